#!/usr/bin/env bash
# The smallest useful call (for when the device budget left is under ~700 s): the FP8 per tensor
# A/B of call_main.sh at qwen3 only, sa's FP8 swap GPU tests, then bf16 HEAD against both tails
# (MIN_BF16=0 skips the bf16 part).
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call_min.sh", carry=["dist/head", "dist/tails", "dist/sa"])
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
T=SWAPMOE_SWAP_L2_TAIL
OUT=$OUT/ab WHEELS="head tails:$T=24,0 tails:$T=0,24 tails:$T=24,24 sa" CASES="qwen3-30b-a3b:1,2,8" \
  ARGS="--quant fp8_tensor --no-read-floor" ROUNDS=2 BENCH_TIMEOUT=40 timeout 170 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_fp8.txt"; echo "$(el) ab fp8 done"
python3 benches/ab_summary.py "$OUT/ab_fp8.txt" | tee "$OUT/ab_fp8_summary.txt"
PYTHONPATH=/tmp/site_sa timeout 100 python3 -m pytest -m "gpu and not serial" -q -p no:cacheprovider -n 16 -rfE \
  tests/test_fp8_gpu.py -k "swap" > "$OUT/pytest_sa_swap.log" 2>&1
echo "$(el) fp8 swap tests (sa): exit $? ; $(tail -1 "$OUT/pytest_sa_swap.log")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_sa_swap.log" | head
[ "${MIN_BF16:-1}" = 0 ] && { echo "$(el) end (no bf16)"; exit 0; }
OUT=$OUT/ab WHEELS="head tails:$T=24,24" CASES="qwen3-30b-a3b:1,8" \
  ARGS="--no-read-floor" ROUNDS=2 BENCH_TIMEOUT=40 timeout 70 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_bf16.txt"; echo "$(el) ab bf16 done"
python3 benches/ab_summary.py "$OUT/ab_bf16.txt" | tee "$OUT/ab_bf16_summary.txt"
echo "$(el) end"
