#!/usr/bin/env bash
# The next device call, on whichever card comes (written 2026-12-07 06:40; build dist/main from main first):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07b/call_any.sh", carry=["dist/main"], kind="nvidia-h200")
# 1. `swapmoe bench --with-routing` of qwen3-30b-a3b and deepseek-v3-tp8 at M = 1, 8, 64 (issue 3's
#    table, now with each model's own router: DeepSeek-V3's grouped sigmoid; its GPU path and the
#    router_ids_match field have not run on a GPU), bf16, no baselines, 3 rounds each.
# 2. H200: call_min.sh (the README's decode tables, the routing bench, the swap split tests, the
#    sanitizers, the routing tests) within what is left of $DEADLINE.
#    H100: the GPU suite's swap_splits, serial and wgmma parts (not run on main since the caller's
#    workspace), within what is left.
source benches/call_common.sh
D=${DEADLINE:-540}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
mkdir -p "$OUT/bench"
for round in 1 2 3; do
  for model in deepseek-v3-tp8 qwen3-30b-a3b; do
    [ $(el) -gt $((D - 60)) ] && break 2
    PYTHONPATH=/tmp/site_main timeout 80 python3 -m swapmoe bench --model $model --m 1,8,64 --with-routing \
      --no-baselines --no-read-floor --no-progress --json "$OUT/bench/routing_${model}_$round.json" \
      > "$OUT/bench/routing_${model}_$round.txt" 2>&1
    status "bench --with-routing $model round $round" $?
    grep -E "^router|^ *[0-9]+ |^M |^check|note" "$OUT/bench/routing_${model}_$round.txt" | cut -c1-160
  done
done
left=$((D - $(el)))
if grep -q H200 "$OUT/gpu.txt"; then
  WHEEL=main DEADLINE=$left OUT=$OUT bash benches/results/h200_2026-12-06/call_min.sh
else
  STEPS="swap_splits serial wgmma" DEADLINE=$left WHEEL=main OUT=$OUT bash benches/results/session_2026-12-06c/call_suite.sh
fi
pack 'pytest_*.log' "routing_main.txt" 'sanitize_*.txt' 'bench/routing_deepseek-v3-tp8_1.txt'
echo "[$(el) s] end"
