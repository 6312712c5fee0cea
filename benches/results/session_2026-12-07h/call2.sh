#!/usr/bin/env bash
# Session 2026-12-07 (22:50-), call 2; dist/main = main at 1fea3ce (as call 1):
#   run(command="DEADLINE=570 OUT=$OUT bash benches/results/session_2026-12-07h/call2.sh", carry=["dist/main"], kind="nvidia-h200")
# H200: h200_2026-12-06/call_min.sh (decode tables, routing bench, split tests, sanitizers).
# H100: what main owes since the launcher change (d9c2bfd) after call 1's GPU suite parts:
# 1. compute-sanitizer memcheck and racecheck of every kernel variant (last run on main's
#    kernels 2026-12-07 09:00, before d9c2bfd changed the launchers' grid bounds).
# 2. `swapmoe bench` of the three public shapes at decode (M = 1-64), bf16, FP8 per tensor and
#    FP8 128x128 blocks: the README's H100 table is of 2026-12-06 (the push form), before the
#    launcher change, the thin-slots rule and the H100 tables of 2026-12-07.
# 3. The routing bench (issue 3) if time is left.
source benches/call_common.sh
D=${DEADLINE:-570}
start_call main $D
sanitize_variants main 90
export PYTHONPATH=/tmp/site_main
DECODE=1,2,4,8,16,32,64
bench_shapes none $DECODE $((D - 200))
bench_shapes fp8_tensor $DECODE $((D - 150))
bench_shapes fp8_block128 $DECODE $((D - 100))
left=$((D - $(el) - 10))
[ $left -gt 70 ] && routing_bench main $((left < 90 ? left : 90)) 3
pack 'sanitize_*.txt' 'bench/bench_*[0-9b].txt' 'bench/bench_*tensor.txt' 'bench/bench_*128.txt' "routing_main.txt"
echo "[$(el) s] end"
