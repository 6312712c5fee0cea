#!/usr/bin/env bash
# The second call on an H200 this session (written 2026-12-07 14:05), after call_min.sh (run by
# session_2026-12-07d/call2.sh on an H200); dist/main = main:
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07e/call_h200b.sh", carry=["dist/main"], kind="nvidia-h200")
# 1. Issue 3's table on the H200: `swapmoe bench --with-routing` (6 paired rounds, the orders'
#    mean) of deepseek-v3-tp8 and qwen3-30b-a3b at M = 1, 8, 64. Prediction: within +2.0..+3.6 µs
#    as on the H100, deepseek M = 64 the largest.
# 2. Issue 6: Qwen3-30B-A3B TP2 (N = 384) and TP4 (N = 192) tuned with --per-hidden-size (K = 2048)
#    on the H200, bf16 and FP8 per tensor (the H200 has only Qwen3-235B's K = 4096 tables there).
# 3. GPU suite parts not run by call_min.sh, while time is left.
source benches/call_common.sh
D=${DEADLINE:-540}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
with_routing_bench main 1,8,64 deepseek-v3-tp8 qwen3-30b-a3b
for tp in 4 2; do
  for tag in bf16:none fp8:fp8_tensor; do
    tune_tables main q30_tp${tp}_${tag%%:*} 70 $((D - 120)) --model qwen3-30b-a3b --tp $tp --quant ${tag#*:} --per-hidden-size
  done
done
tar czf "$OUT/bench.tgz" -C "$OUT" bench $(cd "$OUT" && ls -d logs tables 2>/dev/null) && rm -rf "$OUT/bench" "$OUT/logs" "$OUT/tables"
left=$((D - $(el)))
[ $left -gt 100 ] && STEPS="fp8_other routing" DEADLINE=$left WHEEL=main OUT=$OUT bash benches/results/session_2026-12-06c/call_suite.sh
echo "[$(el) s] end"
