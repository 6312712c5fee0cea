#!/usr/bin/env bash
# This session's fifth device call (written 2026-12-07 09:55; dist/main = main at 9604ea2):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07c/call5.sh", carry=["dist/main"], kind="nvidia-h200")
# H200: call_min.sh (the README's decode tables with the push-form cluster sum, never run on an
#   H200, and the rest of its list).
# H100: tables for expert-parallel deployments: Qwen3-235B-A22B with EP8 (16 local experts of
#   128, N = 1536, K = 4096; how Qwen3-235B-A22B-FP8 runs on 8 GPUs, its TP8 N = 192 not being a
#   multiple of 128) in 128x128 blocks and bf16, and DeepSeek-V3 with EP16 (16 local of 256,
#   N = 2048, K = 7168) in 128x128 blocks; M = 1-64, swapmoe's kernels only.
source benches/call_common.sh
D=${DEADLINE:-420}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
if grep -q H200 "$OUT/gpu.txt"; then
  WHEEL=main DEADLINE=$((D + 140 - $(el))) OUT=$OUT bash benches/results/h200_2026-12-06/call_min.sh
  exit
fi
mkdir -p "$OUT/tables" "$OUT/logs"
tune() {  # TAG SECONDS ARGS...
  local tag=$1 s=$2
  shift 2
  [ $(el) -gt $((D - s)) ] && { echo "[$(el) s] tune $tag skipped"; return; }
  PYTHONPATH=/tmp/site_main timeout $s python3 -m swapmoe tune "$@" --m 1,2,4,8,16,32,64 --force --no-vllm \
    --out-dir "$OUT/tables" --no-progress > "$OUT/logs/tune_$tag.txt" 2>&1
  status "tune $tag" $?
  grep -E "^ *M=" "$OUT/logs/tune_$tag.txt" | cut -c1-120
}
tune qwen3-235b-a22b_ep8_fp8_block128 90 --model qwen3-235b-a22b --ep 8 --quant fp8_block128
tune qwen3-235b-a22b_ep8_bf16 90 --model qwen3-235b-a22b --ep 8
tune deepseek-v3_ep16_fp8_block128 90 --model deepseek-v3 --ep 16 --quant fp8_block128
ls "$OUT/tables"
tar czf "$OUT/tables.tgz" -C "$OUT" tables && rm -rf "$OUT/tables"
tar czf "$OUT/tune_logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "[$(el) s] end"
