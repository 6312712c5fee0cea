//! The problem descriptor: every input of `fused_experts`, validated once.
//!
//! `TensorDesc` is what the binding layer extracts from a DLPack tensor (no Python
//! here, so this module is tested with `cargo test --no-default-features`).
//! `MoeProblem::new` checks dtypes, shapes, strides and devices and names the
//! offending argument in every error.

use crate::error::{Error, Result};
use std::fmt;

/// Element types the op meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
    I32,
    I64,
    /// float8_e4m3fn (DLPack code 10, 8 bits): FP8 weights.
    F8E4M3,
    /// Anything else, kept for the error message: (DLPack type code, bits).
    Other(u8, u8),
}

/// The usual name of a DLPack dtype (DLPack 1.3's type codes, dlpack.h `DLDataTypeCode`):
/// `float64`, `complex64`, `uint16`, `float8_e5m2`, ...; a code DLPack does not define shows
/// as `dlpack(code=.., bits=..)`.
fn dlpack_dtype_name(code: u8, bits: u8) -> String {
    // the codes of every width, then the fixed-width ones with their width
    let (named, width) = match code {
        0 => return format!("int{bits}"),
        1 => return format!("uint{bits}"),
        2 => return format!("float{bits}"),
        4 => return format!("bfloat{bits}"),
        5 => return format!("complex{bits}"),
        3 => return "opaque handle".into(),
        6 => ("bool", 8),
        7 => ("float8_e3m4", 8),
        8 => ("float8_e4m3", 8),
        9 => ("float8_e4m3b11fnuz", 8),
        10 => ("float8_e4m3fn", 8),
        11 => ("float8_e4m3fnuz", 8),
        12 => ("float8_e5m2", 8),
        13 => ("float8_e5m2fnuz", 8),
        14 => ("float8_e8m0fnu", 8),
        15 => ("float6_e2m3fn", 6),
        16 => ("float6_e3m2fn", 6),
        17 => ("float4_e2m1fn", 4),
        _ => return format!("dlpack(code={code}, bits={bits})"),
    };
    // a producer that sets another width than the type's is shown as such
    if bits == width {
        named.into()
    } else {
        format!("{named} ({bits} bits)")
    }
}

impl DType {
    pub fn name(&self) -> String {
        match self {
            DType::F32 => "float32".into(),
            DType::BF16 => "bfloat16".into(),
            DType::F16 => "float16".into(),
            DType::I32 => "int32".into(),
            DType::I64 => "int64".into(),
            DType::F8E4M3 => "float8_e4m3fn".into(),
            DType::Other(code, bits) => dlpack_dtype_name(*code, *bits),
        }
    }
    pub fn size(&self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::I64 => 8,
            DType::F8E4M3 => 1,
            DType::Other(_, bits) => (*bits as usize).div_ceil(8),
        }
    }
    pub fn is_float(&self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }
    /// Short suffix used in kernel names.
    pub fn suffix(&self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F8E4M3 => "f8e4m3",
            DType::Other(..) => "other",
        }
    }
    /// Code of a float dtype for kernels that read small side inputs of any float type
    /// (`ScalarCode` in cuda/common/moe_common.cuh).
    pub fn scalar_code(&self) -> i32 {
        match self {
            DType::BF16 => 1,
            DType::F16 => 2,
            _ => 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    Cuda(i32),
    /// Any other DLPack device: (device type, id).
    Other(u32, i32),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Other(t, i) => write!(f, "dlpack-device(type={t}, id={i})"),
        }
    }
}

/// A tensor as the core sees it: metadata plus the address of element 0.
#[derive(Clone, Debug)]
pub struct TensorDesc {
    pub dtype: DType,
    pub shape: Vec<i64>,
    /// Strides in elements (compact row-major when the producer gave none).
    pub strides: Vec<i64>,
    pub device: Device,
    /// Address of the first element (data pointer plus byte offset).
    pub addr: usize,
    pub read_only: bool,
}

/// Distinct, non-overlapping addresses for descriptors of tensors that do not exist (the
/// oracle's offline questions, tests): each one after the last, 256-byte aligned, from 1 MiB.
pub struct FakeAddresses(std::cell::Cell<usize>);

impl Default for FakeAddresses {
    fn default() -> Self {
        FakeAddresses(std::cell::Cell::new(1 << 20))
    }
}

impl FakeAddresses {
    /// A compact row-major descriptor at the next free address.
    pub fn tensor(&self, dtype: DType, shape: &[i64], device: Device) -> TensorDesc {
        let addr = self.0.get();
        let bytes = shape
            .iter()
            .fold(dtype.size(), |a, &d| a.saturating_mul(d.max(0) as usize));
        self.0
            .set(align_up(addr.saturating_add(bytes)).saturating_add(WS_ALIGN));
        TensorDesc::contiguous(dtype, shape, device, addr)
    }
}

/// `out` may be hidden_states (each row is read before it is written) but no other input:
/// ShapeError naming the first of `read` (name, tensor) whose bytes it overlaps.
pub fn check_out_overlaps(out: &TensorDesc, read: &[(&str, Option<&TensorDesc>)]) -> Result<()> {
    let Some((o0, o1)) = out.byte_span() else {
        return Ok(());
    };
    for (name, t) in read {
        if let Some((t0, t1)) = t.and_then(|t| t.byte_span()) {
            if o0 < t1 && t0 < o1 {
                return Err(Error::Shape(format!(
                    "out: expected memory that does not overlap {name} (out may be hidden_states, no other input), got bytes [{o0:#x}, {o1:#x}) against {name}'s [{t0:#x}, {t1:#x})"
                )));
            }
        }
    }
    Ok(())
}

impl TensorDesc {
    /// The tensor as an error message's "got ...": its dtype and shape.
    pub fn described(&self) -> String {
        format!("a {} tensor of shape {:?}", self.dtype.name(), self.shape)
    }

