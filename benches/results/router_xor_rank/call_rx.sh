#!/usr/bin/env bash
# The grouped CTA router with butterfly-shuffle ranks (branch exp/router-xor-rank), ~6 minutes:
#   on the CPU machine: git worktree add /tmp/rx exp/router-xor-rank; (cd /tmp/rx &&
#     CARGO_TARGET_DIR=/tmp/rx_target maturin build --release -o /work/main/dist/rx);
#     maturin build --release -o dist/head (main)
#   run(command="OUT=$OUT bash benches/results/router_xor_rank/call_rx.sh", carry=["dist/head", "dist/rx"])
# 1. rx's routing GPU tests (routers against the CPU, fused_moe against select_experts +
#    fused_experts) and compute-sanitizer on the router cases of sanitize_case.py.
# 2. The routing bench, head / rx / head / rx (fused_moe - fused_experts and the router alone).
# (Ran as is on an H100, 2026-12-05 19:20. Since the branch landed, ROUTING_ONLY=1 skips step 1
# and stops the bench after ~170 s: issue 3's table with rx on whatever card comes, ~3 minutes:
#   run(command="ROUTING_ONLY=1 OUT=$OUT bash benches/results/router_xor_rank/call_rx.sh", carry=["dist/head", "dist/rx"]))
source benches/call_common.sh
cat "$OUT/gpu.txt"
install_wheels head rx || exit 1
[ -z "${ROUTING_ONLY:-}" ] && gpu_pytest rx_routing rx 150 -m gpu -n 16 tests/test_routing_gpu.py tests/test_routing_fused_gpu.py
for tool in memcheck racecheck; do
  [ -n "${ROUTING_ONLY:-}" ] && break
  PYTHONPATH=/tmp/site_rx timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 python3 benches/sanitize_case.py > "$OUT/sanitize_$tool.txt" 2>&1
  status "sanitize $tool" $?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|DIFFERENT|ALL OK" "$OUT/sanitize_$tool.txt"
done
for w in head rx head rx; do
  [ $(el) -gt $([ -n "${ROUTING_ONLY:-}" ] && echo 170 || echo 480) ] && break
  PYTHONPATH=/tmp/site_$w timeout 70 python3 benches/routing_bench.py --m 1,8,64 --rounds 3 > "$OUT/routing_$w.txt" 2>&1
  status "routing $w" $?
  grep -E "^(qwen3|deepseek)" "$OUT/routing_$w.txt" | cut -c1-200
done
pack 'pytest_*.log' 'routing_*.txt'
echo "[$(el) s] end"
