//! The PyO3 bindings: `swapmoe._core`. Thin: import tensors, build the problem, ask the
//! oracle, run. Errors become the exception classes of `swapmoe.errors`.

mod tensor;

use crate::cuda;
use crate::error::{Error, CLASS_NAMES};
use crate::oracle;
use crate::problem::{
    Activation, DType, Device, MoeArgs, MoeProblem, QuantArgs, QuantScheme, TensorDesc,
    WorkspaceLayout, WS_ALIGN,
};
use crate::routing::{RouterConfig, RouterProblem, Scoring};
use crate::tables::{ExternalBackend, Quant};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

static CLASSES: [PyOnceLock<Py<PyType>>; CLASS_NAMES.len()] =
    [const { PyOnceLock::new() }; CLASS_NAMES.len()];

pub(crate) fn to_pyerr(py: Python<'_>, err: Error) -> PyErr {
    match CLASSES[err.class_index()].import(py, "swapmoe.errors", err.class_name()) {
        Ok(cls) => PyErr::from_type(cls.clone(), err.to_string()),
        Err(e) => e,
    }
}

trait IntoPy<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}
impl<T> IntoPy<T> for crate::error::Result<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_pyerr(py, e))
    }
}

/// The tensor inputs of fused_experts, imported through DLPack and alive while held.
struct MoeInputs {
    hidden_states: tensor::Imported,
    w1: tensor::Imported,
    w2: tensor::Imported,
    topk_weights: tensor::Imported,
    topk_ids: tensor::Imported,
    expert_map: Option<tensor::Imported>,
    quant: QuantInputs,
}

/// The FP8 arguments of fused_experts (all absent without FP8).
#[derive(Default)]
struct QuantInputs {
    use_fp8_w8a8: bool,
    per_channel_quant: bool,
    block_shape: Option<Vec<i64>>,
    w1_scale: Option<tensor::Imported>,
    w2_scale: Option<tensor::Imported>,
    a1_scale: Option<tensor::Imported>,
    a2_scale: Option<tensor::Imported>,
}

impl QuantInputs {
    #[allow(clippy::too_many_arguments)]
    fn import(
        use_fp8_w8a8: bool,
        per_channel_quant: bool,
        block_shape: Option<Vec<i64>>,
        w1_scale: Option<&Bound<'_, PyAny>>,
        w2_scale: Option<&Bound<'_, PyAny>>,
        a1_scale: Option<&Bound<'_, PyAny>>,
        a2_scale: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let imp = |name: &str, t: Option<&Bound<'_, PyAny>>| {
            t.map(|t| tensor::import(name, t)).transpose()
        };
        Ok(QuantInputs {
            use_fp8_w8a8,
            per_channel_quant,
            block_shape,
            w1_scale: imp("w1_scale", w1_scale)?,
            w2_scale: imp("w2_scale", w2_scale)?,
            a1_scale: imp("a1_scale", a1_scale)?,
            a2_scale: imp("a2_scale", a2_scale)?,
        })
    }

    fn args(&self) -> QuantArgs<'_> {
        QuantArgs {
            use_fp8_w8a8: self.use_fp8_w8a8,
            per_channel_quant: self.per_channel_quant,
            block_shape: self.block_shape.as_deref(),
            w1_scale: self.w1_scale.as_ref().map(|t| &t.desc),
            w2_scale: self.w2_scale.as_ref().map(|t| &t.desc),
            a1_scale: self.a1_scale.as_ref().map(|t| &t.desc),
            a2_scale: self.a2_scale.as_ref().map(|t| &t.desc),
        }
    }
}

impl MoeInputs {
    fn import(
        hidden_states: &Bound<'_, PyAny>,
        w1: &Bound<'_, PyAny>,
        w2: &Bound<'_, PyAny>,
        topk_weights: &Bound<'_, PyAny>,
        topk_ids: &Bound<'_, PyAny>,
        expert_map: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Self::import_with(hidden_states, w1, w2, expert_map, || {
            Ok((
                tensor::import("topk_weights", topk_weights)?,
                tensor::import("topk_ids", topk_ids)?,
            ))
        })
    }

    /// `import`, with the router's weights and ids from `routing` (imported, or views into a
    /// workspace), in the same order: hidden_states, w1, w2, the routing, expert_map.
    fn import_with(
        hidden_states: &Bound<'_, PyAny>,
        w1: &Bound<'_, PyAny>,
        w2: &Bound<'_, PyAny>,
        expert_map: Option<&Bound<'_, PyAny>>,
        routing: impl FnOnce() -> PyResult<(tensor::Imported, tensor::Imported)>,
    ) -> PyResult<Self> {
        let hidden_states = tensor::import("hidden_states", hidden_states)?;
        let w1 = tensor::import("w1", w1)?;
        let w2 = tensor::import("w2", w2)?;
        let (topk_weights, topk_ids) = routing()?;
        Ok(MoeInputs {
            hidden_states,
            w1,
            w2,
            topk_weights,
            topk_ids,
            expert_map: expert_map
                .map(|m| tensor::import("expert_map", m))
                .transpose()?,
            quant: QuantInputs::default(),
        })
    }

    /// Every imported tensor, named, for the workspace's overlap check.
    fn named(&self) -> Vec<(&'static str, &TensorDesc)> {
        let q = &self.quant;
        let mut v = vec![
            ("hidden_states", &self.hidden_states.desc),
            ("w1", &self.w1.desc),
            ("w2", &self.w2.desc),
            ("topk_weights", &self.topk_weights.desc),
            ("topk_ids", &self.topk_ids.desc),
        ];
        let optional = [
            ("expert_map", &self.expert_map),
            ("w1_scale", &q.w1_scale),
            ("w2_scale", &q.w2_scale),
            ("a1_scale", &q.a1_scale),
            ("a2_scale", &q.a2_scale),
        ];
        v.extend(
            optional
                .into_iter()
                .filter_map(|(name, t)| t.as_ref().map(|t| (name, &t.desc))),
        );
        v
    }

    fn problem(
        &self,
        out: &crate::problem::TensorDesc,
        activation: Activation,
        apply_router_weight_on_input: bool,
        global_num_experts: i64,
    ) -> crate::error::Result<MoeProblem> {
        MoeProblem::new(&MoeArgs {
            hidden_states: &self.hidden_states.desc,
            w1: &self.w1.desc,
            w2: &self.w2.desc,
            topk_weights: &self.topk_weights.desc,
            topk_ids: &self.topk_ids.desc,
            out,
            expert_map: self.expert_map.as_ref().map(|t| &t.desc),
            activation,
            apply_router_weight_on_input,
            global_num_experts,
            quant: self.quant.args(),
        })
    }
}