    /// Bytes of a compact row-major tensor (strides as `contiguous` gives them, ignoring
    /// dimensions of size 1), None for any other layout (a broadcast or strided view covers
    /// fewer bytes than its shape says) or a size that overflows.
    pub fn contiguous_bytes(&self) -> Option<usize> {
        let mut expect = 1i64;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d < 0 || (d > 1 && s != expect) {
                return None;
            }
            expect = expect.checked_mul(d.max(1))?;
        }
        if self.shape.contains(&0) {
            return Some(0);
        }
        usize::try_from(expect).ok()?.checked_mul(self.dtype.size())
    }

    /// The bytes [first, last) its elements can touch, None when it has none (a dimension of
    /// 0) or the span overflows. Negative strides count toward `first`.
    pub fn byte_span(&self) -> Option<(usize, usize)> {
        if self.shape.iter().any(|&d| d <= 0) {
            return None;
        }
        let (mut lo, mut hi) = (0i128, 0i128);
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            let reach = (d as i128 - 1) * s as i128;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        let size = self.dtype.size() as i128;
        let first = self.addr as i128 + lo * size;
        let last = self.addr as i128 + (hi + 1) * size;
        Some((usize::try_from(first).ok()?, usize::try_from(last).ok()?))
    }

    /// A compact row-major tensor descriptor (used by tests and the CPU bench).
    pub fn contiguous(dtype: DType, shape: &[i64], device: Device, addr: usize) -> Self {
        let mut strides = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1].max(1);
        }
        TensorDesc {
            dtype,
            shape: shape.to_vec(),
            strides,
            device,
            addr,
            read_only: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    Silu,
    Gelu,
}

impl Activation {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "silu" => Ok(Activation::Silu),
            "gelu" => Ok(Activation::Gelu),
            other => Err(Error::Argument(format!(
                "activation: expected one of 'silu', 'gelu', got {other:?}"
            ))),
        }
    }
    /// Code passed to kernels (`Activation` in cuda/common/moe_common.cuh).
    pub fn code(&self) -> i32 {
        match self {
            Activation::Silu => 0,
            Activation::Gelu => 1,
        }
    }
    pub fn name(&self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::Gelu => "gelu",
        }
    }
}

/// Columns (and rows) of one FP8 scale block: the only `block_shape` accepted is [128, 128].
pub const FP8_BLOCK: usize = 128;
/// Largest finite float8_e4m3fn value.
pub const FP8_MAX: f32 = 448.0;
/// Smallest dynamic per-tensor / per-token scale (vLLM's `min_scaling_factor`,
/// 1 / (448 * 512)): an all-zero input gets this scale instead of 0, so no 0/0.
pub const FP8_MIN_SCALE: f32 = 1.0 / (448.0 * 512.0);
/// Smallest absmax of a per-token-group (block) scale (vLLM's `eps` of
/// per_token_group_quant_fp8): scale = max(absmax, 1e-10) / 448.
pub const FP8_GROUP_EPS: f32 = 1e-10;

/// How FP8 W8A8 weights and activations are scaled (vLLM's `fused_experts_impl` with
/// `use_fp8_w8a8=True`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantScheme {
    /// w1_scale [E], w2_scale [E]; activations one scale per tensor (a1_scale/a2_scale
    /// static, or dynamic absmax / 448).
    Tensor,
    /// `per_channel_quant=True`: w1_scale [E, 2N], w2_scale [E, K]; activations dynamic
    /// per token (row absmax / 448).
    Channel,
    /// `block_shape=[128, 128]`: w1_scale [E, ceil(2N/128), ceil(K/128)], w2_scale
    /// [E, ceil(K/128), ceil(N/128)]; activations dynamic per token per 128 columns.
    Block,
}

impl QuantScheme {
    /// Code passed to kernels and kernel-name suffix.
    pub fn code(&self) -> i32 {
        match self {
            QuantScheme::Tensor => 0,
            QuantScheme::Channel => 1,
            QuantScheme::Block => 2,
        }
    }
    pub fn name(&self) -> &'static str {
        match self {
            QuantScheme::Tensor => "tensor",
            QuantScheme::Channel => "channel",
            QuantScheme::Block => "block",
        }
    }
    /// The `quant` names of `swapmoe.select_backend`.
    pub fn parse(s: &str) -> Option<QuantScheme> {
        match s {
            "fp8_tensor" => Some(QuantScheme::Tensor),
            "fp8_channel" => Some(QuantScheme::Channel),
            "fp8_block128" => Some(QuantScheme::Block),
            _ => None,
        }
    }
    /// Activation scales per row of `cols` columns: 1, or one per 128-column group.
    pub fn groups(&self, cols: usize) -> usize {
        match self {
            QuantScheme::Block => cols.div_ceil(FP8_BLOCK),
            _ => 1,
        }
    }
}

/// The FP8 arguments of one call, before validation (all absent without FP8).
#[derive(Clone, Copy, Debug, Default)]
pub struct QuantArgs<'a> {
    pub use_fp8_w8a8: bool,
    pub per_channel_quant: bool,
    pub block_shape: Option<&'a [i64]>,
    pub w1_scale: Option<&'a TensorDesc>,
    pub w2_scale: Option<&'a TensorDesc>,
    pub a1_scale: Option<&'a TensorDesc>,
    pub a2_scale: Option<&'a TensorDesc>,
}

/// A float32 weight-scale tensor seen as [E, rows, cols] with element strides (0 on the
/// dimensions the scheme broadcasts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ScaleDesc {
    pub addr: usize,
    pub expert: i64,
    pub row: i64,
    pub col: i64,
}

impl ScaleDesc {
    /// Element offset of (expert, row, col).
    pub fn offset(&self, e: usize, r: usize, c: usize) -> usize {
        (e as i64 * self.expert + r as i64 * self.row + c as i64 * self.col) as usize
    }
}

/// Validated FP8 W8A8 description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Quant {
    pub scheme: QuantScheme,
    pub w1_scale: ScaleDesc,
    pub w2_scale: ScaleDesc,
    /// Address of the static float32 input scale, 0 when dynamic.
    pub a1_scale: usize,
    /// Address of the static float32 intermediate scale, 0 when dynamic.
    pub a2_scale: usize,
}

