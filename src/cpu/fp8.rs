//! FP8 (e4m3) W8A8 on the CPU: the reference the CUDA kernels are checked against.
//!
//! vLLM's `fused_experts_impl(use_fp8_w8a8=True)` semantics, per (token, k) slot with a
//! local expert e (S = M*topk slots):
//!   x_q, xs  = quantize(x)                 (per tensor, per token, or per token per 128 columns)
//!   g, u     = (x_q . w1_q[e]^T) dequantized by xs and w1_scale, accumulated in f32
//!              (times the router weight with apply_router_weight_on_input)
//!   a        = act(g) * u                  (kept in f32)
//!   a_q, as  = quantize(a)                 (a2_scale static, or dynamic like x)
//!   y        = (a_q . w2_q[e]^T) dequantized by as and w2_scale
//!   out[t]  += router_weight * y           (summed in k order)
//!
//! Quantizing v with scale s gives the e4m3 value nearest to v/s (ties to even) after
//! clamping to +-448. Per-tensor scales multiply by the f32 reciprocal 1/s (as vLLM's
//! scaled_fp8_quant); per-token and per-group scales divide (as vLLM's per-token and
//! per_token_group kernels). Dynamic scales: per tensor and per token
//! max(absmax / 448, 1/(448*512)); per group max(absmax, 1e-10) / 448.
//!
//! Non-finite values: NaN and +-inf in x or in the intermediate quantize to NaN (not to
//! +-448), and are left out of every absmax. So a NaN or inf reaches exactly the output
//! rows of the tokens it belongs to, and never changes another token's scale.

use super::{gelu, read_f32_any, silu, slot_experts, Element, Ptr};
use crate::error::Result;
use crate::problem::{
    Activation, MoeProblem, QuantScheme, FP8_BLOCK, FP8_GROUP_EPS, FP8_MAX, FP8_MIN_SCALE,
};
use rayon::prelude::*;
use std::sync::OnceLock;

/// Value of an e4m3fn byte (0x7F and 0xFF are NaN; there is no infinity).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((b >> 3) & 0xF) as i32;
    let m = (b & 7) as f32;
    if e == 15 && b & 7 == 7 {
        return f32::NAN;
    }
    let v = if e == 0 {
        m * (1.0 / 512.0)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    sign * v
}

fn table() -> &'static [f32; 256] {
    static T: OnceLock<[f32; 256]> = OnceLock::new();
    T.get_or_init(|| std::array::from_fn(|i| e4m3_to_f32(i as u8)))
}

/// The e4m3 value nearest to `v` (ties to even), saturating at +-448; NaN stays NaN.
pub fn round_e4m3(v: f32) -> f32 {
    if v.is_nan() {
        return f32::NAN;
    }
    let a = v.abs().min(FP8_MAX);
    let r = if a < 1.0 / 64.0 {
        // subnormal range: steps of 2^-9
        (a * 512.0).round_ties_even() / 512.0
    } else {
        let e = ((a.to_bits() >> 23) & 0xFF) as i32 - 127;
        let step = 2f32.powi(e - 3);
        (a / step).round_ties_even() * step
    };
    r.min(FP8_MAX).copysign(v)
}

/// Quantizes `v` with scale `s`: `v * inv` when `inv` is given (per-tensor), else `v / s`.
#[inline]
pub fn quantize(v: f32, s: f32, inv: Option<f32>) -> f32 {
    if !v.is_finite() {
        return f32::NAN;
    }
    let t = match inv {
        Some(i) => v * i,
        None => v / s,
    };
    round_e4m3(t.clamp(-FP8_MAX, FP8_MAX))
}

