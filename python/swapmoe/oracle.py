"""``swapmoe.select_backend``: the oracle's plan for a shape, also offline ("what would an
H200 do?"). The decisions live in the Rust core (``src/oracle.rs``, tables in
``src/tables.rs``); this only shapes them."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _args, _core
from ._args import CONVERSION_ERRORS, raise_named
from .errors import ArgumentError

QUANTS = (None, "fp8_tensor", "fp8_channel", "fp8_block128")
#: backends outside swapmoe that a tuned table may name; a caller running inside vLLM
#: passes the ones it can run as ``external_backends``
EXTERNAL_BACKENDS = ("vllm_triton", "flashinfer_cutlass")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one call of the op would run.

    - ``backend``: ``cuda_decode``, ``cuda_wgmma_swap``, ``cuda_mma``, ``cuda_wgmma``,
      ``cuda_generic``, ``cuda_bulk_decode`` (or ``cpu`` for CPU
      tensors), or an external backend (``vllm_triton``, ``flashinfer_cutlass``) when a
      table picked it and the caller allowed it, or (``vllm_triton``) when no table measured
      the call against it and the call is outside swapmoe's measured range (README, "Tuned
      tables"), or forced by ``backend=`` / ``$SWAPMOE_BACKEND`` where the caller lists it in
      ``external_backends``
    - ``swap_ab``: whether the weights fill the MMA's wide side and the tokens the narrow one
    - ``tile``: kernels, rows per CTA, tokens per pass (token tile), load widths, PDL,
      ``splits`` (cuda_wgmma_swap's cluster sizes: GEMM1's K split, GEMM2's expert split),
      ``align_in_gemm1`` (cuda_wgmma's GEMM1 groups the slots itself: no align kernel); for an
      external backend, those of swapmoe's ``fallback``
    - ``source``: ``"override"`` (``backend=``, ``$SWAPMOE_BACKEND``,
      ``$SWAPMOE_MMA_TOKEN_TILE``), ``"table"`` (a tuned table entry) or ``"heuristic"``
    - ``reasons``: why each choice was made, and at least one sentence per candidate (each
      of swapmoe's backends and the external ones), starting with its name: picked, not
      picked (with the table entry's time against the pick's where it timed it) or rejected
    - ``table``: path of the tuned table consulted (None: none for this shape and device);
      ``table_m``: its entry's M; ``source == "table"`` says whether the plan follows it
    - ``fallback``: for an external backend, the swapmoe backend to run without it
    """

    backend: str
    swap_ab: bool
    tile: Dict[str, Any]
    source: str
    reasons: List[str]
    device_name: str
    device_capability: Tuple[int, int]
    table: Optional[str] = None
    table_m: Optional[int] = None
    fallback: Optional[str] = None


