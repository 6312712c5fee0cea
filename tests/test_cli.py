"""The command line (`swapmoe bench`, `swapmoe check`) and the benchmark helpers, on the CPU."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from swapmoe import bench as B
from swapmoe import cli

torch = pytest.importorskip("torch")

# (E, topk, K, N) typed in again from the model cards, not copied from bench.PRESETS
EXPECTED_PRESETS = {
    "mixtral-8x7b": (8, 2, 4096, 14336),
    "mixtral-8x22b": (8, 2, 6144, 16384),
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "qwen3-235b-a22b": (128, 8, 4096, 1536),
    "deepseek-v3": (256, 8, 7168, 2048),
    "deepseek-v3-tp8": (256, 8, 7168, 256),
    "gpt-oss-120b": (128, 4, 2880, 2880),
    "llama4-scout": (16, 1, 5120, 8192),
}

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swapmoe", *args], capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------------------------
# argument parsing
# ---------------------------------------------------------------------------------------


def test_build_is_not_a_profiling_build():
    """Wheels that tests and users run are release builds: the per-CTA stamps of
    `SWAPMOE_CUDA_STAMPS=1` (benches/stamps.py) stay out of them. Set
    SWAPMOE_EXPECT_STAMPS_BUILD=1 to run the suite on a profiling build on purpose."""
    import swapmoe

    info = swapmoe.build_info()
    assert info["cuda_stamps"] is (os.environ.get("SWAPMOE_EXPECT_STAMPS_BUILD") == "1")
    # a timing probe (SWAPMOE_CUDA_PROBE=no_mma) computes wrong results: never the tested build
    assert info["cuda_probe"] is None


def test_parser_defaults():
    a = cli.build_parser().parse_args(["bench"])
    assert a.command == "bench"
    assert (a.model, a.shape, a.hf_config) == (None, None, None)
    assert (a.tp, a.ep, a.layers, a.seed) == (1, 1, 8, 0)
    assert a.dtype == "bf16" and a.routing == "uniform" and a.device == "auto"
    assert a.quant == "none" and a.read_bw is None and a.gemm_tflops is None
    assert a.graph is True and a.check is True and a.check_all is False
    assert a.baselines is None  # decided by the device: on for GPU, off for CPU
    assert a.m is None and a.json is None and a.csv is None and a.plot is None
    assert a.progress is True


def test_parser_flags():
    a = cli.build_parser().parse_args([
        "bench", "--model", "mixtral-8x7b", "--tp", "2", "--ep", "4", "--dtype", "fp16", "--m", "1,8",
        "--routing", "skewed", "--layers", "4", "--no-graph", "--baselines", "--no-check", "--json", "o.json",
        "--csv", "--plot", "p.png", "--device", "cpu", "--no-progress"])
    assert a.model == "mixtral-8x7b" and (a.tp, a.ep, a.layers) == (2, 4, 4)
    assert a.dtype == "fp16" and a.m == "1,8" and a.routing == "skewed"
    assert a.graph is False and a.baselines is True and a.check is False
    assert a.json == "o.json" and a.csv == "-" and a.plot == "p.png" and a.progress is False
    assert cli.build_parser().parse_args(["bench", "--out", "x.json", "--csv", "t.csv"]).json == "x.json"
    assert cli.build_parser().parse_args(["bench", "--csv", "t.csv"]).csv == "t.csv"
    assert cli.build_parser().parse_args(["bench", "--no-baselines"]).baselines is False
    a = cli.build_parser().parse_args(["bench", "--quant", "fp8_block128", "--gemm-tflops", "750"])
    assert a.quant == "fp8_block128" and a.gemm_tflops == 750.0


@pytest.mark.parametrize("argv", [
    ["bench", "--model", "qwen3-30b-a3b", "--shape", "8,2,64,32"],
    ["bench", "--dtype", "fp8"],
    ["bench", "--quant", "fp8"],
    ["bench", "--quant", "int4"],
    ["bench", "--routing", "zipf"],
    ["bench", "--layers", "many"],
    ["frobnicate"],
])
def test_parser_rejects(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "bench" in capsys.readouterr().out


@pytest.mark.parametrize("argv, text", [
    (["bench", "--model", "no-such-model"], "--model"),
    (["bench", "--model", "qwen3-30b-a3b", "--tp", "5"], "--tp"),
    (["bench", "--model", "qwen3-30b-a3b", "--ep", "3"], "--ep"),
    (["bench", "--shape", "8,2,64"], "--shape"),
    (["bench", "--m", "1,x"], "--m"),
    (["bench", "--m", "0"], "--m"),
    (["bench", "--tp", "2"], "--tp"),
    (["bench", "--hf-config", "/nonexistent/config.json"], "--hf-config"),
    (["bench", "--device", "tpu"], "--device"),
    # found by an audit (2026-12-07): each of these hung, ran with a silent default, or ended
    # in a traceback (or only after the whole run)
    (["bench", "--shape", ""], "--shape: expected four integers"),
    (["bench", "--model", ""], "--model: expected one of"),
    (["bench", "--layers", "99999999999"], "--layers: expected an integer in [1, 1024]"),
    (["bench", "--layers", "0"], "--layers"),
    (["bench", "--seed", "99999999999999999999999"], "--seed: expected an integer in [0, 2^62]"),
    (["bench", "--seed", "-1"], "--seed"),
    (["bench", "--zipf-s", "-5"], "--zipf-s: expected a finite exponent"),
    (["bench", "--zipf-s", "inf"], "--zipf-s"),
    (["bench", "--read-bw", "0"], "--read-bw: expected a positive finite number"),
    (["bench", "--read-bw", "nan"], "--read-bw"),
    (["bench", "--gemm-tflops", "-1"], "--gemm-tflops"),
    (["bench", "--device", ""], "--device"),
    (["bench", "--device", "cpu:1"], "--device"),
    (["bench", "--m", "4294967296"], "--m: expected token counts in [1, 2^31 - 1]"),
    (["bench", "--json", "/nonexistent/dir/x.json"], "--json: expected a path in an existing folder"),
    (["bench", "--csv", "/nonexistent/dir/x.csv"], "--csv"),
    (["bench", "--plot", "/nonexistent/dir/x.png"], "--plot"),
    (["explain", "--shape", "", "--device-name", "NVIDIA H200"], "--shape: expected four integers"),
    (["explain", "--model", "", "--device-name", "NVIDIA H200"], "--model: expected one of"),
    (["explain", "--model", "qwen3-30b-a3b", "--device-name", "NVIDIA H200", "--m", "99999999999999999999999"],
     "--m: expected token counts"),
    (["explain", "--model", "qwen3-30b-a3b", "--device-name", ""], "--device-name (or --capability): expected"),
    (["explain", "--model", "qwen3-30b-a3b", "--device-name", "NVIDIA H200", "--backend", "foo"],
     "--backend: expected one of"),
    (["tune", "--model", "qwen3-30b-a3b", "--layers", "5000", "--out-dir", "/tmp"], "--layers"),
])
def test_bad_values_exit_2_with_message(argv, text, capsys):
    assert cli.main(argv + (["--no-progress"] if argv[0] in ("bench", "tune") else [])) == 2
    err = capsys.readouterr().err
    assert "error" in err and text in err


def test_m_list():
    assert B.parse_m_list("16,1, 4,4") == [1, 4, 16]
    with pytest.raises(B.BenchError):
        B.parse_m_list("")


# ---------------------------------------------------------------------------------------
# shapes: presets, sharding, config.json
# ---------------------------------------------------------------------------------------


def test_preset_list_is_complete():
    assert set(B.PRESETS) == set(EXPECTED_PRESETS)


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_preset_numbers(name):
    s = B.preset_shape(name)
    assert (s.E, s.topk, s.K, s.N) == EXPECTED_PRESETS[name]
    assert (s.tp, s.ep, s.E_global, s.name) == (1, 1, EXPECTED_PRESETS[name][0], name)
    E, _, K, N = EXPECTED_PRESETS[name]
    assert s.weight_bytes(2) == E * 3 * N * K * 2
    assert B.preset_shape(name.upper()).key() == s.key()


def test_tp_divides_n():
    s = B.preset_shape("deepseek-v3", tp=8)
    assert s.key() == EXPECTED_PRESETS["deepseek-v3-tp8"] and s.tp == 8
    assert B.preset_shape("mixtral-8x7b", tp=2).N == 7168
    with pytest.raises(B.BenchError, match="--tp"):
        B.preset_shape("qwen3-30b-a3b", tp=5)  # 768 % 5


def test_ep_divides_e():
    s = B.preset_shape("qwen3-30b-a3b", ep=4)
    assert (s.E, s.E_global, s.ep, s.topk, s.N) == (32, 128, 4, 8, 768)
    s = B.preset_shape("deepseek-v3", tp=2, ep=8)
    assert (s.E, s.E_global, s.N, s.K) == (32, 256, 1024, 7168)
    assert s.name == "deepseek-v3-tp2-ep8"
    with pytest.raises(B.BenchError, match="--ep"):
        B.preset_shape("mixtral-8x7b", ep=3)
    with pytest.raises(B.BenchError):
        B.preset_shape("mixtral-8x7b", tp=0)


def test_parse_shape():
    s = B.parse_shape("64, 6, 1024, 512", tp=2, ep=4)
    assert (s.E, s.E_global, s.topk, s.K, s.N, s.source) == (16, 64, 6, 1024, 256, "shape")
    with pytest.raises(B.BenchError, match="topk"):
        B.parse_shape("4,8,64,32")


def _write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return str(p)


@pytest.mark.parametrize("cfg, expect", [
    # Mixtral: num_local_experts, intermediate_size
    ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 4096,
      "intermediate_size": 14336}, (8, 2, 4096, 14336)),
    # Qwen3-MoE: the dense intermediate_size must lose to moe_intermediate_size
    ({"model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "hidden_size": 2048,
      "intermediate_size": 6144, "moe_intermediate_size": 768}, (128, 8, 2048, 768)),
    # DeepSeek-V3: n_routed_experts
    ({"model_type": "deepseek_v3", "n_routed_experts": 256, "num_experts_per_tok": 8, "hidden_size": 7168,
      "intermediate_size": 18432, "moe_intermediate_size": 2048}, (256, 8, 7168, 2048)),
    # gpt-oss: experts_per_token
    ({"model_type": "gpt_oss", "num_local_experts": 128, "experts_per_token": 4, "hidden_size": 2880,
      "intermediate_size": 2880}, (128, 4, 2880, 2880)),
    # Llama 4: everything under text_config
    ({"model_type": "llama4", "text_config": {"num_local_experts": 16, "num_experts_per_tok": 1,
                                              "hidden_size": 5120, "intermediate_size": 8192,
                                              "intermediate_size_mlp": 16384}}, (16, 1, 5120, 8192)),
])
def test_hf_config(tmp_path, cfg, expect):
    s = B.hf_config_shape(_write(tmp_path, cfg))
    assert s.key() == expect
    assert s.source.startswith("hf-config:")


def test_hf_config_sharded_and_named(tmp_path):
    cfg = {"_name_or_path": "Qwen/Qwen3-30B-A3B", "num_experts": 128, "num_experts_per_tok": 8,
           "hidden_size": 2048, "moe_intermediate_size": 768}
    s = B.hf_config_shape(_write(tmp_path, cfg), tp=4, ep=2)
    assert (s.E, s.E_global, s.N, s.K, s.topk) == (64, 128, 192, 2048, 8)
    assert s.name.startswith("Qwen3-30B-A3B")


def test_hf_config_errors(tmp_path):
    with pytest.raises(B.BenchError, match="expert count"):
        B.hf_config_shape(_write(tmp_path, {"hidden_size": 4096, "intermediate_size": 11008}))
    with pytest.raises(B.BenchError, match="hidden_size"):
        B.hf_config_shape(_write(tmp_path, {"num_experts": 8, "num_experts_per_tok": 2,
                                            "moe_intermediate_size": 64}))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(B.BenchError, match="expected JSON in UTF-8"):
        B.hf_config_shape(str(bad))
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(B.BenchError, match="expected JSON in UTF-8"):
        B.hf_config_shape(str(bad))
    sizes = {"num_experts": 8, "num_experts_per_tok": 2, "hidden_size": 64, "moe_intermediate_size": 32}
    # only JSON integers: 8.7 is not 8 experts, true is not topk 1, 1e400 (inf) is no size
    for key, value in (("num_experts", 8.7), ("num_experts_per_tok", True), ("hidden_size", float("inf")),
                       ("moe_intermediate_size", "32")):
        with pytest.raises(B.BenchError, match=f"expected an integer .* got {value!r}"):
            B.hf_config_shape(_write(tmp_path, dict(sizes, **{key: value})))
    assert B.hf_config_shape(_write(tmp_path, sizes)).E == 8


@pytest.mark.parametrize("content", [b"[1, 2]", b'{"rows": 5}', b'{"rows": [1]}', b"\xff\xfe", b"{"])
def test_malformed_anchor_files_are_named(tmp_path, content):
    path = tmp_path / "anchor.json"
    path.write_bytes(content)
    with pytest.raises(B.BenchError, match=r"^anchor .*anchor.json: expected "):
        B.load_anchor(str(path))


# ---------------------------------------------------------------------------------------
# floor, TF/s, anchor
# ---------------------------------------------------------------------------------------


def test_floor_qwen3_by_hand():
    # 8 experts touched, M=1, bf16, 4.42 TB/s: (8*3*768*2048*2 + 2*1*2048*2) B / 4.42e12 B/s
    hand = (8 * 3 * 768 * 2048 * 2 + 2 * 1 * 2048 * 2) / 4.42e12 * 1e6
    got = B.hbm_floor_us(8, 768, 2048, 1, 2, 2, 4.42e12)
    assert got == pytest.approx(hand, rel=1e-12)
    assert got == pytest.approx(17.08, abs=0.01)


def test_floor_by_hand_other_cases():
    # mixtral bf16, 2 experts, M=1: 2*3*14336*4096*2 = 704.6 MB -> 159.4 us at 4.421 TB/s
    assert B.hbm_floor_us(2, 14336, 4096, 1, 2, 2, 4.421e12) == pytest.approx(159.383, abs=0.01)
    # fp32 weights and activations count 4 bytes each
    assert B.hbm_floor_us(1, 10, 20, 3, 4, 4, 1e12) == pytest.approx((3 * 10 * 20 * 4 + 2 * 3 * 20 * 4) / 1e6)
    # activations only when no expert is touched
    assert B.hbm_floor_us(0, 768, 2048, 64, 2, 2, 1e12) == pytest.approx(2 * 64 * 2048 * 2 / 1e6)


def test_weight_bytes_from_quant():
    assert B.weight_bytes_per_element("none", "bf16") == 2
    assert B.weight_bytes_per_element("none", "fp16") == 2
    assert B.weight_bytes_per_element("none", "fp32") == 4
    for q in ("fp8_tensor", "fp8_channel", "fp8_block128"):
        for dt in ("bf16", "fp16", "fp32"):
            assert B.weight_bytes_per_element(q, dt) == 1
    assert set(B.QUANTS) == {"none", "fp8_tensor", "fp8_channel", "fp8_block128"}
    with pytest.raises(B.BenchError, match="--quant"):
        B.weight_bytes_per_element("int4", "bf16")
    assert B.anchor_variant("none", "bf16") == "bf16" and B.anchor_variant("none", "fp16") == "fp16"
    assert B.anchor_variant("fp8_tensor", "bf16") == "fp8-tensor"
    assert B.anchor_variant("fp8_block128", "bf16") == "fp8-block128"
    assert B.anchor_variant("fp8_channel", "bf16") is None


def test_floor_bytes_per_weight_from_quant():
    # qwen3, 8 experts touched, M=1, bf16 activations: FP8 weights are 1 byte, activations stay 2
    fp8 = (8 * 3 * 768 * 2048 * 1 + 2 * 1 * 2048 * 2) / 4.42e12 * 1e6
    bf16 = (8 * 3 * 768 * 2048 * 2 + 2 * 1 * 2048 * 2) / 4.42e12 * 1e6
    for q in ("fp8_tensor", "fp8_channel", "fp8_block128"):
        assert B.hbm_floor_us(8, 768, 2048, 1, 2, 2, 4.42e12, quant=q) == pytest.approx(fp8, rel=1e-12)
    assert B.hbm_floor_us(8, 768, 2048, 1, 2, 2, 4.42e12, quant="none") == pytest.approx(bf16, rel=1e-12)
    assert B.hbm_floor_us(8, 768, 2048, 1, 2, 2, 4.42e12) == pytest.approx(bf16, rel=1e-12)
    # unquantized fp32: the dtype's 4 bytes
    want = (3 * 10 * 20 * 4 + 2 * 3 * 20 * 4) / 1e6
    assert B.hbm_floor_us(1, 10, 20, 3, 4, 4, 1e12, quant="none") == pytest.approx(want)
    with pytest.raises(B.BenchError):
        B.hbm_floor_us(1, 10, 20, 3, 2, 2, 1e12, quant="fp4")


def test_floor_matches_every_anchor_row():
    path = B.find_anchor()
    assert path and os.path.isfile(path)
    anchor = B.load_anchor(path)
    quant_of = {B.anchor_variant(q, "bf16"): q for q in B.QUANTS}
    for r in anchor["rows"]:
        q = quant_of[r["variant"]]  # fp8 weights from the quant, bf16 activations
        f = B.hbm_floor_us(r["experts_touched"], r["N"], r["K"], r["M"], 2, 2, anchor["read_tbps"] * 1e12, quant=q)
        assert f == pytest.approx(r["floor_us"], rel=1e-4), r
        bpw = B.weight_bytes_per_element(q, "bf16")
        assert bpw == (2 if r["variant"] == "bf16" else 1)
        assert B.hbm_floor_us(r["experts_touched"], r["N"], r["K"], r["M"], bpw, 2,
                              anchor["read_tbps"] * 1e12) == pytest.approx(r["floor_us"], rel=1e-4)


def test_tflops():
    # qwen3 M=1024 topk 8 in 1 ms: 2*8192*3*768*2048 / 1e-3 s
    assert B.moe_tflops(8192, 768, 2048, 1000.0) == pytest.approx(2 * 8192 * 3 * 768 * 2048 / 1e-3 / 1e12)


def test_gemm_ceiling_formula():
    # the GPU timer is replaced by one that runs the GEMM once and says 2 ms
    seen = []

    def timer(fn):
        seen.append(fn())
        return 2.0

    tf = B.measure_gemm_tflops(torch, torch.device("cpu"), timer, n=64)
    assert tf == pytest.approx(2 * 64 ** 3 / 2e-3 / 1e12)
    assert seen[0].shape == (64, 64) and seen[0].dtype == torch.bfloat16
    assert B.GEMM_N == 8192


def test_anchor_rows_match_shapes():
    anchor = B.load_anchor(B.find_anchor())
    r = B.anchor_row(anchor, B.preset_shape("qwen3-30b-a3b"), "bf16", 1)
    assert r and r["shape"] == "qwen3-30b-a3b" and r["vllm_gemm_us"] > 0
    # deepseek-v3 with --tp 8 is the anchor's deepseek-v3-tp8 shape
    r = B.anchor_row(anchor, B.preset_shape("deepseek-v3", tp=8), "bf16", 64)
    assert r and r["shape"] == "deepseek-v3-tp8"
    assert B.anchor_row(anchor, B.preset_shape("qwen3-30b-a3b"), "fp16", 1) is None
    assert B.anchor_row(anchor, B.preset_shape("qwen3-30b-a3b"), "bf16", 3) is None
    assert B.anchor_row(anchor, B.preset_shape("qwen3-30b-a3b", ep=2), "bf16", 1) is None
    assert B.anchor_row(anchor, B.preset_shape("gpt-oss-120b"), "bf16", 1) is None
    assert B.anchor_row(None, B.preset_shape("qwen3-30b-a3b"), "bf16", 1) is None


def test_anchor_override(tmp_path, monkeypatch):
    src = B.find_anchor()
    assert B.find_anchor(src) == src
    assert B.find_anchor(os.path.dirname(src)) == os.path.join(os.path.dirname(src), B.ANCHOR_FILE)
    with pytest.raises(B.BenchError):
        B.find_anchor(str(tmp_path / "missing.json"))
    mine = tmp_path / "a.json"
    mine.write_text(json.dumps({"rows": []}))
    monkeypatch.setenv("SWAPMOE_ANCHORS", str(mine))
    assert B.find_anchor() == str(mine)
    assert B.find_anchor(src) == src  # --anchors before the environment
    monkeypatch.setenv("SWAPMOE_ANCHORS", str(tmp_path))  # a folder without the anchor file
    with pytest.raises(B.BenchError, match=r"\$SWAPMOE_ANCHORS: .*no such file"):
        B.find_anchor()
    (tmp_path / B.ANCHOR_FILE).write_text(json.dumps({"rows": []}))
    assert B.find_anchor() == str(tmp_path / B.ANCHOR_FILE)
    monkeypatch.setenv("SWAPMOE_ANCHORS", str(tmp_path / "missing.json"))
    with pytest.raises(B.BenchError, match="SWAPMOE_ANCHORS"):
        B.find_anchor()


# ---------------------------------------------------------------------------------------
# routing, reference, baselines (CPU)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["uniform", "skewed"])
def test_routing(kind):
    g = torch.Generator().manual_seed(0)
    tw, ids = B.make_routing(torch, 64, 32, 4, kind, g, torch.device("cpu"))
    assert tw.shape == ids.shape == (64, 4)
    assert tw.dtype == torch.float32 and ids.dtype == torch.int32
    assert int(ids.min()) >= 0 and int(ids.max()) < 32
    assert all(len(set(row)) == 4 for row in ids.tolist())  # distinct experts per token
    assert bool((tw > 0).all())


def test_skewed_routing_is_skewed():
    g = torch.Generator().manual_seed(0)
    _, ids = B.make_routing(torch, 4096, 64, 1, "skewed", g, torch.device("cpu"), zipf_s=1.2)
    counts = torch.bincount(ids.flatten().long(), minlength=64).sort(descending=True).values
    assert counts[0] > 8 * counts[32]


def _problem(ep=1, M=5, dtype=torch.float32, seed=1):
    shape = B.shard_shape("t", 8, 3, 64, 32, 1, ep)
    g = torch.Generator().manual_seed(seed)
    dev = torch.device("cpu")
    tw, ids = B.make_routing(torch, M, shape.E_global, shape.topk, "uniform", g, dev)
    x = torch.randn(M, shape.K, generator=g, dtype=dtype)
    w1, w2 = B.make_weights(torch, shape, dtype, g, dev)
    return shape, x, w1, w2, tw, ids, B.make_expert_map(torch, shape, dev)


@pytest.mark.parametrize("ep", [1, 2])
def test_reference64_matches_numpy_reference(ep):
    from swapmoe.reference import fused_experts_ref

    shape, x, w1, w2, tw, ids, emap = _problem(ep)
    got = B.reference64(torch, x, w1, w2, tw, ids, emap).numpy()
    kw = {} if emap is None else {"expert_map": emap.numpy(), "global_num_experts": shape.E_global}
    want = fused_experts_ref(x.numpy(), w1.numpy(), w2.numpy(), tw.numpy(), ids.numpy(), **kw)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    if ep > 1:
        assert B.make_expert_map(torch, shape, torch.device("cpu")).tolist()[: shape.E] == list(range(shape.E))


@pytest.mark.parametrize("ep", [1, 2])
@pytest.mark.parametrize("name", [B.IMPL_SWAPMOE, B.IMPL_EAGER, B.IMPL_GROUPED])
def test_implementations_match_reference(name, ep):
    if name == B.IMPL_GROUPED and not hasattr(torch, "_grouped_mm"):
        pytest.skip("no torch._grouped_mm")
    shape, x, w1, w2, tw, ids, emap = _problem(ep, M=7, dtype=torch.bfloat16)
    res = B.check_point(torch, [name], x, (w1, w2), tw, ids, emap, B.TOLERANCE["bf16"])[name]
    assert res["ok"], res
    assert res["rel_err"] < 1e-2


def test_check_point_catches_unwritten_output(monkeypatch):
    shape, x, w1, w2, tw, ids, emap = _problem()

    def lazy(x, w1, w2, tw, ids, emap, out):
        out[:-1] = 0  # leaves the poisoned last row
        return out

    monkeypatch.setitem(B.IMPLS, "lazy", (lazy, True))
    res = B.check_point(torch, ["lazy"], x, (w1, w2), tw, ids, emap, 1e-3)["lazy"]
    assert not res["ok"] and math.isinf(res["rel_err"])


# ---------------------------------------------------------------------------------------
# CPU runs end to end
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpu_run")
    j, p = str(d / "f.json"), str(d / "p.png")
    rc = cli.main(["bench", "--device", "cpu", "--m", "1,2", "--json", j, "--plot", p, "--no-progress"])
    with open(j) as f:
        return rc, json.load(f), p


def test_cpu_run_json_schema(cpu_run):
    rc, rec, _ = cpu_run
    assert rc == 0
    for key in ("schema", "mode", "label", "device", "versions", "driver_version", "build_info", "shape",
                "dtype", "quant", "bytes_per_weight", "routing", "method", "read_bw", "gemm_tflops", "anchor",
                "check", "implementations", "points", "notes", "skipped", "elapsed_s"):
        assert key in rec, key
    assert rec["schema"] == B.SCHEMA and rec["mode"] == "cpu"
    assert rec["label"].startswith("CPU run:")
    assert rec["device"]["type"] == "cpu" and rec["device"]["name"]
    for k in ("swapmoe", "torch", "triton", "numpy", "python"):
        assert k in rec["versions"]
    assert rec["versions"]["swapmoe"] and rec["versions"]["torch"]
    assert rec["build_info"]["version"] == rec["versions"]["swapmoe"]
    assert {"targets", "modules", "nvcc_version"} <= set(rec["build_info"])
    assert rec["shape"]["E"] == 8 and rec["shape"]["topk"] == 2 and rec["shape"]["K"] == 256
    assert rec["shape"]["N"] == 128
    assert rec["read_bw"] is None and rec["gemm_tflops"] is None  # no HBM, no GPU GEMM on a CPU run
    assert rec["quant"] == "none" and rec["dtype"] == "bf16" and rec["bytes_per_weight"] == 2
    assert {"timer", "graph", "layers", "weight_copies", "l2_flushed", "statistic"} <= set(rec["method"])
    assert rec["check"]["ok"] and rec["check"]["M"] == 1
    assert rec["check"]["results"]["swapmoe"]["rel_err"] < 1e-2
    assert rec["implementations"] == ["swapmoe"]  # baselines are off by default on the CPU
    assert [p["M"] for p in rec["points"]] == [1, 2]
    for p in rec["points"]:
        assert 1 <= p["experts_touched"] <= 8 and p["slots"] == p["M"] * 2
        assert p["floor_us"] is None and p["anchor_vllm_gemm_us"] is None
        r = p["results"]["swapmoe"]
        assert r["time_us"] > 0 and r["tflops"] > 0 and "pct_floor" not in r and "pct_gemm" not in r
        assert p["plan"]["backend"] == "cpu"


def test_cpu_run_plot_is_png(cpu_run):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.image as mpimg

    _, _, p = cpu_run
    with open(p, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    img = mpimg.imread(p)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_cpu_run_table_and_csv(capsys, tmp_path):
    rc = cli.main(["bench", "--device", "cpu", "--shape", "4,2,64,32", "--m", "3", "--layers", "2",
                   "--no-progress", "--baselines"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "CPU run: no CUDA device; times are the Rust reference path, not GPU kernels" in out or \
        "CPU run: --device cpu" in out
    assert "E=4 topk=2 K=64 N=32" in out and "swapmoe_us" in out and "eager_us" in out
    head = next(ln for ln in out.splitlines() if ln.split()[:1] == ["M"]).split()
    assert head[:5] == ["M", "touched", "plan", "swapmoe_us", "TF/s"]  # no floor / %gemm columns on the CPU
    row = out.splitlines()[[ln.split()[:1] for ln in out.splitlines()].index(["M"]) + 1].split()
    assert row[0] == "3" and row[2] == "cpu"
    rc = cli.main(["bench", "--device", "cpu", "--shape", "4,2,64,32", "--m", "1,3", "--layers", "2",
                   "--no-progress", "--csv", "--no-check"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and lines[0].startswith("M,experts_touched,slots,floor_us")
    assert [ln.split(",")[0] for ln in lines[1:]] == ["1", "3"]
    assert lines[0].split(",")[5] == "plan" and lines[1].split(",")[5] == "cpu"
    assert float(lines[1].split(",")[lines[0].split(",").index("swapmoe_us")]) > 0


def test_cpu_run_ep_and_hf_config(tmp_path):
    cfg = _write(tmp_path, {"num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 64,
                            "intermediate_size": 64})
    j = str(tmp_path / "r.json")
    rc = cli.main(["bench", "--device", "cpu", "--hf-config", cfg, "--tp", "2", "--ep", "2", "--m", "4",
                   "--layers", "2", "--no-progress", "--json", j, "--baselines", "--routing", "skewed"])
    rec = json.load(open(j))
    assert rc == 0 and rec["check"]["ok"]
    assert (rec["shape"]["E"], rec["shape"]["E_global"], rec["shape"]["N"]) == (4, 8, 32)
    assert rec["points"][0]["slots"] <= 4 * 2
    assert set(rec["implementations"]) >= {"swapmoe", "torch-eager"}


def test_default_cpu_bench_subprocess():
    r = run_cli("bench", "--no-progress", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "CPU run:" in r.stdout and "cpu-small" in r.stdout
    assert [ln.split()[0] for ln in r.stdout.splitlines()[-3:]] == ["1", "4", "16"]


def test_aborted_run_exits_1_and_says_so(monkeypatch, capsys):
    """A run that ends early (a sticky CUDA error raises out of the M loop) keeps the points
    measured so far, prints RUN ABORTED and exits 1 although the check passed."""
    real = B.make_routing

    def routing(torch, M, *a, **kw):
        if M == 4:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (fake)")
        return real(torch, M, *a, **kw)

    monkeypatch.setattr(B, "make_routing", routing)
    rc = cli.main(["bench", "--device", "cpu", "--shape", "4,2,64,32", "--m", "1,4", "--layers", "2",
                   "--no-progress"])
    out = capsys.readouterr().out
    assert "RUN ABORTED at M=4: " in out and "illegal memory access" in out
    assert "check at M=1" in out and " ok" in out  # the check passed: the abort alone sets rc
    lines = out.splitlines()
    i = [ln.split()[:1] for ln in lines].index(["M"])
    assert lines[i + 1].split()[0] == "1"  # the point measured before the abort is kept
    assert rc == 1


def _bench_argv_all_flags(tmp_path):
    return ["bench", "--shape", "8,2,64,32", "--tp", "2", "--ep", "2", "--dtype", "fp16", "--quant", "fp8_channel",
            "--m", "3,1", "--routing", "skewed", "--zipf-s", "1.7", "--layers", "3", "--no-graph", "--baselines",
            "--no-check", "--check-all", "--device", "cpu", "--seed", "11", "--anchors", str(tmp_path / "a.json"),
            "--read-bw", "3.25", "--read-floor", "--gemm-tflops", "612.5", "--no-progress", "--with-routing",
            "--routing-rounds", "2"]


def test_bench_passes_every_flag_to_run_bench(monkeypatch, tmp_path, capsys):
    """Each bench flag reaches run_bench with its value (run_bench itself is faked: the
    record printed is a GPU-shaped one)."""
    got = {}

    def fake_run_bench(shape, **kw):
        got["shape"] = shape
        got.update(kw)
        return _fake_gpu_record()

    monkeypatch.setattr(B, "run_bench", fake_run_bench)
    assert cli.main(_bench_argv_all_flags(tmp_path)) == 0
    assert "swapmoe_us" in capsys.readouterr().out
    sh = got.pop("shape")
    assert (sh.E, sh.E_global, sh.topk, sh.K, sh.N, sh.tp, sh.ep) == (4, 8, 2, 64, 16, 2, 2)
    assert callable(got.pop("log"))
    assert got == {"dtype": "fp16", "quant": "fp8_channel", "m_list": [1, 3], "routing": "skewed", "zipf_s": 1.7,
                   "layers": 3, "graph": False, "baselines": True, "check": False, "check_all": True,
                   "device": "cpu", "seed": 11, "anchors": str(tmp_path / "a.json"), "read_bw_tbps": 3.25,
                   "gemm_tflops": 612.5, "progress": False, "with_routing": True, "read_floor": True,
                   "routing_rounds": 2}
    got.clear()
    assert cli.main(["bench", "--device", "cpu", "--no-progress"]) == 0
    capsys.readouterr()
    assert got["shape"] is None and got["layers"] == 8 and got["read_bw_tbps"] is None
    assert got["gemm_tflops"] is None and got["read_floor"] is None and got["baselines"] is None


def test_tune_passes_every_flag_to_run_tune(monkeypatch, tmp_path, capsys):
    """Each tune flag reaches run_tune with its value (run_tune itself is faked)."""
    from swapmoe import tune as T

    got = {}
    path = str(tmp_path / "t" / "E=8,N=32,device_name=X,dtype=fp16.json")

    def fake_run_tune(shapes, **kw):
        got["shapes"] = shapes
        got.update(kw)
        return [{"shape": shapes[0].name, "path": path, "skipped_m": [], "entries": {}}]

    monkeypatch.setattr(T, "run_tune", fake_run_tune)
    assert cli.main(["tune", "--shape", "8,2,64,32", "--dtype", "fp16", "--quant", "fp8_tensor", "--m", "2,1",
                     "--out-dir", str(tmp_path / "t"), "--force", "--layers", "5", "--no-vllm", "--no-flashinfer",
                     "--no-check",
                     "--prune", "3.5", "--device", "cuda:1", "--seed", "7", "--no-progress", "--per-hidden-size"]) == 0
    out, err = capsys.readouterr()
    assert path in out and f"SWAPMOE_TABLES_DIR={tmp_path / 't'}" in err
    assert [(s.E, s.topk, s.K, s.N) for s in got.pop("shapes")] == [(8, 2, 64, 32)]
    assert callable(got.pop("log"))
    assert got == {"out_dir": str(tmp_path / "t"), "dtype": "fp16", "quant": "fp8_tensor", "m_list": [1, 2],
                   "force": True, "layers": 5, "vllm": False, "flashinfer": False, "check": False, "prune": 3.5,
                   "device": "cuda:1", "seed": 7, "progress": False, "per_hidden_size": True}
    got.clear()
    assert cli.main(["tune", "--shape", "8,2,64,32", "--out-dir", str(tmp_path / "t")]) == 0
    capsys.readouterr()
    assert got["force"] is False and got["prune"] == T.DEFAULT_PRUNE and got["layers"] == 8
    assert got["vllm"] is True and got["flashinfer"] is True and got["check"] is True and got["progress"] is True


# ---------------------------------------------------------------------------------------
# the vLLM baseline, with a fake vllm module (vLLM is not installed here)
# ---------------------------------------------------------------------------------------

VLLM_MOD = "vllm.model_executor.layers.fused_moe.fused_moe"


def _fake_vllm_fused_experts(calls, wrong=False, fail=None):
    """vLLM's fused_experts semantics in plain torch: w1 [E, 2N, K] (gate then up), w2
    [E, K, N], expert_map global -> local (-1: not here); a new output tensor."""

    def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, activation="silu",
                      apply_router_weight_on_input=False, global_num_experts=-1, expert_map=None,
                      quant_config=None):
        calls.append({"global_num_experts": global_num_experts, "expert_map": expert_map,
                      "dtype": hidden_states.dtype, "shape": tuple(hidden_states.shape)})
        if fail is not None:
            raise fail
        ids = topk_ids.long()
        if expert_map is not None:
            assert expert_map.numel() == global_num_experts
            ids = expert_map.long()[ids]
        N = w1.shape[1] // 2
        out = torch.zeros(hidden_states.shape, dtype=torch.float32)
        for m in range(ids.shape[0]):
            for k in range(ids.shape[1]):
                e = int(ids[m, k])
                if e < 0:
                    continue
                h = w1[e].float() @ hidden_states[m].float()
                y = w2[e].float() @ (torch.nn.functional.silu(h[:N]) * h[N:])
                out[m] += float(topk_weights[m, k]) * y
        if wrong:
            out *= 1.5
        return out.to(hidden_states.dtype)

    return fused_experts


def _install_fake_vllm(monkeypatch, fused_experts, version="0.33.0-fake"):
    parts = VLLM_MOD.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        mod = types.ModuleType(name)
        if i == 1:
            mod.__version__ = version
        if i == len(parts) and fused_experts is not None:
            mod.fused_experts = fused_experts
        monkeypatch.setitem(sys.modules, name, mod)


def test_load_vllm_fused_experts(monkeypatch):
    calls = []
    fe = _fake_vllm_fused_experts(calls)
    _install_fake_vllm(monkeypatch, fe)
    fn, info = B.load_vllm_fused_experts()
    assert fn is fe and info == "0.33.0-fake"


def test_load_vllm_not_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    fn, why = B.load_vllm_fused_experts()
    assert fn is None and why.startswith("vllm not importable (ModuleNotFoundError")


def test_load_vllm_without_fused_experts(monkeypatch):
    _install_fake_vllm(monkeypatch, None)
    fn, why = B.load_vllm_fused_experts()
    assert fn is None and "fused_experts not found" in why


def test_load_vllm_import_breaks(monkeypatch):
    # vllm imports, its fused_moe module raises (an install that is there but broken)
    _install_fake_vllm(monkeypatch, None)
    monkeypatch.delitem(sys.modules, VLLM_MOD)
    import importlib

    real = importlib.import_module

    def imp(name, *a, **k):
        if name == VLLM_MOD:
            raise RuntimeError("CUDA platform could not be detected")
        return real(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", imp)
    fn, why = B.load_vllm_fused_experts()
    assert fn is None and "RuntimeError: CUDA platform could not be detected" in why


@pytest.mark.parametrize("ep", [1, 2])
def test_vllm_impl_matches_reference(ep):
    calls = []
    impl = B.make_vllm_impl(_fake_vllm_fused_experts(calls))
    shape, x, w1, w2, tw, ids, emap = _problem(ep, M=6, dtype=torch.bfloat16)
    table = dict(B.IMPLS, **{B.IMPL_VLLM: (impl, True)})
    res = B.check_point(torch, [B.IMPL_VLLM], x, (w1, w2), tw, ids, emap, B.TOLERANCE["bf16"], table)
    assert res[B.IMPL_VLLM]["ok"], res
    if ep == 1:
        assert calls[-1]["expert_map"] is None and calls[-1]["global_num_experts"] == -1
    else:
        assert calls[-1]["global_num_experts"] == shape.E_global and calls[-1]["expert_map"] is emap
    # timing passes out=None: vLLM's own output comes back, no copy
    y = impl(x, w1, w2, tw, ids, emap, None)
    assert y.shape == x.shape and y.dtype == x.dtype
    out = torch.full_like(x, float("nan"))
    assert impl(x, w1, w2, tw, ids, emap, out) is out and bool(torch.isfinite(out).all())


def test_vllm_impl_failure_is_reported():
    impl = B.make_vllm_impl(_fake_vllm_fused_experts([], fail=RuntimeError("no triton on cpu")))
    _, x, w1, w2, tw, ids, emap = _problem()
    table = dict(B.IMPLS, **{B.IMPL_VLLM: (impl, True)})
    res = B.check_point(torch, [B.IMPL_VLLM], x, (w1, w2), tw, ids, emap, 1e-3, table)[B.IMPL_VLLM]
    assert not res["ok"] and res["error"] == "RuntimeError: no triton on cpu"


@pytest.mark.parametrize("ep", [1, 2])
def test_cpu_run_with_fake_vllm(monkeypatch, tmp_path, capsys, ep):
    calls = []
    _install_fake_vllm(monkeypatch, _fake_vllm_fused_experts(calls))
    j = str(tmp_path / "v.json")
    rc = cli.main(["bench", "--device", "cpu", "--shape", "8,2,64,32", "--ep", str(ep), "--m", "1,3",
                   "--layers", "2", "--no-progress", "--baselines", "--json", j])
    out = capsys.readouterr().out
    rec = json.load(open(j))
    assert rc == 0 and rec["check"]["ok"]
    assert rec["implementations"][:2] == ["swapmoe", "vllm-fused"]
    assert B.IMPL_VLLM not in rec["skipped"]
    assert rec["versions"]["vllm"] == "0.33.0-fake"
    assert rec["check"]["results"]["vllm-fused"]["ok"]
    for p in rec["points"]:
        r = p["results"]["vllm-fused"]
        assert r["time_us"] > 0 and r["how"] == "perf_counter"
        assert p["results"]["swapmoe"]["speedup_vs"]["vllm-fused"] == pytest.approx(
            r["time_us"] / p["results"]["swapmoe"]["time_us"])
    assert calls and all(c["dtype"] == torch.bfloat16 for c in calls)
    if ep == 2:
        assert all(c["global_num_experts"] == 8 and c["expert_map"].numel() == 8 for c in calls)
    head = next(ln for ln in out.splitlines() if ln.split()[:1] == ["M"]).split()
    assert "vllm_fused_us" in head and "x_vllm_fused" in head
    assert head.index("vllm_fused_us") < head.index("gmm_us") < head.index("eager_us")  # vLLM first among the baselines
    assert "vllm 0.33.0-fake" in out
    csv = cli.csv_text(rec).splitlines()[0].split(",")
    assert "vllm-fused_us" in csv and "swapmoe_x_vllm-fused" in csv


@pytest.mark.parametrize("kind", ["raises", "wrong"])
def test_cpu_run_drops_a_failing_vllm(monkeypatch, tmp_path, capsys, kind):
    fe = (_fake_vllm_fused_experts([], fail=RuntimeError("triton: no GPU")) if kind == "raises"
          else _fake_vllm_fused_experts([], wrong=True))
    _install_fake_vllm(monkeypatch, fe)
    j = str(tmp_path / "v.json")
    rc = cli.main(["bench", "--device", "cpu", "--shape", "8,2,64,32", "--m", "1,2", "--layers", "2",
                   "--no-progress", "--baselines", "--json", j])
    out = capsys.readouterr().out
    rec = json.load(open(j))
    assert rc == 0 and rec["check"]["ok"]  # swapmoe is fine; the baseline is dropped
    assert "vllm-fused" not in rec["implementations"]
    why = rec["skipped"]["vllm-fused"]
    assert ("RuntimeError: triton: no GPU" in why) if kind == "raises" else why.startswith("check failed")
    assert f"skipped: vllm-fused: {why}" in out and "vllm_fused_us" not in out


def test_cpu_run_drops_vllm_failing_at_timing(monkeypatch, tmp_path):
    # with --no-check the first failure happens while timing: dropped with the M it failed at
    _install_fake_vllm(monkeypatch, _fake_vllm_fused_experts([], fail=ValueError("bad shape")))
    j = str(tmp_path / "v.json")
    rc = cli.main(["bench", "--device", "cpu", "--shape", "8,2,64,32", "--m", "1,2", "--layers", "2",
                   "--no-progress", "--baselines", "--no-check", "--json", j])
    rec = json.load(open(j))
    assert rc == 0 and "vllm-fused" not in rec["implementations"]
    assert rec["skipped"]["vllm-fused"] == "failed at M=1: ValueError: bad shape"
    assert rec["points"][0]["errors"]["vllm-fused"] == "ValueError: bad shape"
    assert "vllm-fused" not in rec["points"][1]["errors"]


def test_cpu_run_without_vllm_lists_the_reason(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)
    j = str(tmp_path / "v.json")
    rc = cli.main(["bench", "--device", "cpu", "--shape", "4,2,64,32", "--m", "1", "--layers", "2",
                   "--no-progress", "--baselines", "--json", j])
    rec = json.load(open(j))
    assert rc == 0 and rec["skipped"]["vllm-fused"].startswith("vllm not importable")
    assert "vllm" not in rec["versions"]


# ---------------------------------------------------------------------------------------
# GPU-shaped records print and plot (the GPU run itself is not tested here)
# ---------------------------------------------------------------------------------------


def _fake_gpu_record(gemm=750.0):
    shape = B.preset_shape("qwen3-30b-a3b")
    anchor = B.load_anchor(B.find_anchor())
    bw = 4.4e12
    rec = {
        "schema": B.SCHEMA, "mode": "gpu", "label": None,
        "device": {"type": "cuda", "index": 0, "name": "NVIDIA H200", "capability": "9.0", "sm_count": 132},
        "versions": {"swapmoe": "0.1.0", "torch": "2.11.0+cu130", "triton": "3.6.0", "vllm": "0.33.0"},
        "driver_version": 13000, "build_info": {}, "shape": shape.as_dict(), "dtype": "bf16", "quant": "none",
        "bytes_per_weight": 2, "bytes_per_act": 2, "routing": {"kind": "uniform", "seed": 0},
        "method": {"timer": "do_bench", "graph": True, "layers": 8, "weight_copies": 8, "l2_flushed": True,
                   "gemm_ceiling": "torch.matmul of two 8192x8192 bf16 matrices"},
        "read_bw": {"bytes_per_s": bw, "tbps": bw / 1e12, "method": "sum over 4 GiB"},
        "gemm_tflops": gemm,
        "anchor": {"path": "x", "matched": True, "variant": "bf16", "device": "NVIDIA H200"},
        "check": {"M": 1, "ok": True, "results": {"swapmoe": {"rel_err": 3e-3, "tol": 1e-2, "ok": True}}},
        "implementations": ["swapmoe", "vllm-fused", "torch-grouped-mm", "torch-eager"], "skipped": {},
        "points": [], "notes": [], "aborted": None,
    }
    backends = {1: "cuda_decode", 64: "cuda_mma", 4096: "cuda_mma"}
    for M in (1, 64, 4096):
        row = B.anchor_row(anchor, shape, "bf16", M)
        floor = B.hbm_floor_us(row["experts_touched"], shape.N, shape.K, M, 2, 2, bw)
        res = {}
        for name, t in (("swapmoe", row["vllm_gemm_us"] / 1.5), ("vllm-fused", row["vllm_gemm_us"] * 1.2),
                        ("torch-grouped-mm", row["vllm_gemm_us"] * 2), ("torch-eager", row["vllm_gemm_us"] * 75)):
            res[name] = {"time_us": t, "how": "graph", "pct_floor": 100 * floor / t,
                         "tflops": B.moe_tflops(M * 8, shape.N, shape.K, t),
                         "speedup_vs_anchor": row["vllm_gemm_us"] / t}
            if gemm:
                res[name]["pct_gemm"] = 100 * res[name]["tflops"] / gemm
        res["swapmoe"]["speedup_vs"] = {"vllm-fused": 1.8, "torch-grouped-mm": 3.0, "torch-eager": 112.5}
        rec["points"].append({"M": M, "experts_touched": row["experts_touched"], "slots": M * 8,
                              "floor_us": floor, "anchor_vllm_gemm_us": row["vllm_gemm_us"],
                              "anchor_experts_touched": row["experts_touched"], "results": res, "errors": {},
                              "plan": {"backend": backends[M], "kernels": ["k"], "reasons": [],
                                       "workspace_bytes": 0}})
    return rec


def test_gpu_record_table_with_the_read_floor():
    """Points with a read floor get read_us and %read (read_us / swapmoe_us) next to the
    formula floor, a header line says what it is, and the CSV carries both."""
    rec = _fake_gpu_record()
    rec["read_floor"] = {"method": "a read-only Triton kernel over the routed experts' bytes", "chunk_bytes": 16384}
    for p in rec["points"]:
        p["read_floor_us"] = p["floor_us"] * 1.4
        for r in p["results"].values():
            r["pct_read"] = 100 * p["read_floor_us"] / r["time_us"]
    text = cli.format_table(rec)
    assert "read floor: a read-only Triton kernel over the routed experts' bytes; %read = read_us / swapmoe_us" in text
    head = next(ln for ln in text.splitlines() if ln.split()[:1] == ["M"]).split()
    assert head[:8] == ["M", "touched", "plan", "floor_us", "read_us", "swapmoe_us", "%floor", "%read"]
    lines = text.splitlines()
    row = lines[lines.index(next(ln for ln in lines if ln.split()[:1] == ["M"])) + 1].split()
    p1 = rec["points"][0]
    assert row[4] == f"{p1['read_floor_us']:.1f}" and row[7] == f"{p1['results']['swapmoe']['pct_read']:.0f}%"
    csv = cli.csv_text(rec).splitlines()
    cols = csv[0].split(",")
    assert cols[-5:] == ["read_floor_us", "swapmoe_pct_read", "vllm-fused_pct_read", "torch-grouped-mm_pct_read",
                         "torch-eager_pct_read"]
    assert float(csv[1].split(",")[cols.index("read_floor_us")]) == pytest.approx(p1["read_floor_us"], rel=1e-5)
    without = cli.format_table(_fake_gpu_record())  # no read floor measured: no such columns
    assert "read_us" not in without and "%read" not in without


def test_gpu_record_table(tmp_path):
    rec = _fake_gpu_record()
    text = cli.format_table(rec)
    assert "NVIDIA H200 (sm_90, 132 SMs), driver 13.0" in text and "vllm 0.33.0" in text
    assert "CUDA graph of 8 layers" in text and "read bw 4.400 TB/s" in text
    assert "bf16 GEMM ceiling: 750 TF/s (torch.matmul of two 8192x8192 bf16 matrices)" in text
    head = next(ln for ln in text.splitlines() if ln.split()[:1] == ["M"])
    assert head.split() == ["M", "touched", "plan", "floor_us", "swapmoe_us", "%floor", "TF/s", "%gemm",
                            "anchor_us", "x_anchor", "vllm_fused_us", "x_vllm_fused", "gmm_us", "x_gmm",
                            "eager_us", "x_eager"]
    lines = text.splitlines()
    rows = [ln.split() for ln in lines[lines.index(head) + 1:lines.index(head) + 4]]
    assert [r[2] for r in rows] == ["cuda_decode", "cuda_mma", "cuda_mma"]
    assert rows[0][0] == "1" and rows[0][9] == "1.50x" and rows[0][11] == "1.80x" and rows[0][13] == "3.00x"
    assert rows[0][15] == "112.50x"
    p4096 = rec["points"][2]["results"]["swapmoe"]
    assert rows[2][7] == f"{p4096['tflops'] / 750 * 100:.0f}%"
    # every cell of every row, by column name, against the record's values
    cols = head.split()
    for p, row in zip(rec["points"], rows):
        sw, res = p["results"]["swapmoe"], p["results"]
        want = {"M": str(p["M"]), "touched": str(p["experts_touched"]), "plan": p["plan"]["backend"],
                "floor_us": cli._us(p["floor_us"]), "swapmoe_us": cli._us(sw["time_us"]),
                "%floor": cli._pct(sw["pct_floor"]), "TF/s": cli._tf(sw["tflops"]), "%gemm": cli._pct(sw["pct_gemm"]),
                "anchor_us": cli._us(p["anchor_vllm_gemm_us"]), "x_anchor": cli._x(sw["speedup_vs_anchor"])}
        for impl, short in (("vllm-fused", "vllm_fused"), ("torch-grouped-mm", "gmm"), ("torch-eager", "eager")):
            want[f"{short}_us"] = cli._us(res[impl]["time_us"])
            want[f"x_{short}"] = cli._x(sw["speedup_vs"][impl])
        assert set(want) == set(cols)
        assert dict(zip(cols, row)) == want, p["M"]
        # the cells a swapped column would confuse differ, so the check above tells them apart
        assert want["anchor_us"] != want["floor_us"] and want["%floor"] != want["%gemm"]
    assert len(head) <= 160  # every column there can be, still one line on a wide terminal
    assert "vllm_fused = vLLM's fused_experts, the whole op; gmm = torch._grouped_mm pipeline" in text
    csv = cli.csv_text(rec).splitlines()
    assert "swapmoe_x_torch-grouped-mm" in csv[0] and "swapmoe_x_vllm-fused" in csv[0] and len(csv) == 4
    assert "swapmoe_pct_gemm" in csv[0] and csv[1].split(",")[5] == "cuda_decode"
    # every CSV column, by header name, against the record
    impls = rec["implementations"]
    csv_head = csv[0].split(",")
    assert csv_head == (["M", "experts_touched", "slots", "floor_us", "anchor_vllm_gemm_us", "plan"]
                        + [f"{n}_{c}" for n in impls for c in ("us", "pct_floor", "tflops", "pct_gemm", "x_anchor")]
                        + [f"swapmoe_x_{n}" for n in impls[1:]] + ["read_floor_us"] + [f"{n}_pct_read" for n in impls])
    for p, line in zip(rec["points"], csv[1:]):
        got = dict(zip(csv_head, line.split(",")))
        assert len(got) == len(csv_head) == len(line.split(","))
        assert (got["M"], got["experts_touched"], got["slots"], got["plan"]) == \
            (str(p["M"]), str(p["experts_touched"]), str(p["slots"]), p["plan"]["backend"])
        want = {"floor_us": p["floor_us"], "anchor_vllm_gemm_us": p["anchor_vllm_gemm_us"]}
        for n in impls:
            r = p["results"][n]
            want.update({f"{n}_us": r["time_us"], f"{n}_pct_floor": r["pct_floor"], f"{n}_tflops": r["tflops"],
                         f"{n}_pct_gemm": r["pct_gemm"], f"{n}_x_anchor": r["speedup_vs_anchor"]})
            assert r["tflops"] != pytest.approx(r["pct_gemm"], rel=1e-3)  # a swap of the two would show
            if n != "swapmoe":
                want[f"swapmoe_x_{n}"] = p["results"]["swapmoe"]["speedup_vs"][n]
        for k, v in want.items():
            assert float(got[k]) == pytest.approx(v, rel=1e-5), (p["M"], k)
        assert got["read_floor_us"] == "" and all(got[f"{n}_pct_read"] == "" for n in impls)
    p = str(tmp_path / "g.png")
    B.plot_record(rec, p)
    assert open(p, "rb").read(8) == PNG_SIGNATURE
    j = str(tmp_path / "g.json")
    bad = copy.deepcopy(rec)
    bad["points"][0]["results"]["swapmoe"]["pct_floor"] = float("inf")
    B.write_json(bad, j)
    got = json.load(open(j))
    assert got["points"][0]["results"]["swapmoe"]["pct_floor"] == "inf" and got["gemm_tflops"] == 750.0
    assert got["points"][0]["plan"]["backend"] == "cuda_decode"


def test_gpu_record_table_without_gemm_ceiling():
    # the ceiling could not be measured: no %gemm column, the header says so; a failed plan shows "err"
    rec = _fake_gpu_record(gemm=None)
    rec["points"][1]["plan"] = "SwapmoeError: no plan"
    text = cli.format_table(rec)
    assert "bf16 GEMM ceiling: n/a" in text
    head = next(ln for ln in text.splitlines() if ln.split()[:1] == ["M"]).split()
    assert "%gemm" not in head and head[2] == "plan"
    lines = text.splitlines()
    row = lines[[ln.split()[:1] for ln in lines].index(["M"]) + 2].split()
    assert row[0] == "64" and row[2] == "err"


# ---------------------------------------------------------------------------------------
# swapmoe check, python -m, light import
# ---------------------------------------------------------------------------------------


def test_check_main(capsys):
    assert cli.main(["check"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("swapmoe ")
    for key in ("nvcc:", "embedded targets:", "modules:", "cuda driver:", "torch:", "vllm:", "vllm plugin:",
                "tuned tables:"):
        assert key in out, key
    if not torch.cuda.is_available():
        assert "no CUDA driver" in out or "devices:" in out


@pytest.mark.parametrize("value, disabled", [(None, False), ("", False), ("0", False), (" 0 ", False),
                                             ("1", True)])
def test_disable_env_zero_keeps_the_plugin_on(monkeypatch, capsys, value, disabled):
    """README: SWAPMOE_DISABLE=1 turns the vLLM plugin off; unset, empty or 0 leaves it on,
    both in the plugin's register() and in what `swapmoe check` reports. (vLLM's version is
    faked outside the supported range, so that register() stops before importing vLLM.)"""
    import importlib.metadata

    from swapmoe import vllm_plugin as P

    if value is None:
        monkeypatch.delenv("SWAPMOE_DISABLE", raising=False)
    else:
        monkeypatch.setenv("SWAPMOE_DISABLE", value)
    real_version, real_eps = importlib.metadata.version, importlib.metadata.entry_points
    ep = importlib.metadata.EntryPoint("swapmoe", "swapmoe.vllm_plugin:register", "vllm.general_plugins")

    def entry_points(**kw):
        return [ep] if kw.get("group") == "vllm.general_plugins" else real_eps(**kw)

    def version(name):
        return "0.32.0" if name == "vllm" else real_version(name)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(P, "_status", None)
    P.register()
    assert ("disabled by SWAPMOE_DISABLE" in P.status()) is disabled, P.status()
    if not disabled:
        assert "vLLM 0.32.0 is outside the supported range" in P.status()
    monkeypatch.setattr(P, "_status", None)
    state = cli._plugin_state()
    assert ("disabled" in state) is disabled, state
    assert ("inactive: vLLM 0.32.0 is outside the range" in state) is not disabled, state
    assert cli.main(["check"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("vllm plugin: "))
    assert line == f"vllm plugin: {state}"


def test_explain_fp8_below_sm89_names_the_quant_flag(capsys):
    """FP8 asked of a device below sm_89: explain exits 2 and names --quant (select_backend's
    error names its `quant` argument, which explain rewrites as the flag)."""
    from swapmoe import cli

    rc = cli.main(["explain", "--model", "qwen3-30b-a3b", "--quant", "fp8_tensor", "--m", "1",
                   "--device-name", "NVIDIA A100-SXM4-80GB"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "swapmoe explain: error: --quant fp8_tensor: FP8 (tensor) needs compute capability >= 8.9" in err, err


def test_explain_backend_override(monkeypatch, capsys):
    """`swapmoe explain --backend X` plans with X forced, as $SWAPMOE_BACKEND does."""
    monkeypatch.delenv("SWAPMOE_BACKEND", raising=False)
    argv = ["explain", "--model", "qwen3-30b-a3b", "--m", "1,64", "--device-name", "NVIDIA H200"]
    assert cli.main(argv) == 0
    plain = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("M=")]
    assert len(plain) == 2 and not any("cuda_generic" in ln or "override" in ln for ln in plain)
    assert cli.main(argv + ["--backend", "cuda_generic"]) == 0
    out = capsys.readouterr().out
    heads = [ln for ln in out.splitlines() if ln.startswith("M=")]
    assert [h.split(" (")[0] for h in heads] == ["M=1: cuda_generic", "M=64: cuda_generic"]
    assert all("(override;" in h and "on NVIDIA H200 sm_90" in h for h in heads)
    assert out.count("- override: cuda_generic forced by the backend argument or $SWAPMOE_BACKEND") == 2


def test_check_subprocess():
    r = run_cli("check")
    assert r.returncode == 0, r.stderr
    assert "vllm:" in r.stdout and "embedded targets:" in r.stdout


def test_import_stays_light():
    code = ("import sys, swapmoe, swapmoe.cli, swapmoe.bench; "
            "print(sorted(m for m in ('torch', 'triton', 'matplotlib', 'tqdm') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_with_routing_cpu_run_times_fused_moe(tmp_path):
    """--with-routing adds swapmoe.fused_moe from the same logits; it passes the float64
    check (same routing as the precomputed ids) and gets a time."""
    from swapmoe import bench as B

    rec = B.run_bench(None, device="cpu", m_list=[1, 3], with_routing=True, progress=False)
    assert rec["method"]["with_routing"] is True
    assert B.IMPL_ROUTED in rec["implementations"]
    assert rec["check"]["results"][B.IMPL_ROUTED]["ok"]
    for p in rec["points"]:
        assert p["results"][B.IMPL_ROUTED]["time_us"] > 0


def test_with_routing_needs_uniform_routing():
    from swapmoe import bench as B

    with pytest.raises(B.BenchError, match="with-routing"):
        B.run_bench(None, device="cpu", m_list=[1], with_routing=True, routing="skewed", progress=False)


# ---------------------------------------------------------------------------------------
# FP8 W8A8 (--quant fp8_*) on the CPU path
# ---------------------------------------------------------------------------------------

FP8_QUANTS = ["fp8_tensor", "fp8_channel", "fp8_block128"]


def _fp8_problem(quant, ep=1, M=6, dtype=torch.bfloat16, seed=3, E=8, topk=3, K=200, N=72):
    """An FP8 problem as run_bench builds it (K, N with partial 128-blocks)."""
    shape = B.shard_shape("t", E, topk, K, N, 1, ep)
    g = torch.Generator().manual_seed(seed)
    dev = torch.device("cpu")
    tw, ids = B.make_routing(torch, M, shape.E_global, shape.topk, "uniform", g, dev)
    x = torch.randn(M, shape.K, generator=g, dtype=dtype)
    w1, w2, s1, s2 = B.make_fp8_weights(torch, shape, dtype, g, dev, quant)
    emap = B.make_expert_map(torch, shape, dev)
    fp8 = B.fp8_kwargs(quant, s1, s2)
    if quant == "fp8_tensor":
        a1, a2, _ = B.calibrate_static_scales(torch, shape, w1, w2, fp8, dtype, seed, dev, emap)
        fp8 = B.fp8_kwargs(quant, s1, s2, a1, a2)
    return shape, x, w1, w2, tw, ids, emap, fp8


@pytest.mark.parametrize("quant", FP8_QUANTS)
def test_fp8_weights_layouts_and_values(quant):
    shape = B.shard_shape("t", 4, 2, 200, 136)
    g = torch.Generator().manual_seed(0)
    w1, w2, s1, s2 = B.make_fp8_weights(torch, shape, torch.bfloat16, g, torch.device("cpu"), quant)
    assert w1.dtype == w2.dtype == torch.float8_e4m3fn
    assert tuple(w1.shape) == (4, 272, 200) and tuple(w2.shape) == (4, 200, 136)
    want = {"fp8_tensor": ((4,), (4,)), "fp8_channel": ((4, 272), (4, 200)),
            "fp8_block128": ((4, 3, 2), (4, 2, 2))}[quant]
    assert B.fp8_scale_shapes(quant, shape) == want
    assert (tuple(s1.shape), tuple(s2.shape)) == want and s1.dtype == s2.dtype == torch.float32
    # the same master weights, unquantized, from the same generator state
    g = torch.Generator().manual_seed(0)
    m1 = torch.randn(4, 272, 200, generator=g, dtype=torch.bfloat16).mul_(200 ** -0.5)
    scheme = B.FP8_SCHEMES[quant]
    d1 = w1.double() * B._expand_weight_scale(torch, s1, scheme, 272, 200).double()
    assert float((d1 - m1.double()).norm() / m1.double().norm()) < 0.05  # e4m3: 3 mantissa bits
    assert float(w1.float().abs().max()) == 448.0  # absmax / 448: the largest weight of a group is +-448
    # the op validates these layouts: the CPU path runs them
    tw, ids = B.make_routing(torch, 3, 4, 2, "uniform", g, torch.device("cpu"))
    x = torch.randn(3, 200, dtype=torch.bfloat16)
    kw = B.fp8_kwargs(quant, s1, s2)
    out = B.impl_swapmoe(x, w1, w2, tw, ids, None, torch.empty_like(x), fp8=kw)
    assert bool(torch.isfinite(out).all())


def test_fp8_weight_copies_count_one_byte():
    shape = B.preset_shape("mixtral-8x7b")
    free = B._free_bytes(torch, torch.device("cpu"))
    copies, per_copy, _ = B.weight_copies(torch, shape, B.weight_bytes_per_element("fp8_tensor", "bf16"), 8,
                                          torch.device("cpu"), "fp8_tensor")
    assert per_copy == 8 * 3 * 14336 * 4096
    assert copies == min(8, int(B.MEMORY_FRACTION * free // per_copy))


@pytest.mark.parametrize("ep", [1, 2])
@pytest.mark.parametrize("quant", FP8_QUANTS)
def test_reference64_fp8_matches_numpy_reference(quant, ep):
    from swapmoe.reference import e4m3_decode, fused_experts_fp8_ref

    shape, x, w1, w2, tw, ids, emap, fp8 = _fp8_problem(quant, ep, M=9, dtype=torch.float32)
    got, flips = B.reference64_fp8(torch, x, w1, w2, tw, ids, emap, fp8)

    def host(t):
        return None if t is None else t.double().numpy()

    kw = {} if emap is None else {"expert_map": emap.numpy(), "global_num_experts": shape.E_global}
    want, want_flips = fused_experts_fp8_ref(
        x.numpy(), e4m3_decode(w1.view(torch.uint8).numpy()), e4m3_decode(w2.view(torch.uint8).numpy()),
        tw.numpy(), ids.numpy(), w1_scale=host(fp8["w1_scale"]), w2_scale=host(fp8["w2_scale"]),
        a1_scale=host(fp8["a1_scale"]), a2_scale=host(fp8["a2_scale"]), per_channel_quant=fp8["per_channel_quant"],
        block_shape=fp8["block_shape"], **kw)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    assert flips["m"].numel() == len(want_flips)
    for f in range(len(want_flips)):
        m, delta = want_flips[f]
        assert int(flips["m"][f]) == m
        mine = flips["coef"][f] * B._w2_columns(torch, w2, fp8["w2_scale"], B.FP8_SCHEMES[quant],
                                                flips["e"][f:f + 1], flips["j"][f:f + 1])[0]
        np.testing.assert_allclose(mine.numpy(), delta, rtol=1e-10, atol=1e-14)


def test_rel_error_fp8_applies_flips():
    shape, x, w1, w2, tw, ids, emap, fp8 = _fp8_problem("fp8_channel", M=64, dtype=torch.float32, K=256, N=128)
    ref, flips = B.reference64_fp8(torch, x, w1, w2, tw, ids, emap, fp8)
    assert flips["m"].numel() >= 2
    cols = B._w2_columns(torch, w2, fp8["w2_scale"], "channel", flips["e"][:1], flips["j"][:1])
    out = ref.clone()
    out[int(flips["m"][0])] += flips["coef"][0] * cols[0]  # the op rounded one element the other way
    plain = float((out - ref).norm() / ref.norm())
    err, used = B.rel_error_fp8(torch, out, ref, flips, w2, fp8)
    assert plain > 1e-6 and err < 1e-12 and used == 1
    err, used = B.rel_error_fp8(torch, ref.clone(), ref, flips, w2, fp8)
    assert err == 0 and used == 0
    bad = ref.clone()
    bad[1, 3] = float("nan")
    assert math.isinf(B.rel_error_fp8(torch, bad, ref, flips, w2, fp8)[0])


class _CudaScalarDivision(torch.overrides.TorchFunctionMode):
    """Runs CPU tensors with ATen's CUDA rule for ``tensor / python_number``: multiply by the
    reciprocal rounded to the op-math dtype (BinaryDivTrueKernel.cu, div_true_kernel_cuda,
    ``is_cpu_scalar(2)``), instead of the correctly rounded division the CPU does. Counts the
    divisions it rewrote in ``rewritten``."""

    DIV = {torch.Tensor.__truediv__, torch.Tensor.__itruediv__, torch.Tensor.div, torch.Tensor.div_,
           torch.div, torch.divide, torch.true_divide}

    def __init__(self):
        super().__init__()
        self.rewritten = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func in self.DIV and len(args) == 2 and not kwargs.get("rounding_mode")
                and isinstance(args[0], torch.Tensor) and args[0].is_floating_point()
                and isinstance(args[1], (int, float)) and not isinstance(args[1], bool)):
            opmath = torch.float64 if args[0].dtype == torch.float64 else torch.float32
            inv = float(torch.tensor(1.0 / float(args[1]), dtype=torch.float64).to(opmath))
            self.rewritten += 1
            inplace = func in (torch.Tensor.__itruediv__, torch.Tensor.div_)
            return args[0].mul_(inv) if inplace else args[0] * inv
        return func(*args, **kwargs)


def test_cuda_scalar_division_emulation():
    v = torch.arange(1, 65, dtype=torch.float32)
    with _CudaScalarDivision() as mode:
        got = v / 448.0
    assert mode.rewritten == 1
    assert torch.equal(got, v * float(np.float32(1.0) / np.float32(448.0)))
    assert not torch.equal(got, v / 448.0)  # one ulp apart somewhere (the point of the emulation)


@pytest.mark.parametrize("quant", FP8_QUANTS)
@pytest.mark.parametrize("dims", [(16, 8, 512, 384), (8, 3, 200, 72)], ids=["qwen3-blocks", "partial-blocks"])
def test_reference64_fp8_is_device_independent(quant, dims):
    """The GPU fp8_block128 check failed (rel err 1.7-2.1e-2) while the kernels matched the CPU
    path: on CUDA tensors ``absmax / 448.0`` was a multiply by fl32(1/448), one ulp off the op's
    division, which flips bf16 activations sitting on e4m3 rounding midpoints. Here the CPU
    runs CUDA's scalar-division rule: the reference must not change at all, and must still
    pass the check against the op. qwen3-blocks: qwen3's 128x128 block structure scaled down
    (E=16, topk=8, K=512 = 4 blocks, N=384 = 3 blocks; bf16 inputs, dynamic scales)."""
    E, topk, K, N = dims
    shape, x, w1, w2, tw, ids, emap, fp8 = _fp8_problem(quant, M=5, seed=11, E=E, topk=topk, K=K, N=N)
    if quant == "fp8_tensor":
        fp8 = dict(fp8, a1_scale=None, a2_scale=None)  # dynamic per-tensor scales divide too
    want, want_flips = B.reference64_fp8(torch, x, w1, w2, tw, ids, emap, fp8)
    with _CudaScalarDivision():
        got, flips = B.reference64_fp8(torch, x, w1, w2, tw, ids, emap, fp8)
    assert torch.equal(got, want), float((got - want).norm() / want.norm())
    assert torch.equal(flips["m"], want_flips["m"]) and torch.equal(flips["j"], want_flips["j"])
    out = B.impl_swapmoe(x, w1, w2, tw, ids, emap, torch.full_like(x, float("nan")), fp8=fp8)
    err, _ = B.rel_error_fp8(torch, out, got, flips, w2, fp8)
    assert err <= B.TOLERANCE["bf16"], err


def test_fp8_act_quant_ties_on_bf16_input():
    """bf16 activations land exactly on e4m3 midpoints often (448 v / absmax of 8-bit
    mantissas); those are the elements a one-ulp scale error flips."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(64, 512, generator=g).to(torch.bfloat16).float()
    q, s = B.fp8_act_quant_torch(torch, v, "block")
    t = (v / s).double()
    step = B._e4m3_step(torch, t.abs())
    ties = int(((t.abs() / step) % 1 == 0.5).sum())
    assert ties > 0
    with _CudaScalarDivision():
        q2, s2 = B.fp8_act_quant_torch(torch, v, "block")
    assert torch.equal(s2, s) and torch.equal(q2, q)


