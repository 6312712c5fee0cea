#!/usr/bin/env bash
# Issue 3 on an H200 in ~2 minutes (for a session's last device seconds):
#   run(command="OUT=$OUT bash benches/results/cluster_push_exit/call_routing_h200.sh", carry=["dist/main"], kind="nvidia-h200")
# The routing GPU tests with main's wheel, then the routing bench (fused_moe - fused_experts).
source benches/call_common.sh
cat "$OUT/gpu.txt"
install_wheels main || exit 1
gpu_pytest main_routing main 60 -m gpu -n 16 tests/test_routing_gpu.py tests/test_routing_fused_gpu.py
routing_bench main 50 2
echo "[$(el) s] end"
