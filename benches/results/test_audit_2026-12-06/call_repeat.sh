#!/usr/bin/env bash
# The tests the audit added or changed in the non-FP8 GPU files, five times over (one run of
# call_tests.sh had one unnamed failure at 82% of those files; call_rest.sh's rerun passed all):
source benches/call_common.sh
export TIMEOUT_SIGNAL=KILL
install_wheels cupy || exit 1
for i in 1 2 3 4 5; do
  [ $(el) -gt 150 ] && break
  gpu_pytest rep$i cupy 40 -m "gpu and not serial" -n 16 -v -k "back_to_back or current_stream or deterministic or l2_hints or run_fp8" tests/test_gpu.py tests/test_routing_gpu.py tests/test_routing_fused_gpu.py tests/test_vllm_experts_gpu.py | head -3
  grep -E " FAILED " "$OUT/pytest_rep$i.log" | head -5
done
echo "[$(el) s] end"
