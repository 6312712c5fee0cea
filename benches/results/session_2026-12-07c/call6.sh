#!/usr/bin/env bash
# This session's sixth device call (written 2026-12-07 10:05; dist/main = main at 9604ea2 plus
# the EP tables of call 5): is the swap-AB GEMM1 ring, not the one routing draw, what made the
# tune's launch variants 11-30% faster than the default launch at M = 1-2 under expert
# parallelism (call 5: Qwen3-235B-A22B EP8 bf16 M = 1 r2p1 22.5 against 29.1 µs, 128x128 blocks
# 24.0 against 31.3; DeepSeek-V3 EP16 M = 1 34.9 against 36.6)? `swapmoe bench` with tables off
# and cuda_wgmma_swap forced, default launch against GEMM1 rings 2 and 3 (GEMM2 by PDL), three
# routing seeds each (seed 0 is the tune's draw), rounds alternating the variants.
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07c/call6.sh", carry=["dist/main"], kind="nvidia-h200")
source benches/call_common.sh
D=${DEADLINE:-420}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
mkdir -p "$OUT/bench"
one() {  # TAG RING SEED ARGS...
  local tag=$1 ring=$2 seed=$3
  shift 3
  [ $(el) -gt $((D - 20)) ] && return
  if [ "$ring" = own ]; then
    env SWAPMOE_TABLES=off SWAPMOE_BACKEND=cuda_wgmma_swap PYTHONPATH=/tmp/site_main timeout 60 python3 -m swapmoe bench \
      "$@" --m 1,2 --seed $seed --no-baselines --no-read-floor --no-progress --json "$OUT/bench/${tag}_${ring}_s$seed.json" \
      > "$OUT/bench/${tag}_${ring}_s$seed.txt" 2>&1
  else
    env SWAPMOE_TABLES=off SWAPMOE_BACKEND=cuda_wgmma_swap SWAPMOE_SWAP_GEMM1_RING=$ring SWAPMOE_SWAP_GEMM2_PDL=1 \
      PYTHONPATH=/tmp/site_main timeout 60 python3 -m swapmoe bench \
      "$@" --m 1,2 --seed $seed --no-baselines --no-read-floor --no-progress --json "$OUT/bench/${tag}_${ring}_s$seed.json" \
      > "$OUT/bench/${tag}_${ring}_s$seed.txt" 2>&1
  fi
  echo "[$(el) s] $tag ring $ring seed $seed: $(grep -E '^ *[12] ' "$OUT/bench/${tag}_${ring}_s$seed.txt" | awk '{printf "M=%s touched %s %s us; ", $1, $2, $5}')"
}
for seed in 0 1 2; do
  for ring in own 2 3; do one q235_ep8_bf16 $ring $seed --model qwen3-235b-a22b --ep 8; done
  for ring in own 2 3; do one q235_ep8_block $ring $seed --model qwen3-235b-a22b --ep 8 --quant fp8_block128; done
done
for seed in 0 1; do
  for ring in own 2 3; do one ds_ep16_block $ring $seed --model deepseek-v3 --ep 16 --quant fp8_block128; done
done
tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
echo "[$(el) s] end"
