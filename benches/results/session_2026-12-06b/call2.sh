#!/usr/bin/env bash
# Second call of the 18:19 session. On an H200: main's H200 call (call_min.sh, on g1, ~560 s). Elsewhere: the
# wgmma selection (~230 s) on g1 (GEMM1 by PDL, this tree), then A/B main / g1 in bf16 at
# decode and in bf16 / FP8 at prefill (call1 measured FP8 decode: deepseek -1.2 us). The selection
# includes the GEMM1-by-PDL tests, whose helper moved to conftest (81f54ac) after call1.
#   run(command="OUT=$OUT bash benches/results/session_2026-12-06b/call2.sh", carry=["dist/main", "dist/g1"], kind="nvidia-h200")
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  WHEEL=g1 DEADLINE=${H200_DEADLINE:-560} bash benches/results/h200_2026-12-06/call_min.sh
  exit
fi
source benches/call_common.sh
D=${DEADLINE:-400}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main g1 || exit 1
K="(wgmma and not swap) or long_predecessor or queued_ahead or align_cluster or (fused_moe_matches_separate and wgmma) or cuda_graph_fused_moe"
gpu_pytest wgmma g1 240 -m gpu -n 16 -o faulthandler_timeout=60 -k "($K)" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
left=$((D - $(el) - 5))
[ $left -gt 40 ] && BENCH_TIMEOUT=40 ab g1_bf16 "main g1 g1 main" "deepseek-v3-tp8:16,64 mixtral-8x7b:4096" "" $((left < 130 ? left : 130))
left=$((D - $(el) - 5))
[ $left -gt 40 ] && BENCH_TIMEOUT=40 ab g1_prefill_fp8 "main g1 g1 main" "mixtral-8x7b:4096 deepseek-v3-tp8:1024" "--quant fp8_tensor" $left
pack 'pytest_*.log' 'ab_*_summary.txt'
echo "[$(el) s] end"
