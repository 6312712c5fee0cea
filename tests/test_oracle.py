"""swapmoe.select_backend and `swapmoe explain`: the heuristics' plans asked offline."""

import pytest

import swapmoe
from swapmoe import cli

H200 = dict(device_name="NVIDIA H200")


@pytest.fixture(autouse=True)
def _heuristics_only(monkeypatch):
    """These tests are about the heuristics: tables off (tests/test_tables.py has them)."""
    monkeypatch.setenv("SWAPMOE_TABLES", "off")
    monkeypatch.delenv("SWAPMOE_BACKEND", raising=False)
    monkeypatch.delenv("SWAPMOE_MMA_TOKEN_TILE", raising=False)
    monkeypatch.delenv("SWAPMOE_FIRST_KERNEL_PDL", raising=False)
    monkeypatch.delenv("SWAPMOE_WGMMA_PREGATHER", raising=False)
    monkeypatch.delenv("SWAPMOE_WGMMA_PERSISTENT", raising=False)
    monkeypatch.delenv("SWAPMOE_ALIGN_IN_GEMM1", raising=False)


QWEN3 = (128, 8, 2048, 768)  # E, topk, K, N


def plan(m, shape=QWEN3, **kw):
    E, topk, K, N = shape
    return swapmoe.select_backend(m, E, topk, K, N, **{**H200, **kw})


def test_swap_ab_at_m1_on_h200_and_decode_kernels_with_pdl():
    # in cuda_decode's range the swap-AB kernels, which measured faster there on the H200
    p = plan(1)
    assert p.backend == "cuda_wgmma_swap" and p.swap_ab and p.source == "heuristic"
    assert p.tile["pdl"] is True and p.device_capability == (9, 0)
    assert any("faster than cuda_decode in its range" in r for r in p.reasons)
    # the decode kernels (forced; the heuristics' pick where swap-AB cannot run)
    p = plan(1, backend="cuda_decode")
    assert p.backend == "cuda_decode" and p.swap_ab and p.tile["pdl"] is True
    # qwen3's GEMM2 has K/8 = 256 CTAs, 2 per SM: the register-unbounded GEMM2
    assert p.tile["kernels"] == ["decode_moe_gemm1_act_bf16_v8", "decode_moe_gemm2_sum_wide_bf16_v8"]
    p = plan(1, dtype="fp32")  # no swap-AB kernels for fp32
    assert p.backend == "cuda_decode" and p.source == "heuristic"
    assert any(r.startswith("cuda_decode:") for r in p.reasons)


def test_decode_gemm2_bounded_when_its_ctas_exceed_two_per_sm():
    decode = {"backend": "cuda_decode"}
    p = plan(1, (256, 8, 7168, 256), **decode)  # deepseek-v3-tp8: 896 GEMM2 CTAs on 132 SMs
    assert p.tile["kernels"] == ["decode_moe_gemm1_act_bf16_v8", "decode_moe_gemm2_sum_bf16_v8"]
    assert any(r.startswith("gemm2: 896 CTAs") for r in p.reasons)
    # 264 CTAs (K = 2112) still fit two per SM
    wide = plan(1, (128, 8, 2112, 768), **decode)
    assert wide.tile["kernels"][1] == "decode_moe_gemm2_sum_wide_bf16_v8"
    assert plan(1, (128, 8, 2120, 768), **decode).tile["kernels"][1] == "decode_moe_gemm2_sum_bf16_v8"