fn scale_dims_ok(t: &TensorDesc, accepted: &[&[i64]]) -> bool {
    accepted.contains(&t.shape.as_slice())
}

fn check_scale_tensor(name: &str, t: &TensorDesc, device: Device) -> Result<()> {
    if t.dtype != DType::F32 {
        return Err(Error::DType(format!(
            "{name}: expected float32, got {}",
            t.dtype.name()
        )));
    }
    check_device(name, t, device)?;
    if let Some((axis, s)) = t.strides.iter().enumerate().find(|(_, s)| **s < 0) {
        return Err(Error::Shape(format!(
            "{name}: expected non-negative strides, got stride {s} on dimension {axis}"
        )));
    }
    Ok(())
}

/// A weight scale of `shape` variants; returns it as [E, rows, cols] strides.
fn weight_scale(
    name: &str,
    t: Option<&TensorDesc>,
    device: Device,
    accepted: &[&[i64]],
    what: &str,
) -> Result<ScaleDesc> {
    let Some(t) = t else {
        return Err(Error::Argument(format!(
            "{name}: expected a float32 tensor {what} with use_fp8_w8a8=True, got None"
        )));
    };
    check_scale_tensor(name, t, device)?;
    if !scale_dims_ok(t, accepted) {
        let shapes: Vec<String> = accepted.iter().map(|s| dims(s)).collect();
        return Err(Error::Shape(format!(
            "{name}: expected shape {} {what}, got {}",
            shapes.join(" or "),
            dims(&t.shape)
        )));
    }
    let st = |i: usize| -> i64 {
        if i < t.shape.len() && t.shape[i] > 1 {
            t.strides[i]
        } else {
            0
        }
    };
    Ok(ScaleDesc {
        addr: t.addr,
        expert: st(0),
        row: st(1),
        col: st(2),
    })
}

fn act_scale(name: &str, t: Option<&TensorDesc>, device: Device) -> Result<usize> {
    let Some(t) = t else { return Ok(0) };
    check_scale_tensor(name, t, device)?;
    if !(t.shape.is_empty() || t.shape == [1]) {
        return Err(Error::Shape(format!(
            "{name}: expected a scalar float32 tensor of shape [] or [1] (a static per-tensor scale), got shape {}",
            dims(&t.shape)
        )));
    }
    Ok(t.addr)
}

impl Fp8Quant {
    /// Per-tensor with a static intermediate scale: GEMM1 can write the e4m3 intermediate
    /// itself (the swap-AB "q8" kernels), which changes both the kernels and where they win.
    pub fn static_intermediate(&self) -> bool {
        self.scheme == QuantScheme::Tensor && self.a2_scale != 0
    }

    /// Validates the FP8 arguments for weights [E, 2N, K] and [E, K, N]. `None` without FP8.
    pub fn validate(
        q: &QuantArgs<'_>,
        e: i64,
        n: i64,
        k: i64,
        device: Device,
    ) -> Result<Option<Fp8Quant>> {
        if !q.use_fp8_w8a8 {
            let block = q.block_shape.map(|b| format!("{b:?}"));
            let given = [
                (
                    "per_channel_quant",
                    q.per_channel_quant.then(|| "True".to_string()),
                ),
                ("block_shape", block),
                ("w1_scale", q.w1_scale.map(TensorDesc::described)),
                ("w2_scale", q.w2_scale.map(TensorDesc::described)),
                ("a1_scale", q.a1_scale.map(TensorDesc::described)),
                ("a2_scale", q.a2_scale.map(TensorDesc::described)),
            ];
            if let Some((name, Some(value))) = given.iter().find(|(_, g)| g.is_some()) {
                let expected = if *name == "per_channel_quant" {
                    "False"
                } else {
                    "None"
                };
                return Err(Error::Argument(format!(
                    "{name}: expected {expected} without use_fp8_w8a8=True, got {value}"
                )));
            }
            return Ok(None);
        }
        let scheme = match (q.block_shape, q.per_channel_quant) {
            (Some(b), _) if b != [FP8_BLOCK as i64, FP8_BLOCK as i64] => {
                let parts: Vec<String> = b.iter().map(|v| v.to_string()).collect();
                return Err(Error::Argument(format!(
                    "block_shape: expected [128, 128] or None, got [{}]",
                    parts.join(", ")
                )));
            }
            (Some(_), true) => {
                return Err(Error::Argument(
                    "per_channel_quant: expected False with block_shape=[128, 128] (block scales are per 128x128 tile), got True".into(),
                ))
            }
            (Some(_), false) => QuantScheme::Block,
            (None, true) => QuantScheme::Channel,
            (None, false) => QuantScheme::Tensor,
        };
        let b = FP8_BLOCK as i64;
        let (w1_scale, w2_scale) = match scheme {
            QuantScheme::Tensor => (
                weight_scale(
                    "w1_scale",
                    q.w1_scale,
                    device,
                    &[&[e], &[e, 1], &[e, 1, 1]],
                    "(one scale per expert)",
                )?,
                weight_scale(
                    "w2_scale",
                    q.w2_scale,
                    device,
                    &[&[e], &[e, 1], &[e, 1, 1]],
                    "(one scale per expert)",
                )?,
            ),
            QuantScheme::Channel => (
                weight_scale(
                    "w1_scale",
                    q.w1_scale,
                    device,
                    &[&[e, 2 * n], &[e, 2 * n, 1]],
                    "(per output channel, per_channel_quant=True)",
                )?,
                weight_scale(
                    "w2_scale",
                    q.w2_scale,
                    device,
                    &[&[e, k], &[e, k, 1]],
                    "(per output channel, per_channel_quant=True)",
                )?,
            ),
            QuantScheme::Block => (
                weight_scale(
                    "w1_scale",
                    q.w1_scale,
                    device,
                    &[&[e, (2 * n + b - 1) / b, (k + b - 1) / b]],
                    "([E, ceil(2N/128), ceil(K/128)], block_shape=[128, 128])",
                )?,
                weight_scale(
                    "w2_scale",
                    q.w2_scale,
                    device,
                    &[&[e, (k + b - 1) / b, (n + b - 1) / b]],
                    "([E, ceil(K/128), ceil(N/128)], block_shape=[128, 128])",
                )?,
            ),
        };
        if scheme != QuantScheme::Tensor {
            let why = if scheme == QuantScheme::Block {
                "with block_shape=[128, 128] (activations are quantized dynamically per token per 128 columns)"
            } else {
                "with per_channel_quant=True (activations are quantized dynamically per token)"
            };
            for (name, t) in [("a1_scale", q.a1_scale), ("a2_scale", q.a2_scale)] {
                if let Some(t) = t {
                    return Err(Error::Argument(format!(
                        "{name}: expected None {why}, got {}",
                        t.described()
                    )));
                }
            }
        }
        Ok(Some(Fp8Quant {
            scheme,
            w1_scale,
            w2_scale,
            a1_scale: act_scale("a1_scale", q.a1_scale, device)?,
            a2_scale: act_scale("a2_scale", q.a2_scale, device)?,
        }))
    }
}

