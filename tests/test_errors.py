"""Every bad input raises the right typed exception, and its message names the argument
and the expected and given values. Runs each case with numpy and with torch CPU inputs."""

from __future__ import annotations

import ctypes
import re
import numpy as np
import pytest

import swapmoe
from conftest import Case, call, check_close, make_problem, poison, reference, same_bits, snapshot, to_f64, to_inputs, torch

M, E, N, K, TOPK = 5, 8, 40, 48, 2
LIBS = ["numpy", pytest.param("torch", marks=pytest.mark.skipif(torch is None, reason="needs torch"))]

BASE = {
    swapmoe.ShapeError: ValueError,
    swapmoe.DTypeError: TypeError,
    swapmoe.DeviceError: ValueError,
    swapmoe.ArgumentError: ValueError,
}


# --------------------------------------------------------------------------- helpers


def cast(t, dtype: str):
    if isinstance(t, np.ndarray):
        return t.astype({"bfloat16": np.float16}.get(dtype, dtype))
    return t.to(getattr(torch, dtype))


def compact(t):
    return np.ascontiguousarray(t) if isinstance(t, np.ndarray) else t.contiguous()


def swap_last2(t):
    return np.swapaxes(t, -1, -2) if isinstance(t, np.ndarray) else t.transpose(-1, -2)


def last_dim_strided(t):
    """Same shape and values, but a transposed layout (last-dim stride != 1)."""
    return swap_last2(compact(swap_last2(t)))


def zeros(lib, shape, dtype):
    if lib == "numpy":
        return np.zeros(shape, dtype=dtype)
    return torch.zeros(shape, dtype=getattr(torch, dtype))


@pytest.fixture
def args(request, rng):
    """Valid keyword arguments for a call: M=5, E=8, N=40, K=48, topk=2, float32."""
    lib = request.param if hasattr(request, "param") else "numpy"
    case = Case(M, E, TOPK, N, K)
    inp = to_inputs(make_problem(rng, case), case, lib, "float32")
    return dict(hidden_states=inp["x"], w1=inp["w1"], w2=inp["w2"], topk_weights=inp["tw"], topk_ids=inp["ids"])


def expect(cls, kwargs, *needles):
    """Calls the op; it must raise cls (a swapmoe.Error and the fitting builtin) with
    every needle in its message. Returns the message."""
    with pytest.raises(cls) as info:
        swapmoe.fused_experts(**kwargs)
    err = info.value
    assert type(err) is cls, type(err)
    assert isinstance(err, swapmoe.Error)
    assert isinstance(err, BASE[cls])
    msg = str(err)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


def lib_of(kwargs):
    return "numpy" if isinstance(kwargs["hidden_states"], np.ndarray) else "torch"


# --------------------------------------------------------------------------- classes


def test_exception_hierarchy():
    assert issubclass(swapmoe.ShapeError, ValueError)
    assert issubclass(swapmoe.DTypeError, TypeError)
    assert issubclass(swapmoe.DeviceError, ValueError)
    assert issubclass(swapmoe.ArgumentError, ValueError)
    assert issubclass(swapmoe.CudaError, RuntimeError)
    assert issubclass(swapmoe.OutOfMemoryError, MemoryError)
    for cls in (swapmoe.ShapeError, swapmoe.DTypeError, swapmoe.DeviceError, swapmoe.ArgumentError, swapmoe.CudaError,
                swapmoe.OutOfMemoryError):
        assert issubclass(cls, swapmoe.Error)
    assert not issubclass(swapmoe.Error, (ValueError, TypeError, RuntimeError))


# --------------------------------------------------------------------------- ndim

NDIM = [
    ("hidden_states", lambda a: a["hidden_states"][None], ["hidden_states", "2-D", "[1, 5, 48]"]),
    ("hidden_states", lambda a: a["hidden_states"][0], ["hidden_states", "2-D", "got shape [48]"]),
    ("w1", lambda a: a["w1"][0], ["w1", "3-D", "[E, 2N, K]", "[80, 48]"]),
    ("w2", lambda a: a["w2"][None], ["w2", "3-D", "[1, 8, 48, 40]"]),
    ("topk_weights", lambda a: a["topk_weights"][:, 0], ["topk_weights", "2-D", "[5]"]),
    ("topk_ids", lambda a: a["topk_ids"][None], ["topk_ids", "2-D", "[1, 5, 2]"]),
    ("out", lambda a: a["hidden_states"][0] * 0, ["out", "2-D", "[48]"]),
    ("expert_map", lambda a: zeros(lib_of(a), (1, E), "int32"), ["expert_map", "1-D", "[1, 8]"]),
]


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("name,make,needles", NDIM, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(NDIM)])
def test_wrong_ndim(args, name, make, needles):
    args[name] = make(args)
    expect(swapmoe.ShapeError, args, *needles)


# --------------------------------------------------------------------------- dtype

DTYPE = [
    ("w1", "float16", ["w1", "expected float32 (the dtype of hidden_states)", "got float16"]),
    ("w2", "bfloat16", ["w2", "expected float32 (the dtype of hidden_states)", "got"]),
    ("out", "float16", ["out", "expected float32", "got float16"]),
    ("hidden_states", "float64", ["hidden_states", "bfloat16, float16 or float32", "got float64"]),
    ("hidden_states", "int32", ["hidden_states", "bfloat16, float16 or float32", "got int32"]),
    ("topk_ids", "float32", ["topk_ids", "int32 or int64", "got float32"]),
    ("topk_ids", "int16", ["topk_ids", "int32 or int64", "got int16"]),
    ("topk_weights", "int32", ["topk_weights", "float32, bfloat16 or float16", "got int32"]),
    ("topk_weights", "int64", ["topk_weights", "float32, bfloat16 or float16", "got int64"]),
    ("topk_weights", "float64", ["topk_weights", "float32, bfloat16 or float16", "got float64"]),
    ("expert_map", "int64", ["expert_map", "expected int32", "got int64"]),
    ("topk_ids", "uint16", ["topk_ids", "int32 or int64", "got uint16"]),
    ("hidden_states", "complex64", ["hidden_states", "bfloat16, float16 or float32", "got complex64"]),
]


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("name,dtype,needles", DTYPE, ids=[f"{n}-{d}" for n, d, _ in DTYPE])
def test_wrong_dtype(args, name, dtype, needles):
    if name == "out":
        args["out"] = cast(args["hidden_states"], dtype)
    elif name == "expert_map":
        args["expert_map"] = cast(zeros(lib_of(args), (E,), "int32"), dtype)
    elif name == "hidden_states" and dtype == "int32":
        args[name] = cast(args[name] * 10, dtype)
    else:
        args[name] = cast(args[name], dtype)
    expect(swapmoe.DTypeError, args, *needles)


@pytest.mark.parametrize("args", ["torch"], indirect=True)
def test_bf16_hidden_with_fp32_weights(args):
    if torch is None:
        pytest.skip("needs torch")
    args["hidden_states"] = args["hidden_states"].bfloat16()
    expect(swapmoe.DTypeError, args, "w1", "expected bfloat16 (the dtype of hidden_states)", "got float32")


# --------------------------------------------------------------------------- shapes

