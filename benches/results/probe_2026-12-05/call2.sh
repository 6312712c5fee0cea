#!/usr/bin/env bash
# The second device call: the swap GPU tests on the tails wheel (with the L2-tail tests of the
# branch), the block-run FP8 tests under 16 workers with the grouped float64 reference (never run
# on the GPU; before it, 8-12 at once did not finish in 70-180 s), then the whole FP8 GPU file on
# HEAD's wheel, and last the L2 tails' budgets and GEMM2's ring and PDL beside them.
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call2.sh", carry=["dist/head", "dist/tails"])
# The tails wheel's tests are the branch's (they add test_wgmma_swap_l2_tail and test_swap_l2_tail):
# copy them beside main's first: `mkdir -p tests_tails && git archive exp/l2-tails tests | tar -x
# --strip-components=1 -C tests_tails` (untracked, so the device copy carries it; remove it after).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
for w in head tails; do
  rm -rf /tmp/site_$w && python3 -m pip install -q --no-index --no-deps --target /tmp/site_$w dist/$w/*.whl || exit 1
done
TT=tests; [ -d tests_tails ] && TT=tests_tails
PYTHONPATH=/tmp/site_tails timeout 190 python3 -m pytest -m "gpu and not serial" -q -p no:cacheprovider -n 16 -rfE \
  $TT/test_fp8_gpu.py $TT/test_gpu.py -k "swap" > "$OUT/pytest_swap_tails.log" 2>&1
echo "$(el) swap tests (tails, $TT): exit $? ; $(tail -1 "$OUT/pytest_swap_tails.log")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_swap_tails.log" | head
PYTHONPATH=/tmp/site_head timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -n 16 -rfE --durations=5 \
  tests/test_fp8_gpu.py -k "block_run" > "$OUT/pytest_block_run.log" 2>&1
echo "$(el) block_run: exit $? ; $(tail -1 "$OUT/pytest_block_run.log")"
PYTHONPATH=/tmp/site_head timeout 180 python3 -m pytest -m "gpu and not serial" -q -p no:cacheprovider -n 16 -rfE \
  --durations=15 tests/test_fp8_gpu.py -k "not block_run" > "$OUT/pytest_fp8.log" 2>&1
echo "$(el) fp8 file: exit $? ; $(tail -1 "$OUT/pytest_fp8.log")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_fp8.log" | head
T=SWAPMOE_SWAP_L2_TAIL
OUT=$OUT/ab WHEELS="tails:$T=0,24 tails:$T=0,48 tails:$T=0,24,SWAPMOE_SWAP_GEMM2_RING=3 tails:$T=0,24,SWAPMOE_SWAP_GEMM2_PDL=0" \
  CASES="qwen3-30b-a3b:1,2" ARGS="--quant fp8_tensor --no-read-floor" ROUNDS=2 BENCH_TIMEOUT=40 timeout 110 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_tail_budgets.txt"; python3 benches/ab_summary.py "$OUT/ab_tail_budgets.txt"
echo "$(el) end"
