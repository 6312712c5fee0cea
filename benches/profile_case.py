"""One qwen3-30b-a3b layer per decode backend, for Nsight Compute (issue 5's next step:
what limits the decode kernels). Warm-up calls run first; profile the last calls with

    ncu --clock-control none --launch-skip 6 python3 benches/profile_case.py [M]
"""

import sys

import torch

import swapmoe

M = int(sys.argv[1]) if len(sys.argv) > 1 else 1
E, TOPK, K, N = 128, 8, 2048, 768
g = torch.Generator(device="cuda").manual_seed(0)
w1 = (torch.randn(E, 2 * N, K, device="cuda", generator=g) / K**0.5).to(torch.bfloat16)
w2 = (torch.randn(E, K, N, device="cuda", generator=g) / N**0.5).to(torch.bfloat16)
x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
logits = torch.randn(M, E, device="cuda", generator=g)
tw, ids = swapmoe.select_experts(logits, TOPK)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for backend in ("cuda_decode", "cuda_bulk_decode"):
    for _ in range(3):
        flush.zero_()  # L2 cold, as in the benchmark
        swapmoe.fused_experts(x, w1, w2, tw, ids, backend=backend)
flush.zero_()
swapmoe.fused_moe(x, w1, w2, logits, TOPK)  # router inside decode GEMM1
torch.cuda.synchronize()
print("done")
