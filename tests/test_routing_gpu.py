"""The routers on CUDA (torch, device="cuda"): ``swapmoe.select_experts`` and
``swapmoe.fused_moe`` against the float64 reference and against the CPU path, for the
router variants of tests/test_routing.py; ties, -inf and NaN; token counts 1 to 300; CUDA
graphs; torch.compile; the CUDA limits. Every test is marked ``gpu`` and skipped when torch
sees no CUDA device."""

from __future__ import annotations

import math

import numpy as np
import pytest

import swapmoe
from conftest import TOLERANCE, check_close, has_cuda, to_f64, torch
from swapmoe.reference import rel_error
from test_routing import (
    BY_NAME,
    K_HID,
    LOGIT_GRID,
    VARIANT_IDS,
    VARIANTS,
    W_RTOL,
    Router,
    as_lib,
    check_routing,
    draw_bias,
    draw_logits,
    moe_call,
    moe_inputs,
    moe_problem,
    moe_ref,
    near_tie,
    route,
    route_ref,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

DEV = "cuda"
DTYPES = ["float32", "bfloat16", "float16"]


@pytest.fixture(autouse=True)
def _cuda_sync():
    yield
    if has_cuda():
        torch.cuda.synchronize()  # surfaces asynchronous faults in the test that caused them


def cuda_routing(r: Router, logits: np.ndarray, bias, dtype: str):
    g = as_lib(logits, "torch", dtype, DEV)
    b = as_lib(bias, "torch", "float32", DEV)
    return g, b


# --------------------------------------------------------------------------- select_experts


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 64, 300])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("r", VARIANTS, ids=VARIANT_IDS)
def test_select_experts_cuda_matches_reference(r, dtype, M, rng):
    bias = draw_bias(rng, r)
    g, b = cuda_routing(r, draw_logits(rng, r, M, bias), bias, dtype)
    w, ids = route(r, g, b)
    assert w.device == g.device and ids.device == g.device
    torch.cuda.synchronize()
    check_routing(r, (w, ids), route_ref(r, g, b), what=f"{r.name} {dtype} M={M}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("r", VARIANTS, ids=VARIANT_IDS)
def test_cuda_matches_cpu(r, dtype, rng):
    """The GPU router and the CPU router agree: ids exactly, weights bitwise or within
    float32 rounding (expf and the order of the softmax sum differ)."""
    bias = draw_bias(rng, r)
    logits = draw_logits(rng, r, 97, bias)
    g_cpu, b_cpu = as_lib(logits, "torch", dtype), as_lib(bias, "torch", "float32")
    w_cpu, ids_cpu = route(r, g_cpu, b_cpu)
    w_gpu, ids_gpu = route(r, g_cpu.to(DEV), None if b_cpu is None else b_cpu.to(DEV))
    w_gpu, ids_gpu = w_gpu.cpu(), ids_gpu.cpu()
    assert torch.equal(ids_gpu, ids_cpu)
    if not torch.equal(w_gpu, w_cpu):
        torch.testing.assert_close(w_gpu, w_cpu, rtol=W_RTOL, atol=0, equal_nan=True)


@pytest.mark.gpu
def test_cuda_deterministic(rng):
    r = BY_NAME["deepseek_v3"]
    bias = draw_bias(rng, r)
    g, b = cuda_routing(r, draw_logits(rng, r, 64, bias), bias, "bfloat16")
    w1, i1 = route(r, g, b)
    w2, i2 = route(r, g, b)
    assert torch.equal(w1, w2) and torch.equal(i1, i2)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "r",
    [
        Router("e1024_k32_g32", 1024, 32, "sigmoid", groups=(32, 8), bias=True, scale=2.5),
        Router("e1024_softmax_k32", 1024, 32),
        Router("e1000_k5", 1000, 5, "sigmoid", renormalize=False),  # E not a multiple of 32
        Router("e1_k1", 1, 1),
        Router("e33_k32", 33, 32, "sigmoid"),
        Router("e96_g32_k3", 96, 3, "softmax", groups=(32, 2), bias=True),
    ],
    ids=lambda r: r.name,
)
def test_cuda_router_shape_limits(r, rng):
    """The largest expert count, topk and group count the GPU router takes, and odd
    sizes. For E > 256 logits and bias come from finer grids (distinct values); rows with
    a near-tie are redrawn as in draw_logits."""
    if r.E <= 256:
        bias = draw_bias(rng, r)
        logits = draw_logits(rng, r, 40, bias)
    else:
        bias = None
        if r.bias:
            bias = (rng.permutation(np.arange(-r.E, r.E))[: r.E] / 4096).astype(np.float32)
        grid = np.arange(-r.E, r.E, dtype=np.float32) / np.float32(128)
        rows = []
        while len(rows) < 40:
            row = rng.permutation(grid)[: r.E]
            if not near_tie(row, r, bias):
                rows.append(row)
        logits = np.stack(rows).astype(np.float32)
    g, b = cuda_routing(r, logits, bias, "float32")
    w, ids = route(r, g, b)
    torch.cuda.synchronize()
    check_routing(r, (w, ids), route_ref(r, g, b), what=r.name)


