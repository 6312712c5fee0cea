"""``swapmoe.select_backend``: the oracle's plan for a shape, also offline ("what would an
H200 do?"). The decisions live in the Rust core (``src/oracle.rs``); this only shapes them."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from . import _core
from .errors import ArgumentError

QUANTS = (None, "fp8_tensor", "fp8_channel", "fp8_block128")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one call of the op would run.

    - ``backend``: ``cuda_decode``, ``cuda_mma``, ``cuda_generic`` (or ``cpu`` for CPU tensors)
    - ``swap_ab``: whether the weights fill the MMA's wide side and the tokens the narrow one
    - ``tile``: kernels, rows per CTA, tokens per pass (token tile), load widths, PDL
    - ``source``: ``"heuristic"`` or ``"override"`` (``backend=`` / ``$SWAPMOE_BACKEND``);
      this build ships no tuned tables
    - ``reasons``: why each choice was made and each candidate rejected
    """

    backend: str
    swap_ab: bool
    tile: Dict[str, Any]
    source: str
    reasons: List[str]
    device_name: str
    device_capability: Tuple[int, int]


def select_backend(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    hidden_size: int,
    intermediate_size: int,
    *,
    dtype: str = "bf16",
    quant: Optional[str] = None,
    device_capability: Optional[Tuple[int, int]] = None,
    device_name: Optional[str] = None,
    backend: Optional[str] = None,
) -> Plan:
    """The plan for fused experts with ``num_tokens`` tokens, ``num_experts`` local experts,
    ``top_k``, hidden size K and intermediate size N (contiguous, aligned tensors).

    With neither ``device_name`` nor ``device_capability`` the current CUDA device 0 is
    asked; a known ``device_name`` (e.g. ``"NVIDIA H200"``) needs no GPU. ``quant``:
    ``"fp8_tensor"`` (static activation scales assumed), ``"fp8_channel"`` or
    ``"fp8_block128"`` plan FP8 W8A8 weights; FP8 on a device below sm_89 raises
    :class:`ArgumentError`."""
    if quant not in QUANTS:
        raise ArgumentError(f"quant: expected one of {QUANTS}, got {quant!r}")
    cap = tuple(int(v) for v in device_capability) if device_capability is not None else None
    d = _core.select_backend(num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype, cap,
                             device_name, None, backend, quant)
    return Plan(
        backend=d["backend"],
        swap_ab=bool(d["swap_ab"]),
        tile=dict(d["tile"]),
        source=d["source"],
        reasons=list(d["reasons"]),
        device_name=d["device_name"],
        device_capability=tuple(d["device_capability"]),
    )
