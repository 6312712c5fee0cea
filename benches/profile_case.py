"""One MoE layer per decode backend, for Nsight Compute (issue 5's next step: what limits
the decode kernels), plus fused_moe's router. Shape: qwen3 (default) or deepseek.
$PROFILE_BACKENDS (comma-separated, default cuda_decode,cuda_bulk_decode) picks the backends;
$PROFILE_ROUTER=0 leaves out fused_moe. $PROFILE_QUANT=fp8_tensor|fp8_channel|fp8_block128 runs FP8
weights instead (static per-tensor activation scales, as `swapmoe bench` calibrates them).

    ncu --clock-control none python3 benches/profile_case.py [M] [qwen3|deepseek]
"""

import os
import sys

import torch

import swapmoe

M = int(sys.argv[1]) if len(sys.argv) > 1 else 1
SHAPES = {"qwen3": (128, 8, 2048, 768), "deepseek": (256, 8, 7168, 256)}
E, TOPK, K, N = SHAPES[sys.argv[2] if len(sys.argv) > 2 else "qwen3"]
g = torch.Generator(device="cuda").manual_seed(0)
w1 = (torch.randn(E, 2 * N, K, device="cuda", generator=g) / K**0.5).to(torch.bfloat16)
w2 = (torch.randn(E, K, N, device="cuda", generator=g) / N**0.5).to(torch.bfloat16)
x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
logits = torch.randn(M, E, device="cuda", generator=g)
tw, ids = swapmoe.select_experts(logits, TOPK)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
QUANT = os.environ.get("PROFILE_QUANT")
fp8 = {}
if QUANT:
    def e4m3(w, scheme):
        if scheme == "fp8_tensor":
            s = w.abs().amax(dim=(1, 2), keepdim=True) / 448
        elif scheme == "fp8_channel":
            s = w.abs().amax(dim=2, keepdim=True) / 448
        else:
            e, r, c = w.shape
            b = torch.nn.functional.pad(w, (0, -c % 128, 0, -r % 128)).reshape(e, -(-r // 128), 128, -(-c // 128), 128)
            s = b.abs().amax(dim=(2, 4)) / 448
            full = s.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :r, :c]
            return (w.float() / full).to(torch.float8_e4m3fn), s.float()
        return (w.float() / s).to(torch.float8_e4m3fn), s.reshape(s.shape[0], -1).squeeze(-1).float()

    w1, s1 = e4m3(w1, QUANT)
    w2, s2 = e4m3(w2, QUANT)
    fp8 = dict(use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2)
    if QUANT == "fp8_tensor":
        one = torch.tensor(0.02, device="cuda")
        fp8.update(a1_scale=one, a2_scale=one)
    elif QUANT == "fp8_channel":
        fp8.update(per_channel_quant=True)
    else:
        fp8.update(block_shape=[128, 128])

for backend in os.environ.get("PROFILE_BACKENDS", "cuda_decode,cuda_bulk_decode").split(","):
    if M * TOPK > (64 if backend == "cuda_bulk_decode" else 512):
        continue
    for _ in range(2):
        flush.zero_()  # L2 cold, as in the benchmark
        swapmoe.fused_experts(x, w1, w2, tw, ids, backend=backend, **fp8)
for fusion in ("on", "off") if os.environ.get("PROFILE_ROUTER", "1") != "0" else ():  # fused_moe with the router placed by the oracle, then separate
    os.environ["SWAPMOE_ROUTER_FUSION"] = fusion
    flush.zero_()
    swapmoe.fused_moe(x, w1, w2, logits, TOPK, **fp8)
torch.cuda.synchronize()
print("done")