# Grouped sigmoid routers the CTA router takes (`oracle::router_kernel`): power-of-two groups
# of 2 to 32 experts, E <= 256 (E not a multiple of 32 too), with and without a bias, and the
# largest topk (32).
CTA_ROUTERS = [
    BY_NAME["deepseek_v3"],
    Router("cta_e48_g2", 48, 4, "sigmoid", groups=(24, 6), bias=True, scale=1.5),
    Router("cta_e80_g16", 80, 6, "sigmoid", groups=(5, 2), renormalize=False),
    Router("cta_e64_g8", 64, 8, "sigmoid", groups=(8, 4)),
    Router("cta_e256_k32", 256, 32, "sigmoid", groups=(8, 2), bias=True, scale=2.5),
    Router("cta_e200_g8", 200, 5, "sigmoid", groups=(25, 3), bias=True),
]


def router_kernel_of(r: Router, g, b) -> str:
    """The router kernel fused_moe's plan names for these logits (describe_plan)."""
    M = g.shape[0]
    x = torch.zeros(M, 64, dtype=torch.bfloat16, device=DEV)
    w1 = torch.zeros(r.E, 128, 64, dtype=torch.bfloat16, device=DEV)
    w2 = torch.zeros(r.E, 64, 64, dtype=torch.bfloat16, device=DEV)
    w, ids = route(r, g, b)
    plan = swapmoe._core.describe_plan(x, w1, w2, w, ids, fused_moe=True, scoring=r.scoring,
                                       num_expert_group=None if r.groups is None else r.groups[0])
    return plan["kernels"][0]


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 7, 64, 300])
@pytest.mark.parametrize("r", CTA_ROUTERS, ids=lambda r: r.name)
def test_cta_router_matches_reference_and_warp_router(r, M, rng, monkeypatch):
    """The grouped CTA router (one thread per expert; the default, also with
    $SWAPMOE_ROUTER_KERNEL=cta) against the float64 reference, and bitwise against the warp
    router ($SWAPMOE_ROUTER_KERNEL=warp): the same scores, picks and renormalizing sum.
    Outputs are poisoned first, so a slot it misses shows."""
    bias = draw_bias(rng, r)
    g, b = cuda_routing(r, draw_logits(rng, r, M, bias), bias, "bfloat16")
    default = router_kernel_of(r, g, b)
    assert default == "swapmoe_route_grouped_cta", default
    monkeypatch.setenv("SWAPMOE_ROUTER_KERNEL", "cta")
    assert router_kernel_of(r, g, b) == "swapmoe_route_grouped_cta"
    w = torch.full((M, r.topk), float("nan"), device=DEV)
    ids = torch.full((M, r.topk), -7, dtype=torch.int32, device=DEV)
    ng, tg = r.groups
    swapmoe._core.select_experts(g, w, ids, r.topk, r.renormalize, r.scoring, ng, tg, b, r.scale,
                                 torch.cuda.current_stream().cuda_stream, None)
    check_routing(r, (w, ids), route_ref(r, g, b), what=f"{r.name} M={M}")
    monkeypatch.setenv("SWAPMOE_ROUTER_KERNEL", "warp")
    assert router_kernel_of(r, g, b).startswith("swapmoe_route_topk_p")
    w_warp, ids_warp = route(r, g, b)
    torch.cuda.synchronize()
    assert torch.equal(ids, ids_warp)
    assert torch.equal(w, w_warp), f"{r.name} M={M}: CTA and warp router weights differ"