@pytest.mark.parametrize("quant", FP8_QUANTS)
def test_fp8_check_point_passes(quant):
    shape, x, w1, w2, tw, ids, emap, fp8 = _fp8_problem(quant, ep=2, M=7)
    res = B.check_point(torch, [B.IMPL_SWAPMOE], x, (w1, w2), tw, ids, emap, B.TOLERANCE["bf16"], fp8=fp8)
    r = res[B.IMPL_SWAPMOE]
    assert r["ok"] and r["rel_err"] < 1e-2 and "flips" in r, r


@pytest.mark.parametrize("quant", FP8_QUANTS)
def test_fp8_cpu_run(quant, tmp_path, capsys):
    j = str(tmp_path / "f.json")
    rc = cli.main(["bench", "--device", "cpu", "--quant", quant, "--shape", "8,2,256,128", "--m", "1,5",
                   "--layers", "2", "--no-progress", "--check-all", "--baselines", "--json", j])
    out = capsys.readouterr().out
    rec = json.load(open(j))
    assert rc == 0, out
    assert rec["quant"] == quant and rec["dtype"] == "bf16"
    assert rec["bytes_per_weight"] == 1 and rec["bytes_per_act"] == 2
    assert rec["method"]["weight_bytes_per_copy"] == 8 * 3 * 128 * 256
    assert rec["check"]["ok"] and rec["check"]["reference"] == B.CHECK_REFERENCE_FP8
    assert rec["check"]["results"]["swapmoe"]["rel_err"] < 1e-2
    assert all(p["check"]["swapmoe"]["ok"] for p in rec["points"])
    assert rec["implementations"] == ["swapmoe"]  # the baselines run unquantized weights only
    assert set(rec["skipped"]) == {B.IMPL_VLLM, B.IMPL_GROUPED, B.IMPL_EAGER}
    assert all(quant in why for why in rec["skipped"].values())
    f = rec["method"]["fp8"]
    assert f["w1_scale_shape"] == list(B.fp8_scale_shapes(quant, B.parse_shape("8,2,256,128"))[0])
    if quant == "fp8_tensor":
        assert f["activation_scales"].startswith("static") and f["a1_scale"] > 0 and f["a2_scale"] > 0
    else:
        assert f["activation_scales"].startswith("dynamic") and f["a1_scale"] is None
    assert rec["anchor"]["variant"] == B.anchor_variant(quant, "bf16")
    for p in rec["points"]:
        assert p["plan"]["backend"] == "cpu" and p["results"]["swapmoe"]["time_us"] > 0
        assert p["floor_us"] is None  # no HBM on a CPU run
        # the floor a GPU run would print: 1 byte per weight, 2 per activation
        want = (p["experts_touched"] * 3 * 128 * 256 * 1 + 2 * p["M"] * 256 * 2) / 4.42e12 * 1e6
        got = B.hbm_floor_us(p["experts_touched"], 128, 256, p["M"], rec["bytes_per_act"], rec["bytes_per_act"],
                             4.42e12, quant=rec["quant"])
        assert got == pytest.approx(want, rel=1e-12)
    assert f"bf16 {quant}" in out.splitlines()[0]
    assert "FP8 reference" in out and "swapmoe" in out and "FAIL" not in out
    assert f"skipped: {B.IMPL_EAGER}:" in out


