#!/usr/bin/env bash
# Third call (same `dist/align`, the align-cluster test now forcing the align kernel):
#   run(command="OUT=$OUT bash benches/results/align_in_gemm1_2026-12-06/call_align3.sh", carry=["dist/main", "dist/align"])
# 1. the cuda_wgmma, chain, align-cluster and fused_moe GPU tests, verbose (each test's
#    result in the log even if the run is cut), with a traceback of any test past 60 s;
# 2. A/B FP8 per tensor: main, align with the rule off, align: what the kernels' change costs
#    where GEMM1 does not group the slots, and what grouping them gains;
# 3. compute-sanitizer memcheck of every kernel variant.
source benches/call_common.sh
D=${DEADLINE:-480}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main align || exit 1
K="(wgmma and not swap) or long_predecessor or queued_ahead or align_cluster or (fused_moe_matches_separate and wgmma) or cuda_graph_fused_moe"
gpu_pytest wgmma align 230 -m gpu -n 16 -v -o faulthandler_timeout=60 -k "$K" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
grep -cE " PASSED " "$OUT/pytest_wgmma.log"; grep -E " (FAILED|ERROR) |Timeout" "$OUT/pytest_wgmma.log" | head -10
BENCH_TIMEOUT=40 ab fp8 "main align:SWAPMOE_ALIGN_IN_GEMM1=off align" "qwen3-30b-a3b:16,64 deepseek-v3-tp8:16,64" "--quant fp8_tensor" 140
if [ $(el) -lt $((D - 40)) ]; then
  PYTHONPATH=/tmp/site_align timeout $((D - $(el) - 5)) compute-sanitizer --tool memcheck --error-exitcode 9 python3 benches/sanitize_case.py \
    > "$OUT/sanitize_memcheck.txt" 2>&1
  status "sanitize memcheck (align)" $?
  grep -E "ERROR SUMMARY|DIFFERENT|ALL OK" "$OUT/sanitize_memcheck.txt"
fi
pack 'pytest_*.log' 'ab_*_summary.txt' 'sanitize_*.txt'
echo "[$(el) s] end"
