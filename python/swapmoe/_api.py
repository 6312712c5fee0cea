"""The public op. Dispatches on the tensor library; the work happens in ``_core``."""

from __future__ import annotations

import operator
import sys
import warnings
from typing import Any, List, Optional, Tuple

from . import _core
from ._args import CONVERSION_ERRORS, host_buffer, host_router_outputs, quant_name, raise_named, routing_shape, shown
from .errors import ArgumentError, DTypeError, ShapeError


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _shape(x: Any) -> Optional[tuple]:
    """``x.shape`` as a tuple of ints, or None where it has none (a nested torch tensor's
    ``.shape`` raises RuntimeError: the op's own checks then name the tensor)."""
    try:
        shape = getattr(x, "shape", None)
        return tuple(int(d) for d in shape) if shape is not None else None
    except (TypeError, RuntimeError):
        return None


def _workspace_size(hidden_states: Any, w1: Any, m: int, topk: int, quant: Optional[str], routing: bool) -> int:
    h, w = _shape(hidden_states), _shape(w1)
    if not h or not w or len(h) != 2 or len(w) != 3:
        return 0
    if w[0] < 1 or w[1] % 2 or w[2] != h[1] or m != h[0] or min(h + w + (topk,)) < 0:
        return 0
    itemsize = getattr(getattr(hidden_states, "dtype", None), "itemsize", 0) or 2
    try:
        return _core.workspace_bytes(h[0], topk, w[1] // 2, h[1], w[0], itemsize, quant, routing)
    except CONVERSION_ERRORS as e:
        raise_named(e, dict(topk=topk, quant=quant))


def workspace_bytes(hidden_states: Any, w1: Any, topk_ids: Any, quant: Optional[str] = None) -> int:
    """Bytes of CUDA workspace one :func:`fused_experts` call needs (its ``workspace=``),
    from the shapes of its inputs (0 when the shapes are not those of a valid call: the op
    itself then raises a precise error). ``quant``: None, ``"fp8_tensor"``, ``"fp8_channel"``
    or ``"fp8_block128"``, the call's scheme. :class:`OutOfMemoryError` where the size passes
    2^64 bytes."""
    ids = _shape(topk_ids)
    if not ids or len(ids) != 2:
        return 0
    return _workspace_size(hidden_states, w1, ids[0], ids[1], quant, False)


def fused_moe_workspace_bytes(hidden_states: Any, w1: Any, topk: int, quant: Optional[str] = None) -> int:
    """Bytes of CUDA workspace one :func:`fused_moe` call with ``workspace=`` needs: the
    experts' sections, then the router's weights and ids (``[M, topk]`` each), which such a
    call keeps in its workspace. Otherwise as :func:`workspace_bytes`."""
    try:
        topk = operator.index(topk)
    except TypeError:
        raise ArgumentError(f"topk: expected an integer, got {shown(topk)}") from None
    h = _shape(hidden_states)
    return _workspace_size(hidden_states, w1, h[0] if h else -1, topk, quant, True)


_DL_CPU = 1  # DLPack's device type of host memory (dlpack.h: kDLCPU)


def _on_host(tensor: Any) -> bool:
    """Whether a DLPack tensor lives in host memory, where the CPU path runs it. A producer
    without a working ``__dlpack_device__`` counts as host: the core's import then names the
    device it finds."""
    device = getattr(tensor, "__dlpack_device__", None)
    if device is None:
        return True
    try:
        return int(device()[0]) == _DL_CPU
    except Exception:  # noqa: BLE001
        return True  # a broken producer: the core's import reports it


def _stream_address(stream: Any) -> int:
    """A CUstream address from ``stream``: an int (0: the legacy default stream), or a stream
    object with ``cuda_stream`` (torch) or ``ptr`` (CuPy)."""
    value = stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            value = getattr(stream, attr)
            break
    if type(value) is bool:
        value = None
    try:
        address = operator.index(value)
    except TypeError:
        address = -1
    if not 0 <= address < 2**64:
        raise ArgumentError(
            "stream: expected a CUstream address (an int >= 0, 0 for the legacy default stream) or a "
            f"stream object with .cuda_stream (torch) or .ptr (CuPy), got {shown(stream)}"
        )
    return address


def _no_out(hidden_states: Any) -> ArgumentError:
    """The error for a call without ``out`` on tensors of a library swapmoe does not allocate for."""
    return ArgumentError(
        f"out: expected an output tensor for inputs of type {type(hidden_states).__name__} "
        "(swapmoe allocates only for torch, numpy and cupy), got None"
    )


def _no_caller_buffers(library: str, why: str, workspace: Any, stream: Any) -> None:
    """:class:`ArgumentError` for ``workspace`` / ``stream`` given where the call takes neither."""
    for name, value in (("workspace", workspace), ("stream", stream)):
        if value is not None:
            raise ArgumentError(f"{name}: expected None for {library} ({why}), got {shown(value)}")


def fused_experts(
    hidden_states: Any,
    w1: Any,
    w2: Any,
    topk_weights: Any,
    topk_ids: Any,
    *,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Any = None,
    out: Any = None,
    check_ids: bool = False,
    backend: Optional[str] = None,
    use_fp8_w8a8: bool = False,
    w1_scale: Any = None,
    w2_scale: Any = None,
    a1_scale: Any = None,
    a2_scale: Any = None,
    per_channel_quant: bool = False,
    block_shape: Optional[List[int]] = None,
    workspace: Any = None,
    stream: Any = None,
) -> Any:
    """Fused MoE experts with vLLM's semantics; returns ``out`` ([M, K]).

    ``out[m] = sum_k topk_weights[m, k] * w2[e] @ (act(w1[e, :N] @ x[m]) * (w1[e, N:] @ x[m]))``
    with ``e = expert_map[topk_ids[m, k]]`` (or ``topk_ids[m, k]`` without a map).

    - hidden_states ``[M, K]``, bf16/fp16/fp32; w1 ``[E, 2N, K]`` (gate rows, then up);
      w2 ``[E, K, N]``; all of one dtype, last dimension contiguous.
    - topk_weights ``[M, topk]`` (fp32, bf16 or fp16); topk_ids ``[M, topk]`` int32/int64.
    - activation: ``"silu"`` or ``"gelu"`` (erf form).
    - apply_router_weight_on_input: scale the input by the router weight (needs topk == 1).
    - global_num_experts: number of experts the ids refer to (-1: ``expert_map.shape[0]``,
      or ``E`` without a map). expert_map ``[global_E]`` int32 maps ids to local experts or
      -1 (expert parallelism).
    - Ids outside ``[0, global_num_experts)``, -1 ids and unmapped experts contribute
      nothing and are never used to index memory. ``check_ids=True`` raises
      :class:`ShapeError` naming the first bad id instead; on CUDA it waits for the stream
      (a host sync) and cannot be used during graph capture.
    - out: optional ``[M, K]`` output to write (may be ``hidden_states`` itself, but overlap
      no other input: :class:`ShapeError`).
    - backend: force a backend (``"cuda_decode"``, ``"cuda_wgmma_swap"``, ``"cuda_mma"``,
      ``"cuda_wgmma"``, ``"cuda_bulk_decode"``, ``"cuda_generic"`` or ``"cpu"``) instead of
      the oracle's choice; ``$SWAPMOE_BACKEND`` does the same for every call. A backend that
      cannot run the call raises the error of what stops it: :class:`ShapeError` (a K or N
      tail its layout cannot take, naming the multiple; M or the slots past its limit),
      :class:`DTypeError`, :class:`DeviceError`, or :class:`ArgumentError` (FP8 on a backend
      without e4m3 kernels).
    - FP8 W8A8 (vLLM's ``use_fp8_w8a8=True``): w1/w2 are float8_e4m3fn (numpy: uint8
      holding e4m3 bytes) and hidden_states stays bf16/fp16/fp32; the output has the
      hidden dtype. Schemes, with float32 scales:

      - per tensor: ``w1_scale``/``w2_scale`` ``[E]`` (or ``[E, 1]``, ``[E, 1, 1]``);
        ``a1_scale``/``a2_scale`` scalar (``[]`` or ``[1]``) static scales of the input and
        of the intermediate, or None for dynamic ones (absmax / 448);
      - ``per_channel_quant=True``: ``w1_scale [E, 2N]``, ``w2_scale [E, K]`` (or with a
        trailing 1); activations quantized dynamically per token;
      - ``block_shape=[128, 128]``: ``w1_scale [E, ceil(2N/128), ceil(K/128)]``,
        ``w2_scale [E, ceil(K/128), ceil(N/128)]``; activations dynamic per token per 128
        columns.

      NaN or inf in hidden_states (or the intermediate) quantizes to NaN and is left out of
      every absmax: it reaches exactly the output rows of its token. CUDA needs sm_89+.

    torch tensors go through ``torch.ops.swapmoe`` under ``torch.compile``; CUDA tensors
    launch on ``torch.cuda.current_stream()`` with the workspace from torch's caching
    allocator (``workspace`` and ``stream`` must be None). numpy arrays run the CPU path.

    CUDA tensors of other libraries (CuPy, or any DLPack producer) may bring their own:

    - workspace: a contiguous, writable buffer on the inputs' device, 256-byte aligned, of at
      least :func:`workspace_bytes` bytes, overlapping no other argument. The call allocates
      none and the caller owns it: keep it alive as long as a CUDA graph that captured the
      call, and do not share it between calls that may run at once. CuPy arrays without one
      take theirs from CuPy's pool, and then a CuPy stream that is capturing a CUDA graph
      raises :class:`ArgumentError` (the pool would take it back while replays still use it).
      Other producers need one (and ``out``).
    - stream: where to launch, a CUstream address (int) or a stream object with
      ``cuda_stream`` or ``ptr``; default CuPy's current stream of the inputs' device for CuPy,
      the legacy default stream (0) for other producers. The inputs must be ready on it.
    """
    if not isinstance(activation, str):
        raise ArgumentError(f"activation: expected one of 'silu', 'gelu', got {shown(activation)}")
    kw = dict(
        activation=activation,
        apply_router_weight_on_input=apply_router_weight_on_input,
        global_num_experts=global_num_experts,
        expert_map=expert_map,
        out=out,
        check_ids=check_ids,
        backend=backend,
        use_fp8_w8a8=use_fp8_w8a8,
        w1_scale=w1_scale,
        w2_scale=w2_scale,
        a1_scale=a1_scale,
        a2_scale=a2_scale,
        per_channel_quant=per_channel_quant,
        block_shape=_listed(block_shape),
    )
    if _is_torch(hidden_states):
        from . import ops

        _no_caller_buffers("torch tensors", _TORCH_BUFFERS, workspace, stream)
        return ops.fused_experts_torch(hidden_states, w1, w2, topk_weights, topk_ids, **kw)
    return _fused_experts_dlpack(hidden_states, w1, w2, topk_weights, topk_ids, workspace=workspace,
                                 stream=stream, **kw)


def _listed(block_shape: Any) -> Any:
    """``block_shape`` as the core takes it (a list or tuple of ints): a 1-D tensor or array
    (``torch.tensor([128, 128])``) becomes its list; anything else goes on as it is, for the
    core to take or the error path to name."""
    if block_shape is None or isinstance(block_shape, (list, tuple)):
        return block_shape
    tolist = getattr(block_shape, "tolist", None)
    if callable(tolist) and len(getattr(block_shape, "shape", ())) == 1:
        listed = tolist()
        if isinstance(listed, list):
            return listed
    return block_shape


_TORCH_BUFFERS = "the op takes its workspace from torch's caching allocator and launches on torch's current stream"
_HOST_BUFFERS = "the CPU path needs no workspace and no stream"


def _require_dlpack(tensor: Any, name: str) -> None:
    """:class:`DTypeError` naming ``name`` unless ``tensor`` can be exported through DLPack."""
    if not hasattr(tensor, "__dlpack__"):
        raise DTypeError(
            f"{name}: expected a tensor that supports DLPack (torch, numpy, cupy, ...), got {type(tensor).__name__}"
        )


def _cupy_stream(cupy: Any, stream: Any, pool_workspace: bool) -> int:
    """The stream a CuPy call launches on: ``stream``, or CuPy's current stream of the current
    device. A call whose workspace comes from CuPy's pool (``pool_workspace``) refuses a
    stream that is capturing a CUDA graph: the workspace goes back to the pool when the call
    returns, while every replay would still use it. (torch's graphs keep theirs: their
    private pool lives as long as the graph; a caller's own workspace lives as long as the
    caller keeps it.)"""
    if stream is None:
        s = cupy.cuda.get_current_stream()
    else:
        address = _stream_address(stream)
        if not pool_workspace:
            return address
        with warnings.catch_warnings():
            # CuPy 14 deprecates ExternalStream for objects with __cuda_stream__; a bare
            # address has no other wrapper, and this one only asks whether it captures
            warnings.simplefilter("ignore", DeprecationWarning)
            s = cupy.cuda.ExternalStream(address)
    if pool_workspace and s.ptr and s.is_capturing():
        raise ArgumentError(
            "workspace: expected the caller's own workspace (swapmoe.workspace_bytes(...) bytes, or "
            "swapmoe.fused_moe_workspace_bytes for fused_moe) for a call on a CuPy stream that is capturing a "
            "CUDA graph (a workspace from CuPy's pool returns to the pool when the call returns, while a replay "
            "would still use it), got None"
        )
    return s.ptr


def _non_cupy_out_and_stream(hidden_states: Any, module: str, out: Any, workspace: Any, stream: Any):
    """``(out, stream, on_host)`` for tensors that are not CuPy's. Host tensors run the CPU
    path: no workspace and no stream, and numpy's output is allocated here. Another library's
    CUDA tensors bring their output, workspace and stream (default the legacy stream, 0)."""
    if module == "numpy" or _on_host(hidden_states):
        _no_caller_buffers(f"{type(hidden_states).__name__} inputs in host memory", _HOST_BUFFERS, workspace, stream)
        if out is None:
            if module != "numpy":
                raise _no_out(hidden_states)
            import numpy as np

            shape = _shape(hidden_states) or ()
            out = host_buffer(lambda: np.empty(shape, dtype=hidden_states.dtype), "out", shape, hidden_states.dtype)
        return out, 0, True
    stream = 0 if stream is None else _stream_address(stream)
    if out is None:
        raise _no_out(hidden_states)
    return out, stream, False


def _fused_experts_dlpack(hidden_states, w1, w2, topk_weights, topk_ids, *, out, workspace, stream, **kw):
    _require_dlpack(hidden_states, "hidden_states")
    module = type(hidden_states).__module__.split(".")[0]
    if module == "cupy":
        import cupy  # type: ignore[import-not-found]

        quant = quant_name(kw.get("use_fp8_w8a8", False), kw.get("per_channel_quant", False), kw.get("block_shape"))
        with hidden_states.device:  # the inputs' GPU, whichever is CuPy's current one
            stream = _cupy_stream(cupy, stream, workspace is None)
            if out is None:
                out = cupy.empty(hidden_states.shape, dtype=hidden_states.dtype)
            if workspace is None:
                workspace = cupy.empty(workspace_bytes(hidden_states, w1, topk_ids, quant), dtype=cupy.uint8)
    else:
        out, stream, _ = _non_cupy_out_and_stream(hidden_states, module, out, workspace, stream)
    try:
        _core.fused_experts(
            hidden_states, w1, w2, topk_weights, topk_ids, out, workspace=workspace, stream=stream, **kw
        )
    except CONVERSION_ERRORS as e:
        raise_named(e, kw)
    return out


def _router_args(topk: Any, scoring: Any) -> int:
    """topk as an int; both checked for their Python types (the core checks the values)."""
    try:
        topk = operator.index(topk)
    except TypeError:
        raise ArgumentError(f"topk: expected an integer, got {shown(topk)}") from None
    if not isinstance(scoring, str):
        raise ArgumentError(f"scoring: expected 'softmax' or 'sigmoid', got {shown(scoring)}")
    return topk


def select_experts(
    gating_output: Any,
    topk: int,
    *,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    e_score_correction_bias: Any = None,
    routed_scaling_factor: float = 1.0,
    num_tokens: Optional[int] = None,
) -> Tuple[Any, Any]:
    """Routes router logits ``[M, E]`` (fp32, bf16 or fp16) to ``(topk_weights fp32 [M, topk],
    topk_ids int32 [M, topk])`` with vLLM's ``fused_topk`` / ``grouped_topk`` semantics.

    - ``scoring``: ``"softmax"`` (Mixtral, Qwen3) or ``"sigmoid"`` (DeepSeek-V3, Llama-4 top-1).
    - ``num_expert_group`` / ``topk_group``: grouped top-k (DeepSeek-V3: 8 and 4). A group's
      score is its best score, or with ``e_score_correction_bias`` ``[E]`` the sum of its two
      best biased scores; only the ``topk_group`` best groups can be picked from.
    - The bias only steers selection; weights are the unbiased scores, divided by their sum
      when ``renormalize``, then multiplied by ``routed_scaling_factor``.
    - Ids come in descending score order; equal scores go to the lowest expert index. NaN
      ranks above every number (as in ``torch.topk``): a NaN logit is picked and its NaN
      weight reaches the output, never silently dropped. A softmax row with a NaN is all NaN.
    - ``num_tokens``: when given, ``gating_output.shape[0]`` must equal it.
    """
    topk = _router_args(topk, scoring)
    if _is_torch(gating_output):
        from . import ops

        return ops.select_experts_torch(
            gating_output, topk, renormalize, scoring, num_expert_group, topk_group,
            e_score_correction_bias, routed_scaling_factor, num_tokens,
        )
    _require_dlpack(gating_output, "gating_output")
    m, k = routing_shape(_shape(gating_output) or (), topk)
    module = type(gating_output).__module__.split(".")[0]
    stream = 0
    if module == "cupy":
        import cupy  # type: ignore[import-not-found]

        with gating_output.device:
            weights, ids = cupy.empty((m, k), cupy.float32), cupy.empty((m, k), cupy.int32)
            stream = cupy.cuda.get_current_stream().ptr
    else:
        import numpy as np

        weights, ids = host_router_outputs(np.empty, np.float32, np.int32, m, k)
    try:
        _core.select_experts(
            gating_output, weights, ids, topk, renormalize, scoring, num_expert_group, topk_group,
            e_score_correction_bias, routed_scaling_factor, stream, num_tokens,
        )
    except CONVERSION_ERRORS as e:
        raise_named(e, locals())
    return weights, ids


def fused_moe(
    hidden_states: Any,
    w1: Any,
    w2: Any,
    gating_output: Any,
    topk: int,
    *,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    e_score_correction_bias: Any = None,
    routed_scaling_factor: float = 1.0,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Any = None,
    out: Any = None,
    backend: Optional[str] = None,
    use_fp8_w8a8: bool = False,
    w1_scale: Any = None,
    w2_scale: Any = None,
    a1_scale: Any = None,
    a2_scale: Any = None,
    per_channel_quant: bool = False,
    block_shape: Optional[List[int]] = None,
    workspace: Any = None,
    stream: Any = None,
) -> Any:
    """The whole MoE layer from router logits: :func:`select_experts` then
    :func:`fused_experts`, with the same results, on the GPU for CUDA tensors with no host
    sync. ``gating_output`` is ``[M, global_E]``; the other arguments are those of the two.

    On CUDA the router kernel runs first (``_core.describe_plan(..., fused_moe=True,
    scoring=..., num_expert_group=...)`` names it and says why): the warp router, or for
    grouped sigmoid routing (DeepSeek-V3) the grouped CTA router, launched with programmatic
    dependent launch up to M = 16; ``$SWAPMOE_ROUTER_KERNEL`` (``auto``, ``warp``, ``cta``)
    overrides that choice. ``$SWAPMOE_ROUTER_FUSION=on`` routes inside the experts' first kernel
    instead where it can (E <= 256: the decode GEMM1 at M <= 8, the align kernel at
    M <= 16), which measured slower.

    The library of ``hidden_states`` allocates the output and the routing buffers; the other
    tensors may come from any DLPack library on the same device (torch ``hidden_states`` with
    numpy or cupy logits: the logits are viewed through ``torch.from_dlpack``, no copy).

    ``workspace`` and ``stream`` as for :func:`fused_experts` (CUDA tensors of libraries other
    than torch), except that a caller's workspace also holds the router's weights and ids:
    size it with :func:`fused_moe_workspace_bytes`. With one, the call allocates nothing but
    ``out`` (where none is given), so a CuPy stream may capture it in a CUDA graph."""
    g_shape, w_shape, m_shape = _shape(gating_output), _shape(w1), _shape(expert_map)
    try:
        global_num_experts = operator.index(global_num_experts)
    except TypeError:
        raise ArgumentError(
            f"global_num_experts: expected an integer, got {shown(global_num_experts)}") from None
    # (a global_num_experts that is neither -1 nor positive is left to the core, which names it)
    if g_shape and len(g_shape) == 2 and w_shape and (global_num_experts == -1 or global_num_experts > 0):
        if global_num_experts != -1:
            experts, what = global_num_experts, "global_num_experts"
        elif m_shape:
            experts, what = m_shape[0], "expert_map.shape[0]"
        else:
            experts, what = w_shape[0], "w1.shape[0], no expert_map given"
        if g_shape[1] != experts:
            raise ShapeError(
                f"gating_output: expected shape [M, {experts}] ({what}), got [{g_shape[0]}, {g_shape[1]}]"
            )
    topk = _router_args(topk, scoring)
    if not isinstance(activation, str):
        raise ArgumentError(f"activation: expected one of 'silu', 'gelu', got {shown(activation)}")
    kw = dict(
        renormalize=renormalize,
        scoring=scoring,
        num_expert_group=num_expert_group,
        topk_group=topk_group,
        e_score_correction_bias=e_score_correction_bias,
        routed_scaling_factor=routed_scaling_factor,
        activation=activation,
        apply_router_weight_on_input=apply_router_weight_on_input,
        global_num_experts=global_num_experts,
        expert_map=expert_map,
        backend=backend,
        use_fp8_w8a8=use_fp8_w8a8,
        w1_scale=w1_scale,
        w2_scale=w2_scale,
        a1_scale=a1_scale,
        a2_scale=a2_scale,
        per_channel_quant=per_channel_quant,
        block_shape=_listed(block_shape),
    )
    if _is_torch(hidden_states):
        from . import ops

        _no_caller_buffers("torch tensors", _TORCH_BUFFERS, workspace, stream)
        if not _is_torch(gating_output):
            gating_output = _torch_view(gating_output, "gating_output")

        return ops.fused_moe_torch(hidden_states, w1, w2, gating_output, topk, out=out, **kw)
    return _fused_moe_dlpack(hidden_states, w1, w2, gating_output, topk, out=out, workspace=workspace,
                             stream=stream, **kw)


def _torch_view(tensor: Any, name: str) -> Any:
    """A torch view (no copy) of another library's tensor, for the torch path when
    ``hidden_states`` is a torch tensor: the outputs are allocated by torch."""
    import torch

    _require_dlpack(tensor, name)
    try:
        return torch.from_dlpack(tensor)
    except MemoryError:
        raise
    except Exception as e:  # a producer's refusal (read-only, a dtype torch lacks, ...)
        raise DTypeError(
            f"{name}: expected a tensor that torch can import through DLPack (hidden_states is a "
            f"torch.Tensor), got {type(tensor).__name__} that it refused: {e}"
        ) from None


def _fused_moe_dlpack(hidden_states, w1, w2, gating_output, topk, *, out, workspace, stream, **kw):
    _require_dlpack(hidden_states, "hidden_states")
    _require_dlpack(gating_output, "gating_output")
    module = type(hidden_states).__module__.split(".")[0]
    m, k = routing_shape(_shape(gating_output) or (), topk)
    weights = ids = None  # None: the router's outputs live in the caller's workspace
    if module == "cupy":
        import cupy  # type: ignore[import-not-found]

        quant = quant_name(kw["use_fp8_w8a8"], kw["per_channel_quant"], kw["block_shape"])
        with hidden_states.device:
            stream = _cupy_stream(cupy, stream, workspace is None)
            if out is None:
                out = cupy.empty(hidden_states.shape, dtype=hidden_states.dtype)
            if workspace is None:
                weights, ids = cupy.empty((m, k), cupy.float32), cupy.empty((m, k), cupy.int32)
                workspace = cupy.empty(workspace_bytes(hidden_states, w1, ids, quant), dtype=cupy.uint8)
    else:
        out, stream, on_host = _non_cupy_out_and_stream(hidden_states, module, out, workspace, stream)
        if on_host:
            import numpy as np

            weights, ids = host_router_outputs(np.empty, np.float32, np.int32, m, k)
    try:
        _core.fused_moe(
            hidden_states, w1, w2, gating_output, weights, ids, out, workspace, topk,
            kw["renormalize"], kw["scoring"], kw["num_expert_group"], kw["topk_group"],
            kw["e_score_correction_bias"], kw["routed_scaling_factor"], kw["activation"],
            kw["apply_router_weight_on_input"], kw["global_num_experts"], kw["expert_map"], stream,
            kw["backend"], kw["use_fp8_w8a8"], kw["w1_scale"], kw["w2_scale"], kw["a1_scale"], kw["a2_scale"],
            kw["per_channel_quant"], kw["block_shape"],
        )
    except CONVERSION_ERRORS as e:
        raise_named(e, dict(kw, topk=topk))
    return out


def device_ordinal(device: Any) -> int:
    """``swapmoe.warmup``'s ``device`` as a CUDA ordinal (the range is the core's to check)."""
    bad = ArgumentError(
        "device: expected a CUDA device ordinal (int), 'cuda', 'cuda:N', a torch.device of type "
        f"cuda or a CuPy Device, got {shown(device)}")
    if type(device) is bool:
        raise bad
    try:
        ordinal = operator.index(device)
    except TypeError:
        ordinal = None
    if ordinal is None and isinstance(getattr(device, "id", None), int) and type(device).__module__.startswith("cupy"):
        ordinal = device.id  # cupy.cuda.Device
    if ordinal is None:
        kind, index = None, None
        if isinstance(device, str):
            kind, colon, rest = device.strip().partition(":")
            if colon:
                if not rest.isdigit():
                    raise bad
                index = int(rest)
        elif type(device).__name__ == "device" and type(device).__module__ == "torch":
            kind, index = device.type, device.index
        if kind != "cuda":
            raise bad
        if index is None:
            torch = sys.modules.get("torch")
            index = torch.cuda.current_device() if torch is not None and torch.cuda.is_available() else 0
        ordinal = index
    if not -(2**31) <= ordinal < 2**31:
        raise bad
    return ordinal
