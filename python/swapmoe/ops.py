"""torch integration: ``torch.ops.swapmoe.fused_experts`` (functional) and
``torch.ops.swapmoe.fused_experts_out`` (writes ``out``), with fake implementations for
torch.compile. Output and workspace come from torch's caching allocator; kernels launch
on ``torch.cuda.current_stream()``, so the op can be captured in a CUDA graph."""

from __future__ import annotations

from typing import List, Optional

import torch

from . import _core
from ._args import CONVERSION_ERRORS, host_buffer, host_router_outputs, quant_name, raise_named, routing_shape
from .errors import ArgumentError, DTypeError


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_fused_experts_core = _core.fused_experts
_workspace_bytes = _core.workspace_bytes


def _current_stream(hidden_states: torch.Tensor) -> int:
    """Address of torch's current CUDA stream on the tensor's device (0: legacy default)."""
    if _raw_stream is not None:
        return _raw_stream(hidden_states.get_device())
    return torch.cuda.current_stream(hidden_states.device).cuda_stream


def _cuda_workspace(hidden_states: torch.Tensor, w1: torch.Tensor, topk_ids_shape, quant: Optional[str]):
    """(workspace, stream) for a call on CUDA tensors: a uint8 buffer from torch's caching
    allocator sized by the core (None when the shapes are malformed: the core then names the
    argument before it needs a workspace), and torch's current stream."""
    stream = _current_stream(hidden_states)
    try:
        h, w = hidden_states.shape, w1.shape
        nbytes = _workspace_bytes(h[0], topk_ids_shape[1], w[1] // 2, h[1], w[0], hidden_states.element_size(),
                                  quant)
    except (IndexError, TypeError, ValueError):
        nbytes = 0
    if not nbytes:
        return None, stream
    return torch.empty(nbytes, dtype=torch.uint8, device=hidden_states.device), stream


def _run(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    out: torch.Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    global_num_experts: int,
    expert_map: Optional[torch.Tensor],
    check_ids: bool = False,
    backend: Optional[str] = None,
    use_fp8_w8a8: bool = False,
    w1_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    a1_scale: Optional[torch.Tensor] = None,
    a2_scale: Optional[torch.Tensor] = None,
    per_channel_quant: bool = False,
    block_shape: Optional[List[int]] = None,
) -> None:
    # This is the eager hot path: positional arguments, one helper call.
    workspace, stream = None, 0
    if hidden_states.is_cuda:
        workspace, stream = _cuda_workspace(hidden_states, w1, topk_ids.shape,
                                            quant_name(use_fp8_w8a8, per_channel_quant, block_shape))
    try:
        _fused_experts_core(hidden_states, w1, w2, topk_weights, topk_ids, out, workspace, activation,
                            apply_router_weight_on_input, global_num_experts, expert_map, check_ids,
                            stream, backend, use_fp8_w8a8, w1_scale, w2_scale, a1_scale, a2_scale,
                            per_channel_quant, block_shape)
    except CONVERSION_ERRORS as e:
        raise_named(e, locals())


def _not_nested(tensor: torch.Tensor, name: str) -> None:
    """A nested tensor has no shape to allocate by (its ``.shape`` raises): DTypeError
    naming it, as the core names other tensors DLPack cannot carry."""
    if tensor.is_nested:
        raise DTypeError(f"{name}: expected a dense (strided) tensor, got a nested tensor")


def _empty_out(hidden_states: torch.Tensor) -> torch.Tensor:
    shape, dtype, device = hidden_states.shape, hidden_states.dtype, hidden_states.device
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    return host_buffer(lambda: torch.empty(shape, dtype=dtype), "out", shape, dtype)


