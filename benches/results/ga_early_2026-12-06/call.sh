#!/usr/bin/env bash
# GEMM1's grouping with its ring barriers and tensor-map prefetch ahead of the PDL wait, and the
# three block scans of the grouping (and of route_align) in one pass (wheel dist/ga2, branch
# exp/ga-early), against main (dist/main, the landed grouping), ~9.5 minutes:
#   run(command="OUT=$OUT bash benches/results/ga_early_2026-12-06/call.sh", carry=["dist/main", "dist/ga2"])
# 1. ga2's grouping GPU tests (with the 256- and 2000-expert cases no GPU has run yet), the
#    chain and align-cluster tests, then the routing GPU tests (route_align changed);
# 2. A/B main / ga2 / main with the grouping off, FP8 per tensor at qwen3-30b-a3b (groups) and
#    deepseek-v3-tp8 (route_align), two rounds in the order main ga2 off ga2 main;
# 3. compute-sanitizer memcheck and racecheck of every kernel variant with ga2.
source benches/call_common.sh
D=${DEADLINE:-560}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main ga2 || exit 1
K="groups_the_slots_itself or long_predecessor or queued_ahead or align_cluster or cuda_graph_fused_moe"
gpu_pytest new ga2 130 -m gpu -n 16 -v -o faulthandler_timeout=60 -k "$K" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
grep -cE " PASSED " "$OUT/pytest_new.log"; grep -E " (FAILED|ERROR) " "$OUT/pytest_new.log" | head
gpu_pytest routing ga2 100 -m gpu -n 16 tests/test_routing_gpu.py tests/test_routing_fused_gpu.py
OFF="main:SWAPMOE_ALIGN_IN_GEMM1=off"
BENCH_TIMEOUT=40 ab tensor "main ga2 $OFF ga2 main" "qwen3-30b-a3b:16,32,64 deepseek-v3-tp8:16,64" "--quant fp8_tensor" 210
sanitize_variants ga2 60 $((D - 65))
pack 'pytest_*.log' 'ab_*_summary.txt' 'sanitize_*.txt'
echo "[$(el) s] end"
