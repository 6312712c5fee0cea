"""Tuned tables: the shipped seed tables, $SWAPMOE_TABLES_DIR, external backends, the tile
override, `swapmoe explain` with tables, and `swapmoe tune`'s pure parts and CPU errors."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

import swapmoe
from swapmoe import _core, cli
from swapmoe import tune as T

H200 = "NVIDIA H200"
# (E, topk, K, N), typed in again from the model cards
QWEN3 = (128, 8, 2048, 768)
DEEPSEEK_TP8 = (256, 8, 7168, 256)
MIXTRAL = (8, 2, 4096, 14336)
SHIPPED = {
    "E=128,N=768,device_name=NVIDIA_H200,dtype=bf16.json",
    "E=256,N=256,device_name=NVIDIA_H200,dtype=bf16.json",
    "E=8,N=14336,device_name=NVIDIA_H200,dtype=bf16.json",
    "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
    "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
    "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
    "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
    "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
    "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
    "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel=true.json",
    "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel=true.json",
    "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel=true.json",
    # Qwen3-235B-A22B at TP8 and TP4 (K = 4096), bf16 and FP8 per tensor, M = 1-64, no vLLM times
    "E=128,N=192,device_name=NVIDIA_H200,dtype=bf16.json",
    "E=128,N=384,device_name=NVIDIA_H200,dtype=bf16.json",
    "E=128,N=192,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
    "E=128,N=384,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
}
# The H100 SXM's: the three public shapes, bf16 and the three FP8 schemes, M = 1-4096, measured
# by `swapmoe tune --no-vllm` on an H100 (2026-12-06; no vLLM times, no anchor for the H100).
H100 = "NVIDIA H100 80GB HBM3"
SHIPPED_H100 = {
    f"E={e},N={n},device_name=NVIDIA_H100_80GB_HBM3,dtype={d}.json"
    for e, n in ((128, 768), (256, 256), (8, 14336))
    for d in ("bf16", "fp8_w8a8", "fp8_w8a8,block_shape=[128,128]", "fp8_w8a8,per_channel=true")
}
# Qwen3-235B-A22B on the H100 (2026-12-07, M = 1-64, swapmoe's kernels only): TP4 (N = 384) bf16,
# per tensor and 128x128 blocks (Qwen3-235B-A22B-FP8's scheme); TP8 (N = 192) bf16 and per tensor
# (vLLM refuses 128x128 blocks where N = 192 is not a multiple of 128).
SHIPPED_H100_235B = {
    "E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json",
    "E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json",
    "E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json",
    "E=128,N=192,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json",
    "E=128,N=192,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json",
}
# More deployments on the H100 (2026-12-07, M = 1-64, swapmoe's kernels only): Mixtral-8x22B at
# TP8 (N = 2048) and TP4 (N = 4096), bf16 and per tensor; Llama-4-Scout at TP8 (E = 16, top-1,
# N = 1024), bf16; DeepSeek-V3 with EP8 (32 local experts of 256, N = 2048), 128x128 blocks.
SHIPPED_H100_MORE = {
    "E=8,N=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json",
    "E=8,N=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json",
    "E=8,N=4096,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json",
    "E=8,N=4096,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json",
    "E=16,N=1024,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json",
    "E=32,N=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json",
    # expert parallelism: Qwen3-235B-A22B EP8 (16 of 128, N = 1536; how its FP8 checkpoint runs on
    # 8 GPUs), 128x128 blocks and bf16; DeepSeek-V3 EP16 (16 of 256, N = 2048), 128x128 blocks
    "E=16,N=1536,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json",
    "E=16,N=1536,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json",
    "E=16,N=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json",
}
# Qwen3-30B-A3B at TP2 (N = 384) and TP4 (N = 192) on the H100 (2026-12-07, M = 1-64, swapmoe's
# kernels only), named by K = 2048: they share (E, N) with Qwen3-235B-A22B TP4 / TP8 (K = 4096).
SHIPPED_H100_30B_BY_K = {
    "E=128,N=384,K=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json",
    "E=128,N=384,K=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json",
    "E=128,N=384,K=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json",
    "E=128,N=192,K=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json",
    "E=128,N=192,K=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json",
}
# Qwen3-235B-A22B TP2 (N = 768, K = 4096): the reverse collision, (E, N) of Qwen3-30B-A3B TP1
SHIPPED_H100_235B_TP2_BY_K = {
    "E=128,N=768,K=4096,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json",
    "E=128,N=768,K=4096,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json",
    "E=128,N=768,K=4096,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json",
}
SHIPPED_ALL = (SHIPPED | SHIPPED_H100 | SHIPPED_H100_235B | SHIPPED_H100_MORE | SHIPPED_H100_30B_BY_K
               | SHIPPED_H100_235B_TP2_BY_K)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("SWAPMOE_BACKEND", "SWAPMOE_MMA_TOKEN_TILE", "SWAPMOE_TABLES_DIR", "SWAPMOE_TABLES"):
        monkeypatch.delenv(k, raising=False)


def plan(m, shape, **kw):
    E, topk, K, N = shape
    return swapmoe.select_backend(m, E, topk, K, N, device_name=H200, **kw)


def write(folder, name, table):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(table if isinstance(table, str) else json.dumps(table))
    return path


# ---------------------------------------------------------------------------------------
# the shipped seed tables
# ---------------------------------------------------------------------------------------


def test_shipped_tables_are_in_the_package_and_found_by_the_oracle():
    folder = swapmoe.TABLES_DIR
    assert os.path.isdir(folder) and os.path.dirname(folder) == os.path.dirname(swapmoe.__file__)
    # on disk the separators are ';' (a wheel's RECORD is CSV); the oracle's names are vLLM's
    assert {n.replace(",", ";") for n in SHIPPED_ALL} == set(os.listdir(folder))
    info = _core.tables_info()
    assert info["shipped_dir"] == folder and info["user_dir"] is None
    found = {f["file"]: f for f in info["files"]}
    assert SHIPPED_ALL <= set(found)
    for name in SHIPPED_ALL:
        assert found[name]["ok"] and found[name]["origin"] == "shipped" and found[name]["entries"] >= 5
        t = _core.read_table(found[name]["path"])
        assert t["metadata"]["K"] and t["metadata"]["topk"]


def test_shipped_h100_tables_are_measured_and_picked_on_an_h100_only():
    """The H100's tables: every entry measured by `swapmoe tune` on the H100 (its pick the
    fastest of its times, swapmoe's kernels only), 13 M points each; the oracle takes them for
    that device name and not for the H200's; inside vLLM (no vllm_triton times) their calls
    are decided as untabled ones, with the entry's pick as the fallback."""
    for name in SHIPPED_H100:
        entries = tuned_entries(name, H100)
        assert sorted(entries) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096], name
        for m, e in entries.items():
            assert "vllm_triton" not in e["times_us"], (name, m)
    # deepseek-v3-tp8 bf16 M = 32: the H100 table measured cuda_wgmma_swap fastest
    table = shipped_table("E=256,N=256,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json")
    assert T.table_entries(table)[32]["backend"] == "cuda_wgmma_swap"
    p = swapmoe.select_backend(32, 256, 8, 7168, 256, device_name=H100, device_capability=(9, 0))
    assert p.source == "table" and p.backend == "cuda_wgmma_swap", p.reasons
    assert any("NVIDIA_H100_80GB_HBM3" in r for r in p.reasons), p.reasons
    # not for another device name
    other = swapmoe.select_backend(32, 256, 8, 7168, 256, device_name="NVIDIA H100 PCIe", device_capability=(9, 0))
    assert other.source == "heuristic"
    # inside vLLM: no vllm_triton time, so vLLM's Triton runs it with the table's pick as fallback
    v = swapmoe.select_backend(32, 256, 8, 7168, 256, device_name=H100, device_capability=(9, 0),
                               external_backends=("vllm_triton",))
    assert v.backend == "vllm_triton" and v.fallback == "cuda_wgmma_swap", v.reasons


def test_shipped_h100_qwen3_235b_tables_are_measured_and_picked():
    """Qwen3-235B-A22B's H100 tables (TP4 and TP8): measured by `swapmoe tune` on the H100 at
    M = 1-64 with swapmoe's kernels only, and the oracle's pick there is the entry's. Where
    the heuristics missed the tune's fastest by more than 5% (TP8 bf16 M = 1: cuda_decode
    22.0 against swap-AB 23.1 µs; TP4 128x128 blocks M = 1: the e4m3 GEMM2 ring of 7, 29.2
    against 30.8; M = 4: cuda_wgmma t64 70.2 against swap-AB 75.5) the table decides."""
    for name in SHIPPED_H100_235B:
        entries = tuned_entries(name, H100)
        assert sorted(entries) == [1, 2, 4, 8, 16, 32, 64], name
        meta = shipped_table(name)["metadata"]
        assert (meta["E"], meta["topk"], meta["K"], meta["model"]) == (
            128, 8, 4096, f"qwen3-235b-a22b-tp{1536 // meta['N']}"), name
        for m, e in entries.items():
            assert "vllm_triton" not in e["times_us"], (name, m)
    cases = [  # (M, N, quant, backend, token tile or None)
        (1, 192, None, "cuda_decode", None),
        (4, 384, "fp8_block128", "cuda_wgmma", 64),
        (32, 384, None, "cuda_wgmma", 64),
        (64, 192, None, "cuda_mma", 16),
    ]
    for m, n, quant, backend, tile in cases:
        p = swapmoe.select_backend(m, 128, 8, 4096, n, device_name=H100, device_capability=(9, 0), quant=quant)
        assert p.source == "table" and p.backend == backend, (m, n, quant, p.reasons)
        if tile is not None:
            assert p.tile["tokens_per_pass"] == tile, (m, n, quant, p.tile)
    # the 128x128-block entry at M = 1 carries its swap launch (GEMM2 ring 7)
    p = swapmoe.select_backend(1, 128, 8, 4096, 384, device_name=H100, device_capability=(9, 0),
                               quant="fp8_block128")
    assert p.source == "table" and p.backend == "cuda_wgmma_swap" and p.tile["swap_gemm2_ring"] == 7, p.tile


def test_shipped_h100_tables_of_more_deployments():
    """Mixtral-8x22B (TP8, TP4), Llama-4-Scout (TP8), DeepSeek-V3 with EP8 and EP16 and
    Qwen3-235B-A22B with EP8 on the H100:
    measured by `swapmoe tune` at M = 1-64 with swapmoe's kernels only, each on its model's
    shape (the EP8 table on 32 local experts of 256), and picked for those calls."""
    shapes = {  # E_local: (model, E_global, topk, K)
        "E=8,N=2048": ("mixtral-8x22b-tp8", 8, 2, 6144), "E=8,N=4096": ("mixtral-8x22b-tp4", 8, 2, 6144),
        "E=16,N=1024": ("llama4-scout-tp8", 16, 1, 5120), "E=32,N=2048": ("deepseek-v3-ep8", 256, 8, 7168),
        "E=16,N=1536": ("qwen3-235b-a22b-ep8", 128, 8, 4096), "E=16,N=2048": ("deepseek-v3-ep16", 256, 8, 7168),
    }
    for name in SHIPPED_H100_MORE:
        entries = tuned_entries(name, H100)
        assert sorted(entries) == [1, 2, 4, 8, 16, 32, 64], name
        meta = shipped_table(name)["metadata"]
        model, e_global, topk, k = shapes[name.split(",device_name")[0]]
        assert (meta["model"], meta["E_global"], meta["topk"], meta["K"]) == (model, e_global, topk, k), name
    # Mixtral-8x22B TP8 FP8 per tensor at M = 16: swap-AB with the e4m3 GEMM2's ring of 5
    # (110.0 µs) where the heuristics take cuda_wgmma t64 (118.8)
    p = swapmoe.select_backend(16, 8, 2, 6144, 2048, device_name=H100, device_capability=(9, 0), quant="fp8_tensor")
    assert p.source == "table" and p.backend == "cuda_wgmma_swap" and p.tile["swap_gemm2_ring"] == 5, p.reasons
    # Llama-4-Scout TP8 bf16 at M = 2: the decode kernels (29.3 against swap-AB's 31.0)
    p = swapmoe.select_backend(2, 16, 1, 5120, 1024, device_name=H100, device_capability=(9, 0))
    assert p.source == "table" and p.backend == "cuda_decode", p.reasons
    # the expert-parallel tables, asked as a rank: the entry's launch comes before the ring rule
    # for ~1 active expert (which would take a GEMM1 ring of 3)
    ep = lambda m, e, k, n, g, quant=None: swapmoe.select_backend(  # noqa: E731
        m, e, 8, k, n, device_name=H100, device_capability=(9, 0), quant=quant, global_num_experts=g)
    p = ep(1, 16, 4096, 1536, 128)  # Qwen3-235B EP8 bf16: r2p1, 22.5 µs
    assert p.source == "table" and p.backend == "cuda_wgmma_swap" and p.tile["swap_gemm1_ring"] == 2, p.reasons
    p = ep(1, 16, 7168, 2048, 256, "fp8_block128")  # DeepSeek-V3 EP16: r0p1g5, 34.9 µs
    assert p.source == "table" and p.tile["swap_gemm1_ring"] == 0 and p.tile["swap_gemm2_ring"] == 5, p.reasons
    p = ep(4, 32, 7168, 2048, 256, "fp8_block128")  # DeepSeek-V3 EP8: cuda_wgmma t64, 127.2 µs
    assert p.source == "table" and p.backend == "cuda_wgmma" and p.tile["tokens_per_pass"] == 64, p.reasons
    # untabled (tables off): the rule's ring of 3 for the same rank at M = 1
    with_env = os.environ.get("SWAPMOE_TABLES")
    os.environ["SWAPMOE_TABLES"] = "off"
    try:
        assert ep(1, 16, 4096, 1536, 128).tile["swap_gemm1_ring"] == 3
    finally:
        if with_env is None:
            del os.environ["SWAPMOE_TABLES"]
        else:
            os.environ["SWAPMOE_TABLES"] = with_env