/// Runs the fused experts op. `out` is written; `workspace` (CUDA only) must hold at least
/// `workspace_bytes(...)` bytes on the device. Launches on `stream` (a CUstream address,
/// 0 for the legacy default stream).
#[pyfunction]
#[pyo3(signature = (hidden_states, w1, w2, topk_weights, topk_ids, out, workspace=None, activation="silu", apply_router_weight_on_input=false, global_num_experts=-1, expert_map=None, check_ids=false, stream=0, backend=None, use_fp8_w8a8=false, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None, per_channel_quant=false, block_shape=None))]
#[pyo3(
    text_signature = "(hidden_states, w1, w2, topk_weights, topk_ids, out, workspace=None, activation='silu', apply_router_weight_on_input=False, global_num_experts=-1, expert_map=None, check_ids=False, stream=0, backend=None, use_fp8_w8a8=False, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None, per_channel_quant=False, block_shape=None)"
)]
#[allow(clippy::too_many_arguments)]
fn fused_experts(
    py: Python<'_>,
    hidden_states: &Bound<'_, PyAny>,
    w1: &Bound<'_, PyAny>,
    w2: &Bound<'_, PyAny>,
    topk_weights: &Bound<'_, PyAny>,
    topk_ids: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    workspace: Option<&Bound<'_, PyAny>>,
    activation: &str,
    apply_router_weight_on_input: bool,
    global_num_experts: i64,
    expert_map: Option<&Bound<'_, PyAny>>,
    check_ids: bool,
    stream: usize,
    backend: Option<&str>,
    use_fp8_w8a8: bool,
    w1_scale: Option<&Bound<'_, PyAny>>,
    w2_scale: Option<&Bound<'_, PyAny>>,
    a1_scale: Option<&Bound<'_, PyAny>>,
    a2_scale: Option<&Bound<'_, PyAny>>,
    per_channel_quant: bool,
    block_shape: Option<Vec<i64>>,
) -> PyResult<()> {
    let activation = Activation::parse(activation).py_err(py)?;
    let forced = oracle::forced_backend(backend).py_err(py)?;
    let mut inputs = MoeInputs::import(hidden_states, w1, w2, topk_weights, topk_ids, expert_map)?;
    inputs.quant = QuantInputs::import(
        use_fp8_w8a8,
        per_channel_quant,
        block_shape,
        w1_scale,
        w2_scale,
        a1_scale,
        a2_scale,
    )?;
    let t_out = tensor::import("out", out)?;
    let problem = inputs
        .problem(
            &t_out.desc,
            activation,
            apply_router_weight_on_input,
            global_num_experts,
        )
        .py_err(py)?;
    let ws = workspace
        .map(|w| tensor::import("workspace", w))
        .transpose()?;

    match problem.device {
        crate::problem::Device::Cpu => {
            oracle::plan_for_launch(&problem, None, forced).py_err(py)?;
            // SAFETY: every address comes from a validated DLPack import alive until return.
            if check_ids {
                unsafe { crate::cpu::check_ids(&problem) }.py_err(py)?;
            }
            let p = problem.clone();
            py.detach(move || unsafe { crate::cpu::fused_experts(&p) })
                .py_err(py)
        }
        _ => {
            let mut plan = cuda_plan(py, &problem, forced)?;
            log_note(py, plan.log.take());
            // The GIL goes while the launcher works: a first call's module loads and
            // check_ids's wait for the stream take milliseconds, which other Python threads
            // (a watchdog, a server's other threads) need not wait out. Every address comes
            // from a DLPack import the caller keeps alive until return.
            if check_ids {
                py.detach(|| cuda::launch::check_ids(&problem, stream))
                    .py_err(py)?;
            }
            let mut named = inputs.named();
            named.push(("out", &t_out.desc));
            let need = WorkspaceLayout::for_problem(&problem).total;
            let (ws_addr, ws_bytes) = workspace_buffer(
                ws.as_ref(),
                &problem,
                need,
                "swapmoe.workspace_bytes(hidden_states, w1, topk_ids, quant)",
                &named,
            )
            .py_err(py)?;
            py.detach(|| cuda::launch::fused_experts(&problem, &plan, ws_addr, ws_bytes, stream))
                .py_err(py)
        }
    }
}

/// The oracle's plan for a CUDA problem on its device.
fn cuda_plan(
    py: Python<'_>,
    problem: &MoeProblem,
    forced: Option<oracle::Backend>,
) -> PyResult<oracle::Plan> {
    let ordinal = match problem.device {
        crate::problem::Device::Cuda(i) => i,
        _ => 0,
    };
    let dev = cuda::device(ordinal).py_err(py)?;
    oracle::plan_for_launch(problem, Some(&dev.caps), forced).py_err(py)
}

/// fused_moe's router outputs as views into the caller's workspace: float32 weights at byte
/// `weights_at`, int32 ids at `ids_at`, each [M, topk] with M from `gating_output` ([M, E]).
/// Address 0 without a workspace (the call then fails on the missing workspace unless M = 0,
/// where nothing is launched). The workspace's own checks come later (`workspace_buffer`),
/// before any launch.
fn routing_views(
    gating_output: &TensorDesc,
    topk: usize,
    workspace: Option<&tensor::Imported>,
    weights_at: usize,
    ids_at: usize,
) -> crate::error::Result<(tensor::Imported, tensor::Imported)> {
    let m = match gating_output.shape.as_slice() {
        [m, _] => *m,
        _ => {
            return Err(Error::Shape(format!(
                "gating_output: expected shape [M, E], got {:?}",
                gating_output.shape
            )))
        }
    };
    // on the logits' device whatever the workspace's: workspace_buffer names a workspace on
    // another device (the problem would otherwise blame topk_weights)
    let device = gating_output.device;
    let base = workspace.map_or(0, |w| w.desc.addr);
    let at = |off: usize| {
        if base == 0 {
            0
        } else {
            base.saturating_add(off)
        }
    };
    let shape = [m, topk as i64];
    Ok((
        tensor::Imported::view(TensorDesc::contiguous(
            DType::F32,
            &shape,
            device,
            at(weights_at),
        )),
        tensor::Imported::view(TensorDesc::contiguous(
            DType::I32,
            &shape,
            device,
            at(ids_at),
        )),
    ))
}

