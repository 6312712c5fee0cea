#!/usr/bin/env bash
# This session's first device call (written 2026-12-07 10:55; dist/main = main at b3069ce):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07d/call1.sh", carry=["dist/main"], kind="nvidia-h200")
# H200: call_min.sh (the README's decode tables with the push-form cluster sum, never run on an
#   H200, and the rest of its list).
# H100:
# 1. The bench's GPU test of the paired rounds in their ABBA / re-capture form (fdd8b61, never
#    run on a GPU), then `swapmoe bench --with-routing` for deepseek-v3-tp8 and qwen3-30b-a3b at
#    M = 1, 8, 64 in that form (issue 3's table).
# 2. Tables of another K: Qwen3-30B-A3B TP2 (N = 384) and TP4 (N = 192), K = 2048, tuned into a
#    scratch folder. Shipped tables are keyed by (E, N), so these deployments read Qwen3-235B's
#    TP4 / TP8 tables (K = 4096); the tune's per-candidate times at K = 2048 say what those
#    entries' launches cost there against the fastest.
source benches/call_common.sh
D=${DEADLINE:-560}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
if grep -q H200 "$OUT/gpu.txt"; then
  WHEEL=main DEADLINE=$((D - $(el))) OUT=$OUT bash benches/results/h200_2026-12-06/call_min.sh
  exit
fi
gpu_pytest bench_gpu main 90 -m gpu tests/test_bench_routing.py
mkdir -p "$OUT/bench" "$OUT/tables" "$OUT/logs"
for model in deepseek-v3-tp8 qwen3-30b-a3b; do
  PYTHONPATH=/tmp/site_main timeout 120 python3 -m swapmoe bench --model $model --m 1,8,64 --with-routing \
    --no-baselines --no-read-floor --no-progress --json "$OUT/bench/paired_${model}.json" \
    > "$OUT/bench/paired_${model}.txt" 2>&1
  status "bench --with-routing (ABBA) $model" $?
  grep -E "^ *[0-9]+ |^ *M |CHECK|error" "$OUT/bench/paired_${model}.txt" | cut -c1-220
done
tune() {  # TAG SECONDS ARGS...
  local tag=$1 s=$2
  shift 2
  [ $(el) -gt $((D - s)) ] && { echo "[$(el) s] tune $tag skipped"; return; }
  PYTHONPATH=/tmp/site_main timeout $s python3 -m swapmoe tune "$@" --m 1,2,4,8,16,32,64 --force --no-vllm \
    --out-dir "$OUT/tables" --no-progress > "$OUT/logs/tune_$tag.txt" 2>&1
  status "tune $tag" $?
  grep -E "^ *M=" "$OUT/logs/tune_$tag.txt" | cut -c1-120
}
tune q30_tp2_bf16 60 --model qwen3-30b-a3b --tp 2
tune q30_tp4_bf16 60 --model qwen3-30b-a3b --tp 4
tune q30_tp2_fp8_tensor 60 --model qwen3-30b-a3b --tp 2 --quant fp8_tensor
tune q30_tp4_fp8_tensor 60 --model qwen3-30b-a3b --tp 4 --quant fp8_tensor
tune q30_tp2_fp8_block128 60 --model qwen3-30b-a3b --tp 2 --quant fp8_block128
ls "$OUT/tables"
tar czf "$OUT/tables.tgz" -C "$OUT" tables && rm -rf "$OUT/tables"
tar czf "$OUT/logs.tgz" -C "$OUT" logs bench && rm -rf "$OUT/logs" "$OUT/bench"
echo "[$(el) s] end"
