#!/usr/bin/env bash
# Session 2026-12-07 (16:47-), call 3; dist/main = main:
#   run(command="DEADLINE=... OUT=$OUT bash benches/results/session_2026-12-07f/call5.sh", carry=["dist/main"], kind="nvidia-h200")
# H200: session_2026-12-06's call_min.sh (the README's decode tables with main's kernels first).
# H100: is this machine one whose GEMM2-by-PDL launches run slow (call3's, 17:01: +5-11%) or not
#   (call4's, 17:16)? The same launch triple at three shapes, tables off (the heuristics), ring 3
#   with GEMM2 after GEMM1 (r3p0) and ring 3 with GEMM2 by PDL (r3p1), 2 rounds. Prediction (call4's
#   card): qwen3-235b TP2 M = 16 heur 516 / r3p0 504 / r3p1 524, M = 4 203 / 196.5 / 202; a
#   slow-PDL machine reads heur and r3p1 5-11% above those while r3p0 stays within 2%.
source benches/call_common.sh
D=${DEADLINE:-300}
start_call main $D
mkdir -p "$OUT/bench"
bb() {  # TAG ROUND MODEL MS ENV...
  local tag=$1 r=$2 model=$3 ms=$4 m
  shift 4
  m=${model//,/_}
  [ $(el) -gt $((D - 30)) ] && { echo "[$(el) s] $m $tag r$r skipped"; return; }
  env "$@" PYTHONPATH=/tmp/site_main timeout 90 python3 -m swapmoe bench --model ${model%%,*} \
    $([ "${model#*,}" != "$model" ] && echo --tp ${model#*,}) --m $ms --no-baselines --no-read-floor --no-progress \
    --json "$OUT/bench/${m}_${tag}_r$r.json" > "$OUT/bench/${m}_${tag}_r$r.txt" 2>&1
  echo "[$(el) s] $m $tag r$r: $(grep -E '^ *[0-9]+ ' "$OUT/bench/${m}_${tag}_r$r.txt" | awk '{printf "M=%s %s %s; ", $1, $3, $5}')"
}
for r in 1 2; do
  for model in qwen3-235b-a22b,2:4,16 qwen3-30b-a3b:4,16 deepseek-v3-tp8:8,16; do
    bb heur $r ${model%%:*} ${model#*:} SWAPMOE_TABLES=off
    for v in r3p0 r3p1; do
      bb $v $r ${model%%:*} ${model#*:} SWAPMOE_BACKEND=cuda_wgmma_swap SWAPMOE_SWAP_GEMM1_RING=3 SWAPMOE_SWAP_GEMM2_PDL=${v:3:1}
    done
  done
done
pack 'bench/qwen3-235b-a22b_2_heur_r1.txt'
echo "[$(el) s] end"
