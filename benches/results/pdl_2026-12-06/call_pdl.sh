#!/usr/bin/env bash
# The long-predecessor tests (a first kernel that reads x before its griddepcontrol.wait) and
# the bench's GPU columns, on main and on planted bugs, in one device call (~6 minutes):
#   run(command="OUT=$OUT bash benches/results/pdl_2026-12-06/call_pdl.sh", carry=["dist/main", "dist/mut2"])
# dist/mut2: main's kernels with M2 (the FP8 absmax pre-pass reads x before its wait) and M3
# (the bf16 swap GEMM1 has no griddepcontrol.wait at all).
# 1. How long the long call takes alone (the window the tests rely on).
# 2. main: the new tests (long predecessor: bf16, FP8, fused_moe; the bench's GPU columns),
#    the CuPy GPU tests (their helpers changed since their last run), the old back-to-back tests.
# 3. mut2: the new tests and the old back-to-back tests (which of them catch M2 and M3).
# 4. The bench test against two planted bench bugs (experts counted globally; FP8 floor at 2
#    bytes per weight).
source benches/call_common.sh
D=${DEADLINE:-560}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main mut2 || exit 1
NEW="long_predecessor or floors_the_experts"
OLD="back_to_back"
FILES="tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py tests/test_bench_tools.py"
for w in main mut2; do
  PYTHONPATH=/tmp/site_$w:tests timeout 60 python3 - > "$OUT/long_call_$w.txt" 2>&1 <<'PY'
import numpy as np, torch
import conftest as C
rng = np.random.default_rng(0)
for K in (256, 512):
    x = torch.randn(12, K, device="cuda", dtype=torch.bfloat16)
    inp, case = C._long_call_inputs(x, rng)
    out = torch.empty_like(x)
    C.call(inp, case, out=out, backend="cuda_wgmma_swap")
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); C.call(inp, case, out=out, backend="cuda_wgmma_swap"); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    import swapmoe
    import os
    os.environ["SWAPMOE_BACKEND"] = "cuda_wgmma_swap"
    plan = swapmoe._core.describe_plan(x, inp["w1"], inp["w2"], inp["tw"], inp["ids"])
    del os.environ["SWAPMOE_BACKEND"]
    print(f"K={K}: long call alone {np.median(ts):.1f} us (min {min(ts):.1f}, max {max(ts):.1f});",
          {k: plan.get(k) for k in ("backend", "kernels", "ctas", "splits", "swap_gemm2_pdl")})
PY
  status "long call $w" $?; cat "$OUT/long_call_$w.txt" | tail -3
done
gpu_pytest new_main main 150 -m gpu -k "$NEW" $FILES
gpu_pytest new_mut2 mut2 120 -m gpu -k "$NEW" $FILES
gpu_pytest old_mut2 mut2 90 -m gpu -k "$OLD" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
for m in B1 B2; do
  rm -rf /tmp/site_$m && cp -r /tmp/site_main /tmp/site_$m
  f=/tmp/site_$m/swapmoe/bench.py
  case $m in
    B1) sed -i 's/            touched = len(experts)$/            touched = int(torch.unique(ids).numel())/' $f ;;
    B2) sed -i 's/hbm_floor_us(touched, shape.N, shape.K, M, bpe, bpe, bw, quant=quant)/hbm_floor_us(touched, shape.N, shape.K, M, bpe, bpe, bw)/' $f ;;
  esac
  diff -q /tmp/site_main/swapmoe/bench.py $f > /dev/null && echo "$m: NOT APPLIED"
  gpu_pytest bench_$m $m 60 -m gpu -k "floors_the_experts" tests/test_bench_tools.py
done
left=$((D - $(el) - 10))
[ $left -gt 60 ] && gpu_pytest cupy main $((left < 200 ? left : 200)) -m gpu -n 8 tests/test_cupy_gpu.py
left=$((D - $(el) - 10))
[ $left -gt 40 ] && gpu_pytest old_main main $((left < 90 ? left : 90)) -m gpu -k "$OLD" tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py
pack 'pytest_new_*.log' 'pytest_old_mut2.log' 'long_call_*.txt' 'pytest_cupy.log'
echo "[$(el) s] end"
