"""Correctness of the CUDA path against the float64 reference (computed on the CPU), plus
CUDA graphs, torch.compile, streams, determinism and CUDA-side errors. Every test is
marked ``gpu`` and skipped when torch sees no CUDA device."""

from __future__ import annotations

import ctypes
import inspect
import math
import threading

import numpy as np
import pytest

import swapmoe
from conftest import (
    TOLERANCE,
    Case,
    call,
    call_with_workspace,
    chain_after_long_call,
    chain_three,
    current_cuda_context,
    queued_ahead_of_the_gpu,
    queued_reruns,
    check_close,
    has_cuda,
    junk_workspace,
    libcuda,
    make_problem,
    poison,
    reference,
    run_case,
    same_bits,
    snapshot,
    to_f64,
    to_inputs,
    torch,
)
from swapmoe.reference import rel_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

DEV = "cuda"

# Broad but smaller than the CPU grid. K and N that are not multiples of the 16-byte
# vector (scalar loads), misaligned views, decode-sized (M*topk <= 512) and larger
# problems, expert maps, invalid and duplicate ids, every output mode.
GPU_GRID = [
    Case(1, 1, 1, 40, 48),
    Case(3, 8, 2, 64, 64, "gelu", id_dtype="int64", layout="strided", out="poison"),
    Case(16, 8, 8, 40, 200, out="inplace"),
    Case(33, 64, 6, 96, 200, "gelu", id_dtype="int64", out="poison"),
    Case(128, 64, 8, 40, 48, ids="concentrated", layout="strided", out="poison"),
    Case(128, 128, 8, 64, 64, ep=True, out="poison", tw_dtype="bfloat16"),
    Case(33, 256, 8, 40, 48, "gelu", ids="concentrated", id_dtype="int64", out="inplace"),
    Case(16, 256, 6, 40, 64, ep=True, layout="strided", out="poison"),
    Case(1, 256, 8, 64, 64, out="poison"),
    Case(3, 128, 2, 96, 48, "gelu", ids="invalid", id_dtype="int64", out="poison"),
    Case(33, 8, 6, 96, 64, ids="invalid", ep=True, id_dtype="int64", layout="strided", out="poison"),
    Case(128, 256, 1, 64, 48, ids="invalid", ep=True, layout="strided", out="poison", tw_dtype="float16"),
    Case(80, 16, 8, 37, 50, "gelu", ids="dup", out="poison"),  # odd N and K: scalar loads
    Case(7, 8, 2, 20, 33, ids="invalid", out="inplace"),
    Case(96, 32, 6, 64, 256, layout="misaligned", out="poison"),  # unaligned rows/addresses
    Case(5, 8, 8, 64, 64, "gelu", ep=True, layout="misaligned", out="inplace"),
    Case(200, 8, 2, 40, 48, ids="none", out="poison"),
    Case(300, 64, 4, 96, 200, ids="concentrated", ep=True, out="poison"),
]

DECODE_M = [1, 2, 3, 4, 5, 8, 16, 17, 32, 64, 65]  # 8 to 520 slots: both sides of the decode cut-over


def _ids(cases):
    return [c.id for c in cases]


@pytest.fixture(autouse=True)
def _cuda_sync():
    yield
    if has_cuda():
        torch.cuda.synchronize()  # surfaces asynchronous faults in the test that caused them


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", GPU_GRID, ids=_ids(GPU_GRID))
def test_grid_cuda(case, dtype, rng):
    run_case(case, "torch", dtype, rng, device=DEV)


HAS_BACKEND_ARG = "backend" in inspect.signature(swapmoe.fused_experts).parameters
FORCED = [
    Case(1, 128, 8, 128, 256, out="poison"),
    Case(17, 64, 6, 37, 50, "gelu", ids="invalid", ep=True, out="poison"),
    Case(64, 128, 8, 128, 256, ids="concentrated", layout="misaligned", out="inplace"),
]


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("backend", ["cuda_decode", "cuda_generic"])
@pytest.mark.parametrize("case", FORCED, ids=_ids(FORCED))
def test_forced_backends(case, backend, rng):
    """Decode-sized problems on each CUDA backend (the oracle picks only one of them)."""
    run_case(case, "torch", "bfloat16", rng, device=DEV, backend=backend)


MMA_CASES = [
    Case(1, 128, 8, 128, 256, out="poison"),
    Case(17, 64, 6, 40, 56, "gelu", ids="invalid", ep=True, out="poison"),
    Case(64, 128, 8, 128, 256, ids="concentrated", out="inplace"),
    Case(70, 8, 3, 72, 136, ids="dup", out="poison"),
    Case(300, 8, 2, 200, 136, out="poison"),  # 128-token tiles, N and K tails
    Case(1000, 4, 2, 64, 64, ids="invalid", out="poison"),
]


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", MMA_CASES, ids=_ids(MMA_CASES))
def test_tensor_core_backend(case, dtype, rng):
    """The mma.sync tensor-core kernels (token tiles 16, 64, 128) on their own."""
    run_case(case, "torch", dtype, rng, device=DEV, backend="cuda_mma")


