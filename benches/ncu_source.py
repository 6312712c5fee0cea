"""Where a kernel's time goes, per SASS instruction: a summary of Nsight Compute's source page
(the `device_run.sh ncu-source` step).

For each CSV (one kernel each, exported with `ncu -i REPORT --page source --csv --print-source
sass`): the instructions executed and the warp-stall samples in all, per opcode (sorted by
samples), and the lines with the most samples, by their index in the listing. Given two CSVs,
the opcode table also shows the second minus the first: how a variant of a kernel differs
(benches/NOTES.md "GEMM2 epilogue loads" found the per-channel GEMM2's waits this way).

    ncu --section SourceCounters --section WarpStateStats --import-source no -k regex:NAME -c 1 \\
        -o rep python3 benches/profile_case.py M shape
    ncu -i rep.ncu-rep --page source --csv --print-source sass > k.csv
    python3 benches/ncu_source.py k.csv [other.csv] [--top N] [--opcodes N]
"""

import argparse
import csv
import re
import sys
from collections import Counter
from dataclasses import dataclass, field

EXECUTED = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"
SOURCE = "Source"


class SourcePageError(ValueError):
    """A CSV that is not an ncu source page with the columns this summary reads."""


@dataclass
class SourcePage:
    kernel: str
    lines: list = field(default_factory=list)  # (index, source, executed, samples)

    @property
    def executed(self) -> int:
        return sum(line[2] for line in self.lines)

    @property
    def samples(self) -> int:
        return sum(line[3] for line in self.lines)


def count(text: str) -> int:
    """An ncu count ("1,584" or "1584"; "" or "-" is 0)."""
    text = text.strip().replace(",", "")
    return int(float(text)) if text not in ("", "-") else 0


def opcode(source: str) -> str:
    """The opcode of a SASS line without its predicate and modifiers: `@!P4 LDG.E.64 R2, ...` ->
    `LDG`."""
    text = re.sub(r"^@!?U?P\w+\s+", "", source.strip())
    return text.split(" ", 1)[0].split(".", 1)[0] if text else "?"


def read_page(path: str) -> SourcePage:
    rows = list(csv.reader(open(path, newline="")))
    header_at = next((i for i, r in enumerate(rows) if SOURCE in r and EXECUTED in r), None)
    if header_at is None:
        raise SourcePageError(f"{path}: no header row with {SOURCE!r} and {EXECUTED!r} columns "
                              "(export with: ncu -i REPORT --page source --csv --print-source sass)")
    header = rows[header_at]
    if SAMPLES not in header:
        raise SourcePageError(f"{path}: no {SAMPLES!r} column (profile with --section WarpStateStats "
                              "--section SourceCounters)")
    kernel = next((r[1] for r in rows[:header_at] if len(r) > 1 and r[0] == "Kernel Name"), "?")
    src, ex, sm = header.index(SOURCE), header.index(EXECUTED), header.index(SAMPLES)
    page = SourcePage(kernel)
    for index, r in enumerate(rows[header_at + 1:]):
        if len(r) <= max(src, ex, sm):
            continue
        page.lines.append((index, r[src].strip(), count(r[ex]), count(r[sm])))
    return page


def by_opcode(page: SourcePage) -> tuple[Counter, Counter]:
    executed, samples = Counter(), Counter()
    for _, source, ex, sm in page.lines:
        op = opcode(source)
        executed[op] += ex
        samples[op] += sm
    return executed, samples


def summary(pages: list[SourcePage], top: int, opcodes: int) -> str:
    out = []
    for p in pages:
        out.append(f"== {p.kernel}: {p.executed:,} instructions executed, {p.samples:,} stall samples, "
                   f"{len(p.lines)} SASS lines")
    tables = [by_opcode(p) for p in pages]
    ops = sorted(set().union(*(t[1] for t in tables), *(t[0] for t in tables)),
                 key=lambda o: -max(t[1][o] for t in tables))[:opcodes]
    head = "opcode".ljust(10) + "".join(f"{'executed':>14}{'samples':>9}" for _ in pages)
    if len(pages) == 2:
        head += f"{'d executed':>14}{'d samples':>10}"
    out += ["", head]
    for op in ops:
        line = op.ljust(10) + "".join(f"{ex[op]:>14,}{sm[op]:>9,}" for ex, sm in tables)
        if len(pages) == 2:
            (ex0, sm0), (ex1, sm1) = tables
            line += f"{ex1[op] - ex0[op]:>+14,}{sm1[op] - sm0[op]:>+10,}"
        out.append(line)
    for p in pages:
        out += ["", f"lines with the most stall samples, {p.kernel} (index in the listing, samples, executed):"]
        for index, source, ex, sm in sorted(p.lines, key=lambda line: -line[3])[:top]:
            out.append(f"{index:>7} {sm:>7,} {ex:>12,}  {source[:90]}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="source pages, one kernel each (two: compared)")
    ap.add_argument("--top", type=int, default=25, help="lines with the most samples to list (25)")
    ap.add_argument("--opcodes", type=int, default=25, help="opcodes to list (25)")
    args = ap.parse_args(argv)
    if len(args.csv) > 2:
        ap.error(f"csv: expected one or two files, got {len(args.csv)}")
    try:
        pages = [read_page(p) for p in args.csv]
    except (OSError, SourcePageError) as e:
        print(f"ncu_source: {e}", file=sys.stderr)
        return 2
    print(summary(pages, args.top, args.opcodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
