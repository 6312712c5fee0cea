"""Command line: ``swapmoe bench`` (timing against the HBM floor, the bf16 GEMM ceiling, the
vLLM anchor, vLLM's fused_experts and torch baselines), ``swapmoe tune`` (tuned tables for
the oracle), ``swapmoe explain`` (the oracle's plans) and ``swapmoe check`` (what this
install sees). The benchmark lives in :mod:`swapmoe.bench` and the tuning in
:mod:`swapmoe.tune`; this module parses arguments and prints."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import bench as B


def _shape_from_args(args: argparse.Namespace) -> Optional[B.MoeShape]:
    # `is not None`: an empty --shape "" or --model "" is a bad value, not a missing one
    if args.hf_config is not None:
        return B.hf_config_shape(args.hf_config, args.tp, args.ep)
    if args.shape is not None:
        return B.parse_shape(args.shape, args.tp, args.ep)
    if args.model is not None:
        return B.preset_shape(args.model, args.tp, args.ep)
    if args.tp != 1 or args.ep != 1:
        raise B.BenchError("--tp/--ep: need a shape to shard (--model, --shape or --hf-config)")
    return None


def _bench_shape_from_args(args: argparse.Namespace) -> Optional[B.MoeShape]:
    """The bench's shape, with --router (if given) as its router."""
    shape = _shape_from_args(args)
    spec = getattr(args, "router", None)
    if spec is None:
        return shape
    if not getattr(args, "with_routing", False):
        raise B.BenchError("--router: only with --with-routing (the router of fused_moe's column)")
    if shape is None:
        raise B.BenchError("--router: needs a shape to route (--model, --shape or --hf-config)")
    return dataclasses.replace(shape, router=B.parse_router(spec))


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only where it says something (not None, not a flag's bool)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or isinstance(action.default, bool) or "default" in text:
            return text
        return super()._get_help_string(action) or text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swapmoe", description="swapmoe: fused MoE experts for vLLM.")
    sub = p.add_subparsers(dest="command", metavar="{bench,tune,explain,check}")

    b = sub.add_parser(
        "bench",
        help="time swapmoe against the HBM floor, vLLM's anchor, vLLM's fused_experts and torch baselines",
        description=(
            "Times swapmoe.fused_experts per layer. On a GPU: a CUDA graph of --layers calls, each on its own "
            "weight copy, replayed under triton.testing.do_bench (L2 flushed, median), divided by --layers; "
            "the HBM floor uses a streaming read bandwidth and %gemm a bf16 GEMM ceiling, both measured in the "
            "same run. Without a CUDA device the Rust CPU path is timed on a small shape instead."),
        formatter_class=_HelpFormatter,
    )
    src = b.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="NAME",
                     help=f"preset shape: {', '.join(B.PRESETS)} (GPU default {B.GPU_DEFAULT_MODEL})")
    src.add_argument("--hf-config", metavar="PATH", help="Hugging Face config.json to read the shape from")
    src.add_argument("--shape", metavar="E,topk,K,N", help="explicit shape: experts, topk, hidden, moe intermediate")
    b.add_argument("--tp", type=int, default=1, metavar="N", help="tensor parallel: divides the intermediate size N")
    b.add_argument("--ep", type=int, default=1, metavar="N",
                   help="expert parallel: divides E; routing stays over all experts and an expert_map keeps "
                        "this rank's share")
    b.add_argument("--dtype", choices=list(B.DTYPES), default="bf16", help="weights and activations")
    b.add_argument("--quant", choices=list(B.QUANTS), default="none",
                   help="weight quantization: FP8 W8A8 e4m3 weights (1 byte each) with per-tensor (static activation scales), per-channel or 128x128-block scales; the torch and vLLM baselines are skipped for FP8")
    b.add_argument("--m", metavar="M,M,...", default=None,
                   help="token counts (GPU default %s; CPU default %s)" % (
                       ",".join(map(str, B.DEFAULT_M_GPU)), ",".join(map(str, B.DEFAULT_M_CPU))))
    b.add_argument("--routing", choices=["uniform", "skewed"], default="uniform",
                   help="uniform: topk of softmax(randn(M, E)) as the anchor; skewed: Zipf over experts")
    b.add_argument("--zipf-s", type=float, default=1.0, help="Zipf exponent of --routing skewed")
    b.add_argument("--layers", type=int, default=8, help="calls per CUDA graph, each on its own weight copy")
    b.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True,
                   help="capture the layers in a CUDA graph, else time the eager loop (default: graph)")
    b.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=None,
                   help="also time vLLM's fused_experts (when vllm imports), the torch._grouped_mm pipeline "
                        "and the torch eager pipeline (default: on for GPU runs, off for CPU runs)")
    b.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="check every implementation against a float64 reference at the smallest M before "
                        "timing (default: on)")
    b.add_argument("--check-all", action="store_true", help="check at every M, not only the smallest")
    b.add_argument("--with-routing", action="store_true",
                   help="also time swapmoe.fused_moe from the router logits (GPU router + fused experts) "
                        "next to fused_experts on precomputed ids (needs --routing uniform). The router is the "
                        "model's own (preset or config; softmax top-k without renormalize where none is named) "
                        "and every column runs on its ids")
    b.add_argument("--routing-rounds", type=int, default=None, metavar="N",
                   help="with --with-routing, time fused_experts and fused_moe again in N alternating rounds "
                        "per M (each round in the other order: ABBA) and print their paired difference as "
                        "moe-exp_us (the mean of the two orders' medians of the per-round differences, "
                        f"min..max over rounds); an even N puts as many rounds in each order; 0: off "
                        f"(default: {B.ROUTING_ROUNDS})")
    b.add_argument("--router", metavar="SPEC", default=None,
                   help="the router of --with-routing instead of the shape's: a preset's name (e.g. deepseek-v3), "
                        "or softmax|sigmoid[,renorm][,groups=G/T][,bias][,scale=F], e.g. "
                        "sigmoid,renorm,groups=8/4,bias,scale=2.5")
    b.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    b.add_argument("--seed", type=int, default=0, help="routing and activation seed")
    b.add_argument("--anchors", metavar="PATH", default=None,
                   help=f"anchor JSON (default: $SWAPMOE_ANCHORS, shared/anchors/{B.ANCHOR_FILE}, or the packaged copy)")
    b.add_argument("--read-bw", type=float, default=None, metavar="TB/s",
                   help="use this read bandwidth for the floor instead of measuring it")
    b.add_argument("--read-floor", action=argparse.BooleanOptionalAction, default=None,
                   help="also time a read-only kernel over each point's routed weight bytes, as the op is timed "
                        "(read_us, %%read: what a one-kernel-per-layer reader needs; default: on for GPU runs, "
                        "needs triton)")
    b.add_argument("--gemm-tflops", type=float, default=None, metavar="TF/s",
                   help="use this bf16 GEMM ceiling for %%gemm instead of measuring it")
    b.add_argument("--json", "--out", dest="json", metavar="PATH", help="write the full record as JSON")
    b.add_argument("--csv", nargs="?", const="-", default=None, metavar="PATH",
                   help="CSV instead of the table on stdout, or to PATH")
    b.add_argument("--plot", metavar="PATH", help="PNG of time and %% of floor against M")
    b.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    b.set_defaults(func=cmd_bench)

    c = sub.add_parser("check", help="print version, build, CUDA driver and devices, torch and vLLM")
    c.set_defaults(func=cmd_check)

    x = sub.add_parser(
        "explain",
        help="print the oracle's plan and its reasons for each M (works offline with --device-name)",
        formatter_class=_HelpFormatter,
    )
    xs = x.add_mutually_exclusive_group(required=True)
    xs.add_argument("--model", metavar="NAME", help=f"preset shape: {', '.join(B.PRESETS)}")
    xs.add_argument("--hf-config", metavar="PATH", help="Hugging Face config.json to read the shape from")
    xs.add_argument("--shape", metavar="E,topk,K,N", help="explicit shape: experts, topk, hidden, moe intermediate")
    x.add_argument("--tp", type=int, default=1, metavar="N", help="tensor parallel: divides N")
    x.add_argument("--ep", type=int, default=1, metavar="N", help="expert parallel: divides E")
    x.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    x.add_argument("--quant", choices=list(B.QUANTS), default="none",
                   help="weight quantization: FP8 W8A8 plans need sm_89+ (fp8_tensor assumes static activation scales)")
    x.add_argument("--activation-scales", choices=["static", "dynamic"], default=None,
                   help="FP8 activation scales: static (a1_scale and a2_scale given) or dynamic (computed by "
                        "the op); default: static for fp8_tensor, dynamic for the other schemes")
    x.add_argument("--external-backends", metavar="NAME,...", default="",
                   help="backends outside swapmoe the caller can run (inside vLLM): vllm_triton, "
                        "flashinfer_cutlass; tuned tables may pick them")
    x.add_argument("--m", metavar="M,M,...", default="1,8,64,1024", help="token counts")
    x.add_argument("--device-name", metavar="NAME", default=None,
                   help='ask for this device (e.g. "NVIDIA H200") instead of CUDA device 0; needs no GPU')
    x.add_argument("--capability", metavar="MAJOR.MINOR", default=None,
                   help="compute capability, for a device name the oracle does not know")
    x.add_argument("--backend", default=None, help="force a backend, as $SWAPMOE_BACKEND does")
    x.set_defaults(func=cmd_explain)

    from . import tune as T

    t = sub.add_parser(
        "tune",
        help="measure every swapmoe candidate per shape and M on this GPU and write tuned tables",
        description=(
            "For each shape and M, times every candidate the oracle can run (cuda_decode, cuda_wgmma_swap and, at "
            "M <= 32, its launch variants cuda_wgmma_swap:r<ring>p<pdl> (GEMM1 ring 2 or 3, GEMM2 by "
            "PDL or after GEMM1), cuda_mma and cuda_wgmma with each token tile, cuda_generic; vLLM's Triton "
            "fused_experts as vllm_triton when vllm imports; FlashInfer's CUTLASS fused MoE as vLLM runs it, as "
            "flashinfer_cutlass, when flashinfer imports) as "
            "swapmoe bench does: a CUDA graph of --layers calls on distinct weight copies, "
            "triton.testing.do_bench (L2 flushed, median), divided by --layers. Writes "
            "E=..,N=..,device_name=..,dtype=...json into --out-dir after every M; a second run skips the M "
            "points already there (--force re-measures). Point $SWAPMOE_TABLES_DIR at the folder to use them. "
            "--quant fp8_*: FP8 weights and scales as swapmoe bench --quant, swapmoe's FP8 backends "
            "(cuda_decode, cuda_wgmma_swap, cuda_wgmma, cuda_generic) and vLLM's Triton FP8 path, into "
            "dtype=fp8_w8a8[,per_channel=true|,block_shape=[128,128]] tables whose metadata says the kind of "
            "activation scales measured (static for fp8_tensor, dynamic otherwise); an FP8 entry without a "
            "vllm_triton time leaves the vLLM plugin's calls on vLLM's Triton, and the run says so. A candidate "
            "pruned at a smaller M is still timed where no other candidate can run M."),
        formatter_class=_HelpFormatter,
    )
    ts = t.add_mutually_exclusive_group()
    ts.add_argument("--model", metavar="NAME[,NAME...]",
                    help=f"preset shapes, comma-separated: {', '.join(B.PRESETS)}")
    ts.add_argument("--hf-config", metavar="PATH", help="Hugging Face config.json to read the shape from")
    ts.add_argument("--shape", metavar="E,topk,K,N", help="explicit shape: experts, topk, hidden, moe intermediate")
    t.add_argument("-E", dest="num_experts", type=int, metavar="E", help="experts (with -K, -N, --topk)")
    t.add_argument("-K", dest="hidden", type=int, metavar="K", help="hidden size")
    t.add_argument("-N", dest="intermediate", type=int, metavar="N", help="moe intermediate size (w2.shape[2])")
    t.add_argument("--topk", type=int, metavar="K", help="experts per token")
    t.add_argument("--tp", type=int, default=1, metavar="N", help="tensor parallel: divides N")
    t.add_argument("--ep", type=int, default=1, metavar="N", help="expert parallel: divides E")
    t.add_argument("--dtype", choices=list(B.DTYPES), default="bf16")
    t.add_argument("--quant", choices=list(B.QUANTS), default="none",
                   help="weight quantization: FP8 W8A8 inputs as swapmoe bench --quant builds them; candidates "
                        "cuda_decode, cuda_wgmma_swap (Hopper), cuda_wgmma:t64/t128 (Hopper), "
                        "cuda_generic (and vllm_triton), written to the "
                        "dtype=fp8_w8a8... tables (needs sm_89+)")
    t.add_argument("--m", metavar="M,M,...", default=",".join(map(str, T.DEFAULT_M)), help="token counts")
    t.add_argument("--out-dir", metavar="DIR", default=None,
                   help="folder for the tables (default: $SWAPMOE_TABLES_DIR; one of the two is needed)")
    t.add_argument("--force", action="store_true", help="re-measure M points already in the table")
    t.add_argument("--per-hidden-size", action="store_true",
                   help="name each table by its hidden size too (E=..,N=..,K=..,...): the oracle reads it only "
                        "for calls of that K, ahead of the (E, N) table, which stands for every K (vLLM's key). "
                        "For a model that shares (E, N) with another, e.g. Qwen3-30B-A3B TP2 and "
                        "Qwen3-235B-A22B TP4")
    t.add_argument("--layers", type=int, default=8, help="calls per CUDA graph, each on its own weight copy")
    t.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=True,
                   help="also time vLLM's Triton fused_experts as vllm_triton when vllm imports (default: on)")
    t.add_argument("--flashinfer", action=argparse.BooleanOptionalAction, default=True,
                   help="also time FlashInfer's CUTLASS fused MoE as vLLM's FlashInferExperts runs it, as "
                        "flashinfer_cutlass, when flashinfer imports (bf16/fp16 and fp8_tensor on sm_90+, "
                        "fp8_block128 on sm_90; default: on)")
    t.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="check every candidate against a float64 reference at the first M measured per shape; "
                        "a wrong one is dropped (default: on)")
    t.add_argument("--prune", type=float, default=T.DEFAULT_PRUNE, metavar="X",
                   help="stop timing cuda_decode / cuda_generic at larger M once they were more than X times "
                        "the best, unless no other candidate can run that M (0: never)")
    t.add_argument("--device", default="auto", help="auto, cuda or cuda:N")
    t.add_argument("--seed", type=int, default=0, help="routing and activation seed")
    t.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    t.set_defaults(func=cmd_tune)
    return p


