"""Two GPUs in one process: every op on tensors of a device other than the current one, calls
alternating between devices, the stream of the tensors' device, CUDA graphs captured on the
second device, CuPy arrays there, and the caller's state left as it was (torch's current
device, the thread's CUDA context). vLLM runs one process per GPU (its current device is its
tensors'), but a process that holds layers on several GPUs (pipeline stages in one process,
a user's script) calls the op with tensors of a device that is not the current one. Every
test is marked ``gpu`` and skipped with fewer than two CUDA devices."""

from __future__ import annotations

import math
import os

import pytest

import swapmoe
from conftest import (
    Case,
    call,
    check_close,
    _gate_stream,
    check_fp8_close,
    current_cuda_context,
    fp8_call,
    fp8_reference,
    has_cuda,
    make_fp8_problem,
    make_problem,
    reference,
    to_fp8_inputs,
    to_inputs,
    torch,
)
from test_routing import BY_NAME, check_routing, moe_call, moe_inputs, moe_problem, moe_ref, route, route_ref

# The two devices: A = 0 and B = 1. SWAPMOE_TEST_OTHER_DEVICE=0 runs every test with B = A on
# one GPU: nothing crosses devices then, but the tests' own code runs (a dry run of the file).
A = 0
B = int(os.environ.get("SWAPMOE_TEST_OTHER_DEVICE", "1"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (has_cuda() and torch.cuda.device_count() > max(A, B)),
                       reason="needs two CUDA devices (SWAPMOE_TEST_OTHER_DEVICE=0: a one-GPU dry run)"),
]


def _hopper(device: int) -> bool:
    return torch.cuda.get_device_capability(device) == (9, 0)


class CallerState:
    """torch's current device and the thread's CUDA context before a call, to check that the
    call left both as they were."""

    def __init__(self):
        self.device = torch.cuda.current_device()
        self.context = current_cuda_context()

    def check(self, what: str):
        assert torch.cuda.current_device() == self.device, (
            f"{what}: torch's current device moved from {self.device} to {torch.cuda.current_device()}")
        assert current_cuda_context() == self.context, f"{what}: the thread's CUDA context changed"


BF16_BACKENDS = [None, "cuda_generic", "cuda_decode", "cuda_mma", "cuda_wgmma_swap", "cuda_wgmma"]


@pytest.mark.parametrize("current,data", [(A, B), (B, A)], ids=["current0-data1", "current1-data0"])
@pytest.mark.parametrize("backend", BF16_BACKENDS, ids=lambda b: b or "oracle")
@pytest.mark.parametrize("M", [1, 40])
def test_fused_experts_on_a_device_that_is_not_current(M, backend, current, data, rng):
    if backend in ("cuda_wgmma_swap", "cuda_wgmma") and not _hopper(data):
        pytest.skip(f"{backend} runs on sm_90 only")
    case = Case(M, 16, 4, 128, 256, ids="concentrated")
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", f"cuda:{data}")
    with torch.cuda.device(current):
        state = CallerState()
        out = call(inp, case, backend=backend)
        state.check(f"fused_experts on cuda:{data}")
    assert out.device == torch.device(f"cuda:{data}")
    torch.cuda.synchronize(data)
    check_close(out, reference(inp, case), "bfloat16", what=f"{backend} on cuda:{data}, cuda:{current} current")


@pytest.mark.parametrize("scheme,static", [("tensor", False), ("tensor", True), ("channel", False), ("block", False)])
def test_fp8_on_a_device_that_is_not_current(scheme, static, rng):
    if torch.cuda.get_device_capability(B) < (8, 9):
        pytest.skip("FP8 needs compute capability >= 8.9")
    case = Case(12, 16, 4, 256, 512, ids="concentrated", out="poison")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme, static=static), case, "torch", "bfloat16", f"cuda:{B}")
    with torch.cuda.device(A):
        state = CallerState()
        out = fp8_call(inp, case)
        state.check("FP8 fused_experts on cuda:1")
    torch.cuda.synchronize(B)
    ref, flips = fp8_reference(inp, case)
    check_fp8_close(out, ref, flips, "bfloat16", what=f"FP8 {scheme} on cuda:1")


@pytest.mark.parametrize("router", ["qwen3", "deepseek_v3"])
def test_routing_and_fused_moe_on_a_device_that_is_not_current(router, rng):
    r = BY_NAME[router]
    inp = moe_inputs(moe_problem(rng, r, 9, ep=False), "torch", "bfloat16", "float32", device=f"cuda:{B}")
    with torch.cuda.device(A):
        state = CallerState()
        got = route(r, inp["logits"], inp["bias"])
        out = moe_call(r, inp)
        state.check(f"select_experts and fused_moe ({router}) on cuda:1")
    assert got[0].device == got[1].device == out.device == torch.device(f"cuda:{B}")
    torch.cuda.synchronize(B)
    check_routing(r, got, route_ref(r, inp["logits"], inp["bias"]), what=f"{router} on cuda:1")
    check_close(out, moe_ref(r, inp), "bfloat16", what=f"fused_moe {router} on cuda:1")