/// The inputs of one call, before validation.
pub struct MoeArgs<'a> {
    pub hidden_states: &'a TensorDesc,
    pub w1: &'a TensorDesc,
    pub w2: &'a TensorDesc,
    pub topk_weights: &'a TensorDesc,
    pub topk_ids: &'a TensorDesc,
    pub out: &'a TensorDesc,
    pub expert_map: Option<&'a TensorDesc>,
    pub activation: Activation,
    pub apply_router_weight_on_input: bool,
    pub global_num_experts: i64,
    /// FP8 W8A8 arguments (`QuantArgs::default()` without FP8).
    pub quant: QuantArgs<'a>,
}

/// Element strides of every operand, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Strides {
    pub hidden_row: i64,
    pub w1_expert: i64,
    pub w1_row: i64,
    pub w2_expert: i64,
    pub w2_row: i64,
    pub topk_weights_row: i64,
    pub topk_ids_row: i64,
    pub out_row: i64,
}

/// Addresses of every operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Operands {
    pub hidden_states: usize,
    pub w1: usize,
    pub w2: usize,
    pub topk_weights: usize,
    pub topk_ids: usize,
    pub out: usize,
    /// 0 when there is no expert map.
    pub expert_map: usize,
}

/// One validated fused-experts problem.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeProblem {
    /// Tokens.
    pub m: usize,
    /// Hidden size (w1's reduction dimension, w2's output rows).
    pub k: usize,
    /// Intermediate size per expert (w1 has 2N rows: gate then up).
    pub n: usize,
    pub topk: usize,
    /// Experts held here: w1.shape[0].
    pub local_experts: usize,
    /// Experts the router ids refer to.
    pub global_experts: usize,
    /// dtype of hidden_states and out (and of w1, w2 without FP8).
    pub dtype: DType,
    /// dtype of w1 and w2: `dtype`, or float8_e4m3fn with FP8.
    pub weight_dtype: DType,
    /// FP8 W8A8 scales and scheme (`use_fp8_w8a8=True`).
    pub quant: Option<Fp8Quant>,
    pub topk_weights_dtype: DType,
    pub topk_ids_dtype: DType,
    pub activation: Activation,
    pub apply_router_weight_on_input: bool,
    pub has_expert_map: bool,
    pub device: Device,
    pub strides: Strides,
    pub operands: Operands,
}