/// The CUDA workspace's (address, bytes): at least `need` bytes (`sizing` says how a caller
/// sizes it) on the problem's device, compact, writable, WS_ALIGN-aligned and overlapping
/// none of `named` (the call's other tensors). None passes only where nothing needs it (M = 0).
fn workspace_buffer(
    workspace: Option<&tensor::Imported>,
    p: &MoeProblem,
    need: usize,
    sizing: &str,
    named: &[(&str, &TensorDesc)],
) -> crate::error::Result<(usize, usize)> {
    let device = p.device;
    if p.m == 0 {
        return Ok((0, 0)); // nothing is launched
    }
    if need == usize::MAX {
        return Err(WorkspaceLayout::problem_overflow_error(p));
    }
    let Some(w) = workspace else {
        if need == 0 {
            return Ok((0, 0));
        }
        return Err(Error::Argument(format!(
            "workspace: expected a CUDA buffer of at least {need} bytes for CUDA tensors ({sizing}), got None"
        )));
    };
    let d = &w.desc;
    if d.device != device {
        return Err(Error::Device(format!(
            "workspace: expected device {device} (the device of hidden_states), got {}",
            d.device
        )));
    }
    let Some(bytes) = d.contiguous_bytes() else {
        return Err(Error::Shape(format!(
            "workspace: expected a contiguous buffer (row-major, no broadcast or strided view), got shape {:?} with strides {:?}",
            d.shape, d.strides
        )));
    };
    if bytes < need {
        return Err(Error::Shape(format!(
            "workspace: expected at least {need} bytes ({sizing}), got {bytes}"
        )));
    }
    if bytes == 0 {
        return Ok((0, 0));
    }
    if d.read_only {
        return Err(Error::Argument(
            "workspace: expected a writable buffer, got one its producer exported read-only".into(),
        ));
    }
    if d.addr % WS_ALIGN != 0 {
        return Err(Error::Argument(format!(
            "workspace: expected an address aligned to {WS_ALIGN} bytes (as torch and cupy allocate), got {:#x}",
            d.addr
        )));
    }
    let (w0, w1) = (d.addr, d.addr + bytes);
    for (name, t) in named {
        if let Some((t0, t1)) = t.byte_span() {
            if w0 < t1 && t0 < w1 {
                return Err(Error::Shape(format!(
                    "workspace: expected memory that overlaps no other argument, got bytes [{w0:#x}, {w1:#x}) against {name}'s [{t0:#x}, {t1:#x})"
                )));
            }
        }
    }
    Ok((d.addr, bytes))
}

/// The router's configuration from select_experts' arguments.
fn router_config(
    topk: i64,
    renormalize: bool,
    scoring: &str,
    num_expert_group: Option<i64>,
    topk_group: Option<i64>,
    routed_scaling_factor: f64,
) -> crate::error::Result<RouterConfig> {
    let scoring = Scoring::parse(scoring)?;
    if topk < 1 {
        return Err(Error::Argument(format!("topk: expected >= 1, got {topk}")));
    }
    let groups = match (num_expert_group, topk_group) {
        (None, None) => None,
        (Some(g), Some(t)) if g >= 1 && t >= 1 => Some((g as usize, t as usize)),
        (Some(g), Some(t)) => {
            return Err(Error::Argument(format!(
                "num_expert_group, topk_group: expected both >= 1, got {g} and {t}"
            )))
        }
        (g, t) => {
            let shown = |v: Option<i64>| v.map_or("None".to_string(), |v| v.to_string());
            return Err(Error::Argument(format!(
                "num_expert_group, topk_group: expected both or neither, got {} and {}",
                shown(g),
                shown(t)
            )));
        }
    };
    if !(routed_scaling_factor as f32).is_finite() {
        return Err(Error::Argument(format!(
            "routed_scaling_factor: expected a finite number (it is applied in float32, up to ~3.4e38), got {routed_scaling_factor:?}"
        )));
    }
    Ok(RouterConfig {
        topk: topk as usize,
        renormalize,
        scoring,
        groups,
        routed_scaling_factor: routed_scaling_factor as f32,
    })
}

/// Routes router logits into `topk_weights` (fp32 [M, topk]) and `topk_ids` (int32),
/// on `stream` for CUDA tensors. `num_tokens`: hidden_states.shape[0] to check against.
#[pyfunction]
#[pyo3(signature = (gating_output, topk_weights, topk_ids, topk, renormalize=true, scoring="softmax", num_expert_group=None, topk_group=None, e_score_correction_bias=None, routed_scaling_factor=1.0, stream=0, num_tokens=None))]
#[pyo3(
    text_signature = "(gating_output, topk_weights, topk_ids, topk, renormalize=True, scoring='softmax', num_expert_group=None, topk_group=None, e_score_correction_bias=None, routed_scaling_factor=1.0, stream=0, num_tokens=None)"
)]
#[allow(clippy::too_many_arguments)]
fn select_experts(
    py: Python<'_>,
    gating_output: &Bound<'_, PyAny>,
    topk_weights: &Bound<'_, PyAny>,
    topk_ids: &Bound<'_, PyAny>,
    topk: i64,
    renormalize: bool,
    scoring: &str,
    num_expert_group: Option<i64>,
    topk_group: Option<i64>,
    e_score_correction_bias: Option<&Bound<'_, PyAny>>,
    routed_scaling_factor: f64,
    stream: usize,
    num_tokens: Option<i64>,
) -> PyResult<()> {
    let cfg = router_config(
        topk,
        renormalize,
        scoring,
        num_expert_group,
        topk_group,
        routed_scaling_factor,
    )
    .py_err(py)?;
    let g = tensor::import("gating_output", gating_output)?;
    let w = tensor::import("topk_weights", topk_weights)?;
    let ids = tensor::import("topk_ids", topk_ids)?;
    let bias = match e_score_correction_bias {
        Some(b) => Some(tensor::import("e_score_correction_bias", b)?),
        None => None,
    };
    let p = RouterProblem::new(
        &g.desc,
        bias.as_ref().map(|b| &b.desc),
        &w.desc,
        &ids.desc,
        cfg,
        num_tokens.map(|m| (m, "num_tokens")),
    )
    .py_err(py)?;
    match p.device {
        crate::problem::Device::Cpu => {
            // SAFETY: the addresses come from DLPack imports alive until return.
            py.detach(|| unsafe { crate::routing::select_experts_cpu(&p) });
            Ok(())
        }
        // without the GIL, as fused_experts' launches
        _ => py
            .detach(|| cuda::launch::select_experts(&p, stream))
            .py_err(py),
    }
}

