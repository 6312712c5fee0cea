#!/usr/bin/env bash
# Prepared 2026-12-05 (03:00; this session's device time was spent), not yet run. One call for
# the next device session. Build first: `maturin build --release -o dist/head`, then
#   run(command="OUT=$OUT bash benches/results/next_device_2026-12-06/call1.sh",
#       carry=["dist/head"], timeout_s=600)
# (the file name does not start with "dev": .git/info/exclude leaves dev*.sh out of the copy).
# What it checks (benches/NOTES.md, "Next steps (2026-12-05, 02:50)"):
#  1. test_wide_experts_per_tensor_default_plan (new, never run): wide FP8 per tensor now
#     swap-AB up to M = 16 by default;
#  2. the 20 test_wgmma_gemm2_block_run* tests with each xdist worker's CPU share
#     (tests/conftest.py, 2026-12-05): 8-12 of them took 150-240 s before; durations recorded;
#  3. the wide per-tensor rule on the GPU: Mixtral FP8 per tensor, tables off, the heuristics'
#     swap-AB against cuda_wgmma forced, M = 2, 4, 8, 16, 32, two rounds;
#  4. the rest of test_fp8_gpu.py under the CPU share, with durations (the file's first full
#     run since the share: ~750 non-serial tests took 330-375 s without finishing before).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
rm -rf /tmp/site_head && python3 -m pip install -q --no-index --no-deps --target /tmp/site_head dist/head/*.whl || exit 1
PYTHONPATH=/tmp/site_head timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
  tests/test_fp8_gpu.py -k wide_experts > "$OUT/pytest_wide.txt" 2>&1
rc=$?; echo "$(el) pytest wide experts: exit $rc ; $(tail -1 "$OUT/pytest_wide.txt")"
PYTHONPATH=/tmp/site_head timeout 180 python3 -m pytest -m gpu -v -p no:cacheprovider -n 16 -rfE --durations=20 \
  tests/test_fp8_gpu.py -k block_run > "$OUT/pytest_block_run.txt" 2>&1
rc=$?; echo "$(el) pytest block_run: exit $rc ; $(tail -1 "$OUT/pytest_block_run.txt")"
OUT=$OUT/ab WHEELS="head:SWAPMOE_TABLES=off head:SWAPMOE_TABLES=off,SWAPMOE_BACKEND=cuda_wgmma" \
  CASES="mixtral-8x7b:2,4,8,16,32" ROUNDS=2 BENCH_TIMEOUT=60 ARGS="--quant fp8_tensor" \
  timeout 120 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_wide_per_tensor.txt"; echo "$(el) ab wide per tensor done"
PYTHONPATH=/tmp/site_head timeout 200 python3 -m pytest -m "gpu and not serial" -q -p no:cacheprovider -n 16 -rfE \
  --durations=30 tests/test_fp8_gpu.py -k "not block_run and not wide_experts" > "$OUT/pytest_fp8_rest.txt" 2>&1
rc=$?; echo "$(el) pytest fp8 rest: exit $rc ; $(tail -1 "$OUT/pytest_fp8_rest.txt")"
