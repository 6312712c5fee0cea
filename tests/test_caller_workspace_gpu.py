"""The caller's own workspace and stream on the GPU, for CUDA tensors of a library swapmoe
does not know (``Foreign``: the DLPack protocol alone, here over torch tensors): the op runs
on the given stream, in the given workspace (filled with 0xFF, so a kernel that trusts what
it holds shows up), with the torch call's bits; the core refuses a workspace that is too
small, misaligned, strided, on another device or overlapping another argument (a read-only
one: the core's unit tests, as no CUDA producer here exports one),
and leaves ``out`` untouched. CuPy's capture with a workspace of its own is in
``test_cupy_gpu.py``."""

from __future__ import annotations

import math

import pytest

import swapmoe
from conftest import Case, call, check_close, make_problem, poison, reference, to_inputs, torch
from test_caller_workspace import Foreign, foreign
from test_routing import BY_NAME, moe_call, moe_inputs, moe_problem, moe_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

DEV = "cuda"

CASES = [
    Case(1, 8, 2, 64, 128),  # M = 1
    Case(5, 16, 4, 64, 128, ep=True),  # expert_map with -1 entries
    Case(17, 128, 8, 64, 256, ids="concentrated"),  # most experts get no token
    Case(64, 32, 6, 40, 48, "gelu"),  # N and K not multiples of 16
    Case(300, 8, 2, 96, 200, ids="invalid", id_dtype="int64"),  # past every token tile
]


def junk(nbytes: int):
    """A workspace of ``nbytes`` full of 0xFF (bf16 NaN, int32 -1)."""
    return torch.full((max(nbytes, 1),), 0xFF, dtype=torch.uint8, device=DEV)


