//! Routers: router logits [M, E] -> (topk_weights fp32 [M, topk], topk_ids int32 [M, topk]),
//! with vLLM's `fused_topk` and `grouped_topk` semantics.
//!
//! - scores = softmax(logits) or sigmoid(logits), in f32.
//! - Grouped (DeepSeek-V3): experts form `num_expert_group` equal groups. A group's score
//!   is the max of its scores, or with a correction bias the sum of its two best biased
//!   scores. The best `topk_group` groups stay; experts elsewhere cannot be picked.
//! - The `topk` best experts by score (biased score when a bias is given) are picked.
//!   Order: descending; ties go to the lowest expert index. NaN counts as larger than every
//!   number (as in torch.topk), so a NaN score is picked and its NaN weight reaches the
//!   output: never silently wrong.
//! - Weights are the unbiased scores of the picked experts, divided by their sum when
//!   `renormalize`, then multiplied by `routed_scaling_factor`.

use crate::error::{Error, Result};
use crate::problem::{DType, Device, TensorDesc};
use half::{bf16, f16};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    Softmax,
    Sigmoid,
}

impl Scoring {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "softmax" => Ok(Scoring::Softmax),
            "sigmoid" => Ok(Scoring::Sigmoid),
            other => Err(Error::Argument(format!(
                "scoring: expected 'softmax' or 'sigmoid', got {other:?}"
            ))),
        }
    }
    /// Code passed to kernels (cuda/route_topk.cu).
    pub fn code(&self) -> i32 {
        match self {
            Scoring::Softmax => 0,
            Scoring::Sigmoid => 1,
        }
    }
}

/// Largest expert count the GPU router holds (`kMaxExperts` in cuda/route_topk.cu).
pub const GPU_ROUTER_MAX_EXPERTS: usize = 1024;
/// Largest group count of the grouped router (one group per lane).
pub const MAX_EXPERT_GROUPS: usize = 32;
/// Largest topk of the GPU router (`kMaxTopk`).
pub const GPU_ROUTER_MAX_TOPK: usize = 32;

#[derive(Clone, Debug, PartialEq)]
pub struct RouterConfig {
    pub topk: usize,
    pub renormalize: bool,
    pub scoring: Scoring,
    /// (num_expert_group, topk_group)
    pub groups: Option<(usize, usize)>,
    pub routed_scaling_factor: f32,
}

/// A validated routing problem.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterProblem {
    pub m: usize,
    pub experts: usize,
    pub cfg: RouterConfig,
    pub logits_dtype: DType,
    pub logits_row_stride: i64,
    pub logits: usize,
    /// 0 when there is no correction bias.
    pub bias: usize,
    pub bias_dtype: DType,
    pub weights_out: usize,
    pub weights_row_stride: i64,
    pub ids_out: usize,
    pub ids_row_stride: i64,
    pub device: Device,
}

