#!/usr/bin/env bash
# The routing bench alone, head / rx / head / rx (3 rounds each), for issue 3's table on whatever
# card comes (the first call of 2026-12-05 evening ran on an H100), ~3 minutes:
#   run(command="OUT=$OUT bash benches/results/router_xor_rank/call_rx_h200.sh", carry=["dist/head", "dist/rx"])
source benches/call_common.sh
cat "$OUT/gpu.txt"
install_wheels head rx || exit 1
for w in head rx head rx; do
  [ $(el) -gt 170 ] && break
  PYTHONPATH=/tmp/site_$w timeout 70 python3 benches/routing_bench.py --m 1,8,64 --rounds 3 > "$OUT/routing_$w.txt" 2>&1
  status "routing $w" $?
  grep -E "^(qwen3|deepseek)" "$OUT/routing_$w.txt" | cut -c1-130
done
echo "[$(el) s] end"