BULK_CASES = [
    Case(1, 128, 8, 128, 256, out="poison"),
    # > 4 slots of one expert (several slot groups), K chunk tail (1000 = 512 + 488), EP map
    Case(5, 16, 8, 200, 1000, "gelu", ids="concentrated", ep=True, out="poison"),
    # N > 1024 (two GEMM2 chunks), K = 512 + 8, out aliases hidden_states, invalid ids
    Case(8, 64, 8, 1160, 520, ids="invalid", id_dtype="int64", out="inplace"),
    Case(7, 8, 2, 64, 64, ids="dup", out="poison", tw_dtype="bfloat16"),
    Case(16, 8, 1, 40, 48, on_input=True, out="poison"),
    Case(64, 256, 1, 64, 48, ids="invalid", ep=True, out="poison"),  # 64 slots: the limit
    Case(3, 8, 2, 64, 64, ids="none", out="poison"),  # no expert at all: out must be zeros
    Case(2, 128, 8, 768, 2048, out="poison"),  # qwen3-30b-a3b's expert shape
]


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", BULK_CASES, ids=_ids(BULK_CASES))
def test_bulk_decode_backend(case, dtype, rng):
    """The Hopper bulk-copy (TMA) decode kernels on their own (sm_90 only)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuda_bulk_decode runs on sm_90 only")
    run_case(case, "torch", dtype, rng, device=DEV, backend="cuda_bulk_decode")


def _rerun(inp, case, **kw):
    """One call with a NaN output and a 0xFF workspace (bits of the call's own, not the
    previous rerun's leftovers): a value a kernel failed to write, or read before writing,
    cannot match by accident."""
    return snapshot(call_with_workspace(inp, case, junk_workspace(inp), poison(inp["x"]), **kw))


def _assert_deterministic(backend, case, rng, reruns=20):
    """A moving result would be a race: ``reruns`` calls of ``backend`` on the same inputs
    must be bit-identical to the first, which matches the reference."""
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    first = _rerun(inp, case, backend=backend)
    check_close(torch.from_numpy(first).view(torch.bfloat16), reference(inp, case), "bfloat16", what=backend)
    for _ in range(reruns):
        assert same_bits(_rerun(inp, case, backend=backend), first)


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
def test_bulk_decode_is_deterministic(rng):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuda_bulk_decode runs on sm_90 only")
    _assert_deterministic("cuda_bulk_decode", Case(4, 64, 8, 1160, 1000, ids="concentrated", out="poison"), rng)


WGMMA_CASES = [
    Case(1, 128, 8, 128, 256, out="poison"),  # 8 tiles of one row each
    # ragged experts, invalid ids, expert map with -1, N and K not multiples of 64 (TMA zero fill)
    Case(17, 64, 6, 40, 56, "gelu", ids="invalid", ep=True, out="poison"),
    Case(64, 128, 8, 128, 256, ids="concentrated", out="inplace"),  # many tiles per hot expert
    Case(70, 8, 3, 72, 136, ids="dup", out="poison", tw_dtype="bfloat16"),
    Case(300, 8, 2, 200, 136, out="poison"),  # 2 GEMM1 column blocks
    Case(1000, 4, 2, 64, 64, ids="invalid", id_dtype="int64", out="poison"),
    # 6000 slots: 47 tiles, several raster groups and a partial one; 3 GEMM2 column blocks
    Case(3000, 8, 2, 264, 520, out="poison"),
    Case(600, 64, 1, 96, 200, "gelu", on_input=True, ep=True, ids="invalid", out="poison"),
    Case(3, 8, 2, 64, 64, ids="none", out="poison"),  # no expert at all: out must be zeros
    Case(2, 128, 8, 768, 2048, out="poison"),  # qwen3-30b-a3b's expert shape
    # N >= 4096: the plan gathers the token rows first (wgmma_moe_gather) and GEMM1 reads them by TMA
    Case(300, 4, 2, 4104, 136, out="poison"),
    Case(64, 8, 2, 4096, 64, "gelu", ids="invalid", ep=True, out="inplace"),
]


def _needs_hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuda_wgmma runs on sm_90 only")


def _run_wgmma_tile(case, dtype, tile, rng, monkeypatch):
    """Runs `case` on cuda_wgmma at token tile `tile` (sm_90 only) against the reference, checks
    that the plan took that backend and tile, and returns the plan."""
    _needs_hopper()
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", str(tile))
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma")
    _, _, inp = run_case(case, "torch", dtype, rng, device=DEV)
    plan = swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"],
                                       expert_map=inp["expert_map"])
    assert (plan["backend"], plan["tokens_per_pass"]) == ("cuda_wgmma", tile)
    return plan


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("tile", [64, 128])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", WGMMA_CASES, ids=_ids(WGMMA_CASES))
def test_wgmma_backend(case, dtype, tile, rng, monkeypatch):
    """The Hopper wgmma + TMA GEMMs on their own (sm_90 only), each token tile."""
    _run_wgmma_tile(case, dtype, tile, rng, monkeypatch)


# Experts whose token counts sit on both sides of the tile edges (conftest TILE_EDGE_COUNTS:
# 0, 1, 63-65, 127-129, 191-193, 255-257 tokens), in the one-CTA-per-item grids and in the
# persistent ones (GEMM2 at N = 256, GEMM1 at K = 256), where the ring runs on into the next
# tile; 20 reruns must be bit-identical.
TILE_EDGE_CASES = [Case(997, 16, 2, 256, 512, ids="tile_edges", out="poison"),
                   Case(997, 16, 2, 512, 256, "gelu", ids="tile_edges", out="poison")]


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("tile", [64, 128])
@pytest.mark.parametrize("case", TILE_EDGE_CASES, ids=_ids(TILE_EDGE_CASES))
def test_wgmma_tile_edges(case, tile, rng, monkeypatch):
    _run_wgmma_tile(case, "bfloat16", tile, rng, monkeypatch)
    _assert_deterministic("cuda_wgmma", case, rng)


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("hints", [1, 2, 3], ids=lambda h: f"l2_hints={h}")
@pytest.mark.parametrize("pregather", ["off", "on"], ids=lambda v: f"pregather={v}")
@pytest.mark.parametrize("tile", [64, 128])
def test_wgmma_l2_hints(tile, pregather, hints, rng, monkeypatch):
    """L2 eviction hints on cuda_wgmma's loads ($SWAPMOE_WGMMA_L2_HINTS: weights evict first,
    token rows evict last, both) move where lines live in L2, never the results: the tile-edge
    case against the reference, in both A modes, and the plan says which hints it ran."""
    monkeypatch.setenv("SWAPMOE_WGMMA_L2_HINTS", str(hints))
    monkeypatch.setenv("SWAPMOE_WGMMA_PREGATHER", pregather)
    plan = _run_wgmma_tile(TILE_EDGE_CASES[0], "bfloat16", tile, rng, monkeypatch)
    assert plan["wgmma_l2_hints"] == hints
    assert ("wgmma_moe_gather" in plan["kernels"]) == (pregather == "on"), plan["kernels"]


# GEMM2 in runs of column blocks per token tile ($SWAPMOE_WGMMA_GEMM2_BLOCK_RUN): the producer
# loads a tile's rows once per run and finds them in the ring's buffers for the run's other
# blocks. N = 256 (4 k-stages in tile 128's 4 stages) and N = 128 (2 in 4); K = 2056 makes 9
# column blocks, the last of 8 columns, so runs end inside K and at its edge; tile-edge token
# counts, concentrated experts, invalid ids with an expert map. 20 reruns must be bit-identical.
BLOCK_RUN_CASES = [Case(997, 16, 2, 256, 2056, ids="tile_edges", out="poison"),
                   Case(1200, 8, 2, 256, 2048, ids="concentrated", out="poison"),
                   Case(600, 64, 6, 128, 520, "gelu", ids="invalid", ep=True, out="poison")]


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("run", [2, 4, 12])
@pytest.mark.parametrize("case", BLOCK_RUN_CASES, ids=_ids(BLOCK_RUN_CASES))
def test_wgmma_gemm2_block_run(case, run, rng, monkeypatch):
    monkeypatch.setenv("SWAPMOE_WGMMA_GEMM2_BLOCK_RUN", str(run))
    plan = _run_wgmma_tile(case, "bfloat16", 128, rng, monkeypatch)
    assert plan["wgmma_persistent"][1]
    assert plan["wgmma_gemm2_block_run"] == min(run, -(-case.K // 256))
    _assert_deterministic("cuda_wgmma", case, rng)


# The routing alignment as a thread-block cluster ($SWAPMOE_ALIGN_CTAS; the oracle takes one CTA
# per 4096 slots): the slot runs of 1-8 CTAs, with empty runs (fewer slots than CTAs), a last
# partial batch, invalid ids, an expert map with -1, strided int64 ids and concentrated experts,
# for each backend behind route_align. The grouping within an expert may differ between cluster
# sizes; every slot is computed on its own, so the output must be bit-identical.
ALIGN_CLUSTER_CASES = [
    ("cuda_wgmma", Case(1500, 128, 8, 128, 256, ids="invalid", ep=True, id_dtype="int64", out="poison")),
    # strided topk_ids (offsets by division); the tensor-map backends need aligned row strides
    ("cuda_generic", Case(1500, 64, 6, 40, 48, ids="invalid", ep=True, id_dtype="int64", layout="strided",
                          out="poison")),
    ("cuda_wgmma", Case(3, 64, 2, 64, 64, out="poison")),
    ("cuda_mma", Case(700, 64, 6, 96, 200, ids="concentrated", out="poison")),
    ("cuda_generic", Case(33, 8, 2, 40, 48, "gelu", ids="invalid", ep=True, out="poison")),
]


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("ctas", [2, 3, 8])
@pytest.mark.parametrize("backend,case", ALIGN_CLUSTER_CASES, ids=[f"{b}-{c.id}" for b, c in ALIGN_CLUSTER_CASES])
def test_align_cluster_gives_the_same_output(backend, case, ctas, rng, monkeypatch):
    _needs_hopper()
    monkeypatch.setenv("SWAPMOE_BACKEND", backend)
    monkeypatch.setenv("SWAPMOE_ALIGN_CTAS", str(ctas))
    monkeypatch.setenv("SWAPMOE_ALIGN_IN_GEMM1", "off")  # the align kernel, also at cuda_wgmma's few slots
    out, _, inp = run_case(case, "torch", "bfloat16", rng, device=DEV)
    plan = swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"],
                                       expert_map=inp["expert_map"])
    assert (plan["backend"], plan["align_ctas"], plan["kernels"][0]) == (backend, ctas, "swapmoe_route_align")
    clustered = out.clone()
    monkeypatch.setenv("SWAPMOE_ALIGN_CTAS", "1")
    one = call(inp, case, out=torch.full_like(out, float("nan")))
    torch.cuda.synchronize()
    assert torch.equal(one, clustered), f"{backend} {case.id}: {ctas} align CTAs differ from one"


# cuda_wgmma's GEMM1 grouping the slots itself ($SWAPMOE_ALIGN_IN_GEMM1, `Plan::align_in_gemm1`,
# no align kernel): every CTA groups them in its own shared memory and CTA 0 writes the grouping
# that GEMM2 and the top-k sum read, so every CTA must come to the same order within an expert
# (the concentrated case puts several tiles on each hot expert). M = 1; ragged experts with
# invalid ids and an expert map with -1; duplicate ids; int64 ids in a strided view; no expert
# at all; the router weight on the input; 512 slots over 128 and 256 experts (the rule's bound);
# 2000 experts, whose grouping nearly fills the shared memory past the stages. Each in the
# persistent grid and one CTA per item.
ALIGN_IN_GEMM1_CASES = [
    Case(1, 128, 8, 128, 256, out="poison"),
    Case(17, 64, 6, 40, 56, "gelu", ids="invalid", ep=True, out="poison"),
    Case(64, 8, 8, 128, 256, ids="concentrated", out="poison"),
    Case(70, 8, 3, 72, 136, ids="dup", out="poison"),
    Case(33, 64, 6, 64, 128, ids="invalid", ep=True, id_dtype="int64", out="poison"),
    Case(3, 8, 2, 64, 64, ids="none", out="poison"),
    Case(40, 16, 1, 96, 200, "gelu", on_input=True, out="poison"),
    Case(64, 128, 8, 256, 512, out="poison"),
    Case(64, 256, 8, 128, 256, out="poison"),  # deepseek-v3's 256 experts at 512 slots
    Case(1, 2000, 8, 64, 128, out="poison"),  # the grouping of 2000 experts: 24 KB, near the limit
]


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("persistent", ["on", "off"], ids=lambda v: f"persistent={v}")
@pytest.mark.parametrize("tile", [64, 128])
@pytest.mark.parametrize("case", ALIGN_IN_GEMM1_CASES, ids=_ids(ALIGN_IN_GEMM1_CASES))
def test_wgmma_gemm1_groups_the_slots_itself(case, tile, persistent, rng, monkeypatch):
    """Against the reference, bit-identical to the plan with route_align and to its own reruns,
    each on a 0xFF workspace and a NaN output (GEMM2 and the top-k sum read only what GEMM1's
    CTA 0 wrote)."""
    _needs_hopper()
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", str(tile))
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma")
    monkeypatch.setenv("SWAPMOE_WGMMA_PERSISTENT", persistent)
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    if case.id_dtype == "int64":  # the same ids in a view whose rows are topk + 3 apart
        wide = torch.full((case.M, case.topk + 3), -7, dtype=torch.int64, device=DEV)
        wide[:, :case.topk] = inp["ids"]
        inp["ids"] = wide[:, :case.topk]
    ref = reference(inp, case)
    outs = {}
    for align in ("on", "off"):
        monkeypatch.setenv("SWAPMOE_ALIGN_IN_GEMM1", align)
        plan = swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"],
                                           expert_map=inp["expert_map"], activation=case.act)
        assert (plan["backend"], plan["tokens_per_pass"]) == ("cuda_wgmma", tile)
        assert plan["align_in_gemm1"] == (align == "on"), plan["reasons"]
        assert ("swapmoe_route_align" in plan["kernels"]) == (align == "off"), plan["kernels"]
        outs[align] = _rerun(inp, case)
    check_close(torch.from_numpy(outs["on"]).view(torch.bfloat16), ref, "bfloat16", what=case.id)
    assert same_bits(outs["on"], outs["off"]), f"{case.id}: GEMM1's grouping and route_align's differ"
    monkeypatch.setenv("SWAPMOE_ALIGN_IN_GEMM1", "on")
    for _ in range(5):
        assert same_bits(_rerun(inp, case), outs["on"]), f"{case.id}: a rerun moved"


# cuda_wgmma's GEMM1 after route_align launched by PDL ($SWAPMOE_WGMMA_GEMM1_PDL,
# `Plan::wgmma_gemm1_pdl`): its CTAs set up their ring under route_align's tail and wait before
# they read the tile list, the ids or the token rows. GEMM1 with fewer k-stages than the ring's
# stages (K = 64, 256) and more (K = 4096); ragged experts with invalid ids and an expert map;
# CTAs with no tile (3 tokens); the persistent grid and one CTA per item; tile 128 (GEMM2 in
# block runs of 4).
GEMM1_PDL_CASES = [
    (64, Case(64, 128, 8, 128, 512, out="poison")),
    (64, Case(17, 64, 6, 1024, 256, "gelu", ids="invalid", ep=True, out="poison")),
    (64, Case(200, 8, 2, 128, 4096, ids="concentrated", out="poison")),
    (64, Case(3, 64, 2, 64, 64, out="poison")),
    (128, Case(200, 8, 2, 256, 2048, ids="concentrated", out="poison")),
]


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("persistent", ["on", "off"], ids=lambda v: f"persistent={v}")
@pytest.mark.parametrize("tile,case", GEMM1_PDL_CASES, ids=[f"t{t}-{c.id}" for t, c in GEMM1_PDL_CASES])
def test_wgmma_gemm1_by_pdl(tile, case, persistent, rng, monkeypatch):
    """Against the reference and bit-identical to the plan without PDL, each on a 0xFF workspace
    and a NaN output; then 4 calls with PDL queued back to back, each bit-identical too. The
    plan says which launches ran."""
    _needs_hopper()
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma")
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", str(tile))
    monkeypatch.setenv("SWAPMOE_WGMMA_PERSISTENT", persistent)
    monkeypatch.setenv("SWAPMOE_WGMMA_GEMM2_BLOCK_RUN", "4" if tile == 128 else "1")
    monkeypatch.setenv("SWAPMOE_ALIGN_IN_GEMM1", "off")
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    ref = reference(inp, case)
    outs = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv("SWAPMOE_WGMMA_GEMM1_PDL", pdl)
        plan = swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"],
                                           expert_map=inp["expert_map"], activation=case.act)
        assert plan["backend"] == "cuda_wgmma", plan["reasons"]
        assert plan["wgmma_gemm1_pdl"] == (pdl == "1"), plan["reasons"]
        assert not plan["align_in_gemm1"], plan["reasons"]
        runs = 4 if tile == 128 and persistent == "on" else 1
        assert plan["wgmma_gemm2_block_run"] == runs, plan["reasons"]
        outs[pdl] = _rerun(inp, case)
    check_close(torch.from_numpy(outs["1"]).view(torch.bfloat16), ref, "bfloat16", what=case.id)
    assert same_bits(outs["1"], outs["0"]), f"{case.id}: GEMM1 by PDL differs from GEMM1 after route_align"
    monkeypatch.setenv("SWAPMOE_WGMMA_GEMM1_PDL", "1")
    for i, out in enumerate(queued_reruns(inp, case, 4)):
        assert same_bits(out, outs["1"]), f"{case.id}: queued call {i} moved"


# Persistent grids with several work items per CTA (one CTA per SM, ~370 items): GEMM2 with
# 4 k-stages (N = 256) and GEMM1 with 32 (K = 2048; persistent for its 2 column blocks per
# expert), then GEMM1 with 4 (K = 256); the ring's stages and phases run on across tiles.
PERSISTENT_CASES = [Case(1200, 8, 2, 256, 2048, out="poison"),
                    Case(1200, 8, 2, 1024, 256, ids="concentrated", out="poison")]


@pytest.mark.serial
@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("tile", [64, 128])
@pytest.mark.parametrize("case", PERSISTENT_CASES, ids=_ids(PERSISTENT_CASES))
def test_wgmma_persistent_grids(case, tile, rng, monkeypatch):
    plan = _run_wgmma_tile(case, "bfloat16", tile, rng, monkeypatch)
    assert plan["wgmma_persistent"] == ((True, True) if case.N == 256 else (True, False))
    assert 0 < plan["ctas"] < 2 * torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("M", DECODE_M)
def test_wgmma_every_decode_size(M, rng):
    _needs_hopper()
    run_case(Case(M, 128, 8, 128, 256, out="poison"), "torch", "bfloat16", rng, device=DEV, backend="cuda_wgmma")


@pytest.mark.serial
@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("tile", [64, 128])
def test_wgmma_is_deterministic(tile, rng, monkeypatch):
    """A moving result would be a pipeline race: 20 reruns must be bit-identical."""
    _needs_hopper()
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", str(tile))
    _assert_deterministic("cuda_wgmma", Case(2000, 16, 4, 264, 520, ids="concentrated", out="poison"), rng)


def test_wgmma_rejects_unaligned_rows(rng):
    """Tensor maps need 16-byte rows: forcing cuda_wgmma on misaligned views is a ShapeError
    that says so, not a fault."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuda_wgmma runs on sm_90 only")
    case = Case(64, 8, 2, 64, 64, layout="misaligned")
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    with pytest.raises(swapmoe.ShapeError, match="cuda_wgmma.*multiples of 8"):
        call(inp, case, backend="cuda_wgmma")


