//! CPU path (rayon, half): the reference implementation and the fallback for CPU tensors.
//!
//! Arithmetic is f32 with the same semantics as the GPU path: for each (token, k) slot
//! with a local expert e,
//!   h = act(x . w1[e, :N]^T) * (x . w1[e, N:]^T)            (kept in f32)
//!   out[t] += router_weight[t, k] * (h . w2[e]^T)           (summed in k order)
//! With apply_router_weight_on_input the weight scales x instead (topk == 1).

pub mod fp8;

use crate::error::{Error, Result};
use crate::problem::{DType, MoeProblem};
use half::{bf16, f16};
use rayon::prelude::*;

/// An element type the CPU path computes on.
pub trait Element: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}
impl Element for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl Element for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}
impl Element for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// A zeroed float32 buffer of `dims`' product of elements, allocated fallibly: where the
/// product overflows or the allocation fails, `OutOfMemoryError` naming `what` and its size
/// (an infallible `vec!` would abort the interpreter).
pub(crate) fn zeroed_f32(what: &str, dims: &[usize]) -> Result<Vec<f32>> {
    let too_big =
        || {
            let bytes = dims.iter().fold(4u128, |a, &d| a.saturating_mul(d as u128));
            Error::Memory(format!(
            "the CPU path needs {what}: {} float32 values, {:.1} GiB, which could not be allocated",
            dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(" x "),
            bytes as f64 / (1u64 << 30) as f64
        ))
        };
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
        .ok_or_else(too_big)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| too_big())?;
    v.resize(n, 0.0f32);
    Ok(v)
}