fn dims(shape: &[i64]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

fn check_ndim(name: &str, t: &TensorDesc, ndim: usize, what: &str) -> Result<()> {
    if t.shape.len() != ndim {
        return Err(Error::Shape(format!(
            "{name}: expected a {ndim}-D tensor {what}, got shape {}",
            dims(&t.shape)
        )));
    }
    Ok(())
}

fn check_last_contiguous(name: &str, t: &TensorDesc) -> Result<()> {
    if t.shape.contains(&0) {
        return Ok(()); // no elements: producers give such tensors any strides (numpy: 0)
    }
    let last = t.shape.len() - 1;
    if t.shape[last] > 1 && t.strides[last] != 1 {
        return Err(Error::Shape(format!(
            "{name}: expected the last dimension to be contiguous (stride 1), got strides {} for shape {}",
            dims(&t.strides),
            dims(&t.shape)
        )));
    }
    for (axis, &s) in t.strides.iter().enumerate() {
        if s < 0 {
            return Err(Error::Shape(format!(
                "{name}: expected non-negative strides, got stride {s} on dimension {axis}"
            )));
        }
    }
    Ok(())
}

fn check_shape(name: &str, t: &TensorDesc, expected: &[i64], what: &str) -> Result<()> {
    if t.shape != expected {
        return Err(Error::Shape(format!(
            "{name}: expected shape {} {what}, got {}",
            dims(expected),
            dims(&t.shape)
        )));
    }
    Ok(())
}

fn check_device(name: &str, t: &TensorDesc, device: Device) -> Result<()> {
    if t.device != device {
        return Err(Error::Device(format!(
            "{name}: expected device {device} (the device of hidden_states), got {}",
            t.device
        )));
    }
    Ok(())
}

/// The weights' dtype: the activations' dtype, or float8_e4m3fn with `use_fp8_w8a8`
/// (uint8 is taken as raw e4m3 bytes then, for numpy, which has no float8).
fn check_weight_dtype(name: &str, w: &TensorDesc, act: DType, fp8: bool) -> Result<DType> {
    let is_fp8 = w.dtype == DType::F8E4M3;
    if fp8 {
        if is_fp8 || w.dtype == DType::Other(1, 8) {
            return Ok(DType::F8E4M3);
        }
        return Err(Error::DType(format!(
            "{name}: expected float8_e4m3fn (use_fp8_w8a8=True), got {}",
            w.dtype.name()
        )));
    }
    if w.dtype != act {
        let hint = if is_fp8 {
            "; FP8 weights need use_fp8_w8a8=True with w1_scale and w2_scale"
        } else {
            ""
        };
        return Err(Error::DType(format!(
            "{name}: expected {} (the dtype of hidden_states), got {}{hint}",
            act.name(),
            w.dtype.name()
        )));
    }
    Ok(act)
}

/// Largest local expert count the GPU routing kernel holds in shared memory.
pub const MAX_GPU_LOCAL_EXPERTS: usize = 8192;

impl MoeProblem {
    pub fn new(a: &MoeArgs<'_>) -> Result<Self> {
        let h = a.hidden_states;
        check_ndim("hidden_states", h, 2, "[M, K]")?;
        if !matches!(h.dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(Error::DType(format!(
                "hidden_states: expected bfloat16, float16 or float32, got {}",
                h.dtype.name()
            )));
        }
        check_last_contiguous("hidden_states", h)?;
        let device = h.device;
        if !matches!(device, Device::Cpu | Device::Cuda(_)) {
            return Err(Error::Device(format!(
                "hidden_states: expected a CPU or CUDA tensor, got device {device}"
            )));
        }
        let (m, k) = (h.shape[0], h.shape[1]);
        if k < 1 {
            return Err(Error::Shape(format!(
                "hidden_states: expected hidden size K >= 1, got shape {}",
                dims(&h.shape)
            )));
        }

        let w1 = a.w1;
        check_ndim("w1", w1, 3, "[E, 2N, K]")?;
        let fp8 = a.quant.use_fp8_w8a8;
        let weight_dtype = check_weight_dtype("w1", w1, h.dtype, fp8)?;
        let e = w1.shape[0];
        if e < 1 || w1.shape[1] < 2 || w1.shape[1] % 2 != 0 || w1.shape[2] != k {
            return Err(Error::Shape(format!(
                "w1: expected shape [E, 2N, K] with E >= 1, an even 2N >= 2 and K = {k} (hidden_states.shape[1]), got {}",
                dims(&w1.shape)
            )));
        }
        check_last_contiguous("w1", w1)?;
        check_device("w1", w1, device)?;
        let n = w1.shape[1] / 2;

        let w2 = a.w2;
        check_ndim("w2", w2, 3, "[E, K, N]")?;
        if check_weight_dtype("w2", w2, h.dtype, fp8)? != weight_dtype {
            return Err(Error::DType(format!(
                "w2: expected {} (the dtype of w1), got {}",
                weight_dtype.name(),
                w2.dtype.name()
            )));
        }
        check_shape(
            "w2",
            w2,
            &[e, k, n],
            "[E, K, N] (E and 2N from w1, K from hidden_states)",
        )?;
        check_last_contiguous("w2", w2)?;
        check_device("w2", w2, device)?;

        let tw = a.topk_weights;
        check_ndim("topk_weights", tw, 2, "[M, topk]")?;
        if !tw.dtype.is_float() {
            return Err(Error::DType(format!(
                "topk_weights: expected float32, bfloat16 or float16, got {}",
                tw.dtype.name()
            )));
        }
        let topk = tw.shape[1];
        if tw.shape[0] != m || topk < 1 {
            return Err(Error::Shape(format!(
                "topk_weights: expected shape [M, topk] with M = {m} (hidden_states.shape[0]) and topk >= 1, got {}",
                dims(&tw.shape)
            )));
        }
        check_last_contiguous("topk_weights", tw)?;
        check_device("topk_weights", tw, device)?;

        let ids = a.topk_ids;
        check_ndim("topk_ids", ids, 2, "[M, topk]")?;
        if !matches!(ids.dtype, DType::I32 | DType::I64) {
            return Err(Error::DType(format!(
                "topk_ids: expected int32 or int64, got {}",
                ids.dtype.name()
            )));
        }
        check_shape("topk_ids", ids, &[m, topk], "(the shape of topk_weights)")?;
        check_last_contiguous("topk_ids", ids)?;
        check_device("topk_ids", ids, device)?;

        let out = a.out;
        check_ndim("out", out, 2, "[M, K]")?;
        if out.dtype != h.dtype {
            return Err(Error::DType(format!(
                "out: expected {} (the dtype of hidden_states), got {}",
                h.dtype.name(),
                out.dtype.name()
            )));
        }
        check_shape("out", out, &[m, k], "(the shape of hidden_states)")?;
        check_last_contiguous("out", out)?;
        if m > 1 && k > 0 && out.strides[0] < k {
            return Err(Error::Shape(format!(
                "out: expected rows that do not overlap (row stride >= K = {k}), got row stride {}",
                out.strides[0]
            )));
        }
        check_device("out", out, device)?;
        if out.read_only {
            return Err(Error::Argument(
                "out: expected a writable tensor, got a read-only one".into(),
            ));
        }
        // out may be hidden_states (each row is read before it is written), but no input that
        // is read while out is written: w2, the router weights and ids, the map, the scales
        let q = &a.quant;
        let read = [
            ("w1", Some(a.w1)),
            ("w2", Some(a.w2)),
            ("topk_weights", Some(a.topk_weights)),
            ("topk_ids", Some(a.topk_ids)),
            ("expert_map", a.expert_map),
            ("w1_scale", q.w1_scale),
            ("w2_scale", q.w2_scale),
            ("a1_scale", q.a1_scale),
            ("a2_scale", q.a2_scale),
        ];
        check_out_overlaps(out, &read)?;

        let global = match a.expert_map {
            Some(map) => {
                check_ndim("expert_map", map, 1, "[global_num_experts]")?;
                if map.dtype != DType::I32 {
                    return Err(Error::DType(format!(
                        "expert_map: expected int32, got {}",
                        map.dtype.name()
                    )));
                }
                check_last_contiguous("expert_map", map)?;
                check_device("expert_map", map, device)?;
                let g = map.shape[0];
                if a.global_num_experts != -1 && a.global_num_experts != g {
                    return Err(Error::Shape(format!(
                        "global_num_experts: expected {g} (expert_map.shape[0]) or -1, got {}",
                        a.global_num_experts
                    )));
                }
                if g < 1 {
                    return Err(Error::Shape(
                        "expert_map: expected at least one entry, got shape [0]".into(),
                    ));
                }
                g
            }
            None => {
                if a.global_num_experts != -1 && a.global_num_experts != e {
                    return Err(Error::Shape(format!(
                        "global_num_experts: expected {e} (w1.shape[0], no expert_map given) or -1, got {}",
                        a.global_num_experts
                    )));
                }
                e
            }
        };

        if a.apply_router_weight_on_input && topk != 1 {
            return Err(Error::Shape(format!(
                "topk_ids: expected topk == 1 when apply_router_weight_on_input=True, got topk = {topk}"
            )));
        }

        let slots = m.checked_mul(topk).unwrap_or(i64::MAX);
        if matches!(device, Device::Cuda(_)) {
            if slots > i32::MAX as i64 || n > i32::MAX as i64 || k > i32::MAX as i64 {
                return Err(Error::Shape(format!(
                    "hidden_states: expected M*topk, N and K below 2^31 on CUDA, got M*topk = {slots}, N = {n}, K = {k}"
                )));
            }
            if e as usize > MAX_GPU_LOCAL_EXPERTS {
                return Err(Error::Shape(format!(
                    "w1: expected at most {MAX_GPU_LOCAL_EXPERTS} local experts on CUDA, got E = {e}"
                )));
            }
            if global > i32::MAX as i64 {
                return Err(Error::Shape(format!(
                    "global_num_experts: expected below 2^31 on CUDA, got {global}"
                )));
            }
        }

        let quant = Fp8Quant::validate(&a.quant, e, n, k, device)?;

        Ok(MoeProblem {
            m: m as usize,
            k: k as usize,
            n: n as usize,
            topk: topk as usize,
            local_experts: e as usize,
            global_experts: global as usize,
            dtype: h.dtype,
            weight_dtype,
            quant,
            topk_weights_dtype: tw.dtype,
            topk_ids_dtype: ids.dtype,
            activation: a.activation,
            apply_router_weight_on_input: a.apply_router_weight_on_input,
            has_expert_map: a.expert_map.is_some(),
            device,
            strides: Strides {
                hidden_row: h.strides[0],
                w1_expert: w1.strides[0],
                w1_row: w1.strides[1],
                w2_expert: w2.strides[0],
                w2_row: w2.strides[1],
                topk_weights_row: tw.strides[0],
                topk_ids_row: ids.strides[0],
                out_row: out.strides[0],
            },
            operands: Operands {
                hidden_states: h.addr,
                w1: w1.addr,
                w2: w2.addr,
                topk_weights: tw.addr,
                topk_ids: ids.addr,
                out: out.addr,
                expert_map: a.expert_map.map(|t| t.addr).unwrap_or(0),
            },
        })
    }

    /// Number of (token, k) slots.
    pub fn slots(&self) -> usize {
        self.m * self.topk
    }

    /// The most local experts this call's slots can reach ([`max_active_experts`]).
    pub fn max_active_experts(&self) -> usize {
        max_active_experts(self.local_experts, self.slots())
    }

    /// Bytes of weights the op must read if `experts_touched` experts are used.
    pub fn weight_bytes(&self, experts_touched: usize) -> usize {
        experts_touched * 3 * self.n * self.k * self.weight_dtype.size()
    }

    /// The FP8 scheme, if any.
    pub fn scheme(&self) -> Option<QuantScheme> {
        self.quant.map(|q| q.scheme)
    }
}

impl fmt::Display for MoeProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MoeProblem(M={}, K={}, N={}, topk={}, E={}, global_E={}, dtype={}{}, act={}, router_weight_on_input={}, expert_map={}, device={})",
            self.m,
            self.k,
            self.n,
            self.topk,
            self.local_experts,
            self.global_experts,
            self.dtype.name(),
            match self.quant {
                Some(q) => format!(", fp8_w8a8={}", q.scheme.name()),
                None => String::new(),
            },
            self.activation.name(),
            self.apply_router_weight_on_input,
            self.has_expert_map,
            self.device
        )
    }
}

