#!/usr/bin/env bash
# The back-to-back and long-predecessor tests with their calls queued ahead of the GPU
# (conftest.queued_ahead_of_the_gpu), on main (twice) and on planted bugs:
#   run(command="OUT=$OUT WHEELS='main mut2' bash benches/results/pdl_2026-12-06/call_pdl2.sh", carry=["dist/main", "dist/mut2"])
# dist/mut2: M2 (the FP8 absmax pre-pass reads x before its wait) and M3 (the bf16 swap GEMM1
# has no griddepcontrol.wait); dist/mut3: M4 (FP8 quantize-x has no griddepcontrol.wait).
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels ${WHEELS:-main mut2} || exit 1
SEL="long_predecessor or back_to_back"
FILES="tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py"
for w in ${WHEELS:-main mut2}; do
  gpu_pytest $w $w 120 -m gpu -k "$SEL" $FILES
done
[ "${REPEAT_MAIN:-1}" = 1 ] && gpu_pytest main_again main 120 -m gpu -k "$SEL" $FILES
pack 'pytest_*.log'
echo "[$(el) s] end"
