"""Per-kernel durations from an Nsight Compute CSV of `benches/profile_case.py` (the
`device_run.sh ktimes` step): one line per swapmoe kernel and grid, its durations in µs in
launch order, and the sum of the medians of the op's kernels. Where the CSV also has
`dram__bytes_read.sum` / `dram__bytes_write.sum` (`KTIMES_METRICS=dram` in device_run.sh),
each line ends with the median DRAM bytes read and written (GB) and their rate (TB/s). Torch's
own kernels (weight quantization, the L2 flush) and the router that builds the inputs are
left out.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv python3 benches/profile_case.py M shape > k.csv
    python3 benches/kernel_times.py k.csv [more.csv ...]
"""

import csv
import statistics
import sys

NOT_THE_OP = ("at::", "void at", "elementwise", "vectorized", "distribution", "swapmoe_route_topk",
              "swapmoe_route_grouped")


TIME = "gpu__time_duration.sum"
READ, WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
TIME_UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
BYTE_UNITS = {"byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0}


def kernel_metrics(path: str) -> dict[str, dict[str, list[float]]]:
    """{"kernel (grid)": {metric: [value, ...]}} in first-launch order; durations in µs, bytes
    in GB."""
    lines = open(path).read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"{path}: no ncu CSV rows (did the profiled program fail?)")
    out: dict[str, dict[str, list[float]]] = {}
    for row in csv.DictReader(lines[start:]):
        metric = row["Metric Name"]
        if metric not in (TIME, READ, WRITE):
            continue
        name = row["Kernel Name"]
        if any(name.startswith(p) or p in name for p in NOT_THE_OP):
            continue
        units = TIME_UNITS if metric == TIME else BYTE_UNITS
        scale = units.get(row["Metric Unit"])
        if scale is None:
            raise SystemExit(f"{path}: unexpected unit {row['Metric Unit']!r} of {metric}")
        value = float(row["Metric Value"].replace(",", "")) * scale
        out.setdefault(f"{name} {row['Grid Size']}", {}).setdefault(metric, []).append(value)
    return out


def kernel_times(path: str) -> dict[str, list[float]]:
    """{"kernel (grid)": [µs, ...]} in first-launch order."""
    return {k: m[TIME] for k, m in kernel_metrics(path).items() if TIME in m}


def main(paths: list[str]) -> None:
    for path in paths:
        metrics = kernel_metrics(path)
        print(f"== {path}")
        total = 0.0
        for name, m in metrics.items():
            ts = m.get(TIME, [])
            line = f"  {name[:80]:80s} {' '.join(f'{t:8.1f}' for t in ts)}"
            if ts:
                total += statistics.median(ts)
            if READ in m and WRITE in m:
                r, w = statistics.median(m[READ]), statistics.median(m[WRITE])
                rate = (r + w) / (statistics.median(ts) * 1e-6) / 1e3 if ts else float("nan")
                line += f"   read {r:7.3f} GB  write {w:7.3f} GB  {rate:5.2f} TB/s"
            print(line)
        print(f"  {'sum of the medians':80s} {total:8.1f}")


if __name__ == "__main__":
    main(sys.argv[1:] or sys.exit(__doc__))
