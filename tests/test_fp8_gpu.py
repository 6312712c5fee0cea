"""The CUDA FP8 (e4m3) W8A8 path against the float64 FP8 reference (computed on the CPU),
with the tolerances and flip accounting of tests/conftest.py (FP8_TOLERANCE). Every test is
marked ``gpu`` and skipped when torch sees no CUDA device; FP8 needs sm_89+ (on older
devices the op must raise ArgumentError, tested below)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import swapmoe
from conftest import (
    FP8_SCHEMES,
    FP8_TOLERANCE,
    Case,
    call_with_workspace,
    chain_after_long_call,
    chain_three,
    check_close,
    check_fp8_close,
    fp8_call,
    fp8_kwargs,
    fp8_reference,
    has_cuda,
    junk_workspace,
    make_fp8_problem,
    poison,
    queued_reruns,
    reference,
    run_fp8_case,
    same_bits,
    snapshot,
    to_f64,
    to_fp8_inputs,
    torch,
    wgmma_fp8_case,
)
from swapmoe.bench import FP8_SCHEMES as QUANT_SCHEMES
from swapmoe.reference import rel_error_with_flips
from test_routing import BY_NAME as ROUTERS, draw_logits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

DEV = "cuda"
DECODE_M = [1, 2, 3, 4, 5, 8, 16, 17, 32, 64]


def _fp8_capable() -> bool:
    return has_cuda() and torch.cuda.get_device_capability() >= (8, 9)


needs_sm89 = pytest.mark.skipif(not _fp8_capable(), reason="FP8 needs compute capability >= 8.9")
needs_sm90 = pytest.mark.skipif(not (has_cuda() and torch.cuda.get_device_capability() == (9, 0)),
                                reason="the FP8 swap-AB kernels need sm_90 (Hopper)")


@pytest.fixture(autouse=True)
def _cuda_sync():
    yield
    if has_cuda():
        torch.cuda.synchronize()


# (N, K): 16-byte e4m3 vectors (multiples of 16) and scalar loads with partial 128-blocks.
VEC_SHAPE = (128, 256)
ODD_SHAPE = (72, 200)
# Two 128-column groups of the intermediate and two x four 128x128 weight blocks per expert:
# with N <= 128 a block scheme has one group, so a wrong group or block index goes unseen.
BLOCKS_SHAPE = (256, 512)


def _case(M, shape=VEC_SHAPE, **kw):
    N, K = shape
    base = dict(M=M, E=128, topk=8, N=N, K=K, out="poison")
    base.update(kw)
    return Case(**base)


@needs_sm89
@pytest.mark.parametrize("ids", ["uniform", "concentrated"])
@pytest.mark.parametrize("M", DECODE_M)
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_decode_sizes(scheme, M, ids, rng):
    """Every decode batch size (8 to 512 slots: the oracle's decode and generic sides)."""
    run_fp8_case(_case(M, ids=ids), scheme, "torch", "bfloat16", rng, device=DEV)


@needs_sm89
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("shape", [VEC_SHAPE, ODD_SHAPE, BLOCKS_SHAPE], ids=["vec16", "scalar", "blocks2x4"])
@pytest.mark.parametrize("backend", ["cuda_decode", "cuda_generic"])
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_backends_shapes_dtypes(scheme, backend, shape, dtype, rng):
    """Both CUDA FP8 backends, 16-byte and scalar loads, several scale blocks, every output dtype."""
    case = _case(9, shape, E=16, topk=4, ids="concentrated")
    run_fp8_case(case, scheme, "torch", dtype, rng, device=DEV, backend=backend)


@needs_sm89
@pytest.mark.parametrize("shape", [VEC_SHAPE, BLOCKS_SHAPE], ids=["vec16", "blocks2x4"])
@pytest.mark.parametrize("M,topk", [(1, 1), (1, 2), (2, 2), (3, 2)])
@pytest.mark.parametrize("backend", ["cuda_decode", "cuda_generic"])
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_backends_with_fewer_slots_than_a_row_group(scheme, backend, M, topk, shape, rng):
    """1 to 6 (token, expert) slots, forced: on Hopper the oracle gives FP8 calls to the
    tensor-core kernels, so only a forced backend runs the SIMT kernels' few-slot paths (the
    decode GEMM2 splits each output row over several parts when S < its 8 rows)."""
    run_fp8_case(_case(M, shape, E=8, topk=topk), scheme, "torch", "bfloat16", rng, device=DEV, backend=backend)


PREFILL = [
    _case(300, ids="concentrated", ep=True),
    _case(300, ODD_SHAPE, E=8, topk=2, ids="invalid", id_dtype="int64"),
    _case(600, E=8, topk=1, on_input=True, ep=True),
    _case(200, E=64, topk=6, ids="dup", out="inplace"),
    _case(300, E=64, topk=6, ids="none"),
    _case(800, E=64, topk=6, ids="invalid", ep=True),  # 4800 slots: the alignment as a cluster of two CTAs
]


@needs_sm89
@pytest.mark.parametrize("case", PREFILL, ids=lambda c: c.id)
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_prefill(scheme, case, rng):
    if case.ids == "none":
        prob = make_fp8_problem(rng, case, scheme)
        inp = to_fp8_inputs(prob, case, "torch", "bfloat16", DEV)
        out = fp8_call(inp, case, out=poison(inp["x"]))
        torch.cuda.synchronize()
        assert (to_f64(out) == 0).all()
        return
    run_fp8_case(case, scheme, "torch", "bfloat16", rng, device=DEV)


ROUTING = [
    dict(ep=True),
    dict(ep=True, ids="invalid"),
    dict(E=16, topk=1, on_input=True),
    dict(E=8, topk=2, act="gelu", tw_dtype="float16"),
    dict(E=256, topk=8, ids="concentrated"),  # most experts get no token
]


@needs_sm89
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("routing", ROUTING, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
@pytest.mark.parametrize("M", [3, 64])
def test_per_tensor_routing(M, routing, static, rng):
    run_fp8_case(_case(M, **routing), "tensor", "torch", "bfloat16", rng, device=DEV, static=static)


@needs_sm89
@pytest.mark.parametrize("routing", ROUTING, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
@pytest.mark.parametrize("scheme", ["channel", "block"])
def test_channel_block_routing(scheme, routing, rng):
    run_fp8_case(_case(17, **routing), scheme, "torch", "bfloat16", rng, device=DEV)


@needs_sm89
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
@pytest.mark.parametrize("M", [5, 300])
def test_gpu_matches_cpu_path(scheme, M, rng):
    """The CUDA and CPU FP8 paths agree (same quantization rules, f32 order aside)."""
    case = _case(M, ODD_SHAPE, E=16, topk=4, ids="invalid", ep=True)
    prob = make_fp8_problem(rng, case, scheme)
    gpu = fp8_call(to_fp8_inputs(prob, case, "torch", "float32", DEV), case).cpu()
    cpu_inp = to_fp8_inputs(prob, case, "torch", "float32")
    cpu = fp8_call(cpu_inp, case)
    _, flips = fp8_reference(cpu_inp, case)
    assert rel_error_with_flips(to_f64(gpu), to_f64(cpu), flips) <= FP8_TOLERANCE["float32"]


@needs_sm89
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
@pytest.mark.parametrize("M", [4, 100])
def test_deterministic(scheme, M, rng):
    case = _case(M, ids="concentrated")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme), case, "torch", "bfloat16", DEV)
    first = snapshot(fp8_call(inp, case))
    for _ in range(3):
        assert same_bits(snapshot(fp8_call(inp, case)), first)


def _backend_or_skip(backend, scheme):
    """None (the oracle's choice), or cuda_wgmma's FP8 GEMMs where they run (sm_90)."""
    if backend == "cuda_wgmma" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuda_wgmma's FP8 GEMMs: sm_90")
    return {} if backend is None else {"backend": backend}


@needs_sm89
@pytest.mark.parametrize("backend", [None, "cuda_wgmma"], ids=["oracle", "wgmma"])
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("M", [6, 150])
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_nonfinite_input(scheme, M, bad, backend, rng):
    """NaN/inf in one token's input: that token's output row is NaN, every other row is
    finite and matches the reference (the dynamic scales ignore it)."""
    kw = _backend_or_skip(backend, scheme)
    case = _case(M, E=8, topk=2)
    prob = make_fp8_problem(rng, case, scheme)
    t = M // 2
    prob["x"][t, 7] = bad
    inp = to_fp8_inputs(prob, case, "torch", "bfloat16", DEV)
    ref, flips = fp8_reference(inp, case)
    o = to_f64(fp8_call(inp, case, out=poison(inp["x"]), **kw))
    assert np.isnan(o[t]).all()
    keep = np.arange(M) != t
    assert np.isfinite(o[keep]).all()
    kept = [(m - (m > t), d) for m, d in flips if m != t]
    assert rel_error_with_flips(o[keep], ref[keep], kept) <= FP8_TOLERANCE["bfloat16"]


@needs_sm89
@pytest.mark.parametrize("backend", [None, "cuda_wgmma"], ids=["oracle", "wgmma"])
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
@pytest.mark.parametrize("M", [4, 150])
def test_zero_tokens_and_unused_nan_experts(scheme, M, backend, rng):
    """All-zero tokens give exact zero rows (no 0/0 scale); NaN weights of experts no token
    reaches do not leak."""
    kw = _backend_or_skip(backend, scheme)
    case = _case(M, E=16, topk=2, ids="concentrated")
    prob = make_fp8_problem(rng, case, scheme)
    prob["x"][1] = 0.0
    unused = sorted(set(range(case.E)) - set(prob["ids"].ravel().tolist()))
    assert unused
    prob["w1_codes"][unused] = 0x7F
    prob["w2_codes"][unused] = 0x7F
    inp = to_fp8_inputs(prob, case, "torch", "bfloat16", DEV)
    ref, flips = fp8_reference(inp, case)
    out = fp8_call(inp, case, out=poison(inp["x"]), **kw)
    torch.cuda.synchronize()
    assert (to_f64(out)[1] == 0).all()
    check_fp8_close(out, ref, flips, "bfloat16")


@needs_sm89
@pytest.mark.parametrize("scheme", FP8_SCHEMES + ["tensor-static"])
@pytest.mark.parametrize("M", [4, 100])
def test_cuda_graph_capture_and_replay(scheme, M, rng):
    case = _case(M, E=32, topk=6, ids="concentrated")
    prob = make_fp8_problem(rng, case, scheme.split("-")[0], static=scheme.endswith("static"))
    inp = to_fp8_inputs(prob, case, "torch", "bfloat16", DEV)
    assert swapmoe.warmup(0) > 0
    out_buf = torch.empty_like(inp["x"])
    fp8_call(inp, case, out=out_buf)  # one eager call before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8_call(inp, case, out=out_buf)
    _replay_on_fresh_inputs(graph, out_buf, inp, case, scheme.split("-")[0], rng)


def _replay_on_fresh_inputs(graph, out_buf, inp, case, scheme, rng, replays=2):
    """Copies fresh inputs into the captured buffers, replays, checks against the reference."""
    for _ in range(replays):
        fresh = make_fp8_problem(rng, case, scheme)
        for name in ("x", "tw", "ids"):
            inp[name].copy_(torch.from_numpy(np.ascontiguousarray(fresh[name])).to(inp[name].dtype))
        out_buf.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        ref, flips = fp8_reference(inp, case)
        check_fp8_close(out_buf, ref, flips, "bfloat16", what="graph replay")


@needs_sm89
def test_compile_fullgraph_cuda(rng):
    torch._dynamo.reset()
    case = _case(8, E=16, topk=2)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "block"), case, "torch", "bfloat16", DEV)

    def f(x, w1, w2, tw, ids, s1, s2):
        return swapmoe.fused_experts(x, w1, w2, tw, ids, use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2,
                                     block_shape=[128, 128]) * 2

    args = (inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"], inp["w1_scale"], inp["w2_scale"])
    assert torch.equal(torch.compile(f, fullgraph=True)(*args), f(*args))


@needs_sm89
def test_mma_backend_refuses_fp8(rng):
    case = _case(64, E=8, topk=2)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "tensor"), case, "torch", "bfloat16", DEV)
    with pytest.raises(swapmoe.ArgumentError, match="FP8"):
        fp8_call(inp, case, backend="cuda_mma")


