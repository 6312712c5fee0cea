"""FP8 (e4m3) W8A8 fused experts on the CPU path: every scheme against the float64 FP8
reference (swapmoe.reference.fused_experts_fp8_ref), the validation of every FP8
argument, non-finite inputs, and the torch op's FP8 arguments."""

from __future__ import annotations

import numpy as np
import pytest

import swapmoe
from conftest import (
    FP8_SCHEMES,
    FP8_TOLERANCE,
    Case,
    check_fp8_close,
    fp8_call,
    fp8_kwargs,
    fp8_reference,
    make_fp8_problem,
    poison,
    requires_torch,
    run_fp8_case,
    same_bits,
    to_f64,
    to_fp8_inputs,
    torch,
)
from swapmoe.reference import (
    e4m3_decode,
    e4m3_encode,
    fp8_quantize,
    fused_experts_fp8_ref,
    fused_experts_ref,
    rel_error,
    rel_error_with_flips,
    round_e4m3,
)

# K and N not multiples of 128 (partial blocks) for every scheme; the block scheme also
# gets K, N > 128 with partial last blocks (2N = 272: three block rows, the gate/up
# boundary inside one).
SHAPES = {"tensor": (40, 48), "channel": (40, 48), "block": (136, 200)}  # (N, K)
M_VALUES = [1, 2, 3, 5, 8, 17, 64]


def _case(M, scheme, **kw):
    N, K = SHAPES[scheme]
    base = dict(M=M, E=8, topk=2, N=N, K=K, out="poison")
    base.update(kw)
    return Case(**base)


# --------------------------------------------------------------------------- numerics


def test_round_e4m3_matches_torch():
    """The reference's e4m3 rounding is torch's float8_e4m3fn cast (round to nearest even)
    on every value in range, including ties and subnormals."""
    if torch is None:
        pytest.skip("needs torch")
    codes = np.arange(256, dtype=np.uint8)
    vals = e4m3_decode(codes)
    assert np.array_equal(vals, torch.from_numpy(codes).view(torch.float8_e4m3fn).double().numpy(), equal_nan=True)
    finite = vals[np.isfinite(vals)]
    mids = (np.sort(finite)[1:] + np.sort(finite)[:-1]) / 2  # every tie
    rng = np.random.default_rng(0)
    v = np.concatenate([finite, mids, rng.uniform(-448, 448, 4000), rng.uniform(-0.02, 0.02, 4000)]).astype(np.float32)
    want = torch.from_numpy(v).to(torch.float8_e4m3fn).float().numpy().astype(np.float64)
    got = round_e4m3(v)
    assert np.array_equal(got, want)
    assert np.array_equal(e4m3_encode(got), torch.from_numpy(v).to(torch.float8_e4m3fn).view(torch.uint8).numpy())
    assert np.array_equal(e4m3_decode(e4m3_encode(finite)), finite)
    assert np.array_equal(e4m3_encode(finite), codes[np.isfinite(vals)])  # every code, both zeros
    strided = np.stack([got, -got])[:, ::3]  # a view that is not contiguous
    assert np.array_equal(e4m3_encode(strided), np.stack([e4m3_encode(got), e4m3_encode(-got)])[:, ::3])


def test_quantize_saturates_and_keeps_nan():
    q = fp8_quantize(np.array([1e6, -1e6, np.nan, np.inf, -np.inf, 0.0], np.float32), np.float32(1.0), False)
    assert q[0] == 448 and q[1] == -448 and q[-1] == 0
    assert np.isnan(q[2:5]).all(), "non-finite inputs must quantize to NaN, not to +-448"


# --------------------------------------------------------------------------- schemes


@pytest.mark.parametrize("lib,dtype", [("torch", "bfloat16"), ("torch", "float32"), ("numpy", "float16")])
@pytest.mark.parametrize("M", M_VALUES)
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_schemes_vs_reference(scheme, M, lib, dtype, rng):
    if lib == "torch" and torch is None:
        pytest.skip("needs torch")
    run_fp8_case(_case(M, scheme), scheme, lib, dtype, rng)


