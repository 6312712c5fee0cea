"""swapmoe.vllm_experts on the CPU (no vLLM needed): workspace sizing and alignment, and
the experts body against the float64 reference. The CUDA side is test_vllm_experts_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import swapmoe  # noqa: E402
from swapmoe import _core, reference, vllm_experts  # noqa: E402


@pytest.mark.parametrize("M", [1, 3, 8, 64, 513])
@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("E, topk, K, N", [
    (128, 8, 2048, 768),  # qwen3-30b-a3b: K > 2N
    (8, 2, 4096, 14336),  # mixtral-8x7b: 2N > N > K, so 2N alone bounds Triton's intermediate_cache1
])
def test_workspace2_holds_swapmoe_workspace_and_tritons(M, itemsize, E, topk, K, N):
    """vLLM's TritonExperts (which runs the calls the oracle routes to vllm_triton) puts
    intermediate_cache1 [M, topk, 2N] and intermediate_cache3 [M, topk, K] in workspace2 and
    intermediate_cache2 [M*topk, N] in workspace13; workspace2 also holds swapmoe's aligned
    workspace."""
    ws13, ws2, out = vllm_experts.workspace_shapes(M, 2 * N, K, topk, E, itemsize)
    assert ws13[0] == ws2[0] == out[0] == M  # vLLM chunks on the first dimension
    assert ws13 == (M, topk, max(N, K)) and out == (M, K)
    need = _core.workspace_bytes(M, topk, N, K, E, itemsize) + vllm_experts.WORKSPACE_ALIGN
    assert int(np.prod(ws2)) * itemsize >= need
    assert ws2[:2] == (M, topk) and ws2[2] >= 2 * N and ws2[2] >= K  # Triton's caches 1 and 3
    assert int(np.prod(ws2)) >= M * topk * 2 * N


def test_aligned_workspace_is_256_aligned_and_bounded():
    buf = torch.empty(10_000, dtype=torch.uint8)
    for skew in range(0, 64, 7):
        view = vllm_experts.aligned_workspace(buf[skew:], 4096)
        assert view.data_ptr() % 256 == 0 and view.numel() == 4096
        assert view.data_ptr() >= buf[skew:].data_ptr()
    with pytest.raises(swapmoe.ArgumentError, match=r"workspace2: expected at least \d+ bytes"):
        vllm_experts.aligned_workspace(buf[:100], 4096)
    assert vllm_experts.aligned_workspace(buf, 0) is None
    # the bound is exact: the bytes to the next 256-byte boundary plus nbytes fit, one fewer
    # does not (a buffer sized exactly must be taken, a short one never handed back short)
    for skew in (0, 1, 255):
        start = buf[skew:]
        skip = (-start.data_ptr()) % 256
        view = vllm_experts.aligned_workspace(start[: skip + 4096], 4096)
        assert view.data_ptr() - start.data_ptr() == skip < 256 and view.numel() == 4096
        with pytest.raises(swapmoe.ArgumentError, match=rf"workspace2: expected at least {skip + 4096} bytes"):
            vllm_experts.aligned_workspace(start[: skip + 4095], 4096)


@pytest.mark.parametrize("on_input", [False, True])
def test_run_on_cpu_matches_reference(on_input):
    rng = np.random.default_rng(3 + on_input)
    M, K, N, E = 9, 64, 48, 6
    topk = 1 if on_input else 2
    x = rng.standard_normal((M, K))
    w1 = rng.standard_normal((E, 2 * N, K)) / 8
    w2 = rng.standard_normal((E, K, N)) / 7
    ids = np.stack([rng.choice(E, topk, replace=False) for _ in range(M)]).astype(np.int32)
    ids[0, 0] = -1  # a slot routed to another rank
    tw = rng.random((M, topk)).astype(np.float32)
    t = lambda a, dt=torch.float32: torch.from_numpy(np.ascontiguousarray(a)).to(dt)  # noqa: E731
    out = torch.full((M, K), float("nan"))
    vllm_experts.run(out, t(x), t(w1), t(w2), t(tw), t(ids, torch.int32), "silu", E, None, None, on_input)
    ref = reference.fused_experts_ref(x, w1, w2, np.ones_like(tw) if on_input else tw, ids)
    assert reference.rel_error(out.double().numpy(), ref) < 1e-5


def test_run_rejects_unsupported_activation():
    z = torch.zeros(1, 8)
    with pytest.raises(swapmoe.ArgumentError, match="activation: expected one of"):
        vllm_experts.run(z, z, torch.zeros(1, 8, 8), torch.zeros(1, 8, 4), torch.ones(1, 1),
                         torch.zeros(1, 1, dtype=torch.int32), "swigluoai", 1, None, None, False)


def test_the_plugin_routes_every_fp8_scheme_of_this_build():
    """vllm_plugin.fp8_schemes() asks the oracle offline which FP8 schemes this build runs and
    treats any refusal as "not built"; every scheme is built, so all three must come back (an
    empty answer would quietly leave every FP8 layer to vLLM). Needs no vLLM."""
    from swapmoe import vllm_plugin

    assert set(vllm_plugin.fp8_schemes()) == {"fp8_tensor", "fp8_channel", "fp8_block128"}
