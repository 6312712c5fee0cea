"""Type stubs of the compiled extension ``swapmoe._core`` (Rust, PyO3)."""

from typing import Any, Optional

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
) -> None:
    """Runs the op into ``out``. CUDA tensors need ``workspace`` (a CUDA buffer of at least
    ``workspace_bytes(...)`` bytes) and launch on ``stream`` (a CUstream address; the
    inputs must be ready on it)."""

def workspace_bytes(m: int, topk: int, n: int, k: int, num_experts: int, elem_size: int) -> int: ...
def describe_plan(
    hidden_states: Any,
    w1: Any,
    w2: Any,
    topk_weights: Any,
    topk_ids: Any,
    *,
    activation: str = "silu",
    expert_map: Optional[Any] = None,
) -> dict[str, Any]: ...
def build_info() -> dict[str, Any]: ...
def driver_version() -> int: ...
def device_info(ordinal: int) -> dict[str, Any]: ...
def warmup(ordinal: int) -> int: ...
