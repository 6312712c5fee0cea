"""CuPy arrays on the GPU: ``swapmoe.fused_experts``, ``select_experts`` and ``fused_moe``
with CuPy inputs allocate their outputs and workspace with CuPy and launch on CuPy's current
stream. Checked against the float64 references: every CUDA backend, FP8 weights from torch
beside CuPy activations, a non-blocking CuPy stream whose earlier work the op must wait for,
and the typed errors. Every test is marked ``gpu``; the module is skipped without CuPy."""

from __future__ import annotations

import numpy as np
import pytest

import swapmoe
from conftest import (
    Case,
    call,
    check_close,
    check_fp8_close,
    fp8_call,
    fp8_reference,
    has_cuda,
    make_fp8_problem,
    make_problem,
    reference,
    same_bits,
    to_fp8_inputs,
    to_inputs,
    torch,
)
from test_routing import (
    BY_NAME,
    VARIANT_IDS,
    VARIANTS,
    check_routing,
    draw_bias,
    draw_logits,
    moe_call,
    moe_inputs,
    moe_problem,
    moe_ref,
    route,
    route_ref,
)

cupy = pytest.importorskip("cupy")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

DTYPES = ["float16", "float32"]


@pytest.fixture(autouse=True)
def _cuda_sync():
    yield
    if has_cuda():
        cupy.cuda.Device().synchronize()  # surfaces asynchronous faults in the test that caused them


def to_cupy(inp: dict) -> dict:
    """The numpy tensors of a to_inputs() or moe_inputs() dict as CuPy arrays (same values,
    contiguous; None stays None)."""
    return {n: (None if v is None else cupy.asarray(v)) for n, v in inp.items() if n != "buffers"}


def capability() -> tuple:
    cc = int(cupy.cuda.Device().compute_capability)
    return cc // 10, cc % 10


# --------------------------------------------------------------------------- fused_experts

CUPY_CASES = [
    Case(1, 8, 2, 64, 128),  # M = 1
    Case(5, 16, 4, 64, 128, ep=True),  # expert_map with -1 entries
    Case(17, 128, 8, 64, 256, ids="concentrated"),  # most experts get no token
    Case(64, 32, 6, 40, 48, "gelu"),  # N and K not multiples of 16
    Case(300, 8, 2, 96, 200, ids="invalid", id_dtype="int64"),  # past every token tile; bad ids dropped
]


@pytest.mark.parametrize("out_mode", ["allocated", "given"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CUPY_CASES, ids=lambda c: c.id)
def test_fused_experts_cupy_matches_reference(case, dtype, out_mode, rng):
    """The oracle's pick on CuPy arrays: the output is a CuPy array on the inputs' device
    (allocated, or the poisoned ``out=`` given), within the dtype's tolerance of the float64
    reference, and the inputs are untouched."""
    host = to_inputs(make_problem(rng, case), case, "numpy", dtype)
    ref = reference(host, case)
    dev = to_cupy(host)
    kw = {}
    if out_mode == "given":
        kw["out"] = cupy.full(dev["x"].shape, np.nan, dtype=dev["x"].dtype)
    out = call(dev, case, **kw)
    assert isinstance(out, cupy.ndarray), type(out)
    assert out.device.id == dev["x"].device.id
    if out_mode == "given":
        assert out is kw["out"], "fused_experts must return the out= array it was given"
    check_close(out.get(), ref, dtype, what=f"{case.id} cupy")
    for name in ("x", "w1", "w2", "tw", "ids"):
        assert same_bits(dev[name].get(), host[name]), f"{name} was modified"


BACKEND_CASE = Case(9, 64, 6, 64, 128, "gelu", ids="invalid", ep=True)  # 54 slots: every decode kernel takes it


@pytest.mark.parametrize(
    "backend", ["cuda_generic", "cuda_decode", "cuda_mma", "cuda_bulk_decode", "cuda_wgmma_swap", "cuda_wgmma"]
)
def test_every_cuda_backend_runs_on_cupy_arrays(backend, rng):
    """Each kernel family's workspace (sized from the CuPy arrays' shapes in Python) and
    launch work with CuPy inputs."""
    if backend in ("cuda_bulk_decode", "cuda_wgmma_swap", "cuda_wgmma") and capability() != (9, 0):
        pytest.skip(f"{backend} runs on sm_90 only")
    host = to_inputs(make_problem(rng, BACKEND_CASE), BACKEND_CASE, "numpy", "float16")
    out = call(to_cupy(host), BACKEND_CASE, backend=backend)
    check_close(out.get(), reference(host, BACKEND_CASE), "float16", what=backend)


@pytest.mark.parametrize("M", [3, 300])
@pytest.mark.parametrize("scheme", ["tensor", "channel", "block"])
def test_fp8_torch_weights_with_cupy_activations(scheme, M, rng):
    """FP8 (e4m3 weights exported by torch: CuPy has no float8 dtype) beside CuPy float16
    activations, routing and output: the workspace includes the scheme's quantization buffers."""
    if capability() < (8, 9):
        pytest.skip("FP8 needs sm_89+")
    case = Case(M, 16, 4, 128, 256, ep=True)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme), case, "torch", "float16", "cuda")
    ref, flips = fp8_reference(inp, case)
    torch.cuda.synchronize()  # torch's copies are done before CuPy's stream reads them
    mixed = dict(inp)
    for name in ("x", "tw", "ids", "expert_map"):
        mixed[name] = cupy.from_dlpack(inp[name])
    out = fp8_call(mixed, case)
    assert isinstance(out, cupy.ndarray)
    check_fp8_close(out.get(), ref, flips, "float16", what=f"{case.id}-{scheme} cupy")


