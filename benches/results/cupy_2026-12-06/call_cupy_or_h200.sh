#!/usr/bin/env bash
# call_cupy.sh (bounded to ~170 s); then, only if the machine is an H200, the H200 call of
# main (benches/results/h200_2026-12-06/call_min.sh) in the time left:
#   run(command="OUT=$OUT bash benches/results/cupy_2026-12-06/call_cupy_or_h200.sh",
#       carry=["dist/cupy", "dist/main"], kind="nvidia-h200")
mkdir -p "$OUT/cupy"
OUT=$OUT/cupy DEADLINE=170 bash benches/results/cupy_2026-12-06/call_cupy.sh
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  mkdir -p "$OUT/h200"
  OUT=$OUT/h200 DEADLINE=400 bash benches/results/h200_2026-12-06/call_min.sh
fi
cd "$OUT" && tar czf cupy_logs.tgz cupy && rm -rf cupy
[ -d h200 ] && tar czf h200.tgz h200 && rm -rf h200
ls -R "$OUT" | head -20
