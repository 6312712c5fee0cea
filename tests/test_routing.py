"""The routers on the CPU: ``swapmoe.select_experts`` and ``swapmoe.fused_moe`` (numpy and
torch CPU, logits fp32 / bf16 / fp16) against the float64 reference
(``swapmoe.reference.select_experts_ref`` / ``fused_moe_ref``): the router variants of
Mixtral, Qwen3, DeepSeek-V3 (grouped sigmoid with a correction bias and a routed scaling
factor), a grouped softmax and Llama-4 (top-1 sigmoid); exact ties, -inf and NaN logits;
hypothesis properties; argument errors; opcheck and torch.compile.

Logits are drawn as a random permutation of well-separated values (multiples of 1/16,
exactly representable in bf16 and fp16, so every dtype sees the same values), and the
correction bias as distinct multiples of 1/512; rows whose biased scores still come
within a float32 rounding of a tie that matters are redrawn. Ids are then compared
exactly and weights with a float32 tolerance."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import swapmoe
from conftest import TOLERANCE, check_close, dtype_name, requires_torch, to_f64, torch
from swapmoe.reference import fused_moe_ref, rel_error, select_experts_ref

# --------------------------------------------------------------------------- variants


@dataclasses.dataclass(frozen=True)
class Router:
    name: str
    E: int
    topk: int
    scoring: str = "softmax"
    renormalize: bool = True
    groups: Optional[tuple] = None  # (num_expert_group, topk_group)
    bias: bool = False
    scale: float = 1.0

    def kwargs(self) -> dict:
        """Keyword arguments of select_experts / fused_moe (without the bias tensor)."""
        kw = dict(renormalize=self.renormalize, scoring=self.scoring, routed_scaling_factor=self.scale)
        if self.groups is not None:
            kw.update(num_expert_group=self.groups[0], topk_group=self.groups[1])
        return kw


VARIANTS = [
    Router("mixtral", 8, 2),
    Router("mixtral_no_renorm", 8, 2, renormalize=False),
    Router("qwen3", 128, 8),
    Router("qwen3_no_renorm", 128, 8, renormalize=False),
    Router("deepseek_v3", 256, 8, "sigmoid", groups=(8, 4), bias=True, scale=2.5),
    Router("grouped_softmax", 160, 6, groups=(8, 3), renormalize=False),
    Router("llama4", 16, 1, "sigmoid", renormalize=False),
]
VARIANT_IDS = [v.name for v in VARIANTS]
BY_NAME = {v.name: v for v in VARIANTS}

# (library, logits dtype): numpy has no bfloat16
LIB_DTYPES = [
    ("numpy", "float32"),
    ("numpy", "float16"),
    ("torch", "float32"),
    ("torch", "bfloat16"),
    ("torch", "float16"),
]

# Logits: multiples of 1/16 in [-8, 8): 256 values, exact in fp32, bf16 and fp16.
LOGIT_GRID = np.arange(-128, 128, dtype=np.float32) / np.float32(16)
# Bias: multiples of 1/512 in [-0.25, 0.25): exact in every dtype too.
BIAS_GRID = np.arange(-128, 128, dtype=np.float32) / np.float32(512)
NEAR_TIE = 2e-6  # relative gap under which float32 and float64 may order two scores differently

W_RTOL = 1e-5  # weights, float32 routing against the float64 reference


def _need(lib: str) -> None:
    if lib == "torch" and torch is None:
        pytest.skip("needs torch")


# --------------------------------------------------------------------------- inputs


def scores64(logits: np.ndarray, scoring: str) -> np.ndarray:
    """float64 scores of float32 logits (rows), NaN/inf as the reference treats them."""
    x = np.asarray(logits, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if scoring == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        ex = np.exp(x - x.max(axis=-1, keepdims=True))
        return ex / ex.sum(axis=-1, keepdims=True)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= NEAR_TIE * max(abs(a), abs(b))


def _sorted_gaps_ok(vals: np.ndarray, count: int) -> bool:
    """No near-tie among the best ``count + 1`` values (which decide the best ``count``
    and their order)."""
    top = np.sort(vals)[::-1][: count + 1]
    return not any(_close(top[i], top[i + 1]) for i in range(len(top) - 1))


def near_tie(row: np.ndarray, r: Router, bias: Optional[np.ndarray]) -> bool:
    """Whether float32 rounding could change the routing of this row of logits."""
    s = scores64(row[None], r.scoring)[0]
    sel = s + bias if bias is not None else s
    allowed = np.ones(r.E, bool)
    if r.groups is not None:
        ng, tg = r.groups
        g = sel.reshape(ng, -1)
        gs = np.sort(g, axis=1)[:, ::-1]
        gscore = gs[:, :2].sum(axis=1) if bias is not None else gs[:, 0]
        if not _sorted_gaps_ok(gscore, tg):
            return True
        keep = np.argsort(-gscore, kind="stable")[:tg]
        allowed = np.isin(np.arange(r.E) // (r.E // ng), keep)
    return not _sorted_gaps_ok(sel[allowed], r.topk)


def draw_bias(rng: np.random.Generator, r: Router) -> Optional[np.ndarray]:
    if not r.bias:
        return None
    return rng.permutation(distinct_grid(BIAS_GRID, r.E))[: r.E].copy()


def distinct_grid(grid: np.ndarray, n: int) -> np.ndarray:
    """``grid`` when it has n values, else the same range at a finer power-of-two step
    (float32-exact; bf16-exact up to 512 values)."""
    if n <= grid.size:
        return grid
    refine = 1 << int(np.ceil(np.log2(n / grid.size)))
    return np.arange(grid.size * refine, dtype=np.float32) * ((grid[1] - grid[0]) / refine) + grid[0]


def draw_logits(rng: np.random.Generator, r: Router, M: int, bias: Optional[np.ndarray] = None) -> np.ndarray:
    """[M, E] float32: each row E distinct grid values in random order, redrawn while the
    routing of the row has a near-tie."""
    out = np.empty((M, r.E), np.float32)
    for m in range(M):
        for _ in range(100):
            out[m] = rng.permutation(distinct_grid(LOGIT_GRID, r.E))[: r.E]
            if not near_tie(out[m], r, bias):
                break
        else:  # pragma: no cover - 100 draws in a row with a near-tie
            raise AssertionError("could not draw logits without a near-tie")
    return out


def as_lib(a: Optional[np.ndarray], lib: str, dtype: str, device: str = "cpu"):
    """numpy array or torch tensor of dtype (None stays None)."""
    if a is None:
        return None
    if lib == "numpy":
        return np.ascontiguousarray(a.astype({"float32": np.float32, "float16": np.float16}[dtype]))
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(device=device, dtype=getattr(torch, dtype))


def as_f32(t) -> np.ndarray:
    """The logits as the op sees them, widened to float32 (bf16/fp16 -> f32 is exact)."""
    if torch is not None and isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float32).numpy()
    return np.asarray(t, np.float32)


def route(r: Router, logits, bias=None, **kw):
    return swapmoe.select_experts(logits, r.topk, e_score_correction_bias=bias, **{**r.kwargs(), **kw})


def route_ref(r: Router, logits, bias=None, **kw):
    b = None if bias is None else as_f32(bias)
    return select_experts_ref(as_f32(logits), r.topk, e_score_correction_bias=b, **{**r.kwargs(), **kw})


def check_routing(r: Router, got, ref, *, what: str = "") -> None:
    """Output types and shapes, ids exactly, weights to a float32 tolerance (NaN where the
    reference has NaN)."""
    w, ids = got
    wr, idr = ref
    M = wr.shape[0]
    assert tuple(w.shape) == (M, r.topk) and tuple(ids.shape) == (M, r.topk), (w.shape, ids.shape)
    assert dtype_name(w) == "float32" and dtype_name(ids) == "int32", (dtype_name(w), dtype_name(ids))
    ids64 = np.asarray(ids.cpu() if hasattr(ids, "cpu") else ids).astype(np.int64)
    bad = np.argwhere(ids64 != idr)
    assert bad.size == 0, f"{what}: ids differ at {bad[:5].tolist()}: got {ids64[bad[0][0]]}, want {idr[bad[0][0]]}"
    np.testing.assert_allclose(to_f64(w), wr, rtol=W_RTOL, atol=0, equal_nan=True, err_msg=what)


# --------------------------------------------------------------------------- select_experts


@pytest.mark.parametrize("lib,dtype", LIB_DTYPES)
@pytest.mark.parametrize("r", VARIANTS, ids=VARIANT_IDS)
def test_select_experts_matches_reference(r, lib, dtype, rng):
    _need(lib)
    bias = draw_bias(rng, r)
    logits = draw_logits(rng, r, 37, bias)
    g = as_lib(logits, lib, dtype)
    b = as_lib(bias, lib, "float32")
    got = route(r, g, b)
    if lib == "numpy":
        assert isinstance(got[0], np.ndarray) and isinstance(got[1], np.ndarray)
    else:
        assert isinstance(got[0], torch.Tensor) and got[0].device.type == "cpu"
    check_routing(r, got, route_ref(r, g, b), what=f"{r.name} {lib} {dtype}")
    # the logits are well separated: the picks are not a degenerate lowest-index pattern
    ids = np.asarray(got[1])
    assert len({tuple(row) for row in ids.tolist()}) > 1


@pytest.mark.parametrize("r", VARIANTS, ids=VARIANT_IDS)
def test_select_experts_numpy_matches_torch_bitwise(r, rng):
    """numpy and torch take the same CPU router: the same bits."""
    _need("torch")
    bias = draw_bias(rng, r)
    logits = draw_logits(rng, r, 19, bias)
    wn, idn = route(r, logits, bias)
    wt, idt = route(r, torch.from_numpy(logits), None if bias is None else torch.from_numpy(bias))
    assert wn.tobytes() == wt.numpy().tobytes() and np.array_equal(idn, idt.numpy())


@pytest.mark.parametrize("bias_dtype", ["bfloat16", "float16"])
def test_bias_dtypes(bias_dtype, rng):
    """A bf16/fp16 correction bias is read as its own dtype (the reference sees the same
    rounded values)."""
    _need("torch")
    r = BY_NAME["deepseek_v3"]
    bias = draw_bias(rng, r)  # exact in every dtype
    logits = draw_logits(rng, r, 16, bias)
    g = torch.from_numpy(logits).bfloat16()
    b = as_lib(bias, "torch", bias_dtype)
    check_routing(r, route(r, g, b), route_ref(r, g, b))
    # the bias matters: without it the routing differs somewhere
    assert not np.array_equal(route(r, g)[1].numpy(), route(r, g, b)[1].numpy())


def test_bias_without_groups_steers_selection(rng):
    """A bias without grouping steers selection; the weights stay unbiased."""
    r = Router("biased_sigmoid", 16, 4, "sigmoid", bias=True, scale=2.5)
    bias = draw_bias(rng, r)
    logits = draw_logits(rng, r, 23, bias)
    got = route(r, logits, bias)
    check_routing(r, got, route_ref(r, logits, bias))
    big = np.zeros(16, np.float32)
    big[[3, 11]] = 10.0  # a large bias forces experts 3 and 11 first
    w, ids = route(dataclasses.replace(r, renormalize=False, scale=1.0), logits, big)
    assert set(ids[:, :2].ravel().tolist()) <= {3, 11}
    s = scores64(logits, "sigmoid")
    np.testing.assert_allclose(w, np.take_along_axis(s, ids.astype(np.int64), 1), rtol=W_RTOL)


def test_noncontiguous_logits(rng):
    """Logits that are a column window of a wider buffer (row stride > E), NaN around."""
    r = BY_NAME["deepseek_v3"]
    bias = draw_bias(rng, r)
    logits = draw_logits(rng, r, 9, bias)
    buf = np.full((9, r.E + 13), np.nan, np.float32)
    buf[:, 5 : 5 + r.E] = logits
    view = buf[:, 5 : 5 + r.E]
    check_routing(r, route(r, view, bias), route_ref(r, logits, bias))
    if torch is not None:
        tbuf = torch.from_numpy(buf)
        check_routing(r, route(r, tbuf[:, 5 : 5 + r.E], torch.from_numpy(bias)), route_ref(r, logits, bias))


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_m0(lib):
    _need(lib)
    r = BY_NAME["deepseek_v3"]
    g = as_lib(np.zeros((0, r.E), np.float32), lib, "float32")
    b = as_lib(np.zeros(r.E, np.float32), lib, "float32")
    w, ids = route(r, g, b)
    assert tuple(w.shape) == (0, 8) and tuple(ids.shape) == (0, 8)
    assert dtype_name(w) == "float32" and dtype_name(ids) == "int32"


def test_topk_equals_e(rng):
    """topk == E: every expert, in descending order; renormalized weights sum to 1."""
    r = Router("all", 8, 8)
    logits = draw_logits(rng, r, 5)
    w, ids = route(r, logits)
    check_routing(r, (w, ids), route_ref(r, logits))
    assert all(sorted(row) == list(range(8)) for row in ids.tolist())
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)


def test_cpu_router_has_no_expert_limit(rng):
    """The CPU router takes more than the GPU's 1024 experts (and topk > 32)."""
    r = Router("e2048", 2048, 40, "sigmoid", groups=(16, 5), bias=True)
    grid = np.arange(-1024, 1024, dtype=np.float32) / np.float32(128)  # distinct, exact
    bias = (rng.permutation(np.arange(-1024, 1024))[: r.E] / 8192).astype(np.float32)
    rows = []
    while len(rows) < 3:
        row = rng.permutation(grid)
        if not near_tie(row, r, bias):
            rows.append(row)
    logits = np.stack(rows)
    check_routing(r, route(r, logits, bias), route_ref(r, logits, bias))