VARIANTS = [
    dict(ids="concentrated"),  # most experts get no token
    dict(ids="invalid", id_dtype="int64"),
    dict(ep=True),  # expert_map with -1 entries
    dict(ep=True, ids="invalid"),
    dict(topk=1, on_input=True),  # router weight on the input (scales GEMM1's output)
    dict(topk=1, on_input=True, ep=True, ids="concentrated"),
    dict(act="gelu", tw_dtype="bfloat16"),
    dict(ids="dup", out="inplace"),
    dict(E=64, topk=6, ids="concentrated", out="none"),
]


@requires_torch
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
@pytest.mark.parametrize("M", [3, 17, 64])
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_routing_variants(scheme, M, variant, rng):
    run_fp8_case(_case(M, scheme, **variant), scheme, "torch", "bfloat16", rng)


@pytest.mark.parametrize("lib", ["numpy", pytest.param("torch", marks=requires_torch)])
@pytest.mark.parametrize("M", [1, 5, 64])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_per_tensor_static_and_dynamic(static, M, lib, rng):
    """Static a1_scale/a2_scale (with saturation: the scales are smaller than absmax/448)
    and dynamic per-tensor scales."""
    dtype = "float32"
    out, ref, flips, inp = run_fp8_case(_case(M, "tensor", ep=True), "tensor", lib, dtype, rng, static=static)
    if static:
        # the static scales matter: the dynamic result is another one
        dyn = dict(inp, a1_scale=None, a2_scale=None)
        other, _ = fp8_reference(dyn, _case(M, "tensor"))
        assert rel_error(other, ref) > 10 * FP8_TOLERANCE[dtype]


@requires_torch
@pytest.mark.parametrize("scheme", ["tensor", "channel"])
def test_trailing_one_scale_shapes(scheme, rng):
    """w1_scale [E, 1, 1] / [E, 2N, 1] and w2_scale alike are accepted (vLLM's layouts)."""
    run_fp8_case(_case(9, scheme), scheme, "torch", "bfloat16", rng, trailing=True)


@requires_torch
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_strided_scale_views(scheme, rng):
    """Scales that are non-contiguous views (every other element of a bigger tensor)."""
    case = _case(7, scheme)
    prob = make_fp8_problem(rng, case, scheme)
    inp = to_fp8_inputs(prob, case, "torch", "bfloat16")
    ref, flips = fp8_reference(inp, case)
    for name in ("w1_scale", "w2_scale"):
        t = inp[name]
        big = torch.full(t.shape[:-1] + (2 * t.shape[-1],), float("nan"))
        big[..., ::2] = t
        inp[name] = big[..., ::2]
        assert not inp[name].is_contiguous() or t.shape[-1] == 1
    out = fp8_call(inp, case)
    check_fp8_close(out, ref, flips, "bfloat16")


@requires_torch
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_numpy_and_torch_agree_bitwise(scheme, rng):
    case = _case(17, scheme, ep=True, ids="invalid")
    prob = make_fp8_problem(rng, case, scheme)
    a = fp8_call(to_fp8_inputs(prob, case, "numpy", "float32"), case)
    b = fp8_call(to_fp8_inputs(prob, case, "torch", "float32"), case)
    assert same_bits(a, b.numpy())


@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_deterministic(scheme, rng):
    case = _case(33, scheme, ids="concentrated")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme), case, "numpy", "float32")
    assert same_bits(fp8_call(inp, case), fp8_call(inp, case))


