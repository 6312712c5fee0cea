#!/usr/bin/env bash
# This session's second device call (written 2026-12-07 11:45): dist/main = main + the tables
# named by K (Qwen3-30B-A3B TP2/TP4 on the H100); dist/stamps = the same with
# SWAPMOE_CUDA_STAMPS=1 (per-CTA timestamps, benches/stamps.py).
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07d/call2.sh", carry=["dist/main","dist/stamps"], kind="nvidia-h200")
# H200: call_min.sh first (the README's decode tables with the push-form cluster sum).
# 1. The K-named tables against the (E, N) ones they replace for K = 2048: `swapmoe bench` of
#    Qwen3-30B-A3B TP4 (N = 192) FP8 per tensor M = 1-8 and bf16 M = 8-32, and TP2 (N = 384)
#    bf16 M = 1-8, with the shipped folder whole (new) and without its K= files (old), ABAB.
#    Prediction (the tune's times): TP4 FP8 M = 4 27.8 -> 25.5 µs, M = 1 13.3 -> 12.7;
#    TP4 bf16 M = 32 123.2 -> 114.4; TP2 bf16 M = 4 58.6 -> 55.8; the rest within ±1.5%.
# 2. `swapmoe bench --with-routing` (deepseek-v3-tp8, qwen3-30b-a3b, M = 1, 8, 64) with moe-exp_us
#    as the mean of the two orders' medians over 6 rounds (call 1's 5-round median took one
#    order: deepseek M = 64 +2.3 where the orders' mean was +3.5).
# 3. The reverse collision: Qwen3-235B-A22B TP2 (N = 768, K = 4096; its FP8 checkpoint on two
#    H200s) reads Qwen3-30B-A3B's (E, N) tables (K = 2048); tuned with --per-hidden-size.
# 4. Why the swap GEMM1's own ring (6 stages) loses to a ring of 3 where one expert is active:
#    per-CTA stamps of Qwen3-235B-A22B EP8 M = 1 bf16 (one rank: 16 of 128 experts) with GEMM1
#    rings own / 3 / 2, routing seeds with one local expert touched; Qwen3-30B-A3B M = 1 (8
#    experts) own / 3 as the contrast.
source benches/call_common.sh
D=${DEADLINE:-560}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main stamps || exit 1
if grep -q H200 "$OUT/gpu.txt"; then
  WHEEL=main DEADLINE=$((D - $(el))) OUT=$OUT bash benches/results/h200_2026-12-06/call_min.sh
  exit
fi
rm -rf /tmp/site_old && cp -r /tmp/site_main /tmp/site_old && rm -f /tmp/site_old/swapmoe/tables/*K=*
echo "K-named tables: new $(ls /tmp/site_main/swapmoe/tables | grep -c 'K=') old $(ls /tmp/site_old/swapmoe/tables | grep -c 'K=')"
mkdir -p "$OUT/bench" "$OUT/stamps"
kb() {  # TAG ROUND ARGS...
  local tag=$1 r=$2 v
  shift 2
  for v in new old; do
    s=main; [ $v = old ] && s=old
    PYTHONPATH=/tmp/site_$s timeout 60 python3 -m swapmoe bench --model qwen3-30b-a3b "$@" --no-baselines \
      --no-read-floor --no-progress --json "$OUT/bench/${tag}_${v}_r$r.json" > "$OUT/bench/${tag}_${v}_r$r.txt" 2>&1
    echo "[$(el) s] $tag $v r$r: $(grep -E '^ *[0-9]+ ' "$OUT/bench/${tag}_${v}_r$r.txt" | awk '{printf "M=%s %s %s; ", $1, $3, $5}')"
  done
}
for r in $(seq 1 "${KROUNDS:-2}"); do
  kb tp4_fp8 $r --tp 4 --quant fp8_tensor --m 1,2,4,8
  kb tp4_bf16 $r --tp 4 --m 8,16,32
  kb tp2_bf16 $r --tp 2 --m 1,2,4,8
done
with_routing_bench main 1,8,64 deepseek-v3-tp8 qwen3-30b-a3b
for tag in bf16:none fp8_tensor:fp8_tensor fp8_block128:fp8_block128; do
  tune_tables main q235_tp2_${tag%%:*} 60 $D --model qwen3-235b-a22b --tp 2 --quant ${tag#*:} --per-hidden-size
done
st() {  # TAG RING ARGS...
  local tag=$1 ring=$2
  shift 2
  [ $(el) -gt $((D - 40)) ] && { echo "[$(el) s] stamps $tag skipped"; return; }
  local env=()
  [ "$ring" != rule ] && env=(SWAPMOE_SWAP_GEMM1_RING=$ring)
  env "${env[@]}" PYTHONPATH=/tmp/site_stamps timeout 60 python3 benches/stamps.py "$@" --label "ring$ring" \
    --json "$OUT/stamps/stamps.json.gz" > "$OUT/stamps/${tag}_ring$ring.txt" 2>&1
  status "stamps $tag ring $ring" $?
  head -2 "$OUT/stamps/${tag}_ring$ring.txt"
}
for seed in 0 1 2; do
  for ring in 0 3 2; do st q235ep8_s$seed $ring --shape 128,8,4096,1536 --ep 8 --m 1 --seed $seed; done
done
for ring in 0 3; do st qwen3 $ring --shape qwen3 --m 1; done
tar czf "$OUT/bench.tgz" -C "$OUT" bench logs tables && rm -rf "$OUT/bench" "$OUT/logs" "$OUT/tables"
tar czf "$OUT/stamps.tgz" -C "$OUT" stamps && rm -rf "$OUT/stamps"
echo "[$(el) s] end"
