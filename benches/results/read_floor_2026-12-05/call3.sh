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
timeout 240 python3 benches/read_floor.py --models qwen3-30b-a3b,deepseek-v3-tp8 --m 1,2,8 --chunks-kib 16,64 \
  --json "$OUT/read_floor_boxes.json" > "$OUT/read_floor_boxes.log" 2>&1
echo "$(el) read_floor: exit $?"
timeout 100 python3 benches/read_floor.py --models mixtral-8x7b --m 1 --dtypes fp8 --chunks-kib 64 \
  --boxes "128x16:flat,128x16:slab,128x16:rows,32x64:slab" --json "$OUT/read_floor_mixtral.json" > "$OUT/read_floor_mixtral.log" 2>&1
echo "$(el) read_floor mixtral: exit $?"
timeout 170 python3 -m pytest -m gpu -v -p no:cacheprovider -n 12 -rfE --durations=15 --timeout=100 --timeout-method=thread \
  tests/test_fp8_gpu.py -k "test_wgmma_gemm2_block_run and N256" > "$OUT/pytest_block_run_n256.log" 2>&1
echo "$(el) block_run N256 under xdist: exit $? ; $(tail -1 "$OUT/pytest_block_run_n256.log")"