def test_shipped_h100_qwen3_30b_tables_are_named_by_k_and_read_for_that_k_only():
    """Qwen3-30B-A3B TP2 / TP4 (K = 2048) share (E, N) with Qwen3-235B-A22B TP4 / TP8 (K =
    4096). Their own tables, named by K, are measured at K = 2048 and read for calls of that K;
    calls of K = 4096 still read the (E, N) tables."""
    for name in SHIPPED_H100_30B_BY_K:
        entries = tuned_entries(name, H100)
        assert sorted(entries) == [1, 2, 4, 8, 16, 32, 64], name
        meta = shipped_table(name)["metadata"]
        assert (meta["E"], meta["topk"], meta["K"], meta["model"]) == (
            128, 8, 2048, f"qwen3-30b-a3b-tp{768 // meta['N']}"), name
        assert _core.table_file_name(128, meta["N"], H100, "bf16", meta["quant"], hidden_size=2048) == name

    def at(m, k, n, quant=None):
        return swapmoe.select_backend(m, 128, 8, k, n, device_name=H100, device_capability=(9, 0), quant=quant)

    # TP4 per tensor at M = 4: the K = 2048 table's e4m3 GEMM2 ring of 5 (25.5 µs there, where the
    # Qwen3-235B entry's default launch took 27.8); K = 4096 keeps the 235B entry
    p = at(4, 2048, 192, "fp8_tensor")
    assert p.source == "table" and "K=2048" in p.table and p.tile["swap_gemm2_ring"] == 5, p.reasons
    assert not any("measured with K=" in r for r in p.reasons), p.reasons
    p = at(4, 4096, 192, "fp8_tensor")
    assert p.source == "table" and "K=" not in os.path.basename(p.table), p.table
    # TP8-shaped bf16 at M = 32: cuda_mma t16 at K = 2048 (114.4 against the 235B pick's 123.2)
    p = at(32, 2048, 192)
    assert (p.source, p.backend, p.tile["tokens_per_pass"]) == ("table", "cuda_mma", 16), p.reasons
    assert at(32, 4096, 192).backend == "cuda_wgmma_swap"
    # another K (no table of its own) reads the (E, N) table and says so
    p = at(4, 3072, 192, "fp8_tensor")
    assert "K=" not in os.path.basename(p.table)
    assert any("measured with K=4096 (this call K=3072)" in r and "K=3072" in r for r in p.reasons), p.reasons


def test_shipped_h100_qwen3_235b_tp2_tables_are_named_by_k():
    """Qwen3-235B-A22B TP2 (N = 768, K = 4096) shares (E, N) with Qwen3-30B-A3B TP1 (K = 2048):
    its own tables (H100, 2026-12-07) are read at K = 4096, the Qwen3-30B ones at K = 2048."""
    for name in SHIPPED_H100_235B_TP2_BY_K:
        assert sorted(tuned_entries(name, H100)) == [1, 2, 4, 8, 16, 32, 64], name
        meta = shipped_table(name)["metadata"]
        assert (meta["E"], meta["N"], meta["topk"], meta["K"], meta["model"]) == (
            128, 768, 8, 4096, "qwen3-235b-a22b-tp2"), name
        assert _core.table_file_name(128, 768, H100, "bf16", meta["quant"], hidden_size=4096) == name

    def at(m, k):
        return swapmoe.select_backend(m, 128, 8, k, 768, device_name=H100, device_capability=(9, 0),
                                      quant="fp8_block128")

    # 128x128 blocks at M = 2: cuda_wgmma t64 at K = 4096 (72.7 µs, where the Qwen3-30B entry's
    # swap-AB launch measured 77.6 there); K = 2048 keeps the Qwen3-30B entry
    p = at(2, 4096)
    assert (p.source, p.backend, p.tile["tokens_per_pass"]) == ("table", "cuda_wgmma", 64), p.reasons
    assert "K=4096" in os.path.basename(p.table)
    p = at(2, 2048)
    assert p.source == "table" and "K=" not in os.path.basename(p.table) and p.backend == "cuda_wgmma_swap", p.reasons


def test_user_table_named_by_k_steers_only_calls_of_that_k(tmp_path, monkeypatch):
    shape = (16, 2, 1024, 512)
    meta = {"E": 16, "N": 512, "K": 1024, "topk": 2}
    write(tmp_path, _core.table_file_name(16, 512, H200, hidden_size=1024).replace(",", ";"),
          {"metadata": meta, "8": {"backend": "cuda_generic"}})
    write(tmp_path, _core.table_file_name(16, 512, H200),
          {"metadata": dict(meta, K=4096), "8": {"backend": "cuda_decode"}})
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    p = plan(8, shape)
    assert (p.backend, p.source) == ("cuda_generic", "table") and "K=1024" in p.table
    p = plan(8, (16, 2, 2048, 512))
    assert (p.backend, p.source) == ("cuda_decode", "table") and "K=" not in os.path.basename(p.table)
    # a K-named file whose metadata disagrees is ignored with the reason (another folder: a
    # folder's tables are read once per process)
    bad = tmp_path / "bad"
    write(bad, _core.table_file_name(16, 512, H200, hidden_size=2048), {"metadata": dict(meta, K=1024),
                                                                         "8": {"backend": "cuda_generic"}})
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(bad))
    p = plan(8, (16, 2, 2048, 512))
    assert p.source == "heuristic"
    assert any("metadata.K = 1024 but the file name says K=2048" in r for r in p.reasons), p.reasons


def shipped_table(name):
    """The JSON of the shipped table `name` (vLLM's spelling; `;` on disk)."""
    with open(os.path.join(swapmoe.TABLES_DIR, name.replace(",", ";")), encoding="utf-8") as f:
        return json.load(f)


def tuned_entries(name, device_name):
    """The entries of shipped table `name`, after checking that `swapmoe tune` measured it on
    `device_name` and that each entry names its source and picks the fastest of its times."""
    table = shipped_table(name)
    assert table["metadata"]["generated_by"] == "swapmoe tune"
    assert table["metadata"]["device_name"] == device_name
    entries = T.table_entries(table)
    for m, e in entries.items():
        assert e["source"].startswith("swapmoe tune"), (name, m)
        assert e["time_us"] > 0 and e["time_us"] == min(e["times_us"].values()), (name, m)
    return entries


def test_shipped_entries_are_measured():
    """The shipped tables come from `swapmoe tune` on the H200; vLLM's times come from the
    anchor (benches/merge_anchor.py), and every entry says where its numbers come from."""
    for name in SHIPPED:
        for m, e in tuned_entries(name, H200).items():
            if "vllm_triton" in e["times_us"]:
                assert "anchor" in e["vllm_triton_source"], (name, m)


def test_shipped_qwen3_235b_tables_pick_swapmoe_kernels_outside_vllm_only():
    """Qwen3-235B-A22B at TP8 (N = 192) and TP4 (N = 384), tuned 2026-12-05 with swapmoe's
    kernels only (benches/results/device_2026-12-05/): outside vLLM the measured pick, inside
    vLLM an untabled call's rule (no vllm_triton time to compare with)."""
    tp8, tp4 = (128, 8, 4096, 192), (128, 8, 4096, 384)
    # bf16 TP8 M = 1: cuda_decode 19.5 µs against swap-AB 20.1-21.1 (the heuristics' pick)
    assert (plan(1, tp8).backend, plan(1, tp8).source) == ("cuda_decode", "table")
    # bf16 TP4 M = 8: swap-AB, GEMM1 ring 3, GEMM2 after GEMM1 (135.3 against 146.0 by default)
    p = plan(8, tp4)
    assert (p.backend, p.tile["swap_gemm1_ring"], p.tile["swap_gemm2_pdl"]) == ("cuda_wgmma_swap", 3, False), p.reasons
    # FP8 TP8 M = 8: the e4m3 wgmma GEMMs, tile 64 (57.7 against swap-AB 61.6)
    p = plan(8, tp8, quant="fp8_tensor")
    assert (p.backend, p.source, p.tile["tokens_per_pass"]) == ("cuda_wgmma", "table", 64), p.reasons
    inside_vllm = dict(external_backends=("vllm_triton",))
    assert plan(8, tp4, **inside_vllm).backend == "vllm_triton"
    assert plan(8, tp8, quant="fp8_tensor", **inside_vllm).backend == "vllm_triton"


def test_shipped_tables_pick_the_measured_decode_backend():
    # measured (benches/results/tables_retune_2026-12-04/tune.txt): Mixtral M=1 swap-AB
    # 173.6 µs < cuda_generic 180.3
    p = plan(1, MIXTRAL)
    assert (p.backend, p.source, p.table_m) == ("cuda_wgmma_swap", "table", 1)
    assert p.table == os.path.join(swapmoe.TABLES_DIR, "E=8;N=14336;device_name=NVIDIA_H200;dtype=bf16.json")
    assert plan(1, MIXTRAL, backend="cuda_decode").source == "override"
    # deepseek M=4: the table's fastest swapmoe backend (cuda_wgmma_swap 92.0 µs, vLLM's Triton
    # ~101.9; cuda_decode 104.4)
    p = plan(4, DEEPSEEK_TP8)
    assert (p.backend, p.source, p.table_m) == ("cuda_wgmma_swap", "table", 4)
    # qwen3 M=4, 8: vllm_triton (~81.4, 127.8) is external, not a candidate here: the fastest
    # swapmoe label, swap-AB with a ring of 2 stages (5 GEMM1 CTAs per SM) and GEMM2 started
    # after GEMM1 (83.0, 138.0 against 84.2, 142.2 with the oracle's rules; tune of 2026-12-04
    # 15:01); M=16: cuda_mma t16 (197.6, the entry of 12:03 kept, see its note)
    for m in (4, 8):
        p = plan(m, QWEN3)
        assert (p.backend, p.source, p.tile["swap_gemm1_ring"], p.tile["swap_gemm2_pdl"]) == \
            ("cuda_wgmma_swap", "table", 2, False), (m, p.reasons)
    p = plan(16, QWEN3)
    assert (p.backend, p.source, p.tile["tokens_per_pass"]) == ("cuda_mma", "table", 16)
    # deepseek M=16: swap-AB with the rules, a ring of 2 stages (282.9) over cuda_mma t16 (310.0);
    # M=8, 32: a ring of 3 with GEMM2 by PDL (160.6, 454.0 against 162.6, 457.5)
    p = plan(16, DEEPSEEK_TP8)
    assert (p.backend, p.source, p.tile["swap_gemm1_ring"]) == ("cuda_wgmma_swap", "table", 2)
    for m in (8, 32):
        p = plan(m, DEEPSEEK_TP8)
        assert (p.backend, p.tile["swap_gemm1_ring"], p.tile["swap_gemm2_pdl"]) == ("cuda_wgmma_swap", 3, True)


