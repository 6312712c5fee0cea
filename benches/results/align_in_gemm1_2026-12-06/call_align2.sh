#!/usr/bin/env bash
# cuda_wgmma's GEMM1 grouping the slots itself, second wheel (`dist/align`: GEMM1's dynamic
# shared memory limit now leaves 2 KiB for its static shared memory), against main:
#   run(command="OUT=$OUT bash benches/results/align_in_gemm1_2026-12-06/call_align2.sh", carry=["dist/main", "dist/align"])
# 1. the new GPU tests, then the cuda_wgmma, chain, align-cluster and fused_moe GPU tests;
# 2. A/B of `swapmoe bench` FP8 per tensor at M = 8-64 on qwen3-30b-a3b and deepseek-v3-tp8;
# 3. compute-sanitizer racecheck, then memcheck, of every kernel variant (sanitize_case.py).
source benches/call_common.sh
D=${DEADLINE:-575}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main align || exit 1
gpu_pytest new align 130 -m gpu -n 16 --durations=5 -k "groups_the_slots_itself" tests/test_gpu.py tests/test_fp8_gpu.py
grep -E "^[0-9.]+s (call|setup)" "$OUT/pytest_new.log" | head -5
K="(wgmma and not swap) or long_predecessor or queued_ahead or align_cluster or (fused_moe_matches_separate and wgmma) or cuda_graph_fused_moe"
gpu_pytest wgmma align 200 -m gpu -n 16 --durations=5 -k "$K" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
grep -E "^[0-9.]+s (call|setup)" "$OUT/pytest_wgmma.log" | head -5
BENCH_TIMEOUT=40 ab fp8 "main align" "qwen3-30b-a3b:8,16,32,64 deepseek-v3-tp8:8,16,32,64" "--quant fp8_tensor" 150
if [ $(el) -lt $((D - 60)) ]; then
  PYTHONPATH=/tmp/site_align timeout $((D - $(el) - 5)) compute-sanitizer --tool racecheck --error-exitcode 9 python3 benches/sanitize_case.py \
    > "$OUT/sanitize_racecheck.txt" 2>&1
  status "sanitize racecheck (align)" $?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|DIFFERENT|ALL OK" "$OUT/sanitize_racecheck.txt"
fi
pack 'pytest_*.log' 'ab_*_summary.txt' 'sanitize_*.txt'
echo "[$(el) s] end"
