#!/usr/bin/env bash
# The back-to-back and long-predecessor tests with the stream held on a host flag
# (conftest.queued_ahead_of_the_gpu, cuStreamWaitValue32) instead of a 10 ms spin kernel, which
# 16 test processes overran: on dist/ctx under 16 workers and alone, on dist/mut2 (planted
# missing waits M2, M3) under 16 workers:
#   run(command="OUT=$OUT bash benches/results/pdl_2026-12-06/call_gate.sh", carry=["dist/ctx", "dist/mut2"])
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels ctx mut2 || exit 1
SEL="long_predecessor or back_to_back or threads_context"
FILES="tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py"
gpu_pytest gate_ctx_n16 ctx 120 -m gpu -n 16 -k "$SEL" $FILES
gpu_pytest gate_mut2_n16 mut2 120 -m gpu -n 16 -k "$SEL" $FILES
gpu_pytest gate_ctx ctx 120 -m gpu -k "$SEL" $FILES
pack 'pytest_*.log'
echo "[$(el) s] end"