@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_tolerance_detects_missing_activation_quantization(scheme, rng):
    """The check is tight enough to fail: the unquantized-activation result (dequantized
    weights, bf16-style math) is far outside the FP8 tolerance."""
    case = _case(17, scheme)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme), case, "numpy", "float32")
    out = fp8_call(inp, case)
    ref, flips = fp8_reference(inp, case)
    assert rel_error_with_flips(out, ref, flips) <= FP8_TOLERANCE["float32"]
    from swapmoe.reference import fp8_weight_scale_full

    E, two_n, K = inp["w1"].shape
    w1 = e4m3_decode(inp["w1"]) * fp8_weight_scale_full(inp["w1_scale"], scheme, two_n, K)
    w2 = e4m3_decode(inp["w2"]) * fp8_weight_scale_full(inp["w2_scale"], scheme, K, two_n // 2)
    plain = fused_experts_ref(to_f64(inp["x"]), w1, w2, inp["tw"], inp["ids"])
    assert rel_error(out, plain) > 20 * FP8_TOLERANCE["float32"]


def test_flip_accounting_is_needed_rarely_and_bounded(rng):
    """Over many problems, the plain relative error (no flips) stays within the tolerance
    for most, and the flips the reference lists are few (the margin is not so wide that
    anything would pass)."""
    n_flips = []
    for i in range(20):
        case = _case(8, FP8_SCHEMES[i % 3])
        inp = to_fp8_inputs(make_fp8_problem(rng, case, FP8_SCHEMES[i % 3]), case, "numpy", "float32")
        ref, flips = fp8_reference(inp, case)
        n_flips.append(len(flips))
        out = fp8_call(inp, case)
        assert rel_error_with_flips(out, ref, flips) <= FP8_TOLERANCE["float32"]
    slots_elems = 8 * 2 * 136
    assert max(n_flips) <= 0.01 * slots_elems, n_flips


# --------------------------------------------------------------------------- special values


@pytest.mark.parametrize("lib", ["numpy", pytest.param("torch", marks=requires_torch)])
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_zero_rows(scheme, lib, rng):
    """An all-zero token (and thus zero activations) gets the minimum scale, never 0/0:
    its output row is exactly 0 and the others are unaffected."""
    case = _case(9, scheme)
    prob = make_fp8_problem(rng, case, scheme)
    prob["x"][4] = 0.0
    inp = to_fp8_inputs(prob, case, lib, "float32")
    ref, flips = fp8_reference(inp, case)
    out = fp8_call(inp, case, out=poison(inp["x"]))
    o = to_f64(out)
    assert (o[4] == 0).all()
    check_fp8_close(out, ref, flips, "float32")


@pytest.mark.parametrize("lib", ["numpy", pytest.param("torch", marks=requires_torch)])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_nonfinite_input_reaches_only_its_rows(scheme, bad, lib, rng):
    """NaN or +-inf in hidden_states quantizes to NaN and is left out of every absmax: the
    output rows of that token are NaN, every other row matches the reference (a dynamic
    per-tensor scale is not poisoned by it)."""
    case = _case(9, scheme)
    prob = make_fp8_problem(rng, case, scheme)
    t = 3
    prob["x"][t, 5] = bad
    inp = to_fp8_inputs(prob, case, lib, "float32")
    ref, flips = fp8_reference(inp, case)
    assert np.isnan(ref[t]).all() and np.isfinite(np.delete(ref, t, axis=0)).all()
    o = to_f64(fp8_call(inp, case, out=poison(inp["x"])))
    assert np.isnan(o[t]).all(), "the token with a non-finite input must come out NaN"
    keep = np.ones(case.M, bool)
    keep[t] = False
    assert np.isfinite(o[keep]).all()
    assert rel_error_with_flips(o[keep], ref[keep], [(m - (m > t), d) for m, d in flips if m != t]) <= 1e-5


@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_unrouted_nan_token_does_not_leak(scheme, rng):
    """A NaN token routed nowhere changes nothing (also not a dynamic per-tensor scale)."""
    case = _case(9, scheme)
    prob = make_fp8_problem(rng, case, scheme)
    prob["x"][2] = np.nan
    prob["ids"][2] = -1
    inp = to_fp8_inputs(prob, case, "numpy", "float32")
    ref, flips = fp8_reference(inp, case)
    out = fp8_call(inp, case, out=poison(inp["x"]))
    assert (to_f64(out)[2] == 0).all()
    check_fp8_close(out, ref, flips, "float32")


@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_nan_weight_code_propagates(scheme, rng):
    """A NaN e4m3 weight (0x7F) of a used expert reaches the rows that use it."""
    case = _case(6, scheme)
    prob = make_fp8_problem(rng, case, scheme)
    e = int(prob["ids"][1, 0])
    prob["w2_codes"][e, 7, 3] = 0x7F
    inp = to_fp8_inputs(prob, case, "numpy", "float32")
    ref, _ = fp8_reference(inp, case)
    o = to_f64(fp8_call(inp, case))
    assert np.array_equal(np.isnan(o), np.isnan(ref)) and np.isnan(o).any() and not np.isnan(o).all()


def test_m0(rng):
    case = _case(0, "block")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "block"), case, "numpy", "float32")
    out = fp8_call(inp, case)
    assert out.shape == (0, case.K)


# --------------------------------------------------------------------------- errors

BASE = {
    swapmoe.ShapeError: ValueError,
    swapmoe.DTypeError: TypeError,
    swapmoe.ArgumentError: ValueError,
}


