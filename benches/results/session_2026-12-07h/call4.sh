#!/usr/bin/env bash
# Session 2026-12-07 (22:50-), call 4 (not run: too little device time was left to start a machine;
# build dist/ahead from branch exp/fp8-rows-ahead first): the dynamic-scale swap-AB GEMM2's producer loop unrolled
# by kFp8RowsAhead (each buffer in its own registers: no move of a buffer whose loads are in
# flight; dist/ahead) against dist/main (1fea3ce), in the device time left (~320 s):
#   run(command="DEADLINE=190 OUT=$OUT bash benches/results/session_2026-12-07h/call4.sh", carry=["dist/main", "dist/ahead"], kind="nvidia-h200")
# 1. A/B, swap-AB forced, FP8 128x128 blocks (2 rounds): qwen3-30b-a3b M = 1, 8,
#    deepseek-v3-tp8 M = 8, mixtral-8x7b M = 2 (call 3's version: +4 to +7% at the first three,
#    -9% at Mixtral).
# 2. The FP8 file's swap GPU tests (not serial) with dist/ahead.
# 3. A/B per channel at qwen3-30b-a3b M = 16 (token tile 16: 2 buffers, now unrolled too).
source benches/call_common.sh
D=${DEADLINE:-190}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main ahead || exit 1
F=SWAPMOE_BACKEND=cuda_wgmma_swap
BENCH_TIMEOUT=50 ab block "main:$F ahead:$F" "qwen3-30b-a3b:1,8 deepseek-v3-tp8:8 mixtral-8x7b:2" "--quant fp8_block128" 100
left=$((D - $(el) - 5))
[ $left -gt 40 ] && gpu_pytest fp8_swap ahead $((left < 70 ? left : 70)) -m "gpu and not serial" -n 16 -k swap tests/test_fp8_gpu.py
[ $(el) -lt $((D - 30)) ] && BENCH_TIMEOUT=25 ab channel "main:$F ahead:$F" "qwen3-30b-a3b:16" "--quant fp8_channel" $((D - $(el)))
pack 'ab_*_summary.txt' 'pytest_fp8_swap.log'
echo "[$(el) s] end"
