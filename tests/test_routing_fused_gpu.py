"""fused_moe's router placement on CUDA (issue 3): by default the router kernel runs first
(measured fastest); with $SWAPMOE_ROUTER_FUSION=on the decode GEMM1 routes for itself and
the align kernel routes. Both against ``select_experts`` + ``fused_experts`` on the same
backend (bitwise: the same router code and the same expert kernels) and against the float64
reference, with expert_map -1 entries, the placement the oracle reports and CUDA-graph
capture. Every test is marked ``gpu`` and skipped when torch sees no CUDA device."""

from __future__ import annotations

import math

import numpy as np
import pytest

import swapmoe
from conftest import chain_after_long_call, check_close, has_cuda, queued_ahead_of_the_gpu, reference, torch
from test_routing import VARIANTS, Router, draw_logits, moe_call, moe_inputs, moe_problem, moe_ref, route

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

DEV = "cuda"

# Routers whose groups do not line up with the router's lanes (the general group path), and
# one wider than the fused router holds (E > 256: always a separate kernel).
EXTRA = [
    Router("groups_across_lanes", 48, 4, groups=(16, 5)),
    Router("groups_odd_bias", 100, 6, "sigmoid", groups=(4, 2), bias=True, scale=1.5),
    Router("wide_e512", 512, 8, "sigmoid", groups=(8, 4), bias=True, scale=2.5),
]
ROUTERS = VARIANTS + EXTRA
FUSED_MAX_E = 256

# (backend, token counts): the routing twins cover decode M <= 8 and align M <= 16.
CASES = [("cuda_decode", m) for m in (1, 3, 8, 9)] + [
    (b, m) for b in ("cuda_generic", "cuda_mma") for m in (1, 16, 17, 33, 130)
] + [("cuda_wgmma", m) for m in (40, 128)]


@pytest.fixture(autouse=True)
def _cuda_sync():
    yield
    if has_cuda():
        torch.cuda.synchronize()


def expected_placement(r: Router, backend: str, M: int, fusion: str) -> str:
    if fusion == "off" or r.E > FUSED_MAX_E:
        return "separate"
    if backend == "cuda_decode":
        return "in_decode_gemm1" if M <= 8 else "separate"
    return "in_align" if M <= 16 else "separate"


def separate_call(r: Router, inp: dict):
    w, ids = route(r, inp["logits"], inp["bias"])
    return swapmoe.fused_experts(inp["x"], inp["w1"], inp["w2"], w, ids, expert_map=inp["emap"])


def placement(r: Router, inp: dict) -> dict:
    w, ids = route(r, inp["logits"], inp["bias"])
    return swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], w, ids, expert_map=inp["emap"],
                                       fused_moe=True, scoring=r.scoring,
                                       num_expert_group=None if r.groups is None else r.groups[0])


def expected_router_kernel(r: Router, M: int) -> str:
    """The separate router kernel: the grouped CTA router for grouped sigmoid routing with
    power-of-two groups of <= 32 experts and E <= 256 (at any M), else a warp router."""
    if r.scoring == "sigmoid" and r.groups is not None and r.groups[0] > 1 and r.E <= 256:
        gs = r.E // r.groups[0]
        if gs & (gs - 1) == 0 and gs <= 32:
            return "swapmoe_route_grouped_cta"
    return "swapmoe_route_topk_p"