def _fp8_args(rng, scheme="tensor", lib="numpy", static=False):
    case = _case(5, scheme)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme, static=static), case, lib, "float32")
    kw = dict(hidden_states=inp["x"], w1=inp["w1"], w2=inp["w2"], topk_weights=inp["tw"], topk_ids=inp["ids"])
    kw.update(fp8_kwargs(inp))
    return kw, case


def _expect(cls, kwargs, *needles):
    with pytest.raises(cls) as info:
        swapmoe.fused_experts(**kwargs)
    err = info.value
    assert type(err) is cls and isinstance(err, swapmoe.Error) and isinstance(err, BASE[cls])
    for needle in needles:
        assert needle in str(err), f"{needle!r} not in {str(err)!r}"
    return str(err)


E, N, K = 8, 40, 48
BN, BK = 136, 200  # block shapes


def f32(*shape):
    return np.ones(shape, np.float32)


SCALE_ERRORS = [
    # (scheme, argument, bad value, error class, needles)
    ("tensor", "w1_scale", f32(E, 2), swapmoe.ShapeError, ["w1_scale", "[8] or [8, 1] or [8, 1, 1]", "got [8, 2]"]),
    ("tensor", "w2_scale", f32(E + 1), swapmoe.ShapeError, ["w2_scale", "[8]", "got [9]"]),
    ("tensor", "w1_scale", np.ones(E, np.float16), swapmoe.DTypeError, ["w1_scale", "expected float32", "got float16"]),
    ("tensor", "w2_scale", np.ones(E, np.float64), swapmoe.DTypeError, ["w2_scale", "expected float32", "got float64"]),
    ("tensor", "w1_scale", None, swapmoe.ArgumentError, ["w1_scale", "use_fp8_w8a8=True", "got None"]),
    ("tensor", "w2_scale", None, swapmoe.ArgumentError, ["w2_scale", "got None"]),
    ("tensor", "a1_scale", f32(2), swapmoe.ShapeError, ["a1_scale", "[] or [1]", "got shape [2]"]),
    ("tensor", "a2_scale", f32(1, 1), swapmoe.ShapeError, ["a2_scale", "[] or [1]", "got shape [1, 1]"]),
    ("tensor", "a1_scale", np.ones(1, np.float16), swapmoe.DTypeError, ["a1_scale", "float32", "got float16"]),
    ("tensor", "a2_scale", np.ones((), np.int32), swapmoe.DTypeError, ["a2_scale", "float32", "got int32"]),
    ("channel", "w1_scale", f32(E), swapmoe.ShapeError, ["w1_scale", "[8, 80] or [8, 80, 1]", "got [8]"]),
    ("channel", "w1_scale", f32(E, N), swapmoe.ShapeError, ["w1_scale", "[8, 80]", "got [8, 40]"]),
    ("channel", "w2_scale", f32(E, N), swapmoe.ShapeError, ["w2_scale", "[8, 48] or [8, 48, 1]", "got [8, 40]"]),
    ("channel", "a1_scale", f32(1), swapmoe.ArgumentError, ["a1_scale", "expected None with per_channel_quant=True",
                                                           "got a float32 tensor of shape [1]"]),
    ("channel", "a2_scale", f32(1), swapmoe.ArgumentError, ["a2_scale", "expected None with per_channel_quant=True"]),
    ("block", "w1_scale", f32(E, 2, 2), swapmoe.ShapeError, ["w1_scale", "[8, 3, 2]", "ceil(2N/128)", "got [8, 2, 2]"]),
    ("block", "w2_scale", f32(E, 2, 1), swapmoe.ShapeError, ["w2_scale", "[8, 2, 2]", "ceil(K/128)", "got [8, 2, 1]"]),
    ("block", "w1_scale", f32(E), swapmoe.ShapeError, ["w1_scale", "got [8]"]),
    ("block", "w2_scale", np.ones((E, 2, 2), np.float16), swapmoe.DTypeError, ["w2_scale", "float32", "got float16"]),
    ("block", "a1_scale", f32(1), swapmoe.ArgumentError, ["a1_scale", "expected None with block_shape=[128, 128]"]),
    ("block", "a2_scale", f32(), swapmoe.ArgumentError, ["a2_scale", "expected None with block_shape",
                                                       "got a float32 tensor of shape []"]),
]