def _graph_capture_and_replay(backend, M, rng, monkeypatch):
    """Captures one call of ``backend`` in a CUDA graph, then replays it twice on fresh
    inputs written into the captured buffers; each replay must match float64."""
    _needs_hopper()
    monkeypatch.setenv("SWAPMOE_BACKEND", backend)
    case = Case(M, 32, 6, 64, 128, ids="concentrated")
    prob = make_problem(rng, case)
    inp = to_inputs(prob, case, "torch", "bfloat16", DEV)
    swapmoe.warmup(0)
    call(inp, case)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(inp, case)
    for _ in range(2):
        fresh = make_problem(rng, case)
        fresh["w1"], fresh["w2"] = prob["w1"], prob["w2"]
        _fresh_into(inp, fresh, case)
        graph.replay()
        torch.cuda.synchronize()
        check_close(captured, reference(inp, case), "bfloat16", what="graph replay")


@pytest.mark.serial
@pytest.mark.parametrize("M", [4, 300])
def test_wgmma_cuda_graph_capture_and_replay(M, rng, monkeypatch):
    _graph_capture_and_replay("cuda_wgmma", M, rng, monkeypatch)


SWAP_CASES = [
    Case(1, 128, 8, 128, 256, out="poison"),  # M=1: 8 experts of one token each
    # ragged experts, invalid ids, expert map with -1, N and K not multiples of 64 (TMA zero fill)
    Case(17, 64, 6, 40, 56, "gelu", ids="invalid", ep=True, out="poison"),
    Case(64, 128, 8, 128, 256, ids="concentrated", out="inplace"),  # 64 tokens: the widest tile
    Case(7, 8, 3, 72, 136, ids="dup", out="poison", tw_dtype="bfloat16"),  # a token lists an expert twice
    Case(5, 16, 1, 96, 200, "gelu", on_input=True, ep=True, ids="invalid", out="poison"),
    Case(3, 8, 2, 64, 64, ids="none", out="poison"),  # no expert at all: out must be zeros
    Case(2, 128, 8, 768, 2048, out="poison"),  # qwen3-30b-a3b's expert shape
    Case(1, 16, 8, 256, 7168, out="poison"),  # deepseek-v3-tp8's expert shape (fewer experts)
    Case(33, 8, 2, 520, 264, id_dtype="int64", out="poison"),  # several row blocks, both tails
]
SWAP_SPLITS = [None, "1,1", "4,2", "8,8"]  # None: the oracle's clusters


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("splits", SWAP_SPLITS, ids=lambda s: f"splits={s or 'oracle'}")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", SWAP_CASES, ids=_ids(SWAP_CASES))
def test_wgmma_swap_backend(case, dtype, splits, rng, monkeypatch):
    """The Hopper swap-AB decode kernels (sm_90 only), with each cluster split: GEMM1's K
    and GEMM2's experts over 1 to 8 CTAs summed through distributed shared memory."""
    _needs_hopper()
    if splits:
        monkeypatch.setenv("SWAPMOE_SWAP_SPLITS", splits)
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma_swap")
    _, _, inp = run_case(case, "torch", dtype, rng, device=DEV)
    plan = swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"],
                                       expert_map=inp["expert_map"])
    assert plan["backend"] == "cuda_wgmma_swap"
    assert plan["tokens_per_pass"] == min(t for t in (8, 16, 32, 64) if t >= case.M)
    if splits:
        assert plan["splits"] == tuple(int(v) for v in splits.split(","))


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("slices", ["4,4", "1,4", "4,1"])
@pytest.mark.parametrize("case", [SWAP_CASES[i] for i in (1, 3, 4, 6, 8)], ids=_ids([SWAP_CASES[i] for i in (1, 3, 4, 6, 8)]))
def test_wgmma_swap_k_slices(case, slices, rng, monkeypatch):
    """Stages of 4 K slices (4 x 128 bytes of each weight row at once) in either GEMM,
    including K and N tails inside a stage."""
    _needs_hopper()
    monkeypatch.setenv("SWAPMOE_SWAP_SLICES", slices)
    monkeypatch.setenv("SWAPMOE_SWAP_SPLITS", "2,2")
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma_swap")
    _, _, inp = run_case(case, "torch", "bfloat16", rng, device=DEV)
    plan = swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"],
                                       expert_map=inp["expert_map"])
    g1, g2 = slices.split(",")
    assert plan["kernels"][0].endswith(f"_s{g1}") and plan["kernels"][1].endswith(f"_s{g2}")