def test_tensor_cores_at_prefill_with_token_tile_from_slots_per_expert():
    # Hopper: the wgmma GEMMs from 4 slots per expert on, tile 64 up to 48 slots per expert
    p = plan(512)  # 32 slots per expert
    assert p.backend == "cuda_wgmma" and not p.swap_ab and p.tile["tokens_per_pass"] == 64
    p = plan(1024)  # 64
    assert p.backend == "cuda_wgmma" and p.tile["tokens_per_pass"] == 128
    p = plan(4096, shape=(8, 2, 4096, 14336))
    assert p.backend == "cuda_wgmma" and p.tile["tokens_per_pass"] == 128
    assert any(r.startswith("cuda_decode: rejected") for r in p.reasons)
    p = plan(96, shape=(256, 8, 7168, 256))  # 3 slots per expert: the 16-token mma.sync tile
    assert p.backend == "cuda_mma" and p.tile["tokens_per_pass"] == 16
    assert any(r.startswith("cuda_wgmma: not picked") for r in p.reasons)
    p = plan(128, shape=(256, 8, 7168, 256))  # 4 slots per expert: the wgmma GEMMs
    assert p.backend == "cuda_wgmma" and p.tile["tokens_per_pass"] == 64
    # Ampere has no wgmma: mma.sync, tile by slots per expert
    p = swapmoe.select_backend(1024, *QWEN3, device_capability=(8, 0), device_name="NVIDIA A100-SXM4-80GB")
    assert p.backend == "cuda_mma" and p.tile["tokens_per_pass"] == 64
    assert any(r.startswith("cuda_wgmma: rejected") and "sm_90" in r for r in p.reasons)


MIXTRAL = (8, 2, 4096, 14336)
DEEPSEEK = (256, 8, 7168, 256)


@pytest.mark.parametrize("quant", [None, "fp8_tensor", "fp8_channel"])
def test_wgmma_token_tile_and_gemm1_a_mode(quant, monkeypatch):
    """cuda_wgmma (bf16 and FP8): tile 128 past 48 slots per expert, GEMM1's rows gathered
    beforehand (the gather kernel, then TMA) for N >= 4096, both forced by the environment."""
    kw = {"quant": quant, "activation_scales": "static" if quant == "fp8_tensor" else None} if quant else {}
    gemm1 = "wgmma_moe_fp8_gemm1" if quant else "wgmma_moe_gemm1_act"

    def kernels(m, shape):
        p = plan(m, shape, **kw)
        assert p.backend == "cuda_wgmma", p.reasons
        return p, [k for k in p.tile["kernels"] if k.startswith(gemm1) or k == "wgmma_moe_gather"]

    p, k = kernels(4096, MIXTRAL)  # 1024 slots per expert, N = 14336
    assert p.tile["tokens_per_pass"] == 128
    assert k[0] == "wgmma_moe_gather" and k[1].endswith("_t128_xs"), k
    assert any(r.startswith("gemm1: N=14336 >= 4096") for r in p.reasons)
    p, k = kernels(512, QWEN3)  # 32 slots per expert, N = 768
    assert p.tile["tokens_per_pass"] == 64 and k[0].endswith("_t64"), k
    monkeypatch.setenv("SWAPMOE_WGMMA_PREGATHER", "on")
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", "128")
    p, k = kernels(512, QWEN3)
    assert k[0] == "wgmma_moe_gather" and k[1].endswith("_t128_xs"), k
    assert any("forced by $SWAPMOE_WGMMA_PREGATHER=on" in r for r in p.reasons)
    monkeypatch.setenv("SWAPMOE_WGMMA_PREGATHER", "off")
    p, k = kernels(4096, MIXTRAL)
    assert len(k) == 1 and k[0].endswith("_t128"), k  # no gather kernel
    monkeypatch.setenv("SWAPMOE_WGMMA_PREGATHER", "sometimes")
    p, k = kernels(4096, MIXTRAL)
    assert k[0] == "wgmma_moe_gather"
    assert any('$SWAPMOE_WGMMA_PREGATHER="sometimes" ignored' in r for r in p.reasons)


