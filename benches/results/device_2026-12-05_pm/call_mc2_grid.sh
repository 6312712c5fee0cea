#!/usr/bin/env bash
# The fourth call of 2026-12-05 pm, ~4 minutes:
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05_pm/call_mc2_grid.sh",
#       carry=["dist/head", "dist/mc2"])
# The paired kernels' per-CTA work now looks like the unpaired (call 3's source views), yet each
# GEMM takes ~9% longer in a grid of one CTA per work item (8064 at Mixtral GEMM1): a cluster
# starts only when two SMs of one GPC are free at once. The persistent grid launches its
# clusters once. A/B at Mixtral M = 4096, fp8_tensor and bf16: HEAD and mc2 paired, each with
# the oracle's grid and with persistent grids; then ncu kernel times of mc2 paired persistent
# (the grid it launches is cuOccupancyMaxActiveClusters x 2).
source benches/call_common.sh  # $OUT, gpu.txt, el, ab, pack
M=SWAPMOE_WGMMA_MULTICAST=on P=SWAPMOE_WGMMA_PERSISTENT=on
BENCH_TIMEOUT=75 ab grid_fp8 "head head:$P mc2:$M mc2:$M,$P" "mixtral-8x7b:4096" "--quant fp8_tensor --no-read-floor" 200
BENCH_TIMEOUT=75 ab grid_bf16 "head head:$P mc2:$M mc2:$M,$P" "mixtral-8x7b:4096" "--no-read-floor" 200
for w in head mc2; do
  [ "$(el)" -lt 420 ] || break
  SWAPMOE_WGMMA_MULTICAST=on SWAPMOE_WGMMA_PERSISTENT=on OUT=$OUT/k_$w WHEEL_DIR=dist/$w KTIMES_CASES="mixtral:4096:fp8_tensor" \
    timeout 60 bash benches/device_run.sh ktimes 2>&1 | grep -E "gemm|sum"
done
pack '*_summary.txt'
echo "[$(el) s] end"
