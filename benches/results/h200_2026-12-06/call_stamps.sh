#!/usr/bin/env bash
# Where GEMM2's tail after GEMM1 goes with the push-form cluster sum (NOTES 2026-12-06 "Next
# steps" item 1), ~3 minutes with the start: per-CTA stamps of main's swap kernels at decode.
#   built on the CPU machine: SWAPMOE_CUDA_STAMPS=1 CARGO_TARGET_DIR=/tmp/stamps_target
#     maturin build --release -o dist/stamps   (from main; a profiling build, same kernels plus
#     %globaltimer records)
#   run(command="OUT=$OUT bash benches/results/h200_2026-12-06/call_stamps.sh", carry=["dist/stamps"])
# Each case prints, per kernel and layer, the CTAs' entry, PDL wait, first stage, last stage
# and exit times from the layer's first GEMM1 entry (benches/stamps.py); the raw records go to
# stamps_raw.json.gz.
source benches/call_common.sh
cat "$OUT/gpu.txt"
rm -rf /tmp/site_stamps && python3 -m pip install -q --no-index --no-deps --target /tmp/site_stamps dist/stamps/*.whl || exit 1
for c in qwen3:1::fp8_tensor deepseek:1::fp8_tensor qwen3:1 deepseek:1 qwen3:8::fp8_tensor qwen3:8; do
  IFS=: read -r shape m splits quant <<< "$c"
  echo "=== $c" >> "$OUT/stamps.txt"
  PYTHONPATH=/tmp/site_stamps timeout 60 python3 benches/stamps.py --shape $shape --m $m ${splits:+--splits $splits} \
    ${quant:+--quant $quant} --json "$OUT/stamps_raw.json.gz" >> "$OUT/stamps.txt" 2>&1
  status "stamps $c" $?
done
tail -c 6000 "$OUT/stamps.txt"
echo "[$(el) s] end"