/// Byte offsets of the GPU workspace sections. Every section starts on a 256-byte boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspaceLayout {
    /// int32 [S]: local expert of each slot, or -1.
    pub slot_expert: usize,
    /// int32 [E+1]
    pub expert_offsets: usize,
    /// int32 [S]
    pub sorted_slots: usize,
    /// int32 [E]
    pub active_experts: usize,
    /// int32 [1]
    pub num_active: usize,
    /// int32 [max_tiles]: expert of each token tile of the tensor-core GEMMs
    pub tile_expert: usize,
    /// int32 [max_tiles]: first sorted slot of each token tile
    pub tile_start: usize,
    /// int32 [1]
    pub num_tiles: usize,
    /// dtype [S, N]: act(gate) * up (float32 with FP8: quantized as GEMM2 loads it); with
    /// M <= SWAP_MAX_TOKENS at least [min(E, S), M, N] (cuda_wgmma_swap's per-expert rows;
    /// e4m3 with FP8 and a static intermediate scale)
    pub intermediate: usize,
    /// float32 [S, K]: per-slot GEMM2 output, router weight applied
    pub slot_out: usize,
    /// FP8 only (empty otherwise). e4m3 [M, round_up(K, 16)]: the quantized input.
    pub x_q: usize,
    /// float32 [M, groups of K]: the input's scales (one per token, or per 128 columns).
    pub x_scale: usize,
    /// float32 [FP8_AMAX_PARTIALS]: partial absmax of the input (dynamic per-tensor).
    pub x_partials: usize,
    /// float32 [S, groups of N]: absmax of the intermediate (per tensor: element 0); in
    /// cuda_wgmma with 128x128 blocks, the intermediate's group scales by sorted position.
    pub inter_amax: usize,
    /// FP8 only. e4m3 [S, N]: the intermediate in sorted order, quantized for cuda_wgmma's
    /// GEMM2 (by its GEMM1 with a static scale or block scales, else by the
    /// quantize-intermediate kernel).
    pub inter_q: usize,
    pub total: usize,
}

/// Byte offsets of `fused_moe`'s router outputs in a caller-owned workspace
/// (`WorkspaceLayout::routing_tail`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutingTail {
    /// float32 [M, topk]: the router weights
    pub weights: usize,
    /// int32 [M, topk]: the expert ids
    pub ids: usize,
    /// bytes of the whole workspace, the experts' sections included
    pub total: usize,
}

