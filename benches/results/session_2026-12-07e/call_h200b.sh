#!/usr/bin/env bash
# The second call on an H200 this session (written 2026-12-07 14:05, reordered 14:25), after
# call_min.sh (run by session_2026-12-07d/call2.sh on an H200: decode tables, routing bench,
# swap split tests, sanitizers, routing tests); dist/main = main:
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07e/call_h200b.sh", carry=["dist/main"], kind="nvidia-h200")
# 1. Issue 5/6's prefill points on the H200 with main's kernels: `swapmoe bench` of the three
#    public shapes at M = 1024, 4096, bf16 and FP8 per tensor (the README's tables are of
#    2026-12-05's kernels; the H100 since read prefill unchanged within noise).
# 2. Issue 3's table on the H200: `swapmoe bench --with-routing` (6 paired rounds, the orders'
#    mean) of deepseek-v3-tp8 and qwen3-30b-a3b at M = 1, 8, 64. Prediction: +2.0..+3.6 µs as
#    on the H100, deepseek M = 64 the largest.
# 3. Issue 6: Qwen3-30B-A3B TP4 (N = 192, K = 2048) tuned with --per-hidden-size, if time is left.
# 4. GPU suite parts call_min.sh does not run (fp8_other, rest), in what is left.
source benches/call_common.sh
D=${DEADLINE:-540}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
PYTHONPATH=/tmp/site_main bench_shapes none 1024,4096 150
PYTHONPATH=/tmp/site_main bench_shapes fp8_tensor 1024,4096 260
with_routing_bench main 1,8,64 deepseek-v3-tp8 qwen3-30b-a3b
for tag in bf16:none fp8:fp8_tensor; do  # only where 25 s are left before the suite's share
  tune_tables main q30_tp4_${tag%%:*} 25 $((D - 200)) --model qwen3-30b-a3b --tp 4 --quant ${tag#*:} --per-hidden-size
done
left=$((D - $(el)))
if [ $left -gt 100 ]; then  # call_suite.sh packs $OUT when it ends
  STEPS="fp8_other rest" DEADLINE=$left WHEEL=main OUT=$OUT bash benches/results/session_2026-12-06c/call_suite.sh
else
  pack 'bench/paired_*.txt'
fi
echo "[$(el) s] end"
