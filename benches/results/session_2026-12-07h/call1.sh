#!/usr/bin/env bash
# Session 2026-12-07 (22:50-), call 1; dist/main = main at 1fea3ce (no kernel change since the
# GPU suite's serial, swap_splits and wgmma parts last ran; d9c2bfd changed the launchers' grid
# bounds and those parts have not run since):
#   run(command="DEADLINE=570 OUT=$OUT bash benches/results/session_2026-12-07h/call1.sh", carry=["dist/main"], kind="nvidia-h200")
# H200: h200_2026-12-06/call_min.sh (decode tables, routing bench, split tests, sanitizers).
# H100: call_suite.sh's serial, swap_splits and wgmma parts (153 + 123 + 202 s of pytest on the
# H100 of 2026-12-06 20:15), each only while its time is left.
source benches/call_common.sh
D=${DEADLINE:-570}
start_call main $D
STEPS="serial swap_splits wgmma" DEADLINE=$((D - $(el) - 5)) OUT=$OUT/suite bash benches/results/session_2026-12-06c/call_suite.sh
pack 'suite/pytest_serial.log' 'suite/pytest_swap_splits.log' 'suite/pytest_wgmma.log'
echo "[$(el) s] end"
