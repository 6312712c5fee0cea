"""The vLLM plugin against a real vLLM (0.33.0, installed from PyPI by scripts/test-vllm.sh).

Skipped where vLLM is not importable. The GPU side (``apply`` on CUDA tensors laid out as
vLLM gives them) is in tests/test_vllm_experts_gpu.py, which needs no vLLM.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

vllm = pytest.importorskip("vllm", reason="needs vLLM (scripts/test-vllm.sh installs it in its own venv)")
torch = pytest.importorskip("torch")

import vllm.model_executor.layers.fused_moe.modular_kernel as mk  # noqa: E402
import vllm.plugins  # noqa: E402
from vllm.model_executor.custom_op import op_registry_oot  # noqa: E402
from vllm.model_executor.layers.fused_moe.activation import MoEActivation  # noqa: E402
from vllm.model_executor.layers.fused_moe.config import (  # noqa: E402
    FusedMoEConfig,
    FusedMoEParallelConfig,
    FusedMoEQuantConfig,
    RoutingMethodType,
    fp8_w8a8_moe_quant_config,
)
from vllm.model_executor.layers.fused_moe.oracle import fp8 as fp8_oracle  # noqa: E402
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (  # noqa: E402
    UnquantizedFusedMoEMethod,
)
from vllm.model_executor.layers.quantization.utils import quant_utils as q  # noqa: E402
from vllm.platforms import PlatformEnum  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402

import swapmoe  # noqa: E402
from swapmoe import reference, vllm_experts, vllm_plugin  # noqa: E402


@pytest.fixture(autouse=True)
def clean_plugin(monkeypatch):
    """Each test starts with the plugin unregistered and vLLM's plugin loader reset."""
    vllm_plugin._unregister_for_tests()
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.delenv("SWAPMOE_DISABLE", raising=False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    yield
    vllm_plugin._unregister_for_tests()


@pytest.fixture
def hopper(monkeypatch):
    """vLLM's current platform, mocked as one CUDA device of capability 9.0 (an H200)."""
    platform = vllm.platforms.current_platform
    cls = type(platform)
    monkeypatch.setattr(platform, "_enum", PlatformEnum.CUDA)
    monkeypatch.setattr(cls, "get_device_capability", classmethod(lambda c, device_id=0: DeviceCapability(9, 0)))
    monkeypatch.setattr(cls, "get_device_name", classmethod(lambda c, device_id=0: "NVIDIA H200"))
    monkeypatch.setattr(cls, "supports_fp8", classmethod(lambda c: True))
    return platform


@pytest.fixture
def vllm_config():
    """A default VllmConfig in context: vLLM's CustomOps read it when they are built."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        yield


def moe_config(*, E=128, topk=8, K=2048, N=768, dtype=torch.bfloat16, backend="auto", **kw):
    return FusedMoEConfig(
        num_experts=E,
        experts_per_token=topk,
        hidden_dim=K,
        intermediate_size=N,
        num_local_experts=E,
        num_logical_experts=E,
        activation=kw.pop("activation", MoEActivation.SILU),
        device="cpu",
        routing_method=RoutingMethodType.Renormalize,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        in_dtype=dtype,
        moe_backend=backend,
        **kw,
    )


def capture_log():
    records = []

    class H(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = H(level=logging.DEBUG)
    vllm_plugin.logger.addHandler(handler)
    vllm_plugin.logger.setLevel(logging.DEBUG)
    return records, handler


# --------------------------------------------------------------------------- registration


def test_entry_point_is_installed():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("swapmoe") == "swapmoe.vllm_plugin:register"


def test_load_general_plugins_runs_register_and_is_idempotent(hopper):
    records, handler = capture_log()
    try:
        vllm.plugins.load_general_plugins()
        first = vllm_plugin.status()
        assert first is not None and first.startswith("swapmoe "), first
        assert "unquantized MoE -> swapmoe experts" in first
        assert "FP8 MoE -> swapmoe's oracle" in first
        assert op_registry_oot["UnquantizedFusedMoEMethod"] is vllm_plugin.unquantized_method_class()
        assert getattr(fp8_oracle.backend_to_kernel_cls, "_swapmoe", False)
        # vLLM's loader runs once per process; our register is idempotent on its own too.
        vllm.plugins.plugins_loaded = False
        vllm.plugins.load_general_plugins()
        vllm_plugin.register()
        assert vllm_plugin.status() == first
        assert [r for r in records if r.startswith("swapmoe ")] == [first], records
        assert not getattr(fp8_oracle.backend_to_kernel_cls.__wrapped__, "_swapmoe", False)
    finally:
        vllm_plugin.logger.removeHandler(handler)


def test_vllm_plugins_filter_can_exclude_it(hopper, monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
    vllm.plugins.load_general_plugins()
    assert vllm_plugin.status() is None
    assert "UnquantizedFusedMoEMethod" not in op_registry_oot


def test_disable_env_is_a_logged_noop(hopper, monkeypatch):
    monkeypatch.setenv("SWAPMOE_DISABLE", "1")
    records, handler = capture_log()
    try:
        vllm.plugins.load_general_plugins()
    finally:
        vllm_plugin.logger.removeHandler(handler)
    assert "disabled by SWAPMOE_DISABLE=1" in vllm_plugin.status()
    assert records == [vllm_plugin.status()]
    assert "UnquantizedFusedMoEMethod" not in op_registry_oot
    assert not getattr(fp8_oracle.backend_to_kernel_cls, "_swapmoe", False)


@pytest.mark.parametrize("version", ["0.32.1", "0.34.0", "1.0.0"])
def test_version_outside_range_is_a_logged_noop(hopper, monkeypatch, version):
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version if name == "vllm" else real(name))
    vllm_plugin.register()
    assert f"vLLM {version} is outside the supported range >=0.33.0,<0.34.0" in vllm_plugin.status()
    assert "UnquantizedFusedMoEMethod" not in op_registry_oot


def test_non_cuda_platform_is_a_logged_noop():
    # This machine's real platform (no GPU): nothing is replaced.
    vllm_plugin.register()
    assert "is not CUDA; nothing replaced" in vllm_plugin.status()
    assert "UnquantizedFusedMoEMethod" not in op_registry_oot


def test_old_gpu_is_a_logged_noop(hopper, monkeypatch):
    monkeypatch.setattr(type(hopper), "get_device_capability", classmethod(lambda c, device_id=0: DeviceCapability(7, 5)))
    vllm_plugin.register()
    assert "below (8, 0)" in vllm_plugin.status()


# --------------------------------------------------------------------------- unquantized


def test_unquantized_layer_gets_swapmoe_experts(hopper, vllm_config):
    vllm_plugin.register()
    method = UnquantizedFusedMoEMethod(moe_config())
    assert type(method) is vllm_plugin.unquantized_method_class()
    assert method.experts_cls is vllm_plugin.experts_class(), method.swapmoe_reason
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import make_unquantized_moe_kernel

    kernel = make_unquantized_moe_kernel(
        quant_config=FusedMoEQuantConfig.make(), moe_config=method.moe,
        backend=method.unquantized_backend, experts_cls=method.experts_cls,
    )
    assert isinstance(kernel.fused_experts, vllm_plugin.experts_class())


@pytest.mark.parametrize("forced", ["triton", "flashinfer_cutlass"])
def test_forced_moe_backend_is_respected(hopper, vllm_config, forced):
    vllm_plugin.register()
    try:
        method = UnquantizedFusedMoEMethod(moe_config(backend=forced))
    except ValueError as e:  # FlashInfer may reject the (mocked) device: vLLM's own error
        assert forced == "flashinfer_cutlass" and "does not support" in str(e), e
        return
    assert method.experts_cls is not vllm_plugin.experts_class()


@pytest.mark.parametrize(
    "kw, why",
    [
        (dict(has_bias=True), "biases"),
        (dict(swiglu_limit=7.0), "SwiGLU"),
        (dict(activation=MoEActivation.SWIGLUOAI), "activation"),
        (dict(activation=MoEActivation.RELU2_NO_MUL), "act_and_mul"),
        (dict(backend="triton"), "forced"),
    ],
)
def test_unsupported_configs_stay_on_vllm_triton(hopper, kw, why):
    experts = vllm_plugin.experts_class()
    cfg = moe_config(**kw)
    ok, reason = experts.is_supported_config(experts, cfg, None, None, mk.FusedMoEActivationFormat.Standard)
    assert not ok and why in reason, reason


def test_is_supported_config_passes_vllms_checks(hopper):
    experts = vllm_plugin.experts_class()
    for act in (MoEActivation.SILU, MoEActivation.GELU):
        for dtype in (torch.bfloat16, torch.float16):
            ok, reason = experts.is_supported_config(
                experts, moe_config(activation=act, dtype=dtype), None, None, mk.FusedMoEActivationFormat.Standard)
            assert ok, reason
    ok, reason = experts.is_supported_config(
        experts, moe_config(), None, None, mk.FusedMoEActivationFormat.BatchedExperts)
    assert not ok and "activation format" in reason


def test_not_supported_off_cuda():
    experts = vllm_plugin.experts_class()
    ok, reason = experts.is_supported_config(experts, moe_config(), None, None, mk.FusedMoEActivationFormat.Standard)
    assert not ok and "current device" in reason


# --------------------------------------------------------------------------- FP8


FP8_KEYS = {
    "fp8_tensor static": (q.kFp8StaticTensorSym, q.kFp8StaticTensorSym),
    "fp8_tensor dynamic": (q.kFp8StaticTensorSym, q.kFp8DynamicTensorSym),
    "fp8_channel": (q.kFp8StaticChannelSym, q.kFp8DynamicTokenSym),
    "fp8_block128": (q.kFp8Static128BlockSym, q.kFp8Dynamic128Sym),
}


@pytest.mark.parametrize("scheme", list(FP8_KEYS))
def test_fp8_layer_is_routed_by_swapmoe(hopper, vllm_config, scheme):
    vllm_plugin.register()
    weight_key, act_key = FP8_KEYS[scheme]
    backend, experts_cls = fp8_oracle.select_fp8_moe_backend(moe_config(), weight_key, act_key)
    quant = scheme.split()[0]
    # every scheme is in this build (an empty fp8_schemes(), which swallows the oracle's
    # errors, would otherwise pass this test by its other branch)
    assert quant in vllm_plugin.fp8_schemes()
    assert backend == fp8_oracle.Fp8MoeBackend.TRITON
    assert experts_cls is vllm_plugin.experts_class()


def test_fp8_priority_puts_triton_before_flashinfer_on_hopper(hopper, vllm_config):
    vllm_plugin.register()
    order = fp8_oracle._get_priority_backends(moe_config(), q.kFp8StaticTensorSym, q.kFp8StaticTensorSym)
    original = fp8_oracle._get_priority_backends.__wrapped__(
        moe_config(), q.kFp8StaticTensorSym, q.kFp8StaticTensorSym)
    B = fp8_oracle.Fp8MoeBackend
    assert original.index(B.FLASHINFER_CUTLASS) < original.index(B.TRITON)
    plan = vllm_plugin._layer_plan(moe_config(), q.kFp8StaticTensorSym, q.kFp8StaticTensorSym, 1,
                                   ("vllm_triton", "flashinfer_cutlass"))
    assert plan is not None
    if plan.backend == "flashinfer_cutlass":
        assert order == original
    else:
        assert order.index(B.TRITON) < order.index(B.FLASHINFER_CUTLASS), (order, plan.reasons)
        assert sorted(b.value for b in order) == sorted(b.value for b in original)


def test_fp8_layer_plan_follows_the_activation_key(hopper, vllm_config):
    # the shipped per-tensor table (H200, qwen3's shape) was measured with static scales
    ask = lambda act: vllm_plugin._layer_plan(moe_config(), q.kFp8StaticTensorSym, act, 1,  # noqa: E731
                                              ("vllm_triton", "flashinfer_cutlass"))
    static, dynamic = ask(q.kFp8StaticTensorSym), ask(q.kFp8DynamicTensorSym)
    assert static.source == "table", static.reasons
    assert dynamic.source == "heuristic"
    assert any("measured with static activation scales and this call's are dynamic" in r for r in dynamic.reasons)


def test_layer_plan_under_expert_parallelism_gives_the_models_expert_count(hopper, monkeypatch):
    """A layer whose rank holds 32 of 256 experts asks the oracle with global_num_experts=256;
    one that holds them all with -1."""
    import types

    from swapmoe import oracle as sw_oracle

    asked = []
    monkeypatch.setattr(sw_oracle, "select_backend",
                        lambda *a, **kw: asked.append((a[1], kw["global_num_experts"])) or "plan")
    for local, global_ in ((32, 256), (256, 256)):
        cfg = types.SimpleNamespace(num_local_experts=local, num_experts=global_, experts_per_token=8,
                                    hidden_dim=7168, intermediate_size_per_partition=2048, in_dtype=torch.bfloat16)
        assert vllm_plugin._layer_plan(cfg, None, None, 1, ("vllm_triton",)) == "plan"
    assert asked == [(32, 256), (256, -1)]


def test_fp8_forced_backend_is_respected(hopper, vllm_config):
    vllm_plugin.register()
    backend, experts_cls = fp8_oracle.select_fp8_moe_backend(
        moe_config(backend="triton"), q.kFp8StaticTensorSym, q.kFp8StaticTensorSym)
    assert backend == fp8_oracle.Fp8MoeBackend.TRITON
    assert experts_cls is not vllm_plugin.experts_class()


# --------------------------------------------------------------------------- apply (CPU)


def _vllm_buffers(experts, M, N2, K, topk, E, dtype):
    """Workspaces as vLLM's modular kernel allocates them: workspace13 shares its storage
    with the output (one chunk), workspace2 is separate."""
    ws13_shape, ws2_shape, out_shape = experts.workspace_shapes(M, N2, K, topk, E, E, None, MoEActivation.SILU)
    common = torch.full((max(np.prod(ws13_shape), np.prod(out_shape)),), float("nan"), dtype=dtype)
    workspace13 = common[: int(np.prod(ws13_shape))].view(ws13_shape)
    output = common[: int(np.prod(out_shape))].view(out_shape)
    workspace2 = torch.full(ws2_shape, float("nan"), dtype=dtype)
    return output, workspace13, workspace2


@pytest.mark.parametrize("on_input", [False, True])
@pytest.mark.parametrize("with_map", [False, True])
def test_apply_on_cpu_matches_float64_reference(on_input, with_map):
    rng = np.random.default_rng(1234 + 2 * on_input + with_map)
    M, K, N, topk = 13, 96, 64, 1 if on_input else 3
    global_E = 12
    E = 8 if with_map else global_E
    emap = None
    if with_map:
        m = -np.ones(global_E, dtype=np.int32)
        m[rng.choice(global_E, E, replace=False)] = np.arange(E, dtype=np.int32)
        emap = m
    x = rng.standard_normal((M, K)) * 0.5
    w1 = rng.standard_normal((E, 2 * N, K)) / np.sqrt(K)
    w2 = rng.standard_normal((E, K, N)) / np.sqrt(N)
    ids = np.stack([rng.choice(global_E, topk, replace=False) for _ in range(M)]).astype(np.int32)
    tw = rng.random((M, topk)).astype(np.float32)
    ref_in = x * tw[:, :1] if on_input else x  # vLLM's prepare step scales the input first
    ref = reference.fused_experts_ref(ref_in, w1, w2, np.ones_like(tw) if on_input else tw, ids,
                                      global_num_experts=global_E, expert_map=emap)

    experts_cls = vllm_plugin.experts_class()
    experts = experts_cls(moe_config(E=global_E, topk=topk, K=K, N=N, dtype=torch.float32),
                          FusedMoEQuantConfig.make())
    t = lambda a, dt=torch.float32: torch.from_numpy(np.ascontiguousarray(a)).to(dt)  # noqa: E731
    output, ws13, ws2 = _vllm_buffers(experts, M, 2 * N, K, topk, E, torch.float32)
    asked = []  # the global expert count apply() gives route(): the model's only with a map
    route = experts.route
    experts.route = lambda *a: (asked.append(a[4:]), route(*a))[1]
    ret = experts.apply(
        output=output, hidden_states=t(ref_in), w1=t(w1), w2=t(w2), topk_weights=t(tw),
        topk_ids=t(ids, torch.int32), activation=MoEActivation.SILU, global_num_experts=global_E,
        expert_map=None if emap is None else t(emap, torch.int32), a1q_scale=None, a2_scale=None,
        workspace13=ws13, workspace2=ws2, expert_tokens_meta=None,
        apply_router_weight_on_input=on_input,
    )
    assert ret is None
    assert asked == [(global_E if with_map else -1,)]
    out = output.double().numpy()
    assert np.isfinite(out).all()
    assert reference.rel_error(out, ref) < 1e-5
    assert isinstance(experts.finalize_weight_and_reduce_impl(),
                      type(experts._triton.finalize_weight_and_reduce_impl()))


def test_workspace_shapes_cover_triton_and_swapmoe():
    experts = vllm_plugin.experts_class()(moe_config(), FusedMoEQuantConfig.make())
    for M in (1, 7, 64, 1000):
        ours = experts.workspace_shapes(M, 1536, 2048, 8, 128, 128, None, MoEActivation.SILU)
        theirs = experts._triton.workspace_shapes(M, 1536, 2048, 8, 128, 128, None, MoEActivation.SILU)
        for a, b in zip(ours, theirs):
            assert a[0] == b[0] and np.prod(a) >= np.prod(b)
        need = vllm_experts.swapmoe_workspace_bytes(M, 768, 2048, 8, 128, 2)
        assert np.prod(ours[1]) * 2 >= need
        assert ours[2] == (M, 2048)


class _CudaShaped:
    """Enough of a CUDA tensor for ``route``: its shape, dtype, device and ``is_cuda``."""

    is_cuda = True

    def __init__(self, *shape, dtype=torch.bfloat16):
        self.shape, self.dtype, self.device = torch.Size(shape), dtype, torch.device("cuda", 0)


def test_route_asks_the_oracle_once_per_token_count(monkeypatch):
    """On CUDA, route() asks the oracle with the call's (M, E, topk, K, N) (N from w2 [E, K, N]),
    the device's capability and name and vLLM's Triton as an external backend; it caches the
    answer per token count, not across counts, and only a vllm_triton plan goes to Triton."""
    from swapmoe import oracle as sw_oracle

    asked = []

    def select_backend(m, e, topk, k, n, **kw):
        asked.append((m, e, topk, k, n, kw["device_capability"], kw["device_name"], kw["external_backends"]))
        return type("Plan", (), {"backend": "vllm_triton" if m == 1 else "cuda_wgmma_swap"})()

    monkeypatch.setattr(sw_oracle, "select_backend", select_backend)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    experts = vllm_plugin.experts_class()(moe_config(E=128, topk=8, K=2048, N=768), FusedMoEQuantConfig.make())
    w1, w2 = _CudaShaped(128, 1536, 2048), _CudaShaped(128, 2048, 768)
    routes = [experts.route(_CudaShaped(m, 2048), w1, w2, 8) for m in (1, 64, 1, 64, 8)]
    assert routes == ["vllm_triton", "swapmoe", "vllm_triton", "swapmoe", "swapmoe"]
    assert [a[0] for a in asked] == [1, 64, 8]  # once per token count
    assert all(a[1:5] == (128, 8, 2048, 768) for a in asked), asked
    assert asked[0][5:] == ((9, 0), "NVIDIA H200", ("vllm_triton",))


def test_route_under_expert_parallelism_asks_for_the_ranks_share(monkeypatch):
    """With an expert map (this rank holds 32 of 256 experts) route() gives the oracle the
    model's expert count, so that it plans for the slots that land on the rank, as the op
    does with the map; without one (or where the counts agree) it gives -1."""
    from swapmoe import oracle as sw_oracle

    asked = []

    def select_backend(m, e, topk, k, n, **kw):
        asked.append((m, e, kw["global_num_experts"]))
        return type("Plan", (), {"backend": "cuda_wgmma_swap"})()

    monkeypatch.setattr(sw_oracle, "select_backend", select_backend)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    experts = vllm_plugin.experts_class()(moe_config(E=32, topk=8, K=7168, N=2048), FusedMoEQuantConfig.make())
    w1, w2 = _CudaShaped(32, 4096, 7168), _CudaShaped(32, 7168, 2048)
    assert experts.route(_CudaShaped(1, 7168), w1, w2, 8, 256) == "swapmoe"
    assert experts.route(_CudaShaped(2, 7168), w1, w2, 8, 32) == "swapmoe"
    assert experts.route(_CudaShaped(4, 7168), w1, w2, 8) == "swapmoe"
    assert asked == [(1, 32, 256), (2, 32, -1), (4, 32, -1)]
    g = vllm_plugin._rank_global_experts
    assert (g(32, 256), g(32, 32), g(32, -1), g(32, None), g(256, 32)) == (256, -1, -1, -1, -1)
    # the real oracle: DeepSeek-V3 EP8 with 128x128 blocks at M = 2 (no table on the H200)
    plan = lambda gl: swapmoe.select_backend(2, 32, 8, 7168, 2048, quant="fp8_block128",  # noqa: E731
                                             device_name="NVIDIA H200", global_num_experts=gl)
    assert (plan(-1).backend, plan(256).backend) == ("cuda_wgmma", "cuda_wgmma_swap")


def test_a_forced_external_backend_reaches_the_oracle_and_not_the_op(monkeypatch):
    """$SWAPMOE_BACKEND naming an external backend: route() lists it among the external
    backends, so the oracle's plan takes the override (an external pick: vLLM's Triton runs the
    call) instead of refusing it and leaving the call to the op, which refuses such a name; and
    fp8_schemes() still says what the build runs (its probe names its own backend)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    w1, w2 = _CudaShaped(128, 1536, 2048), _CudaShaped(128, 2048, 768)
    for forced in ("flashinfer_cutlass", "vllm_triton"):
        monkeypatch.setenv("SWAPMOE_BACKEND", forced)
        vllm_plugin.fp8_schemes.cache_clear()
        try:
            assert vllm_plugin.fp8_schemes() == ("fp8_tensor", "fp8_channel", "fp8_block128")
        finally:
            vllm_plugin.fp8_schemes.cache_clear()
        experts = vllm_plugin.experts_class()(moe_config(E=128, topk=8, K=2048, N=768), FusedMoEQuantConfig.make())
        assert [experts.route(_CudaShaped(m, 2048), w1, w2, 8) for m in (1, 64)] == ["vllm_triton"] * 2
    monkeypatch.delenv("SWAPMOE_BACKEND")
    experts = vllm_plugin.experts_class()(moe_config(E=128, topk=8, K=2048, N=768), FusedMoEQuantConfig.make())
    assert experts.route(_CudaShaped(1, 2048), w1, w2, 8) == "swapmoe"  # the H200 table's pick at M = 1