@pytest.mark.parametrize("quant", [None, "fp8_block128"])
def test_wgmma_persistent_grids_and_their_override(quant, monkeypatch):
    """cuda_wgmma's GEMMs run as persistent grids (one CTA per SM) for items of <= 8 k-stages
    (FP8: 16), GEMM1 also with <= 8 column blocks per expert; both, neither or the one named
    when the environment says so."""
    kw = {"quant": quant} if quant else {}
    p = plan(4096, QWEN3, **kw)  # GEMM1: K = 2048; GEMM2: N = 768 (bf16: 32 and 12 stages; FP8: 16 and 6)
    assert p.backend == "cuda_wgmma", p.reasons
    fp8 = quant is not None
    # GEMM1's 6 column blocks per expert (<= 8): persistent whatever its stages
    assert p.tile["wgmma_persistent"] == (True, fp8) and p.tile["ctas"] == 132
    monkeypatch.setenv("SWAPMOE_WGMMA_PERSISTENT", "on")
    p = plan(4096, QWEN3, **kw)
    assert p.tile["wgmma_persistent"] == (True, True) and p.tile["ctas"] == 132
    assert any("forced by $SWAPMOE_WGMMA_PERSISTENT=on" in r for r in p.reasons)
    monkeypatch.setenv("SWAPMOE_WGMMA_PERSISTENT", "off")
    p = plan(4096, QWEN3, **kw)
    assert p.tile["wgmma_persistent"] == (False, False) and p.tile["ctas"] == 0
    for which, want in (("gemm1", (True, False)), ("gemm2", (False, True))):
        monkeypatch.setenv("SWAPMOE_WGMMA_PERSISTENT", which)
        p = plan(4096, QWEN3, **kw)
        assert p.tile["wgmma_persistent"] == want and p.tile["ctas"] == 132
        assert any(f"forced by $SWAPMOE_WGMMA_PERSISTENT={which}" in r for r in p.reasons)
    monkeypatch.setenv("SWAPMOE_WGMMA_PERSISTENT", "always")
    assert any('$SWAPMOE_WGMMA_PERSISTENT="always" ignored' in r for r in plan(4096, QWEN3, **kw).reasons)


def test_fp32_falls_back_to_generic_with_reason():
    p = plan(1024, dtype="fp32")
    assert p.backend == "cuda_generic" and not p.swap_ab
    assert any("cuda_mma: rejected" in r and "float32" in r for r in p.reasons)


def test_first_kernel_pdl_on_hopper_and_its_override(monkeypatch):
    assert plan(8).tile["first_kernel_pdl"] is True
    a100 = swapmoe.select_backend(8, *QWEN3, device_capability=(8, 0), device_name="my A100")
    assert a100.tile["first_kernel_pdl"] is False
    monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", "off")
    p = plan(8)
    assert p.tile["first_kernel_pdl"] is False and p.tile["pdl"] is True
    assert any(r.startswith("override: $SWAPMOE_FIRST_KERNEL_PDL=off") for r in p.reasons)
    monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", "on")
    a100 = swapmoe.select_backend(8, *QWEN3, device_capability=(8, 0), device_name="my A100")
    assert a100.tile["first_kernel_pdl"] is False
    assert any(r.endswith("ignored, PDL needs sm_90") for r in a100.reasons)
    monkeypatch.setenv("SWAPMOE_FIRST_KERNEL_PDL", "sometimes")
    with pytest.raises(swapmoe.ArgumentError, match='SWAPMOE_FIRST_KERNEL_PDL.*"sometimes"'):
        plan(8)


def test_ampere_gets_no_pdl():
    p = swapmoe.select_backend(1, *QWEN3, device_capability=(8, 0), device_name="my A100")
    assert p.backend == "cuda_decode" and p.tile["pdl"] is False
    assert p.device_name == "my A100"


def test_override_argument_and_env(monkeypatch):
    p = plan(1, backend="cuda_generic")
    assert p.backend == "cuda_generic" and p.source == "override"
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_mma")
    p = plan(1)
    assert p.backend == "cuda_mma" and p.source == "override"  # the env var overrides too
    assert any(r.startswith("override:") for r in p.reasons)
    with pytest.raises(swapmoe.ShapeError, match=r"cuda_decode cannot run .*at most M\*topk = 512 slots"):
        monkeypatch.delenv("SWAPMOE_BACKEND")
        plan(1024, backend="cuda_decode")  # 8192 slots: more than the decode kernels hold


@pytest.mark.parametrize(
    "kw,cls,needle",
    [
        (dict(device_name="Some GPU"), swapmoe.ArgumentError, "device_capability"),
        (dict(quant="fp8_tensor", device_name="NVIDIA A100-SXM4-80GB"), swapmoe.ArgumentError, "quant: FP8"),
        (dict(quant="int4"), swapmoe.ArgumentError, "quant"),
        (dict(dtype="fp64"), swapmoe.DTypeError, "dtype"),
        (dict(backend="fastest"), swapmoe.ArgumentError, "backend"),
    ],
)
def test_bad_questions_raise_typed_errors(kw, cls, needle):
    with pytest.raises(cls) as e:
        plan(8, **kw)
    assert needle in str(e.value)


