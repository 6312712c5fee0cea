#!/usr/bin/env bash
# 2026-12-05 (session 04:00), call 3: the read floor with the two-launch variant and the box
# patterns (does the weights' access pattern set GEMM1's ~2.4 TB/s at M = 1?), and where the
# N256 block-run FP8 tests spend their time under xdist (pytest-timeout dumps the stacks).
#   run(command="OUT=$OUT bash benches/results/read_floor_2026-12-05/call3.sh", carry=["dist/head"])
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
rm -rf /tmp/site_head && python3 -m pip install -q --no-index --no-deps --target /tmp/site_head dist/head/*.whl || exit 1
export PYTHONPATH=/tmp/site_head
timeout 240 python3 benches/read_floor.py --models qwen3-30b-a3b,deepseek-v3-tp8 --m 1,8 --chunks-kib 16 \
  --json "$OUT/read_floor_boxes.json" > "$OUT/read_floor_boxes.log" 2>&1
echo "$(el) read_floor: exit $?"
# 4. the bench's read-floor column (swapmoe/_read_floor.py) and its GPU test
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_bench_tools.py > "$OUT/pytest_bench_tools_gpu.log" 2>&1
echo "$(el) pytest bench_tools gpu: exit $? ; $(tail -1 "$OUT/pytest_bench_tools_gpu.log")"
for q in none fp8_tensor; do
  for model in qwen3-30b-a3b deepseek-v3-tp8; do
    timeout 60 python3 -m swapmoe bench --model $model --m 1,2,4,8 --quant $q --no-check --no-baselines \
      --no-progress > "$OUT/bench_read_${model}_$q.txt" 2>&1
    echo "$(el) bench $model $q: exit $?"
  done
done
# 5. last (the least needed): the N256 block-run tests under xdist
timeout 95 python3 -m pytest -m gpu -v -p no:cacheprovider -n 12 -rfE --durations=15 --timeout=70 --timeout-method=thread \
  tests/test_fp8_gpu.py -k "test_wgmma_gemm2_block_run and N256" > "$OUT/pytest_block_run_n256.log" 2>&1
echo "$(el) block_run N256 under xdist: exit $? ; $(tail -1 "$OUT/pytest_block_run_n256.log")"
