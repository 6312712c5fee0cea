#!/usr/bin/env bash
# The first device call after 2026-12-05 (session 07:00, no device lent then): where the swap-AB
# kernels' excess over a pure reader sits at decode (NOTES "A timing probe build"), and the
# first measurement of the stages past the ring into L2 (NOTES "GEMM1's tail into L2", "GEMM2's
# tail into L2 after its wait", "L2 tails as a plan field": branch exp/l2-tails, tails.patch).
# Build here first (each ~11.5 MB; the carry takes 64 MiB):
#   maturin build --release -o dist/head
#   SWAPMOE_CUDA_STAMPS=1 maturin build --release -o dist/stamps
#   SWAPMOE_CUDA_STAMPS=1 SWAPMOE_CUDA_PROBE=no_mma maturin build --release -o dist/probe_stamps
#   git worktree add /tmp/tails exp/l2-tails && cd /tmp/tails && maturin build --release -o /work/main/dist/tails
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call1.sh",
#       carry=["dist/head", "dist/stamps", "dist/probe_stamps", "dist/tails"])
# (each flip of the build variables recompiles the CUDA modules, ~3.5 min on the 2-CPU machine.)
# The probe's effect is read as the stamped probe against the stamped release build (stamps.py
# times both; the stamps cost each the same ~2 us per layer). The tails wheel's correctness runs
# in call2.sh (a prefetch into L2 changes no value); its default (no $SWAPMOE_SWAP_L2_TAIL) is
# HEAD's behaviour with one more kernel argument, timed beside head to see that it costs nothing.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
for w in head stamps probe_stamps tails; do
  rm -rf /tmp/site_$w && python3 -m pip install -q --no-index --no-deps --target /tmp/site_$w dist/$w/*.whl || exit 1
done
# 0. the probe refuses a device unless told (a DeviceError, not wrong numbers)
PYTHONPATH=/tmp/site_probe_stamps timeout 30 python3 -c "
import torch, swapmoe
print(swapmoe.build_info()['cuda_probe'])
try:
    swapmoe.warmup(0); print('NOT REFUSED')
except swapmoe.DeviceError as e:
    print('refused:', str(e)[:80])" > "$OUT/probe_refusal.txt" 2>&1
echo "$(el) probe refusal: $(tail -1 "$OUT/probe_refusal.txt")"
# 1. L2 tails, FP8 per tensor: GEMM1's, GEMM2's, both (24 MiB each), against head and the
# tails wheel's default
T=SWAPMOE_SWAP_L2_TAIL
OUT=$OUT/ab WHEELS="head tails tails:$T=24,0 tails:$T=0,24 tails:$T=24,24" CASES="qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1" \
  ARGS="--quant fp8_tensor --no-read-floor" ROUNDS=2 BENCH_TIMEOUT=40 timeout 230 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_fp8.txt"; echo "$(el) ab fp8 done"
# 2. the per-CTA timelines (which kernel the probe shortens, and by how much)
st() {  # label, site, env..., -- stamps args
  local label=$1 site=$2; shift 2; local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  echo "=== $label" >> "$OUT/stamps.txt"
  env "${envs[@]}" SWAPMOE_PROBE_BUILD_OK=1 PYTHONPATH=/tmp/site_$site timeout 40 python3 benches/stamps.py "$@" \
    --json "$OUT/stamps_raw.json.gz" >> "$OUT/stamps.txt" 2>&1
  echo "$(el) stamps $label: exit $?"
}
st qwen3_fp8_m1 stamps X=1 -- --shape qwen3 --m 1 --quant fp8_tensor
st qwen3_fp8_m1_probe probe_stamps X=1 -- --shape qwen3 --m 1 --quant fp8_tensor
# GEMM1 with no GEMM2 prefetching beside it (GEMM2 after GEMM1 has finished): GEMM1's stream alone,
# against the w13 reader's 10.0 us
st qwen3_fp8_m1_probe_nopdl probe_stamps SWAPMOE_SWAP_GEMM2_PDL=0 -- --shape qwen3 --m 1 --quant fp8_tensor --label nopdl
# 3. bf16
OUT=$OUT/ab WHEELS="head tails:$T=24,0 tails:$T=0,24 tails:$T=24,24" CASES="qwen3-30b-a3b:1,8" \
  ARGS="--no-read-floor" ROUNDS=2 BENCH_TIMEOUT=40 timeout 150 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_bf16.txt"; echo "$(el) ab bf16 done"
python3 benches/ab_summary.py "$OUT"/ab_*.txt > "$OUT/ab_summary.txt" 2>&1; cat "$OUT/ab_summary.txt"
st qwen3_bf16_m1 stamps X=1 -- --shape qwen3 --m 1
st qwen3_bf16_m1_probe probe_stamps X=1 -- --shape qwen3 --m 1
st deepseek_fp8_m1 stamps X=1 -- --shape deepseek --m 1 --quant fp8_tensor
st deepseek_fp8_m1_probe probe_stamps X=1 -- --shape deepseek --m 1 --quant fp8_tensor
echo "$(el) end"
