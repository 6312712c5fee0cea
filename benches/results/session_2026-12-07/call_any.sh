#!/usr/bin/env bash
# The next device call, on whichever card comes (written 2026-12-07; build dist/main from main first):
#   run(command="DEADLINE=540 OUT=$OUT bash benches/results/session_2026-12-07/call_any.sh", carry=["dist/main"], kind="nvidia-h200")
# H200: call1.sh (main's H200 validation and README tables: call_min.sh, then the
#       caller-workspace tests, which have not run on an H200).
# H100: the parts of the GPU suite that have not run on main since the caller's workspace
#       (the caller-workspace tests themselves passed on an H100 on 2026-12-07 04:41):
#       swap_splits, serial, then wgmma while time is left.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  OUT=$OUT bash benches/results/session_2026-12-07/call1.sh
  exit
fi
STEPS="swap_splits serial wgmma" DEADLINE=${DEADLINE:-540} OUT=$OUT bash benches/results/session_2026-12-06c/call_suite.sh
