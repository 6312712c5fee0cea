#!/usr/bin/env bash
# This session's second device call (written 2026-12-07 08:50; dist/main = main + the paired rounds):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07c/call2.sh", carry=["dist/main"], kind="nvidia-h200")
# 1. `swapmoe bench --with-routing` with the paired rounds (5 alternating rounds per point,
#    moe-exp_us) for deepseek-v3-tp8 and qwen3-30b-a3b at M = 1, 8, 64: call1's two columns
#    read +5.1 / +5.5 at deepseek M = 64 where routing_bench's paired rounds read +2.6 (+2.3..+2.8).
# 2. The bench's new GPU test (graphs replayed in turn), then the FP8 file's other tests and
#    compute-sanitizer memcheck and racecheck of every kernel variant (not run on main today).
source benches/call_common.sh
D=${DEADLINE:-540}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main || exit 1
mkdir -p "$OUT/bench"
for model in deepseek-v3-tp8 qwen3-30b-a3b; do
  PYTHONPATH=/tmp/site_main timeout 120 python3 -m swapmoe bench --model $model --m 1,8,64 --with-routing \
    --no-baselines --no-read-floor --no-progress --json "$OUT/bench/paired_${model}.json" \
    > "$OUT/bench/paired_${model}.txt" 2>&1
  status "bench --with-routing (paired) $model" $?
  grep -E "^ *[0-9]+ |^ *M |CHECK|error" "$OUT/bench/paired_${model}.txt" | cut -c1-200
done
gpu_pytest bench_gpu main 90 -m gpu tests/test_bench_routing.py
left=$((D - $(el)))
[ $left -gt 100 ] && gpu_pytest fp8_other main 110 -m "gpu and not serial" -n 16 -k "not wgmma" tests/test_fp8_gpu.py
sanitize_variants main 75 $((D - 80))
pack 'pytest_*.log' 'sanitize_*.txt' 'bench/paired_*.txt'
echo "[$(el) s] end"
