"""swapmoe's vLLM plugin: ``pip install swapmoe`` and vLLM's MoE layers use swapmoe.

vLLM loads the ``vllm.general_plugins`` entry point ``swapmoe = swapmoe.vllm_plugin:register``
in every process. :func:`register` then

- checks ``$SWAPMOE_DISABLE``, the vLLM version (:data:`SUPPORTED_VLLM`) and the platform
  (CUDA, compute capability 8.0 or newer);
- unquantized MoE: registers :class:`SwapmoeUnquantizedFusedMoEMethod` through
  ``UnquantizedFusedMoEMethod.register_oot``. Where vLLM would run its ``TritonExperts``
  and the user did not force ``--moe-backend``, the layer's experts become swapmoe's;
- FP8 MoE: wraps ``oracle.fp8.backend_to_kernel_cls`` so that the TRITON entry offers
  swapmoe's experts first (for the FP8 schemes this build runs), and
  ``oracle.fp8._get_priority_backends`` so that swapmoe's oracle, not vLLM's static list,
  decides whether FLASHINFER_CUTLASS goes before TRITON on Hopper;
- logs one line saying what it replaced, or why it did nothing.

At run time the experts class asks swapmoe's oracle, per token count, whether swapmoe's
kernels or vLLM's Triton kernels run the call (``Plan.backend == "vllm_triton"``), and
delegates to a ``TritonExperts`` it holds. Nothing on the call path syncs the host.

Importing this module imports neither vLLM nor CUDA; the vLLM classes are built on first use.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from typing import Any, Dict, List, Optional, Tuple

logger = logging.getLogger("vllm.swapmoe")

#: vLLM versions the plugin is tested against: [first, end).
SUPPORTED_VLLM: Tuple[Tuple[int, int, int], Tuple[int, int, int]] = ((0, 33, 0), (0, 34, 0))
#: Oldest compute capability swapmoe's CUDA kernels run on.
MIN_CAPABILITY = (8, 0)
DISABLE_ENV = "SWAPMOE_DISABLE"

# What the last register() did: None before the first call, else its log line.
_status: Optional[str] = None
# What register() changed in vLLM, so that tests can undo it: (object, attribute, old value).
_patches: List[Tuple[Any, str, Any]] = []
_registered_oot: Optional[str] = None


def status() -> Optional[str]:
    """The line :func:`register` logged in this process (None if it has not run)."""
    return _status


def _parse_version(text: str) -> Tuple[int, int, int]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        return (0, 0, 0)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def _fmt(v: Tuple[int, int, int]) -> str:
    return ".".join(str(x) for x in v)


def _say(line: str) -> None:
    global _status
    _status = line
    logger.info(line)


def register() -> None:
    """vLLM's plugin hook. Idempotent and cheap: a second call in a process does nothing."""
    if _status is not None:
        return
    if os.environ.get(DISABLE_ENV, "").strip() not in ("", "0"):
        _say(f"swapmoe: disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]}; vLLM's own MoE kernels run")
        return
    try:
        from importlib.metadata import version

        vllm_version = version("vllm")
    except Exception:  # noqa: BLE001 - any failure means "no usable vLLM"
        _say("swapmoe: vLLM is not installed; nothing replaced")
        return
    have = _parse_version(vllm_version)
    lo, hi = SUPPORTED_VLLM
    if not (lo <= have < hi):
        _say(
            f"swapmoe: vLLM {vllm_version} is outside the supported range "
            f">={_fmt(lo)},<{_fmt(hi)}; nothing replaced"
        )
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        _say(f"swapmoe: platform {type(current_platform).__name__} is not CUDA; nothing replaced")
        return
    cap = current_platform.get_device_capability()
    cap_t = (cap.major, cap.minor) if cap is not None else None
    if cap_t is None or cap_t < MIN_CAPABILITY:
        _say(
            f"swapmoe: CUDA compute capability {cap_t} is below {MIN_CAPABILITY}; nothing replaced"
        )
        return
    done = [_register_unquantized(), _register_fp8()]
    from . import __version__

    _say(
        f"swapmoe {__version__}: vLLM {vllm_version}, sm_{cap_t[0]}{cap_t[1]}: "
        + "; ".join(done)
        + f" (turn off with {DISABLE_ENV}=1)"
    )


def _unregister_for_tests() -> None:
    """Undoes :func:`register` (tests only): restores what it patched."""
    global _status, _registered_oot
    while _patches:
        obj, name, old = _patches.pop()
        setattr(obj, name, old)
    if _registered_oot is not None:
        from vllm.model_executor.custom_op import op_registry_oot

        op_registry_oot.pop(_registered_oot, None)
        _registered_oot = None
    _status = None


