#!/usr/bin/env bash
# The first call of the next device session, ~9 minutes (say which card answered):
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05_pm/call_next.sh",
#       carry=["dist/head", "dist/pre_sa"])
# dist/head: a wheel of main (on this machine it is dist/ct's wheel, built from 4d6fbe9, whose
# src/, cuda/ and python/ are main's at dedc882; rebuild with `maturin build --release -o
# dist/head` if they change); dist/pre_sa: 94b15a6's kernels (main before 3b2667f).
# 1. If the card is an H200: the A/B of 3b2667f that so far ran on H100s only (qwen3
#    fp8_tensor M = 1, 2, 8, deepseek fp8_tensor M = 1, qwen3 fp8_channel M = 1).
# 2. The shared-memory hypothesis (NOTES "How much an epilogue overlap could win"): ncu's
#    SpeedOfLight, MemoryWorkloadAnalysis and ComputeWorkloadAnalysis of the e4m3 t128 GEMM1
#    and the bf16 t128 GEMM1 at Mixtral M = 4096 (shared-memory and tensor-pipe utilization,
#    and the SM clock under load).
# 3. Every GPU file but the FP8 one (pytest-rest, 1055 + 8 tests: 280 s was too little on an
#    H100 this session), in the time left.
source benches/call_common.sh  # $OUT, gpu.txt, el, ab, pack
if grep -q H200 "$OUT/gpu.txt"; then
  ab sa_tensor "pre_sa head" "qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1" "--quant fp8_tensor --no-read-floor" 150
  ab sa_channel "pre_sa head" "qwen3-30b-a3b:1" "--quant fp8_channel --no-read-floor" 60
fi
install_wheels head || exit 1
for c in "fp8_tensor wgmma_moe_fp8_gemm1" "none wgmma_moe_gemm1"; do
  read -r quant kernel <<< "$c"
  env PYTHONPATH=/tmp/site_head $( [ "$quant" != none ] && echo PROFILE_QUANT=$quant ) PROFILE_BACKENDS=oracle PROFILE_ROUTER=0 \
    timeout 90 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis -k regex:"$kernel" -c 1 \
    python3 benches/profile_case.py 4096 mixtral > "$OUT/sections_${quant}.txt" 2>&1
  echo "[$(el) s] ncu $quant: exit $?"
  grep -E "SM Frequency|Duration|Memory Throughput|L1/TEX Cache Throughput|Shared|Tensor|Compute \(SM\)" "$OUT/sections_${quant}.txt" | head -30
done
OUT=$OUT/rest WHEEL_DIR=dist/head TEST_TIMEOUT=$(( 560 - $(el) - 30 )) SERIAL_TIMEOUT=30 \
  bash benches/device_run.sh pytest-rest 2>&1 | grep -E "exit|FAILED|ERROR"
pack '*_summary.txt' 'sections_*.txt'
echo "[$(el) s] end"