def test_bfloat16_cupy_arrays_if_cupy_has_them(rng):
    """bf16 through CuPy where this CuPy imports torch's bfloat16 tensors."""
    case = Case(7, 16, 4, 64, 128, ep=True)
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", "cuda")
    try:
        dev = {n: (None if v is None else cupy.from_dlpack(v)) for n, v in inp.items() if n != "buffers"}
    except (TypeError, ValueError, RuntimeError, BufferError) as e:
        pytest.skip(f"this CuPy ({cupy.__version__}) does not import bfloat16: {e}")
    ref = reference(inp, case)
    torch.cuda.synchronize()
    out = call(dev, case)
    assert isinstance(out, cupy.ndarray) and out.dtype == dev["x"].dtype
    cupy.cuda.Device().synchronize()
    check_close(torch.from_dlpack(out), ref, "bfloat16", what="cupy bf16")


# --------------------------------------------------------------------------- streams


SLEEP_CYCLES = 200_000_000  # ~0.1 s of device time: far longer than queueing the op takes


def _sleep_on(stream, cycles: int = SLEEP_CYCLES) -> None:
    """Device time queued on a CuPy stream (torch's sleep kernel, launched on the same CUDA
    stream through torch.cuda.ExternalStream)."""
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
        torch.cuda._sleep(cycles)


def _copy_async(dst, src, stream) -> None:
    dst.data.copy_from_device_async(src.data, src.nbytes, stream)


def _warm_up(side, op) -> None:
    """Runs ``op`` once on ``side`` and waits: its module loads and the memory pool's first
    cudaMalloc for that stream (either may synchronize the device, which would order a launch
    on the wrong stream after the sleep by accident) happen before the race is set up."""
    with side:
        _sleep_on(side, 1000)
        op()
    side.synchronize()


def _run_after_late_writes(dev: dict, names, op):
    """Zeroes ``dev[name]`` for each name, then on a non-blocking side stream (after a warm-up
    there): a long sleep, the arrays' real values written back, and ``op()``. Asserts that the
    sleep was still running when ``op`` was queued (the race is armed), waits, and returns
    ``op``'s result: right only if ``op`` ran on the side stream after the writes."""
    staged = {n: dev[n].copy() for n in names}
    for n in names:
        dev[n].fill(0)
    cupy.cuda.Device().synchronize()
    side = cupy.cuda.Stream(non_blocking=True)
    _warm_up(side, op)
    with side:
        _sleep_on(side)
        for n in names:
            _copy_async(dev[n], staged[n], side)
        out = op()
    assert not side.done, "the side stream finished before the op was queued: lengthen the sleep"
    side.synchronize()
    return out


