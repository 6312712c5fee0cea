#!/usr/bin/env bash
# cuda_wgmma's GEMM1 grouping the slots itself (no route_align launch), `dist/align`, against
# main (`dist/main`), on one GPU, in order of value (each later step only while time is left):
#   run(command="OUT=$OUT bash benches/results/align_in_gemm1_2026-12-06/call_align.sh", carry=["dist/main", "dist/align"])
# 1. the new GPU tests, then the wgmma, chain and routing GPU tests (regressions) on dist/align;
# 2. A/B of `swapmoe bench` (FP8 per tensor, then bf16) at M = 8-64 on qwen3-30b-a3b and
#    deepseek-v3-tp8, two rounds, main against align;
# 3. compute-sanitizer memcheck and racecheck of every kernel variant (sanitize_case.py);
# 4. the graph timeline of qwen3-30b-a3b FP8 M = 16 and 64 on dist/align.
source benches/call_common.sh
D=${DEADLINE:-570}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main align || exit 1
gpu_pytest new align 150 -m gpu -n 16 -k "groups_the_slots_itself" tests/test_gpu.py tests/test_fp8_gpu.py
gpu_pytest wgmma align 200 -m gpu -n 16 -k "wgmma or long_predecessor or queued_ahead or back_to_back or align or fused_moe" \
  tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
BENCH_TIMEOUT=40 ab fp8 "main align" "qwen3-30b-a3b:8,16,32,64 deepseek-v3-tp8:8,16,32,64" "--quant fp8_tensor" 150
[ $(el) -lt $((D - 200)) ] && sanitize_variants align 60
[ $(el) -lt $((D - 110)) ] && BENCH_TIMEOUT=40 ab bf16 "main align" "qwen3-30b-a3b:16,32,64 deepseek-v3-tp8:16,32,64" "" 100
if [ $(el) -lt $((D - 30)) ]; then
  for m in 16 64; do
    PYTHONPATH=/tmp/site_align PROFILE_QUANT=fp8_tensor TIMELINE_REPLAYS=20 timeout 25 python3 benches/graph_timeline.py $m qwen3 \
      > "$OUT/timeline_qwen3_${m}_fp8_align.txt" 2>&1
    status "timeline M=$m" $?; grep -E "^  [a-z]|per layer" "$OUT/timeline_qwen3_${m}_fp8_align.txt"
  done
fi
pack 'pytest_*.log' 'ab_*_summary.txt' 'sanitize_*.txt'
echo "[$(el) s] end"
