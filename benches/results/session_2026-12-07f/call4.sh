#!/usr/bin/env bash
# Session 2026-12-07 (16:47-), call 2; dist/main = main:
#   run(command="DEADLINE=... OUT=$OUT bash benches/results/session_2026-12-07f/call4.sh", carry=["dist/main"], kind="nvidia-h200")
# H200: session_2026-12-06's call_min.sh (the README's decode tables with main's kernels first).
# H100: why call3.sh's old plans read slower in the op than the K = 4096 tune timed them
#   (bf16 Qwen3-235B TP2 M = 16: heuristics' launch, own ring 5 + GEMM2 by PDL, 515.1 in the tune
#   on another H100 at 14:47, 575 in the bench at 17:01; M = 4 ring 3 + GEMM2 by PDL 201.1 / 211.7;
#   the GEMM2-after-GEMM1 launches agreed within 2%). On one card, in one call: the bench with the
#   tables off (the heuristics' launch) and with the shipped tables, the tune of the same points,
#   the bench again. Prediction: the tune reads what the bench reads on the same card (a card
#   difference, not a tool one), i.e. the plain cuda_wgmma_swap at M = 16 near 575 in both.
source benches/call_common.sh
D=${DEADLINE:-400}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
h200_call_min main $D
mkdir -p "$OUT/bench" "$OUT/logs"
bb() {  # TAG ROUND ENV...
  local tag=$1 r=$2
  shift 2
  [ $(el) -gt $((D - 30)) ] && { echo "[$(el) s] $tag r$r skipped"; return; }
  env "$@" PYTHONPATH=/tmp/site_main timeout 90 python3 -m swapmoe bench --model qwen3-235b-a22b --tp 2 --m 4,16 \
    --no-baselines --no-read-floor --no-progress --json "$OUT/bench/${tag}_r$r.json" > "$OUT/bench/${tag}_r$r.txt" 2>&1
  echo "[$(el) s] $tag r$r: $(grep -E '^ *[0-9]+ ' "$OUT/bench/${tag}_r$r.txt" | awk '{printf "M=%s %s %s; ", $1, $3, $5}')"
}
bb heur 1 SWAPMOE_TABLES=off
bb tables 1 X=1
PYTHONPATH=/tmp/site_main timeout 150 python3 -m swapmoe tune --model qwen3-235b-a22b --tp 2 --m 4,16 --per-hidden-size \
  --force --no-vllm --out-dir "$OUT/tables" --no-progress > "$OUT/logs/tune.txt" 2>&1
status tune $?
grep -E "^ *M=" "$OUT/logs/tune.txt" | cut -c1-260
bb heur 2 SWAPMOE_TABLES=off
bb tables 2 X=1
for v in r3p1 r3p0; do  # the tune's labels, forced in the bench as the tune forces them
  bb forced_$v 1 SWAPMOE_BACKEND=cuda_wgmma_swap SWAPMOE_SWAP_GEMM1_RING=${v:1:1} SWAPMOE_SWAP_GEMM2_PDL=${v:3:1}
done
pack 'logs/tune.txt'
echo "[$(el) s] end"
