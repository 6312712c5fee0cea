#!/usr/bin/env bash
# This session's third device call (written 2026-12-07 09:10; dist/main = main at 5ade252):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07c/call3.sh", carry=["dist/main"], kind="nvidia-h200")
# H200: call_min.sh (the README's decode tables with the push-form cluster sum, never run on
#   an H200; the routing bench; the split tests; sanitizers; routing tests).
# H100: tables for Qwen3-235B-A22B (E = 128, topk = 8, K = 4096) on the H100, which has none
#   for it (the H200 has TP4 / TP8 bf16 and FP8 per tensor): TP4 (N = 384) bf16, fp8_tensor and
#   fp8_block128 (Qwen3-235B-A22B-FP8's scheme; TP8's N = 192 is not a multiple of 128, which
#   vLLM refuses for 128x128 blocks), TP8 (N = 192) bf16 and fp8_tensor; M = 1-64, swapmoe's
#   kernels only (no vLLM on the device).
source benches/call_common.sh
D=${DEADLINE:-540}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
if grep -q H200 "$OUT/gpu.txt"; then
  WHEEL=main DEADLINE=$((D - $(el))) OUT=$OUT bash benches/results/h200_2026-12-06/call_min.sh
  exit
fi
mkdir -p "$OUT/tables"
tune() {  # TP QUANT
  [ $(el) -gt $((D - 70)) ] && { echo "[$(el) s] tune tp$1 $2 skipped"; return; }
  PYTHONPATH=/tmp/site_main timeout 90 python3 -m swapmoe tune --model qwen3-235b-a22b --tp $1 --quant $2 \
    --m 1,2,4,8,16,32,64 --force --no-vllm --out-dir "$OUT/tables" --no-progress > "$OUT/tune_tp$1_$2.txt" 2>&1
  status "tune qwen3-235b-a22b tp$1 $2" $?
  tail -3 "$OUT/tune_tp$1_$2.txt" | cut -c1-200
}
tune 4 none
tune 4 fp8_tensor
tune 4 fp8_block128
tune 8 none
tune 8 fp8_tensor
ls "$OUT/tables"
tar czf "$OUT/tables.tgz" -C "$OUT" tables && rm -rf "$OUT/tables"
pack 'tables.tgz' 'tune_*.txt'
echo "[$(el) s] end"