/// Runs the whole layer from router logits: routes `gating_output` into `topk_weights`
/// (fp32 [M, topk]) and `topk_ids` (int32), then the fused experts on them into `out`. On
/// CUDA the oracle places the router: inside the experts' first kernel when that pays, else
/// as its own kernel first. `workspace` as for `fused_experts`; with `topk_weights` and
/// `topk_ids` None (CUDA only) the router's outputs live in the workspace too, after the
/// experts' sections (`workspace_bytes(..., routing=True)` sizes it).
#[pyfunction]
#[pyo3(signature = (hidden_states, w1, w2, gating_output, topk_weights, topk_ids, out, workspace, topk, renormalize=true, scoring="softmax", num_expert_group=None, topk_group=None, e_score_correction_bias=None, routed_scaling_factor=1.0, activation="silu", apply_router_weight_on_input=false, global_num_experts=-1, expert_map=None, stream=0, backend=None, use_fp8_w8a8=false, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None, per_channel_quant=false, block_shape=None))]
#[pyo3(
    text_signature = "(hidden_states, w1, w2, gating_output, topk_weights, topk_ids, out, workspace, topk, renormalize=True, scoring='softmax', num_expert_group=None, topk_group=None, e_score_correction_bias=None, routed_scaling_factor=1.0, activation='silu', apply_router_weight_on_input=False, global_num_experts=-1, expert_map=None, stream=0, backend=None, use_fp8_w8a8=False, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None, per_channel_quant=False, block_shape=None)"
)]
#[allow(clippy::too_many_arguments)]
fn fused_moe(
    py: Python<'_>,
    hidden_states: &Bound<'_, PyAny>,
    w1: &Bound<'_, PyAny>,
    w2: &Bound<'_, PyAny>,
    gating_output: &Bound<'_, PyAny>,
    topk_weights: Option<&Bound<'_, PyAny>>,
    topk_ids: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    workspace: Option<&Bound<'_, PyAny>>,
    topk: i64,
    renormalize: bool,
    scoring: &str,
    num_expert_group: Option<i64>,
    topk_group: Option<i64>,
    e_score_correction_bias: Option<&Bound<'_, PyAny>>,
    routed_scaling_factor: f64,
    activation: &str,
    apply_router_weight_on_input: bool,
    global_num_experts: i64,
    expert_map: Option<&Bound<'_, PyAny>>,
    stream: usize,
    backend: Option<&str>,
    use_fp8_w8a8: bool,
    w1_scale: Option<&Bound<'_, PyAny>>,
    w2_scale: Option<&Bound<'_, PyAny>>,
    a1_scale: Option<&Bound<'_, PyAny>>,
    a2_scale: Option<&Bound<'_, PyAny>>,
    per_channel_quant: bool,
    block_shape: Option<Vec<i64>>,
) -> PyResult<()> {
    let cfg = router_config(
        topk,
        renormalize,
        scoring,
        num_expert_group,
        topk_group,
        routed_scaling_factor,
    )
    .py_err(py)?;
    let activation = Activation::parse(activation).py_err(py)?;
    let forced = oracle::forced_backend(backend).py_err(py)?;
    let ws = workspace
        .map(|w| tensor::import("workspace", w))
        .transpose()?;
    let g = tensor::import("gating_output", gating_output)?;
    let in_workspace = match (topk_weights, topk_ids) {
        (Some(_), Some(_)) => false,
        (None, None) => true,
        _ => {
            return Err(to_pyerr(
                py,
                Error::Argument(
                    "topk_weights, topk_ids: expected both tensors or both None (the router's outputs in the workspace), got one of them".into(),
                ),
            ))
        }
    };
    let mut inputs = MoeInputs::import_with(hidden_states, w1, w2, expert_map, || {
        match (topk_weights, topk_ids) {
            (Some(w), Some(i)) => Ok((
                tensor::import("topk_weights", w)?,
                tensor::import("topk_ids", i)?,
            )),
            // placeholders at the workspace's start until the experts' layout, which needs
            // the problem, places them after its sections (below)
            _ => routing_views(&g.desc, cfg.topk, ws.as_ref(), 0, 0).py_err(py),
        }
    })?;
    inputs.quant = QuantInputs::import(
        use_fp8_w8a8,
        per_channel_quant,
        block_shape,
        w1_scale,
        w2_scale,
        a1_scale,
        a2_scale,
    )?;
    if g.desc.device != inputs.hidden_states.desc.device {
        return Err(to_pyerr(
            py,
            Error::Device(format!(
                "gating_output: expected device {} (the device of hidden_states), got {}",
                inputs.hidden_states.desc.device, g.desc.device
            )),
        ));
    }
    let bias = e_score_correction_bias
        .map(|b| tensor::import("e_score_correction_bias", b))
        .transpose()?;
    let t_out = tensor::import("out", out)?;
    let problem_of = |inputs: &MoeInputs| {
        inputs
            .problem(
                &t_out.desc,
                activation,
                apply_router_weight_on_input,
                global_num_experts,
            )
            .py_err(py)
    };
    if in_workspace {
        if inputs.hidden_states.desc.device == Device::Cpu {
            return Err(to_pyerr(
                py,
                Error::Argument(
                    "topk_weights, topk_ids: expected tensors for CPU inputs (only a CUDA call keeps the router's outputs in its workspace), got None".into(),
                ),
            ));
        }
        // The experts' layout from a problem over the placeholders, then the real places.
        let probe = problem_of(&inputs)?;
        let tail = WorkspaceLayout::for_problem(&probe).routing_tail(probe.m, probe.topk);
        let (w, i) =
            routing_views(&g.desc, cfg.topk, ws.as_ref(), tail.weights, tail.ids).py_err(py)?;
        inputs.topk_weights = w;
        inputs.topk_ids = i;
    }
    let m_hidden = match inputs.hidden_states.desc.shape.as_slice() {
        [m, _] => Some((*m, "hidden_states.shape[0]")),
        _ => None,
    };
    let router = RouterProblem::new(
        &g.desc,
        bias.as_ref().map(|b| &b.desc),
        &inputs.topk_weights.desc,
        &inputs.topk_ids.desc,
        cfg,
        m_hidden,
    )
    .py_err(py)?;
    let problem = problem_of(&inputs)?;
    // As fused_experts: out may be hidden_states, no other input (the router's too).
    crate::problem::check_out_overlaps(
        &t_out.desc,
        &[
            ("gating_output", Some(&g.desc)),
            ("e_score_correction_bias", bias.as_ref().map(|b| &b.desc)),
        ],
    )
    .py_err(py)?;
    if router.experts != problem.global_experts {
        return Err(to_pyerr(
            py,
            Error::Shape(format!(
                "gating_output: expected shape [M, {}] (the global expert count), got [{}, {}]",
                problem.global_experts, router.m, router.experts
            )),
        ));
    }
    match problem.device {
        crate::problem::Device::Cpu => {
            oracle::plan_for_launch(&problem, None, forced).py_err(py)?;
            let p = problem.clone();
            // SAFETY: every address comes from a validated DLPack import alive until return.
            py.detach(move || unsafe {
                crate::routing::select_experts_cpu(&router);
                crate::cpu::fused_experts(&p)
            })
            .py_err(py)
        }
        _ => {
            let mut plan = cuda_plan(py, &problem, forced)?;
            oracle::place_router(
                &mut plan,
                problem.m,
                router.experts,
                &router.cfg,
                oracle::RouterRequest::from_env().py_err(py)?,
            );
            log_note(py, plan.log.take());
            let layout = WorkspaceLayout::for_problem(&problem);
            let (need, sizing) = if in_workspace {
                let tail = layout.routing_tail(problem.m, problem.topk);
                (tail.total, "swapmoe.fused_moe_workspace_bytes(hidden_states, w1, topk, quant): the experts' sections, then the router's outputs")
            } else {
                (
                    layout.total,
                    "swapmoe.workspace_bytes(hidden_states, w1, topk_ids, quant)",
                )
            };
            // (the router's outputs, when they live in the workspace, are not other arguments)
            let mut named: Vec<_> = inputs
                .named()
                .into_iter()
                .filter(|(name, _)| !(in_workspace && name.starts_with("topk_")))
                .collect();
            named.push(("out", &t_out.desc));
            named.push(("gating_output", &g.desc));
            if let Some(b) = &bias {
                named.push(("e_score_correction_bias", &b.desc));
            }
            let (ws_addr, mut ws_bytes) =
                workspace_buffer(ws.as_ref(), &problem, need, sizing, &named).py_err(py)?;
            if in_workspace {
                ws_bytes = ws_bytes.min(layout.total); // the experts stop at the router's outputs
            }
            // without the GIL, as fused_experts' launches
            py.detach(|| {
                cuda::launch::fused_moe(&router, &problem, &plan, ws_addr, ws_bytes, stream)
            })
            .py_err(py)
        }
    }
}