@needs_sm89
def test_plan_picks_fp8_kernels(rng):
    """The plan select_backend gives (per tensor, static activation scales by default) and the
    call it describes: static scales here too, so the kernels asserted are the ones that run."""
    case = _case(1)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "tensor", static=True), case, "torch", "bfloat16", DEV)
    p = swapmoe.select_backend(1, 128, 8, 256, 128, quant="fp8_tensor")
    if torch.cuda.get_device_capability() == (9, 0):
        # select_backend plans per-tensor FP8 with static activation scales
        assert p.backend == "cuda_wgmma_swap" and "swap_moe_fp8_gemm1_tensor_q8_n8" in p.tile["kernels"]
    else:
        assert p.backend == "cuda_decode" and "decode_moe_fp8_gemm1_tensor_v16" in p.tile["kernels"]
    ref, flips = fp8_reference(inp, case)
    check_fp8_close(fp8_call(inp, case), ref, flips, "bfloat16")


@needs_sm90
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("M", [2, 9, 16])
def test_wide_experts_per_tensor_default_plan(M, static, rng):
    """Wide experts (N >= 4096) per tensor: the oracle keeps the e4m3 swap-AB kernels up to
    M = 16 (`SWAP_FP8_WIDE_BEFORE_WGMMA_MAX_TOKENS`, 2026-12-05; before, the wgmma GEMMs from
    M = 2); the default plan against the reference, with an N tail past 4096."""
    case = _case(M, (4224, 256), E=8, topk=2)
    scales = "static" if static else "dynamic"
    plan = swapmoe.select_backend(M, case.E, case.topk, case.K, case.N, quant="fp8_tensor", activation_scales=scales)
    assert (plan.backend, plan.source) == ("cuda_wgmma_swap", "heuristic"), plan.reasons
    run_fp8_case(case, "tensor", "torch", "bfloat16", rng, device=DEV, static=static)