def test_fp8_cpu_run_with_routing_and_ep():
    rec = B.run_bench(B.parse_shape("8,2,128,64", ep=2), device="cpu", quant="fp8_block128", m_list=[1, 4],
                      with_routing=True, progress=False, check_all=True)
    assert rec["check"]["ok"] and rec["check"]["results"][B.IMPL_ROUTED]["ok"]
    assert rec["implementations"] == [B.IMPL_SWAPMOE, B.IMPL_ROUTED]
    assert all(p["results"][B.IMPL_ROUTED]["time_us"] > 0 for p in rec["points"])


def _wrong_fp8_impls():
    def scaled(x, w1, w2, tw, ids, emap, out, fp8=None):
        B.impl_swapmoe(x, w1, w2, tw, ids, emap, out, fp8=fp8)
        return out.mul_(1.05)

    def unquantized_activations(x, w1, w2, tw, ids, emap, out, fp8=None):
        # right weights, activations not quantized: about 4% off, the FP8 check must see it
        ref = B.reference64(torch, x, _dequant_all(w1, fp8["w1_scale"], fp8), _dequant_all(w2, fp8["w2_scale"], fp8),
                            tw, ids, emap)
        return out.copy_(ref)

    def nan_row(x, w1, w2, tw, ids, emap, out, fp8=None):
        B.impl_swapmoe(x, w1, w2, tw, ids, emap, out, fp8=fp8)
        out[0, 0] = float("nan")
        return out

    def drops_fp8(x, w1, w2, tw, ids, emap, out, fp8=None):
        return B.impl_swapmoe(x, w1, w2, tw, ids, emap, out)

    return {"scaled": scaled, "unquantized": unquantized_activations, "nan": nan_row, "drops_fp8": drops_fp8}


