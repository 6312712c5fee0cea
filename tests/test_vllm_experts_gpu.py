"""The body of the vLLM experts class (swapmoe.vllm_experts) on CUDA, with tensors and
workspaces laid out as vLLM's modular kernel gives them. Needs no vLLM: the GPU machine
has none, so this is how the plugin's GPU side is tested (tests/test_vllm_plugin.py runs
the class itself against a real vLLM on the CPU)."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import (  # noqa: E402
    FP8_TOLERANCE,
    Case,
    check_fp8_close,
    fp8_reference,
    make_fp8_problem,
    same_bits,
    seed_for,
    snapshot,
    to_fp8_inputs,
)
from swapmoe import reference, vllm_experts  # noqa: E402
from swapmoe.reference import rel_error_with_flips  # noqa: E402

pytestmark = pytest.mark.gpu

needs_sm89 = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)),
    reason="FP8 needs compute capability >= 8.9",
)

# bf16 inputs, fp32 accumulation: the error vs float64 is the bf16 rounding of the
# intermediate and the output (2^-8 relative each), averaged over the rows.
TOL = {torch.bfloat16: 1.6e-2, torch.float16: 4e-3}


def vllm_buffers(M, N2, K, topk, E, dtype, device="cuda"):
    """vLLM's _allocate_buffers with one chunk: workspace13 and the output share storage,
    workspace2 comes from the workspace manager at a 256-byte-aligned offset."""
    ws13_shape, ws2_shape, out_shape = vllm_experts.workspace_shapes(M, N2, K, topk, E, torch.tensor([], dtype=dtype).element_size())
    n13 = max(int(np.prod(ws13_shape)), int(np.prod(out_shape)))
    common = torch.full((n13,), float("nan"), dtype=dtype, device=device)
    pool = torch.full((int(np.prod(ws2_shape)) + 4096,), float("nan"), dtype=dtype, device=device)
    # The manager's second buffer starts after the first one, rounded to 256 bytes.
    offset = 256 // pool.element_size() * 3
    workspace2 = pool[offset : offset + int(np.prod(ws2_shape))].view(ws2_shape)
    return common[: int(np.prod(out_shape))].view(out_shape), common[: int(np.prod(ws13_shape))].view(ws13_shape), workspace2


def make_case(rng, M, K, N, topk, global_E, E, with_map, on_input):
    emap = None
    if with_map:
        emap = -np.ones(global_E, dtype=np.int32)
        emap[rng.choice(global_E, E, replace=False)] = np.arange(E, dtype=np.int32)
    x = rng.standard_normal((M, K))
    w1 = rng.standard_normal((E, 2 * N, K)) / np.sqrt(K)
    w2 = rng.standard_normal((E, K, N)) / np.sqrt(N)
    ids = np.stack([rng.choice(global_E, topk, replace=False) for _ in range(M)]).astype(np.int32)
    # Ragged experts: a few hot experts take most slots, many get none.
    hot = rng.random((M, topk)) < 0.5
    ids[hot] = ids[hot] % 3
    for row in ids:  # keep ids unique per row
        seen = set()
        for j, v in enumerate(row):
            while int(v) in seen:
                v = (int(v) + 1) % global_E
            row[j] = v
            seen.add(int(v))
    tw = rng.random((M, topk)).astype(np.float32)
    return x, w1, w2, ids, tw, emap


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [1, 2, 5, 17, 64, 300])
@pytest.mark.parametrize("with_map", [False, True])
def test_apply_on_cuda_matches_float64_reference(dtype, M, with_map):
    on_input = M in (1, 17)  # vLLM's apply_router_weight_on_input needs topk == 1
    topk = 1 if on_input else 4
    rng = np.random.default_rng(M * 10 + with_map)
    K, N, global_E = 256, 192, 24
    E = 16 if with_map else global_E
    x, w1, w2, ids, tw, emap = make_case(rng, M, K, N, topk, global_E, E, with_map, on_input)
    x_in = x * tw[:, :1] if on_input else x  # vLLM's prepare step applies the weight first
    dev = "cuda"
    t = lambda a, dt=dtype: torch.from_numpy(np.ascontiguousarray(a)).to(device=dev, dtype=dt)  # noqa: E731
    xt, w1t, w2t = t(x_in), t(w1), t(w2)
    ref = reference.fused_experts_ref(
        xt.double().cpu().numpy(), w1t.double().cpu().numpy(), w2t.double().cpu().numpy(),
        np.ones_like(tw) if on_input else tw, ids, global_num_experts=global_E, expert_map=emap)
    output, ws13, ws2 = vllm_buffers(M, 2 * N, K, topk, E, dtype)
    vllm_experts.run(output, xt, w1t, w2t, t(tw, torch.float32), t(ids, torch.int32), "silu",
                     global_E, None if emap is None else t(emap, torch.int32), ws2, on_input)
    torch.cuda.synchronize()
    out = output.double().cpu().numpy()
    assert np.isfinite(out).all()
    err = reference.rel_error(out, ref)
    assert err < TOL[dtype], err


def test_apply_is_captured_in_a_cuda_graph():
    rng = np.random.default_rng(7)
    M, K, N, topk, E = 4, 256, 128, 2, 8
    x, w1, w2, ids, tw, _ = make_case(rng, M, K, N, topk, E, E, False, False)
    t = lambda a, dt=torch.bfloat16: torch.from_numpy(np.ascontiguousarray(a)).to(device="cuda", dtype=dt)  # noqa: E731
    xt, w1t, w2t, twt, idt = t(x), t(w1), t(w2), t(tw, torch.float32), t(ids, torch.int32)
    output, ws13, ws2 = vllm_buffers(M, 2 * N, K, topk, E, torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up outside the graph, as vLLM does
        vllm_experts.run(output, xt, w1t, w2t, twt, idt, "silu", E, None, ws2, False)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        vllm_experts.run(output, xt, w1t, w2t, twt, idt, "silu", E, None, ws2, False)
    output.fill_(float("nan"))
    # New inputs in the same buffers, then replay.
    x2 = rng.standard_normal((M, K))
    xt.copy_(t(x2))
    graph.replay()
    torch.cuda.synchronize()
    ref = reference.fused_experts_ref(xt.double().cpu().numpy(), w1t.double().cpu().numpy(),
                                      w2t.double().cpu().numpy(), tw, ids)
    assert reference.rel_error(output.double().cpu().numpy(), ref) < TOL[torch.bfloat16]


def test_short_workspace_raises_typed_error():
    import swapmoe

    dtype = torch.bfloat16
    M, K, N, topk, E = 8, 256, 128, 2, 8
    x = torch.randn(M, K, device="cuda", dtype=dtype)
    w1 = torch.randn(E, 2 * N, K, device="cuda", dtype=dtype)
    w2 = torch.randn(E, K, N, device="cuda", dtype=dtype)
    ids = torch.zeros(M, topk, device="cuda", dtype=torch.int32)
    ids[:, 1] = 1
    tw = torch.ones(M, topk, device="cuda")
    out = torch.empty(M, K, device="cuda", dtype=dtype)
    with pytest.raises(swapmoe.ArgumentError, match="workspace2"):
        vllm_experts.run(out, x, w1, w2, tw, ids, "silu", E, None, torch.empty(16, device="cuda", dtype=dtype), False)


# --------------------------------------------------------------------------- FP8 (run_fp8)

# The quant name the experts class passes (vllm_plugin.quant_of_config), per scheme.
FP8_QUANT = {"tensor": "fp8_tensor", "channel": "fp8_channel", "block": "fp8_block128"}

# (scheme, static activation scales): vLLM's (weight, activation) keys that map to swapmoe
# (vllm_plugin._fp8_key_schemes): per tensor with static or dynamic activation scales, per
# channel with per-token activations, 128x128 blocks with per-token 128-column groups.
FP8_VLLM_SCHEMES = {
    "tensor-static": ("tensor", True),
    "tensor-dynamic": ("tensor", False),
    "channel": ("channel", False),
    "block128": ("block", False),
}

# Routing as vLLM hands it to the experts. "ep": an expert_map [2E+1] with -1 entries and ids
# drawn over every global expert (so some slots are on other ranks). on_input: vLLM's prepare
# step has already scaled the input by the router weight (topk == 1).
FP8_ROUTINGS = {
    "topk4": dict(E=16, topk=4, ids="concentrated"),
    "topk4-ep-gelu": dict(E=8, topk=4, ep=True, act="gelu"),
    "on_input": dict(E=16, topk=1, on_input=True),
    "on_input-ep": dict(E=8, topk=1, on_input=True, ep=True),
}

# (N, K), valid for every CUDA FP8 kernel (multiples of 16; N a multiple of 128 for the
# 128x128 blocks). 256x256: w1 has 4x2 scale blocks, w2 2x2, the intermediate two groups per
# token. 128x384: w1 2x3, w2 3x1, three groups per token of the input.
FP8_SHAPES = {"N256-K256": (256, 256), "N128-K384": (128, 384)}


def _fp8_quant_config(inp, scheme):
    """What run_fp8 reads of vLLM's FusedMoEQuantConfig."""
    return types.SimpleNamespace(
        w1_scale=inp["w1_scale"],
        w2_scale=inp["w2_scale"],
        a1_scale=inp["a1_scale"],
        a2_scale=inp["a2_scale"],
        block_shape=[128, 128] if scheme == "block" else None,
    )


