"""Random FP8 W8A8 problems shared by the FP8 diagnostics (fp8_diff.py, fp8_wgmma_error.py):
e4m3 weights, float32 scales per scheme, softmax top-k routing, all from one CPU generator."""

import torch


def fp8_problem(M, E, topk, K, N, scheme, dtype=torch.bfloat16, seed=0, static_scales=False):
    """(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, kwargs) on the CPU for `scheme`
    ("tensor", "channel" or "block"); kwargs are the scheme's other fused_experts arguments
    (with static_scales, per tensor: a1_scale 0.01 and a2_scale 0.05)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w1 = (torch.randn(E, 2 * N, K, generator=g) * 8).to(torch.float8_e4m3fn)
    w2 = (torch.randn(E, K, N, generator=g) * 8).to(torch.float8_e4m3fn)
    b = 128
    if scheme == "block":
        s1 = torch.rand(E, -(-2 * N // b), -(-K // b), generator=g) * 0.02 + 0.01
        s2 = torch.rand(E, -(-K // b), -(-N // b), generator=g) * 0.02 + 0.01
        kw = dict(block_shape=[b, b])
    elif scheme == "channel":
        s1 = torch.rand(E, 2 * N, generator=g) * 0.02 + 0.01
        s2 = torch.rand(E, K, generator=g) * 0.02 + 0.01
        kw = dict(per_channel_quant=True)
    else:
        s1 = torch.rand(E, generator=g) * 0.02 + 0.01
        s2 = torch.rand(E, generator=g) * 0.02 + 0.01
        kw = dict(a1_scale=torch.tensor(0.01), a2_scale=torch.tensor(0.05)) if static_scales else {}
    tw, ids = torch.topk(torch.softmax(torch.randn(M, E, generator=g), -1), topk)
    return x, w1, w2, tw, ids.to(torch.int32), s1, s2, kw