@torch.library.custom_op("swapmoe::fused_experts", mutates_args=())
def fused_experts_op(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
    use_fp8_w8a8: bool = False,
    w1_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    a1_scale: Optional[torch.Tensor] = None,
    a2_scale: Optional[torch.Tensor] = None,
    per_channel_quant: bool = False,
    block_shape: Optional[List[int]] = None,
) -> torch.Tensor:
    out = _empty_out(hidden_states)
    _run(hidden_states, w1, w2, topk_weights, topk_ids, out, activation,
         apply_router_weight_on_input, global_num_experts, expert_map, False, backend,
         use_fp8_w8a8, w1_scale, w2_scale, a1_scale, a2_scale, per_channel_quant, block_shape)
    return out


@fused_experts_op.register_fake
def _fused_experts_fake(hidden_states, w1, w2, topk_weights, topk_ids, activation="silu",
                        apply_router_weight_on_input=False, global_num_experts=-1, expert_map=None,
                        backend=None, use_fp8_w8a8=False, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None,
                        per_channel_quant=False, block_shape=None):
    return hidden_states.new_empty(hidden_states.shape)


@torch.library.custom_op("swapmoe::fused_experts_out", mutates_args=("out",))
def fused_experts_out_op(
    out: torch.Tensor,
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
    use_fp8_w8a8: bool = False,
    w1_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    a1_scale: Optional[torch.Tensor] = None,
    a2_scale: Optional[torch.Tensor] = None,
    per_channel_quant: bool = False,
    block_shape: Optional[List[int]] = None,
) -> None:
    _run(hidden_states, w1, w2, topk_weights, topk_ids, out, activation,
         apply_router_weight_on_input, global_num_experts, expert_map, False, backend,
         use_fp8_w8a8, w1_scale, w2_scale, a1_scale, a2_scale, per_channel_quant, block_shape)


@fused_experts_out_op.register_fake
def _fused_experts_out_fake(out, hidden_states, w1, w2, topk_weights, topk_ids, activation="silu",
                            apply_router_weight_on_input=False, global_num_experts=-1, expert_map=None,
                            backend=None, use_fp8_w8a8=False, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None,
                        per_channel_quant=False, block_shape=None):
    return None


def fused_experts_torch(hidden_states, w1, w2, topk_weights, topk_ids, *, activation="silu",
                        apply_router_weight_on_input=False, global_num_experts=-1, expert_map=None,
                        out=None, check_ids=False, backend=None, use_fp8_w8a8=False, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None,
                        per_channel_quant=False, block_shape=None):
    """``swapmoe.fused_experts`` for torch tensors. Eager calls skip the dispatcher (lower
    host overhead); under torch.compile the registered ops are used."""
    if torch.compiler.is_compiling():
        if check_ids:
            raise ArgumentError("check_ids: expected False under torch.compile (it syncs the host), got True")
        if out is None:
            return torch.ops.swapmoe.fused_experts(
                hidden_states, w1, w2, topk_weights, topk_ids, activation,
                apply_router_weight_on_input, global_num_experts, expert_map, backend,
                use_fp8_w8a8, w1_scale, w2_scale, a1_scale, a2_scale, per_channel_quant, block_shape)
        torch.ops.swapmoe.fused_experts_out(
            out, hidden_states, w1, w2, topk_weights, topk_ids, activation,
            apply_router_weight_on_input, global_num_experts, expert_map, backend,
            use_fp8_w8a8, w1_scale, w2_scale, a1_scale, a2_scale, per_channel_quant, block_shape)
        return out
    _not_nested(hidden_states, "hidden_states")
    if out is None:
        out = _empty_out(hidden_states) if hidden_states.dim() == 2 else hidden_states
    _run(hidden_states, w1, w2, topk_weights, topk_ids, out, activation,
         apply_router_weight_on_input, global_num_experts, expert_map, check_ids, backend,
         use_fp8_w8a8, w1_scale, w2_scale, a1_scale, a2_scale, per_channel_quant, block_shape)
    return out