@pytest.mark.parametrize(
    "scheme,name,value,cls,needles", SCALE_ERRORS, ids=[f"{s}-{n}-{i}" for i, (s, n, *_) in enumerate(SCALE_ERRORS)]
)
def test_bad_scales(scheme, name, value, cls, needles, rng):
    kw, _ = _fp8_args(rng, scheme)
    kw[name] = value
    _expect(cls, kw, *needles)


@requires_torch
@pytest.mark.parametrize("name", ["w1_scale", "w2_scale", "a1_scale"])
def test_bad_scales_torch(name, rng):
    kw, _ = _fp8_args(rng, "tensor", "torch", static=True)
    kw[name] = kw[name].to(torch.bfloat16)
    _expect(swapmoe.DTypeError, kw, name, "expected float32", "got bfloat16")
    kw[name] = torch.ones(3, 3)
    _expect(swapmoe.ShapeError, kw, name, "got")


@pytest.mark.parametrize("block_shape", [[64, 64], [128], [128, 64], [256, 128]])
def test_bad_block_shape(block_shape, rng):
    kw, _ = _fp8_args(rng, "block")
    kw["block_shape"] = block_shape
    _expect(swapmoe.ArgumentError, kw, "block_shape", "expected [128, 128]", f"got {block_shape}".replace("'", ""))


def test_block_and_per_channel_conflict(rng):
    kw, _ = _fp8_args(rng, "block")
    kw["per_channel_quant"] = True
    _expect(swapmoe.ArgumentError, kw, "per_channel_quant", "expected False with block_shape")


@requires_torch
def test_fp8_weights_without_flag(rng):
    kw, _ = _fp8_args(rng, "tensor", "torch")
    for name in ("use_fp8_w8a8", "w1_scale", "w2_scale", "a1_scale", "a2_scale", "per_channel_quant", "block_shape"):
        kw.pop(name)
    _expect(swapmoe.DTypeError, kw, "w1", "expected float32 (the dtype of hidden_states)", "got float8_e4m3fn",
            "use_fp8_w8a8=True")


@requires_torch
@pytest.mark.parametrize("which", ["w1", "w2"])
def test_flag_with_float_weights(which, rng):
    kw, case = _fp8_args(rng, "tensor", "torch")
    kw[which] = torch.ones(kw[which].shape, dtype=torch.bfloat16)
    _expect(swapmoe.DTypeError, kw, which, "expected float8_e4m3fn (use_fp8_w8a8=True)", "got bfloat16")


@requires_torch
def test_e5m2_weights_rejected(rng):
    kw, _ = _fp8_args(rng, "tensor", "torch")
    kw["w1"] = kw["w1"].float().to(torch.float8_e5m2)
    _expect(swapmoe.DTypeError, kw, "w1", "float8_e4m3fn", "got float8_e5m2")


@pytest.mark.parametrize("name", ["w1_scale", "w2_scale", "a1_scale", "a2_scale", "per_channel_quant", "block_shape"])
def test_quant_arguments_without_flag(name, rng):
    case = _case(5, "tensor")
    from conftest import make_problem, to_inputs

    inp = to_inputs(make_problem(rng, case), case, "numpy", "float32")
    kw = dict(hidden_states=inp["x"], w1=inp["w1"], w2=inp["w2"], topk_weights=inp["tw"], topk_ids=inp["ids"])
    kw[name] = {"per_channel_quant": True, "block_shape": [128, 128]}.get(name, f32(1))
    given = {"per_channel_quant": "got True", "block_shape": "got [128, 128]"}.get(
        name, "got a float32 tensor of shape [1]")
    _expect(swapmoe.ArgumentError, kw, name, "without use_fp8_w8a8=True", given)


@requires_torch
def test_scale_on_other_device_named(rng):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to put a scale on")
    kw, _ = _fp8_args(rng, "tensor", "torch")
    kw["w2_scale"] = kw["w2_scale"].cuda()
    with pytest.raises(swapmoe.DeviceError, match="w2_scale"):
        swapmoe.fused_experts(**kw)


# --------------------------------------------------------------------------- torch op


