"""`swapmoe bench --with-routing` runs each model's own router (CPU runs on small shapes)."""

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

import swapmoe  # noqa: E402
from swapmoe import bench as B  # noqa: E402
from swapmoe import cli  # noqa: E402


def _small(name, K=64, N=32):
    """The preset's experts, topk and router on small K and N (CPU-sized weights)."""
    return dataclasses.replace(B.preset_shape(name), K=K, N=N)


def _run(shape, **kw):
    kw = dict(dict(device="cpu", m_list=[1, 5], with_routing=True, progress=False, layers=1), **kw)
    return B.run_bench(shape, **kw)


# ---- the routers the presets, configs and --router name -----------------------------------


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v3-tp8"])
def test_deepseek_presets_route_grouped_sigmoid_with_bias_and_scaling(name):
    r = B.preset_shape(name, tp=1).router
    assert (r.scoring, r.renormalize, r.num_expert_group, r.topk_group, r.correction_bias,
            r.routed_scaling_factor) == ("sigmoid", True, 8, 4, True, 2.5)
    assert r.origin == f"{name} preset"
    kw = r.kwargs(bias="BIAS")
    assert kw == dict(renormalize=True, scoring="sigmoid", num_expert_group=8, topk_group=4,
                      e_score_correction_bias="BIAS", routed_scaling_factor=2.5)
    # sharding keeps the model's router
    assert B.preset_shape(name, ep=8).router == r


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "mixtral-8x22b",
                                  "gpt-oss-120b"])
def test_softmax_presets_renormalize(name):
    r = B.preset_shape(name).router
    assert (r.scoring, r.renormalize, r.num_expert_group, r.correction_bias, r.routed_scaling_factor) == (
        "softmax", True, None, False, 1.0)
    assert r.kwargs(bias="ignored")["e_score_correction_bias"] is None


def test_every_preset_names_its_router():
    assert set(B.PRESET_ROUTERS) == set(B.PRESETS)
    r = B.preset_shape("llama4-scout").router
    assert (r.scoring, r.renormalize, r.num_expert_group) == ("sigmoid", False, None)


def test_shapes_without_a_router_keep_softmax_without_renormalize():
    assert B.parse_shape("16,4,64,32").router is None
    assert (B.DEFAULT_ROUTER.scoring, B.DEFAULT_ROUTER.renormalize) == ("softmax", False)
    assert "router" not in B.preset_shape("deepseek-v3").as_dict()  # the shape's JSON is unchanged


@pytest.mark.parametrize("cfg, expect", [
    ({"model_type": "deepseek_v3", "n_routed_experts": 256, "num_experts_per_tok": 8, "hidden_size": 7168,
      "moe_intermediate_size": 2048, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 8,
      "topk_group": 4, "norm_topk_prob": True, "routed_scaling_factor": 2.5},
     ("sigmoid", True, 8, 4, True, 2.5)),
    ({"model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "hidden_size": 2048,
      "moe_intermediate_size": 768, "norm_topk_prob": True}, ("softmax", True, None, None, False, 1.0)),
    ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 4096,
      "intermediate_size": 14336}, ("softmax", True, None, None, False, 1.0)),
    ({"model_type": "llama4", "text_config": {"model_type": "llama4_text", "num_local_experts": 16,
                                              "num_experts_per_tok": 1, "hidden_size": 5120,
                                              "intermediate_size": 8192}},
     ("sigmoid", False, None, None, False, 1.0)),
])
def test_hf_config_router(tmp_path, cfg, expect):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    r = B.hf_config_shape(str(p)).router
    got = (r.scoring, r.renormalize, r.num_expert_group, r.topk_group, r.correction_bias, r.routed_scaling_factor)
    assert got == expect


def test_hf_config_without_router_keys_has_none(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"num_experts": 8, "num_experts_per_tok": 2, "hidden_size": 64,
                             "moe_intermediate_size": 32}))
    assert B.hf_config_shape(str(p)).router is None


