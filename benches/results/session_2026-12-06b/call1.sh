#!/usr/bin/env bash
# First call of the 18:19 session. On an H200: main's H200 call (call_min.sh). Elsewhere (an H100):
# g1 (GEMM1 by PDL, branch exp/wgmma-gemm1-pdl, this tree) and swl (swap GEMM2 consumers wait
# late, exp/swap-gemm2-wait-late; its tests are main's, which this tree holds) against main.
#   run(command="OUT=$OUT bash benches/results/session_2026-12-06b/call1.sh", carry=["dist/main", "dist/g1", "dist/swl"], kind="nvidia-h200")
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  DEADLINE=555 bash benches/results/h200_2026-12-06/call_min.sh
  exit
fi
source benches/call_common.sh
D=${DEADLINE:-545}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main g1 swl || exit 1
gpu_pytest g1_new g1 60 -m gpu -n 16 -k "gemm1_by_pdl" tests/test_gpu.py tests/test_fp8_gpu.py
gpu_pytest swl_swap swl 130 -m "gpu and not serial" -n 16 -o faulthandler_timeout=100 -k "$SPLIT_TESTS or queued_ahead or long_predecessor" tests/test_gpu.py tests/test_fp8_gpu.py
BENCH_TIMEOUT=30 ab g1_fp8 "main g1 g1 main" "deepseek-v3-tp8:16,64 qwen3-30b-a3b:16" "--quant fp8_tensor" 70
BENCH_TIMEOUT=30 ab swl_fp8 "main swl swl main" "qwen3-30b-a3b:1,2,4,8 deepseek-v3-tp8:1,2,4,8" "--quant fp8_tensor" 80
for w in g1 swl; do
  left=$((D - $(el) - 5))
  [ $left -gt 60 ] || break
  sanitize_variants $w 40 $((D - 45))
  for t in memcheck racecheck; do [ -f "$OUT/sanitize_$t.txt" ] && mv "$OUT/sanitize_$t.txt" "$OUT/sanitize_${t}_$w.txt"; done
done
left=$((D - $(el) - 5))
[ $left -gt 40 ] && BENCH_TIMEOUT=30 ab swl_bf16 "main swl swl main" "qwen3-30b-a3b:1,2,4 deepseek-v3-tp8:1,2,4" "" $left
pack 'pytest_*.log' 'ab_*_summary.txt'
echo "[$(el) s] end"
