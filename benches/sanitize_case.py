"""One small call of every kernel variant, for compute-sanitizer (memcheck, racecheck).
Exits non-zero on a wrong result."""

import os
import sys

import numpy as np
import torch

import swapmoe
from swapmoe.reference import fused_experts_ref, rel_error


def run(M, E, topk, K, N, dtype, global_E=None, activation="silu", backend=None):
    g = torch.Generator(device="cuda").manual_seed(M + E + K)
    dev = "cuda"
    x = torch.randn(M, K, device=dev, generator=g).to(dtype)
    w1 = (torch.randn(E, 2 * N, K, device=dev, generator=g) / K**0.5).to(dtype)
    w2 = (torch.randn(E, K, N, device=dev, generator=g) / N**0.5).to(dtype)
    G = global_E or E
    tw, ids = torch.topk(torch.softmax(torch.randn(M, G, device=dev, generator=g), -1), topk)
    ids = ids.to(torch.int32)
    emap = None
    if global_E:
        emap = torch.full((G,), -1, dtype=torch.int32, device=dev)
        emap[torch.randperm(G, device=dev, generator=g)[:E]] = torch.arange(E, dtype=torch.int32, device=dev)
    out = torch.full((M, K), float("nan"), device=dev, dtype=dtype)
    swapmoe.fused_experts(x, w1, w2, tw, ids, out=out, expert_map=emap, activation=activation, backend=backend)
    torch.cuda.synchronize()
    ref = fused_experts_ref(
        x.double().cpu().numpy(), w1.double().cpu().numpy(), w2.double().cpu().numpy(),
        tw.double().cpu().numpy(), ids.cpu().numpy(), activation=activation,
        expert_map=None if emap is None else emap.cpu().numpy(),
    )
    err = rel_error(out.double().cpu().numpy(), ref)
    tol = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1e-2}[dtype]
    print(f"M={M} E={E} topk={topk} K={K} N={N} {dtype} global_E={global_E} backend={backend}: rel_err={err:.2e}")
    return err < tol


ok = True
for backend in ("cuda_decode", "cuda_generic"):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        ok &= run(3, 8, 2, 64, 32, dtype, backend=backend)   # vectorized loads
        ok &= run(5, 8, 2, 66, 34, dtype, backend=backend)   # scalar loads (K, N not multiples of 8)
    ok &= run(6, 8, 3, 64, 48, torch.bfloat16, global_E=16, activation="gelu", backend=backend)  # expert_map with -1
ok &= run(40, 16, 4, 136, 72, torch.bfloat16, backend="cuda_decode")  # several 32-slot chunks
for dtype in (torch.bfloat16, torch.float16):  # tensor-core tiles 16, 64, 128; K and N tails
    ok &= run(9, 8, 2, 200, 72, dtype, backend="cuda_mma")
    ok &= run(300, 4, 2, 136, 200, dtype, backend="cuda_mma")
