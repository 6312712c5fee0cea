#!/usr/bin/env bash
# First call of the 2026-12-07 session, on whichever card comes:
#   run(command="OUT=$OUT bash benches/results/session_2026-12-07/call_any.sh", carry=["dist/main", "dist/sh"], kind="nvidia-h200")
# H200: call1.sh (main's H200 validation and README tables, then the caller-workspace tests).
# H100: the caller-workspace tests on main (their last edits never ran on a GPU), then
# call_sh.sh (the suspend-hint A/B and sh's split and wgmma tests) in the time left.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  OUT=$OUT bash benches/results/session_2026-12-07/call1.sh
  exit
fi
source benches/call_common.sh
OUT=$OUT bash benches/results/session_2026-12-07/call_cw_only.sh
DEADLINE=$((${DEADLINE:-540} - $(el))) OUT=$OUT bash benches/results/session_2026-12-07/call_sh.sh
