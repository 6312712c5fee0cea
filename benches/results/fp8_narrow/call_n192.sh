#!/usr/bin/env bash
# The narrow e4m3 GEMMs (192 weight rows per CTA, one drain per stage pair; branch
# exp/fp8-n192, NOTES "FP8 GEMM1 over 192 weight rows") on the device, ~9 minutes:
#   built here: CARGO_TARGET_DIR=/tmp/n192_target maturin build --release -o dist/n192
#   run(command="OUT=$OUT bash benches/results/fp8_narrow/call_n192.sh", carry=["dist/n192"])
# In order of value, each later step only while time is left (the call ends by ~540 s):
# 1. Their GPU tests (every case, N and K tails, persistent grids, each GEMM alone).
# 2. compute-sanitizer memcheck of the tile-edge tests.
# 3. A/B in one wheel, $SWAPMOE_EXP_FP8_NARROW off / gemm1 / on (both): fp8_tensor Mixtral
#    M = 1024 and 4096 and qwen3-30b-a3b M = 4096 (2 rounds).
# 4. racecheck of the tile-edge tests; the t128 FP8 tests with the switch off (the other
#    kernels' code moved to Tile<BM, BN>; their SASS is unchanged); fp8_channel on Mixtral.
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels n192 || exit 1
for v in off gemm1 on; do  # the plans the A/B runs (the bench's shapes on this device)
  SWAPMOE_EXP_FP8_NARROW=$v PYTHONPATH=/tmp/site_n192 python3 -m swapmoe explain --model mixtral-8x7b --quant fp8_tensor \
    --m 1024,4096 2>&1 | grep -E "^M=|kernels:"
done
gpu_pytest narrow n192 100 -n 16 tests/test_fp8_gpu.py -k "narrow"
sanitize() {
  PYTHONPATH=/tmp/site_n192 timeout "$2" compute-sanitizer --tool $1 --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
    tests/test_fp8_gpu.py -k "narrow_gemms and tile_edges and not pregathered" > "$OUT/sanitize_$1.txt" 2>&1
  status "sanitize $1" $?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/sanitize_$1.txt" | tail -3
}
sanitize memcheck 70
ab tensor "n192 n192:SWAPMOE_EXP_FP8_NARROW=gemm1 n192:SWAPMOE_EXP_FP8_NARROW=on" "mixtral-8x7b:1024,4096 qwen3-30b-a3b:4096" \
  "--quant fp8_tensor --no-read-floor" 240
[ $(el) -lt 440 ] && sanitize racecheck 70
left=$((540 - $(el)))
[ $left -gt 70 ] && gpu_pytest t128 n192 $((left < 90 ? left : 90)) -n 16 tests/test_fp8_gpu.py -k "wgmma and t128 and not swap and not block_run"
left=$((540 - $(el)))
[ $left -gt 50 ] && ab channel "n192 n192:SWAPMOE_EXP_FP8_NARROW=on" "mixtral-8x7b:4096" "--quant fp8_channel --no-read-floor" $left
pack 'pytest_*.log' 'ab_*_summary.txt' 'sanitize_*.txt'
echo "[$(el) s] end"
