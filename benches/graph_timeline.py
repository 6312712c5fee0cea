"""Per-kernel times inside the benchmark's CUDA graph (torch.profiler / CUPTI), against the
kernels alone (ncu, `device_run.sh ktimes`): which kernel of a layer runs longer in the graph
than alone, and how long the boundaries between kernels are.

    python3 benches/graph_timeline.py M [qwen3|deepseek|mixtral]   (PROFILE_QUANT as profile_case.py)

PROFILE_QUANT=fp8_tensor passes static activation scales (0.02) as `swapmoe bench --quant` does;
with PROFILE_DYNAMIC=1 it passes none (dynamic per-tensor scales).

As `swapmoe bench`: a graph of 8 fused_experts calls, each on its own weight copy, with the
oracle's plan; L2 flushed before each replay. Prints, over the layers of the last replays, each
kernel's median duration in the graph, its median gap after the previous kernel's end (negative:
it overlaps it, as PDL allows), and the median layer span (first start to last end) and
layer period (first start to the next layer's first start).
"""

import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict

import torch

import swapmoe
from swapmoe.bench import capture_graph, warm_up_for_capture

M = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
SHAPES = {"qwen3": (128, 8, 2048, 768), "deepseek": (256, 8, 7168, 256), "mixtral": (8, 2, 4096, 14336)}
SHAPE = sys.argv[2] if len(sys.argv) > 2 else "qwen3"
E, TOPK, K, N = SHAPES[SHAPE]
LAYERS = 8
# $TIMELINE_REPLAYS replays back to back under the profiler (each after an L2 flush), as do_bench
# runs them: the later ones show what sustained load does to the clock.
REPLAYS = int(os.environ.get("TIMELINE_REPLAYS", "5"))
QUANT = os.environ.get("PROFILE_QUANT")
DYNAMIC = os.environ.get("PROFILE_DYNAMIC", "") not in ("", "0")  # fp8_tensor without static scales

g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
logits = torch.randn(M, E, device="cuda", generator=g)
tw, ids = swapmoe.select_experts(logits, TOPK)
layers = []
for _ in range(LAYERS):
    w1 = (torch.randn(E, 2 * N, K, device="cuda", generator=g) / K**0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, K, N, device="cuda", generator=g) / N**0.5).to(torch.bfloat16)
    fp8 = {}
    if QUANT:  # quantized and passed as `swapmoe bench --quant` does
        from swapmoe import bench as B

        scheme = B.FP8_SCHEMES[B.check_quant(QUANT)]
        w1, s1 = B.quantize_fp8_weight(torch, w1, scheme)
        w2, s2 = B.quantize_fp8_weight(torch, w2, scheme)
        static = torch.tensor(0.02, device="cuda") if scheme == "tensor" and not DYNAMIC else None
        fp8 = B.fp8_kwargs(QUANT, s1, s2, static, static)
    out = torch.empty_like(x)
    layers.append(lambda w1=w1, w2=w2, fp8=fp8, out=out: swapmoe.fused_experts(x, w1, w2, tw, ids, out=out, **fp8))

warm_up_for_capture(torch, layers)
graph = capture_graph(torch, layers)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for _ in range(3):  # warm-up
    flush.zero_()
    graph.replay()
torch.cuda.synchronize()

with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(REPLAYS):
        flush.zero_()
        graph.replay()
    torch.cuda.synchronize()
path = os.path.join(tempfile.mkdtemp(), "trace.json")
prof.export_chrome_trace(path)
events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
events.sort(key=lambda e: e["ts"])
# Replays are separated by the flush kernel (a torch fill); a layer begins at its first kernel,
# which is the first kernel of the call's own sequence (the same name at a fixed position).
runs, cur = [], []
for e in events:
    if "swap" not in e["name"] and "wgmma" not in e["name"]:  # swapmoe's kernels: swapmoe_*, swap_moe_*, wgmma_moe_*
        if cur:
            runs.append(cur)
            cur = []
        continue
    cur.append(e)
if cur:
    runs.append(cur)
runs = [r for r in runs if len(r) % LAYERS == 0 and r]
if not runs:
    sys.exit(f"no complete replay among {len(events)} kernel events (CUPTI saw none inside the graph?)")
per_layer = len(runs[0]) // LAYERS
dur, gap, span, period = defaultdict(list), defaultdict(list), [], []
for r in runs:
    for layer in range(LAYERS):
        ks = r[layer * per_layer:(layer + 1) * per_layer]
        for i, e in enumerate(ks):
            key = (i, e["name"])
            dur[key].append(e["dur"])
            if i > 0:
                prev = ks[i - 1]
                gap[key].append(e["ts"] - (prev["ts"] + prev["dur"]))
        span.append(ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"])
        if layer + 1 < LAYERS:
            period.append(r[(layer + 1) * per_layer]["ts"] - ks[0]["ts"])
print(f"{SHAPE} M={M} quant={QUANT or 'none'}{' (dynamic)' if QUANT and DYNAMIC else ''}: {len(runs)} replays x {LAYERS} layers,"
      f" {per_layer} kernels per layer (µs, medians)")
for key in sorted(dur):
    g_ = f"{statistics.median(gap[key]):8.1f}" if gap[key] else "        "
    print(f"  {key[1][:60]:60s} {statistics.median(dur[key]):8.1f}  gap before {g_}")
print(f"  layer span (first start to last end) {statistics.median(span):.1f}, period (start to next layer's start)"
      f" {statistics.median(period):.1f}")
if len(runs) >= 40:  # each kernel in the first 10 replays against the last 20 (the steady state under load)
    print("  per kernel, first 10 replays -> last 20 (µs, medians):")
    for i in range(per_layer):
        first = [r[j * per_layer + i]["dur"] for r in runs[:10] for j in range(LAYERS)]
        last = [r[j * per_layer + i]["dur"] for r in runs[-20:] for j in range(LAYERS)]
        a, b = statistics.median(first), statistics.median(last)
        print(f"    {runs[0][i]['name'][:58]:58s} {a:8.1f} -> {b:8.1f} ({100 * (b / a - 1):+.1f}%)")
for i, r in enumerate(runs):
    if len(runs) > 12 and 4 <= i < len(runs) - 4 and i % 10:
        continue
    starts = [r[j * per_layer]["ts"] for j in range(LAYERS)]
    print(f"  replay {i}: first kernel start to last kernel end {r[-1]['ts'] + r[-1]['dur'] - r[0]['ts']:.1f},"
          f" layer periods {' '.join(f'{b - a:.0f}' for a, b in zip(starts, starts[1:]))}")
# The same graph as `swapmoe bench` times it: triton's do_bench (L2 flushed before each replay), median.
try:
    from triton.testing import do_bench

    ms = do_bench(graph.replay, return_mode="median")
    print(f"  do_bench(graph.replay): {ms * 1000:.1f} µs per replay, {ms * 1000 / LAYERS:.1f} per layer")
except ImportError:
    pass
