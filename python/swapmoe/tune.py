"""``swapmoe tune``: measures every swapmoe candidate (backend x tensor-core token tile, and
at M <= 32 cuda_wgmma_swap's launch variants ``cuda_wgmma_swap:r<ring>p<pdl>`` (bf16/fp16 and FP8):
GEMM1's ring of stages, GEMM2 by PDL or after GEMM1; for FP8 also ``r0p1g<ring>``, the e4m3
GEMM2's ring) for given shapes and token counts on the
current GPU and writes tuned tables that the oracle reads (format: ``src/tables.rs``; names:
``swapmoe._core.table_file_name``).

Timing is ``swapmoe bench``'s (``bench.gpu_time_us``): a CUDA graph of ``layers`` calls on
distinct weight copies, replayed under ``triton.testing.do_bench`` (L2 flushed, median),
divided by ``layers``; uniform routing ``topk(softmax(randn(M, E)))``. A candidate is forced
with ``$SWAPMOE_BACKEND`` and ``$SWAPMOE_MMA_TOKEN_TILE`` (a launch variant also with
``$SWAPMOE_SWAP_GEMM1_RING``, ``$SWAPMOE_SWAP_GEMM2_PDL`` and ``$SWAPMOE_SWAP_GEMM2_RING``)
(source "override"); one that the
oracle says cannot run a point is skipped with its reason. When vLLM imports, its Triton
``fused_experts`` is timed on the same inputs and stored as ``vllm_triton``, a candidate
only for callers inside vLLM. When flashinfer imports, FlashInfer's CUTLASS fused MoE is timed
the way vLLM's ``FlashInferExperts`` runs it (bf16/fp16 and FP8 per tensor with static scales
on sm_90+, FP8 128x128 blocks on sm_90; the weights converted once per shape as vLLM converts
them, FlashInfer's autotuner run once per shape) and stored as ``flashinfer_cutlass``, also a
candidate only inside vLLM; it is checked against the reference like every candidate.

FP8 (``quant`` fp8_tensor, fp8_channel, fp8_block128): the inputs are ``swapmoe bench
--quant``'s (e4m3 weight copies with absmax/448 scales per expert, output row or 128x128
block; fp8_tensor's static activation scales from a calibration sample, the others dynamic),
the candidates swapmoe's FP8 backends (cuda_decode, cuda_wgmma_swap, cuda_wgmma (token tiles 64
and 128), cuda_generic: cuda_mma has no FP8 kernels) and, when vLLM imports, vLLM's Triton ``fused_experts`` with the same weights and
scales (``fp8_w8a8_moe_quant_config``). The tables are the FP8 ones the oracle reads
(``dtype=fp8_w8a8[,per_channel=true|,block_shape=[128,128]]``); their metadata has ``quant``.
An entry (bf16 or FP8) with no ``vllm_triton`` time cannot say swapmoe is faster than vLLM's
Triton: inside vLLM the oracle decides such calls as untabled ones (vLLM's Triton outside the
range where swapmoe's heuristic pick measured faster at every shipped H200 shape), with the
entry's pick as swapmoe's choice; outside vLLM the entry's pick runs. The run says so when
vLLM is not timed.

The table file is rewritten after every M point, so an interrupted run keeps what it
measured; running again skips the M points already in the file (``--force`` re-measures).

The pure parts (labels, which points to run, pruning, entries, merging, writing) need no GPU
and are unit-tested; :func:`run_tune` is the GPU part.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from . import bench as B

SCHEMA = "swapmoe.table/1"
#: the default sweep
DEFAULT_M: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SWAPMOE_BACKENDS: Tuple[str, ...] = ("cuda_decode", "cuda_wgmma_swap", "cuda_mma", "cuda_wgmma", "cuda_generic")
MMA_TILES: Tuple[int, ...] = (16, 64, 128)
WGMMA_TILES: Tuple[int, ...] = (64, 128)
VLLM_LABEL = "vllm_triton"
#: SIMT backends whose cost against the best grows with M: once one is more than
#: ``prune`` times the best at some M, it is not timed at larger M (the tensor-core path is
#: never pruned: at M=1 it can lose 2x and still win from M=8 on)
PRUNABLE: Tuple[str, ...] = ("cuda_decode", "cuda_generic")
DEFAULT_PRUNE = 2.0
ENV_BACKEND = "SWAPMOE_BACKEND"
ENV_TILE = "SWAPMOE_MMA_TOKEN_TILE"
ENV_TABLES = "SWAPMOE_TABLES_DIR"
ENV_SWAP_RING = "SWAPMOE_SWAP_GEMM1_RING"
ENV_SWAP_GEMM2_PDL = "SWAPMOE_SWAP_GEMM2_PDL"
ENV_SWAP_GEMM2_RING = "SWAPMOE_SWAP_GEMM2_RING"
#: cuda_wgmma_swap's launch variants (bf16/fp16, and FP8 since its e4m3 GEMM1 takes a ring
#: too) timed besides its rules (label suffix ``r<GEMM1 ring>p<GEMM2 by PDL>``; ring 0 is the
#: kernel's own): more GEMM1 CTAs per SM
#: stream faster alone but leave GEMM2 (started under GEMM1 by PDL) less room, so which pair
#: wins depends on the shape (H200, benches/NOTES.md "Swap launch variants": qwen3-30b-a3b
#: M = 8-16 1.6-1.8% faster with r2p0, deepseek-v3-tp8 M = 8, 32 0.7-1% with r3p1)
SWAP_LAUNCH_VARIANTS: Tuple[str, ...] = ("r2p0", "r2p1", "r3p0", "r3p1")
#: FP8 only (the e4m3 GEMM2s take their ring at launch; the bf16/fp16 one's is fixed): GEMM1
#: as its own ring, GEMM2 by PDL with a ring of 5 or 7 (suffix ``g<ring>``). Where GEMM2's CTAs
#: prefetch beside GEMM1, a smaller ring lets more of them start there and leaves GEMM1 more
#: bandwidth (deepseek-v3-tp8 fp8_tensor M = 1 / 2: ring 7 23.3 / 37.3 µs against 24.0 / 38.2
#: with its own 11) but costs where a CTA has many k-stages (qwen3-30b-a3b M = 2: +1.0 µs)
#: (H200, benches/NOTES.md "The e4m3 swap GEMM2 ring"; the stamps of "Ring cursor, FP8
#: launch-variant tables, ..." show the gain is GEMM1's), so tables pick it per shape
SWAP_GEMM2_RING_VARIANTS: Tuple[str, ...] = ("r0p1g5", "r0p1g7")
#: largest M the variants are timed at (token tiles 8-32; at 64 one CTA fits an SM)
SWAP_LAUNCH_MAX_M = 32


#: swapmoe backends with FP8 kernels (cuda_mma has none; the oracle refuses it for FP8);
#: cuda_wgmma_swap's and cuda_wgmma's need bf16/fp16 activations and Hopper (and cuda_wgmma
#: with 128x128 blocks N a multiple of 128: the oracle says so per shape)
FP8_BACKENDS: Tuple[str, ...] = ("cuda_decode", "cuda_wgmma_swap", "cuda_wgmma", "cuda_generic")
#: FP8 needs native e4m3 conversions (the oracle refuses FP8 below sm_89)
FP8_MIN_CAPABILITY = (8, 9)
#: where vLLM 0.33 builds the quant config its fused_experts takes for FP8 W8A8
VLLM_FP8_QUANT_CONFIG = "vllm.model_executor.layers.fused_moe.config.fp8_w8a8_moe_quant_config"
#: ||out - ref|| / ||ref|| bound for vLLM's FP8 against swapmoe's FP8 reference. vLLM rounds
#: GEMM1's output and the intermediate to the activation dtype before quantizing, and its
#: quantizers need not break e4m3 ties as swapmoe's do; a single flipped activation code moves
#: an absmax and re-rounds its whole group, so two correct W8A8 implementations differ by about
#: the e4m3 rounding itself (1-2e-2: e.g. a reciprocal-multiply scale against a division, qwen3
#: M=1, benches/NOTES.md FP8 v1). 5e-2 still catches wrong scales or layouts (errors of O(1)).
VLLM_FP8_TOLERANCE = 5e-2
#: FlashInfer's CUTLASS fused MoE as vLLM's ``FlashInferExperts`` runs it
#: (``experts/flashinfer_cutlass_moe.py``): a candidate only for callers inside vLLM
FLASHINFER_LABEL = "flashinfer_cutlass"
#: the function vLLM's ``FlashInferExperts.apply`` calls (through ``vllm.utils.flashinfer``)
FLASHINFER_FUSED_MOE = "flashinfer.fused_moe.cutlass_fused_moe"
#: ``tune_max_num_tokens`` as vLLM passes it: its largest CUDA-graph capture size, by default
#: min(2 * max_num_seqs, 512) = 512; FlashInfer's autotuner profiles token buckets up to it
FLASHINFER_TUNE_MAX_TOKENS = 512
#: the offset added to the tune's seed for the autotuning call's inputs (routing and x), so
#: that they are not the timed points' own
FLASHINFER_AUTOTUNE_SEED_OFFSET = 3_000_017
#: FlashInfer's FP8 per-tensor kernels need the intermediate size a multiple of 16 (TMA's
#: 128-bit alignment of e4m3 rows); vLLM pads gate and up to it (``align_moe_weights_for_fi``)
FLASHINFER_FP8_N_ALIGN = 16
#: K and N alignment of the bf16/fp16 kernels (128 bits of 16-bit elements); vLLM pads nothing there
FLASHINFER_BF16_ALIGN = 8
#: vLLM clamps 128x128 block scales to this before FlashInfer's CUTLASS kernel (Hopper gives
#: NaN for near-zero scales, ``prepare_fp8_moe_layer_for_fi``)
FLASHINFER_MIN_BLOCK_SCALE = 1e-10
#: FlashInfer's FP8 against swapmoe's FP8 reference: it rounds the intermediate its own way,
#: as vLLM's Triton does (:data:`VLLM_FP8_TOLERANCE`); gate and up or scales of the wrong
#: tensor give O(1) errors, but 128x128 block scales of gate and up swapped wrongly differ by
#: <1% on random weights (tests pin that conversion instead)
FLASHINFER_FP8_TOLERANCE = VLLM_FP8_TOLERANCE
#: where vLLM's static per-tensor activation quantizer lives (its prepare step runs it
#: before FlashInfer's FP8 kernel, which takes e4m3 activations)
VLLM_SCALED_FP8_QUANT = "vllm._custom_ops.scaled_fp8_quant"


class TuneError(B.BenchError):
    """A tune request that cannot run (no GPU, bad folder, a table that cannot be merged)."""


class DeviceLost(TuneError):
    """The device cannot go on (a sticky CUDA error): the run stops, the table keeps the M
    points written so far."""


# --------------------------------------------------------------------------------------
# Pure parts
# --------------------------------------------------------------------------------------


def candidate_label(backend: str, tile: Optional[int] = None) -> str:
    """``cuda_mma:t64`` for a tensor-core tile, else the backend name (the labels of a
    table's ``times_us``)."""
    return f"{backend}:t{tile}" if tile else backend


def _swap_launch_parts(label: str) -> Optional[Tuple[int, bool, Optional[int]]]:
    """``"cuda_wgmma_swap:r0p1g7"`` -> (0, True, 7); the GEMM2 ring None without ``g``; None
    for a label that is not a swap launch (the grammar of ``SwapLaunch::parse``)."""
    backend, sep, v = label.partition(":")
    if backend != "cuda_wgmma_swap" or not sep or not v.startswith("r") or "p" not in v:
        return None
    ring, _, rest = v[1:].partition("p")
    pdl, g, ring2 = rest.partition("g")
    if not ring.isdigit() or int(ring) == 1 or pdl not in ("0", "1"):
        return None
    if g and (not ring2.isdigit() or int(ring2) == 1):
        return None
    return int(ring), pdl == "1", (int(ring2) if g else None)


def swap_launch(label: str) -> Optional[Tuple[int, bool]]:
    """``"cuda_wgmma_swap:r2p0"`` -> (2, False): GEMM1's ring and whether GEMM2 starts by
    PDL (also for a label with a GEMM2 ring, :func:`swap_gemm2_ring`); None for every other
    label."""
    parts = _swap_launch_parts(label)
    return None if parts is None else (parts[0], parts[1])


def swap_gemm2_ring(label: str) -> Optional[int]:
    """``"cuda_wgmma_swap:r0p1g7"`` -> 7: the e4m3 GEMM2's ring a launch label names (0: its
    own); None where it names none (the oracle's rule) or is not a swap launch."""
    parts = _swap_launch_parts(label)
    return None if parts is None else parts[2]


def entry_label(entry: dict) -> str:
    """The label of an entry's own choice (backend, token tile, swap launch)."""
    if entry.get("swap_gemm1_ring") is not None:
        g = f"g{entry['swap_gemm2_ring']}" if entry.get("swap_gemm2_ring") is not None else ""
        return f"{entry['backend']}:r{entry['swap_gemm1_ring']}p{int(bool(entry.get('swap_gemm2_pdl')))}{g}"
    return candidate_label(entry["backend"], entry.get("token_tile"))


def set_choice(entry: dict, label: str) -> dict:
    """Makes ``label`` the entry's own choice: its ``backend``, and ``token_tile`` or
    ``swap_gemm1_ring`` / ``swap_gemm2_pdl`` (/ ``swap_gemm2_ring``) where the label has them
    (removed where it has not). Returns the entry."""
    backend, tile = parse_label(label)
    entry["backend"] = backend
    if tile:
        entry["token_tile"] = tile
    else:
        entry.pop("token_tile", None)
    launch = swap_launch(label)
    if launch:
        entry["swap_gemm1_ring"], entry["swap_gemm2_pdl"] = launch
    else:
        entry.pop("swap_gemm1_ring", None)
        entry.pop("swap_gemm2_pdl", None)
    ring2 = swap_gemm2_ring(label)
    if ring2 is not None:
        entry["swap_gemm2_ring"] = ring2
    else:
        entry.pop("swap_gemm2_ring", None)
    return entry


def parse_label(label: str) -> Tuple[str, Optional[int]]:
    """``"cuda_mma:t64"`` -> ("cuda_mma", 64); ``"cuda_decode"`` -> ("cuda_decode", None);
    ``"cuda_wgmma_swap:r2p0"`` -> ("cuda_wgmma_swap", None) (its launch: :func:`swap_launch`)."""
    if swap_launch(label):
        return label.partition(":")[0], None
    backend, sep, tile = label.partition(":t")
    if sep and tile.isdigit():
        return backend, int(tile)
    return label, None


def swapmoe_candidates(dtype: str, quant: str = "none") -> List[str]:
    """Every swapmoe candidate for a dtype: decode, the Hopper swap-AB decode kernels, each
    tensor-core tile and the Hopper wgmma GEMMs (bf16/fp16), generic; for an FP8 ``quant`` the
    backends with FP8 kernels (decode; for bf16/fp16 the swap-AB e4m3 kernels with their launch
    variants and each tile of the e4m3 wgmma GEMMs; generic).
    Candidates the device cannot run are skipped with the oracle's reason."""
    if quant != "none":
        labels = ["cuda_decode"]
        if dtype in ("bf16", "fp16"):
            labels.append("cuda_wgmma_swap")
            labels += [f"cuda_wgmma_swap:{v}" for v in SWAP_LAUNCH_VARIANTS + SWAP_GEMM2_RING_VARIANTS]
            labels += [candidate_label("cuda_wgmma", t) for t in WGMMA_TILES]
        labels.append("cuda_generic")
        return labels
    labels = ["cuda_decode"]
    if dtype in ("bf16", "fp16"):
        labels.append("cuda_wgmma_swap")
        labels += [f"cuda_wgmma_swap:{v}" for v in SWAP_LAUNCH_VARIANTS]
        labels += [candidate_label("cuda_mma", t) for t in MMA_TILES]
        labels += [candidate_label("cuda_wgmma", t) for t in WGMMA_TILES]
    labels.append("cuda_generic")
    return labels


def table_entries(table: Optional[dict]) -> Dict[int, dict]:
    """The M entries of a table (its integer keys)."""
    out: Dict[int, dict] = {}
    for k, v in (table or {}).items():
        if k.isdigit() and isinstance(v, dict):
            out[int(k)] = v
    return out


def points_to_run(ms: Sequence[int], table: Optional[dict], force: bool = False) -> List[int]:
    """The M points of ``ms`` to measure: all with ``force``, else those not in ``table``."""
    have = set() if force else set(table_entries(table))
    return [m for m in sorted(set(ms)) if m not in have]


def pruned(label: str, M: int, entries: Dict[int, dict], factor: float = DEFAULT_PRUNE) -> Optional[str]:
    """Why ``label`` is not timed at ``M``: a prunable backend that was more than ``factor``
    times the best time at a smaller M of ``entries`` (None: time it). ``factor`` <= 0 never
    prunes."""
    if factor <= 0 or parse_label(label)[0] not in PRUNABLE:
        return None
    for m in sorted(entries):
        if m >= M:
            break
        times = entries[m].get("times_us") or {}
        if label in times and times:
            best = min(times.values())
            if best > 0 and times[label] > factor * best:
                return f"pruned: {times[label] / best:.1f}x the best at M={m} (> {factor:g}x)"
    return None


def make_entry(times: Dict[str, float], skipped: Optional[Dict[str, str]] = None,
               source: str = "") -> dict:
    """A table entry from the measured times (label -> µs): the fastest label becomes the
    backend (and token tile), ``times_us`` keeps every label fastest first, ``skipped``
    says why the others were not timed."""
    if not times:
        raise ValueError("make_entry: no measured candidate")
    ordered = sorted(times.items(), key=lambda kv: kv[1])
    best, best_us = ordered[0]
    entry: Dict[str, Any] = set_choice({}, best)
    entry["time_us"] = round(best_us, 2)
    entry["times_us"] = {k: round(v, 2) for k, v in ordered}
    swapmoe_best = next((k for k, _ in ordered if parse_label(k)[0] in SWAPMOE_BACKENDS), None)
    if swapmoe_best and swapmoe_best != best:
        entry["best_swapmoe"] = swapmoe_best
    if skipped:
        entry["skipped"] = dict(sorted(skipped.items()))
    if source:
        entry["source"] = source
    return entry


#: metadata keys that must agree for two runs to share a table file
IDENTITY = ("E", "N", "K", "topk", "device_name", "dtype", "quant")


def compatible(old_meta: dict, new_meta: dict) -> Optional[str]:
    """None when a table with ``old_meta`` can take entries measured with ``new_meta``, else
    what differs."""
    diff = [f"{k}={old_meta.get(k)!r} (this run {new_meta.get(k)!r})" for k in IDENTITY
            if k in old_meta and old_meta.get(k) != new_meta.get(k)]
    return ", ".join(diff) if diff else None


def merge_table(old: Optional[dict], new_entries: Dict[int, dict], meta: dict) -> dict:
    """The table after a run: ``meta`` (keeping the old ``created`` date and run count),
    then the old entries with the new ones replacing those of the same M, sorted by M."""
    old = old or {}
    old_meta: dict = old["metadata"] if isinstance(old.get("metadata"), dict) else {}
    m = dict(meta)
    m["created"] = old_meta.get("created") or meta.get("created") or meta.get("date")
    m["runs"] = int(old_meta.get("runs") or 0) + 1
    entries = table_entries(old)
    entries.update(new_entries)
    out: Dict[str, Any] = {"metadata": m}
    for k in sorted(entries):
        out[str(k)] = entries[k]
    return out


def put_entry(table: dict, M: int, entry: dict) -> dict:
    """``table`` with ``entry`` at M (replacing one there), entries sorted by M after the
    other keys."""
    entries = table_entries(table)
    entries[M] = entry
    out = {k: v for k, v in table.items() if not k.isdigit()}
    for k in sorted(entries):
        out[str(k)] = entries[k]
    return out


def read_json_table(path: str) -> Optional[dict]:
    """The JSON object of ``path``, None when there is no file; :class:`TuneError` when it is
    not a JSON object."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise TuneError(f"{path}: cannot be read as JSON ({e}); remove it or pass --force to replace it") from None
    if not isinstance(data, dict):
        raise TuneError(f"{path}: expected a JSON object; remove it or pass --force to replace it")
    return data


def write_table(path: str, table: dict) -> None:
    """Writes ``table`` to ``path`` atomically (a temporary file renamed over it)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def file_spelling(name: str) -> str:
    """The on-disk spelling of a table name: vLLM's ``,`` separators written as ``;``, because
    a wheel's RECORD is CSV and maturin does not quote commas, so a tuned file can be shipped
    in ``python/swapmoe/tables/`` as is. The oracle reads both spellings as one name."""
    return name.replace(",", ";")


def table_path(out_dir: str, name: str) -> str:
    """Where the table ``name`` lives in ``out_dir``: an existing file in either spelling
    (so a run resumes it), else the ``;`` spelling."""
    for candidate in (file_spelling(name), name):
        path = os.path.join(out_dir, candidate)
        if os.path.exists(path):
            return path
    return os.path.join(out_dir, file_spelling(name))


def resolve_out_dir(out_dir: Optional[str]) -> str:
    """``--out-dir``, else ``$SWAPMOE_TABLES_DIR``; created if missing. Never the package's
    own tables folder unless named explicitly."""
    d = out_dir or os.environ.get(ENV_TABLES)
    if not d:
        raise TuneError(f"--out-dir: name a folder for the tables (or set ${ENV_TABLES}); then point "
                        f"${ENV_TABLES} at it so that the oracle reads them")
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise TuneError(f"--out-dir: cannot create {d} ({e.strerror or e})") from None
    if not os.access(d, os.W_OK):
        raise TuneError(f"--out-dir: {d} is not writable")
    return d


def table_metadata(shape: B.MoeShape, dtype: str, device_name: str, capability: Tuple[int, int],
                   layers: int, seed: int, timer: str, versions: Dict[str, Optional[str]],
                   quant: str = "none") -> dict:
    """The ``metadata`` of a table measured by this run: ``dtype`` is the activation dtype,
    ``quant`` the FP8 scheme (None unquantized; the file name carries it as vLLM's
    ``dtype=fp8_w8a8...`` key)."""
    from . import __version__

    today = datetime.date.today().isoformat()
    inputs = ""
    if quant != "none":
        scheme = B.FP8_SCHEMES[quant]
        inputs = ("; FP8 inputs as swapmoe bench --quant: e4m3 weights, scale absmax/448 per "
                  + {"tensor": "expert", "channel": "output row", "block": "128x128 block"}[scheme]
                  + ("; static activation scales from a 256-token calibration sample" if scheme == "tensor"
                     else "; dynamic activation scales"))
    return {
        "schema": SCHEMA,
        "E": shape.E, "N": shape.N, "K": shape.K, "topk": shape.topk,
        "E_global": shape.E_global, "tp": shape.tp, "ep": shape.ep, "model": shape.name,
        "device_name": device_name, "device_capability": f"{capability[0]}.{capability[1]}",
        "dtype": dtype, "quant": None if quant == "none" else quant,
        # which FP8 calls the table describes (the oracle skips it for the other kind)
        "activation_scales": None if quant == "none" else ("static" if B.FP8_SCHEMES[quant] == "tensor" else "dynamic"),
        "swapmoe_version": __version__, "date": today, "created": today,
        "method": (f"swapmoe tune: {timer}; CUDA graph of {layers} calls on distinct weight copies, "
                   f"time / {layers} per call; uniform routing topk(softmax(randn(M, E))), seed {seed}; "
                   f"each candidate forced with ${ENV_BACKEND} / ${ENV_TILE}{inputs}"),
        "versions": versions,
        "generated_by": "swapmoe tune",
    }


@contextlib.contextmanager
def forced(label: str) -> Iterator[None]:
    """Forces the candidate ``label`` for the swapmoe calls inside (env vars, restored)."""
    backend, tile = parse_label(label)
    launch = swap_launch(label)
    ring2 = swap_gemm2_ring(label)
    saved = {k: os.environ.get(k) for k in (ENV_BACKEND, ENV_TILE, ENV_SWAP_RING, ENV_SWAP_GEMM2_PDL,
                                            ENV_SWAP_GEMM2_RING)}
    os.environ[ENV_BACKEND] = backend
    if tile:
        os.environ[ENV_TILE] = str(tile)
    else:
        os.environ.pop(ENV_TILE, None)
    if launch:
        os.environ[ENV_SWAP_RING] = str(launch[0])
        os.environ[ENV_SWAP_GEMM2_PDL] = "1" if launch[1] else "0"
    else:
        os.environ.pop(ENV_SWAP_RING, None)
        os.environ.pop(ENV_SWAP_GEMM2_PDL, None)
    if ring2 is not None:
        os.environ[ENV_SWAP_GEMM2_RING] = str(ring2)
    else:
        os.environ.pop(ENV_SWAP_GEMM2_RING, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ineligible(label: str, M: int, shape: B.MoeShape, dtype: str, device_name: str,
               capability: Tuple[int, int], quant: str = "none") -> Optional[str]:
    """Why the oracle cannot run ``label`` at ``M`` (None: it can)."""
    from . import _core
    from .errors import Error

    if swap_launch(label) and M > SWAP_LAUNCH_MAX_M:
        return f"cuda_wgmma_swap's launch variants are timed at M <= {SWAP_LAUNCH_MAX_M}"

    with forced(label):
        try:
            plan = _core.select_backend(M, shape.E, shape.topk, shape.K, shape.N, dtype=dtype,
                                        quant=None if quant == "none" else quant,
                                        device_capability=capability, device_name=device_name,
                                        global_num_experts=shape.E_global)
        except Error as e:
            return str(e)
    ring2 = swap_gemm2_ring(label)
    if ring2 is not None and plan["tile"].get("swap_gemm2_ring") != ring2:
        # the plan does not run the ring the label names (the bf16/fp16 GEMM2, a GEMM2 one per
        # SM, a ring past the kernel's own): timing it would record the label for another plan
        why = [r for r in plan["reasons"] if "SWAPMOE_SWAP_GEMM2_RING" in r]
        return (f"its GEMM2 ring of {ring2} is not what the plan runs "
                f"({plan['tile'].get('swap_gemm2_ring')}): " + "; ".join(why))
    return None


# --------------------------------------------------------------------------------------
# The sweep (device-independent: a runner measures)
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class ShapePlan:
    """One shape of a run: its table file, the metadata this run writes, the table already
    there (None: a new file) and the M points to measure."""

    shape: B.MoeShape
    path: str
    meta: dict
    old: Optional[dict]
    todo: List[int]


class Runner:
    """What :func:`sweep` needs from a device. :class:`GpuRunner` is the real one; tests
    use a fake."""

    #: candidate labels, swapmoe's then the external ones
    labels: List[str] = []

    def start_shape(self, shape: B.MoeShape) -> None:
        """Allocates what the shape needs (weights)."""

    def end_shape(self) -> None:
        """Frees it."""

    def inputs(self, shape: B.MoeShape, M: int) -> Any:
        """The activations and routing of one M point."""

    def ineligible(self, label: str, shape: B.MoeShape, M: int) -> Optional[str]:
        """Why ``label`` cannot run the point (None: it can)."""
        return None

    def check(self, labels: Sequence[str], inputs: Any) -> Dict[str, Optional[str]]:
        """label -> None when its output matches the float64 reference, else why not."""
        return {lb: None for lb in labels}

    def time_us(self, label: str, inputs: Any) -> Tuple[float, str]:
        """(µs per call, how it was timed); raises when the candidate fails."""
        raise NotImplementedError


def prepare(shapes: Sequence[B.MoeShape], out_dir: str, ms: Sequence[int], force: bool, meta_of: Callable,
            file_name: Callable, say: Callable[[str], None] = lambda s: None) -> List[ShapePlan]:
    """Which table file each shape goes to and which of ``ms`` it still needs: existing
    entries are kept (``force``: re-measured); a file measured with another K or topk, or
    not JSON, is an error unless ``force`` (which replaces it)."""
    plans = []
    for shape in shapes:
        path = table_path(out_dir, file_name(shape))
        meta = meta_of(shape)
        old = None
        try:
            old = read_json_table(path)
        except TuneError:
            if not force:
                raise
            say(f"{path}: not a JSON object, replaced (--force)")
        if old is not None:
            diff = compatible(old.get("metadata") or {}, meta)
            if diff:
                if not force:
                    raise TuneError(f"{path} was measured with {diff}; use another --out-dir, or --force to "
                                    "replace it")
                say(f"{path} was measured with {diff}: replaced (--force)")
                old = None
        todo = points_to_run(ms, old, force)
        done = sorted(set(ms) - set(todo))
        if done:
            say(f"{shape.name}: M={','.join(map(str, done))} already in {path}, skipped (--force re-measures)")
        plans.append(ShapePlan(shape, path, meta, old, todo))
    return plans


def sweep(plans: Sequence[ShapePlan], runner: Runner, *, check: bool = True, prune: float = DEFAULT_PRUNE,
          bar: Any = None, say: Callable[[str], None] = lambda s: None) -> List[dict]:
    """Measures every point of every plan with ``runner``; the table file is rewritten after
    each M. Returns one summary per shape ({"shape", "path", "measured", "skipped_m",
    "entries"})."""
    summaries = []
    for sp in plans:
        shape = sp.shape
        summary: Dict[str, Any] = {"shape": shape.describe(), "path": sp.path, "measured": [],
                                   "skipped_m": sorted(set(table_entries(sp.old)) - set(sp.todo)), "entries": {}}
        summaries.append(summary)
        if not sp.todo:
            continue
        if bar is not None:
            bar.set_description(f"tune {shape.name}")
        runner.start_shape(shape)
        try:
            dropped: Dict[str, str] = {}
            entries = table_entries(sp.old)
            table = merge_table(sp.old, {}, sp.meta)  # this run's metadata, written with the first entry
            for i_m, M in enumerate(sp.todo):
                inputs = runner.inputs(shape, M)
                skipped: Dict[str, str] = dict(dropped)
                runnable, pruned_here = [], []
                for lb in runner.labels:
                    if lb in dropped:
                        continue
                    why = runner.ineligible(lb, shape, M)
                    if why is None:
                        why = pruned(lb, M, entries, prune)
                        if why:
                            pruned_here.append(lb)
                    if why:
                        skipped[lb] = why
                    else:
                        runnable.append(lb)
                if not runnable and pruned_here:
                    # pruning is for candidates that others beat; where no other can run M
                    # (past the swap and decode kernels' token limits), the pruned ones are
                    # all the table can have
                    runnable = pruned_here
                    for lb in pruned_here:
                        skipped[f"{lb} (note)"] = f"timed although {skipped.pop(lb)}: no other candidate runs M={M}"
                if check and i_m == 0:
                    for lb, bad in runner.check(runnable, inputs).items():
                        if bad:
                            dropped[lb] = skipped[lb] = f"dropped for this shape: {bad}"
                            runnable.remove(lb)
                            say(f"{shape.name}: {lb} dropped, {bad}")
                times: Dict[str, float] = {}
                for lb in runnable:
                    try:
                        us, how = runner.time_us(lb, inputs)
                    except DeviceLost:
                        raise
                    except Exception as e:
                        skipped[lb] = f"failed: {B._err(e, 300)}"
                        say(f"{shape.name} M={M}: {lb} failed: {B._err(e, 300)}")
                        continue
                    times[lb] = us
                    if how != "graph":
                        skipped[f"{lb} (note)"] = f"timed as {how}"
                if bar is not None:
                    bar.update(len(runner.labels))
                if not times:
                    say(f"{shape.name} M={M}: no candidate could be timed: {skipped}")
                    continue
                entry = make_entry(times, skipped, source=f"swapmoe tune {sp.meta.get('swapmoe_version')}, "
                                                          f"{sp.meta.get('date')}")
                entries[M] = entry
                table = put_entry(table, M, entry)
                write_table(sp.path, table)
                summary["measured"].append(M)
                summary["entries"][M] = entry
        finally:
            runner.end_shape()
    return summaries




# --------------------------------------------------------------------------------------
# The GPU run
# --------------------------------------------------------------------------------------


def _swapmoe_impl(label: str) -> Callable:
    def impl(x, w1, w2, tw, ids, emap, out, fp8=None):
        with forced(label):
            return B.impl_swapmoe(x, w1, w2, tw, ids, emap, out, fp8=fp8)

    return impl


def load_vllm_fp8_quant_config() -> Tuple[Optional[Callable], str]:
    """(vLLM's ``fp8_w8a8_moe_quant_config``, "") or (None, why not)."""
    try:
        _, fn = B.import_quietly(VLLM_FP8_QUANT_CONFIG)
    except Exception as e:  # not installed, or installed and broken
        return None, f"vllm: {VLLM_FP8_QUANT_CONFIG.rpartition('.')[0]} not importable ({B._err(e)})"
    if not callable(fn):
        return None, f"vllm: {VLLM_FP8_QUANT_CONFIG} not found"
    return fn, ""


def vllm_fp8_config_kwargs(fp8: dict) -> dict:
    """The keyword arguments of vLLM's ``fp8_w8a8_moe_quant_config`` for swapmoe's FP8 keyword
    arguments (:func:`swapmoe.bench.fp8_kwargs`): per-channel weight scales as vLLM's FP8
    layers hold them ([E, rows, 1]), per-token activations with them; block scales as is."""
    channel = bool(fp8.get("per_channel_quant"))
    w1s, w2s = fp8["w1_scale"], fp8["w2_scale"]
    if channel:
        w1s, w2s = w1s.unsqueeze(-1), w2s.unsqueeze(-1)
    return {"w1_scale": w1s, "w2_scale": w2s, "a1_scale": fp8.get("a1_scale"), "a2_scale": fp8.get("a2_scale"),
            "per_act_token_quant": channel, "per_out_ch_quant": channel,
            "block_shape": list(fp8["block_shape"]) if fp8.get("block_shape") is not None else None}


def make_vllm_fp8_impl(fused_experts: Callable, quant_config: Callable) -> Callable:
    """An implementation that calls vLLM's ``fused_experts(..., quant_config=...)`` on the e4m3
    weights with the scales of ``fp8=`` (one config per weight copy, built on first use, so
    no config is built inside a captured graph); output handling as
    :func:`swapmoe.bench.make_vllm_impl`."""
    configs: Dict[int, Any] = {}

    def impl_vllm_fp8(x, w1, w2, tw, ids, emap, out, fp8=None):
        if not fp8:
            raise TuneError("vllm_triton FP8: no FP8 scales given")
        key = id(fp8["w1_scale"])
        if key not in configs:
            configs[key] = quant_config(**vllm_fp8_config_kwargs(fp8))
        kw = {} if emap is None else {"expert_map": emap, "global_num_experts": emap.numel()}
        y = fused_experts(x, w1, w2, tw, ids, quant_config=configs[key], **kw)
        return y if out is None else out.copy_(y)

    return impl_vllm_fp8


# --------------------------------------------------------------------------------------
# FlashInfer's CUTLASS fused MoE, as vLLM's FlashInferExperts runs it
# --------------------------------------------------------------------------------------
#
# What vLLM does (read from its source: experts/flashinfer_cutlass_moe.py FlashInferExperts,
# oracle/fp8.py convert_to_fp8_moe_kernel_format and make_fp8_moe_quant_config,
# oracle/unquantized.py convert_to_unquantized_kernel_format, quantization/utils/
# flashinfer_utils.py prepare_fp8_moe_layer_for_fi), written here in our own code:
# - once, at weight loading: w13's halves swapped to [up, gate] (FlashInfer's SwiGLU takes
#   the up rows first); FP8 per tensor also pads gate and up to a multiple of 16 rows;
#   FP8 128x128 blocks swap w13's block scales the same way and clamp all block scales to
#   at least 1e-10;
# - FP8 per tensor: quant_scales = [w13_scale * a1_scale (per expert), 1 / a2_scale,
#   w2_scale * a2_scale (per expert), a1_scale]; the activations reach FlashInfer already
#   e4m3 (vLLM's prepare step quantizes them with the static a1_scale); 128x128 blocks:
#   quant_scales = [w13 block scales, w2 block scales], bf16 activations,
#   use_deepseek_fp8_block_scale=True (sm_90 only); unquantized: quant_scales = [];
# - each call: cutlass_fused_moe(input, topk_ids (int32), topk_weights, w31, w2,
#   output=..., output_dtype, quant_scales, tp/ep size and rank, tune_max_num_tokens), the
#   global expert ids with ep_size / ep_rank (no expert map), after FlashInfer's autotuner
#   profiled its tactics at start-up (vLLM's kernel_warmup.flashinfer_autotune).
# vLLM's FlashInferExperts supports (its _supports_quant_scheme): unquantized and FP8 per
# tensor with static scales on sm_90+, FP8 128x128 blocks (dynamic activations) on sm_90;
# not FP8 per channel.


@dataclasses.dataclass
class FlashInferApi:
    """What tune needs from flashinfer: ``cutlass_fused_moe``, its ``autotune`` context (None:
    default tactics) and the version."""

    fused_moe: Callable
    autotune: Optional[Callable]
    version: str


def load_flashinfer() -> Tuple[Optional[FlashInferApi], str]:
    """(the API, flashinfer's version) when :data:`FLASHINFER_FUSED_MOE` imports, else (None,
    the reason). Imported with stdout sent to stderr, as vLLM is."""
    try:
        fi, fn = B.import_quietly(FLASHINFER_FUSED_MOE)
    except Exception as e:  # not installed, or installed and broken
        return None, f"flashinfer not importable ({B._err(e)})"
    version = str(getattr(fi, "__version__", None) or B._version("flashinfer") or "unknown")
    if not callable(fn):
        return None, f"flashinfer {version}: {FLASHINFER_FUSED_MOE} not found"
    autotune = getattr(fi, "autotune", None)
    if not callable(autotune):
        try:
            _, autotune = B.import_quietly("flashinfer.autotuner.autotune")
        except Exception:
            autotune = None
    return FlashInferApi(fn, autotune if callable(autotune) else None, version), version


def flashinfer_unsupported(dtype: str, quant: str, capability: Tuple[int, int]) -> Optional[str]:
    """Why vLLM would not run FlashInfer's CUTLASS MoE for this dtype, quantization and
    device (None: it would), from ``FlashInferExperts._supports_current_device`` and
    ``_supports_quant_scheme``."""
    sm = f"sm_{capability[0]}{capability[1]}"
    if capability < (9, 0):
        return f"vLLM runs FlashInfer's CUTLASS MoE on sm_90 and newer, this device is {sm}"
    if dtype not in ("bf16", "fp16"):
        return f"vLLM runs FlashInfer's CUTLASS MoE for bf16/fp16 activations, not {dtype}"
    if quant == "fp8_channel":
        return ("vLLM's FlashInferExperts has no FP8 per-channel scheme (unquantized, FP8 per tensor with static "
                "scales, FP8 128x128 blocks on sm_90)")
    if quant == "fp8_block128" and capability != (9, 0):
        return f"FlashInfer's CUTLASS FP8 128x128-block MoE runs on sm_90 only, this device is {sm}"
    return None


def flashinfer_shape_unsupported(shape: B.MoeShape, quant: str) -> Optional[str]:
    """Why FlashInfer's CUTLASS MoE cannot run this shape as vLLM prepares it (None: it can):
    K (and, unquantized, N) a multiple of its TMA alignment; 128x128 blocks need K and N
    multiples of 128 (w13's block scales swap by halves); expert parallelism as vLLM's
    linear placement (rank 0 holds the first E experts)."""
    align = FLASHINFER_BF16_ALIGN if quant == "none" else FLASHINFER_FP8_N_ALIGN
    if shape.K % align:
        return f"K = {shape.K} is not a multiple of {align} (FlashInfer's TMA alignment)"
    if quant == "none" and shape.N % align:
        return f"N = {shape.N} is not a multiple of {align} (FlashInfer's TMA alignment; vLLM pads no bf16 weights)"
    if quant == "fp8_block128" and (shape.K % B.FP8_BLOCK or shape.N % B.FP8_BLOCK):
        return (f"K = {shape.K} and N = {shape.N} must be multiples of {B.FP8_BLOCK} for 128x128 blocks (w13's block "
                "scales are swapped by halves)")
    if shape.E * shape.ep != shape.E_global:
        return f"E_global = {shape.E_global} is not E * ep = {shape.E} * {shape.ep}"
    return None


def _byte_view(torch: Any, w: Any) -> Tuple[Any, Any]:
    """(``w`` viewed as uint8 when its elements are 1-byte floats (e4m3), else ``w``; the
    dtype to view results back as): copies and zero fills of e4m3 go through bytes, which
    every torch build supports."""
    if w.element_size() == 1 and w.is_floating_point():
        return w.view(torch.uint8), w.dtype
    return w, None


def swap_gate_up(torch: Any, w: Any) -> Any:
    """``w`` [E, 2R, C] with its two halves swapped, as a new contiguous tensor: vLLM's w13
    (gate rows then up rows, or their block scales) in the [up, gate] order FlashInfer's
    CUTLASS MoE takes (vLLM's ``swap_w13_to_w31``)."""
    if w.dim() != 3 or w.shape[1] % 2:
        raise TuneError(f"flashinfer_cutlass: expected w13 [E, 2R, C], got {tuple(w.shape)}")
    b, dt = _byte_view(torch, w)
    R = b.shape[1] // 2
    out = torch.cat((b[:, R:], b[:, :R]), dim=1).contiguous()
    return out if dt is None else out.view(dt)


def pad_gate_up(torch: Any, w13: Any, w2: Any, align: int) -> Tuple[Any, Any]:
    """(w13 [E, 2Np, K], w2 [E, K, Np]) with N padded to ``Np``, the next multiple of
    ``align``: gate in rows [0, N), up in rows [Np, Np + N), zeros elsewhere (zero gate and up
    rows add nothing), w2's new columns zero. ``w13``, ``w2`` as they are when N is a
    multiple already. (vLLM's ``align_moe_weights_for_fi`` copies w13 into the first 2N rows
    before swapping, which would move up rows into the gate half; the kernel needs each half
    padded, as here.)"""
    E, twoN, K = w13.shape
    N = twoN // 2
    Np = -(-N // align) * align
    if Np == N:
        return w13, w2
    b13, dt = _byte_view(torch, w13)
    b2, _ = _byte_view(torch, w2)
    p13 = torch.zeros(E, 2 * Np, K, dtype=b13.dtype, device=b13.device)
    p13[:, :N] = b13[:, :N]
    p13[:, Np:Np + N] = b13[:, N:]
    p2 = torch.zeros(E, b2.shape[1], Np, dtype=b2.dtype, device=b2.device)
    p2[:, :, :N] = b2
    return (p13, p2) if dt is None else (p13.view(dt), p2.view(dt))


def flashinfer_fp8_tensor_scales(torch: Any, w1_scale: Any, w2_scale: Any, a1_scale: Any, a2_scale: Any) -> List[Any]:
    """``quant_scales`` of FlashInfer's FP8 per-tensor MoE as vLLM builds them
    (``make_fp8_moe_quant_config`` for FLASHINFER_CUTLASS, ``FlashInferExperts.apply``):
    [GEMM1 dequant w1_scale * a1_scale [E], GEMM2 activation quant 1 / a2_scale (0-d), GEMM2
    dequant w2_scale * a2_scale [E], GEMM1 input dequant a1_scale (0-d)], float32."""
    f32 = torch.float32
    a1 = a1_scale.to(f32).reshape(())
    a2 = a2_scale.to(f32).reshape(())
    return [(w1_scale.to(f32).reshape(-1) * a1).contiguous(), (1.0 / a2).contiguous(),
            (w2_scale.to(f32).reshape(-1) * a2).contiguous(), a1.contiguous()]


@dataclasses.dataclass
class FlashInferWeights:
    """One weight copy as FlashInfer's CUTLASS MoE takes it (:func:`prepare_flashinfer_weights`)."""

    w13: Any
    w2: Any
    quant_scales: List[Any]
    #: FP8 per tensor: the static activation scale the activations are quantized with before
    #: the call (vLLM's prepare step) and its reciprocal; None otherwise
    a1_scale: Any = None
    a1_inv: Any = None
    #: 128x128 blocks (use_deepseek_fp8_block_scale)
    block: bool = False


def prepare_flashinfer_weights(torch: Any, w1: Any, w2: Any, quant: str,
                               fp8: Optional[dict] = None) -> FlashInferWeights:
    """One copy of swapmoe's weights (w1 [E, 2N, K] gate then up, w2 [E, K, N]; ``fp8`` the FP8
    keyword arguments of :func:`swapmoe.bench.fp8_kwargs`) converted as vLLM converts a layer's
    weights for FlashInfer's CUTLASS MoE (see the section's comment): done once per shape,
    never inside a timed call."""
    if quant == "none":
        return FlashInferWeights(swap_gate_up(torch, w1), w2, [])
    if not fp8:
        raise TuneError(f"flashinfer_cutlass {quant}: no FP8 scales given")
    scheme = B.FP8_SCHEMES[quant]
    if scheme == "tensor":
        a1, a2 = fp8.get("a1_scale"), fp8.get("a2_scale")
        if a1 is None or a2 is None:
            raise TuneError("flashinfer_cutlass fp8_tensor: vLLM runs FlashInfer's FP8 per-tensor MoE with static "
                            "activation scales only (a1_scale and a2_scale)")
        w13p, w2p = pad_gate_up(torch, w1, w2, FLASHINFER_FP8_N_ALIGN)
        scales = flashinfer_fp8_tensor_scales(torch, fp8["w1_scale"], fp8["w2_scale"], a1, a2)
        return FlashInferWeights(swap_gate_up(torch, w13p), w2p, scales, a1_scale=scales[3],
                                 a1_inv=(1.0 / scales[3]).contiguous())
    if scheme == "block":
        s1 = swap_gate_up(torch, fp8["w1_scale"].to(torch.float32)).clamp_min_(FLASHINFER_MIN_BLOCK_SCALE)
        s2 = fp8["w2_scale"].to(torch.float32).clamp_min(FLASHINFER_MIN_BLOCK_SCALE).contiguous()
        return FlashInferWeights(swap_gate_up(torch, w1), w2, [s1, s2], block=True)
    raise TuneError(f"flashinfer_cutlass: {quant} is not a scheme vLLM runs through FlashInfer")


def load_vllm_scaled_fp8_quant() -> Optional[Callable]:
    """vLLM's static per-tensor activation quantizer (``scaled_fp8_quant(x, scale)`` ->
    (e4m3, scale)), or None when vLLM's ops do not import."""
    try:
        _, fn = B.import_quietly(VLLM_SCALED_FP8_QUANT)
    except Exception:
        return None
    return fn if callable(fn) else None


def torch_static_fp8_quant(torch: Any) -> Callable:
    """``quantize(x, a1_scale, a1_inv)``: x times 1/a1_scale, clamped to +-448, as e4m3 (the
    torch stand-in for vLLM's fused quantizer: four kernels instead of one)."""
    f8 = torch.float8_e4m3fn

    def quantize(x, a1_scale, a1_inv):
        return x.to(torch.float32).mul_(a1_inv).clamp_(-B.FP8_MAX, B.FP8_MAX).to(f8)

    return quantize


class FlashInferCutlass:
    """The ``flashinfer_cutlass`` candidate: the weights of every copy are converted once per
    shape (:meth:`prepare`, outside the timed calls; looked up by the copy's w1), FlashInfer's
    autotuner profiles once per shape (:meth:`autotune_shape`), and each call is what vLLM's
    ``FlashInferExperts`` does inside vLLM: FP8 per tensor quantizes the activations with the
    static a1_scale (vLLM's prepare step), then ``cutlass_fused_moe`` writes ``out``."""

    def __init__(self, api: FlashInferApi, quant: str, quantize_input: Optional[Callable] = None):
        self.api, self.quant = api, quant
        #: (x, a1_scale, a1_inv) -> e4m3 x; None: :func:`torch_static_fp8_quant` on first use
        self.quantize_input = quantize_input
        self.prepared: Dict[int, FlashInferWeights] = {}
        self.tp = self.ep = 1

    def prepare(self, torch: Any, shape: B.MoeShape, weights: Sequence[Tuple[Any, Any]], qargs: Sequence[dict],
                emap: Any = None) -> None:
        """Converts every weight copy of the shape (raises :class:`TuneError` for an expert
        map that is not vLLM's linear placement of rank 0)."""
        if emap is not None:
            want = torch.full((shape.E_global,), -1, dtype=emap.dtype, device=emap.device)
            want[: shape.E] = torch.arange(shape.E, dtype=emap.dtype, device=emap.device)
            if not torch.equal(emap, want):
                raise TuneError("flashinfer_cutlass: the expert map is not rank 0's first E experts (FlashInfer "
                                "takes ep_size / ep_rank, not a map)")
        self.reset()
        self.tp, self.ep = shape.tp, shape.ep
        if self.quant == "fp8_tensor" and self.quantize_input is None:
            self.quantize_input = torch_static_fp8_quant(torch)
        for (w1, w2), q in zip(weights, qargs):
            if id(w1) not in self.prepared:
                self.prepared[id(w1)] = prepare_flashinfer_weights(torch, w1, w2, self.quant, q.get("fp8"))

    def reset(self) -> None:
        self.prepared = {}

    def autotune_shape(self, torch: Any, shape: B.MoeShape, weights: Tuple[Any, Any], dtype: Any, dev: Any,
                       seed: int, emap: Any = None) -> None:
        """Lets FlashInfer's autotuner profile its tactics for every token bucket up to
        :data:`FLASHINFER_TUNE_MAX_TOKENS` (one call of that many tokens, as vLLM's warm-up
        does), so the timed calls run the tactics vLLM would."""
        if self.api.autotune is None:
            return
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed + FLASHINFER_AUTOTUNE_SEED_OFFSET)
        M = FLASHINFER_TUNE_MAX_TOKENS
        tw, ids = B.make_routing(torch, M, shape.E_global, shape.topk, "uniform", gen, dev)
        x = torch.randn(M, shape.K, generator=gen, device=dev, dtype=dtype)
        with self.api.autotune(True):
            self(x, weights[0], weights[1], tw, ids, emap, None)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def __call__(self, x, w1, w2, tw, ids, emap, out, fp8=None):
        p = self.prepared.get(id(w1))
        if p is None:
            raise TuneError("flashinfer_cutlass: these weights were not prepared for FlashInfer (prepare() per shape)")
        inp = x if p.a1_scale is None else self.quantize_input(x, p.a1_scale, p.a1_inv)
        y = self.api.fused_moe(
            input=inp, token_selected_experts=ids.int(), token_final_scales=tw,
            fc1_expert_weights=p.w13, fc2_expert_weights=p.w2, output_dtype=x.dtype, quant_scales=p.quant_scales,
            output=out, tp_size=self.tp, tp_rank=0, ep_size=self.ep, ep_rank=0,
            use_deepseek_fp8_block_scale=p.block, tune_max_num_tokens=FLASHINFER_TUNE_MAX_TOKENS)
        return out if out is not None else y


class GpuRunner(Runner):
    """Measures on a CUDA device as ``swapmoe bench`` does."""

    def __init__(self, torch: Any, dev: Any, dtype: str, layers: int, seed: int, device_name: str,
                 capability: Tuple[int, int], vllm_fn: Optional[Callable], say: Callable[[str], None],
                 quant: str = "none"):
        self.torch, self.dev, self.dtype, self.layers, self.seed = torch, dev, dtype, layers, seed
        self.device_name, self.capability, self.say, self.quant = device_name, capability, say, quant
        self.tdtype = getattr(torch, B.DTYPES[dtype][0])
        self.timer = B.GpuTimer(torch, dev)
        self.impls: Dict[str, Tuple[Callable, bool]] = {lb: (_swapmoe_impl(lb), True)
                                                        for lb in swapmoe_candidates(dtype, quant)}
        if vllm_fn is not None:
            self.impls[VLLM_LABEL] = (vllm_fn, True)
        self.labels = list(self.impls)
        #: the flashinfer_cutlass candidate (:meth:`add_flashinfer`) and why it cannot run the
        #: current shape (None: it can)
        self.flashinfer: Optional[FlashInferCutlass] = None
        self.flashinfer_why: Optional[str] = None
        self.weights: List[Any] = []
        #: per copy, the extra keyword arguments of a call ({} unquantized, {"fp8": ...} FP8)
        self.qargs: List[dict] = []
        self.copies = 0
        self.emap: Any = None
        self.gen: Any = None

    def add_flashinfer(self, impl: FlashInferCutlass) -> None:
        """Registers FlashInfer's CUTLASS MoE as the candidate :data:`FLASHINFER_LABEL`."""
        self.flashinfer = impl
        self.impls[FLASHINFER_LABEL] = (impl, True)
        self.labels = list(self.impls)

    def start_shape(self, shape: B.MoeShape) -> None:
        torch = self.torch
        fp8 = self.quant != "none"
        bpw = B.weight_bytes_per_element(self.quant, self.dtype)
        self.flashinfer_why = None
        if self.flashinfer is not None:
            self.flashinfer_why = flashinfer_shape_unsupported(shape, self.quant)
            if self.flashinfer_why:
                self.say(f"{shape.name}: no {FLASHINFER_LABEL} times: {self.flashinfer_why}")
        # FlashInfer's converted copies (w13 at least) live beside swapmoe's: budget both
        fi_bpw = bpw if self.flashinfer is not None and self.flashinfer_why is None else 0
        self.copies, _, why = B.weight_copies(torch, shape, bpw + fi_bpw, self.layers, self.dev,
                                              self.quant if fp8 else self.dtype)
        if why:
            self.say(why)
        self._start_weights(shape)
        if self.flashinfer is not None and self.flashinfer_why is None:
            self._start_flashinfer(shape)

    def _start_flashinfer(self, shape: B.MoeShape) -> None:
        """Converts the copies for FlashInfer once for the shape and lets its autotuner
        profile; a failure makes the candidate ineligible for the shape, with the reason."""
        torch = self.torch
        try:
            self.flashinfer.prepare(torch, shape, self.weights, self.qargs, self.emap)
        except Exception as e:
            self.flashinfer.reset()
            self.flashinfer_why = f"converting the weights for FlashInfer failed: {B._err(e, 300)}"
            self.say(f"{shape.name}: no {FLASHINFER_LABEL} times: {self.flashinfer_why}")
            return
        if self.flashinfer.api.autotune is not None:
            self.say(f"{shape.name}: {FLASHINFER_LABEL}: FlashInfer's autotuner profiles its tactics for M <= "
                     f"{FLASHINFER_TUNE_MAX_TOKENS}, as vLLM's warm-up does (its first use also compiles its kernels)")
        try:
            self.flashinfer.autotune_shape(torch, shape, self.weights[0], self.tdtype, self.dev, self.seed, self.emap)
        except Exception as e:
            try:
                torch.cuda.synchronize()
            except Exception as sticky:
                raise DeviceLost(f"FlashInfer's autotuning broke the CUDA context ({B._err(sticky, 300)})") from e
            self.say(f"{shape.name}: FlashInfer's autotuner failed ({B._err(e, 300)}); {FLASHINFER_LABEL} is timed "
                     "with its default tactics")

    def _start_weights(self, shape: B.MoeShape) -> None:
        torch = self.torch
        fp8 = self.quant != "none"
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(self.seed + 1_000_003)
        self.emap = B.make_expert_map(torch, shape, self.dev)
        if not fp8:
            self.weights = [B.make_weights(torch, shape, self.tdtype, self.gen, self.dev)
                            for _ in range(self.copies)]
            self.qargs = [{}] * self.copies
            return
        # as swapmoe bench --quant builds them (bench.run_bench)
        self.weights, scales = [], []
        for _ in range(self.copies):
            w1q, w2q, s1, s2 = B.make_fp8_weights(torch, shape, self.tdtype, self.gen, self.dev, self.quant)
            self.weights.append((w1q, w2q))
            scales.append((s1, s2))
        a1 = a2 = None
        if B.FP8_SCHEMES[self.quant] == "tensor":
            w1q, w2q = self.weights[0]
            a1, a2, _ = B.calibrate_static_scales(torch, shape, w1q, w2q, B.fp8_kwargs(self.quant, *scales[0]),
                                                  self.tdtype, self.seed, self.dev, self.emap)
        self.qargs = [{"fp8": B.fp8_kwargs(self.quant, s1, s2, a1, a2)} for s1, s2 in scales]

    def end_shape(self) -> None:
        self.weights = []
        self.qargs = []
        self.emap = None
        if self.flashinfer is not None:
            self.flashinfer.reset()
        if self.dev.type == "cuda":
            self.torch.cuda.empty_cache()

    def inputs(self, shape: B.MoeShape, M: int) -> Any:
        torch = self.torch
        self.gen.manual_seed(self.seed)
        tw, ids = B.make_routing(torch, M, shape.E_global, shape.topk, "uniform", self.gen, self.dev)
        x = torch.randn(M, shape.K, generator=self.gen, device=self.dev, dtype=self.tdtype)
        return x, tw, ids

    def ineligible(self, label: str, shape: B.MoeShape, M: int) -> Optional[str]:
        if label == FLASHINFER_LABEL:
            return self.flashinfer_why
        if label not in swapmoe_candidates(self.dtype, self.quant):
            return None
        return ineligible(label, M, shape, self.dtype, self.device_name, self.capability, self.quant)

    def check(self, labels: Sequence[str], inputs: Any) -> Dict[str, Optional[str]]:
        """Against float64 (FP8: swapmoe's FP8 reference, flips accounted) with the dtype's
        tolerance; vLLM's FP8 with :data:`VLLM_FP8_TOLERANCE` and FlashInfer's with
        :data:`FLASHINFER_FP8_TOLERANCE` (their rounding differs). FlashInfer runs its own
        converted weights, so a layout or scale mistake fails here."""
        x, tw, ids = inputs
        fp8 = self.qargs[0].get("fp8") if self.qargs else None
        groups = [(list(labels), B.TOLERANCE[self.dtype])]
        if fp8:
            own = [lb for lb in labels if lb not in (VLLM_LABEL, FLASHINFER_LABEL)]
            groups = [(own, B.TOLERANCE[self.dtype]),
                      ([lb for lb in labels if lb == VLLM_LABEL], VLLM_FP8_TOLERANCE),
                      ([lb for lb in labels if lb == FLASHINFER_LABEL], FLASHINFER_FP8_TOLERANCE)]
        out: Dict[str, Optional[str]] = {}
        for group, tol in groups:
            if not group:
                continue
            res = B.check_point(self.torch, group, x, self.weights[0], tw, ids, self.emap, tol, self.impls, fp8=fp8)
            out.update({lb: None if r["ok"] else (r.get("error") or f"check failed: rel_err {r['rel_err']} > "
                                                  f"{r['tol']:g}") for lb, r in res.items()})
        return out

    def time_us(self, label: str, inputs: Any) -> Tuple[float, str]:
        torch = self.torch
        x, tw, ids = inputs
        fn = self.impls[label][0]
        outs = [None if label == VLLM_LABEL else torch.empty_like(x) for _ in range(self.layers)]
        calls = [(lambda w, o, q: (lambda: fn(x, w[0], w[1], tw, ids, self.emap, o, **q)))(
            self.weights[i % self.copies], outs[i], self.qargs[i % self.copies]) for i in range(self.layers)]
        try:
            return B.gpu_time_us(torch, calls, self.timer, True)
        except Exception as e:
            try:
                torch.cuda.synchronize()
            except Exception as sticky:  # the context is broken: nothing after this can be timed
                raise DeviceLost(f"{label} broke the CUDA context ({B._err(sticky, 300)}); the M points "
                                 "measured so far are in the table, run again to resume") from e
            raise
        finally:
            del calls, outs
            torch.cuda.empty_cache()


def run_tune(
    shapes: Sequence[B.MoeShape],
    *,
    out_dir: Optional[str],
    dtype: str = "bf16",
    quant: str = "none",
    m_list: Optional[Sequence[int]] = None,
    force: bool = False,
    layers: int = 8,
    vllm: bool = True,
    flashinfer: bool = True,
    check: bool = True,
    prune: float = DEFAULT_PRUNE,
    device: Optional[str] = "auto",
    seed: int = 0,
    progress: bool = True,
    log: Optional[Callable[[str], None]] = None,
    per_hidden_size: bool = False,
) -> List[dict]:
    """Tunes each shape on the GPU; returns one summary per shape (see :func:`sweep`).
    ``per_hidden_size``: name each table by its K too (``E=..,N=..,K=..,...``), so that the
    oracle reads it only for calls of that hidden size, ahead of the (E, N) table.
    ``vllm``: also time vLLM's Triton (``vllm_triton``) when vllm imports; ``flashinfer``:
    also time FlashInfer's CUTLASS MoE as vLLM runs it (``flashinfer_cutlass``) when flashinfer
    imports and vLLM would use it for the dtype, quantization and device.
    Raises :class:`TuneError` (a :class:`BenchError`) for what cannot run: no CUDA device,
    FP8 below sm_89, a folder that cannot be written, a table file of the same name measured
    with another K or topk (unless ``force``)."""
    say = log or (lambda s: None)
    B.check_quant(quant)
    if dtype not in B.DTYPES:
        raise TuneError(f"--dtype: expected one of {', '.join(B.DTYPES)}, got {dtype!r}")
    try:
        B.check_layers_and_seed(layers, seed)
    except B.BenchError as e:
        raise TuneError(str(e)) from None
    if not shapes:
        raise TuneError("no shape to tune")
    ms = sorted(set(int(m) for m in (m_list or DEFAULT_M)))
    if not ms or ms[0] < 1:
        raise TuneError(f"--m: expected positive token counts, got {m_list!r}")
    out = resolve_out_dir(out_dir)
    try:
        import torch
    except ImportError:
        raise TuneError("swapmoe tune needs torch (pip install torch)") from None
    if not torch.cuda.is_available():
        raise TuneError(f"needs a CUDA GPU, and torch {torch.__version__} sees none (built for CUDA "
                        f"{torch.version.cuda or 'none'}). Tables are measured on the device they are for; "
                        "`swapmoe explain --device-name ...` shows the oracle's plans offline")
    dev = B.resolve_device(torch, device)
    if dev.type != "cuda":
        raise TuneError(f"--device {device}: tune measures CUDA kernels, not the CPU path")

    import swapmoe
    from . import _core

    torch.cuda.set_device(dev)
    info = dict(_core.device_info(dev.index))
    device_name = str(info["name"])
    cap = tuple(int(v) for v in info["capability"])
    capability = (cap[0], cap[1])
    if quant != "none" and capability < FP8_MIN_CAPABILITY:
        raise TuneError(f"--quant {quant}: FP8 needs compute capability >= 8.9 (native e4m3 conversions); "
                        f"{device_name} is sm_{capability[0]}{capability[1]}")
    swapmoe.warmup(dev.index)
    env = B.environment()
    versions: Dict[str, Optional[str]] = {k: env.get(k) for k in ("torch", "triton")}
    vllm_fn = None
    no_vllm = None
    if vllm:
        fe, why = B.load_vllm_fused_experts()
        if fe is None:
            no_vllm = why
        elif quant != "none":
            qc, qwhy = load_vllm_fp8_quant_config()
            if qc is None:
                no_vllm = qwhy
            else:
                vllm_fn = make_vllm_fp8_impl(fe, qc)
                versions["vllm"] = why
        else:
            vllm_fn = B.make_vllm_impl(fe)
            versions["vllm"] = why
    else:
        no_vllm = "--no-vllm"
    if no_vllm:
        say(f"{no_vllm}: no {VLLM_LABEL} times in the tables (swapmoe candidates only)")
        say(f"note: without {VLLM_LABEL} times these tables choose among swapmoe's kernels only; inside "
            f"vLLM their calls are decided as untabled ones (vLLM's Triton outside swapmoe's measured range), "
            f"with the tables' picks as swapmoe's choice. Add {VLLM_LABEL} times (a run with vLLM, or "
            "benches/merge_anchor.py) to route between the two by measurement")
    fi_impl = None
    no_fi = None
    if flashinfer:
        api, fwhy = load_flashinfer()
        if api is None:
            no_fi = fwhy
        else:
            no_fi = flashinfer_unsupported(dtype, quant, capability)
            if no_fi is None:
                quantize = None
                if quant == "fp8_tensor":
                    vq = load_vllm_scaled_fp8_quant()
                    if vq is not None:
                        quantize = (lambda q: (lambda x, a1, a1_inv: q(x, a1)[0]))(vq)
                    else:
                        say(f"{FLASHINFER_LABEL}: vLLM's scaled_fp8_quant does not import; the activations are "
                            "quantized with torch ops before FlashInfer's FP8 kernel (vLLM's prepare step runs one "
                            "fused kernel: small-M times are a little pessimistic)")
                fi_impl = FlashInferCutlass(api, quant, quantize)
                versions["flashinfer"] = api.version
                if api.autotune is None:
                    say(f"{FLASHINFER_LABEL}: flashinfer {api.version} has no autotune; timed with its default tactics")
    else:
        no_fi = "--no-flashinfer"
    if no_fi:
        say(f"{no_fi}: no {FLASHINFER_LABEL} times in the tables")
    runner = GpuRunner(torch, dev, dtype, layers, seed, device_name, capability, vllm_fn, say, quant)
    if fi_impl is not None:
        runner.add_flashinfer(fi_impl)
    plans = prepare(
        shapes, out, ms, force,
        meta_of=lambda sh: table_metadata(sh, dtype, device_name, capability, layers, seed, runner.timer.method,
                                          versions, quant),
        file_name=lambda sh: _core.table_file_name(sh.E, sh.N, device_name, dtype,
                                                   None if quant == "none" else quant,
                                                   hidden_size=sh.K if per_hidden_size else None),
        say=say)
    bar = None
    total = sum(len(p.todo) for p in plans) * len(runner.labels)
    if progress and total:
        try:
            from tqdm import tqdm

            tty = sys.stderr.isatty()
            bar = tqdm(total=total, file=sys.stderr, desc="tune", unit="pt", leave=False,
                       dynamic_ncols=tty, mininterval=0.1 if tty else 30.0)
        except ImportError:
            bar = None
    try:
        summaries = sweep(plans, runner, check=check, prune=prune, bar=bar, say=say)
    finally:
        if bar is not None:
            bar.close()
    if quant != "none" and vllm_fn is not None:
        for s in summaries:
            missing = [M for M, e in sorted(s["entries"].items()) if VLLM_LABEL not in e["times_us"]]
            if missing:
                say(f"warning: {s['path']}: no {VLLM_LABEL} time at M={','.join(map(str, missing))} (see the "
                    f"entries' skipped); inside vLLM those entries leave FP8 calls on vLLM's Triton")
    from .errors import Error

    for sp in plans:  # the oracle must parse what was written
        if os.path.exists(sp.path):
            try:
                _core.read_table(sp.path)
            except Error as e:
                raise TuneError(f"the oracle cannot read the table just written ({e}); please report this") from e
    return summaries


def format_summary(summaries: Sequence[dict]) -> str:
    """One block per shape: each measured M with the winner and every candidate's µs."""
    lines = []
    for s in summaries:
        lines.append(f"{s['shape']}: {s['path']}")
        if s["skipped_m"]:
            lines.append(f"  already in the table (not re-measured): M={','.join(map(str, s['skipped_m']))}")
        for M, e in sorted(s["entries"].items()):
            best = entry_label(e)
            others = ", ".join(f"{k} {v:.1f}" for k, v in e["times_us"].items() if k != best)
            lines.append(f"  M={M:<5} {best:<14} {e['time_us']:9.1f} µs   ({others or 'no other candidate'})")
    return "\n".join(lines)

