#!/usr/bin/env bash
# This session's first device call (written 2026-12-07 08:55; build dist/main from main first):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07c/call1.sh", carry=["dist/main"], kind="nvidia-h200")
# 1. Router placements inside fused_moe at deepseek-v3-tp8 M = 16, 32, 64 (benches/routing_bench.py:
#    the default, the warp router, the CTA router, with and without first-kernel PDL, the
#    routing twins, in alternating rounds in one process): issue 3's M = 64 point read +3.5 to
#    +6.1 µs on an H100 on 2026-12-07 07:45 against the 3 µs bound.
# 2. `swapmoe bench --with-routing` for deepseek-v3-tp8 and qwen3-30b-a3b at M = 1, 8, 64, 2 rounds
#    (issue 3's table; no H200 has run it with DeepSeek-V3's own router).
# 3. H200: call_min.sh (README decode tables, routing bench, split tests, sanitizers, routing
#    tests) within what is left; H100: the suite's serial and wgmma parts.
source benches/call_common.sh
D=${DEADLINE:-550}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
PYTHONPATH=/tmp/site_main timeout 170 python3 benches/routing_bench.py --shapes deepseek-v3-tp8 --m 16,32,64 \
  --rounds 5 --json "$OUT/routing_placements.json" > "$OUT/routing_placements.txt" 2>&1
status "routing placements" $?
cut -c1-200 "$OUT/routing_placements.txt" | head -8
mkdir -p "$OUT/bench"
for round in 1 2; do
  for model in deepseek-v3-tp8 qwen3-30b-a3b; do
    [ $(el) -gt $((D - 200)) ] && break 2
    PYTHONPATH=/tmp/site_main timeout 80 python3 -m swapmoe bench --model $model --m 1,8,64 --with-routing \
      --no-baselines --no-read-floor --no-progress --json "$OUT/bench/routing_${model}_$round.json" \
      > "$OUT/bench/routing_${model}_$round.txt" 2>&1
    status "bench --with-routing $model round $round" $?
    grep -E "^ *[0-9]+ " "$OUT/bench/routing_${model}_$round.txt" | cut -c1-160
  done
done
left=$((D - $(el)))
if grep -q H200 "$OUT/gpu.txt"; then
  WHEEL=main DEADLINE=$left OUT=$OUT bash benches/results/h200_2026-12-06/call_min.sh
else
  STEPS="serial wgmma" DEADLINE=$left WHEEL=main OUT=$OUT bash benches/results/session_2026-12-06c/call_suite.sh
fi
pack 'pytest_*.log' 'routing_*' 'sanitize_*.txt' 'bench/routing_deepseek-v3-tp8_1.txt'
echo "[$(el) s] end"
