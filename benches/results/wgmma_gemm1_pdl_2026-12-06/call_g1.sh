#!/usr/bin/env bash
# cuda_wgmma's GEMM1 after route_align / quantize-x by PDL alone (branch exp/wgmma-gemm1-pdl,
# wheel dist/g1) against main (dist/main), one short call (~4 minutes):
#   run(command="OUT=$OUT bash benches/results/wgmma_gemm1_pdl_2026-12-06/call_g1.sh", carry=["dist/main", "dist/g1"])
# 1. the new GPU tests (bf16 and FP8: GEMM1 by PDL against not, bit for bit, the reference,
#    queued reruns);
# 2. A/B main / g1, FP8 per tensor and bf16, at route_align plans (deepseek-v3-tp8 M = 16, 64);
# 3. compute-sanitizer memcheck and racecheck of every kernel variant on g1, as time allows.
source benches/call_common.sh
D=${DEADLINE:-240}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main g1 || exit 1
gpu_pytest new g1 60 -m gpu -n 16 -k "gemm1_by_pdl" tests/test_gpu.py tests/test_fp8_gpu.py
BENCH_TIMEOUT=30 ab fp8 "main g1 g1 main" "deepseek-v3-tp8:16,64" "--quant fp8_tensor" 60
left=$((D - $(el) - 5))
[ $left -gt 30 ] && BENCH_TIMEOUT=30 ab bf16 "main g1 g1 main" "deepseek-v3-tp8:16,64" "" $left
sanitize_variants g1 40 $((D - 45))
pack 'pytest_*.log' 'ab_*_summary.txt' 'sanitize_*.txt'
echo "[$(el) s] end"