/// Bytes of CUDA workspace `fused_experts` needs for M tokens (M*topk slots); `quant`:
/// None, "fp8_tensor", "fp8_channel" or "fp8_block128". `routing=True`: fused_moe's
/// workspace when it also holds the router's outputs (the call gets no topk_weights /
/// topk_ids tensors).
#[pyfunction]
#[pyo3(signature = (m, topk, n, k, num_experts, elem_size, quant=None, routing=false))]
#[allow(clippy::too_many_arguments)]
fn workspace_bytes(
    py: Python<'_>,
    m: usize,
    topk: usize,
    n: usize,
    k: usize,
    num_experts: usize,
    elem_size: usize,
    quant: Option<&str>,
    routing: bool,
) -> PyResult<usize> {
    let q = parse_quant(quant).py_err(py)?;
    let layout = WorkspaceLayout::with_quant(m, topk, num_experts, n, k, elem_size, q);
    let total = match routing {
        true => layout.routing_tail(m, topk).total,
        false => layout.total,
    };
    if total == usize::MAX {
        return Err(to_pyerr(
            py,
            WorkspaceLayout::overflow_error(m, topk, n, k, num_experts),
        ));
    }
    Ok(total)
}

fn parse_quant(quant: Option<&str>) -> crate::error::Result<Option<QuantScheme>> {
    match quant {
        None => Ok(None),
        Some(s) => QuantScheme::parse(s).map(Some).ok_or_else(|| {
            Error::Argument(format!(
                "quant: expected None, 'fp8_tensor', 'fp8_channel' or 'fp8_block128', got {s:?}"
            ))
        }),
    }
}

/// The plan the oracle makes for a call, as a dict (for `swapmoe explain` and tests).
///
/// With `fused_moe`, the plan also places the router; `scoring` and `num_expert_group`
/// describe the routing (they pick the router kernel).
#[pyfunction]
#[pyo3(signature = (hidden_states, w1, w2, topk_weights, topk_ids, *, activation="silu", expert_map=None, fused_moe=false, scoring="softmax", num_expert_group=None))]
#[allow(clippy::too_many_arguments)]
fn describe_plan<'py>(
    py: Python<'py>,
    hidden_states: &Bound<'py, PyAny>,
    w1: &Bound<'py, PyAny>,
    w2: &Bound<'py, PyAny>,
    topk_weights: &Bound<'py, PyAny>,
    topk_ids: &Bound<'py, PyAny>,
    activation: &str,
    expert_map: Option<&Bound<'py, PyAny>>,
    fused_moe: bool,
    scoring: &str,
    num_expert_group: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let activation = Activation::parse(activation).py_err(py)?;
    let inputs = MoeInputs::import(hidden_states, w1, w2, topk_weights, topk_ids, expert_map)?;
    // The plan does not depend on the output tensor: a compact, writable one of
    // hidden_states' shape stands in for it (never written: nothing runs), placed past every
    // input so that the op's overlap check cannot blame it (at hidden_states' address it
    // overlapped the inputs after a broadcast hidden_states, whose own span is smaller).
    let h = &inputs.hidden_states.desc;
    let past_inputs = inputs
        .named()
        .iter()
        .filter_map(|(_, t)| t.byte_span().map(|(_, end)| end))
        .max()
        .unwrap_or(h.addr);
    let stand_in = past_inputs
        .checked_next_multiple_of(256)
        .unwrap_or(past_inputs);
    let out = crate::problem::TensorDesc::contiguous(h.dtype, &h.shape, h.device, stand_in);
    let problem = inputs.problem(&out, activation, false, -1).py_err(py)?;
    let caps = match problem.device {
        crate::problem::Device::Cuda(i) => Some(cuda::device(i).py_err(py)?.caps.clone()),
        _ => None,
    };
    let forced = oracle::forced_backend(None).py_err(py)?;
    let mut plan = oracle::plan_with(&problem, caps.as_ref(), forced).py_err(py)?;
    if fused_moe {
        let request = oracle::RouterRequest::from_env().py_err(py)?;
        let cfg = crate::routing::RouterConfig {
            topk: problem.topk,
            renormalize: true,
            scoring: crate::routing::Scoring::parse(scoring).py_err(py)?,
            // Only the group count picks the router kernel; topk_group does not.
            groups: num_expert_group.map(|g| (g, g)),
            routed_scaling_factor: 1.0,
        };
        oracle::place_router(&mut plan, problem.m, problem.global_experts, &cfg, request);
    }
    log_note(py, plan.log.take());
    let mut kernels: Vec<String> = plan.kernels.iter().map(|k| k.symbol()).collect();
    if let oracle::RouterPlacement::Separate(id) = plan.router {
        kernels.insert(0, id.symbol());
    }
    let d = PyDict::new(py);
    d.set_item("problem", problem.to_string())?;
    d.set_item("backend", plan.backend.name())?;
    d.set_item("source", plan.source.name())?;
    d.set_item("table", plan.table.as_ref().map(|t| t.path.clone()))?;
    d.set_item("kernels", kernels)?;
    d.set_item("router", plan.router.name())?;
    d.set_item("rows_per_cta", plan.rows_per_cta)?;
    d.set_item("tokens_per_pass", plan.tokens_per_pass)?;
    d.set_item("splits", plan.splits)?;
    d.set_item("swap_gemm1_ring", plan.swap_gemm1_ring)?;
    d.set_item("swap_gemm2_ring", plan.swap_gemm2_ring)?;
    d.set_item("swap_gemm2_one_per_sm", plan.swap_gemm2_one_per_sm)?;
    d.set_item("swap_gemm2_pdl", plan.swap_gemm2_pdl)?;
    d.set_item("wgmma_gemm1_pdl", plan.wgmma_gemm1_pdl)?;
    d.set_item("align_ctas", plan.align_ctas)?;
    d.set_item("align_in_gemm1", plan.align_in_gemm1)?;
    d.set_item("pdl", plan.pdl)?;
    d.set_item("first_kernel_pdl", plan.first_kernel_pdl)?;
    d.set_item("ctas", plan.ctas)?;
    d.set_item("wgmma_persistent", plan.wgmma_persistent)?;
    d.set_item("wgmma_l2_hints", plan.wgmma_l2_hints)?;
    d.set_item("wgmma_gemm2_block_run", plan.wgmma_gemm2_block_run)?;
    d.set_item("reasons", plan.reasons.into_vec())?;
    d.set_item(
        "workspace_bytes",
        WorkspaceLayout::for_problem(&problem).total,
    )?;
    Ok(d)
}

