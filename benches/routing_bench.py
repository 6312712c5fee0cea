"""fused_moe (router on the GPU + fused experts) against fused_experts on precomputed ids,
and against routing done by separate torch kernels, per layer in a CUDA graph of 8 layers
on distinct weight copies (L2 flushed, do_bench median). Issue 3's measurement.

    python benches/routing_bench.py [--m 1,8,64] [--shapes qwen3-30b-a3b,deepseek-v3-tp8] [--json out.json]
"""

import argparse
import json
import os

import torch
import triton.testing

import swapmoe
from swapmoe.bench import paired_difference

SHAPES = {
    # name: (E, topk, K, N, router kwargs)
    "qwen3-30b-a3b": (128, 8, 2048, 768, dict(renormalize=True, scoring="softmax")),
    "deepseek-v3-tp8": (256, 8, 7168, 256, dict(renormalize=True, scoring="sigmoid", num_expert_group=8,
                                                 topk_group=4, routed_scaling_factor=2.5)),
}


def torch_router(logits, topk, kw, bias):
    """vLLM-style routing in separate torch kernels (for the comparison only)."""
    if kw["scoring"] == "softmax":
        w, i = torch.topk(torch.softmax(logits.float(), -1), topk)
        return w / w.sum(-1, keepdim=True), i.to(torch.int32)
    scores = logits.float().sigmoid()
    biased = scores + bias
    M, E = logits.shape
    g = kw["num_expert_group"]
    gs = biased.view(M, g, -1).topk(2, -1)[0].sum(-1)
    gidx = gs.topk(kw["topk_group"], -1)[1]
    mask = torch.zeros_like(gs).scatter_(1, gidx, 1).unsqueeze(-1).expand(M, g, E // g).reshape(M, E)
    ids = biased.masked_fill(mask == 0, float("-inf")).topk(topk, -1)[1]
    w = scores.gather(1, ids)
    w = w / w.sum(-1, keepdim=True) * kw["routed_scaling_factor"]
    return w, ids.to(torch.int32)


def capture(fn, layers):
    """A CUDA graph of `layers` calls fn(0..layers-1)."""
    fn(0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for i in range(layers):
                fn(i)
    return g


def time_graphs(graphs, layers, rounds):
    """Per-layer µs of each graph: the median over `rounds` rounds that replay the graphs in
    turn (do_bench median each), in order on even rounds and reversed on odd ones, so that
    clock and thermal drift, and a graph's position in the round, fall on all of them alike.
    The differences between them are what this bench reports."""
    times = {name: [] for name in graphs}
    names = list(graphs)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(triton.testing.do_bench(graphs[name].replay, return_mode="median") * 1000 / layers)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}, times


def paired_delta(times, a, b):
    """(a - b) within each round: the mean of the two orders' medians (`swapmoe bench`'s
    paired_difference: a position effect cancels), min and max over rounds."""
    d = paired_difference(times[a], times[b])
    return d["estimate"], d["min"], d["max"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,8,64")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6,
                    help="timing rounds per point, of alternating order (even: as many in each order)")
    ap.add_argument("--json")
    a = ap.parse_args()
    shapes = a.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {unknown}, expected names of {list(SHAPES)}")
    swapmoe.warmup(0)
    rows = []
    print(f"{'shape':16s} {'M':>4s} {'experts_us':>10s} {'fused_moe_us':>12s} {'delta_us':>8s} "
          f"{'paired delta (min..max)':>23s} "
          f"{'warp_router':>11s} {'delta':>8s} {'cta_router':>10s} {'delta':>8s} {'fusion_on':>10s} {'delta':>8s} {'torch_route+experts_us':>22s} "
          f"{'router kernel':>26s} {'alone/warp/cta':>17s} {'router (on)':>16s} {'launches moe/on/experts':>24s} "
          f"{'max|diff|':>9s} {'experts+noop/noop':>17s} {'first kernel w/o PDL: experts/moe/moe(cta)':>44s} "
          f"{'moe, first kernel with PDL (delta)':>34s}")
    for name in shapes:
        E, topk, K, N, kw = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        w1 = (torch.randn(E, 2 * N, K, device="cuda", generator=gen) / K**0.5).to(torch.bfloat16)
        w2 = (torch.randn(E, K, N, device="cuda", generator=gen) / N**0.5).to(torch.bfloat16)
        w1s = [w1.clone() for _ in range(a.layers)]
        w2s = [w2.clone() for _ in range(a.layers)]
        del w1, w2
        bias = (torch.randn(E, device="cuda", generator=gen) * 0.1) if kw["scoring"] == "sigmoid" else None
        kwb = dict(kw, e_score_correction_bias=bias) if bias is not None else kw
        for M in [int(v) for v in a.m.split(",")]:
            x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
            logits = torch.randn(M, E, device="cuda", generator=gen)
            tw, ids = swapmoe.select_experts(logits, topk, **kwb)
            out = torch.empty_like(x)
            moe = lambda i: swapmoe.fused_moe(x, w1s[i], w2s[i], logits, topk, out=out, **kwb)  # noqa: E731
            graphs = dict(
                experts=capture(lambda i: swapmoe.fused_experts(x, w1s[i], w2s[i], tw, ids, out=out), a.layers),
                moe=capture(moe, a.layers),
            )
            # fused_experts with a one-element torch kernel (launched without PDL) after each
            # layer: tells whether chaining one layer's GEMM2 to the next layer's GEMM1 by PDL
            # changes fused_experts' time (fused_moe puts its router between them).
            pad = torch.zeros(1, device="cuda")
            graphs["experts_then_noop"] = capture(
                lambda i: (swapmoe.fused_experts(x, w1s[i], w2s[i], tw, ids, out=out), pad.add_(1)), a.layers)
            graphs["noop"] = capture(lambda i: pad.add_(1), a.layers)
            route = lambda i: swapmoe.select_experts(logits, topk, **kwb)  # noqa: E731
            graphs["router"] = capture(route, a.layers)
            os.environ["SWAPMOE_ROUTER_KERNEL"] = "warp"  # the warp router where the CTA router applies
            try:
                graphs["warp"] = capture(moe, a.layers)
                graphs["warp_router"] = capture(route, a.layers)
                os.environ["SWAPMOE_ROUTER_KERNEL"] = "cta"  # the CTA router at any M, where it applies
                graphs["cta"] = capture(moe, a.layers)
                graphs["cta_router"] = capture(route, a.layers)
            finally:
                del os.environ["SWAPMOE_ROUTER_KERNEL"]
            # The op's first kernel launched without PDL ($SWAPMOE_FIRST_KERNEL_PDL=off): whether
            # its CTAs, placed while the previous layer's last kernel still runs, cost time.
            os.environ["SWAPMOE_FIRST_KERNEL_PDL"] = "off"
            try:
                graphs["experts_nopdl"] = capture(
                    lambda i: swapmoe.fused_experts(x, w1s[i], w2s[i], tw, ids, out=out), a.layers)
                graphs["moe_nopdl"] = capture(moe, a.layers)
                os.environ["SWAPMOE_ROUTER_KERNEL"] = "cta"  # and the CTA router, where it applies
                graphs["cta_nopdl"] = capture(moe, a.layers)
            finally:
                del os.environ["SWAPMOE_FIRST_KERNEL_PDL"]
                os.environ.pop("SWAPMOE_ROUTER_KERNEL", None)
            # ... and with PDL ($SWAPMOE_FIRST_KERNEL_PDL=on): fused_moe's router where the
            # oracle launches it without (one-wave GEMM1 rule, CTA router past M = 16)
            os.environ["SWAPMOE_FIRST_KERNEL_PDL"] = "on"
            try:
                graphs["moe_pdl"] = capture(moe, a.layers)
            finally:
                del os.environ["SWAPMOE_FIRST_KERNEL_PDL"]
            os.environ["SWAPMOE_ROUTER_FUSION"] = "on"  # the routing twins, where M allows
            try:
                graphs["twin"] = capture(moe, a.layers)
                plan_twin = swapmoe._core.describe_plan(x, w1s[0], w2s[0], tw, ids, fused_moe=True)
            finally:
                del os.environ["SWAPMOE_ROUTER_FUSION"]
            graphs["torch_routing"] = capture(
                lambda i: swapmoe.fused_experts(x, w1s[i], w2s[i], *torch_router(logits, topk, kw, bias), out=out),
                a.layers)
            t, per_round = time_graphs(graphs, a.layers, a.rounds)
            paired, paired_min, paired_max = paired_delta(per_round, "moe", "experts")
            t_exp, t_moe, t_warp, t_twin, t_sep = (t[k] for k in ("experts", "moe", "warp", "twin", "torch_routing"))
            t_router, t_warp_router, t_cta, t_cta_router = t["router"], t["warp_router"], t["cta"], t["cta_router"]
            t_exp_noop, t_noop = t["experts_then_noop"], t["noop"]
            t_exp_nopdl, t_moe_nopdl, t_cta_nopdl = t["experts_nopdl"], t["moe_nopdl"], t["cta_nopdl"]
            t_moe_pdl = t["moe_pdl"]
            del graphs
            ref_out = swapmoe.fused_experts(x, w1s[0], w2s[0], *torch_router(logits, topk, kw, bias))
            moe_out = swapmoe.fused_moe(x, w1s[0], w2s[0], logits, topk, **kwb)
            diff = (ref_out.float() - moe_out.float()).abs().max().item()
            plan = swapmoe._core.describe_plan(x, w1s[0], w2s[0], tw, ids)
            plan_moe = swapmoe._core.describe_plan(x, w1s[0], w2s[0], tw, ids, fused_moe=True,
                                                   scoring=kw["scoring"],
                                                   num_expert_group=kw.get("num_expert_group"))
            rows.append(dict(shape=name, M=M, fused_experts_us=t_exp, fused_moe_us=t_moe,
                             fused_moe_fusion_on_us=t_twin, fused_moe_warp_router_us=t_warp,
                             delta_warp_router_us=t_warp - t_exp, router_kernel=plan_moe["kernels"][0],
                             router_alone_us=t_router, warp_router_alone_us=t_warp_router,
                             fused_moe_cta_router_us=t_cta, delta_cta_router_us=t_cta - t_exp,
                             cta_router_alone_us=t_cta_router, fused_experts_then_noop_us=t_exp_noop,
                             noop_alone_us=t_noop, fused_experts_first_pdl_off_us=t_exp_nopdl,
                             fused_moe_cta_router_first_pdl_off_us=t_cta_nopdl,
                             fused_moe_first_pdl_off_us=t_moe_nopdl, fused_moe_first_pdl_on_us=t_moe_pdl,
                             torch_routing_plus_experts_us=t_sep, delta_us=t_moe - t_exp,
                             delta_paired_us=paired, delta_paired_min_us=paired_min,
                             delta_paired_max_us=paired_max,
                             fused_experts_rounds_us=per_round["experts"], fused_moe_rounds_us=per_round["moe"],
                             delta_fusion_on_us=t_twin - t_exp,
                             router=plan_moe["router"], router_fusion_on=plan_twin["router"],
                             launches_fused_moe=len(plan_moe["kernels"]),
                             launches_fusion_on=len(plan_twin["kernels"]),
                             launches_fused_experts=len(plan["kernels"]),
                             backend=plan["backend"], max_abs_diff_vs_torch_routing=diff))
            print(f"{name:16s} {M:4d} {t_exp:10.1f} {t_moe:12.1f} {t_moe - t_exp:8.1f} "
                  f"{f'{paired:+.1f} ({paired_min:+.1f}..{paired_max:+.1f})':>23s} {t_warp:11.1f} "
                  f"{t_warp - t_exp:8.1f} {t_cta:10.1f} {t_cta - t_exp:8.1f} {t_twin:10.1f} "
                  f"{t_twin - t_exp:8.1f} {t_sep:22.1f} {plan_moe['kernels'][0]:>26s} {t_router:5.1f}/{t_warp_router:5.1f}/{t_cta_router:5.1f} {plan_twin['router']:>16s} "
                  f"{len(plan_moe['kernels']):>3d}/{len(plan_twin['kernels'])}/{len(plan['kernels']):<3d} {diff:9.2e} "
                  f"{t_exp_noop:10.1f}/{t_noop:5.1f} {t_exp_nopdl:16.1f}/{t_moe_nopdl:.1f}/{t_cta_nopdl:<16.1f} "
                  f"{t_moe_pdl:26.1f} ({t_moe_pdl - t_exp:+.1f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), layers=a.layers, rounds=a.rounds, rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