fn dims(shape: &[i64]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

fn float_input(name: &str, t: &TensorDesc) -> Result<()> {
    if !t.dtype.is_float() {
        return Err(Error::DType(format!(
            "{name}: expected float32, bfloat16 or float16, got {}",
            t.dtype.name()
        )));
    }
    Ok(())
}

/// Non-negative strides (the router indexes rows as `t * stride`) and a contiguous last
/// dimension.
fn last_contiguous(name: &str, t: &TensorDesc) -> Result<()> {
    if let Some((axis, s)) = t.strides.iter().enumerate().find(|(_, s)| **s < 0) {
        return Err(Error::Shape(format!(
            "{name}: expected non-negative strides, got stride {s} on dimension {axis}"
        )));
    }
    let last = t.shape.len() - 1;
    if !t.shape.iter().any(|&d| d <= 0) && t.shape[last] > 1 && t.strides[last] != 1 {
        return Err(Error::Shape(format!(
            "{name}: expected the last dimension to be contiguous (stride 1), got strides {}",
            dims(&t.strides)
        )));
    }
    Ok(())
}

fn same_device(name: &str, t: &TensorDesc, device: Device) -> Result<()> {
    if t.device != device {
        return Err(Error::Device(format!(
            "{name}: expected device {device} (the device of gating_output), got {}",
            t.device
        )));
    }
    Ok(())
}

impl RouterProblem {
    /// `m_expected`: the rows gating_output must have and where that number comes from
    /// (`hidden_states.shape[0]` for fused_moe, `num_tokens` for select_experts).
    pub fn new(
        gating_output: &TensorDesc,
        bias: Option<&TensorDesc>,
        weights_out: &TensorDesc,
        ids_out: &TensorDesc,
        cfg: RouterConfig,
        m_expected: Option<(i64, &str)>,
    ) -> Result<Self> {
        let g = gating_output;
        if g.shape.len() != 2 {
            return Err(Error::Shape(format!(
                "gating_output: expected a 2-D tensor [M, E], got shape {}",
                dims(&g.shape)
            )));
        }
        float_input("gating_output", g)?;
        last_contiguous("gating_output", g)?;
        let device = g.device;
        if !matches!(device, Device::Cpu | Device::Cuda(_)) {
            return Err(Error::Device(format!(
                "gating_output: expected a CPU or CUDA tensor, got device {device}"
            )));
        }
        let (m, e) = (g.shape[0], g.shape[1]);
        if let Some((mh, source)) = m_expected {
            if m != mh {
                return Err(Error::Shape(format!(
                    "gating_output: expected shape [M, E] with M = {mh} ({source}), got {}",
                    dims(&g.shape)
                )));
            }
        }
        if e < 1 {
            return Err(Error::Shape(format!(
                "gating_output: expected at least one expert, got shape {}",
                dims(&g.shape)
            )));
        }
        let e = e as usize;
        let k = cfg.topk;
        if k < 1 || k > e {
            return Err(Error::Argument(format!(
                "topk: expected 1 <= topk <= E = {e} (gating_output.shape[1]), got {k}"
            )));
        }
        if let Some((ng, tg)) = cfg.groups {
            if !(1..=MAX_EXPERT_GROUPS).contains(&ng) || e % ng != 0 {
                return Err(Error::Argument(format!(
                    "num_expert_group: expected a divisor of E = {e} between 1 and {MAX_EXPERT_GROUPS}, got {ng}"
                )));
            }
            if tg < 1 || tg > ng {
                return Err(Error::Argument(format!(
                    "topk_group: expected 1 <= topk_group <= num_expert_group = {ng}, got {tg}"
                )));
            }
            let reachable = tg * (e / ng);
            if k > reachable {
                return Err(Error::Argument(format!(
                    "topk: expected at most topk_group * E / num_expert_group = {reachable} experts reachable, got {k}"
                )));
            }
            if bias.is_some() && e / ng < 2 {
                return Err(Error::Argument(format!(
                    "num_expert_group: a correction bias scores groups by their two best experts, so groups need >= 2 experts, got {} per group",
                    e / ng
                )));
            }
        }
        if !cfg.routed_scaling_factor.is_finite() {
            return Err(Error::Argument(format!(
                "routed_scaling_factor: expected a finite number, got {}",
                cfg.routed_scaling_factor
            )));
        }
        let (bias_addr, bias_dtype) = match bias {
            Some(b) => {
                float_input("e_score_correction_bias", b)?;
                if b.shape != [e as i64] {
                    return Err(Error::Shape(format!(
                        "e_score_correction_bias: expected shape [{e}] (gating_output.shape[1]), got {}",
                        dims(&b.shape)
                    )));
                }
                last_contiguous("e_score_correction_bias", b)?;
                same_device("e_score_correction_bias", b, device)?;
                (b.addr, b.dtype)
            }
            None => (0, DType::F32),
        };
        let check_out = |name: &str, t: &TensorDesc, dtype: DType| -> Result<()> {
            if t.dtype != dtype {
                return Err(Error::DType(format!(
                    "{name}: expected {}, got {}",
                    dtype.name(),
                    t.dtype.name()
                )));
            }
            if t.shape != [m, k as i64] {
                return Err(Error::Shape(format!(
                    "{name}: expected shape [{m}, {k}], got {}",
                    dims(&t.shape)
                )));
            }
            last_contiguous(name, t)?;
            same_device(name, t, device)
        };
        check_out("topk_weights", weights_out, DType::F32)?;
        check_out("topk_ids", ids_out, DType::I32)?;
        if matches!(device, Device::Cuda(_)) {
            if e > GPU_ROUTER_MAX_EXPERTS {
                return Err(Error::Shape(format!(
                    "gating_output: expected at most {GPU_ROUTER_MAX_EXPERTS} experts on CUDA, got {e}"
                )));
            }
            if k > GPU_ROUTER_MAX_TOPK {
                return Err(Error::Argument(format!(
                    "topk: expected at most {GPU_ROUTER_MAX_TOPK} on CUDA, got {k}"
                )));
            }
            if m > i32::MAX as i64 {
                return Err(Error::Shape(format!(
                    "gating_output: expected M below 2^31, got {m}"
                )));
            }
        }
        Ok(RouterProblem {
            m: m as usize,
            experts: e,
            cfg,
            logits_dtype: g.dtype,
            logits_row_stride: g.strides[0],
            logits: g.addr,
            bias: bias_addr,
            bias_dtype,
            weights_out: weights_out.addr,
            weights_row_stride: weights_out.strides[0],
            ids_out: ids_out.addr,
            ids_row_stride: ids_out.strides[0],
            device,
        })
    }
}

/// `a` ranks before `b` (torch.topk order: NaN first, then descending; equal -> caller
/// keeps the lower index).
pub fn ranks_before(a: f32, b: f32) -> bool {
    (a.is_nan() && !b.is_nan()) || a > b
}

/// Routes one token: `logits` [E] -> (weights, ids), both of length topk.
pub fn route_row(logits: &[f32], bias: Option<&[f32]>, cfg: &RouterConfig) -> (Vec<f32>, Vec<i32>) {
    let e = logits.len();
    let scores: Vec<f32> = match cfg.scoring {
        Scoring::Softmax => {
            let mx = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let ex: Vec<f32> = logits.iter().map(|&x| (x - mx).exp()).collect();
            let sum: f32 = ex.iter().sum();
            if logits.iter().any(|x| x.is_nan()) {
                vec![f32::NAN; e]
            } else {
                ex.iter().map(|v| v / sum).collect()
            }
        }
        Scoring::Sigmoid => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
    };
    let select: Vec<f32> = match bias {
        Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
        None => scores.clone(),
    };
    let mut allowed = vec![true; e];
    if let Some((ng, tg)) = cfg.groups {
        let gs = e / ng;
        let group_score: Vec<f32> = (0..ng)
            .map(|g| {
                let vals = &select[g * gs..(g + 1) * gs];
                if bias.is_some() {
                    let (i1, v1) = best(vals, &vec![true; gs]);
                    let mut rest = vec![true; gs];
                    rest[i1] = false;
                    let (_, v2) = best(vals, &rest);
                    v1 + v2
                } else {
                    best(vals, &vec![true; gs]).1
                }
            })
            .collect();
        let mut group_ok = vec![false; ng];
        let mut open = vec![true; ng];
        for _ in 0..tg {
            let (gi, _) = best(&group_score, &open);
            open[gi] = false;
            group_ok[gi] = true;
        }
        for (i, a) in allowed.iter_mut().enumerate() {
            *a = group_ok[i / gs];
        }
    }
    let mut weights = Vec::with_capacity(cfg.topk);
    let mut ids = Vec::with_capacity(cfg.topk);
    for _ in 0..cfg.topk {
        let (i, _) = best(&select, &allowed);
        allowed[i] = false;
        ids.push(i as i32);
        weights.push(scores[i]);
    }
    if cfg.renormalize {
        let sum: f32 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= sum);
    }
    if cfg.routed_scaling_factor != 1.0 {
        weights
            .iter_mut()
            .for_each(|w| *w *= cfg.routed_scaling_factor);
    }
    (weights, ids)
}

