#!/usr/bin/env bash
# The e4m3 t128 per-tensor loop in column quarters with register A (branch exp/fp8-rs-quarters),
# ~9 minutes:
#   on the CPU machine: maturin build --release -o dist/rs (the branch), dist/head (main)
#   run(command="OUT=$OUT bash benches/results/fp8_rs_quarters/call_rs.sh", carry=["dist/head", "dist/rs"])
# (2026-12-05 19:45: the first run of this call lost the machine with nothing back; each
# step now ends by SIGKILL and a failing tile-edge test stops the call.)
# 1. rs's FP8 wgmma tests (every scheme; per tensor is the changed loop), the serial ones.
# 2. A/B head / rs, fp8_tensor prefill on the three public shapes, two rounds.
# 3. compute-sanitizer memcheck and racecheck on the tile-edge tests (per tensor, both tiles).
# 4. The error against float64 (fp8_wgmma_error.py), head and rs.
source benches/call_common.sh
cat "$OUT/gpu.txt"
install_wheels head rs || exit 1
export TIMEOUT_SIGNAL=KILL
gpu_pytest rs_edges rs 45 -m "gpu and not serial" -k "test_wgmma_tile_edges and tensor" tests/test_fp8_gpu.py || { pack; exit 1; }
gpu_pytest rs_wgmma rs 100 -m "gpu and not serial" -k "wgmma and not block_run" -n 16 tests/test_fp8_gpu.py
ab rs_tensor "head rs" "mixtral-8x7b:1024,4096 qwen3-30b-a3b:4096 deepseek-v3-tp8:4096" "--quant fp8_tensor --no-read-floor" 200
gpu_pytest rs_serial rs 50 -m "gpu and serial" -k "wgmma" tests/test_fp8_gpu.py
for tool in memcheck racecheck; do
  [ $(el) -gt 420 ] && break
  PYTHONPATH=/tmp/site_rs timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
    -k "test_wgmma_tile_edges and tensor" tests/test_fp8_gpu.py > "$OUT/sanitize_$tool.txt" 2>&1
  status "sanitize $tool" $?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/sanitize_$tool.txt" | tail -3
done
for w in head rs; do
  [ $(el) -gt 480 ] && break
  (cd benches && PYTHONPATH=/tmp/site_$w timeout 40 python3 fp8_wgmma_error.py > "$OUT/error_$w.txt" 2>&1)
  status "error $w" $?
  cat "$OUT/error_$w.txt" | tail -5
done
pack 'ab_*_summary.txt' 'pytest_*.log' 'error_*.txt'
echo "[$(el) s] end"
