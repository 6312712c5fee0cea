"""Per-CTA timeline of the swap-AB kernels (issue 5: where the fixed ~10-12 µs per layer go).

Needs a profiling build: `SWAPMOE_CUDA_STAMPS=1 maturin build --release`. Thread 0 of each
CTA of swap_moe_gemm1_act / swap_moe_gemm2_sum records %globaltimer at: entry (t0), GEMM1:
after griddepcontrol.wait / GEMM2: routing done (t1), GEMM1: expert picked / GEMM2: after
griddepcontrol.wait (t2), first stage full (t3), last stage consumed (t4), exit (t5).
With --quant fp8_tensor (static scales) the FP8 swap GEMM1 and GEMM2 record the same points,
except that the FP8 GEMM1 routes before its wait (t1: expert picked, t2: after the wait,
which returns when quantize-x is complete).
This runs one replay of a CUDA graph of 8 layers (distinct weight copies, L2 flushed first,
as the benchmark) and summarizes each kernel per layer, in µs from the layer's first GEMM1
CTA entry.

    python benches/stamps.py --shape qwen3 --m 1 [--splits 1,4] [--json out.json.gz]
    python benches/stamps.py --shape 128,8,4096,1536 --ep 8 --m 1   # Qwen3-235B-A22B EP8, one rank

It also times the graph (do_bench median, per layer; the stamps cost an atomic and a few
stores per CTA).
--json adds this case (summaries and the raw records of one replay) to a gzipped JSON file,
under a key of the shape, quant, M and splits, with "_probe" for a timing-probe build
(`SWAPMOE_CUDA_PROBE=no_mma`, whose consumers skip the math) and --label's text if given.
Builds since 2026-12-05 also record when thread 0's wait for each of a CTA's first 16 stages
returned (`swapmoe_stage_stamps`); the run prints their cadence per kernel: the median over
CTAs of each stage's time after the CTA's first stage (with the math that includes consuming
the stages before it; in a probe build it is when the stage landed).
"""

import argparse
import ctypes
import gzip
import json
import os
import statistics

import torch
import triton.testing

import swapmoe
from swapmoe import _core

SHAPES = {"qwen3": (128, 8, 2048, 768), "deepseek": (256, 8, 7168, 256), "mixtral": (8, 2, 4096, 14336)}
WORDS = 16
# words 13-14: the ring's other first-round stages already full when the first landed, and
# when the last first-round stage did (0 where the CTA has fewer items than its ring)
FIELDS = ("kernel", "bx", "by", "rank", "sm", "expert", "items", "t0", "t1", "t2", "t3", "t4", "t5",
          "ready_at_first", "ring_full")


STAGE_STAMPS = 16


