#!/usr/bin/env bash
# Session 2026-12-07 (19:37-), call 1 (not run: no machine was lent); dist/main = main, which
# since d9c2bfd has Problem::max_active_experts (the launcher's grid rows and active-expert
# bounds through one method; no kernel change) and since 82baa80 the thin-slots swap-AB rule
# (deepseek-v3-tp8 bf16 M = 17-32 untabled; no kernel change):
#   run(command="DEADLINE=570 OUT=$OUT bash benches/results/session_2026-12-07g/call1.sh", carry=["dist/main"], kind="nvidia-h200")
# H200: h200_2026-12-06/call_min.sh (decode tables, routing bench, split tests, sanitizers).
# H100: the GPU tests the launcher change owes (call_suite.sh's rest and fp8_other parts: every
# launcher path but the routing files, ~310 s on an H100), then session_2026-12-07f/call5.sh
# (is this machine slow on GEMM2-by-PDL launches?) in what is left.
source benches/call_common.sh
D=${DEADLINE:-570}
start_call main $D
STEPS="rest fp8_other" DEADLINE=350 OUT=$OUT/suite bash benches/results/session_2026-12-06c/call_suite.sh
left=$((D - $(el)))
echo "[$(el) s] PDL probe in $left s"
DEADLINE=$left OUT=$OUT/pdl bash benches/results/session_2026-12-07f/call5.sh
pack 'suite/pytest_rest.log' 'suite/pytest_fp8_other.log' 'pdl/bench/qwen3-235b-a22b_2_heur_r1.txt'
echo "[$(el) s] end"