@pytest.mark.parametrize("fusion", ["off", "on"])
@pytest.mark.parametrize("backend,M", CASES, ids=[f"{b}-{m}" for b, m in CASES])
@pytest.mark.parametrize("r", ROUTERS, ids=lambda r: r.name)
def test_fused_moe_matches_separate_calls(r, backend, M, fusion, rng, monkeypatch):
    if backend == "cuda_decode" and M * r.topk > 512:
        pytest.skip("decode takes M * topk <= 512")
    monkeypatch.setenv("SWAPMOE_BACKEND", backend)
    if fusion == "on":
        monkeypatch.setenv("SWAPMOE_ROUTER_FUSION", "on")
    ep = M % 2 == 1  # odd M: expert_map with -1 entries
    dtype = "float32" if backend == "cuda_generic" and M == 17 else "bfloat16"
    if backend == "cuda_mma" and dtype == "float32":
        dtype = "bfloat16"
    inp = moe_inputs(moe_problem(rng, r, M, ep), "torch", dtype, "float32", device=DEV)
    plan = placement(r, inp)
    assert plan["backend"] == backend
    assert plan["router"] == expected_placement(r, backend, M, fusion), plan["reasons"]
    assert any(s.startswith("router:") for s in plan["reasons"])
    if plan["router"] == "separate":
        assert plan["kernels"][0].startswith(expected_router_kernel(r, M)), plan["kernels"]
    else:
        assert "routed" in plan["kernels"][0]
    fused = moe_call(r, inp)
    sep = separate_call(r, inp)
    torch.cuda.synchronize()
    assert torch.equal(fused, sep), f"{r.name} {backend} M={M}: fused routing differs from separate"
    check_close(fused, moe_ref(r, inp), dtype, what=f"{r.name} {backend} M={M}")


@pytest.mark.parametrize("backend,M", [("cuda_decode", 4), ("cuda_mma", 12), ("cuda_generic", 6)])
def test_router_fusion_on_and_off_give_the_same_output(backend, M, rng, monkeypatch):
    r = next(v for v in VARIANTS if v.name == "deepseek_v3")
    monkeypatch.setenv("SWAPMOE_BACKEND", backend)
    inp = moe_inputs(moe_problem(rng, r, M, ep=True), "torch", "bfloat16", "float32", device=DEV)
    plan = placement(r, inp)
    assert plan["router"] == "separate" and any("measured faster" in s for s in plan["reasons"])
    sep = moe_call(r, inp)
    monkeypatch.setenv("SWAPMOE_ROUTER_FUSION", "on")
    assert placement(r, inp)["router"] != "separate"
    fused = moe_call(r, inp)
    torch.cuda.synchronize()
    assert torch.equal(fused, sep)


@pytest.mark.parametrize("variable,value", [("SWAPMOE_ROUTER_FUSION", "maybe"), ("SWAPMOE_FIRST_KERNEL_PDL", "sometimes")])
def test_launch_env_rejects_other_values(variable, value, rng, monkeypatch):
    r = VARIANTS[0]
    inp = moe_inputs(moe_problem(rng, r, 2, ep=False), "torch", "bfloat16", device=DEV)
    monkeypatch.setenv(variable, value)
    with pytest.raises(swapmoe.ArgumentError, match=f'{variable}.*"{value}"'):
        moe_call(r, inp)