SHAPE = [
    ("w2_N", lambda a: {"w2": compact(a["w2"][..., :-1])}, ["w2", "expected shape [8, 48, 40]", "got [8, 48, 39]"]),
    ("w2_E", lambda a: {"w2": a["w2"][:4]}, ["w2", "expected shape [8, 48, 40]", "got [4, 48, 40]"]),
    ("w2_K", lambda a: {"w2": a["w2"][:, :47]}, ["w2", "expected shape [8, 48, 40]", "got [8, 47, 40]"]),
    ("w1_K", lambda a: {"w1": a["w1"][..., :47]}, ["w1", "K = 48", "got [8, 80, 47]"]),
    ("w1_odd", lambda a: {"w1": a["w1"][:, :79]}, ["w1", "even 2N", "got [8, 79, 48]"]),
    ("w1_E0", lambda a: {"w1": a["w1"][:0]}, ["w1", "E >= 1", "got [0, 80, 48]"]),
    ("ids_vs_weights", lambda a: {"topk_ids": compact(a["topk_ids"][:, :1])}, ["topk_ids", "expected shape [5, 2]", "got [5, 1]"]),
    ("ids_rows", lambda a: {"topk_ids": a["topk_ids"][:4]}, ["topk_ids", "expected shape [5, 2]", "got [4, 2]"]),
    (
        "weights_rows",
        lambda a: {"topk_weights": a["topk_weights"][:4], "topk_ids": a["topk_ids"][:4]},
        ["topk_weights", "M = 5", "got [4, 2]"],
    ),
    ("topk0", lambda a: {"topk_weights": a["topk_weights"][:, :0], "topk_ids": a["topk_ids"][:, :0]}, ["topk_weights", "topk >= 1", "[5, 0]"]),
    ("out_cols", lambda a: {"out": zeros(lib_of(a), (5, 49), "float32")}, ["out", "expected shape [5, 48]", "got [5, 49]"]),
    ("out_rows", lambda a: {"out": zeros(lib_of(a), (6, 48), "float32")}, ["out", "expected shape [5, 48]", "got [6, 48]"]),
    (
        "K0",
        lambda a: {"hidden_states": a["hidden_states"][:, :0], "w1": a["w1"][..., :0], "w2": a["w2"][:, :0]},
        ["hidden_states", "K >= 1", "[5, 0]"],
    ),
    ("empty_map", lambda a: {"expert_map": zeros(lib_of(a), (0,), "int32")}, ["expert_map", "at least one entry"]),
]


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("name,change,needles", SHAPE, ids=[s[0] for s in SHAPE])
def test_mismatched_shape(args, name, change, needles):
    args.update(change(args))
    expect(swapmoe.ShapeError, args, *needles)


# --------------------------------------------------------------------------- layout

LAYOUT = ["hidden_states", "w1", "w2", "topk_weights", "topk_ids", "out"]


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("name", LAYOUT)
def test_last_dim_not_contiguous(args, name):
    if name == "out":
        args["out"] = last_dim_strided(args["hidden_states"] * 0)
    else:
        args[name] = last_dim_strided(args[name])
    shape = list(args[name].shape)
    msg = expect(swapmoe.ShapeError, args, name, "last dimension to be contiguous (stride 1)")
    assert f"for shape [{', '.join(map(str, shape))}]" in msg


@pytest.mark.parametrize("args", LIBS, indirect=True)
def test_transposed_w1_names_strides(args):
    args["w1"] = last_dim_strided(args["w1"])
    expect(swapmoe.ShapeError, args, "w1", "got strides [3840, 1, 80] for shape [8, 80, 48]")


@pytest.mark.parametrize("name", ["hidden_states", "topk_ids"])
def test_negative_strides(args, name):
    args[name] = args[name][::-1]
    step = -args[name].strides[0] // args[name].itemsize
    expect(swapmoe.ShapeError, args, name, "non-negative strides", f"got stride -{step} on dimension 0")


@pytest.mark.parametrize("args", LIBS, indirect=True)
def test_overlapping_out_rows_rejected(args):
    x = args["hidden_states"]
    if isinstance(x, np.ndarray):
        # a writable view whose M rows are one row of memory
        args["out"] = np.lib.stride_tricks.as_strided(np.zeros(K, np.float32), (M, K), (0, 4))
    else:
        args["out"] = torch.zeros(1, K).expand(M, K)
    expect(swapmoe.ShapeError, args, "out")


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("activation", ["relu", "SiLU", "gelu_tanh", ""])
def test_unknown_activation(args, activation):
    args["activation"] = activation
    expect(swapmoe.ArgumentError, args, "activation", "'silu', 'gelu'", f'got "{activation}"')


@pytest.mark.parametrize("args", LIBS, indirect=True)
def test_router_weight_on_input_needs_topk1(args):
    args["apply_router_weight_on_input"] = True
    expect(swapmoe.ShapeError, args, "apply_router_weight_on_input", "topk == 1", "got topk = 2")


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("g", [0, 7, 9, -2])
def test_global_num_experts_vs_E(args, g):
    args["global_num_experts"] = g
    expect(swapmoe.ShapeError, args, "global_num_experts", "expected 8 (w1.shape[0]", f"got {g}")


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("g", [8, 9, 11])
def test_global_num_experts_vs_expert_map(args, g):
    args["expert_map"] = zeros(lib_of(args), (10,), "int32")
    args["global_num_experts"] = g
    expect(swapmoe.ShapeError, args, "global_num_experts", "expected 10 (expert_map.shape[0])", f"got {g}")


@pytest.mark.parametrize("args", LIBS, indirect=True)
def test_global_num_experts_consistent_is_accepted(args):
    """The matching value (and -1) pass: the checks above are not blanket refusals."""
    lib = lib_of(args)
    base = snapshot(swapmoe.fused_experts(**args))
    assert same_bits(snapshot(swapmoe.fused_experts(**args, global_num_experts=E)), base)
    emap = np.full(10, -1, np.int32)
    emap[:E] = np.arange(E)  # identity on the ids in use, two extra unmapped ids
    if lib == "torch":
        emap = torch.from_numpy(emap)
    got = swapmoe.fused_experts(**args, global_num_experts=10, expert_map=emap)
    assert same_bits(snapshot(got), base)


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("name", ["w1", "w2", "topk_weights", "topk_ids", "out", "expert_map"])
def test_python_list_argument(args, name):
    if name == "out":
        args["out"] = (args["hidden_states"] * 0).tolist()
    elif name == "expert_map":
        args["expert_map"] = list(range(E))
    else:
        args[name] = args[name].tolist()
    expect(swapmoe.DTypeError, args, name, "supports DLPack", "got list")


@pytest.mark.parametrize("args", LIBS, indirect=True)
def test_none_weight(args):
    args["w2"] = None
    expect(swapmoe.DTypeError, args, "w2", "got NoneType")


@pytest.mark.parametrize("args", LIBS, indirect=True)
def test_python_list_hidden_states(args):
    args["hidden_states"] = args["hidden_states"].tolist()
    expect(swapmoe.DTypeError, args, "hidden_states", "got list")


def test_read_only_out(args):
    out = np.zeros((M, K), np.float32)
    out.flags.writeable = False
    args["out"] = out
    expect(swapmoe.ArgumentError, args, "out", "writable", "read-only")
    assert (out == 0).all()


# --------------------------------------------------------------------------- devices


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


@_DELETER
def _no_delete(_):
    pass


