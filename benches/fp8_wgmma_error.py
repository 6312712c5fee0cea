"""Relative error of the FP8 wgmma GEMMs (cuda_wgmma, token tile 128) against the float64
reference, on fixed inputs: compares builds that change the FP8 accumulation (how often the
tensor core's partial sums are promoted to f32). Prints one line per case:
plain relative error and the error with the reference's rounding flips accounted for.

    python3 benches/fp8_wgmma_error.py
"""

import numpy as np
import torch

import swapmoe
from fp8_cases import fp8_problem
from swapmoe.reference import e4m3_decode, fused_experts_fp8_ref, rel_error, rel_error_with_flips

CASES = [  # (M, E, topk, K, N, scheme, out dtype)
    (1024, 16, 2, 2048, 768, "tensor", torch.bfloat16),
    (1024, 16, 2, 2048, 768, "channel", torch.bfloat16),
    (1024, 16, 2, 7168, 256, "tensor", torch.bfloat16),
    (1024, 8, 2, 4096, 1024, "tensor", torch.bfloat16),
]

for M, E, topk, K, N, scheme, dtype in CASES:
    x, w1, w2, tw, ids, s1, s2, kw = fp8_problem(M, E, topk, K, N, scheme, dtype, static_scales=True)
    dev = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in kw.items()}
    out = swapmoe.fused_experts(x.cuda(), w1.cuda(), w2.cuda(), tw.cuda(), ids.cuda(), use_fp8_w8a8=True,
                                w1_scale=s1.cuda(), w2_scale=s2.cuda(), backend="cuda_wgmma", **dev)
    ref, flips = fused_experts_fp8_ref(
        x.float().numpy(), e4m3_decode(w1.view(torch.uint8).numpy()), e4m3_decode(w2.view(torch.uint8).numpy()),
        tw.numpy(), ids.numpy(), w1_scale=s1.numpy(), w2_scale=s2.numpy(),
        a1_scale=kw["a1_scale"].numpy() if "a1_scale" in kw else None,
        a2_scale=kw["a2_scale"].numpy() if "a2_scale" in kw else None,
        per_channel_quant=scheme == "channel", flip_margin=2e-3)
    o = out.float().cpu().numpy().astype(np.float64)
    print(f"M={M} E={E} topk={topk} K={K} N={N} {scheme} {str(dtype)[6:]}: rel_error {rel_error(o, ref):.3e},"
          f" with flips {rel_error_with_flips(o, ref, flips):.3e} ({len(flips)} flips), NaN {int(np.isnan(o).sum())}",
          flush=True)
