#!/usr/bin/env bash
# The second device call: the block-run FP8 tests under 16 workers with the grouped float64
# reference (never run on the GPU; before it, 8-12 at once did not finish in 70-180 s), the
# swap tests on the l2tail and g2tail wheels, then the whole FP8 GPU file on HEAD's wheel.
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call2.sh",
#       carry=["dist/head", "dist/l2tail", "dist/g2tail"])
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
for w in head l2tail g2tail; do
  rm -rf /tmp/site_$w && python3 -m pip install -q --no-index --no-deps --target /tmp/site_$w dist/$w/*.whl || exit 1
done
PYTHONPATH=/tmp/site_head timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -n 16 -rfE --durations=5 \
  tests/test_fp8_gpu.py -k "block_run" > "$OUT/pytest_block_run.log" 2>&1
echo "$(el) block_run: exit $? ; $(tail -1 "$OUT/pytest_block_run.log")"
for w in l2tail g2tail; do
  PYTHONPATH=/tmp/site_$w timeout 120 python3 -m pytest -m "gpu and not serial" -q -p no:cacheprovider -n 16 -rfE \
    tests/test_fp8_gpu.py tests/test_gpu.py -k "swap" > "$OUT/pytest_swap_$w.log" 2>&1
  echo "$(el) swap tests ($w): exit $? ; $(tail -1 "$OUT/pytest_swap_$w.log")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_swap_$w.log" | head
done
PYTHONPATH=/tmp/site_head timeout 240 python3 -m pytest -m "gpu and not serial" -q -p no:cacheprovider -n 16 -rfE \
  --durations=15 tests/test_fp8_gpu.py -k "not block_run" > "$OUT/pytest_fp8.log" 2>&1
echo "$(el) fp8 file: exit $? ; $(tail -1 "$OUT/pytest_fp8.log")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_fp8.log" | head