def same(a, b) -> bool:
    """The same bits (bf16 through an int16 view)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


def _late_inputs(tensors, op):
    """Zeroes each tensor, then on a side stream (after a warm-up there): a long sleep, the
    real values written back, and ``op(side)``. Right only if ``op`` launched on ``side``."""
    staged = [t.clone() for t in tensors]
    for t in tensors:
        t.zero_()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # warm-up: module loads and the allocator's first cudaMalloc
        torch.cuda._sleep(1000)
        op(side)
    side.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of device time on the side stream
        for t, s in zip(tensors, staged):
            t.copy_(s)
    result = op(side)
    assert not side.query(), "the side stream finished before the op was queued: lengthen the sleep"
    side.synchronize()
    return result


@pytest.mark.parametrize("stream_form", ["address", "object"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_foreign_cuda_tensors_run_on_the_callers_workspace_and_stream(case, stream_form, rng):
    """With ``out``, a 0xFF workspace of ``workspace_bytes`` and a side stream (its address,
    or the stream object), the output has the torch call's bits and is within tolerance of
    the float64 reference; the inputs, written late on that stream, were waited for."""
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    want = call(inp, case)
    ws = junk(swapmoe.workspace_bytes(inp["x"], inp["w1"], inp["ids"]))
    out = poison(inp["x"])
    f = foreign(inp)

    def op(side):
        out.fill_(math.nan)
        stream = side.cuda_stream if stream_form == "address" else side
        return call(f, case, out=Foreign(out), workspace=Foreign(ws), stream=stream)

    got = _late_inputs([inp["x"]], op)
    assert isinstance(got, Foreign) and got.tensor is out
    assert same(out, want), "the foreign call differs from the torch call"
    check_close(out, reference(inp, case), "bfloat16", what=f"{case.id} foreign")


def test_foreign_cuda_tensors_without_a_workspace_are_refused_with_its_size(rng):
    """Another library's CUDA tensors need ``workspace=``: ArgumentError naming it, the bytes
    and how to size them; nothing runs. M = 0 needs none."""
    case = CASES[1]
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    need = swapmoe.workspace_bytes(inp["x"], inp["w1"], inp["ids"])
    out = poison(inp["x"])
    with pytest.raises(
        swapmoe.ArgumentError,
        match=rf"workspace: expected a CUDA buffer of at least {need} bytes for CUDA tensors "
        r"\(swapmoe\.workspace_bytes",
    ):
        call(foreign(inp), case, out=Foreign(out))
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a refused call wrote out"
    empty = to_inputs(make_problem(rng, Case(0, 16, 4, 64, 128)), Case(0, 16, 4, 64, 128), "torch", "bfloat16", DEV)
    got = call(foreign(empty), Case(0, 16, 4, 64, 128), out=Foreign(poison(empty["x"])))
    assert tuple(got.tensor.shape) == (0, 128)


def _bad_workspaces(inp, need):
    """(name, workspace, out, error class, message pattern) for each refused buffer."""
    big = junk(need + 4096)
    out = poison(inp["x"])
    host = torch.full((need,), 0xFF, dtype=torch.uint8)
    strided = junk(2 * need)[::2]
    both = torch.empty(need + inp["x"].numel() * 2 + 512, dtype=torch.uint8, device=DEV)
    out_inside = both[need + 256 : need + 256 + inp["x"].numel() * 2].view(torch.bfloat16).view(inp["x"].shape)
    return [
        ("too small", junk(need - 256), out, swapmoe.ShapeError, rf"workspace: expected at least {need} bytes"),
        ("misaligned", big[16 : 16 + need], out, swapmoe.ArgumentError,
         r"workspace: expected an address aligned to 256 bytes"),
        ("strided", strided, out, swapmoe.ShapeError, r"workspace: expected a contiguous buffer"),
        ("on the host", host, out, swapmoe.DeviceError, r"workspace: expected device"),
        ("holds out", both, out_inside, swapmoe.ShapeError,
         r"workspace: expected memory that overlaps no other argument, got bytes .* against out's"),
    ]


@pytest.mark.parametrize("which", ["too small", "misaligned", "strided", "on the host", "holds out"])
def test_the_core_refuses_a_workspace_it_cannot_use(which, rng):
    """Each refused buffer raises its typed error naming ``workspace`` and leaves ``out`` as
    it was (NaN): the check comes before any launch."""
    case = CASES[2]
    inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", DEV)
    need = swapmoe.workspace_bytes(inp["x"], inp["w1"], inp["ids"])
    name, ws, out, error, pattern = next(b for b in _bad_workspaces(inp, need) if b[0] == which)
    out.fill_(math.nan)
    with pytest.raises(error, match=pattern):
        call(foreign(inp), case, out=Foreign(out), workspace=Foreign(ws))
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), f"{name}: a refused call wrote out"


@pytest.mark.parametrize("r_name,M,ep", [("qwen3", 1, False), ("qwen3", 16, False), ("deepseek_v3", 5, True),
                                         ("mixtral", 64, False)])
def test_foreign_fused_moe_keeps_the_router_outputs_in_the_workspace(r_name, M, ep, rng):
    """fused_moe on another library's CUDA tensors: the router's weights and ids go into the
    caller's workspace (``fused_moe_workspace_bytes``, 0xFF), and the output has the torch
    call's bits, within tolerance of the float64 reference. The experts' size alone is
    refused, naming the size that holds both, and a host workspace is refused as such."""
    r = BY_NAME[r_name]
    inp = moe_inputs(moe_problem(rng, r, M, ep), "torch", "bfloat16", "float32", device=DEV)
    want = moe_call(r, inp)
    need = swapmoe.fused_moe_workspace_bytes(inp["x"], inp["w1"], r.topk)
    f = {n: (v if n == "emap" or v is None else Foreign(v)) for n, v in inp.items()}
    out = poison(inp["x"])

    def op(side):
        out.fill_(math.nan)
        return moe_call(r, f, out=Foreign(out), workspace=Foreign(junk(need)), stream=side)

    _late_inputs([inp["x"], inp["logits"]], op)
    assert same(out, want), "the foreign fused_moe differs from the torch call"
    check_close(out, moe_ref(r, inp), "bfloat16", what=f"{r_name} M={M} foreign fused_moe")

    ids = torch.empty((M, r.topk), dtype=torch.int32, device=DEV)
    experts_only = swapmoe.workspace_bytes(inp["x"], inp["w1"], ids)
    assert experts_only < need
    with pytest.raises(swapmoe.ShapeError,
                       match=rf"workspace: expected at least {need} bytes \(swapmoe\.fused_moe_workspace_bytes"):
        moe_call(r, f, out=Foreign(out), workspace=Foreign(junk(experts_only)))
    host = torch.full((need,), 0xFF, dtype=torch.uint8)  # the router's outputs would land on the host
    with pytest.raises(swapmoe.DeviceError, match=r"workspace: expected device"):
        moe_call(r, f, out=Foreign(out), workspace=Foreign(host))
