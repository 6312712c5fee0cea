#!/usr/bin/env bash
# This session's seventh device call (written 2026-12-07 10:30; dist/main = main with the swap
# GEMM1 ring of 3 where about one expert is active, `SWAP_FEW_EXPERTS_GEMM1_RING`):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07c/call7.sh", carry=["dist/main"], kind="nvidia-h200")
# 1. The swap-AB GPU tests (rings, splits, launch variants, expert maps; bf16 and FP8).
# 2. `swapmoe bench`, tables off: the new rule's plan (ring 3 at ~1 active expert) against the
#    kernel's own ring forced (SWAPMOE_SWAP_GEMM1_RING=0), Qwen3-235B-A22B EP8 bf16 and 128x128
#    blocks and DeepSeek-V3 EP16 128x128 blocks at M = 1, 2, seeds 0 and 1.
source benches/call_common.sh
D=${DEADLINE:-380}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
mkdir -p "$OUT/bench"
one() {  # TAG VARIANT SEED ARGS...
  local tag=$1 v=$2 seed=$3 ring=()
  shift 3
  [ "$v" = own ] && ring=(SWAPMOE_SWAP_GEMM1_RING=0)
  env SWAPMOE_TABLES=off "${ring[@]}" PYTHONPATH=/tmp/site_main timeout 60 python3 -m swapmoe bench "$@" --m 1,2 \
    --seed $seed --no-baselines --no-read-floor --no-progress --json "$OUT/bench/${tag}_${v}_s$seed.json" \
    > "$OUT/bench/${tag}_${v}_s$seed.txt" 2>&1
  echo "[$(el) s] $tag $v seed $seed: $(grep -E '^ *[12] ' "$OUT/bench/${tag}_${v}_s$seed.txt" | awk '{printf "M=%s touched %s %s %s us; ", $1, $2, $3, $5}')"
}
for seed in 0 1; do
  for v in rule own; do one q235_ep8_bf16 $v $seed --model qwen3-235b-a22b --ep 8; done
  for v in rule own; do one q235_ep8_block $v $seed --model qwen3-235b-a22b --ep 8 --quant fp8_block128; done
  for v in rule own; do one ds_ep16_block $v $seed --model deepseek-v3 --ep 16 --quant fp8_block128; done
done
left=$((D - $(el)))
[ $left -gt 60 ] && gpu_pytest swap main $((left - 5)) -m "gpu and not serial" -n 16 -k "swap or expert_map" \
  tests/test_gpu.py tests/test_fp8_gpu.py
tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
echo "[$(el) s] end"
