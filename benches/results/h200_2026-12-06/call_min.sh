#!/usr/bin/env bash
# main (134bfa3's kernels: the push-form cluster sum) on an H200 in one call, ~9.5 minutes with
# the start, in order of value; each later step runs only while time is left (ends by ~$DEADLINE s):
#   run(command="OUT=$OUT bash benches/results/h200_2026-12-06/call_min.sh", carry=["dist/main"], kind="nvidia-h200")
# 1. `swapmoe bench` of the three public shapes at decode, bf16 and FP8 per tensor (README tables).
# 2. The routing bench (fused_moe - fused_experts, issue 3).
# 3. The swap split GPU tests (bf16 and FP8, the kernels the push form changed).
# 4. compute-sanitizer memcheck and racecheck of every kernel variant (sanitize_case.py; FP8 too
#    since 2026-12-07 23:50), each tool started only while 125 s are left.
# 5. The routing GPU tests.
source benches/call_common.sh
D=${DEADLINE:-565}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
W=${WHEEL:-main}  # dist/$W: main by default; call2.sh passes g1 (= main's kernels since b33c5f5)
install_wheels $W || exit 1
DECODE=1,2,4,8,16,32,64
PYTHONPATH=/tmp/site_$W bench_shapes none $DECODE
PYTHONPATH=/tmp/site_$W bench_shapes fp8_tensor $DECODE
routing_bench $W 80 3
left=$((D - $(el) - 10))
[ $left -gt 70 ] && gpu_pytest swap_splits $W $((left < 90 ? left : 90)) -m "gpu and not serial" -k "$SPLIT_TESTS" -n 16 tests/test_gpu.py tests/test_fp8_gpu.py
sanitize_variants $W 120 $((D - 125))  # 120 s per tool: sanitize_case.py has 24 FP8 calls since 2026-12-07 23:50
left=$((D - $(el) - 8))
[ $left -gt 25 ] && gpu_pytest routing $W $((left < 60 ? left : 60)) -m gpu -n 16 tests/test_routing_gpu.py tests/test_routing_fused_gpu.py
pack 'pytest_*.log' "routing_$W.txt" 'sanitize_*.txt' 'bench/*_fp8_tensor.txt'
echo "[$(el) s] end"