class Stamps:
    def __init__(self):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.buf, self.buf_bytes = _core._module_global(0, "sm90_swap_decode", "swapmoe_stamps")
        self.count, _ = _core._module_global(0, "sm90_swap_decode", "swapmoe_stamp_count")
        try:  # builds before 2026-12-05 have no per-stage stamps
            self.stages, _ = _core._module_global(0, "sm90_swap_decode", "swapmoe_stage_stamps")
        except swapmoe.Error:
            self.stages = None

    def reset(self):
        torch.cuda.synchronize()
        zero = ctypes.c_uint32(0)
        assert self.cuda.cuMemcpyHtoD_v2(ctypes.c_uint64(self.count), ctypes.byref(zero), ctypes.c_size_t(4)) == 0

    def read(self):
        torch.cuda.synchronize()
        n = ctypes.c_uint32(0)
        assert self.cuda.cuMemcpyDtoH_v2(ctypes.byref(n), ctypes.c_uint64(self.count), ctypes.c_size_t(4)) == 0
        n = min(n.value, self.buf_bytes // (8 * WORDS))
        host = (ctypes.c_uint64 * (n * WORDS))()
        if n:
            assert self.cuda.cuMemcpyDtoH_v2(host, ctypes.c_uint64(self.buf), ctypes.c_size_t(n * WORDS * 8)) == 0
        stages = None
        if self.stages is not None and n:
            stages = (ctypes.c_uint64 * (n * STAGE_STAMPS))()
            assert self.cuda.cuMemcpyDtoH_v2(stages, ctypes.c_uint64(self.stages),
                                             ctypes.c_size_t(n * STAGE_STAMPS * 8)) == 0
        recs = []
        for i in range(n):
            r = dict(zip(FIELDS, host[i * WORDS : i * WORDS + len(FIELDS)]))
            r["expert"] = ctypes.c_int64(r["expert"]).value
            r["stages"] = [t for t in stages[i * STAGE_STAMPS : (i + 1) * STAGE_STAMPS] if t] if stages else []
            recs.append(r)
        return recs


def stage_cadence(recs, kernel):
    """Per stage k of the CTAs of `kernel` that recorded stage stamps: the median over CTAs of
    (stage k - stage 0) in µs, and how many CTAs reached stage k."""
    rows = [r["stages"] for r in recs if r["kernel"] == kernel and r.get("stages")]
    out = []
    for k in range(STAGE_STAMPS):
        d = [(st[k] - st[0]) / 1000.0 for st in rows if len(st) > k]
        if d:
            out.append((k, statistics.median(d), len(d)))
    return out


def instances(recs, kernel):
    """The records of `kernel`, split into launches: sorted by entry, chunked by grid size
    (every launch of a kernel in the graph has the same grid, and a launch's CTAs all enter
    before the next launch of the same kernel can start)."""
    rs = sorted((r for r in recs if r["kernel"] == kernel), key=lambda r: r["t0"])
    grid = len({(r["bx"], r["by"]) for r in rs})
    return [rs[i : i + grid] for i in range(0, len(rs), grid)]


def _us_or_nan(us, ts):
    """The median of `ts` in µs from the layer's start, NaN where no CTA reached the point."""
    return us(statistics.median(ts)) if ts else float("nan")


def summarize(recs, fp8=False):
    g1s, g2s = instances(recs, 3 if fp8 else 1), instances(recs, 4 if fp8 else 2)
    # the bf16 GEMM1 waits, then routes; the FP8 GEMM1 routes, then waits
    wait1, routed1 = ("t2", "t1") if fp8 else ("t1", "t2")
    rows = []
    for layer, (g1, g2) in enumerate(zip(g1s, g2s)):
        base = min(r["t0"] for r in g1)
        us = lambda t: (t - base) / 1000.0  # noqa: E731
        work1 = [r for r in g1 if r["items"] > 0]
        work2 = [r for r in g2 if r["items"] > 0]
        row = {
            "layer": layer,
            "g1_ctas": len(g1),
            "g1_working": len(work1),
            "g1_entry_last": us(max(r["t0"] for r in g1)),
            "g1_wait_done_med": us(statistics.median(r[wait1] for r in g1 if r[wait1])),
            "g1_routed_med": us(statistics.median(r[routed1] for r in g1)),
            "g1_first_full_min": us(min(r["t3"] for r in work1)),
            "g1_first_full_med": us(statistics.median(r["t3"] for r in work1)),
            "g1_ready_at_first_med": statistics.median(r["ready_at_first"] for r in work1),
            "g1_ring_full_med": _us_or_nan(us, [r["ring_full"] for r in work1 if r["ring_full"]]),
            "g1_consumed_min": us(min(r["t4"] for r in work1)),
            "g1_consumed_med": us(statistics.median(r["t4"] for r in work1)),
            "g1_exit_max": us(max(r["t5"] for r in g1)),
            "g2_ctas": len(g2),
            "g2_entry_min": us(min(r["t0"] for r in g2)),
            "g2_entry_max": us(max(r["t0"] for r in g2)),
            "g2_routed_med": us(statistics.median(r["t1"] for r in g2)),
            "g2_wait_done_min": us(min(r["t2"] for r in g2 if r["t2"])),
            "g2_wait_done_max": us(max(r["t2"] for r in g2 if r["t2"])),
            "g2_first_full_med": us(statistics.median(r["t3"] for r in work2)),
            "g2_ready_at_first_med": statistics.median(r["ready_at_first"] for r in work2),
            "g2_ring_full_med": _us_or_nan(us, [r["ring_full"] for r in work2 if r["ring_full"]]),
            "g2_consumed_med": us(statistics.median(r["t4"] for r in work2)),
            "g2_consumed_max": us(max(r["t4"] for r in work2)),
            "g2_exit_max": us(max(r["t5"] for r in g2)),
            "g1_sms": len({r["sm"] for r in g1}),
            "g2_sms": len({r["sm"] for r in g2}),
        }
        if layer + 1 < len(g1s):
            row["next_g1_entry_min"] = us(min(r["t0"] for r in g1s[layer + 1]))
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3",
                    help=f"{', '.join(sorted(SHAPES))} or E,topk,K,N (E: the model's experts)")
    ap.add_argument("--ep", type=int, default=1,
                    help="expert parallel: this rank holds the first E/ep experts (an expert_map with -1 "
                         "for the rest), as one rank of an EP deployment")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--splits", default=None, help="$SWAPMOE_SWAP_SPLITS (GEMM1 K split, GEMM2 expert split)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--quant", default="none", choices=["none", "fp8_tensor"],
                    help="fp8_tensor: e4m3 weights with per-expert scales, static a1/a2 scales")
    ap.add_argument("--seed", type=int, default=0, help="routing seed (the logits' generator)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--label", default="", help="appended to the case's key in --json")
    a = ap.parse_args()
    if a.splits:
        os.environ["SWAPMOE_SWAP_SPLITS"] = a.splits
    if a.shape in SHAPES:
        E_global, topk, K, N = SHAPES[a.shape]
    else:
        try:
            E_global, topk, K, N = (int(v) for v in a.shape.split(","))
        except ValueError:
            ap.error(f"--shape: expected one of {', '.join(sorted(SHAPES))} or E,topk,K,N, got {a.shape!r}")
    if a.ep < 1 or E_global % a.ep:
        ap.error(f"--ep: expected a divisor of E={E_global}, got {a.ep}")
    E = E_global // a.ep
    g = torch.Generator(device="cuda").manual_seed(0)
    w1s = [(torch.randn(E, 2 * N, K, device="cuda", generator=g) / K**0.5).to(torch.bfloat16) for _ in range(a.layers)]
    w2s = [(torch.randn(E, K, N, device="cuda", generator=g) / N**0.5).to(torch.bfloat16) for _ in range(a.layers)]
    x = torch.randn(a.m, K, device="cuda", generator=g).to(torch.bfloat16)
    routing = torch.Generator(device="cuda").manual_seed(a.seed)
    tw, ids = swapmoe.select_experts(torch.randn(a.m, E_global, device="cuda", generator=routing), topk)
    expert_map = None
    if a.ep > 1:  # the rank's experts are the first E of E_global
        expert_map = torch.full((E_global,), -1, dtype=torch.int32, device="cuda")
        expert_map[:E] = torch.arange(E, dtype=torch.int32, device="cuda")
    touched = len({int(i) for i in ids.flatten().tolist() if i < E})
    out = [torch.empty(a.m, K, device="cuda", dtype=torch.bfloat16) for _ in range(a.layers)]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    fp8 = a.quant == "fp8_tensor"
    quant = [{} for _ in range(a.layers)]
    if fp8:
        for i in range(a.layers):
            for name, w in (("w1", w1s), ("w2", w2s)):
                scale = w[i].float().abs().amax(dim=(1, 2)).clamp(min=1e-12) / 448.0
                w[i] = (w[i].float() / scale[:, None, None]).to(torch.float8_e4m3fn)
                quant[i][f"{name}_scale"] = scale
            quant[i].update(use_fp8_w8a8=True, a1_scale=(x.float().abs().amax() / 448.0).reshape(()),
                            a2_scale=torch.tensor(3.0 / 448.0, device="cuda"))

    def layer(i):
        swapmoe.fused_experts(x, w1s[i], w2s[i], tw, ids, backend="cuda_wgmma_swap", out=out[i],
                              expert_map=expert_map, **quant[i])

    st = Stamps()
    layer(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        for i in range(a.layers):
            layer(i)
    plan = swapmoe.select_backend(a.m, E, topk, K, N, quant=None if a.quant == "none" else a.quant,
                                  device_name=torch.cuda.get_device_name(),
                                  global_num_experts=E_global if a.ep > 1 else -1)
    ring = os.environ.get("SWAPMOE_SWAP_GEMM1_RING")
    print(f"{a.shape} M={a.m} {a.quant} ep={a.ep} ({touched} of the rank's {E} experts touched) "
          f"splits={a.splits or 'oracle'} GEMM1 ring={ring or 'oracle'} "
          f"(default plan {plan.backend}; forced cuda_wgmma_swap)")
    case = {"shape": a.shape, "m": a.m, "splits": a.splits, "quant": a.quant, "ep": a.ep, "seed": a.seed,
            "touched": touched,
            "gemm1_ring": ring}

    def replay():
        flush.zero_()
        graph.replay()

    for _ in range(3):
        replay()
    results, raw = [], None
    for _ in range(3):
        st.reset()
        replay()
        raw = st.read()
        results.append(summarize(raw, fp8))
    us = triton.testing.do_bench(graph.replay, return_mode="median") * 1000 / a.layers
    print(f"{us:.2f} µs per layer (do_bench median, L2 flushed)")
    keys = [k for k in results[0][0] if k != "layer"]
    # layers 1..n-2 of every replay (the first and last layer have no neighbour on one side)
    body = [row for rows in results for row in rows[1:-1]]
    print(f"{'event (µs from the layer first GEMM1 entry)':44s} {'median':>8s} {'min':>8s} {'max':>8s}")
    for k in keys:
        vals = [row[k] for row in body if k in row and row[k] == row[k]]  # NaN: no CTA got there
        if vals:
            print(f"{k:44s} {statistics.median(vals):8.2f} {min(vals):8.2f} {max(vals):8.2f}")
    probe = swapmoe.build_info().get("cuda_probe")
    for kernel, name in ((3, "GEMM1"), (4, "GEMM2")) if fp8 else ((1, "GEMM1"), (2, "GEMM2")):
        cad = stage_cadence(raw, kernel)
        if cad:
            print(f"{name} stage k - stage 0 (µs, median over CTAs{', probe: arrivals' if probe else ''}): "
                  + " ".join(f"{k}:{t:.2f}" for k, t, _ in cad))
    case.update(us_per_layer=us, summaries=results, raw_fields=FIELDS, raw=[[r[f] for f in FIELDS] for r in raw],
                raw_stages=[r["stages"] for r in raw], cuda_probe=probe)
    if a.json:
        # gzip: the raw records of a multi-wave case run to megabytes
        data = {}
        if os.path.exists(a.json):
            with gzip.open(a.json, "rt") as f:
                data = json.load(f)
        tag = "" if a.quant == "none" else f"_{a.quant}"
        ep = f"_ep{a.ep}" if a.ep > 1 else ""
        key = f"{a.shape}{ep}{tag}_m{a.m}_s{a.splits or 'oracle'}" + ("_probe" if probe else "")
        key += f"_seed{a.seed}" if a.seed else ""
        data[key + (f"_{a.label}" if a.label else "")] = case
        with gzip.open(a.json, "wt") as f:
            json.dump(data, f)

if __name__ == "__main__":
    main()