_CAPSULE_NEW = ctypes.pythonapi.PyCapsule_New
_CAPSULE_NEW.restype = ctypes.py_object
_CAPSULE_NEW.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeDeviceTensor:
    """A DLPack producer describing a numpy array's memory as living on another device
    (type 2 = CUDA, 7 = Vulkan, ...). swapmoe validates devices before it touches any
    memory, so device errors can be tested without the device."""

    def __init__(self, arr: np.ndarray, device_type: int, device_id: int = 0):
        self.arr = np.ascontiguousarray(arr)
        self.device = (device_type, device_id)
        self._keep = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        a = self.arr
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        strides = (ctypes.c_int64 * a.ndim)(*[s // a.itemsize for s in a.strides])
        code = {"f": 2, "i": 0, "u": 1}[a.dtype.kind]
        m = _DLManagedTensor()
        m.dl_tensor = _DLTensor(a.ctypes.data, _DLDevice(*self.device), a.ndim, _DLDataType(code, a.itemsize * 8, 1), shape, strides, 0)
        m.manager_ctx = None
        m.deleter = _no_delete
        self._keep.append((m, shape, strides))
        return _CAPSULE_NEW(ctypes.addressof(m), b"dltensor", None)


def test_fake_device_tensor_on_cpu_works(args):
    """The fake producer is sound: claiming device CPU (type 1), it computes normally."""
    ref = swapmoe.fused_experts(**args)
    args["w1"] = FakeDeviceTensor(args["w1"], 1)
    got = swapmoe.fused_experts(**args)
    assert same_bits(got, ref) and np.abs(ref).max() > 0


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("name", ["w1", "w2", "topk_weights", "topk_ids", "out", "expert_map"])
def test_cpu_hidden_with_cuda_tensor(args, name):
    lib = lib_of(args)
    if name == "out":
        base = np.zeros((M, K), np.float32)
    elif name == "expert_map":
        base = np.arange(E, dtype=np.int32)
    else:
        base = args[name] if lib == "numpy" else args[name].numpy()
    args[name] = FakeDeviceTensor(base, 2, 1)
    expect(swapmoe.DeviceError, args, name, "expected device cpu (the device of hidden_states)", "got cuda:1")


def test_cuda_hidden_with_cpu_weights(args):
    args["hidden_states"] = FakeDeviceTensor(args["hidden_states"], 2, 0)
    args["out"] = FakeDeviceTensor(np.zeros((M, K), np.float32), 2, 0)
    expect(swapmoe.DeviceError, args, "w1", "expected device cuda:0 (the device of hidden_states)", "got cpu")


def test_unsupported_device(args):
    args["hidden_states"] = FakeDeviceTensor(args["hidden_states"], 7, 0)
    args["out"] = np.zeros((M, K), np.float32)
    expect(swapmoe.DeviceError, args, "hidden_states", "a CPU or CUDA tensor", "dlpack-device(type=7, id=0)")


# --------------------------------------------------------------------------- check_ids


BAD_IDS = [("int32", b) for b in (8, 9, -2, -(2**31), 2**31 - 1)] + [("int64", b) for b in (8, -2, 2**31, 2**32 + 1, -(2**40))]


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("id_dtype,bad", BAD_IDS)
def test_check_ids_bad_id(args, id_dtype, bad):
    ids = cast(args["topk_ids"], id_dtype)
    ids[2, 1] = bad
    args["topk_ids"] = ids
    out = poison(args["hidden_states"])
    args["out"] = out
    args["check_ids"] = True
    expect(swapmoe.ShapeError, args, "topk_ids", "[0, 8) (global_num_experts) or -1", f"got {bad} at [2, 1]")
    assert np.isnan(to_f64(out)).all(), "output written although the ids were rejected"
    # Without check_ids the same call runs: the bad id contributes nothing, so the output is
    # bitwise the one with that slot routed nowhere (-1).
    args["check_ids"] = False
    assert swapmoe.fused_experts(**args) is out
    assert np.isfinite(to_f64(out)).all()
    ids[2, 1] = -1
    args["out"] = poison(args["hidden_states"])
    assert same_bits(out, swapmoe.fused_experts(**args))


@pytest.mark.parametrize("args", LIBS, indirect=True)
def test_check_ids_names_first_bad_id(args):
    ids = args["topk_ids"]
    ids[1, 0] = 50
    ids[3, 1] = 60
    args["check_ids"] = True
    expect(swapmoe.ShapeError, args, "got 50 at [1, 0]")


@pytest.mark.parametrize("args", LIBS, indirect=True)
def test_check_ids_with_expert_map_range(args):
    """With a map of 10 entries ids 8 and 9 are valid, 10 is not."""
    lib = lib_of(args)
    emap = zeros(lib, (10,), "int32") - 1
    emap[1] = 3
    emap[9] = 0
    ids = args["topk_ids"]
    ids[0, 0] = 9
    ids[0, 1] = 8
    swapmoe.fused_experts(**args, expert_map=emap, check_ids=True)
    ids[4, 0] = 10
    args.update(expert_map=emap, check_ids=True)
    expect(swapmoe.ShapeError, args, "topk_ids", "[0, 10)", "got 10 at [4, 0]")


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("entry", [8, 100, -2])
def test_check_ids_bad_expert_map_entry(args, entry):
    lib = lib_of(args)
    emap = zeros(lib, (E,), "int32") - 1
    emap[0] = 1
    emap[2] = entry
    args.update(expert_map=emap, check_ids=True)
    expect(swapmoe.ShapeError, args, "expert_map", "entries in [-1, 8) (w1.shape[0] local experts)", f"got {entry} at index 2")


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("ep", [False, True], ids=["no_map", "ep"])
def test_check_ids_passes_valid_ids(lib, ep, rng):
    """Valid ids (with -1 entries, and -1 map entries) pass check_ids and give the same
    bits as check_ids=False, matching the reference."""
    case = Case(17, 8, 3, 40, 48, ep=ep)
    prob = make_problem(rng, case)
    prob["ids"][::3, 1] = -1
    prob["ids"][5] = -1
    inp = to_inputs(prob, case, lib, "float32")
    checked = call(inp, case, check_ids=True, out=poison(inp["x"]))
    plain = call(inp, case, check_ids=False)
    assert same_bits(snapshot(checked), snapshot(plain))
    check_close(checked, reference(inp, case), "float32")
    assert (to_f64(checked)[5] == 0).all()
    if ep:
        assert (prob["expert_map"] == -1).any()


# --------------------------------------------------------------------------- sizes no memory holds


@pytest.mark.parametrize("quant", [None, "fp8_tensor"])
def test_cpu_intermediate_too_large_raises_out_of_memory(quant):
    """The CPU path's float32 intermediate (M*topk x N) is allocated fallibly: 16 TiB raises
    OutOfMemoryError (a MemoryError) naming it, where an infallible allocation aborted the
    interpreter. The inputs themselves are small (N = 2^20 with K = 1)."""
    M, K, N, E, topk = 2**16, 1, 2**20, 1, 64
    x = np.zeros((M, K), np.float32)
    tw = np.ones((M, topk), np.float32)
    ids = np.zeros((M, topk), np.int32)
    if quant:
        w1 = np.zeros((E, 2 * N, K), np.uint8)
        w2 = np.zeros((E, K, N), np.uint8)
        kw = dict(use_fp8_w8a8=True, w1_scale=np.ones(E, np.float32), w2_scale=np.ones(E, np.float32))
    else:
        w1 = np.zeros((E, 2 * N, K), np.float32)
        w2 = np.zeros((E, K, N), np.float32)
        kw = {}
    with pytest.raises(swapmoe.OutOfMemoryError, match=r"intermediate.*65536 x 64 x 1048576|intermediate.*4194304 x 1048576") as e:
        swapmoe.fused_experts(x, w1, w2, tw, ids, **kw)
    assert isinstance(e.value, MemoryError) and "could not be allocated" in str(e.value)


def test_workspace_bytes_never_wraps_and_is_zero_for_invalid_shapes():
    """Sizes past 2^64 bytes raise OutOfMemoryError instead of wrapping to a small number (a
    CUDA workspace sized by it would be too short); shapes that are not a valid call give 0."""
    with pytest.raises(swapmoe.OutOfMemoryError, match=r"workspace: .* more than 2\^64 bytes .*M = 1048576"):
        swapmoe._core.workspace_bytes(2**20, 2**10, 2**31 - 1, 2**31 - 1, 8192, 2, "fp8_tensor")
    class Shaped:  # only .shape and .dtype are read
        def __init__(self, *shape):
            self.shape, self.dtype = shape, np.dtype("float16")
    good = swapmoe.workspace_bytes(Shaped(4, 64), Shaped(8, 96, 64), Shaped(4, 2))
    assert good > 0
    for h, w, ids in [((4, 64), (8, 96, 32), (4, 2)),   # K differs
                      ((4, 64), (8, 95, 64), (4, 2)),   # 2N odd
                      ((4, 64), (0, 96, 64), (4, 2)),   # no expert
                      ((4, 64), (8, 96, 64), (5, 2))]:  # M differs
        assert swapmoe.workspace_bytes(Shaped(*h), Shaped(*w), Shaped(*ids)) == 0, (h, w, ids)


# --------------------------------------------------------------------------- Python types of scalar arguments

BAD_SCALARS = [
    ("check_ids", 1, "check_ids: expected a bool, got 1 (int)"),
    ("apply_router_weight_on_input", 0, "apply_router_weight_on_input: expected a bool, got 0 (int)"),
    ("global_num_experts", 4.0, "global_num_experts: expected an integer, got 4.0 (float)"),
    ("global_num_experts", None, "global_num_experts: expected an integer, got None"),
    ("global_num_experts", 2**64, "global_num_experts: expected an integer in ["),
    ("backend", 5, "backend: expected None or a str, got 5 (int)"),
    ("backend", "\ud800", "backend: expected None or a str that encodes as UTF-8"),
    ("activation", "\ud800", "activation: expected a str that encodes as UTF-8"),
    ("use_fp8_w8a8", 1, "use_fp8_w8a8: expected a bool, got 1 (int)"),
    ("block_shape", "128", "block_shape: expected None or a list of integers, got '128' (str)"),
    ("block_shape", [128.0, 128.0], "block_shape: expected None or a list of integers"),
]


@pytest.mark.parametrize("args", LIBS, indirect=True)
@pytest.mark.parametrize("name,value,needle", BAD_SCALARS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD_SCALARS)])
def test_scalar_arguments_of_the_wrong_python_type_are_named(args, name, value, needle):
    """The core's conversions of scalar arguments raise bare TypeError / OverflowError /
    UnicodeEncodeError without the argument's name; the wrappers name it (ArgumentError,
    chained to the conversion's error)."""
    args[name] = value
    with pytest.raises(swapmoe.ArgumentError, match=re.escape(needle)) as e:
        swapmoe.fused_experts(**args)
    assert isinstance(e.value.__cause__, (TypeError, OverflowError, UnicodeEncodeError))


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("kw,needle", [
    (dict(renormalize=1), "renormalize: expected a bool"),
    (dict(routed_scaling_factor=None), "routed_scaling_factor: expected a real number, got None"),
    (dict(num_expert_group=2.0, topk_group=1), "num_expert_group: expected None or an integer, got 2.0"),
    (dict(num_expert_group=2, topk_group=1.0), "topk_group: expected None or an integer, got 1.0"),
    (dict(num_tokens="3"), "num_tokens: expected None or an integer, got '3'"),
    (dict(topk=2**63), "topk: expected an integer in ["),
    (dict(topk=2**33), "topk: expected 1 <= topk <= E = 8"),  # no [M, 2^33] buffer is allocated first
])
def test_router_arguments_of_the_wrong_python_type_are_named(lib, kw, needle):
    g = zeros(lib, (3, E), "float32")
    kw = {"topk": 2, **kw}
    with pytest.raises(swapmoe.ArgumentError, match=re.escape(needle)):
        swapmoe.select_experts(g, kw.pop("topk"), **kw)


