#!/usr/bin/env bash
# One call for both open device items of 2026-12-06 (a start is scarce today), ~9 minutes:
#   run(command="OUT=$OUT bash benches/results/fp8_narrow/call_combo.sh", carry=["dist/main", "dist/n192"])
# On an H200 first main's README tables (decode, bf16 and FP8 per tensor: the push form has not
# run on an H200) and issue 3's routing bench; on any card then the narrow e4m3 GEMMs of
# branch exp/fp8-n192 (wheel dist/n192; `fp8_narrow_rejected.patch`): their GPU tests,
# memcheck of the tile-edge tests, and an A/B in one wheel of $SWAPMOE_EXP_FP8_NARROW off /
# gemm1 / on. Each step runs while time is left (ends by ~$DEADLINE s, default 400: a start
# costs device time too, and 749 s were left when this ran). This is the script that ran
# (2026-12-06 03:52, H100); an earlier draft with the same steps and a longer deadline never ran.
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
D=${DEADLINE:-400}
install_wheels main n192 || exit 1
if grep -q H200 "$OUT/gpu.txt"; then
  DECODE=1,2,4,8,16,32,64
  PYTHONPATH=/tmp/site_main bench_shapes none $DECODE $((D * 2 / 5))
  PYTHONPATH=/tmp/site_main bench_shapes fp8_tensor $DECODE $((D * 2 / 5))
  [ $(el) -lt $((D / 2)) ] && routing_bench main 45 2
fi
for v in off gemm1 on; do  # the plans the A/B runs
  SWAPMOE_EXP_FP8_NARROW=$v PYTHONPATH=/tmp/site_n192 python3 -m swapmoe explain --model mixtral-8x7b --quant fp8_tensor \
    --m 4096 2>&1 | grep -E "kernels:"
done
gpu_pytest narrow n192 80 -n 16 tests/test_fp8_gpu.py -k "narrow"
[ $(el) -lt $((D - 150)) ] && PYTHONPATH=/tmp/site_n192 timeout 50 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
  tests/test_fp8_gpu.py -k "narrow_gemms and tile_edges and not pregathered" > "$OUT/sanitize_memcheck.txt" 2>&1
status "sanitize memcheck" $?
grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitize_memcheck.txt" | tail -2
left=$((D - $(el)))
[ $left -gt 50 ] && ab tensor "n192 n192:SWAPMOE_EXP_FP8_NARROW=gemm1 n192:SWAPMOE_EXP_FP8_NARROW=on" \
  "mixtral-8x7b:4096 qwen3-30b-a3b:4096 mixtral-8x7b:1024" "--quant fp8_tensor --no-read-floor" $left
pack 'pytest_*.log' 'ab_*_summary.txt' 'sanitize_*.txt' 'routing_main.txt' 'bench/*_fp8_tensor.txt'
echo "[$(el) s] end"