@pytest.mark.skipif(not has_cuda() or _fp8_capable(), reason="needs a CUDA device below sm_89")
def test_pre_ada_device_raises(rng):
    case = _case(2, E=8, topk=2)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "tensor"), case, "torch", "bfloat16", DEV)
    with pytest.raises(swapmoe.ArgumentError, match="sm_89"):
        fp8_call(inp, case)


@needs_sm89
def test_kwargs_roundtrip(rng):
    """fp8_kwargs passes scales on the device; a scale on the CPU is a DeviceError."""
    case = _case(2, E=8, topk=2)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "channel"), case, "torch", "bfloat16", DEV)
    kw = fp8_kwargs(inp)
    kw["w1_scale"] = kw["w1_scale"].cpu()
    with pytest.raises(swapmoe.DeviceError, match="w1_scale"):
        swapmoe.fused_experts(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"], **kw)


# The FP8 swap-AB kernels (cuda_wgmma_swap with use_fp8_w8a8): every token tile (8/16/32/64),
# N and K tails of the 128-wide stages (N = 80, K = 336), the expert map with -1, invalid and
# duplicate ids, the router weight on the input, gelu, mostly idle experts.
SWAP_CASES = [
    _case(1),
    _case(5, ids="concentrated"),
    _case(16, (80, 336), E=16, topk=4, ids="invalid", ep=True),
    _case(17, (80, 336), E=8, topk=2, ids="dup", act="gelu"),
    _case(3, E=16, topk=1, on_input=True),
    _case(40, E=256, topk=8, ids="concentrated", out="inplace"),
    _case(64, E=64, topk=6),
    _case(3, BLOCKS_SHAPE, E=16, topk=4, ep=True),  # several intermediate groups and weight blocks
    # 6 stages of N per expert, the last one a tail: the dynamic-scale GEMM2 producer fetches
    # rows for stages ahead of the one it stores, across one expert's stages into the next's
    _case(2, (720, 256), E=16, topk=2),
]
SWAP_SPLITS = [None, "1,1", "2,4", "8,8"]  # None: the oracle's clusters


# (scheme, static activation scales): "tensor" with static scales runs the kernels whose
# GEMM1 writes the e4m3 intermediate (swap_moe_fp8_*_tensor_q8_*).
SWAP_SCHEMES = [(s, False) for s in FP8_SCHEMES] + [("tensor", True)]


def _scheme_id(v):
    return f"{v[0]}-static" if v[1] else v[0]


@needs_sm90
@pytest.mark.parametrize("splits", SWAP_SPLITS, ids=lambda s: f"splits{(s or 'oracle').replace(',', 'x')}")
@pytest.mark.parametrize("case", SWAP_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("scheme", SWAP_SCHEMES, ids=_scheme_id)
def test_swap_backend(scheme, case, splits, rng, monkeypatch):
    if splits:
        monkeypatch.setenv("SWAPMOE_SWAP_SPLITS", splits)
    run_fp8_case(case, scheme[0], "torch", "bfloat16", rng, device=DEV, static=scheme[1],
                 backend="cuda_wgmma_swap")


@needs_sm90
@pytest.mark.parametrize("gemm2_pdl", ["0", "1"], ids=lambda v: f"gemm2_pdl={v}")
@pytest.mark.parametrize("one_per_sm", ["0", "1"])
@pytest.mark.parametrize("case", [SWAP_CASES[0], SWAP_CASES[3], SWAP_CASES[6]], ids=lambda c: c.id)
@pytest.mark.parametrize("scheme", SWAP_SCHEMES, ids=_scheme_id)
def test_swap_gemm2_launch(scheme, case, one_per_sm, gemm2_pdl, rng, monkeypatch):
    """Both FP8 swap GEMM2s launched with more than half an SM's shared memory (one CTA per
    SM) or their own, by programmatic dependent launch under GEMM1 or after it: the same
    kernels, so the same results."""
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM2_ONE_PER_SM", one_per_sm)
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM2_PDL", gemm2_pdl)
    run_fp8_case(case, scheme[0], "torch", "bfloat16", rng, device=DEV, static=scheme[1],
                 backend="cuda_wgmma_swap")


@needs_sm90
@pytest.mark.parametrize("ring", ["2", "3", "4"], ids=lambda r: f"ring{r}")
@pytest.mark.parametrize("splits", [None, "4,4"], ids=lambda s: f"splits={s or 'oracle'}")
@pytest.mark.parametrize("case", [SWAP_CASES[0], SWAP_CASES[3], SWAP_CASES[6]], ids=lambda c: c.id)
@pytest.mark.parametrize("scheme", SWAP_SCHEMES, ids=_scheme_id)
def test_swap_gemm1_ring(scheme, case, splits, ring, rng, monkeypatch):
    """The e4m3 GEMM1 with a ring of 2-4 stages ($SWAPMOE_SWAP_GEMM1_RING; more CTAs per SM):
    the stage index and the barriers' phases wrap at the ring, whatever the number of k-stages
    per CTA (K = 256 and 336 split 1-4 ways); the plan says the ring."""
    _check_swap_ring("gemm1", ring, scheme, case, splits, rng, monkeypatch)


def _check_swap_ring(gemm, ring, scheme, case, splits, rng, monkeypatch):
    """Runs ``case`` on cuda_wgmma_swap with ``gemm``'s ring forced ($SWAPMOE_SWAP_<GEMM>_RING,
    SWAP_SPLITS ``splits`` or the oracle's) against the float64 reference, then checks that the
    plan runs that ring."""
    if splits:
        monkeypatch.setenv("SWAPMOE_SWAP_SPLITS", splits)
    monkeypatch.setenv(f"SWAPMOE_SWAP_{gemm.upper()}_RING", ring)
    run_fp8_case(case, scheme[0], "torch", "bfloat16", rng, device=DEV, static=scheme[1],
                 backend="cuda_wgmma_swap")
    plan = swapmoe.select_backend(case.M, case.E, case.topk, case.K, case.N, quant=QUANT_OF_SCHEME[scheme[0]],
                                  activation_scales="static" if scheme[1] else "dynamic",
                                  backend="cuda_wgmma_swap")
    assert plan.tile[f"swap_{gemm}_ring"] == int(ring), plan.reasons


@needs_sm90
@pytest.mark.parametrize("splits", [None, "1,1"], ids=lambda s: f"splits={s or 'oracle'}")
@pytest.mark.parametrize("case,ring", [
    pytest.param(c, r, id=f"{c.id}-ring{r}")
    for c, rings in ((SWAP_CASES[0], ("2", "4", "7")), (SWAP_CASES[3], ("2", "4")), (SWAP_CASES[6], ("2", "4")))
    for r in rings])
@pytest.mark.parametrize("scheme", SWAP_SCHEMES, ids=_scheme_id)
def test_swap_gemm2_ring(scheme, case, splits, ring, rng, monkeypatch):
    """Both e4m3 GEMM2s with a ring of 2, 4 or 7 stages ($SWAPMOE_SWAP_GEMM2_RING; 7, the tune
    candidate `r0p1g7`, at token tile 8, whose own ring is longer): the stage index and phases
    of the producer (the TMA thread, or the quantizing warpgroup) wrap at the ring over experts
    and k-stages (all experts in one CTA with "1,1"); the plan says the ring."""
    _check_swap_ring("gemm2", ring, scheme, case, splits, rng, monkeypatch)


@needs_sm90
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["aligned-rows", "odd-rows", "odd-start"])
@pytest.mark.parametrize("M", [1, 9])
def test_swap_static_quantizes_strided_inputs(M, layout, dtype, rng):
    """Strided and misaligned hidden_states on the static-scale path: every layout gives the
    contiguous input's result, bit for bit."""
    case = _case(M, E=16, topk=4)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "tensor", static=True), case, "torch", dtype, DEV)
    ref, flips = fp8_reference(inp, case)
    want = fp8_call(inp, case, backend="cuda_wgmma_swap")
    x = inp["x"]
    K = x.shape[1]
    pad, start = {"aligned-rows": (8, 0), "odd-rows": (4, 0), "odd-start": (8, 1)}[layout]
    wide = torch.full((M, K + pad), float("nan"), dtype=x.dtype, device=DEV)
    wide[:, start:start + K] = x
    inp["x"] = wide[:, start:start + K]
    assert inp["x"].stride(0) == K + pad
    got = fp8_call(inp, case, backend="cuda_wgmma_swap")
    torch.cuda.synchronize()
    check_fp8_close(got, ref, flips, dtype, what=f"{case.id}-{layout}")
    assert same_bits(snapshot(got), snapshot(want))


