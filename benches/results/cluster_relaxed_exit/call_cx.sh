#!/usr/bin/env bash
# The swap kernels' cluster sum (issues 5, 6), ~6 minutes with the start:
#   cx  = exp/cluster-relaxed-exit (6e7033d): pull form without GPU membars on rank 0's path (the
#         second barrier relaxed; rank 0 arrives relaxed at the first and writes no scratch)
#   cxp = exp/cluster-push (56c85b1): push form (peers st.async their sums into rank 0, counted on
#         an mbarrier; no memory barrier at all), pull form where the sums do not fit rank 0's ring
#   each built in its own worktree: git worktree add /tmp/B BRANCH; (source /root/env.sh; cd /tmp/B &&
#     CARGO_TARGET_DIR=/tmp/B_target maturin build --release -o /work/main/dist/NAME); dist/head = main
#   run(command="OUT=$OUT bash benches/results/cluster_relaxed_exit/call_cx.sh", carry=["dist/head", "dist/cx", "dist/cxp"])
# 1. The swap GPU tests with splits (bf16 and FP8: 1,1 to 8,8; splits 8 at M = 64 take cxp's pull
#    path) on cxp, then on cx.
# 2. A/B head / cx / cxp at decode, two rounds (outputs are bitwise the same by construction).
# 3. compute-sanitizer memcheck and racecheck on sanitize_case.py with cxp (the st.async path).
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels head cx cxp || exit 1
SPLIT_TESTS="test_swap_gemm1_ring or test_swap_gemm2_ring or test_wgmma_swap_backend or test_wgmma_swap_gemm2_launch"
gpu_pytest cxp_swap cxp 75 -m "gpu and not serial" -k "$SPLIT_TESTS" -n 16 tests/test_gpu.py tests/test_fp8_gpu.py || { pack; exit 1; }
gpu_pytest cx_swap cx 75 -m "gpu and not serial" -k "$SPLIT_TESTS" -n 16 tests/test_gpu.py tests/test_fp8_gpu.py
BENCH_TIMEOUT=40 ab cx_fp8 "head cx cxp" "qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1,8" "--quant fp8_tensor --no-read-floor" 150
BENCH_TIMEOUT=40 ab cx_bf16 "head cx cxp" "qwen3-30b-a3b:1,8" "--no-read-floor" 80
for tool in memcheck racecheck; do
  [ $(el) -gt 500 ] && break
  PYTHONPATH=/tmp/site_cxp timeout 45 compute-sanitizer --tool $tool --error-exitcode 9 python3 benches/sanitize_case.py > "$OUT/sanitize_$tool.txt" 2>&1
  status "sanitize $tool (cxp)" $?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|DIFFERENT|ALL OK" "$OUT/sanitize_$tool.txt"
done
pack 'ab_*_summary.txt' 'pytest_*.log'
echo "[$(el) s] end"