# --------------------------------------------------------------------------------------
# bench output
# --------------------------------------------------------------------------------------


def _us(v: Optional[float]) -> str:
    if v is None:
        return "n/a"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _pct(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def _tf(v: Optional[float]) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3f}" if v < 1 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def build_kind_lines(info: dict) -> List[str]:
    """Lines that say a build is not a release build (`build_info()`): a timing probe, whose
    results are wrong on purpose, or a profiling build; none for a release build."""
    lines = []
    if info.get("cuda_probe"):
        lines.append(f"build: timing probe SWAPMOE_CUDA_PROBE={info['cuda_probe']}: the swap-AB kernels skip "
                     "their math (memory pipeline only); their results are wrong on purpose (it opens a "
                     "device only with SWAPMOE_PROBE_BUILD_OK=1)")
    if info.get("cuda_stamps"):
        lines.append("build: profiling (SWAPMOE_CUDA_STAMPS=1): the swap-AB kernels record per-CTA stamps")
    return lines


def header_lines(rec: dict) -> List[str]:
    sh = rec["shape"]
    v = rec["versions"]
    lines = []
    shape = f"E={sh['E']} topk={sh['topk']} K={sh['K']} N={sh['N']}"
    if sh["tp"] > 1:
        shape += f" tp={sh['tp']}"
    if sh["ep"] > 1:
        shape += f" ep={sh['ep']} (E_global={sh['E_global']})"
    r = rec["routing"]
    routing = r["kind"] + (f" (zipf s={r['zipf_s']})" if r["kind"] == "skewed" else "") + f", seed {r['seed']}"
    quant = rec.get("quant") or "none"
    dtype = rec["dtype"] + ("" if quant == "none" else f" {quant}")
    lines.append(f"swapmoe {v['swapmoe']} bench: {sh['name']}  {shape}  {dtype}  routing {routing}")
    router = r.get("router")
    if router:
        lines.append(f"router (--with-routing, {router['origin']}): {router['describe']}"
                     + (f"; correction bias {router['e_score_correction_bias']}"
                        if router.get("e_score_correction_bias") else "")
                     + "; every column runs on this router's ids (float64 reference router)")
    lines += build_kind_lines(rec.get("build_info") or {})
    m = rec["method"]
    vllm = f", vllm {v['vllm']}" if v.get("vllm") else ""
    if rec["mode"] == "cpu":
        lines.append(rec["label"])
        lines.append(f"device: {rec['device']['name']}; torch {v['torch']}{vllm}; {m['timer']}; "
                     f"{m['weight_copies']} weight copies; HBM floor and GEMM ceiling: n/a")
    else:
        d = rec["device"]
        lines.append(f"device: {d['name']} (sm_{d['capability'].replace('.', '')}, {d['sm_count']} SMs), "
                     f"driver {B.format_driver(rec['driver_version'])}; torch {v['torch']}, triton {v['triton']}{vllm}")
        copies = m["weight_copies"]
        layout = (f"CUDA graph of {m['layers']} layers" if m["graph"] else f"eager loop of {m['layers']} layers")
        layout += f" ({copies} weight copies)" if copies == m["layers"] else f" (cycling over {copies} weight copies)"
        lines.append(f"method: {layout}, {m['timer']}, time / {m['layers']} per layer")
        bw = rec["read_bw"]
        lines.append(f"floor: (experts_touched*3*N*K*{rec['bytes_per_weight']} + 2*M*K*{rec['bytes_per_act']}) B / "
                     f"read bw {bw['tbps']:.3f} TB/s ({bw['method']})")
        if rec.get("read_floor"):
            lines.append(f"read floor: {rec['read_floor']['method']}; %read = read_us / swapmoe_us")
        gemm = rec.get("gemm_tflops")
        lines.append(f"bf16 GEMM ceiling: {gemm:.0f} TF/s ({m.get('gemm_ceiling')}); %gemm = TF/s / ceiling"
                     if gemm else "bf16 GEMM ceiling: n/a (not measured)")
    a = rec.get("anchor") or {}
    if a.get("matched"):
        lines.append(f"anchor: vLLM 0.33 Triton fused_moe, 2 GEMM kernels only ({a.get('device')}, "
                     f"{a.get('variant')}); x_anchor = anchor / swapmoe")
    elif a.get("path"):
        lines.append(f"anchor: n/a ({a.get('why_not')})")
    else:
        lines.append("anchor: n/a (anchor file not found)")
    chk = rec.get("check")
    if chk:
        parts = []
        for name, res in chk["results"].items():
            if res.get("error"):
                parts.append(f"{name} ERROR {res['error']}")
            else:
                err = res["rel_err"]
                err_s = "inf (NaN/unwritten)" if err is None or math.isinf(err) else f"{err:.2e}"
                parts.append(f"{name} {err_s} {'ok' if res['ok'] else 'FAIL'}")
        what = "vs float64" if quant == "none" else \
            "vs float64 FP8 reference (activations quantized as the op, e4m3 midpoint flips accounted)"
        lines.append(f"check at M={chk['M']} {what}, rel err (tol {next(iter(chk['results'].values()))['tol']:g}): "
                     + "; ".join(parts))
        if chk.get("all_M"):
            bad = chk.get("failed_M") or []
            lines.append("check at every M: " + (f"swapmoe FAILED at M={','.join(map(str, bad))}" if bad else "swapmoe ok"))
    return lines


