#!/usr/bin/env bash
# The core lets the GIL go while it launches and waits (src/python/mod.rs, py.detach): the
# thread test on main's wheel (expected to fail) and on dist/gil, then dist/gil's test_gpu and
# routing GPU files under 16 workers, as a check that every launch path still runs:
#   run(command="OUT=$OUT bash benches/results/multi_gpu_2026-12-06/call_gil.sh", carry=["dist/main", "dist/gil"])
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main gil || exit 1
gpu_pytest gil_test_main main 60 -m gpu -k "other_python_threads" tests/test_gpu.py
gpu_pytest gil_test_gil gil 60 -m gpu -k "other_python_threads or threads_context or queued_ahead" tests/test_gpu.py
gpu_pytest gil_suite gil 260 -m "gpu and not serial" -n 16 tests/test_gpu.py tests/test_routing_gpu.py tests/test_routing_fused_gpu.py
pack 'pytest_*.log'
echo "[$(el) s] end"