@pytest.mark.parametrize("M", [4, 300])
def test_fused_experts_runs_on_cupy_current_stream(M, rng):
    """On a non-blocking CuPy stream (no implicit ordering with the default stream), work
    queued before the call (a long sleep, then the input's write) must come first: the op
    launches on CuPy's current stream, and its output is ready when that stream is. (Checked
    to fail when the op launches on the legacy default stream instead:
    benches/results/cupy_2026-12-06/mutation_stream0.sh.)"""
    case = Case(M, 16, 4, 64, 128)
    host = to_inputs(make_problem(rng, case), case, "numpy", "float16")
    ref = reference(host, case)
    dev = to_cupy(host)
    out = _run_after_late_writes(dev, ["x"], lambda: call(dev, case))
    check_close(out.get(), ref, "float16", what="side stream")


def test_fused_moe_runs_on_cupy_current_stream(rng):
    """The router reads logits written on the side stream after the sleep; the experts read
    hidden states written there too."""
    r = BY_NAME["deepseek_v3"]
    prob = moe_problem(rng, r, 64, ep=False)
    host = moe_inputs(prob, "numpy", "float16", "float32")
    ref = moe_ref(r, host)
    dev = to_cupy(host)
    out = _run_after_late_writes(dev, ["x", "logits"], lambda: moe_call(r, dev))
    check_close(out.get(), ref, "float16", what="fused_moe side stream")


@pytest.mark.parametrize("stream_given", [False, True], ids=["current_stream", "stream_arg"])
@pytest.mark.parametrize("op", ["fused_experts", "fused_moe"])
def test_cupy_graph_capture_without_a_workspace_is_refused(op, stream_given, rng):
    """Capturing a CuPy call without ``workspace=`` in a CUDA graph (on CuPy's current stream,
    or on the capturing stream given as ``stream=``) raises ArgumentError naming it before
    anything is queued (a workspace from CuPy's pool would return to the pool while replays
    still use it), and the capture itself stays valid. select_experts is allowed: its outputs
    are the caller's arrays."""
    r = BY_NAME["qwen3"]
    prob = moe_problem(rng, r, 4, ep=False)
    dev = to_cupy(moe_inputs(prob, "numpy", "float16"))
    out = cupy.empty_like(dev["x"])
    side = cupy.cuda.Stream(non_blocking=True)
    kw = dict(stream=side) if stream_given else {}
    if op == "fused_experts":
        w, ids = route(r, dev["logits"])
        run = lambda: swapmoe.fused_experts(dev["x"], dev["w1"], dev["w2"], w, ids, out=out, **kw)  # noqa: E731
    else:
        run = lambda: moe_call(r, dev, out=out, **kw)  # noqa: E731
    _warm_up(side, run)
    out.fill(np.nan)
    cupy.cuda.Device().synchronize()
    with side:
        side.begin_capture()
        try:
            with pytest.raises(swapmoe.ArgumentError, match="workspace: expected the caller's own workspace .* for a "
                               "call on a CuPy stream that is capturing a CUDA graph"):
                run()
        finally:
            graph = side.end_capture()
    graph.launch(side)  # the refused call queued nothing: the graph leaves out as it was
    side.synchronize()
    assert bool(cupy.isnan(out).all()), "the refused call left work in the captured graph"
    with side:
        side.begin_capture()
        try:
            w, ids = route(r, dev["logits"])
        finally:
            graph = side.end_capture()
    dev["logits"][...] = cupy.asarray(draw_logits(rng, r, 4))  # new logits, on the default stream
    cupy.cuda.Device().synchronize()
    graph.launch(side)
    side.synchronize()
    check_routing(r, (w.get(), ids.get()), route_ref(r, dev["logits"].get()), what="select_experts replayed")


