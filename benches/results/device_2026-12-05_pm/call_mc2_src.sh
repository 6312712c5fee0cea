#!/usr/bin/env bash
# The third call of 2026-12-05 pm, ~2-3 minutes:
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05_pm/call_mc2_src.sh", carry=["dist/mc2"])
# ncu source views of exp/wgmma-multicast e3e5d09 (dist/mc2) at Mixtral fp8_tensor M = 4096,
# paired ($SWAPMOE_WGMMA_MULTICAST=on) against unpaired, for the e4m3 GEMM1 and GEMM2: where
# the pairs still lose 9% per kernel once the handoff's GPU-scope fence is gone.
source benches/call_common.sh  # $OUT, gpu.txt, el, ab, pack
for k in gemm1 gemm2; do
  for m in on off; do
    SWAPMOE_WGMMA_MULTICAST=$m OUT=$OUT/${k}_$m WHEEL_DIR=dist/mc2 NCU_SOURCE_CASES="mixtral:4096:fp8_tensor" \
      NCU_SOURCE_KERNEL=wgmma_moe_fp8_$k timeout 90 bash benches/device_run.sh ncu-source 2>&1 | grep -E "ncu|=="
  done
  python3 benches/ncu_source.py "$OUT/${k}_on/source_mixtral_4096_fp8_tensor.csv" "$OUT/${k}_off/source_mixtral_4096_fp8_tensor.csv" \
    --top 40 > "$OUT/${k}_compared.txt"; head -32 "$OUT/${k}_compared.txt"
  echo "[$(el) s] $k done"
done
for k in gemm1 gemm2; do cp "$OUT/${k}_on/source_mixtral_4096_fp8_tensor.txt" "$OUT/${k}_on.txt"; done
pack '*_compared.txt' 'gemm?_on.txt'
echo "[$(el) s] end"