def test_shipped_fp8_tables_route_between_swapmoe_and_vllm():
    """`swapmoe tune --quant` on the H200 (2026-12-03, 0bddb37's kernels:
    benches/results/channel_epilogue_2026-12-03/tune_*.txt) plus vLLM's times from the anchor
    (benches/merge_anchor.py: GEMMs + 5 x 1.6 µs)."""
    inside_vllm = {"external_backends": ["vllm_triton"]}
    # qwen3 per-tensor (static scales): swap-AB 21.0 µs against vLLM's ~25.5 at M = 1;
    # vLLM's Triton from M = 8 on (swap 83.8 against ~75.2)
    p = plan(1, QWEN3, quant="fp8_tensor", **inside_vllm)
    assert (p.backend, p.source, p.table_m) == ("cuda_wgmma_swap", "table", 1), p.reasons
    assert p.table.endswith("E=128;N=768;device_name=NVIDIA_H200;dtype=fp8_w8a8.json")
    p = plan(8, QWEN3, quant="fp8_tensor", **inside_vllm)
    assert (p.backend, p.fallback) == ("vllm_triton", "cuda_wgmma_swap")
    # outside vLLM the table's fastest swapmoe label: swap-AB with a GEMM1 ring of 2, GEMM2 by PDL
    # (81.4 against 84.3 with the oracle's rules; tune and A/B of 2026-12-04:
    # benches/results/fp8_launch_tables_2026-12-04/)
    p = plan(8, QWEN3, quant="fp8_tensor")
    assert (p.backend, p.tile["swap_gemm1_ring"], p.tile["swap_gemm2_pdl"]) == ("cuda_wgmma_swap", 2, True), p.reasons
    # deepseek M = 2 and 8: a GEMM1 ring of 3 with GEMM2 by PDL (37.7 / 96.0 against 39.0 / 97.1),
    # inside vLLM too (vLLM's Triton ~43.8 / ~100.9)
    for m in (2, 8):
        p = plan(m, DEEPSEEK_TP8, quant="fp8_tensor", **inside_vllm)
        assert (p.backend, p.source, p.tile["swap_gemm1_ring"], p.tile["swap_gemm2_pdl"]) == \
            ("cuda_wgmma_swap", "table", 3, True), (m, p.reasons)
    # deepseek M = 1: the GEMM1's own ring, GEMM2 by PDL with a ring of 7 (tune of 2026-12-05:
    # 23.6 against 24.3 with its own ring; A/B three rounds 23.4 against 24.1-24.2;
    # benches/results/device_2026-12-05/), inside vLLM too (vLLM's Triton ~36.3)
    p = plan(1, DEEPSEEK_TP8, quant="fp8_tensor", **inside_vllm)
    assert (p.backend, p.source, p.tile["swap_gemm1_ring"], p.tile["swap_gemm2_pdl"], p.tile["swap_gemm2_ring"]) == \
        ("cuda_wgmma_swap", "table", 0, True, 7), p.reasons
    # prefill: vLLM's Triton (2626 µs est.), swapmoe's fallback the e4m3 wgmma GEMMs (3205 µs)
    p = plan(4096, MIXTRAL, quant="fp8_tensor", **inside_vllm)
    assert (p.backend, p.fallback) == ("vllm_triton", "cuda_wgmma")
    # Mixtral M = 2: swap-AB (150.4 µs; the wgmma GEMMs t64 157.5) against vLLM's ~183
    p = plan(2, MIXTRAL, quant="fp8_tensor", **inside_vllm)
    assert (p.backend, p.source) == ("cuda_wgmma_swap", "table"), p.reasons
    # Mixtral M = 4096 with 128x128 blocks: the wgmma GEMMs t128 (3619 µs) against vLLM's ~4543
    p = plan(4096, MIXTRAL, quant="fp8_block128", **inside_vllm)
    assert (p.backend, p.source, p.tile["tokens_per_pass"]) == ("cuda_wgmma", "table", 128), p.reasons
    # measured with static activation scales: a dynamic per-tensor call is not described
    p = plan(1, QWEN3, quant="fp8_tensor", activation_scales="dynamic", **inside_vllm)
    assert p.source == "heuristic" and any("measured with static activation scales" in r for r in p.reasons)
    # block 128 at qwen3 M = 1: swap-AB with the GEMM2 ring rule, 26.7 µs against vLLM's ~27.3
    p = plan(1, QWEN3, quant="fp8_block128", **inside_vllm)
    assert (p.backend, p.source, p.tile["swap_gemm2_ring"]) == ("cuda_wgmma_swap", "table", 5), p.reasons
    # block 128 (dynamic scales, the only kind): deepseek M = 1 and 2 swap 31.1 / 45.5 µs
    # against ~39.7 / ~48.0; M = 4 vLLM's Triton (swap 68.6 against ~64.9)
    for m in (1, 2):
        p = plan(m, DEEPSEEK_TP8, quant="fp8_block128", **inside_vllm)
        assert (p.backend, p.source) == ("cuda_wgmma_swap", "table"), p.reasons
    assert plan(4, DEEPSEEK_TP8, quant="fp8_block128", **inside_vllm).backend == "vllm_triton"
    with pytest.raises(swapmoe.ArgumentError, match="activation_scales: expected None or 'dynamic'"):
        plan(1, DEEPSEEK_TP8, quant="fp8_block128", activation_scales="static")
    with pytest.raises(swapmoe.ArgumentError, match="activation_scales: expected 'static' or 'dynamic'"):
        plan(1, QWEN3, quant="fp8_tensor", activation_scales="calibrated")


def test_shipped_fp8_channel_tables_keep_vllm_calls_on_vllm_triton():
    """`swapmoe tune --quant fp8_channel --no-vllm` on the H200 (2026-12-03, 0bddb37's kernels,
    benches/NOTES.md "GEMM2 epilogue loads"): the anchor has no per-channel vLLM times, so inside vLLM the calls
    stay on vLLM's Triton with the table's pick as the fallback; outside vLLM the table picks."""
    inside_vllm = {"external_backends": ["vllm_triton"]}
    # deepseek M = 4096: t128 1072 µs against t64 1229; M = 1024: t64 565 against t128 672
    p = plan(4096, DEEPSEEK_TP8, quant="fp8_channel")
    assert (p.backend, p.source, p.tile["tokens_per_pass"]) == ("cuda_wgmma", "table", 128), p.reasons
    assert p.table.endswith("E=256;N=256;device_name=NVIDIA_H200;dtype=fp8_w8a8;per_channel=true.json")
    p = plan(1024, DEEPSEEK_TP8, quant="fp8_channel")
    assert (p.backend, p.source, p.tile["tokens_per_pass"]) == ("cuda_wgmma", "table", 64), p.reasons
    # qwen3 M = 4: the wgmma GEMMs (65.5 µs) where the heuristic says swap-AB (71.0)
    p = plan(4, QWEN3, quant="fp8_channel")
    assert (p.backend, p.source) == ("cuda_wgmma", "table"), p.reasons
    assert swapmoe.select_backend(4, *QWEN3, device_name=H200, quant="fp8_channel",
                                  backend="cuda_wgmma_swap").source == "override"
    for m, shape in ((1, QWEN3), (4096, DEEPSEEK_TP8), (2, MIXTRAL)):
        p = plan(m, shape, quant="fp8_channel", **inside_vllm)
        assert (p.backend, p.source) == ("vllm_triton", "table"), p.reasons
        assert p.fallback == plan(m, shape, quant="fp8_channel").backend
        assert any("no vllm_triton time at M=" in r for r in p.reasons), p.reasons


def shipped_shapes(suffix):
    """(name, table JSON, (E, topk, K, N) from its metadata) of each shipped table whose name
    ends with `suffix`, in name order."""
    for name in sorted(n for n in SHIPPED if n.endswith(suffix)):
        table = shipped_table(name)
        meta = table["metadata"]
        yield name, table, (meta["E"], meta["topk"], meta["K"], meta["N"])


def _heuristic_label(p):
    """The tune label of a plan's swapmoe backend (its fallback when vLLM's Triton was picked)."""
    backend = p.fallback or p.backend
    tiled = backend in ("cuda_mma", "cuda_wgmma")
    return T.candidate_label(backend, p.tile["tokens_per_pass"] if tiled else None)


# The kinds of call for which the oracle has a measured range where swapmoe runs unmeasured
# calls inside vLLM, and the shipped tables that measured each.
UNTABLED_KINDS = {
    "16-bit": ({"quant": None}, "dtype=bf16.json"),
    "fp8_tensor static": ({"quant": "fp8_tensor", "activation_scales": "static"}, "dtype=fp8_w8a8.json"),
}


@pytest.mark.parametrize("kind", sorted(UNTABLED_KINDS))
def test_untabled_range_inside_vllm_is_where_swapmoe_won_at_every_shipped_shape(kind, monkeypatch):
    """Inside vLLM a call no table measured runs swapmoe only up to the M where, at every
    shipped H200 shape of its kind, the heuristics' pick (tables off) measured faster than
    vLLM's Triton by more than 1% in the table's own times; past it vLLM's Triton. Derived
    here from the tables, so the oracle's bounds (`UNTABLED_SWAPMOE_*_MAX_TOKENS`) must follow
    them."""
    kw, suffix = UNTABLED_KINDS[kind]
    monkeypatch.setenv("SWAPMOE_TABLES", "off")
    won = {}  # M -> swapmoe's heuristic pick faster than vLLM's Triton at every shape so far
    for name, table, shape in shipped_shapes(suffix):
        for m, entry in T.table_entries(table).items():
            times = entry.get("times_us", {})
            if "vllm_triton" not in times:
                continue
            label = _heuristic_label(plan(m, shape, **kw))
            assert label in times, (name, m, label, sorted(times))
            # faster by more than the run-to-run spread of the tables' times (1%)
            won[m] = won.get(m, True) and times[label] * 1.01 < times["vllm_triton"]
    ms = sorted(won)
    assert len(ms) >= 8, ms
    bound = 0
    for m in ms:
        if not won[m]:
            break
        bound = m
    assert bound >= 1, won  # swapmoe's kernels win somewhere, or the range would be empty
    for m in ms:
        for name, _, shape in shipped_shapes(suffix):
            p = plan(m, shape, external_backends=["vllm_triton"], **kw)
            assert p.source == "heuristic", p.reasons
            assert (p.backend == "vllm_triton") == (m > bound), (kind, name, m, bound, p.reasons)
            assert p.fallback is None or p.fallback == _heuristic_label(p).partition(":")[0]
    # the same bound for a shape and a device no table measured
    E, topk, K, N = 64, 4, 1024, 512
    monkeypatch.delenv("SWAPMOE_TABLES")
    for m, to_vllm in ((bound, False), (bound + 1, True)):
        p = swapmoe.select_backend(m, E, topk, K, N, device_name="NVIDIA H100 80GB HBM3",
                                   device_capability=(9, 0), external_backends=["vllm_triton"], **kw)
        assert (p.backend == "vllm_triton") == to_vllm, (m, p.reasons)
        assert any(r.startswith("vllm_triton:") for r in p.reasons), p.reasons


@pytest.mark.parametrize("suffix,quant", [("per_channel=true.json", "fp8_channel"),
                                           ("block_shape=[128,128].json", "fp8_block128")])
def test_fp8_scaled_heuristics_pick_swap_or_wgmma_as_the_tables_measured(suffix, quant, monkeypatch):
    """Without tables, per-channel and 128x128-block FP8 calls on Hopper run the swap-AB
    kernels while cuda_wgmma's GEMM1 grid is under 1.5 waves, its e4m3 GEMMs from there on
    (`SWAP_FP8_SCALED_MAX_WGMMA_WAVES`). At every shipped H200 point that timed both, that
    choice is the faster of the two or within 5% of it (the wgmma side at its fastest tile:
    the tile is another rule)."""
    monkeypatch.setenv("SWAPMOE_TABLES", "off")
    checked = 0
    for name, table, shape in shipped_shapes(suffix):
        for m, entry in T.table_entries(table).items():
            times = entry.get("times_us", {})
            swap = times.get("cuda_wgmma_swap")
            wgmma = min((t for k, t in times.items() if k.startswith("cuda_wgmma:t")), default=None)
            if swap is None or wgmma is None:
                continue
            p = plan(m, shape, quant=quant)
            assert p.backend in ("cuda_wgmma_swap", "cuda_wgmma"), (name, m, p.backend)
            mine = swap if p.backend == "cuda_wgmma_swap" else wgmma
            assert mine <= 1.05 * min(swap, wgmma), (name, m, p.backend, swap, wgmma, p.reasons)
            checked += 1
    assert checked >= 15, checked


