"""Writes the seed tuned tables (python/swapmoe/tables/*.json) for the H200 from
measurements already in the repo, and from nothing else:

- ``benches/results/bench_<model>.json`` (2026-11-30 00:28, ``swapmoe bench``): the whole op
  with the heuristic's choice at each M; the token tile is read from the plan's reasons.
- ``benches/NOTES.md``, the per-backend tables of v3 (2026-11-29 23:46) and v4 (23:56):
  the same op forced to each backend in one run (the tile then was the heuristic's, and
  NOTES does not record it, so those times are labelled without a tile).

An entry's backend is the fastest candidate of the per-backend comparison where there is
one, else the one backend measured there (the heuristic's). M points with no measurement
are left out: the heuristics cover them (the oracle uses an entry only within 2x of its M). ``swapmoe tune`` on the H200 replaces these.

    python benches/seed_tables.py      # from the repository root
"""

import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "python", "swapmoe", "tables")

# benches/NOTES.md per-backend times (µs), copied from its tables: {model: {M: (section, {backend: µs})}}
NOTES = {
    "qwen3-30b-a3b": {
        1: ("v3", {"cuda_decode": 33.6, "cuda_generic": 36.0, "cuda_mma": 39.7}),
        8: ("v3", {"cuda_decode": 208.6, "cuda_generic": 164.7, "cuda_mma": 154.9}),
        16: ("v4", {"cuda_decode": 260.6, "cuda_mma": 207.2}),
        64: ("v3", {"cuda_decode": 1422.0, "cuda_generic": 531.6, "cuda_mma": 307.1}),
        1024: ("v3", {"cuda_mma": 545.6}),
    },
    "deepseek-v3-tp8": {
        1: ("v4", {"cuda_decode": 34.1, "cuda_generic": 51.1, "cuda_mma": 69.5}),
        2: ("v4", {"cuda_decode": 60.7, "cuda_generic": 90.7, "cuda_mma": 82.4}),
        4: ("v4", {"cuda_decode": 106.0, "cuda_generic": 158.5, "cuda_mma": 113.1}),
        8: ("v4", {"cuda_decode": 183.9, "cuda_generic": 268.3, "cuda_mma": 163.7}),
        16: ("v4", {"cuda_decode": 345.4, "cuda_generic": 480.4, "cuda_mma": 296.9}),
        64: ("v3", {"cuda_decode": 1153.0, "cuda_generic": 1125.0, "cuda_mma": 623.3}),
        1024: ("v3", {"cuda_mma": 1259.0}),
    },
    "mixtral-8x7b": {
        1: ("v4", {"cuda_decode": 189.5, "cuda_generic": 179.3, "cuda_mma": 234.8}),
        2: ("v4", {"cuda_decode": 360.4, "cuda_generic": 339.2, "cuda_mma": 385.2}),
        4: ("v4", {"cuda_decode": 529.1, "cuda_generic": 436.2, "cuda_mma": 465.1}),
        8: ("v4", {"cuda_decode": 900.6, "cuda_generic": 707.5, "cuda_mma": 612.5}),
        16: ("v4", {"cuda_decode": 1649.9, "cuda_generic": 1114.0, "cuda_mma": 724.2}),
        64: ("v3", {"cuda_decode": 5918.0, "cuda_generic": 3245.0, "cuda_mma": 918.2}),
        1024: ("v3", {"cuda_mma": 2892.0}),
    },
}
SECTION = {"v3": "benches/NOTES.md v3 per-backend table (2026-11-29 23:46)",
           "v4": "benches/NOTES.md v4 per-backend table (2026-11-29 23:56)"}


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    for model, notes in NOTES.items():
        res_path = f"benches/results/bench_{model}.json"
        with open(os.path.join(ROOT, res_path), encoding="utf-8") as f:
            rec = json.load(f)
        sh = rec["shape"]
        run = f"{res_path} ({rec['started'][:16].replace('T', ' ')}, whole op, the heuristic's choice)"
        whole = {}  # M -> (backend, tile or None, µs)
        for p in rec["points"]:
            plan = p["plan"]
            tile = None
            for r in plan["reasons"]:
                m = re.search(r"token tile (\d+)", r)
                if m:
                    tile = int(m.group(1))
            whole[p["M"]] = (plan["backend"], tile, p["results"]["swapmoe"]["time_us"])
        table = {"metadata": {
            "E": sh["E"], "N": sh["N"], "K": sh["K"], "topk": sh["topk"], "model": model,
            "device_name": rec["device"]["name"], "dtype": rec["dtype"], "quant": None,
            "swapmoe_version": rec["versions"]["swapmoe"], "date": rec["started"][:10],
            "method": rec["method"]["timer"] + f"; CUDA graph of {rec['method']['layers']} calls on distinct "
                      "weight copies, median, per call; uniform routing topk(softmax(randn(M, E)))",
            "generated_by": "benches/seed_tables.py from measurements in the repository (seed); "
                            "regenerate with swapmoe tune on the device",
        }}
        for M in sorted(set(whole) | set(notes)):
            entry = {}
            if M in notes:
                section, times = notes[M]
                best = min(times, key=times.get)
                backend = best
                tile = whole[M][1] if M in whole and whole[M][0] == best == "cuda_mma" else None
                time_us = times[best]
                source = f"backend and times_us: {SECTION[section]}"
                if M in whole and whole[M][0] == best:
                    time_us = round(whole[M][2], 1)
                    source = f"time_us: {run}; times_us: {SECTION[section]}"
                    if tile:
                        source += f"; token tile: the one measured in {res_path}"
                entry = {"backend": backend}
                if tile:
                    entry["token_tile"] = tile
                entry["time_us"] = time_us
                entry["times_us"] = times
                entry["source"] = source
            else:
                backend, tile, us = whole[M]
                entry = {"backend": backend}
                if tile:
                    entry["token_tile"] = tile
                entry["time_us"] = round(us, 1)
                entry["source"] = f"{run}; only this backend was measured at this M"
            table[str(M)] = entry
        # ';' for vLLM's ',': a wheel's RECORD is CSV and maturin does not quote commas (the
        # oracle reads both spellings as the same name)
        name = (f"E={sh['E']};N={sh['N']};device_name={rec['device']['name'].replace(' ', '_')};"
                f"dtype={rec['dtype']}.json")
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
        print("wrote", os.path.relpath(os.path.join(OUT, name), ROOT))


if __name__ == "__main__":
    main()