def test_bad_shape_raises_shape_error():
    with pytest.raises(swapmoe.ShapeError, match="top_k"):
        swapmoe.select_backend(1, 8, 9, 64, 64, **H200)


def test_a_rank_under_expert_parallelism_is_planned_for_its_share_of_the_slots(capsys):
    """global_num_experts: the plan of a rank that holds 32 of DeepSeek-V3's 256 experts
    expects ~1 of M = 1's 8 slots there (swap-AB), where 32 experts planned as the whole model
    expect ~8 (cuda_wgmma's GEMMs); explain --ep passes the model's count."""
    ep = dict(quant="fp8_block128", **H200)
    assert swapmoe.select_backend(1, 32, 8, 7168, 2048, **ep).backend == "cuda_wgmma"
    assert swapmoe.select_backend(1, 32, 8, 7168, 2048, global_num_experts=256, **ep).backend == "cuda_wgmma_swap"
    same = [swapmoe.select_backend(4, *QWEN3, global_num_experts=g, **H200) for g in (-1, 128)]
    assert same[0].backend == same[1].backend and same[0].tile == same[1].tile
    # top_k may exceed the rank's experts, not the model's
    assert swapmoe.select_backend(1, 4, 8, 7168, 2048, global_num_experts=256, **H200).backend
    fewer = r"global_num_experts: expected -1 or at least num_experts \(32\), got 16"
    with pytest.raises(swapmoe.ShapeError, match=fewer):
        swapmoe.select_backend(1, 32, 8, 7168, 2048, global_num_experts=16, **H200)
    with pytest.raises(swapmoe.ShapeError, match="top_k"):
        swapmoe.select_backend(1, 4, 8, 7168, 2048, global_num_experts=6, **H200)
    with pytest.raises(swapmoe.ArgumentError, match="global_num_experts: expected an integer"):
        swapmoe.select_backend(1, 32, 8, 7168, 2048, global_num_experts="256", **H200)
    assert cli.main(["explain", "--model", "deepseek-v3", "--ep", "8", "--quant", "fp8_block128", "--m", "1",
                     "--device-name", "NVIDIA H200"]) == 0
    assert "M=1: cuda_wgmma_swap (heuristic" in capsys.readouterr().out


def test_explain_offline(capsys):
    assert cli.main(["explain", "--model", "qwen3-30b-a3b", "--device-name", "NVIDIA H200", "--m", "1,1024"]) == 0
    out = capsys.readouterr().out
    assert "M=1: cuda_wgmma_swap (heuristic; swap_ab=True) on NVIDIA H200 sm_90" in out
    assert "M=1024: cuda_wgmma" in out and "token tiles of 128 rows" in out  # heuristic: 64 slots per expert


def test_explain_errors_exit_2(capsys):
    assert cli.main(["explain", "--shape", "8,2,256,128", "--capability", "8.0", "--device-name", "A100",
                     "--quant", "fp8_tensor"]) == 2
    assert cli.main(["explain", "--shape", "8,2,256,128", "--device-name", "X", "--capability", "nine"]) == 2
    err = capsys.readouterr().err
    assert "sm_89" in err and "--capability" in err


def test_explain_fp8(capsys):
    assert cli.main(["explain", "--shape", "128,8,2048,768", "--device-name", "NVIDIA H200", "--quant",
                     "fp8_block128", "--m", "1,1024"]) == 0
    out = capsys.readouterr().out
    assert "fp8_block128" in out and "M=1: cuda_wgmma_swap" in out and "swap_moe_fp8_gemm1_block_n8" in out
    assert "M=1024: cuda_wgmma" in out and "wgmma_moe_fp8_gemm1_block_t128" in out
    assert "wgmma_moe_fp8_gemm2_bf16_block_t128" in out and "quant_inter" not in out