def test_parse_router():
    r = B.parse_router("sigmoid,renorm,groups=4/2,bias,scale=2.5")
    assert (r.scoring, r.renormalize, r.num_expert_group, r.topk_group, r.correction_bias,
            r.routed_scaling_factor) == ("sigmoid", True, 4, 2, True, 2.5)
    assert B.parse_router("softmax") == dataclasses.replace(B.DEFAULT_ROUTER, origin="--router softmax")
    d = B.parse_router("DeepSeek-V3")
    assert dataclasses.replace(d, origin="") == dataclasses.replace(B.DEEPSEEK_V3_ROUTER, origin="")
    for bad in ("", "relu", "softmax,groups=4", "softmax,groups=x/2", "sigmoid,scale=-1", "softmax,topk=3",
                "sigmoid,groups=0/0"):
        with pytest.raises(B.BenchError, match="--router"):
            B.parse_router(bad)


def test_router_check_rejects_what_cannot_route():
    r = B.parse_router("sigmoid,groups=8/4,bias")
    r.check(32, 4)
    with pytest.raises(B.BenchError, match="do not divide"):
        r.check(36, 4)
    with pytest.raises(B.BenchError, match="topk=20"):
        r.check(32, 20)  # 4 groups of 4 hold 16
    with pytest.raises(B.BenchError, match="do not divide"):
        _run(dataclasses.replace(B.parse_shape("12,2,64,32"), router=r), m_list=[1])


def test_correction_bias_is_fixed_by_the_seed():
    a = B.make_correction_bias(torch, B.DEEPSEEK_V3_ROUTER, 256, 7, torch.device("cpu"))
    b = B.make_correction_bias(torch, B.DEEPSEEK_V3_ROUTER, 256, 7, torch.device("cpu"))
    c = B.make_correction_bias(torch, B.DEEPSEEK_V3_ROUTER, 256, 8, torch.device("cpu"))
    assert a.dtype == torch.float32 and a.shape == (256,) and torch.equal(a, b) and not torch.equal(a, c)
    assert B.make_correction_bias(torch, B.SOFTMAX_RENORM, 256, 7, torch.device("cpu")) is None


# ---- the with-routing column on the router's ids ------------------------------------------------


def test_deepseek_run_passes_its_router_and_bias_to_fused_moe(monkeypatch):
    """fused_moe gets the DeepSeek router's arguments with the bias made once for the shape,
    and fused_experts runs on the ids that router picks."""
    calls, seen_ids = [], []
    real_moe, real_experts = swapmoe.fused_moe, swapmoe.fused_experts

    def spy_moe(x, w1, w2, logits, topk, **kw):
        calls.append(kw)
        return real_moe(x, w1, w2, logits, topk, **kw)

    def spy_experts(x, w1, w2, tw, ids, **kw):
        seen_ids.append(ids)
        return real_experts(x, w1, w2, tw, ids, **kw)

    monkeypatch.setattr(swapmoe, "fused_moe", spy_moe)
    monkeypatch.setattr(swapmoe, "fused_experts", spy_experts)
    shape = _small("deepseek-v3-tp8")
    rec = _run(shape, m_list=[1, 3])
    assert rec["check"]["ok"] and rec["check"]["results"][B.IMPL_ROUTED]["ok"]
    assert calls
    bias = calls[0]["e_score_correction_bias"]
    assert bias is not None and bias.shape == (256,) and bias.dtype == torch.float32
    for kw in calls:
        assert (kw["scoring"], kw["renormalize"], kw["num_expert_group"], kw["topk_group"],
                kw["routed_scaling_factor"]) == ("sigmoid", True, 8, 4, 2.5)
        assert kw["e_score_correction_bias"] is bias  # one bias per shape
    assert torch.equal(bias, B.make_correction_bias(torch, shape.router, 256, 0, torch.device("cpu")))
    r = rec["routing"]["router"]
    assert (r["scoring"], r["num_expert_group"], r["topk_group"], r["correction_bias"],
            r["routed_scaling_factor"], r["renormalize"]) == ("sigmoid", 8, 4, True, 2.5, True)
    assert "deepseek-v3-tp8 preset" == r["origin"] and "randn(E_global=256)" in r["e_score_correction_bias"]
    # every fused_experts call ran on the router's ids, and experts touched are theirs
    for p in rec["points"]:
        assert p["router_ids_match"] is True
        gen = torch.Generator().manual_seed(0)
        logits = []
        B.make_routing(torch, p["M"], 256, 8, "uniform", gen, torch.device("cpu"), logits_out=logits)
        _, ids = B.router_ids(torch, logits[0], 8, shape.router, bias)
        assert p["experts_touched"] == len(torch.unique(ids))
        assert any(i.shape == ids.shape and torch.equal(i, ids) for i in seen_ids)


