#!/usr/bin/env bash
# The second call of 2026-12-05 pm, ~8 minutes:
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05_pm/call_mc2.sh",
#       carry=["dist/head", "dist/mc2", "dist/ct"])
# dist/head: main's kernels (3b2667f); dist/mc2: exp/wgmma-multicast e3e5d09 (the consumers'
# stage handoff to the partner without the GPU-scope fence); dist/ct: exp/column-token 4d6fbe9
# (accumulator_token, a SASS change in 24 of the 80 swap kernels' epilogues).
# tests_mc/ is mc2's tests/ copied into the checkout (untracked, so it travels with the
# working tree); remove it after the run.
# 1. mc2's multicast GPU tests, killed after 150 s (a deadlocked cluster shows as a timeout).
# 2. Only if they pass: the whole op at Mixtral M = 4096 (fp8_tensor, bf16) and qwen3 M = 4096
#    (fp8_tensor), HEAD against mc2 paired; then ncu kernel times of mc2 paired at Mixtral
#    fp8_tensor M = 4096 (HEAD's: 1673 / 831 µs on the H100 of 13:35).
# 3. ct against HEAD at decode (qwen3 fp8_tensor and bf16 M = 1, 8), then ct's swap GPU tests.
source benches/call_common.sh  # $OUT, gpu.txt, el, ab, pack
install_wheels head mc2 ct || exit 1
echo "[$(el) s] installed"
TIMEOUT_SIGNAL=KILL gpu_pytest mc2 mc2 150 -m gpu -n 8 tests_mc/test_gpu.py tests_mc/test_fp8_gpu.py -k multicast
rc=$?
if [ $rc = 0 ]; then
  M=SWAPMOE_WGMMA_MULTICAST=on
  BENCH_TIMEOUT=75 ab mc_fp8 "head mc2:$M" "mixtral-8x7b:4096 qwen3-30b-a3b:4096" "--quant fp8_tensor --no-read-floor" 200
  BENCH_TIMEOUT=75 ab mc_bf16 "head mc2:$M" "mixtral-8x7b:4096" "--no-read-floor" 120
  [ "$(el)" -lt 330 ] && SWAPMOE_WGMMA_MULTICAST=on OUT=$OUT/k_mc2 WHEEL_DIR=dist/mc2 KTIMES_CASES="mixtral:4096:fp8_tensor" \
    timeout 60 bash benches/device_run.sh ktimes 2>&1 | grep -vE "^(===|name)"
fi
[ "$(el)" -lt 400 ] && ab ct "head ct" "qwen3-30b-a3b:1,8" "--quant fp8_tensor --no-read-floor" 60
[ "$(el)" -lt 440 ] && ab ct_bf16 "head ct" "qwen3-30b-a3b:1,8" "--no-read-floor" 60
if [ "$(el)" -lt 480 ]; then
  gpu_pytest ct_swap ct 120 -m "gpu and not serial" -n 16 tests/test_fp8_gpu.py tests/test_gpu.py -k "swap"
fi
pack '*_summary.txt'
echo "[$(el) s] end"
