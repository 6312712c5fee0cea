#!/usr/bin/env bash
# The first device call after 2026-12-05 (session 07:00, no device lent then): where the swap-AB
# kernels' excess over a pure reader sits at decode (NOTES "Next steps", item 1), and the
# block-run FP8 tests under xdist with the grouped float64 reference (never run on the GPU).
# Build here first (each ~11 MB; all four fit the carry's 64 MiB):
#   maturin build --release -o dist/head
#   SWAPMOE_CUDA_PROBE=no_mma maturin build --release -o dist/probe
#   SWAPMOE_CUDA_STAMPS=1 maturin build --release -o dist/stamps
#   SWAPMOE_CUDA_STAMPS=1 SWAPMOE_CUDA_PROBE=no_mma maturin build --release -o dist/probe_stamps
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call1.sh",
#       carry=["dist/head", "dist/probe", "dist/stamps", "dist/probe_stamps"])
# (maturin reuses target/ across the four builds only when the env is unchanged: each flip
# recompiles the CUDA modules, ~4 min on this machine.)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
for w in head probe stamps probe_stamps; do
  rm -rf /tmp/site_$w && python3 -m pip install -q --no-index --no-deps --target /tmp/site_$w dist/$w/*.whl || exit 1
done
# 0. the probe refuses a device unless told (a DeviceError, not wrong numbers)
PYTHONPATH=/tmp/site_probe python3 -c "
import torch, swapmoe
print(swapmoe.build_info()['cuda_probe'])
try:
    swapmoe.warmup(0); print('NOT REFUSED')
except swapmoe.DeviceError as e:
    print('refused:', str(e)[:80])" > "$OUT/probe_refusal.txt" 2>&1
echo "$(el) probe refusal: $(tail -1 "$OUT/probe_refusal.txt")"
# 1. the block-run FP8 tests under xdist (before the grouped reference, 8-12 at once did not finish in 70-180 s)
PYTHONPATH=/tmp/site_head timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -n 16 -rfE --durations=5 \
  tests/test_fp8_gpu.py -k "block_run" > "$OUT/pytest_block_run.log" 2>&1
echo "$(el) block_run: exit $? ; $(tail -1 "$OUT/pytest_block_run.log")"
# 2. release against probe (no math), interleaved: FP8 per tensor, then bf16
OUT=$OUT/ab WHEELS="head probe:SWAPMOE_PROBE_BUILD_OK=1" CASES="qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1,8" \
  ARGS="--quant fp8_tensor --no-read-floor" ROUNDS=2 BENCH_TIMEOUT=60 timeout 150 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_fp8.txt"; echo "$(el) ab fp8 done"
OUT=$OUT/ab WHEELS="head probe:SWAPMOE_PROBE_BUILD_OK=1" CASES="qwen3-30b-a3b:1,8 deepseek-v3-tp8:1" \
  ARGS="--no-read-floor" ROUNDS=2 BENCH_TIMEOUT=60 timeout 110 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_bf16.txt"; echo "$(el) ab bf16 done"
# 3. the per-CTA timelines of both (which kernel the probe shortens, and by how much)
st() {  # label, site, -- stamps args
  local label=$1 site=$2; shift 3
  echo "=== $label" >> "$OUT/stamps.txt"
  SWAPMOE_PROBE_BUILD_OK=1 PYTHONPATH=/tmp/site_$site timeout 40 python3 benches/stamps.py "$@" \
    --json "$OUT/stamps_raw.json.gz" >> "$OUT/stamps.txt" 2>&1
  echo "$(el) stamps $label: exit $?"
}
st qwen3_fp8_m1 stamps -- --shape qwen3 --m 1 --quant fp8_tensor
st qwen3_fp8_m1_probe probe_stamps -- --shape qwen3 --m 1 --quant fp8_tensor
st qwen3_bf16_m1 stamps -- --shape qwen3 --m 1
st qwen3_bf16_m1_probe probe_stamps -- --shape qwen3 --m 1
st deepseek_fp8_m1 stamps -- --shape deepseek --m 1 --quant fp8_tensor
st deepseek_fp8_m1_probe probe_stamps -- --shape deepseek --m 1 --quant fp8_tensor
# 4. the read floor of the same points, for the table (one reader per layer, and two)
PYTHONPATH=/tmp/site_head timeout 90 python3 benches/read_floor.py --models qwen3-30b-a3b,deepseek-v3-tp8 --m 1,8 \
  --chunks-kib 16 --boxes "" --json "$OUT/read_floor.json" > "$OUT/read_floor.log" 2>&1
echo "$(el) read_floor: exit $?"
echo "$(el) end"
