#!/usr/bin/env bash
# The first device call after 2026-12-05 (session 07:00, no device lent then): where the swap-AB
# kernels' excess over a pure reader sits at decode (NOTES "A timing probe build"), and the
# first tests of the stages past the ring into L2 (NOTES "GEMM1's tail into L2", "GEMM2's tail
# into L2 after its wait": l2tail.patch, g2tail.patch).
# Build here first (each ~11.5 MB; five fit the carry's 64 MiB, six do not: the plain probe
# wheel is left out, and the probe's effect is read from its stamped build against the stamped
# release build, both timed by stamps.py):
#   maturin build --release -o dist/head
#   SWAPMOE_CUDA_STAMPS=1 maturin build --release -o dist/stamps
#   SWAPMOE_CUDA_STAMPS=1 SWAPMOE_CUDA_PROBE=no_mma maturin build --release -o dist/probe_stamps
#   git worktree add /tmp/l2tail HEAD && cd /tmp/l2tail && git apply \
#     /work/main/benches/results/probe_2026-12-05/l2tail.patch && maturin build --release -o /work/main/dist/l2tail
#   (the same with g2tail.patch into dist/g2tail, in its own worktree)
#   run(command="OUT=$OUT bash benches/results/probe_2026-12-05/call1.sh",
#       carry=["dist/head", "dist/stamps", "dist/probe_stamps", "dist/l2tail", "dist/g2tail"])
# (each flip of the build variables recompiles the CUDA modules, ~3.5 min on the 2-CPU machine.)
# The l2tail and g2tail wheels' correctness runs in call2.sh (the tail prefetch changes no result: it only
# moves bytes into L2 earlier).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
for w in head stamps probe_stamps l2tail g2tail; do
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
# 1. release, l2tail and g2tail, interleaved: FP8 per tensor
OUT=$OUT/ab WHEELS="head l2tail g2tail" CASES="qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1,8" \
  ARGS="--quant fp8_tensor --no-read-floor" ROUNDS=2 BENCH_TIMEOUT=50 timeout 200 bash benches/ab.sh > /dev/null 2>&1
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
st qwen3_fp8_m1_probe_nopdl probe_stamps SWAPMOE_SWAP_GEMM2_PDL=0 -- --shape qwen3 --m 1 --quant fp8_tensor
# 3. bf16
OUT=$OUT/ab WHEELS="head l2tail g2tail" CASES="qwen3-30b-a3b:1,8 deepseek-v3-tp8:1" \
  ARGS="--no-read-floor" ROUNDS=2 BENCH_TIMEOUT=50 timeout 150 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_bf16.txt"; echo "$(el) ab bf16 done"
st qwen3_bf16_m1 stamps X=1 -- --shape qwen3 --m 1
st qwen3_bf16_m1_probe probe_stamps X=1 -- --shape qwen3 --m 1
st deepseek_fp8_m1 stamps X=1 -- --shape deepseek --m 1 --quant fp8_tensor
st deepseek_fp8_m1_probe probe_stamps X=1 -- --shape deepseek --m 1 --quant fp8_tensor
# 4. last (cut first if the call runs long): with GEMM2's tail after its wait, does GEMM2 still
# want to prefetch its ring under GEMM1 (ring 5, PDL), or less of it?
OUT=$OUT/ab WHEELS="g2tail g2tail:SWAPMOE_SWAP_GEMM2_RING=3 g2tail:SWAPMOE_SWAP_GEMM2_PDL=0" CASES="qwen3-30b-a3b:1" \
  ARGS="--quant fp8_tensor --no-read-floor" ROUNDS=2 BENCH_TIMEOUT=40 timeout 80 bash benches/ab.sh > /dev/null 2>&1
mv "$OUT/ab/ab.txt" "$OUT/ab_g2tail_ring.txt"; echo "$(el) ab g2tail ring done"
python3 benches/ab_summary.py "$OUT"/ab_*.txt > "$OUT/ab_summary.txt" 2>&1; cat "$OUT/ab_summary.txt"
echo "$(el) end"