@needs_sm89
@pytest.mark.parametrize("layout", ["odd-rows", "odd-start"])
@pytest.mark.parametrize("case", [_case(9, E=16, topk=4), _case(300, (80, 336), E=8, topk=2, ep=True),
                                  _case(6, (32, 8464), E=4, topk=2)],
                         ids=lambda c: c.id)
@pytest.mark.parametrize("scheme", ["tensor", "channel"])
def test_quantize_x_vector_and_scalar_paths_agree(scheme, case, layout, rng):
    """quantize-x reads 16-byte vectors of rows that allow them (aligned, K a multiple of 8)
    and falls back to element loads otherwise: the same e4m3 codes and scales, so an x with
    misaligned rows or start gives the aligned x's output bit for bit, for the dynamic
    per-tensor and per-token scales (decode and prefill plans). K = 8464 takes the vector
    loop more than one step per row (256 threads x 4 vectors of 8 bf16 cover 8192)."""
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme), case, "torch", "bfloat16", DEV)
    ref, flips = fp8_reference(inp, case)
    want = fp8_call(inp, case)
    x = inp["x"]
    K = x.shape[1]
    pad, start = {"odd-rows": (4, 0), "odd-start": (8, 1)}[layout]
    wide = torch.full((case.M, K + pad), float("nan"), dtype=x.dtype, device=DEV)
    wide[:, start:start + K] = x
    inp["x"] = wide[:, start:start + K]
    got = fp8_call(inp, case)
    torch.cuda.synchronize()
    check_fp8_close(want, ref, flips, "bfloat16", what=f"{case.id}-aligned")
    assert same_bits(snapshot(got), snapshot(want)), f"{case.id}-{layout}"


@needs_sm90
@pytest.mark.parametrize("case", [_case(5, E=64, topk=4, ids="dup"), _case(9, (80, 336), E=16, topk=2, ep=True)],
                         ids=lambda c: c.id)
def test_swap_static_does_not_read_stale_workspace(case, rng):
    """GEMM1 writes every e4m3 row GEMM2 reads (0 for tokens that skip the expert); the
    copy zero-fills rows past M. A workspace full of e4m3 NaN (0xFF), passed to the core as
    the call's workspace, must not leak in."""
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "tensor", static=True), case, "torch", "bfloat16", DEV)
    ref, flips = fp8_reference(inp, case)
    for _ in range(2):
        out = call_with_workspace(inp, case, junk_workspace(inp, "fp8_tensor"), poison(inp["x"]),
                                  backend="cuda_wgmma_swap", **fp8_kwargs(inp))
        torch.cuda.synchronize()
        check_fp8_close(out, ref, flips, "bfloat16", what=case.id)


@needs_sm90
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("M", [2, 24])
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_swap_dtypes_and_static_scales(scheme, M, dtype, static, rng):
    if static and scheme != "tensor":
        pytest.skip("static activation scales are per tensor")
    run_fp8_case(_case(M, E=32, topk=4), scheme, "torch", dtype, rng, device=DEV, static=static,
                 backend="cuda_wgmma_swap")


# cuda_wgmma's GEMM1 grouping the slots itself (`Plan::align_in_gemm1`): the quantize-x kernel
# is then the first, GEMM1 second. M = 1, ragged experts with invalid ids and an expert map,
# several tiles per hot expert, int64 ids with 192 slots over 128 experts.
ALIGN_IN_GEMM1_CASES = [_case(1), _case(17, E=64, topk=6, ids="invalid", ep=True), _case(64, E=8, ids="concentrated"),
                        _case(24, id_dtype="int64")]


