#!/usr/bin/env bash
# The thread-context test on main (the op leaves the primary context current: expected to
# fail) and on dist/ctx (the caller's context restored after each op), then dist/ctx's
# test_gpu.py, routing and FP8 back-to-back tests as a check that every launch path still runs:
#   run(command="OUT=$OUT bash benches/results/multi_gpu_2026-12-06/call_ctx.sh", carry=["dist/main", "dist/ctx"])
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main ctx || exit 1
gpu_pytest ctx_test_main main 60 -m gpu -k threads_context tests/test_gpu.py
gpu_pytest ctx_test_ctx ctx 60 -m gpu -k threads_context tests/test_gpu.py
gpu_pytest multi_ctx ctx 60 -m gpu tests/test_multi_gpu.py
gpu_pytest gpu_ctx ctx 300 -m "gpu and not serial" -n 16 tests/test_gpu.py tests/test_routing_gpu.py tests/test_routing_fused_gpu.py
gpu_pytest fp8_ctx ctx 100 -m "gpu and not serial" -n 16 -k "back_to_back or long_predecessor or fewer_slots" tests/test_fp8_gpu.py
gpu_pytest serial_ctx ctx 90 -m "gpu and serial" tests/test_gpu.py tests/test_routing_gpu.py tests/test_routing_fused_gpu.py
pack 'pytest_ctx_test_*.log' 'pytest_gpu_ctx.log' 'pytest_fp8_ctx.log' 'pytest_serial_ctx.log'
echo "[$(el) s] end"
