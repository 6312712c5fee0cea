"""`swapmoe tune`'s flashinfer_cutlass candidate without a GPU: a fake `flashinfer` module in
sys.modules (flashinfer is not installed here), the weight conversion vLLM does for FlashInfer's
CUTLASS MoE checked on small CPU tensors, the output check that catches a layout mistake, and
a table with a flashinfer_cutlass time that the oracle and `swapmoe explain` pick."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types

import pytest

import swapmoe
from swapmoe import _core, cli
from swapmoe import tune as T

torch = pytest.importorskip("torch")

H200 = "NVIDIA H200"
FI = T.FLASHINFER_LABEL


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("SWAPMOE_BACKEND", "SWAPMOE_MMA_TOKEN_TILE", "SWAPMOE_TABLES_DIR", "SWAPMOE_TABLES"):
        monkeypatch.delenv(k, raising=False)


# ---------------------------------------------------------------------------------------
# a fake flashinfer: cutlass_fused_moe's contract in plain torch (fc1 = [up, gate])
# ---------------------------------------------------------------------------------------


def _expand_blocks(s, R, C):
    return s.repeat_interleave(128, dim=0)[:R].repeat_interleave(128, dim=1)[:, :C]


def fake_cutlass_fused_moe(calls=None):
    """FlashInfer's CUTLASS fused MoE as its docstring and vLLM's call describe it: fc1 [E, 2N,
    K] with the up rows first and the gate rows second (SwiGLU: silu(gate) * up), fc2 [E, K, N];
    global expert ids, rank ``ep_rank`` of ``ep_size`` holding experts [ep_rank*E, ...);
    FP8 per tensor: e4m3 input, quant_scales [fc1 dequant [E], fc2 act quant, fc2 dequant [E],
    fc1 input dequant]; 128x128 blocks: bf16 input quantized per 128 columns, quant_scales
    [fc1 block scales, fc2 block scales]."""

    def cutlass_fused_moe(input, token_selected_experts, token_final_scales, fc1_expert_weights,
                          fc2_expert_weights, output_dtype, quant_scales, output=None, tp_size=1, tp_rank=0,
                          ep_size=1, ep_rank=0, use_deepseek_fp8_block_scale=False, tune_max_num_tokens=8192,
                          **kw):
        if calls is not None:
            calls.append(dict(M=input.shape[0], input_dtype=input.dtype, tp_size=tp_size, ep_size=ep_size,
                              ep_rank=ep_rank, block=use_deepseek_fp8_block_scale,
                              tune_max_num_tokens=tune_max_num_tokens, output_given=output is not None,
                              n_scales=len(quant_scales)))
        E, K, Np = fc2_expert_weights.shape
        assert fc1_expert_weights.shape == (E, 2 * Np, K)
        assert token_selected_experts.dtype == torch.int32
        fp8_in = input.dtype == torch.float8_e4m3fn
        x = input.float()
        M, topk = token_selected_experts.shape
        acc = torch.zeros(M, K, dtype=torch.float32)
        for m in range(M):
            for k in range(topk):
                e = int(token_selected_experts[m, k]) - ep_rank * E
                if not 0 <= e < E:
                    continue
                w1 = fc1_expert_weights[e].float()
                w2 = fc2_expert_weights[e].float()
                xm = x[m]
                if use_deepseek_fp8_block_scale:
                    s1, s2 = quant_scales
                    w1 = w1 * _expand_blocks(s1[e], 2 * Np, K)
                    w2 = w2 * _expand_blocks(s2[e], K, Np)
                    xq, xs = T.B.fp8_act_quant_torch(torch, xm.reshape(1, -1), "block")
                    xm = (xq.float() * xs).reshape(-1)
                h = w1 @ xm
                if fp8_in:
                    h = h * quant_scales[0][e]
                up, gate = h[:Np], h[Np:]
                a = torch.nn.functional.silu(gate) * up
                if fp8_in:
                    a = (a * quant_scales[1]).clamp(-448, 448).to(torch.float8_e4m3fn).float()
                elif use_deepseek_fp8_block_scale:
                    aq, as_ = T.B.fp8_act_quant_torch(torch, a.reshape(1, -1), "block")
                    a = (aq.float() * as_).reshape(-1)
                y = w2 @ a
                if fp8_in:
                    y = y * quant_scales[2][e]
                acc[m] += float(token_final_scales[m, k]) * y
        res = acc.to(output_dtype)
        if output is None:
            return res
        output.copy_(res)
        return output

    return cutlass_fused_moe


def install_fake_flashinfer(monkeypatch, calls=None, autotune_log=None, version="0.7.2"):
    fi = types.ModuleType("flashinfer")
    fi.__version__ = version
    fm = types.ModuleType("flashinfer.fused_moe")
    fm.cutlass_fused_moe = fake_cutlass_fused_moe(calls)
    fi.fused_moe = fm

    @contextlib.contextmanager
    def autotune(tune_mode=True, cache=None):
        if autotune_log is not None:
            autotune_log.append(tune_mode)
        yield

    fi.autotune = autotune
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setitem(sys.modules, "flashinfer.fused_moe", fm)
    return fi


# ---------------------------------------------------------------------------------------
# loading and when it applies
# ---------------------------------------------------------------------------------------


def test_load_flashinfer_says_why_when_it_does_not_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import raises ImportError
    api, why = T.load_flashinfer()
    assert api is None and why.startswith("flashinfer not importable")


def test_load_flashinfer_finds_cutlass_fused_moe_and_autotune(monkeypatch):
    install_fake_flashinfer(monkeypatch, version="9.9.9")
    api, version = T.load_flashinfer()
    assert version == "9.9.9" and api.version == "9.9.9"
    assert api.fused_moe is sys.modules["flashinfer.fused_moe"].cutlass_fused_moe
    assert api.autotune is sys.modules["flashinfer"].autotune
    # a flashinfer without the CUTLASS MoE
    del sys.modules["flashinfer.fused_moe"].cutlass_fused_moe
    api, why = T.load_flashinfer()
    assert api is None and T.FLASHINFER_FUSED_MOE in why


@pytest.mark.parametrize("dtype, quant, cap, text", [
    ("bf16", "none", (9, 0), None),
    ("fp16", "fp8_tensor", (10, 0), None),
    ("bf16", "fp8_block128", (9, 0), None),
    ("bf16", "fp8_block128", (10, 0), "sm_90 only"),
    ("bf16", "fp8_channel", (9, 0), "no FP8 per-channel"),
    ("bf16", "none", (8, 9), "sm_90 and newer"),
    ("fp32", "none", (9, 0), "bf16/fp16"),
])
def test_flashinfer_applies_where_vllm_uses_it(dtype, quant, cap, text):
    why = T.flashinfer_unsupported(dtype, quant, cap)
    assert (why is None) if text is None else (text in why), why


def test_flashinfer_shape_limits():
    ok = T.B.shard_shape("s", 16, 4, 1024, 512)
    assert T.flashinfer_shape_unsupported(ok, "none") is None
    assert T.flashinfer_shape_unsupported(ok, "fp8_block128") is None
    # FP8 per tensor pads N to 16 as vLLM does: any N
    assert T.flashinfer_shape_unsupported(T.B.shard_shape("s", 16, 4, 1024, 100), "fp8_tensor") is None
    assert "N = 100" in T.flashinfer_shape_unsupported(T.B.shard_shape("s", 16, 4, 1024, 100), "none")
    assert "K = 1000" in T.flashinfer_shape_unsupported(T.B.shard_shape("s", 16, 4, 1000, 512), "fp8_tensor")
    assert "128x128" in T.flashinfer_shape_unsupported(T.B.shard_shape("s", 16, 4, 1024, 192), "fp8_block128")


# ---------------------------------------------------------------------------------------
# the conversion (pure, small CPU tensors, explicit expectations)
# ---------------------------------------------------------------------------------------


def test_swap_gate_up_puts_the_up_rows_first():
    # one expert, N = 2 rows of gate (g0, g1) then 2 of up (u0, u1), K = 3
    g0, g1, u0, u1 = [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [10.0, 11.0, 12.0]
    w13 = torch.tensor([[g0, g1, u0, u1]])
    out = T.swap_gate_up(torch, w13)
    assert out.tolist() == [[u0, u1, g0, g1]]
    assert out.is_contiguous() and w13.tolist() == [[g0, g1, u0, u1]]  # the input is untouched
    # per expert, on e4m3 (bytes kept), and on 128x128 block scales [E, 2N/128, K/128]
    w = torch.arange(2 * 4 * 2, dtype=torch.float32).reshape(2, 4, 2)
    assert T.swap_gate_up(torch, w).tolist() == [[[4, 5], [6, 7], [0, 1], [2, 3]],
                                                 [[12, 13], [14, 15], [8, 9], [10, 11]]]
    q = w.to(torch.float8_e4m3fn)
    sq = T.swap_gate_up(torch, q)
    assert sq.dtype == torch.float8_e4m3fn and sq.float().tolist() == T.swap_gate_up(torch, w).tolist()
    with pytest.raises(T.TuneError, match="2R"):
        T.swap_gate_up(torch, torch.zeros(1, 3, 2))


def test_pad_gate_up_pads_each_half():
    # N = 3 padded to 4: gate rows 0-2, a zero row, up rows 4-6, a zero row; w2 gets a zero column
    w13 = torch.tensor([[[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]]])  # gate 1,2,3; up 4,5,6
    w2 = torch.tensor([[[7.0, 8.0, 9.0]]])  # K = 1, N = 3
    p13, p2 = T.pad_gate_up(torch, w13, w2, 4)
    assert p13.flatten().tolist() == [1, 2, 3, 0, 4, 5, 6, 0]
    assert p2.tolist() == [[[7, 8, 9, 0]]]
    assert T.swap_gate_up(torch, p13).flatten().tolist() == [4, 5, 6, 0, 1, 2, 3, 0]
    # a multiple already: the same tensors; e4m3 through bytes
    assert T.pad_gate_up(torch, w13, w2, 3) == (w13, w2)
    q13, q2 = T.pad_gate_up(torch, w13.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn), 4)
    assert q13.dtype == torch.float8_e4m3fn and q13.float().flatten().tolist() == [1, 2, 3, 0, 4, 5, 6, 0]


def test_fp8_tensor_scales_as_vllm_builds_them():
    w1s, w2s = torch.tensor([0.5, 0.25]), torch.tensor([2.0, 4.0])
    a1, a2 = torch.tensor(0.125), torch.tensor(0.5)
    g1, a2g, g2, a1s = T.flashinfer_fp8_tensor_scales(torch, w1s, w2s, a1, a2)
    assert g1.tolist() == [0.0625, 0.03125]  # w13_scale * a1_scale, per expert
    assert a2g.dim() == 0 and float(a2g) == 2.0  # 1 / a2_scale
    assert g2.tolist() == [1.0, 2.0]  # w2_scale * a2_scale
    assert a1s.dim() == 0 and float(a1s) == 0.125  # the input's dequant scale
    assert all(t.dtype == torch.float32 for t in (g1, a2g, g2, a1s))
    # one expert stays [1] (vLLM's squeeze() would make it 0-d, which FlashInfer refuses)
    assert T.flashinfer_fp8_tensor_scales(torch, w1s[:1], w2s[:1], a1, a2)[0].shape == (1,)


def test_prepare_flashinfer_weights_per_scheme():
    E, N, K = 2, 3, 4
    w1 = torch.randn(E, 2 * N, K)
    w2 = torch.randn(E, K, N)
    p = T.prepare_flashinfer_weights(torch, w1, w2, "none")
    assert torch.equal(p.w13[:, :N], w1[:, N:]) and torch.equal(p.w13[:, N:], w1[:, :N])
    assert p.w2 is w2 and p.quant_scales == [] and p.a1_scale is None and not p.block
    # FP8 per tensor: padded to 16 rows a half, swapped, the four scales, the input's scale
    q1, q2 = w1.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
    fp8 = T.B.fp8_kwargs("fp8_tensor", torch.tensor([0.5, 0.25]), torch.tensor([2.0, 4.0]),
                         torch.tensor(0.125), torch.tensor(0.5))
    p = T.prepare_flashinfer_weights(torch, q1, q2, "fp8_tensor", fp8)
    assert p.w13.shape == (E, 32, K) and p.w2.shape == (E, K, 16) and p.w13.dtype == torch.float8_e4m3fn
    assert torch.equal(p.w13[:, :N].float(), q1[:, N:].float())  # up first
    assert torch.equal(p.w13[:, 16:16 + N].float(), q1[:, :N].float())  # then gate
    assert not p.w13[:, N:16].float().any() and not p.w2[:, :, N:].float().any()
    assert [t.tolist() for t in p.quant_scales] == [[0.0625, 0.03125], 2.0, [1.0, 2.0], 0.125]
    assert float(p.a1_scale) == 0.125 and float(p.a1_inv) == 8.0 and not p.block
    with pytest.raises(T.TuneError, match="static"):
        T.prepare_flashinfer_weights(torch, q1, q2, "fp8_tensor", dict(fp8, a1_scale=None, a2_scale=None))
    # 128x128 blocks: w13's block scales swapped with it, all scales clamped to 1e-10
    N, K = 128, 256
    b1 = torch.randn(E, 2 * N, K).to(torch.float8_e4m3fn)
    b2 = torch.randn(E, K, N).to(torch.float8_e4m3fn)
    s1 = torch.tensor([[[1.0, 2.0], [3.0, 1e-20]], [[5.0, 6.0], [7.0, 8.0]]])  # [E, 2N/128, K/128]
    s2 = torch.tensor([[[1e-30], [2.0]], [[3.0], [4.0]]])  # [E, K/128, N/128]
    p = T.prepare_flashinfer_weights(torch, b1, b2, "fp8_block128", T.B.fp8_kwargs("fp8_block128", s1, s2))
    assert p.block and p.a1_scale is None and p.w2 is b2
    assert torch.equal(p.w13[:, :N].float(), b1[:, N:].float())
    assert p.quant_scales[0].flatten().tolist() == pytest.approx([3.0, 1e-10, 1.0, 2.0, 7.0, 8.0, 5.0, 6.0])
    assert p.quant_scales[0].shape == s1.shape
    assert p.quant_scales[1].flatten().tolist() == pytest.approx([1e-10, 2.0, 3.0, 4.0])
    assert s1[0, 1, 1] == 1e-20  # the bench's scales are not changed in place
    with pytest.raises(T.TuneError, match="fp8_channel"):
        T.prepare_flashinfer_weights(torch, q1, q2, "fp8_channel", T.B.fp8_kwargs(
            "fp8_channel", torch.ones(E, 2 * 3), torch.ones(E, 4)))


# ---------------------------------------------------------------------------------------
# the candidate, checked against the reference (on the CPU, the fake kernel)
# ---------------------------------------------------------------------------------------


class _CpuRunner(T.GpuRunner):
    """tune's GpuRunner on the CPU: weights, conversion, autotune and check as on a GPU; the
    swapmoe labels run swapmoe's CPU path (the CUDA backends cannot be forced here), times are
    faked (CUDA graphs need a GPU)."""

    TIMES = {"cuda_decode": 30.0, "cuda_generic": 40.0, FI: 10.0}

    def __init__(self, dtype="bf16", quant="none", say=None):
        super().__init__(torch, torch.device("cpu"), dtype, 2, 0, H200, (9, 0), None, say or (lambda s: None), quant)
        self.impls = {lb: (T.B.impl_swapmoe, True) for lb in ("cuda_decode", "cuda_generic")}
        self.labels = list(self.impls)

    def ineligible(self, label, shape, M):
        return self.flashinfer_why if label == FI else None

    def time_us(self, label, inputs):
        return self.TIMES[label], "graph"


def _fi_runner(monkeypatch, quant="none", calls=None, autotune_log=None, say=None):
    install_fake_flashinfer(monkeypatch, calls, autotune_log)
    api, _ = T.load_flashinfer()
    r = _CpuRunner(quant=quant, say=say)
    r.add_flashinfer(T.FlashInferCutlass(api, quant))
    return r


@pytest.mark.parametrize("quant", ["none", "fp8_tensor", "fp8_block128"])
def test_flashinfer_candidate_passes_the_check_with_vllms_layout(quant, monkeypatch):
    calls, tuned = [], []
    r = _fi_runner(monkeypatch, quant, calls, tuned)
    assert r.labels[-1] == FI and r.impls[FI][0] is r.flashinfer
    shape = T.B.shard_shape("fi", 4, 2, 256, 128, ep=2)  # E_global 8: rank 0 holds experts 0-3
    r.start_shape(shape)
    assert r.flashinfer_why is None and len(r.flashinfer.prepared) == r.copies == 2
    # the autotuner ran once for the shape, on FLASHINFER_TUNE_MAX_TOKENS tokens
    assert tuned == [True] and calls[0]["M"] == T.FLASHINFER_TUNE_MAX_TOKENS
    assert (calls[0]["ep_size"], calls[0]["ep_rank"], calls[0]["tp_size"]) == (2, 0, 1)
    inputs = r.inputs(shape, 3)
    res = r.check(r.labels, inputs)
    assert res == {"cuda_decode": None, "cuda_generic": None, FI: None}, res
    last = calls[-1]
    assert last["output_given"] and last["tune_max_num_tokens"] == T.FLASHINFER_TUNE_MAX_TOKENS
    assert last["block"] == (quant == "fp8_block128")
    assert last["input_dtype"] == (torch.float8_e4m3fn if quant == "fp8_tensor" else torch.bfloat16)
    assert last["n_scales"] == {"none": 0, "fp8_tensor": 4, "fp8_block128": 2}[quant]
    r.end_shape()
    assert r.flashinfer.prepared == {}


@pytest.mark.parametrize("quant", ["none", "fp8_tensor"])
def test_a_layout_mistake_fails_the_check_and_stores_no_time(quant, monkeypatch, tmp_path):
    """w13 left as [gate, up] (no swap): the check drops flashinfer_cutlass and the table has
    no time for it; with the swap the same sweep stores it (and it wins)."""
    shape = T.B.shard_shape("fi", 4, 2, 256, 128)

    def sweep(folder):
        folder.mkdir()
        plans = T.prepare([shape], str(folder), [2, 4], False,
                          meta_of=lambda sh: T.table_metadata(sh, "bf16", H200, (9, 0), 2, 0, "fake", {}, quant),
                          file_name=lambda sh: _core.table_file_name(sh.E, sh.N, H200, "bf16",
                                                                     None if quant == "none" else quant))
        return T.sweep(plans, _fi_runner(monkeypatch, quant))

    [good] = sweep(tmp_path / "good")
    assert all(e["times_us"][FI] == 10.0 and e["backend"] == FI for e in good["entries"].values())
    monkeypatch.setattr(T, "swap_gate_up", lambda torch_, w: w.contiguous())
    [bad] = sweep(tmp_path / "bad")
    for M, e in bad["entries"].items():
        assert FI not in e["times_us"] and e["backend"] == "cuda_decode", e
        assert e["skipped"][FI].startswith("dropped for this shape: check failed: rel_err"), e["skipped"]
    with open(bad["path"], encoding="utf-8") as f:
        assert FI not in json.dumps({k: v.get("times_us") for k, v in json.load(f).items() if k.isdigit()})


def test_a_shape_flashinfer_cannot_run_is_skipped_with_its_reason(monkeypatch):
    said = []
    r = _fi_runner(monkeypatch, "none", say=said.append)
    shape = T.B.shard_shape("odd", 4, 2, 256, 100)  # N % 8
    r.start_shape(shape)
    assert r.flashinfer.prepared == {} and "N = 100" in r.ineligible(FI, shape, 1)
    assert [s for s in said if FI in s] == [f"odd: no {FI} times: {r.flashinfer_why}"]
    # a conversion that raises: ineligible for the shape, said once, the run goes on
    said.clear()
    r.end_shape()

    def boom(*a, **k):
        raise RuntimeError("no")

    monkeypatch.setattr(T, "prepare_flashinfer_weights", boom)
    ok = T.B.shard_shape("ok", 4, 2, 256, 128)
    r.start_shape(ok)
    assert r.ineligible(FI, ok, 1).startswith("converting the weights for FlashInfer failed")
    assert len([s for s in said if FI in s]) == 1


# ---------------------------------------------------------------------------------------
# run_tune: registered when flashinfer imports, said once when it does not
# ---------------------------------------------------------------------------------------


class _Timer:
    method = "fake timer"


class _FakeRunner(T.Runner):
    def __init__(self):
        self.labels = ["cuda_decode", "vllm_triton"]
        self.timer = _Timer()
        self.flashinfer = None

    def add_flashinfer(self, impl):
        self.flashinfer = impl
        self.labels.append(FI)

    def inputs(self, shape, M):
        return M

    def time_us(self, label, M):
        return {"cuda_decode": 20.0, "vllm_triton": 15.0, FI: 10.0}[label], "graph"


def _fake_device(monkeypatch, made):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: None)
    monkeypatch.setattr(T.B, "resolve_device", lambda torch_, device: torch.device("cuda", 0))
    monkeypatch.setattr(_core, "device_info", lambda index: {"name": H200, "capability": (9, 0)})
    monkeypatch.setattr(swapmoe, "warmup", lambda index=None: [])

    def fake_runner(torch_, dev, dtype, layers, seed, device_name, capability, vllm_fn, say, q):
        r = _FakeRunner()
        made.append(r)
        return r

    monkeypatch.setattr(T, "GpuRunner", fake_runner)


@pytest.mark.parametrize("quant", ["none", "fp8_tensor"])
def test_run_tune_registers_flashinfer_and_stores_its_time(quant, tmp_path, monkeypatch):
    install_fake_flashinfer(monkeypatch, version="0.7.2")
    monkeypatch.setitem(sys.modules, "vllm", None)
    made, said = [], []
    _fake_device(monkeypatch, made)
    shape = T.B.shard_shape("fake", 16, 4, 1024, 512)
    [s] = T.run_tune([shape], out_dir=str(tmp_path), quant=quant, m_list=[1, 8], vllm=False, progress=False,
                     log=said.append)
    [r] = made
    assert isinstance(r.flashinfer, T.FlashInferCutlass) and r.flashinfer.quant == quant
    assert r.labels[-1] == FI
    assert not any(f"no {FI} times" in m for m in said), said
    # fp8_tensor without vLLM's quantizer: the torch stand-in, said once
    assert len([m for m in said if "scaled_fp8_quant" in m]) == (quant == "fp8_tensor")
    parsed = _core.read_table(s["path"])
    for M in (1, 8):
        e = parsed["entries"][M]
        assert e["backend"] == FI and e["times_us"][FI] == 10.0
    with open(s["path"], encoding="utf-8") as f:
        raw = json.load(f)
    assert raw["metadata"]["versions"]["flashinfer"] == "0.7.2"
    assert raw["1"]["best_swapmoe"] == "cuda_decode"


@pytest.mark.parametrize("setup, kw, quant, text", [
    ("missing", {}, "none", "flashinfer not importable"),
    ("fake", {"flashinfer": False}, "none", "--no-flashinfer"),
    ("fake", {}, "fp8_channel", "no FP8 per-channel scheme"),
])
def test_run_tune_says_once_why_flashinfer_is_not_timed(setup, kw, quant, text, tmp_path, monkeypatch):
    if setup == "missing":
        monkeypatch.setitem(sys.modules, "flashinfer", None)
    else:
        install_fake_flashinfer(monkeypatch)
    made, said = [], []
    _fake_device(monkeypatch, made)
    shape = T.B.shard_shape("fake", 16, 4, 1024, 512)
    [s] = T.run_tune([shape], out_dir=str(tmp_path), quant=quant, m_list=[1, 8], vllm=False, progress=False,
                     log=said.append, **kw)
    [r] = made
    assert r.flashinfer is None and FI not in r.labels
    lines = [m for m in said if f"no {FI} times" in m]
    assert len(lines) == 1 and text in lines[0], said
    assert s["measured"] == [1, 8]
    assert all(FI not in e["times_us"] for e in _core.read_table(s["path"])["entries"].values())


def test_cli_no_flashinfer_reaches_run_tune(monkeypatch, tmp_path, capsys):
    got = {}

    def fake_run_tune(shapes, **kw):
        got.clear()
        got.update(kw)
        return [{"shape": shapes[0].name, "path": str(tmp_path / "t.json"), "skipped_m": [], "entries": {}}]

    monkeypatch.setattr(T, "run_tune", fake_run_tune)
    assert cli.main(["tune", "--shape", "8,2,64,32", "--out-dir", str(tmp_path), "--no-flashinfer"]) == 0
    assert got["flashinfer"] is False and got["vllm"] is True
    assert cli.main(["tune", "--shape", "8,2,64,32", "--out-dir", str(tmp_path)]) == 0
    assert got.get("flashinfer", True) is True  # run_tune's default: on
    capsys.readouterr()
    a = cli.build_parser().parse_args(["tune", "--model", "qwen3-30b-a3b", "--out-dir", "d"])
    assert a.flashinfer is True


# ---------------------------------------------------------------------------------------
# a table with a flashinfer_cutlass time: the oracle and `swapmoe explain` pick it
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("quant", ["none", "fp8_tensor"])
def test_explain_picks_flashinfer_cutlass_from_a_tuned_table(quant, tmp_path, monkeypatch, capsys):
    q = None if quant == "none" else quant
    shape = T.B.shard_shape("fi-shape", 64, 4, 1024, 512)  # no shipped table
    meta = T.table_metadata(shape, "bf16", H200, (9, 0), 8, 0, "fake timer", {"flashinfer": "0.7.2"}, quant)
    table = T.merge_table(None, {
        8: T.make_entry({FI: 10.0, "vllm_triton": 12.0, "cuda_mma:t16": 15.0} if q is None
                        else {FI: 10.0, "vllm_triton": 12.0, "cuda_wgmma_swap": 15.0}),
        64: T.make_entry({FI: 40.0, "vllm_triton": 30.0, "cuda_wgmma:t64": 35.0}),
    }, meta)
    path = T.table_path(str(tmp_path), _core.table_file_name(64, 512, H200, "bf16", q))
    T.write_table(path, table)
    parsed = _core.read_table(path)
    assert parsed["entries"][8]["backend"] == FI and parsed["entries"][8]["times_us"][FI] == 10.0
    monkeypatch.setenv("SWAPMOE_TABLES_DIR", str(tmp_path))
    argv = ["explain", "--shape", "64,4,1024,512", "--m", "8,64", "--device-name", H200]
    if q:
        argv += ["--quant", quant]
    assert cli.main(argv + ["--external-backends", "vllm_triton,flashinfer_cutlass"]) == 0
    out = capsys.readouterr().out
    assert f"M=8: {FI} (table" in out, out
    assert "M=64: vllm_triton (table" in out, out
    assert os.path.basename(path) in out
    # a caller that cannot run FlashInfer is not sent there
    assert cli.main(argv + ["--external-backends", "vllm_triton"]) == 0
    out = capsys.readouterr().out
    assert f"M=8: {FI}" not in out, out
    p = swapmoe.select_backend(8, 64, 4, 1024, 512, device_name=H200, quant=q,
                               external_backends=("vllm_triton", FI))
    assert (p.backend, p.source, p.table_m) == (FI, "table", 8) and p.fallback
