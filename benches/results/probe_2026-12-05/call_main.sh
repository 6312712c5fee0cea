#!/usr/bin/env bash
# One call instead of call1 + call_sa (2026-12-05 10:00: the device refused five starts this
# session, so the most important measurements go first in a single call):
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call_main.sh",
#       carry=["dist/head", "dist/tails", "dist/sa", "dist/stamps", "dist/probe_stamps"])
# 1. FP8 per tensor A/B: HEAD, the tails wheel's default (one more kernel argument), GEMM1's,
#    GEMM2's and both L2 tails (24 MiB each), the epilogue scales ahead (sa).
# 2. sa's FP8 swap GPU tests.  3. bf16: HEAD against both tails.  4. stamps: release against
#    probe at qwen3 FP8 M = 1.
# With under ~700 s of device budget left, CALL_SIZE=min (carry only dist/head, dist/tails,
# dist/sa): step 1 at qwen3 only and without the tails' default, step 2, step 3 unless
# MIN_BF16=0, no stamps.
export BENCH_TIMEOUT=40
source benches/call_common.sh  # $OUT, gpu.txt, el, ab
min=0; [ "${CALL_SIZE:-full}" = min ] && min=1
T=SWAPMOE_SWAP_L2_TAIL
if [ $min = 1 ]; then
  ab fp8 "head tails:$T=24,0 tails:$T=0,24 tails:$T=24,24 sa" "qwen3-30b-a3b:1,2,8" "--quant fp8_tensor --no-read-floor" 170
else
  ab fp8 "head tails tails:$T=24,0 tails:$T=0,24 tails:$T=24,24 sa" "qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1" \
    "--quant fp8_tensor --no-read-floor" 290
fi
# ab.sh installed every wheel of the FP8 A/B, sa's into /tmp/site_sa
gpu_pytest sa_swap sa 100 -m "gpu and not serial" -n 16 tests/test_fp8_gpu.py -k "swap"
[ $min = 1 ] && [ "${MIN_BF16:-1}" = 0 ] && { echo "[$(el) s] end (no bf16)"; exit 0; }
ab bf16 "head tails:$T=24,24" "qwen3-30b-a3b:1,8" "--no-read-floor" 70
[ $min = 1 ] && { echo "[$(el) s] end (no stamps)"; exit 0; }
for site in stamps probe_stamps; do
  install_wheels $site || exit 1
  echo "=== qwen3_fp8_m1 $site" >> "$OUT/stamps.txt"
  SWAPMOE_PROBE_BUILD_OK=1 PYTHONPATH=/tmp/site_$site timeout 40 python3 benches/stamps.py --shape qwen3 --m 1 --quant fp8_tensor \
    --json "$OUT/stamps_raw.json.gz" >> "$OUT/stamps.txt" 2>&1
  rc=$?
  echo "[$(el) s] stamps $site: exit $rc"
done
echo "[$(el) s] end"