@needs_sm90
@pytest.mark.parametrize("tile", [64, 128])
@pytest.mark.parametrize("case", ALIGN_IN_GEMM1_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("scheme", SWAP_SCHEMES, ids=_scheme_id)
def test_wgmma_gemm1_groups_the_slots_itself(scheme, case, tile, rng, monkeypatch):
    """Against the FP8 reference and bit-identical to the plan with route_align, each on a 0xFF
    workspace and a NaN output; the oracle's plan for the call's shape says which ran."""
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma")
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", str(tile))
    monkeypatch.setenv("SWAPMOE_WGMMA_PERSISTENT", "on")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme[0], static=scheme[1]), case, "torch", "bfloat16", DEV)
    ref, flips = fp8_reference(inp, case)
    quant = {"tensor": "fp8_tensor", "channel": "fp8_channel", "block": "fp8_block128"}[scheme[0]]
    outs = {}
    for align in ("on", "off"):
        monkeypatch.setenv("SWAPMOE_ALIGN_IN_GEMM1", align)
        plan = swapmoe.select_backend(case.M, case.E, case.topk, case.K, case.N, quant=quant)
        kernels = plan.tile["kernels"]
        assert plan.tile["align_in_gemm1"] == (align == "on"), plan.reasons
        assert ("swapmoe_route_align" in kernels) == (align == "off"), kernels
        outs[align] = snapshot(call_with_workspace(inp, case, junk_workspace(inp, quant), poison(inp["x"]),
                                                   **fp8_kwargs(inp)))
    check_fp8_close(torch.from_numpy(outs["on"]).view(torch.bfloat16), ref, flips, "bfloat16", what=case.id)
    assert same_bits(outs["on"], outs["off"]), f"{case.id}: GEMM1's grouping and route_align's differ"


# cuda_wgmma's e4m3 GEMM1 after quantize-x and route_align launched by PDL
# ($SWAPMOE_WGMMA_GEMM1_PDL): every scheme (the intermediate written by GEMM1 or quantized after
# it); fewer k-stages than the ring's stages and more; tile 128.
GEMM1_PDL_CASES = [(64, _case(24)), (64, _case(17, (1024, 256), E=64, topk=6, ids="invalid", ep=True)),
                   (64, _case(200, E=8, topk=2, ids="concentrated")),
                   (128, _case(200, (256, 2048), E=8, topk=2, ids="concentrated"))]


@needs_sm90
@pytest.mark.parametrize("tile,case", GEMM1_PDL_CASES, ids=[f"t{t}-{c.id}" for t, c in GEMM1_PDL_CASES])
@pytest.mark.parametrize("scheme", SWAP_SCHEMES, ids=_scheme_id)
def test_wgmma_gemm1_by_pdl(scheme, tile, case, rng, monkeypatch):
    """Against the FP8 reference and bit-identical to the plan without PDL, each on a 0xFF
    workspace and a NaN output; then 3 calls with PDL queued back to back, each bit-identical
    too. The oracle's plan says which launches ran."""
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma")
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", str(tile))
    monkeypatch.setenv("SWAPMOE_WGMMA_PERSISTENT", "on")
    monkeypatch.setenv("SWAPMOE_WGMMA_GEMM2_BLOCK_RUN", "4" if tile == 128 else "1")
    monkeypatch.setenv("SWAPMOE_ALIGN_IN_GEMM1", "off")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme[0], static=scheme[1]), case, "torch", "bfloat16", DEV)
    ref, flips = fp8_reference(inp, case)
    quant = {"tensor": "fp8_tensor", "channel": "fp8_channel", "block": "fp8_block128"}[scheme[0]]

    outs = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv("SWAPMOE_WGMMA_GEMM1_PDL", pdl)
        plan = swapmoe.select_backend(case.M, case.E, case.topk, case.K, case.N, quant=quant)
        assert plan.backend == "cuda_wgmma", plan.reasons
        assert plan.tile["wgmma_gemm1_pdl"] == (pdl == "1"), plan.reasons
        assert not plan.tile["align_in_gemm1"], plan.reasons
        assert plan.tile["wgmma_gemm2_block_run"] == (4 if tile == 128 else 1), plan.reasons
        outs[pdl] = snapshot(call_with_workspace(inp, case, junk_workspace(inp, quant), poison(inp["x"]),
                                                 **fp8_kwargs(inp)))
    check_fp8_close(torch.from_numpy(outs["1"]).view(torch.bfloat16), ref, flips, "bfloat16", what=case.id)
    assert same_bits(outs["1"], outs["0"]), f"{case.id}: GEMM1 by PDL differs from GEMM1 after route_align"
    monkeypatch.setenv("SWAPMOE_WGMMA_GEMM1_PDL", "1")
    for i, out in enumerate(queued_reruns(inp, case, 3, quant, **fp8_kwargs(inp))):
        assert same_bits(out, outs["1"]), f"{case.id}: queued call {i} moved"


@needs_sm90
@pytest.mark.parametrize("splits", ["1,1", "4,4"])
@pytest.mark.parametrize("scheme", SWAP_SCHEMES, ids=_scheme_id)
def test_swap_is_deterministic(scheme, splits, rng, monkeypatch):
    """Cluster sums go in rank order and nothing is atomic but the absmax (order-free). Each
    rerun gets a NaN output and a 0xFF workspace, so a value left over from the previous
    rerun cannot stand in for one a kernel failed to write."""
    monkeypatch.setenv("SWAPMOE_SWAP_SPLITS", splits)
    case = _case(12, E=16, topk=4, ids="concentrated")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme[0], static=scheme[1]), case, "torch", "bfloat16", DEV)
    quant = {"tensor": "fp8_tensor", "channel": "fp8_channel", "block": "fp8_block128"}[scheme[0]]

    def rerun():
        return snapshot(call_with_workspace(inp, case, junk_workspace(inp, quant), poison(inp["x"]),
                                            backend="cuda_wgmma_swap", **fp8_kwargs(inp)))

    first = rerun()
    ref, flips = fp8_reference(inp, case)
    check_fp8_close(torch.from_numpy(first).view(torch.bfloat16), ref, flips, "bfloat16")
    for _ in range(10):
        assert same_bits(rerun(), first)


