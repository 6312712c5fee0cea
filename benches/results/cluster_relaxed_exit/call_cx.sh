#!/usr/bin/env bash
# The swap kernels' cluster sum without GPU membars on rank 0's path (branch exp/cluster-relaxed-exit:
# the second barrier relaxed; rank 0 arrives relaxed at the first and writes no scratch), ~4 minutes:
#   maturin build --release -o dist/cx (the branch); dist/head (main)
#   run(command="OUT=$OUT bash benches/results/cluster_relaxed_exit/call_cx.sh", carry=["dist/head", "dist/cx"])
# 1. cx's swap GPU tests with splits (bf16 and FP8, a short selection), then
# 2. A/B head / cx at decode, two rounds.
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels head cx || exit 1
gpu_pytest cx_swap cx 60 -m "gpu and not serial" -k "test_swap_gemm1_ring or test_swap_gemm2_ring or test_wgmma_swap_backend or test_wgmma_swap_gemm2_launch" -n 16 tests/test_gpu.py tests/test_fp8_gpu.py
BENCH_TIMEOUT=40 ab cx_fp8 "head cx" "qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1" "--quant fp8_tensor --no-read-floor" 110
BENCH_TIMEOUT=40 ab cx_bf16 "head cx" "qwen3-30b-a3b:1,8" "--no-read-floor" 60
pack 'ab_*_summary.txt' 'pytest_*.log'
echo "[$(el) s] end"
