#!/usr/bin/env bash
# The README's decode tables and issue 3's routing table after the push-form cluster sum, ~7
# minutes with the start (H200 wanted):
#   run(command="WHEEL=main OUT=$OUT bash benches/results/cluster_push_exit/call_tables.sh", carry=["dist/main"])
# 1. `swapmoe bench` of the three public shapes at decode (M = 1-64), bf16 and FP8 per tensor,
#    vLLM's baselines included.
# 2. The routing bench (fused_moe - fused_experts, issue 3) with the landed router.
# 3. FP8 128x128 blocks at decode if time is left.
source benches/call_common.sh
cat "$OUT/gpu.txt"
W=${WHEEL:-main}
install_wheels "$W" || exit 1
export PYTHONPATH=/tmp/site_$W
DECODE=1,2,4,8,16,32,64
bench_shapes none $DECODE
bench_shapes fp8_tensor $DECODE
routing_bench "$W" 80 3
bench_shapes fp8_block128 $DECODE 470
pack 'bench/*.txt' "routing_$W.txt"
echo "[$(el) s] end"
