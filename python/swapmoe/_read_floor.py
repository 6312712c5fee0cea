"""The read floor of a decode layer, for ``swapmoe bench`` (its ``read_us`` and ``%read``
columns) and ``benches/read_floor.py``.

A Triton kernel that does nothing but read the routed experts' w13 and w2 bytes (16-byte
loads, a kept sum), launched once per layer on the bench's own weight copies and timed as the
op is: what any one-kernel-per-layer implementation needs to move those bytes under the
bench's method (L2 flushed, 8 layers per graph). At M = 1-2 on fine-grained MoE it sits well
above ``floor_us`` (bytes over a 4 GiB streaming read's bandwidth): a 38 MB read spends ~2 µs
ramping up and draining (benches/NOTES.md, "The practical read floor of a decode layer").

Bench-only: imported by ``swapmoe.bench`` when triton is there, never by the op.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import triton
import triton.language as tl

#: bytes per program: the fastest of 16, 32, 64 and 128 KiB at M = 1-2 on the H200
#: (2026-12-05); from M = 4 32 KiB is up to 3% faster, which the column does not chase
CHUNK_BYTES = 16 * 1024
#: int64 elements each program loads per step (8 KiB)
BLOCK = 1024


@triton.jit
def read_weights_kernel(w1_ptr, w2_ptr, seg_ptr, out_ptr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Program (c, s) reads int64 elements [c*CHUNK, (c+1)*CHUNK) of segment s (a row
    (tensor, offset, length) of seg_ptr: tensor 0 is w1_ptr, 1 is w2_ptr) and stores their
    wrapping sum, so that the loads are not dropped."""
    c = tl.program_id(0)
    s = tl.program_id(1)
    which = tl.load(seg_ptr + 3 * s)
    off = tl.load(seg_ptr + 3 * s + 1)
    n = tl.load(seg_ptr + 3 * s + 2)
    start = c.to(tl.int64) * CHUNK
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    if start < n:
        for i in range(0, CHUNK, BLOCK):
            idx = start + i + tl.arange(0, BLOCK)
            if which == 0:
                acc += tl.load(w1_ptr + off + idx, mask=idx < n, other=0)
            else:
                acc += tl.load(w2_ptr + off + idx, mask=idx < n, other=0)
    tl.store(out_ptr + s * tl.num_programs(0) + c, tl.sum(acc, axis=0))


def weight_segments(experts: Sequence[int], w13_elems: int, w2_elems: int) -> List[Tuple[int, int, int]]:
    """(tensor, offset, length) in int64 elements of what a layer must read: each expert's
    w13 block (tensor 0), then each one's w2 block (tensor 1), in the order given."""
    return [(0, e * w13_elems, w13_elems) for e in experts] + [(1, e * w2_elems, w2_elems) for e in experts]


def as_int64(torch: Any, w: Any, what: str) -> Any:
    """A contiguous weight tensor viewed as int64 elements (ValueError when its bytes per
    expert are not a multiple of 8)."""
    per_expert = w[0].numel() * w.element_size()
    if not w.is_contiguous() or per_expert % 8:
        raise ValueError(f"{what}: the read floor needs contiguous experts of a multiple of 8 bytes, "
                         f"got {per_expert} bytes per expert (contiguous: {w.is_contiguous()})")
    return w.reshape(-1).view(torch.uint8).view(torch.int64), per_expert // 8


class Reader:
    """A call that reads the given segments of two int64 views in one launch; its
    ``partial_sums`` (one per program) hold what the last call read."""

    def __init__(self, torch: Any, v1: Any, v2: Any, segs: Sequence[Tuple[int, int, int]],
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        self.v1, self.v2 = v1, v2
        self.chunk = chunk_bytes // 8
        if chunk_bytes % 8 or self.chunk < 1 or self.chunk & (self.chunk - 1):
            raise ValueError(f"chunk_bytes: expected 8 x a power of two, got {chunk_bytes}")
        self.block = min(BLOCK, self.chunk)  # a program's steps tile its chunk exactly
        self.table = torch.tensor(list(segs), dtype=torch.int64, device=v1.device).reshape(-1, 3)
        self.grid = (max([-(-n // self.chunk) for _, _, n in segs], default=0), len(segs))
        self.partial_sums = torch.zeros(self.grid[0] * self.grid[1], dtype=torch.int64, device=v1.device)

    def __call__(self) -> None:
        if self.grid[0] * self.grid[1]:
            read_weights_kernel[self.grid](self.v1, self.v2, self.table, self.partial_sums, CHUNK=self.chunk,
                                           BLOCK=self.block, num_warps=4)


def make_reader(torch: Any, w1: Any, w2: Any, experts: Sequence[int], chunk_bytes: int = CHUNK_BYTES) -> Reader:
    """A call that reads ``experts``' w13 rows of ``w1`` [E, 2N, K] and w2 rows of ``w2``
    [E, K, N] (any dtype) in one launch; nothing when ``experts`` is empty."""
    v1, e1 = as_int64(torch, w1, "w1")
    v2, e2 = as_int64(torch, w2, "w2")
    return Reader(torch, v1, v2, weight_segments(list(experts), e1, e2), chunk_bytes)
