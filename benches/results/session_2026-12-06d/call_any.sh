#!/usr/bin/env bash
# One call on whichever card comes (dist/cw = main's product files since 19baa58):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-06d/call_any.sh", carry=["dist/cw"], kind="nvidia-h200")
# H200: call_cw.sh (call_min.sh's tables, routing bench, split tests and sanitizers within
# $H200_DEADLINE s, then the caller-workspace tests). H100: the caller-workspace tests, then the
# suite's swap_splits and serial parts (not yet run with the workspace checks) within $DEADLINE s.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  H200_DEADLINE=${H200_DEADLINE:-330} OUT=$OUT bash benches/results/session_2026-12-06d/call_cw.sh
  exit
fi
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels cw || exit 1
gpu_pytest caller_workspace cw 120 -m "gpu or not gpu" -n 8 tests/test_caller_workspace_gpu.py \
  tests/test_caller_workspace.py tests/test_cupy_gpu.py
STEPS="swap_splits serial" DEADLINE=$((${DEADLINE:-330} - $(el))) WHEEL=cw OUT=$OUT bash benches/results/session_2026-12-06c/call_suite.sh
echo "[$(el) s] end"
