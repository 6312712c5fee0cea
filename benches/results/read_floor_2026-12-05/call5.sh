#!/usr/bin/env bash
# 2026-12-05 call 5: the block-run FP8 tests under xdist with the grouped reference (36a1202 + the
# reference commit): before, 8-12 at once did not finish in 70-180 s.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
rm -rf /tmp/site_head && python3 -m pip install -q --no-index --no-deps --target /tmp/site_head dist/head/*.whl || exit 1
PYTHONPATH=/tmp/site_head timeout 45 python3 -m pytest -m gpu -q -p no:cacheprovider -n 16 -rfE --durations=5 \
  tests/test_fp8_gpu.py -k "block_run" > "$OUT/pytest_block_run.log" 2>&1
echo "block_run: exit $? ; $(tail -1 "$OUT/pytest_block_run.log")"