@needs_sm90
@pytest.mark.parametrize("M", [1, 6, 16])
@pytest.mark.parametrize("router", ["qwen3", "deepseek_v3"])
@pytest.mark.parametrize("scheme", SWAP_SCHEMES, ids=_scheme_id)
def test_swap_fused_moe_graph_routes_fresh_logits(scheme, router, M, rng, monkeypatch):
    """fused_moe on the swap backend captured in a CUDA graph: the router kernel, quantize-x,
    GEMM1, GEMM2. GEMM1 reads the routing and issues its first stages' weight copies before
    its griddepcontrol.wait (under quantize-x), so each replay, on fresh logits and x, must
    give what select_experts + fused_experts give eagerly on the same inputs, bit for bit."""
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma_swap")
    r = ROUTERS[router]
    case = _case(M, E=r.E, topk=r.topk)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme[0], static=scheme[1]), case, "torch", "bfloat16", DEV)
    bias_host = (rng.standard_normal(r.E) * 0.1).astype(np.float32) if r.bias else None
    bias = None if bias_host is None else torch.from_numpy(bias_host).to(DEV)
    logits = torch.from_numpy(draw_logits(rng, r, M, bias_host)).to(DEV)
    quant = fp8_kwargs(inp)

    def moe():
        return swapmoe.fused_moe(inp["x"], inp["w1"], inp["w2"], logits, r.topk, e_score_correction_bias=bias,
                                 **quant, **r.kwargs())

    moe()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe()
    for replay in range(3):
        logits.copy_(torch.from_numpy(draw_logits(rng, r, M, bias_host)))
        inp["x"].copy_(torch.from_numpy(rng.standard_normal(tuple(inp["x"].shape), dtype=np.float32)))
        captured.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        w, ids = swapmoe.select_experts(logits, r.topk, e_score_correction_bias=bias, **r.kwargs())
        want = swapmoe.fused_experts(inp["x"], inp["w1"], inp["w2"], w, ids, **quant)
        torch.cuda.synchronize()
        assert not torch.isnan(captured).any(), f"replay {replay}: NaN left in the output"
        assert same_bits(snapshot(captured), snapshot(want)), f"replay {replay}: differs from the eager calls"


@needs_sm90
@pytest.mark.parametrize("what", ["float32", "K=200"])
def test_swap_refuses_what_it_cannot_run(what, rng):
    shape, dtype = (VEC_SHAPE, "float32") if what == "float32" else (ODD_SHAPE, "bfloat16")
    case = _case(4, shape, E=8, topk=2)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "tensor"), case, "torch", dtype, DEV)
    why = "bfloat16 or float16 outputs" if what == "float32" else "multiples of 16 e4m3"
    error = swapmoe.DTypeError if what == "float32" else swapmoe.ShapeError
    with pytest.raises(error, match=why):
        fp8_call(inp, case, backend="cuda_wgmma_swap")


@needs_sm90
@pytest.mark.parametrize("backend", ["cuda_wgmma_swap", "cuda_decode", "cuda_generic"])
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_first_kernel_without_pdl_gives_the_same_bits(scheme, backend, rng, monkeypatch):
    """$SWAPMOE_FIRST_KERNEL_PDL=off launches the first FP8 kernel (the absmax pre-pass or the
    input quantization, or the align kernel before them) without PDL: the same bits."""
    case = _case(5, E=16, topk=4, ids="concentrated")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme), case, "torch", "bfloat16", DEV)
    monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", "on")
    on = snapshot(fp8_call(inp, case, backend=backend))
    monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", "off")
    assert same_bits(snapshot(fp8_call(inp, case, backend=backend)), on)


@needs_sm90
@pytest.mark.parametrize("backend", ["cuda_wgmma_swap", "cuda_wgmma", "cuda_decode", "cuda_generic"])
@pytest.mark.parametrize("scheme", SWAP_SCHEMES, ids=_scheme_id)
def test_back_to_back_calls_feed_each_other(scheme, backend, rng, monkeypatch):
    """Three calls queued with no sync between them, each on the previous one's output (NaN
    until written), every kernel after the first launched with PDL: a first kernel that reads
    its input, or rewrites the workspace block the previous call's last kernel still reads,
    before its griddepcontrol.wait gets NaN or corrupts the previous output. (The test before
    this one compares PDL on and off on one call, which no such race can change.) Each output
    against the reference on the input that call had."""
    monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", "on")
    case = _case(12, BLOCKS_SHAPE, E=16, topk=4, ids="concentrated")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme[0], static=scheme[1]), case, "torch", "bfloat16", DEV)
    xs = chain_three(inp, lambda step, out: fp8_call(step, case, out=out, backend=backend))
    for i in range(3):
        ref, flips = fp8_reference(dict(inp, x=xs[i]), case)
        assert np.linalg.norm(ref) > 0, f"call {i + 1}: degenerate chain (zero reference)"
        check_fp8_close(xs[i + 1], ref, flips, "bfloat16", what=f"call {i + 1} of 3, {backend}")


@needs_sm90
@pytest.mark.parametrize("backend", ["cuda_wgmma_swap", "cuda_wgmma", "cuda_decode", "cuda_generic"])
@pytest.mark.parametrize("scheme", SWAP_SCHEMES, ids=_scheme_id)
def test_first_kernel_waits_for_a_long_predecessor(scheme, backend, rng, monkeypatch):
    """The FP8 call queued right after a long bf16 call that lets its dependents start early
    and writes this call's input at its end (conftest.chain_after_long_call): a pre-pass
    (absmax, quantize-x) or GEMM1 that reads x, or rewrites a workspace block the long call
    still reads, before its griddepcontrol.wait fails here. The back-to-back test above
    passed with the absmax pre-pass reading x before its wait (NOTES "Test audit"); this one
    is checked against that planted bug (NOTES "A long predecessor")."""
    monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", "on")
    case = _case(12, BLOCKS_SHAPE, E=16, topk=4, ids="concentrated")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme[0], static=scheme[1]), case, "torch", "bfloat16", DEV)
    long_inp, long_case, long_out, out = chain_after_long_call(
        inp, lambda step, o: fp8_call(step, case, out=o, backend=backend), rng)
    check_close(long_out, reference(long_inp, long_case), "bfloat16", what="the long call")
    ref, flips = fp8_reference(dict(inp, x=long_out), case)
    check_fp8_close(out, ref, flips, "bfloat16", what=f"{backend} after the long call")