def _run_swap_case(case, splits, rng, monkeypatch):
    """Runs `case` in bf16 on cuda_wgmma_swap (checked against the float64 reference by
    run_case), with GEMM1's and GEMM2's cluster sizes `splits` ("g1,g2", None: the oracle's),
    and returns the plan such a call runs."""
    if splits:
        monkeypatch.setenv("SWAPMOE_SWAP_SPLITS", splits)
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma_swap")
    _, _, inp = run_case(case, "torch", "bfloat16", rng, device=DEV)
    return swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"],
                                       expert_map=inp["expert_map"])


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("gemm2_pdl", ["0", "1"], ids=lambda v: f"gemm2_pdl={v}")
@pytest.mark.parametrize("one_per_sm", ["0", "1"])
@pytest.mark.parametrize("splits", [None, "2,4"], ids=lambda s: f"splits={s or 'oracle'}")
@pytest.mark.parametrize("case", [SWAP_CASES[i] for i in (0, 3, 6)], ids=_ids([SWAP_CASES[i] for i in (0, 3, 6)]))
def test_wgmma_swap_gemm2_launch(case, splits, one_per_sm, gemm2_pdl, rng, monkeypatch):
    """GEMM2 launched with more than half an SM's shared memory (one CTA per SM) or its own
    (two), by programmatic dependent launch under GEMM1 or after it: the same kernel and ring,
    so the same result; the plan says how it launched."""
    _needs_hopper()
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM2_ONE_PER_SM", one_per_sm)
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM2_PDL", gemm2_pdl)
    plan = _run_swap_case(case, splits, rng, monkeypatch)
    assert plan["swap_gemm2_one_per_sm"] is (one_per_sm == "1")
    assert plan["swap_gemm2_pdl"] is (gemm2_pdl == "1")


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("ring", ["0", "2", "3"], ids=lambda r: f"ring{r}")
@pytest.mark.parametrize("splits", [None, "2,4"], ids=lambda s: f"splits={s or 'oracle'}")
@pytest.mark.parametrize("case", [SWAP_CASES[i] for i in (0, 3, 6)], ids=_ids([SWAP_CASES[i] for i in (0, 3, 6)]))
def test_wgmma_swap_gemm1_ring(case, splits, ring, rng, monkeypatch):
    """GEMM1 with a ring of 2 or 3 stages (more CTAs per SM; $SWAPMOE_SWAP_GEMM1_RING) or its
    own (0): the stage index and the barriers' phases wrap at the ring, whatever the number
    of k-stages; the plan says the ring."""
    _needs_hopper()
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM1_RING", ring)
    plan = _run_swap_case(case, splits, rng, monkeypatch)
    assert plan["swap_gemm1_ring"] == int(ring)


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("launch", ["r2p0", "r2p1", "r3p0", "r3p1"])
@pytest.mark.parametrize("case", [SWAP_CASES[i] for i in (1, 6, 7)], ids=_ids([SWAP_CASES[i] for i in (1, 6, 7)]))
def test_wgmma_swap_launch_variants(case, launch, rng, monkeypatch):
    """The launches `swapmoe tune` times and tables pick (`cuda_wgmma_swap:r<ring>p<pdl>`): a
    small GEMM1 ring (more CTAs per SM) with GEMM2 by PDL under GEMM1 or after it."""
    _needs_hopper()
    ring, pdl = launch[1], launch[3]
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM1_RING", ring)
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM2_PDL", pdl)
    plan = _run_swap_case(case, None, rng, monkeypatch)
    assert (plan["swap_gemm1_ring"], plan["swap_gemm2_pdl"]) == (int(ring), pdl == "1")


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("ids", ["uniform", "concentrated"])
@pytest.mark.parametrize("M", [m for m in DECODE_M if m <= 64])
def test_wgmma_swap_every_decode_size(M, ids, rng):
    _needs_hopper()
    run_case(Case(M, 128, 8, 128, 256, ids=ids, out="poison"), "torch", "bfloat16", rng, device=DEV,
             backend="cuda_wgmma_swap")


