#!/usr/bin/env bash
# cuda_wgmma's kernels after the first by PDL (branch exp/wgmma-gemm2-pdl, wheel dist/pdl)
# against main (dist/main, built from the branch's base), first call, ~9.5 minutes:
#   run(command="OUT=$OUT bash benches/results/wgmma_gemm2_pdl_2026-12-06/call1.sh", carry=["dist/main", "dist/pdl"])
# 1. the new GPU tests (bf16 and FP8: PDL on against off, route_align's and GEMM1's tile lists),
#    then the wgmma, chain, align-cluster and graph tests, on pdl;
# 2. A/B main / pdl / pdl with GEMM2's and with GEMM1's knob off, FP8 per tensor at
#    qwen3-30b-a3b (GEMM1 groups: no early weights, no GEMM1 knob) and deepseek-v3-tp8
#    (route_align: early weights, GEMM1 by PDL), order main pdl off2 off1 pdl main.
# (call2.sh: bf16 and prefill, the sanitizers, the serial tests.)
source benches/call_common.sh
D=${DEADLINE:-560}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main pdl || exit 1
gpu_pytest new pdl 120 -m gpu -n 16 -o faulthandler_timeout=60 -k "gemm2_by_pdl" tests/test_gpu.py tests/test_fp8_gpu.py
K="(wgmma and not swap) or long_predecessor or queued_ahead or align_cluster or (fused_moe_matches_separate and wgmma) or cuda_graph_fused_moe"
gpu_pytest wgmma pdl 170 -m gpu -n 16 -o faulthandler_timeout=60 -k "($K) and not gemm2_by_pdl" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
OFF2="pdl:SWAPMOE_WGMMA_GEMM2_PDL=0"
OFF1="pdl:SWAPMOE_WGMMA_GEMM1_PDL=0"
BENCH_TIMEOUT=40 ab fp8 "main pdl $OFF2 $OFF1 pdl main" "qwen3-30b-a3b:16,32,64 deepseek-v3-tp8:16,64" "--quant fp8_tensor" $((D - $(el) - 10))
pack 'pytest_*.log' 'ab_*_summary.txt'
echo "[$(el) s] end"
