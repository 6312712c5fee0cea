#!/usr/bin/env bash
# The e4m3 swap GEMM1's epilogue scales loaded before its main loop (branch
# exp/g1-scales-ahead; NOTES "The e4m3 swap GEMM1's epilogue scales ahead"): its FP8 swap GPU
# tests, then an A/B against HEAD in FP8 per tensor (static scales: the q8 epilogue) and per
# channel (the f32 epilogue).
#   cd /tmp/sa && CARGO_TARGET_DIR=/tmp/sa_target maturin build --release -o /work/main/dist/sa
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call_sa.sh", carry=["dist/head", "dist/sa"])
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
rm -rf /tmp/site_sa && python3 -m pip install -q --no-index --no-deps --target /tmp/site_sa dist/sa/*.whl || exit 1
PYTHONPATH=/tmp/site_sa timeout 170 python3 -m pytest -m "gpu and not serial" -q -p no:cacheprovider -n 16 -rfE \
  tests/test_fp8_gpu.py -k "swap" > "$OUT/pytest_sa_swap.log" 2>&1
echo "$(el) fp8 swap tests (sa): exit $? ; $(tail -1 "$OUT/pytest_sa_swap.log")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_sa_swap.log" | head
OUT=$OUT/ab WHEELS="head sa" CASES="qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1" \
  ARGS="--quant fp8_tensor --no-read-floor" ROUNDS=3 BENCH_TIMEOUT=40 timeout 200 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_sa_tensor.txt"; echo "$(el) ab tensor done"
OUT=$OUT/ab WHEELS="head sa" CASES="qwen3-30b-a3b:1,8" \
  ARGS="--quant fp8_channel --no-read-floor" ROUNDS=3 BENCH_TIMEOUT=40 timeout 120 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_sa_channel.txt"
python3 benches/ab_summary.py "$OUT"/ab_sa_*.txt | tee "$OUT/ab_sa_summary.txt"
echo "$(el) end"
