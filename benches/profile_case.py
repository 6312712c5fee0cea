"""One MoE layer per backend, for Nsight Compute (what limits the decode kernels and the
prefill wgmma GEMMs), plus fused_moe's router. Shape: qwen3 (default), deepseek or mixtral.
$PROFILE_BACKENDS (comma-separated, default cuda_decode,cuda_bulk_decode) picks the backends
("oracle": the plan the oracle picks for the call, as `swapmoe bench` runs it);
$PROFILE_ROUTER=0 leaves out fused_moe; $PROFILE_K=k sets the hidden size (K) to k. $PROFILE_QUANT=fp8_tensor|fp8_channel|fp8_block128 runs FP8
weights instead (static per-tensor activation scales, as `swapmoe bench` calibrates them).

    ncu --clock-control none python3 benches/profile_case.py [M] [qwen3|deepseek]
"""

import os
import sys

import torch

import swapmoe

M = int(sys.argv[1]) if len(sys.argv) > 1 else 1
SHAPES = {"qwen3": (128, 8, 2048, 768), "deepseek": (256, 8, 7168, 256), "mixtral": (8, 2, 4096, 14336)}
SLOT_CAPS = {"cuda_bulk_decode": 64, "cuda_decode": 512}  # the decode backends' largest M * topk
E, TOPK, K, N = SHAPES[sys.argv[2] if len(sys.argv) > 2 else "qwen3"]
# $PROFILE_K replaces the shape's hidden size (a GEMM's time against its k-stages per tile, with
# the same tiles: the router logits then come from their own generator, so that K leaves the
# routing as it is).
PROFILE_K = os.environ.get("PROFILE_K")
K = int(PROFILE_K) if PROFILE_K else K
g = torch.Generator(device="cuda").manual_seed(0)
w1 = (torch.randn(E, 2 * N, K, device="cuda", generator=g) / K**0.5).to(torch.bfloat16)
w2 = (torch.randn(E, K, N, device="cuda", generator=g) / N**0.5).to(torch.bfloat16)
x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
g_router = torch.Generator(device="cuda").manual_seed(1) if PROFILE_K else g
logits = torch.randn(M, E, device="cuda", generator=g_router)
tw, ids = swapmoe.select_experts(logits, TOPK)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
QUANT = os.environ.get("PROFILE_QUANT")
fp8 = {}
if QUANT:
    # quantized and passed as `swapmoe bench --quant` does
    from swapmoe import bench as B

    scheme = B.FP8_SCHEMES[B.check_quant(QUANT)]
    w1, s1 = B.quantize_fp8_weight(torch, w1, scheme)
    w2, s2 = B.quantize_fp8_weight(torch, w2, scheme)
    static = torch.tensor(0.02, device="cuda") if scheme == "tensor" else None
    fp8 = B.fp8_kwargs(QUANT, s1, s2, static, static)

for backend in os.environ.get("PROFILE_BACKENDS", "cuda_decode,cuda_bulk_decode").split(","):
    if M * TOPK > SLOT_CAPS.get(backend, M * TOPK):
        continue
    for _ in range(2):
        flush.zero_()  # L2 cold, as in the benchmark
        chosen = {} if backend == "oracle" else {"backend": backend}
        swapmoe.fused_experts(x, w1, w2, tw, ids, **chosen, **fp8)
for fusion in ("on", "off") if os.environ.get("PROFILE_ROUTER", "1") != "0" else ():  # fused_moe with the router placed by the oracle, then separate
    os.environ["SWAPMOE_ROUTER_FUSION"] = fusion
    flush.zero_()
    swapmoe.fused_moe(x, w1, w2, logits, TOPK, **fp8)
torch.cuda.synchronize()
print("done")