def test_untabled_calls_outside_the_measured_kinds_go_to_vllm_triton():
    """FP8 per channel, 128x128 blocks and dynamic per-tensor scales, fp32, and devices other
    than sm_90 have no measured range: inside vLLM an untabled call of theirs stays on vLLM's
    Triton at every M; outside vLLM the heuristics' pick runs."""
    dims = (64, 4, 1024, 512)
    cases = [
        {"quant": "fp8_channel"},
        {"quant": "fp8_block128"},
        {"quant": "fp8_tensor", "activation_scales": "dynamic"},
        {"dtype": "fp32"},
        {"device_capability": (8, 0), "device_name": "NVIDIA A100-SXM4-80GB"},
    ]
    for kw in cases:
        kw = {"device_name": H200, **kw}
        E, topk, K, N = dims
        p = swapmoe.select_backend(1, E, topk, K, N, external_backends=["vllm_triton"], **kw)
        assert (p.backend, p.source) == ("vllm_triton", "heuristic"), (kw, p.reasons)
        assert any("no range was measured" in r for r in p.reasons), (kw, p.reasons)
        alone = swapmoe.select_backend(1, E, topk, K, N, **kw)
        assert alone.backend == p.fallback != "vllm_triton", (kw, alone.backend, p.fallback)


def test_shipped_table_tiles_and_gaps():
    p = plan(1024, QWEN3)
    assert (p.backend, p.source, p.tile["tokens_per_pass"]) == ("cuda_wgmma", "table", 128)
    assert p.tile["kernels"][1] == "wgmma_moe_gemm1_act_bf16_t128"
    p = plan(512, QWEN3)  # the table's tile, not the heuristic's
    assert (p.backend, p.source, p.tile["tokens_per_pass"]) == ("cuda_wgmma", "table", 64)
    # M=10000: the nearest entry (4096) is more than 2x away: the heuristics decide
    p = plan(10000, QWEN3)
    assert p.source == "heuristic" and p.table_m == 4096
    assert any("no entry within 2x of M=10000" in r for r in p.reasons)
    # another dtype or device has no table
    assert plan(1024, QWEN3, dtype="fp16").table is None
    p = swapmoe.select_backend(1024, *QWEN3, device_name="NVIDIA A100-SXM4-80GB")
    assert p.table is None and p.source == "heuristic"


def test_tables_off(monkeypatch):
    monkeypatch.setenv("SWAPMOE_TABLES", "off")
    p = plan(4, QWEN3)
    assert (p.backend, p.source) == ("cuda_wgmma_swap", "heuristic")
    assert any("tables are off" in r for r in p.reasons)


# ---------------------------------------------------------------------------------------
# $SWAPMOE_TABLES_DIR
# ---------------------------------------------------------------------------------------


def test_user_table_replaces_the_shipped_one(tmp_path, monkeypatch):
    name = "E=128,N=768,device_name=NVIDIA_H200,dtype=bf16.json"
    write(tmp_path, name, {"1": {"backend": "cuda_mma", "token_tile": 128}})
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    p = plan(1, QWEN3)
    assert (p.backend, p.source, p.tile["tokens_per_pass"]) == ("cuda_mma", "table", 128)
    assert p.table == str(tmp_path / name)
    assert any("(user)" in r for r in p.reasons)
    # the other shipped tables stay
    assert plan(1, MIXTRAL).table.startswith(swapmoe.TABLES_DIR)


@pytest.mark.parametrize("quant", [None, "fp8_tensor", "fp8_channel", "fp8_block128"])
def test_every_swap_launch_tune_writes_is_planned_from_a_table(tmp_path, monkeypatch, quant):
    """An entry `swapmoe tune` makes from a winning launch variant (bf16 and every FP8 scheme)
    is planned with that ring and GEMM2 launch, not set aside (FP8 entries were, until the
    e4m3 GEMM1 ring's guard was lifted; NOTES "The e4m3 swap GEMM2 ring")."""
    meta = {"E": 128, "N": 768, "K": 2048, "topk": 8}
    if quant:
        meta["activation_scales"] = "static" if quant == "fp8_tensor" else "dynamic"
    for v in T.SWAP_LAUNCH_VARIANTS:
        ring, pdl = T.swap_launch(f"cuda_wgmma_swap:{v}")
        folder = tmp_path / v
        entry = T.make_entry({f"cuda_wgmma_swap:{v}": 50.0, "cuda_wgmma_swap": 60.0, "cuda_wgmma:t64": 70.0})
        write(folder, _core.table_file_name(128, 768, H200, quant=quant), {"metadata": meta, "8": entry})
        monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(folder))
        p = plan(8, QWEN3, quant=quant, device_capability=(9, 0))
        assert (p.backend, p.source) == ("cuda_wgmma_swap", "table"), (v, p.reasons)
        assert (p.tile["swap_gemm1_ring"], p.tile["swap_gemm2_pdl"]) == (ring, pdl), (v, p.reasons)
        assert any("as the table measured" in r for r in p.reasons), p.reasons
    # FP8: the e4m3 GEMM2's ring too, at M = 2 (the rule keeps its own ring there)
    for v in T.SWAP_GEMM2_RING_VARIANTS if quant else ():
        ring2 = T.swap_gemm2_ring(f"cuda_wgmma_swap:{v}")
        folder = tmp_path / v
        entry = T.make_entry({f"cuda_wgmma_swap:{v}": 30.0, "cuda_wgmma_swap": 32.0})
        path = write(folder, _core.table_file_name(128, 768, H200, quant=quant), {"metadata": meta, "2": entry})
        assert _core.read_table(str(path))["entries"][2]["swap_gemm2_ring"] == ring2
        monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(folder))
        p = plan(2, QWEN3, quant=quant, device_capability=(9, 0))
        assert (p.source, p.tile["swap_gemm2_ring"]) == ("table", ring2), (v, p.reasons)
        assert any(f"gemm2: a ring of {ring2} stages" in r and "as the table measured" in r for r in p.reasons)


def test_user_table_for_a_new_shape_with_nearest_m(tmp_path, monkeypatch):
    write(tmp_path, _core.table_file_name(64, 512, H200), {
        "metadata": {"E": 64, "N": 512, "K": 1024, "topk": 4},
        "16": {"backend": "cuda_generic"},
        "32": {"backend": "cuda_mma", "token_tile": 16},
    })
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    shape = (64, 4, 1024, 512)
    assert plan(24, shape).backend == "cuda_generic"  # a tie goes to the smaller M
    assert plan(25, shape).backend == "cuda_mma"
    assert plan(200, shape).source == "heuristic"


def test_rejected_entry_falls_back_and_logs_once(tmp_path, monkeypatch, caplog):
    # cuda_decode holds at most 512 slots: M=128 with topk 8 is 1024
    write(tmp_path, _core.table_file_name(40, 512, H200), {"128": {"backend": "cuda_decode"}})
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    shape = (40, 8, 1024, 512)
    with caplog.at_level(logging.INFO, logger="swapmoe"):
        p = plan(128, shape)
        plan(100, shape)
    assert p.source == "heuristic" and p.backend == "cuda_wgmma"  # 1024 slots over 40 experts
    assert any("table: rejected cuda_decode" in r and "512" in r for r in p.reasons)
    records = [r for r in caplog.records if r.name == "swapmoe" and "cannot run" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.WARNING


def test_malformed_table_is_ignored_with_a_reason(tmp_path, monkeypatch, caplog):
    write(tmp_path, _core.table_file_name(48, 512, H200), "{not json")
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="swapmoe"):
        p = plan(8, (48, 8, 1024, 512))
    assert p.source == "heuristic"
    assert any("malformed" in r and "not valid JSON" in r for r in p.reasons)
    assert any("malformed" in r.getMessage() for r in caplog.records if r.name == "swapmoe")
    info = _core.tables_info()
    assert any(not f["ok"] and f["origin"] == "user" for f in info["files"])
    with pytest.raises(swapmoe.ArgumentError, match="not valid JSON"):
        _core.read_table(str(tmp_path / _core.table_file_name(48, 512, H200)))


def test_missing_user_folder_is_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path / "nope"))
    p = plan(8, (56, 8, 1024, 512))
    assert any("cannot be listed" in r for r in p.reasons)


def test_external_backends_only_when_allowed(tmp_path, monkeypatch):
    write(tmp_path, _core.table_file_name(24, 512, H200), {
        "64": {"backend": "vllm_triton", "times_us": {"vllm_triton": 80.0, "cuda_mma:t64": 90.0,
                                                      "cuda_generic": 200.0}},
    })
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    shape = (24, 8, 1024, 512)
    p = plan(64, shape)
    assert (p.backend, p.source, p.fallback, p.tile["tokens_per_pass"]) == ("cuda_mma", "table", None, 64)
    assert any("vllm_triton is a candidate only" in r for r in p.reasons)
    p = plan(64, shape, external_backends=("vllm_triton",))
    assert (p.backend, p.source, p.fallback, p.swap_ab) == ("vllm_triton", "table", "cuda_mma", False)
    p = plan(64, shape, external_backends="vllm_triton")  # one name alone is accepted
    assert p.backend == "vllm_triton"
    assert plan(64, shape, external_backends=["flashinfer_cutlass"]).backend == "cuda_mma"
    with pytest.raises(swapmoe.ArgumentError, match="external_backends"):
        plan(64, shape, external_backends=("triton",))


def test_overrides_beat_tables(monkeypatch):
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_decode")
    p = plan(1, MIXTRAL)
    assert (p.backend, p.source) == ("cuda_decode", "override")
    monkeypatch.delenv("SWAPMOE_BACKEND")
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", "128")
    p = plan(512, QWEN3)  # the table says cuda_wgmma, tile 64
    assert (p.backend, p.source, p.tile["tokens_per_pass"]) == ("cuda_wgmma", "override", 128)
    assert any("token tile 128 forced" in r for r in p.reasons)
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", "32")
    with pytest.raises(swapmoe.ArgumentError, match="SWAPMOE_MMA_TOKEN_TILE"):
        plan(1024, QWEN3)


def test_table_names_and_fp8():
    assert _core.table_file_name(128, 768, H200) == "E=128,N=768,device_name=NVIDIA_H200,dtype=bf16.json"
    assert _core.table_file_name(256, 256, H200, "bf16", "fp8_block128") == \
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert _core.table_file_name(256, 256, H200, quant="fp8_tensor").endswith("dtype=fp8_w8a8.json")
    # FP8 plans read the FP8 table of their scheme
    p = plan(8, DEEPSEEK_TP8, quant="fp8_block128")  # measured: the e4m3 wgmma GEMMs
    assert p.backend == "cuda_wgmma" and p.source == "table"
    assert p.table.endswith("E=256;N=256;device_name=NVIDIA_H200;dtype=fp8_w8a8;block_shape=[128;128].json")
    p = plan(2, (256, 8, 7168, 512), quant="fp8_block128")  # no table for N=512
    assert p.backend == "cuda_wgmma_swap" and p.source == "heuristic"  # 0.94 waves of wgmma
    assert any("dtype=fp8_w8a8,block_shape=[128,128].json" in r for r in p.reasons)
    assert all("fp8" in k for k in p.tile["kernels"] if "gemm" in k)


def test_describe_plan_reports_source_and_table():
    np = pytest.importorskip("numpy")
    x = np.zeros((4, 64), np.float32)
    w1, w2 = np.zeros((8, 64, 64), np.float32), np.zeros((8, 64, 32), np.float32)
    d = _core.describe_plan(x, w1, w2, np.zeros((4, 2), np.float32), np.zeros((4, 2), np.int32))
    assert d["backend"] == "cpu" and d["source"] == "heuristic" and d["table"] is None


# ---------------------------------------------------------------------------------------
# swapmoe explain
# ---------------------------------------------------------------------------------------


def test_explain_shows_source_and_table(capsys):
    assert cli.main(["explain", "--model", "mixtral-8x7b", "--device-name", H200, "--m", "1,10000"]) == 0
    out = capsys.readouterr().out
    assert f"tables: {len(SHIPPED_ALL)} loaded from" in out
    assert "M=1: cuda_wgmma_swap (table; swap_ab=True) on NVIDIA H200 sm_90" in out
    assert "table: " + os.path.join(swapmoe.TABLES_DIR, "E=8;N=14336;device_name=NVIDIA_H200;dtype=bf16.json") \
        + " entry M=1 (used)" in out
    assert "M=10000: cuda_wgmma (heuristic;" in out and "(not used, see the reasons)" in out