def _dequant_all(w, s, fp8):
    scheme = B._fp8_scheme_of(fp8)
    return w.double() * B._expand_weight_scale(torch, s, scheme, w.shape[1], w.shape[2]).double()


@pytest.mark.parametrize("kind", ["scaled", "unquantized", "nan", "drops_fp8"])
@pytest.mark.parametrize("quant", ["fp8_tensor", "fp8_block128"])
def test_fp8_check_catches_a_wrong_impl(quant, kind, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(B.IMPLS, B.IMPL_SWAPMOE, (_wrong_fp8_impls()[kind], True))
    j = str(tmp_path / "w.json")
    rc = cli.main(["bench", "--device", "cpu", "--quant", quant, "--shape", "8,2,256,128",
                   "--m", "4", "--layers", "2", "--no-progress", "--json", j])
    out = capsys.readouterr().out
    rec = json.load(open(j))
    assert rc == 1 and not rec["check"]["ok"] and rec["check"]["failed_M"] == [4]
    r = rec["check"]["results"]["swapmoe"]
    assert not r["ok"]
    if kind == "drops_fp8":  # fp8 weights without use_fp8_w8a8: the op refuses, an error entry
        assert r["error"] and r["rel_err"] is None and "swapmoe ERROR" in out
    elif kind == "nan":
        assert r["rel_err"] == "inf" and "inf (NaN/unwritten)" in out
    else:
        assert r["rel_err"] > r["tol"] and "FAIL" in out
    assert any("CHECK FAILED for swapmoe" in n for n in rec["notes"])


@pytest.mark.parametrize("quant", FP8_QUANTS)
def test_fp8_plan_column(quant):
    """CPU tensors: the cpu backend; a GPU run asks select_backend(..., quant=) (here offline,
    as for a device other than 0) for the FP8 kernels and the workspace."""
    shape, x, w1, w2, tw, ids, emap, fp8 = _fp8_problem(quant, M=1, K=256, N=128)
    p = B.describe_point_plan(torch, x, (w1, w2), tw, ids, emap, shape, "bf16", quant, False)
    assert p["backend"] == "cpu"
    p = B.describe_point_plan(torch, x, (w1, w2), tw, ids, emap, shape, "bf16", quant, True,
                              {"device_name": "NVIDIA H200", "device_capability": (9, 0)})
    assert isinstance(p, dict), p
    assert p["backend"] == "cuda_wgmma_swap" and any("fp8" in k for k in p["kernels"])
    import swapmoe

    assert p["workspace_bytes"] == swapmoe.workspace_bytes(x, w1, ids, quant) > 0
    p = B.describe_point_plan(torch, x, (w1, w2), tw, ids, emap, shape, "bf16", quant, True,
                              {"device_name": "NVIDIA H200", "device_capability": (8, 0)})
    assert isinstance(p, str) and "Error" in p  # FP8 below sm_89: the error text, not a crash


def test_a_reader_that_goes_away_stops_the_cli_quietly():
    """`swapmoe explain ... | head`: the closed pipe ends the command with 141 (SIGPIPE's
    status), no traceback. The output (~1 KB per M) is far more than a pipe holds, so the
    command is still writing when the reader closes."""
    ms = ",".join(str(m) for m in range(1, 400))
    proc = subprocess.Popen([sys.executable, "-m", "swapmoe", "explain", "--model", "qwen3-30b-a3b",
                             "--m", ms, "--device-name", "NVIDIA H200"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"swapmoe ")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_gpu_record_header_names_a_probe_or_profiling_build():
    """A table timed on a probe build (kernels without their math) or a profiling build says so
    in its header, so that such numbers are never read as the op's; a release build's has no
    such line."""
    rec = _fake_gpu_record()
    assert "build:" not in cli.format_table(rec)
    rec["build_info"] = {"cuda_probe": "no_mma", "cuda_stamps": True}
    text = cli.format_table(rec)
    assert ("build: timing probe SWAPMOE_CUDA_PROBE=no_mma: the swap-AB kernels skip their math (memory "
            "pipeline only); their results are wrong on purpose") in text
    assert "build: profiling (SWAPMOE_CUDA_STAMPS=1)" in text