@pytest.mark.parametrize("quant", [None, "fp8_tensor"])
def test_swap_gemm2_one_cta_per_sm_from_long_rows(quant, monkeypatch):
    """cuda_wgmma_swap's GEMM2 runs one CTA per SM where w2's rows are long (N >= 4096,
    Mixtral), two per SM otherwise (qwen3); the environment forces either; bad values are
    ignored with a reason. Other backends never set it."""
    kw = {"backend": "cuda_wgmma_swap", **({"quant": quant} if quant else {})}
    mixtral = plan(1, MIXTRAL, **kw)
    assert mixtral.backend == "cuda_wgmma_swap" and mixtral.tile["swap_gemm2_one_per_sm"] is True
    assert any(r.startswith("gemm2: one CTA per SM (N = 14336") for r in mixtral.reasons)
    assert plan(1, QWEN3, **kw).tile["swap_gemm2_one_per_sm"] is False
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM2_ONE_PER_SM", "1")
    assert plan(1, QWEN3, **kw).tile["swap_gemm2_one_per_sm"] is True
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM2_ONE_PER_SM", "0")
    assert plan(1, MIXTRAL, **kw).tile["swap_gemm2_one_per_sm"] is False
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM2_ONE_PER_SM", "on")
    p = plan(1, MIXTRAL, **kw)
    assert p.tile["swap_gemm2_one_per_sm"] is True
    assert any('$SWAPMOE_SWAP_GEMM2_ONE_PER_SM="on" ignored' in r for r in p.reasons)
    monkeypatch.setenv("SWAPMOE_SWAP_GEMM2_ONE_PER_SM", "1")
    assert plan(4096, MIXTRAL).tile["swap_gemm2_one_per_sm"] is False  # cuda_wgmma


@pytest.mark.parametrize("quant", [None, "fp8_tensor"])
def test_wgmma_l2_hints_where_experts_fill_half_a_tile(quant, monkeypatch):
    """cuda_wgmma's loads carry L2 eviction hints (weights first, token rows last: 3) where the
    expected tokens per expert fill at most half a token tile, none past it; the environment
    forces any of 0-3 and the plan says why."""
    kw = {"backend": "cuda_wgmma", **({"quant": quant} if quant else {})}
    for m in (256, 1024, 4096):
        p = plan(m, DEEPSEEK, **kw)
        tile = p.tile["tokens_per_pass"]
        want = 3 if 2 * m * 8 <= tile * 256 else 0
        assert p.tile["wgmma_l2_hints"] == want, p.reasons
        assert any(r.startswith("cuda_wgmma loads: ") for r in p.reasons)
    assert plan(4096, DEEPSEEK, **kw).tile["wgmma_l2_hints"] == 0
    monkeypatch.setenv("SWAPMOE_WGMMA_L2_HINTS", "2")
    p = plan(4096, DEEPSEEK, **kw)
    assert p.tile["wgmma_l2_hints"] == 2
    assert "cuda_wgmma loads: token rows evict last (forced by $SWAPMOE_WGMMA_L2_HINTS=2)" in p.reasons
    assert plan(1, QWEN3, backend="cuda_wgmma_swap").tile["wgmma_l2_hints"] == 0
    monkeypatch.delenv("SWAPMOE_WGMMA_L2_HINTS")
    wide = plan(4096, MIXTRAL, **kw)  # N >= 4096: at any tokens per expert
    assert wide.tile["wgmma_l2_hints"] == 3
    assert any("GEMM1 reads each tile's token rows in 112 column blocks" in r for r in wide.reasons)