def _register_unquantized() -> str:
    global _registered_oot
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )

    name = UnquantizedFusedMoEMethod.__name__
    if name in op_registry_oot:
        return f"unquantized MoE left to {op_registry_oot[name].__name__} (registered by another plugin)"
    UnquantizedFusedMoEMethod.register_oot(unquantized_method_class())
    _registered_oot = name
    return "unquantized MoE -> swapmoe experts where vLLM picks TRITON"


def _register_fp8() -> str:
    try:
        from vllm.model_executor.layers.fused_moe.oracle import fp8 as fp8_oracle
    except ImportError as e:
        return f"FP8 MoE left to vLLM (oracle.fp8 not importable: {e})"
    missing = [a for a in ("backend_to_kernel_cls", "_get_priority_backends", "Fp8MoeBackend")
               if not hasattr(fp8_oracle, a)]
    if missing:
        return f"FP8 MoE left to vLLM (oracle.fp8 lacks {missing})"
    if getattr(fp8_oracle.backend_to_kernel_cls, "_swapmoe", False):
        return "FP8 MoE already wrapped"
    backend_enum = fp8_oracle.Fp8MoeBackend
    original_classes = fp8_oracle.backend_to_kernel_cls
    original_priority = fp8_oracle._get_priority_backends

    def backend_to_kernel_cls(backend):  # type: ignore[no-untyped-def]
        classes = original_classes(backend)
        if backend == backend_enum.TRITON:
            return [experts_class(), *classes]
        return classes

    def _get_priority_backends(moe_config, weight_key, activation_key):  # type: ignore[no-untyped-def]
        backends = original_priority(moe_config, weight_key, activation_key)
        return reorder_fp8_backends(backends, backend_enum, moe_config, weight_key, activation_key)

    backend_to_kernel_cls._swapmoe = True  # type: ignore[attr-defined]
    backend_to_kernel_cls.__wrapped__ = original_classes  # type: ignore[attr-defined]
    _get_priority_backends.__wrapped__ = original_priority  # type: ignore[attr-defined]
    _patches.append((fp8_oracle, "backend_to_kernel_cls", original_classes))
    fp8_oracle.backend_to_kernel_cls = backend_to_kernel_cls
    _patches.append((fp8_oracle, "_get_priority_backends", original_priority))
    fp8_oracle._get_priority_backends = _get_priority_backends
    schemes = ", ".join(fp8_schemes()) or "none in this build, so vLLM's TritonExperts run them"
    return f"FP8 MoE -> swapmoe's oracle orders FlashInfer/Triton, swapmoe experts for {schemes}"


# ---------------------------------------------------------------------------------------
# Schemes and the oracle's answers
# ---------------------------------------------------------------------------------------


def _triton_entry_externals() -> Tuple[str, ...]:
    """The external backends ``SwapmoeExperts`` (offered in vLLM's TRITON entry) can hand a call
    to: vLLM's Triton, whose experts it stands in for, and an external backend
    ``$SWAPMOE_BACKEND`` forces, so that the oracle takes the override instead of refusing it
    (FlashInfer is placed by vLLM's own order, before this entry; here vLLM's Triton runs such
    calls)."""
    from .oracle import EXTERNAL_BACKENDS

    forced = os.environ.get("SWAPMOE_BACKEND", "")
    return ("vllm_triton",) + ((forced,) if forced in EXTERNAL_BACKENDS and forced != "vllm_triton" else ())


@functools.lru_cache(maxsize=None)
def fp8_schemes() -> Tuple[str, ...]:
    """FP8 schemes this build of swapmoe runs on CUDA (asked of the oracle, offline)."""
    from .oracle import select_backend

    out = []
    for quant in ("fp8_tensor", "fp8_channel", "fp8_block128"):
        try:
            # backend= names the generic kernels, which every FP8 scheme this build has runs on:
            # the answer is about the build, not about a $SWAPMOE_BACKEND the user forced
            select_backend(1, 8, 2, 256, 256, dtype="bf16", quant=quant, device_name="NVIDIA H200",
                           backend="cuda_generic")
        except Exception:  # noqa: BLE001 - the oracle refusing means "not in this build"
            continue
        out.append(quant)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _fp8_key_schemes() -> Dict[Tuple[Any, Any], str]:
    """vLLM's (weight, activation) QuantKeys of the FP8 schemes swapmoe runs -> quant name."""
    from vllm.model_executor.layers.quantization.utils import quant_utils as q

    return {
        (q.kFp8StaticTensorSym, q.kFp8StaticTensorSym): "fp8_tensor",
        (q.kFp8StaticTensorSym, q.kFp8DynamicTensorSym): "fp8_tensor",
        (q.kFp8StaticChannelSym, q.kFp8DynamicTokenSym): "fp8_channel",
        (q.kFp8Static128BlockSym, q.kFp8Dynamic128Sym): "fp8_block128",
    }


