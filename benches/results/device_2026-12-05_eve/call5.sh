source benches/call_common.sh
cat "$OUT/gpu.txt"
install_wheels par || exit 1
for v in on off; do
  [ $(el) -gt 120 ] && break
  SWAPMOE_EXP_PDL_AFTER_ROUTER=$v PYTHONPATH=/tmp/site_par timeout 70 python3 benches/routing_bench.py --m 1,8,64 --rounds 3 > "$OUT/routing_$v.txt" 2>&1
  echo "[$(el) s] routing pdl-after-router=$v: status $?"
  grep -E "^(qwen3|deepseek)" "$OUT/routing_$v.txt" | cut -c1-90 | tee -a "$OUT/summary_$v.txt"
done
echo "[$(el) s] end"