ok &= run(70, 8, 3, 64, 48, torch.bfloat16, global_E=16, backend="cuda_mma")
if torch.cuda.get_device_capability() == (9, 0):  # TMA bulk-copy decode kernels
    for dtype in (torch.bfloat16, torch.float16):
        ok &= run(3, 8, 2, 520, 1160, dtype, backend="cuda_bulk_decode")  # K and N chunk tails
    ok &= run(8, 16, 8, 64, 48, torch.bfloat16, global_E=32, activation="gelu", backend="cuda_bulk_decode")
    # wgmma + TMA GEMMs, both token tiles: K and N tails (TMA zero fill), 2 GEMM1 column
    # blocks, expert map
    for tile in ("64", "128"):
        os.environ["SWAPMOE_MMA_TOKEN_TILE"] = tile
        for dtype in (torch.bfloat16, torch.float16):
            ok &= run(300, 4, 2, 136, 200, dtype, backend="cuda_wgmma")
        ok &= run(70, 8, 3, 64, 48, torch.bfloat16, global_E=16, activation="gelu", backend="cuda_wgmma")
    del os.environ["SWAPMOE_MMA_TOKEN_TILE"]
    # cuda_wgmma's GEMM1 grouping the slots itself (every CTA in its own shared memory, CTA 0
    # writing the grouping for the kernels after it): both tiles, the persistent grid and one
    # CTA per item, several tiles per expert, an expert map
    os.environ["SWAPMOE_ALIGN_IN_GEMM1"] = "on"
    for tile in ("64", "128"):
        os.environ["SWAPMOE_MMA_TOKEN_TILE"] = tile
        for persistent in ("on", "off"):
            os.environ["SWAPMOE_WGMMA_PERSISTENT"] = persistent
            ok &= run(100, 2, 2, 136, 200, torch.bfloat16, backend="cuda_wgmma")
            ok &= run(7, 8, 3, 64, 48, torch.bfloat16, global_E=16, activation="gelu", backend="cuda_wgmma")
    for knob in ("SWAPMOE_ALIGN_IN_GEMM1", "SWAPMOE_MMA_TOKEN_TILE", "SWAPMOE_WGMMA_PERSISTENT"):
        del os.environ[knob]
    # swap-AB decode kernels: each token tile (8..64), K and N tails, expert-map cases; without
    # clusters and 1 K slice per stage, and with the widest clusters (distributed shared
    # memory) and 4 slices
    for splits, slices in (("1,1", "1,1"), ("8,8", "4,4")):
        os.environ["SWAPMOE_SWAP_SPLITS"] = splits
        os.environ["SWAPMOE_SWAP_SLICES"] = slices
        for dtype in (torch.bfloat16, torch.float16):
            ok &= run(3, 8, 2, 136, 200, dtype, backend="cuda_wgmma_swap")
        ok &= run(13, 16, 4, 72, 520, torch.bfloat16, global_E=32, activation="gelu", backend="cuda_wgmma_swap")
        ok &= run(30, 64, 8, 64, 64, torch.bfloat16, backend="cuda_wgmma_swap")
        ok &= run(64, 8, 2, 64, 48, torch.float16, backend="cuda_wgmma_swap")
    del os.environ["SWAPMOE_SWAP_SPLITS"], os.environ["SWAPMOE_SWAP_SLICES"]


# FP8 W8A8: every FP8 kernel family in each scheme (per tensor with dynamic and with static
# activation scales, per channel, 128x128 blocks), checked against the tests' float64 FP8
# reference (conftest.run_fp8_case): the quantize-x and absmax pre-passes, the SIMT decode and
# generic kernels (sm_89+), and on sm_90 cuda_wgmma at both token tiles and cuda_wgmma_swap
# (the dynamic-scale GEMM2 and, with static scales, the e4m3-intermediate one) without
# clusters and with the widest.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from conftest import Case, run_fp8_case, wgmma_fp8_case  # noqa: E402

FP8_SCHEMES = [("tensor", False), ("tensor", True), ("channel", False), ("block", False)]


def fp8_run(case, scheme, static, backend, **env):
    """One FP8 call under the given environment; True if it matches the reference."""
    os.environ.update(env)
    try:
        run_fp8_case(case, scheme, "torch", "bfloat16", np.random.default_rng(case.M * 31 + case.K),
                     device="cuda", static=static, backend=backend)
        result, good = "ok", True
    except AssertionError as exc:
        result, good = f"WRONG: {exc}", False
    finally:
        for name in env:
            del os.environ[name]
    print(f"fp8 {scheme}{'-static' if static else ''} {case.id} {backend} {env or ''}: {result}")
    return good


if torch.cuda.get_device_capability() >= (8, 9):
    for scheme, static in FP8_SCHEMES:
        ok &= fp8_run(Case(M=3, E=16, topk=4, N=128, K=256, out="poison"), scheme, static, "cuda_decode")
        ok &= fp8_run(Case(M=20, E=8, topk=2, N=80, K=336, out="poison", ep=True), scheme, static, "cuda_generic")
