#!/usr/bin/env bash
# The grouping as its own GEMM1 kernels (`_ga`, `dist/align2`): the GEMM1s that do not group
# are main's code again. New tests, the wgmma backend and chain tests, and an A/B against main
# (deepseek-v3-tp8's plan does not group: it must match main).
#   run(command="OUT=$OUT bash benches/results/align_in_gemm1_2026-12-06/call_align4.sh", carry=["dist/main", "dist/align2"])
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main align2 || exit 1
gpu_pytest new align2 60 -m gpu -n 16 -k "groups_the_slots_itself" tests/test_gpu.py tests/test_fp8_gpu.py
gpu_pytest wgmma align2 85 -m gpu -n 16 -v -k "test_wgmma_backend or long_predecessor or queued_ahead or align_cluster or test_wgmma_every_decode_size" \
  tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
grep -cE " PASSED " "$OUT/pytest_wgmma.log"; grep -E " (FAILED|ERROR) " "$OUT/pytest_wgmma.log" | head -10
BENCH_TIMEOUT=40 ab fp8 "main align2" "qwen3-30b-a3b:16,64 deepseek-v3-tp8:16,64" "--quant fp8_tensor" 100
pack 'pytest_*.log' 'ab_*_summary.txt'
echo "[$(el) s] end"
