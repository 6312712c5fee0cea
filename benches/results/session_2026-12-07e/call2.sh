#!/usr/bin/env bash
# This session's second device call (written 2026-12-07 15:05); dist/main = main:
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07e/call2.sh", carry=["dist/main"])
# H200: session_2026-12-06's call_min.sh (the README's decode tables with main's kernels, the
#   routing bench, the split tests, the sanitizers, the routing tests) and nothing else.
# H100: what the swap GEMM1's idle grid rows cost (NOTES "Session of 2026-12-07 (13:46-)", 4).
#   A layer of Qwen3-235B-A22B EP8 at M = 1 (one rank: 16 local experts of 128, topk 8) has 8
#   grid rows of 192 CTAs, 1 or 2 of them working; the same experts as a topk-1 (or topk-2) model
#   of 16 experts have 1 (or 2) rows, all working, with the same plan otherwise (tables off,
#   cuda_wgmma_swap, splits 8,1 forced, ring by $SWAPMOE_SWAP_GEMM1_RING: own / 3 / 2). The difference is
#   what a grid of fewer rows than slots would save. Prediction: without idle rows the own ring
#   is fastest, ~21-22 us at one expert in bf16 (the EP8 layer: 28.5 own, 23.1 ring 3), so the
#   fewer-rows grid would save ~1-2 us over the ring-of-3 rule there and ~5 over the own ring.
source benches/call_common.sh
D=${DEADLINE:-540}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
if grep -q H200 "$OUT/gpu.txt"; then
  WHEEL=main DEADLINE=$((D - $(el))) OUT=$OUT bash benches/results/h200_2026-12-06/call_min.sh
  exit
fi
mkdir -p "$OUT/bench"
one() {  # TAG RING QUANT ARGS...
  local tag=$1 ring=$2 q=$3 qa=()
  shift 3
  [ "$q" != none ] && qa=(--quant "$q")
  [ $(el) -gt $((D - 25)) ] && { echo "[$(el) s] $tag skipped"; return; }
  SWAPMOE_TABLES=off SWAPMOE_BACKEND=cuda_wgmma_swap SWAPMOE_SWAP_SPLITS=8,1 SWAPMOE_SWAP_GEMM1_RING=$ring \
    PYTHONPATH=/tmp/site_main \
    timeout 60 python3 -m swapmoe bench "$@" "${qa[@]}" --m 1 --no-baselines --no-read-floor --no-progress \
    --json "$OUT/bench/${tag}_${q}_ring$ring.json" > "$OUT/bench/${tag}_${q}_ring$ring.txt" 2>&1
  echo "[$(el) s] $tag $q ring $ring: $(grep -E '^ *1 ' "$OUT/bench/${tag}_${q}_ring$ring.txt" | awk '{print "touched", $2, $3, $5, "us"}')"
}
for round in 1 2; do
  for q in none fp8_block128; do
    for ring in 0 3 2; do
      one "ep8_s0_r$round" $ring $q --shape 128,8,4096,1536 --ep 8 --seed 0
      one "top1_r$round" $ring $q --shape 16,1,4096,1536
      one "ep8_s1_r$round" $ring $q --shape 128,8,4096,1536 --ep 8 --seed 1
      one "top2_r$round" $ring $q --shape 16,2,4096,1536
    done
  done
done
pack 'bench/ep8_s0_r1_none_ring0.txt'
echo "[$(el) s] end"