def test_routed_scaling_factor_applies_without_renormalize(rng):
    r = Router("scaled", 16, 3, "sigmoid", renormalize=False, scale=2.5)
    logits = draw_logits(rng, r, 7)
    w, ids = route(r, logits)
    w1, ids1 = route(dataclasses.replace(r, scale=1.0), logits)
    assert np.array_equal(ids, ids1)
    np.testing.assert_allclose(w, 2.5 * w1, rtol=1e-6)


# --------------------------------------------------------------------------- fused_moe

N_FF, K_HID = 32, 64


def moe_weights(rng: np.random.Generator, E: int, N: int = N_FF, K: int = K_HID):
    w1 = rng.standard_normal((E, 2 * N, K), dtype=np.float32) / np.float32(math.sqrt(K))
    w2 = rng.standard_normal((E, K, N), dtype=np.float32) / np.float32(math.sqrt(N))
    return w1, w2


def half_expert_map(rng: np.random.Generator, global_e: int) -> np.ndarray:
    """[global_E] int32: half the global experts map to a permutation of E/2 local ones
    (expert parallelism), the rest to -1."""
    local = max(global_e // 2, 1)
    emap = np.full(global_e, -1, np.int32)
    emap[rng.permutation(global_e)[:local]] = rng.permutation(local)
    return emap


def moe_problem(rng, r: Router, M: int, ep: bool):
    bias = draw_bias(rng, r)
    emap = half_expert_map(rng, r.E) if ep else None
    local = r.E if emap is None else int((emap >= 0).sum())
    w1, w2 = moe_weights(rng, local)
    x = rng.standard_normal((M, K_HID), dtype=np.float32)
    return dict(x=x, w1=w1, w2=w2, logits=draw_logits(rng, r, M, bias), bias=bias, emap=emap)


def moe_inputs(prob: dict, lib: str, dtype: str, logits_dtype: Optional[str] = None, device: str = "cpu") -> dict:
    logits_dtype = logits_dtype or dtype
    conv = lambda a, d: as_lib(a, lib, d, device)  # noqa: E731
    emap = prob["emap"]
    if emap is not None:
        emap = emap.copy() if lib == "numpy" else torch.from_numpy(emap).to(device)
    return dict(
        x=conv(prob["x"], dtype),
        w1=conv(prob["w1"], dtype),
        w2=conv(prob["w2"], dtype),
        logits=conv(prob["logits"], logits_dtype),
        bias=conv(prob["bias"], "float32"),
        emap=emap,
    )


def moe_call(r: Router, inp: dict, **kw):
    return swapmoe.fused_moe(
        inp["x"], inp["w1"], inp["w2"], inp["logits"], r.topk,
        e_score_correction_bias=inp["bias"], expert_map=inp["emap"], **{**r.kwargs(), **kw},
    )


def moe_ref(r: Router, inp: dict, **kw) -> np.ndarray:
    emap = inp["emap"]
    return fused_moe_ref(
        to_f64(inp["x"]), to_f64(inp["w1"]), to_f64(inp["w2"]), as_f32(inp["logits"]), r.topk,
        e_score_correction_bias=None if inp["bias"] is None else as_f32(inp["bias"]),
        expert_map=None if emap is None else np.asarray(emap.cpu() if hasattr(emap, "cpu") else emap),
        **{**r.kwargs(), **kw},
    )


MOE_LIB_DTYPES = [("numpy", "float32"), ("numpy", "float16"), ("torch", "float32"), ("torch", "bfloat16")]


@pytest.mark.parametrize("ep", [False, True], ids=["no_map", "ep"])
@pytest.mark.parametrize("lib,dtype", MOE_LIB_DTYPES)
@pytest.mark.parametrize("r", VARIANTS, ids=VARIANT_IDS)
def test_fused_moe_matches_reference(r, lib, dtype, ep, rng):
    _need(lib)
    prob = moe_problem(rng, r, 16, ep)
    inp = moe_inputs(prob, lib, dtype)
    ref = moe_ref(r, inp)
    assert np.linalg.norm(ref) > 0, "degenerate case: the reference is all zeros"
    out = moe_call(r, inp)
    check_close(out, ref, dtype, what=f"{r.name} {lib} {dtype} ep={ep}")


@pytest.mark.parametrize("logits_dtype", ["float32", "bfloat16"])
def test_fused_moe_logits_dtype_independent_of_hidden_dtype(logits_dtype, rng):
    """bf16 hidden states with fp32 logits and the other way round."""
    _need("torch")
    r = BY_NAME["deepseek_v3"]
    prob = moe_problem(rng, r, 12, ep=False)
    hidden = "float32" if logits_dtype == "bfloat16" else "bfloat16"
    inp = moe_inputs(prob, "torch", hidden, logits_dtype)
    check_close(moe_call(r, inp), moe_ref(r, inp), hidden)


@pytest.mark.parametrize("libs", [("torch", "numpy"), ("numpy", "torch")])
def test_fused_moe_mixed_libraries(libs, rng):
    """Tensors of two libraries (torch hidden states and numpy logits, or the other way round):
    the hidden states' library allocates the output, and the result is the one-library one."""
    _need("torch")
    hidden_lib, logits_lib = libs
    r = BY_NAME["qwen3"]
    prob = moe_problem(rng, r, 9, ep=True)
    inp = moe_inputs(prob, hidden_lib, "float32")
    one_lib = moe_call(r, inp)
    mixed = dict(inp, logits=moe_inputs(prob, logits_lib, "float32")["logits"])
    got = moe_call(r, mixed)
    assert type(got) is type(inp["x"])
    assert np.array_equal(np.asarray(got), np.asarray(one_lib))


def test_fused_moe_logits_torch_cannot_import_are_named():
    """torch hidden states with logits whose producer refuses DLPack: a DTypeError naming
    gating_output and the refusal; a MemoryError of the producer goes up unchanged."""
    _need("torch")

    class Refusing:
        shape = (3, 8)

        def __dlpack__(self, **kw):
            raise BufferError("cannot export")

        def __dlpack_device__(self):
            return (1, 0)

    class OutOfMemory(Refusing):
        def __dlpack__(self, **kw):
            raise MemoryError("producer")

    x, w1, w2 = torch.randn(3, K_HID), torch.randn(8, 2 * N_FF, K_HID), torch.randn(8, K_HID, N_FF)
    with pytest.raises(swapmoe.DTypeError, match="gating_output: .*torch can import.*cannot export"):
        swapmoe.fused_moe(x, w1, w2, Refusing(), 2)
    with pytest.raises(MemoryError, match="producer"):
        swapmoe.fused_moe(x, w1, w2, OutOfMemory(), 2)


def test_fused_moe_llama4_router_weight_on_input(rng):
    """Llama-4: top-1 sigmoid, the router weight applied to the input."""
    r = BY_NAME["llama4"]
    prob = moe_problem(rng, r, 16, ep=False)
    inp = moe_inputs(prob, "numpy", "float32")
    ref = moe_ref(r, inp, apply_router_weight_on_input=True)
    out = moe_call(r, inp, apply_router_weight_on_input=True)
    check_close(out, ref, "float32")
    assert rel_error(moe_ref(r, inp), ref) > 10 * TOLERANCE["float32"]  # the flag matters


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_fused_moe_out_and_activation(lib, rng):
    _need(lib)
    r = BY_NAME["qwen3"]
    prob = moe_problem(rng, r, 10, ep=True)
    inp = moe_inputs(prob, lib, "float32")
    given = np.full((10, K_HID), np.nan, np.float32) if lib == "numpy" else torch.full((10, K_HID), math.nan)
    got = moe_call(r, inp, activation="gelu", out=given)
    assert got is given
    check_close(given, moe_ref(r, inp, activation="gelu"), "float32")


def test_fused_moe_equals_select_then_fused_experts(rng):
    """fused_moe is select_experts then fused_experts: identical bits."""
    _need("torch")
    r = BY_NAME["deepseek_v3"]
    inp = moe_inputs(moe_problem(rng, r, 16, ep=True), "torch", "bfloat16")
    w, ids = route(r, inp["logits"], inp["bias"])
    two_step = swapmoe.fused_experts(inp["x"], inp["w1"], inp["w2"], w, ids, expert_map=inp["emap"])
    assert torch.equal(moe_call(r, inp), two_step)


# --------------------------------------------------------------------------- ties


@pytest.mark.parametrize("lib,dtype", [("numpy", "float32"), ("torch", "bfloat16"), ("numpy", "float16")])
@pytest.mark.parametrize("r", VARIANTS, ids=VARIANT_IDS)
def test_all_equal_logits_pick_lowest_indices(r, lib, dtype, rng):
    _need(lib)
    bias = None if not r.bias else np.zeros(r.E, np.float32)  # a constant bias keeps the tie
    value = float(rng.choice(LOGIT_GRID))
    g = as_lib(np.full((3, r.E), value, np.float32), lib, dtype)
    b = as_lib(bias, lib, "float32")
    w, ids = route(r, g, b)
    check_routing(r, (w, ids), route_ref(r, g, b))
    assert (np.asarray(ids) == np.arange(r.topk)).all(), ids
    if r.renormalize:
        np.testing.assert_allclose(to_f64(w), r.scale / r.topk, rtol=1e-6)


def test_partial_ties_go_to_lowest_index():
    r = Router("ties", 8, 5)
    logits = np.array([[1, 3, 3, 0, 3, 2, 2, -1], [0, 0, 0, 0, 5, 0, 0, 5]], np.float32)
    w, ids = route(r, logits)
    assert ids.tolist() == [[1, 2, 4, 5, 6], [4, 7, 0, 1, 2]]
    check_routing(r, (w, ids), route_ref(r, logits))
    # equal logits, equal weights
    assert w[0, 0] == w[0, 1] == w[0, 2] and w[0, 3] == w[0, 4]


def test_group_ties_go_to_lowest_group():
    """Groups 1 and 3 tie for the best group score: group 1 is kept."""
    r = Router("group_ties", 8, 2, "sigmoid", groups=(4, 1))
    logits = np.array([[0, 1, 2, 0, 0, 1, 0, 2]], np.float32)
    w, ids = route(r, logits)
    assert ids.tolist() == [[2, 3]]
    check_routing(r, (w, ids), route_ref(r, logits))
    # with a bias: group scores are sums of two; groups 0 and 2 tie at 1.5 + 0.5
    rb = dataclasses.replace(r, bias=True)
    logits = np.zeros((1, 8), np.float32)
    bias = np.array([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 0.0, 0.0], np.float32)
    w, ids = route(rb, logits, bias)
    assert ids.tolist() == [[0, 1]]
    check_routing(rb, (w, ids), route_ref(rb, logits, bias))


def test_group_score_is_sum_of_two_best_with_bias():
    """Without a bias the group with the single best expert wins (max); with one (even a
    zero bias) the group whose two best experts sum higher wins."""
    # group 0: sigmoid 0.953 and ~0 (max 0.953, sum 0.953); group 1: 0.731 twice (sum 1.462)
    logits = np.array([[3.0, -9.0, -9.0, -9.0, 1.0, 1.0, -9.0, -9.0]], np.float32)
    nob = Router("g", 8, 2, "sigmoid", groups=(2, 1))
    w, ids = route(nob, logits)
    assert ids.tolist() == [[0, 1]]
    check_routing(nob, (w, ids), route_ref(nob, logits))
    wb = dataclasses.replace(nob, bias=True)
    bias = np.zeros(8, np.float32)
    w, ids = route(wb, logits, bias)
    assert ids.tolist() == [[4, 5]]
    check_routing(wb, (w, ids), route_ref(wb, logits, bias))


# --------------------------------------------------------------------------- -inf


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("r", VARIANTS, ids=VARIANT_IDS)
def test_some_neg_inf_never_picked_unless_needed(r, lib, rng):
    _need(lib)
    bias = draw_bias(rng, r)
    logits = draw_logits(rng, r, 24, bias)
    for m in range(logits.shape[0]):
        # -inf on about half the experts, redrawn until enough finite ones are in reach
        # (with a bias, a -inf expert's biased score is its bias: it may rank above a
        # finite one; such rows are redrawn too)
        for _ in range(200):
            row = np.where(rng.random(r.E) < 0.5, -np.inf, logits[m]).astype(np.float32)
            picks = select_experts_ref(row[None], r.topk, **_ref_kw(r, bias))[1][0]
            if np.isfinite(row[picks]).all() and not near_tie(row, r, bias) and np.isinf(row).any():
                break
        else:  # pragma: no cover
            raise AssertionError("could not draw a row")
        logits[m] = row
    g, b = as_lib(logits, lib, "float32"), as_lib(bias, lib, "float32")
    w, ids = route(r, g, b)
    check_routing(r, (w, ids), route_ref(r, g, b))
    ids = np.asarray(ids).astype(np.int64)
    assert np.isfinite(np.take_along_axis(logits, ids, 1)).all(), "a -inf expert was picked"
    assert np.isfinite(to_f64(w)).all() and (to_f64(w) > 0).all()


def _ref_kw(r: Router, bias) -> dict:
    return dict(e_score_correction_bias=bias, **r.kwargs())


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_neg_inf_picked_when_needed(scoring, renormalize):
    """Only one finite logit and topk 3: the finite expert, then the lowest -inf ones,
    with weight 0."""
    r = Router("needed", 8, 3, scoring, renormalize=renormalize)
    logits = np.full((1, 8), -np.inf, np.float32)
    logits[0, 5] = 0.5
    w, ids = route(r, logits)
    assert ids.tolist() == [[5, 0, 1]]
    assert (w[0, 1:] == 0).all() and w[0, 0] > 0
    if renormalize:
        assert w[0, 0] == 1.0
    check_routing(r, (w, ids), route_ref(r, logits))


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_softmax_row_all_neg_inf_is_nan(lib):
    """A softmax row of -inf has no distribution: NaN weights (never a silent 0), ids
    0..topk-1; the other rows are unaffected; fused_moe's row is NaN."""
    _need(lib)
    r = BY_NAME["qwen3"]
    rng = np.random.default_rng(7)
    prob = moe_problem(rng, r, 4, ep=False)
    prob["logits"][2] = -np.inf
    inp = moe_inputs(prob, lib, "float32")
    w, ids = route(r, inp["logits"])
    w, ids = to_f64(w), np.asarray(ids)
    assert np.isnan(w[2]).all() and ids[2].tolist() == list(range(r.topk))
    assert np.isfinite(w[[0, 1, 3]]).all()
    check_routing(r, route(r, inp["logits"]), route_ref(r, inp["logits"]))
    out = to_f64(moe_call(r, inp))
    assert np.isnan(out[2]).all(), "an all -inf softmax row must not give a finite output"
    assert np.isfinite(out[[0, 1, 3]]).all()


@pytest.mark.parametrize("renormalize", [True, False])
def test_sigmoid_row_all_neg_inf(renormalize):
    """All sigmoid scores 0: weights 0 without renormalize, 0/0 = NaN with it."""
    r = Router("sig", 16, 4, "sigmoid", renormalize=renormalize)
    logits = np.full((2, 16), -np.inf, np.float32)
    w, ids = route(r, logits)
    assert (ids == np.arange(4)).all()
    if renormalize:
        assert np.isnan(w).all()
    else:
        assert (w == 0).all()
    check_routing(r, (w, ids), route_ref(r, logits))


# --------------------------------------------------------------------------- NaN


@pytest.mark.parametrize("lib,dtype", [("numpy", "float32"), ("torch", "bfloat16"), ("torch", "float16")])
@pytest.mark.parametrize("r", [v for v in VARIANTS if v.scoring == "sigmoid"], ids=lambda v: v.name)
def test_sigmoid_nan_is_picked_first(r, lib, dtype, rng):
    """A NaN logit: that expert comes first with a NaN weight (all NaN after
    renormalize); its fused_moe row is NaN, never silently finite; other rows unaffected."""
    _need(lib)
    M, t = 6, 3
    prob = moe_problem(rng, r, M, ep=False)
    j = int(rng.integers(r.E))
    prob["logits"][t, j] = np.nan
    inp = moe_inputs(prob, lib, dtype)
    w, ids = route(r, inp["logits"], inp["bias"])
    check_routing(r, (w, ids), route_ref(r, inp["logits"], inp["bias"]))
    w, ids = to_f64(w), np.asarray(ids)
    assert ids[t, 0] == j
    if r.renormalize:
        assert np.isnan(w[t]).all()
    else:
        assert np.isnan(w[t, 0]) and np.isfinite(w[t, 1:]).all()
    assert np.isfinite(np.delete(w, t, axis=0)).all()
    if r.groups is not None:  # NaN's group is kept: picks come only from kept groups
        gs = r.E // r.groups[0]
        assert len(set((ids[t] // gs).tolist())) <= r.groups[1]
    out = to_f64(moe_call(r, inp))
    assert np.isnan(out[t]).all(), "a NaN router logit must reach the output row"
    ref = moe_ref(r, inp)
    keep = np.arange(M) != t
    assert np.isfinite(out[keep]).all()
    assert rel_error(out[keep], ref[keep]) <= TOLERANCE[dtype]


def test_sigmoid_several_nans_in_index_order():
    r = Router("nans", 8, 4, "sigmoid", renormalize=False)
    logits = np.array([[0.5, np.nan, 2.0, np.nan, -1.0, 3.0, np.nan, 0.0]], np.float32)
    w, ids = route(r, logits)
    assert ids.tolist() == [[1, 3, 6, 5]]
    assert np.isnan(w[0, :3]).all() and np.isclose(w[0, 3], 1 / (1 + math.exp(-3.0)))
    check_routing(r, (w, ids), route_ref(r, logits))


@pytest.mark.parametrize("lib,dtype", [("numpy", "float32"), ("torch", "bfloat16")])
@pytest.mark.parametrize("r", [v for v in VARIANTS if v.scoring == "softmax"], ids=lambda v: v.name)
def test_softmax_nan_poisons_the_row(r, lib, dtype, rng):
    _need(lib)
    M, t = 5, 1
    prob = moe_problem(rng, r, M, ep=False)
    prob["logits"][t, int(rng.integers(r.E))] = np.nan
    inp = moe_inputs(prob, lib, dtype)
    w, ids = route(r, inp["logits"])
    check_routing(r, (w, ids), route_ref(r, inp["logits"]))
    w = to_f64(w)
    assert np.isnan(w[t]).all() and np.asarray(ids)[t].tolist() == list(range(r.topk))
    assert np.isfinite(np.delete(w, t, axis=0)).all()
    out = to_f64(moe_call(r, inp))
    assert np.isnan(out[t]).all()
    assert np.isfinite(np.delete(out, t, axis=0)).all()


# --------------------------------------------------------------------------- properties


@st.composite
def routing_problems(draw):
    ng = draw(st.sampled_from([None, 1, 2, 4, 8]))
    gs = draw(st.sampled_from([1, 2, 3, 5, 8]))
    if ng is None:
        E = draw(st.sampled_from([1, 2, 3, 7, 8, 16, 60, 128]))
        tg = None
        reach = E
    else:
        E = ng * gs
        tg = draw(st.integers(1, ng))
        reach = tg * gs
    topk = draw(st.integers(1, min(reach, 10)))
    bias = draw(st.booleans()) and (ng is None or gs >= 2)
    r = Router(
        "random",
        E,
        topk,
        scoring=draw(st.sampled_from(["softmax", "sigmoid"])),
        renormalize=draw(st.booleans()),
        groups=None if ng is None else (ng, tg),
        bias=bias,
        scale=draw(st.sampled_from([1.0, 2.5, 0.75])),
    )
    M = draw(st.integers(1, 12))
    spread = draw(st.sampled_from([0.1, 1.0, 4.0]))
    coarse = draw(st.booleans())  # round to a coarse grid: many exact ties
    lib_dtype = draw(st.sampled_from(LIB_DTYPES if torch is not None else LIB_DTYPES[:2]))
    return r, M, spread, coarse, lib_dtype, draw(st.integers(0, 2**63 - 1))


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(routing_problems())
def test_routing_properties(problem):
    """Ids unique and in range; renormalized weights sum to routed_scaling_factor;
    weights are the unbiased scores of the picked experts; picks come in descending
    (biased) score order and only from the best topk_group groups."""
    r, M, spread, coarse, (lib, dtype), seed = problem
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((M, r.E)) * spread).astype(np.float32)
    if coarse:
        logits = np.round(logits * 2) / 2
    bias = (rng.standard_normal(r.E) * 0.1).astype(np.float32) if r.bias else None
    g, b = as_lib(logits, lib, dtype), as_lib(bias, lib, "float32")
    w, ids = route(r, g, b)
    w, ids = to_f64(w), np.asarray(ids).astype(np.int64)
    x = as_f32(g).astype(np.float64)
    assert w.shape == ids.shape == (M, r.topk)
    assert ((ids >= 0) & (ids < r.E)).all()
    assert all(len(set(row)) == r.topk for row in ids.tolist()), "duplicate ids in a row"
    assert np.isfinite(w).all() and (w >= 0).all()

    s = scores64(x, r.scoring)
    picked = np.take_along_axis(s, ids, 1)
    expect = picked / picked.sum(axis=1, keepdims=True) if r.renormalize else picked
    np.testing.assert_allclose(w, r.scale * expect, rtol=2e-5, atol=1e-7)
    if r.renormalize:
        np.testing.assert_allclose(w.sum(axis=1), r.scale, rtol=1e-5)

    sel = s + bias.astype(np.float64) if bias is not None else s
    tol = 1e-6
    chosen = np.take_along_axis(sel, ids, 1)
    assert (np.diff(chosen, axis=1) <= tol).all(), "picks not in descending score order"
    if r.groups is not None:
        ng, tg = r.groups
        gs = r.E // ng
        grouped = np.sort(sel.reshape(M, ng, gs), axis=2)[:, :, ::-1]
        gscore = grouped[:, :, :2].sum(axis=2) if bias is not None else grouped[:, :, 0]
        cut = np.sort(gscore, axis=1)[:, ::-1][:, tg - 1]  # the topk_group-th best group score
        for m in range(M):
            groups = set((ids[m] // gs).tolist())
            assert len(groups) <= tg, (m, groups)
            # every group picked from is among the best topk_group (up to rounding)
            assert all(gscore[m, q] >= cut[m] - tol for q in groups), (m, groups, gscore[m], cut[m])
    # nothing better was left out: each pick beats every unpicked expert of the groups used
    for m in range(M):
        allowed = np.ones(r.E, bool)
        if r.groups is not None:
            allowed = np.isin(np.arange(r.E) // (r.E // r.groups[0]), ids[m] // (r.E // r.groups[0]))
        allowed[ids[m]] = False
        if allowed.any():
            assert chosen[m].min() >= sel[m, allowed].max() - tol


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    r=st.sampled_from(VARIANTS),
    M=st.integers(1, 9),
    lib_dtype=st.sampled_from([("numpy", "float32"), ("numpy", "float16")]),
    seed=st.integers(0, 2**63 - 1),
)
def test_random_separated_rows_match_reference(r, M, lib_dtype, seed):
    lib, dtype = lib_dtype
    rng = np.random.default_rng(seed)
    bias = draw_bias(rng, r)
    g = as_lib(draw_logits(rng, r, M, bias), lib, dtype)
    check_routing(r, route(r, g, bias), route_ref(r, g, bias))


# --------------------------------------------------------------------------- errors

E8 = np.zeros((3, 8), np.float32)


def _err_cases():
    z = lambda n: np.zeros(n, np.float32)  # noqa: E731
    return [
        ("topk_gt_E", dict(topk=9), swapmoe.ArgumentError, "topk"),
        ("topk_0", dict(topk=0), swapmoe.ArgumentError, "topk"),
        ("topk_neg", dict(topk=-2), swapmoe.ArgumentError, "topk"),
        ("groups_not_dividing", dict(topk=2, num_expert_group=3, topk_group=1), swapmoe.ArgumentError, "num_expert_group"),
        ("groups_zero", dict(topk=2, num_expert_group=0, topk_group=1), swapmoe.ArgumentError,
         "num_expert_group, topk_group"),
        ("topk_group_gt_groups", dict(topk=2, num_expert_group=4, topk_group=5), swapmoe.ArgumentError, "topk_group"),
        ("only_num_expert_group", dict(topk=2, num_expert_group=4), swapmoe.ArgumentError, "num_expert_group, topk_group"),
        ("only_topk_group", dict(topk=2, topk_group=2), swapmoe.ArgumentError, "num_expert_group, topk_group"),
        ("topk_unreachable", dict(topk=3, num_expert_group=4, topk_group=1), swapmoe.ArgumentError, "topk"),
        ("bias_short", dict(topk=2, e_score_correction_bias=z(7)), swapmoe.ShapeError, "e_score_correction_bias"),
        ("bias_2d", dict(topk=2, e_score_correction_bias=np.zeros((1, 8), np.float32)), swapmoe.ShapeError, "e_score_correction_bias"),
        ("bias_int", dict(topk=2, e_score_correction_bias=np.zeros(8, np.int32)), swapmoe.DTypeError, "e_score_correction_bias"),
        ("bias_group_size_1", dict(topk=2, num_expert_group=8, topk_group=2, e_score_correction_bias=z(8)), swapmoe.ArgumentError, "num_expert_group"),
        ("unknown_scoring", dict(topk=2, scoring="softplus"), swapmoe.ArgumentError, "scoring"),
        ("scale_inf", dict(topk=2, routed_scaling_factor=math.inf), swapmoe.ArgumentError, "routed_scaling_factor"),
        ("scale_nan", dict(topk=2, routed_scaling_factor=math.nan), swapmoe.ArgumentError, "routed_scaling_factor"),
        # finite in float64, not in the float32 it is applied in
        ("scale_past_f32", dict(topk=2, routed_scaling_factor=1e39), swapmoe.ArgumentError, "routed_scaling_factor"),
        ("num_tokens", dict(topk=2, num_tokens=4), swapmoe.ShapeError, "gating_output"),
    ]


ERR_CASES = _err_cases()


def _convert_kwargs(kw: dict, lib: str) -> dict:
    kw = dict(kw)
    b = kw.get("e_score_correction_bias")
    if b is not None and lib == "torch":
        kw["e_score_correction_bias"] = torch.from_numpy(b)
    return kw


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("name,kw,exc,arg", ERR_CASES, ids=[c[0] for c in ERR_CASES])
def test_select_experts_errors(name, kw, exc, arg, lib):
    _need(lib)
    g = E8 if lib == "numpy" else torch.from_numpy(E8)
    kw = _convert_kwargs(kw, lib)
    topk = kw.pop("topk")
    with pytest.raises(exc) as info:
        swapmoe.select_experts(g, topk, **kw)
    # the name and its colon: "topk" alone would also pass for a message that blames topk_group
    assert str(info.value).startswith(arg + ": "), f"the message must start with '{arg}: ': {info.value}"
    assert isinstance(info.value, swapmoe.Error)


GATING_ERRORS = [
    ("1d", lambda: np.zeros(8, np.float32), swapmoe.ShapeError),
    ("3d", lambda: np.zeros((1, 3, 8), np.float32), swapmoe.ShapeError),
    ("no_experts", lambda: np.zeros((3, 0), np.float32), swapmoe.ShapeError),
    ("int32", lambda: np.zeros((3, 8), np.int32), swapmoe.DTypeError),
    ("int64", lambda: np.zeros((3, 8), np.int64), swapmoe.DTypeError),
    ("float64", lambda: np.zeros((3, 8), np.float64), swapmoe.DTypeError),
    ("column_major", lambda: np.asfortranarray(np.zeros((3, 8), np.float32)), swapmoe.ShapeError),
]


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("name,make,exc", GATING_ERRORS, ids=[c[0] for c in GATING_ERRORS])
def test_gating_output_errors(name, make, exc, lib):
    _need(lib)
    g = make()
    if lib == "torch":
        g = torch.from_numpy(g) if name != "column_major" else torch.zeros(8, 3).t()
    with pytest.raises(exc, match=r"^gating_output"):
        swapmoe.select_experts(g, 1)


def test_gating_output_not_a_tensor():
    with pytest.raises(swapmoe.DTypeError, match=r"^gating_output"):
        swapmoe.select_experts([[0.0, 1.0]], 1)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_fused_moe_token_count_mismatch(lib, rng):
    """gating_output must have one row per token of hidden_states."""
    _need(lib)
    r = BY_NAME["mixtral"]
    inp = moe_inputs(moe_problem(rng, r, 6, ep=False), lib, "float32")
    inp["logits"] = inp["logits"][:5]
    with pytest.raises(swapmoe.ShapeError, match=r"^gating_output.*M = 6"):
        moe_call(r, inp)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_fused_moe_errors_name_the_argument(lib, rng):
    _need(lib)
    r = BY_NAME["deepseek_v3"]
    inp = moe_inputs(moe_problem(rng, r, 4, ep=False), lib, "float32")
    with pytest.raises(swapmoe.ArgumentError, match=r"^topk_group"):
        moe_call(r, inp, topk_group=9)
    with pytest.raises(swapmoe.DTypeError, match=r"^gating_output"):
        i32 = inp["logits"].astype(np.int32) if lib == "numpy" else inp["logits"].int()
        moe_call(r, dict(inp, logits=i32))


@pytest.mark.parametrize("name,value", [("SWAPMOE_ROUTER_KERNEL", "fast"), ("SWAPMOE_ROUTER_FUSION", "maybe")])
def test_router_env_knobs_reject_other_values(name, value, rng, monkeypatch):
    """The router's environment knobs are read where fused_moe's router is placed; a value
    they do not know is an ArgumentError naming the variable and the value, on any device."""
    r = BY_NAME["deepseek_v3"]
    inp = moe_inputs(moe_problem(rng, r, 2, ep=False), "numpy", "float32")
    w, ids = route(r, inp["logits"], inp["bias"])
    monkeypatch.setenv(name, value)
    with pytest.raises(swapmoe.ArgumentError, match=rf"^\${name}: expected .*got \"{value}\""):
        swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], w, ids, fused_moe=True,
                                    scoring="sigmoid", num_expert_group=8)
    monkeypatch.setenv(name, "")
    plan = swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], w, ids, fused_moe=True,
                                       scoring="sigmoid", num_expert_group=8)
    assert plan["router"] == "not_routing" or any(s.startswith("router:") for s in plan["reasons"]), plan
    with pytest.raises(swapmoe.ArgumentError, match=r"^scoring"):
        swapmoe._core.describe_plan(inp["x"], inp["w1"], inp["w2"], w, ids, fused_moe=True, scoring="relu")


def test_numpy_integer_topk():
    w, ids = swapmoe.select_experts(E8, np.int64(2))
    assert w.shape == (3, 2)
    with pytest.raises(swapmoe.ArgumentError, match=r"^topk"):
        swapmoe.select_experts(E8, 2.0)
    with pytest.raises(swapmoe.ArgumentError, match=r"^scoring"):
        swapmoe.select_experts(E8, 2, scoring=None)


def test_fused_moe_expert_count_mismatch(rng):
    r = Router("mismatch", 16, 2)
    w1, w2 = moe_weights(rng, 8)
    x = rng.standard_normal((4, K_HID), dtype=np.float32)
    with pytest.raises(swapmoe.ShapeError, match=r"^gating_output"):
        swapmoe.fused_moe(x, w1, w2, draw_logits(rng, r, 4), 2)


# --------------------------------------------------------------------------- torch op


@requires_torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("r", [BY_NAME["mixtral"], BY_NAME["deepseek_v3"], BY_NAME["llama4"]], ids=lambda v: v.name)
def test_opcheck_select_experts(r, dtype, rng):
    import swapmoe.ops  # noqa: F401  (registers torch.ops.swapmoe)

    bias = draw_bias(rng, r)
    g = as_lib(draw_logits(rng, r, 7, bias), "torch", dtype)
    kw = dict(r.kwargs(), e_score_correction_bias=None if bias is None else torch.from_numpy(bias))
    op = torch.ops.swapmoe.select_experts.default
    result = torch.library.opcheck(op, (g, r.topk), kw)
    assert result and all(v == "SUCCESS" for v in result.values()), result
    w, ids = op(g, r.topk, **kw)
    check_routing(r, (w, ids), route_ref(r, g, bias))


@requires_torch
def test_select_experts_op_fake_shapes():
    import swapmoe.ops  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        g = torch.empty(5, 256, dtype=torch.bfloat16)
        b = torch.empty(256)
        w, ids = torch.ops.swapmoe.select_experts(g, 8, True, "sigmoid", 8, 4, b, 2.5)
    assert tuple(w.shape) == (5, 8) and w.dtype == torch.float32
    assert tuple(ids.shape) == (5, 8) and ids.dtype == torch.int32


@requires_torch
def test_compile_fullgraph_fused_moe_matches_eager(rng):
    """torch.compile(fullgraph=True) of a function calling fused_moe (grouped sigmoid with
    bias, expert map, bf16) gives eager's bits."""
    torch._dynamo.reset()
    r = BY_NAME["deepseek_v3"]
    inp = moe_inputs(moe_problem(rng, r, 9, ep=True), "torch", "bfloat16", "float32")

    def f(x, w1, w2, logits, bias, emap):
        y = swapmoe.fused_moe(
            x, w1, w2, logits, 8, renormalize=True, scoring="sigmoid", num_expert_group=8, topk_group=4,
            e_score_correction_bias=bias, routed_scaling_factor=2.5, expert_map=emap,
        )
        # select_experts with every router argument, so the compiled op must pass each on
        w, ids = swapmoe.select_experts(logits * 1.0, 8, renormalize=True, scoring="sigmoid", num_expert_group=8,
                                        topk_group=4, e_score_correction_bias=bias, routed_scaling_factor=2.5)
        return y * 2, w, ids

    args = (inp["x"], inp["w1"], inp["w2"], inp["logits"], inp["bias"], inp["emap"])
    eager = f(*args)
    got = torch.compile(f, fullgraph=True)(*args)
    for a, b in zip(got, eager):
        assert a.dtype == b.dtype and torch.equal(a, b)
    check_close(eager[0] / 2, moe_ref(r, inp), "bfloat16")


def test_router_messages_show_the_value_given_and_where_m_comes_from():
    with pytest.raises(swapmoe.ArgumentError, match=r"float32.*, got 1e\+?39$"):
        swapmoe.select_experts(E8, 2, routed_scaling_factor=1e39)
    with pytest.raises(swapmoe.ShapeError, match=r"M = 4 \(num_tokens\)"):
        swapmoe.select_experts(E8, 2, num_tokens=4)