/// Largest |v| over the finite values (0 when there are none).
#[inline]
fn absmax(vals: impl Iterator<Item = f32>) -> f32 {
    vals.filter(|v| v.is_finite())
        .fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Dynamic scale of a per-tensor or per-token absmax.
#[inline]
pub fn scale_from_absmax(amax: f32) -> f32 {
    (amax / FP8_MAX).max(FP8_MIN_SCALE)
}

/// Dynamic scale of a per-128-column-group absmax.
#[inline]
pub fn group_scale_from_absmax(amax: f32) -> f32 {
    amax.max(FP8_GROUP_EPS) / FP8_MAX
}

/// Quantizes `rows` rows of `cols` values (`row(r)`: row r, or None for a row that takes no
/// part) per the scheme. `static_scale`: the per-tensor scale given by the caller; without
/// it the rows that take part set a dynamic per-tensor absmax (each row is then produced
/// twice, rather than held twice). Returns (codes as f32 [rows*cols], scales [rows*groups])
/// with every row's scales filled (per tensor: the same value); `OutOfMemoryError` where
/// those buffers cannot be allocated.
fn quantize_rows(
    scheme: QuantScheme,
    rows: usize,
    cols: usize,
    row: &(dyn Fn(usize) -> Option<Vec<f32>> + Sync),
    static_scale: Option<f32>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let groups = scheme.groups(cols);
    let mut q = super::zeroed_f32("the quantized rows (float32 codes)", &[rows, cols])?;
    let mut scales = super::zeroed_f32("the quantization scales", &[rows, groups])?;
    let tensor_scale = match (scheme, static_scale) {
        (QuantScheme::Tensor, Some(s)) => Some(s),
        (QuantScheme::Tensor, None) => Some(scale_from_absmax(
            (0..rows)
                .into_par_iter()
                .filter_map(|r| row(r).map(|d| absmax(d.iter().copied())))
                .reduce(|| 0.0f32, f32::max),
        )),
        _ => None,
    };
    q.par_chunks_mut(cols.max(1))
        .zip(scales.par_chunks_mut(groups))
        .enumerate()
        .for_each(|(r, (qr, sr))| {
            let Some(d) = row(r) else { return };
            let d = &d;
            match scheme {
                QuantScheme::Tensor => {
                    let s = tensor_scale.unwrap_or(1.0);
                    let inv = 1.0 / s;
                    sr[0] = s;
                    for (dst, &v) in qr.iter_mut().zip(d) {
                        *dst = quantize(v, s, Some(inv));
                    }
                }
                QuantScheme::Channel => {
                    let s = scale_from_absmax(absmax(d.iter().copied()));
                    sr[0] = s;
                    for (dst, &v) in qr.iter_mut().zip(d) {
                        *dst = quantize(v, s, None);
                    }
                }
                QuantScheme::Block => {
                    for (g, (qg, dg)) in qr
                        .chunks_mut(FP8_BLOCK)
                        .zip(d.chunks(FP8_BLOCK))
                        .enumerate()
                    {
                        let s = group_scale_from_absmax(absmax(dg.iter().copied()));
                        sr[g] = s;
                        for (dst, &v) in qg.iter_mut().zip(dg) {
                            *dst = quantize(v, s, None);
                        }
                    }
                }
            }
        });
    Ok((q, scales))
}

/// Dot product of quantized activations with one e4m3 weight row, per scheme:
/// (sum over k of x_q * w_q) * xs * ws, the block scheme summing per 128 columns.
#[inline]
fn dot_q(
    w: &[u8],
    xq: &[f32],
    xs: &[f32],
    scheme: QuantScheme,
    wscale: impl Fn(usize) -> f32,
) -> f32 {
    let t = table();
    let raw = |lo: usize, hi: usize| -> f32 {
        let mut acc = [0.0f32; 4];
        let (wc, xc) = (&w[lo..hi], &xq[lo..hi]);
        let chunks = wc.len() / 4;
        for c in 0..chunks {
            for j in 0..4 {
                acc[j] += t[wc[4 * c + j] as usize] * xc[4 * c + j];
            }
        }
        let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        for j in chunks * 4..wc.len() {
            s += t[wc[j] as usize] * xc[j];
        }
        s
    };
    match scheme {
        QuantScheme::Block => {
            let mut sum = 0.0f32;
            for (g, lo) in (0..w.len()).step_by(FP8_BLOCK).enumerate() {
                let hi = (lo + FP8_BLOCK).min(w.len());
                sum += raw(lo, hi) * (xs[g] * wscale(g));
            }
            sum
        }
        _ => raw(0, w.len()) * (xs[0] * wscale(0)),
    }
}

/// Runs the FP8 op on CPU tensors.
///
/// # Safety
/// `p` must describe live CPU tensors (`p.quant` is Some); `out` must not overlap the inputs.
pub unsafe fn run<T: Element>(p: &MoeProblem) -> Result<()> {
    let q = p.quant.expect("the FP8 path needs p.quant");
    let (m, k, n, topk) = (p.m, p.k, p.n, p.topk);
    if m == 0 {
        return Ok(());
    }
    let slots = m * topk;
    let experts = slot_experts(p);
    let o = p.operands;
    let s = p.strides;
    let scheme = q.scheme;
    let hidden = Ptr(o.hidden_states);
    let (w1, w2) = (Ptr(o.w1), Ptr(o.w2));
    let (ws1, ws2) = (q.w1_scale, q.w2_scale);
    let (ws1_addr, ws2_addr) = (Ptr(ws1.addr), Ptr(ws2.addr));
    let tw = Ptr(o.topk_weights);
    let tw_dtype = p.topk_weights_dtype;
    let on_input = p.apply_router_weight_on_input;
    let act = p.activation;
    let router_weight = move |slot: usize| -> f32 {
        let (t, kk) = (slot / topk, slot % topk);
        read_f32_any(tw.0, tw_dtype, t * s.topk_weights_row as usize + kk)
    };
    let read_f32 = |addr: usize| -> Option<f32> { (addr != 0).then(|| *(addr as *const f32)) };

    // 1. The input, quantized per token (every token counts toward a per-tensor absmax).
    let gk = scheme.groups(k);
    let x_row = move |t: usize| -> Option<Vec<f32>> {
        let xs: &[T] =
            std::slice::from_raw_parts((hidden.0 as *const T).add(t * s.hidden_row as usize), k);
        Some(xs.iter().map(|v| v.to_f32()).collect())
    };
    let (xq, xscale) = quantize_rows(scheme, m, k, &x_row, read_f32(q.a1_scale))?;

    // 2. GEMM1 + act-and-mul in f32, one task per slot.
    let mut inter = super::zeroed_f32("the intermediate (M*topk x N float32)", &[slots, n])?;
    inter.par_chunks_mut(n).enumerate().for_each(|(slot, row)| {
        let e = experts[slot];
        if e < 0 {
            return;
        }
        let e = e as usize;
        let t = slot / topk;
        let xr = &xq[t * k..(t + 1) * k];
        let xs = &xscale[t * gk..(t + 1) * gk];
        let w = if on_input { router_weight(slot) } else { 1.0 };
        let base = (w1.0 as *const u8).add(e * s.w1_expert as usize);
        let wrow = |r: usize| std::slice::from_raw_parts(base.add(r * s.w1_row as usize), k);
        let scale = |r: usize| {
            move |g: usize| *(ws1_addr.0 as *const f32).add(ws1.offset(e, wrow_index(scheme, r), g))
        };
        for (j, dst) in row.iter_mut().enumerate() {
            let g = dot_q(wrow(j), xr, xs, scheme, scale(j)) * w;
            let u = dot_q(wrow(j + n), xr, xs, scheme, scale(j + n)) * w;
            let a = match act {
                Activation::Silu => silu(g),
                Activation::Gelu => gelu(g),
            };
            *dst = a * u;
        }
    });

    // 3. The intermediate, quantized per slot (slots without an expert take no part).
    let gn = scheme.groups(n);
    let inter_ref = &inter;
    let experts_ref = &experts;
    let inter_row = move |slot: usize| -> Option<Vec<f32>> {
        (experts_ref[slot] >= 0).then(|| inter_ref[slot * n..(slot + 1) * n].to_vec())
    };
    let (aq, ascale) = quantize_rows(scheme, slots, n, &inter_row, read_f32(q.a2_scale))?;

    // 4. GEMM2 + router weight + sum over k, one task per (token, block of output rows).
    const ROWS: usize = 64;
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
            let e = e as usize;
            let w = if on_input { 1.0 } else { router_weight(slot) };
            let ar = &aq[slot * n..(slot + 1) * n];
            let asc = &ascale[slot * gn..(slot + 1) * gn];
            let base = (w2.0 as *const u8).add(e * s.w2_expert as usize);
            for r in r0..r1 {
                let wr = std::slice::from_raw_parts(base.add(r * s.w2_row as usize), n);
                let scale = |g: usize| {
                    *(ws2_addr.0 as *const f32).add(ws2.offset(e, wrow_index(scheme, r), g))
                };
                acc[r - r0] += w * dot_q(wr, ar, asc, scheme, scale);
            }
        }
        let dst = (out.0 as *mut T).add(t * s.out_row as usize);
        for r in r0..r1 {
            *dst.add(r) = T::from_f32(acc[r - r0]);
        }
    });
    Ok(())
}