def test_qwen3_run_routes_softmax_renormalized(monkeypatch):
    calls = []
    real_moe = swapmoe.fused_moe
    monkeypatch.setattr(swapmoe, "fused_moe", lambda *a, **kw: (calls.append(kw), real_moe(*a, **kw))[1])
    rec = _run(_small("qwen3-30b-a3b"), m_list=[2])
    assert rec["check"]["results"][B.IMPL_ROUTED]["ok"]
    assert {(kw["scoring"], kw["renormalize"], kw["num_expert_group"], kw["e_score_correction_bias"],
             kw["routed_scaling_factor"]) for kw in calls} == {("softmax", True, None, None, 1.0)}
    assert rec["routing"]["router"]["describe"] == "softmax top-8, renormalize"


def test_deepseek_like_shape_checks_at_every_m_on_cpu():
    """A --shape with the DeepSeek router scaled down (32 experts in 8 groups): the float64
    check of fused_moe passes at every M, with expert parallelism too."""
    router = B.parse_router("sigmoid,renorm,groups=8/4,bias,scale=2.5")
    for ep in (1, 2):
        shape = dataclasses.replace(B.parse_shape("32,4,64,32", ep=ep), router=router)
        rec = _run(shape, m_list=[1, 4, 9], check_all=True)
        assert rec["check"]["ok"] and not rec["check"].get("failed_M")
        assert rec["check"]["results"][B.IMPL_ROUTED]["ok"]
        for p in rec["points"]:
            assert p["router_ids_match"] is True and p["results"][B.IMPL_ROUTED]["time_us"] > 0


def test_check_fails_when_its_ids_are_not_the_routers(monkeypatch):
    """The check holds fused_moe to the router's ids: given the softmax ids of --routing
    uniform instead (what the bench used before it ran model routers), fused_moe fails it
    while fused_experts on those ids still passes."""
    router = B.parse_router("sigmoid,renorm,groups=8/4,bias,scale=2.5")
    shape = dataclasses.replace(B.parse_shape("32,4,64,32"), router=router)

    def softmax_ids(torch_, logits, topk, router_, bias):
        w, i = torch_.topk(torch_.softmax(logits, dim=-1), topk, dim=-1)
        return w.float().contiguous(), i.to(torch_.int32).contiguous()

    good = _run(shape, m_list=[1])
    assert good["check"]["results"][B.IMPL_ROUTED]["ok"]
    monkeypatch.setattr(B, "router_ids", softmax_ids)
    bad = _run(shape, m_list=[1])
    assert bad["check"]["results"][B.IMPL_SWAPMOE]["ok"]
    assert not bad["check"]["results"][B.IMPL_ROUTED]["ok"]
    assert B.IMPL_ROUTED in bad["skipped"] and "check failed" in bad["skipped"][B.IMPL_ROUTED]
    assert bad["points"][0]["router_ids_match"] is False
    assert any("other experts than the float64 reference router" in n for n in bad["notes"])


def test_check_point_with_the_routed_impl_needs_the_routers_ids():
    """check_point directly: the same fused_moe column passes on the router's ids and fails
    on ids of another router over the same logits (the weights kept the router's)."""
    router = B.parse_router("sigmoid,renorm,groups=4/2,bias,scale=2.5")
    gen = torch.Generator().manual_seed(3)
    M, E, topk, K, N = 6, 16, 3, 64, 32
    logits = torch.randn(M, E, generator=gen)
    bias = B.make_correction_bias(torch, router, E, 0, torch.device("cpu"))
    shape = B.shard_shape("t", E, topk, K, N, router=router)
    w1, w2 = B.make_weights(torch, shape, torch.float32, gen, torch.device("cpu"))
    x = torch.randn(M, K, generator=gen)
    table = {B.IMPL_ROUTED: (B.make_routed_impl(logits, topk, router.kwargs(bias)), True)}
    tw, ids = B.router_ids(torch, logits, topk, router, bias)
    ok = B.check_point(torch, [B.IMPL_ROUTED], x, (w1, w2), tw, ids, None, 1e-3, table)
    assert ok[B.IMPL_ROUTED]["ok"], ok
    _, other = torch.topk(logits, topk, dim=-1)  # plain top-k of the logits: not the grouped router's
    assert not torch.equal(other.sort(1)[0], ids.long().sort(1)[0])
    bad = B.check_point(torch, [B.IMPL_ROUTED], x, (w1, w2), tw, other.to(torch.int32), None, 1e-3, table)
    assert not bad[B.IMPL_ROUTED]["ok"]