@pytest.mark.skipif(not HAS_BACKEND_ARG, reason="this build has no backend= argument")
@pytest.mark.parametrize("splits", ["1,1", "8,8"])
def test_wgmma_swap_is_deterministic(splits, rng, monkeypatch):
    """A moving result would be a pipeline or cluster race: 20 reruns must be bit-identical."""
    _needs_hopper()
    monkeypatch.setenv("SWAPMOE_SWAP_SPLITS", splits)
    _assert_deterministic("cuda_wgmma_swap", Case(13, 64, 8, 264, 1160, ids="concentrated", out="poison"), rng)


def test_wgmma_swap_rejects_more_than_64_tokens(rng):
    _needs_hopper()
    case = Case(65, 8, 2, 64, 64)
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    with pytest.raises(swapmoe.ShapeError, match="cuda_wgmma_swap.*at most M = 64 tokens.*got 65"):
        call(inp, case, backend="cuda_wgmma_swap")


@pytest.mark.parametrize("M", [1, 24])
def test_wgmma_swap_cuda_graph_capture_and_replay(M, rng, monkeypatch):
    _graph_capture_and_replay("cuda_wgmma_swap", M, rng, monkeypatch)


@pytest.mark.parametrize("tile", [16, 64, 128])
@pytest.mark.parametrize("case", [MMA_CASES[1], MMA_CASES[2], MMA_CASES[4]],
                         ids=_ids([MMA_CASES[1], MMA_CASES[2], MMA_CASES[4]]))
