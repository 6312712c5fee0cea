#!/usr/bin/env bash
# The third device call: every other GPU file on HEAD's wheel under 16 workers, then the serial tests.
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call3.sh", carry=["dist/head"])
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
rm -rf /tmp/site_head && python3 -m pip install -q --no-index --no-deps --target /tmp/site_head dist/head/*.whl || exit 1
export PYTHONPATH=/tmp/site_head
timeout 330 python3 -m pytest -m "gpu and not serial" -q -p no:cacheprovider -n 16 -rfE --durations=15 \
  --ignore=tests/test_fp8_gpu.py tests > "$OUT/pytest_rest.log" 2>&1
echo "$(el) the other files: exit $? ; $(tail -1 "$OUT/pytest_rest.log")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_rest.log" | head
timeout 200 python3 -m pytest -m "gpu and serial" -q -p no:cacheprovider -rfE tests > "$OUT/pytest_serial.log" 2>&1
echo "$(el) serial: exit $? ; $(tail -1 "$OUT/pytest_serial.log")"
