#!/usr/bin/env bash
# The review's test fixes (the long call timed on the GPU alone, modules loaded before the
# stream is held, test_multi_gpu's stream held on a flag and graph on its own capture stream):
# main's wheel, and dist/mut3 (M4: FP8 quantize-x without griddepcontrol.wait) with the flag:
#   run(command="OUT=$OUT bash benches/results/pdl_2026-12-06/call_final.sh", carry=["dist/main", "dist/mut3"])
source benches/call_common.sh
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels main mut3 || exit 1
PYTHONPATH=/tmp/site_main:tests timeout 60 python3 - > "$OUT/long_call_gpu_time.txt" 2>&1 <<'PY'
import numpy as np, torch
import conftest as C
rng = np.random.default_rng(0)
for K in (256, 512):
    x = torch.randn(12, K, device="cuda", dtype=torch.bfloat16)
    inp, case = C._long_call_inputs(x, rng)
    out = torch.empty_like(x)
    C.call(inp, case, out=out, backend="cuda_wgmma_swap")
    ts = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with C.queued_ahead_of_the_gpu():
            a.record(); C.call(inp, case, out=out, backend="cuda_wgmma_swap"); b.record()
        ts.append(a.elapsed_time(b) * 1e3)
    print(f"K={K}: the long call on the GPU alone {np.median(ts):.1f} us (min {min(ts):.1f}, max {max(ts):.1f})")
PY
status "long call GPU time" $?; cat "$OUT/long_call_gpu_time.txt"
SEL="queued_ahead or threads_context or long_predecessor or back_to_back"
FILES="tests/test_gpu.py tests/test_fp8_gpu.py tests/test_routing_fused_gpu.py"
gpu_pytest final_main main 120 -m gpu -k "$SEL" $FILES
gpu_pytest final_mut3 mut3 120 -m gpu -k "$SEL" $FILES
SWAPMOE_TEST_OTHER_DEVICE=0 gpu_pytest multi_dry main 90 -m gpu tests/test_multi_gpu.py
pack 'pytest_*.log' 'long_call_gpu_time.txt'
echo "[$(el) s] end"