if torch.cuda.get_device_capability() == (9, 0):
    for scheme, static in FP8_SCHEMES:
        for tile in ("64", "128"):
            ok &= fp8_run(wgmma_fp8_case(Case(M=100, E=4, topk=2, N=80, K=336, out="poison"), scheme), scheme,
                          static, "cuda_wgmma", SWAPMOE_MMA_TOKEN_TILE=tile)
        for splits in ("1,1", "8,8"):
            ok &= fp8_run(Case(M=5, E=16, topk=4, N=256, K=512, ids="concentrated", out="poison"), scheme, static,
                          "cuda_wgmma_swap", SWAPMOE_SWAP_SPLITS=splits)


def route_case(M, E, topk, **kw):
    """The GPU router against the CPU router on the same logits."""
    g = torch.Generator(device="cuda").manual_seed(M * 7 + E)
    logits = torch.randn(M, E, device="cuda", generator=g)
    if kw.pop("bias", False):
        kw["e_score_correction_bias"] = torch.randn(E, device="cuda", generator=g) * 0.1
    w, i = swapmoe.select_experts(logits, topk, **kw)
    torch.cuda.synchronize()
    cpu_kw = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in kw.items()}
    wc, ic = swapmoe.select_experts(logits.cpu(), topk, **cpu_kw)
    same = torch.equal(i.cpu(), ic) and torch.allclose(w.cpu(), wc, rtol=1e-5, atol=1e-6)
    print(f"router M={M} E={E} topk={topk} {sorted(kw)}: {'same as CPU' if same else 'DIFFERENT'}")
    return same


ok &= route_case(5, 128, 8)
ok &= route_case(3, 256, 8, scoring="sigmoid", num_expert_group=8, topk_group=4, bias=True, routed_scaling_factor=2.5)
ok &= route_case(9, 16, 1, scoring="sigmoid", renormalize=False)
ok &= route_case(3, 80, 6, scoring="sigmoid", num_expert_group=5, topk_group=2)  # CTA router, E % 32 != 0
ok &= route_case(4, 48, 4, num_expert_group=16, topk_group=5)  # groups not aligned with lanes
ok &= route_case(6, 512, 8, scoring="sigmoid", num_expert_group=8, topk_group=4, bias=True)  # wide router


def fused_moe_case(M, E, topk, backend, **kw):
    """fused_moe with the router inside the first kernel ($SWAPMOE_ROUTER_FUSION=on) against
    select_experts + fused_experts on the same backend (expected: identical)."""
    os.environ["SWAPMOE_ROUTER_FUSION"] = "on"
    g = torch.Generator(device="cuda").manual_seed(M * 11 + E)
    K, N = 64, 48
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    w1 = (torch.randn(E, 2 * N, K, device="cuda", generator=g) / K**0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, K, N, device="cuda", generator=g) / N**0.5).to(torch.bfloat16)
    logits = torch.randn(M, E, device="cuda", generator=g)
    if kw.pop("bias", False):
        kw["e_score_correction_bias"] = torch.randn(E, device="cuda", generator=g) * 0.1
    fused = swapmoe.fused_moe(x, w1, w2, logits, topk, backend=backend, **kw)
    w, i = swapmoe.select_experts(logits, topk, **kw)
    sep = swapmoe.fused_experts(x, w1, w2, w, i, backend=backend)
    torch.cuda.synchronize()
    same = torch.equal(fused, sep)
    print(f"fused_moe M={M} E={E} topk={topk} {backend} {sorted(kw)}: {'same as separate' if same else 'DIFFERENT'}")
    return same


ok &= fused_moe_case(1, 128, 8, "cuda_decode")  # router in decode GEMM1
ok &= fused_moe_case(5, 256, 8, "cuda_decode", scoring="sigmoid", num_expert_group=8, topk_group=4, bias=True)
ok &= fused_moe_case(16, 128, 8, "cuda_mma")  # router in the align kernel
ok &= fused_moe_case(13, 64, 6, "cuda_generic")
print("ALL OK" if ok else "FAILED")
raise SystemExit(0 if ok else 1)
