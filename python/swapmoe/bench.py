"""Benchmark logic behind ``swapmoe bench`` (the CLI only parses arguments and prints).

GPU timing follows ``docs/PERFORMANCE.md``, the method the vLLM anchor was measured with:
``layers`` distinct weight copies, one CUDA graph holding ``layers`` calls (one per copy),
``triton.testing.do_bench(graph.replay, return_mode="median")`` (L2 flushed before each
replay), divided by ``layers``. Without triton: CUDA events, an explicit 256 MB L2 flush
before each replay, median of 50. On the CPU the Rust reference path is timed with
``time.perf_counter`` (median).

The HBM floor of one call:
``floor_us = (experts_touched * 3*N*K * bytes_per_weight + 2*M*K * bytes_per_act) / read_bw``,
``bytes_per_weight`` 1 for the FP8 ``--quant`` variants, the dtype's size otherwise. The
bf16 GEMM ceiling (``torch.matmul`` of two 8192x8192 bf16 matrices, same timer) is measured
in the same run; ``%gemm`` is a point's TF/s over it.

The read floor (GPU runs with triton, ``read_floor``): a read-only kernel over exactly the
routed experts' w13 and w2 bytes of each layer (``swapmoe._read_floor``), on the same weight
copies and timed the same way; ``%read`` = its time over the op's. Unlike ``floor_us`` it
includes what one kernel per layer cannot avoid (ramp-up and drain, ~2 µs at 40 MB).

Baselines timed the same way (GPU default): the torch eager pipeline, the
``torch._grouped_mm`` pipeline and, when ``import vllm`` works, vLLM's own
``fused_experts`` (the whole op: align, GEMMs, activation, sum). With an FP8 ``--quant``
only swapmoe (and ``fused_moe`` with ``--with-routing``) is timed; the baselines are listed in
``record["skipped"]`` with the reason.

``--with-routing`` also times ``swapmoe.fused_moe`` from the router logits with the shape's
model's own router (:data:`PRESET_ROUTERS`, a config's router keys, ``--router``; softmax top-k
without renormalize where none is named), DeepSeek-style routers with a correction bias drawn
once per shape. Every column then runs on the ids that router picks (the float64 reference
router on the same logits), so fused_experts on precomputed ids and fused_moe do the same work
and the check holds fused_moe's routing to the reference's. The router is in
``record["routing"]["router"]``.

FP8 (``--quant fp8_tensor|fp8_channel|fp8_block128``): each weight copy is drawn as bf16
master weights (one chunk of experts at a time) and quantized to ``float8_e4m3fn`` with
scale = absmax / 448 per expert (tensor), per output row (channel) or per 128x128 block, in
the layouts ``fused_experts`` validates. fp8_tensor uses static activation scales computed
once from a calibration sample (see :func:`calibrate_static_scales`), as vLLM's FP8
checkpoints and the anchor's fp8-tensor variant do; fp8_channel and fp8_block128 quantize
activations dynamically (per token, per token and 128 columns). The check compares against
a float64 reference on the dequantized weights that quantizes the activations as the op does
(:func:`reference64_fp8`), with e4m3 rounding-midpoint flips accounted for.

torch, triton, tqdm and matplotlib are imported inside functions, so importing this module
stays light.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

SCHEMA = "swapmoe.bench/1"

#: name -> (E, topk, hidden K, moe intermediate N), unsharded.
PRESETS: Dict[str, Tuple[int, int, int, int]] = {
    "mixtral-8x7b": (8, 2, 4096, 14336),
    "mixtral-8x22b": (8, 2, 6144, 16384),
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "qwen3-235b-a22b": (128, 8, 4096, 1536),
    "deepseek-v3": (256, 8, 7168, 2048),
    "deepseek-v3-tp8": (256, 8, 7168, 256),
    "gpt-oss-120b": (128, 4, 2880, 2880),
    "llama4-scout": (16, 1, 5120, 8192),
}

DEFAULT_M_GPU: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096)
DEFAULT_M_CPU: Tuple[int, ...] = (1, 4, 16)
#: (E, topk, K, N) of the CPU run when no shape is given.
CPU_DEFAULT_SHAPE: Tuple[int, int, int, int] = (8, 2, 256, 128)
GPU_DEFAULT_MODEL = "qwen3-30b-a3b"

#: --dtype -> (torch dtype name, bytes per element)
DTYPES: Dict[str, Tuple[str, int]] = {"bf16": ("bfloat16", 2), "fp16": ("float16", 2), "fp32": ("float32", 4)}
#: --quant -> (bytes per weight element, or None for the dtype's size; the anchor's variant
#: name, or None for the dtype's own name / no anchor row). FP8 activations stay in the dtype.
QUANTS: Dict[str, Tuple[Optional[int], Optional[str]]] = {
    "none": (None, None),
    "fp8_tensor": (1, "fp8-tensor"),
    "fp8_channel": (1, None),
    "fp8_block128": (1, "fp8-block128"),
}
#: --quant -> the scheme name of swapmoe.reference (fp8_scheme / fp8_act_quant)
FP8_SCHEMES: Dict[str, str] = {"fp8_tensor": "tensor", "fp8_channel": "channel", "fp8_block128": "block"}
FP8_MAX = 448.0
FP8_BLOCK = 128
#: e4m3 elements within this relative distance of a rounding midpoint may round either way
#: between the op (float32 intermediate) and the float64 reference (as tests/conftest.py)
FP8_FLIP_MARGIN = 1e-4
#: tokens of the calibration sample that sets fp8_tensor's static activation scales
FP8_CALIBRATION_TOKENS = 256
#: ||out - ref|| / ||ref|| bound of the correctness check, per dtype (METHOD.md: bf16
#: operands land between 1e-3 and 1e-2, float32 far under 1e-3). The FP8 check uses the
#: same bounds: its reference quantizes the activations exactly as the op does and accounts
#: for e4m3 rounding-midpoint flips, so what is left is the unquantized path's error
#: (float32 accumulation order, rounding of the output to its dtype); tests/conftest.py's
#: FP8_TOLERANCE (1e-2 for bf16) is the same or tighter.
TOLERANCE: Dict[str, float] = {"bf16": 1e-2, "fp16": 5e-3, "fp32": 1e-3}

ANCHOR_FILE = "h200_vllm_0.33_triton.json"
#: weight copies may take at most this share of the free memory
MEMORY_FRACTION = 0.6
#: bytes summed for the in-run streaming-read bandwidth (a cap: at most 40% of free memory)
READ_BW_BYTES = 4 << 30
#: Alternating rounds of fused_experts and fused_moe per point with --with-routing (the
#: paired difference, ``point["routing_overhead"]``).
ROUTING_ROUNDS = 6  # even: as many rounds in each order (paired_difference)
#: size of the square bf16 torch.matmul that measures the GEMM ceiling
GEMM_N = 8192
#: bytes written to flush L2 when triton is not there
L2_FLUSH_BYTES = 256 << 20

IMPL_SWAPMOE = "swapmoe"
IMPL_EAGER = "torch-eager"
IMPL_GROUPED = "torch-grouped-mm"
IMPL_VLLM = "vllm-fused"
IMPL_ROUTED = "swapmoe-fused-moe"
SHORT_NAMES = {IMPL_SWAPMOE: "swapmoe", IMPL_EAGER: "eager", IMPL_GROUPED: "gmm", IMPL_VLLM: "vllm_fused",
               IMPL_ROUTED: "fused_moe"}
#: the order of implementations in the record, the table and the CSV
IMPL_ORDER = (IMPL_SWAPMOE, IMPL_ROUTED, IMPL_VLLM, IMPL_GROUPED, IMPL_EAGER)
#: implementations that allocate and return their output (vLLM's fused_experts): timed
#: without a copy into a given ``out``, as a model runs them
RETURNS_OUTPUT = frozenset({IMPL_VLLM})
VLLM_FUSED_EXPERTS = "vllm.model_executor.layers.fused_moe.fused_moe.fused_experts"

CPU_LABEL = "CPU run: no CUDA device; times are the Rust reference path, not GPU kernels"
CPU_LABEL_FORCED = "CPU run: --device cpu; times are the Rust reference path, not GPU kernels"


class BenchError(Exception):
    """A bad benchmark request (unknown preset, shape that does not shard, unreadable config)."""


# --------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterSpec:
    """A model's router, as ``swapmoe.fused_moe`` / ``select_experts`` take it: what
    ``--with-routing`` runs from the router logits. ``correction_bias``: the router takes an
    ``e_score_correction_bias`` [E_global] (DeepSeek-V3's noaux_tc); the bench draws one per
    shape (:func:`make_correction_bias`). ``origin``: where the spec came from (a preset, a
    config, ``--router``, the default)."""

    scoring: str = "softmax"
    renormalize: bool = False
    num_expert_group: Optional[int] = None
    topk_group: Optional[int] = None
    correction_bias: bool = False
    routed_scaling_factor: float = 1.0
    origin: str = "default"

    @property
    def grouped(self) -> bool:
        return self.num_expert_group is not None

    def kwargs(self, bias: Any = None) -> dict:
        """The router keyword arguments of ``swapmoe.fused_moe`` / ``select_experts`` (and of
        ``swapmoe.reference.select_experts_ref``), with ``bias`` as the correction bias."""
        return dict(renormalize=self.renormalize, scoring=self.scoring, num_expert_group=self.num_expert_group,
                    topk_group=self.topk_group, e_score_correction_bias=bias if self.correction_bias else None,
                    routed_scaling_factor=self.routed_scaling_factor)

    def describe(self, topk: Optional[int] = None) -> str:
        k = f" top-{topk}" if topk else " top-k"
        s = f"{self.scoring}{k}"
        if self.grouped:
            s += (f" in the best {self.topk_group} of {self.num_expert_group} groups"
                  + (" (group score: sum of its 2 best biased scores)" if self.correction_bias
                     else " (group score: its best score)"))
        if self.correction_bias:
            s += ", e_score_correction_bias"
        s += ", renormalize" if self.renormalize else ", no renormalize"
        if self.routed_scaling_factor != 1.0:
            s += f", x{self.routed_scaling_factor:g}"
        return s

    def check(self, E_global: int, topk: int) -> None:
        """:class:`BenchError` where the router cannot route ``topk`` of ``E_global`` experts."""
        if self.scoring not in ("softmax", "sigmoid"):
            raise BenchError(f"router: expected softmax or sigmoid scoring, got {self.scoring!r}")
        if (self.num_expert_group is None) != (self.topk_group is None):
            raise BenchError("router: expected both num_expert_group and topk_group, or neither")
        if self.grouped:
            g, t = self.num_expert_group, self.topk_group
            if g < 1 or E_global % g:
                raise BenchError(f"router: {g} expert groups do not divide E={E_global}")
            if not 1 <= t <= g:
                raise BenchError(f"router: expected 1 <= topk_group <= {g}, got {t}")
            if topk > t * (E_global // g):
                raise BenchError(f"router: topk={topk} is more than the {t} groups of {E_global // g} experts hold")
        if not (math.isfinite(self.routed_scaling_factor) and self.routed_scaling_factor > 0):
            raise BenchError(f"router: expected a positive routed_scaling_factor, got {self.routed_scaling_factor}")

    def as_dict(self) -> dict:
        return asdict(self)


#: the router of ``--with-routing`` on shapes that name none (--shape, the CPU default, a
#: config without router keys): softmax top-k without renormalize, the routing of
#: ``--routing uniform``'s precomputed ids
DEFAULT_ROUTER = RouterSpec(origin="default: softmax top-k, as --routing uniform's ids")
#: softmax top-k renormalized over the k picked (Mixtral, Qwen3-MoE with norm_topk_prob, gpt-oss:
#: softmax over the top-k logits is the same)
SOFTMAX_RENORM = RouterSpec("softmax", renormalize=True)
#: DeepSeek-V3's noaux_tc router: sigmoid scores, 8 groups, the best 4 by the sum of each
#: group's 2 best biased scores, top-8 in them, weights renormalized and scaled by 2.5
DEEPSEEK_V3_ROUTER = RouterSpec("sigmoid", renormalize=True, num_expert_group=8, topk_group=4,
                                correction_bias=True, routed_scaling_factor=2.5)
#: Llama 4: sigmoid of the top-1 logit, not renormalized
LLAMA4_ROUTER = RouterSpec("sigmoid", renormalize=False)

#: preset -> its model's router (see :data:`PRESETS`; the Hugging Face configs' scoring_func,
#: n_group, topk_group, topk_method, norm_topk_prob and routed_scaling_factor)
PRESET_ROUTERS: Dict[str, RouterSpec] = {
    "mixtral-8x7b": SOFTMAX_RENORM,
    "mixtral-8x22b": SOFTMAX_RENORM,
    "qwen3-30b-a3b": SOFTMAX_RENORM,
    "qwen3-235b-a22b": SOFTMAX_RENORM,
    "deepseek-v3": DEEPSEEK_V3_ROUTER,
    "deepseek-v3-tp8": DEEPSEEK_V3_ROUTER,
    "gpt-oss-120b": SOFTMAX_RENORM,
    "llama4-scout": LLAMA4_ROUTER,
}
#: model_type -> renormalize, for configs without norm_topk_prob (vLLM's model code)
_RENORMALIZE_BY_MODEL_TYPE = {"mixtral": True, "gpt_oss": True}
#: the offset added to --seed for the correction bias' generator
BIAS_SEED_OFFSET = 3_000_017
#: the correction bias the bench draws: randn(E_global) x this, float32
BIAS_SCALE = 0.1


def parse_router(text: str) -> RouterSpec:
    """``--router``: a preset's name (its model's router, see :data:`PRESET_ROUTERS`), or
    ``softmax`` / ``sigmoid`` followed by comma-separated options ``renorm``,
    ``groups=G/T`` (G groups, the best T kept), ``bias`` (a correction bias) and
    ``scale=F`` (routed scaling factor); e.g. ``sigmoid,renorm,groups=8/4,bias,scale=2.5``."""
    raw = str(text).strip()
    key = raw.lower()
    if key in PRESET_ROUTERS:
        return replace(PRESET_ROUTERS[key], origin=f"--router {key} (that preset's router)")
    parts = [p.strip() for p in key.split(",") if p.strip()]
    if not parts or parts[0] not in ("softmax", "sigmoid"):
        raise BenchError(f"--router: expected a preset ({', '.join(PRESET_ROUTERS)}) or softmax|sigmoid[,renorm]"
                         f"[,groups=G/T][,bias][,scale=F], got {text!r}")
    kw: Dict[str, Any] = {"scoring": parts[0]}
    for opt in parts[1:]:
        name, _, value = opt.partition("=")
        try:
            if opt in ("renorm", "renormalize"):
                kw["renormalize"] = True
            elif opt == "bias":
                kw["correction_bias"] = True
            elif name == "groups" and value:
                g, _, t = value.partition("/")
                kw["num_expert_group"], kw["topk_group"] = int(g), int(t)
            elif name == "scale" and value:
                kw["routed_scaling_factor"] = float(value)
            else:
                raise ValueError
        except ValueError:
            raise BenchError(f"--router: unknown option {opt!r} in {text!r} (renorm, groups=G/T, bias, "
                             f"scale=F)") from None
    spec = RouterSpec(origin=f"--router {raw}", **kw)
    if spec.num_expert_group is not None and (spec.num_expert_group < 1 or spec.topk_group < 1):
        raise BenchError(f"--router: expected positive groups=G/T, got {text!r}")
    if not (math.isfinite(spec.routed_scaling_factor) and spec.routed_scaling_factor > 0):
        raise BenchError(f"--router: expected a positive scale, got {text!r}")
    return spec


def hf_config_router(cfg: dict, scope: dict) -> Optional[RouterSpec]:
    """The router a Hugging Face config names (keys of ``scope`` first, then of ``cfg``):
    ``scoring_func``, ``n_group`` / ``topk_group`` (grouped where n_group > 1),
    ``topk_method: noaux_tc`` (a correction bias), ``norm_topk_prob`` and
    ``routed_scaling_factor``; Llama 4 routes by the sigmoid of the top-1 logit, Mixtral and
    gpt-oss renormalize. None where the config says nothing about its router."""

    def get(key: str) -> Any:
        return scope.get(key, cfg.get(key))

    model_type = str(get("model_type") or "").lower()
    if model_type.startswith("llama4"):
        return replace(LLAMA4_ROUTER, origin=f"hf-config (model_type {model_type})")
    keys = ("scoring_func", "n_group", "topk_group", "topk_method", "norm_topk_prob", "routed_scaling_factor")
    if all(get(k) is None for k in keys) and model_type not in _RENORMALIZE_BY_MODEL_TYPE:
        return None
    scoring = str(get("scoring_func") or "softmax").lower()
    n_group, topk_group = get("n_group"), get("topk_group")
    grouped = isinstance(n_group, int) and n_group > 1 and isinstance(topk_group, int)
    renorm = get("norm_topk_prob")
    if renorm is None:
        renorm = _RENORMALIZE_BY_MODEL_TYPE.get(model_type, False)
    scale = get("routed_scaling_factor")
    return RouterSpec(scoring=scoring, renormalize=bool(renorm),
                      num_expert_group=n_group if grouped else None, topk_group=topk_group if grouped else None,
                      correction_bias=str(get("topk_method") or "").lower() == "noaux_tc",
                      routed_scaling_factor=float(scale) if isinstance(scale, (int, float)) else 1.0,
                      origin="hf-config" + (f" (model_type {model_type})" if model_type else ""))


@dataclass(frozen=True)
class MoeShape:
    """One MoE layer as one GPU holds it. ``E`` is the local expert count (``E_global/ep``),
    ``N`` the local moe intermediate size (``N_full/tp``)."""

    name: str
    E: int
    topk: int
    K: int
    N: int
    tp: int = 1
    ep: int = 1
    source: str = "preset"
    #: the model's router (``--with-routing``); None: :data:`DEFAULT_ROUTER`
    router: Optional[RouterSpec] = None

    @property
    def E_global(self) -> int:
        return self.E * self.ep

    def weight_bytes(self, bytes_per_weight: int) -> int:
        """Bytes of one copy of w13 [E, 2N, K] plus w2 [E, K, N]."""
        return self.E * 3 * self.N * self.K * bytes_per_weight

    def key(self) -> Tuple[int, int, int, int]:
        return (self.E, self.topk, self.K, self.N)

    def describe(self) -> str:
        s = f"{self.name} (E={self.E}, topk={self.topk}, K={self.K}, N={self.N}"
        if self.tp > 1:
            s += f", tp={self.tp}"
        if self.ep > 1:
            s += f", ep={self.ep} of E_global={self.E_global}"
        return s + ")"

    def as_dict(self) -> dict:
        """The shape's fields (the router is in the record's ``routing``, see run_bench)."""
        d = asdict(self)
        del d["router"]
        d["E_global"] = self.E_global
        return d


def shard_shape(name: str, E: int, topk: int, K: int, N: int, tp: int = 1, ep: int = 1,
                source: str = "preset", router: Optional[RouterSpec] = None) -> MoeShape:
    """The shape one GPU holds: ``N/tp`` intermediate columns and ``E/ep`` experts."""
    for what, v in (("E", E), ("topk", topk), ("K", K), ("N", N), ("--tp", tp), ("--ep", ep)):
        if not isinstance(v, int) or v < 1:
            raise BenchError(f"{what}: expected a positive integer, got {v!r}")
    if topk > E:
        raise BenchError(f"topk: expected at most E={E}, got {topk}")
    if N % tp:
        raise BenchError(f"--tp: expected a divisor of N={N}, got {tp}")
    if E % ep:
        raise BenchError(f"--ep: expected a divisor of E={E}, got {ep}")
    suffix = "".join(f"-{k}{v}" for k, v in (("tp", tp), ("ep", ep)) if v > 1)
    return MoeShape(name + suffix, E // ep, topk, K, N // tp, tp, ep, source, router)


def preset_shape(name: str, tp: int = 1, ep: int = 1) -> MoeShape:
    """A named preset (see :data:`PRESETS`), sharded by ``tp`` (N) and ``ep`` (E)."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise BenchError(f"--model: expected one of {', '.join(PRESETS)}, got {name!r}")
    E, topk, K, N = PRESETS[key]
    router = replace(PRESET_ROUTERS[key], origin=f"{key} preset") if key in PRESET_ROUTERS else None
    return shard_shape(key, E, topk, K, N, tp, ep, "preset", router)