@pytest.mark.parametrize("kw,needle", [
    (dict(num_tokens=4.0), "num_tokens: expected an integer, got 4.0"),
    (dict(num_tokens=2**63), "num_tokens: expected an integer in ["),
    (dict(dtype=None), "dtype: expected a str, got None"),
    (dict(device_name=5), "device_name: expected None or a str, got 5"),
    (dict(external_backends=None), "external_backends: expected a list of str, got None"),
    (dict(external_backends=[1]), "external_backends: expected a list of str, got [1]"),
    (dict(quant=np.array(["fp8_tensor"])), "quant: expected one of"),
    (dict(device_capability=(9,)), "device_capability: expected None or (major, minor) integers"),
    (dict(device_capability=(9, 0, 0)), "device_capability: expected None or (major, minor) integers"),
    (dict(device_capability="90"), "device_capability: expected None or (major, minor) integers"),
    (dict(device_capability=(9.7, 0.2)), "device_capability: expected None or (major, minor) integers"),
    (dict(device_capability=(7, 5)), "device_capability: expected sm_80 or newer"),
    (dict(device_capability=(9, -5)), "device_capability: expected sm_80 or newer"),
    (dict(device_capability=(9, 10)), "device_capability: expected sm_80 or newer"),
    (dict(device_capability=(2**40, 0)), "device_capability: expected sm_80 or newer"),
])
def test_select_backend_arguments_of_the_wrong_python_type_are_named(kw, needle):
    kw = {"num_tokens": 4, "device_name": "NVIDIA H200", **kw}
    with pytest.raises(swapmoe.ArgumentError, match=re.escape(needle)):
        swapmoe.select_backend(kw.pop("num_tokens"), 8, 2, 256, 64, **kw)


@pytest.mark.parametrize("raised,seen", [(KeyboardInterrupt, KeyboardInterrupt), (SystemExit, SystemExit),
                                         (MemoryError, MemoryError), (ValueError, swapmoe.DTypeError)])
def test_a_producers_own_interrupt_goes_up_unchanged(raised, seen):
    """What a producer's __dlpack__ raises is the tensor's fault (DTypeError naming the
    argument) unless it is an interrupt, an exit or a failed allocation: those go up as
    they were raised."""
    class Producer:
        def __dlpack__(self, **kw):
            raise raised("from the producer")

        def __dlpack_device__(self):
            return (1, 0)

    h = np.zeros((2, 4), np.float32)
    with pytest.raises(seen) as e:
        swapmoe.fused_experts(h, Producer(), h, h, h)
    if seen is swapmoe.DTypeError:
        assert "w1: the tensor could not be imported through DLPack" in str(e.value)


def test_router_rejects_negative_strides():
    """gating_output with a negative row stride (a reversed numpy view; torch has none) is
    rejected, as fused_experts rejects its tensors' (the router indexes rows as t * stride)."""
    g = np.zeros((4, E), np.float32)[::-1]
    with pytest.raises(swapmoe.ShapeError, match="gating_output: expected non-negative strides, got stride -8 on dimension 0"):
        swapmoe.select_experts(g, 2)


def test_describe_plan_does_not_blame_an_out_it_does_not_take():
    """describe_plan has no `out`: a read-only or broadcast hidden_states (fine as an input)
    plans as fused_experts would run it with a fresh output."""
    x = np.zeros((M, K), np.float32)
    w1, w2 = np.zeros((E, 2 * N, K), np.float32), np.zeros((E, K, N), np.float32)
    tw, ids = np.ones((M, TOPK), np.float32), np.zeros((M, TOPK), np.int32)
    x.setflags(write=False)
    for h in (x, np.broadcast_to(np.zeros((1, K), np.float32), (M, K))):
        plan = swapmoe._core.describe_plan(h, w1, w2, tw, ids)
        assert plan["backend"] == "cpu"
    # A broadcast hidden_states spans one row; the router weights right after it in the same
    # buffer lie where a compact output at its address would reach (this overlap was blamed
    # on the stand-in output when the allocator put topk_weights there by chance).
    buf = np.zeros(K + M * TOPK, np.float32)
    h = np.broadcast_to(buf[:K], (M, K))
    tw_after = buf[K:].reshape(M, TOPK)
    assert swapmoe._core.describe_plan(h, w1, w2, tw_after, ids)["backend"] == "cpu"


