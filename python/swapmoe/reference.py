"""A float64 reference of fused_experts in numpy, for tests and benchmark checks.
Takes numpy arrays (convert torch tensors with ``.double().cpu().numpy()`` first)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np


def _act(name: str, g: np.ndarray) -> np.ndarray:
    if name == "silu":
        return g / (1.0 + np.exp(-g))
    if name == "gelu":
        erf = np.vectorize(math.erf, otypes=[np.float64])
        return 0.5 * g * (1.0 + erf(g / math.sqrt(2.0)))
    raise ValueError(f"activation: expected 'silu' or 'gelu', got {name!r}")


def fused_experts_ref(
    hidden_states: np.ndarray,
    w1: np.ndarray,
    w2: np.ndarray,
    topk_weights: np.ndarray,
    topk_ids: np.ndarray,
    *,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Optional[np.ndarray] = None,
) -> np.ndarray:
    """float64 result of the op. Ids outside [0, global_num_experts), and experts that
    the map sends to -1, contribute nothing."""
    x = np.asarray(hidden_states, dtype=np.float64)
    w1 = np.asarray(w1, dtype=np.float64)
    w2 = np.asarray(w2, dtype=np.float64)
    tw = np.asarray(topk_weights, dtype=np.float64)
    ids = np.asarray(topk_ids, dtype=np.int64)
    E, two_n, _ = w1.shape
    n = two_n // 2
    if global_num_experts < 0:
        global_num_experts = len(expert_map) if expert_map is not None else E
    local = _local_experts(ids, global_num_experts, expert_map, E)
    out = np.zeros_like(x)
    # each token's slots in k order; at one k, the tokens of each expert as one product, so
    # that an expert's weights are read once per k and not once per token
    for k in range(ids.shape[1]):
        for e, ms in _tokens_by_expert(local[:, k]):
            xin = x[ms] * tw[ms, k, None] if apply_router_weight_on_input else x[ms]
            h = xin @ w1[e].T
            a = _act(activation, h[:, :n]) * h[:, n:]
            y = a @ w2[e].T
            out[ms] += y if apply_router_weight_on_input else tw[ms, k, None] * y
    return out


def _local_experts(ids: np.ndarray, global_num_experts: int, expert_map: Optional[np.ndarray], E: int) -> np.ndarray:
    """[M, topk] local expert of each slot, -1 where the slot does no work (an id outside
    [0, global_num_experts), or one the map sends to -1 or past E)."""
    ids = np.asarray(ids, dtype=np.int64)
    ok = (ids >= 0) & (ids < global_num_experts)
    local = np.where(ok, ids, -1)
    if expert_map is not None:
        emap = np.asarray(expert_map, dtype=np.int64)
        local = np.where(ok, emap[np.where(ok, ids, 0)], -1) if emap.size else np.full_like(ids, -1)
    return np.where((local >= 0) & (local < E), local, -1)


def _tokens_by_expert(local_k: np.ndarray):
    """(expert, the tokens whose slot at one top-k position goes to it) in ascending expert
    order; each token at most once."""
    for e in np.unique(local_k[local_k >= 0]):
        yield int(e), np.flatnonzero(local_k == e)


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere gives inf."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return math.inf
    denom = np.linalg.norm(ref)
    num = np.linalg.norm(out - ref)
    if denom == 0:
        return float(num)
    return float(num / denom)


# --------------------------------------------------------------------------- FP8 W8A8

FP8_MAX = 448.0
FP8_BLOCK = 128
#: Smallest dynamic per-tensor / per-token scale, 1 / (448 * 512) in float32 (vLLM's
#: ``min_scaling_factor``).
FP8_MIN_SCALE = np.float32(1.0) / np.float32(448.0 * 512.0)
#: Smallest absmax of a per-128-column group (vLLM's ``eps`` of per_token_group_quant_fp8).
FP8_GROUP_EPS = np.float32(1e-10)


def _e4m3_step(a: np.ndarray) -> np.ndarray:
    """Spacing of e4m3 values around |a| (a >= 0 and finite, float64; callers clamp to 448
    first): 2^-9 below 2^-6, else 2^(e-3) for a in [2^e, 2^(e+1)) (from a's float64
    exponent bits)."""
    a = np.asarray(a, dtype=np.float64)
    exponent = (np.ascontiguousarray(a).view(np.uint64).reshape(a.shape) >> np.uint64(52)) & np.uint64(0x7FF)
    normal = a >= 2.0**-6  # exponent >= 1017: the shift below stays in range
    step = (np.where(normal, exponent, np.uint64(1023)) - np.uint64(3)) << np.uint64(52)
    return np.where(normal, step.view(np.float64), 2.0**-9)


def round_e4m3(v: np.ndarray) -> np.ndarray:
    """float64 array of the e4m3 values nearest to v (ties to even), saturating at +-448;
    NaN stays NaN (float8_e4m3fn has no infinity)."""
    v = np.asarray(v, dtype=np.float64)
    a = np.minimum(np.abs(v), FP8_MAX)
    step = _e4m3_step(a)
    r = np.minimum(np.round(a / step) * step, FP8_MAX)  # np.round: half to even
    return np.where(np.isnan(v), np.nan, np.copysign(r, v))


def _e4m3_values() -> np.ndarray:
    """float64 value of each of the 256 e4m3fn codes (NaN at 0x7F and 0xFF)."""
    c = np.arange(256, dtype=np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = (c & 7).astype(np.float64)
    v = np.where(e == 0, m * 2.0**-9, (1.0 + m / 8.0) * np.ldexp(1.0, e - 7))
    return np.where((c & 0x7F) == 0x7F, np.nan, sign * v)


_E4M3_VALUES = _e4m3_values()


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    """float64 values of e4m3fn bytes (uint8), by table."""
    return _E4M3_VALUES[np.asarray(codes, dtype=np.uint8)]


def e4m3_encode(values: np.ndarray) -> np.ndarray:
    """uint8 e4m3fn bytes of values that round_e4m3 returned (exact e4m3 values or NaN): a
    normal value's exponent and top three mantissa bits are read from its float64 bits, a
    subnormal's (|v| < 2^-6) mantissa is |v| / 2^-9."""
    v = np.ascontiguousarray(values, dtype=np.float64)
    bits = v.view(np.uint64)
    # the float64 exponent's low 4 bits and the top 3 mantissa bits; a normal e4m3 exponent
    # (1..15) is the float64 one minus 1016, i.e. those 4 bits minus 8 modulo 16
    codes = ((bits >> np.uint64(49)) & np.uint64(0x7F)).astype(np.int64)
    codes -= 8 << 3
    codes &= 0x7F
    small = np.flatnonzero(np.abs(v) < 2.0**-6)  # subnormals and zeros
    codes.reshape(-1)[small] = np.rint(np.abs(v.reshape(-1)[small]) * 512).astype(np.int64)
    codes |= (bits >> np.uint64(63)).astype(np.int64) << 7
    codes = codes.astype(np.uint8)
    codes[np.isnan(v)] = 0x7F
    return codes


