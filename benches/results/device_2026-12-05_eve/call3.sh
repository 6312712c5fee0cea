#!/usr/bin/env bash
# The third call of 2026-12-05 evening, ~8 minutes:
#   run(command="OUT=$OUT bash benches/results/device_2026-12-05_eve/call3.sh", carry=["dist/head", "dist/off"])
# dist/off = head + warpgroup 1 of the BM = 128 e4m3 consumers taking its first stage of each
# tile alone (kFp8OffsetWarpgroups), so that the two warpgroups' drains and promotions stop
# falling together (GEMM1 only; GEMM2's router-weight hook keeps the old loop).
# 1. A/B head vs off at FP8 per-tensor prefill (the t128 GEMM1s).
# 2. off's FP8 wgmma t128 tests (non-block: the paired-stage path).
# 3. head's FP8 swap-AB tests (their test ids name cuda_wgmma_swap, so call2's "not wgmma" left
#    them out).
# 4. The routing bench on head (issue 3's table), in the time left.
source benches/call_common.sh  # $OUT, gpu.txt, el, install_wheels, gpu_pytest, ab, pack
cat "$OUT/gpu.txt"
ab off "head off" "mixtral-8x7b:1024,4096 qwen3-30b-a3b:4096 deepseek-v3-tp8:4096" "--quant fp8_tensor" 200
ab off_channel "head off" "mixtral-8x7b:4096" "--quant fp8_channel" 60
install_wheels head off || exit 1
gpu_pytest off_t128 off 120 -m "gpu and not serial" -k "wgmma and t128 and not block" -n 16 tests/test_fp8_gpu.py
gpu_pytest head_swap head 150 -m "gpu and not serial" -k "swap" -n 16 tests/test_fp8_gpu.py
if [ $(el) -lt 470 ]; then
  PYTHONPATH=/tmp/site_head timeout $(( 560 - $(el) )) python3 benches/routing_bench.py --m 1,8,64 --json "$OUT/routing.json" > "$OUT/routing.txt" 2>&1
  echo "[$(el) s] routing bench: status $?"; tail -25 "$OUT/routing.txt"
fi
pack 'ab_*_summary.txt' 'pytest_*.log' 'routing.txt'
echo "[$(el) s] end"
