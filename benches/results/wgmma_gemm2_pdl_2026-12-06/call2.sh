#!/usr/bin/env bash
# cuda_wgmma's GEMM2 by PDL, second call (after call1.sh passed), ~8 minutes:
#   run(command="OUT=$OUT bash benches/results/wgmma_gemm2_pdl_2026-12-06/call2.sh", carry=["dist/main", "dist/pdl"])
# 1. A/B main / pdl in bf16 at decode (qwen3-30b-a3b M = 32, 64; deepseek-v3-tp8 M = 16, 64) and
#    at prefill (qwen3-30b-a3b bf16 and deepseek-v3-tp8 fp8_tensor at M = 1024), order main pdl pdl main;
# 2. compute-sanitizer memcheck and racecheck of every kernel variant with pdl;
# 3. the serial GPU tests on pdl, as far as time allows.
source benches/call_common.sh
D=${DEADLINE:-560}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main pdl || exit 1
BENCH_TIMEOUT=40 ab bf16 "main pdl pdl main" "qwen3-30b-a3b:32,64 deepseek-v3-tp8:16,64" "" 150
BENCH_TIMEOUT=60 ab prefill_bf16 "main pdl pdl main" "qwen3-30b-a3b:1024" "" 90
BENCH_TIMEOUT=60 ab prefill_fp8 "main pdl pdl main" "deepseek-v3-tp8:1024" "--quant fp8_tensor" 90
sanitize_variants pdl 60 $((D - 140))
left=$((D - $(el) - 10))
[ $left -gt 60 ] && gpu_pytest serial pdl $((left < 150 ? left : 150)) -m "gpu and serial" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
pack 'pytest_*.log' 'ab_*_summary.txt' 'sanitize_*.txt'
echo "[$(el) s] end"
