#!/usr/bin/env bash
# Where the PDL patch loses 6 us at qwen3 FP8 (call_first.sh's A/B), and the rest of its tests,
# in one call of ~9 minutes:
#   run(command="OUT=$OUT bash benches/results/wgmma_gemm2_pdl_2026-12-06/call_split.sh", carry=["dist/main", "dist/pdlx"])
# (dist/pdlx: the patch exp-wgmma-gemm2-pdl.patch applied, and in src/cuda/launch.rs's
# wgmma_topk_reduce the launch's `plan.wgmma_gemm2_pdl,` argument made
# `plan.wgmma_gemm2_pdl && std::env::var("SWAPMOE_X_SUM_PDL").map_or(true, |v| v != "0"),`.)
# Ran 2026-12-06 16:58 on an H100 (call_split_out/; NOTES "The PDL patch measured").
# 1. per-kernel times and gaps in the bench's graph (graph_timeline.py) for main, pdlx (the
#    patch plus $SWAPMOE_X_SUM_PDL, a throwaway knob for the top-k sum's PDL alone) and pdlx
#    with each of the sum's and GEMM2's PDL off (qwen3 FP8 M = 16; deepseek: main and pdlx);
# 2. an A/B of the same entries (qwen3 M = 16, 64; deepseek M = 16);
# 3. the wgmma, chain, align-cluster and graph GPU tests on pdlx (call_first.sh's ran out of time
#    at 96% with no failure);
# 4. compute-sanitizer memcheck, then racecheck, of every kernel variant on pdlx, as time allows.
source benches/call_common.sh
D=${DEADLINE:-555}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main pdlx || exit 1
for c in qwen3:16:main qwen3:16:pdlx qwen3:16:pdlx:SWAPMOE_X_SUM_PDL=0 qwen3:16:pdlx:SWAPMOE_WGMMA_GEMM2_PDL=0 deepseek:16:main deepseek:16:pdlx; do
  IFS=: read -r shape m w e <<< "$c"
  f="$OUT/timeline/${shape}_${m}_${w}_${e//=/_}.txt"; mkdir -p "$OUT/timeline"
  env $e PYTHONPATH=/tmp/site_$w TIMELINE_REPLAYS=20 PROFILE_QUANT=fp8_tensor timeout 60 python3 benches/graph_timeline.py $m $shape > "$f" 2>&1
  status "timeline $c" $?
  grep -E "^  [a-z_0-9]+ +[0-9.]+ +gap|layer span|do_bench" "$f"
done
BENCH_TIMEOUT=40 ab split "main pdlx pdlx:SWAPMOE_X_SUM_PDL=0 pdlx:SWAPMOE_WGMMA_GEMM2_PDL=0 pdlx main" "qwen3-30b-a3b:16,64 deepseek-v3-tp8:16" "--quant fp8_tensor" 150
K="(wgmma and not swap) or long_predecessor or queued_ahead or align_cluster or (fused_moe_matches_separate and wgmma) or cuda_graph_fused_moe"
left=$((D - $(el) - 70))
gpu_pytest wgmma pdlx $((left < 240 ? left : 240)) -m gpu -n 16 -o faulthandler_timeout=120 -k "$K" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
sanitize_variants pdlx 60 $((D - 60))
pack 'timeline/*' 'pytest_*.log' 'ab_*_summary.txt' 'sanitize_*.txt'
echo "[$(el) s] end"