@requires_torch
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_opcheck_fp8(scheme, static, rng):
    if static and scheme != "tensor":
        pytest.skip("static scales are per-tensor only")
    case = _case(6, scheme, ep=True)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme, static=static), case, "torch", "bfloat16")
    args = (inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"])
    kw = dict(activation="silu", apply_router_weight_on_input=False, global_num_experts=-1,
              expert_map=inp["expert_map"], **fp8_kwargs(inp))
    # test_schema is left out: torch's own mutation check multiplies every tensor argument,
    # and torch 2.11 has no CPU multiply for float8_e4m3fn ("mul_cpu_reduced_float" not
    # implemented); the fake-tensor, autograd-registration and AOT checks all run.
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    result = torch.library.opcheck(torch.ops.swapmoe.fused_experts.default, args, kw, test_utils=utils)
    assert result and all(v == "SUCCESS" for v in result.values()), result
    out = torch.zeros_like(inp["x"])
    result = torch.library.opcheck(torch.ops.swapmoe.fused_experts_out.default, (out,) + args, kw, test_utils=utils)
    assert all(v == "SUCCESS" for v in result.values()), result
    functional = torch.ops.swapmoe.fused_experts(*args, **kw)
    api = swapmoe.fused_experts(*args, expert_map=inp["expert_map"], **fp8_kwargs(inp))
    assert torch.equal(functional, api)
    ref, flips = fp8_reference(inp, case)
    check_fp8_close(api, ref, flips, "bfloat16")


@requires_torch
def test_fake_impl_fp8(rng):
    from torch._subclasses.fake_tensor import FakeTensorMode

    case = _case(6, "block")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "block"), case, "torch", "float16")
    with FakeTensorMode() as mode:
        args = [mode.from_tensor(inp[n]) for n in ("x", "w1", "w2", "tw", "ids")]
        got = torch.ops.swapmoe.fused_experts(
            *args, use_fp8_w8a8=True, w1_scale=mode.from_tensor(inp["w1_scale"]),
            w2_scale=mode.from_tensor(inp["w2_scale"]), block_shape=[128, 128])
        assert tuple(got.shape) == (6, case.K) and got.dtype == torch.float16


@requires_torch
@pytest.mark.parametrize("scheme,static", [("channel", False), ("tensor", True), ("tensor", False), ("block", False)])
def test_compile_fullgraph_fp8(scheme, static, rng):
    """torch.compile(fullgraph=True) passes every FP8 argument through the registered op:
    static activation scales (dropping them would quantize dynamically: other bits), channel
    and block scales, the same bits as eager."""
    torch._dynamo.reset()
    case = _case(6, scheme)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme, static=static), case, "torch", "bfloat16")
    assert (inp["a1_scale"] is not None) == static

    def f(x, w1, w2, tw, ids, s1, s2, a1, a2):
        return swapmoe.fused_experts(x, w1, w2, tw, ids, use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2,
                                     a1_scale=a1, a2_scale=a2, per_channel_quant=scheme == "channel",
                                     block_shape=[128, 128] if scheme == "block" else None) * 2

    args = (inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"], inp["w1_scale"], inp["w2_scale"],
            inp["a1_scale"], inp["a2_scale"])
    assert torch.equal(torch.compile(f, fullgraph=True)(*args), f(*args))


@requires_torch
def test_fused_moe_fp8(rng):
    case = _case(7, "tensor", E=8)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "tensor"), case, "torch", "bfloat16")
    logits = torch.randn(7, 8)
    weights, ids = swapmoe.select_experts(logits, 2)
    got = swapmoe.fused_moe(inp["x"], inp["w1"], inp["w2"], logits, 2, **fp8_kwargs(inp))
    want = swapmoe.fused_experts(inp["x"], inp["w1"], inp["w2"], weights, ids, **fp8_kwargs(inp))
    assert torch.equal(got, want)


# --------------------------------------------------------------------------- oracle and workspace