def _plan(p: dict) -> str:
    """The oracle's backend of a point ("err" where describe_plan failed)."""
    plan = p.get("plan")
    if isinstance(plan, dict):
        return str(plan.get("backend") or "?")
    return "err" if plan else "n/a"


BASELINE_WHAT = {
    B.IMPL_ROUTED: "swapmoe.fused_moe from router logits (the op's router + fused experts; router above)",
    B.IMPL_VLLM: "vLLM's fused_experts, the whole op",
    B.IMPL_GROUPED: "torch._grouped_mm pipeline",
    B.IMPL_EAGER: "torch eager pipeline",
}


def baselines_shown(rec: dict) -> List[str]:
    return [n for n in rec["implementations"] if n != B.IMPL_SWAPMOE]


def table_rows(rec: dict) -> Tuple[List[str], List[List[str]]]:
    """The table: one row per M. Columns that only hold n/a in a CPU run (floor, %floor,
    %gemm) are left out there; the full record is in --json / --csv."""
    floor = rec["mode"] == "gpu" and rec.get("read_bw") is not None
    read = any(p.get("read_floor_us") is not None for p in rec["points"])
    gemm = rec["mode"] == "gpu" and bool(rec.get("gemm_tflops"))
    anchor = bool((rec.get("anchor") or {}).get("matched"))
    baselines = baselines_shown(rec)
    head = ["M", "touched", "plan"] + (["floor_us"] if floor else []) + (["read_us"] if read else []) + ["swapmoe_us"]
    head += (["%floor"] if floor else []) + (["%read"] if read else []) + ["TF/s"] + (["%gemm"] if gemm else [])
    if anchor:
        head += ["anchor_us", "x_anchor"]
    for bname in baselines:
        s = B.SHORT_NAMES.get(bname, bname)
        head += [f"{s}_us", f"x_{s}"]
    paired = any(p.get("routing_overhead") for p in rec["points"])
    if paired:
        head += ["moe-exp_us"]
    rows = []
    for p in rec["points"]:
        sw = p["results"].get(B.IMPL_SWAPMOE, {})
        row = [str(p["M"]), str(p["experts_touched"]), _plan(p)] + ([_us(p["floor_us"])] if floor else [])
        row += [_us(p.get("read_floor_us"))] if read else []
        row += [_us(sw.get("time_us"))] + ([_pct(sw.get("pct_floor"))] if floor else [])
        row += ([_pct(sw.get("pct_read"))] if read else []) + [_tf(sw.get("tflops"))]
        row += [_pct(sw.get("pct_gemm"))] if gemm else []
        if anchor:
            row += [_us(p.get("anchor_vllm_gemm_us")), _x(sw.get("speedup_vs_anchor"))]
        for bname in baselines:
            r = p["results"].get(bname)
            row += [_us(r["time_us"]) if r else "n/a", _x((sw.get("speedup_vs") or {}).get(bname))]
        if paired:
            row += [_paired_delta(p.get("routing_overhead"))]
        rows.append(row)
    return head, rows


