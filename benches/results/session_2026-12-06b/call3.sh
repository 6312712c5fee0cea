#!/usr/bin/env bash
# Last call of the 18:19 session (~300 s of device time left: ~170 s of command). On an H200:
# main's qwen3-30b-a3b decode tables, bf16 and FP8 per tensor (the README's H200 tables predate
# the push form and the grouping). Elsewhere: as much of the wgmma selection on main's wheel
# (dist/g1 = main's kernels) as fits.
#   run(command="OUT=$OUT bash benches/results/session_2026-12-06b/call3.sh", carry=["dist/g1"], kind="nvidia-h200")
source benches/call_common.sh
D=${DEADLINE:-165}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels g1 || exit 1
if grep -q H200 "$OUT/gpu.txt"; then
  mkdir -p "$OUT/bench"
  for q in none fp8_tensor; do
    a=""; share=2; [ $q != none ] && a="--quant $q" && share=1
    timeout $(( (D - $(el)) / share )) env PYTHONPATH=/tmp/site_g1 python3 -m swapmoe bench --model qwen3-30b-a3b --m 1,2,4,8,16,32,64 $a --no-progress \
      --json "$OUT/bench/bench_qwen3-30b-a3b_$q.json" > "$OUT/bench/bench_qwen3-30b-a3b_$q.txt" 2>&1
    status "bench qwen3 $q" $?
    grep -E "^ +[0-9]+ " "$OUT/bench/bench_qwen3-30b-a3b_$q.txt"
  done
else
  K="(wgmma and not swap) or long_predecessor or queued_ahead or align_cluster or (fused_moe_matches_separate and wgmma) or cuda_graph_fused_moe"
  gpu_pytest wgmma g1 $((D - $(el) - 5)) -m gpu -n 16 -o faulthandler_timeout=60 -k "$K" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
fi
echo "[$(el) s] end"
