"""The body of swapmoe's vLLM experts class, without vLLM.

vLLM's modular kernel hands an experts object its inputs, an output tensor and two
workspaces whose shapes the object asked for (``workspace_shapes``). This module holds
that contract as plain functions of torch tensors, so that it runs (and is tested on the
GPU machine) where vLLM is not installed; :mod:`swapmoe.vllm_plugin` wraps it in vLLM's
``FusedMoEExpertsModular``.

Layouts are vLLM's: ``hidden_states [M, K]``, ``w1 [E, 2N, K]`` (gate rows, then up),
``w2 [E, K, N]``, ``topk_weights fp32 [M, topk]``, ``topk_ids int32 [M, topk]``,
``expert_map int32 [global_E]`` (-1: not on this rank), ``output [M, K]``.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from . import _core
from .errors import ArgumentError
from .ops import _current_stream

# vLLM carves workspaces at 256-byte boundaries; swapmoe's sections need the same.
WORKSPACE_ALIGN = 256

# Activations whose math swapmoe implements exactly as vLLM's ``*_and_mul`` does.
SUPPORTED_ACTIVATIONS = ("silu", "gelu")


def swapmoe_workspace_bytes(m: int, n: int, k: int, topk: int, local_experts: int, itemsize: int) -> int:
    """Bytes swapmoe's CUDA path needs for one call, plus room to align the base."""
    need = _core.workspace_bytes(m, topk, n, k, local_experts, itemsize)
    return need + WORKSPACE_ALIGN if need else 0


def workspace_shapes(
    m: int, n2: int, k: int, topk: int, local_experts: int, itemsize: int
) -> Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]:
    """``(workspace13, workspace2, output)`` shapes, in elements of the activation dtype.

    ``n2`` is ``w1.shape[1]`` (2N), as vLLM passes it. The shapes hold what vLLM's
    ``TritonExperts`` needs (so a call the oracle routes to Triton can use them) and
    ``workspace2`` also holds swapmoe's workspace. swapmoe never uses ``workspace13``:
    vLLM may alias it with the output.
    """
    n = n2 // 2
    rows = max(m, 1) * topk
    ours = swapmoe_workspace_bytes(m, n, k, topk, local_experts, itemsize)
    per_row = -(-ours // (rows * itemsize)) if ours else 0
    ws13 = (m, topk, max(n, k))
    ws2 = (m, topk, max(n2, k, per_row))
    return ws13, ws2, (m, k)


def aligned_workspace(workspace2: torch.Tensor, nbytes: int) -> Optional[torch.Tensor]:
    """A 256-byte-aligned uint8 view of ``nbytes`` of ``workspace2`` (None if nbytes is 0)."""
    if nbytes == 0:
        return None
    flat = workspace2.reshape(-1).view(torch.uint8)
    skip = (-flat.data_ptr()) % WORKSPACE_ALIGN
    if flat.numel() < skip + nbytes:
        raise ArgumentError(
            f"workspace2: expected at least {skip + nbytes} bytes (swapmoe's workspace, aligned), "
            f"got {flat.numel()}: size it with workspace_shapes"
        )
    return flat[skip : skip + nbytes]


def _experts_weights(topk_weights: torch.Tensor, apply_router_weight_on_input: bool) -> torch.Tensor:
    """The router weights the experts apply: unit weights when vLLM's prepare step has
    already scaled the input by them (``apply_router_weight_on_input``, topk == 1)."""
    if apply_router_weight_on_input:
        return torch.ones_like(topk_weights, dtype=torch.float32)
    return topk_weights


def run(
    output: torch.Tensor,
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    global_num_experts: int,
    expert_map: Optional[torch.Tensor],
    workspace2: Optional[torch.Tensor],
    apply_router_weight_on_input: bool,
    backend: Optional[str] = None,
) -> None:
    """What the experts class's ``apply`` does when the oracle picks swapmoe: writes the
    weighted, top-k-reduced result into ``output`` ([M, K]).

    With ``apply_router_weight_on_input`` vLLM's prepare step has already scaled the input
    by the router weight (topk == 1), so the experts must not apply it again: swapmoe runs
    with unit weights. The call launches on torch's current stream, uses ``workspace2``
    (never ``workspace13``, which vLLM may alias with ``output``) and never syncs the host.
    """
    if activation not in SUPPORTED_ACTIVATIONS:
        raise ArgumentError(f"activation: expected one of {SUPPORTED_ACTIVATIONS}, got {activation!r}")
    weights = _experts_weights(topk_weights, apply_router_weight_on_input)
    workspace = None
    stream = 0
    if hidden_states.is_cuda:
        m, k = hidden_states.shape
        n = w2.shape[2]
        nbytes = _core.workspace_bytes(m, topk_ids.shape[1], n, k, w1.shape[0], hidden_states.element_size())
        if workspace2 is None:
            raise ArgumentError("workspace2: expected a CUDA workspace for CUDA tensors, got None")
        workspace = aligned_workspace(workspace2, nbytes)
        stream = _current_stream(hidden_states)
    _core.fused_experts(
        hidden_states, w1, w2, weights, topk_ids, output, workspace, activation, False,
        global_num_experts, expert_map, False, stream, backend,
    )


def run_fp8(
    output: torch.Tensor,
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    global_num_experts: int,
    expert_map: Optional[torch.Tensor],
    workspace2: Optional[torch.Tensor],
    apply_router_weight_on_input: bool,
    quant_config: Any,
    quant: str,
) -> None:
    """:func:`run` for FP8 W8A8 layers: ``hidden_states`` arrives unquantized (the experts
    class tells vLLM's prepare step not to quantize) and swapmoe quantizes it inside its
    kernels with the layer's scales (``quant_config``: vLLM's FusedMoEQuantConfig)."""
    from ._api import fused_experts

    weights = _experts_weights(topk_weights, apply_router_weight_on_input)
    fused_experts(
        hidden_states, w1, w2, weights, topk_ids,
        activation=activation, global_num_experts=global_num_experts, expert_map=expert_map,
        out=output, use_fp8_w8a8=True, w1_scale=quant_config.w1_scale,
        w2_scale=quant_config.w2_scale, a1_scale=quant_config.a1_scale,
        a2_scale=quant_config.a2_scale, per_channel_quant=(quant == "fp8_channel"),
        block_shape=quant_config.block_shape,
    )