def test_explain_shows_swap_clusters(capsys):
    # deepseek-v3-tp8 M=1: the table's cuda_wgmma_swap, GEMM1's K over clusters of 4 CTAs,
    # GEMM2's experts over 2 (the oracle's splits for 8 active experts on 132 SMs)
    assert cli.main(["explain", "--model", "deepseek-v3-tp8", "--device-name", H200, "--m", "1"]) == 0
    out = capsys.readouterr().out
    assert "M=1: cuda_wgmma_swap (table; swap_ab=True)" in out
    assert "swap_moe_gemm1_act_bf16_n8_s1, swap_moe_gemm2_sum_bf16_n8_s1" in out
    assert "tokens_per_pass=8" in out and "clusters: gemm1 4, gemm2 2" in out


def test_explain_shows_the_swap_gemm1_ring(capsys):
    # deepseek-v3-tp8 M=16: the table's swap-AB with the oracle's rules: its GEMM1 on a ring of
    # 2 stages so that ~404 CTAs fit one wave of 4 per SM; M=8: the table's measured launch, a
    # ring of 3 with GEMM2 by PDL; M=2: the kernel's own ring (no gemm1_ring shown)
    assert cli.main(["explain", "--model", "deepseek-v3-tp8", "--device-name", H200, "--m", "2,8,16"]) == 0
    out = capsys.readouterr().out
    m2, rest = out.split("\nM=8: ")
    m8, m16 = rest.split("\nM=16: ")
    assert "M=2: cuda_wgmma_swap (table; swap_ab=True)" in m2 and "gemm1_ring=" not in m2
    assert m8.startswith("cuda_wgmma_swap (table; swap_ab=True)")
    assert "gemm1_ring=3" in m8 and "gemm1: a ring of 3 stages (0: the kernel's own, 6), as the table measured" in m8
    assert "gemm2_after_gemm1" not in m8
    assert m16.startswith("cuda_wgmma_swap (table; swap_ab=True)")
    assert "gemm1_ring=2" in m16 and "gemm1: a ring of 2 stages (its own: 5)" in m16
    # qwen3-30b-a3b M=8: a ring of 2 and GEMM2 started after GEMM1, as measured
    assert cli.main(["explain", "--model", "qwen3-30b-a3b", "--device-name", H200, "--m", "8"]) == 0
    out = capsys.readouterr().out
    assert "gemm1_ring=2 gemm2_after_gemm1" in out
    assert "gemm2: starts after GEMM1 has finished (no PDL), as the table measured" in out


def test_explain_shows_the_swap_gemm2_ring(capsys):
    # qwen3-30b-a3b fp8_tensor M=1: the e4m3 GEMM2 on a ring of 5 so that its 128 CTAs fit
    # beside GEMM1's; M=2: its own ring (24 k-stages per CTA), with the reason
    assert cli.main(["explain", "--model", "qwen3-30b-a3b", "--quant", "fp8_tensor", "--device-name", H200,
                     "--m", "1,2"]) == 0
    out = capsys.readouterr().out
    m1, m2 = out.split("\nM=2: ")
    assert "gemm2_ring=5" in m1 and "gemm2: a ring of 5 stages (its own: 11)" in m1
    assert "gemm2_ring=" not in m2 and "24 k-stages per CTA are more than 5/2 per stage" in m2


def test_explain_external_backends(tmp_path, monkeypatch, capsys):
    write(tmp_path, _core.table_file_name(32, 512, H200), {"8": {"backend": "vllm_triton"}})
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    argv = ["explain", "--shape", "32,4,1024,512", "--device-name", H200, "--m", "8"]
    assert cli.main(argv + ["--external-backends", "vllm_triton"]) == 0
    assert "M=8: vllm_triton (table; swap_ab=False; swapmoe fallback" in capsys.readouterr().out
    assert cli.main(argv) == 0
    assert "(heuristic;" in capsys.readouterr().out
    assert cli.main(argv + ["--external-backends", "cutlass"]) == 2
    assert "error: --external-backends: expected names from" in capsys.readouterr().err


