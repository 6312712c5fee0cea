#!/usr/bin/env bash
# Session 2026-12-07 (22:50-), call 3 (ran on an H100 at 23:31; NOTES "The dynamic-scale GEMM2's rows
# several stages ahead"; dist/ahead was the shift version, fp8_rows_ahead_shift_rejected.patch): the dynamic-scale swap-AB GEMM2 with its token rows
# several stages ahead (dist/ahead: main + kFp8RowsAhead, 4 at NT = 8) against dist/main
# (1fea3ce):
#   run(command="DEADLINE=570 OUT=$OUT bash benches/results/session_2026-12-07h/call3.sh", carry=["dist/main", "dist/ahead"], kind="nvidia-h200")
# 1. same_bits.py --swap-only: every swap-AB output bit-identical (only load timing changed).
# 2. A/B, swap-AB forced, FP8 128x128 blocks (2 rounds): qwen3-30b-a3b M = 1, 4, 8,
#    deepseek-v3-tp8 M = 1, 8, mixtral-8x7b M = 2.
# 3. The FP8 file's swap GPU tests (not serial) with dist/ahead.
# 4. compute-sanitizer memcheck, then racecheck, of the FP8 swap-AB kernels (dist/ahead): 16 small
#    calls of test_swap_backend (every scheme, M = 1 and 5, no clusters and the widest ones);
#    benches/sanitize_case.py has no FP8 case.
source benches/call_common.sh
D=${DEADLINE:-570}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main ahead || exit 1
same_bits_swap main ahead
F=SWAPMOE_BACKEND=cuda_wgmma_swap
BENCH_TIMEOUT=60 ab block "main:$F ahead:$F" "qwen3-30b-a3b:1,4,8 deepseek-v3-tp8:1,8 mixtral-8x7b:2" "--quant fp8_block128" 240
left=$((D - $(el) - 10))
[ $left -gt 60 ] && gpu_pytest fp8_swap ahead $((left < 120 ? left : 120)) -m "gpu and not serial" -n 16 -k swap tests/test_fp8_gpu.py
sanitize_fp8_swap ahead 150 "$D"
pack 'bits_compare.txt' 'ab_*_summary.txt' 'pytest_fp8_swap.log' 'sanitize_*.txt'
echo "[$(el) s] end"
