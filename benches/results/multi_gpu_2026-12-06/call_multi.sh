#!/usr/bin/env bash
# tests/test_multi_gpu.py on two GPUs of one host, with each wheel named in $WHEELS:
#   run(command="OUT=$OUT WHEELS='main' bash benches/results/multi_gpu_2026-12-06/call_multi.sh",
#       carry=["dist/main"], kind="nvidia-h100-x2")
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels ${WHEELS:-main} || exit 1
for w in ${WHEELS:-main}; do
  gpu_pytest multi_$w $w 200 -m gpu tests/test_multi_gpu.py
done
echo "[$(el) s] end"
