"""The body of the vLLM experts class (swapmoe.vllm_experts) on CUDA, with tensors and
workspaces laid out as vLLM's modular kernel gives them. Needs no vLLM: the GPU machine
has none, so this is how the plugin's GPU side is tested (tests/test_vllm_plugin.py runs
the class itself against a real vLLM on the CPU)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from swapmoe import reference, vllm_experts  # noqa: E402

pytestmark = pytest.mark.gpu

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