@pytest.mark.parametrize("fusion", ["off", "on"])
@pytest.mark.parametrize("backend,M", [("cuda_decode", 2), ("cuda_mma", 24)])
def test_fused_moe_writes_every_output(backend, M, fusion, rng, monkeypatch):
    """Every output element is written (out poisoned with NaN first)."""
    r = next(v for v in VARIANTS if v.name == "qwen3")
    monkeypatch.setenv("SWAPMOE_BACKEND", backend)
    monkeypatch.setenv("SWAPMOE_ROUTER_FUSION", fusion)
    inp = moe_inputs(moe_problem(rng, r, M, ep=False), "torch", "bfloat16", device=DEV)
    out = torch.full_like(inp["x"], math.nan)
    got = moe_call(r, inp, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    check_close(out, moe_ref(r, inp), "bfloat16")


@pytest.mark.parametrize("fusion", ["off", "on"])
@pytest.mark.parametrize("backend,M", [("cuda_decode", 1), ("cuda_decode", 8), ("cuda_mma", 16), ("cuda_wgmma", 64)])
def test_cuda_graph_fused_moe_placements(backend, M, fusion, rng, monkeypatch):
    """fused_moe captured in a CUDA graph, router kernel or routing twin; replays route
    fresh logits."""
    r = next(v for v in VARIANTS if v.name == "deepseek_v3")
    monkeypatch.setenv("SWAPMOE_BACKEND", backend)
    monkeypatch.setenv("SWAPMOE_ROUTER_FUSION", fusion)
    prob = moe_problem(rng, r, M, ep=True)
    inp = moe_inputs(prob, "torch", "bfloat16", "float32", device=DEV)
    # fusion on: the twins route up to M = 16 (the align kernel) or M = 8 (decode GEMM1)
    assert (placement(r, inp)["router"] == "separate") == (fusion == "off" or M > 16)
    swapmoe.warmup(0)
    moe_call(r, inp)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe_call(r, inp)
    for _ in range(2):
        inp["logits"].copy_(torch.from_numpy(draw_logits(rng, r, M, prob["bias"])))
        inp["x"].copy_(torch.from_numpy(rng.standard_normal(tuple(inp["x"].shape), dtype=np.float32)))
        captured.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check_close(captured, moe_ref(r, inp), "bfloat16", what="graph replay")


def separate_eager_and_graph(r: Router, inp: dict):
    """(select_experts + fused_experts, fused_moe eagerly, fused_moe captured in a CUDA graph
    and replayed), synchronized."""
    experts = separate_call(r, inp)
    moe = moe_call(r, inp)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe_call(r, inp)
    graph.replay()
    torch.cuda.synchronize()
    return experts, moe, captured.clone()


BACKENDS_FIRST_PDL = [("cuda_decode", 3), ("cuda_wgmma_swap", 5), ("cuda_wgmma", 40), ("cuda_mma", 17),
                      ("cuda_generic", 2), ("cuda_bulk_decode", 2)]


@pytest.mark.parametrize("backend,M", BACKENDS_FIRST_PDL, ids=[f"{b}-{m}" for b, m in BACKENDS_FIRST_PDL])
def test_first_kernel_without_pdl_gives_the_same_output(backend, M, rng, monkeypatch):
    """$SWAPMOE_FIRST_KERNEL_PDL=off launches the op's first kernel (fused_experts' first, or
    fused_moe's router) without programmatic dependent launch: bitwise the same results, on
    every backend, in eager calls and in a CUDA graph."""
    r = next(v for v in VARIANTS if v.name == "deepseek_v3")
    monkeypatch.setenv("SWAPMOE_BACKEND", backend)
    inp = moe_inputs(moe_problem(rng, r, M, ep=True), "torch", "bfloat16", "float32", device=DEV)
    w, ids = route(r, inp["logits"], inp["bias"])
    runs = {}
    for mode in ("on", "off"):
        monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", mode)
        plan = swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], w, ids, expert_map=inp["emap"])
        assert plan["backend"] == backend
        assert any(s.startswith(f"override: $SWAPMOE_FIRST_KERNEL_PDL={mode}") for s in plan["reasons"])
        runs[mode] = separate_eager_and_graph(r, inp)
    for a, b in zip(runs["on"], runs["off"]):
        assert torch.equal(a, b), f"{backend} M={M}: the first kernel's launch mode changed the result"
    check_close(runs["off"][1], moe_ref(r, inp), "bfloat16", what=f"{backend} M={M}")


