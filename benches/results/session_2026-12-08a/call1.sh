#!/usr/bin/env bash
# Session 2026-12-08 (00:48-), call 1 (not run: the device refused every start that day): the
# dynamic-scale swap-AB GEMM2's producer loop unrolled by kFp8RowsAhead (dist/ahead) against
# dist/main (1fea3ce's kernels; main's later commits touch no kernel). Build the three wheels
# first (~6 minutes each on 2 cores; dist/ is not kept between sessions):
#   bash benches/build_wheel.sh main
#   bash benches/build_wheel.sh ahead benches/results/session_2026-12-07h/fp8_rows_ahead_unrolled.patch
#   bash benches/build_wheel.sh ahead2 benches/results/session_2026-12-08a/fp8_rows_ahead_nt32_fallback.patch
# then:
#   run(command="DEADLINE=560 OUT=$OUT bash benches/results/session_2026-12-08a/call1.sh", carry=["dist/main", "dist/ahead", "dist/ahead2"])
# Predictions (NOTES "The dynamic-scale GEMM2's rows several stages ahead", version 2): blocks
# qwen3 M = 1 29.1 -> 26-28, M = 8 131 -> 110-120, deepseek M = 8 135 -> ~120, Mixtral M = 2
# 310 -> 200-250; per channel at qwen3 M = 16 (token tile 16, 2 buffers) 0 to -10%.
# 1. same_bits.py --swap-only: every swap-AB output bit-identical (only load timing changed).
# 2. A/B, swap-AB forced, FP8 128x128 blocks (2 rounds): qwen3-30b-a3b M = 1, 4, 8,
#    deepseek-v3-tp8 M = 1, 8, mixtral-8x7b M = 2.
# 3. A/B/C at token tiles 32 and 64, whose spills grew on the branch (NT = 64: 216-928 bytes
#    against 100-152): main, ahead, and ahead2 (ahead with main's loop kept from NT = 32:
#    fp8_rows_ahead_nt32_fallback.patch); blocks at qwen3-30b-a3b and Mixtral M = 64, per channel at qwen3 M = 32.
# 4. A/B, swap-AB forced, per channel: qwen3-30b-a3b M = 1, 8, 16, mixtral-8x7b M = 2.
# 5. The FP8 file's swap GPU tests (not serial) with dist/ahead.
# 6. compute-sanitizer memcheck, then racecheck, of the FP8 swap-AB calls (dist/ahead).
source benches/call_common.sh
D=${DEADLINE:-560}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main ahead ahead2 || exit 1
same_bits_swap main ahead
F=SWAPMOE_BACKEND=cuda_wgmma_swap
BENCH_TIMEOUT=60 ab block "main:$F ahead:$F" "qwen3-30b-a3b:1,4,8 deepseek-v3-tp8:1,8 mixtral-8x7b:2" "--quant fp8_block128" 200
BENCH_TIMEOUT=40 ab block64 "main:$F ahead:$F ahead2:$F" "qwen3-30b-a3b:64 mixtral-8x7b:64" "--quant fp8_block128" 110
BENCH_TIMEOUT=40 ab channel32 "main:$F ahead:$F ahead2:$F" "qwen3-30b-a3b:32" "--quant fp8_channel" 60
BENCH_TIMEOUT=40 ab channel "main:$F ahead:$F" "qwen3-30b-a3b:1,8,16 mixtral-8x7b:2" "--quant fp8_channel" 90
left=$((D - $(el) - 10))
[ $left -gt 60 ] && gpu_pytest fp8_swap ahead $((left < 120 ? left : 120)) -m "gpu and not serial" -n 16 -k swap tests/test_fp8_gpu.py
sanitize_fp8_swap ahead 120 "$D"
pack 'bits_compare.txt' 'ab_*_summary.txt' 'pytest_fp8_swap.log' 'sanitize_*.txt'
echo "[$(el) s] end"