/// Sends a plan's one-time note to the `swapmoe` logger (warning or info).
fn log_note(py: Python<'_>, note: Option<oracle::LogNote>) {
    let Some(note) = note else { return };
    let level = if note.warning { "warning" } else { "info" };
    let sent = py
        .import("logging")
        .and_then(|m| m.call_method1("getLogger", ("swapmoe",)))
        .and_then(|l| l.call_method1(level, ("%s", note.message.as_str())));
    if sent.is_err() {
        eprintln!("swapmoe: {}", note.message);
    }
}

fn parse_float_dtype(dtype: &str) -> crate::error::Result<DType> {
    match dtype {
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "fp16" | "float16" => Ok(DType::F16),
        "fp32" | "float32" => Ok(DType::F32),
        other => Err(Error::DType(format!(
            "dtype: expected 'bf16', 'fp16' or 'fp32', got {other:?}"
        ))),
    }
}

/// The oracle's plan for a shape, without tensors: the device is the one named (known
/// names fill in the capability), else the given capability, else CUDA device 0. Tables
/// may pick the backends named in `external_backends` (e.g. `["vllm_triton"]`).
#[pyfunction]
#[pyo3(signature = (num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype="bf16", device_capability=None, device_name=None, sm_count=None, backend=None, quant=None, external_backends=None, activation_scales=None, global_num_experts=-1))]
#[pyo3(
    text_signature = "(num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype='bf16', device_capability=None, device_name=None, sm_count=None, backend=None, quant=None, external_backends=None, activation_scales=None, global_num_experts=-1)"
)]
#[allow(clippy::too_many_arguments)]
fn select_backend<'py>(
    py: Python<'py>,
    num_tokens: i64,
    num_experts: i64,
    top_k: i64,
    hidden_size: i64,
    intermediate_size: i64,
    dtype: &str,
    device_capability: Option<(i32, i32)>,
    device_name: Option<&str>,
    sm_count: Option<i32>,
    backend: Option<&str>,
    quant: Option<&str>,
    external_backends: Option<Vec<String>>,
    activation_scales: Option<&str>,
    global_num_experts: i64,
) -> PyResult<Bound<'py, PyDict>> {
    let dtype = parse_float_dtype(dtype).py_err(py)?;
    let quant = parse_quant(quant).py_err(py)?;
    let scales = activation_scales
        .map(|s| crate::tables::ActivationScales::parse(s, "activation_scales"))
        .transpose()
        .py_err(py)?;
    let external =
        ExternalBackend::parse_list(external_backends.as_deref().unwrap_or_default()).py_err(py)?;
    let forced = oracle::forced_choice(backend).py_err(py)?;
    let tile = oracle::forced_mma_tile().py_err(py)?;
    let caps = if device_name.is_some() || device_capability.is_some() {
        oracle::offline_caps(device_name, device_capability, sm_count).py_err(py)?
    } else {
        cuda::device(0)
            .map(|d| d.caps.clone())
            .map_err(|e| {
                Error::Argument(format!(
                    "device_name: expected a device name or device_capability when no CUDA device can be asked ({e})"
                ))
            })
            .py_err(py)?
    };
    let tables = crate::tables::global();
    let req = oracle::Request {
        backend: match forced {
            Some(oracle::Forced::Swapmoe(b)) => Some(b),
            _ => None,
        },
        forced_external: match forced {
            Some(oracle::Forced::External(x)) => Some(x),
            _ => None,
        },
        mma_token_tile: tile,
        quant: None,
        external: &external,
        tables: Some(&tables),
        first_kernel_pdl: oracle::forced_first_kernel_pdl().py_err(py)?,
        quiet: false,
    };
    let mut plan = oracle::plan_for_shape(
        num_tokens,
        num_experts,
        global_num_experts,
        top_k,
        hidden_size,
        intermediate_size,
        dtype,
        quant,
        scales,
        &caps,
        &req,
    )
    .py_err(py)?;
    log_note(py, plan.log.take());
    let d = PyDict::new(py);
    match plan.external {
        Some(x) => {
            d.set_item("backend", x.name())?;
            d.set_item("swap_ab", false)?;
            d.set_item("fallback", plan.backend.name())?;
        }
        None => {
            d.set_item("backend", plan.backend.name())?;
            d.set_item(
                "swap_ab",
                matches!(
                    plan.backend,
                    oracle::Backend::CudaDecode
                        | oracle::Backend::CudaMma
                        | oracle::Backend::CudaBulkDecode
                        | oracle::Backend::CudaWgmmaSwap
                ),
            )?;
            d.set_item("fallback", py.None())?;
        }
    }
    let tile = PyDict::new(py);
    tile.set_item(
        "kernels",
        plan.kernels.iter().map(|k| k.symbol()).collect::<Vec<_>>(),
    )?;
    tile.set_item("rows_per_cta", plan.rows_per_cta)?;
    tile.set_item("tokens_per_pass", plan.tokens_per_pass)?;
    tile.set_item("ctas", plan.ctas)?;
    tile.set_item("wgmma_persistent", plan.wgmma_persistent)?;
    tile.set_item("wgmma_l2_hints", plan.wgmma_l2_hints)?;
    tile.set_item("wgmma_gemm2_block_run", plan.wgmma_gemm2_block_run)?;
    tile.set_item("gemm1_vec", plan.gemm1_vec)?;
    tile.set_item("gemm2_vec", plan.gemm2_vec)?;
    tile.set_item("pdl", plan.pdl)?;
    tile.set_item("first_kernel_pdl", plan.first_kernel_pdl)?;
    tile.set_item("splits", plan.splits)?;
    tile.set_item("swap_gemm1_ring", plan.swap_gemm1_ring)?;
    tile.set_item("swap_gemm2_ring", plan.swap_gemm2_ring)?;
    tile.set_item("swap_gemm2_one_per_sm", plan.swap_gemm2_one_per_sm)?;
    tile.set_item("swap_gemm2_pdl", plan.swap_gemm2_pdl)?;
    tile.set_item("wgmma_gemm1_pdl", plan.wgmma_gemm1_pdl)?;
    tile.set_item("align_ctas", plan.align_ctas)?;
    tile.set_item("align_in_gemm1", plan.align_in_gemm1)?;
    d.set_item("tile", tile)?;
    d.set_item("source", plan.source.name())?;
    d.set_item("reasons", plan.reasons.into_vec())?;
    d.set_item("device_name", caps.name)?;
    d.set_item("device_capability", caps.capability)?;
    d.set_item("table", plan.table.as_ref().map(|t| t.path.clone()))?;
    d.set_item("table_m", plan.table.as_ref().map(|t| t.m))?;
    d.set_item("table_used", plan.table.as_ref().is_some_and(|t| t.used))?;
    Ok(d)
}