/// Alignment of every workspace section, and of a caller-owned workspace's address.
pub const WS_ALIGN: usize = 256;
/// Smallest token tile of the tensor-core kernels (sizes the tile lists).
pub const MIN_TOKEN_TILE: usize = 16;
/// CTAs of the dynamic per-tensor input absmax kernel (`kAmaxPartials` in cuda/generic_moe.cu).
pub const FP8_AMAX_PARTIALS: usize = 128;

/// The most of `local_experts` experts that `slots` (token, k) slots can reach: each slot
/// names one expert. Bounds the per-expert grid rows and buffers.
pub fn max_active_experts(local_experts: usize, slots: usize) -> usize {
    local_experts.min(slots)
}

/// `x` rounded up to WS_ALIGN; usize::MAX where that overflows.
fn align_up(x: usize) -> usize {
    x.div_ceil(WS_ALIGN).saturating_mul(WS_ALIGN)
}

/// The product of `xs`, usize::MAX where it overflows (the layout's sizes saturate: a
/// workspace that cannot exist is never sized by a wrapped product).
fn size(xs: &[usize]) -> usize {
    xs.iter().fold(1usize, |a, &x| a.saturating_mul(x))
}

impl WorkspaceLayout {
    /// Layout for `slots` = M*topk slots. `elem_size` is the activation dtype's size.
    pub fn new(slots: usize, local_experts: usize, n: usize, k: usize, elem_size: usize) -> Self {
        let m = if slots == 0 { 0 } else { 1 };
        Self::with_quant(m, slots.max(m), local_experts, n, k, elem_size, None)
    }

    /// Layout for M tokens and `slots_per_token` = topk, with the FP8 sections of `quant`.
    pub fn with_quant(
        m: usize,
        topk: usize,
        local_experts: usize,
        n: usize,
        k: usize,
        elem_size: usize,
        quant: Option<QuantScheme>,
    ) -> Self {
        let slots = m.saturating_mul(topk);
        let mut at = 0usize;
        let mut take = |bytes: usize| {
            let start = at;
            at = align_up(at.saturating_add(bytes));
            start
        };
        let slot_expert = take(size(&[4, slots]));
        let expert_offsets = take(size(&[4, local_experts.saturating_add(1)]));
        let sorted_slots = take(size(&[4, slots]));
        let active_experts = take(size(&[4, local_experts]));
        let num_active = take(4);
        let tiles = Self::max_tiles(slots, local_experts, MIN_TOKEN_TILE);
        let tile_expert = take(size(&[4, tiles]));
        let tile_start = take(size(&[4, tiles]));
        let num_tiles = take(4);
        let inter_elem = if quant.is_some() { 4 } else { elem_size };
        // The swap-AB decode path keeps one row per (active expert, token) instead:
        // min(E, S) x M x N in the activation dtype, or in e4m3 (per-tensor FP8 with a
        // static intermediate scale; the other FP8 schemes keep the f32 rows per slot).
        let swap_rows = if m <= crate::oracle::SWAP_MAX_TOKENS {
            size(&[max_active_experts(local_experts, slots), m])
        } else {
            0
        };
        let swap_elem = match quant {
            None => elem_size,
            Some(QuantScheme::Tensor) => 1,
            Some(_) => 0,
        };
        let intermediate =
            take(size(&[inter_elem, slots, n]).max(size(&[swap_elem, swap_rows, n])));
        let slot_out = take(size(&[4, slots, k]));
        let (xq, xs, xp, ia, iq) = match quant {
            Some(q) => (
                size(&[m, k.div_ceil(16), 16]),
                size(&[4, m, q.groups(k)]),
                4 * FP8_AMAX_PARTIALS,
                size(&[4, slots.max(1), q.groups(n)]),
                // cuda_wgmma's e4m3 intermediate (it runs every scheme)
                size(&[slots, n]),
            ),
            None => (0, 0, 0, 0, 0),
        };
        let x_q = take(xq);
        let x_scale = take(xs);
        let x_partials = take(xp);
        let inter_amax = take(ia);
        let inter_q = take(iq);
        WorkspaceLayout {
            slot_expert,
            expert_offsets,
            sorted_slots,
            active_experts,
            num_active,
            tile_expert,
            tile_start,
            num_tiles,
            intermediate,
            slot_out,
            x_q,
            x_scale,
            x_partials,
            inter_amax,
            inter_q,
            total: at,
        }
    }

    /// Upper bound on the token tiles of `tile_tokens` slots: every active expert (at most
    /// min(E, S)) leaves at most one partial tile.
    pub fn max_tiles(slots: usize, local_experts: usize, tile_tokens: usize) -> usize {
        slots
            .div_ceil(tile_tokens.max(1))
            .saturating_add(max_active_experts(local_experts, slots))
    }

    /// Whether the layout's size overflowed (its `total` saturated): no buffer can hold it.
    pub fn overflows(&self) -> bool {
        self.total == usize::MAX
    }

    /// The error for a call whose workspace size overflows (`overflows`).
    pub fn overflow_error(m: usize, topk: usize, n: usize, k: usize, experts: usize) -> Error {
        Error::Memory(format!(
            "workspace: the call needs more than 2^64 bytes (M = {m}, topk = {topk}, N = {n}, K = {k}, E = {experts}); split M into smaller calls"
        ))
    }

    /// Where `fused_moe` keeps the router's outputs when the caller gives no tensors for
    /// them (a caller-owned workspace: CuPy under graph capture, other DLPack producers):
    /// after the experts' sections, float32 weights [M, topk], then int32 ids [M, topk].
    /// `total` saturates to usize::MAX where the size overflows.
    pub fn routing_tail(&self, m: usize, topk: usize) -> RoutingTail {
        let bytes = size(&[4, m, topk]);
        let weights = self.total;
        let ids = align_up(weights.saturating_add(bytes));
        RoutingTail {
            weights,
            ids,
            total: align_up(ids.saturating_add(bytes)),
        }
    }

