#!/usr/bin/env bash
# The push form's first cluster barrier opened early (issues 5, 6), ~7 minutes with the start:
#   main = 134bfa3's kernels (push form), co = exp/cluster-open-early (peers arrive at start)
#   built on the CPU machine: maturin build --release -o dist/main (main); git worktree add
#     /tmp/Bo exp/cluster-open-early; (cd /tmp/Bo && CARGO_TARGET_DIR=/tmp/cx2_target maturin
#     build --release -o /work/main/dist/co)
#   run(command="OUT=$OUT bash benches/results/cluster_open_early/call_co.sh", carry=["dist/main", "dist/co"], kind="nvidia-h200")
# 1. The swap split GPU tests (bf16 and FP8, splits 1,1 to 8,8) on co.
# 2. Decode A/B main / co, two rounds, FP8 per tensor and bf16.
# 3. compute-sanitizer memcheck and racecheck on co; the routing GPU tests on main.
source benches/call_common.sh
D=${DEADLINE:-560}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main co || exit 1
SPLIT_TESTS="test_swap_gemm1_ring or test_swap_gemm2_ring or test_wgmma_swap_backend or test_wgmma_swap_gemm2_launch"
gpu_pytest co_swap co 90 -m "gpu and not serial" -k "$SPLIT_TESTS" -n 16 tests/test_gpu.py tests/test_fp8_gpu.py
co_ok=$?
if [ $co_ok = 0 ]; then
  BENCH_TIMEOUT=40 ab co_fp8 "main co" "qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1,2,8" "--quant fp8_tensor --no-read-floor" 150
  BENCH_TIMEOUT=40 ab co_bf16 "main co" "qwen3-30b-a3b:1,8 deepseek-v3-tp8:1,8" "--no-read-floor" 110
  for tool in memcheck racecheck; do
    [ $(el) -gt $((D - 130)) ] && break
    PYTHONPATH=/tmp/site_co timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 benches/sanitize_case.py > "$OUT/sanitize_$tool.txt" 2>&1
    status "sanitize $tool (co)" $?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|DIFFERENT|ALL OK" "$OUT/sanitize_$tool.txt"
  done
fi
left=$((D - $(el) - 5))
[ $left -gt 30 ] && gpu_pytest main_routing main $((left < 70 ? left : 70)) -m gpu -n 16 tests/test_routing_gpu.py tests/test_routing_fused_gpu.py
pack 'ab_*_summary.txt' 'pytest_*.log' 'sanitize_*.txt'
echo "[$(el) s] end"
