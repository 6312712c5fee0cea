#!/usr/bin/env bash
# 2026-12-05, second device call. Wheels: dist/head (348c702), dist/pb (348c702 + the ring
# cursor holding the phase bit, benches/results/ring_cursor_phase_bit_2026-12-04/*.patch).
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05/call2.sh",
#       carry=["dist/head", "dist/pb", "abtables"], timeout_s=600)
# 1. pb: every swap GPU test (bf16 and FP8); 2. A/B head vs pb (bf16 qwen3 M = 1 / 4,
# deepseek M = 1; fp8 qwen3 M = 1 / 8, deepseek M = 1), two rounds; 3. A/B of the shipped
# tables against abtables/ (deepseek fp8 per-tensor M = 1 with GEMM2 ring 7 from call 1's
# tune), three rounds; 4. the five test_wgmma_gemm2_block_run* tests; 5. a bf16 tune of
# Qwen3-235B at TP8 (E = 128, N = 192: a narrow shape no table has) at M = 1-64.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
for w in head pb; do
  rm -rf /tmp/site_$w && python3 -m pip install -q --no-index --no-deps --target /tmp/site_$w dist/$w/*.whl || exit 1
done
PYTHONPATH=/tmp/site_pb timeout 170 python3 -m pytest -m "gpu and not serial" -q -p no:cacheprovider -n 16 -rfE \
  tests/test_gpu.py tests/test_fp8_gpu.py -k "swap and not block_run" > "$OUT/pytest_pb_swap.txt" 2>&1
rc=$?; echo "$(el) pytest pb swap: exit $rc ; $(tail -1 "$OUT/pytest_pb_swap.txt")"
OUT=$OUT/ab_bf16 WHEELS="head pb" CASES="qwen3-30b-a3b:1,4 deepseek-v3-tp8:1" ROUNDS=2 BENCH_TIMEOUT=60 \
  timeout 100 bash benches/ab.sh > /dev/null 2>&1; echo "$(el) ab pb bf16"
OUT=$OUT/ab_fp8 WHEELS="head pb" CASES="qwen3-30b-a3b:1,8 deepseek-v3-tp8:1" ROUNDS=2 BENCH_TIMEOUT=60 \
  ARGS="--quant fp8_tensor" timeout 100 bash benches/ab.sh > /dev/null 2>&1; echo "$(el) ab pb fp8"
OUT=$OUT/ab_tables WHEELS="head head:SWAPMOE_TABLES_DIR=$PWD/abtables" CASES="deepseek-v3-tp8:1 qwen3-30b-a3b:1" ROUNDS=3 \
  BENCH_TIMEOUT=60 ARGS="--quant fp8_tensor" timeout 80 bash benches/ab.sh > /dev/null 2>&1; echo "$(el) ab tables"
PYTHONPATH=/tmp/site_head timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 10 -rfE --durations=5 \
  tests/test_fp8_gpu.py -k "block_run" > "$OUT/pytest_block_run.txt" 2>&1
rc=$?; echo "$(el) pytest block_run: exit $rc ; $(tail -1 "$OUT/pytest_block_run.txt")"
mkdir -p "$OUT/tables"
PYTHONPATH=/tmp/site_head timeout 100 python3 -m swapmoe tune --model qwen3-235b-a22b --tp 8 \
  --m 1,2,4,8,16,32,64 --force --no-vllm --out-dir "$OUT/tables" --no-progress > "$OUT/tune_235b.txt" 2>&1
echo "$(el) tune qwen3-235b tp8 bf16: exit $?"
tar czf "$OUT/tables.tgz" -C "$OUT" tables && rm -rf "$OUT/tables"