@pytest.mark.parametrize("args,needle", [
    ((2**31, 8, 2, 256, 64), "num_tokens = 2147483648"),
    ((2**30, 8, 2, 256, 64), "num_tokens = 1073741824, top_k = 2"),  # M * topk
    ((4, 8, 2, 256, 2**62), "intermediate_size = 4611686018427387904"),
])
def test_select_backend_names_its_own_arguments_past_the_ops_limits(args, needle):
    with pytest.raises(swapmoe.ShapeError, match=re.escape(needle)) as e:
        swapmoe.select_backend(*args, device_name="NVIDIA H200")
    assert "each < 2^31" in str(e.value) and "hidden_states" not in str(e.value)


# --------------------------------------------------------------------------- the second fuzz pass


class _BadRepr:
    def __repr__(self):
        raise ZeroDivisionError("no repr")


@pytest.mark.parametrize("call,needle", [
    (lambda a, g: swapmoe.select_experts(g, 10**5000), "got <an int of 16610 bits> (int)"),
    (lambda a, g: swapmoe.fused_experts(**a, check_ids=10**5000), "check_ids: expected a bool, got <an int of 16610 bits> (int)"),
    (lambda a, g: swapmoe.fused_experts(**a, activation=_BadRepr()), "activation: expected one of 'silu', 'gelu', got <unprintable> (_BadRepr)"),
    (lambda a, g: swapmoe.fused_experts(**a, block_shape={128}), "block_shape: expected None or a list of integers"),
    (lambda a, g: swapmoe.fused_experts(**a, block_shape=(x for x in [128, 128])), "block_shape: expected None or a list"),
    (lambda a, g: swapmoe.select_experts(g, 2, routed_scaling_factor=bytearray(b"1.5")), "routed_scaling_factor: expected a real number"),
    (lambda a, g: swapmoe.fused_moe(a["hidden_states"], a["w1"], a["w2"], g, 2, global_num_experts=None), "global_num_experts: expected an integer, got None"),
    (lambda a, g: swapmoe.fused_moe(a["hidden_states"], a["w1"], a["w2"], g, 2, global_num_experts=np.array([8, 8])), "global_num_experts: expected an integer"),
    (lambda a, g: swapmoe.workspace_bytes(a["hidden_states"], a["w1"], a["topk_ids"], quant=1), "quant: expected None or a str, got 1 (int)"),
])
def test_error_paths_name_the_argument_whatever_its_value(args, call, needle):
    """The error path itself never fails on the value it reports (a 5000-digit int, a
    failing __repr__), and values the core cannot convert (a set for a list, a bytearray for
    a float, a non-integer global_num_experts before a shape check uses it) are named."""
    g = np.zeros((M, E), np.float32)
    with pytest.raises(swapmoe.ArgumentError, match=re.escape(needle)):
        call(args, g)


def test_select_backend_reads_a_generator_of_external_backends_once():
    lst = swapmoe.select_backend(8, 128, 8, 2048, 768, device_name="NVIDIA H200", external_backends=["vllm_triton"])
    gen = swapmoe.select_backend(8, 128, 8, 2048, 768, device_name="NVIDIA H200",
                                 external_backends=(b for b in ["vllm_triton"]))
    assert gen.backend == lst.backend == "vllm_triton"
    with pytest.raises(swapmoe.ArgumentError, match="external_backends: expected a list of str"):
        swapmoe.select_backend(8, 128, 8, 2048, 768, device_name="NVIDIA H200", external_backends=b"vllm_triton")


@pytest.mark.parametrize("other", ["w1", "w2", "topk_weights", "topk_ids"])
def test_out_overlapping_an_input_other_than_hidden_states_is_rejected(other):
    """out may be hidden_states; an out inside w2 or the router weights was written while they
    were read (a wrong result, no error)."""
    x = np.random.default_rng(0).standard_normal((M, K)).astype(np.float32)
    t = {"w1": np.zeros((E, 2 * N, K), np.float32), "w2": np.zeros((E, K, N), np.float32),
         "topk_weights": np.ones((M, TOPK), np.float32), "topk_ids": np.zeros((M, TOPK), np.int32)}
    # `other` and out share the start of one buffer
    buf = np.zeros(max(M * K, t[other].size), np.float32)
    t[other] = buf.view(t[other].dtype)[: t[other].size].reshape(t[other].shape)
    out = buf[: M * K].reshape(M, K)
    w1, w2, tw, ids = t["w1"], t["w2"], t["topk_weights"], t["topk_ids"]
    with pytest.raises(swapmoe.ShapeError, match=f"out: expected memory that does not overlap {other}"):
        swapmoe.fused_experts(x, w1, w2, tw, ids, out=out)
    swapmoe.fused_experts(x, w1, w2, tw, ids, out=x)  # hidden_states itself: allowed


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_select_experts_op_checks_num_tokens_as_the_eager_call_does():
    """torch.ops.swapmoe.select_experts (what torch.compile runs) takes num_tokens too."""
    g = torch.zeros(3, E)
    with pytest.raises(swapmoe.ShapeError, match=re.escape("M = 5 (num_tokens)")):
        torch.ops.swapmoe.select_experts(g, 2, num_tokens=5)
    w, i = torch.ops.swapmoe.select_experts(g, 2, num_tokens=3)
    assert w.shape == i.shape == (3, 2)


# --------------------------------------------------------------------------- API-layer gaps
# (each of these was a planted bug in python/swapmoe/_api.py or _args.py that no test caught)


@pytest.mark.parametrize("lib", LIBS)
def test_numpy_bool_flags_are_never_blamed(lib, rng):
    """numpy bools are bools (numpy 2 names the type ``bool``, numpy 1 ``bool_``): the error
    names the bad argument, never a valid np.True_ flag beside it."""
    conv = (lambda a: a) if lib == "numpy" else torch.from_numpy
    g = conv(np.zeros((3, 8), np.float32))
    swapmoe.select_experts(g, 2, renormalize=np.True_)
    with pytest.raises(swapmoe.ArgumentError, match=r"^num_expert_group: expected None or an integer"):
        swapmoe.select_experts(g, 2, renormalize=np.True_, num_expert_group=2.0, topk_group=1)
    case = Case(5, 8, 2, 40, 48)
    inp = to_inputs(make_problem(rng, case), case, lib, "float32")
    with pytest.raises(swapmoe.ArgumentError, match=r"^backend: expected None or a str, got 5"):
        call(inp, case, check_ids=np.True_, backend=5)
    # where an integer is asked for, a numpy bool is named (not an index under numpy 2)
    with pytest.raises(swapmoe.ArgumentError, match=r"^global_num_experts: expected an integer"):
        call(inp, case, global_num_experts=np.True_)
    with pytest.raises(swapmoe.ArgumentError, match=r"^num_tokens: expected "):
        swapmoe.select_experts(g, 2, num_tokens=np.True_)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("topk", [2**63, -(2**63) - 1])
def test_fused_moe_names_topk_past_i64(lib, topk):
    conv = (lambda a: a) if lib == "numpy" else torch.from_numpy
    x, w1, w2, g = (conv(np.zeros(s, np.float32)) for s in [(4, 64), (8, 64, 64), (8, 64, 32), (4, 8)])
    with pytest.raises(swapmoe.ArgumentError, match=re.escape("topk: expected an integer in [")):
        swapmoe.fused_moe(x, w1, w2, g, topk)


