#!/usr/bin/env bash
# This session's third device call (written 2026-12-07 15:25; ~580 s of budget left); dist/main = main:
#   run(command="DEADLINE=... OUT=$OUT bash benches/results/session_2026-12-07e/call3.sh", carry=["dist/main"])
# H200: session_2026-12-06's call_min.sh (the README's decode tables with main's kernels first).
# H100: the shipped Qwen3-235B-A22B TP2 tables (K = 4096, 5a15767) in the op against the same wheel
#   without them (old: Qwen3-30B-A3B's (E, N) tables), ABAB, 2 rounds. Prediction (the tune's
#   times): 128x128 blocks M = 2 77.6 -> 72.7 us, bf16 M = 16 515.1 -> 504.9, M = 2 112.3 -> 110.7,
#   M = 4 201.1 -> 196.4, FP8 per tensor M = 1 36.7 -> 35.7, M = 4 107.0 -> 105.1; the rest within
#   the rounds' spread.
source benches/call_common.sh
D=${DEADLINE:-400}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
h200_call_min main $D
rm -rf /tmp/site_old && cp -r /tmp/site_main /tmp/site_old && rm -f /tmp/site_old/swapmoe/tables/*N=768\;K=4096*
echo "K=4096 N=768 tables: new $(ls /tmp/site_main/swapmoe/tables | grep -c 'N=768;K=4096') old $(ls /tmp/site_old/swapmoe/tables | grep -c 'N=768;K=4096')"
mkdir -p "$OUT/bench"
kb() {  # TAG ROUND ARGS...
  local tag=$1 r=$2 v s
  shift 2
  for v in new old; do
    [ $(el) -gt $((D - 30)) ] && { echo "[$(el) s] $tag $v r$r skipped"; continue; }
    s=main; [ $v = old ] && s=old
    PYTHONPATH=/tmp/site_$s timeout 90 python3 -m swapmoe bench --model qwen3-235b-a22b --tp 2 "$@" --no-baselines \
      --no-read-floor --no-progress --json "$OUT/bench/${tag}_${v}_r$r.json" > "$OUT/bench/${tag}_${v}_r$r.txt" 2>&1
    echo "[$(el) s] $tag $v r$r: $(grep -E '^ *[0-9]+ ' "$OUT/bench/${tag}_${v}_r$r.txt" | awk '{printf "M=%s %s %s; ", $1, $3, $5}')"
  done
}
for r in 1 2; do
  kb block $r --quant fp8_block128 --m 2,4
  kb bf16 $r --m 2,4,16
  kb fp8 $r --quant fp8_tensor --m 1,4
done
pack 'bench/block_new_r1.txt'
echo "[$(el) s] end"
