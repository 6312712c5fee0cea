#!/usr/bin/env bash
# On an H200: main's H200 call (benches/results/h200_2026-12-06/call_min.sh: decode tables,
# issue 3's table, sanitizers). Elsewhere: the new single-GPU tests of 19331ff (the host-flag
# gate, the thread's context) and the chains, on main's wheel:
#   run(command="OUT=$OUT bash benches/results/pdl_2026-12-06/call_gate_or_h200.sh", carry=["dist/main"], kind="nvidia-h200")
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  DEADLINE=555 bash benches/results/h200_2026-12-06/call_min.sh
  exit
fi
source benches/call_common.sh
cat "$OUT/gpu.txt"
install_wheels main || exit 1
gpu_pytest new_tests main 120 -m gpu -k "queued_ahead or threads_context or long_predecessor or back_to_back" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
# tests/test_multi_gpu.py's own code on one GPU (B = A = 0: nothing crosses devices)
SWAPMOE_TEST_OTHER_DEVICE=0 gpu_pytest multi_dry main 120 -m gpu tests/test_multi_gpu.py
echo "[$(el) s] end"
