#!/usr/bin/env bash
# The third device call: every other GPU file on HEAD's wheel under 16 workers, then their serial
# tests (benches/device_run.sh pytest-rest), then the FP8 file's serial tests (call 2 ran its others).
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call3.sh", carry=["dist/head"])
set -u
OUT=${OUT:-/tmp/out} WHEEL_DIR=dist/head TEST_TIMEOUT=330 SERIAL_TIMEOUT=90 bash benches/device_run.sh pytest-rest
PYTHONPATH=/tmp/site timeout 170 python3 -m pytest -m "gpu and serial" -q -p no:cacheprovider -rfE \
  tests/test_fp8_gpu.py > "${OUT:-/tmp/out}/pytest_fp8_serial.log" 2>&1
echo "fp8 serial: exit $? ; $(tail -1 "${OUT:-/tmp/out}/pytest_fp8_serial.log")"