def _paired_delta(o: Optional[dict]) -> str:
    """fused_moe - fused_experts over the paired rounds: "+2.6 (+2.3..+2.8)"."""
    if not o:
        return "n/a"
    return f"{o['delta_us']:+.1f} ({o['delta_min_us']:+.1f}..{o['delta_max_us']:+.1f})"


def format_table(rec: dict) -> str:
    head, rows = table_rows(rec)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = header_lines(rec)
    lines.append("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for r in rows:
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    hows: Dict[str, set] = {}
    for p in rec["points"]:
        for name, r in p["results"].items():
            hows.setdefault(name, set()).add(r["how"])
    odd = {n: h for n, h in hows.items() if h != {"graph"} and rec["mode"] == "gpu"}
    for n, h in odd.items():
        lines.append(f"note: {n} timed as {', '.join(sorted(h))}")
    diff = [f"M={p['M']}: {p['experts_touched']} vs {p['anchor_experts_touched']}" for p in rec["points"]
            if p.get("anchor_experts_touched") not in (None, p["experts_touched"])]
    if diff:
        lines.append("note: experts touched here vs in the anchor run differ at " + "; ".join(diff))
    for p in rec["points"]:
        for n, err in (p.get("errors") or {}).items():
            lines.append(f"error: {n} at M={p['M']}: {err}")
    for n, why in rec["skipped"].items():
        lines.append(f"skipped: {n}: {why}")
    for note in rec["notes"]:
        lines.append(f"note: {note}")
    if rec.get("aborted"):
        lines.append(f"RUN ABORTED {rec['aborted']}")
    if rec["mode"] == "gpu":
        lines.append("x_<impl> = that time / swapmoe time (> 1: swapmoe faster); TF/s = 2*slots*3*N*K / time; "
                     "plan = the oracle's backend")
    if baselines_shown(rec):
        lines.append("baselines: " + "; ".join(f"{B.SHORT_NAMES.get(n, n)} = {BASELINE_WHAT.get(n, n)}"
                                               for n in baselines_shown(rec)))
    rounds = {p["routing_overhead"]["rounds"] for p in rec["points"] if p.get("routing_overhead")}
    if rounds:
        n = "/".join(map(str, sorted(rounds)))
        lines.append(f"moe-exp_us = fused_moe - fused_experts, µs per layer, timed again in {n} "
                     "rounds of alternating order: the mean of the two orders' medians of the per-round "
                     "differences (min..max over rounds); the two _us columns were timed one after the other")
    return "\n".join(lines)


def csv_text(rec: dict) -> str:
    impls = rec["implementations"]
    head = ["M", "experts_touched", "slots", "floor_us", "anchor_vllm_gemm_us", "plan"]
    for n in impls:
        head += [f"{n}_us", f"{n}_pct_floor", f"{n}_tflops", f"{n}_pct_gemm", f"{n}_x_anchor"]
    head += [f"swapmoe_x_{n}" for n in impls if n != B.IMPL_SWAPMOE]
    head += ["read_floor_us"] + [f"{n}_pct_read" for n in impls]
    paired = any(p.get("routing_overhead") for p in rec["points"])
    if paired:
        head += ["fused_moe_minus_experts_paired_us", "fused_moe_minus_experts_paired_min_us",
                 "fused_moe_minus_experts_paired_max_us", "fused_moe_minus_experts_order_effect_us"]

    def f(v: Any) -> str:
        return "" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v))

    out = [",".join(head)]
    for p in rec["points"]:
        row = [p["M"], p["experts_touched"], p["slots"], p["floor_us"], p["anchor_vllm_gemm_us"], _plan(p)]
        for n in impls:
            r = p["results"].get(n, {})
            row += [r.get("time_us"), r.get("pct_floor"), r.get("tflops"), r.get("pct_gemm"),
                    r.get("speedup_vs_anchor")]
        sw = p["results"].get(B.IMPL_SWAPMOE, {}).get("speedup_vs") or {}
        row += [sw.get(n) for n in impls if n != B.IMPL_SWAPMOE]
        row += [p.get("read_floor_us")] + [p["results"].get(n, {}).get("pct_read") for n in impls]
        if paired:
            o = p.get("routing_overhead") or {}
            row += [o.get("delta_us"), o.get("delta_min_us"), o.get("delta_max_us"), o.get("order_effect_us")]
        out.append(",".join(f(v) for v in row))
    return "\n".join(out) + "\n"


