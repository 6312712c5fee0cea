"""The torch integration on CPU: the registered ops (opcheck, fake impls, FakeTensorMode),
torch.compile(fullgraph=True) against eager, and agreement of swapmoe.fused_experts with
torch.ops.swapmoe.*."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import swapmoe  # noqa: E402
import swapmoe.ops  # noqa: E402,F401  (registers torch.ops.swapmoe)
from conftest import Case, check_close, make_problem, poison, reference, to_inputs  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

OPS = torch.ops.swapmoe

# (case, dtype) combinations for opcheck and compile tests: activations, expert maps,
# id and weight dtypes, router weight on input, strided layouts.
VARIANTS = [
    (Case(16, 8, 2, 40, 48), "float32"),
    (Case(9, 8, 2, 64, 64, "gelu", id_dtype="int64"), "bfloat16"),
    (Case(5, 16, 6, 40, 48, ids="invalid", ep=True, tw_dtype="bfloat16"), "float16"),
    (Case(7, 8, 1, 40, 48, on_input=True, ep=True), "float32"),
    (Case(12, 8, 2, 40, 48, "gelu", layout="strided"), "bfloat16"),
]
VARIANT_IDS = [f"{c.id}-{d}" for c, d in VARIANTS]


def inputs(case: Case, dtype: str, rng) -> dict:
    return to_inputs(make_problem(rng, case), case, "torch", dtype)


def op_args(inp: dict, case: Case) -> tuple:
    return (inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"])


def op_kwargs(inp: dict, case: Case) -> dict:
    return dict(
        activation=case.act,
        apply_router_weight_on_input=case.on_input,
        global_num_experts=-1,
        expert_map=inp["expert_map"],
    )


def api_kwargs(inp: dict, case: Case) -> dict:
    kw = op_kwargs(inp, case)
    kw.pop("global_num_experts")
    return kw


# --------------------------------------------------------------------------- registration


def test_ops_registered_with_schemas():
    f = OPS.fused_experts.default._schema
    o = OPS.fused_experts_out.default._schema
    assert [a.name for a in f.arguments][:5] == ["hidden_states", "w1", "w2", "topk_weights", "topk_ids"]
    assert not any(a.alias_info is not None and a.alias_info.is_write for a in f.arguments)
    out_arg = o.arguments[0]
    assert out_arg.name == "out" and out_arg.alias_info is not None and out_arg.alias_info.is_write
    assert len(o.returns) == 0 and len(f.returns) == 1


# --------------------------------------------------------------------------- opcheck


@pytest.mark.parametrize("case,dtype", VARIANTS, ids=VARIANT_IDS)
def test_opcheck_functional(case, dtype, rng):
    inp = inputs(case, dtype, rng)
    result = torch.library.opcheck(OPS.fused_experts.default, op_args(inp, case), op_kwargs(inp, case))
    assert result and all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("case,dtype", VARIANTS[:3], ids=VARIANT_IDS[:3])
def test_opcheck_out(case, dtype, rng):
    inp = inputs(case, dtype, rng)
    out = torch.zeros_like(inp["x"])
    result = torch.library.opcheck(OPS.fused_experts_out.default, (out,) + op_args(inp, case), op_kwargs(inp, case))
    assert result and all(v == "SUCCESS" for v in result.values()), result


# --------------------------------------------------------------------------- API vs ops


@pytest.mark.parametrize("case,dtype", VARIANTS, ids=VARIANT_IDS)
def test_api_equals_registered_ops(case, dtype, rng):
    inp = inputs(case, dtype, rng)
    api = swapmoe.fused_experts(*op_args(inp, case), **api_kwargs(inp, case))
    functional = OPS.fused_experts(*op_args(inp, case), **op_kwargs(inp, case))
    out = poison(inp["x"])
    assert OPS.fused_experts_out(out, *op_args(inp, case), **op_kwargs(inp, case)) is None
    assert torch.equal(api, functional)
    assert torch.equal(api, out)
    check_close(api, reference(inp, case), dtype)


def test_registered_op_raises_typed_errors(rng):
    case = Case(4, 8, 2, 40, 48)
    inp = inputs(case, "float32", rng)
    with pytest.raises(swapmoe.ShapeError, match="w2"):
        OPS.fused_experts(inp["x"], inp["w1"], inp["w2"][:, :-1], inp["tw"], inp["ids"])
    with pytest.raises(swapmoe.ArgumentError, match="activation"):
        OPS.fused_experts(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"], "relu")


# --------------------------------------------------------------------------- fake tensors


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_fake_impl_shape_dtype(dtype, layout, rng):
    case = Case(11, 8, 2, 40, 48, ep=True, layout=layout)
    inp = inputs(case, dtype, rng)
    real = OPS.fused_experts(*op_args(inp, case), **op_kwargs(inp, case))
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(t) for t in op_args(inp, case)]
        fake_map = mode.from_tensor(inp["expert_map"])
        got = OPS.fused_experts(*fake_args, expert_map=fake_map)
        assert type(got).__name__ == "FakeTensor"
        assert tuple(got.shape) == (11, 48)
        assert got.dtype == getattr(torch, dtype) and got.device == inp["x"].device
        assert got.stride() == real.stride()  # fake and real outputs lay out alike
        fake_out = mode.from_tensor(torch.empty(11, 48, dtype=getattr(torch, dtype)))
        assert OPS.fused_experts_out(fake_out, *fake_args, expert_map=fake_map) is None


def test_meta_tensors_use_fake_impl():
    x = torch.empty(6, 48, dtype=torch.bfloat16, device="meta")
    w1 = torch.empty(8, 80, 48, dtype=torch.bfloat16, device="meta")
    w2 = torch.empty(8, 48, 40, dtype=torch.bfloat16, device="meta")
    tw = torch.empty(6, 2, device="meta")
    ids = torch.empty(6, 2, dtype=torch.int32, device="meta")
    got = OPS.fused_experts(x, w1, w2, tw, ids)
    assert got.device.type == "meta" and tuple(got.shape) == (6, 48) and got.dtype == torch.bfloat16


# --------------------------------------------------------------------------- torch.compile


def _fn(x, w1, w2, tw, ids, emap, act, on_input):
    y = swapmoe.fused_experts(x, w1, w2, tw, ids, activation=act, apply_router_weight_on_input=on_input, expert_map=emap)
    return y * 2 + 1


def _fn_out(x, w1, w2, tw, ids, emap, act, on_input, out):
    r = swapmoe.fused_experts(x, w1, w2, tw, ids, activation=act, apply_router_weight_on_input=on_input, expert_map=emap, out=out)
    return r * 2 + 1


COMPILE_VARIANTS = [VARIANTS[0], VARIANTS[2], VARIANTS[3]]
COMPILE_IDS = [VARIANT_IDS[0], VARIANT_IDS[2], VARIANT_IDS[3]]


@pytest.mark.parametrize("with_out", [False, True], ids=["functional", "out"])
@pytest.mark.parametrize("case,dtype", COMPILE_VARIANTS, ids=COMPILE_IDS)
def test_compile_fullgraph_matches_eager(case, dtype, with_out, rng):
    torch._dynamo.reset()
    inp = inputs(case, dtype, rng)
    a = op_args(inp, case) + (inp["expert_map"], case.act, case.on_input)
    if with_out:
        eager_out = poison(inp["x"])
        eager = _fn_out(*a, eager_out)
        compiled_out = poison(inp["x"])
        got = torch.compile(_fn_out, fullgraph=True)(*a, compiled_out)
        assert torch.equal(compiled_out, eager_out), "out= not written identically under compile"
    else:
        eager = _fn(*a)
        got = torch.compile(_fn, fullgraph=True)(*a)
    assert torch.equal(got, eager)
    check_close((eager - 1) / 2, reference(inp, case), dtype)


def test_compile_inplace_out_is_hidden_states(rng):
    torch._dynamo.reset()
    case = Case(8, 8, 2, 40, 48)
    inp = inputs(case, "float32", rng)
    ref = reference(inp, case)

    def f(x, w1, w2, tw, ids):
        swapmoe.fused_experts(x, w1, w2, tw, ids, out=x)
        return x + 0

    x = inp["x"].clone()
    got = torch.compile(f, fullgraph=True)(x, inp["w1"], inp["w2"], inp["tw"], inp["ids"])
    check_close(x, ref, "float32")
    assert torch.equal(got, x)


def test_compile_dynamic_shapes(rng):
    """One dynamic-shape compilation serves several M without recompiling."""
    torch._dynamo.reset()
    compiled = torch.compile(_fn, fullgraph=True, dynamic=True)
    for i, m in enumerate((3, 17, 5)):
        case = Case(m, 8, 2, 40, 48, "gelu")
        inp = inputs(case, "float32", rng)
        a = op_args(inp, case) + (None, "gelu", False)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            got = compiled(*a)
        assert tuple(got.shape) == (m, 48)
        assert torch.equal(got, _fn(*a))


def test_compile_rejects_check_ids(rng):
    """check_ids syncs the host: refused under torch.compile (fullgraph surfaces it)."""
    torch._dynamo.reset()
    case = Case(4, 8, 2, 40, 48)
    inp = inputs(case, "float32", rng)

    def f(x, w1, w2, tw, ids):
        return swapmoe.fused_experts(x, w1, w2, tw, ids, check_ids=True)

    with pytest.raises(Exception) as info:
        torch.compile(f, fullgraph=True)(*op_args(inp, case))
    # dynamo wraps the ArgumentError raised while tracing; its message comes through
    text = str(info.value)
    assert isinstance(info.value, (swapmoe.ArgumentError, torch._dynamo.exc.Unsupported)), type(info.value)
    assert "check_ids: expected False under torch.compile" in text, text
    # eager with the same arguments works
    out = f(*op_args(inp, case))
    check_close(out, reference(inp, case), "float32")


def _moe_torch(rng, dtype=torch.bfloat16):
    g = torch.from_numpy(rng.standard_normal((7, 8), dtype=np.float32))
    x = torch.from_numpy(rng.standard_normal((7, 64), dtype=np.float32)).to(dtype)
    w1 = (torch.from_numpy(rng.standard_normal((8, 64, 64), dtype=np.float32)) / 8).to(dtype)
    w2 = (torch.from_numpy(rng.standard_normal((8, 64, 32), dtype=np.float32)) / 6).to(dtype)
    return x, w1, w2, g


@pytest.mark.parametrize("op", ["fused_moe", "fused_moe_out"])
def test_opcheck_fused_moe(op, rng):
    """The fused_moe ops' fake implementations (bf16 hidden states, fp32 logits: the output
    has the hidden states' dtype) pass opcheck."""
    x, w1, w2, g = _moe_torch(rng)
    args = (x, w1, w2, g, 2) if op == "fused_moe" else (torch.empty_like(x), x, w1, w2, g, 2)
    res = torch.library.opcheck(getattr(OPS, op).default, args)
    assert all(v == "SUCCESS" for v in res.values()), res


def test_compile_fused_moe_writes_out(rng):
    """fused_moe(out=...) under torch.compile fills the caller's out, as eagerly, with an
    expert map (dropped, every expert would count) and gelu."""
    torch._dynamo.reset()
    x, w1, w2, g = _moe_torch(rng)
    # 8 global experts, this rank holds 4 of the 8 local weight sets' ids: the others are -1
    emap = torch.tensor([0, -1, 1, -1, 2, -1, 3, -1], dtype=torch.int32)
    w1, w2 = w1[:4], w2[:4]

    def f(x, w1, w2, g, out, emap):
        swapmoe.fused_moe(x, w1, w2, g, 2, out=out, expert_map=emap, activation="gelu")
        return out * 1

    eager_out, compiled_out = poison(x), poison(x)
    eager = f(x, w1, w2, g, eager_out, emap)
    got = torch.compile(f, fullgraph=True)(x, w1, w2, g, compiled_out, emap)
    assert torch.equal(got, eager) and torch.equal(compiled_out, eager_out)
    no_map = swapmoe.fused_moe(x, torch.cat([w1, w1]), torch.cat([w2, w2]), g, 2, activation="gelu")
    assert not torch.equal(eager, no_map), "the map must matter in this case"
