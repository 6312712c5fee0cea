"""Shared helpers for the swapmoe test suite.

- Every test gets its own RNG, seeded from a hash of its node id: each parameter
  combination sees fresh random inputs (never zeros), reproducibly from run to run.
- ``Case`` describes one problem (shapes, routing, layout, output mode); ``make_problem``
  draws its float32/int master arrays; ``to_inputs`` turns them into numpy or torch
  tensors of a dtype, on a device, contiguous or with padded (non-contiguous but valid)
  layouts whose padding is NaN, so that a read out of bounds shows up in the output.
- ``run_case`` calls ``swapmoe.fused_experts`` and checks the result against the
  float64 reference (``swapmoe.reference``): dtype, shape, no NaN, relative error, that
  the inputs are untouched and that nothing is written outside ``out``.
- ``poison`` makes a NaN-filled output buffer so an unwritten element fails the test.
- Tests marked ``gpu`` are skipped when torch sees no CUDA device.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import math
import os
import threading
from typing import Any, Optional


def _cpu_share_per_xdist_worker() -> Optional[int]:
    """Under pytest-xdist (the device runs use ``-n 10-16`` on 16 CPUs), each worker's
    OpenMP / BLAS pools default to every CPU: 16 workers x 16 threads spin against each other.
    Each worker gets its share of the CPUs instead; set before numpy and torch load their
    pools (an explicit ``OMP_NUM_THREADS`` etc. is kept). On the H200 host (2026-12-05) the
    FP8 GPU file's ~740 non-serial tests then passed in 113 s under 16 workers; before, they
    did not finish in 330-375 s. (Its N256 block-run cases were slow for another reason: the
    float64 reference's per-slot products, since grouped by expert.)"""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers <= 1:
        return None
    share = max(1, (os.cpu_count() or 1) // workers)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(share))
    return share


_XDIST_CPU_SHARE = _cpu_share_per_xdist_worker()

import numpy as np  # noqa: E402  (after the thread counts above)
import pytest  # noqa: E402

import swapmoe
from swapmoe.reference import fused_experts_ref, rel_error

try:  # torch is optional: the numpy tests run without it.
    import torch
except ImportError:  # pragma: no cover - the CI venv has torch
    torch = None  # type: ignore[assignment]
if torch is not None and _XDIST_CPU_SHARE is not None:
    torch.set_num_threads(_XDIST_CPU_SHARE)  # its pool may have started before the variables


# --------------------------------------------------------------------------- devices


def has_cuda() -> bool:
    return torch is not None and torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


requires_torch = pytest.mark.skipif(torch is None, reason="needs torch")


# --------------------------------------------------------------------------- seeding


def seed_for(nodeid: str) -> int:
    """A 63-bit seed from a test's node id (its parameters included)."""
    digest = hashlib.blake2b(nodeid.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@pytest.fixture
def seed(request) -> int:
    return seed_for(request.node.nodeid)


@pytest.fixture
def rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------- dtypes

TOLERANCE = {"float32": 1e-5, "float16": 3e-3, "bfloat16": 1e-2}

NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64}


def torch_dtype(name: str):
    return getattr(torch, name)


def dtype_name(t: Any) -> str:
    """'float32', 'bfloat16', ... for numpy arrays and torch tensors."""
    if torch is not None and isinstance(t, torch.Tensor):
        return str(t.dtype).replace("torch.", "")
    return np.dtype(t.dtype).name


def to_f64(t: Any) -> np.ndarray:
    """A float64 numpy copy of a numpy array or torch tensor (any device)."""
    if torch is not None and isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def to_i64(t: Any) -> np.ndarray:
    if torch is not None and isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.int64).numpy()
    return np.asarray(t, dtype=np.int64)


def snapshot(t: Any) -> np.ndarray:
    """A host copy of t's values (bitwise; for 'unchanged' checks)."""
    if torch is not None and isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().copy()
        return t.numpy().copy()
    return np.array(t, copy=True)


def elem_strides(t: Any) -> tuple:
    """Strides in elements (numpy's are in bytes)."""
    if torch is not None and isinstance(t, torch.Tensor):
        return tuple(t.stride())
    return tuple(s // t.itemsize for s in t.strides)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (NaN == NaN when the bits agree)."""
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# --------------------------------------------------------------------------- problems


@dataclasses.dataclass(frozen=True)
class Case:
    M: int
    E: int
    topk: int
    N: int
    K: int
    act: str = "silu"
    # uniform: distinct experts per row over all global experts;
    # concentrated: every row picks from a few hot experts (most experts get no tokens);
    # invalid: some ids are -1, < -1 or >= global_num_experts;
    # dup: ids drawn with replacement (an expert may appear twice in a row);
    # none: every id is -1;
    # tile_edges: each of E = 16 experts gets a count of TILE_EDGE_COUNTS (0, 1, and both sides
    # of 64, 128, 192 and 256), so M * topk must be their sum (1994: M = 997 at topk = 2).
    ids: str = "uniform"
    ep: bool = False  # expert_map [global_E] with -1 entries, global_E > E
    id_dtype: str = "int32"
    tw_dtype: str = "float32"
    # strided: every operand a padded, offset view (16-byte aligned rows);
    # misaligned: odd paddings and offsets, so rows and addresses are not 16-byte aligned
    layout: str = "contiguous"
    out: str = "none"  # none | poison | inplace
    on_input: bool = False  # apply_router_weight_on_input (topk == 1)

    def __post_init__(self):
        assert self.topk <= self.E or self.ep, self
        assert not self.on_input or self.topk == 1, self

    @property
    def id(self) -> str:
        parts = [f"M{self.M}", f"E{self.E}", f"k{self.topk}", f"N{self.N}", f"K{self.K}", self.act, self.ids]
        if self.ep:
            parts.append("ep")
        parts.append(self.id_dtype)
        if self.tw_dtype != "float32":
            parts.append(f"tw_{self.tw_dtype}")
        if self.layout != "contiguous":
            parts.append(self.layout)
        if self.out != "none":
            parts.append(f"out_{self.out}")
        if self.on_input:
            parts.append("on_input")
        return "-".join(parts)

    @property
    def global_experts(self) -> int:
        return 2 * self.E + 1 if self.ep else self.E


def _distinct_rows(rng: np.random.Generator, rows: int, pool: np.ndarray, topk: int) -> np.ndarray:
    """rows x topk ids, distinct within each row, drawn from pool."""
    order = np.argsort(rng.random((rows, len(pool))), axis=1)[:, :topk]
    return pool[order]


def make_expert_map(rng: np.random.Generator, case: Case) -> np.ndarray:
    """[global_E] int32: E (or E-1) random global ids map to a permutation of the local
    experts, every other entry is -1."""
    G, E = case.global_experts, case.E
    mapped = E if E <= case.topk else E - 1  # leave one local expert unreachable
    emap = np.full(G, -1, dtype=np.int32)
    globals_ = rng.permutation(G)[:mapped]
    emap[globals_] = rng.permutation(E)[:mapped]
    return emap


def make_ids(rng: np.random.Generator, case: Case, emap: Optional[np.ndarray]) -> np.ndarray:
    ids = _make_ids(rng, case, emap)
    if emap is not None and case.ids != "none" and case.M > 0:
        # row 0 reaches at least one local expert, so the expected output is not all zeros
        if not any(0 <= g < len(emap) and emap[g] >= 0 for g in ids[0]):
            ids[0, 0] = rng.choice(np.flatnonzero(emap >= 0))
    return ids


# Tokens per expert on both sides of the token tiles' edges (ids="tile_edges"): at token tile
# 128 an expert's last tile may hold rows for one consumer warpgroup of the wgmma GEMMs or
# for both, and an expert may end exactly on a tile.
TILE_EDGE_COUNTS = (0, 1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 3, 70)


def _make_ids(rng: np.random.Generator, case: Case, emap: Optional[np.ndarray]) -> np.ndarray:
    M, k, G = case.M, case.topk, case.global_experts
    if case.ids == "none":
        return np.full((M, k), -1, dtype=np.int64)
    if case.ids == "tile_edges":
        assert G == len(TILE_EDGE_COUNTS) and M * k == sum(TILE_EDGE_COUNTS) and emap is None, case
        # each expert's slots are a run of < M, so slots s and s + M (one row) differ in expert
        slots = np.repeat(rng.permutation(G), TILE_EDGE_COUNTS)
        return slots.reshape(k, M).T[rng.permutation(M)].astype(np.int64)
    if case.ids == "dup":
        return rng.integers(0, G, size=(M, k)).astype(np.int64)
    if case.ids == "concentrated":
        pool = np.flatnonzero(emap >= 0) if emap is not None else np.arange(G)
        hot = rng.choice(pool, size=min(len(pool), max(k, 3)), replace=False)
        return _distinct_rows(rng, M, hot, k).astype(np.int64)
    ids = _distinct_rows(rng, M, np.arange(G), k).astype(np.int64)
    if case.ids == "uniform":
        return ids
    assert case.ids == "invalid", case.ids
    bad = [-1, -1, -5, G, G + 7, 2**31 - 1, -(2**31)]
    if case.id_dtype == "int64":
        # would alias valid experts if the op truncated ids to 32 bits
        bad += [2**32, 2**32 + 1, -(2**32) + 1, 2**40 + G // 2]
    mask = rng.random((M, k)) < 0.35
    mask[0, 0] = False  # keep at least one valid id
    ids[mask] = rng.choice(np.array(bad, dtype=np.int64), size=int(mask.sum()))
    # and every kind of bad id at least once, where there is room
    flat = ids.reshape(-1)
    for i, v in enumerate(bad[: flat.size - 1]):
        flat[i + 1] = v
    return ids


def make_problem(rng: np.random.Generator, case: Case) -> dict:
    """float32 master arrays (weights ~ 1/sqrt(fan-in) so outputs are O(1)) and int ids."""
    M, E, N, K, k = case.M, case.E, case.N, case.K, case.topk
    emap = make_expert_map(rng, case) if case.ep else None
    return dict(
        x=rng.standard_normal((M, K), dtype=np.float32),
        w1=(rng.standard_normal((E, 2 * N, K), dtype=np.float32) / np.float32(math.sqrt(K))),
        w2=(rng.standard_normal((E, K, N), dtype=np.float32) / np.float32(math.sqrt(N))),
        tw=rng.uniform(0.1, 1.0, size=(M, k)).astype(np.float32),
        ids=make_ids(rng, case, emap),
        expert_map=emap,
    )


# --------------------------------------------------------------------------- tensors


def convert(a: np.ndarray, lib: str, dtype: str, device: str = "cpu"):
    if lib == "numpy":
        return np.ascontiguousarray(a.astype(NP_DTYPES[dtype]))
    # torch.empty gives torch's own compact strides (torch.from_numpy keeps numpy's,
    # which are (0, 0) for empty arrays).
    out = torch.empty(a.shape, dtype=torch_dtype(dtype), device=device)
    return out.copy_(torch.from_numpy(np.ascontiguousarray(a)))


def embed(a, before, after, fill):
    """Copy a into a bigger buffer (padded by before/after elements per dimension, filled
    with fill) and return (view, buffer): the view has a's values and shape, a byte
    offset and larger strides."""
    shape = tuple(s + b + e for s, b, e in zip(a.shape, before, after))
    if torch is not None and isinstance(a, torch.Tensor):
        buf = torch.full(shape, fill, dtype=a.dtype, device=a.device)
    else:
        buf = np.full(shape, fill, dtype=a.dtype)
    view = buf[tuple(slice(b, b + s) for b, s in zip(before, a.shape))]
    view[...] = a
    return view, buf


# padding per operand for the non-contiguous layouts: (before, after) per dimension.
STRIDED_PADS = {
    "x": ((1, 0), (2, 16)),  # row stride K+16, offset by a row
    "w1": ((1, 0, 0), (2, 2, 8)),  # a slice along dim 0 of a bigger tensor, padded rows
    "w2": ((2, 0, 0), (1, 0, 5)),
    "tw": ((1, 0), (0, 3)),
    "ids": ((0, 0), (1, 3)),
    "out": ((0, 0), (3, 4)),
    "expert_map": ((1,), (2,)),  # offset only (its one dimension must be contiguous)
}
MISALIGNED_PADS = {
    "x": ((1, 1), (0, 2)),  # starts one element in: address not 16-byte aligned
    "w1": ((0, 0, 1), (1, 1, 2)),  # row stride K+3
    "w2": ((1, 0, 1), (0, 0, 0)),  # row stride N+1
    "tw": ((0, 1), (0, 0)),
    "ids": ((0, 1), (0, 0)),
    "out": ((0, 1), (1, 2)),
    "expert_map": ((1,), (0,)),
}
PADS = {"strided": STRIDED_PADS, "misaligned": MISALIGNED_PADS}
STRIDED_FILL = {"x": math.nan, "w1": math.nan, "w2": math.nan, "tw": math.nan, "out": math.nan, "ids": 0, "expert_map": 0}


def to_inputs(prob: dict, case: Case, lib: str, dtype: str, device: str = "cpu") -> dict:
    """The call's tensors: x, w1, w2, tw, ids, expert_map, plus 'buffers' (name ->
    padded backing buffer, for the non-contiguous layouts)."""
    tw_dtype = case.tw_dtype
    if lib == "numpy" and tw_dtype == "bfloat16":
        tw_dtype = "float16"  # numpy has no bfloat16
    t = dict(
        x=convert(prob["x"], lib, dtype, device),
        w1=convert(prob["w1"], lib, dtype, device),
        w2=convert(prob["w2"], lib, dtype, device),
        tw=convert(prob["tw"], lib, tw_dtype, device),
        ids=convert(prob["ids"], lib, case.id_dtype, device),
        expert_map=None if prob["expert_map"] is None else convert(prob["expert_map"], lib, "int32", device),
    )
    buffers = {}
    if case.layout in PADS:
        for name in ("x", "w1", "w2", "tw", "ids", "expert_map"):
            if t[name] is None:
                continue
            before, after = PADS[case.layout][name]
            t[name], buffers[name] = embed(t[name], before, after, STRIDED_FILL[name])
        # really strided (not just offset): rows of x, w1, w2, tw, ids are padded
        for name in ("x", "w1", "w2", "tw", "ids"):
            assert elem_strides(t[name])[-2] > t[name].shape[-1], (name, elem_strides(t[name]))
    else:
        assert case.layout == "contiguous", case.layout
    t["buffers"] = buffers
    return t


def poison(like, *, layout: str = "contiguous"):
    """A NaN-filled output buffer with like's shape, dtype and device (pass as out=).
    For a non-contiguous layout returns (view, buffer): a padded view whose padding is
    NaN too."""
    if torch is not None and isinstance(like, torch.Tensor):
        out = torch.full(tuple(like.shape), math.nan, dtype=like.dtype, device=like.device)
    else:
        out = np.full(like.shape, np.nan, dtype=like.dtype)
    if layout not in PADS:
        return out
    before, after = PADS[layout]["out"]
    return embed(out, before, after, math.nan)


def reference(inp: dict, case: Case) -> np.ndarray:
    """float64 reference from the tensors as the op sees them (after dtype rounding)."""
    emap = inp["expert_map"]
    return fused_experts_ref(
        to_f64(inp["x"]),
        to_f64(inp["w1"]),
        to_f64(inp["w2"]),
        to_f64(inp["tw"]),
        to_i64(inp["ids"]),
        activation=case.act,
        apply_router_weight_on_input=case.on_input,
        expert_map=None if emap is None else to_i64(emap),
    )


def call(inp: dict, case: Case, **kw):
    kwargs = dict(activation=case.act, apply_router_weight_on_input=case.on_input)
    if inp["expert_map"] is not None:
        kwargs["expert_map"] = inp["expert_map"]
    kwargs.update(kw)
    return swapmoe.fused_experts(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"], **kwargs)


def junk_workspace(inp: dict, quant: Optional[str] = None):
    """A CUDA workspace of the call's size (``swapmoe.workspace_bytes``) full of 0xFF bytes
    (e4m3 and bf16 NaN, -1 as an int32): a kernel that reads a workspace element before writing
    it, or trusts one a previous call left, shows up in the output."""
    nbytes = swapmoe.workspace_bytes(inp["x"], inp["w1"], inp["ids"], quant)
    return torch.full((max(nbytes, 1),), 0xFF, dtype=torch.uint8, device=inp["x"].device)


def call_with_workspace(inp: dict, case: Case, workspace, out, **kw):
    """The op through the core with the caller's workspace and output (torch CUDA tensors),
    on torch's current stream, so that a test decides what the workspace holds."""
    kwargs = dict(activation=case.act, apply_router_weight_on_input=case.on_input)
    if inp["expert_map"] is not None:
        kwargs["expert_map"] = inp["expert_map"]
    kwargs.update(kw)
    swapmoe._core.fused_experts(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"], out, workspace=workspace,
                                stream=torch.cuda.current_stream().cuda_stream, **kwargs)
    return out


# Calls that must run back to back are queued while the stream waits on a host flag: queueing
# a call from Python takes tens of µs, longer than a small call runs, so otherwise the GPU
# idles between the calls and no kernel ever overlaps the one before (NOTES "A long
# predecessor": the back-to-back tests passed a planted missing wait for this reason). A spin
# kernel instead of the flag would set a time limit on the queueing, which 16 test processes
# sharing a CPU overran (10 ms, NOTES "A long predecessor").
QUEUE_WATCHDOG_S = 20.0


def libcuda():
    """The CUDA driver library (ctypes), for the tests that look at driver state."""
    return ctypes.CDLL("libcuda.so.1")


def current_cuda_context() -> int:
    """The thread's current CUDA context (cuCtxGetCurrent) as an integer; 0: none."""
    ctx = ctypes.c_void_p()
    assert libcuda().cuCtxGetCurrent(ctypes.byref(ctx)) == 0
    return ctx.value or 0


def _gate_stream(stream: int):
    """Makes ``stream`` wait (cuStreamWaitValue32) until a pinned host int32 becomes 1.
    Returns the flag, a pinned CPU tensor (set [0] = 1 to open), or None where the driver
    refuses."""
    lib = libcuda()
    if not (hasattr(lib, "cuMemHostGetDevicePointer_v2") and hasattr(lib, "cuStreamWaitValue32_v2")):
        return None
    flag = torch.zeros(1, dtype=torch.int32).pin_memory()
    lib.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    lib.cuStreamWaitValue32_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    dptr = ctypes.c_uint64()
    if lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), flag.data_ptr(), 0) != 0:
        return None
    if lib.cuStreamWaitValue32_v2(stream, dptr.value, 1, 0) != 0:  # 0: CU_STREAM_WAIT_VALUE_GEQ
        return None
    return flag


@contextlib.contextmanager
def queued_ahead_of_the_gpu():
    """The calls queued in the block (on torch's current stream) run back to back on the GPU:
    the stream waits on a host flag (``_gate_stream``) that the block sets once they are all
    queued. A call that waited for the device inside the block would wait for ever: a
    watchdog sets the flag after QUEUE_WATCHDOG_S and the block then fails (swapmoe's core and
    torch let the GIL go while they wait, so the watchdog runs). Where the driver refuses the
    wait, a ~0.1 s spin kernel stands in, and the block fails if it ended before the last call
    was queued (then some ran alone, and the test could not fail)."""
    # module loads synchronize the device: done before the stream is held
    swapmoe.warmup(torch.cuda.current_device())
    torch.cuda.synchronize()
    gate = _gate_stream(torch.cuda.current_stream().cuda_stream)
    if gate is None:
        torch.cuda._sleep(200_000_000)
        spun = torch.cuda.Event()
        spun.record()
        yield
        assert not spun.query(), "the spin kernel ended before the calls were queued"
        torch.cuda.synchronize()
        return
    fired = threading.Event()

    def watchdog():
        fired.set()
        gate[0] = 1

    timer = threading.Timer(QUEUE_WATCHDOG_S, watchdog)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        gate[0] = 1
        torch.cuda.synchronize()
    assert not fired.is_set(), f"a call waited for the device while the stream was held (> {QUEUE_WATCHDOG_S} s)"


def queued_reruns(inp: dict, case: Case, n: int, quant: Optional[str] = None, **kw) -> list:
    """``n`` calls of the op queued back to back (queued_ahead_of_the_gpu), so that each kernel
    launched by PDL overlaps the one before it, each on its own 0xFF workspace (``quant``'s
    size, junk_workspace) and NaN output; ``kw`` goes to call_with_workspace. Returns the
    outputs' snapshots."""
    bufs = [(junk_workspace(inp, quant), poison(inp["x"])) for _ in range(n)]
    with queued_ahead_of_the_gpu():
        for workspace, out in bufs:
            call_with_workspace(inp, case, workspace, out, **kw)
    return [snapshot(out) for _, out in bufs]


def chain_three(inp: dict, step) -> list:
    """Three calls queued back to back, each on the previous one's output: ``step(inp, out)``
    runs the op on ``inp`` into ``out``. The outputs (NaN until written) are allocated first,
    the calls are warmed up (module loads synchronize the device), nothing else is queued
    between them, and they are queued ahead of the GPU (queued_ahead_of_the_gpu), so each
    call's first kernel follows the previous call's last one directly (with PDL, possibly
    before it ends). Returns [x, y1, y2, y3]."""
    outs = [poison(inp["x"]) for _ in range(3)]
    step(inp, poison(inp["x"]))  # warm-up
    xs = [inp["x"]]
    with queued_ahead_of_the_gpu():
        for out in outs:
            xs.append(step(dict(inp, x=xs[-1]), out))
    return xs


# The long call of chain_after_long_call: one expert of intermediate size LONG_CALL_N, every
# token routed to it, on cuda_wgmma_swap. Its GEMM2 lets its dependents start as it begins
# (sm90_swap_decode.cu) and then streams 128 x LONG_CALL_N weights per CTA on a few SMs (one
# CTA per 128 output columns), so the next call's first kernel runs on idle SMs tens of µs
# before the long call writes its output: a window of tens of µs, where chain_three's short
# calls leave a few µs (NOTES "A long predecessor").
LONG_CALL_N = 16384
# What the long call must take alone on the GPU (queued ahead of it, so that the host's
# queueing does not count) for the overlap to be there: it measured 39, 42.5 and 51 µs at
# K = 128, 256 and 512 on an H100, the next call's first kernel starting a few µs after the
# long call's GEMM2 does (NOTES "A long predecessor").
LONG_CALL_MIN_US = 20.0


def _long_call_inputs(x, rng: np.random.Generator) -> tuple:
    M, K = x.shape
    case = Case(M, 1, 1, LONG_CALL_N, K)
    gen = torch.Generator(device=x.device).manual_seed(int(rng.integers(2**31)))
    dev = x.device

    def weights(shape, fan_in):
        w = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32) / math.sqrt(fan_in)
        return w.to(x.dtype)

    inp = dict(
        x=x,
        w1=weights((1, 2 * LONG_CALL_N, K), K),
        w2=weights((1, K, LONG_CALL_N), LONG_CALL_N),
        tw=torch.rand((M, 1), generator=gen, device=dev, dtype=torch.float32) * 0.9 + 0.1,
        ids=torch.zeros((M, 1), dtype=torch.int32, device=dev),
        expert_map=None,
    )
    return inp, case


def chain_after_long_call(inp: dict, step, rng: np.random.Generator) -> tuple:
    """The call under test, ``step(inp, out)``, queued right after a long bf16 call on
    cuda_wgmma_swap (sm_90 only) whose output is its input x: a first kernel that reads x, or
    rewrites a workspace block the long call still reads, before its griddepcontrol.wait gets
    NaN (the long call's output until written) or corrupts the long call's output. Both calls
    are warmed up first (a first call loads modules, which synchronizes the device and would
    hide the race) and the long call is timed alone, so that the test fails when it is too
    short to overlap anything. Returns (long_inp, long_case, long_out, out): check both
    outputs against their references (the long call's input is inp["x"]; the call under test's
    is long_out)."""
    long_inp, long_case = _long_call_inputs(inp["x"], rng)
    long_out = poison(inp["x"])
    out = poison(inp["x"])

    def long_call(o):
        return call(long_inp, long_case, out=o, backend="cuda_wgmma_swap")

    step(inp, poison(inp["x"]))  # warm-up: module loads, allocator blocks
    timed_out = poison(inp["x"])
    long_call(timed_out)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with queued_ahead_of_the_gpu():  # GPU time only: the queueing does not count
        start.record()
        long_call(timed_out)
        end.record()
    torch.cuda.synchronize()
    took_us = start.elapsed_time(end) * 1e3
    assert took_us >= LONG_CALL_MIN_US, f"the long call took {took_us:.1f} µs: too short to overlap the next call"
    with queued_ahead_of_the_gpu():
        long_call(long_out)
        step(dict(inp, x=long_out), out)  # nothing between the two calls on the stream
    return long_inp, long_case, long_out, out


def check_close(out, ref: np.ndarray, dtype: str, *, what: str = "") -> float:
    """Shape, dtype, no NaN/inf, and relative error within the dtype's tolerance."""
    assert tuple(out.shape) == ref.shape, (tuple(out.shape), ref.shape)
    assert dtype_name(out) == dtype, (dtype_name(out), dtype)
    o = to_f64(out)
    assert np.isfinite(o).all(), f"{what}: non-finite output at {np.argwhere(~np.isfinite(o))[:5].tolist()}"
    err = rel_error(o, ref)
    assert err <= TOLERANCE[dtype], f"{what}: rel_error {err:.3g} > {TOLERANCE[dtype]} ({dtype})"
    check_rows(o, ref, dtype, what=what)
    return err


# Per-row bound, as a multiple of the dtype's tolerance. The whole-output error of a large
# problem hides one wrong row: one slot dropped out of 1200-3000 tokens (an off-by-one at a
# tile edge) moves the bf16 error below 1e-2 in about half the draws. A row's own error is
# its output's rounding (2^-9 for bf16), far below this bound.
ROW_TOLERANCE_FACTOR = 5


def check_rows(o: np.ndarray, ref: np.ndarray, dtype: str, *, what: str = "") -> None:
    """Each row's relative error within ROW_TOLERANCE_FACTOR x the dtype's tolerance; a row
    whose reference is much smaller than the typical row (or zero) is measured against a tenth
    of the typical row norm instead, so that its rounding does not count as relative error."""
    if ref.ndim != 2 or ref.shape[0] < 2 or not np.isfinite(ref).all():
        return
    norms = np.linalg.norm(ref, axis=1)
    typical = float(np.sqrt(np.mean(norms**2)))
    if typical == 0.0:
        return
    row_err = np.linalg.norm(o - ref, axis=1) / np.maximum(norms, 0.1 * typical)
    worst = int(np.argmax(row_err))
    bound = ROW_TOLERANCE_FACTOR * TOLERANCE[dtype]
    assert row_err[worst] <= bound, f"{what}: row {worst} rel_error {row_err[worst]:.3g} > {bound:.3g} ({dtype})"


def run_case(case: Case, lib: str, dtype: str, rng: np.random.Generator, device: str = "cpu", **kw):
    """Builds the case, calls the op and checks everything. Returns (out, ref, inputs)."""
    prob = make_problem(rng, case)
    inp = to_inputs(prob, case, lib, dtype, device)
    ref = reference(inp, case)
    if case.ids == "none":
        assert not ref.any()
    elif case.M > 0 and not np.isnan(ref).any():
        assert np.linalg.norm(ref) > 0, "degenerate case: the reference is all zeros"

    before = {n: snapshot(inp[n]) for n in ("x", "w1", "w2", "tw", "ids")}
    buffers_before = {n: snapshot(b) for n, b in inp["buffers"].items()}
    out_buf = None
    if case.out == "none":
        out = call(inp, case, **kw)
        if lib == "numpy":
            assert isinstance(out, np.ndarray)
        else:
            assert isinstance(out, torch.Tensor) and out.device == inp["x"].device
    elif case.out == "poison":
        if case.layout in PADS:
            given, out_buf = poison(inp["x"], layout=case.layout)
        else:
            given = poison(inp["x"])
        out = call(inp, case, out=given, **kw)
        assert out is given, "fused_experts must return the out= tensor it was given"
    else:
        assert case.out == "inplace", case.out
        out = call(inp, case, out=inp["x"], **kw)
        assert out is inp["x"]

    if device != "cpu":
        torch.cuda.synchronize()
    check_close(out, ref, dtype, what=case.id)

    # Inputs untouched (except hidden_states when it is the output).
    for name, old in before.items():
        if name == "x" and case.out == "inplace":
            continue
        assert same_bits(snapshot(inp[name]), old), f"{name} was modified"
    # Nothing written outside the views: the padding of every buffer is as it was.
    for name, buf in inp["buffers"].items():
        old = buffers_before[name]
        new = snapshot(buf)
        if name == "x" and case.out == "inplace":
            view = tuple(slice(b, b + s) for b, s in zip(PADS[case.layout]["x"][0], inp["x"].shape))
            new[view] = old[view]
        assert same_bits(new, old), f"{name}: padding around the view was modified"
    if out_buf is not None:
        pad = to_f64(out_buf)
        offset = PADS[case.layout]["out"][0]
        pad[tuple(slice(b, b + s) for b, s in zip(offset, out.shape))] = np.nan
        assert np.isnan(pad).all(), "out: elements outside the [M, K] view were written"
    return out, ref, inp


# --------------------------------------------------------------------------- FP8 W8A8

from swapmoe.reference import (  # noqa: E402
    FP8_BLOCK,
    e4m3_decode,
    e4m3_encode,
    fused_experts_fp8_ref,
    rel_error_with_flips,
    round_e4m3,
)

FP8_SCHEMES = ["tensor", "channel", "block"]

# FP8 tolerances (relative Frobenius error vs the float64 reference, after flips). Both
# sides quantize the input identically (same float32 scale and division, same rounding),
# so x_q is bit-identical; what is left is float32 accumulation order in the GEMMs (about
# 1e-6 at these sizes), the float32 vs float64 intermediate, and the rounding of the
# output to its dtype. The intermediate can straddle an e4m3 rounding midpoint: that one
# element then moves one fp8 step (up to 12.5% of it, about 1% of a row for N = 64), which
# no sensible tolerance can absorb, so the reference lists every element within 1e-4
# (relative) of a midpoint and the check adds the ones that bring the reference closer
# (rel_error_with_flips). With flips accounted for, the dtype tolerances of the bf16/fp16/
# fp32 path hold: float32 1e-5 (the CPU path measures <= 2e-7; margin for the GPU's
# __expf and summation order),
# float16 3e-3 and bfloat16 1e-2 (output rounding, 2^-11 and 2^-8 per element).
FP8_TOLERANCE = {"float32": 1e-5, "float16": 3e-3, "bfloat16": 1e-2}
# On CUDA tensors the oracle may pick the tensor-core FP8 kernels (Hopper, cuda_wgmma_swap):
# wgmma e4m3 accumulates each instruction's products with a reduced-precision adder (about
# 14 bits, the reason DeepGEMM and CUTLASS promote to float32 every 128 of K, as these
# kernels do). Measured on the H200 (benches/NOTES.md, "FP8 swap v1"): their f32
# intermediate differs from the SIMT kernels' by up to 1.5e-3 (relative) on elements that
# are small against the terms of their dot products. Within that distance of a midpoint an
# element (and, through a dynamic scale, the scale itself) may round either way, so on CUDA
# the reference lists the elements within FP8_TC_FLIP_MARGIN of a midpoint as flips.
FP8_TC_FLIP_MARGIN = 4e-3


def fp8_weight(rng: np.random.Generator, w: np.ndarray, scheme: str, trailing: bool = False):
    """Quantizes float32 weights [E, R, C] like a checkpoint would (scale = absmax / 448,
    times a random factor in [0.8, 1.25], so that some weights saturate): returns (e4m3
    bytes uint8 [E, R, C], float32 scale of the scheme's shape; with ``trailing`` the
    [E, 1, 1] / [E, R, 1] variants)."""
    E, R, C = w.shape
    if scheme == "tensor":
        s = np.abs(w).reshape(E, -1).max(axis=1) / 448.0
    elif scheme == "channel":
        s = np.abs(w).max(axis=2) / 448.0
    else:
        gr, gc = -(-R // FP8_BLOCK), -(-C // FP8_BLOCK)
        pad = np.zeros((E, gr * FP8_BLOCK, gc * FP8_BLOCK), np.float32)
        pad[:, :R, :C] = np.abs(w)
        s = pad.reshape(E, gr, FP8_BLOCK, gc, FP8_BLOCK).max(axis=(2, 4)) / 448.0
    s = np.maximum(s * rng.uniform(0.8, 1.25, size=s.shape), 1e-12).astype(np.float32)
    if scheme == "tensor":
        full = s[:, None, None]
    elif scheme == "channel":
        full = s[:, :, None]
    else:
        full = np.repeat(np.repeat(s, FP8_BLOCK, axis=1), FP8_BLOCK, axis=2)[:, :R, :C]
    codes = e4m3_encode(round_e4m3(np.clip(w / full.astype(np.float64), -448, 448)))
    if trailing and scheme == "tensor":
        s = s.reshape(E, 1, 1)
    elif trailing and scheme == "channel":
        s = s[:, :, None]
    return codes, s


def wgmma_fp8_case(case: Case, scheme: str) -> Case:
    """The case as cuda_wgmma's FP8 GEMMs run it for `scheme`: with 128x128 blocks, N rounded
    up to a multiple of 128 (the kernels take whole blocks of the intermediate)."""
    if scheme == "block" and case.N % 128:
        return dataclasses.replace(case, N=-(-case.N // 128) * 128)
    return case


def make_fp8_problem(rng: np.random.Generator, case: Case, scheme: str, *, static: bool = False,
                     trailing: bool = False) -> dict:
    """make_problem plus e4m3 weights and their scales; with ``static`` (per tensor only)
    also a1_scale and a2_scale (0-d float32, chosen so that some values saturate)."""
    prob = make_problem(rng, case)
    prob["w1_codes"], prob["w1_scale"] = fp8_weight(rng, prob["w1"], scheme, trailing)
    prob["w2_codes"], prob["w2_scale"] = fp8_weight(rng, prob["w2"], scheme, trailing)
    prob["scheme"] = scheme
    prob["a1_scale"] = prob["a2_scale"] = None
    if static:
        assert scheme == "tensor"
        amax = float(np.abs(prob["x"]).max()) if prob["x"].size else 1.0
        prob["a1_scale"] = np.asarray(amax / 448.0 * 0.8, np.float32)  # the largest 20% saturate
        prob["a2_scale"] = np.asarray([3.0 / 448.0], np.float32)  # |act*mul| > 3 saturates
    return prob


def _fp8_tensor(codes: np.ndarray, lib: str, device: str):
    if lib == "numpy":
        return np.ascontiguousarray(codes)
    return torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn).to(device)


def _f32(a, lib: str, device: str):
    if a is None:
        return None
    if lib == "numpy":
        return np.ascontiguousarray(a, dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(device)


def to_fp8_inputs(prob: dict, case: Case, lib: str, dtype: str, device: str = "cpu") -> dict:
    """to_inputs with e4m3 weights (torch float8_e4m3fn, numpy uint8 bytes) and scales."""
    inp = to_inputs(prob, case, lib, dtype, device)
    inp["w1"] = _fp8_tensor(prob["w1_codes"], lib, device)
    inp["w2"] = _fp8_tensor(prob["w2_codes"], lib, device)
    inp["buffers"].pop("w1", None)
    inp["buffers"].pop("w2", None)
    for name in ("w1_scale", "w2_scale", "a1_scale", "a2_scale"):
        inp[name] = _f32(prob[name], lib, device)
    inp["scheme"] = prob["scheme"]
    return inp


def fp8_kwargs(inp: dict) -> dict:
    scheme = inp["scheme"]
    return dict(
        use_fp8_w8a8=True,
        w1_scale=inp["w1_scale"],
        w2_scale=inp["w2_scale"],
        a1_scale=inp["a1_scale"],
        a2_scale=inp["a2_scale"],
        per_channel_quant=scheme == "channel",
        block_shape=[128, 128] if scheme == "block" else None,
    )


def fp8_call(inp: dict, case: Case, **kw):
    return call(inp, case, **{**fp8_kwargs(inp), **kw})


def fp8_reference(inp: dict, case: Case):
    """(out float64, flips) of the float64 FP8 reference for the op's inputs."""
    emap = inp["expert_map"]

    def host(t):
        return None if t is None else to_f64(t)

    def codes(t):
        if torch is not None and isinstance(t, torch.Tensor):
            return t.detach().cpu().view(torch.uint8).numpy()
        return np.asarray(t)

    scheme = inp["scheme"]
    return fused_experts_fp8_ref(
        to_f64(inp["x"]),
        e4m3_decode(codes(inp["w1"])),
        e4m3_decode(codes(inp["w2"])),
        to_f64(inp["tw"]),
        to_i64(inp["ids"]),
        w1_scale=host(inp["w1_scale"]),
        w2_scale=host(inp["w2_scale"]),
        a1_scale=host(inp["a1_scale"]),
        a2_scale=host(inp["a2_scale"]),
        per_channel_quant=scheme == "channel",
        block_shape=[128, 128] if scheme == "block" else None,
        activation=case.act,
        apply_router_weight_on_input=case.on_input,
        expert_map=None if emap is None else to_i64(emap),
        flip_margin=FP8_TC_FLIP_MARGIN if _on_cuda(inp["x"]) else 1e-4,
    )


def _on_cuda(t) -> bool:
    return torch is not None and isinstance(t, torch.Tensor) and t.is_cuda


def check_fp8_close(out, ref: np.ndarray, flips, dtype: str, *, what: str = "") -> float:
    assert tuple(out.shape) == ref.shape, (tuple(out.shape), ref.shape)
    assert dtype_name(out) == dtype, (dtype_name(out), dtype)
    o = to_f64(out)
    assert np.isfinite(o).all(), f"{what}: non-finite output at {np.argwhere(~np.isfinite(o))[:5].tolist()}"
    err = rel_error_with_flips(o, ref, flips)
    assert err <= FP8_TOLERANCE[dtype], f"{what}: rel_error {err:.3g} > {FP8_TOLERANCE[dtype]} ({dtype}, {len(flips)} flips)"
    return err


def run_fp8_case(case: Case, scheme: str, lib: str, dtype: str, rng: np.random.Generator, device: str = "cpu",
                 *, static: bool = False, trailing: bool = False, **kw):
    """Builds an FP8 case, calls the op (out per case.out) and checks it against the
    float64 FP8 reference. Returns (out, ref, flips, inp)."""
    prob = make_fp8_problem(rng, case, scheme, static=static, trailing=trailing)
    inp = to_fp8_inputs(prob, case, lib, dtype, device)
    ref, flips = fp8_reference(inp, case)
    if case.ids != "none" and case.M > 0:
        assert np.linalg.norm(ref) > 0, "degenerate case: the reference is all zeros"
    before = {n: snapshot(inp[n]) for n in ("x", "tw", "ids")}
    if case.out == "poison":
        given = poison(inp["x"])
        out = fp8_call(inp, case, out=given, **kw)
        assert out is given
    elif case.out == "inplace":
        out = fp8_call(inp, case, out=inp["x"], **kw)
        assert out is inp["x"]
    else:
        out = fp8_call(inp, case, **kw)
    if device != "cpu":
        torch.cuda.synchronize()
    check_fp8_close(out, ref, flips, dtype, what=f"{case.id}-{scheme}")
    for name, old in before.items():
        if name == "x" and case.out == "inplace":
            continue
        assert same_bits(snapshot(inp[name]), old), f"{name} was modified"
    return out, ref, flips, inp