def parse_shape(text: str, tp: int = 1, ep: int = 1) -> MoeShape:
    """``"E,topk,K,N"`` -> shape."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        E, topk, K, N = (int(p) for p in parts)
    except ValueError:
        raise BenchError(f"--shape: expected four integers E,topk,K,N, got {text!r}") from None
    return shard_shape(f"shape-{E}x{topk}x{K}x{N}", E, topk, K, N, tp, ep, "shape")


_E_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
_TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")
_N_KEYS = ("moe_intermediate_size", "intermediate_size")
_NESTED = ("text_config", "language_config", "llm_config")


def _first(cfg: dict, keys: Sequence[str]) -> Tuple[Optional[str], Any]:
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return k, v
    return None, None


def read_json_file(path: str, what: str) -> Any:
    """The JSON document in the file at ``path``; :class:`BenchError` starting with ``what``
    when it cannot be read or is not JSON in UTF-8."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise BenchError(f"{what}: cannot read it: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BenchError(f"{what}: expected JSON in UTF-8, got a file that does not parse ({e})") from None


def hf_config_shape(path: str, tp: int = 1, ep: int = 1) -> MoeShape:
    """Shape from a Hugging Face ``config.json``: experts from num_experts /
    num_local_experts / n_routed_experts, topk from num_experts_per_tok, K from
    hidden_size, N from moe_intermediate_size (else intermediate_size). Keys nested under
    text_config (Llama 4, multimodal configs) are found too."""
    cfg = read_json_file(path, f"--hf-config {path}")
    if not isinstance(cfg, dict):
        raise BenchError(f"--hf-config: expected a JSON object in {path}")
    scopes = [cfg] + [cfg[k] for k in _NESTED if isinstance(cfg.get(k), dict)]
    for scope in scopes:
        _, E = _first(scope, _E_KEYS)
        if E is not None:
            break
    else:
        raise BenchError(f"--hf-config: {path} names no expert count ({', '.join(_E_KEYS)}): not a MoE model?")
    found = {}
    for what, keys in (("topk", _TOPK_KEYS), ("K", ("hidden_size",)), ("N", _N_KEYS)):
        _, v = _first(scope, keys)
        if v is None:
            _, v = _first(cfg, keys)
        if v is None:
            raise BenchError(f"--hf-config: {path} has no {' / '.join(keys)}")
        found[what] = v
    sizes = dict(experts=E, **found)
    for what, v in sizes.items():
        # JSON integers only: 8.7 is not 8 experts, true is not topk 1, 1e400 is no size at all
        if type(v) is not int:
            raise BenchError(f"--hf-config: expected an integer {what} in {path}, got {v!r}")
    name = cfg.get("_name_or_path") or scope.get("model_type") or cfg.get("model_type") or "hf-config"
    name = str(name).rstrip("/").split("/")[-1] or "hf-config"
    return shard_shape(name, E, found["topk"], found["K"], found["N"], tp, ep, f"hf-config:{path}",
                       hf_config_router(cfg, scope))


#: the largest token count the command line takes (the op's slot indices are 32-bit)
MAX_M = 2**31 - 1


def parse_m_list(text: str) -> List[int]:
    """``"1,2,4"`` -> [1, 2, 4] (sorted, unique, positive)."""
    try:
        ms = sorted({int(p) for p in str(text).replace(" ", "").split(",") if p})
    except ValueError:
        raise BenchError(f"--m: expected comma-separated token counts like 1,8,64, got {text!r}") from None
    if not ms or ms[0] < 1 or ms[-1] > MAX_M:
        raise BenchError(f"--m: expected token counts in [1, 2^31 - 1], got {text!r}")
    return ms


# --------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------


def check_quant(quant: str) -> str:
    """``quant`` if it names a variant (see :data:`QUANTS`), else :class:`BenchError`."""
    if quant not in QUANTS:
        raise BenchError(f"--quant: expected one of {', '.join(QUANTS)}, got {quant!r}")
    return quant


def weight_bytes_per_element(quant: str, dtype: str) -> int:
    """Bytes per stored weight element: 1 for the FP8 variants, the dtype's size otherwise."""
    nbytes = QUANTS[check_quant(quant)][0]
    return DTYPES[dtype][1] if nbytes is None else nbytes


def anchor_variant(quant: str, dtype: str) -> Optional[str]:
    """The anchor's variant name for this run: the dtype unquantized, ``fp8-tensor`` /
    ``fp8-block128`` quantized, None where the anchor has no such variant (fp8_channel)."""
    check_quant(quant)
    return dtype if quant == "none" else QUANTS[quant][1]


