#!/usr/bin/env bash
# The multicast-pairs experiment (branch exp/wgmma-multicast, wheel dist/mc) first, then the
# decode A/B that call_main.sh carries, in one call for a budget of ~800 s:
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call_mc.sh",
#       carry=["dist/head", "dist/mc", "dist/tails", "dist/sa"])
# tests_mc/ was the branch's tests/ copied into the checkout (untracked, so it travelled with
# the working tree) and removed after the run.
# 1. mc's multicast GPU tests (bf16/f16 and every FP8 scheme against float64 and bit for bit
#    against the unpaired kernels, both grids, both tiles, block runs, graphs), killed after
#    200 s: a cluster that deadlocks shows as a timeout here, not as a lost call.
# 2. Only if they pass: Mixtral M = 4096, fp8_tensor (HEAD, mc unpaired, mc paired) and bf16
#    (HEAD, mc paired); the paired kernels are the experiment, mc unpaired prices its extra
#    registers.
# 3. The FP8 per-tensor decode A/B of call_main.sh's small form (HEAD, both L2 tails, sa at
#    qwen3 M = 1, 2, 8), then sa's FP8 swap tests, as far as the time goes.
source benches/call_common.sh  # $OUT, gpu.txt, el, ab
install_wheels head mc tails sa || exit 1
echo "[$(el) s] installed"
TIMEOUT_SIGNAL=KILL gpu_pytest mc mc 200 -m gpu -n 8 tests_mc/test_gpu.py tests_mc/test_fp8_gpu.py -k multicast
rc=$?
if [ $rc = 0 ]; then
  M=SWAPMOE_WGMMA_MULTICAST=on
  BENCH_TIMEOUT=75 ab mc_fp8 "head mc mc:$M" "mixtral-8x7b:4096" "--quant fp8_tensor --no-read-floor" 200
  BENCH_TIMEOUT=75 ab mc_bf16 "head mc:$M" "mixtral-8x7b:4096" "--no-read-floor" 140
fi
T=SWAPMOE_SWAP_L2_TAIL
[ "$(el)" -lt 330 ] && ab fp8_decode "head tails:$T=24,0 tails:$T=0,24 tails:$T=24,24 sa" "qwen3-30b-a3b:1,2,8" \
  "--quant fp8_tensor --no-read-floor" 150
if [ "$(el)" -lt 440 ]; then
  gpu_pytest sa_swap sa 100 -m "gpu and not serial" -n 16 tests/test_fp8_gpu.py -k "swap"
fi
echo "[$(el) s] end"