@pytest.mark.parametrize("lib", LIBS)
def test_str_and_dict_scalars_are_named(lib, rng):
    conv = (lambda a: a) if lib == "numpy" else torch.from_numpy
    g = conv(np.zeros((3, 8), np.float32))
    with pytest.raises(swapmoe.ArgumentError, match=r"^routed_scaling_factor: expected a real number, got '1.5'"):
        swapmoe.select_experts(g, 2, routed_scaling_factor="1.5")
    case = Case(5, 8, 2, 40, 48)
    inp = to_inputs(make_problem(rng, case), case, lib, "float32")
    with pytest.raises(swapmoe.ArgumentError, match=r"^block_shape: expected None or a list of integers"):
        call(inp, case, block_shape={128: 0, 1: 0})


def test_fused_moe_expert_count_message_names_its_source():
    x, w1, w2 = np.zeros((4, 64), np.float32), np.zeros((8, 64, 64), np.float32), np.zeros((8, 64, 32), np.float32)
    with pytest.raises(swapmoe.ShapeError, match=re.escape(
            "gating_output: expected shape [M, 8] (w1.shape[0], no expert_map given), got [4, 16]")):
        swapmoe.fused_moe(x, w1, w2, np.zeros((4, 16), np.float32), 2)
    emap = np.full(16, -1, np.int32)
    emap[:8] = np.arange(8)
    with pytest.raises(swapmoe.ShapeError, match=re.escape(
            "gating_output: expected shape [M, 16] (expert_map.shape[0]), got [4, 12]")):
        swapmoe.fused_moe(x, w1, w2, np.zeros((4, 12), np.float32), 2, expert_map=emap)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("bad", [-5, 0])
def test_fused_moe_names_a_bad_global_num_experts(lib, bad):
    """A global_num_experts that is neither -1 nor an expert count is named as such (as
    fused_experts does), not reported as a gating_output shape of [M, -5]."""
    conv = (lambda a: a) if lib == "numpy" else torch.from_numpy
    x, w1, w2, g = (conv(np.zeros(s, np.float32)) for s in [(4, 64), (8, 64, 64), (8, 64, 32), (4, 8)])
    with pytest.raises(swapmoe.ShapeError, match=re.escape(f"global_num_experts: expected 8 (w1.shape[0], no expert_map given) or -1, got {bad}")):
        swapmoe.fused_moe(x, w1, w2, g, 2, global_num_experts=bad)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("M", [1, 9, 70])
def test_workspace_bytes_is_the_plans(dtype, M, rng):
    """The public workspace size maps the tensors' shapes onto the core's (M, topk, N, K, E)
    as the plan does, for every quant."""
    case = Case(M, 8, 2, 40, 48)
    inp = to_inputs(make_problem(rng, case), case, "numpy", dtype)
    plan = swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"])
    assert swapmoe.workspace_bytes(inp["x"], inp["w1"], inp["ids"]) == plan["workspace_bytes"] > 0
    for q in ("fp8_tensor", "fp8_channel", "fp8_block128"):
        assert swapmoe.workspace_bytes(inp["x"], inp["w1"], inp["ids"], q) == \
            swapmoe._core.workspace_bytes(M, 2, 40, 48, 8, inp["x"].itemsize, q)


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_cupy_and_torch_name_the_same_quant():
    """The CuPy path (_api) and the torch path (ops) size their workspace with one quant name."""
    from swapmoe import _api, _args, ops

    assert _api.quant_name is ops.quant_name is _args.quant_name
    for fp8 in (False, True):
        for channel in (False, True):
            for block in (None, [128, 128]):
                want = None if not fp8 else "fp8_block128" if block else "fp8_channel" if channel else "fp8_tensor"
                assert _args.quant_name(fp8, channel, block) == want


@pytest.mark.parametrize("lib", LIBS)
def test_a_forced_backend_that_cannot_run_names_where_it_was_forced(lib, rng, monkeypatch):
    """A backend forced by the argument or by $SWAPMOE_BACKEND that cannot run the call (a
    CUDA backend on host tensors) raises DeviceError; where the environment sets the
    variable the message names it and its value, since the user may never have passed
    ``backend=``. An unknown name in the variable is named as the variable."""
    case = Case(5, 8, 2, 40, 48)
    inp = to_inputs(make_problem(rng, case), case, lib, "float32")
    monkeypatch.delenv("SWAPMOE_BACKEND", raising=False)
    with pytest.raises(swapmoe.DeviceError, match=r"^backend: cuda_mma cannot run .*: it needs CUDA tensors") as e:
        call(inp, case, backend="cuda_mma")
    assert "SWAPMOE_BACKEND" not in str(e.value)
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_mma")
    with pytest.raises(swapmoe.DeviceError,
                       match=r"^backend \(the argument, else \$SWAPMOE_BACKEND=\"cuda_mma\"\): cuda_mma cannot run "):
        call(inp, case)
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_tcgen05")
    with pytest.raises(swapmoe.ArgumentError,
                       match=r"^SWAPMOE_BACKEND: expected one of \[.*\], got \"cuda_tcgen05\""):
        call(inp, case)
    # the argument wins over the variable, and the CPU backend runs host tensors
    out = call(inp, case, backend="cpu")
    assert out.shape == (case.M, case.K)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("name", ["vllm_triton", "flashinfer_cutlass"])
def test_the_op_refuses_an_external_backend(lib, rng, monkeypatch, name):
    """fused_experts runs swapmoe's kernels: forcing a backend outside swapmoe (by the argument
    or $SWAPMOE_BACKEND) raises ArgumentError naming it and where it came from."""
    case = Case(5, 8, 2, 40, 48)
    inp = to_inputs(make_problem(rng, case), case, lib, "float32")
    monkeypatch.delenv("SWAPMOE_BACKEND", raising=False)
    with pytest.raises(swapmoe.ArgumentError, match=rf"^backend: {name} runs outside swapmoe"):
        call(inp, case, backend=name)
    monkeypatch.setenv("SWAPMOE_BACKEND", name)
    with pytest.raises(swapmoe.ArgumentError, match=rf"^SWAPMOE_BACKEND: {name} runs outside swapmoe"):
        call(inp, case)


@pytest.mark.parametrize("backend", ["cuda_wgmma_swap", "cuda_wgmma", "cuda_mma", "cuda_bulk_decode"])
@pytest.mark.parametrize("K,N", [(2050, 768), (2048, 770)])
def test_a_forced_backend_refuses_k_and_n_tails_with_a_shape_error(backend, K, N):
    """Issue 5: where a kernel's layout cannot take a K or N tail, forcing it raises ShapeError
    (a ValueError) naming the multiple it needs, not an ArgumentError; the heuristics pick a
    kernel that takes the tail (asked offline: no GPU needed)."""
    with pytest.raises(swapmoe.ShapeError, match=rf"^backend: {backend} cannot run .*multiples of 8 elements") as e:
        swapmoe.select_backend(1, 128, 8, K, N, device_name="NVIDIA H200", backend=backend)
    assert isinstance(e.value, ValueError)
    assert swapmoe.select_backend(1, 128, 8, K, N, device_name="NVIDIA H200").backend == "cuda_decode"


def test_a_forced_backend_refuses_a_dtype_with_a_dtype_error():
    """A 16-bit kernel forced on a float32 call raises DTypeError (a TypeError) naming the dtype."""
    with pytest.raises(swapmoe.DTypeError, match=r"needs bfloat16 or float16, got float32") as e:
        swapmoe.select_backend(4, 128, 8, 2048, 768, dtype="fp32", device_name="NVIDIA H200", backend="cuda_wgmma")
    assert isinstance(e.value, TypeError)


