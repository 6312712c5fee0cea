#!/usr/bin/env bash
# The README's decode tables and issue 3's routing table after the push-form cluster sum, ~7
# minutes with the start (H200 wanted):
#   run(command="WHEEL=main OUT=$OUT bash benches/results/cluster_push_exit/call_tables.sh", carry=["dist/main"])
# 1. `swapmoe bench` of the three public shapes at decode (M = 1-64), bf16 and FP8 per tensor,
#    vLLM's baselines included.
# 2. The routing bench (fused_moe - fused_experts, issue 3) with the landed router.
# 3. FP8 128x128 blocks at decode if time is left.
source benches/call_common.sh
cat "$OUT/gpu.txt"
W=${WHEEL:-main}
install_wheels "$W" || exit 1
export PYTHONPATH=/tmp/site_$W
bench_all() {  # quant (none = bf16)
  local q="" tag="" model
  [ "$1" != none ] && q="--quant $1" && tag="_$1"
  for model in qwen3-30b-a3b deepseek-v3-tp8 mixtral-8x7b; do
    [ $(el) -gt ${2:-520} ] && break
    timeout 90 python3 -m swapmoe bench --model $model --m 1,2,4,8,16,32,64 $q --no-progress \
      --json "$OUT/bench/bench_$model$tag.json" > "$OUT/bench/bench_$model$tag.txt" 2>&1
    status "bench $model $1" $?
    grep -E "^ +[0-9]+ " "$OUT/bench/bench_$model$tag.txt"
  done
}
mkdir -p "$OUT/bench"
bench_all none
bench_all fp8_tensor
timeout 80 python3 benches/routing_bench.py --m 1,8,64 --rounds 3 > "$OUT/routing_$W.txt" 2>&1
status "routing $W" $?
grep -E "^(shape|qwen3|deepseek)" "$OUT/routing_$W.txt" | cut -c1-110
bench_all fp8_block128 470
pack 'bench/*.txt' "routing_$W.txt"
echo "[$(el) s] end"