def test_fp8_layer_asks_the_oracle_with_its_kind_of_activation_scales():
    """The shipped per-tensor tables were measured with static scales: a layer with dynamic
    ones must not be routed by them (swapmoe runs other kernels for it)."""
    w, s = torch.ones(4), torch.ones(1)
    of = vllm_plugin.activation_scales_of_config
    assert of(fp8_w8a8_moe_quant_config(w, w, a1_scale=s, a2_scale=s), "fp8_tensor") == "static"
    assert of(fp8_w8a8_moe_quant_config(w, w), "fp8_tensor") == "dynamic"
    assert of(fp8_w8a8_moe_quant_config(w, w, a1_scale=s), "fp8_tensor") == "dynamic"
    assert of(fp8_w8a8_moe_quant_config(w, w, block_shape=[128, 128]), "fp8_block128") is None
    plan = lambda scales: swapmoe.select_backend(  # noqa: E731
        1, 128, 8, 2048, 768, quant="fp8_tensor", device_name="NVIDIA H200",
        external_backends=("vllm_triton",), activation_scales=scales)
    assert (plan("static").backend, plan("static").source) == ("cuda_wgmma_swap", "table")
    assert (plan("dynamic").backend, plan("dynamic").source) == ("vllm_triton", "heuristic")


def test_fp8_quant_config_maps_to_schemes():
    w = torch.ones(4)
    assert vllm_plugin.quant_of_config(FusedMoEQuantConfig.make()) is None
    assert vllm_plugin.quant_of_config(fp8_w8a8_moe_quant_config(w, w, a1_scale=w[:1])) == "fp8_tensor"
    assert vllm_plugin.quant_of_config(
        fp8_w8a8_moe_quant_config(w, w, per_act_token_quant=True, per_out_ch_quant=True)) == "fp8_channel"
    assert vllm_plugin.quant_of_config(fp8_w8a8_moe_quant_config(w, w, block_shape=[128, 128])) == "fp8_block128"
