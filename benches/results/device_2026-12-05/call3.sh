#!/usr/bin/env bash
# 2026-12-05, third device call (dist/head = 348c702's kernels):
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05/call3.sh", carry=["dist/head"])
# 1. tunes of Qwen3-235B-A22B (E = 128, topk = 8, K = 4096) at TP8 (N = 192) FP8 per tensor and
#    at TP4 (N = 384) bf16 and FP8 per tensor, M = 1-64: narrow shapes no shipped table has, data
#    for the heuristics' swap/decode/mma rules; 2. the 20 test_wgmma_gemm2_block_run* tests
#    (call 2 ran 12 of them, all passed, before its limit), verbose.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/tables"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
rm -rf /tmp/site_head && python3 -m pip install -q --no-index --no-deps --target /tmp/site_head dist/head/*.whl || exit 1
for spec in "8 fp8_tensor" "4 none" "4 fp8_tensor"; do
  set -- $spec
  PYTHONPATH=/tmp/site_head timeout 60 python3 -m swapmoe tune --model qwen3-235b-a22b --tp $1 --quant $2 \
    --m 1,2,4,8,16,32,64 --force --no-vllm --out-dir "$OUT/tables" --no-progress >> "$OUT/tune_235b.txt" 2>&1
  echo "$(el) tune tp$1 $2: exit $?"
done
tar czf "$OUT/tables.tgz" -C "$OUT" tables && rm -rf "$OUT/tables"
PYTHONPATH=/tmp/site_head timeout 240 python3 -m pytest -m gpu -v -p no:cacheprovider -n 20 -rfE --durations=20 \
  tests/test_fp8_gpu.py -k "block_run" > "$OUT/pytest_block_run.txt" 2>&1
rc=$?; echo "$(el) pytest block_run: exit $rc ; $(tail -1 "$OUT/pytest_block_run.txt")"
