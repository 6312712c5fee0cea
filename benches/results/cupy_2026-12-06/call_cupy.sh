#!/usr/bin/env bash
# The CuPy path on a GPU for the first time (tests/test_cupy_gpu.py), in one device call:
#   run(command="OUT=$OUT bash benches/results/cupy_2026-12-06/call_cupy.sh", carry=["dist/cupy"])
# 1. CuPy on the device: version, a kernel (NVRTC), DLPack of torch's bfloat16.
# 2. tests/test_cupy_gpu.py (every backend, FP8, streams, routers, errors).
# 3. The torch-side tests of the same API functions (routing), as a check that nothing else moved.
source benches/call_common.sh
D=${DEADLINE:-400}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels cupy || exit 1
PYTHONPATH=/tmp/site_cupy timeout 60 python3 - > "$OUT/cupy_env.txt" 2>&1 <<'PY'
import cupy, torch
print("cupy", cupy.__version__, "device cc", cupy.cuda.Device().compute_capability)
print("kernel:", int(cupy.arange(10).sum()))
try:
    a = cupy.from_dlpack(torch.ones(3, dtype=torch.bfloat16, device="cuda"))
    print("bf16 from torch:", a.dtype)
except Exception as e:
    print("bf16 from torch refused:", type(e).__name__, e)
PY
status "cupy env" $?; cat "$OUT/cupy_env.txt"
gpu_pytest cupy cupy 240 -m gpu -n 8 tests/test_cupy_gpu.py
left=$((D - $(el) - 10))
[ $left -gt 40 ] && gpu_pytest routing cupy $((left < 120 ? left : 120)) -m gpu -n 16 tests/test_routing_gpu.py tests/test_routing_fused_gpu.py
echo "[$(el) s] end"
