"""swapmoe: a fused Mixture-of-Experts operator for vLLM on NVIDIA GPUs.

``fused_experts`` takes any DLPack tensors (torch, numpy, cupy). CUDA tensors run the
embedded CUDA kernels on the caller's current stream; CPU tensors run the Rust reference
path. Importing swapmoe needs no GPU and no CUDA toolkit.
"""

import os as _os
from typing import Any as _Any

from . import _api, _core
from ._api import fused_experts, fused_moe, fused_moe_workspace_bytes, select_experts, workspace_bytes
from .errors import ArgumentError, CudaError, DeviceError, DTypeError, Error, OutOfMemoryError, ShapeError
from .oracle import Plan, select_backend

#: the tuned tables shipped with the package; ``$SWAPMOE_TABLES_DIR`` adds or replaces files
TABLES_DIR: str = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "tables")
_core._set_shipped_tables_dir(TABLES_DIR)  # the Rust oracle reads them on its first lookup

__version__: str = _core.__version__


def build_info() -> dict:
    """What this build holds: version, nvcc version, embedded targets, modules and kernels,
    `cuda_stamps` (True for a profiling build, `SWAPMOE_CUDA_STAMPS=1`; see benches/stamps.py)
    and `cuda_probe` (None, or the timing probe it was built as, `SWAPMOE_CUDA_PROBE=no_mma`:
    kernels that skip their math and open a device only with `SWAPMOE_PROBE_BUILD_OK=1`)."""
    return dict(_core.build_info())


def warmup(device: _Any = 0) -> int:
    """Loads the kernel modules on CUDA device ``device`` and resolves every kernel variant
    (every dtype, load width and tensor-core token tile, so whatever a tuned table or an
    override picks), so that a later CUDA-graph capture does no module work. Returns the
    kernel count.

    ``device``: an ordinal (int), ``"cuda"`` / ``"cuda:N"``, a ``torch.device`` of type
    cuda, or a CuPy ``Device``; ``"cuda"`` without an index is torch's current device where
    torch is imported, else 0. Anything else raises :class:`ArgumentError` naming
    ``device``; an ordinal no GPU has, :class:`DeviceError`."""
    return _core.warmup(_api.device_ordinal(device))


__all__ = [
    "fused_experts",
    "fused_moe",
    "select_experts",
    "select_backend",
    "Plan",
    "workspace_bytes",
    "fused_moe_workspace_bytes",
    "build_info",
    "warmup",
    "Error",
    "ShapeError",
    "DTypeError",
    "DeviceError",
    "ArgumentError",
    "CudaError",
    "OutOfMemoryError",
    "__version__",
]