@pytest.mark.gpu
@pytest.mark.parametrize("r", CTA_ROUTERS[:3], ids=lambda r: r.name)
def test_cta_router_ties_and_nan_match_the_warp_router(r, rng, monkeypatch):
    """Coarse logits (exact ties between experts and between groups) in the first half of
    the rows, -inf and NaN: the CTA router picks what the warp router picks, bit for bit,
    and NaN is picked first with a NaN weight. The second half holds well-separated rows
    (draw_logits), checked against the float64 reference too; tied rows are not, because
    with a bias, sums of scores that tie in real numbers can round apart in float32."""
    M, half = 96, 48
    bias = draw_bias(rng, r)
    logits = draw_logits(rng, r, M, bias)
    logits[:half] = rng.integers(-2, 3, size=(half, r.E)).astype(np.float32)
    logits[5, 3] = np.nan
    logits[6, :] = np.nan
    logits[7, :] = -np.inf
    logits[8, : r.E // 2] = -np.inf
    g, b = cuda_routing(r, logits, bias, "float32")
    monkeypatch.setenv("SWAPMOE_ROUTER_KERNEL", "cta")
    assert router_kernel_of(r, g, b) == "swapmoe_route_grouped_cta"
    w, ids = route(r, g, b)
    monkeypatch.setenv("SWAPMOE_ROUTER_KERNEL", "warp")
    w_warp, ids_warp = route(r, g, b)
    torch.cuda.synchronize()
    assert torch.equal(ids, ids_warp)
    assert torch.equal(w.isnan(), w_warp.isnan())
    assert torch.equal(torch.nan_to_num(w), torch.nan_to_num(w_warp))
    assert ids[5, 0].item() == 3 and math.isnan(w[5, 0].item())
    check_routing(r, (w[half:], ids[half:]), route_ref(r, g[half:], b), what=f"{r.name} separated rows")


@pytest.mark.gpu
def test_router_kernel_env_rejects_other_values(rng, monkeypatch):
    r = BY_NAME["deepseek_v3"]
    g = torch.zeros(2, r.E, device=DEV)
    monkeypatch.setenv("SWAPMOE_ROUTER_KERNEL", "fast")
    with pytest.raises(swapmoe.ArgumentError, match="SWAPMOE_ROUTER_KERNEL.*'auto', 'warp' or 'cta'.*\"fast\""):
        route(r, g, torch.zeros(r.E, device=DEV))


@pytest.mark.gpu
def test_cuda_noncontiguous_logits(rng):
    r = BY_NAME["deepseek_v3"]
    bias = draw_bias(rng, r)
    logits = draw_logits(rng, r, 33, bias)
    buf = torch.full((33, r.E + 24), math.nan, dtype=torch.bfloat16, device=DEV)
    view = buf[:, 8 : 8 + r.E]
    view.copy_(torch.from_numpy(logits).to(DEV, torch.bfloat16))
    b = torch.from_numpy(bias).to(DEV)
    check_routing(r, route(r, view, b), route_ref(r, view, b))


@pytest.mark.gpu
def test_cuda_m0():
    r = BY_NAME["qwen3"]
    w, ids = route(r, torch.empty(0, r.E, device=DEV))
    assert tuple(w.shape) == (0, r.topk) and tuple(ids.shape) == (0, r.topk)
    assert w.device.type == "cuda" and ids.dtype == torch.int32


@pytest.mark.gpu
def test_cuda_runs_on_current_stream(rng):
    """Logits written on a side stream (after a long sleep) are routed on that stream:
    the router sees the new values."""
    r = BY_NAME["deepseek_v3"]
    bias = draw_bias(rng, r)
    logits = draw_logits(rng, r, 64, bias)
    g = torch.zeros(64, r.E, device=DEV)
    src = torch.from_numpy(logits).to(DEV)
    b = torch.from_numpy(bias).to(DEV)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # warm-up: module loads and first allocations for this stream
        torch.cuda._sleep(1000)
        route(r, g, b)  # may synchronize the device, which would hide the race
    side.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of device time
        g.copy_(src)
        w, ids = route(r, g, b)
    assert not side.query(), "the side stream finished before the router was queued: lengthen the sleep"
    side.synchronize()
    check_routing(r, (w, ids), route_ref(r, logits, bias))


# --------------------------------------------------------------------------- fused_moe


@pytest.mark.gpu
@pytest.mark.parametrize("ep", [False, True], ids=["no_map", "ep"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("r", VARIANTS, ids=VARIANT_IDS)
def test_fused_moe_cuda_matches_reference(r, dtype, ep, rng):
    prob = moe_problem(rng, r, 24, ep)
    inp = moe_inputs(prob, "torch", dtype, device=DEV)
    ref = moe_ref(r, inp)
    assert np.linalg.norm(ref) > 0
    out = moe_call(r, inp)
    assert out.device == inp["x"].device
    torch.cuda.synchronize()
    check_close(out, ref, dtype, what=f"{r.name} {dtype} ep={ep}")


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 64, 300])
@pytest.mark.parametrize("r", [BY_NAME["deepseek_v3"], BY_NAME["mixtral"], BY_NAME["llama4"]], ids=lambda r: r.name)
def test_fused_moe_cuda_token_counts(r, M, rng):
    inp = moe_inputs(moe_problem(rng, r, M, ep=False), "torch", "bfloat16", "float32", device=DEV)
    out = moe_call(r, inp)
    torch.cuda.synchronize()
    check_close(out, moe_ref(r, inp), "bfloat16", what=f"{r.name} M={M}")


@pytest.mark.gpu
def test_fused_moe_cuda_llama4_router_weight_on_input(rng):
    r = BY_NAME["llama4"]
    inp = moe_inputs(moe_problem(rng, r, 40, ep=False), "torch", "bfloat16", device=DEV)
    out = moe_call(r, inp, apply_router_weight_on_input=True)
    torch.cuda.synchronize()
    check_close(out, moe_ref(r, inp, apply_router_weight_on_input=True), "bfloat16")


@pytest.mark.gpu
def test_fused_moe_cuda_matches_cpu(rng):
    r = BY_NAME["deepseek_v3"]
    prob = moe_problem(rng, r, 48, ep=True)
    gpu = moe_call(r, moe_inputs(prob, "torch", "float32", device=DEV)).cpu()
    cpu = moe_call(r, moe_inputs(prob, "torch", "float32"))
    assert rel_error(to_f64(gpu), to_f64(cpu)) <= TOLERANCE["float32"]


# --------------------------------------------------------------------------- ties, -inf, NaN


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("r", VARIANTS, ids=VARIANT_IDS)
def test_cuda_all_equal_logits_pick_lowest_indices(r, dtype, rng):
    value = float(rng.choice(LOGIT_GRID))
    bias = np.zeros(r.E, np.float32) if r.bias else None
    g, b = cuda_routing(r, np.full((70, r.E), value, np.float32), bias, dtype)
    w, ids = route(r, g, b)
    assert (ids.cpu().numpy() == np.arange(r.topk)).all()
    check_routing(r, (w, ids), route_ref(r, g, b))


@pytest.mark.gpu
def test_cuda_partial_and_group_ties():
    r = Router("ties", 8, 5)
    logits = torch.tensor([[1, 3, 3, 0, 3, 2, 2, -1], [0, 0, 0, 0, 5, 0, 0, 5]], dtype=torch.float32, device=DEV)
    assert route(r, logits)[1].tolist() == [[1, 2, 4, 5, 6], [4, 7, 0, 1, 2]]
    rg = Router("group_ties", 8, 2, "sigmoid", groups=(4, 1))
    logits = torch.tensor([[0, 1, 2, 0, 0, 1, 0, 2]], dtype=torch.float32, device=DEV)
    assert route(rg, logits)[1].tolist() == [[2, 3]]
    rb = Router("group_ties_bias", 8, 2, "sigmoid", groups=(4, 1), bias=True)
    bias = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 0.0, 0.0], device=DEV)
    assert route(rb, torch.zeros(1, 8, device=DEV), bias)[1].tolist() == [[0, 1]]
    # sum of the two best with a bias, max without
    logits = torch.tensor([[3.0, -9.0, -9.0, -9.0, 1.0, 1.0, -9.0, -9.0]], device=DEV)
    r2 = Router("g", 8, 2, "sigmoid", groups=(2, 1))
    assert route(r2, logits)[1].tolist() == [[0, 1]]
    assert route(r2, logits, torch.zeros(8, device=DEV))[1].tolist() == [[4, 5]]


