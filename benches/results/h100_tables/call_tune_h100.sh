#!/usr/bin/env bash
# Tuned tables for the H100 (NOTES "Next steps (2026-12-06)" item 4): `swapmoe tune` of the three
# public shapes at 13 M points, bf16 and the three FP8 schemes, swapmoe's candidates only (no
# vLLM on the device). Resumable: give the last call's tables.tgz back as dist/tune_resume.tgz
# (a tracked copy is not needed; carry it) and the M points already in it are skipped.
#   run(command="OUT=$OUT bash benches/results/h100_tables/call_tune_h100.sh", carry=["dist/main"], kind="nvidia-h100-x1")
#   (resume: carry=["dist/main", "dist/tune_resume.tgz"])
# Unpack $OUT/tables.tgz's files into python/swapmoe/tables/ (their names carry
# device_name=NVIDIA_H100_80GB_HBM3), check them with `swapmoe explain --device-name`, and A/B
# the picks against the heuristics (SWAPMOE_TABLES=off) before shipping.
source benches/call_common.sh
D=${DEADLINE:-560}
grep -q H100 "$OUT/gpu.txt" || { echo "not an H100: $(tail -1 "$OUT/gpu.txt")"; exit 3; }
resume=""; [ -f dist/tune_resume.tgz ] && cp dist/tune_resume.tgz "$OUT/tables.tgz" && resume=$OUT/tables.tgz
for q in none fp8_tensor fp8_channel fp8_block128; do
  left=$((D - $(el) - 15))
  [ $left -lt 30 ] && break
  echo "=== tune --quant $q ($left s left)" >> "$OUT/tune.txt"
  WHEEL_DIR=dist/main TUNE_ARGS="--quant $q --no-vllm" TUNE_RESUME=$resume TUNE_TIMEOUT=$left \
    bash benches/device_run.sh tune > /dev/null 2>&1
  # device_run.sh's tune step pipes tune through tee, so its exit status is not tune's: count
  # the measured points instead
  echo "[$(el) s] tune $q: $(grep -c '^  M=' "$OUT/tune.txt") M points measured so far; last line: $(tail -1 "$OUT/tune.txt")"
  resume=$OUT/tables.tgz
done
tail -c 5000 "$OUT/tune.txt"
tar tzf "$OUT/tables.tgz" | sort
echo "[$(el) s] end"
