"""Per-kernel durations from an Nsight Compute CSV of `benches/profile_case.py` (the
`device_run.sh ktimes` step): one line per swapmoe kernel and grid, its durations in µs in
launch order, and the sum of the medians of the op's kernels. Torch's own kernels (weight
quantization, the L2 flush) and the router that builds the inputs are left out.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv python3 benches/profile_case.py M shape > k.csv
    python3 benches/kernel_times.py k.csv [more.csv ...]
"""

import csv
import statistics
import sys

NOT_THE_OP = ("at::", "void at", "elementwise", "vectorized", "distribution", "swapmoe_route_topk",
              "swapmoe_route_grouped")


def kernel_times(path: str) -> dict[str, list[float]]:
    """{"kernel (grid)": [µs, ...]} in first-launch order."""
    lines = open(path).read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"{path}: no ncu CSV rows (did the profiled program fail?)")
    times: dict[str, list[float]] = {}
    for row in csv.DictReader(lines[start:]):
        if row["Metric Name"] != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"]
        if any(name.startswith(p) or p in name for p in NOT_THE_OP):
            continue
        scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "ms": 1e3}.get(row["Metric Unit"], None)
        if scale is None:
            raise SystemExit(f"{path}: unexpected unit {row['Metric Unit']!r}")
        value = float(row["Metric Value"].replace(",", "")) * scale
        times.setdefault(f"{name} {row['Grid Size']}", []).append(value)
    return times


def main(paths: list[str]) -> None:
    for path in paths:
        times = kernel_times(path)
        print(f"== {path}")
        for name, ts in times.items():
            print(f"  {name[:80]:80s} {' '.join(f'{t:8.1f}' for t in ts)}")
        print(f"  {'sum of the medians':80s} {sum(statistics.median(ts) for ts in times.values()):8.1f}")


if __name__ == "__main__":
    main(sys.argv[1:] or sys.exit(__doc__))
