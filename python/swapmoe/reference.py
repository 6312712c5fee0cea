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
    out = np.zeros_like(x)
    for m in range(x.shape[0]):
        for k in range(ids.shape[1]):
            g = int(ids[m, k])
            if g < 0 or g >= global_num_experts:
                continue
            e = int(expert_map[g]) if expert_map is not None else g
            if e < 0 or e >= E:
                continue
            xin = x[m] * tw[m, k] if apply_router_weight_on_input else x[m]
            h = w1[e] @ xin
            a = _act(activation, h[:n]) * h[n:]
            y = w2[e] @ a
            out[m] += y if apply_router_weight_on_input else tw[m, k] * y
    return out


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