def _explain_tables_line() -> str:
    from . import _core

    info = _core.tables_info()
    n_ok = sum(1 for f in info["files"] if f["ok"])
    bad = [f["file"] for f in info["files"] if not f["ok"]]
    line = (f"tables: {n_ok} loaded from {info['shipped_dir'] or '(no shipped folder)'}"
            f" and $SWAPMOE_TABLES_DIR={info['user_dir'] or '(unset)'}")
    if bad:
        line += f"; malformed, ignored: {', '.join(bad)}"
    for e in info["dir_errors"]:
        line += f"; {e}"
    return line


def _as_flag(msg: str, args: argparse.Namespace) -> str:
    """A select_backend error as the command line's: the argument it names becomes the flag
    that gave it (``num_tokens: ...`` -> ``--m: ...``)."""
    capability = "--capability" if args.capability else "--device-name (or --capability)"
    flags = {
        "num_tokens": "--m",
        "quant": f"--quant {args.quant}",
        "activation_scales": "--activation-scales",
        "device_capability": capability,
        "device_name": "--device-name",
        "backend": "--backend",
        "external_backends": "--external-backends",
        "dtype": "--dtype",
    }
    name, sep, rest = msg.partition(": ")
    return f"{flags[name]}: {rest}" if sep and name in flags else msg


