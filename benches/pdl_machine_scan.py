"""Is GEMM2-by-PDL's gain a property of the shape or of the machine? Reads `swapmoe tune` logs
and compares, for every swap-AB point they timed, the launch with GEMM2 by PDL against the same
ring with GEMM2 after GEMM1 (`cuda_wgmma_swap:r{R}p1` over `:r{R}p0`).

    python benches/pdl_machine_scan.py [LOG ...]      (default: every tune log under benches/results)

A point is (model and dtype, M, ring). For each log it prints the ratios' median and range;
then, for the points timed in more than one log of the same GPU, each log's ratio over the
median of the other logs' ratios at the same point (its "excess"), and per log the median
excess over its shared points. A machine whose PDL launches run slow (2026-12-07 17:01's:
GEMM2-by-PDL launches 5-11% slower in the op than on the next call's machine) shows a median
excess of several percent; shape effects cancel, as every log is compared at the same points.
The GPU of a log is the device name in its tables' file names (the line that names each model),
else the `gpu.txt` (nvidia-smi) beside it or one folder up; logs with neither are set aside for
the comparison.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import statistics
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

HEADER = re.compile(r"^(\S+) \(E=\d+, topk=\d+, K=\d+, N=\d+")
DEVICE = re.compile(r"device_name=([^;]+)")
DTYPE = re.compile(r"dtype=([^;.]+(?:;block_shape=\[[^\]]*\])?(?:;per_channel=true)?)")
ROW = re.compile(r"^\s+M=(\d+)\s+(\S+)\s+([\d.]+) µs\s+\((.*)\)\s*$")
RINGS = (2, 3, 4, 5, 6)

Point = Tuple[str, int, int]  # "model dtype", M, ring


def parse_log(path: str) -> Tuple[Dict[Point, float], Optional[str]]:
    """({point: p1 time / p0 time}, the GPU its tables name) of one tune log."""
    ratios: Dict[Point, float] = {}
    model = None
    device = None
    with open(path, errors="replace") as f:
        for line in f:
            h = HEADER.match(line)
            if h:
                d = DTYPE.search(line)
                model = f"{h.group(1)} {d.group(1) if d else '?'}"
                g = DEVICE.search(line)
                if g:
                    device = g.group(1).replace("_", " ")
                continue
            r = ROW.match(line)
            if not r or model is None:
                continue
            times = {r.group(2): float(r.group(3))}
            for part in r.group(4).split(", "):
                name, _, value = part.rpartition(" ")
                try:
                    times[name] = float(value)
                except ValueError:
                    pass
            for ring in RINGS:
                p1 = times.get(f"cuda_wgmma_swap:r{ring}p1")
                p0 = times.get(f"cuda_wgmma_swap:r{ring}p0")
                if p1 and p0:
                    ratios[(model, int(r.group(1)), ring)] = p1 / p0
    return ratios, device


def gpu_of(path: str) -> Optional[str]:
    """The GPU name in the gpu.txt beside the log or one folder up, if any."""
    d = os.path.dirname(path)
    for g in (os.path.join(d, "gpu.txt"), os.path.join(os.path.dirname(d), "gpu.txt")):
        if os.path.isfile(g):
            with open(g) as f:
                lines = f.read().splitlines()
            if len(lines) >= 2:
                return lines[1].split(",")[0].strip()
    return None


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="*", help="tune logs (default: benches/results/**/*.txt)")
    ap.add_argument("--across-gpus", action="store_true",
                    help="compare every log with every other, whatever its GPU (is the ratio the shape's on both cards?)")
    args = ap.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    logs = args.logs or sorted(glob.glob(os.path.join(here, "results", "**", "*.txt"), recursive=True))
    per_log: Dict[str, Dict[Point, float]] = {}
    gpus: Dict[str, Optional[str]] = {}
    missing = [p for p in logs if not os.path.isfile(p)]
    if missing:
        print(f"logs: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    for path in logs:
        ratios, device = parse_log(path)
        if ratios:
            per_log[path] = ratios
            gpus[path] = device or gpu_of(path)
    if not per_log:
        print("no tune log with both GEMM2 launches of a ring", file=sys.stderr)
        return 1
    root = os.path.commonpath(list(per_log)) if len(per_log) > 1 else os.path.dirname(next(iter(per_log)))
    name = {p: os.path.relpath(p, root) for p in per_log}

    print("p1/p0 per log (GEMM2 by PDL over GEMM2 after GEMM1, same ring): points, median, min..max")
    for p, ratios in per_log.items():
        v = list(ratios.values())
        print(f"  {name[p]:70s} {gpus[p] or '?':22s} {len(v):4d}  {statistics.median(v):.3f}  "
              f"{min(v):.3f}..{max(v):.3f}")

    print(f"\nexcess over the other logs {'of any GPU' if args.across_gpus else 'of the same GPU'} at the same points "
          "(ratio / their median)")
    by_gpu: Dict[str, List[str]] = defaultdict(list)
    for p, g in gpus.items():
        if args.across_gpus:
            by_gpu["any GPU"].append(p)
        elif g:
            by_gpu[g].append(p)
    for g, paths in sorted(by_gpu.items()):
        for p in paths:
            excess = []
            for point, ratio in per_log[p].items():
                others = [per_log[q][point] for q in paths if q != p and point in per_log[q]]
                if others:
                    excess.append(ratio / statistics.median(others))
            if excess:
                print(f"  {name[p]:70s} {gpus[p] or '?':22s} {len(excess):4d} shared  median {statistics.median(excess):.3f}  "
                      f"{min(excess):.3f}..{max(excess):.3f}")
            else:
                print(f"  {name[p]:70s} {gpus[p] or '?':22s}    0 shared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