/// Index and value of the best allowed entry (NaN first, then largest, lowest index on ties).
fn best(vals: &[f32], allowed: &[bool]) -> (usize, f32) {
    let mut bi = usize::MAX;
    let mut bv = f32::NEG_INFINITY;
    for (i, (&v, &ok)) in vals.iter().zip(allowed).enumerate() {
        if ok && (bi == usize::MAX || ranks_before(v, bv)) {
            bi = i;
            bv = v;
        }
    }
    (bi, bv)
}

unsafe fn read_f32(base: usize, dtype: DType, idx: usize) -> f32 {
    match dtype {
        DType::BF16 => (*(base as *const bf16).add(idx)).to_f32(),
        DType::F16 => (*(base as *const f16).add(idx)).to_f32(),
        _ => *(base as *const f32).add(idx),
    }
}

/// Routes every token on the CPU, writing the two outputs.
///
/// # Safety
/// `p` must describe live CPU tensors.
pub unsafe fn select_experts_cpu(p: &RouterProblem) {
    let e = p.experts;
    let bias: Option<Vec<f32>> =
        (p.bias != 0).then(|| (0..e).map(|i| read_f32(p.bias, p.bias_dtype, i)).collect());
    for t in 0..p.m {
        let row: Vec<f32> = (0..e)
            .map(|i| {
                read_f32(
                    p.logits,
                    p.logits_dtype,
                    t * p.logits_row_stride as usize + i,
                )
            })
            .collect();
        let (w, ids) = route_row(&row, bias.as_deref(), &p.cfg);
        let wdst = (p.weights_out as *mut f32).add(t * p.weights_row_stride as usize);
        let idst = (p.ids_out as *mut i32).add(t * p.ids_row_stride as usize);
        for j in 0..p.cfg.topk {
            *wdst.add(j) = w[j];
            *idst.add(j) = ids[j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(topk: usize) -> RouterConfig {
        RouterConfig {
            topk,
            renormalize: false,
            scoring: Scoring::Softmax,
            groups: None,
            routed_scaling_factor: 1.0,
        }
    }

    #[test]
    fn softmax_topk_and_renormalize() {
        let (w, ids) = route_row(&[0.0, 2.0, 1.0, 2.0], None, &cfg(2));
        assert_eq!(ids, vec![1, 3]); // tie: lower index first
        let e2 = 2f32.exp();
        let total = 1.0 + 2.0 * e2 + 1f32.exp();
        assert!((w[0] - e2 / total).abs() < 1e-6);
        let mut c = cfg(2);
        c.renormalize = true;
        let (w, _) = route_row(&[0.0, 2.0, 1.0, 2.0], None, &c);
        assert!((w[0] - 0.5).abs() < 1e-6 && (w[1] - 0.5).abs() < 1e-6);
    }

    #[test]
    fn all_equal_picks_lowest_indices() {
        let (_, ids) = route_row(&[1.0; 8], None, &cfg(3));
        assert_eq!(ids, vec![0, 1, 2]);
    }

    #[test]
    fn grouped_with_bias_stays_in_chosen_groups() {
        // 4 groups of 2; bias lifts group 3; topk_group 1.
        let logits = [3.0, 2.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1];
        let bias = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 5.0];
        let c = RouterConfig {
            topk: 2,
            renormalize: false,
            scoring: Scoring::Sigmoid,
            groups: Some((4, 1)),
            routed_scaling_factor: 2.5,
        };
        let (w, ids) = route_row(&logits, Some(&bias), &c);
        assert_eq!(ids, vec![7, 6]);
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        assert!((w[0] - 2.5 * sig(0.1)).abs() < 1e-6); // unbiased score, scaled
    }

    #[test]
    fn nan_is_picked_first_and_poisons_weights() {
        let mut c = cfg(1);
        c.scoring = Scoring::Sigmoid;
        let (w, ids) = route_row(&[0.5, f32::NAN, 2.0], None, &c);
        assert_eq!(ids, vec![1]);
        assert!(w[0].is_nan());
    }
}