def check_run_fp8(vllm_scheme, routing, M, shape, device="cuda"):
    """Calls vllm_experts.run_fp8 as the experts class's apply() does (bf16 input as vLLM's
    prepare step leaves it, unquantized; output aliasing workspace13 and NaN-filled;
    workspace2 from vllm_buffers) and checks the output against the float64 FP8 reference
    with conftest's tolerance and flip accounting."""
    scheme, static = FP8_VLLM_SCHEMES[vllm_scheme]
    N, K = FP8_SHAPES[shape]
    case = Case(M=M, N=N, K=K, **FP8_ROUTINGS[routing])
    # seeded by the parameters (not the node id), so the data do not depend on where pytest runs
    rng = np.random.default_rng(seed_for(f"run_fp8-{vllm_scheme}-{routing}-M{M}-{shape}"))
    # per channel: the weight scales as vLLM stores them, [E, 2N, 1] and [E, K, 1]
    prob = make_fp8_problem(rng, case, scheme, static=static, trailing=scheme == "channel")
    inp = to_fp8_inputs(prob, case, "torch", "bfloat16", device)
    tol = FP8_TOLERANCE["bfloat16"]

    if case.on_input:
        # vLLM's prepare step: a1 = a1 * topk_weights.to(a1.dtype); the experts then apply
        # unit weights, so the reference is the op on the scaled input with unit weights.
        hidden = inp["x"] * inp["tw"].to(inp["x"].dtype)
        ref_case = dataclasses.replace(case, on_input=False)
        ref_inp = dict(inp, x=hidden, tw=torch.ones_like(inp["tw"]))
    else:
        hidden = inp["x"]
        ref_case, ref_inp = case, inp
    ref, flips = fp8_reference(ref_inp, ref_case)
    assert np.linalg.norm(ref) > 0, "degenerate case: the reference is all zeros"

    # The case tells the plausible mistakes apart from the right answer by well over the
    # tolerance: a run_fp8 making one would output these references, give or take float32
    # accumulation and bf16 output rounding (a few 1e-3 at most), and fail the check below.
    if case.on_input:
        twice, _ = fp8_reference(dict(ref_inp, tw=inp["tw"]), ref_case)
        assert rel_error_with_flips(twice, ref, flips) > 3 * tol, "router weight applied twice: indistinguishable"
    if static:
        for dropped in ({"a1_scale": None}, {"a2_scale": None}, {"a1_scale": None, "a2_scale": None}):
            alt, _ = fp8_reference(dict(ref_inp, **dropped), ref_case)
            err = rel_error_with_flips(alt, ref, flips)
            assert err > 1.5 * tol, f"dynamic {sorted(dropped)} indistinguishable from static ({err:.3g})"

    def current(name):  # a snapshot of an input (e4m3 weights as their bytes)
        t = hidden if name == "hidden" else inp[name]
        return snapshot(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t)

    names = ("hidden", "w1", "w2", "tw", "ids", "w1_scale", "w2_scale", "a1_scale", "a2_scale", "expert_map")
    before = {n: current(n) for n in names if n == "hidden" or inp[n] is not None}

    output, _ws13, ws2 = vllm_buffers(M, 2 * N, K, case.topk, case.E, torch.bfloat16, device=device)
    output.fill_(float("nan"))  # (vllm_buffers' are NaN already) an unwritten element fails
    vllm_experts.run_fp8(
        output, hidden, inp["w1"], inp["w2"], inp["tw"], inp["ids"], case.act, case.global_experts,
        inp["expert_map"], ws2, case.on_input, _fp8_quant_config(inp, scheme), FP8_QUANT[scheme],
    )
    if device != "cpu":
        torch.cuda.synchronize()
    check_fp8_close(output, ref, flips, "bfloat16", what=f"run_fp8-{vllm_scheme}-{routing}-M{M}-{shape}")
    for name, old in before.items():
        assert same_bits(current(name), old), f"{name} was modified"
    return output, ref


@needs_sm89
@pytest.mark.parametrize("shape", list(FP8_SHAPES))
@pytest.mark.parametrize("M", [3, 200])
@pytest.mark.parametrize("routing", list(FP8_ROUTINGS))
@pytest.mark.parametrize("vllm_scheme", list(FP8_VLLM_SCHEMES))
def test_run_fp8_on_cuda_matches_float64_fp8_reference(vllm_scheme, routing, M, shape):
    """run_fp8 for each FP8 scheme vLLM hands swapmoe: the quant config's scales, block
    shape and the per-channel flag reach the kernels, the router weight is applied once
    (at the output, or only by vLLM's prepare step with apply_router_weight_on_input), the
    expert map's -1 entries contribute nothing, and every output element is written."""
    check_run_fp8(vllm_scheme, routing, M, shape)