/// The file name of the tuned table for a shape on a device: vLLM's naming, (E, N), or with
/// `hidden_size` the name of a table for that K alone (read ahead of the (E, N) one).
#[pyfunction]
#[pyo3(signature = (num_experts, intermediate_size, device_name, dtype="bf16", quant=None, hidden_size=None))]
fn table_file_name(
    py: Python<'_>,
    num_experts: usize,
    intermediate_size: usize,
    device_name: &str,
    dtype: &str,
    quant: Option<&str>,
    hidden_size: Option<usize>,
) -> PyResult<String> {
    let dtype = parse_float_dtype(dtype).py_err(py)?;
    let quant = Quant::parse(quant).py_err(py)?;
    Ok(match hidden_size {
        Some(k) => crate::tables::file_name_for_hidden(
            num_experts,
            intermediate_size,
            k,
            device_name,
            dtype,
            quant,
        ),
        None => crate::tables::file_name(num_experts, intermediate_size, device_name, dtype, quant),
    })
}

/// Parses a table file as the oracle does: {"file", "metadata": {E, N, K, topk,
/// device_name}, "entries": {M: {"backend", "token_tile", "time_us", "times_us"}}}.
/// A malformed file raises ArgumentError with the reason.
#[pyfunction]
fn read_table<'py>(py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
    let t = crate::tables::Table::read(std::path::Path::new(path), crate::tables::Origin::User)
        .map_err(|e| to_pyerr(py, Error::Argument(format!("table {path}: {e}"))))?;
    let d = PyDict::new(py);
    d.set_item("file", &t.file)?;
    let meta = PyDict::new(py);
    meta.set_item("E", t.meta.e)?;
    meta.set_item("N", t.meta.n)?;
    meta.set_item("K", t.meta.k)?;
    meta.set_item("topk", t.meta.topk)?;
    meta.set_item("device_name", t.meta.device_name.clone())?;
    meta.set_item(
        "activation_scales",
        t.meta.activation_scales.map(|a| a.name()),
    )?;
    d.set_item("metadata", meta)?;
    let entries = PyDict::new(py);
    for e in &t.entries {
        let x = PyDict::new(py);
        match &e.choice {
            crate::tables::Choice::Swapmoe {
                backend,
                token_tile,
                swap,
            } => {
                x.set_item("backend", backend.name())?;
                x.set_item("token_tile", *token_tile)?;
                if let Some(v) = swap {
                    x.set_item("swap_gemm1_ring", v.gemm1_ring)?;
                    x.set_item("swap_gemm2_pdl", v.gemm2_pdl)?;
                    if let Some(r) = v.gemm2_ring {
                        x.set_item("swap_gemm2_ring", r)?;
                    }
                }
            }
            other => {
                x.set_item("backend", other.label())?;
                x.set_item("token_tile", py.None())?;
            }
        }
        x.set_item("time_us", e.time_us)?;
        let times = PyDict::new(py);
        for (c, us) in &e.times_us {
            times.set_item(c.label(), *us)?;
        }
        x.set_item("times_us", times)?;
        entries.set_item(e.m, x)?;
    }
    d.set_item("entries", entries)?;
    Ok(d)
}

/// The tables the oracle sees now: {"shipped_dir", "user_dir", "dir_errors",
/// "files": [{"file", "path", "origin", "ok", "error", "entries"}]}.
#[pyfunction]
fn tables_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let set = crate::tables::global();
    let d = PyDict::new(py);
    let show = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    d.set_item("shipped_dir", show(&set.shipped_dir))?;
    d.set_item("user_dir", show(&set.user_dir))?;
    d.set_item("dir_errors", set.dir_errors.clone())?;
    let files = pyo3::types::PyList::empty(py);
    for (name, loaded) in set.files() {
        let f = PyDict::new(py);
        f.set_item("file", name)?;
        f.set_item("path", loaded.path().display().to_string())?;
        f.set_item("origin", loaded.origin().name())?;
        match loaded {
            crate::tables::Loaded::Ok(t) => {
                f.set_item("ok", true)?;
                f.set_item("error", py.None())?;
                f.set_item("entries", t.entries.len())?;
            }
            crate::tables::Loaded::Bad { error, .. } => {
                f.set_item("ok", false)?;
                f.set_item("error", error)?;
                f.set_item("entries", 0)?;
            }
        }
        files.append(f)?;
    }
    d.set_item("files", files)?;
    Ok(d)
}

/// Sets the folder of the tables shipped with the package (called by `swapmoe/__init__.py`).
#[pyfunction]
#[pyo3(name = "_set_shipped_tables_dir", signature = (path))]
fn set_shipped_tables_dir(path: Option<&str>) {
    crate::tables::set_shipped_dir(path.map(std::path::PathBuf::from));
}

/// What this build of the extension holds.
#[pyfunction]
fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("version", env!("CARGO_PKG_VERSION"))?;
    d.set_item("nvcc_version", cuda::images::NVCC_VERSION)?;
    d.set_item("targets", cuda::images::TARGETS.to_vec())?;
    d.set_item(
        "modules",
        cuda::images::FATBINS
            .iter()
            .map(|(n, img)| (n.to_string(), img.len()))
            .collect::<Vec<_>>(),
    )?;
    d.set_item(
        "kernels",
        oracle::KernelId::all()
            .iter()
            .map(|k| k.symbol())
            .collect::<Vec<_>>(),
    )?;
    // A profiling build (SWAPMOE_CUDA_STAMPS=1): the swap kernels record per-CTA timestamps.
    d.set_item("cuda_stamps", env!("SWAPMOE_CUDA_STAMPS_BUILD") == "1")?;
    // A probe build (SWAPMOE_CUDA_PROBE=no_mma): the swap kernels skip their math on purpose.
    d.set_item("cuda_probe", crate::cuda::probe_build())?;
    d.set_item(
        "profile",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    )?;
    Ok(d)
}

