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
    /// Anything else, kept for the error message: (DLPack type code, bits).
    Other(u8, u8),
}

impl DType {
    pub fn name(&self) -> String {
        match self {
            DType::F32 => "float32".into(),
            DType::BF16 => "bfloat16".into(),
            DType::F16 => "float16".into(),
            DType::I32 => "int32".into(),
            DType::I64 => "int64".into(),
            DType::Other(code, bits) => match (code, bits) {
                (2, 64) => "float64".into(),
                (0, 8) => "int8".into(),
                (0, 16) => "int16".into(),
                (1, 8) => "uint8".into(),
                (6, _) => "bool".into(),
                (10, 8) => "float8_e4m3fn".into(),
                (12, 8) => "float8_e5m2".into(),
                _ => format!("dlpack(code={code}, bits={bits})"),
            },
        }
    }
    pub fn size(&self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::I64 => 8,
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

impl TensorDesc {
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
    /// dtype of hidden_states, w1, w2 and out.
    pub dtype: DType,
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
        if w1.dtype != h.dtype {
            return Err(Error::DType(format!(
                "w1: expected {} (the dtype of hidden_states), got {}",
                h.dtype.name(),
                w1.dtype.name()
            )));
        }
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
        if w2.dtype != h.dtype {
            return Err(Error::DType(format!(
                "w2: expected {} (the dtype of hidden_states), got {}",
                h.dtype.name(),
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

        Ok(MoeProblem {
            m: m as usize,
            k: k as usize,
            n: n as usize,
            topk: topk as usize,
            local_experts: e as usize,
            global_experts: global as usize,
            dtype: h.dtype,
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

    /// Bytes of weights the op must read if `experts_touched` experts are used.
    pub fn weight_bytes(&self, experts_touched: usize) -> usize {
        experts_touched * 3 * self.n * self.k * self.dtype.size()
    }
}

impl fmt::Display for MoeProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MoeProblem(M={}, K={}, N={}, topk={}, E={}, global_E={}, dtype={}, act={}, router_weight_on_input={}, expert_map={}, device={})",
            self.m,
            self.k,
            self.n,
            self.topk,
            self.local_experts,
            self.global_experts,
            self.dtype.name(),
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
    /// dtype [S, N]: act(gate) * up
    pub intermediate: usize,
    /// float32 [S, K]: per-slot GEMM2 output, router weight applied
    pub slot_out: usize,
    pub total: usize,
}

const WS_ALIGN: usize = 256;
/// Smallest token tile of the tensor-core kernels (sizes the tile lists).
pub const MIN_TOKEN_TILE: usize = 16;

fn align_up(x: usize) -> usize {
    x.div_ceil(WS_ALIGN) * WS_ALIGN
}

impl WorkspaceLayout {
    /// Layout for `slots` = M*topk slots. `elem_size` is the activation dtype's size.
    pub fn new(slots: usize, local_experts: usize, n: usize, k: usize, elem_size: usize) -> Self {
        let mut at = 0usize;
        let mut take = |bytes: usize| {
            let start = at;
            at = align_up(at + bytes);
            start
        };
        let slot_expert = take(4 * slots);
        let expert_offsets = take(4 * (local_experts + 1));
        let sorted_slots = take(4 * slots);
        let active_experts = take(4 * local_experts);
        let num_active = take(4);
        let tiles = Self::max_tiles(slots, local_experts, MIN_TOKEN_TILE);
        let tile_expert = take(4 * tiles);
        let tile_start = take(4 * tiles);
        let num_tiles = take(4);
        let intermediate = take(elem_size * slots * n);
        let slot_out = take(4 * slots * k);
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
            total: at,
        }
    }

    /// Upper bound on the token tiles of `tile_tokens` slots: every active expert (at most
    /// min(E, S)) leaves at most one partial tile.
    pub fn max_tiles(slots: usize, local_experts: usize, tile_tokens: usize) -> usize {
        slots.div_ceil(tile_tokens.max(1)) + local_experts.min(slots)
    }

    pub fn for_problem(p: &MoeProblem) -> Self {
        Self::new(p.slots(), p.local_experts, p.n, p.k, p.dtype.size())
    }
}