pub fn silu(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

/// erf-based gelu, as vLLM's gelu_and_mul.
pub fn gelu(g: f32) -> f32 {
    0.5 * g * (1.0 + erf(g * std::f32::consts::FRAC_1_SQRT_2))
}

/// erf with |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26 is too coarse; this is the
/// Numerical Recipes erfc Chebyshev fit, evaluated in f64).
pub fn erf(x: f32) -> f32 {
    let z = (x as f64).abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    let v = 1.0 - r;
    (if x >= 0.0 { v } else { -v }) as f32
}

#[derive(Clone, Copy)]
struct Ptr(usize);
// The addresses come from validated DLPack tensors that outlive the call.
unsafe impl Send for Ptr {}
unsafe impl Sync for Ptr {}

unsafe fn read<T: Element>(base: usize, idx: usize) -> T {
    *(base as *const T).add(idx)
}

unsafe fn read_f32_any(base: usize, dtype: DType, idx: usize) -> f32 {
    match dtype {
        DType::BF16 => read::<bf16>(base, idx).to_f32(),
        DType::F16 => read::<f16>(base, idx).to_f32(),
        _ => read::<f32>(base, idx),
    }
}

unsafe fn read_id(base: usize, dtype: DType, idx: usize) -> i64 {
    match dtype {
        DType::I64 => *(base as *const i64).add(idx),
        _ => *(base as *const i32).add(idx) as i64,
    }
}

/// Local expert of every slot, or -1 for ids out of range, -1 ids, and unmapped experts.
///
/// # Safety
/// `p` must describe live CPU tensors.
pub unsafe fn slot_experts(p: &MoeProblem) -> Vec<i64> {
    let o = &p.operands;
    let mut v = Vec::with_capacity(p.slots());
    for t in 0..p.m {
        for k in 0..p.topk {
            let g = read_id(
                o.topk_ids,
                p.topk_ids_dtype,
                t * p.strides.topk_ids_row as usize + k,
            );
            let local = if g >= 0 && (g as usize) < p.global_experts {
                let l = if p.has_expert_map {
                    *(o.expert_map as *const i32).add(g as usize) as i64
                } else {
                    g
                };
                if l >= 0 && (l as usize) < p.local_experts {
                    l
                } else {
                    -1
                }
            } else {
                -1
            };
            v.push(local);
        }
    }
    v
}

/// Checks every router id and expert-map entry; the error names the first bad one.
/// `-1` ids are vLLM's "no expert" sentinel and are allowed.
///
/// # Safety
/// `p` must describe live CPU tensors.
pub unsafe fn check_ids(p: &MoeProblem) -> Result<()> {
    let ids = |t: usize, k: usize| {
        read_id(
            p.operands.topk_ids,
            p.topk_ids_dtype,
            t * p.strides.topk_ids_row as usize + k,
        )
    };
    let map = |g: usize| -> Option<i64> {
        if p.has_expert_map {
            Some(*(p.operands.expert_map as *const i32).add(g) as i64)
        } else {
            None
        }
    };
    check_ids_with(p, ids, map)
}

/// Shared by the CPU and CUDA paths (the CUDA path copies ids to the host first).
pub fn check_ids_with(
    p: &MoeProblem,
    ids: impl Fn(usize, usize) -> i64,
    map: impl Fn(usize) -> Option<i64>,
) -> Result<()> {
    for g in 0..p.global_experts {
        match map(g) {
            Some(l) if l < -1 || l >= p.local_experts as i64 => {
                return Err(Error::Shape(format!(
                    "expert_map: expected entries in [-1, {}) (w1.shape[0] local experts), got {l} at index {g}",
                    p.local_experts
                )));
            }
            None => break,
            _ => {}
        }
    }
    for t in 0..p.m {
        for k in 0..p.topk {
            let g = ids(t, k);
            if g != -1 && (g < 0 || g >= p.global_experts as i64) {
                return Err(Error::Shape(format!(
                    "topk_ids: expected ids in [0, {}) (global_num_experts) or -1, got {g} at [{t}, {k}]",
                    p.global_experts
                )));
            }
        }
    }
    Ok(())
}

#[inline]
fn dot<T: Element>(w: &[T], x: &[f32]) -> f32 {
    // Four partial sums: a little ILP without changing the f32 semantics much.
    let mut acc = [0.0f32; 4];
    let chunks = w.len() / 4;
    for c in 0..chunks {
        for j in 0..4 {
            acc[j] += w[4 * c + j].to_f32() * x[4 * c + j];
        }
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for j in chunks * 4..w.len() {
        s += w[j].to_f32() * x[j];
    }
    s
}

/// Runs the op on CPU tensors.
///
/// # Safety
/// `p` must describe live CPU tensors; `out` must not overlap the weights.
pub unsafe fn fused_experts(p: &MoeProblem) -> Result<()> {
    let fp8 = p.quant.is_some();
    match p.dtype {
        DType::F32 if fp8 => fp8::run::<f32>(p),
        DType::BF16 if fp8 => fp8::run::<bf16>(p),
        DType::F16 if fp8 => fp8::run::<f16>(p),
        DType::F32 => run::<f32>(p),
        DType::BF16 => run::<bf16>(p),
        DType::F16 => run::<f16>(p),
        other => Err(Error::DType(format!(
            "hidden_states: expected bfloat16, float16 or float32, got {}",
            other.name()
        ))),
    }
}

unsafe fn run<T: Element>(p: &MoeProblem) -> Result<()> {
    let (m, k, n, topk) = (p.m, p.k, p.n, p.topk);
    if m == 0 {
        return Ok(());
    }
    let experts = slot_experts(p);
    let o = p.operands;
    let s = p.strides;
    let hidden = Ptr(o.hidden_states);
    let w1 = Ptr(o.w1);
    let w2 = Ptr(o.w2);
    let tw = Ptr(o.topk_weights);
    let tw_dtype = p.topk_weights_dtype;
    let act = p.activation;
    let on_input = p.apply_router_weight_on_input;
    let router_weight = move |slot: usize| -> f32 {
        let (t, kk) = (slot / topk, slot % topk);
        read_f32_any(tw.0, tw_dtype, t * s.topk_weights_row as usize + kk)
    };

    // GEMM1 + activation, one task per (slot, block of rows).
    let mut inter = zeroed_f32("the intermediate (M*topk x N float32)", &[m, topk, n])?;
    const ROWS: usize = 64;
    inter
        .par_chunks_mut(n)
        .enumerate()
        .flat_map_iter(|(slot, row)| {
            row.chunks_mut(ROWS)
                .enumerate()
                .map(move |(b, c)| (slot, b, c))
        })
        .for_each(|(slot, b, chunk)| {
            let e = experts[slot];
            if e < 0 {
                return;
            }
            let t = slot / topk;
            let xs: &[T] = std::slice::from_raw_parts(
                (hidden.0 as *const T).add(t * s.hidden_row as usize),
                k,
            );
            let mut x: Vec<f32> = xs.iter().map(|v| v.to_f32()).collect();
            if on_input {
                let w = router_weight(slot);
                x.iter_mut().for_each(|v| *v *= w);
            }
            let base = (w1.0 as *const T).add(e as usize * s.w1_expert as usize);
            for (i, dst) in chunk.iter_mut().enumerate() {
                let j = b * ROWS + i;
                let g = dot(
                    std::slice::from_raw_parts(base.add(j * s.w1_row as usize), k),
                    &x,
                );
                let u = dot(
                    std::slice::from_raw_parts(base.add((j + n) * s.w1_row as usize), k),
                    &x,
                );
                let a = match act {
                    crate::problem::Activation::Silu => silu(g),
                    crate::problem::Activation::Gelu => gelu(g),
                };
                *dst = a * u;
            }
        });

    // GEMM2 + router weight + sum over k, one task per (token, block of output rows).
    let out = Ptr(o.out);
    let kblocks = k.div_ceil(ROWS);
    (0..m * kblocks).into_par_iter().for_each(|task| {
        let (t, b) = (task / kblocks, task % kblocks);
        let r0 = b * ROWS;
        let r1 = (r0 + ROWS).min(k);
        let mut acc = [0.0f32; ROWS];
        for kk in 0..topk {
            let slot = t * topk + kk;
            let e = experts[slot];
            if e < 0 {
                continue;
            }
            let w = if on_input { 1.0 } else { router_weight(slot) };
            let h = &inter[slot * n..(slot + 1) * n];
            let base = (w2.0 as *const T).add(e as usize * s.w2_expert as usize);
            for r in r0..r1 {
                let y = dot(
                    std::slice::from_raw_parts(base.add(r * s.w2_row as usize), n),
                    h,
                );
                acc[r - r0] += w * y;
            }
        }
        let dst = (out.0 as *mut T).add(t * s.out_row as usize);
        for r in r0..r1 {
            *dst.add(r) = T::from_f32(acc[r - r0]);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0f32, 0.0f64),
            (0.5, 0.520_499_877_8),
            (1.0, 0.842_700_792_9),
            (-2.0, -0.995_322_265),
            (3.5, 0.999_999_256_9),
        ] {
            assert!(
                (erf(x) as f64 - want).abs() < 2e-7,
                "erf({x}) = {} want {want}",
                erf(x)
            );
        }
    }

    #[test]
    fn host_buffers_fail_with_a_typed_error() {
        assert_eq!(zeroed_f32("x", &[3, 2]).unwrap(), vec![0.0; 6]);
        assert!(zeroed_f32("x", &[0, 5]).unwrap().is_empty());
        // the product overflows usize, or its bytes exceed isize::MAX: no allocation is tried
        for dims in [&[usize::MAX, 2][..], &[1 << 62, 1], &[1 << 40, 1 << 30]] {
            match zeroed_f32("the intermediate", dims) {
                Err(Error::Memory(m)) => {
                    assert!(
                        m.contains("the intermediate") && m.contains("could not be allocated"),
                        "{m}"
                    )
                }
                other => panic!("{dims:?}: {other:?}"),
            }
        }
        // 16 TiB: within isize::MAX, refused by the allocator
        let err = zeroed_f32("the intermediate", &[65536, 64, 1 << 20]).unwrap_err();
        assert!(
            err.to_string()
                .contains("65536 x 64 x 1048576 float32 values, 16384.0 GiB"),
            "{err}"
        );
    }

    #[test]
    fn activations() {
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((gelu(1.0) - 0.841_344_7).abs() < 1e-6);
        assert_eq!(silu(0.0), 0.0);
    }
}
