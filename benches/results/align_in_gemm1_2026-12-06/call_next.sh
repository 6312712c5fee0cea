#!/usr/bin/env bash
# The next session's first call (NOTES "Next steps (2026-12-06, 11:50)" 1): main with GEMM1's
# grouping, as landed (`dist/main` rebuilt from main), on whatever GPU comes, ~8 minutes:
#   run(command="OUT=$OUT bash benches/results/align_in_gemm1_2026-12-06/call_next.sh", carry=["dist/main"], kind="nvidia-h200")
# 1. the grouping's GPU tests (with the 256- and 2000-expert cases no GPU has run yet), then the
#    cuda_wgmma, chain, align-cluster and fused_moe tests, verbose;
# 2. A/B of main against itself with the grouping off, in both entry orders (ABBA), FP8 per
#    tensor at qwen3-30b-a3b (groups) and deepseek-v3-tp8 (does not: the off entries must read
#    as the default), then qwen3 per channel and 128x128 blocks;
# 3. compute-sanitizer racecheck and memcheck of every kernel variant (the _ga kernels' cases).
source benches/call_common.sh
D=${DEADLINE:-570}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
gpu_pytest new main 120 -m gpu -n 16 -v -k "groups_the_slots_itself" tests/test_gpu.py tests/test_fp8_gpu.py
grep -cE " PASSED " "$OUT/pytest_new.log"; grep -E " (FAILED|ERROR) " "$OUT/pytest_new.log" | head
K="(wgmma and not swap) or long_predecessor or queued_ahead or align_cluster or (fused_moe_matches_separate and wgmma) or cuda_graph_fused_moe"
gpu_pytest wgmma main 230 -m gpu -n 16 -v -o faulthandler_timeout=60 -k "$K" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
grep -cE " PASSED " "$OUT/pytest_wgmma.log"; grep -E " (FAILED|ERROR) " "$OUT/pytest_wgmma.log" | head
OFF="main:SWAPMOE_ALIGN_IN_GEMM1=off"
BENCH_TIMEOUT=40 ab tensor "main $OFF $OFF main" "qwen3-30b-a3b:16,32,64 deepseek-v3-tp8:16,64" "--quant fp8_tensor" 150
[ $(el) -lt $((D - 120)) ] && BENCH_TIMEOUT=40 ab scaled "main $OFF" "qwen3-30b-a3b:8,16,64" "--quant fp8_channel" 60
[ $(el) -lt $((D - 60)) ] && BENCH_TIMEOUT=40 ab blocks "main $OFF" "qwen3-30b-a3b:4,16,64" "--quant fp8_block128" 60
sanitize_variants main 60 $((D - 70))
pack 'pytest_*.log' 'ab_*_summary.txt' 'sanitize_*.txt'
echo "[$(el) s] end"
