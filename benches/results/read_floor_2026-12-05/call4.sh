#!/usr/bin/env bash
# 2026-12-05 call 4: why an N256 block-run FP8 test that passes alone in ~9 s does not finish in
# 70-180 s when 8-12 of them run at once (call 3: every xdist worker still running at 70 s).
# Four copies of one case in parallel, each with a faulthandler stack dump after 25 s, and the
# GPU's utilization sampled meanwhile.
#   run(command="OUT=$OUT bash benches/results/read_floor_2026-12-05/call4.sh", carry=["dist/head"])
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
rm -rf /tmp/site_head && python3 -m pip install -q --no-index --no-deps --target /tmp/site_head dist/head/*.whl || exit 1
export PYTHONPATH=/tmp/site_head
timeout 75 nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,clocks.sm --format=csv -lms 1000 > "$OUT/smi.csv" 2>&1 &
t0=$(date +%s)
for i in 1 2 3 4; do
  ( timeout 70 python3 -m pytest -m gpu -v -p no:xdist -p no:cacheprovider -o faulthandler_timeout=25 --durations=3 \
      tests/test_fp8_gpu.py -k "test_wgmma_gemm2_block_run and tensor-N256-3" > "$OUT/par_$i.log" 2>&1
    echo "copy $i: exit $? after $(( $(date +%s) - t0 )) s" ) &
done
wait
