"""Adds vLLM's measured Triton times to tuned tables, as the external candidate `vllm_triton`.

The GPU machine has no vLLM, so `swapmoe tune` cannot time vLLM's kernels there. The anchor
(`shared/anchors/h200_vllm_0.33_triton.json`) has them, measured on the same H200 with the
same method (a graph of 8 layers on distinct weight copies, L2 flushed, median), for vLLM's
two GEMM kernels alone. vLLM's whole op also runs its align, activation and sum kernels; in a
graph each further kernel costs about 1.5-1.8 µs (PERFORMANCE.md), so the estimate used is
GEMMs + 3 x 1.6 µs. The entry's `backend` becomes the fastest of all its times; without
`external_backends` the oracle takes the fastest swapmoe time (tables.rs).

Usage: python benches/merge_anchor.py ANCHOR.json TABLE.json [TABLE.json ...]
"""

import json
import sys

EXTRA_KERNELS_US = 3 * 1.6


def main(argv):
    anchor = json.load(open(argv[1]))
    for path in argv[2:]:
        table = json.load(open(path))
        meta = table["metadata"]
        variant = meta.get("dtype") if not meta.get("quant") else None
        rows = {r["M"]: r for r in anchor["rows"]
                if r.get("variant") == variant and r["E"] == meta["E"] and r["N"] == meta["N"]
                and r["K"] == meta["K"] and r["topk"] == meta["topk"]}
        merged = []
        for key, entry in table.items():
            if key == "metadata" or int(key) not in rows:
                continue
            gemm = rows[int(key)]["vllm_gemm_us"]
            est = round(gemm + EXTRA_KERNELS_US, 2)
            times = entry.setdefault("times_us", {})
            times["vllm_triton"] = est
            entry["vllm_triton_source"] = (
                f"anchor {anchor.get('measured')}: vLLM 0.33 Triton GEMMs {gemm:.1f} µs + "
                f"{EXTRA_KERNELS_US:.1f} µs for its align/activation/sum kernels (estimate)")
            best = min(times, key=times.get)
            entry["backend"] = best.split(":")[0]
            entry["time_us"] = times[best]
            if best.startswith("cuda_mma:t"):
                entry["token_tile"] = int(best.split(":t")[1])
            merged.append(f"M={key}: {best}")
        meta["external_times"] = ("vllm_triton: from the anchor (vLLM's GEMMs alone, measured on this "
                                  f"H200) + {EXTRA_KERNELS_US} µs; see benches/merge_anchor.py")
        json.dump(table, open(path, "w"), indent=1, ensure_ascii=False)
        print(path, "; ".join(merged))


if __name__ == "__main__":
    main(sys.argv)
