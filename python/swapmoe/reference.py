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