@pytest.mark.parametrize("op", ["fused_experts", "fused_moe"])
def test_cupy_graph_capture_with_the_callers_workspace_replays_on_new_inputs(op, rng):
    """With a workspace of its own (``workspace_bytes``, or ``fused_moe_workspace_bytes``,
    which also holds the router's outputs) a CuPy call captures on a capturing stream given
    as ``stream=``; each replay, after new hidden states (and logits) are written in place,
    matches the float64 reference on those inputs. Nothing of the call lives in CuPy's pool
    but the arrays the test holds."""
    r = BY_NAME["qwen3"]
    M = 5
    dev = to_cupy(moe_inputs(moe_problem(rng, r, M, ep=False), "numpy", "float16", "float32"))
    out = cupy.empty_like(dev["x"])
    if op == "fused_experts":
        w, ids = route(r, dev["logits"])
        ws = cupy.empty(swapmoe.workspace_bytes(dev["x"], dev["w1"], ids), dtype=cupy.uint8)
        run = lambda s: swapmoe.fused_experts(dev["x"], dev["w1"], dev["w2"], w, ids, out=out,  # noqa: E731
                                              workspace=ws, stream=s)
    else:
        ws = cupy.empty(swapmoe.fused_moe_workspace_bytes(dev["x"], dev["w1"], r.topk), dtype=cupy.uint8)
        run = lambda s: moe_call(r, dev, out=out, workspace=ws, stream=s)  # noqa: E731
    side = cupy.cuda.Stream(non_blocking=True)
    _warm_up(side, lambda: run(side))
    side.begin_capture()
    try:
        got = run(side)
    finally:
        graph = side.end_capture()
    assert got is out
    for replay in range(2):
        host = moe_inputs(moe_problem(rng, r, M, ep=False), "numpy", "float16", "float32")
        dev["x"][...] = cupy.asarray(host["x"])
        if op == "fused_moe":
            dev["logits"][...] = cupy.asarray(host["logits"])
        host["w1"], host["w2"] = dev["w1"].get(), dev["w2"].get()
        out.fill(np.nan)
        ws.fill(0xFF)  # what the last replay left is not trusted
        cupy.cuda.Device().synchronize()
        graph.launch(side)
        side.synchronize()
        if op == "fused_experts":
            hx = dict(x=host["x"], w1=host["w1"], w2=host["w2"], tw=w.get(), ids=ids.get(), expert_map=None)
            ref = reference(hx, Case(M, r.E, r.topk, host["w1"].shape[1] // 2, host["x"].shape[1]))
        else:
            host["logits"] = dev["logits"].get()
            ref = moe_ref(r, host)
        check_close(out.get(), ref, "float16", what=f"{op} replay {replay}")


# --------------------------------------------------------------------------- routers


@pytest.mark.parametrize("M", [1, 64])
@pytest.mark.parametrize("r", VARIANTS, ids=VARIANT_IDS)
def test_select_experts_cupy_matches_reference(r, M, rng):
    bias = draw_bias(rng, r)
    logits = draw_logits(rng, r, M, bias)
    b = None if bias is None else cupy.asarray(bias)
    w, ids = route(r, cupy.asarray(logits), b)
    assert isinstance(w, cupy.ndarray) and isinstance(ids, cupy.ndarray)
    check_routing(r, (w.get(), ids.get()), route_ref(r, logits, bias), what=f"{r.name} cupy M={M}")


@pytest.mark.parametrize("ep", [False, True], ids=["no_map", "ep"])
@pytest.mark.parametrize("r", VARIANTS, ids=VARIANT_IDS)
def test_fused_moe_cupy_matches_reference(r, ep, rng):
    prob = moe_problem(rng, r, 24, ep)
    host = moe_inputs(prob, "numpy", "float16", "float32")
    ref = moe_ref(r, host)
    assert np.linalg.norm(ref) > 0, "degenerate case: the reference is all zeros"
    dev = to_cupy(host)
    out = moe_call(r, dev)
    assert isinstance(out, cupy.ndarray)
    check_close(out.get(), ref, "float16", what=f"{r.name} cupy ep={ep}")


# --------------------------------------------------------------------------- errors


def test_cupy_out_of_the_wrong_dtype_is_named(rng):
    case = Case(4, 8, 2, 64, 64)
    dev = to_cupy(to_inputs(make_problem(rng, case), case, "numpy", "float16"))
    with pytest.raises(swapmoe.DTypeError, match="out"):
        call(dev, case, out=cupy.zeros(dev["x"].shape, cupy.float32))


def test_cupy_activations_with_host_weights_are_named(rng):
    case = Case(4, 8, 2, 64, 64)
    host = to_inputs(make_problem(rng, case), case, "numpy", "float16")
    dev = dict(to_cupy(host), w1=host["w1"])
    with pytest.raises(swapmoe.DeviceError, match="w1"):
        call(dev, case)
