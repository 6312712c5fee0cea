#!/usr/bin/env bash
# The caller's own workspace and stream (branch exp/caller-workspace, wheel dist/cw: main's
# kernels, no CUDA change) on a GPU, in one call (~7-9 minutes with the start):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-06d/call_cw.sh", carry=["dist/cw"], kind="nvidia-h200")
# On an H200 first call_min.sh with WHEEL=cw (the README's H200 tables, the routing bench, the
# swap split tests, the sanitizers, the routing tests: cw's kernels are main's). Then, on any
# card: the new GPU tests (test_caller_workspace_gpu.py, and test_cupy_gpu.py whole, whose
# capture tests changed) and the CPU file beside them. With REST=1, on an H100, then the
# suite's "rest" part (every GPU file but the FP8 and routing ones; 233 s at 16 workers on
# 2026-12-06 20:15) at WORKERS (default 4) xdist processes: whether fewer workers run it as
# fast (the first run, 22:00, had REST on: 201 s at 4).
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels cw || exit 1
if grep -q H200 "$OUT/gpu.txt"; then
  WHEEL=cw DEADLINE=${H200_DEADLINE:-450} OUT=$OUT bash benches/results/h200_2026-12-06/call_min.sh
fi
gpu_pytest caller_workspace cw 120 -m "gpu or not gpu" -n 8 tests/test_caller_workspace_gpu.py \
  tests/test_caller_workspace.py tests/test_cupy_gpu.py
if [ "${REST:-0}" = 1 ] && ! grep -q H200 "$OUT/gpu.txt"; then
  FILES=$(ls tests/test_*gpu*.py | grep -v -e test_fp8_gpu.py -e test_routing)
  left=$((${DEADLINE:-540} - $(el)))
  [ $left -gt 60 ] && gpu_pytest rest_w${WORKERS:-4} cw $left -m "gpu and not serial" -n ${WORKERS:-4} $FILES
fi
pack 'pytest_caller_workspace.log' 'pytest_rest*.log' "routing_cw.txt" 'sanitize_*.txt' 'bench/*_fp8_tensor.txt'
echo "[$(el) s] end"