@pytest.mark.parametrize("quant", ["fp8_tensor", "fp8_channel", "fp8_block128"])
def test_select_backend_fp8(quant, monkeypatch):
    monkeypatch.setenv("SWAPMOE_TABLES", "off")  # the heuristics (the shipped FP8 tables: test_tables.py)
    p = swapmoe.select_backend(1, 128, 8, 2048, 768, quant=quant, device_name="NVIDIA H200")
    assert p.backend == "cuda_wgmma_swap" and p.swap_ab
    assert any(k.startswith("swap_moe_fp8_gemm1_") for k in p.tile["kernels"])
    assert any(r.startswith("fp8:") for r in p.reasons)
    # M = 1024 (64 slots per expert): the e4m3 wgmma GEMMs for every scheme (128x128 blocks:
    # scaled at each stage's promotion, GEMM1 quantizes the intermediate itself)
    p = swapmoe.select_backend(1024, 128, 8, 2048, 768, quant=quant, device_name="NVIDIA H200")
    assert p.backend == "cuda_wgmma" and not p.swap_ab
    assert any(k.startswith("wgmma_moe_fp8_gemm1_") for k in p.tile["kernels"])
    assert (quant == "fp8_channel") == any("quant_inter" in k for k in p.tile["kernels"])
    # 128x128 blocks with N not a multiple of 128: the SIMT FP8 kernels
    if quant == "fp8_block128":
        p = swapmoe.select_backend(1024, 128, 8, 2048, 704, quant=quant, device_name="NVIDIA H200")
        assert p.backend == "cuda_generic"
        assert any("cuda_wgmma: rejected" in r and "N must be a multiple of 128" in r for r in p.reasons)
        assert any("cuda_mma: rejected" in r and "FP8" in r for r in p.reasons)
    # On Ada (sm_89) there is no wgmma: the SIMT FP8 kernels.
    p = swapmoe.select_backend(1024, 128, 8, 2048, 768, quant=quant, device_name="NVIDIA L40S")
    assert p.backend == "cuda_generic"
    with pytest.raises(swapmoe.ArgumentError, match="sm_89"):
        swapmoe.select_backend(1, 128, 8, 2048, 768, quant=quant, device_name="NVIDIA A100-SXM4-80GB")
    p = swapmoe.select_backend(1, 128, 8, 2048, 768, quant=quant, device_name="NVIDIA L40S")
    assert p.backend == "cuda_decode"


def test_workspace_bytes_fp8(rng):
    case = _case(5, "block")
    inp = to_fp8_inputs(make_fp8_problem(rng, case, "block"), case, "numpy", "float32")
    plain = swapmoe.workspace_bytes(inp["x"], inp["w1"], inp["ids"])
    fp8 = swapmoe.workspace_bytes(inp["x"], inp["w1"], inp["ids"], "fp8_block128")
    (M, K), (E, two_n, _), topk = inp["x"].shape, inp["w1"].shape, inp["ids"].shape[1]
    S, N = M * topk, two_n // 2
    # FP8: the float32 intermediate [S, N], the e4m3 input [M, K] and the per-slot output
    # (128x128 blocks: no e4m3 intermediate [S, N], which only cuda_wgmma's schemes use)
    assert fp8 >= 4 * S * N + M * K + 4 * S * K
    # unquantized at M <= 64: the swap-AB path's per-(expert, token) rows [min(E, S), M, N]
    # in the activation dtype (float32 here) and the per-slot output
    assert plain >= 4 * min(E, S) * M * N + 4 * S * K
    with pytest.raises(swapmoe.ArgumentError, match="quant"):
        swapmoe.workspace_bytes(inp["x"], inp["w1"], inp["ids"], "int4")


