"""The caller's own workspace and stream (``workspace=``, ``stream=``) for tensors of
libraries other than torch, and tensors of libraries swapmoe does not know (any DLPack
producer): what the Python layer accepts, sizes and refuses without a GPU. The GPU side
(the buffers used, graph capture with CuPy, the core's checks of the buffer) is in
``test_caller_workspace_gpu.py``."""

from __future__ import annotations

import numpy as np
import pytest

import swapmoe
from conftest import Case, call, check_close, make_problem, reference, same_bits, to_inputs, torch
from test_routing import BY_NAME, moe_call, moe_inputs, moe_problem, moe_ref


class Foreign:
    """A tensor of a library swapmoe does not know: the DLPack protocol, ``shape`` and
    ``dtype`` (as numpy, torch, cupy and JAX arrays have them), nothing else."""

    def __init__(self, tensor, device_type=None):
        self.tensor = tensor
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype
        self._device_type = device_type  # pretend to live elsewhere (checks before the import)

    def __dlpack__(self, **kw):
        return self.tensor.__dlpack__(**kw)

    def __dlpack_device__(self):
        if self._device_type is not None:
            return (self._device_type, 0)
        return self.tensor.__dlpack_device__()


def foreign(inp: dict) -> dict:
    return {n: (None if v is None or n == "buffers" else Foreign(v)) for n, v in inp.items()}


CASE = Case(5, 16, 4, 64, 128, ep=True)


# --------------------------------------------------------------------------- sizes


