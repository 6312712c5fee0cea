#!/usr/bin/env bash
# The second call of 2026-12-05 evening, ~9.5 minutes, on the machine call1 left warm:
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05_eve/call2.sh", carry=["dist/head", "dist/pre_sa"])
# 1. If the card is an H200: the A/B of 3b2667f (dist/pre_sa = 94b15a6, main before it) that
#    so far ran on H100s only.
# 2. The GPU suite on dist/head: the FP8 file's tests but its wgmma ones (the swap-AB kernels
#    3b2667f and 4d6fbe9 changed), then every other GPU file (pytest-rest), serial tests last.
source benches/call_common.sh  # $OUT, gpu.txt, el, install_wheels, gpu_pytest, ab, pack
cat "$OUT/gpu.txt"
if grep -q H200 "$OUT/gpu.txt"; then
  ab sa_tensor "pre_sa head" "qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1" "--quant fp8_tensor --no-read-floor" 150
fi
install_wheels head || exit 1
# call1's prefill rows of the five bench files that did not come back (more than 8 files)
for c in "qwen3-30b-a3b none" "qwen3-30b-a3b fp8_tensor" "qwen3-30b-a3b fp8_block128" "mixtral-8x7b fp8_tensor" "mixtral-8x7b fp8_block128"; do
  read -r model quant <<< "$c"
  PYTHONPATH=/tmp/site_head timeout 60 python3 -m swapmoe bench --model $model --m 1024,4096 $( [ $quant != none ] && echo --quant $quant ) \
    --no-progress --no-baselines --no-read-floor >> "$OUT/bench_prefill.txt" 2>&1
  echo "[$(el) s] bench $c: status $?"
done
grep -E "^swapmoe 0|^ *[0-9]+ " "$OUT/bench_prefill.txt"
gpu_pytest fp8_not_wgmma head 150 -m "gpu and not serial" -k "not wgmma" -n 16 tests/test_fp8_gpu.py
OUT=$OUT/rest WHEEL_DIR=dist/head TEST_TIMEOUT=$(( 545 - $(el) - 45 )) SERIAL_TIMEOUT=45 \
  bash benches/device_run.sh pytest-rest 2>&1 | grep -E "exit|FAILED|ERROR"
pack 'bench_prefill.txt' 'ab_*_summary.txt' 'pytest_*.log' 'rest/pytest-rest*.txt'
echo "[$(el) s] end"
