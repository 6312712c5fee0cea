#!/usr/bin/env bash
# The smallest useful call (~60-100 s): the caller-workspace tests on main, whose last edits
# (the CuPy refusal with stream=, a host workspace for fused_moe) never ran on a GPU; dist/$WHEEL
# (default main).
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07/call_cw_only.sh", carry=["dist/main"], kind="nvidia-h200")
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
W=${WHEEL:-main}
install_wheels $W || exit 1
gpu_pytest caller_workspace $W 100 -m "gpu or not gpu" -n 8 tests/test_caller_workspace_gpu.py \
  tests/test_caller_workspace.py tests/test_cupy_gpu.py
echo "[$(el) s] end"
