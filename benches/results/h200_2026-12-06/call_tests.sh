#!/usr/bin/env bash
# The GPU tests and sanitizers of main (134bfa3's kernels: the push-form cluster sum) on an H200,
# ~9 minutes with the start:
#   run(command="OUT=$OUT bash benches/results/h200_2026-12-06/call_tests.sh", carry=["dist/main"], kind="nvidia-h200")
# In order of what the push form touched: the swap split tests (bf16 and FP8), compute-sanitizer
# memcheck and racecheck of every kernel variant (benches/sanitize_case.py), the routing GPU
# tests, then every other GPU file's non-serial tests and the FP8 file's non-wgmma ones, each
# only while time is left (the call ends by about $DEADLINE s).
source benches/call_common.sh
D=${DEADLINE:-560}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
SPLIT_TESTS="test_swap_gemm1_ring or test_swap_gemm2_ring or test_wgmma_swap_backend or test_wgmma_swap_gemm2_launch"
gpu_pytest swap_splits main 90 -m "gpu and not serial" -k "$SPLIT_TESTS" -n 16 tests/test_gpu.py tests/test_fp8_gpu.py
for tool in memcheck racecheck; do
  PYTHONPATH=/tmp/site_main timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 benches/sanitize_case.py > "$OUT/sanitize_$tool.txt" 2>&1
  status "sanitize $tool" $?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|DIFFERENT|ALL OK" "$OUT/sanitize_$tool.txt"
done
gpu_pytest routing main 60 -m gpu -n 16 tests/test_routing_gpu.py tests/test_routing_fused_gpu.py
rest=$(ls tests/test_*gpu*.py | grep -v -e test_fp8_gpu.py -e test_routing)
left=$((D - $(el) - 100))
[ $left -gt 60 ] && gpu_pytest rest main $left -m "gpu and not serial" -n 16 $rest
left=$((D - $(el) - 10))
[ $left -gt 30 ] && gpu_pytest fp8_not_wgmma main $left -m "gpu and not serial" -k "not wgmma" -n 16 tests/test_fp8_gpu.py
pack 'pytest_*.log' 'sanitize_*.txt'
echo "[$(el) s] end"
