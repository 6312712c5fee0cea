#!/usr/bin/env bash
# Main at bc9a12e (dist/main) on whichever card comes, one call (~9 minutes with the start):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07/call1.sh", carry=["dist/main"], kind="nvidia-h200")
# H200: call_min.sh (the README's decode tables in bf16 and FP8 per tensor, the routing bench,
# the swap split tests, the sanitizers, the routing tests) within $H200_DEADLINE s, then the
# caller-workspace tests (never run on an H200; their last edits never on any GPU).
# H100: the caller-workspace tests, then the suite's swap_splits and serial parts (not yet run
# with the workspace checks) within $DEADLINE s.
source benches/call_common.sh
cat "$OUT/gpu.txt"
W=${WHEEL:-main}  # each step below installs dist/$W itself
if grep -q H200 "$OUT/gpu.txt"; then
  WHEEL=$W DEADLINE=${H200_DEADLINE:-430} OUT=$OUT bash benches/results/h200_2026-12-06/call_min.sh
  WHEEL=$W OUT=$OUT bash benches/results/session_2026-12-07/call_cw_only.sh
  pack 'pytest_*.log' "routing_$W.txt" 'sanitize_*.txt' 'bench/*'
else
  WHEEL=$W OUT=$OUT bash benches/results/session_2026-12-07/call_cw_only.sh
  STEPS="swap_splits serial" DEADLINE=$((${DEADLINE:-520} - $(el))) WHEEL=$W OUT=$OUT bash benches/results/session_2026-12-06c/call_suite.sh
  pack 'pytest_*.log'
fi
echo "[$(el) s] end"
