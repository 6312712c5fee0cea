#!/usr/bin/env bash
# Where GEMM2's tail after GEMM1 goes with the push-form cluster sum (NOTES 2026-12-06 "Next
# steps" item 1), ~3 minutes with the start: per-CTA stamps of main's swap kernels at decode.
#   built on the CPU machine: SWAPMOE_CUDA_STAMPS=1 CARGO_TARGET_DIR=/tmp/stamps_target
#     maturin build --release -o dist/stamps   (from main; a profiling build, same kernels plus
#     %globaltimer records)
#   run(command="OUT=$OUT bash benches/results/h200_2026-12-06/call_stamps.sh", carry=["dist/stamps"])
# device_run.sh's stamps step; each case prints, per kernel and layer, the CTAs' entry, PDL wait, first stage, last stage
# and exit times from the layer's first GEMM1 entry (benches/stamps.py); the raw records go to
# stamps_raw.json.gz.
source benches/call_common.sh
STAMPS_CASES="qwen3:1::fp8_tensor deepseek:1::fp8_tensor qwen3:1 deepseek:1 qwen3:8::fp8_tensor qwen3:8" \
  WHEEL_DIR=dist/stamps timeout 300 bash benches/device_run.sh stamps
status "device_run.sh stamps" $?
tail -c 6000 "$OUT/stamps.txt"
echo "[$(el) s] end"
