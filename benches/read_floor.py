"""The practical HBM floor of one decode MoE layer: how fast can any kernel read just the bytes
the layer must read, measured the way the bench measures the op.

A Triton kernel that does nothing but read the routed experts' w13 and w2 rows (16-byte loads,
a sum kept so that the loads stay) is timed in a CUDA graph of 8 layers, each on its own copy
of the weights, L2 flushed before each replay, per layer = replay / 8. That is the bench's
method (swapmoe.bench), so the op's time can be set against it directly.

Variants (each a column of the output):
- ``routed``: each layer reads its own routing's experts (topk of softmax(randn), as the
  bench), from its own weight copy: the op's bytes, the op's places.
- ``contiguous``: the same number of bytes per layer from the start of its copy: no expert
  scatter, so what ``routed`` loses to the scatter shows.
- ``one launch``: one kernel reads all 8 layers' routed bytes: the graph's per-kernel cost and
  the ramp of a short kernel are paid once, not 8 times.
- ``two launches``: per layer, one kernel for the w13 bytes and then one for the w2 bytes (the
  op's two GEMMs, without PDL).
- ``boxes`` (``--boxes``): the routed w13 bytes (GEMM1's) read as one program per TMA-like box
  of ROWS rows x a slab of each row, in a CTA's stage order ("slab"), every row block's first
  slab first ("rows"), or as contiguous boxes of the same size ("flat", the control): whether
  the weights' access pattern, not their amount, sets the rate.

The bytes counted are the weights only (activations are a few KB at decode). Output: one row
per (shape, dtype, M) with µs and TB/s per variant, and the best chunk size found.

Usage (on a GPU): python benches/read_floor.py [--models qwen3-30b-a3b,...] [--m 1,2,4,8]
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

from swapmoe import bench as B
from swapmoe._read_floor import Reader, weight_segments

LAYERS = 8


@triton.jit
def _read_boxes(base_ptr, box_ptr, out_ptr, BR: tl.constexpr, BW: tl.constexpr):
    """Program p reads one box: BR rows of BW int64 elements, from offset box[p, 0] with a
    row stride of box[p, 1] int64 elements (a TMA box of a weight matrix)."""
    p = tl.program_id(0)
    off = tl.load(box_ptr + 2 * p)
    stride = tl.load(box_ptr + 2 * p + 1)
    rows = tl.arange(0, BR)[:, None].to(tl.int64)
    cols = tl.arange(0, BW)[None, :]
    v = tl.load(base_ptr + off + rows * stride + cols)
    tl.store(out_ptr + p, tl.sum(tl.sum(v, axis=1), axis=0))


def boxes_of(segs, row_elems_of, br: int, bw: int, order: str):
    """[(offset, row stride)] of the BR x BW boxes that tile the segments (each a matrix whose
    rows are row_elems_of(seg) int64 long), slab by slab of each row block ("slab": a CTA's
    stages in turn) or row block by row block ("rows": every row block's first slab first);
    "flat": the segment as rows of BW (contiguous boxes of the same size, the control)."""
    out = []
    for off, n in segs:
        re_ = bw if order == "flat" else row_elems_of(off, n)
        rows = n // re_
        if rows % br or re_ % bw:
            return None
        slabs = re_ // bw
        if order == "slab":
            out += [(off + rb * br * re_ + kt * bw, re_) for rb in range(rows // br) for kt in range(slabs)]
        else:
            out += [(off + rb * br * re_ + kt * bw, re_) for kt in range(slabs) for rb in range(rows // br)]
    return out


def segments_of(ids, layer: int, shape, bpw: int, copy_elems: int, contiguous: bool):
    """[(offset, length)] in int64 elements of the bytes one layer reads: the distinct
    experts' w13 then w2 rows of copy ``layer`` (or the same count from the copy's start)."""
    E, K, N = shape.E, shape.K, shape.N
    w13 = 2 * N * K * bpw // 8
    w2 = K * N * bpw // 8
    experts = sorted(set(int(e) for e in ids.reshape(-1).tolist() if 0 <= int(e) < E))
    if contiguous:
        experts = list(range(len(experts)))
    # one buffer holds every copy, each copy w13 [E, 2N, K] then w2 [E, K, N]
    start = (layer * copy_elems, layer * copy_elems + E * w13)
    return [(start[t] + off, n) for t, off, n in weight_segments(experts, w13, w2)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen3-30b-a3b,deepseek-v3-tp8,mixtral-8x7b")
    ap.add_argument("--m", default="1,2,4,8")
    ap.add_argument("--dtypes", default="fp8,bf16")
    ap.add_argument("--chunks-kib", default="16,32,64,128")
    ap.add_argument("--boxes", default="128x16:flat,128x16:slab,128x16:rows,64x32:slab,32x64:slab",
                    help="box variants ROWSxINT64S:ORDER (16 int64 = 128 B per row; ORDER slab, rows or "
                         "flat), one program per box, over the w13 bytes only (GEMM1's); '' for none")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    timer = B.GpuTimer(torch, dev)
    bw, nb = B.measure_read_bandwidth(torch, dev, timer)
    print(f"# {torch.cuda.get_device_name(dev)}; streaming read {bw / 1e12:.2f} TB/s over {nb >> 20} MiB; "
          f"{timer.method}; {LAYERS} layers per graph")
    rows = []
    print(f"{'shape':16} {'dt':4} {'M':>3} {'experts':>7} {'MB':>6} {'floor':>6} | "
          f"{'routed':>14} {'contig':>14} {'1 launch':>14} {'2 launches':>14} | best chunk")
    for model in a.models.split(","):
        shape = B.preset_shape(model)
        for dt in a.dtypes.split(","):
            bpw = 1 if dt == "fp8" else 2
            copy_elems = shape.weight_bytes(bpw) // 8
            buf = torch.empty(LAYERS * copy_elems, dtype=torch.int64, device=dev).random_()
            gen = torch.Generator(device=dev)
            for M in B.parse_m_list(a.m):
                gen.manual_seed(1234 + M)
                routings = [B.make_routing(torch, M, shape.E, shape.topk, "uniform", gen, dev)[1].cpu()
                            for _ in range(LAYERS)]
                per_layer = {v: [segments_of(routings[i], i, shape, bpw, copy_elems, v == "contiguous")
                                 for i in range(LAYERS)] for v in ("routed", "contiguous")}
                touched = sum(len(s) for s in per_layer["routed"]) // (2 * LAYERS)
                mbytes = sum(n for segs in per_layer["routed"] for _, n in segs) * 8 / LAYERS
                best = {}
                all_chunks = {}
                for kib in (int(k) for k in a.chunks_kib.split(",")):
                    for variant in ("routed", "contiguous", "one launch", "two launches"):
                        if variant == "one launch":
                            groups = [sum(per_layer["routed"], [])]
                        elif variant == "two launches":  # w13's bytes, then w2's: the op's two GEMMs
                            groups = [half for segs in per_layer["routed"]
                                      for half in (segs[: len(segs) // 2], segs[len(segs) // 2:])]
                        else:
                            groups = per_layer[variant]
                        # one buffer holds every copy: tensor 0 at both pointers
                        calls = [Reader(torch, buf, buf, [(0, off, n) for off, n in segs], kib * 1024)
                                 for segs in groups]
                        us = B.gpu_time_us(torch, calls, timer, graph=True)[0] * len(calls) / LAYERS
                        all_chunks[f"{variant}@{kib}K"] = us
                        if variant not in best or us < best[variant][0]:
                            best[variant] = (us, kib)
                box_us = {}
                w13_bytes = sum(n for segs in per_layer["routed"] for _, n in segs[: len(segs) // 2]) * 8 / LAYERS
                for spec in [b for b in a.boxes.split(",") if b]:
                    dims, order = spec.split(":")
                    br, bwid = (int(v) for v in dims.split("x"))
                    calls = []
                    for i, segs in enumerate(per_layer["routed"]):
                        segs = segs[: len(segs) // 2]  # w13
                        base = i * copy_elems
                        w13_end = base + shape.E * (2 * shape.N * shape.K * bpw // 8)

                        def row_elems_of(off, n, w13_end=w13_end):
                            return shape.K * bpw // 8 if off < w13_end else shape.N * bpw // 8
                        boxes = boxes_of(segs, row_elems_of, br, bwid, order)
                        if boxes is None:
                            break
                        bt = torch.tensor(boxes, dtype=torch.int64, device=dev)
                        out = torch.empty(len(boxes), dtype=torch.int64, device=dev)

                        def call(bt=bt, out=out, br=br, bwid=bwid):
                            _read_boxes[(bt.shape[0],)](buf, bt, out, BR=br, BW=bwid, num_warps=4)
                        calls.append(call)
                    if len(calls) == LAYERS:
                        box_us[spec] = B.gpu_time_us(torch, calls, timer, graph=True)[0]
                floor = mbytes / bw * 1e6
                cells = " ".join(f"{best[v][0]:7.2f}/{mbytes / best[v][0] / 1e6:4.2f}TB"
                                 for v in ("routed", "contiguous", "one launch", "two launches"))
                print(f"{shape.name:16} {dt:4} {M:3d} {touched:7d} {mbytes / 1e6:6.1f} {floor:6.2f} | {cells} | "
                      + ", ".join(f"{v} {best[v][1]}K" for v in best), flush=True)
                if box_us:
                    print("    w13 boxes: " + "  ".join(f"{k} {u:.2f} us ({w13_bytes / u / 1e6:.2f} TB/s)"
                                                      for k, u in box_us.items()), flush=True)
                rows.append({"shape": shape.name, "dtype": dt, "M": M, "experts_touched": touched,
                             "weight_bytes": mbytes, "floor_us": floor,
                             **{f"{v}_us": best[v][0] for v in best}, **{f"{v}_chunk_kib": best[v][1] for v in best},
                             "all_chunks": all_chunks, "boxes_us": box_us})
            del buf
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"read_bw": bw, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
