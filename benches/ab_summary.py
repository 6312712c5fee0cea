"""Summarizes `benches/ab.sh` logs: per case (model, bench arguments, M), each entry's time in
every round, their mean, and the difference from the first entry of the run.

    python benches/ab_summary.py OUT/ab_fp8.txt [OUT/ab_bf16.txt ...]

ab.sh writes a `=== round R MODEL M=1,2,8 wheel=ENTRY ARGS` line before each bench's table rows
(`M touched plan floor_us [read_us] swapmoe_us %floor ...`); the swapmoe time is the column
just before the first percentage, so the rows read the same with and without the read-floor
column. Rows of an entry the oracle set aside ("cannot run") or that failed are reported as
such, not averaged.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

HEADER = re.compile(r"^=== round (\d+) (\S+) M=(\S+) wheel=(\S+)\s*(.*)$")

Case = Tuple[str, str, int]  # model, bench arguments, M


def row_time(tokens: List[str]) -> Optional[Tuple[int, str, float]]:
    """(M, plan, swapmoe µs) of one table row, or None when the row is not one."""
    if len(tokens) < 5 or not tokens[0].isdigit():
        return None
    pct = next((i for i, t in enumerate(tokens) if t.endswith("%")), None)
    if pct is None or pct < 4:
        return None
    try:
        return int(tokens[0]), tokens[2], float(tokens[pct - 1])
    except ValueError:
        return None


def parse(lines) -> Tuple["OrderedDict[Case, OrderedDict[str, List[float]]]", Dict[Case, Dict[str, str]], List[str]]:
    """times[case][entry] = the time of every round, plans[case][entry] = the plan column, and
    the lines that report a problem (errors, entries set aside)."""
    times: "OrderedDict[Case, OrderedDict[str, List[float]]]" = OrderedDict()
    plans: Dict[Case, Dict[str, str]] = {}
    problems: List[str] = []
    model = entry = args = None
    for raw in lines:
        line = raw.rstrip("\n")
        h = HEADER.match(line)
        if h:
            _, model, _, entry, args = h.groups()
            continue
        if entry is None:
            continue
        r = row_time(line.split())
        if r is None:
            if line.strip():
                problems.append(f"{model} {args} {entry}: {line.strip()}")
            continue
        m, plan, t = r
        case = (model, args.strip(), m)
        times.setdefault(case, OrderedDict()).setdefault(entry, []).append(t)
        plans.setdefault(case, {})[entry] = plan
    return times, plans, problems


def summarize(lines) -> str:
    times, plans, problems = parse(lines)
    out: List[str] = []
    for case, entries in times.items():
        model, args, m = case
        out.append(f"{model} M={m} {args}".rstrip())
        base: Optional[float] = None
        for entry, ts in entries.items():
            mean = statistics.fmean(ts)
            rounds = " ".join(f"{t:.1f}" for t in ts)
            if base is None:
                base = mean
                diff = "(base)"
            else:
                diff = f"{mean - base:+.1f} us ({100 * (mean - base) / base:+.1f}%)"
            out.append(f"  {entry:40} {plans[case][entry]:22} {rounds:24} mean {mean:8.1f}  {diff}")
    if problems:
        out.append("not rows (errors, entries set aside):")
        out += [f"  {p}" for p in problems]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="ab.txt files written by benches/ab.sh")
    a = ap.parse_args(argv)
    for path in a.logs:
        with open(path) as f:
            print(f"# {path}")
            print(summarize(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