def quant_of_keys(weight_key: Any, activation_key: Any) -> Tuple[Optional[str], Optional[str]]:
    """(swapmoe quant name, why not) for vLLM's (weight, activation) QuantKeys."""
    if weight_key is None and activation_key is None:
        return None, None
    quant = _fp8_key_schemes().get((weight_key, activation_key))
    if quant is None:
        return None, f"quantization scheme {weight_key}x{activation_key} is not one swapmoe runs"
    if quant not in fp8_schemes():
        return None, f"{quant} kernels are not in this build of swapmoe"
    return quant, None


def quant_of_config(quant_config: Any) -> Optional[str]:
    """swapmoe quant name for a FusedMoEQuantConfig (None: unquantized)."""
    if quant_config is None or not getattr(quant_config, "use_fp8_w8a8", False):
        return None
    if quant_config.block_shape is not None:
        return "fp8_block128"
    if quant_config.per_out_ch_quant:
        return "fp8_channel"
    return "fp8_tensor"


def activation_scales_of_config(quant_config: Any, quant: Optional[str]) -> Optional[str]:
    """``"static"`` for a per-tensor FP8 layer with both activation scales (a calibrated
    checkpoint), ``"dynamic"`` when either is computed at run time (then swapmoe runs its
    dynamic-scale kernels, so a table measured with static scales does not describe the call),
    None for the other schemes (dynamic is their only kind)."""
    if quant != "fp8_tensor":
        return None
    static = (getattr(quant_config, "a1_scale", None) is not None
              and getattr(quant_config, "a2_scale", None) is not None)
    return "static" if static else "dynamic"


def _dtype_name(dtype: Any) -> str:
    import torch

    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, "bf16")


def reorder_fp8_backends(backends: list, backend_enum: Any, moe_config: Any, weight_key: Any,
                         activation_key: Any) -> list:
    """vLLM's FP8 priority list, with FLASHINFER_CUTLASS after TRITON where swapmoe's oracle
    says so for this layer at decode (M = 1)."""
    fi, triton = backend_enum.FLASHINFER_CUTLASS, backend_enum.TRITON
    if fi not in backends or triton not in backends or backends.index(triton) < backends.index(fi):
        return backends
    plan = _layer_plan(moe_config, weight_key, activation_key, 1,
                       ("vllm_triton", "flashinfer_cutlass"))
    if plan is None or plan.backend == "flashinfer_cutlass":
        return backends
    out = [b for b in backends if b != fi]
    out.insert(out.index(triton) + 1, fi)
    logger.debug("swapmoe: FP8 MoE backends reordered, TRITON before FLASHINFER_CUTLASS: %s",
                 "; ".join(plan.reasons))
    return out


def _rank_global_experts(local: int, global_: Any) -> int:
    """``global_num_experts`` for the oracle: the model's experts where this rank holds fewer
    (expert parallelism), else -1 (the rank holds them all)."""
    try:
        g = int(global_)
    except (TypeError, ValueError):
        return -1
    return g if g > int(local) else -1


def _layer_plan(moe_config: Any, weight_key: Any, activation_key: Any, m: int,
                external: Tuple[str, ...]) -> Any:
    """The oracle's plan for this layer at ``m`` tokens on the current device, or None when
    the oracle cannot answer (then vLLM's own order stands)."""
    from vllm.platforms import current_platform

    from .oracle import select_backend

    # The layer's weight scheme, and for per-tensor weights whether its activation scales are
    # static (calibrated) or dynamic: the tables are measured for one kind.
    quant = {w: q for (w, _a), q in _fp8_key_schemes().items()}.get(weight_key)
    scales = None
    if quant == "fp8_tensor":
        from vllm.model_executor.layers.quantization.utils import quant_utils as q

        scales = "static" if activation_key == q.kFp8StaticTensorSym else "dynamic"
    cap = current_platform.get_device_capability()
    try:
        return select_backend(
            m, moe_config.num_local_experts, moe_config.experts_per_token, moe_config.hidden_dim,
            moe_config.intermediate_size_per_partition, dtype=_dtype_name(moe_config.in_dtype),
            quant=quant, device_capability=(cap.major, cap.minor),
            device_name=current_platform.get_device_name(), external_backends=external,
            activation_scales=scales,
            global_num_experts=_rank_global_experts(moe_config.num_local_experts,
                                                    getattr(moe_config, "num_experts", -1)),
        )
    except Exception as e:  # noqa: BLE001
        logger.debug("swapmoe: the oracle cannot plan this layer (%s); vLLM's order stands", e)
        return None


