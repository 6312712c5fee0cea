#!/usr/bin/env bash
# The first call of the next device session, ~8 minutes (on the H200 if one comes; say which
# card answered):
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05_h100/call_next.sh",
#       carry=["dist/head", "dist/pre_sa", "dist/mc"])
# dist/head: main with the epilogue scales ahead (3b2667f); dist/pre_sa: 94b15a6's kernels
# (main before it); dist/mc: the multicast-pairs branch (5a54b81's kernels). Rebuild any of
# them if main's kernels or Rust change first.
# 1. The A/B of 3b2667f that so far ran on an H100 only: qwen3 fp8_tensor M = 1, 2, 8,
#    deepseek fp8_tensor M = 1, qwen3 fp8_channel M = 1, 8.
# 2. The FP8 swap GPU tests on head; compute-sanitizer memcheck and racecheck on the FP8
#    decode cases (their swap GEMM1 is the kernel 3b2667f changed).
# 3. ncu source views of the e4m3 GEMM1 at Mixtral fp8_tensor M = 4096 in multicast pairs and
#    unpaired (dist/mc): where the paired CTAs wait (NOTES "Multicast pairs: the coupling").
export BENCH_TIMEOUT=40
source benches/call_common.sh  # $OUT, gpu.txt, el, ab
ab sa_tensor "pre_sa head" "qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1" "--quant fp8_tensor --no-read-floor" 150
ab sa_channel "pre_sa head" "qwen3-30b-a3b:1,8" "--quant fp8_channel --no-read-floor" 80
# ab.sh installed both wheels; device_run.sh installs its WHEEL_DIR into /tmp/site itself
OUT=$OUT/head WHEEL_DIR=dist/head PYTEST_K=swap TEST_TIMEOUT=120 timeout 150 bash benches/device_run.sh pytest-fp8 \
  2>&1 | grep -E "exit|FAILED|ERROR"
echo "[$(el) s] fp8 swap tests done"
[ "$(el)" -lt 330 ] && OUT=$OUT/head WHEEL_DIR=dist/head timeout 150 bash benches/device_run.sh sanitize-fp8 2>&1 | grep -E "sanitizer"
echo "[$(el) s] sanitizer done"
for m in on off; do
  [ "$(el)" -lt 470 ] || break
  SWAPMOE_WGMMA_MULTICAST=$m OUT=$OUT/mc_$m WHEEL_DIR=dist/mc NCU_SOURCE_CASES="mixtral:4096:fp8_tensor" \
    NCU_SOURCE_KERNEL=wgmma_moe_fp8_gemm1 timeout 60 bash benches/device_run.sh ncu-source 2>&1 | grep -E "ncu|stall|%"
done
[ -f "$OUT/mc_on/source_mixtral_4096_fp8_tensor.csv" ] && [ -f "$OUT/mc_off/source_mixtral_4096_fp8_tensor.csv" ] \
  && python3 benches/ncu_source.py "$OUT/mc_on/source_mixtral_4096_fp8_tensor.csv" "$OUT/mc_off/source_mixtral_4096_fp8_tensor.csv" \
  > "$OUT/mc_source_compared.txt" && head -30 "$OUT/mc_source_compared.txt"
# At most 8 files come back: the summaries as they are, everything else in one archive.
cd "$OUT" && tar czf /tmp/raw.tgz --exclude gpu.txt --exclude '*_summary.txt' --exclude mc_source_compared.txt . \
  && find . -mindepth 1 ! -name gpu.txt ! -name '*_summary.txt' ! -name mc_source_compared.txt -delete \
  && mv /tmp/raw.tgz "$OUT/raw.tgz"
ls "$OUT"
echo "[$(el) s] end"
