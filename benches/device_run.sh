#!/usr/bin/env bash
# One device session's batch: install the wheel carried in dist/, then run what the
# arguments name (smoke, sanitize, pytest, bench). Logs go to $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist/*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
for step in "$@"; do
  echo "=== $step ($(date +%T))"
  case "$step" in
    smoke) python3 benches/gpu_smoke.py ${SMOKE_M:-1,8,64,1024} 2>&1 | tee "$OUT/smoke.txt" ;;
    sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 python3 benches/sanitize_case.py > "$OUT/sanitize_$tool.txt" 2>&1
        echo "compute-sanitizer $tool: exit $? ; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|ALL OK|FAILED' "$OUT/sanitize_$tool.txt" | tr '\n' ' ')"
      done ;;
    pytest) python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -25 ;;
    pytest-all) python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_all.txt" | tail -25 ;;
    *) echo "unknown step $step" ;;
  esac
done
