"""Adds vLLM's measured Triton times to tuned tables, as the external candidate `vllm_triton`.

The GPU machine has no vLLM, so `swapmoe tune` cannot time vLLM's kernels there. The anchor
(`shared/anchors/h200_vllm_0.33_triton.json`) has them, measured on the same H200 with the
same method (a graph of 8 layers on distinct weight copies, L2 flushed, median), for vLLM's
two GEMM kernels alone. vLLM's whole op also runs small kernels around them; in a graph each
further kernel costs about 1.5-1.8 µs (PERFORMANCE.md), so the estimate is GEMMs + 1.6 µs per
kernel:
- unquantized: align, activation, sum (3 kernels);
- FP8 (fp8_tensor, fp8_block128): align, input quantization, activation, intermediate
  quantization, sum (5 kernels).
At larger M those kernels take longer than a launch gap, so the estimate is a lower bound
of vLLM's time: it errs toward routing to vLLM. The anchor has no per-channel FP8 rows, so
per-channel tables get no vllm_triton times: the oracle keeps their calls on vLLM's Triton
inside vLLM (an FP8 entry that never timed vLLM cannot say swapmoe is faster), and outside
vLLM they choose among swapmoe's kernels. The entry's `backend` becomes the fastest of all
its times (with the token tile or swap-AB launch of its label); without `external_backends` the
oracle takes the fastest swapmoe time (tables.rs).

FP8 tables written by a `swapmoe tune` older than the `activation_scales` metadata get it
here, as tune sets it (static for fp8_tensor, whose bench inputs carry calibrated scales;
dynamic for the others).

Usage: python benches/merge_anchor.py ANCHOR.json TABLE.json [TABLE.json ...]
"""

import json
import sys

from swapmoe.tune import set_choice

KERNEL_US = 1.6
EXTRA_KERNELS = {None: ("align/activation/sum", 3),
                 "fp8_tensor": ("align/input quant/activation/intermediate quant/sum", 5),
                 "fp8_block128": ("align/input quant/activation/intermediate quant/sum", 5)}
ANCHOR_VARIANT = {"fp8_tensor": "fp8-tensor", "fp8_block128": "fp8-block128"}


def main(argv):
    anchor = json.load(open(argv[1]))
    for path in argv[2:]:
        table = json.load(open(path))
        meta = table["metadata"]
        quant = meta.get("quant")
        if quant and meta.get("activation_scales") is None:
            meta["activation_scales"] = "static" if quant == "fp8_tensor" else "dynamic"
        if quant and quant not in ANCHOR_VARIANT:
            print(path, f": the anchor has no {quant} rows; left as it is")
            json.dump(table, open(path, "w"), indent=1, ensure_ascii=False)
            continue
        variant = ANCHOR_VARIANT[quant] if quant else meta.get("dtype")
        what, count = EXTRA_KERNELS[quant]
        extra = round(count * KERNEL_US, 2)
        rows = {r["M"]: r for r in anchor["rows"]
                if r.get("variant") == variant and r["E"] == meta["E"] and r["N"] == meta["N"]
                and r["K"] == meta["K"] and r["topk"] == meta["topk"]}
        merged = []
        for key, entry in table.items():
            if key == "metadata" or int(key) not in rows:
                continue
            gemm = rows[int(key)]["vllm_gemm_us"]
            times = entry.setdefault("times_us", {})
            times["vllm_triton"] = round(gemm + extra, 2)
            entry["vllm_triton_source"] = (
                f"anchor {anchor.get('measured')}: vLLM 0.33 Triton GEMMs {gemm:.1f} µs + "
                f"{extra:.1f} µs for its {what} kernels (estimate)")
            best = min(times, key=times.get)
            set_choice(entry, best)
            entry["time_us"] = times[best]
            merged.append(f"M={key}: {best}")
        meta["external_times"] = (f"vllm_triton: from the anchor (vLLM's GEMMs alone, measured on this "
                                  f"H200) + {extra} µs for {count} more kernels; see benches/merge_anchor.py")
        json.dump(table, open(path, "w"), indent=1, ensure_ascii=False)
        print(path, "; ".join(merged))


if __name__ == "__main__":
    main(sys.argv)