def hbm_floor_us(experts_touched: int, N: int, K: int, M: int, bytes_per_weight: float = 2,
                 bytes_per_act: float = 2, read_bw: float = 4.42e12, quant: Optional[str] = None) -> float:
    """Time (µs) to read each touched expert's w13 and w2 once plus the activations in and
    out, at ``read_bw`` bytes/s (PERFORMANCE.md). ``bytes_per_weight`` is the dtype's size;
    a ``quant`` other than None/"none" (see :data:`QUANTS`) replaces it with the quantized
    size (1 byte for FP8)."""
    if quant is not None:
        q = QUANTS[check_quant(quant)][0]
        if q is not None:
            bytes_per_weight = q
    nbytes = experts_touched * 3 * N * K * bytes_per_weight + 2 * M * K * bytes_per_act
    return nbytes / read_bw * 1e6


def moe_tflops(slots: int, N: int, K: int, time_us: float) -> float:
    """TF/s of ``slots`` (token, expert) pairs: 2 * slots * 3*N*K / time. ``slots`` is
    M*topk without expert parallelism."""
    return 2.0 * slots * 3 * N * K / (time_us * 1e-6) / 1e12


# --------------------------------------------------------------------------------------
# The anchor
# --------------------------------------------------------------------------------------


def find_anchor(path: Optional[str] = None) -> Optional[str]:
    """``path``, else ``$SWAPMOE_ANCHORS`` (a file or folder), else shared/anchors next to
    the working directory or the checkout, else the copy shipped in the package. A path
    given either way must exist (:class:`BenchError` naming it otherwise)."""
    for given, what in ((path, "--anchors"), (os.environ.get("SWAPMOE_ANCHORS"), "$SWAPMOE_ANCHORS")):
        if given:
            found = os.path.join(given, ANCHOR_FILE) if os.path.isdir(given) else given
            if not os.path.isfile(found):
                raise BenchError(f"{what}: expected an anchor JSON file or a folder holding {ANCHOR_FILE}, "
                                 f"got {given!r} (no such file {found})")
            return found
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = []
    for base in (os.getcwd(), os.path.join(here, "..", "..")):
        candidates.append(os.path.join(base, "shared", "anchors", ANCHOR_FILE))
        candidates.append(os.path.join(base, "..", "shared", "anchors", ANCHOR_FILE))
    candidates.append(os.path.join(here, "data", ANCHOR_FILE))
    for c in candidates:
        if os.path.isfile(c):
            return os.path.normpath(c)
    return None