def cmd_explain(args: argparse.Namespace) -> int:
    import swapmoe

    shape = _shape_from_args(args)
    if shape is None:  # argparse requires one of the shape flags; a caller of cmd_explain may not
        raise B.BenchError("explain: name the shape: --model, --shape E,topk,K,N or --hf-config")
    quant = None if args.quant == "none" else args.quant
    external = [v for v in (args.external_backends or "").replace(" ", "").split(",") if v]
    cap = None
    if args.capability:
        try:
            major, minor = (int(v) for v in args.capability.split("."))
            cap = (major, minor)
        except ValueError:
            print(f"swapmoe explain: error: --capability: expected MAJOR.MINOR, got {args.capability!r}",
                  file=sys.stderr)
            return 2
    print(f"swapmoe {swapmoe.__version__} explain: {shape.name}  E={shape.E} topk={shape.topk} "
          f"K={shape.K} N={shape.N}  {args.dtype}" + (f" {quant}" if quant else ""))
    print(_explain_tables_line())
    for m in B.parse_m_list(args.m):
        try:
            plan = swapmoe.select_backend(m, shape.E, shape.topk, shape.K, shape.N, dtype=args.dtype, quant=quant,
                                          device_capability=cap, device_name=args.device_name,
                                          backend=args.backend, external_backends=external,
                                          activation_scales=args.activation_scales,
                                          global_num_experts=shape.E_global)
        except swapmoe.Error as e:
            print(f"swapmoe explain: error: {_as_flag(str(e), args)}", file=sys.stderr)
            return 2
        t = plan.tile
        fallback = f"; swapmoe fallback {plan.fallback}" if plan.fallback else ""
        print(f"\nM={m}: {plan.backend} ({plan.source}; swap_ab={plan.swap_ab}{fallback}) on {plan.device_name} "
              f"sm_{plan.device_capability[0]}{plan.device_capability[1]}")
        if plan.table:
            used = "used" if plan.source == "table" else "not used, see the reasons"
            print(f"  table: {plan.table} entry M={plan.table_m} ({used})")
        else:
            print("  table: none for this shape, dtype and device")
        print(f"  kernels: {', '.join(t['kernels'])}")
        splits = t.get("splits", (1, 1))
        clusters = f" clusters: gemm1 {splits[0]}, gemm2 {splits[1]}" if tuple(splits) != (1, 1) else ""
        if t.get("align_ctas", 1) > 1:
            clusters += f" align_ctas={t['align_ctas']}"
        if t.get("align_in_gemm1"):
            clusters += " align=gemm1"
        if t.get("swap_gemm1_ring", 0) > 0:
            clusters += f" gemm1_ring={t['swap_gemm1_ring']}"
        if t.get("swap_gemm2_ring", 0) > 0:
            clusters += f" gemm2_ring={t['swap_gemm2_ring']}"
        if plan.backend == "cuda_wgmma_swap" and t.get("pdl") and not t.get("swap_gemm2_pdl", True):
            clusters += " gemm2_after_gemm1"
        if t.get("wgmma_gemm1_pdl"):
            clusters += " gemm1_pdl"
        print(f"  rows_per_cta={t['rows_per_cta']} tokens_per_pass={t['tokens_per_pass']} "
              f"gemm1_vec={t['gemm1_vec']} gemm2_vec={t['gemm2_vec']} pdl={t['pdl']} "
              f"first_kernel_pdl={t['first_kernel_pdl']}{clusters}")
        for r in plan.reasons:
            print(f"  - {r}")
    return 0