@pytest.mark.parametrize("device", [None, "cpu", "cuda:x", "cuda:-1", "cuda:", "gpu:0", 1.5, True, 2**70, [0], b"cuda"])
def test_warmup_names_a_device_it_cannot_read(device):
    """``warmup(device)`` takes an ordinal, 'cuda[:N]', a torch.device or a CuPy Device; other
    values raise ArgumentError naming ``device`` and the value (not a bare TypeError or
    OverflowError from int())."""
    with pytest.raises(swapmoe.ArgumentError, match=r"^device: expected a CUDA device ordinal \(int\), 'cuda'"):
        swapmoe.warmup(device)


@pytest.mark.parametrize("device, ordinal", [(0, 0), (3, 3), (np.int64(2), 2), ("cuda:1", 1), (" cuda:0 ", 0),
                                             ("cuda", None), (-1, -1)])
def test_warmup_device_forms(device, ordinal):
    from swapmoe import _api
    got = _api.device_ordinal(device)
    if ordinal is None:  # "cuda": torch's current device where torch has CUDA, else 0
        assert got == (torch.cuda.current_device() if torch is not None and torch.cuda.is_available() else 0)
    else:
        assert got == ordinal


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_warmup_takes_a_torch_device():
    from swapmoe import _api
    assert _api.device_ordinal(torch.device("cuda", 2)) == 2
    with pytest.raises(swapmoe.ArgumentError, match=r"^device: .*got device\(type='cpu'\)"):
        swapmoe.warmup(torch.device("cpu"))


@pytest.mark.parametrize("device", [-1, 64])
def test_warmup_blames_device_for_an_ordinal_out_of_range(device):
    with pytest.raises(swapmoe.DeviceError,
                       match=rf"^device: expected a CUDA device ordinal in \[0, 64\), got {device}"):
        swapmoe.warmup(device)


@pytest.mark.parametrize("lib", LIBS)
def test_a_host_buffer_too_large_to_allocate_raises_out_of_memory(lib):
    """Inputs of 2^40 rows through stride-0 views cost nothing, but the output (and the
    router's outputs) the wrappers allocate for them cannot exist: OutOfMemoryError (a
    MemoryError) naming the buffer, not numpy's or torch's own allocation error."""
    rows = 2**40
    x = np.zeros((1, 48), np.float32)
    w1, w2 = np.zeros((4, 16, 48), np.float32), np.zeros((4, 48, 8), np.float32)
    if lib == "numpy":
        wide = lambda a: np.lib.stride_tricks.as_strided(a, (rows, a.shape[1]), (0, a.strides[1]))  # noqa: E731
    else:
        x, w1, w2 = torch.from_numpy(x), torch.from_numpy(w1), torch.from_numpy(w2)
        wide = lambda a: a.expand(rows, a.shape[1])  # noqa: E731
    conv = (lambda a: a) if lib == "numpy" else torch.from_numpy
    tw, ids = conv(np.full((1, 2), 0.5, np.float32)), conv(np.int32([[0, 1]]))
    logits = conv(np.zeros((1, 4), np.float32))
    with pytest.raises(swapmoe.OutOfMemoryError, match=r"^out: expected a host buffer of shape \(1099511627776, 48\)"):
        swapmoe.fused_experts(wide(x), w1, w2, wide(tw), wide(ids))
    with pytest.raises(swapmoe.OutOfMemoryError,
                       match=r"^topk_weights: expected a host buffer of shape \(1099511627776, 2\)"):
        swapmoe.select_experts(wide(logits), 2)
    with pytest.raises(swapmoe.OutOfMemoryError, match=r"^(out|topk_weights): expected a host buffer of shape"):
        swapmoe.fused_moe(wide(x), w1, w2, wide(logits), 2)


@pytest.mark.parametrize("lib", LIBS)
def test_block_shape_as_a_tensor_or_array(lib, rng):
    """A 1-D tensor or array block_shape (as a config may hold it) is read as its list; any
    other non-sequence is named."""
    if lib == "torch" and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("needs torch float8")
    case = Case(3, 4, 2, 128, 128)
    inp = to_inputs(make_problem(rng, case), case, lib, "float32")
    with pytest.raises(swapmoe.ArgumentError,
                       match=r"^block_shape: expected None or a list of integers, got \{128: 1\}"):
        call(inp, case, use_fp8_w8a8=True, block_shape={128: 1})
    as_tensor = np.array([128, 128]) if lib == "numpy" else torch.tensor([128, 128])
    # the tensor passes the argument's conversion: the next error is the float32 weights'
    with pytest.raises(swapmoe.DTypeError, match=r"^w1: expected float8_e4m3fn"):
        call(inp, case, use_fp8_w8a8=True, block_shape=as_tensor)
    two_d = np.array([[128, 128]]) if lib == "numpy" else torch.tensor([[128, 128]])
    with pytest.raises(swapmoe.ArgumentError, match=r"^block_shape: expected None or a list of integers"):
        call(inp, case, use_fp8_w8a8=True, block_shape=two_d)


def test_fused_moe_workspace_bytes_names_a_topk_past_int64():
    x, w1 = np.zeros((2, 48), np.float32), np.zeros((4, 16, 48), np.float32)
    with pytest.raises(swapmoe.ArgumentError, match=r"^topk: expected an integer in"):
        swapmoe.fused_moe_workspace_bytes(x, w1, 2**64)


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_nested_and_storage_less_torch_tensors_are_named(rng):
    """A nested tensor (whose ``.shape`` raises) is a DTypeError naming the argument; a tensor
    DLPack cannot carry (sparse) is too, with torch's first line and its C++ stack left on
    the chained cause."""
    case = Case(5, 8, 2, 40, 48)
    inp = to_inputs(make_problem(rng, case), case, "torch", "float32")
    nested = torch.nested.nested_tensor([inp["x"][0], inp["x"][1]])
    logits = torch.zeros(5, 8)
    with pytest.raises(swapmoe.DTypeError, match=r"^hidden_states: expected a dense \(strided\) tensor, got a nested"):
        swapmoe.fused_experts(nested, inp["w1"], inp["w2"], inp["tw"], inp["ids"])
    with pytest.raises(swapmoe.DTypeError, match=r"^gating_output: expected a dense \(strided\) tensor"):
        swapmoe.select_experts(torch.nested.nested_tensor([logits[0], logits[1]]), 2)
    with pytest.raises(swapmoe.DTypeError, match=r"^gating_output: expected a dense \(strided\) tensor"):
        swapmoe.fused_moe(inp["x"], inp["w1"], inp["w2"], torch.nested.nested_tensor([logits[0]] * 5), 2)
    with pytest.raises(swapmoe.DTypeError, match=r"^w1: the tensor could not be imported through DLPack") as e:
        swapmoe.fused_experts(inp["x"], inp["w1"].to_sparse(), inp["w2"], inp["tw"], inp["ids"])
    assert "\n" not in str(e.value) and "frame #" not in str(e.value)
    assert e.value.__cause__ is not None


