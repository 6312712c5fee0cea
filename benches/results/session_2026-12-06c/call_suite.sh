#!/usr/bin/env bash
# The rest of the whole GPU suite on main (dist/$WHEEL, default dist/main: build it from main, as
# the tests run from the working tree and test main's API; dist/g1 held main's kernels and API
# until the caller's workspace landed, 2026-12-06 22:40), after
# call2.sh (which ran the wgmma selection, or call_min.sh's swap split and routing tests on an
# H200). All six parts are 823 s of pytest time now: two calls at least (H100 times of 2026-12-06 20:15
# in brackets; each part's log lists its 15 slowest tests):
#   run(command="OUT=$OUT bash benches/results/session_2026-12-06c/call_suite.sh", carry=["dist/main"], kind="nvidia-h200")
# STEPS picks and orders the parts (default: every part call2.sh did not run on this card);
# each part starts only while its time is left before $DEADLINE (default 480 s). Two calls that
# fit: STEPS="rest fp8_other" (~320 s), then STEPS="routing swap_splits serial" (~330 s).
# WORKERS: pytest-xdist processes for every parallel part; unset, each part takes what measured
# fastest on an H100 (NOTES "The GPU suite at 4 xdist workers against 16"): rest and routing 4
# (201 and 21 s against 233 and 36 at 16), the others 16 (fp8_other 76 s against 91 at 4).
#   rest          every GPU file but the FP8 and routing ones, not serial   (667 + 35 skipped, 233 s)
#   fp8_other     the FP8 file, not wgmma-named, not serial                 (660 + 9 skipped, 76 s)
#   serial        the serial tests of every file, alone                      (72, 153 s)
#   swap_splits   the swap split/launch-variant tests ($SPLIT_TESTS)        (242, 123 s)
#   routing       the routing files                                          (597, 36 s)
#   wgmma         call2.sh's wgmma selection                                 (548, 202 s)
source benches/call_common.sh
D=${DEADLINE:-480}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
W=${WHEEL:-main}
install_wheels $W || exit 1
if grep -q H200 "$OUT/gpu.txt"; then default="rest fp8_other serial wgmma"; else default="rest fp8_other serial swap_splits routing"; fi
REST=$(ls tests/test_*gpu*.py | grep -v -e test_fp8_gpu.py -e test_routing)
K_WGMMA="(wgmma and not swap) or long_predecessor or queued_ahead or align_cluster or (fused_moe_matches_separate and wgmma) or cuda_graph_fused_moe"
part() {  # NAME NEEDED_SECONDS PYTEST_ARGS...: runs if NEEDED_SECONDS are left, else says so
  local name=$1 need=$2 left=$((D - $(el)))
  shift 2
  if [ $left -lt $need ]; then echo "[$(el) s] $name skipped: $left s left, $need needed"; return; fi
  gpu_pytest "$name" $W "$left" "$@"
}
for step in ${STEPS:-$default}; do
  case $step in
    rest) part rest 250 -m "gpu and not serial" -n ${WORKERS:-4} $REST ;;
    fp8_other) part fp8_other 90 -m "gpu and not serial" -n ${WORKERS:-16} -k "not wgmma" tests/test_fp8_gpu.py ;;
    serial) part serial 170 -m "gpu and serial" tests/test_*gpu*.py ;;
    swap_splits) part swap_splits 135 -m "gpu and not serial" -n ${WORKERS:-16} -k "$SPLIT_TESTS" tests/test_gpu.py tests/test_fp8_gpu.py ;;
    routing) part routing 45 -m "gpu and not serial" -n ${WORKERS:-4} tests/test_routing_gpu.py tests/test_routing_fused_gpu.py ;;
    wgmma) part wgmma 220 -m gpu -n ${WORKERS:-16} -o faulthandler_timeout=60 -k "$K_WGMMA" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py ;;
    *) echo "unknown step $step" ;;
  esac
done
pack 'pytest_*.log'
echo "[$(el) s] end"