def test_default_cpu_run_keeps_softmax_ids():
    """Without a router (the CPU default shape) the router's ids are --routing uniform's."""
    rec = _run(None, m_list=[1, 3])
    assert rec["routing"]["router"]["scoring"] == "softmax" and not rec["routing"]["router"]["renormalize"]
    assert rec["routing"]["router"]["origin"].startswith("default")
    assert rec["check"]["results"][B.IMPL_ROUTED]["ok"]
    for p in rec["points"]:
        gen = torch.Generator().manual_seed(0)
        _, ids = B.make_routing(torch, p["M"], 8, 2, "uniform", gen, torch.device("cpu"))
        assert p["experts_touched"] == len(torch.unique(ids))
    off = B.run_bench(None, device="cpu", m_list=[1], progress=False, layers=1)
    assert off["routing"]["router"] is None and "router_ids_match" not in off["points"][0]


# ---- the command line -------------------------------------------------------------------------


def test_cli_with_routing_prints_and_records_the_router(tmp_path, capsys):
    out_json = tmp_path / "r.json"
    rc = cli.main(["bench", "--device", "cpu", "--shape", "32,4,64,32", "--router",
                   "sigmoid,renorm,groups=8/4,bias,scale=2.5", "--with-routing", "--m", "1,2", "--layers", "1",
                   "--no-progress", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("router (--with-routing"))
    assert "sigmoid top-4 in the best 4 of 8 groups" in line and "e_score_correction_bias" in line
    assert "renormalize" in line and "x2.5" in line
    assert "swapmoe-fused-moe" in out and "FAIL" not in out
    rec = json.loads(out_json.read_text())
    assert rec["routing"]["router"]["num_expert_group"] == 8 and rec["shape"]["name"] == "shape-32x4x64x32"
    assert "router" not in rec["shape"]


def test_cli_with_routing_names_the_preset_router(monkeypatch, capsys):
    """--model deepseek-v3-tp8 --with-routing reaches run_bench with the preset's router (the
    run itself is faked: the preset's weights are GPU-sized)."""
    got = {}
    real_run_bench = B.run_bench

    def fake_run_bench(shape, **kw):
        got["shape"] = shape
        got.update(kw)
        return real_run_bench(_small("deepseek-v3-tp8"), device="cpu", m_list=[1], with_routing=True,
                           progress=False, layers=1)

    monkeypatch.setattr(B, "run_bench", fake_run_bench)
    assert cli.main(["bench", "--model", "deepseek-v3-tp8", "--with-routing", "--device", "cpu",
                     "--no-progress"]) == 0
    assert got["shape"].router.origin == "deepseek-v3-tp8 preset" and got["with_routing"] is True
    out = capsys.readouterr().out
    assert "router (--with-routing, deepseek-v3-tp8 preset): sigmoid top-8 in the best 4 of 8 groups" in out


def test_cli_router_errors(capsys):
    assert cli.main(["bench", "--device", "cpu", "--shape", "32,4,64,32", "--router", "softmax"]) == 2
    assert "--router: only with --with-routing" in capsys.readouterr().err
    assert cli.main(["bench", "--device", "cpu", "--router", "softmax", "--with-routing"]) == 2
    assert "--router: needs a shape" in capsys.readouterr().err
    assert cli.main(["bench", "--device", "cpu", "--shape", "32,4,64,32", "--router", "bogus",
                     "--with-routing"]) == 2
    assert "--router: expected a preset" in capsys.readouterr().err


# ---- fused_moe - fused_experts in paired, alternating rounds ---------------------------------


def test_paired_difference_is_the_mean_of_the_two_orders_medians():
    """Rounds alternate their order (ABBA): a position effect must cancel, not fall on the order
    with more rounds (5 rounds: 3 of one order; the median of all 5 would be 2.3 here)."""
    d = B.paired_difference([12.3, 14.9, 12.0, 14.7, 12.2], [10.0] * 5)  # orders: 2.3 2.0 2.2 | 4.9 4.7
    assert d["estimate"] == pytest.approx((2.2 + 4.8) / 2)
    assert d["order_effect"] == pytest.approx((4.8 - 2.2) / 2)
    assert (d["min"], d["max"]) == (pytest.approx(2.0), pytest.approx(4.9))
    # no position effect: the median of the per-round differences
    d = B.paired_difference([10.0, 20.0, 13.0, 14.0], [9.0, 15.0, 10.0, 13.0])  # even 1, 3 | odd 5, 1
    assert d == {"estimate": (2.0 + 3.0) / 2, "order_effect": 0.5, "min": 1.0, "max": 5.0}
    assert B.paired_difference([3.0], [1.0]) == {"estimate": 2.0, "order_effect": 0.0, "min": 2.0, "max": 2.0}
    assert B.ROUTING_ROUNDS % 2 == 0  # as many rounds in each order by default
    with pytest.raises(ValueError, match="no rounds"):
        B.paired_difference([], [])


def test_paired_rounds_alternate_the_names_within_each_round():
    """Every round times each name once, in order, then reversed (the GPU path's timer faked,
    eager calls): so a drift between rounds and within one falls on both names alike."""
    order = []
    timed = iter(range(1, 100))

    def timer(fn):
        fn()
        return float(next(timed))  # ms of the whole list

    calls = {"a": [lambda: order.append("a")] * 2, "b": [lambda: order.append("b")] * 2}
    times, how = B.paired_rounds_us(torch, calls, timer, graph=False, rounds=3)
    assert how == "eager"
    # ABBA: in order on even rounds, reversed on odd ones
    assert order == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]
    # µs per layer: the timer's ms x 1000 / 2 layers, in the order timed
    assert times == {"a": [500.0, 2000.0, 2500.0], "b": [1000.0, 1500.0, 3000.0]}
    cpu_times, cpu_how = B.paired_rounds_us(torch, calls, None, graph=True, rounds=2)
    assert cpu_how == "perf_counter" and [len(v) for v in cpu_times.values()] == [2, 2]