# The FP8 Hopper wgmma GEMMs (cuda_wgmma with use_fp8_w8a8; tokens in wgmma's 64-row slot,
# e4m3 weights by TMA, 128 of K per stage): both token tiles, N and K tails of the 128-wide
# stages and column blocks (N = 80, K = 336), ragged experts and experts with no token,
# M = 1, invalid, duplicate and int64 ids, the expert map with -1, the router weight on the
# input, gelu, strided operands, in-place output. Per-tensor scales dynamic and static (the
# static intermediate scale makes GEMM1 write e4m3 itself), per-channel scales, and 128x128
# blocks (scaled at each stage's promotion; GEMM1 quantizes the intermediate in 1 x 128
# groups: N a multiple of 128, so their cases take N rounded up: 128 and 256, with the K
# tails 336 and 384 and a w2 scale row clamped past K).
WGMMA_CASES = [
    _case(1, E=8, topk=2),
    _case(17, (80, 336), E=16, topk=4, act="gelu"),
    _case(130, E=16, topk=4, ids="concentrated"),
    _case(300, ids="concentrated", ep=True),
    _case(300, (80, 336), E=8, topk=2, ids="invalid", id_dtype="int64"),
    _case(600, E=8, topk=1, on_input=True, ep=True),
    _case(200, E=64, topk=6, ids="dup", out="inplace"),
    _case(257, (144, 384), E=8, topk=2, layout="strided"),
]
WGMMA_SCHEMES = [("tensor", False), ("tensor", True), ("channel", False), ("block", False)]
# select_backend's quant name of each scheme ("tensor" -> "fp8_tensor", ...)
QUANT_OF_SCHEME = {scheme: quant for quant, scheme in QUANT_SCHEMES.items()}


WGMMA_FP8_TILES = [64, 128]  # the token tiles of the FP8 wgmma GEMMs


WGMMA_A_MODES = ["gather", "pregathered"]  # GEMM1 gathers xq's rows itself, or reads them gathered by TMA


def _wgmma_tile(monkeypatch, tile, a_mode="gather"):
    """Forces cuda_wgmma's token tile (64: two sets of promotion accumulators alternate;
    128: each stage in two halves of columns) and GEMM1's A mode."""
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", str(tile))
    monkeypatch.setenv("SWAPMOE_WGMMA_PREGATHER", "on" if a_mode == "pregathered" else "off")


@needs_sm90
@pytest.mark.parametrize("a_mode", WGMMA_A_MODES)
@pytest.mark.parametrize("tile", WGMMA_FP8_TILES, ids=lambda t: f"t{t}")
@pytest.mark.parametrize("case", WGMMA_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("scheme", WGMMA_SCHEMES, ids=_scheme_id)
def test_wgmma_backend(scheme, case, tile, a_mode, rng, monkeypatch):
    _wgmma_tile(monkeypatch, tile, a_mode)
    case = wgmma_fp8_case(case, scheme[0])
    run_fp8_case(case, scheme[0], "torch", "bfloat16", rng, device=DEV, static=scheme[1], backend="cuda_wgmma")


@needs_sm90
@pytest.mark.parametrize("tile", WGMMA_FP8_TILES, ids=lambda t: f"t{t}")
@pytest.mark.parametrize("scheme", ["channel", "block"])
def test_wgmma_strided_scale_views(scheme, tile, rng, monkeypatch):
    """Weight scales that are non-contiguous views (every other element of a NaN-filled
    tensor): the per-channel epilogues and the block promotion read them by their strides,
    with N and K tails (N = 80, K = 336)."""
    _wgmma_tile(monkeypatch, tile)
    case = wgmma_fp8_case(_case(130, (80, 336), E=16, topk=4), scheme)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme), case, "torch", "bfloat16", DEV)
    ref, flips = fp8_reference(inp, case)
    for name in ("w1_scale", "w2_scale"):
        t = inp[name]
        big = torch.full(t.shape[:-1] + (2 * t.shape[-1],), math.nan, dtype=t.dtype, device=t.device)
        big[..., ::2] = t
        inp[name] = big[..., ::2]
        assert not inp[name].is_contiguous()
    out = fp8_call(inp, case, backend="cuda_wgmma")
    torch.cuda.synchronize()
    check_fp8_close(out, ref, flips, "bfloat16", what=f"{case.id}-{scheme}-strided-scales")


@needs_sm90
@pytest.mark.parametrize("tile", WGMMA_FP8_TILES, ids=lambda t: f"t{t}")
@pytest.mark.parametrize("scheme", WGMMA_SCHEMES, ids=_scheme_id)
def test_wgmma_tile_edges(scheme, tile, rng, monkeypatch):
    """Experts on both sides of the token tiles' edges (conftest TILE_EDGE_COUNTS: 0, 1, 63-65,
    127-129, 191-193, 255-257 tokens), every scheme, each token tile."""
    _wgmma_tile(monkeypatch, tile)
    case = _case(997, (256, 512), E=16, topk=2, ids="tile_edges")
    run_fp8_case(case, scheme[0], "torch", "bfloat16", rng, device=DEV, static=scheme[1], backend="cuda_wgmma")


@needs_sm90
@pytest.mark.parametrize("hints", [1, 3], ids=lambda h: f"l2_hints={h}")
@pytest.mark.parametrize("a_mode", WGMMA_A_MODES)
@pytest.mark.parametrize("scheme", WGMMA_SCHEMES, ids=_scheme_id)
def test_wgmma_l2_hints(scheme, a_mode, hints, rng, monkeypatch):
    """L2 eviction hints on the e4m3 wgmma GEMMs' loads ($SWAPMOE_WGMMA_L2_HINTS) leave the
    results as they are: the tile-edge case, every scheme, both A modes."""
    _wgmma_tile(monkeypatch, 128, a_mode)
    monkeypatch.setenv("SWAPMOE_WGMMA_L2_HINTS", str(hints))
    case = _case(997, (256, 512), E=16, topk=2, ids="tile_edges")
    run_fp8_case(case, scheme[0], "torch", "bfloat16", rng, device=DEV, static=scheme[1], backend="cuda_wgmma")


@pytest.mark.serial
@needs_sm90
@pytest.mark.parametrize("a_mode", WGMMA_A_MODES)
@pytest.mark.parametrize("tile", WGMMA_FP8_TILES, ids=lambda t: f"t{t}")
@pytest.mark.parametrize("shape", [(256, 2048), (1024, 256)], ids=["gemm2-persistent", "gemm1-gemm2-persistent"])
@pytest.mark.parametrize("scheme", WGMMA_SCHEMES, ids=_scheme_id)
def test_wgmma_persistent_grids(scheme, shape, tile, a_mode, rng, monkeypatch):
    """Persistent grids with several work items per CTA (~370 items at tile 64): GEMM2 with 2
    k-stages (N = 256), and both GEMMs (K = 256: 2 stages; N = 1024: 8)."""
    _wgmma_tile(monkeypatch, tile, a_mode)
    case = _case(1200, shape, E=8, topk=2, ids="concentrated")
    run_fp8_case(case, scheme[0], "torch", "bfloat16", rng, device=DEV, static=scheme[1], backend="cuda_wgmma")