@pytest.mark.parametrize("lib", LIBS)
def test_fused_moe_out_may_not_overlap_the_routers_inputs(lib, rng):
    """fused_moe's out follows fused_experts' rule (hidden_states, no other input): memory
    shared with gating_output or e_score_correction_bias is a ShapeError naming it, before
    anything runs; out = hidden_states stays allowed."""
    case = Case(5, 8, 2, 40, 48)
    inp = to_inputs(make_problem(rng, case), case, lib, "float32")
    conv = (lambda a: a) if lib == "numpy" else torch.from_numpy
    buf = conv(np.zeros((case.M, case.K), np.float32))
    logits = buf[:, : case.E]  # the router's logits inside out's memory
    with pytest.raises(swapmoe.ShapeError, match=r"^out: expected memory that does not overlap gating_output"):
        swapmoe.fused_moe(inp["x"], inp["w1"], inp["w2"], logits, 2, out=buf)
    bias = buf[0, : case.E]
    g = conv(rng.standard_normal((case.M, case.E), dtype=np.float32))
    with pytest.raises(swapmoe.ShapeError, match=r"^out: expected memory that does not overlap e_score_correction_bias"):
        swapmoe.fused_moe(inp["x"], inp["w1"], inp["w2"], g, 2, out=buf, scoring="sigmoid", num_expert_group=2,
                          topk_group=1, e_score_correction_bias=bias)
    assert float(np.abs(np.asarray(buf)).max()) == 0.0, "nothing may be written before the error"
    x = inp["x"]
    want = swapmoe.fused_moe(x, inp["w1"], inp["w2"], g, 2)
    assert swapmoe.fused_moe(x, inp["w1"], inp["w2"], g, 2, out=x) is x
    assert same_bits(want, x)


# --------------------------------------------------------------------------- random malformed calls

_FUZZ_DTYPES = ("float32", "bfloat16", "float16", "float64", "int32", "int64", "int8", "uint8", "bool",
                "float8_e4m3fn")


def _fuzz_call(r):
    """One call of fused_experts or fused_moe (torch CPU tensors, some as numpy) on a small
    problem where each argument may be malformed: a wrong shape, dtype or layout, None, a list,
    an out-of-range id or map entry, a bad scalar. Returns (what, hidden_states, call)."""

    def shape(base):
        u = r.random()
        if u < 0.92:
            return base
        if u < 0.94:
            return base[:-1]
        if u < 0.96:
            return base + (r.choice([1, 2]),)
        return tuple(max(0, b + r.choice([-1, 1, 5])) for b in base)

    def tensor(base, dtype):
        dtype = dtype if r.random() < 0.95 else r.choice(_FUZZ_DTYPES)
        s = shape(base)
        t = getattr(torch, dtype)
        if t.is_floating_point:
            return torch.randn(s).to(t)
        if t == torch.bool:
            return torch.rand(s) > 0.5
        return torch.randint(-2, 10, s).to(t)

    def odd(t):
        u = r.random()
        if u < 0.015:
            return None
        if u < 0.03:
            return [1, 2]
        if t.dim() >= 2 and u < 0.045:
            return t.transpose(-1, -2)
        if t.dim() >= 1 and t.shape[-1] > 1 and u < 0.06:
            return t[..., ::2]
        if u < 0.08 and t.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
            return t.numpy()
        return t

    M, E, K, N = r.choice([0, 1, 3, 5]), r.choice([1, 2, 4, 8]), r.choice([8, 16, 24]), r.choice([8, 16])
    topk = r.randint(1, min(E, 3)) if r.random() < 0.95 else E + 1
    act_dtype = r.choice(["float32", "bfloat16", "float16"])
    fp8 = r.random() < 0.3
    w_dtype = "float8_e4m3fn" if fp8 else act_dtype
    x, w1, w2 = tensor((M, K), act_dtype), tensor((E, 2 * N, K), w_dtype), tensor((E, K, N), w_dtype)
    kw = {}
    if r.random() < 0.2:
        kw["expert_map"] = odd(torch.randint(-1, E, shape((E + 1,)), dtype=torch.int32))
        kw["global_num_experts"] = r.choice([-1, E + 1]) if r.random() < 0.9 else r.choice([E, 0, -5])
    if r.random() < 0.1:
        kw["activation"] = r.choice(["silu", "gelu", "relu", "", None, 3])
    if r.random() < 0.1:
        kw["apply_router_weight_on_input"] = r.choice([True, False, True, 1, "yes"])
    if r.random() < 0.1:
        kw["out"] = odd(tensor((M, K), act_dtype))
    if fp8:
        kw["use_fp8_w8a8"] = True
        scheme = r.choice(["tensor", "channel", "block"])
        if scheme == "tensor":
            kw["w1_scale"], kw["w2_scale"] = odd(tensor((E,), "float32")), odd(tensor((E,), "float32"))
            if r.random() < 0.5:
                kw["a1_scale"], kw["a2_scale"] = odd(tensor((1,), "float32")), odd(tensor((), "float32"))
        elif scheme == "channel":
            kw["per_channel_quant"] = True
            kw["w1_scale"], kw["w2_scale"] = odd(tensor((E, 2 * N), "float32")), odd(tensor((E, K), "float32"))
        else:
            kw["block_shape"] = r.choice([[128, 128], [64, 64], [128], None, [0, 128], [-1, 5]])
            kw["w1_scale"], kw["w2_scale"] = odd(tensor((E, 1, 1), "float32")), odd(tensor((E, 1, 1), "float32"))
    if r.random() < 0.3:
        kw.update(renormalize=r.choice([True, False]), scoring=r.choice(["softmax", "sigmoid"]))
        if r.random() < 0.3:  # grouped top-k, the groups dividing E
            kw["num_expert_group"] = r.choice([g for g in (1, 2, 4) if E % g == 0])
            kw["topk_group"] = r.randint(1, kw["num_expert_group"])
        if r.random() < 0.1:
            kw.update(r.choice([{"scoring": "tanh"}, {"num_expert_group": 3, "topk_group": 1},
                                {"num_expert_group": 0}, {"topk_group": 2}, {"routed_scaling_factor": float("nan")},
                                {"routed_scaling_factor": -1.0}, {"routed_scaling_factor": 2.5}]))
        if r.random() < 0.3:
            kw["e_score_correction_bias"] = odd(tensor((E,), "float32"))
        logits = odd(tensor((M, E + 1 if "expert_map" in kw else E), "float32"))
        k = topk if r.random() < 0.9 else r.choice([0, E + 1, -1])
        args = (odd(x), odd(w1), odd(w2), logits, k)
        return "fused_moe", args[0], lambda: swapmoe.fused_moe(*args, **kw)
    tw = odd(tensor((M, topk), "float32"))
    ids = odd(torch.randint(-1, E + 1, shape((M, topk))).to(getattr(torch, r.choice(["int32", "int32", "int64"]))))
    if r.random() < 0.05:
        kw["check_ids"] = True
    args = (odd(x), odd(w1), odd(w2), tw, ids)
    return "fused_experts", args[0], lambda: swapmoe.fused_experts(*args, **kw)


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.parametrize("seed", range(4))
def test_random_malformed_calls_raise_only_swapmoe_errors(seed):
    """Nothing reachable from Python raises anything but a swapmoe.Error (or returns): 150
    random calls per seed of fused_experts and fused_moe on the CPU, each argument possibly
    malformed (shape, dtype, layout, None, a list, bad ids, maps, scales, scalars). Some
    calls must get through (the draw is not all errors), with an output of hidden_states'
    shape and dtype, and some must be refused."""
    import random

    r = random.Random(seed)
    torch.manual_seed(seed)  # the tensors' values, so that a failure repeats
    outcomes = {"returned": 0, "refused": 0}
    for i in range(150):
        what, x, run = _fuzz_call(r)
        try:
            got = run()
        except swapmoe.Error:
            outcomes["refused"] += 1
        except BaseException as e:  # a panic, an IndexError, a torch error...
            raise AssertionError(f"seed {seed}, call {i} ({what}) raised {type(e).__name__}: {e}") from e
        else:
            outcomes["returned"] += 1
            assert tuple(got.shape) == tuple(x.shape) and got.dtype == x.dtype, (seed, i, what, got.shape, x.shape)
    assert outcomes["returned"] >= 10 and outcomes["refused"] >= 10, outcomes