def load_anchor(path: Optional[str]) -> Optional[dict]:
    """The anchor JSON at ``path`` (None: no anchor): an object whose ``rows`` is a list of
    objects; anything else stops the bench with :class:`BenchError` naming the file."""
    if not path:
        return None
    anchor = read_json_file(path, f"anchor {path}")
    rows = anchor.get("rows") if isinstance(anchor, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise BenchError(f"anchor {path}: expected a JSON object whose \"rows\" is a list of objects, "
                         f"got {type(anchor).__name__}" + (f" with rows of type {type(rows).__name__}"
                                                             if isinstance(anchor, dict) else ""))
    return anchor


def anchor_row(anchor: Optional[dict], shape: MoeShape, variant: str, M: int) -> Optional[dict]:
    """The anchor row of this (E, topk, K, N), variant and M, or None. Sharded by expert
    parallelism, a shape is never the anchor's."""
    if not anchor or shape.ep != 1:
        return None
    for r in anchor.get("rows", ()):
        if (r.get("E"), r.get("topk"), r.get("K"), r.get("N")) == shape.key() and \
                r.get("variant") == variant and r.get("M") == M:
            return r
    return None


# --------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------


def _version(mod: str) -> Optional[str]:
    try:
        from importlib import metadata

        return metadata.version(mod)
    except Exception:
        return None


def driver_version() -> Optional[int]:
    from . import _core
    from .errors import Error

    try:
        return int(_core.driver_version())
    except Error:
        return None


def format_driver(v: Optional[int]) -> str:
    return "none" if v is None else f"{v // 1000}.{(v % 1000) // 10}"


def environment() -> dict:
    """Versions and build of everything the numbers depend on (no GPU needed)."""
    from . import __version__, build_info

    env: Dict[str, Any] = {
        "swapmoe": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": _version("numpy"),
        "torch": None,
        "torch_cuda": None,
        "triton": None,
        "driver_version": driver_version(),
        "build_info": build_info(),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
    except ImportError:
        pass
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        pass
    return env


# --------------------------------------------------------------------------------------
# Problem tensors
# --------------------------------------------------------------------------------------


def make_routing(torch: Any, M: int, E_global: int, topk: int, kind: str, gen: Any, device: Any,
                 zipf_s: float = 1.0, logits_out: Optional[list] = None) -> Tuple[Any, Any]:
    """(topk_weights fp32 [M, topk], topk_ids int32 [M, topk]).
    uniform: topk of softmax(randn(M, E)), as the anchor. skewed: topk distinct experts per
    token drawn with probability ~ 1/rank^zipf_s (ranks randomly assigned to experts).
    With ``logits_out`` (uniform only), the router logits are appended to it."""
    if kind == "uniform":
        logits = torch.randn(M, E_global, generator=gen, device=device, dtype=torch.float32)
        if logits_out is not None:
            logits_out.append(logits)
        tw, ids = torch.topk(torch.softmax(logits, dim=-1), topk, dim=-1)
    elif kind == "skewed":
        rank = torch.randperm(E_global, generator=gen, device=device).to(torch.float32) + 1.0
        p = rank.pow(-float(zipf_s))
        ids = torch.multinomial(p.expand(M, E_global).contiguous(), topk, replacement=False, generator=gen)
        tw = torch.softmax(torch.randn(M, topk, generator=gen, device=device, dtype=torch.float32), dim=-1)
    else:
        raise BenchError(f"--routing: expected uniform or skewed, got {kind!r}")
    return tw.float().contiguous(), ids.to(torch.int32).contiguous()


def make_correction_bias(torch: Any, router: RouterSpec, E_global: int, seed: int, device: Any) -> Optional[Any]:
    """The router's ``e_score_correction_bias``, float32 [E_global] on ``device``:
    randn x :data:`BIAS_SCALE` from its own generator (``seed`` + :data:`BIAS_SEED_OFFSET`),
    made once per shape; None for a router without one."""
    if not router.correction_bias:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + BIAS_SEED_OFFSET)
    return torch.randn(E_global, generator=gen, device=device, dtype=torch.float32).mul_(BIAS_SCALE)


def router_ids(torch: Any, logits: Any, topk: int, router: RouterSpec, bias: Any = None) -> Tuple[Any, Any]:
    """(topk_weights fp32, topk_ids int32) on the logits' device that ``router`` picks from
    ``logits`` [M, E_global], by the float64 reference router
    (``swapmoe.reference.select_experts_ref``, independent of the op's router kernels). With
    ``--with-routing`` every column runs on these ids and the check's reference uses them, so
    fused_moe (which routes the logits itself) passes only where its router agrees."""
    from .reference import select_experts_ref

    np_bias = None if bias is None else bias.detach().float().cpu().numpy()
    w, ids = select_experts_ref(logits.detach().float().cpu().numpy(), topk, **router.kwargs(np_bias))
    dev = logits.device
    return (torch.from_numpy(w).to(device=dev, dtype=torch.float32).contiguous(),
            torch.from_numpy(ids).to(device=dev, dtype=torch.int32).contiguous())


def router_agrees(torch: Any, logits: Any, topk: int, router: RouterSpec, bias: Any, ids: Any) -> bool:
    """Whether ``swapmoe.select_experts`` (the op's router, on the logits' device) picks the
    same experts per token as ``ids`` (the reference router's): the point's experts touched
    are then those fused_moe touches too."""
    import swapmoe

    _, got = swapmoe.select_experts(logits, topk, **router.kwargs(bias))
    return bool(torch.equal(got.long().sort(dim=1)[0], ids.long().sort(dim=1)[0]))


def make_expert_map(torch: Any, shape: MoeShape, device: Any) -> Optional[Any]:
    """expert parallelism: this GPU (rank 0) holds global experts [0, E) of E_global."""
    if shape.ep == 1:
        return None
    emap = torch.full((shape.E_global,), -1, dtype=torch.int32, device=device)
    emap[: shape.E] = torch.arange(shape.E, dtype=torch.int32, device=device)
    return emap


def local_ids(torch: Any, ids: Any, emap: Optional[Any], E: int) -> Any:
    """int64 [M*topk] local expert of each slot, E where the slot does no work here."""
    flat = ids.reshape(-1).long()
    if emap is not None:
        G = emap.numel()
        ok = (flat >= 0) & (flat < G)
        loc = torch.where(ok, emap.long()[flat.clamp(0, G - 1)], torch.full_like(flat, -1))
    else:
        loc = flat
    return torch.where((loc >= 0) & (loc < E), loc, torch.full_like(loc, E))


def make_weights(torch: Any, shape: MoeShape, dtype: Any, gen: Any, device: Any) -> Tuple[Any, Any]:
    """One copy: w13 [E, 2N, K] (gate rows then up) and w2 [E, K, N], scaled so that the
    activations stay O(1)."""
    E, K, N = shape.E, shape.K, shape.N
    w1 = torch.randn(E, 2 * N, K, generator=gen, device=device, dtype=dtype).mul_(K ** -0.5)
    w2 = torch.randn(E, K, N, generator=gen, device=device, dtype=dtype).mul_(N ** -0.5)
    return w1, w2


def _fp8_dtype(torch: Any) -> Any:
    dt = getattr(torch, "float8_e4m3fn", None)
    if dt is None:
        raise BenchError(f"--quant fp8_*: torch {torch.__version__} has no float8_e4m3fn")
    return dt


def fp8_scale_shapes(quant: str, shape: MoeShape) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(w1_scale shape, w2_scale shape) of an FP8 ``quant``, as ``fused_experts`` validates
    them: per tensor [E] and [E]; per channel [E, 2N] and [E, K]; block128
    [E, ceil(2N/128), ceil(K/128)] and [E, ceil(K/128), ceil(N/128)]."""
    E, K, N = shape.E, shape.K, shape.N
    scheme = FP8_SCHEMES[quant]
    if scheme == "tensor":
        return (E,), (E,)
    if scheme == "channel":
        return (E, 2 * N), (E, K)
    b = FP8_BLOCK
    return (E, -(-2 * N // b), -(-K // b)), (E, -(-K // b), -(-N // b))


def _expand_weight_scale(torch: Any, s: Any, scheme: str, R: int, C: int) -> Any:
    """Scales of ``e`` experts ([e], [e, R] or [e, R/128, C/128]) broadcastable to [e, R, C]."""
    e = s.shape[0]
    if scheme == "tensor":
        return s.reshape(e, 1, 1)
    if scheme == "channel":
        return s.reshape(e, R, 1)
    s = s.reshape(e, -(-R // FP8_BLOCK), -(-C // FP8_BLOCK))
    return s.repeat_interleave(FP8_BLOCK, dim=1)[:, :R].repeat_interleave(FP8_BLOCK, dim=2)[:, :, :C]


def fp8_weight_scale(torch: Any, w32: Any, scheme: str) -> Any:
    """float32 scales of float32 weights [e, R, C], absmax / 448 (at least 1e-12) per
    expert (tensor), per row (channel) or per 128x128 block (block, partial blocks padded)."""
    a = w32.abs()
    e, R, C = w32.shape
    if scheme == "tensor":
        s = a.amax(dim=(1, 2))
    elif scheme == "channel":
        s = a.amax(dim=2)
    else:
        gr, gc = -(-R // FP8_BLOCK), -(-C // FP8_BLOCK)
        pad = torch.zeros(e, gr * FP8_BLOCK, gc * FP8_BLOCK, dtype=torch.float32, device=w32.device)
        pad[:, :R, :C] = a
        s = pad.view(e, gr, FP8_BLOCK, gc, FP8_BLOCK).amax(dim=(2, 4))
    return _div(torch, s, FP8_MAX).clamp_min_(1e-12).to(torch.float32)


def quantize_fp8_weight(torch: Any, w: Any, scheme: str) -> Tuple[Any, Any]:
    """(float8_e4m3fn [e, R, C], float32 scale) of weights ``w`` [e, R, C]:
    e4m3(clamp(w / scale, +-448)), as an FP8 checkpoint stores them."""
    w32 = w.float()
    s = fp8_weight_scale(torch, w32, scheme)
    full = _expand_weight_scale(torch, s, scheme, w32.shape[1], w32.shape[2])
    q = w32.div_(full).clamp_(-FP8_MAX, FP8_MAX).to(_fp8_dtype(torch))
    return q, s


#: bytes of float32 master weights quantized at a time (bounds the transient memory)
FP8_CHUNK_BYTES = 256 << 20


def make_fp8_weights(torch: Any, shape: MoeShape, dtype: Any, gen: Any, device: Any,
                     quant: str) -> Tuple[Any, Any, Any, Any]:
    """One FP8 copy: (w13 e4m3 [E, 2N, K], w2 e4m3 [E, K, N], w1_scale, w2_scale float32 in
    the layouts of :func:`fp8_scale_shapes`). The master weights are drawn as
    :func:`make_weights` draws them (randn in ``dtype``, times K^-1/2 and N^-1/2), a chunk of
    experts at a time, then quantized (:func:`quantize_fp8_weight`): only the e4m3 bytes and
    the scales stay, 1 byte per weight."""
    E, K, N = shape.E, shape.K, shape.N
    scheme = FP8_SCHEMES[quant]
    f8 = _fp8_dtype(torch)
    w1q = torch.empty(E, 2 * N, K, dtype=f8, device=device)
    w2q = torch.empty(E, K, N, dtype=f8, device=device)
    sh1, sh2 = fp8_scale_shapes(quant, shape)
    s1 = torch.empty(sh1, dtype=torch.float32, device=device)
    s2 = torch.empty(sh2, dtype=torch.float32, device=device)
    chunk = max(1, FP8_CHUNK_BYTES // max(1, 2 * N * K * 4))
    for e0 in range(0, E, chunk):
        e1 = min(E, e0 + chunk)
        w1 = torch.randn(e1 - e0, 2 * N, K, generator=gen, device=device, dtype=dtype).mul_(K ** -0.5)
        w2 = torch.randn(e1 - e0, K, N, generator=gen, device=device, dtype=dtype).mul_(N ** -0.5)
        for w, q, s in ((w1, w1q, s1), (w2, w2q, s2)):
            qc, sc = quantize_fp8_weight(torch, w, scheme)
            q[e0:e1] = qc
            s[e0:e1] = sc
            del qc, sc
        del w1, w2
    return w1q, w2q, s1, s2


def fp8_kwargs(quant: str, w1_scale: Any, w2_scale: Any, a1_scale: Any = None, a2_scale: Any = None) -> dict:
    """The FP8 keyword arguments of ``swapmoe.fused_experts`` / ``fused_moe`` for ``quant``."""
    scheme = FP8_SCHEMES[check_quant(quant)]
    return {
        "use_fp8_w8a8": True,
        "w1_scale": w1_scale,
        "w2_scale": w2_scale,
        "a1_scale": a1_scale,
        "a2_scale": a2_scale,
        "per_channel_quant": scheme == "channel",
        "block_shape": [FP8_BLOCK, FP8_BLOCK] if scheme == "block" else None,
    }


def _fp8_scheme_of(fp8: dict) -> str:
    if fp8.get("block_shape") is not None:
        return "block"
    return "channel" if fp8.get("per_channel_quant") else "tensor"


def _div(torch: Any, v: Any, c: float) -> Any:
    """``v / c`` correctly rounded on every device, as the op divides. Never write
    ``tensor / 448.0`` here: ATen's CUDA division by a Python number (a CPU scalar)
    multiplies by the float32 reciprocal instead (BinaryDivTrueKernel.cu, "may lose one
    bit of precision"), one ulp off ``absmax / 448`` on CUDA tensors only. That ulp moves
    bf16 activations that sit exactly on an e4m3 rounding midpoint (frequent: 448 v / absmax
    of 8-bit mantissas) to the other neighbour, which then changes the intermediate's group
    absmax and re-rounds whole groups: the rel err 1.7-2.1e-2 of the GPU fp8_block128 check
    (NOTES FP8 v1). A 0-d divisor on v's device is divided element-wise on both devices."""
    return v / torch.full((), c, dtype=v.dtype, device=v.device)


def _fp8_min_scale(torch: Any, device: Any) -> Any:
    """1 / (448 * 512) in float32 (vLLM's min_scaling_factor, swapmoe.reference.FP8_MIN_SCALE)."""
    return _div(torch, torch.ones((), dtype=torch.float32, device=device), 448.0 * 512.0)


def _finite_abs(torch: Any, v: Any) -> Any:
    return torch.where(torch.isfinite(v), v.abs(), torch.zeros_like(v))


def fp8_act_quant_torch(torch: Any, v32: Any, scheme: str, static_scale: Any = None,
                        rows: Any = None) -> Tuple[Any, Any]:
    """Activations [R, C] (float32) quantized as the op does (the torch twin of
    ``swapmoe.reference.fp8_act_quant``): returns (e4m3 values float64 [R, C], float32 scales
    broadcastable to [R, C]). tensor: the static scale, else max(absmax over ``rows`` / 448,
    1/(448*512)), values times 1/scale; channel: per row, values / scale; block: per row and
    128 columns, max(absmax, 1e-10) / 448. Non-finite values give NaN."""
    R, C = v32.shape
    f32 = torch.float32
    if scheme == "tensor":
        if static_scale is not None:
            s = static_scale.to(device=v32.device, dtype=f32).reshape(())
        else:
            a = _finite_abs(torch, v32 if rows is None else v32[rows])
            amax = a.amax() if a.numel() else torch.zeros((), dtype=f32, device=v32.device)
            s = torch.maximum(_div(torch, amax, FP8_MAX), _fp8_min_scale(torch, v32.device))
        t = v32 * (torch.ones_like(s) / s)
    elif scheme == "channel":
        amax = _finite_abs(torch, v32).amax(dim=1, keepdim=True)
        s = torch.maximum(_div(torch, amax, FP8_MAX), _fp8_min_scale(torch, v32.device))
        t = v32 / s
    else:
        G = -(-C // FP8_BLOCK)
        pad = torch.zeros(R, G * FP8_BLOCK, dtype=f32, device=v32.device)
        pad[:, :C] = _finite_abs(torch, v32)
        gmax = pad.view(R, G, FP8_BLOCK).amax(dim=2)
        s = _div(torch, gmax.clamp_min(1e-10), FP8_MAX).repeat_interleave(FP8_BLOCK, dim=1)[:, :C]
        t = v32 / s
    q = t.clamp(-FP8_MAX, FP8_MAX).to(_fp8_dtype(torch)).to(torch.float64)
    q = torch.where(torch.isfinite(v32), q, torch.full_like(q, math.nan))
    return q, s


def _dequant_expert(torch: Any, w: Any, scale: Any, scheme: str, e: int) -> Any:
    """float64 [R, C] of expert ``e``'s e4m3 weights times their scales."""
    R, C = w.shape[1], w.shape[2]
    s = _expand_weight_scale(torch, scale[e:e + 1], scheme, R, C)[0]
    return w[e].to(torch.float64) * s.to(torch.float64)


def _fp8_intermediate(torch: Any, x, w1, tw, loc, fp8: dict, topk: int) -> Tuple[Any, list]:
    """float64 act(gate) * up [M*topk, N] of every valid slot (0 elsewhere), from the
    quantized-dequantized input; also the touched local experts."""
    scheme = _fp8_scheme_of(fp8)
    E, N = w1.shape[0], w1.shape[1] // 2
    xq, xs = fp8_act_quant_torch(torch, x.float(), scheme, fp8.get("a1_scale"))
    xd = xq * xs.to(torch.float64)
    inter = torch.zeros(loc.numel(), N, dtype=torch.float64, device=x.device)
    experts = [e for e in torch.unique(loc).tolist() if e < E]
    for e in experts:
        slots = torch.nonzero(loc == e).flatten()
        h = xd[slots // topk] @ _dequant_expert(torch, w1, fp8["w1_scale"], scheme, e).t()
        g = h[:, :N]
        inter[slots] = g / (1.0 + torch.exp(-g)) * h[:, N:]
    return inter, experts


def _e4m3_step(torch: Any, a: Any) -> Any:
    """Spacing of e4m3 values around a >= 0 (float64): 2^-9 below 2^-6, else 2^(e-3) for
    a in [2^(e-1), 2^e). 2^e is a / mantissa (an exact division), so no pow is involved."""
    aa = torch.where(a > 0, a, torch.ones_like(a))
    mant, _ = torch.frexp(aa)  # aa = mant * 2^e, mant in [0.5, 1)
    step = (aa / mant) * 0.0625
    return torch.where(a < 2.0 ** -6, torch.full_like(a, 2.0 ** -9), step)


def reference64_fp8(torch: Any, x, w1, w2, tw, ids, emap, fp8: dict,
                    flip_margin: float = FP8_FLIP_MARGIN) -> Tuple[Any, dict]:
    """float64 FP8 W8A8 result [M, K] on x's device, the torch twin of
    ``swapmoe.reference.fused_experts_fp8_ref`` (same quantization rules; one touched expert
    dequantized at a time, so it fits model-sized shapes). ``fp8``: the op's FP8 keyword
    arguments (:func:`fp8_kwargs`). Returns (out, flips): each element of the intermediate
    within ``flip_margin`` (relative) of an e4m3 rounding midpoint, which the op's float32
    intermediate may round the other way, as tensors ``m`` (token), ``e`` (local expert),
    ``j`` (column of w2) and ``coef`` (router weight x the dequantized change); its output
    change is ``coef * w2[e][:, j]`` dequantized (see :func:`rel_error_fp8`)."""
    scheme = _fp8_scheme_of(fp8)
    M, topk = ids.shape
    E, N = w1.shape[0], w1.shape[1] // 2
    loc = local_ids(torch, ids, emap, E)
    valid = loc < E
    weights = tw.reshape(-1).double()
    inter, experts = _fp8_intermediate(torch, x, w1, tw, loc, fp8, topk)
    aq, as_ = fp8_act_quant_torch(torch, inter.float(), scheme, fp8.get("a2_scale"), rows=valid)
    as64 = as_.to(torch.float64).expand(inter.shape)
    ad = aq * as64
    out = torch.zeros(M, x.shape[1], dtype=torch.float64, device=x.device)
    for e in experts:
        slots = torch.nonzero(loc == e).flatten()
        y = ad[slots] @ _dequant_expert(torch, w2, fp8["w2_scale"], scheme, e).t()
        out.index_add_(0, slots // topk, y * weights[slots].unsqueeze(1))
    del ad
    # elements near a rounding midpoint, and the value the other e4m3 neighbour gives
    t = inter / as64
    a = t.abs().clamp(max=FP8_MAX)
    step = _e4m3_step(torch, a)
    frac = a / step - torch.floor(a / step)
    near = (frac - 0.5).abs() * step <= flip_margin * a.clamp_min(2.0 ** -9)
    near &= valid.unsqueeze(1) & torch.isfinite(t) & (t.abs() < FP8_MAX)
    slot, j = torch.nonzero(near, as_tuple=True)
    av, sv, aqv = a[slot, j], step[slot, j], aq[slot, j]
    alt = torch.where(aqv.abs() > av, torch.floor(av / sv) * sv, torch.ceil(av / sv) * sv)
    alt = torch.copysign(alt, t[slot, j])
    flips = {"m": slot // topk, "e": loc[slot], "j": j, "coef": weights[slot] * (alt - aqv) * as64[slot, j]}
    return out, flips


def _w2_columns(torch: Any, w2, w2_scale, scheme: str, e, j) -> Any:
    """float64 [F, K]: dequantized column ``j[f]`` of expert ``e[f]``'s w2 [E, K, N]."""
    E, K, N = w2.shape
    cols = w2.view(torch.uint8)[e, :, j].view(w2.dtype).to(torch.float64)
    if scheme == "tensor":
        s = w2_scale.reshape(E)[e].unsqueeze(1)
    elif scheme == "channel":
        s = w2_scale.reshape(E, K)[e]
    else:
        s = w2_scale.reshape(E, -(-K // FP8_BLOCK), -(-N // FP8_BLOCK))[e, :, j // FP8_BLOCK]
        s = s.repeat_interleave(FP8_BLOCK, dim=1)[:, :K]
    return cols * s.to(torch.float64)


def rel_error_fp8(torch: Any, out: Any, ref: Any, flips: dict, w2: Any, fp8: dict) -> Tuple[float, int]:
    """(||out - ref'|| / ||ref'||, flips applied): ``ref'`` is ``ref`` plus the flips of
    :func:`reference64_fp8` that bring it closer to ``out``, chosen greedily per token row in
    order (as ``swapmoe.reference.rel_error_with_flips``, row by row). NaN or inf in ``out``
    gives inf."""
    o = out.double()
    if not bool(torch.isfinite(o).all()):
        return math.inf, 0
    ref = ref.clone()
    res = o - ref
    m = flips["m"]
    used = 0
    if m.numel():
        scheme = _fp8_scheme_of(fp8)
        order = torch.argsort(m, stable=True)
        ms = m[order]
        counts = torch.bincount(ms)
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(ms.numel(), device=ms.device) - starts[ms]
        for k in range(int(rank.max()) + 1):
            sel = order[rank == k]  # at most one flip per row
            rows = m[sel]
            delta = flips["coef"][sel].unsqueeze(1) * _w2_columns(torch, w2, fp8["w2_scale"], scheme,
                                                                  flips["e"][sel], flips["j"][sel])
            cur = res[rows]
            new = cur - delta
            better = (new * new).sum(dim=1) < (cur * cur).sum(dim=1)
            if bool(better.any()):
                rb = rows[better]
                res[rb] = new[better]
                ref[rb] += delta[better]
                used += int(better.sum())
    den = float(torch.linalg.vector_norm(ref))
    num = float(torch.linalg.vector_norm(res))
    return (num / den if den else num), used


def calibrate_static_scales(torch: Any, shape: MoeShape, w1, w2, fp8: dict, dtype: Any, seed: int,
                            device: Any, emap: Any = None) -> Tuple[Any, Any, str]:
    """fp8_tensor's static activation scales (float32 0-d tensors on ``device``), computed
    once as a calibration pass would: a sample of :data:`FP8_CALIBRATION_TOKENS` tokens
    (randn in ``dtype``, uniform routing, its own seed), a1_scale = absmax(x) / 448,
    a2_scale = absmax of the float64 intermediate act(gate)*up of its routed slots (x
    quantized with a1_scale, the dequantized weights ``w1``) / 448. Returns (a1, a2, how)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 2_000_003)
    Mc = FP8_CALIBRATION_TOKENS
    tw, ids = make_routing(torch, Mc, shape.E_global, shape.topk, "uniform", gen, device)
    x = torch.randn(Mc, shape.K, generator=gen, device=device, dtype=dtype)
    lo = _fp8_min_scale(torch, device)
    a1 = torch.maximum(_div(torch, _finite_abs(torch, x.float()).amax(), FP8_MAX), lo)
    loc = local_ids(torch, ids, emap, shape.E)
    inter, _ = _fp8_intermediate(torch, x, w1, tw, loc, dict(fp8, a1_scale=a1, a2_scale=None), shape.topk)
    valid = loc < shape.E
    amax = _finite_abs(torch, inter[valid].float()).amax() if bool(valid.any()) else torch.zeros((), device=device)
    a2 = torch.maximum(_div(torch, amax.to(torch.float32), FP8_MAX), lo)
    how = (f"static: a1_scale = absmax of a calibration sample ({Mc} tokens of randn, uniform routing, seed "
           f"{seed}+2000003) / 448; a2_scale = absmax of that sample's float64 act(gate)*up over its routed slots "
           f"(x quantized with a1_scale, dequantized weights of copy 0) / 448; shared by every copy")
    return a1.reshape(()).contiguous(), a2.reshape(()).contiguous(), how


# --------------------------------------------------------------------------------------
# Implementations: each writes out [M, K] from (x, w1, w2, tw, ids, expert_map)
# --------------------------------------------------------------------------------------


def impl_swapmoe(x, w1, w2, tw, ids, emap, out, fp8=None):
    """``fp8``: the FP8 keyword arguments (:func:`fp8_kwargs`) for e4m3 weights."""
    import swapmoe

    kw = {} if emap is None else {"expert_map": emap, "global_num_experts": emap.numel()}
    if fp8:
        kw.update(fp8)
    return swapmoe.fused_experts(x, w1, w2, tw, ids, out=out, **kw)


def make_routed_impl(logits: Any, topk: int, router_kw: Optional[dict] = None) -> Callable:
    """swapmoe.fused_moe from the router logits with ``router_kw`` (:meth:`RouterSpec.kwargs`;
    default: softmax top-k without renormalize). It ignores the ``tw`` and ``ids`` it is given:
    run_bench passes the ids this router picks (:func:`router_ids`), so the check and the
    experts touched are those of the router that is timed."""
    rkw = dict(renormalize=False, scoring="softmax") if router_kw is None else dict(router_kw)

    def impl_fused_moe(x, w1, w2, tw, ids, emap, out, fp8=None):
        import swapmoe

        kw = {} if emap is None else {"expert_map": emap, "global_num_experts": emap.numel()}
        if fp8:
            kw.update(fp8)
        return swapmoe.fused_moe(x, w1, w2, logits, topk, out=out, **rkw, **kw)

    return impl_fused_moe


def impl_torch_eager(x, w1, w2, tw, ids, emap, out):
    """The plain torch pipeline: sort slots by expert, one host sync for the counts, then
    a GEMM / SiLU-and-mul / GEMM per touched expert and an fp32 index_add."""
    import torch
    import torch.nn.functional as F

    M, topk = ids.shape
    E, N = w1.shape[0], w1.shape[1] // 2
    loc = local_ids(torch, ids, emap, E)
    order = torch.argsort(loc, stable=True)
    counts = torch.bincount(loc, minlength=E + 1).tolist()
    weights = tw.reshape(-1).float()
    acc = torch.zeros(M, x.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for e in range(E):
        c = counts[e]
        if c:
            slots = order[start:start + c]
            tok = slots // topk
            h = x.index_select(0, tok) @ w1[e].t()
            a = F.silu(h[:, :N]) * h[:, N:]
            y = a @ w2[e].t()
            acc.index_add_(0, tok, y.float() * weights[slots].unsqueeze(1))
        start += c
    return out.copy_(acc)


def impl_torch_grouped_mm(x, w1, w2, tw, ids, emap, out):
    """torch._grouped_mm (CUTLASS grouped GEMM) pipeline with no host sync, so it can be
    captured: sort slots by expert, gather, grouped GEMM, SiLU-and-mul, grouped GEMM,
    weight, unsort and sum over topk."""
    import torch
    import torch.nn.functional as F

    M, topk = ids.shape
    E, N = w1.shape[0], w1.shape[1] // 2
    loc = local_ids(torch, ids, emap, E)
    order = torch.argsort(loc, stable=True)
    counts = torch.zeros(E + 1, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, loc, torch.ones_like(loc, dtype=torch.int32))
    offs = torch.cumsum(counts[:E], 0, dtype=torch.int32)
    xs = x.index_select(0, order // topk)
    h = torch._grouped_mm(xs, w1.transpose(1, 2), offs=offs)
    a = F.silu(h[:, :N]) * h[:, N:]
    y = torch._grouped_mm(a, w2.transpose(1, 2), offs=offs)
    valid = (loc[order] < E).unsqueeze(1)  # rows past offs[-1] are not written by the GEMMs
    y = torch.where(valid, y.float() * tw.reshape(-1).float()[order].unsqueeze(1), 0.0)
    ys = torch.empty_like(y).index_copy_(0, order, y)
    return out.copy_(ys.view(M, topk, -1).sum(dim=1))


IMPLS: Dict[str, Tuple[Callable, bool]] = {
    # name -> (function, can be captured in a CUDA graph). vLLM's is added per run by
    # run_bench when vllm imports (see load_vllm_fused_experts).
    IMPL_SWAPMOE: (impl_swapmoe, True),
    IMPL_EAGER: (impl_torch_eager, False),
    IMPL_GROUPED: (impl_torch_grouped_mm, True),
}


def import_quietly(path: str) -> Tuple[Any, Any]:
    """(the top-level package of ``path``, the attribute ``path`` names in its module, or None
    where the module lacks it), imported with stdout sent to stderr, so that the loggers a
    package such as vLLM or FlashInfer sets up do not mix into a CSV on stdout. Raises what
    the imports raise."""
    import contextlib
    import importlib

    mod_name, _, attr = path.rpartition(".")
    with contextlib.redirect_stdout(sys.stderr):
        top = importlib.import_module(path.split(".", 1)[0])
        mod = importlib.import_module(mod_name)
    return top, getattr(mod, attr, None)


def load_vllm_fused_experts() -> Tuple[Optional[Callable], str]:
    """(vLLM's ``fused_experts``, vLLM's version) when ``import vllm`` and the import of
    :data:`VLLM_FUSED_EXPERTS` work, else (None, the reason); see :func:`import_quietly`."""
    try:
        vllm, fn = import_quietly(VLLM_FUSED_EXPERTS)
    except Exception as e:  # not installed, or installed and broken
        return None, f"vllm not importable ({_err(e)})"
    if not callable(fn):
        return None, f"vllm {getattr(vllm, '__version__', '?')}: {VLLM_FUSED_EXPERTS} not found"
    return fn, str(getattr(vllm, "__version__", None) or _version("vllm") or "unknown")


def make_vllm_impl(fused_experts: Callable) -> Callable:
    """An implementation (same arguments as the others) that calls vLLM's
    ``fused_experts(hidden_states, w1, w2, topk_weights, topk_ids)`` with ``expert_map`` and
    ``global_num_experts`` under expert parallelism. vLLM allocates its output; with
    ``out=None`` (timing) that is returned as is, else it is copied into ``out`` (check)."""

    def impl_vllm_fused(x, w1, w2, tw, ids, emap, out):
        kw = {} if emap is None else {"expert_map": emap, "global_num_experts": emap.numel()}
        y = fused_experts(x, w1, w2, tw, ids, **kw)
        return y if out is None else out.copy_(y)

    return impl_vllm_fused


def reference64(torch: Any, x, w1, w2, tw, ids, emap) -> Any:
    """float64 result [M, K] on x's device, one touched expert at a time (the weights of
    one expert are upcast at a time; memory stays small)."""
    M, topk = ids.shape
    E, N = w1.shape[0], w1.shape[1] // 2
    loc = local_ids(torch, ids, emap, E)
    weights = tw.reshape(-1).double()
    xd = x.double()
    out = torch.zeros(M, x.shape[1], dtype=torch.float64, device=x.device)
    for e in torch.unique(loc).tolist():
        if e >= E:
            continue
        slots = torch.nonzero(loc == e).flatten()
        tok = slots // topk
        h = xd[tok] @ w1[e].double().t()
        g = h[:, :N]
        a = g / (1.0 + torch.exp(-g)) * h[:, N:]
        y = a @ w2[e].double().t()
        out.index_add_(0, tok, y * weights[slots].unsqueeze(1))
    return out


def check_point(torch: Any, impls: Sequence[str], x, weights: Tuple[Any, Any], tw, ids, emap, tol: float,
                table: Optional[Dict[str, Tuple[Callable, bool]]] = None, fp8: Optional[dict] = None) -> Dict[str, dict]:
    """Each implementation's ||out - ref|| / ||ref|| against :func:`reference64`, the
    output poisoned with NaN first (an unwritten element fails). ``table`` maps names to
    implementations (default :data:`IMPLS`). With ``fp8`` (the FP8 keyword arguments, the
    weights e4m3) each implementation gets ``fp8=`` and the reference is
    :func:`reference64_fp8`, the error :func:`rel_error_fp8` (rounding-midpoint flips
    accounted for)."""
    table = IMPLS if table is None else table
    if fp8:
        ref, flips = reference64_fp8(torch, x, *weights, tw, ids, emap, fp8)
    else:
        ref, flips = reference64(torch, x, *weights, tw, ids, emap), None
    results: Dict[str, dict] = {}
    for name in impls:
        fn = table[name][0]
        out = torch.full_like(x, float("nan"))
        try:
            if fp8:
                fn(x, *weights, tw, ids, emap, out, fp8=fp8)
                err, used = rel_error_fp8(torch, out, ref, flips, weights[1], fp8)
                results[name] = {"rel_err": err, "tol": tol, "ok": err <= tol,
                                 "flips": int(flips["m"].numel()), "flips_used": used}
            else:
                fn(x, *weights, tw, ids, emap, out)
                err = rel_error(torch, out, ref)
                results[name] = {"rel_err": err, "tol": tol, "ok": err <= tol}
        except Exception as e:
            results[name] = {"rel_err": None, "tol": tol, "ok": False, "error": _err(e)}
    return results


def rel_error(torch: Any, out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float64; NaN or inf anywhere gives inf."""
    o = out.double()
    if not bool(torch.isfinite(o).all()):
        return math.inf
    den = float(torch.linalg.vector_norm(ref))
    num = float(torch.linalg.vector_norm(o - ref))
    return num / den if den else num


# --------------------------------------------------------------------------------------
# Timers
# --------------------------------------------------------------------------------------


class GpuTimer:
    """Median ms of fn() with L2 flushed before each call: triton.testing.do_bench when
    there is triton, else CUDA events with a 256 MB write before each of 50 reps."""

    def __init__(self, torch: Any, device: Any):
        self.torch = torch
        self.device = device
        try:
            from triton.testing import do_bench

            self._do_bench = do_bench
            self.method = 'triton.testing.do_bench(return_mode="median"), L2 flushed before each rep'
        except Exception:
            self._do_bench = None
            self._flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
            self.method = "CUDA events, 256 MB L2 flush before each rep, median of 50 (triton not available)"

    def __call__(self, fn: Callable[[], Any]) -> float:
        if self._do_bench is not None:
            return float(self._do_bench(fn, return_mode="median"))
        torch = self.torch
        fn()
        torch.cuda.synchronize(self.device)
        for _ in range(5):
            self._flush.zero_()
            fn()
        reps = 50
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            self._flush.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize(self.device)
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def cpu_time_us(calls: Sequence[Callable[[], Any]], min_reps: int = 5, max_reps: int = 50,
                budget_s: float = 0.25) -> float:
    """Median µs of one call (cycling over the layer copies), by time.perf_counter."""
    calls[0]()
    times: List[float] = []
    deadline = time.perf_counter() + budget_s
    i = 0
    while len(times) < min_reps or (len(times) < max_reps and time.perf_counter() < deadline):
        c = calls[i % len(calls)]
        t0 = time.perf_counter()
        c()
        times.append(time.perf_counter() - t0)
        i += 1
    return statistics.median(times) * 1e6


def warm_up_for_capture(torch: Any, calls: Sequence[Callable[[], Any]]) -> None:
    """Runs ``calls`` once on a side stream, as torch's graph capture wants (allocations and
    lazy initialization out of the way), and waits for them."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def capture_graph(torch: Any, calls: Sequence[Callable[[], Any]]) -> Any:
    """A CUDA graph of ``calls`` in order (after warm_up_for_capture). Raises what capture
    raises."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    return g


def gpu_time_us(torch: Any, calls: Sequence[Callable[[], Any]], timer: GpuTimer, graph: bool) -> Tuple[float, str]:
    """µs per layer of ``calls`` (one per layer): a CUDA graph of all of them replayed under
    ``timer``, or the eager loop. Returns (µs, how)."""
    layers = len(calls)
    how = "eager"
    fn: Callable[[], Any]
    g = None
    if graph:
        warm_up_for_capture(torch, calls)
        try:
            g = capture_graph(torch, calls)
            fn = g.replay
            how = "graph"
        except Exception as e:  # a pipeline that cannot be captured is timed eagerly
            g = None
            torch.cuda.synchronize()
            how = f"eager (graph capture failed: {_err(e, 120)})"
    if g is None:
        def fn() -> None:
            for c in calls:
                c()
    ms = timer(fn)
    del g
    return ms * 1000.0 / layers, how


def paired_rounds_us(torch: Any, calls_by_name: Dict[str, Sequence[Callable[[], Any]]],
                     timer: Optional[GpuTimer], graph: bool, rounds: int) -> Tuple[Dict[str, List[float]], str]:
    """µs per layer of each named call list (one call per layer) in ``rounds`` rounds that
    time every name once, in order on even rounds and reversed on odd ones (ABBA), so that
    drift of the clock or power state, between rounds and within one, falls on every name
    alike and the difference of two names within a round is a paired sample. On the GPU
    (``timer``) each round captures each list again as a CUDA graph where ``graph`` (so that
    the spread over rounds includes what one capture differs from another: allocations and
    placement); where a capture fails, every round is timed again as the eager loop, and
    ``how`` says why. On the CPU (``timer`` None) each round times the calls by
    perf_counter. Returns ({name: [µs per round]}, how)."""
    names = list(calls_by_name)
    how = "perf_counter" if timer is None else ("graph" if graph else "eager")
    while True:
        times: Dict[str, List[float]] = {name: [] for name in names}
        try:
            for r in range(rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    calls = calls_by_name[name]
                    if timer is None:
                        times[name].append(cpu_time_us(calls))
                    elif how == "graph":
                        warm_up_for_capture(torch, calls)
                        g = capture_graph(torch, calls)
                        times[name].append(timer(g.replay) * 1000.0 / len(calls))
                        del g
                    else:
                        times[name].append(timer(lambda: [c() for c in calls]) * 1000.0 / len(calls))
            return times, how
        except Exception as e:
            if how != "graph":
                raise
            torch.cuda.synchronize()  # a sticky CUDA error raises here, as in gpu_time_us
            how = f"eager (graph capture failed: {_err(e, 120)})"


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Dict[str, float]:
    """a[i] - b[i] over paired_rounds_us' rounds, whose order alternates (ABBA): ``estimate``
    is the mean of the two orders' medians (even rounds, odd rounds), so that a position
    effect (the name timed second in a round reading higher or lower) cancels instead of
    falling on whichever order has more rounds; ``order_effect`` is half the odd rounds'
    median minus the even rounds' (0 with one round); ``min`` and ``max`` span every round.
    (deepseek-v3-tp8 M = 64 on an H100, 2026-12-07: rounds read +2.0..+2.3 in one order and
    +4.7..+4.9 in the other, so the median of 5 rounds said +2.3 where the orders' mean is
    +3.5.)"""
    d = [x - y for x, y in zip(a, b)]
    if not d:
        raise ValueError("paired_difference: no rounds")
    even, odd = statistics.median(d[0::2]), statistics.median(d[1::2]) if len(d) > 1 else None
    estimate = even if odd is None else (even + odd) / 2
    return {"estimate": estimate, "order_effect": 0.0 if odd is None else (odd - even) / 2,
            "min": min(d), "max": max(d)}


def measure_read_bandwidth(torch: Any, device: Any, timer: GpuTimer, nbytes: int = READ_BW_BYTES) -> Tuple[float, int]:
    """Streaming read bandwidth (bytes/s): sum over an fp32 tensor of ``nbytes`` (capped at
    40% of free memory), bytes / median time."""
    free, _ = torch.cuda.mem_get_info(device)
    nbytes = min(int(nbytes), int(free * 0.4)) // (1 << 20) * (1 << 20)
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    ms = timer(lambda: x.sum())
    del x
    torch.cuda.empty_cache()
    return nbytes / (ms * 1e-3), nbytes


def measure_gemm_tflops(torch: Any, device: Any, timer: GpuTimer, n: int = GEMM_N) -> float:
    """bf16 GEMM ceiling (TF/s): ``torch.matmul`` of two random n x n bf16 matrices into a
    preallocated output, 2*n^3 / median time under ``timer``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(12345)
    a = torch.randn(n, n, generator=gen, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, generator=gen, device=device, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    ms = timer(lambda: torch.matmul(a, b, out=c))
    del a, b, c
    torch.cuda.empty_cache()
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores)"
    except OSError:
        pass
    return (platform.processor() or platform.machine() or "cpu") + f" ({os.cpu_count()} cores)"


def _free_bytes(torch: Any, device: Any) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def weight_copies(torch: Any, shape: MoeShape, bytes_per_weight: int, layers: int, dev: Any,
                  dtype: str) -> Tuple[int, int, Optional[str]]:
    """(distinct weight copies for ``layers`` calls, bytes per copy, a note when fewer than
    ``layers`` fit): copies may take at most :data:`MEMORY_FRACTION` of the free memory.
    Raises :class:`BenchError` when not even one fits."""
    per_copy = shape.weight_bytes(bytes_per_weight)
    free = _free_bytes(torch, dev)
    copies = min(layers, int(MEMORY_FRACTION * free // per_copy)) if per_copy else layers
    if copies < 1:
        raise BenchError(f"one copy of the weights of {shape.describe()} in {dtype} is {per_copy / 2**30:.1f} GiB; "
                         f"{free / 2**30:.1f} GiB free on {dev} (at most {MEMORY_FRACTION:.0%} may be used)")
    why = None
    if copies < layers:
        why = (f"weights: {copies} distinct copies instead of {layers} ({per_copy / 2**30:.2f} GiB each, "
               f"{free / 2**30:.1f} GiB free, cap {MEMORY_FRACTION:.0%}); the {layers} calls cycle over them")
    return copies, per_copy, why


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


#: most calls (weight copies) one timed graph may hold: past this the bench would only cycle
#: over the copies that fit in memory while spending minutes building the graph
MAX_LAYERS = 1024
#: seeds the bench's generators take, with the offsets it adds (torch.Generator.manual_seed)
MAX_SEED = 2**62


def check_layers_and_seed(layers: Any, seed: Any) -> None:
    """``--layers`` in [1, MAX_LAYERS] and ``--seed`` in [0, MAX_SEED] (bench and tune)."""
    if type(layers) is not int or not 1 <= layers <= MAX_LAYERS:
        raise BenchError(f"--layers: expected an integer in [1, {MAX_LAYERS}], got {layers!r}")
    if type(seed) is not int or not 0 <= seed <= MAX_SEED:
        raise BenchError(f"--seed: expected an integer in [0, 2^62], got {seed!r}")


def check_output_paths(**paths: Optional[str]) -> None:
    """Each output path given (flag name -> path; None or "-": none) must be writable where
    it points, checked before a run that may take minutes, not after it."""
    for flag, path in paths.items():
        if not path or path == "-":
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise BenchError(f"--{flag}: expected a file path, got the folder {path!r}")
        if not os.path.isdir(folder):
            raise BenchError(f"--{flag}: expected a path in an existing folder, got {path!r} ({folder} does not exist)")
        if not os.access(folder, os.W_OK):
            raise BenchError(f"--{flag}: expected a path in a writable folder, got {path!r} ({folder} is not writable)")


def resolve_device(torch: Any, device: Optional[str]) -> Any:
    d = "auto" if device is None else str(device).strip().lower()
    if d == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(d)
    except RuntimeError:
        raise BenchError(f"--device: expected auto, cpu, cuda or cuda:N, got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BenchError(f"--device {device}: torch sees no CUDA device")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise BenchError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu" or dev.index is not None:
        raise BenchError(f"--device: expected auto, cpu, cuda or cuda:N, got {device!r}")
    return dev


def _err(e: BaseException, n: int = 200) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:n]}" if text else type(e).__name__


def _note(record: dict, text: str, log: Optional[Callable[[str], None]]) -> None:
    record["notes"].append(text)
    if log:
        log(text)


CHECK_REFERENCE = "float64 torch, one touched expert at a time"
CHECK_REFERENCE_FP8 = (
    "float64 torch on the dequantized e4m3 weights, activations quantized as the op does "
    "(swapmoe.reference.fp8_act_quant's rules), one touched expert at a time; e4m3 rounding-midpoint "
    f"flips (within {FP8_FLIP_MARGIN:g} relative) that bring the reference closer are applied first "
    "(as swapmoe.reference.rel_error_with_flips); tolerance = the dtype's unquantized one")


def describe_point_plan(torch: Any, x, weights: Tuple[Any, Any], tw, ids, emap, shape: MoeShape, dtype: str,
                        quant: str, gpu: bool, plan_kw: Optional[dict] = None) -> Any:
    """The oracle's plan of one point as a dict (backend, kernels, reasons, workspace_bytes),
    or the error text. Unquantized: ``_core.describe_plan`` of the very call. FP8:
    ``swapmoe.select_backend(..., quant=quant)`` for this shape and device (CPU tensors always
    run the ``cpu`` backend)."""
    try:
        import swapmoe

        if quant == "none":
            plan = swapmoe._core.describe_plan(x, *weights, tw, ids, expert_map=emap)
            return {k: plan.get(k) for k in ("backend", "kernels", "reasons", "workspace_bytes")}
        if not gpu:
            return {"backend": "cpu", "kernels": [], "source": "device",
                    "reasons": ["CPU tensors run the Rust reference path (FP8 W8A8 on the CPU)"],
                    "workspace_bytes": 0}
        p = swapmoe.select_backend(int(x.shape[0]), shape.E, shape.topk, shape.K, shape.N, dtype=dtype,
                                   quant=quant, global_num_experts=shape.E_global,
                                   **(plan_kw or {}))
        return {"backend": p.backend, "kernels": list(p.tile.get("kernels") or []), "source": p.source,
                "reasons": list(p.reasons), "workspace_bytes": swapmoe.workspace_bytes(x, weights[0], ids, quant)}
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def run_bench(
    shape: Optional[MoeShape] = None,
    *,
    dtype: str = "bf16",
    quant: str = "none",
    m_list: Optional[Sequence[int]] = None,
    routing: str = "uniform",
    zipf_s: float = 1.0,
    layers: int = 8,
    graph: bool = True,
    baselines: Optional[bool] = None,
    check: bool = True,
    check_all: bool = False,
    device: Optional[str] = "auto",
    seed: int = 0,
    anchors: Optional[str] = None,
    read_bw_tbps: Optional[float] = None,
    gemm_tflops: Optional[float] = None,
    progress: bool = True,
    log: Optional[Callable[[str], None]] = None,
    with_routing: bool = False,
    read_floor: Optional[bool] = None,
    routing_rounds: int = ROUTING_ROUNDS,
) -> dict:
    """Benchmarks swapmoe (and the baselines) on one shape over ``m_list``; returns the full
    record (see ``swapmoe bench --json``). Defaults depend on the device: on CUDA the shape
    is qwen3-30b-a3b, M the decode-to-prefill sweep and baselines on; on the CPU the shape
    is small, M is 1,4,16 and baselines off. An FP8 ``quant`` times swapmoe on e4m3 weights
    (see the module docstring); the torch and vLLM baselines are then skipped with the reason
    in ``record["skipped"]``. ``read_floor`` (default: on for GPU runs, when triton imports)
    also times a read-only kernel over each point's routed weight bytes
    (``point["read_floor_us"]``, ``%read``; see ``swapmoe._read_floor``). ``with_routing`` also
    times ``swapmoe.fused_moe`` with ``shape.router`` (:data:`DEFAULT_ROUTER` where None) and
    runs every column on that router's ids (see the module docstring), then times fused_experts
    and fused_moe again in ``routing_rounds`` alternating rounds (``point["routing_overhead"]``:
    fused_moe - fused_experts per round, paired; 0 leaves them out)."""
    check_quant(quant)
    if isinstance(routing_rounds, bool) or not isinstance(routing_rounds, int) or routing_rounds < 0:
        raise BenchError(f"--routing-rounds: expected an integer >= 0, got {routing_rounds!r}")
    if with_routing and routing != "uniform":
        raise BenchError("--with-routing: needs --routing uniform (fused_moe routes from logits)")
    if dtype not in DTYPES:
        raise BenchError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    try:
        import torch
    except ImportError:
        raise BenchError("swapmoe bench needs torch (pip install torch)") from None
    if routing not in ("uniform", "skewed"):
        raise BenchError(f"--routing: expected uniform or skewed, got {routing!r}")
    check_layers_and_seed(layers, seed)
    if not (math.isfinite(zipf_s) and zipf_s >= 0):
        raise BenchError(f"--zipf-s: expected a finite exponent >= 0, got {zipf_s}")
    for flag, v in (("--read-bw", read_bw_tbps), ("--gemm-tflops", gemm_tflops)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise BenchError(f"{flag}: expected a positive finite number, got {v}")
    t_start = time.perf_counter()
    dev = resolve_device(torch, device)
    gpu = dev.type == "cuda"
    if shape is None:
        shape = (preset_shape(GPU_DEFAULT_MODEL) if gpu
                 else shard_shape("cpu-small", *CPU_DEFAULT_SHAPE, source="cpu-default"))
    ms = sorted(set(int(m) for m in (m_list or (DEFAULT_M_GPU if gpu else DEFAULT_M_CPU))))
    if not ms or ms[0] < 1:
        raise BenchError(f"--m: expected positive token counts, got {m_list!r}")
    if baselines is None:
        baselines = gpu
    tdtype = getattr(torch, DTYPES[dtype][0])
    bpe = DTYPES[dtype][1]  # activations, and weights unquantized
    bpw = weight_bytes_per_element(quant, dtype)
    variant = anchor_variant(quant, dtype)  # the anchor's unquantized variant is "bf16"
    # ---- the router of --with-routing: the shape's model's, made before anything is timed --
    router: Optional[RouterSpec] = None
    bias = None
    router_record = None
    if with_routing:
        router = shape.router or DEFAULT_ROUTER
        router.check(shape.E_global, shape.topk)
        bias = make_correction_bias(torch, router, shape.E_global, seed, dev)
        router_record = dict(
            router.as_dict(), describe=router.describe(shape.topk),
            e_score_correction_bias=(None if bias is None else
                                     f"randn(E_global={shape.E_global}) x {BIAS_SCALE:g}, float32, seed "
                                     f"{seed}+{BIAS_SEED_OFFSET}, made once for the shape"),
            ids=("the float64 reference router (swapmoe.reference.select_experts_ref) on each M's logits "
                 "(randn(M, E_global), as --routing uniform); every implementation runs on these ids and the "
                 "check's reference uses them; fused_moe routes the logits itself"))

    env = environment()
    record: Dict[str, Any] = {
        "schema": SCHEMA,
        "mode": "gpu" if gpu else "cpu",
        "label": None,
        "device": {"type": dev.type, "index": dev.index, "name": None},
        "versions": {k: env[k] for k in ("swapmoe", "torch", "torch_cuda", "triton", "numpy", "python")},
        "driver_version": env["driver_version"],
        "build_info": env["build_info"],
        "shape": shape.as_dict(),
        "dtype": dtype,
        "quant": quant,
        "bytes_per_weight": bpw,
        "bytes_per_act": bpe,
        "routing": {"kind": routing, "seed": seed, **({"zipf_s": zipf_s} if routing == "skewed" else {}),
                    "router": router_record},
        "method": {},
        "read_bw": None,
        "read_floor": None,
        "gemm_tflops": None,
        "anchor": None,
        "check": None,
        "implementations": [],
        "skipped": {},
        "points": [],
        "notes": [],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }

    # ---- anchor -------------------------------------------------------------------------
    anchor_path = find_anchor(anchors)
    anchor = load_anchor(anchor_path) if anchor_path else None
    anchor_ok = bool(anchor) and variant is not None and routing == "uniform" and shape.ep == 1 and any(
        anchor_row(anchor, shape, variant, m) for m in ms)
    record["anchor"] = {
        "path": anchor_path,
        "what": (anchor or {}).get("what"),
        "device": (anchor or {}).get("device"),
        "variant": variant,
        "matched": anchor_ok,
    }
    if anchor and not anchor_ok:
        why = ("skewed routing" if routing != "uniform" else "expert parallelism" if shape.ep > 1
               else f"no {quant} variant in the anchor" if variant is None
               else f"no {variant} row for (E, topk, K, N) = {shape.key()}")
        record["anchor"]["why_not"] = why

    # ---- device, timer, bandwidth ------------------------------------------------------
    timer: Optional[GpuTimer] = None
    if gpu:
        torch.cuda.set_device(dev)
        import swapmoe

        props = torch.cuda.get_device_properties(dev)
        record["device"].update(name=props.name, capability=f"{props.major}.{props.minor}",
                                sm_count=props.multi_processor_count, total_memory=props.total_memory)
        try:
            record["device"]["swapmoe_device_info"] = dict(swapmoe._core.device_info(dev.index))
        except Exception as e:
            record["device"]["swapmoe_device_info"] = f"{type(e).__name__}: {e}"
        record["kernels_warmed"] = swapmoe.warmup(dev.index)
        timer = GpuTimer(torch, dev)
        if read_bw_tbps:
            bw, bw_how = float(read_bw_tbps) * 1e12, "given (--read-bw)"
        else:
            bw, nbytes = measure_read_bandwidth(torch, dev, timer)
            bw_how = f"sum over {nbytes / (1 << 30):.2f} GiB fp32, bytes / median time"
        record["read_bw"] = {"bytes_per_s": bw, "tbps": bw / 1e12, "method": bw_how}
        if gemm_tflops:
            gemm, gemm_how = float(gemm_tflops), "given (--gemm-tflops)"
        else:
            gemm_how = f"torch.matmul of two {GEMM_N}x{GEMM_N} bf16 matrices, 2*n^3 / median time"
            try:
                gemm = measure_gemm_tflops(torch, dev, timer)
            except Exception as e:  # no room for 3 x 128 MiB, or no bf16 GEMM: %gemm is n/a
                gemm = None
                _note(record, f"bf16 GEMM ceiling not measured: {_err(e)}", log)
                torch.cuda.synchronize()
        record["gemm_tflops"] = gemm
        if gemm and quant != "none":
            fp8_ceiling = (anchor or {}).get("fp8_gemm_tflops")
            _note(record, f"%gemm of {quant} is against the bf16 GEMM ceiling"
                  + (f"; the anchor's FP8 GEMM ceiling (torch._scaled_mm) was {fp8_ceiling:.0f} TF/s"
                     if isinstance(fp8_ceiling, (int, float)) else ""), log)
        if anchor_ok and record["anchor"]["device"] and record["anchor"]["device"] != props.name:
            _note(record, f"the anchor was measured on {record['anchor']['device']}, this run is on {props.name}", log)
        record["method"] = {
            "timer": timer.method,
            "graph": bool(graph),
            "layers": layers,
            "l2_flushed": True,
            "statistic": "median",
            "per_layer": f"time of {layers} calls / {layers}",
            "gemm_ceiling": gemm_how,
        }
    else:
        record["device"]["name"] = cpu_name()
        record["label"] = CPU_LABEL if not torch.cuda.is_available() else CPU_LABEL_FORCED
        record["method"] = {
            "timer": "time.perf_counter, median of 5-50 calls (>= 0.25 s per point)",
            "graph": False,
            "layers": layers,
            "l2_flushed": False,
            "statistic": "median",
            "per_layer": "one call",
        }
        bw = None
        gemm = None

    # ---- the read floor: a read-only kernel over each point's routed weight bytes -------------
    reader: Any = None
    if gpu and (read_floor is None or read_floor):
        try:
            from . import _read_floor as reader

            record["read_floor"] = {
                "method": (f"a read-only Triton kernel over the routed experts' w13 and w2 bytes of each layer "
                           f"({reader.CHUNK_BYTES // 1024} KiB per program, one launch per layer), timed as the op"),
                "chunk_bytes": reader.CHUNK_BYTES}
        except ImportError as e:
            _note(record, f"read floor not measured: {_err(e)}", log)
            reader = None

    # ---- implementations ----------------------------------------------------------------
    table: Dict[str, Tuple[Callable, bool]] = dict(IMPLS)
    impls = [IMPL_SWAPMOE]
    if with_routing:
        impls.append(IMPL_ROUTED)
    if baselines and quant != "none":
        record["skipped"][IMPL_VLLM] = (
            f"--quant {quant}: vLLM's FP8 fused_experts is not wired into this bench (it needs vLLM's "
            "quant_config, and it rounds the intermediate to the activation dtype before quantizing it, "
            "which the float64 FP8 check does not model)")
        record["skipped"][IMPL_GROUPED] = f"--quant {quant}: the torch._grouped_mm pipeline runs unquantized weights only"
        record["skipped"][IMPL_EAGER] = f"--quant {quant}: the torch eager pipeline runs unquantized weights only"
    elif baselines:
        fe, vllm_info = load_vllm_fused_experts()
        if fe is not None:
            table[IMPL_VLLM] = (make_vllm_impl(fe), True)
            impls.append(IMPL_VLLM)
            record["versions"]["vllm"] = vllm_info
        else:
            record["skipped"][IMPL_VLLM] = vllm_info
        if hasattr(torch, "_grouped_mm"):
            impls.append(IMPL_GROUPED)
        else:
            record["skipped"][IMPL_GROUPED] = f"torch {torch.__version__} has no torch._grouped_mm"
        impls.append(IMPL_EAGER)

    # ---- weights ------------------------------------------------------------------------
    copies, per_copy, copies_note = weight_copies(torch, shape, bpw, layers, dev,
                                                  dtype if quant == "none" else quant)
    if copies_note:
        _note(record, copies_note, log)
    record["method"]["with_routing"] = bool(with_routing)
    record["method"]["routing_rounds"] = routing_rounds if with_routing else None
    record["method"]["weight_copies"] = copies
    record["method"]["weight_bytes_per_copy"] = per_copy
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed + 1_000_003)
    emap = make_expert_map(torch, shape, dev)
    #: per copy, the extra keyword arguments of an implementation call ({} unquantized)
    qargs: List[dict] = [{}] * copies
    fp8_check: Optional[dict] = None
    if quant == "none":
        weights = [make_weights(torch, shape, tdtype, gen, dev) for _ in range(copies)]
    else:
        weights, scales = [], []
        for _ in range(copies):
            w1q, w2q, s1, s2 = make_fp8_weights(torch, shape, tdtype, gen, dev, quant)
            weights.append((w1q, w2q))
            scales.append((s1, s2))
        a1 = a2 = None
        act_how = ("dynamic, computed by the op: per token" if FP8_SCHEMES[quant] == "channel"
                   else "dynamic, computed by the op: per token and 128 columns")
        if FP8_SCHEMES[quant] == "tensor":
            a1, a2, act_how = calibrate_static_scales(torch, shape, *weights[0], fp8_kwargs(quant, *scales[0]),
                                                      tdtype, seed, dev, emap)
        qargs = [{"fp8": fp8_kwargs(quant, s1, s2, a1, a2)} for s1, s2 in scales]
        fp8_check = qargs[0]["fp8"]
        sh1, sh2 = fp8_scale_shapes(quant, shape)
        record["method"]["fp8"] = {
            "weights": (f"master weights drawn in {dtype} (randn x K^-1/2 and N^-1/2, as unquantized runs) quantized "
                        "to float8_e4m3fn with scale = absmax / 448 per "
                        + {"tensor": "expert", "channel": "output row", "block": "128x128 block"}[FP8_SCHEMES[quant]]),
            "w1_scale_shape": list(sh1),
            "w2_scale_shape": list(sh2),
            "activation_scales": act_how,
            "a1_scale": None if a1 is None else float(a1),
            "a2_scale": None if a2 is None else float(a2),
        }
        if gpu:
            torch.cuda.synchronize(dev)
            torch.cuda.empty_cache()

    bar = None
    if progress:
        try:
            from tqdm import tqdm

            tty = sys.stderr.isatty()
            # off a terminal (a captured log) redraw rarely, so the bar does not flood the log
            bar = tqdm(total=len(ms) * len(impls), file=sys.stderr, desc=f"bench {shape.name}", unit="pt",
                       leave=False, dynamic_ncols=tty, mininterval=0.1 if tty else 30.0)
        except ImportError:
            bar = None

    tol = TOLERANCE[dtype]
    plan_kw: Dict[str, Any] = {}
    if gpu and dev.index != 0:  # select_backend asks device 0 unless told which device
        plan_kw = {"device_name": record["device"]["name"],
                   "device_capability": tuple(int(c) for c in record["device"]["capability"].split("."))}
    record["aborted"] = None
    try:
        for i_m, M in enumerate(ms):
            gen.manual_seed(seed)
            logits_box: list = []
            tw, ids = make_routing(torch, M, shape.E_global, shape.topk, routing, gen, dev, zipf_s,
                                   logits_out=logits_box if with_routing else None)
            router_same: Optional[bool] = None
            if router is not None:  # every column on the ids of the router fused_moe runs
                tw, ids = router_ids(torch, logits_box[0], shape.topk, router, bias)
                table[IMPL_ROUTED] = (make_routed_impl(logits_box[0], shape.topk, router.kwargs(bias)), True)
                try:
                    router_same = router_agrees(torch, logits_box[0], shape.topk, router, bias, ids)
                except Exception as e:  # fused_moe's check and timing say the rest
                    _note(record, f"swapmoe.select_experts failed at M={M}: {_err(e)}", log)
                if router_same is False:
                    _note(record, f"at M={M} swapmoe.select_experts picks other experts than the float64 "
                                  "reference router: experts touched are the reference's", log)
            x = torch.randn(M, shape.K, generator=gen, device=dev, dtype=tdtype)
            loc = local_ids(torch, ids, emap, shape.E)
            valid = loc < shape.E
            experts = sorted(int(e) for e in torch.unique(loc[valid]).tolist())  # the local experts in use
            touched = len(experts)
            slots = int(valid.sum())
            point: Dict[str, Any] = {"M": M, "experts_touched": touched, "slots": slots, "floor_us": None,
                                     "read_floor_us": None, "anchor_vllm_gemm_us": None,
                                     "anchor_experts_touched": None, "anchor_floor_us": None, "results": {},
                                     "errors": {}}
            if router is not None:
                point["router_ids_match"] = router_same
            record["points"].append(point)  # partial points survive an abort
            if bw:
                point["floor_us"] = hbm_floor_us(touched, shape.N, shape.K, M, bpe, bpe, bw, quant=quant)
            row = anchor_row(anchor, shape, variant, M) if anchor_ok and variant else None
            if row:
                point["anchor_vllm_gemm_us"] = row.get("vllm_gemm_us")
                point["anchor_experts_touched"] = row.get("experts_touched")
                point["anchor_floor_us"] = row.get("floor_us")
            point["plan"] = describe_point_plan(torch, x, weights[0], tw, ids, emap, shape, dtype, quant, gpu,
                                                plan_kw)

            # correctness on the smallest M (every M with check_all), before any timing
            if check and (i_m == 0 or check_all):
                results = check_point(torch, impls, x, weights[0], tw, ids, emap, tol, table, fp8=fp8_check)
                point["check"] = results
                for name in list(impls):
                    if name != IMPL_SWAPMOE and not results[name]["ok"] and i_m == 0:
                        impls.remove(name)  # a baseline that is wrong is not timed
                        r = results[name]
                        record["skipped"][name] = r.get("error") or f"check failed: rel_err {r['rel_err']:.3g} > {tol:g}"
                        if bar is not None:
                            bar.total -= len(ms)
                            bar.refresh()
                if i_m == 0:
                    record["check"] = {"M": M, "reference": CHECK_REFERENCE_FP8 if fp8_check else CHECK_REFERENCE,
                                       "results": results, "ok": results[IMPL_SWAPMOE]["ok"], "all_M": bool(check_all)}
                elif not results[IMPL_SWAPMOE]["ok"]:
                    record["check"]["ok"] = False
                if not results[IMPL_SWAPMOE]["ok"]:
                    record["check"].setdefault("failed_M", []).append(M)
                    _note(record, f"CHECK FAILED for swapmoe at M={M}: {results[IMPL_SWAPMOE]}", log)

            if reader is not None:
                assert timer is not None
                try:
                    reads = [reader.make_reader(torch, *weights[i % copies], experts) for i in range(layers)]
                    point["read_floor_us"] = gpu_time_us(torch, reads, timer, graph)[0]
                except Exception as e:  # measured where it can be; the op's timing goes on
                    _note(record, f"read floor not measured (from M={M} on): {_err(e)}", log)
                    reader = None
                    torch.cuda.synchronize()

            def layer_calls(name: str) -> Tuple[List[Callable[[], Any]], List[Any]]:
                """One call of implementation ``name`` per layer, on that layer's weight copy and
                output (none where the implementation returns its own)."""
                fn = table[name][0]
                outs = [None if name in RETURNS_OUTPUT else torch.empty_like(x) for _ in range(layers)]
                return [(lambda f, w, o, q: (lambda: f(x, w[0], w[1], tw, ids, emap, o, **q)))(
                    fn, weights[i % copies], outs[i], qargs[i % copies]) for i in range(layers)], outs

            for name in list(impls):
                graphable = table[name][1]
                calls, outs = layer_calls(name)
                try:
                    if gpu:
                        assert timer is not None
                        t_us, how = gpu_time_us(torch, calls, timer, graph and graphable)
                    else:
                        t_us, how = cpu_time_us(calls), "perf_counter"
                except Exception as e:
                    point["errors"][name] = _err(e, 400)
                    if name == IMPL_SWAPMOE:
                        _note(record, f"swapmoe failed at M={M}: {_err(e, 400)}", log)
                    else:  # a baseline that fails once is dropped
                        impls.remove(name)
                        record["skipped"][name] = f"failed at M={M}: {_err(e)}"
                    if gpu:
                        torch.cuda.synchronize()  # a sticky CUDA error raises here and aborts the run
                    continue
                finally:
                    del calls, outs
                    if bar is not None:
                        bar.update(1)
                res: Dict[str, Any] = {"time_us": t_us, "how": how, "tflops": moe_tflops(slots, shape.N, shape.K, t_us)}
                if point["floor_us"] is not None:
                    res["pct_floor"] = 100.0 * point["floor_us"] / t_us
                if point["read_floor_us"] is not None:
                    res["pct_read"] = 100.0 * point["read_floor_us"] / t_us
                if gemm:
                    res["pct_gemm"] = 100.0 * res["tflops"] / gemm
                if point["anchor_vllm_gemm_us"]:
                    res["speedup_vs_anchor"] = point["anchor_vllm_gemm_us"] / t_us
                point["results"][name] = res
            sw = point["results"].get(IMPL_SWAPMOE)
            if sw:
                sw["speedup_vs"] = {b: r["time_us"] / sw["time_us"] for b, r in point["results"].items()
                                    if b != IMPL_SWAPMOE}
            if router is not None and routing_rounds > 0 and all(
                    n in point["results"] for n in (IMPL_SWAPMOE, IMPL_ROUTED)):
                # fused_moe - fused_experts (issue 3) is a few µs on layers of up to ~1 ms: the two
                # columns above, timed one after the other, differ also by the clock's drift
                # between them; alternating rounds pair each fused_moe time with a fused_experts
                # time taken just before it.
                pair_calls = {n: layer_calls(n)[0] for n in (IMPL_SWAPMOE, IMPL_ROUTED)}
                try:
                    per_round, how = paired_rounds_us(torch, pair_calls, timer if gpu else None,
                                                      graph and all(table[n][1] for n in pair_calls),
                                                      routing_rounds)
                    d = paired_difference(per_round[IMPL_ROUTED], per_round[IMPL_SWAPMOE])
                    point["routing_overhead"] = {
                        "rounds": routing_rounds, "how": how,
                        "fused_experts_us": per_round[IMPL_SWAPMOE], "fused_moe_us": per_round[IMPL_ROUTED],
                        "delta_us": d["estimate"], "delta_min_us": d["min"], "delta_max_us": d["max"],
                        "order_effect_us": d["order_effect"]}
                except Exception as e:  # the columns above stand; the pairing says why it is missing
                    point["errors"]["routing_overhead"] = _err(e, 400)
                    if gpu:
                        torch.cuda.synchronize()
                finally:
                    del pair_calls
            if gpu:
                torch.cuda.empty_cache()
    except Exception as e:  # keep what was measured (a sticky CUDA error ends the run)
        record["aborted"] = f"at M={M}: {_err(e, 400)}"
        _note(record, f"run aborted {record['aborted']}", log)
    if bar is not None:
        bar.close()

    order = list(IMPL_ORDER) + [n for n in table if n not in IMPL_ORDER]
    record["implementations"] = [n for n in order if any(n in p["results"] for p in record["points"])]
    record["elapsed_s"] = time.perf_counter() - t_start
    return record


# --------------------------------------------------------------------------------------
# Plot
# --------------------------------------------------------------------------------------


def plot_record(record: dict, path: str) -> None:
    """Time and % of floor against M (log x), one line per implementation, the floor and
    the anchor drawn, to a PNG (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    pts = record["points"]
    Ms = [p["M"] for p in pts]
    fig, (ax_t, ax_p) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name in record["implementations"]:
        xs = [p["M"] for p in pts if name in p["results"]]
        ax_t.plot(xs, [p["results"][name]["time_us"] for p in pts if name in p["results"]], marker="o", label=name)
        pct = [(p["M"], p["results"][name].get("pct_floor")) for p in pts if name in p["results"]]
        pct = [(m, v) for m, v in pct if v is not None]
        if pct:
            ax_p.plot([m for m, _ in pct], [v for _, v in pct], marker="o", label=name)
    floor = [(p["M"], p["floor_us"]) for p in pts if p.get("floor_us") is not None]
    if floor:
        ax_t.plot([m for m, _ in floor], [f for _, f in floor], "k--", label="HBM floor")
    anc = [(p["M"], p["anchor_vllm_gemm_us"]) for p in pts if p.get("anchor_vllm_gemm_us")]
    if anc:
        ax_t.plot([m for m, _ in anc], [a for _, a in anc], ls=":", marker="x", color="gray",
                  label="vLLM 0.33 GEMMs (anchor)")
        ax_p.plot([m for m, _ in anc], [100.0 * p["floor_us"] / p["anchor_vllm_gemm_us"] for p in pts
                                         if p.get("anchor_vllm_gemm_us") and p.get("floor_us")],
                  ls=":", marker="x", color="gray", label="vLLM 0.33 GEMMs (anchor)")
    sh = record["shape"]
    quant = record.get("quant") or "none"
    title = (f"{sh['name']}  E={sh['E']} topk={sh['topk']} K={sh['K']} N={sh['N']}  {record['dtype']}"
             + ("" if quant == "none" else f" {quant}"))
    ax_t.set(xscale="log", yscale="log", xlabel="M (tokens)", ylabel="µs per layer", title=title)
    ax_p.set(xscale="log", xlabel="M (tokens)", ylabel="% of HBM floor", title=record["device"].get("name") or "")
    if floor:
        ax_p.axhline(100.0, color="k", ls="--", lw=1, label="floor (100%)")
    else:
        ax_p.text(0.5, 0.5, "% of floor: n/a (CPU run)", ha="center", va="center", transform=ax_p.transAxes)
    for ax in (ax_t, ax_p):
        if Ms:
            ax.set_xlim(min(Ms) / 1.4, max(Ms) * 1.4)
            ax.set_xticks(Ms)
            ax.set_xticklabels([str(m) for m in Ms], fontsize=7)
            ax.minorticks_off()
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if record.get("label"):
        fig.suptitle(record["label"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def write_json(record: dict, path: str) -> None:
    def default(o: Any) -> Any:
        if isinstance(o, tuple):
            return list(o)
        return str(o)

    def clean(o: Any) -> Any:  # JSON has no inf/nan
        if isinstance(o, float) and not math.isfinite(o):
            return None if math.isnan(o) else ("inf" if o > 0 else "-inf")
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    with open(path, "w", encoding="utf-8") as f:
        json.dump(clean(record), f, indent=1, default=default)
        f.write("\n")