@pytest.mark.gpu
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_cuda_neg_inf(scoring, renormalize, rng):
    r = Router("needed", 64, 3, scoring, renormalize=renormalize)
    logits = np.full((4, 64), -np.inf, np.float32)
    logits[0, 37] = 0.5  # one finite expert: it, then the lowest -inf ones with weight 0
    logits[1] = draw_logits(rng, r, 1)[0]
    logits[1, ::2] = -np.inf  # half -inf: never picked
    # row 2 stays all -inf
    logits[3] = draw_logits(rng, r, 1)[0]
    g = torch.from_numpy(logits).to(DEV)
    w, ids = route(r, g)
    check_routing(r, (w, ids), route_ref(r, logits))
    w, ids = w.cpu().numpy(), ids.cpu().numpy()
    assert ids[0].tolist() == [37, 0, 1] and (w[0, 1:] == 0).all()
    assert (ids[1] % 2 == 1).all()
    assert ids[2].tolist() == [0, 1, 2]
    if scoring == "softmax" or renormalize:
        assert np.isnan(w[2]).all()  # no distribution (softmax) or 0/0 (renormalize)
    else:
        assert (w[2] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("r", [v for v in VARIANTS if v.scoring == "sigmoid"], ids=lambda v: v.name)
def test_cuda_sigmoid_nan_is_picked_first(r, dtype, rng):
    M, t = 40, 17
    prob = moe_problem(rng, r, M, ep=False)
    j = int(rng.integers(r.E))
    prob["logits"][t, j] = np.nan
    inp = moe_inputs(prob, "torch", dtype, device=DEV)
    w, ids = route(r, inp["logits"], inp["bias"])
    check_routing(r, (w, ids), route_ref(r, inp["logits"], inp["bias"]))
    w, ids = to_f64(w), ids.cpu().numpy()
    assert ids[t, 0] == j and np.isnan(w[t, 0])
    assert np.isfinite(np.delete(w, t, axis=0)).all()
    out = to_f64(moe_call(r, inp))
    assert np.isnan(out[t]).all(), "a NaN router logit must reach the output row"
    keep = np.arange(M) != t
    assert np.isfinite(out[keep]).all()
    assert rel_error(out[keep], moe_ref(r, inp)[keep]) <= TOLERANCE[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("r", [v for v in VARIANTS if v.scoring == "softmax"], ids=lambda v: v.name)
def test_cuda_softmax_nan_poisons_the_row(r, rng):
    M, t = 9, 4
    prob = moe_problem(rng, r, M, ep=False)
    prob["logits"][t, int(rng.integers(r.E))] = np.nan
    inp = moe_inputs(prob, "torch", "bfloat16", device=DEV)
    w, ids = route(r, inp["logits"])
    check_routing(r, (w, ids), route_ref(r, inp["logits"]))
    assert torch.isnan(w[t]).all() and ids[t].tolist() == list(range(r.topk))
    out = moe_call(r, inp).float()
    assert torch.isnan(out[t]).all()
    assert torch.isfinite(torch.cat([out[:t], out[t + 1 :]])).all()


# --------------------------------------------------------------------------- errors


@pytest.mark.gpu
def test_cuda_too_many_experts():
    g = torch.zeros(2, 1025, device=DEV)
    with pytest.raises(swapmoe.ShapeError, match=r"^gating_output: .*1024"):
        swapmoe.select_experts(g, 2)
    # the CPU router has no such limit
    w, ids = swapmoe.select_experts(g.cpu(), 2)
    assert ids.tolist() == [[0, 1], [0, 1]]


@pytest.mark.gpu
def test_cuda_topk_limit():
    g = torch.zeros(2, 64, device=DEV)
    with pytest.raises(swapmoe.ArgumentError, match=r"^topk"):
        swapmoe.select_experts(g, 33)


@pytest.mark.gpu
def test_cuda_bias_on_other_device():
    g = torch.zeros(2, 16, device=DEV)
    with pytest.raises(swapmoe.DeviceError, match=r"^e_score_correction_bias"):
        swapmoe.select_experts(g, 2, scoring="sigmoid", e_score_correction_bias=torch.zeros(16))


@pytest.mark.gpu
def test_cuda_fused_moe_logits_on_cpu(rng):
    r = BY_NAME["mixtral"]
    inp = moe_inputs(moe_problem(rng, r, 4, ep=False), "torch", "bfloat16", device=DEV)
    inp["logits"] = inp["logits"].cpu()
    with pytest.raises(swapmoe.DeviceError, match="gating_output: expected device cuda"):
        moe_call(r, inp)


# --------------------------------------------------------------------------- graphs, compile


@pytest.mark.gpu
@pytest.mark.parametrize("M", [4, 100])
@pytest.mark.parametrize("r", [BY_NAME["deepseek_v3"], BY_NAME["qwen3"], BY_NAME["llama4"]], ids=lambda r: r.name)
def test_cuda_graph_fused_moe(r, M, rng):
    """fused_moe (routing included) captured in a CUDA graph; replays route new logits
    copied into the captured input."""
    prob = moe_problem(rng, r, M, ep=True)
    inp = moe_inputs(prob, "torch", "bfloat16", "float32", device=DEV)
    assert swapmoe.warmup(0) > 0
    eager = moe_call(r, inp)  # one eager call before capture
    torch.cuda.synchronize()
    check_close(eager, moe_ref(r, inp), "bfloat16")

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe_call(r, inp)
    for _ in range(2):
        fresh = draw_logits(rng, r, M, prob["bias"])
        inp["logits"].copy_(torch.from_numpy(fresh))
        inp["x"].copy_(torch.from_numpy(rng.standard_normal((M, K_HID), dtype=np.float32)))
        captured.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check_close(captured, moe_ref(r, inp), "bfloat16", what="graph replay")


@pytest.mark.gpu
def test_cuda_graph_select_experts(rng):
    r = BY_NAME["deepseek_v3"]
    bias = draw_bias(rng, r)
    g, b = cuda_routing(r, draw_logits(rng, r, 16, bias), bias, "bfloat16")
    swapmoe.warmup(0)
    route(r, g, b)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w, ids = route(r, g, b)
    fresh = draw_logits(rng, r, 16, bias)
    g.copy_(torch.from_numpy(fresh))
    w.fill_(math.nan)
    ids.fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    check_routing(r, (w, ids), route_ref(r, fresh, bias))


@pytest.mark.gpu
def test_cuda_compile_fullgraph_fused_moe(rng):
    torch._dynamo.reset()
    r = BY_NAME["deepseek_v3"]
    inp = moe_inputs(moe_problem(rng, r, 24, ep=True), "torch", "bfloat16", "float32", device=DEV)

    def f(x, w1, w2, logits, bias, emap):
        y = swapmoe.fused_moe(
            x, w1, w2, logits, 8, renormalize=True, scoring="sigmoid", num_expert_group=8, topk_group=4,
            e_score_correction_bias=bias, routed_scaling_factor=2.5, expert_map=emap,
        )
        return y * 2

    args = (inp["x"], inp["w1"], inp["w2"], inp["logits"], inp["bias"], inp["emap"])
    eager = f(*args)
    got = torch.compile(f, fullgraph=True)(*args)
    torch.cuda.synchronize()
    assert torch.equal(got, eager)
    check_close(eager / 2, moe_ref(r, inp), "bfloat16")
