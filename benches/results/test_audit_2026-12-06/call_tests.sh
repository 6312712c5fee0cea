#!/usr/bin/env bash
# The test audit of 2026-12-06 on a GPU, one call (~9 minutes with the start):
#   run(command="OUT=$OUT bash benches/results/test_audit_2026-12-06/call_tests.sh",
#       carry=["dist/cupy", "dist/mut"], kind="nvidia-h200")
# dist/cupy: main's kernels with this change's Python; dist/mut: HEAD's wheel with two planted
# kernel bugs (M1: the decode FP8 GEMM2 reads every column's scale from the first 128-group of
# the intermediate; M2: the FP8 absmax pre-pass reads x before its griddepcontrol.wait).
# 1. The new and changed tests on the real kernels (every non-FP8 GPU file, the FP8 tests the
#    audit touched, their serial ones).
# 2. The planted bugs: the committed (HEAD) tests that should have caught them pass; the new
#    ones fail. head_tests/ held HEAD's (6872a37) test_fp8_gpu.py, test_gpu.py, conftest.py,
#    test_routing.py and test_routing_fused_gpu.py (`git show 6872a37:tests/FILE`) for this
#    call only; it is not kept.
source benches/call_common.sh
D=${DEADLINE:-560}
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels cupy mut || exit 1
FP8_K="backends_shapes_dtypes or fewer_slots or test_swap_backend or plan_picks or stale_workspace or swap_is_deterministic or back_to_back"
gpu_pytest cupy cupy 60 -m gpu -n 8 tests/test_cupy_gpu.py
gpu_pytest fp8_new cupy 150 -m "gpu and not serial" -n 16 -k "$FP8_K" tests/test_fp8_gpu.py
gpu_pytest rest cupy 230 -m "gpu and not serial" -n 16 tests/test_gpu.py tests/test_routing_gpu.py tests/test_routing_fused_gpu.py tests/test_vllm_experts_gpu.py
left=$((D - $(el) - 75))
[ $left -gt 20 ] && gpu_pytest serial cupy $((left < 90 ? left : 90)) -m "gpu and serial" -k "deterministic or tile_edges" tests/test_gpu.py
MUT_K="(blocks2x4 and cuda_decode and block) or (back_to_back and tensor) or (backends_shapes_dtypes and cuda_decode and block) or first_kernel_without_pdl"
(cd benches/results/test_audit_2026-12-06/head_tests && OUT=$OUT gpu_pytest mut_head mut 40 -m gpu -n 8 -k "(backends_shapes_dtypes and cuda_decode and block) or first_kernel_without_pdl" test_fp8_gpu.py)
gpu_pytest mut_new mut 40 -m gpu -n 8 -k "$MUT_K" tests/test_fp8_gpu.py
pack 'pytest_*.log'
echo "[$(el) s] end"
