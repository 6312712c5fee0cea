#!/usr/bin/env bash
# The mbarrier waits with a suspend-time hint (branch exp/mbar-suspend, wheel dist/sh) against
# main (dist/main), interleaved in one run, on whichever card comes (~7 minutes):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07/call_sh.sh", carry=["dist/main", "dist/sh"], kind="nvidia-h200")
# Prediction: prefill a few % faster where the clock is power-capped (waiting warps sleep
# instead of re-issuing try_wait and a branch), decode unchanged within 0.3 us.
# Then, while time is left, the swap split tests and the wgmma selection on sh (every sm_90
# kernel's waits changed).
source benches/call_common.sh
D=${DEADLINE:-540}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main sh || exit 1
BENCH_TIMEOUT=45 ab sh_fp8 "main sh" "mixtral-8x7b:4096 qwen3-30b-a3b:1,8,4096" "--quant fp8_tensor" 200
left=$((D - $(el) - 5))
[ $left -gt 60 ] && BENCH_TIMEOUT=45 ab sh_bf16 "main sh" "mixtral-8x7b:4096 deepseek-v3-tp8:1,16" "" $((left < 170 ? left : 170))
left=$((D - $(el) - 5))
[ $left -gt 60 ] && gpu_pytest sh_splits sh $((left < 130 ? left : 130)) -m "gpu and not serial" -k "$SPLIT_TESTS" -n 16 tests/test_gpu.py tests/test_fp8_gpu.py
K="(wgmma and not swap) or long_predecessor or queued_ahead"
left=$((D - $(el) - 5))
[ $left -gt 60 ] && gpu_pytest sh_wgmma sh $left -m gpu -n 16 -k "($K)" tests/test_gpu.py tests/test_fp8_gpu.py
pack 'pytest_*.log' 'ab_*_summary.txt'
echo "[$(el) s] end"