def test_fused_moe_workspace_holds_the_experts_sections_then_the_routers_outputs():
    """fused_moe's size is fused_experts' (same M, topk, shapes and scheme) plus the float32
    weights and int32 ids [M, topk], each in whole 256-byte blocks."""
    for M, topk in [(1, 8), (7, 2), (64, 6), (300, 8)]:
        x, w1 = np.zeros((M, 128), np.float16), np.zeros((16, 2 * 64, 128), np.float16)
        ids = np.zeros((M, topk), np.int32)
        for quant in (None, "fp8_tensor", "fp8_channel", "fp8_block128"):
            experts = swapmoe.workspace_bytes(x, w1, ids, quant)
            block = -(-4 * M * topk // 256) * 256
            assert experts > 0 and experts % 256 == 0
            assert swapmoe.fused_moe_workspace_bytes(x, w1, topk, quant) == experts + 2 * block, (M, topk, quant)


def test_workspace_sizes_of_malformed_shapes_are_zero_and_bad_arguments_are_named():
    x, w1 = np.zeros((4, 128), np.float16), np.zeros((16, 128, 128), np.float16)
    assert swapmoe.fused_moe_workspace_bytes(x, np.zeros((16, 127, 128), np.float16), 2) == 0  # odd 2N
    assert swapmoe.fused_moe_workspace_bytes(x, np.zeros((16, 128, 64), np.float16), 2) == 0  # K differs
    assert swapmoe.fused_moe_workspace_bytes(np.zeros(4), w1, 2) == 0
    assert swapmoe.fused_moe_workspace_bytes(x, w1, -1) == 0
    with pytest.raises(swapmoe.ArgumentError, match=r"topk: expected an integer, got 2\.0"):
        swapmoe.fused_moe_workspace_bytes(x, w1, 2.0)
    with pytest.raises(swapmoe.ArgumentError, match="quant: expected None, 'fp8_tensor'"):
        swapmoe.fused_moe_workspace_bytes(x, w1, 2, "fp4")
    with pytest.raises(swapmoe.OutOfMemoryError, match="workspace: the call needs more than 2\\^64 bytes"):
        swapmoe._core.workspace_bytes(2**20, 2**10, 4 * (2**31 - 1), 2**31 - 1, 8192, 2, None, True)


# --------------------------------------------------------------------------- host tensors


@pytest.mark.parametrize("arg", ["workspace", "stream"])
def test_host_inputs_take_no_workspace_and_no_stream(arg, rng):
    """The CPU path needs neither: numpy arrays and a foreign host producer's tensors given
    one raise ArgumentError naming it, before anything runs."""
    inp = to_inputs(make_problem(rng, CASE), CASE, "numpy", "float32")
    value = np.zeros(1 << 16, np.uint8) if arg == "workspace" else 0
    with pytest.raises(swapmoe.ArgumentError, match=rf"{arg}: expected None for ndarray inputs in host memory"):
        call(inp, CASE, **{arg: value})
    f = foreign(inp)
    with pytest.raises(swapmoe.ArgumentError, match=rf"{arg}: expected None for Foreign inputs in host memory"):
        call(f, CASE, out=Foreign(np.empty_like(inp["x"])), **{arg: value})
    r = BY_NAME["qwen3"]
    m = moe_inputs(moe_problem(rng, r, 3, ep=False), "numpy", "float32")
    with pytest.raises(swapmoe.ArgumentError, match=rf"{arg}: expected None for ndarray inputs in host memory"):
        moe_call(r, m, **{arg: value})


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.parametrize("arg", ["workspace", "stream"])
def test_torch_tensors_take_no_workspace_and_no_stream(arg, rng):
    """torch calls take theirs from torch (the caching allocator, the current stream): a
    workspace or stream given raises ArgumentError naming it, on any device."""
    inp = to_inputs(make_problem(rng, CASE), CASE, "torch", "float32")
    value = torch.zeros(1 << 16, dtype=torch.uint8) if arg == "workspace" else 0
    with pytest.raises(swapmoe.ArgumentError, match=rf"{arg}: expected None for torch tensors \(the op takes"):
        call(inp, CASE, **{arg: value})
    r = BY_NAME["qwen3"]
    m = moe_inputs(moe_problem(rng, r, 3, ep=False), "torch", "float32")
    with pytest.raises(swapmoe.ArgumentError, match=rf"{arg}: expected None for torch tensors"):
        moe_call(r, m, **{arg: value})


def test_foreign_host_tensors_run_the_cpu_path_into_the_callers_out(rng):
    """A producer swapmoe does not know, in host memory: fused_experts and fused_moe write
    its ``out`` (the same bits as numpy's call), and without ``out`` raise ArgumentError."""
    inp = to_inputs(make_problem(rng, CASE), CASE, "numpy", "float32")
    want = call(inp, CASE)
    out = np.full_like(inp["x"], np.nan)
    got = call(foreign(inp), CASE, out=Foreign(out))
    assert isinstance(got, Foreign) and got.tensor is out
    assert same_bits(out, want)
    check_close(out, reference(inp, CASE), "float32", what="foreign host")
    with pytest.raises(swapmoe.ArgumentError, match="out: expected an output tensor for inputs of type Foreign"):
        call(foreign(inp), CASE)

    r = BY_NAME["deepseek_v3"]
    m = moe_inputs(moe_problem(rng, r, 6, ep=True), "numpy", "float32")
    want = moe_call(r, m)
    out = np.full_like(m["x"], np.nan)
    fm = {n: (v if n == "emap" or v is None else Foreign(v)) for n, v in m.items()}
    moe_call(r, fm, out=Foreign(out))
    assert same_bits(out, want)
    check_close(out, moe_ref(r, m), "float32", what="foreign host fused_moe")


@pytest.mark.parametrize("stream", ["0", -1, 2**64, True, 1.5, object()])
def test_a_stream_that_is_no_address_is_named(stream, rng):
    """``stream`` must be a CUstream address (an int in [0, 2^64)) or an object with
    ``cuda_stream`` / ``ptr``; anything else raises ArgumentError naming it, before the
    tensors are imported (here a host producer that says its tensors are on CUDA)."""
    inp = to_inputs(make_problem(rng, CASE), CASE, "numpy", "float32")
    cuda_like = {n: (None if v is None or n == "buffers" else Foreign(v, device_type=2)) for n, v in inp.items()}
    with pytest.raises(swapmoe.ArgumentError, match=r"stream: expected a CUstream address \(an int >= 0"):
        call(cuda_like, CASE, out=Foreign(np.empty_like(inp["x"]), device_type=2), stream=stream)


def test_stream_objects_give_their_address():
    class TorchLike:
        cuda_stream = 1234

    class CupyLike:
        ptr = 5678

    from swapmoe._api import _stream_address

    assert _stream_address(TorchLike()) == 1234
    assert _stream_address(CupyLike()) == 5678
    assert _stream_address(0) == 0
    assert _stream_address(np.int64(77)) == 77