def _empty_routing(gating_output: torch.Tensor, topk: int):
    m, k = routing_shape(gating_output.shape, topk)
    if gating_output.device.type != "cpu":
        return (gating_output.new_empty((m, k), dtype=torch.float32),
                gating_output.new_empty((m, k), dtype=torch.int32))
    return host_router_outputs(torch.empty, torch.float32, torch.int32, m, k)


def _route(gating_output, topk_weights, topk_ids, topk, renormalize, scoring, num_expert_group,
           topk_group, e_score_correction_bias, routed_scaling_factor, num_tokens) -> None:
    stream = _current_stream(gating_output) if gating_output.is_cuda else 0
    try:
        _core.select_experts(gating_output, topk_weights, topk_ids, topk, renormalize, scoring,
                             num_expert_group, topk_group, e_score_correction_bias,
                             routed_scaling_factor, stream, num_tokens)
    except CONVERSION_ERRORS as e:
        raise_named(e, locals())


@torch.library.custom_op("swapmoe::select_experts", mutates_args=())
def select_experts_op(
    gating_output: torch.Tensor,
    topk: int,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    e_score_correction_bias: Optional[torch.Tensor] = None,
    routed_scaling_factor: float = 1.0,
    num_tokens: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = _empty_routing(gating_output, topk)
    _route(gating_output, weights, ids, topk, renormalize, scoring, num_expert_group, topk_group,
           e_score_correction_bias, routed_scaling_factor, num_tokens)
    return weights, ids


@select_experts_op.register_fake
def _select_experts_fake(gating_output, topk, renormalize=True, scoring="softmax", num_expert_group=None,
                         topk_group=None, e_score_correction_bias=None, routed_scaling_factor=1.0,
                         num_tokens=None):
    # the real op's buffers (_empty_routing): a bad topk or shape is its error to name, at run time
    return _empty_routing(gating_output, topk)


def select_experts_torch(gating_output, topk, renormalize, scoring, num_expert_group, topk_group,
                         e_score_correction_bias, routed_scaling_factor, num_tokens):
    """``swapmoe.select_experts`` for torch tensors (the op under torch.compile)."""
    if torch.compiler.is_compiling():
        return torch.ops.swapmoe.select_experts(gating_output, topk, renormalize, scoring,
                                                num_expert_group, topk_group, e_score_correction_bias,
                                                routed_scaling_factor, num_tokens)
    _not_nested(gating_output, "gating_output")
    weights, ids = _empty_routing(gating_output, topk)
    _route(gating_output, weights, ids, topk, renormalize, scoring, num_expert_group, topk_group,
           e_score_correction_bias, routed_scaling_factor, num_tokens)
    return weights, ids


def _run_moe(hidden_states, w1, w2, gating_output, topk, out, renormalize, scoring, num_expert_group,
             topk_group, e_score_correction_bias, routed_scaling_factor, activation,
             apply_router_weight_on_input, global_num_experts, expert_map, backend, use_fp8_w8a8,
             w1_scale, w2_scale, a1_scale, a2_scale, per_channel_quant, block_shape) -> None:
    """fused_moe into ``out``: the routing goes to fresh [M, topk] buffers that the experts
    read; the core decides where the router runs."""
    topk_weights, topk_ids = _empty_routing(gating_output, topk)
    workspace, stream = None, 0
    if hidden_states.is_cuda:
        workspace, stream = _cuda_workspace(hidden_states, w1, topk_ids.shape,
                                            quant_name(use_fp8_w8a8, per_channel_quant, block_shape))
    try:
        _core.fused_moe(hidden_states, w1, w2, gating_output, topk_weights, topk_ids, out, workspace, topk,
                        renormalize, scoring, num_expert_group, topk_group, e_score_correction_bias,
                        routed_scaling_factor, activation, apply_router_weight_on_input, global_num_experts,
                        expert_map, stream, backend, use_fp8_w8a8, w1_scale, w2_scale, a1_scale, a2_scale,
                        per_channel_quant, block_shape)
    except CONVERSION_ERRORS as e:
        raise_named(e, locals())


@torch.library.custom_op("swapmoe::fused_moe", mutates_args=())
def fused_moe_op(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    gating_output: torch.Tensor,
    topk: int,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    e_score_correction_bias: Optional[torch.Tensor] = None,
    routed_scaling_factor: float = 1.0,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
    use_fp8_w8a8: bool = False,
    w1_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    a1_scale: Optional[torch.Tensor] = None,
    a2_scale: Optional[torch.Tensor] = None,
    per_channel_quant: bool = False,
    block_shape: Optional[List[int]] = None,
) -> torch.Tensor:
    out = _empty_out(hidden_states)
    _run_moe(hidden_states, w1, w2, gating_output, topk, out, renormalize, scoring, num_expert_group,
             topk_group, e_score_correction_bias, routed_scaling_factor, activation,
             apply_router_weight_on_input, global_num_experts, expert_map, backend, use_fp8_w8a8,
             w1_scale, w2_scale, a1_scale, a2_scale, per_channel_quant, block_shape)
    return out


@fused_moe_op.register_fake
def _fused_moe_fake(hidden_states, w1, w2, gating_output, topk, *args, **kwargs):
    return hidden_states.new_empty(hidden_states.shape)


@torch.library.custom_op("swapmoe::fused_moe_out", mutates_args=("out",))
def fused_moe_out_op(
    out: torch.Tensor,
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    gating_output: torch.Tensor,
    topk: int,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    e_score_correction_bias: Optional[torch.Tensor] = None,
    routed_scaling_factor: float = 1.0,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
    use_fp8_w8a8: bool = False,
    w1_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    a1_scale: Optional[torch.Tensor] = None,
    a2_scale: Optional[torch.Tensor] = None,
    per_channel_quant: bool = False,
    block_shape: Optional[List[int]] = None,
) -> None:
    _run_moe(hidden_states, w1, w2, gating_output, topk, out, renormalize, scoring, num_expert_group,
             topk_group, e_score_correction_bias, routed_scaling_factor, activation,
             apply_router_weight_on_input, global_num_experts, expert_map, backend, use_fp8_w8a8,
             w1_scale, w2_scale, a1_scale, a2_scale, per_channel_quant, block_shape)


@fused_moe_out_op.register_fake
def _fused_moe_out_fake(out, hidden_states, w1, w2, gating_output, topk, *args, **kwargs):
    return None


#: fused_moe's arguments after (hidden_states, w1, w2, gating_output, topk), in the ops' order.
_MOE_ARGS = ("renormalize", "scoring", "num_expert_group", "topk_group", "e_score_correction_bias",
             "routed_scaling_factor", "activation", "apply_router_weight_on_input", "global_num_experts",
             "expert_map", "backend", "use_fp8_w8a8", "w1_scale", "w2_scale", "a1_scale", "a2_scale",
             "per_channel_quant", "block_shape")


def fused_moe_torch(hidden_states, w1, w2, gating_output, topk, *, out=None, **kw):
    """``swapmoe.fused_moe`` for torch tensors: the eager path calls the core directly;
    under torch.compile the registered ops are used. ``kw`` holds every name of _MOE_ARGS."""
    args = [kw[name] for name in _MOE_ARGS]
    if torch.compiler.is_compiling():
        if out is None:
            return torch.ops.swapmoe.fused_moe(hidden_states, w1, w2, gating_output, topk, *args)
        torch.ops.swapmoe.fused_moe_out(out, hidden_states, w1, w2, gating_output, topk, *args)
        return out
    _not_nested(hidden_states, "hidden_states")
    _not_nested(gating_output, "gating_output")
    if out is None:
        out = _empty_out(hidden_states) if hidden_states.dim() == 2 else hidden_states
    _run_moe(hidden_states, w1, w2, gating_output, topk, out, *args)
    return out