def fp8_quantize(v: np.ndarray, scale, per_tensor: bool) -> np.ndarray:
    """The e4m3 values (float64) the op stores for float32 values ``v`` with float32
    ``scale`` (broadcast): ``v * (1/scale)`` for per-tensor scales, ``v / scale`` else, in
    float32, clamped to +-448, rounded to nearest even. Non-finite v gives NaN."""
    v32 = np.asarray(v, dtype=np.float32)
    s32 = np.asarray(scale, dtype=np.float32)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        t = v32 * (np.float32(1.0) / s32) if per_tensor else v32 / s32
        t = np.clip(t.astype(np.float32), -FP8_MAX, FP8_MAX)
    return np.where(np.isfinite(v32), round_e4m3(t), np.nan)


def _absmax(v: np.ndarray, axis=None) -> np.ndarray:
    """Largest |v| over the finite values (0 when none), as float32."""
    a = np.where(np.isfinite(v), np.abs(v), 0.0)
    return np.asarray(a.max(axis=axis, initial=0.0), dtype=np.float32)


def fp8_scheme(per_channel_quant: bool, block_shape) -> str:
    if block_shape is not None:
        if list(block_shape) != [FP8_BLOCK, FP8_BLOCK]:
            raise ValueError(f"block_shape: expected [128, 128], got {block_shape!r}")
        return "block"
    return "channel" if per_channel_quant else "tensor"


