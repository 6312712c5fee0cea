#!/usr/bin/env bash
# The first call of 2026-12-05 evening, ~9.5 minutes:
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05_eve/call1.sh", carry=["dist/head"])
# dist/head = main at dc67460 (kernels of 4d6fbe9: 3b2667f's e4m3 swap GEMM1 scales ahead and
# accumulator_token, neither yet measured on an H200). In order of value, each step only when
# the time left allows it:
# 1. `swapmoe bench` of the three public shapes, bf16 and FP8 per tensor (the README's tables).
# 2. ncu SpeedOfLight / memory / compute sections of the e4m3 and bf16 t128 GEMM1 at Mixtral
#    M = 4096: shared-memory utilization (the hypothesis of 2026-12-05 16:00) and the SM clock.
# 3. compute-sanitizer memcheck and racecheck: every kernel variant (sanitize_case.py) and the
#    FP8 decode / prefill cases (device_run.sh sanitize-fp8).
# 4. `swapmoe bench` of FP8 128x128 blocks.
source benches/call_common.sh  # $OUT, gpu.txt, el, install_wheels, pack
cat "$OUT/gpu.txt"
install_wheels head || exit 1
export PYTHONPATH=/tmp/site_head
bench_all() {  # quant (none = bf16)
  local q="" tag="" model
  [ "$1" != none ] && q="--quant $1" && tag="_$1"
  for model in qwen3-30b-a3b deepseek-v3-tp8 mixtral-8x7b; do
    timeout 120 python3 -m swapmoe bench --model $model --m 1,2,4,8,16,32,64,1024,4096 $q --no-progress \
      --json "$OUT/bench/bench_$model$tag.json" > "$OUT/bench/bench_$model$tag.txt" 2>&1
    echo "[$(el) s] bench $model $1: exit $?"
    grep -E "^ +[0-9]+ " "$OUT/bench/bench_$model$tag.txt"
  done
}
mkdir -p "$OUT/bench"
bench_all none
bench_all fp8_tensor
for c in "fp8_tensor wgmma_moe_fp8_gemm1" "none wgmma_moe_gemm1"; do
  [ $(el) -gt 330 ] && break
  read -r quant kernel <<< "$c"
  env $( [ "$quant" != none ] && echo PROFILE_QUANT=$quant ) PROFILE_BACKENDS=oracle PROFILE_ROUTER=0 \
    timeout 90 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis -k regex:"$kernel" -c 1 \
    python3 benches/profile_case.py 4096 mixtral > "$OUT/sections_${quant}.txt" 2>&1
  echo "[$(el) s] ncu $quant: exit $?"
  grep -E "SM Frequency|Duration|Memory Throughput|L1/TEX Cache Throughput|Shared|Tensor|Compute \(SM\)|Issue" "$OUT/sections_${quant}.txt" | head -30
done
mkdir -p "$OUT/sanitize"
for tool in memcheck racecheck; do
  [ $(el) -gt 470 ] && break
  timeout 70 compute-sanitizer --tool $tool --error-exitcode 9 python3 benches/sanitize_case.py > "$OUT/sanitize/$tool.txt" 2>&1
  echo "[$(el) s] sanitize $tool: exit $? ; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|ALL OK|FAILED' "$OUT/sanitize/$tool.txt" | tr '\n' ' ')"
done
for tool in memcheck racecheck; do
  [ $(el) -gt 500 ] && break
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -x -p no:cacheprovider tests/test_fp8_gpu.py \
    -k "test_decode_sizes and uniform and (tensor-1- or channel-5- or block-3-) or test_prefill" > "$OUT/sanitize/fp8_$tool.txt" 2>&1
  echo "[$(el) s] sanitize fp8 $tool: exit $? ; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/sanitize/fp8_$tool.txt" | tr '\n' ' ')"
done
[ $(el) -lt 480 ] && bench_all fp8_block128
pack 'bench/*.txt' 'sections_*.txt'
echo "[$(el) s] end"
