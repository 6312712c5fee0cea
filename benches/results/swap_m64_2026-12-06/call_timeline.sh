#!/usr/bin/env bash
# Where the oracle's plan spends a layer at M = 16-64 (the wgmma t64 path: quantize-x, align,
# GEMM1, GEMM2, top-k sum): per-kernel times and gaps inside the bench's graph (graph_timeline.py).
#   run(command="OUT=$OUT bash benches/results/swap_m64_2026-12-06/call_timeline.sh", carry=["dist/main"])
source benches/call_common.sh
cat "$OUT/gpu.txt"
install_wheels main || exit 1
export PYTHONPATH=/tmp/site_main TIMELINE_REPLAYS=30
for c in qwen3:16:fp8_tensor qwen3:32:fp8_tensor qwen3:64:fp8_tensor qwen3:32:none qwen3:64:none deepseek:16:fp8_tensor deepseek:32:fp8_tensor deepseek:64:fp8_tensor deepseek:64:none; do
  IFS=: read -r shape m quant <<< "$c"
  qe=""; [ $quant != none ] && qe="PROFILE_QUANT=$quant"
  env $qe timeout 90 python3 benches/graph_timeline.py $m $shape > "$OUT/timeline_${shape}_${m}_$quant.txt" 2>&1
  status "timeline $c" $?
  tail -12 "$OUT/timeline_${shape}_${m}_$quant.txt"
done
pack 'none'
echo "[$(el) s] end"
