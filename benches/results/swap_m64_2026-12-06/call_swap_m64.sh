#!/usr/bin/env bash
# On an H200: main's H200 call (benches/results/h200_2026-12-06/call_min.sh). Elsewhere (an
# H100): where the swap-AB kernels lose at qwen3-30b-a3b FP8 M = 16-64 (NOTES "Next steps
# (08:40)" 2): per-kernel time, DRAM and L2 bytes, registers and occupancy of the forced
# swap-AB plan against the oracle's pick (ncu, one layer, caches flushed), and both timed as
# `swapmoe bench` times them (graph of 8 layers).
#   run(command="OUT=$OUT bash benches/results/swap_m64_2026-12-06/call_swap_m64.sh", carry=["dist/main"], kind="nvidia-h200")
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  DEADLINE=555 bash benches/results/h200_2026-12-06/call_min.sh
  exit
fi
source benches/call_common.sh
cat "$OUT/gpu.txt"
install_wheels main || exit 1
export PYTHONPATH=/tmp/site_main
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__cluster_dim_x
for m in 16 32 64; do
  for q in fp8_tensor none; do
    f="$OUT/ncu_qwen3_${m}_$q.csv"
    qe=""; [ $q != none ] && qe="PROFILE_QUANT=$q"
    env $qe PROFILE_BACKENDS=cuda_wgmma_swap,oracle PROFILE_ROUTER=0 timeout 120 \
      ncu --clock-control none --metrics $METRICS --csv python3 benches/profile_case.py $m qwen3 > "$f" 2>&1
    status "ncu qwen3 M=$m $q" $?
    python3 benches/kernel_times.py "$f" | cut -c1-200
  done
done
mkdir -p "$OUT/bench"
for q in fp8_tensor none; do
  qa=""; [ $q != none ] && qa="--quant $q"
  timeout 90 python3 -m swapmoe bench --model qwen3-30b-a3b --m 8,16,32,64 $qa --no-progress > "$OUT/bench/pick_$q.txt" 2>&1
  status "bench pick $q" $?; grep -E "^ +[0-9]+ " "$OUT/bench/pick_$q.txt"
  SWAPMOE_BACKEND=cuda_wgmma_swap timeout 90 python3 -m swapmoe bench --model qwen3-30b-a3b --m 8,16,32,64 $qa --no-progress > "$OUT/bench/swap_$q.txt" 2>&1
  status "bench swap $q" $?; grep -E "^ +[0-9]+ " "$OUT/bench/swap_$q.txt"
done
pack 'bench/*'
echo "[$(el) s] end"
