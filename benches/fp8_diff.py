"""GPU against CPU (both swapmoe) for the FP8 schemes over a few shapes: localizes a
GPU-only FP8 error to a scheme, a backend and a dimension."""

import itertools
import sys

import torch

import swapmoe
from fp8_cases import fp8_problem


def case(M, E, topk, K, N, scheme, backend, seed=0):
    x, w1, w2, tw, ids, s1, s2, kw = fp8_problem(M, E, topk, K, N, scheme, seed=seed)
    cpu = swapmoe.fused_experts(x, w1, w2, tw, ids, use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2, **kw)
    d = "cuda"
    gpu = swapmoe.fused_experts(x.to(d), w1.to(d), w2.to(d), tw.to(d), ids.to(d), use_fp8_w8a8=True,
                                w1_scale=s1.to(d), w2_scale=s2.to(d), backend=backend, **kw).cpu()
    err = ((gpu.double() - cpu.double()).norm() / cpu.double().norm()).item()
    print(f"{scheme:7s} {backend:12s} M={M} E={E} topk={topk} K={K} N={N}: rel diff GPU vs CPU {err:.2e}", flush=True)


shapes = [(1, 8, 2, 256, 128), (1, 8, 2, 2048, 128), (1, 8, 2, 256, 768), (1, 8, 2, 256, 1536),
          (1, 128, 8, 2048, 768), (4, 8, 2, 2048, 768)]
for scheme, backend in itertools.product(["block", "tensor", "channel"], ["cuda_decode", "cuda_generic"]):
    for s in shapes:
        try:
            case(*s, scheme, backend)
        except Exception as e:
            print(scheme, backend, s, "ERROR", e, file=sys.stderr)
