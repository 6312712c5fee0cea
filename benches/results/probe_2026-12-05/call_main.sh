#!/usr/bin/env bash
# One call instead of call1 + call_sa (2026-12-05 10:00: the device refused five starts this
# session, so the most important measurements go first in a single call):
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call_main.sh",
#       carry=["dist/head", "dist/tails", "dist/sa", "dist/stamps", "dist/probe_stamps"])
# 1. FP8 per tensor A/B: HEAD, the tails wheel's default (one more kernel argument), GEMM1's,
#    GEMM2's and both L2 tails (24 MiB each), the epilogue scales ahead (sa).
# 2. bf16: HEAD against both tails.  3. sa's FP8 swap GPU tests.  4. stamps: release against
#    probe at qwen3 FP8 M = 1.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
for w in head tails sa stamps probe_stamps; do
  rm -rf /tmp/site_$w && python3 -m pip install -q --no-index --no-deps --target /tmp/site_$w dist/$w/*.whl || exit 1
done
T=SWAPMOE_SWAP_L2_TAIL
OUT=$OUT/ab WHEELS="head tails tails:$T=24,0 tails:$T=0,24 tails:$T=24,24 sa" CASES="qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1" \
  ARGS="--quant fp8_tensor --no-read-floor" ROUNDS=2 BENCH_TIMEOUT=40 timeout 290 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_fp8.txt"; echo "$(el) ab fp8 done"
python3 benches/ab_summary.py "$OUT/ab_fp8.txt" | tee "$OUT/ab_fp8_summary.txt"
OUT=$OUT/ab WHEELS="head tails:$T=24,24" CASES="qwen3-30b-a3b:1,8" \
  ARGS="--no-read-floor" ROUNDS=2 BENCH_TIMEOUT=40 timeout 70 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_bf16.txt"; echo "$(el) ab bf16 done"
python3 benches/ab_summary.py "$OUT/ab_bf16.txt" | tee "$OUT/ab_bf16_summary.txt"
PYTHONPATH=/tmp/site_sa timeout 100 python3 -m pytest -m "gpu and not serial" -q -p no:cacheprovider -n 16 -rfE \
  tests/test_fp8_gpu.py -k "swap" > "$OUT/pytest_sa_swap.log" 2>&1
echo "$(el) fp8 swap tests (sa): exit $? ; $(tail -1 "$OUT/pytest_sa_swap.log")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_sa_swap.log" | head
for site in stamps probe_stamps; do
  echo "=== qwen3_fp8_m1 $site" >> "$OUT/stamps.txt"
  SWAPMOE_PROBE_BUILD_OK=1 PYTHONPATH=/tmp/site_$site timeout 40 python3 benches/stamps.py --shape qwen3 --m 1 --quant fp8_tensor \
    --json "$OUT/stamps_raw.json.gz" >> "$OUT/stamps.txt" 2>&1
  echo "$(el) stamps $site: exit $?"
done
echo "$(el) end"