def fp8_act_quant(v: np.ndarray, scheme: str, static_scale=None, rows=None):
    """Quantizes activations [R, C] (float32 values) per the scheme. ``rows``: mask of the
    rows that count toward a dynamic per-tensor absmax (default all). Returns (codes
    float64 [R, C], scales float32 [R, C] expanded to every element)."""
    v = np.asarray(v, dtype=np.float32)
    R, C = v.shape
    if rows is None:
        rows = np.ones(R, bool)
    if scheme == "tensor":
        if static_scale is not None:
            s = np.float32(np.asarray(static_scale, np.float32).reshape(()))
        else:
            s = max(_absmax(v[rows]) / np.float32(FP8_MAX), FP8_MIN_SCALE)
        s_full = np.full((R, C), s, np.float32)
        return fp8_quantize(v, s_full, True), s_full
    if scheme == "channel":
        s = np.maximum(_absmax(v, axis=1) / np.float32(FP8_MAX), FP8_MIN_SCALE).astype(np.float32)
        s_full = np.repeat(s[:, None], C, axis=1)
        return fp8_quantize(v, s_full, False), s_full
    G = -(-C // FP8_BLOCK)
    pad = np.zeros((R, G * FP8_BLOCK), np.float32)
    pad[:, :C] = np.where(np.isfinite(v), np.abs(v), 0.0)
    gmax = pad.reshape(R, G, FP8_BLOCK).max(axis=2).astype(np.float32)
    s = (np.maximum(gmax, FP8_GROUP_EPS) / np.float32(FP8_MAX)).astype(np.float32)
    s_full = np.repeat(s, FP8_BLOCK, axis=1)[:, :C]
    return fp8_quantize(v, s_full, False), s_full


def fp8_weight_scale_full(scale: np.ndarray, scheme: str, rows: int, cols: int) -> np.ndarray:
    """A weight scale of any accepted shape expanded to float64 [E, rows, cols]."""
    s = np.asarray(scale, dtype=np.float32).astype(np.float64)
    E = s.shape[0]
    if scheme == "tensor":
        return np.broadcast_to(s.reshape(E, 1, 1), (E, rows, cols))
    if scheme == "channel":
        return np.broadcast_to(s.reshape(E, rows, 1), (E, rows, cols))
    s = s.reshape(E, -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
    return np.repeat(np.repeat(s, FP8_BLOCK, axis=1), FP8_BLOCK, axis=2)[:, :rows, :cols]


def fused_experts_fp8_ref(
    hidden_states: np.ndarray,
    w1: np.ndarray,
    w2: np.ndarray,
    topk_weights: np.ndarray,
    topk_ids: np.ndarray,
    *,
    w1_scale: np.ndarray,
    w2_scale: np.ndarray,
    a1_scale: Optional[np.ndarray] = None,
    a2_scale: Optional[np.ndarray] = None,
    per_channel_quant: bool = False,
    block_shape: Optional[list] = None,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Optional[np.ndarray] = None,
    flip_margin: float = 1e-4,
):
    """float64 reference of the FP8 W8A8 op. ``w1``/``w2`` are the e4m3 weight values
    (float64, e.g. ``e4m3_decode(codes)``), dequantized here with their scales; the
    activations are quantized exactly as the op does (``fp8_act_quant``), everything else
    is float64.

    Returns ``(out, flips)``. The op computes the intermediate in float32, so an element
    whose scaled value lies within ``flip_margin`` (relative) of a rounding midpoint may
    round to the other e4m3 neighbour; each such element is a flip ``(token, delta)``:
    ``delta`` ([K], float64) is what the output row would change by if it rounded the
    other way."""
    scheme = fp8_scheme(per_channel_quant, block_shape)
    x = np.asarray(hidden_states, dtype=np.float32)
    w1 = np.asarray(w1, dtype=np.float64)
    w2 = np.asarray(w2, dtype=np.float64)
    tw = np.asarray(topk_weights, dtype=np.float64)
    ids = np.asarray(topk_ids, dtype=np.int64)
    E, two_n, K = w1.shape
    n = two_n // 2
    M, topk = ids.shape
    if global_num_experts < 0:
        global_num_experts = len(expert_map) if expert_map is not None else E
    w1d = w1 * fp8_weight_scale_full(w1_scale, scheme, two_n, K)
    w2d = w2 * fp8_weight_scale_full(w2_scale, scheme, K, n)
    xq, xs = fp8_act_quant(x, scheme, a1_scale)
    xd = xq * xs.astype(np.float64)

    local_mk = _local_experts(ids, global_num_experts, expert_map, E)
    local = local_mk.reshape(-1)  # slot m * topk + k
    inter = np.zeros((M * topk, n), np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(topk):  # an expert's weights read once per k, not once per slot
            for e, ms in _tokens_by_expert(local_mk[:, k]):
                h = xd[ms] @ w1d[e].T
                if apply_router_weight_on_input:
                    h = h * tw[ms, k, None]
                inter[ms * topk + k] = _act(activation, h[:, :n]) * h[:, n:]
    valid = local >= 0
    aq, as_ = fp8_act_quant(inter.astype(np.float32), scheme, a2_scale, rows=valid)
    ad = aq * as_.astype(np.float64)

    # Elements near a rounding midpoint: the value the other neighbour would give.
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        t = inter / as_.astype(np.float64)
        a = np.minimum(np.abs(t), FP8_MAX)
        step = _e4m3_step(a)
        frac = a / step - np.floor(a / step)
        near = np.abs(frac - 0.5) * step <= flip_margin * np.maximum(a, 2.0**-9)
        near &= valid[:, None] & np.isfinite(t) & (np.abs(t) < FP8_MAX)
        alt = np.copysign(np.where(np.abs(aq) > a, np.floor(a / step) * step, np.ceil(a / step) * step), t)

    out = np.zeros((M, K), np.float64)
    flips = []
    wgt = np.ones((M, topk)) if apply_router_weight_on_input else tw
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(topk):  # each token's slots in k order
            for e, ms in _tokens_by_expert(local_mk[:, k]):
                out[ms] += wgt[ms, k, None] * (ad[ms * topk + k] @ w2d[e].T)
        for slot in np.flatnonzero(valid & near.any(axis=1)):
            m, k = divmod(int(slot), topk)
            e = local[slot]
            for j in np.flatnonzero(near[slot]):
                d = (alt[slot, j] - aq[slot, j]) * float(as_[slot, j])
                flips.append((m, wgt[m, k] * d * w2d[e][:, j]))
    return out, flips


def rel_error_with_flips(out: np.ndarray, ref: np.ndarray, flips) -> float:
    """rel_error of ``out`` against ``ref`` plus the flips (see fused_experts_fp8_ref)
    that bring it closer, chosen greedily one at a time (each flip changes one row, so the
    error's two squared norms are updated row by row)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.array(ref, dtype=np.float64, copy=True)
    if not np.all(np.isfinite(out)):
        return math.inf
    if not flips:
        return rel_error(out, ref)
    o2 = out.reshape(out.shape[0], -1)
    r2 = ref.reshape(ref.shape[0], -1)
    num = float(np.sum((o2 - r2) ** 2))
    den = float(np.sum(r2**2))

    def ratio(n: float, d: float) -> float:
        return math.sqrt(max(n, 0.0)) / math.sqrt(d) if d > 0 else math.sqrt(max(n, 0.0))

    err = ratio(num, den)
    for m, delta in flips:
        row = r2[m] + np.asarray(delta, dtype=np.float64).reshape(-1)
        n = num - float(np.sum((o2[m] - r2[m]) ** 2)) + float(np.sum((o2[m] - row) ** 2))
        d = den - float(np.sum(r2[m] ** 2)) + float(np.sum(row**2))
        e = ratio(n, d)
        if e < err:
            r2[m], num, den, err = row, n, d, e
    return err


# --------------------------------------------------------------------------- routing


def _ranked(values: np.ndarray, allowed: np.ndarray, count: int) -> list:
    """Indices of the ``count`` best allowed entries, best first, in torch.topk order:
    NaN above every number, then descending, equal values to the lowest index."""
    idx = np.flatnonzero(allowed)
    v = values[idx]
    nan = np.isnan(v)
    # np.lexsort: the last key is the primary one; all sorts are stable.
    key = np.where(nan, 0.0, -v)  # descending values
    order = np.lexsort((idx, key, ~nan))
    return [int(i) for i in idx[order[:count]]]


def _router_scores(logits: np.ndarray, scoring: str) -> np.ndarray:
    """float64 scores [M, E] from logits already cast to float32."""
    x = np.asarray(logits, dtype=np.float32).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if scoring == "softmax":
            mx = np.max(x, axis=1, keepdims=True)  # NaN in a row gives a NaN max
            ex = np.exp(x - mx)  # an all -inf row gives NaN (-inf - -inf)
            s = ex / ex.sum(axis=1, keepdims=True)
            return np.where(np.isnan(x).any(axis=1, keepdims=True), np.nan, s)
        if scoring == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
    raise ValueError(f"scoring: expected 'softmax' or 'sigmoid', got {scoring!r}")


def select_experts_ref(
    gating_output: np.ndarray,
    topk: int,
    *,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    e_score_correction_bias: Optional[np.ndarray] = None,
    routed_scaling_factor: float = 1.0,
) -> tuple:
    """float64 reference of ``swapmoe.select_experts`` (vLLM's fused_topk / grouped_topk).

    Takes the logits as the op sees them (pass ``t.float().numpy()`` for bf16/fp16 tensors);
    scores are computed in float64. Returns (weights float64 [M, topk], ids int64 [M, topk]).
    Order: descending; NaN first; equal values to the lowest index (torch.topk)."""
    scores = _router_scores(gating_output, scoring)
    M, E = scores.shape
    if not 1 <= topk <= E:
        raise ValueError(f"topk: expected 1 <= topk <= {E}, got {topk}")
    bias = None
    if e_score_correction_bias is not None:
        bias = np.asarray(e_score_correction_bias, dtype=np.float32).astype(np.float64).reshape(E)
    select = scores + bias if bias is not None else scores
    grouped = num_expert_group is not None or topk_group is not None
    ng = tg = gs = 0
    if grouped:
        if num_expert_group is None or topk_group is None:
            raise ValueError("num_expert_group, topk_group: expected both or neither")
        ng, tg = int(num_expert_group), int(topk_group)
        if E % ng or not 1 <= tg <= ng:
            raise ValueError(f"num_expert_group={ng}, topk_group={tg}: invalid for E = {E}")
        gs = E // ng
    weights = np.empty((M, topk), np.float64)
    ids = np.empty((M, topk), np.int64)
    for m in range(M):
        allowed = np.ones(E, bool)
        if grouped:
            gscore = np.empty(ng, np.float64)
            for g in range(ng):
                vals = select[m, g * gs : (g + 1) * gs]
                best = _ranked(vals, np.ones(gs, bool), 2 if bias is not None else 1)
                gscore[g] = sum(vals[i] for i in best)
            keep = _ranked(gscore, np.ones(ng, bool), tg)
            allowed = np.zeros(E, bool)
            for g in keep:
                allowed[g * gs : (g + 1) * gs] = True
        picked = _ranked(select[m], allowed, topk)
        if len(picked) < topk:
            raise ValueError(f"topk: only {len(picked)} experts reachable, got {topk}")
        w = scores[m, picked]
        if renormalize:
            with np.errstate(invalid="ignore", divide="ignore"):
                w = w / w.sum()
        weights[m] = w * float(np.float32(routed_scaling_factor))
        ids[m] = picked
    return weights, ids


def fused_moe_ref(
    hidden_states: np.ndarray,
    w1: np.ndarray,
    w2: np.ndarray,
    gating_output: np.ndarray,
    topk: int,
    *,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    e_score_correction_bias: Optional[np.ndarray] = None,
    routed_scaling_factor: float = 1.0,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Optional[np.ndarray] = None,
) -> np.ndarray:
    """float64 reference of ``swapmoe.fused_moe``: :func:`select_experts_ref` then
    :func:`fused_experts_ref` (gating_output is [M, global_E])."""
    weights, ids = select_experts_ref(
        gating_output,
        topk,
        renormalize=renormalize,
        scoring=scoring,
        num_expert_group=num_expert_group,
        topk_group=topk_group,
        e_score_correction_bias=e_score_correction_bias,
        routed_scaling_factor=routed_scaling_factor,
    )
    return fused_experts_ref(
        hidden_states,
        w1,
        w2,
        weights,
        ids,
        activation=activation,
        apply_router_weight_on_input=apply_router_weight_on_input,
        global_num_experts=global_num_experts,
        expert_map=expert_map,
    )