/// The CUDA driver version (e.g. 13000). Raises CudaError when no driver is present.
#[pyfunction]
fn driver_version(py: Python<'_>) -> PyResult<i32> {
    cuda::driver_version().py_err(py)
}

/// Name, compute capability and SM count of CUDA device `ordinal`.
#[pyfunction]
fn device_info(py: Python<'_>, ordinal: i32) -> PyResult<Bound<'_, PyDict>> {
    let dev = cuda::device_for(ordinal, "ordinal").py_err(py)?;
    let d = PyDict::new(py);
    d.set_item("ordinal", dev.ordinal)?;
    d.set_item("name", &dev.caps.name)?;
    d.set_item("capability", dev.caps.capability)?;
    d.set_item("sm_count", dev.caps.sm_count)?;
    Ok(d)
}

/// Loads the modules and resolves every kernel on device `ordinal` (do this before
/// CUDA-graph capture). Returns the number of kernels resolved.
#[pyfunction]
fn warmup(py: Python<'_>, ordinal: i32) -> PyResult<usize> {
    cuda::device_for(ordinal, "device")
        .and_then(|d| d.warmup())
        .py_err(py)
}

/// (device address, bytes) of the `__device__` variable `symbol` in the embedded kernel
/// module `module` on device `ordinal`. For profiling builds (`SWAPMOE_CUDA_STAMPS=1`):
/// benches/stamps.py reads the swap kernels' stamp buffer through it.
#[pyfunction]
fn _module_global(
    py: Python<'_>,
    ordinal: i32,
    module: &str,
    symbol: &str,
) -> PyResult<(u64, usize)> {
    cuda::device_for(ordinal, "ordinal")
        .and_then(|d| d.module_global(module, symbol))
        .py_err(py)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fused_experts, m)?)?;
    m.add_function(wrap_pyfunction!(workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(select_experts, m)?)?;
    m.add_function(wrap_pyfunction!(fused_moe, m)?)?;
    m.add_function(wrap_pyfunction!(select_backend, m)?)?;
    m.add_function(wrap_pyfunction!(describe_plan, m)?)?;
    m.add_function(wrap_pyfunction!(table_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(read_table, m)?)?;
    m.add_function(wrap_pyfunction!(tables_info, m)?)?;
    m.add_function(wrap_pyfunction!(set_shipped_tables_dir, m)?)?;
    m.add_function(wrap_pyfunction!(build_info, m)?)?;
    m.add_function(wrap_pyfunction!(driver_version, m)?)?;
    m.add_function(wrap_pyfunction!(device_info, m)?)?;
    m.add_function(wrap_pyfunction!(warmup, m)?)?;
    m.add_function(wrap_pyfunction!(_module_global, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::FakeAddresses;

    /// A CUDA problem on fake addresses (M = 3, topk = 2, E = 4, N = 32, K = 64) and its
    /// tensors, named.
    fn problem(addrs: &FakeAddresses) -> (MoeProblem, Vec<(&'static str, TensorDesc)>) {
        let dev = Device::Cuda(0);
        let t = |d, shape: &[i64]| addrs.tensor(d, shape, dev);
        let named = vec![
            ("hidden_states", t(DType::BF16, &[3, 64])),
            ("w1", t(DType::BF16, &[4, 64, 64])),
            ("w2", t(DType::BF16, &[4, 64, 32])),
            ("topk_weights", t(DType::F32, &[3, 2])),
            ("topk_ids", t(DType::I32, &[3, 2])),
            ("out", t(DType::BF16, &[3, 64])),
        ];
        let p = MoeProblem::new(&MoeArgs {
            hidden_states: &named[0].1,
            w1: &named[1].1,
            w2: &named[2].1,
            topk_weights: &named[3].1,
            topk_ids: &named[4].1,
            out: &named[5].1,
            expert_map: None,
            activation: Activation::Silu,
            apply_router_weight_on_input: false,
            global_num_experts: -1,
            quant: QuantArgs::default(),
        })
        .unwrap();
        (p, named)
    }

    #[test]
    fn a_callers_workspace_is_checked_before_any_launch() {
        let addrs = FakeAddresses::default();
        let (p, named) = problem(&addrs);
        let named: Vec<(&str, &TensorDesc)> = named.iter().map(|(n, t)| (*n, t)).collect();
        let need = WorkspaceLayout::for_problem(&p).total;
        let ws = |desc: TensorDesc| tensor::Imported::view(desc);
        let check = |w: Option<&tensor::Imported>| workspace_buffer(w, &p, need, "sizing", &named);
        let good = addrs.tensor(DType::Other(1, 8), &[need as i64], Device::Cuda(0));
        assert_eq!(check(Some(&ws(good.clone()))).unwrap(), (good.addr, need));
        let message = |w: TensorDesc| {
            let e = check(Some(&ws(w))).unwrap_err();
            format!("{}: {e}", e.class_name())
        };
        let mut small = good.clone();
        small.shape = vec![need as i64 - 1];
        assert!(message(small).starts_with(&format!(
            "ShapeError: workspace: expected at least {need} bytes (sizing), got {}",
            need - 1
        )));
        let mut read_only = good.clone();
        read_only.read_only = true;
        assert!(
            message(read_only).starts_with("ArgumentError: workspace: expected a writable buffer")
        );
        let mut misaligned = good.clone();
        misaligned.addr += 16;
        assert!(message(misaligned).contains("expected an address aligned to 256 bytes"));
        let mut strided = good.clone();
        strided.strides = vec![2];
        assert!(message(strided).starts_with("ShapeError: workspace: expected a contiguous buffer"));
        let mut host = good.clone();
        host.device = Device::Cpu;
        assert!(message(host).starts_with("DeviceError: workspace: expected device"));
        for (name, t) in &named {
            let mut over = good.clone();
            over.addr = t.addr / WS_ALIGN * WS_ALIGN; // starts at or just before the tensor
            let m = message(over);
            assert!(
                m.contains("overlaps no other argument")
                    && m.contains(&format!("against {name}'s")),
                "{m}"
            );
        }
        let m = check(None).unwrap_err().to_string();
        assert!(m.contains(&format!("expected a CUDA buffer of at least {need} bytes for CUDA tensors (sizing), got None")), "{m}");
        assert_eq!(
            workspace_buffer(None, &p, usize::MAX, "sizing", &named)
                .unwrap_err()
                .class_name(),
            "OutOfMemoryError"
        );
    }
}
