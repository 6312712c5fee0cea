#!/usr/bin/env bash
# The fifth call of 2026-12-05 pm, ~9 minutes:
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05_pm/call_suite.sh", carry=["dist/ct"])
# dist/ct = main with 3b2667f (the e4m3 swap GEMM1's epilogue scales ahead) and 4d6fbe9
# (accumulator_token). 1. Every GPU file but the FP8 one, serial tests included
# (device_run.sh pytest-rest: ~977 tests in ~225 s before). 2. In the time left, the FP8 file
# but its wgmma tests (the kernels these commits did not touch), non-serial: decode sizes and
# the other cases whose names do not say "swap" but run the swap-AB kernels (call 2 ran the
# "-k swap" ones on ct).
source benches/call_common.sh  # $OUT, gpu.txt, el, ab, pack
OUT=$OUT/rest WHEEL_DIR=dist/ct TEST_TIMEOUT=280 SERIAL_TIMEOUT=60 bash benches/device_run.sh pytest-rest 2>&1 | grep -E "exit|FAILED|ERROR"
echo "[$(el) s] rest done"
PYTHONPATH=/tmp/site timeout $(( 575 - $(el) )) python3 -m pytest -m "gpu and not serial" -k "not wgmma" -q -p no:cacheprovider \
  -n 16 -rfE tests/test_fp8_gpu.py > "$OUT/pytest_fp8_not_wgmma.txt" 2>&1
echo "[$(el) s] fp8 not wgmma: exit $? ; $(tail -1 "$OUT/pytest_fp8_not_wgmma.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_fp8_not_wgmma.txt" | head
pack
echo "[$(el) s] end"