def _tune_shapes(args: argparse.Namespace) -> List[B.MoeShape]:
    explicit = [args.num_experts, args.hidden, args.intermediate, args.topk]
    if any(v is not None for v in explicit):
        if args.model or args.shape or args.hf_config:
            raise B.BenchError("-E/-K/-N/--topk: give them instead of --model, --shape or --hf-config, not with")
        if any(v is None for v in explicit):
            raise B.BenchError("-E/-K/-N/--topk: give all four")
        E, K, N, topk = explicit
        return [B.shard_shape(f"shape-{E}x{topk}x{K}x{N}", E, topk, K, N, args.tp, args.ep, "shape")]
    if args.model:
        names = [n for n in args.model.replace(" ", "").split(",") if n]
        return [B.preset_shape(n, args.tp, args.ep) for n in names]
    shape = _shape_from_args(args)
    if shape is None:
        raise B.BenchError("tune: name the shapes: --model NAME[,NAME...], --shape E,topk,K,N, -E -K -N --topk, "
                           "or --hf-config")
    return [shape]


def cmd_tune(args: argparse.Namespace) -> int:
    from . import tune as T

    shapes = _tune_shapes(args)
    ms = B.parse_m_list(args.m)

    def log(msg: str) -> None:
        print(f"swapmoe tune: {msg}", file=sys.stderr)

    summaries = T.run_tune(shapes, out_dir=args.out_dir, dtype=args.dtype, quant=args.quant, m_list=ms,
                           force=args.force, layers=args.layers, vllm=args.vllm, check=args.check,
                           prune=args.prune, device=args.device, seed=args.seed, progress=args.progress, log=log,
                           flashinfer=args.flashinfer, per_hidden_size=args.per_hidden_size)
    print(T.format_summary(summaries))
    out = os.path.dirname(summaries[0]["path"]) if summaries else args.out_dir
    print(f"swapmoe tune: tables in {out}; use them with SWAPMOE_TABLES_DIR={out} "
          f"(check with: swapmoe explain --model ... --m ...)", file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    B.check_output_paths(json=args.json, csv=args.csv, plot=args.plot)
    if args.routing_rounds is not None and not args.with_routing:
        raise B.BenchError("--routing-rounds: only with --with-routing (the rounds pair fused_moe with fused_experts)")
    rounds = B.ROUTING_ROUNDS if args.routing_rounds is None else args.routing_rounds
    shape = _bench_shape_from_args(args)
    ms = B.parse_m_list(args.m) if args.m else None

    def log(msg: str) -> None:
        print(f"swapmoe bench: {msg}", file=sys.stderr)

    rec = B.run_bench(shape, dtype=args.dtype, quant=args.quant, m_list=ms, routing=args.routing, zipf_s=args.zipf_s,
                      layers=args.layers, graph=args.graph, baselines=args.baselines, check=args.check,
                      check_all=args.check_all, device=args.device, seed=args.seed, anchors=args.anchors,
                      read_bw_tbps=args.read_bw, gemm_tflops=args.gemm_tflops, progress=args.progress, log=log,
                      with_routing=args.with_routing, read_floor=args.read_floor,
                      routing_rounds=rounds)
    if args.json:
        B.write_json(rec, args.json)
    if args.plot:
        B.plot_record(rec, args.plot)
    if args.csv == "-":
        sys.stdout.write(csv_text(rec))
    else:
        print(format_table(rec))
        if args.csv:
            with open(args.csv, "w", encoding="utf-8") as f:
                f.write(csv_text(rec))
    for what, path in (("json", args.json), ("csv", args.csv if args.csv != "-" else None), ("plot", args.plot)):
        if path:
            print(f"swapmoe bench: wrote {what} to {path}", file=sys.stderr)
    chk = rec.get("check")
    return 1 if (chk and not chk["ok"]) or rec.get("aborted") else 0


# --------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------


def _kib(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def cmd_check(args: argparse.Namespace) -> int:
    import swapmoe
    from . import _core

    info = swapmoe.build_info()
    print(f"swapmoe {swapmoe.__version__} ({info.get('profile', '?')} build)")
    for line in build_kind_lines(info):
        print(line)
    print(f"nvcc: {info.get('nvcc_version', '?')}")
    print(f"embedded targets: {', '.join(info.get('targets', [])) or 'none'}")
    mods = info.get("modules", [])
    print(f"modules: {', '.join(f'{n} ({_kib(int(sz))})' for n, sz in mods) or 'none'}")
    print(f"kernels: {len(info.get('kernels', []))}")
    try:
        dv = int(_core.driver_version())
        print(f"cuda driver: {B.format_driver(dv)} ({dv})")
        devices = []
        for i in range(64):
            try:
                devices.append(dict(_core.device_info(i)))
            except swapmoe.Error:
                break
        if not devices:
            print("devices: none")
        for d in devices:
            cap = d.get("capability")
            cap_s = ".".join(map(str, cap)) if isinstance(cap, (tuple, list)) else str(cap)
            print(f"device {d.get('ordinal')}: {d.get('name')} (compute {cap_s}, {d.get('sm_count')} SMs)")
    except swapmoe.CudaError as e:
        print(f"cuda driver: no CUDA driver ({e})")
        print("devices: none")
    try:
        import torch

        cuda = torch.cuda.is_available()
        extra = f", {torch.cuda.device_count()} device(s)" if cuda else ""
        print(f"torch: {torch.__version__} (built for CUDA {torch.version.cuda or 'none'}; "
              f"cuda available: {cuda}{extra})")
    except ImportError:
        print("torch: not installed")
    try:
        import triton

        print(f"triton: {triton.__version__}")
    except Exception:
        print("triton: not installed")
    try:
        import vllm  # type: ignore[import-not-found]

        print(f"vllm: {getattr(vllm, '__version__', None) or B._version('vllm') or 'unknown version'}")
    except ImportError:
        print("vllm: not installed")
    except Exception as e:  # installed but broken
        print(f"vllm: installed but import failed ({type(e).__name__}: {e})")
    print(f"vllm plugin: {_plugin_state()}")
    print(_explain_tables_line().replace("tables:", "tuned tables:", 1) +
          "; without a table entry the oracle uses the heuristics in src/oracle.rs")
    for f in _core.tables_info()["files"]:
        state = f"{f['entries']} M points" if f["ok"] else f"MALFORMED, ignored: {f['error']}"
        print(f"  {f['origin']}: {f['file']} ({state})")
    return 0


def _plugin_state() -> str:
    """Whether vLLM would load swapmoe's plugin here, and what it would do."""
    import os
    from importlib.metadata import entry_points, version

    from . import vllm_plugin as P

    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.value.startswith("swapmoe.")]
    if not eps:
        return "entry point not installed (install the swapmoe package with pip); vLLM keeps its own MoE kernels"
    lo, hi = P.SUPPORTED_VLLM
    where = f"entry point {eps[0].name} = {eps[0].value}; supports vLLM >={P._fmt(lo)},<{P._fmt(hi)}"
    if os.environ.get(P.DISABLE_ENV, "").strip() not in ("", "0"):
        return f"{where}; disabled by {P.DISABLE_ENV}={os.environ[P.DISABLE_ENV]}"
    try:
        have = version("vllm")
    except Exception:
        return f"{where}; inactive (vLLM is not installed)"
    if not (lo <= P._parse_version(have) < hi):
        return f"{where}; inactive: vLLM {have} is outside the range"
    return f"{where}; active for vLLM {have} on CUDA GPUs of compute capability >= 8.0"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except B.BenchError as e:
        print(f"swapmoe {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`swapmoe explain ... | head`): stop quietly, as coreutils do;
        # stdout points at /dev/null so that the interpreter's final flush cannot fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