def test_workspace_holds_e4m3_swap_rows_only_for_per_tensor_fp8():
    """Per-tensor FP8 with a static intermediate scale writes e4m3 rows per (active expert,
    token), [min(E, S), M, N]; the other schemes keep only the float32 rows per slot."""
    from swapmoe import _core
    M, topk, E, N, K = 64, 8, 128, 768, 2048
    S = M * topk
    A = min(E, S)
    assert A * M * N > 4 * S * N  # the e4m3 rows are the larger section at this shape
    per_tensor = _core.workspace_bytes(M, topk, N, K, E, 2, "fp8_tensor")
    assert per_tensor >= A * M * N + 4 * S * K
    for quant in ("fp8_channel", "fp8_block128"):
        assert _core.workspace_bytes(M, topk, N, K, E, 2, quant) < A * M * N + 4 * S * K
    # cuda_wgmma's e4m3 intermediate [S, N] is there for every scheme; blocks add only their
    # scale sections (input [M, K/128], intermediate [S, N/128]) over per-channel's
    channel = _core.workspace_bytes(M, topk, N, K, E, 2, "fp8_channel")
    block = _core.workspace_bytes(M, topk, N, K, E, 2, "fp8_block128")
    assert channel >= 4 * S * N + S * N + 4 * S * K
    assert 0 <= block - channel <= 4 * (M * K // 128 + S * N // 128) + 2 * 256


def _naive_refs(x, w1, w2, tw, ids, emap, on_input, E):
    """fused_experts_ref as one product per slot (its form before 2026-12-05), silu."""
    M, topk = ids.shape
    n = w1.shape[1] // 2
    out = np.zeros((M, w2.shape[1]))
    for m in range(M):
        for k in range(topk):
            g = int(ids[m, k])
            if not 0 <= g < len(emap):
                continue
            e = int(emap[g])
            if not 0 <= e < E:
                continue
            xin = x[m] * tw[m, k] if on_input else x[m]
            h = w1[e] @ xin
            y = w2[e] @ (h[:n] / (1 + np.exp(-h[:n])) * h[n:])
            out[m] += y if on_input else tw[m, k] * y
    return out


@pytest.mark.parametrize("on_input", [False, True])
def test_references_by_expert_match_one_product_per_slot(on_input):
    """The float64 references group each top-k position's tokens by expert (one product per
    expert, so the weights are read once per k): the same result as one product per slot,
    with repeated ids, -1, ids past E, an expert map with -1, and both router-weight modes.
    (The FP8 reference groups the same way; every FP8 CPU and GPU test checks against it.)"""
    from swapmoe.reference import fused_experts_ref

    rng = np.random.default_rng(7)
    E, G, M, topk, K, N = 6, 9, 23, 3, 32, 16
    x = rng.normal(size=(M, K))
    w1 = rng.normal(size=(E, 2 * N, K)) / K**0.5
    w2 = rng.normal(size=(E, K, N)) / N**0.5
    tw = rng.uniform(size=(M, topk))
    ids = rng.integers(-1, G + 1, size=(M, topk))
    ids[0] = [2, 2, 2]  # one token, the same expert three times
    emap = np.array([0, 1, 2, -1, 3, 4, 5, -1, 1])  # global 3 and 7 are elsewhere
    got = fused_experts_ref(x, w1, w2, tw, ids, apply_router_weight_on_input=on_input, global_num_experts=G,
                            expert_map=emap)
    want = _naive_refs(x, w1, w2, tw, ids, emap, on_input, E)
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.any(got[0] != 0) and np.all(got[[m for m in range(M) if all(
        not 0 <= i < G or emap[i] < 0 for i in ids[m])]] == 0)


@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_flip_deltas_move_the_row(scheme, rng):
    """Every flip the reference lists (an element near an e4m3 midpoint) carries the change
    in the output row that rounding it the other way would make: never zero."""
    case = Case(4, 8, 2, 136, 144)
    inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme), case, "numpy", "float32")
    _, flips = fused_experts_fp8_ref(
        to_f64(inp["x"]), e4m3_decode(inp["w1"]), e4m3_decode(inp["w2"]), to_f64(inp["tw"]),
        inp["ids"].astype(np.int64), w1_scale=inp["w1_scale"], w2_scale=inp["w2_scale"],
        per_channel_quant=scheme == "channel", block_shape=[128, 128] if scheme == "block" else None,
        flip_margin=0.5)
    assert len(flips) > 100
    assert all(np.linalg.norm(d) > 0 for _, d in flips)


@pytest.mark.parametrize("lib", ["numpy", pytest.param("torch", marks=requires_torch)])
@pytest.mark.parametrize("scale", [0.0, 1e-5])
def test_per_tensor_dynamic_scale_floor(scale, lib, rng):
    """All-zero and tiny inputs under a dynamic per-tensor scale: the scale's floor keeps the
    reference and the op finite; zeros give exact zeros."""
    case = Case(6, 8, 2, 64, 64, out="poison")
    prob = make_fp8_problem(rng, case, "tensor")
    prob["x"] = (prob["x"] * np.float32(scale)).astype(np.float32)
    inp = to_fp8_inputs(prob, case, lib, "float32")
    ref, flips = fp8_reference(inp, case)
    out = fp8_call(inp, case, out=poison(inp["x"]))
    o = to_f64(out)
    assert np.isfinite(ref).all() and np.isfinite(o).all()
    if scale == 0.0:
        assert not o.any()
    else:
        check_fp8_close(out, ref, flips, "float32")