def test_tensor_core_every_token_tile(case, tile, rng, monkeypatch):
    """Every token tile a tuned table or $SWAPMOE_MMA_TOKEN_TILE can pick, on shapes whose
    heuristic tile differs (what `swapmoe tune` times)."""
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", str(tile))
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_mma")
    out, _, inp = run_case(case, "torch", "bfloat16", rng, device=DEV)
    plan = swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"],
                                       expert_map=inp["expert_map"])
    assert (plan["backend"], plan["tokens_per_pass"], plan["source"]) == ("cuda_mma", tile, "override")


@pytest.mark.parametrize("ids", ["uniform", "concentrated"])
@pytest.mark.parametrize("M", DECODE_M)
def test_decode_sizes_bf16(M, ids, rng):
    """Every decode batch size on a Mixtral/Qwen-like shape (E=128, topk=8, K=256, N=128)."""
    run_case(Case(M, 128, 8, 128, 256, ids=ids, out="poison"), "torch", "bfloat16", rng, device=DEV)


@pytest.mark.parametrize(
    "case,dtype",
    [
        (Case(512, 128, 8, 128, 256, out="poison"), "bfloat16"),
        (Case(512, 128, 8, 128, 256, "gelu", ids="concentrated", ep=True), "float16"),
        (Case(512, 64, 6, 96, 200, ids="invalid", id_dtype="int64", layout="strided", out="poison"), "bfloat16"),
        (Case(512, 8, 2, 64, 64, out="inplace"), "float32"),
        # 12000 slots: the alignment as a cluster of three CTAs (one per 4096 slots)
        (Case(1500, 128, 8, 128, 256, ids="invalid", ep=True, id_dtype="int64", layout="strided", out="poison"),
         "bfloat16"),
    ],
    ids=lambda v: v.id if isinstance(v, Case) else v,
)
def test_prefill(case, dtype, rng):
    run_case(case, "torch", dtype, rng, device=DEV)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(
    "case",
    [
        Case(16, 8, 1, 40, 48, on_input=True, out="poison"),
        Case(600, 64, 1, 96, 200, "gelu", on_input=True, ep=True, ids="invalid", out="poison"),
    ],
    ids=lambda c: c.id,
)
def test_router_weight_on_input_cuda(case, dtype, rng):
    run_case(case, "torch", dtype, rng, device=DEV)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_m0_cuda(dtype, rng):
    case = Case(0, 8, 2, 40, 48)
    inp = to_inputs(make_problem(rng, case), case, "torch", dtype, DEV)
    out = call(inp, case)
    assert tuple(out.shape) == (0, 48) and out.is_cuda and out.dtype == getattr(torch, dtype)
    given = poison(inp["x"])
    assert call(inp, case, out=given) is given


@pytest.mark.parametrize("M", [3, 200])
def test_all_ids_invalid_give_zeros_cuda(M, rng):
    case = Case(M, 8, 4, 40, 48, ep=True)
    prob = make_problem(rng, case)
    G = case.global_experts
    bad = [-1, G, G + 3, -7] + [int(i) for i in np.flatnonzero(prob["expert_map"] < 0)]
    prob["ids"] = rng.choice(np.array(bad), size=prob["ids"].shape)
    inp = to_inputs(prob, case, "torch", "bfloat16", DEV)
    out = call(inp, case, out=poison(inp["x"]))
    torch.cuda.synchronize()
    assert (to_f64(out) == 0).all()


@pytest.mark.parametrize("M", [6, 150])
@pytest.mark.parametrize("where", ["x", "w1", "w2"])
def test_nan_propagates_cuda(M, where, rng):
    case = Case(M, 8, 2, 40, 48)
    prob = make_problem(rng, case)
    t = int(rng.integers(M))
    e = int(prob["ids"][t, 1])
    if where == "x":
        prob["x"][t, 5] = np.nan
    elif where == "w1":
        prob["w1"][e, 3, 7] = np.nan
    else:
        prob["w2"][e, 11, 2] = np.nan
    inp = to_inputs(prob, case, "torch", "float32", DEV)
    ref = reference(inp, case)
    nan_ref = np.isnan(ref)
    assert nan_ref[t].any() and not nan_ref.all()
    o = to_f64(call(inp, case))
    assert np.array_equal(np.isnan(o), nan_ref)
    assert rel_error(o[~nan_ref], ref[~nan_ref]) <= TOLERANCE["float32"]


@pytest.mark.parametrize("M", [6, 150])
def test_nan_in_unused_experts_does_not_leak_cuda(M, rng):
    case = Case(M, 16, 2, 40, 48, ids="concentrated")
    prob = make_problem(rng, case)
    unused = sorted(set(range(case.E)) - set(prob["ids"].ravel().tolist()))
    assert unused
    prob["w1"][unused] = np.nan
    prob["w2"][unused] = np.nan
    inp = to_inputs(prob, case, "torch", "bfloat16", DEV)
    ref = reference(inp, case)
    out = call(inp, case, out=poison(inp["x"]))
    check_close(out, ref, "bfloat16")


@pytest.mark.parametrize("M", [1, 37, 300])
def test_poisoned_out_fully_overwritten(M, rng):
    case = Case(M, 16, 6, 40, 200, ids="invalid", ep=True, out="poison")
    out, _, _ = run_case(case, "torch", "bfloat16", rng, device=DEV)
    assert not torch.isnan(out).any()


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("M", [8, 64, 400])
def test_deterministic_cuda(M, dtype, rng):
    case = Case(M, 64, 8, 64, 256, ids="concentrated")
    inp = to_inputs(make_problem(rng, case), case, "torch", dtype, DEV)
    first = snapshot(call(inp, case))
    for _ in range(3):
        assert same_bits(_rerun(inp, case), first)


def test_cuda_matches_cpu_path(rng):
    """The CUDA and CPU paths agree to the float32 tolerance."""
    case = Case(40, 16, 4, 64, 96, "gelu", ids="invalid", ep=True)
    prob = make_problem(rng, case)
    gpu = call(to_inputs(prob, case, "torch", "float32", DEV), case).cpu()
    cpu = call(to_inputs(prob, case, "torch", "float32"), case)
    assert rel_error(to_f64(gpu), to_f64(cpu)) <= TOLERANCE["float32"]


# --------------------------------------------------------------------------- graphs


def _fresh_into(inp: dict, prob: dict, case: Case) -> None:
    """Copy a fresh problem's x, tw, ids into the captured input buffers."""
    for name in ("x", "tw", "ids"):
        inp[name].copy_(torch.from_numpy(np.ascontiguousarray(prob[name])).to(inp[name].dtype))


@pytest.mark.parametrize("with_out", [False, True], ids=["functional", "out"])
@pytest.mark.parametrize("M", [4, 100])
def test_cuda_graph_capture_and_replay(M, with_out, rng):
    case = Case(M, 32, 6, 64, 128, ids="concentrated")
    prob = make_problem(rng, case)
    inp = to_inputs(prob, case, "torch", "bfloat16", DEV)
    assert swapmoe.warmup(0) > 0
    out_buf = torch.empty_like(inp["x"])
    eager = call(inp, case)  # one eager call before capture
    torch.cuda.synchronize()
    check_close(eager, reference(inp, case), "bfloat16")

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(inp, case, out=out_buf) if with_out else call(inp, case)
    for _ in range(2):
        fresh = make_problem(rng, case)
        fresh["w1"], fresh["w2"] = prob["w1"], prob["w2"]
        _fresh_into(inp, fresh, case)
        if with_out:
            out_buf.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check_close(captured, reference(inp, case), "bfloat16", what="graph replay")


