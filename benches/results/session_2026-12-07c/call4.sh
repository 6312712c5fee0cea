#!/usr/bin/env bash
# This session's fourth device call (written 2026-12-07 09:20; dist/main = main at 5ade252's
# kernels): H100 tables (M = 1-64, swapmoe's kernels only) for deployments the shipped tables do
# not key (vLLM's keys, E and N; a shape whose E and N another table has would overwrite it):
#   Mixtral-8x22B at TP4 (E = 8, N = 4096, K = 6144) and TP8 (N = 2048): bf16 and FP8 per tensor;
#   Llama-4-Scout at TP8 (E = 16, top-1, N = 1024, K = 5120): bf16;
#   DeepSeek-V3 with EP8 (32 local experts of 256, N = 2048, K = 7168): FP8 128x128 blocks.
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07c/call4.sh", carry=["dist/main"], kind="nvidia-h200")
# On an H200 it runs the same tunes (its tables lack these shapes too).
source benches/call_common.sh
D=${DEADLINE:-400}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
mkdir -p "$OUT/tables"
tune() {  # TAG SECONDS ARGS...
  local tag=$1 s=$2
  shift 2
  [ $(el) -gt $((D - s)) ] && { echo "[$(el) s] tune $tag skipped"; return; }
  PYTHONPATH=/tmp/site_main timeout $s python3 -m swapmoe tune "$@" --m 1,2,4,8,16,32,64 --force --no-vllm \
    --out-dir "$OUT/tables" --no-progress > "$OUT/tune_$tag.txt" 2>&1
  status "tune $tag" $?
  grep -E "^ *M=" "$OUT/tune_$tag.txt" | cut -c1-120
}
tune mixtral-8x22b_tp8_bf16 80 --model mixtral-8x22b --tp 8
tune mixtral-8x22b_tp8_fp8_tensor 80 --model mixtral-8x22b --tp 8 --quant fp8_tensor
tune mixtral-8x22b_tp4_bf16 90 --model mixtral-8x22b --tp 4
tune mixtral-8x22b_tp4_fp8_tensor 90 --model mixtral-8x22b --tp 4 --quant fp8_tensor
tune llama4-scout_tp8_bf16 60 --model llama4-scout --tp 8
tune deepseek-v3_ep8_fp8_block128 90 --model deepseek-v3 --ep 8 --quant fp8_block128
ls "$OUT/tables"
tar czf "$OUT/tables.tgz" -C "$OUT" tables && rm -rf "$OUT/tables"
mkdir -p "$OUT/logs" && mv "$OUT"/tune_*.txt "$OUT/logs/" && tar czf "$OUT/tune_logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "[$(el) s] end"