@needs_sm90
@pytest.mark.parametrize("run", [3, 12])
@pytest.mark.parametrize("shape", [(256, 2064), (128, 528)], ids=["N256", "N128"])
@pytest.mark.parametrize("scheme", WGMMA_SCHEMES, ids=_scheme_id)
def test_wgmma_gemm2_block_run(scheme, shape, run, rng, monkeypatch):
    """The e4m3 GEMM2 in runs of column blocks per token tile ($SWAPMOE_WGMMA_GEMM2_BLOCK_RUN):
    N = 256 and 128 (2 and 1 e4m3 k-stages in tile 128's 4 stages), K = 2064 (9 column blocks,
    the last of 16 columns) and 528 (3), tile-edge token counts; the plan says the run."""
    _wgmma_tile(monkeypatch, 128)
    monkeypatch.setenv("SWAPMOE_WGMMA_GEMM2_BLOCK_RUN", str(run))
    case = _case(997, shape, E=16, topk=2, ids="tile_edges")
    run_fp8_case(case, scheme[0], "torch", "bfloat16", rng, device=DEV, static=scheme[1], backend="cuda_wgmma")
    quant = QUANT_OF_SCHEME[scheme[0]]
    plan = swapmoe.select_backend(case.M, case.E, case.topk, case.K, case.N, quant=quant, backend="cuda_wgmma")
    assert plan.tile["wgmma_gemm2_block_run"] == min(run, -(-case.K // 256)), plan.reasons


@needs_sm90
@pytest.mark.parametrize("scheme", WGMMA_SCHEMES, ids=_scheme_id)
def test_wgmma_gemm2_block_run_by_default_where_tokens_fill_the_tile(scheme, rng, monkeypatch):
    """Unforced, the oracle gives the e4m3 GEMM2 runs of 4 column blocks per token tile where
    the tokens per expert fill tile 128 (1200 x 2 / 8 = 300; K = 2064: 9 blocks, so a short
    last run), and not where they do not (997 x 2 / 16 = 124); both results hold."""
    _wgmma_tile(monkeypatch, 128)
    monkeypatch.delenv("SWAPMOE_WGMMA_GEMM2_BLOCK_RUN", raising=False)
    quant = QUANT_OF_SCHEME[scheme[0]]
    for case, want in [(_case(1200, (256, 2064), E=8, topk=2), 4),
                       (_case(997, (256, 2064), E=16, topk=2, ids="tile_edges"), 1)]:
        plan = swapmoe.select_backend(case.M, case.E, case.topk, case.K, case.N, quant=quant, backend="cuda_wgmma")
        assert plan.tile["wgmma_gemm2_block_run"] == want, plan.reasons
        run_fp8_case(case, scheme[0], "torch", "bfloat16", rng, device=DEV, static=scheme[1], backend="cuda_wgmma")


@pytest.mark.serial
@needs_sm90
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("scheme", WGMMA_SCHEMES, ids=_scheme_id)
def test_wgmma_output_dtypes(scheme, dtype, rng):
    case = _case(400, E=16, topk=4, ids="concentrated")
    run_fp8_case(case, scheme[0], "torch", dtype, rng, device=DEV, static=scheme[1], backend="cuda_wgmma")


@pytest.mark.serial
@needs_sm90
@pytest.mark.parametrize("scheme", WGMMA_SCHEMES, ids=_scheme_id)
def test_wgmma_no_expert_at_all(scheme, rng):
    case = _case(300, E=64, topk=6, ids="none")
    prob = make_fp8_problem(rng, case, scheme[0], static=scheme[1])
    inp = to_fp8_inputs(prob, case, "torch", "bfloat16", DEV)
    out = fp8_call(inp, case, out=poison(inp["x"]), backend="cuda_wgmma")
    torch.cuda.synchronize()
    assert (to_f64(out) == 0).all()


@pytest.mark.serial
@needs_sm90
@pytest.mark.parametrize("a_mode", WGMMA_A_MODES)
@pytest.mark.parametrize("tile", WGMMA_FP8_TILES, ids=lambda t: f"t{t}")
@pytest.mark.parametrize("scheme", WGMMA_SCHEMES, ids=_scheme_id)
def test_wgmma_is_deterministic_and_graph_safe(scheme, tile, a_mode, rng, monkeypatch):
    """Bit-identical reruns (the absmax is an atomic max: order-free), and a CUDA graph of the
    call (with the gather kernel, pregathered) replays right on fresh inputs copied into its
    buffers."""
    _wgmma_tile(monkeypatch, tile, a_mode)
    case = _case(300, E=16, topk=4)
    prob = make_fp8_problem(rng, case, scheme[0], static=scheme[1])
    inp = to_fp8_inputs(prob, case, "torch", "bfloat16", DEV)
    first = snapshot(fp8_call(inp, case, backend="cuda_wgmma"))
    for _ in range(5):
        assert same_bits(snapshot(fp8_call(inp, case, backend="cuda_wgmma")), first)
    out_buf = torch.empty_like(inp["x"])
    fp8_call(inp, case, out=out_buf, backend="cuda_wgmma")  # one eager call before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8_call(inp, case, out=out_buf, backend="cuda_wgmma")
    _replay_on_fresh_inputs(graph, out_buf, inp, case, scheme[0], rng)


@pytest.mark.serial
@needs_sm90
@pytest.mark.parametrize("what", ["block N=80", "float32", "K=200"])
def test_wgmma_refuses_what_it_cannot_run(what, rng):
    scheme = "block" if what.startswith("block") else "tensor"
    shape = {"block N=80": (80, 256), "K=200": ODD_SHAPE}.get(what, VEC_SHAPE)
    dtype = "float32" if what == "float32" else "bfloat16"
    case = _case(300, shape, E=8, topk=2)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme), case, "torch", dtype, DEV)
    why = {"block N=80": "N must be a multiple of 128, got N = 80", "float32": "bfloat16 or float16 outputs",
           "K=200": "multiples of 16 e4m3"}[what]
    error = swapmoe.DTypeError if what == "float32" else swapmoe.ShapeError
    with pytest.raises(error, match=why):
        fp8_call(inp, case, backend="cuda_wgmma")


@pytest.mark.serial
@needs_sm90
def test_wgmma_picked_for_fp8_prefill(rng, monkeypatch):
    """The heuristic takes the e4m3 wgmma GEMMs for per-tensor FP8 with many slots per
    expert, and the default call runs right."""
    monkeypatch.setenv("SWAPMOE_TABLES", "off")
    case = _case(600, E=8, topk=2)
    plan = swapmoe.select_backend(600, 8, 2, case.K, case.N, quant="fp8_tensor", activation_scales="dynamic",
                                  device_name=torch.cuda.get_device_name())
    assert plan.backend == "cuda_wgmma", plan.reasons
    assert "wgmma_moe_fp8_quant_inter_tensor" in plan.tile["kernels"]
    run_fp8_case(case, "tensor", "torch", "bfloat16", rng, device=DEV)