@pytest.mark.parametrize("backend,M", BACKENDS_FIRST_PDL, ids=[f"{b}-{m}" for b, m in BACKENDS_FIRST_PDL])
def test_back_to_back_fused_moe_calls_feed_each_other(backend, M, rng, monkeypatch):
    """Three fused_moe calls queued with no sync between them (and ahead of the GPU, so that
    they run back to back), each on the previous one's output (NaN until written) and its own
    logits, the router launched with PDL: a router or first kernel that rewrites the routing
    and workspace blocks the previous call's last kernel still reads, or reads its input
    before its griddepcontrol.wait, corrupts an output. (The test above compares PDL on and
    off on one call, which no such race can change.)"""
    if backend in ("cuda_wgmma_swap", "cuda_wgmma", "cuda_bulk_decode") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"{backend} runs on sm_90 only")
    r = next(v for v in VARIANTS if v.name == "deepseek_v3")
    monkeypatch.setenv("SWAPMOE_BACKEND", backend)
    monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", "on")
    prob = moe_problem(rng, r, M, ep=True)
    inp = moe_inputs(prob, "torch", "bfloat16", "float32", device=DEV)
    logits = [torch.from_numpy(draw_logits(rng, r, M, prob["bias"])).to(DEV) for _ in range(3)]
    outs = [torch.full_like(inp["x"], math.nan) for _ in range(3)]
    moe_call(r, dict(inp, logits=logits[0]), out=torch.full_like(inp["x"], math.nan))  # warm-up
    xs = [inp["x"]]
    with queued_ahead_of_the_gpu():  # nothing but the three calls between them on the stream
        for g, out in zip(logits, outs):
            xs.append(moe_call(r, dict(inp, x=xs[-1], logits=g), out=out))
    for i in range(3):
        ref = moe_ref(r, dict(inp, x=xs[i], logits=logits[i]))
        assert np.linalg.norm(ref) > 0, f"call {i + 1}: degenerate chain (zero reference)"
        check_close(xs[i + 1], ref, "bfloat16", what=f"call {i + 1} of 3, {backend} M={M}")


@pytest.mark.parametrize("backend,M", BACKENDS_FIRST_PDL, ids=[f"{b}-{m}" for b, m in BACKENDS_FIRST_PDL])
def test_fused_moe_waits_for_a_long_predecessor(backend, M, rng, monkeypatch):
    """fused_moe queued right after a long call that lets its dependents start early and
    writes this call's input at its end (conftest.chain_after_long_call), router with PDL: a
    router or GEMM kernel that reads x, or rewrites a workspace block the long call still
    reads, before its griddepcontrol.wait fails here. Both outputs against their references."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the long call runs on cuda_wgmma_swap, sm_90 only")
    r = next(v for v in VARIANTS if v.name == "deepseek_v3")
    monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", "on")
    inp = moe_inputs(moe_problem(rng, r, M, ep=True), "torch", "bfloat16", "float32", device=DEV)

    def step(s, o):  # SWAPMOE_BACKEND would move the long call too
        return moe_call(r, s, out=o, backend=backend)

    long_inp, long_case, long_out, out = chain_after_long_call(inp, step, rng)
    check_close(long_out, reference(long_inp, long_case), "bfloat16", what="the long call")
    check_close(out, moe_ref(r, dict(inp, x=long_out)), "bfloat16", what=f"{backend} M={M} after the long call")


@pytest.mark.parametrize("name,M", [("deepseek_v3", 1), ("deepseek_v3", 8), ("qwen3", 1)])
def test_router_starts_with_pdl_before_a_one_wave_swap_gemm1(name, M, rng, monkeypatch):
    """Where the swap-AB GEMM1 fits one wave, fused_experts starts it without PDL, but
    fused_moe still starts its router kernel with PDL (GEMM1 follows the router by PDL either
    way; benches/NOTES.md "Router PDL before a one-wave GEMM1"): the plan says so, and the
    result is bitwise that of select_experts + fused_experts, eagerly and in a CUDA graph."""
    r = next(v for v in VARIANTS if v.name == name)
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma_swap")
    inp = moe_inputs(moe_problem(rng, r, M, ep=False), "torch", "bfloat16", "float32", device=DEV)
    w, ids = route(r, inp["logits"], inp["bias"])
    experts_plan = swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], w, ids)
    moe_plan = placement(r, inp)
    assert experts_plan["backend"] == moe_plan["backend"] == "cuda_wgmma_swap"
    assert experts_plan["first_kernel_pdl"] is False, experts_plan["reasons"]
    assert moe_plan["first_kernel_pdl"] is True and moe_plan["router"] == "separate", moe_plan["reasons"]
    assert any(s.startswith("router: launched with PDL although") for s in moe_plan["reasons"])
    sep, moe, captured = separate_eager_and_graph(r, inp)
    assert torch.equal(moe, sep) and torch.equal(captured, sep)
    check_close(moe, moe_ref(r, inp), "bfloat16", what=f"{name} M={M}")
