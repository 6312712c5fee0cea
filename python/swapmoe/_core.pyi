"""Type stubs of the compiled extension ``swapmoe._core`` (Rust, PyO3)."""

from typing import Any, Optional

__all__ = [
    "fused_experts",
    "workspace_bytes",
    "select_experts",
    "fused_moe",
    "select_backend",
    "describe_plan",
    "table_file_name",
    "read_table",
    "tables_info",
    "_set_shipped_tables_dir",
    "build_info",
    "driver_version",
    "device_info",
    "warmup",
    "_module_global",
    "__version__",
]

__version__: str

def fused_experts(
    hidden_states: Any,
    w1: Any,
    w2: Any,
    topk_weights: Any,
    topk_ids: Any,
    out: Any,
    workspace: Optional[Any] = None,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Optional[Any] = None,
    check_ids: bool = False,
    stream: int = 0,
    backend: Optional[str] = None,
    use_fp8_w8a8: bool = False,
    w1_scale: Optional[Any] = None,
    w2_scale: Optional[Any] = None,
    a1_scale: Optional[Any] = None,
    a2_scale: Optional[Any] = None,
    per_channel_quant: bool = False,
    block_shape: Optional[list[int]] = None,
) -> None:
    """Runs the op into ``out``. CUDA tensors need ``workspace`` (a contiguous, writable,
    256-byte aligned CUDA buffer of at least ``workspace_bytes(...)`` bytes that overlaps no
    other argument) and launch on ``stream`` (a CUstream address; the inputs must be ready
    on it)."""

def fused_moe(
    hidden_states: Any,
    w1: Any,
    w2: Any,
    gating_output: Any,
    topk_weights: Optional[Any],
    topk_ids: Optional[Any],
    out: Any,
    workspace: Optional[Any],
    topk: int,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    e_score_correction_bias: Optional[Any] = None,
    routed_scaling_factor: float = 1.0,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Optional[Any] = None,
    stream: int = 0,
    backend: Optional[str] = None,
    use_fp8_w8a8: bool = False,
    w1_scale: Optional[Any] = None,
    w2_scale: Optional[Any] = None,
    a1_scale: Optional[Any] = None,
    a2_scale: Optional[Any] = None,
    per_channel_quant: bool = False,
    block_shape: Optional[list[int]] = None,
) -> None:
    """Routes ``gating_output`` into ``topk_weights`` / ``topk_ids`` (fp32 / int32 [M, topk])
    and runs the experts on them into ``out``; the oracle places the router on CUDA. With both
    None (CUDA only) the router's outputs live in ``workspace`` after the experts' sections
    (``workspace_bytes(..., routing=True)`` bytes)."""

def select_experts(
    gating_output: Any,
    topk_weights: Any,
    topk_ids: Any,
    topk: int,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    e_score_correction_bias: Optional[Any] = None,
    routed_scaling_factor: float = 1.0,
    stream: int = 0,
    num_tokens: Optional[int] = None,
) -> None:
    """Routes router logits into ``topk_weights`` (fp32 [M, topk]) and ``topk_ids`` (int32)."""

def select_backend(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    hidden_size: int,
    intermediate_size: int,
    dtype: str = "bf16",
    device_capability: Optional[tuple[int, int]] = None,
    device_name: Optional[str] = None,
    sm_count: Optional[int] = None,
    backend: Optional[str] = None,
    quant: Optional[str] = None,
    external_backends: Optional[list[str]] = None,
    activation_scales: Optional[str] = None,
    global_num_experts: int = -1,
) -> dict[str, Any]:
    """The oracle's plan for a shape (see ``swapmoe.select_backend``): backend, swap_ab,
    tile, source, reasons, device_name, device_capability, table, table_m, table_used,
    fallback."""

def table_file_name(
    num_experts: int,
    intermediate_size: int,
    device_name: str,
    dtype: str = "bf16",
    quant: Optional[str] = None,
    hidden_size: Optional[int] = None,
) -> str:
    """The tuned table's file name for a shape on a device: vLLM's naming, keyed by (E, N);
    with ``hidden_size``, the name of a table for that K alone (``E=..,N=..,K=..,...``), which
    the oracle reads ahead of the (E, N) one."""

def read_table(path: str) -> dict[str, Any]:
    """A table file parsed as the oracle parses it: {"file", "metadata", "entries": {M:
    {"backend", "token_tile", "time_us", "times_us"}}} (a cuda_wgmma_swap entry with a measured
    launch also has "swap_gemm1_ring" and "swap_gemm2_pdl", and "swap_gemm2_ring" where the
    table names the e4m3 GEMM2's ring); ArgumentError when malformed."""

def tables_info() -> dict[str, Any]:
    """The tables the oracle sees: shipped_dir, user_dir, dir_errors, files."""

def _set_shipped_tables_dir(path: Optional[str]) -> None:
    """Sets the folder of the shipped tables (called by ``swapmoe/__init__.py``)."""

def workspace_bytes(
    m: int,
    topk: int,
    n: int,
    k: int,
    num_experts: int,
    elem_size: int,
    quant: Optional[str] = None,
    routing: bool = False,
) -> int:
    """Bytes of CUDA workspace for M tokens; ``routing``: fused_moe's, with the router's
    outputs in it too."""
def describe_plan(
    hidden_states: Any,
    w1: Any,
    w2: Any,
    topk_weights: Any,
    topk_ids: Any,
    *,
    activation: str = "silu",
    expert_map: Optional[Any] = None,
    fused_moe: bool = False,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
) -> dict[str, Any]:
    """The plan a call with these tensors would run, without running it: problem, backend,
    source, table, kernels (fused_moe's router kernel first where it has its own), router,
    rows_per_cta, tokens_per_pass, splits, swap_gemm1_ring (stages of the swap-AB GEMM1's ring
    when smaller than its own, 0 otherwise), swap_gemm2_ring (the same for its e4m3 GEMM2,
    so that its CTAs fit beside GEMM1's; $SWAPMOE_SWAP_GEMM2_RING forces it), swap_gemm2_one_per_sm, swap_gemm2_pdl (the swap-AB
    GEMM2 starts by programmatic dependent launch under GEMM1), wgmma_gemm1_pdl (so does
    cuda_wgmma's GEMM1 after the plan's own kernels), align_ctas (CTAs of the
    routing alignment, one thread-block cluster past 1), align_in_gemm1 (cuda_wgmma's GEMM1
    groups the slots itself: no align kernel), pdl (later kernels start by
    programmatic dependent launch), first_kernel_pdl (so does the first: fused_experts' first
    kernel, or fused_moe's router), ctas, wgmma_persistent, wgmma_l2_hints (L2 eviction hints of the
    cuda_wgmma loads: 1 weights evict first, 2 token rows evict last), wgmma_gemm2_block_run
    (column blocks per token tile that each cuda_wgmma GEMM2 CTA takes in a row), reasons,
    workspace_bytes."""
def build_info() -> dict[str, Any]: ...
def driver_version() -> int: ...
def device_info(ordinal: int) -> dict[str, Any]: ...
def warmup(ordinal: int) -> int: ...
def _module_global(ordinal: int, module: str, symbol: str) -> tuple[int, int]:
    """(device address, bytes) of a ``__device__`` variable of an embedded kernel module; for
    profiling builds (``SWAPMOE_CUDA_STAMPS=1``, read by ``benches/stamps.py``). ArgumentError
    when the module or symbol does not exist in this build."""