# ---------------------------------------------------------------------------------------
# The vLLM classes, built on first use (vLLM must be importable)
# ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def experts_class() -> type:
    """``SwapmoeExperts``, a ``FusedMoEExpertsModular`` that runs swapmoe's op and delegates
    to vLLM's ``TritonExperts`` where swapmoe's oracle picks ``vllm_triton``."""
    import torch
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
    from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import (
        TopKWeightAndReduceNoOP,
    )
    from vllm.platforms import current_platform

    from . import vllm_experts

    supported_activations = {MoEActivation.SILU: "silu", MoEActivation.GELU: "gelu"}

    class SwapmoeExperts(mk.FusedMoEExpertsModular):
        """swapmoe's fused experts inside vLLM's modular kernel (Standard format)."""

        def __init__(self, moe_config: Any, quant_config: Any) -> None:
            super().__init__(moe_config, quant_config)
            self.quant = quant_of_config(quant_config)
            self._triton = TritonExperts(moe_config, quant_config)
            self._route_cache: Dict[Tuple[int, str], str] = {}

        @staticmethod
        def activation_format():  # type: ignore[no-untyped-def]
            return mk.FusedMoEActivationFormat.Standard

        @staticmethod
        def is_supported_config(cls, moe_config, weight_key, activation_key, activation_format):  # type: ignore[no-untyped-def]
            ok, why = mk.FusedMoEExperts.is_supported_config(
                cls, moe_config, weight_key, activation_key, activation_format)
            if not ok:
                return ok, why
            if moe_config.moe_backend != "auto":
                return False, f"the user forced --moe-backend {moe_config.moe_backend}"
            if moe_config.has_bias:
                return False, "kernel does not support expert biases (swapmoe)"
            if moe_config.swiglu_limit is not None or moe_config.swiglu_alpha is not None:
                return False, "kernel does not support clamped or scaled SwiGLU (swapmoe)"
            if (moe_config.num_experts + 31) // 32 * 32 >= 1024:
                return False, "the TritonExperts it delegates to needs fewer than 1024 experts"
            return True, None

        @staticmethod
        def _supports_current_device() -> bool:
            return bool(current_platform.is_cuda()
                        and current_platform.has_device_capability(MIN_CAPABILITY))

        @staticmethod
        def _supports_no_act_and_mul() -> bool:
            return False

        @staticmethod
        def _supports_quant_scheme(weight_key, activation_key) -> bool:  # type: ignore[no-untyped-def]
            if weight_key is None and activation_key is None:
                return True
            quant, _why = quant_of_keys(weight_key, activation_key)
            return quant is not None

        @staticmethod
        def _supports_activation(activation) -> bool:  # type: ignore[no-untyped-def]
            return activation in supported_activations

        @staticmethod
        def _supports_parallel_config(moe_parallel_config) -> bool:  # type: ignore[no-untyped-def]
            return TritonExperts._supports_parallel_config(moe_parallel_config)

        @property
        def expects_unquantized_inputs(self) -> bool:
            # swapmoe quantizes activations inside its FP8 kernels; for a call routed to
            # Triton, apply() quantizes as vLLM's prepare step would have.
            return self.quant is not None

        def finalize_weight_and_reduce_impl(self):  # type: ignore[no-untyped-def]
            return TopKWeightAndReduceNoOP()

        def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts,  # type: ignore[no-untyped-def]
                             expert_tokens_meta, activation):
            itemsize = torch.empty((), dtype=self.moe_config.in_dtype).element_size()
            return vllm_experts.workspace_shapes(M, N, K, topk, local_num_experts, itemsize)

        def route(self, hidden_states: Any, w1: Any, w2: Any, topk: int, global_num_experts: int = -1) -> str:
            """``"swapmoe"`` or ``"vllm_triton"`` for this call (cached per token count)."""
            m = hidden_states.shape[0]
            if not hidden_states.is_cuda:
                return "swapmoe"
            key = (m, str(hidden_states.device), global_num_experts)
            hit = self._route_cache.get(key)
            if hit is None:
                hit = self._ask_oracle(m, hidden_states, w1, w2, topk, global_num_experts)
                self._route_cache[key] = hit
            return hit

        def _ask_oracle(self, m: int, hidden_states: Any, w1: Any, w2: Any, topk: int,
                        global_num_experts: int = -1) -> str:
            from .oracle import EXTERNAL_BACKENDS, select_backend

            dev = hidden_states.device
            try:
                plan = select_backend(
                    m, w1.shape[0], topk, hidden_states.shape[1], w2.shape[2],
                    dtype=_dtype_name(hidden_states.dtype), quant=self.quant,
                    device_capability=torch.cuda.get_device_capability(dev),
                    device_name=torch.cuda.get_device_name(dev), external_backends=_triton_entry_externals(),
                    activation_scales=activation_scales_of_config(self.quant_config, self.quant),
                    global_num_experts=_rank_global_experts(w1.shape[0], global_num_experts),
                )
            except Exception as e:  # noqa: BLE001
                logger.warning("swapmoe: oracle failed for M=%d (%s); running swapmoe's kernels", m, e)
                return "swapmoe"
            # an external pick (a table's vllm_triton, or one $SWAPMOE_BACKEND forces) runs on the
            # experts this entry stands in for: vLLM's Triton
            return "vllm_triton" if plan.backend in EXTERNAL_BACKENDS else "swapmoe"

        def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation,  # type: ignore[no-untyped-def]
                  global_num_experts, expert_map, a1q_scale, a2_scale, workspace13, workspace2,
                  expert_tokens_meta, apply_router_weight_on_input):
            act = supported_activations.get(activation)
            if act is None or self.route(hidden_states, w1, w2, topk_ids.shape[1],
                                         global_num_experts if expert_map is not None else -1) == "vllm_triton":
                return self._delegate(output, hidden_states, w1, w2, topk_weights, topk_ids,
                                      activation, global_num_experts, expert_map, a1q_scale,
                                      a2_scale, workspace13, workspace2, expert_tokens_meta,
                                      apply_router_weight_on_input)
            if self.quant is None:
                vllm_experts.run(output, hidden_states, w1, w2, topk_weights, topk_ids, act,
                                 global_num_experts, expert_map, workspace2,
                                 apply_router_weight_on_input)
                return None
            vllm_experts.run_fp8(output, hidden_states, w1, w2, topk_weights, topk_ids, act,
                                 global_num_experts, expert_map, workspace2,
                                 apply_router_weight_on_input, self.quant_config, self.quant)
            return None

        def _delegate(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation,  # type: ignore[no-untyped-def]
                      global_num_experts, expert_map, a1q_scale, a2_scale, workspace13, workspace2,
                      expert_tokens_meta, apply_router_weight_on_input):
            if self.quant is not None and a1q_scale is None and hidden_states.dtype != torch.float8_e4m3fn:
                # We asked vLLM not to quantize the input (expects_unquantized_inputs);
                # Triton wants it quantized, exactly as the prepare step does it.
                from vllm.model_executor.layers.fused_moe.utils import moe_kernel_quantize_input

                hidden_states, a1q_scale = moe_kernel_quantize_input(
                    hidden_states, self.a1_scale, self.quant_dtype, self.per_act_token_quant,
                    self.block_shape)
            return self._triton.apply(output, hidden_states, w1, w2, topk_weights, topk_ids,
                                      activation, global_num_experts, expert_map, a1q_scale,
                                      a2_scale, workspace13, workspace2, expert_tokens_meta,
                                      apply_router_weight_on_input)

    return SwapmoeExperts


