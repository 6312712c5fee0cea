#!/usr/bin/env bash
# The non-FP8 GPU files on the real kernels again, with more time (call_tests.sh's "rest" step
# was killed at 95% with one F). The -v was meant to name each test as it ran, but
# gpu_pytest's -q cancels it: a failure would only be named at the end.
#   run(command="OUT=$OUT bash benches/results/test_audit_2026-12-06/call_rest.sh", carry=["dist/cupy"])
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels cupy || exit 1
gpu_pytest rest_v cupy 330 -m "gpu and not serial" -n 16 -v tests/test_gpu.py tests/test_routing_gpu.py tests/test_routing_fused_gpu.py tests/test_vllm_experts_gpu.py
grep -E "FAILED|ERROR" "$OUT/pytest_rest_v.log" | grep -v "^E " | head -20
grep -E -A40 "^_+ test_" "$OUT/pytest_rest_v.log" | grep -E "^E " | head -20
grep -c PASSED "$OUT/pytest_rest_v.log"
echo "[$(el) s] end"
