#!/usr/bin/env bash
# The sixth call of 2026-12-05 pm, ~1-2 minutes:
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05_pm/call_epilogue_share.sh", carry=["dist/ct"])
# How much of main's t128 GEMM1s is per-tile work (epilogue, prologue) rather than the main
# loop, the ceiling of any epilogue overlap (ping-pong): ncu source views of the bf16 GEMM1 at
# Mixtral M = 4096 and of the e4m3 GEMM1 at qwen3-30b-a3b M = 4096 (call 3 has the e4m3 GEMM1
# at Mixtral: 15% per tile). dist/ct = main's kernels.
source benches/call_common.sh  # $OUT, gpu.txt, el, ab, pack
OUT=$OUT/bf16 WHEEL_DIR=dist/ct NCU_SOURCE_CASES="mixtral:4096:none" NCU_SOURCE_KERNEL='wgmma_moe_gemm1' \
  timeout 80 bash benches/device_run.sh ncu-source 2>&1 | grep -E "ncu|=="
OUT=$OUT/qwen3 WHEEL_DIR=dist/ct NCU_SOURCE_CASES="qwen3:4096:fp8_tensor" NCU_SOURCE_KERNEL='wgmma_moe_fp8_gemm1' \
  timeout 80 bash benches/device_run.sh ncu-source 2>&1 | grep -E "ncu|=="
pack '*/source_*.txt'
echo "[$(el) s] end"