def _capability(cap: Any) -> Optional[Tuple[int, int]]:
    """``device_capability`` as (major, minor): None, or a pair of integers naming sm_80 or
    newer (the embedded kernels' targets); ArgumentError otherwise."""
    if cap is None:
        return None
    try:
        major, minor = (operator.index(c) for c in cap)
    except (TypeError, ValueError):
        raise ArgumentError(
            f"device_capability: expected None or (major, minor) integers, got {_args.shown(cap)}") from None
    if not (0 <= minor < 10 and 8 <= major < 100):
        raise ArgumentError(
            "device_capability: expected sm_80 or newer (major >= 8, 0 <= minor <= 9: the embedded "
            f"kernels are built for sm_80 and sm_90a), got {(major, minor)}"
        )
    return major, minor


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
    external_backends: Sequence[str] = (),
    activation_scales: Optional[str] = None,
    global_num_experts: int = -1,
) -> Plan:
    """The plan for fused experts with ``num_tokens`` tokens, ``num_experts`` local experts,
    ``top_k``, hidden size K and intermediate size N (contiguous, aligned tensors).

    ``global_num_experts``: the model's experts when this rank holds ``num_experts`` of them
    (expert parallelism; -1: all of them), as ``fused_experts`` takes it with an
    ``expert_map``: the plan expects about ``num_experts / global_num_experts`` of the slots
    on this rank, as the op plans such a call. ``top_k`` may then exceed ``num_experts`` (not
    ``global_num_experts``); a ``global_num_experts`` below ``num_experts`` raises
    :class:`ShapeError`.

    Order: ``backend`` / ``$SWAPMOE_BACKEND`` (and ``$SWAPMOE_MMA_TOKEN_TILE``), then the
    tuned table of the shape and device (shipped, or ``$SWAPMOE_TABLES_DIR``), then the
    heuristics. A forced backend that cannot run the shape raises the error of what stops it:
    :class:`ShapeError` for a K or N tail its layout cannot take (naming the multiple) or M
    past its limit, :class:`DTypeError`, :class:`DeviceError`, or :class:`ArgumentError`.
    ``backend`` (or the variable) may name an external backend listed in
    ``external_backends``: the plan is then that backend (source ``override``) with the
    heuristics' swapmoe pick as ``fallback``; one not listed raises :class:`ArgumentError`.
    ``external_backends`` (e.g. ``("vllm_triton",)``) names the backends outside
    swapmoe that the caller can run; a table entry naming another one is skipped for the
    best swapmoe entry.

    With neither ``device_name`` nor ``device_capability`` the current CUDA device 0 is
    asked; a known ``device_name`` (e.g. ``"NVIDIA H200"``) needs no GPU. ``quant``:
    ``"fp8_tensor"`` (static activation scales assumed), ``"fp8_channel"`` or
    ``"fp8_block128"`` plan FP8 W8A8 weights; FP8 on a device below sm_89 raises
    :class:`ArgumentError`. ``external_backends`` names backends outside swapmoe the caller
    can run (``"vllm_triton"``, ``"flashinfer_cutlass"``): tuned tables may pick them, and a
    call no table measured against vLLM's Triton goes to ``vllm_triton`` outside the range
    where swapmoe's heuristic pick measured faster at every shipped H200 shape (sm_90:
    bf16/fp16 M = 1, FP8 per tensor with static scales M <= 2). ``activation_scales``: ``"static"`` (``a1_scale`` and ``a2_scale`` given) or
    ``"dynamic"`` (computed by the op); None is the scheme's usual kind, static for
    ``"fp8_tensor"`` and dynamic for the others, which take no other. An FP8 table says which
    kind it was measured with and stands only for calls of that kind."""
    if not (quant is None or isinstance(quant, str)) or quant not in QUANTS:
        raise ArgumentError(f"quant: expected one of {QUANTS}, got {quant!r}")
    given = external_backends
    if isinstance(given, str):
        external_backends = (given,)
    elif not isinstance(given, (bytes, bytearray)):
        try:  # once: a generator read by a check would reach the core empty
            external_backends = tuple(given)
        except TypeError:
            pass
    why = _args.KINDS["external_backends"](external_backends)
    if why:
        raise ArgumentError(f"external_backends: expected {why}, got {_args.shown(given)}")
    cap = _capability(device_capability)
    args = dict(num_tokens=num_tokens, num_experts=num_experts, top_k=top_k, hidden_size=hidden_size,
                intermediate_size=intermediate_size, dtype=dtype, device_name=device_name, backend=backend,
                external_backends=external_backends, activation_scales=activation_scales,
                global_num_experts=global_num_experts)
    try:
        d = _core.select_backend(num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype=dtype,
                                 device_capability=cap, device_name=device_name, backend=backend, quant=quant,
                                 external_backends=list(external_backends),
                                 activation_scales=activation_scales, global_num_experts=global_num_experts)
    except CONVERSION_ERRORS as e:
        raise_named(e, args, _args.SELECT_BACKEND_KINDS)
    return Plan(
        backend=d["backend"],
        swap_ab=bool(d["swap_ab"]),
        tile=dict(d["tile"]),
        source=d["source"],
        reasons=list(d["reasons"]),
        device_name=d["device_name"],
        device_capability=tuple(d["device_capability"]),
        table=d["table"],
        table_m=d["table_m"],
        fallback=d["fallback"],
    )