def test_paired_rounds_capture_each_round_and_fall_back_to_eager(monkeypatch):
    """With graphs, every round captures each list again; where a capture fails, every round
    is timed again eagerly and `how` says why (the GPU path, its CUDA calls faked)."""
    captures = []

    class Graph:
        def __init__(self, calls):
            self.calls = calls

        def replay(self):
            for c in self.calls:
                c()

    def capture(torch_, calls):
        captures.append(len(calls))
        if fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return Graph(calls)

    monkeypatch.setattr(B, "warm_up_for_capture", lambda torch_, calls: None)
    monkeypatch.setattr(B, "capture_graph", capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    ran = []
    calls = {"a": [lambda: ran.append("a")], "b": [lambda: ran.append("b")]}
    fail = False
    times, how = B.paired_rounds_us(torch, calls, lambda fn: (fn(), 1.0)[1], graph=True, rounds=3)
    assert how == "graph" and len(captures) == 6 and times == {"a": [1000.0] * 3, "b": [1000.0] * 3}
    captures.clear()
    ran.clear()
    fail = True
    times, how = B.paired_rounds_us(torch, calls, lambda fn: (fn(), 2.0)[1], graph=True, rounds=2)
    assert how.startswith("eager (graph capture failed: RuntimeError: operation not permitted")
    assert len(captures) == 1 and times == {"a": [2000.0] * 2, "b": [2000.0] * 2}
    assert ran == ["a", "b", "b", "a"]


def test_with_routing_records_the_paired_difference_per_point():
    rec = _run(_small("deepseek-v3-tp8"), m_list=[1, 3], routing_rounds=3)
    assert rec["method"]["routing_rounds"] == 3
    for p in rec["points"]:
        o = p["routing_overhead"]
        assert o["rounds"] == 3 and o["how"] == "perf_counter"
        assert len(o["fused_experts_us"]) == len(o["fused_moe_us"]) == 3
        d = [m - e for m, e in zip(o["fused_moe_us"], o["fused_experts_us"])]
        even, odd = (d[0] + d[2]) / 2, d[1]  # the medians of rounds 0, 2 and of round 1
        assert o["delta_us"] == pytest.approx((even + odd) / 2)
        assert o["order_effect_us"] == pytest.approx((odd - even) / 2)
        assert (o["delta_min_us"], o["delta_max_us"]) == (min(d), max(d))
        assert all(t > 0 for t in o["fused_experts_us"] + o["fused_moe_us"])
    table = cli.format_table(rec)
    head = next(ln for ln in table.splitlines() if ln.lstrip().startswith("M "))
    assert head.split()[-1] == "moe-exp_us"
    o = rec["points"][0]["routing_overhead"]
    assert f"{o['delta_us']:+.1f} ({o['delta_min_us']:+.1f}..{o['delta_max_us']:+.1f})" in table
    assert "timed again in 3 rounds of alternating order" in table
    csv = cli.csv_text(rec).splitlines()
    cols = csv[0].split(",")
    row = dict(zip(cols, csv[1].split(",")))
    assert float(row["fused_moe_minus_experts_paired_us"]) == pytest.approx(o["delta_us"], rel=1e-5)


def test_routing_rounds_zero_and_without_routing_leave_the_pairing_out():
    rec = _run(_small("qwen3-30b-a3b"), m_list=[2], routing_rounds=0)
    assert "routing_overhead" not in rec["points"][0] and rec["method"]["routing_rounds"] == 0
    assert "moe-exp_us" not in cli.format_table(rec)
    plain = B.run_bench(_small("qwen3-30b-a3b"), device="cpu", m_list=[2], progress=False, layers=1)
    assert "routing_overhead" not in plain["points"][0] and plain["method"]["routing_rounds"] is None


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_routing_rounds_must_be_a_count(bad):
    with pytest.raises(B.BenchError, match=r"--routing-rounds: expected an integer >= 0, got"):
        _run(_small("qwen3-30b-a3b"), routing_rounds=bad)


def test_a_failed_pairing_keeps_the_columns_and_says_why(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("capture failed here")

    monkeypatch.setattr(B, "paired_rounds_us", broken)
    rec = _run(_small("qwen3-30b-a3b"), m_list=[1])
    p = rec["points"][0]
    assert "routing_overhead" not in p and "capture failed here" in p["errors"]["routing_overhead"]
    assert {B.IMPL_SWAPMOE, B.IMPL_ROUTED} <= set(p["results"])
    table = cli.format_table(rec)
    assert "error: routing_overhead at M=1: RuntimeError: capture failed here" in table


def test_cli_routing_rounds_reaches_run_bench(monkeypatch):
    got = {}

    def fake_run_bench(shape, **kw):
        got.update(kw)
        raise B.BenchError("stop here")

    monkeypatch.setattr(B, "run_bench", fake_run_bench)
    assert cli.main(["bench", "--device", "cpu", "--with-routing", "--routing-rounds", "7"]) == 2
    assert got["routing_rounds"] == 7
    got.clear()
    cli.main(["bench", "--device", "cpu", "--with-routing"])
    assert got["routing_rounds"] == B.ROUTING_ROUNDS


def test_cli_routing_rounds_needs_with_routing(capsys):
    assert cli.main(["bench", "--device", "cpu", "--routing-rounds", "3"]) == 2
    assert "--routing-rounds: only with --with-routing" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.serial
def test_gpu_paired_rounds_replay_captured_graphs():
    """On a GPU the pairing captures both implementations as graphs and replays them in
    turn; every round's time is positive and the difference is the per-round one."""
    rec = B.run_bench(_small("deepseek-v3-tp8", K=256, N=128), device="cuda", m_list=[1, 9], with_routing=True,
                      progress=False, layers=2, routing_rounds=2, baselines=False, read_floor=False,
                      read_bw_tbps=3.0, gemm_tflops=700.0)
    assert rec["check"]["ok"], rec["check"]
    for p in rec["points"]:
        o = p["routing_overhead"]
        assert o["how"] == "graph" and o["rounds"] == 2
        assert all(t > 0 for t in o["fused_experts_us"] + o["fused_moe_us"])
        d = sorted(m - e for m, e in zip(o["fused_moe_us"], o["fused_experts_us"]))
        assert o["delta_min_us"] == d[0] and o["delta_max_us"] == d[1]
        assert p["router_ids_match"] is True