/// Row index into a weight scale for weight row `r`: the block row for 128x128 blocks.
#[inline]
fn wrow_index(scheme: QuantScheme, r: usize) -> usize {
    match scheme {
        QuantScheme::Block => r / FP8_BLOCK,
        _ => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
    }

    #[test]
    fn rounding_is_nearest_even_and_saturating() {
        // every finite code rounds to itself
        for b in 0u8..=255 {
            let v = e4m3_to_f32(b);
            if v.is_finite() {
                assert_eq!(round_e4m3(v), v, "code {b:#x}");
            }
        }
        assert_eq!(round_e4m3(1.0625), 1.0); // halfway between 1 and 1.125: even
        assert_eq!(round_e4m3(1.1875), 1.25); // halfway between 1.125 and 1.25: even
        assert_eq!(round_e4m3(1.07), 1.125);
        assert_eq!(round_e4m3(1e6), 448.0);
        assert_eq!(round_e4m3(-1e6), -448.0);
        assert_eq!(round_e4m3(3.0 / 1024.0), 2.0 / 512.0); // subnormal tie 1.5 -> 2
        assert!(round_e4m3(f32::NAN).is_nan());
        assert!(quantize(f32::INFINITY, 1.0, None).is_nan());
        assert!(quantize(f32::NAN, 1.0, Some(1.0)).is_nan());
        assert_eq!(quantize(900.0, 1.0, None), 448.0);
    }

    #[test]
    fn zero_rows_get_the_minimum_scale() {
        assert_eq!(scale_from_absmax(0.0), FP8_MIN_SCALE);
        assert_eq!(group_scale_from_absmax(0.0), FP8_GROUP_EPS / FP8_MAX);
        assert_eq!(quantize(0.0, scale_from_absmax(0.0), None), 0.0);
    }
}