    /// `overflow_error` for a problem's sizes.
    pub fn problem_overflow_error(p: &MoeProblem) -> Error {
        Self::overflow_error(p.m, p.topk, p.n, p.k, p.local_experts)
    }

    pub fn for_problem(p: &MoeProblem) -> Self {
        Self::with_quant(
            p.m,
            p.topk,
            p.local_experts,
            p.n,
            p.k,
            p.dtype.size(),
            p.scheme(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlpack_dtypes_are_named_as_the_libraries_name_them() {
        let name = |code, bits| DType::Other(code, bits).name();
        assert_eq!(name(2, 64), "float64");
        assert_eq!(name(5, 64), "complex64");
        assert_eq!(name(5, 128), "complex128");
        assert_eq!(name(0, 8), "int8");
        assert_eq!(name(1, 16), "uint16");
        assert_eq!(name(4, 32), "bfloat32");
        assert_eq!(name(6, 8), "bool");
        assert_eq!(name(12, 8), "float8_e5m2");
        assert_eq!(name(14, 8), "float8_e8m0fnu");
        assert_eq!(name(17, 4), "float4_e2m1fn");
        assert_eq!(name(17, 8), "float4_e2m1fn (8 bits)");
        assert_eq!(name(3, 64), "opaque handle");
        assert_eq!(name(42, 8), "dlpack(code=42, bits=8)");
    }

    #[test]
    fn workspace_sizes_saturate_instead_of_wrapping() {
        let small = WorkspaceLayout::with_quant(4, 8, 128, 768, 2048, 2, None);
        assert!(!small.overflows() && small.total > 4 * 8 * 2048 * 4);
        // sizes near and past 2^64 (the op's own limits allow each factor): the total is never
        // below the per-slot output's true size, and saturates where the sum passes 2^64
        let (m, topk, nk) = (1usize << 20, 1usize << 10, (1usize << 31) - 1);
        let slot_out = 4 * (m * topk) as u128 * nk as u128;
        for q in [None, Some(QuantScheme::Tensor), Some(QuantScheme::Block)] {
            let huge = WorkspaceLayout::with_quant(m, topk, 8192, nk, nk, 2, q);
            assert!(
                huge.total as u128 >= slot_out.min(usize::MAX as u128),
                "{q:?}"
            );
            assert_eq!(huge.overflows(), q.is_some(), "{q:?}: total {}", huge.total);
        }
        let wider = WorkspaceLayout::with_quant(m, topk, 8192, 4 * nk, nk, 2, None);
        assert!(wider.overflows());
        assert_eq!(
            WorkspaceLayout::max_tiles(usize::MAX, usize::MAX, 1),
            usize::MAX
        );
        let e = WorkspaceLayout::overflow_error(1, 2, 3, 4, 5);
        assert_eq!(e.class_name(), "OutOfMemoryError");
    }

    #[test]
    fn the_routing_tail_follows_the_experts_sections_aligned() {
        let experts = WorkspaceLayout::with_quant(5, 3, 16, 64, 128, 2, None);
        let tail = experts.routing_tail(5, 3);
        assert_eq!(tail.weights, experts.total);
        assert_eq!(tail.weights % WS_ALIGN, 0);
        // 5 x 3 float32 weights round up to one aligned block, then the ids alike
        assert_eq!(tail.ids, tail.weights + WS_ALIGN);
        assert_eq!(tail.total, tail.ids + WS_ALIGN);
        let none = WorkspaceLayout::with_quant(0, 3, 16, 64, 128, 2, None).routing_tail(0, 3);
        assert_eq!((none.ids, none.total), (none.weights, none.weights));
        let nk = (1usize << 31) - 1;
        let huge = WorkspaceLayout::with_quant(1 << 20, 1 << 10, 8192, 4 * nk, nk, 2, None);
        assert!(huge.overflows());
        assert_eq!(huge.routing_tail(1 << 20, 1 << 10).total, usize::MAX);
    }

    #[test]
    fn byte_spans_and_fake_addresses() {
        let dev = Device::Cpu;
        let t = TensorDesc::contiguous(DType::F32, &[3, 4], dev, 1000);
        assert_eq!(t.byte_span(), Some((1000, 1048)));
        let rev = TensorDesc {
            strides: vec![-4, 1],
            ..TensorDesc::contiguous(DType::F32, &[3, 4], dev, 1000)
        };
        assert_eq!(rev.byte_span(), Some((1000 - 32, 1016)));
        assert_eq!(
            TensorDesc::contiguous(DType::F32, &[0, 4], dev, 8).byte_span(),
            None
        );
        // each fake tensor after the last: no two overlap
        let addrs = FakeAddresses::default();
        let (a, b) = (
            addrs.tensor(DType::BF16, &[8, 64], dev),
            addrs.tensor(DType::F32, &[2], dev),
        );
        let ((_, a1), (b0, _)) = (a.byte_span().unwrap(), b.byte_span().unwrap());
        assert!(a1 <= b0 && b0 % 256 == 0);
    }

    #[test]
    fn contiguous_bytes_only_for_compact_row_major_tensors() {
        let dev = Device::Cpu;
        let t = |shape: &[i64], strides: &[i64]| TensorDesc {
            strides: strides.to_vec(),
            ..TensorDesc::contiguous(DType::BF16, shape, dev, 0)
        };
        assert_eq!(
            TensorDesc::contiguous(DType::F32, &[3, 4], dev, 0).contiguous_bytes(),
            Some(48)
        );
        assert_eq!(t(&[3, 1, 4], &[4, 99, 1]).contiguous_bytes(), Some(24)); // size-1 dims: any stride
        assert_eq!(t(&[0, 4], &[4, 1]).contiguous_bytes(), Some(0));
        assert_eq!(t(&[1 << 40], &[0]).contiguous_bytes(), None); // broadcast
        assert_eq!(t(&[3, 4], &[8, 1]).contiguous_bytes(), None); // padded rows
        assert_eq!(t(&[3, 4], &[1, 3]).contiguous_bytes(), None); // transposed
        assert_eq!(t(&[1 << 62, 4], &[4, 1]).contiguous_bytes(), None); // overflows
    }
}