def test_check_ids_refused_during_capture(rng):
    case = Case(4, 8, 2, 40, 48)
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    swapmoe.warmup(0)
    call(inp, case)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(swapmoe.ArgumentError, match="check_ids"):
        with torch.cuda.graph(graph):
            call(inp, case, check_ids=True)
    torch.cuda.synchronize()
    check_close(call(inp, case), reference(inp, case), "bfloat16")  # the device is fine


# --------------------------------------------------------------------------- torch.compile


@pytest.mark.parametrize("with_out", [False, True], ids=["functional", "out"])
def test_compile_fullgraph_cuda(with_out, rng):
    torch._dynamo.reset()
    case = Case(24, 16, 4, 64, 128, "gelu", ep=True)
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)

    def f(x, w1, w2, tw, ids, emap, out):
        y = swapmoe.fused_experts(x, w1, w2, tw, ids, activation="gelu", expert_map=emap, out=out)
        return y * 2

    args = (inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"], inp["expert_map"])
    eager_out = poison(inp["x"]) if with_out else None
    compiled_out = poison(inp["x"]) if with_out else None
    eager = f(*args, eager_out)
    got = torch.compile(f, fullgraph=True)(*args, compiled_out)
    torch.cuda.synchronize()
    assert torch.equal(got, eager)
    if with_out:
        assert torch.equal(compiled_out, eager_out)
    check_close(eager / 2, reference(inp, case), "bfloat16")


# --------------------------------------------------------------------------- streams


@pytest.mark.parametrize("M", [4, 300])
def test_launches_on_current_stream(M, rng):
    """Work queued on a side stream before the call (a long sleep, then the input and
    output writes) must be ordered before the op: it runs on the current stream."""
    case = Case(M, 16, 4, 64, 128)
    prob = make_problem(rng, case)
    inp = to_inputs(prob, case, "torch", "bfloat16", DEV)
    ref = reference(inp, case)
    staged_x = inp["x"].clone()
    inp["x"].zero_()
    out = torch.empty_like(staged_x)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # warm-up: module loads and the allocator's first cudaMalloc
        torch.cuda._sleep(1000)
        call(inp, case, out=out)  # for this stream may synchronize the device, hiding the race
    side.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of device time on the side stream
        inp["x"].copy_(staged_x)
        out.fill_(math.nan)
        got = call(inp, case, out=out)
    assert not side.query(), "the side stream finished before the op was queued: lengthen the sleep"
    side.synchronize()
    assert got is out
    check_close(out, ref, "bfloat16", what="side stream")


@pytest.mark.parametrize(
    "backend", ["cuda_generic", "cuda_decode", "cuda_mma", "cuda_bulk_decode", "cuda_wgmma_swap", "cuda_wgmma"]
)
def test_back_to_back_calls_feed_each_other(backend, rng, monkeypatch):
    """Three calls queued with no sync between them, each on the previous one's output (NaN
    until written), the first kernel of each launched with PDL: a first kernel that reads its
    input, or rewrites the workspace block the previous call's last kernel still reads, before
    its griddepcontrol.wait gets NaN or corrupts the previous output. Each output against the
    reference on the input that call had."""
    if backend in ("cuda_bulk_decode", "cuda_wgmma_swap", "cuda_wgmma"):
        _needs_hopper()
    monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", "on")
    case = Case(12, 16, 4, 128, 256, ids="concentrated")
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    xs = chain_three(inp, lambda step, out: call(step, case, out=out, backend=backend))
    for i in range(3):
        ref = reference(dict(inp, x=xs[i]), case)
        assert np.linalg.norm(ref) > 0, f"call {i + 1}: degenerate chain (zero reference)"
        check_close(xs[i + 1], ref, "bfloat16", what=f"call {i + 1} of 3, {backend}")


@pytest.mark.parametrize(
    "backend", ["cuda_generic", "cuda_decode", "cuda_mma", "cuda_bulk_decode", "cuda_wgmma_swap", "cuda_wgmma"]
)
def test_first_kernel_waits_for_a_long_predecessor(backend, rng, monkeypatch):
    """The call queued right after a long one that lets its dependents start early and writes
    this call's input at its end (conftest.chain_after_long_call), first kernel with PDL: a
    kernel that reads x, or rewrites a workspace block the long call still reads, before its
    griddepcontrol.wait fails here (the back-to-back test above has calls too short to show
    it). Both outputs against their references."""
    _needs_hopper()  # the long call runs on cuda_wgmma_swap
    monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", "on")
    case = Case(12, 16, 4, 128, 256, ids="concentrated")
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    long_inp, long_case, long_out, out = chain_after_long_call(
        inp, lambda step, o: call(step, case, out=o, backend=backend), rng)
    check_close(long_out, reference(long_inp, long_case), "bfloat16", what="the long call")
    check_close(out, reference(dict(inp, x=long_out), case), "bfloat16", what=f"{backend} after the long call")


def test_queued_ahead_holds_the_stream_until_the_block_ends():
    """conftest.queued_ahead_of_the_gpu's host flag holds the stream (work queued in the block
    has not run 50 ms later) and the block's end releases it; and the driver takes the flag
    wait here, so the back-to-back tests do not fall back to a spin kernel."""
    import time

    from conftest import _gate_stream

    probe = torch.cuda.Stream()
    flag = _gate_stream(probe.cuda_stream)
    assert flag is not None, "cuStreamWaitValue32 refused: the chains fall back to a spin kernel"
    flag[0] = 1
    probe.synchronize()
    done = torch.cuda.Event()
    with queued_ahead_of_the_gpu():
        done.record()
        time.sleep(0.05)
        assert not done.query(), "the stream ran on while the block held it"
    assert done.query()


def test_a_call_that_waits_lets_other_python_threads_run(rng):
    """The core lets the GIL go while it launches and waits: a check_ids call behind ~0.2 s of
    queued work (it waits for the stream inside the core) leaves another Python thread running
    through the middle of its wait."""
    import time

    case = Case(5, 16, 4, 64, 128)
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    call(inp, case, check_ids=True)  # module loads
    torch.cuda.synchronize()
    stop = threading.Event()
    progress: list = []

    def tick():
        n = 0
        while not stop.is_set():
            n += 1
            if n % 1000 == 0:
                progress.append(time.perf_counter())

    t = threading.Thread(target=tick)
    t.start()
    try:
        torch.cuda._sleep(400_000_000)  # ~0.2 s of device time ahead of the call
        t0 = time.perf_counter()
        out = call(inp, case, check_ids=True)
        t1 = time.perf_counter()
    finally:
        stop.set()
        t.join()
    assert t1 - t0 > 0.1, f"the call did not wait for the queued work ({(t1 - t0) * 1e3:.1f} ms)"
    middle = [p for p in progress if t0 + 0.03 < p < t1 - 0.03]
    assert middle, f"no other thread ran during the {(t1 - t0) * 1e3:.0f} ms the call waited (the GIL was held)"
    check_close(out, reference(inp, case), "bfloat16", what="check_ids call")


def _create_context(lib):
    """A new (non-primary) context on device 0, current on this thread, as PyCUDA makes one;
    None where the driver has no cuCtxCreate_v2."""
    if not hasattr(lib, "cuCtxCreate_v2"):
        return None
    dev = ctypes.c_int()
    assert lib.cuDeviceGet(ctypes.byref(dev), 0) == 0
    ctx = ctypes.c_void_p()
    rc = lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
    return ctx if rc == 0 and ctx.value else None


def test_calls_leave_the_threads_context_as_it_was(rng):
    """The op makes the tensors' device's primary context current for its launches, then the
    thread's own again: on a thread whose current context is another one (here one the test
    creates, as PyCUDA would), fused_experts, select_experts and a check_ids call leave it
    current, and their results are right. (With two GPUs the same keeps torch's current device
    where it was: tests/test_multi_gpu.py.)"""
    lib = libcuda()
    case = Case(5, 16, 4, 64, 128)
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    out = poison(inp["x"])
    workspace = junk_workspace(inp)
    logits = torch.randn(5, 16, device=DEV)
    weights = torch.full((5, 4), math.nan, device=DEV)
    ids = torch.full((5, 4), -7, dtype=torch.int32, device=DEV)
    stream = torch.cuda.current_stream().cuda_stream
    call(inp, case)  # module loads, in torch's thread
    torch.cuda.synchronize()
    seen: dict = {}

    def worker():
        ctx = _create_context(lib)
        if ctx is None:
            seen["skip"] = True
            return
        try:
            seen["before"] = current_cuda_context()
            swapmoe._core.fused_experts(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"], out,
                                        workspace=workspace, stream=stream)
            seen["after fused_experts"] = current_cuda_context()
            swapmoe._core.fused_experts(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"], out,
                                        workspace=workspace, stream=stream, check_ids=True)
            seen["after check_ids"] = current_cuda_context()
            swapmoe._core.select_experts(logits, weights, ids, 4, stream=stream)
            seen["after select_experts"] = current_cuda_context()
            seen["created"] = ctx.value
        except BaseException as e:  # reported in the test's thread
            seen["error"] = e
        finally:
            lib.cuCtxDestroy_v2(ctx)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    if seen.get("skip"):
        pytest.skip("the driver has no cuCtxCreate_v2")
    if "error" in seen:
        raise seen["error"]
    torch.cuda.synchronize()
    for when in ("before", "after fused_experts", "after check_ids", "after select_experts"):
        assert seen[when] == seen["created"], f"{when}: the thread's current context is not the one it made current"
    check_close(out, reference(inp, case), "bfloat16", what="fused_experts from a thread with its own context")
    w_ref, ids_ref = torch.topk(torch.softmax(logits, dim=-1), 4, dim=-1)
    assert torch.equal(ids.long(), ids_ref), (ids, ids_ref)
    torch.testing.assert_close(weights, w_ref / w_ref.sum(-1, keepdim=True))


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("M", [3, 200])
@pytest.mark.parametrize("bad", [8, -3, 2**32 + 1])
def test_check_ids_cuda(M, bad, rng):
    case = Case(M, 8, 2, 40, 48, id_dtype="int64")
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    inp["ids"][M - 1, 1] = bad
    with pytest.raises(swapmoe.ShapeError) as info:
        call(inp, case, check_ids=True)
    msg = str(info.value)
    assert "topk_ids" in msg and f"got {bad} at [{M - 1}, 1]" in msg, msg


def test_check_ids_cuda_bad_expert_map(rng):
    case = Case(5, 8, 2, 40, 48)
    inp = to_inputs(make_problem(rng, case), case, "torch", "float32", DEV)
    emap = torch.arange(8, dtype=torch.int32, device=DEV)
    emap[3] = 9
    with pytest.raises(swapmoe.ShapeError, match=r"expert_map.*got 9 at index 3"):
        call(inp, case, expert_map=emap, check_ids=True)


def test_check_ids_cuda_passes_valid(rng):
    case = Case(50, 8, 4, 40, 48, ep=True)
    prob = make_problem(rng, case)
    prob["ids"][::4, 2] = -1
    inp = to_inputs(prob, case, "torch", "float32", DEV)
    got = call(inp, case, check_ids=True)
    assert torch.equal(got, call(inp, case))
    check_close(got, reference(inp, case), "float32")


@pytest.mark.parametrize("name", ["w1", "w2", "topk_weights", "topk_ids", "out", "expert_map"])
def test_mixed_devices(name, rng):
    case = Case(5, 8, 2, 40, 48, ep=True)
    inp = to_inputs(make_problem(rng, case), case, "torch", "float32", DEV)
    args = dict(
        hidden_states=inp["x"], w1=inp["w1"], w2=inp["w2"], topk_weights=inp["tw"], topk_ids=inp["ids"],
        expert_map=inp["expert_map"], out=torch.empty_like(inp["x"]),
    )
    args[name] = args[name].cpu()
    with pytest.raises(swapmoe.DeviceError) as info:
        swapmoe.fused_experts(**args)
    msg = str(info.value)
    assert name in msg and "expected device cuda:0" in msg and "got cpu" in msg, msg
    assert isinstance(info.value, ValueError) and isinstance(info.value, swapmoe.Error)


def test_cpu_hidden_with_cuda_weights(rng):
    case = Case(5, 8, 2, 40, 48)
    inp = to_inputs(make_problem(rng, case), case, "torch", "float32")
    with pytest.raises(swapmoe.DeviceError, match=r"w1: expected device cpu.*got cuda:0"):
        swapmoe.fused_experts(inp["x"], inp["w1"].to(DEV), inp["w2"], inp["tw"], inp["ids"])


def test_module_global_lookup():
    """The profiling hook behind benches/stamps.py: typed errors naming the argument for an
    unknown module or symbol; the stamp buffer exists exactly in profiling builds."""
    from swapmoe import _core

    with pytest.raises(swapmoe.ArgumentError, match="module: expected one of"):
        _core._module_global(0, "no_such_module", "swapmoe_stamps")
    with pytest.raises(swapmoe.ArgumentError, match="symbol: expected a __device__ variable"):
        _core._module_global(0, "sm90_swap_decode", "no_such_symbol")
    if swapmoe.build_info()["cuda_stamps"]:
        ptr, size = _core._module_global(0, "sm90_swap_decode", "swapmoe_stamps")
        assert ptr != 0 and size == (1 << 16) * 16 * 8
    else:
        with pytest.raises(swapmoe.ArgumentError, match="SWAPMOE_CUDA_STAMPS=1"):
            _core._module_global(0, "sm90_swap_decode", "swapmoe_stamps")