@pytest.mark.parametrize("quant", ["fp8_tensor", "fp8_channel", "fp8_block128"])
def test_explain_fp8_shows_the_fp8_plan(quant, capsys, monkeypatch):
    monkeypatch.setenv("SWAPMOE_TABLES", "off")  # the heuristics
    argv = ["explain", "--model", "qwen3-30b-a3b", "--device-name", H200, "--quant", quant, "--m", "1,64"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    scheme = quant.split("_")[1].replace("128", "")
    assert f"bf16 {quant}" in out.splitlines()[0]
    # explain plans per-tensor FP8 with static activation scales: GEMM1 writes e4m3 rows (q8)
    gemm1 = "swap_moe_fp8_gemm1_tensor_q8_n8" if scheme == "tensor" else f"swap_moe_fp8_gemm1_{scheme}_n8"
    assert "M=1: cuda_wgmma_swap" in out and gemm1 in out
    # past M = 8 (per channel and block: past 1.5 waves of cuda_wgmma's GEMM1 grid) the e4m3
    # wgmma GEMMs (static per-tensor scales: GEMM1 writes e4m3)
    gemm1 = "wgmma_moe_fp8_gemm1_tensor_q8_t64" if scheme == "tensor" else f"wgmma_moe_fp8_gemm1_{scheme}_t64"
    assert "M=64: cuda_wgmma" in out and gemm1 in out
    if scheme == "tensor":
        assert "cuda_wgmma_swap: not picked, FP8 at M = 64 > 8" in out
    else:  # 12 column blocks x ~125.7 active experts
        assert "cuda_wgmma_swap: not picked, cuda_wgmma's GEMM1 fills ~1508 CTAs, 11.43 waves" in out
    # dynamic per-tensor scales: the dynamic kernels (GEMM1's f32 rows quantized by one kernel)
    assert cli.main(argv + ["--activation-scales", "dynamic"]) == 0
    out = capsys.readouterr().out
    if scheme == "tensor":
        assert "swap_moe_fp8_gemm1_tensor_n8" in out and "M=64: cuda_wgmma" in out
        assert "wgmma_moe_fp8_quant_inter_tensor" in out
    assert cli.main(argv + ["--activation-scales", "static"]) == (0 if scheme == "tensor" else 2)
    if scheme != "tensor":
        assert "--activation-scales: expected None or 'dynamic'" in capsys.readouterr().err


def test_explain_fp8_table_by_activation_scales(capsys):
    # the shipped per-tensor tables were measured with static scales
    argv = ["explain", "--model", "qwen3-30b-a3b", "--device-name", H200, "--quant", "fp8_tensor", "--m", "1",
            "--external-backends", "vllm_triton"]
    assert cli.main(argv) == 0
    assert "M=1: cuda_wgmma_swap (table;" in capsys.readouterr().out
    assert cli.main(argv + ["--activation-scales", "dynamic"]) == 0
    out = capsys.readouterr().out
    assert "(heuristic;" in out and "measured with static activation scales and this call's are dynamic" in out


def test_check_lists_tables(capsys):
    assert cli.main(["check"]) == 0
    out = capsys.readouterr().out
    assert f"tuned tables: {len(SHIPPED_ALL)} loaded" in out
    for name in SHIPPED_ALL:
        assert f"shipped: {name}" in out


# ---------------------------------------------------------------------------------------
# swapmoe tune: pure parts
# ---------------------------------------------------------------------------------------


def test_labels_and_candidates():
    assert T.candidate_label("cuda_mma", 64) == "cuda_mma:t64" and T.candidate_label("cuda_decode") == "cuda_decode"
    assert T.parse_label("cuda_mma:t16") == ("cuda_mma", 16)
    assert T.parse_label("vllm_triton") == ("vllm_triton", None)
    swap = ["cuda_wgmma_swap", "cuda_wgmma_swap:r2p0", "cuda_wgmma_swap:r2p1", "cuda_wgmma_swap:r3p0",
            "cuda_wgmma_swap:r3p1"]
    assert T.swapmoe_candidates("bf16") == ["cuda_decode"] + swap + ["cuda_mma:t16", "cuda_mma:t64", "cuda_mma:t128",
                                                                     "cuda_wgmma:t64", "cuda_wgmma:t128", "cuda_generic"]
    # cuda_wgmma_swap's launch variants: GEMM1's ring, GEMM2 by PDL or after GEMM1
    assert T.swap_launch("cuda_wgmma_swap:r2p0") == (2, False) and T.swap_launch("cuda_wgmma_swap:r0p1") == (0, True)
    for bad in ("cuda_wgmma_swap", "cuda_wgmma_swap:r1p0", "cuda_wgmma_swap:r2p2", "cuda_mma:t16", "cuda_wgmma_swap:r2"):
        assert T.swap_launch(bad) is None, bad
    assert T.parse_label("cuda_wgmma_swap:r3p1") == ("cuda_wgmma_swap", None)
    assert T.entry_label({"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 2, "swap_gemm2_pdl": False}) == "cuda_wgmma_swap:r2p0"
    assert T.entry_label({"backend": "cuda_mma", "token_tile": 16}) == "cuda_mma:t16"
    assert T.swapmoe_candidates("fp32") == ["cuda_decode", "cuda_generic"]
    # the e4m3 GEMM2's ring (FP8 only): r<ring>p<pdl>g<ring>
    assert T.swap_launch("cuda_wgmma_swap:r0p1g7") == (0, True) and T.swap_gemm2_ring("cuda_wgmma_swap:r0p1g7") == 7
    assert T.swap_gemm2_ring("cuda_wgmma_swap:r3p1g0") == 0 and T.swap_gemm2_ring("cuda_wgmma_swap:r3p1") is None
    for bad in ("cuda_wgmma_swap:r0p1g1", "cuda_wgmma_swap:r0p1g", "cuda_wgmma_swap:r0p1gx", "cuda_wgmma_swap:r0pg7"):
        assert T.swap_launch(bad) is None and T.swap_gemm2_ring(bad) is None, bad
    entry = T.set_choice({"backend": "cuda_decode", "token_tile": 16}, "cuda_wgmma_swap:r0p1g7")
    assert entry == {"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 0, "swap_gemm2_pdl": True, "swap_gemm2_ring": 7}
    assert T.entry_label(entry) == "cuda_wgmma_swap:r0p1g7"
    assert "swap_gemm2_ring" not in T.set_choice(entry, "cuda_wgmma_swap:r2p0")
    g2 = [f"cuda_wgmma_swap:{v}" for v in T.SWAP_GEMM2_RING_VARIANTS]
    assert g2 == ["cuda_wgmma_swap:r0p1g5", "cuda_wgmma_swap:r0p1g7"]
    for quant in ("fp8_tensor", "fp8_channel", "fp8_block128"):  # cuda_mma has no FP8 kernels
        wgmma = ["cuda_wgmma:t64", "cuda_wgmma:t128"]
        assert T.swapmoe_candidates("bf16", quant) == ["cuda_decode"] + swap + g2 + wgmma + ["cuda_generic"]
        assert T.swapmoe_candidates("fp32", quant) == ["cuda_decode", "cuda_generic"]


def test_ineligible_candidates_ask_the_oracle():
    shape = T.B.preset_shape("qwen3-30b-a3b")
    assert T.ineligible("cuda_mma:t64", 8, shape, "bf16", H200, (9, 0)) is None
    assert "512" in T.ineligible("cuda_decode", 128, shape, "bf16", H200, (9, 0))
    assert "float32" in T.ineligible("cuda_mma:t16", 8, shape, "fp32", H200, (9, 0))
    assert T.ineligible("cuda_wgmma:t64", 1024, shape, "bf16", H200, (9, 0)) is None
    assert "sm_90" in T.ineligible("cuda_wgmma:t128", 1024, shape, "bf16", "NVIDIA A100-SXM4-80GB", (8, 0))
    # FP8: the oracle is asked with the scheme
    assert T.ineligible("cuda_decode", 1, shape, "bf16", H200, (9, 0), "fp8_block128") is None
    assert T.ineligible("cuda_generic", 64, shape, "bf16", H200, (9, 0), "fp8_channel") is None
    assert T.ineligible("cuda_mma:t16", 8, shape, "bf16", H200, (9, 0), "fp8_tensor") is not None
    assert "8.9" in T.ineligible("cuda_generic", 8, shape, "bf16", "NVIDIA A100-SXM4-80GB", (8, 0), "fp8_tensor")
    # the swap launch variants: bf16/fp16 decode only
    assert T.ineligible("cuda_wgmma_swap:r2p0", 8, shape, "bf16", H200, (9, 0)) is None
    assert "M <= 32" in T.ineligible("cuda_wgmma_swap:r2p0", 64, shape, "bf16", H200, (9, 0))
    assert "SWAPMOE_BACKEND" not in os.environ and "SWAPMOE_MMA_TOKEN_TILE" not in os.environ
    assert "SWAPMOE_SWAP_GEMM1_RING" not in os.environ and "SWAPMOE_SWAP_GEMM2_PDL" not in os.environ
    # a GEMM2 ring only where the plan runs it: the e4m3 GEMM2 two to an SM (not the bf16 one,
    # whose ring is fixed, nor Mixtral's one per SM, nor a ring past the kernel's own)
    assert T.ineligible("cuda_wgmma_swap:r0p1g7", 1, shape, "bf16", H200, (9, 0), "fp8_tensor") is None
    assert "not what the plan runs" in T.ineligible("cuda_wgmma_swap:r0p1g7", 1, shape, "bf16", H200, (9, 0))
    mixtral = T.B.preset_shape("mixtral-8x7b")
    assert "not what the plan runs" in T.ineligible("cuda_wgmma_swap:r0p1g7", 1, mixtral, "bf16", H200, (9, 0),
                                                    "fp8_tensor")
    assert "not what the plan runs" in T.ineligible("cuda_wgmma_swap:r0p1g40", 1, shape, "bf16", H200, (9, 0),
                                                    "fp8_tensor")
    assert "SWAPMOE_SWAP_GEMM2_RING" not in os.environ


def test_forced_swap_launch_sets_and_restores_its_knobs(monkeypatch):
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM1_RING", "3")
    with T.forced("cuda_wgmma_swap:r2p0"):
        assert os.environ["SWAPMOE_BACKEND"] == "cuda_wgmma_swap"
        assert (os.environ["SWAPMOE_SWAP_GEMM1_RING"], os.environ["SWAPMOE_SWAP_GEMM2_PDL"]) == ("2", "0")
        p = plan(8, QWEN3)
        assert (p.source, p.tile["swap_gemm1_ring"], p.tile["swap_gemm2_pdl"]) == ("override", 2, False)
    with T.forced("cuda_wgmma_swap"):  # the rules: neither knob
        assert "SWAPMOE_SWAP_GEMM1_RING" not in os.environ and "SWAPMOE_SWAP_GEMM2_PDL" not in os.environ
    assert os.environ["SWAPMOE_SWAP_GEMM1_RING"] == "3" and "SWAPMOE_SWAP_GEMM2_PDL" not in os.environ
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM2_RING", "4")
    with T.forced("cuda_wgmma_swap:r0p1g7"):
        assert os.environ["SWAPMOE_SWAP_GEMM2_RING"] == "7"
        p = plan(1, QWEN3, quant="fp8_tensor")
        assert (p.source, p.tile["swap_gemm1_ring"], p.tile["swap_gemm2_ring"]) == ("override", 0, 7), p.reasons
    with T.forced("cuda_wgmma_swap:r2p0"):  # no GEMM2 ring: the rule's
        assert "SWAPMOE_SWAP_GEMM2_RING" not in os.environ
    assert os.environ["SWAPMOE_SWAP_GEMM2_RING"] == "4"


def test_forced_restores_the_environment(monkeypatch):
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_generic")
    with T.forced("cuda_mma:t128"):
        assert os.environ["SWAPMOE_BACKEND"] == "cuda_mma" and os.environ["SWAPMOE_MMA_TOKEN_TILE"] == "128"
        p = plan(1024, QWEN3)
        assert (p.source, p.tile["tokens_per_pass"]) == ("override", 128)
    assert os.environ["SWAPMOE_BACKEND"] == "cuda_generic" and "SWAPMOE_MMA_TOKEN_TILE" not in os.environ


def test_points_to_run_resumes_and_force_remeasures():
    table = {"metadata": {}, "1": {"backend": "cuda_decode"}, "64": {"backend": "cuda_mma"}}
    assert T.points_to_run([64, 1, 8, 8], table) == [8]
    assert T.points_to_run([1, 8, 64], table, force=True) == [1, 8, 64]
    assert T.points_to_run([1, 2], None) == [1, 2]


def test_pruning_only_simt_backends_after_a_loss():
    entries = {
        8: {"times_us": {"cuda_decode": 300.0, "cuda_mma:t16": 100.0, "cuda_generic": 150.0}},
        64: {"times_us": {"cuda_generic": 500.0, "cuda_mma:t16": 200.0}},
    }
    assert "3.0x the best at M=8" in T.pruned("cuda_decode", 16, entries)
    assert T.pruned("cuda_decode", 8, entries) is None  # only smaller M count
    assert T.pruned("cuda_generic", 64, entries) is None  # 1.5x at M=8
    assert "2.5x the best at M=64" in T.pruned("cuda_generic", 128, entries)
    assert T.pruned("cuda_mma:t16", 4096, {1: {"times_us": {"cuda_mma:t16": 100.0, "cuda_decode": 1.0}}}) is None
    assert T.pruned("cuda_decode", 16, entries, factor=0) is None


def test_make_entry_and_merge():
    e = T.make_entry({"cuda_mma:t16": 120.0, "cuda_mma:t64": 110.0, "cuda_generic": 300.0, "vllm_triton": 100.0},
                     {"cuda_decode": "it holds at most 512 slots"}, source="test")
    assert e["backend"] == "vllm_triton" and "token_tile" not in e and e["time_us"] == 100.0
    assert list(e["times_us"]) == ["vllm_triton", "cuda_mma:t64", "cuda_mma:t16", "cuda_generic"]
    assert e["best_swapmoe"] == "cuda_mma:t64" and e["skipped"]["cuda_decode"].startswith("it holds")
    e2 = T.make_entry({"cuda_mma:t64": 50.0, "cuda_decode": 60.0})
    assert (e2["backend"], e2["token_tile"]) == ("cuda_mma", 64) and "best_swapmoe" not in e2
    # a swap launch variant wins: the entry carries its ring and GEMM2 launch
    e3 = T.make_entry({"cuda_wgmma_swap": 140.0, "cuda_wgmma_swap:r2p0": 137.7, "vllm_triton": 139.0})
    assert (e3["backend"], e3["swap_gemm1_ring"], e3["swap_gemm2_pdl"]) == ("cuda_wgmma_swap", 2, False)
    assert "token_tile" not in e3 and T.entry_label(e3) == "cuda_wgmma_swap:r2p0"
    # another label made the choice (as benches/merge_anchor.py does): the fields it lacks go
    assert T.set_choice(dict(e3), "cuda_mma:t16") == dict(
        {k: v for k, v in e3.items() if not k.startswith("swap_")}, backend="cuda_mma", token_tile=16)
    assert T.set_choice({"backend": "cuda_mma", "token_tile": 16}, "vllm_triton") == {"backend": "vllm_triton"}
    with pytest.raises(ValueError):
        T.make_entry({})
    meta = {"E": 8, "N": 64, "K": 128, "topk": 2, "device_name": H200, "dtype": "bf16", "quant": None,
            "date": "2026-12-02", "created": "2026-12-02"}
    old = {"metadata": dict(meta, created="2026-12-01", runs=1), "1": {"backend": "cuda_decode"},
           "8": {"backend": "cuda_generic"}}
    new = T.merge_table(old, {8: e2, 4: e}, meta)
    assert list(new) == ["metadata", "1", "4", "8"]
    assert new["8"] is e2 and new["metadata"]["created"] == "2026-12-01" and new["metadata"]["runs"] == 2
    assert T.compatible(old["metadata"], meta) is None
    assert "K=128" in T.compatible(old["metadata"], dict(meta, K=256))


def test_written_table_is_read_by_the_oracle(tmp_path, monkeypatch):
    """The writer's output goes through the Rust parser and steers select_backend."""
    shape = T.B.shard_shape("t", 16, 2, 1024, 512)
    meta = T.table_metadata(shape, "bf16", H200, (9, 0), 8, 0, "timer", {"torch": "x"})
    entries = {
        1: T.make_entry({"cuda_decode": 20.0, "cuda_generic": 15.0, "cuda_mma:t16": 30.0}),
        64: T.make_entry({"cuda_mma:t16": 90.0, "cuda_mma:t64": 80.0, "vllm_triton": 70.0}),
        8: T.make_entry({"cuda_wgmma_swap": 60.0, "cuda_wgmma_swap:r2p0": 55.0, "cuda_mma:t16": 70.0}),
    }
    path = tmp_path / _core.table_file_name(16, 512, H200).replace(",", ";")
    assert T.table_path(str(tmp_path), _core.table_file_name(16, 512, H200)) == str(path)
    T.write_table(str(path), T.merge_table(None, entries, meta))
    assert os.listdir(tmp_path) == [path.name]  # no temporary file left behind
    parsed = _core.read_table(str(path))
    assert parsed["metadata"]["K"] == 1024 and parsed["metadata"]["topk"] == 2
    assert parsed["entries"][64]["backend"] == "vllm_triton"
    assert parsed["entries"][64]["times_us"]["cuda_mma:t64"] == 80.0
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    assert plan(1, (16, 2, 1024, 512)).backend == "cuda_generic"
    p = plan(64, (16, 2, 1024, 512))
    assert (p.backend, p.tile["tokens_per_pass"]) == ("cuda_mma", 64)
    assert plan(64, (16, 2, 1024, 512), external_backends=["vllm_triton"]).backend == "vllm_triton"
    # a swap launch variant's entry: its ring and GEMM2 launch reach the plan
    assert (parsed["entries"][8]["swap_gemm1_ring"], parsed["entries"][8]["swap_gemm2_pdl"]) == (2, False)
    p = plan(8, (16, 2, 1024, 512))
    assert (p.backend, p.source, p.tile["swap_gemm1_ring"], p.tile["swap_gemm2_pdl"]) == ("cuda_wgmma_swap", "table", 2, False)
    assert any("as the table measured" in r for r in p.reasons)


def test_table_path_resumes_either_spelling(tmp_path):
    name = _core.table_file_name(8, 64, H200)
    assert T.table_path(str(tmp_path), name) == str(tmp_path / name.replace(",", ";"))
    (tmp_path / name).write_text("{}")  # a vLLM-spelled file already there is resumed
    assert T.table_path(str(tmp_path), name) == str(tmp_path / name)


def test_read_json_table_and_out_dir(tmp_path, monkeypatch):
    assert T.read_json_table(str(tmp_path / "none.json")) is None
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    with pytest.raises(T.TuneError, match="JSON object"):
        T.read_json_table(str(bad))
    with pytest.raises(T.TuneError, match="--out-dir"):
        T.resolve_out_dir(None)
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path / "env"))
    assert T.resolve_out_dir(None) == str(tmp_path / "env") and (tmp_path / "env").is_dir()
    assert T.resolve_out_dir(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")


# ---------------------------------------------------------------------------------------
# swapmoe tune: errors on a machine without a GPU
# ---------------------------------------------------------------------------------------


def _no_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")


def run_cli(*args, env=None):
    e = dict(os.environ)
    e.pop("SWAPMOE_TABLES_DIR", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "swapmoe", *args], capture_output=True, text=True, timeout=120,
                          env=e)


@pytest.mark.parametrize("quant", ["none", "fp8_block128"])
def test_tune_without_gpu_exits_2_with_a_clear_error(tmp_path, quant):
    _no_gpu()
    r = run_cli("tune", "--model", "qwen3-30b-a3b", "--m", "1,8", "--out-dir", str(tmp_path / "t"), "--quant", quant)
    assert r.returncode == 2, r.stderr
    assert "swapmoe tune: error: needs a CUDA GPU" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert os.listdir(tmp_path / "t") == []  # nothing written


@pytest.mark.parametrize("argv, text", [
    (["tune", "--model", "qwen3-30b-a3b"], "--out-dir"),
    (["tune", "--out-dir", "X"], "name the shapes"),
    (["tune", "--model", "qwen3-30b-a3b,nope", "--out-dir", "X"], "--model"),
    (["tune", "-E", "8", "-K", "64", "--out-dir", "X"], "all four"),
    (["tune", "-E", "8", "-K", "64", "-N", "32", "--topk", "2", "--model", "mixtral-8x7b", "--out-dir", "X"],
     "not with"),
    (["tune", "--model", "qwen3-30b-a3b", "--m", "0", "--out-dir", "X"], "--m"),
])
def test_tune_bad_requests_exit_2(argv, text, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv + ["--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "swapmoe tune: error:" in err and text in err, err


def test_tune_parser():
    a = cli.build_parser().parse_args(["tune", "--model", "qwen3-30b-a3b,mixtral-8x7b", "--out-dir", "d"])
    assert a.m == ",".join(map(str, T.DEFAULT_M)) and a.vllm and a.check and not a.force
    assert a.layers == 8 and a.prune == T.DEFAULT_PRUNE and a.dtype == "bf16"
    shapes = cli._tune_shapes(a)
    assert [s.key() for s in shapes] == [QWEN3, MIXTRAL]
    a = cli.build_parser().parse_args(["tune", "-E", "64", "-K", "1024", "-N", "512", "--topk", "4", "--tp", "2"])
    assert [s.key() for s in cli._tune_shapes(a)] == [(64, 4, 1024, 256)]


# ---------------------------------------------------------------------------------------
# swapmoe tune: the sweep, with a fake device
# ---------------------------------------------------------------------------------------


class FakeRunner(T.Runner):
    """Deterministic times: decode wins at M <= 2, generic is slow, the tiles trade places,
    vLLM's Triton wins at M = 64."""

    def __init__(self, wrong=(), fail=(), stop_at=None, vllm=True):
        self.labels = T.swapmoe_candidates("bf16") + (["vllm_triton"] if vllm else [])
        self.wrong, self.fail, self.stop_at = set(wrong), set(fail), stop_at
        self.timed = []
        self.shapes = []

    def start_shape(self, shape):
        self.shapes.append(shape.name)

    def inputs(self, shape, M):
        return M

    def ineligible(self, label, shape, M):
        if label == "cuda_decode" and M * shape.topk > 512:
            return f"it holds at most M*topk = 512 slots, got {M * shape.topk}"
        return None

    def check(self, labels, M):
        return {lb: ("check failed: rel_err 1 > 0.01" if lb in self.wrong else None) for lb in labels}

    def time_us(self, label, M):
        if M == self.stop_at:
            raise KeyboardInterrupt
        if label in self.fail:
            raise RuntimeError("CUDA error: boom")
        self.timed.append((label, M))
        base = {"cuda_decode": 10.0 * M if M <= 2 else 15.0 * M, "cuda_mma:t16": 15.0 + 4.0 * M,
                "cuda_mma:t64": 35.0 + 2.0 * M,
                "cuda_mma:t128": 60.0 + 2.0 * M, "cuda_generic": 12.0 * M + 5.0,
                "vllm_triton": 100.0 if M == 64 else 1e6}
        return base[label], "graph"


def _plans(tmp_path, ms, force=False, shapes=None, K=1024):
    shapes = shapes or [T.B.shard_shape("fake", 16, 8, K, 512)]
    return T.prepare(
        shapes, str(tmp_path), ms, force,
        meta_of=lambda sh: T.table_metadata(sh, "bf16", H200, (9, 0), 8, 0, "fake timer", {}),
        file_name=lambda sh: _core.table_file_name(sh.E, sh.N, H200, "bf16"))


def test_sweep_writes_a_table_the_oracle_follows(tmp_path, monkeypatch):
    runner = FakeRunner()
    [s] = T.sweep(_plans(tmp_path, [1, 2, 8, 64, 128]), runner)
    assert s["measured"] == [1, 2, 8, 64, 128]
    t = _core.read_table(s["path"])
    assert s["path"].endswith("E=16;N=512;device_name=NVIDIA_H200;dtype=bf16.json")
    e = t["entries"]
    assert e[1]["backend"] == "cuda_decode" and e[2]["backend"] == "cuda_decode"
    assert (e[8]["backend"], e[8]["token_tile"]) == ("cuda_mma", 16)
    assert e[64]["backend"] == "vllm_triton"
    assert (e[128]["backend"], e[128]["token_tile"]) == ("cuda_mma", 64)
    # decode was more than 2x the best at M=8 (120 vs 47): pruned from M=64 on
    with open(s["path"], encoding="utf-8") as f:
        raw = json.load(f)
    assert raw["64"]["skipped"]["cuda_decode"].startswith("pruned: ")
    assert raw["128"]["skipped"]["cuda_decode"].startswith("it holds at most")
    assert ("cuda_decode", 64) not in runner.timed
    assert raw["64"]["best_swapmoe"] == "cuda_mma:t64" and raw["metadata"]["runs"] == 1
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    shape = (16, 8, 1024, 512)
    assert plan(2, shape).source == "table" and plan(2, shape).backend == "cuda_decode"
    p = plan(64, shape)
    assert (p.backend, p.tile["tokens_per_pass"]) == ("cuda_mma", 64)  # vllm_triton skipped outside vLLM
    assert plan(64, shape, external_backends=["vllm_triton"]).backend == "vllm_triton"


def test_sweep_times_a_pruned_candidate_where_no_other_can_run(tmp_path):
    """FP8 past the swap and decode kernels' limits: cuda_generic, pruned at small M, is the
    only candidate left, and the table gets its time instead of no entry."""

    class TwoSimt(FakeRunner):
        def __init__(self):
            super().__init__(vllm=False)
            self.labels = ["cuda_decode", "cuda_generic"]

        def time_us(self, label, M):
            self.timed.append((label, M))
            return (10.0 if label == "cuda_decode" else 100.0) * M, "graph"

    runner = TwoSimt()
    [s] = T.sweep(_plans(tmp_path, [1, 8, 128]), runner)
    assert s["measured"] == [1, 8, 128]
    assert ("cuda_generic", 8) not in runner.timed  # pruned: decode runs M = 8
    assert ("cuda_generic", 128) in runner.timed  # decode holds at most 512 slots
    with open(s["path"], encoding="utf-8") as f:
        raw = json.load(f)
    assert raw["8"]["skipped"]["cuda_generic"].startswith("pruned: 10.0x the best at M=1")
    assert raw["128"]["backend"] == "cuda_generic"
    note = raw["128"]["skipped"]["cuda_generic (note)"]
    assert note.startswith("timed although pruned: ") and note.endswith("no other candidate runs M=128")


def test_sweep_resumes_after_an_interruption(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        T.sweep(_plans(tmp_path, [1, 2, 8, 64]), FakeRunner(stop_at=8))
    [path] = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    assert sorted(_core.read_table(path)["entries"]) == [1, 2]  # written after each M
    runner = FakeRunner()
    plans = _plans(tmp_path, [1, 2, 8, 64])
    assert plans[0].todo == [8, 64]
    [s] = T.sweep(plans, runner)
    assert s["measured"] == [8, 64] and s["skipped_m"] == [1, 2]
    assert {m for _, m in runner.timed} == {8, 64}
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    assert [k for k in raw if k != "metadata"] == ["1", "2", "8", "64"] and raw["metadata"]["runs"] == 2
    # --force re-measures everything
    assert _plans(tmp_path, [1, 2, 8, 64], force=True)[0].todo == [1, 2, 8, 64]
    # nothing to do: no timing at all
    runner = FakeRunner()
    T.sweep(_plans(tmp_path, [1, 64]), runner)
    assert runner.timed == []


def test_sweep_drops_wrong_and_failing_candidates(tmp_path):
    runner = FakeRunner(wrong={"cuda_mma:t16"}, fail={"cuda_generic"}, vllm=False)
    [s] = T.sweep(_plans(tmp_path, [1, 8]), runner)
    assert not any(lb == "cuda_mma:t16" for lb, _ in runner.timed)  # dropped at the first M, for all M
    e8 = s["entries"][8]
    assert e8["skipped"]["cuda_mma:t16"].startswith("dropped for this shape: check failed")
    assert e8["skipped"]["cuda_generic"] == "failed: RuntimeError: CUDA error: boom"
    assert (e8["backend"], e8["token_tile"]) == ("cuda_mma", 64)
    assert "vllm_triton" not in e8["times_us"]


def test_sweep_stops_when_the_device_is_lost(tmp_path):
    class Lost(FakeRunner):
        def time_us(self, label, M):
            if M == 8:
                raise T.DeviceLost("cuda_mma:t16 broke the CUDA context")
            return super().time_us(label, M)

    with pytest.raises(T.DeviceLost):
        T.sweep(_plans(tmp_path, [1, 8, 64]), Lost())
    [path] = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    assert sorted(_core.read_table(path)["entries"]) == [1]


def test_prepare_refuses_a_table_of_another_k(tmp_path):
    T.sweep(_plans(tmp_path, [1]), FakeRunner())
    with pytest.raises(T.TuneError, match="K=1024"):
        _plans(tmp_path, [1, 2], K=2048)
    plans = _plans(tmp_path, [1, 2], K=2048, force=True)
    assert plans[0].old is None and plans[0].todo == [1, 2]
    [path] = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    with open(path, "w", encoding="utf-8") as f:
        f.write("{broken")
    with pytest.raises(T.TuneError, match="JSON"):
        _plans(tmp_path, [1])
    assert _plans(tmp_path, [1], force=True)[0].todo == [1]


# ---------------------------------------------------------------------------------------
# swapmoe tune --quant fp8_*
# ---------------------------------------------------------------------------------------

FP8_QUANTS = ["fp8_tensor", "fp8_channel", "fp8_block128"]


class FakeFp8Runner(FakeRunner):
    """FP8 candidates: decode wins at M = 1, generic at M = 8, vLLM's Triton from M = 64 (the
    swap-AB kernels and the wgmma GEMMs never)."""

    def __init__(self, vllm=True, quant="fp8_tensor"):
        super().__init__(vllm=False)
        self.labels = T.swapmoe_candidates("bf16", quant) + (["vllm_triton"] if vllm else [])

    def time_us(self, label, M):
        self.timed.append((label, M))
        base = {"cuda_decode": 30.0 if M == 1 else 40.0 * M, "cuda_generic": 35.0 + 3.0 * M,
                "cuda_wgmma_swap": 100.0 + 50.0 * M, "cuda_wgmma:t64": 300.0 + 1.0 * M,
                "cuda_wgmma:t128": 310.0 + 1.0 * M,
                "vllm_triton": 60.0 + 2.0 * M}
        # the swap-AB launch variants time as the swap kernels do (never the fastest)
        return base[T.parse_label(label)[0]], "graph"


@pytest.mark.parametrize("quant", FP8_QUANTS)
def test_fp8_sweep_writes_a_table_the_oracle_follows(quant, tmp_path, monkeypatch):
    shape = T.B.shard_shape("fake", 16, 8, 1024, 512)
    plans = T.prepare(
        [shape], str(tmp_path), [1, 8, 64], False,
        meta_of=lambda sh: T.table_metadata(sh, "bf16", H200, (9, 0), 8, 0, "fake timer", {}, quant),
        file_name=lambda sh: _core.table_file_name(sh.E, sh.N, H200, "bf16", quant))
    runner = FakeFp8Runner(quant=quant)
    [s] = T.sweep(plans, runner)
    # cuda_wgmma's FP8 GEMMs take per-tensor and per-channel scales (the oracle refuses blocks)
    wgmma = {"cuda_wgmma:t64", "cuda_wgmma:t128"}
    # the swap-AB launch variants at M <= 32 (1 and 8 here), with the e4m3 GEMM2's rings
    variants = {(f"cuda_wgmma_swap:{v}", M) for v in T.SWAP_LAUNCH_VARIANTS + T.SWAP_GEMM2_RING_VARIANTS
                for M in (1, 8)}
    assert variants <= set(runner.timed)
    assert {lb for lb, _ in runner.timed} == ({"cuda_decode", "cuda_wgmma_swap", "cuda_generic", "vllm_triton"}
                                              | wgmma | {lb for lb, _ in variants})
    key = {"fp8_tensor": "dtype=fp8_w8a8.json", "fp8_channel": "dtype=fp8_w8a8;per_channel=true.json",
           "fp8_block128": "dtype=fp8_w8a8;block_shape=[128;128].json"}[quant]
    assert s["path"].endswith("E=16;N=512;device_name=NVIDIA_H200;" + key)
    with open(s["path"], encoding="utf-8") as f:
        raw = json.load(f)
    assert raw["metadata"]["quant"] == quant and raw["metadata"]["dtype"] == "bf16"
    # the bench's per-tensor inputs carry calibrated scales; the other schemes have dynamic ones
    want_scales = "static" if quant == "fp8_tensor" else "dynamic"
    assert raw["metadata"]["activation_scales"] == want_scales
    assert _core.read_table(s["path"])["metadata"]["activation_scales"] == want_scales
    assert "FP8 inputs as swapmoe bench --quant" in raw["metadata"]["method"]
    e = _core.read_table(s["path"])["entries"]
    assert (e[1]["backend"], e[8]["backend"], e[64]["backend"]) == ("cuda_decode", "cuda_generic", "vllm_triton")
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    dims = (16, 8, 1024, 512)
    for m, want in ((1, "cuda_decode"), (8, "cuda_generic"), (64, "cuda_generic")):
        p = plan(m, dims, quant=quant)
        assert (p.backend, p.source, p.table_m) == (want, "table", m), p.reasons
        assert p.table.endswith(key)
    p = plan(64, dims, quant=quant, external_backends=["vllm_triton"])
    assert (p.backend, p.source, p.fallback) == ("vllm_triton", "table", "cuda_generic")
    # the bf16 table of the shape is another file: FP8 entries never steer unquantized calls
    assert plan(1, dims).source == "heuristic"
    # a rerun with another scheme or dtype does not mix into this file
    other = T.table_metadata(shape, "fp16", H200, (9, 0), 8, 0, "t", {}, quant)
    assert "dtype='bf16'" in T.compatible(raw["metadata"], other)


def _fake_vllm_fp8(calls, wrong=False):
    """vLLM's fp8_w8a8_moe_quant_config and fused_experts(..., quant_config=) in terms of
    swapmoe's CPU op (so the mapping of the scales is what is tested)."""
    import types as _types

    import swapmoe as sm

    def quant_config(**kw):
        calls.append(("config", kw))
        return _types.SimpleNamespace(**kw)

    def fused_experts(x, w1, w2, tw, ids, quant_config=None, expert_map=None, global_num_experts=-1):
        qc = quant_config
        calls.append(("call", qc))
        assert qc.per_act_token_quant == qc.per_out_ch_quant
        kw = {} if expert_map is None else {"expert_map": expert_map, "global_num_experts": global_num_experts}
        y = sm.fused_experts(x, w1, w2, tw, ids, use_fp8_w8a8=True, w1_scale=qc.w1_scale, w2_scale=qc.w2_scale,
                             a1_scale=qc.a1_scale, a2_scale=qc.a2_scale, per_channel_quant=qc.per_out_ch_quant,
                             block_shape=qc.block_shape, **kw)
        return y * 1.5 if wrong else y

    return fused_experts, quant_config


@pytest.mark.parametrize("quant", FP8_QUANTS)
def test_fp8_gpu_runner_builds_bench_inputs_and_checks_on_the_cpu(quant, monkeypatch):
    """GpuRunner's FP8 parts that need no GPU: the weights, scales and activation scales as
    swapmoe bench --quant builds them, the check of swapmoe's candidates (FP8 reference,
    the dtype's tolerance) and of vLLM's (its quant config built from the same scales)."""
    import contextlib

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(T, "forced", lambda label: contextlib.nullcontext())  # the CPU path runs the op
    calls = []
    fe, qc = _fake_vllm_fp8(calls)
    shape = T.B.shard_shape("t", 8, 2, 256, 200, 1, 2)  # expert parallel, a partial 128-block
    runner = T.GpuRunner(torch, torch.device("cpu"), "bf16", 2, 0, H200, (9, 0), T.make_vllm_fp8_impl(fe, qc),
                         lambda s: None, quant)
    wgmma = ["cuda_wgmma:t64", "cuda_wgmma:t128"]
    variants = [f"cuda_wgmma_swap:{v}" for v in T.SWAP_LAUNCH_VARIANTS + T.SWAP_GEMM2_RING_VARIANTS]
    assert runner.labels == ["cuda_decode", "cuda_wgmma_swap"] + variants + wgmma + ["cuda_generic", "vllm_triton"]
    runner.start_shape(shape)
    try:
        assert runner.weights[0][0].dtype == torch.float8_e4m3fn
        fp8 = runner.qargs[0]["fp8"]
        assert fp8["use_fp8_w8a8"] and (fp8["a1_scale"] is not None) == (quant == "fp8_tensor")
        inputs = runner.inputs(shape, 5)
        assert runner.check(runner.labels, inputs) == {lb: None for lb in runner.labels}
        cfg = [c for k, c in calls if k == "config"][0]
        if quant == "fp8_channel":
            assert cfg["per_out_ch_quant"] and tuple(cfg["w1_scale"].shape) == (4, 400, 1)
        elif quant == "fp8_block128":
            assert cfg["block_shape"] == [128, 128] and tuple(cfg["w1_scale"].shape) == (4, 4, 2)
        else:
            assert cfg["a1_scale"] is fp8["a1_scale"] and cfg["a2_scale"] is fp8["a2_scale"]
        # a wrong vLLM result is caught by its own (looser) bound, swapmoe's candidates still pass
        bad_fe, bad_qc = _fake_vllm_fp8([], wrong=True)
        runner.impls["vllm_triton"] = (T.make_vllm_fp8_impl(bad_fe, bad_qc), True)
        res = runner.check(runner.labels, inputs)
        assert res["cuda_decode"] is None and res["cuda_wgmma_swap"] is None and res["cuda_generic"] is None
        assert res["vllm_triton"].startswith("check failed") and "> 0.05" in res["vllm_triton"]
    finally:
        runner.end_shape()


def test_vllm_fp8_quant_config_not_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    fn, why = T.load_vllm_fp8_quant_config()
    assert fn is None and "not importable" in why


# ---------------------------------------------------------------------------------------
# swapmoe tune: expert-parallel shards, topk, the swap launch variants' M limit
# ---------------------------------------------------------------------------------------


def test_table_of_an_ep_shard_carries_the_local_e_the_oracle_reads():
    """Under --ep a GPU holds E/ep experts: the table's metadata says the local E (the global
    one beside it). (The next test writes the table and reads it back.)"""
    shape = T.B.shard_shape("t", 16, 2, 1024, 512, ep=2)
    meta = T.table_metadata(shape, "bf16", H200, (9, 0), 8, 0, "timer", {})
    assert (meta["E"], meta["E_global"], meta["ep"]) == (8, 16, 2)


def test_written_ep_table_is_read_with_the_local_e(tmp_path):
    shape = T.B.shard_shape("t", 16, 2, 1024, 512, ep=2)
    meta = T.table_metadata(shape, "bf16", H200, (9, 0), 8, 0, "timer", {})
    path = tmp_path / _core.table_file_name(shape.E, shape.N, H200).replace(",", ";")
    assert path.name.startswith("E=8;N=512;")
    T.write_table(str(path), T.merge_table(None, {1: T.make_entry({"cuda_decode": 10.0, "cuda_generic": 12.0})},
                                           meta))
    parsed = _core.read_table(str(path))
    assert parsed["metadata"]["E"] == 8 and parsed["entries"][1]["backend"] == "cuda_decode"


class _FakeTimer:
    method = "fake timer"


def _fake_h200(monkeypatch):
    """run_tune's device faked as an H200 (no GPU here; needs torch): the GPU runner is the
    test's to fake."""
    torch = pytest.importorskip("torch")
    import swapmoe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: None)
    monkeypatch.setattr(T.B, "resolve_device", lambda torch_, device: torch.device("cuda", 0))
    monkeypatch.setattr(_core, "device_info", lambda index: {"name": H200, "capability": (9, 0)})
    monkeypatch.setattr(swapmoe, "warmup", lambda index=None: [])


@pytest.mark.parametrize("quant", ["none", "fp8_block128"])
def test_run_tune_names_each_table_by_the_local_e_and_the_quant(quant, tmp_path, monkeypatch):
    """run_tune with the device faked (no GPU here): an --ep 2 shape's table goes to the file
    of its local E (what the oracle looks up on that GPU) with the FP8 scheme in the name, and
    the table written there is one the Rust reader accepts."""
    _fake_h200(monkeypatch)
    made = []

    def fake_runner(torch_, dev, dtype, layers, seed, device_name, capability, vllm_fn, say, q):
        assert (device_name, capability, q, vllm_fn) == (H200, (9, 0), quant, None)
        r = FakeRunner(vllm=False) if q == "none" else FakeFp8Runner(vllm=False, quant=q)
        r.timer = _FakeTimer()
        made.append(r)
        return r

    monkeypatch.setattr(T, "GpuRunner", fake_runner)
    shape = T.B.shard_shape("fake", 16, 4, 1024, 512, ep=2)
    [s] = T.run_tune([shape], out_dir=str(tmp_path), quant=quant, m_list=[1, 8], vllm=False, progress=False)
    want = tmp_path / _core.table_file_name(8, 512, H200, "bf16", None if quant == "none" else quant).replace(",", ";")
    assert s["path"] == str(want) and os.listdir(tmp_path) == [want.name]
    assert want.name.startswith("E=8;N=512;device_name=NVIDIA_H200;dtype=")
    assert ("fp8_w8a8" in want.name) == (quant != "none")
    assert made and made[0].timed and s["measured"] == [1, 8]
    parsed = _core.read_table(str(want))
    assert parsed["metadata"]["E"] == 8 and sorted(parsed["entries"]) == [1, 8]
    with open(want, encoding="utf-8") as f:
        raw = json.load(f)
    assert (raw["metadata"]["E_global"], raw["metadata"]["ep"]) == (16, 2)
    assert raw["metadata"]["quant"] == (None if quant == "none" else quant)


def test_run_tune_per_hidden_size_names_the_table_by_k(tmp_path, monkeypatch):
    """--per-hidden-size: the table goes to the file named with its K, which the oracle reads
    for calls of that K only."""
    _fake_h200(monkeypatch)

    def fake_runner(*args):
        r = FakeRunner(vllm=False)
        r.timer = _FakeTimer()
        return r

    monkeypatch.setattr(T, "GpuRunner", fake_runner)
    shape = T.B.shard_shape("fake", 16, 4, 1024, 512)
    [s] = T.run_tune([shape], out_dir=str(tmp_path), m_list=[1, 8], vllm=False, progress=False,
                     per_hidden_size=True)
    want = tmp_path / "E=16;N=512;K=1024;device_name=NVIDIA_H200;dtype=bf16.json"
    assert s["path"] == str(want) and os.listdir(tmp_path) == [want.name]
    assert _core.read_table(str(want))["metadata"]["K"] == 1024
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    assert "K=1024" in (plan(8, (16, 4, 1024, 512)).table or "")
    assert plan(8, (16, 4, 2048, 512)).source == "heuristic"


def test_cli_per_hidden_size_reaches_run_tune(monkeypatch, tmp_path, capsys):
    got = {}

    def fake_run_tune(shapes, **kw):
        got.update(kw)
        return [{"shape": shapes[0].name, "path": str(tmp_path / "t.json"), "skipped_m": [], "entries": {}}]

    monkeypatch.setattr(T, "run_tune", fake_run_tune)
    from swapmoe import cli

    assert cli.main(["tune", "--shape", "8,2,64,32", "--out-dir", str(tmp_path), "--per-hidden-size"]) == 0
    assert got["per_hidden_size"] is True
    assert cli.main(["tune", "--shape", "8,2,64,32", "--out-dir", str(tmp_path)]) == 0
    assert got["per_hidden_size"] is False
    capsys.readouterr()


def test_prepare_refuses_a_table_of_another_topk(tmp_path):
    """The same file name (E, N, device, dtype) measured with another topk is not resumed."""
    T.sweep(_plans(tmp_path, [1]), FakeRunner())  # topk 8
    with pytest.raises(T.TuneError, match="topk=8"):
        _plans(tmp_path, [1, 2], shapes=[T.B.shard_shape("fake", 16, 4, 1024, 512)])
    plans = _plans(tmp_path, [1, 2], shapes=[T.B.shard_shape("fake", 16, 4, 1024, 512)], force=True)
    assert plans[0].old is None and plans[0].todo == [1, 2]


def test_swap_launch_variants_are_timed_up_to_m_32_inclusive():
    shape = T.B.preset_shape("qwen3-30b-a3b")
    assert T.SWAP_LAUNCH_MAX_M == 32
    for label in ("cuda_wgmma_swap:r2p0", "cuda_wgmma_swap:r3p1"):
        assert T.ineligible(label, 32, shape, "bf16", H200, (9, 0)) is None
        assert "M <= 32" in T.ineligible(label, 33, shape, "bf16", H200, (9, 0))
    assert T.ineligible("cuda_wgmma_swap:r0p1g7", 32, shape, "bf16", H200, (9, 0), "fp8_tensor") is None


def test_a_misspelt_tables_switch_keeps_the_tables_and_says_so(monkeypatch):
    """$SWAPMOE_TABLES=of (a typo of off) leaves the tables on, as any value but off/0/none
    does, and the reason is among the folders' errors that `swapmoe check` prints."""
    monkeypatch.setenv("SWAPMOE_TABLES", "of")
    info = _core.tables_info()
    assert any(e.startswith("$SWAPMOE_TABLES: expected off") and '"of"' in e for e in info["dir_errors"])
    assert info["files"], "the tables stay on"
    monkeypatch.setenv("SWAPMOE_TABLES", "off")
    assert not any("SWAPMOE_TABLES" in e for e in _core.tables_info()["dir_errors"])