def test_calls_alternate_between_devices(rng):
    """Each device's modules and kernel handles are its own: calls on cuda:0 and cuda:1 in turn,
    queued without a sync, each right."""
    case = Case(7, 16, 4, 128, 256)
    inps = [to_inputs(make_problem(rng, case), case, "torch", "bfloat16", f"cuda:{d}") for d in (A, B)]
    state = CallerState()
    outs = [[call(inps[d], case) for d in (A, B)] for _ in range(3)]
    state.check("alternating calls")
    torch.cuda.synchronize(A)
    torch.cuda.synchronize(B)
    for d in (A, B):
        ref = reference(inps[d], case)
        for i, round_ in enumerate(outs):
            check_close(round_[d], ref, "bfloat16", what=f"round {i} on cuda:{d}")


def test_launches_on_the_current_stream_of_the_tensors_device(rng):
    """With cuda:0 current, the op on cuda:1 tensors runs on cuda:1's current stream: work
    queued there before it (the input and output writes, behind a host flag that opens once
    the op is queued) comes first."""
    case = Case(4, 16, 4, 64, 128)
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", f"cuda:{B}")
    ref = reference(inp, case)
    staged = inp["x"].clone()
    inp["x"].zero_()
    out = torch.empty_like(staged)
    side = torch.cuda.Stream(device=B)
    with torch.cuda.device(A):
        call(inp, case, out=out)  # warm-up: module loads synchronize the device
        torch.cuda.synchronize(B)
        with torch.cuda.stream(side):  # makes cuda:1 current, side its current stream
            flag = _gate_stream(side.cuda_stream)  # side waits until the call is queued
            assert flag is not None, "cuStreamWaitValue32 refused"
            inp["x"].copy_(staged)
            out.fill_(math.nan)
            torch.cuda.set_device(A)  # cuda:0 current again; cuda:1's current stream stays side
            assert torch.cuda.current_stream(B) == side
            state = CallerState()
            call(inp, case, out=out)
            state.check("the call on cuda:1's side stream")
            flag[0] = 1
    side.synchronize()
    check_close(out, ref, "bfloat16", what="cuda:1 side stream")


def test_graph_captured_on_the_second_device(rng):
    """fused_experts captured in a CUDA graph on cuda:1 and replayed on new inputs."""
    case = Case(6, 16, 4, 128, 256)
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", f"cuda:{B}")
    out = torch.full_like(inp["x"], math.nan)
    # torch's default capture stream is made once per process, on the device current at the
    # first capture (device 0 in a suite run): capture on a stream of this device instead.
    capture = torch.cuda.Stream(device=B)
    with torch.cuda.device(B), torch.cuda.stream(capture):
        call(inp, case, out=out)  # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=capture):
            call(inp, case, out=out)
        for _ in range(2):
            fresh = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", f"cuda:{B}")
            for name in ("x", "w1", "w2", "tw", "ids"):
                inp[name].copy_(fresh[name])
            out.fill_(math.nan)
            graph.replay()
            torch.cuda.synchronize()
            check_close(out, reference(inp, case), "bfloat16", what="graph replay on cuda:1")


def test_warmup_and_plan_of_the_second_device():
    """warmup(1) loads cuda:1's modules; describe_plan and device_info answer for cuda:1."""
    assert swapmoe.warmup(B) > 0
    info = swapmoe._core.device_info(B)
    assert info["name"] == torch.cuda.get_device_name(B)
    x = torch.zeros((2, 256), dtype=torch.bfloat16, device=f"cuda:{B}")
    w1 = torch.zeros((16, 256, 256), dtype=torch.bfloat16, device=f"cuda:{B}")
    w2 = torch.zeros((16, 256, 128), dtype=torch.bfloat16, device=f"cuda:{B}")
    tw = torch.ones((2, 4), dtype=torch.float32, device=f"cuda:{B}")
    ids = torch.zeros((2, 4), dtype=torch.int32, device=f"cuda:{B}")
    state = CallerState()
    plan = swapmoe._core.describe_plan(x, w1, w2, tw, ids)
    state.check("describe_plan on cuda:1")
    assert plan["backend"].startswith("cuda_"), plan


def test_cupy_arrays_on_the_second_device(rng):
    """CuPy arrays on device 1 while CuPy's current device is 0: the outputs and workspace are
    CuPy's on device 1, and the values right."""
    cupy = pytest.importorskip("cupy")
    case = Case(5, 16, 4, 128, 256)
    inp = to_inputs(make_problem(rng, case), case, "numpy", "float16")
    with cupy.cuda.Device(B):
        arrs = {n: (None if v is None else cupy.asarray(v)) for n, v in inp.items() if n != "buffers"}
    with cupy.cuda.Device(A):
        state = CallerState()
        out = call(arrs, case)
        state.check("CuPy fused_experts on device 1")
        assert out.device.id == B
    with cupy.cuda.Device(B):
        cupy.cuda.Device().synchronize()
        check_close(out.get(), reference(inp, case), "float16", what="CuPy on device 1")
