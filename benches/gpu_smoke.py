"""Quick GPU check used at the start of a device session: correctness of every kernel
variant on a few shapes against the float64 reference, then per-layer timings of the
whole op the PERFORMANCE.md way (graph of 8 layers on distinct weights, L2 flushed,
do_bench median). Prints one line per point."""

import sys
import time

import torch

import swapmoe
from swapmoe.reference import fused_experts_ref, rel_error


def make(M, E, topk, K, N, dtype, dev="cuda", seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(M, K, device=dev, dtype=dtype, generator=g)
    w1 = (torch.randn(E, 2 * N, K, device=dev, dtype=torch.float32, generator=g) / K**0.5).to(dtype)
    w2 = (torch.randn(E, K, N, device=dev, dtype=torch.float32, generator=g) / N**0.5).to(dtype)
    logits = torch.randn(M, E, device=dev, generator=g)
    tw, ids = torch.topk(torch.softmax(logits, -1), topk, dim=-1)
    return x, w1, w2, tw.float(), ids.to(torch.int32)


def check(M, E, topk, K, N, dtype, **kw):
    ok = True
    for backend in ("cuda_decode", "cuda_generic", "cuda_mma", "cuda_bulk_decode"):
        if backend == "cuda_bulk_decode" and (dtype == torch.float32 or K % 8 or N % 8 or M * topk > 64):
            continue
        if backend == "cuda_decode" and M * topk > 512:
            continue
        if backend == "cuda_mma" and (dtype == torch.float32 or K % 8 or N % 8):
            continue
        ok &= check_one(M, E, topk, K, N, dtype, backend=backend, **kw)
    return ok


def check_one(M, E, topk, K, N, dtype, **kw):
    x, w1, w2, tw, ids = make(M, E, topk, K, N, dtype, seed=M * 1000 + E)
    out = torch.full((M, K), float("nan"), device="cuda", dtype=dtype)
    swapmoe.fused_experts(x, w1, w2, tw, ids, out=out, **kw)
    torch.cuda.synchronize()
    emap = kw.get("expert_map")
    ref = fused_experts_ref(
        x.double().cpu().numpy(), w1.double().cpu().numpy(), w2.double().cpu().numpy(),
        tw.double().cpu().numpy(), ids.cpu().numpy(), activation=kw.get("activation", "silu"),
        expert_map=None if emap is None else emap.cpu().numpy(),
    )
    err = rel_error(out.double().cpu().numpy(), ref)
    tol = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1e-2}[dtype]
    ok = err < tol
    print(f"check M={M} E={E} topk={topk} K={K} N={N} {dtype} {kw.keys() and list(kw)}: rel_err={err:.2e} {'OK' if ok else 'FAIL'}")
    return ok


def bench(M, E, topk, K, N, dtype=torch.bfloat16, layers=8, read_tbps=4.42, backend=None):
    import triton.testing

    x, w1, w2, tw, ids = make(M, E, topk, K, N, dtype)
    w1s = [w1.clone() for _ in range(layers)]
    w2s = [w2.clone() for _ in range(layers)]
    out = torch.empty_like(x)
    for i in range(layers):
        swapmoe.fused_experts(x, w1s[i], w2s[i], tw, ids, out=out, backend=backend)
    torch.cuda.synchronize()
    gr = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(gr, stream=s):
            for i in range(layers):
                swapmoe.fused_experts(x, w1s[i], w2s[i], tw, ids, out=out, backend=backend)
    ms = triton.testing.do_bench(gr.replay, return_mode="median")
    us = ms * 1000 / layers
    touched = int(torch.unique(ids).numel())
    floor = (touched * 3 * N * K * x.element_size() + 2 * M * K * 2) / (read_tbps * 1e12) * 1e6
    tf = 2 * M * topk * 3 * N * K / (us * 1e-6) / 1e12
    print(f"bench {backend or 'auto':12s} E={E} topk={topk} K={K} N={N} M={M}: {us:8.1f} us  floor {floor:7.1f} us  {100*floor/us:5.1f}% of floor  {tf:6.1f} TF/s  touched={touched}")
    return us


def host_overhead(n=100, reps=20):
    """CPU time to enqueue one eager call (no sync inside the loop), median over reps."""
    x, w1, w2, tw, ids = make(1, 8, 2, 256, 128, torch.bfloat16)
    out = torch.empty_like(x)
    for _ in range(10):
        swapmoe.fused_experts(x, w1, w2, tw, ids, out=out)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            swapmoe.fused_experts(x, w1, w2, tw, ids, out=out)
        times.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    times.sort()
    t_out = times[len(times) // 2]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            swapmoe.fused_experts(x, w1, w2, tw, ids)
        times.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    times.sort()
    t_alloc = times[len(times) // 2]
    from swapmoe import _core
    ws = torch.empty(swapmoe.workspace_bytes(x, w1, ids), dtype=torch.uint8, device="cuda")
    st = torch.cuda.current_stream().cuda_stream
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            _core.fused_experts(x, w1, w2, tw, ids, out, workspace=ws, stream=st)
        times.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    times.sort()
    t_core = times[len(times) // 2]
    def med(f):
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            ts.append((time.perf_counter() - t0) / n * 1e6)
        ts.sort()
        return ts[len(ts) // 2]
    t_dl = med(lambda: x.__dlpack__(stream=-1))
    t_empty = med(lambda: torch.empty(1 << 16, dtype=torch.uint8, device="cuda"))
    t_stream = med(lambda: torch._C._cuda_getCurrentRawStream(0))
    print(f"host overhead per eager call: {t_out:.1f} us with out=, {t_alloc:.1f} us allocating out, "
          f"{t_core:.1f} us _core direct (workspace given); x.__dlpack__ {t_dl:.2f} us, torch.empty {t_empty:.2f} us, raw stream {t_stream:.2f} us")


def main():
    print(torch.cuda.get_device_name(), swapmoe.build_info()["nvcc_version"])
    swapmoe.warmup(0)
    ok = True
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        ok &= check(1, 128, 8, 256, 128, dtype)
        ok &= check(33, 64, 6, 200, 40, dtype)
        ok &= check(128, 8, 2, 512, 96, dtype, activation="gelu")
    if not ok:
        print("SMOKE FAILED")
    host_overhead()
    shapes = {"qwen3-30b-a3b": (128, 8, 2048, 768), "deepseek-v3-tp8": (256, 8, 7168, 256), "mixtral-8x7b": (8, 2, 4096, 14336)}
    ms = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 8, 64, 1024]
    T0 = time.time()
    for name, (E, topk, K, N) in shapes.items():
        for M in ms:
            if M * topk > 512 and time.time() - T0 > 120:
                continue
            t0 = time.time()
            bench(M, E, topk, K, N)
            for b in ("cuda_bulk_decode", "cuda_decode", "cuda_generic", "cuda_mma"):
                if b == "cuda_bulk_decode" and M * topk > 64:
                    continue
                if b == "cuda_decode" and M * topk > 512:
                    continue
                if b == "cuda_generic" and M >= 1024:
                    continue
                bench(M, E, topk, K, N, backend=b)
            if time.time() - t0 > 60:
                break
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
