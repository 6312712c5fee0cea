"""How far the oracle's heuristics are from the tables' fastest swapmoe kernel, on the tables'
own times. For every entry of every table, the plan `swapmoe.select_backend` makes for the
table's shape and device with the tables off (`$SWAPMOE_TABLES=off`, so the heuristics decide)
is looked up among the entry's `times_us` and compared with the fastest swapmoe candidate there
(vLLM's and FlashInfer's times are left out: the heuristics never pick them).

    python benches/heuristics_vs_tables.py [TABLE_OR_FOLDER ...] [--margin 0.05]

Default: the shipped tables (`python/swapmoe/tables`). Prints one line per table (points,
points within the margin, geomean of pick / fastest) with the misses, then the totals.

A heuristic swap-AB plan is read as the launch it names where the table timed that launch
(`cuda_wgmma_swap:r3p1`, `...:r0p1g5`: GEMM1's ring, GEMM2 by PDL, the e4m3 GEMM2's ring),
else as the table's `cuda_wgmma_swap` label, which the tune timed with the backend forced and
the launch left to the heuristics of its day (so a launch rule changed since the table was
tuned is then read with the older rule's time; such points are marked "~"). A tensor-core plan
is its tile's label (`cuda_wgmma:t64`, `cuda_mma:t16`), every other plan its backend's name.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

EXTERNAL = ("vllm_triton", "flashinfer_cutlass")
TILED = ("cuda_wgmma", "cuda_mma")


@dataclass
class Point:
    table: str
    m: int
    pick: str
    pick_us: Optional[float]  # None: the table did not time the heuristics' pick
    best: str
    best_us: float
    exact: bool = True  # False: a swap-AB launch the table did not time, read as its backend's label

    @property
    def ratio(self) -> Optional[float]:
        return None if self.pick_us is None else self.pick_us / self.best_us


def heuristic_labels(plan) -> List[str]:
    """The table labels that can stand for a plan's kernel choice, the most exact first (see
    the module's docstring), spelled by the tune's own label functions."""
    from swapmoe.tune import candidate_label, entry_label  # noqa: PLC0415 (lazy, as table_points)

    t = plan.tile
    if plan.backend in TILED:
        return [candidate_label(plan.backend, t["tokens_per_pass"])]
    if plan.backend != "cuda_wgmma_swap":
        return [plan.backend]
    launch = {"backend": plan.backend, "swap_gemm1_ring": t["swap_gemm1_ring"],
              "swap_gemm2_pdl": t["swap_gemm2_pdl"]}
    labels = []
    if t["swap_gemm2_ring"]:
        labels.append(entry_label({**launch, "swap_gemm2_ring": t["swap_gemm2_ring"]}))
    if t["swap_gemm1_ring"]:
        labels.append(entry_label(launch))
    return labels + [plan.backend]


def table_points(path: str, swapmoe_module=None) -> List[Point]:
    """The heuristics' pick against the fastest swapmoe time at each M entry of one table."""
    sm = swapmoe_module
    if sm is None:
        import swapmoe as sm  # noqa: PLC0415 (the benches import the package lazily)
    with open(path) as f:
        table = json.load(f)
    meta = table["metadata"]
    cap = tuple(int(x) for x in str(meta["device_capability"]).split("."))
    name = os.path.basename(path)
    points = []
    for key, entry in table.items():
        if key == "metadata" or not isinstance(entry, dict) or not entry.get("times_us"):
            continue
        m = int(key)
        times = {k: v for k, v in entry["times_us"].items() if k.partition(":")[0] not in EXTERNAL}
        if not times:
            continue
        plan = sm.select_backend(
            m, meta["E"], meta["topk"], meta["K"], meta["N"], dtype=meta.get("dtype") or "bf16",
            device_capability=cap, device_name=meta["device_name"], quant=meta.get("quant"),
            activation_scales=meta.get("activation_scales"),
            global_num_experts=meta.get("E_global") or -1)
        if plan.source != "heuristic":
            raise RuntimeError(f"{name} M={m}: the plan came from {plan.source!r}, not the heuristics "
                               "(is $SWAPMOE_BACKEND set?)")
        best = min(times, key=times.get)
        labels = heuristic_labels(plan)
        pick = next((label for label in labels if label in times), labels[0])
        exact = pick == labels[0] or pick != "cuda_wgmma_swap"
        points.append(Point(name, m, pick, times.get(pick), best, times[best], exact))
    return sorted(points, key=lambda p: p.m)


def table_files(args: Sequence[str]) -> List[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    paths = list(args) or [os.path.join(here, "..", "python", "swapmoe", "tables")]
    files: List[str] = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "*.json")))
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise FileNotFoundError(f"tables: no such file or folder: {p}")
    return files


def summarize(points: Sequence[Point], margin: float) -> Dict[str, float]:
    timed = [p for p in points if p.ratio is not None]
    within = sum(1 for p in timed if p.ratio <= 1 + margin)
    geomean = math.exp(sum(math.log(p.ratio) for p in timed) / len(timed)) if timed else float("nan")
    return {"points": len(points), "timed": len(timed), "within": within, "geomean": geomean}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="*", help="table files or folders (default: the shipped tables)")
    ap.add_argument("--margin", type=float, default=0.05, help="a pick within this fraction of the fastest counts as within")
    args = ap.parse_args(argv)
    os.environ["SWAPMOE_TABLES"] = "off"
    os.environ.pop("SWAPMOE_BACKEND", None)
    try:
        files = table_files(args.tables)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    every: List[Point] = []
    read = 0
    for path in files:
        try:
            points = table_points(path)
        except (ValueError, KeyError) as e:  # json.JSONDecodeError is a ValueError
            print(f"{os.path.basename(path)}: skipped, not a swapmoe table ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        read += 1
        every += points
        s = summarize(points, args.margin)
        print(f"{os.path.basename(path)}: {s['within']}/{s['timed']} within {args.margin:.0%}, "
              f"geomean {s['geomean'] - 1:+.1%}")
        for p in points:
            if p.ratio is None:
                print(f"  M={p.m}: the heuristics pick {p.pick}, which the table did not time")
            elif p.ratio > 1 + args.margin:
                mark = "" if p.exact else "~"
                print(f"  M={p.m}: {mark}{p.pick} {p.pick_us:.1f} us against {p.best} {p.best_us:.1f} ({p.ratio - 1:+.1%})")
    s = summarize(every, args.margin)
    approx = sum(1 for p in every if not p.exact)
    print(f"all {read} tables: {s['within']}/{s['timed']} points within {args.margin:.0%}, "
          f"geomean {s['geomean'] - 1:+.1%}; {s['points'] - s['timed']} picks not timed, "
          f"{approx} swap-AB launches read as the table's cuda_wgmma_swap (~)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