@functools.lru_cache(maxsize=None)
def unquantized_method_class() -> type:
    """``SwapmoeUnquantizedFusedMoEMethod``: vLLM's ``UnquantizedFusedMoEMethod`` whose
    experts are swapmoe's where vLLM would pick TRITON and the user forced no backend."""
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )

    class SwapmoeUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
        def __init__(self, moe: Any) -> None:
            super().__init__(moe)
            self.swapmoe_reason = self._maybe_use_swapmoe(moe)

        def _maybe_use_swapmoe(self, moe: Any) -> str:
            if self.unquantized_backend != UnquantizedMoeBackend.TRITON:
                return f"vLLM picked {self.unquantized_backend.value}, not TRITON"
            fmt = (mk.FusedMoEActivationFormat.BatchedExperts
                   if moe.moe_parallel_config.use_batched_activation_format
                   else mk.FusedMoEActivationFormat.Standard)
            experts = experts_class()
            ok, why = experts.is_supported_config(experts, moe, None, None, fmt)
            if not ok:
                logger.debug("swapmoe: unquantized MoE layer stays on vLLM's Triton: %s", why)
                return str(why)
            self.experts_cls = experts
            return "swapmoe experts"

    SwapmoeUnquantizedFusedMoEMethod.__qualname__ = "SwapmoeUnquantizedFusedMoEMethod"
    return SwapmoeUnquantizedFusedMoEMethod