def test_wgmma_gemm1_groups_the_slots_itself_at_decode(monkeypatch, capsys):
    """cuda_wgmma's GEMM1 groups the slots itself (no align kernel) where it is a persistent grid
    of at most 512 slots: qwen3-30b-a3b FP8 (16 k-stages) to M = 64; not bf16 at K = 2048 (one
    CTA per item), not past 512 slots; $SWAPMOE_ALIGN_IN_GEMM1 forces it; explain shows it."""
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma")
    fp8 = dict(quant="fp8_tensor", activation_scales="static")
    for m, groups in [(16, True), (64, True), (65, False)]:
        p = plan(m, **fp8)
        assert p.tile["align_in_gemm1"] is groups, (m, p.reasons)
        assert ("swapmoe_route_align" in p.tile["kernels"]) is not groups, p.tile["kernels"]
        assert any(k.endswith("_t64_ga") for k in p.tile["kernels"]) is groups, p.tile["kernels"]
    assert p.tile["kernels"][0] == "swapmoe_route_align"
    assert plan(16, **fp8).tile["kernels"][0] == "swapmoe_fp8_quant_x_bf16"
    bf16 = plan(16)
    assert not bf16.tile["align_in_gemm1"]
    assert any("align: its own kernel before GEMM1 (GEMM1 runs one CTA per item" in r for r in bf16.reasons)
    monkeypatch.setenv("SWAPMOE_ALIGN_IN_GEMM1", "on")
    forced = plan(16)
    assert forced.tile["align_in_gemm1"] and forced.tile["kernels"][0] == "wgmma_moe_gemm1_act_bf16_t64_ga"
    monkeypatch.setenv("SWAPMOE_ALIGN_IN_GEMM1", "off")
    assert not plan(16, **fp8).tile["align_in_gemm1"]
    monkeypatch.delenv("SWAPMOE_ALIGN_IN_GEMM1")
    argv = ["explain", "--model", "qwen3-30b-a3b", "--device-name", "NVIDIA H200", "--quant", "fp8_tensor",
            "--m", "16"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "align=gemm1" in out and "align: inside GEMM1, which groups the 128 slots" in out


@pytest.mark.parametrize("device", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
def test_the_chain_tests_run_a_grouping_gemm1(device, monkeypatch):
    """The GPU tests that catch a kernel reading its input before its PDL wait
    (test_first_kernel_waits_for_a_long_predecessor, bf16 and FP8, and the back-to-back chains)
    cover the grouping GEMM1, which waits before it reads the ids, only while their shapes
    plan it: cuda_wgmma at M = 12 over 16 experts, bf16 (K = 256, N = 128) and FP8 (K = 512,
    N = 256)."""
    monkeypatch.setenv("SWAPMOE_BACKEND", "cuda_wgmma")
    for shape, kw in [((16, 4, 256, 128), {}), ((16, 4, 512, 256), dict(quant="fp8_tensor"))]:
        p = plan(12, shape, device_name=device, **kw)
        assert p.tile["align_in_gemm1"], (shape, kw, p.reasons)
        assert p.tile["first_kernel_pdl"]


BACKENDS = ("cpu", "cuda_generic", "cuda_decode", "cuda_mma", "cuda_bulk_decode", "cuda_wgmma", "cuda_wgmma_swap")
EXTERNAL = ("vllm_triton", "flashinfer_cutlass")


def _said(p, name):
    return [r for r in p.reasons if r.startswith(f"{name}:")]


@pytest.mark.parametrize("tables", ["on", "off"])
@pytest.mark.parametrize("quant", [None, "fp8_tensor", "fp8_block128"])
@pytest.mark.parametrize("m", [1, 8, 64, 1024])
@pytest.mark.parametrize("external", [(), ("vllm_triton",)])
def test_every_candidate_has_a_reason(monkeypatch, tables, quant, m, external):
    """Issue 6: a Plan's reasons say why each candidate was taken or not, whatever decided it
    (a table entry, the heuristics); swapmoe's backends and the external ones alike."""
    monkeypatch.setenv("SWAPMOE_TABLES", tables)
    p = plan(m, quant=quant, external_backends=list(external))
    for name in BACKENDS + EXTERNAL:
        assert _said(p, name), f"{name}: no reason in {p.reasons}"
    assert _said(p, "cpu") == ["cpu: rejected, it needs CPU tensors"]
    assert _said(p, "flashinfer_cutlass") == [
        "flashinfer_cutlass: not a candidate: only a caller that can run it (inside vLLM) allows it, through "
        "external_backends"]
    if not external:
        assert _said(p, "vllm_triton")[0].startswith("vllm_triton: not a candidate")


def test_a_table_plan_quotes_the_entrys_times_for_the_others(monkeypatch):
    """A table-decided plan gives each other timed candidate its measured time against the pick's."""
    monkeypatch.setenv("SWAPMOE_TABLES", "on")
    p = plan(1, external_backends=["vllm_triton"])
    assert p.source == "table" and p.backend == "cuda_wgmma_swap"
    import re

    pick = re.search(r"cuda_wgmma_swap, ([0-9.]+) µs measured", " ".join(p.reasons))
    assert pick, p.reasons
    for name in ("cuda_decode", "cuda_mma", "cuda_wgmma", "vllm_triton"):
        (why,) = _said(p, name)
        # swapmoe's times are the tune's measurements; vLLM's in this shipped table the tune's
        # estimate (the anchor's GEMMs plus the rest), and the sentence does not call it measured
        has = ("has ([0-9.]+) µs for it \\(which may be the tune's estimate of vLLM\\)" if name == "vllm_triton"
               else "measured it at ([0-9.]+) µs")
        m = re.fullmatch(rf"{name}: not picked, the table entry {has} against cuda_wgmma_swap \(([0-9.]+) µs\)", why)
        assert m, why
        assert float(m.group(2)) == float(pick.group(1)) and float(m.group(1)) > float(m.group(2))


def test_a_forced_plan_says_the_others_were_not_picked_because_of_the_override():
    p = plan(64, backend="cuda_mma")
    assert p.source == "override"
    assert _said(p, "cuda_wgmma") == ["cuda_wgmma: not picked, cuda_mma is forced"]
    assert _said(p, "cuda_wgmma_swap") == ["cuda_wgmma_swap: not picked, cuda_mma is forced"]


def test_an_external_backend_can_be_forced_where_the_caller_runs_it(monkeypatch):
    """Issue 6's order (override, tables, heuristics) covers the external candidates: a caller
    that can run vLLM's Triton (the plugin) may force it by backend= or $SWAPMOE_BACKEND; the
    plan names it, with swapmoe's heuristic pick as the fallback."""
    p = plan(8, backend="vllm_triton", external_backends=["vllm_triton"])
    assert (p.backend, p.source, p.fallback) == ("vllm_triton", "override", "cuda_wgmma_swap")
    assert any(r.startswith("override: vllm_triton forced") for r in p.reasons)
    monkeypatch.setenv("SWAPMOE_BACKEND", "flashinfer_cutlass")
    p = plan(64, external_backends=["vllm_triton", "flashinfer_cutlass"])
    assert (p.backend, p.source) == ("flashinfer_cutlass", "override")
    with pytest.raises(swapmoe.ArgumentError, match=r"flashinfer_cutlass runs outside swapmoe: forcing it needs it in "
                                                    r'external_backends .*got \["vllm_triton"\]'):
        plan(64, external_backends=["vllm_triton"])


def test_reasons_name_what_actually_decided(monkeypatch):
    """The sentences for the other candidates follow what decided: a forced external backend
    (not its swapmoe fallback), a table whose pick a forced token tile only refines, and an
    entry that picked swapmoe while the untabled rule sent the call to vLLM's Triton (the entry
    has no vllm_triton time there, so its times are compared against its own pick)."""
    p = plan(8, backend="vllm_triton", external_backends=["vllm_triton"])
    assert _said(p, "cuda_mma") == ["cuda_mma: not picked, vllm_triton is forced"]
    assert _said(p, "vllm_triton") == [
        "vllm_triton: picked, forced (see the override); cuda_wgmma_swap runs the call if it cannot"]
    assert any(r.startswith("override: vllm_triton forced") for r in p.reasons)
    # the fallback keeps the heuristics' own sentence, which says why it is the pick
    assert _said(p, "cuda_wgmma_swap")[0].startswith("cuda_wgmma_swap: M = 8, N = 768: the swap-AB wgmma kernels")
    monkeypatch.setenv("SWAPMOE_TABLES", "on")
    base = plan(64)
    assert base.source == "table" and base.backend == "cuda_wgmma"
    monkeypatch.setenv("SWAPMOE_MMA_TOKEN_TILE", "64")
    tiled = plan(64)
    monkeypatch.delenv("SWAPMOE_MMA_TOKEN_TILE")
    assert tiled.source == "override" and tiled.backend == "cuda_wgmma"
    assert _said(tiled, "cuda_mma") == _said(base, "cuda_mma")
    assert _said(tiled, "cuda_mma")[0].startswith("cuda_mma: not picked, the table entry measured it at ")
    p = plan(512, external_backends=["vllm_triton"])
    assert p.backend == "vllm_triton" and p.fallback == "cuda_wgmma"
    (why,) = _said(p, "cuda_mma")
    assert why.startswith("cuda_mma: not picked, the table entry measured it at ") and "against cuda_wgmma (" in why
