#!/usr/bin/env bash
# 2026-12-05 (session 04:00): the practical read floor of a decode layer (benches/read_floor.py)
# next to the op in the same run, and why the N256 block-run FP8 tests never finish.
#   run(command="OUT=$OUT bash benches/results/read_floor_2026-12-05/call2.sh", carry=["dist/head"])
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
rm -rf /tmp/site_head && python3 -m pip install -q --no-index --no-deps --target /tmp/site_head dist/head/*.whl || exit 1
export PYTHONPATH=/tmp/site_head
# 1. one N256 block-run case alone: a stack dump after 40 s says where it spends its time
timeout 100 python3 -m pytest -m gpu -v -p no:cacheprovider -p no:xdist -o faulthandler_timeout=40 --durations=5 \
  tests/test_fp8_gpu.py -k "test_wgmma_gemm2_block_run and tensor-N256-3" > "$OUT/pytest_block_run_one.txt" 2>&1
echo "$(el) block_run one: exit $? ; $(tail -1 "$OUT/pytest_block_run_one.txt")"
# 2. the read floor
timeout 230 python3 benches/read_floor.py --json "$OUT/read_floor.json" > "$OUT/read_floor.txt" 2>&1
echo "$(el) read_floor: exit $?"
# 3. the op in the same run
for q in none fp8_tensor; do
  for model in qwen3-30b-a3b deepseek-v3-tp8 mixtral-8x7b; do
    timeout 45 python3 -m swapmoe bench --model $model --m 1,2,4,8 --quant $q --no-check --no-baselines --no-progress \
      > "$OUT/bench_${model}_$q.txt" 2>&1
    echo "$(el) bench $model $q: exit $?"
  done
done
