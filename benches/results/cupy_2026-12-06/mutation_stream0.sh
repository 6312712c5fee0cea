#!/usr/bin/env bash
# Can the stream tests fail? Each runs as shipped, then with the op launched on the legacy
# default stream (stream 0) instead of the caller's: CuPy's (_api.py) and torch's (ops.py).
# Expected: pass, then fail.
#   run(command="OUT=$OUT bash benches/results/cupy_2026-12-06/mutation_stream0.sh", carry=["dist/cupy"])
source benches/call_common.sh
TESTS="tests/test_cupy_gpu.py tests/test_gpu.py tests/test_routing_gpu.py"
install_wheels cupy || exit 1
gpu_pytest shipped cupy 90 -m gpu $TESTS -k "current_stream"
# (the run of 2026-12-06 05:27 was on 6872a37's _api.py, where fused_experts and fused_moe read the
# stream inline; since 27c721e they take it from _cupy_launch_stream, mutated by the second line)
sed -i 's/stream = cupy.cuda.get_current_stream().ptr/stream = 0/' /tmp/site_cupy/swapmoe/_api.py
sed -i 's/^    return stream.ptr$/    return 0  # mutation/' /tmp/site_cupy/swapmoe/_api.py
sed -i 's/^def _current_stream(hidden_states: torch.Tensor) -> int:$/&\n    return 0  # mutation/' /tmp/site_cupy/swapmoe/ops.py
grep -c "stream = 0$" /tmp/site_cupy/swapmoe/_api.py; grep -c "# mutation" /tmp/site_cupy/swapmoe/ops.py
gpu_pytest stream0 cupy 90 -m gpu $TESTS -k "current_stream"
echo "[$(el) s] end"
