//! The backend oracle: (problem, device) -> Plan. Every choice of backend, kernel variant
//! and tile lives here, with a one-line reason; launch code only carries a plan out.

use crate::error::{Error, Result};
use crate::problem::{DType, Device, MoeProblem, QuantScheme};
use std::fmt;

/// Output rows per CTA of the generic GEMM kernels (`kRows` in cuda/generic_moe.cu).
pub const GENERIC_ROWS_PER_CTA: usize = 8;
/// Tokens a generic GEMM warp computes per pass over a weight row (`kTok`).
pub const GENERIC_TOKENS_PER_PASS: usize = 4;
/// Output rows per CTA of the decode kernels (`kRows` in cuda/decode_moe.cu).
pub const DECODE_ROWS_PER_CTA: usize = 8;
/// Slots a decode warp computes per pass over a weight row (`kTok` in cuda/decode_moe.cu).
pub const DECODE_TOKENS_PER_PASS: usize = 4;
/// Largest M*topk the decode kernels hold in shared memory (`kMaxSlots`).
pub const DECODE_MAX_SLOTS: usize = 512;
/// Largest M*topk for which the heuristic picks the decode kernels. Measured on the H200
/// (benches/NOTES.md, v3): at M*topk = 64 the tensor-core path is 1.1-1.5x faster.
pub const DECODE_HEURISTIC_MAX_SLOTS: usize = 32;
/// Largest expected slots per active expert for the decode kernels: their GEMM2 reads a
/// slot's weight rows once per slot, not once per expert.
pub const DECODE_HEURISTIC_MAX_SLOTS_PER_EXPERT: f64 = 2.0;
/// Weight rows per CTA of the tensor-core kernels (`kBM` in cuda/sm80_mma_moe.cu); GEMM1
/// takes 64 gate rows and their 64 up rows.
pub const MMA_ROWS_PER_CTA: usize = 128;
/// Dynamic shared memory of a tensor-core kernel with token tile `bn`: 3 stages of a
/// 128 x 64 weight tile and a bn x 64 token tile (`kStages`, `kBK`).
pub fn mma_smem_bytes(bn: usize) -> usize {
    3 * (MMA_ROWS_PER_CTA * 64 * 2 + bn * 64 * 2)
}
/// Token tiles the tensor-core kernels are built for.
pub const MMA_TOKEN_TILES: [usize; 3] = [16, 64, 128];
/// Smallest compute capability the FP8 path runs on (Ada, Hopper and later).
pub const FP8_MIN_CAPABILITY: (i32, i32) = (8, 9);
/// Threads of the routing-alignment CTA (`kThreads` in cuda/route_align.cu).
pub const ROUTE_ALIGN_THREADS: usize = 1024;
/// Threads per CTA of the top-k reduction.
pub const REDUCE_THREADS: usize = 256;

/// What the driver tells us about a device, or what an offline question assumes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    pub name: String,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
    pub sm_count: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The Rust reference path (rayon) for CPU tensors.
    Cpu,
    /// The generic CUDA kernels (cuda/generic_moe.cu): any dtype and shape, sm_80+.
    CudaGeneric,
    /// The two-launch decode kernels (cuda/decode_moe.cu): routing fused into both GEMMs,
    /// top-k sum fused into GEMM2; for M*topk <= DECODE_MAX_SLOTS.
    CudaDecode,
    /// Tensor-core grouped GEMMs (cuda/sm80_mma_moe.cu, mma.sync, sm_80+): bf16/fp16 with
    /// K and N multiples of 8, for many tokens per expert.
    CudaMma,
}

impl Backend {
    pub const ALL: [Backend; 4] = [
        Backend::Cpu,
        Backend::CudaGeneric,
        Backend::CudaDecode,
        Backend::CudaMma,
    ];

    pub fn parse(s: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == s)
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::CudaGeneric => "cuda_generic",
            Backend::CudaDecode => "cuda_decode",
            Backend::CudaMma => "cuda_mma",
        }
    }
}

/// The kernels of the library, by role and variant. `symbol()` is the exported name in
/// the embedded fatbin; `index()` is the slot in each device's function cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    RouteAlign,
    /// (dtype, vector width in elements)
    GenericGemm1Act(DType, usize),
    GenericGemm2(DType, usize),
    GenericTopkReduce(DType),
    DecodeGemm1Act(DType, usize),
    DecodeGemm2Sum(DType, usize),
    /// (bf16 or fp16, token tile)
    MmaGemm1Act(DType, usize),
    MmaGemm2(DType, usize),
    /// Router (cuda/route_topk.cu), by logits dtype.
    RouteTopk(DType),
    /// FP8 W8A8 (cuda/generic_moe.cu): hidden states (by dtype) to e4m3 plus scales.
    Fp8QuantX(DType),
    /// FP8: partial absmax of the hidden states, for a dynamic per-tensor scale.
    Fp8AbsmaxPartials(DType),
    /// FP8 GEMMs: (scheme, vector width in e4m3 elements: 1 or 16); GEMM2 of the decode
    /// path also by output dtype.
    DecodeFp8Gemm1(QuantScheme, usize),
    DecodeFp8Gemm2Sum(DType, QuantScheme, usize),
    GenericFp8Gemm1(QuantScheme, usize),
    GenericFp8Gemm2(QuantScheme, usize),
}

const FP8_SCHEMES: [QuantScheme; 3] = [
    QuantScheme::Tensor,
    QuantScheme::Channel,
    QuantScheme::Block,
];
/// Vector width of the FP8 GEMMs' 16-byte loads, in e4m3 elements.
pub const FP8_VEC: usize = 16;

const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

fn mma_slot(d: DType, tile: usize) -> usize {
    let t = MMA_TOKEN_TILES.iter().position(|x| *x == tile).unwrap_or(0);
    t + 3 * usize::from(d == DType::F16)
}

fn fp8_slot(q: QuantScheme, v: usize) -> usize {
    2 * q.code() as usize + usize::from(v > 1)
}

fn dtype_index(d: DType) -> usize {
    FLOAT_DTYPES.iter().position(|x| *x == d).unwrap_or(0)
}

/// Widest vector (16 bytes) for a dtype.
pub fn vector_width(d: DType) -> usize {
    16 / d.size().max(1)
}

impl KernelId {
    pub const COUNT: usize =
        1 + 3 * 2 + 3 * 2 + 3 + 3 * 2 + 3 * 2 + 2 * 3 * 2 + 3 + 3 + 3 + 3 * 2 * 3 + 3 * 3 * 2;

    pub fn module(&self) -> &'static str {
        match self {
            KernelId::RouteAlign => "route_align",
            KernelId::DecodeGemm1Act(..)
            | KernelId::DecodeGemm2Sum(..)
            | KernelId::DecodeFp8Gemm1(..)
            | KernelId::DecodeFp8Gemm2Sum(..) => "decode_moe",
            KernelId::MmaGemm1Act(..) | KernelId::MmaGemm2(..) => "sm80_mma_moe",
            KernelId::RouteTopk(..) => "route_topk",
            _ => "generic_moe",
        }
    }

    pub fn symbol(&self) -> String {
        match *self {
            KernelId::RouteAlign => "swapmoe_route_align".into(),
            KernelId::GenericGemm1Act(d, v) => format!("generic_moe_gemm1_act_{}_v{v}", d.suffix()),
            KernelId::GenericGemm2(d, v) => format!("generic_moe_gemm2_{}_v{v}", d.suffix()),
            KernelId::GenericTopkReduce(d) => format!("generic_moe_topk_reduce_{}", d.suffix()),
            KernelId::DecodeGemm1Act(d, v) => format!("decode_moe_gemm1_act_{}_v{v}", d.suffix()),
            KernelId::DecodeGemm2Sum(d, v) => format!("decode_moe_gemm2_sum_{}_v{v}", d.suffix()),
            KernelId::MmaGemm1Act(d, t) => format!("sm80_moe_gemm1_act_{}_t{t}", d.suffix()),
            KernelId::MmaGemm2(d, t) => format!("sm80_moe_gemm2_{}_t{t}", d.suffix()),
            KernelId::RouteTopk(d) => format!("swapmoe_route_topk_{}", d.suffix()),
            KernelId::Fp8QuantX(d) => format!("swapmoe_fp8_quant_x_{}", d.suffix()),
            KernelId::Fp8AbsmaxPartials(d) => format!("swapmoe_fp8_absmax_{}", d.suffix()),
            KernelId::DecodeFp8Gemm1(q, v) => format!("decode_moe_fp8_gemm1_{}_v{v}", q.name()),
            KernelId::DecodeFp8Gemm2Sum(d, q, v) => {
                format!("decode_moe_fp8_gemm2_sum_{}_{}_v{v}", d.suffix(), q.name())
            }
            KernelId::GenericFp8Gemm1(q, v) => format!("generic_moe_fp8_gemm1_{}_v{v}", q.name()),
            KernelId::GenericFp8Gemm2(q, v) => format!("generic_moe_fp8_gemm2_{}_v{v}", q.name()),
        }
    }

    pub fn index(&self) -> usize {
        let vec_slot = |d: DType, v: usize| usize::from(v > 1) + 2 * dtype_index(d);
        match *self {
            KernelId::RouteAlign => 0,
            KernelId::GenericGemm1Act(d, v) => 1 + vec_slot(d, v),
            KernelId::GenericGemm2(d, v) => 7 + vec_slot(d, v),
            KernelId::GenericTopkReduce(d) => 13 + dtype_index(d),
            KernelId::DecodeGemm1Act(d, v) => 16 + vec_slot(d, v),
            KernelId::DecodeGemm2Sum(d, v) => 22 + vec_slot(d, v),
            KernelId::MmaGemm1Act(d, t) => 28 + mma_slot(d, t),
            KernelId::MmaGemm2(d, t) => 34 + mma_slot(d, t),
            KernelId::RouteTopk(d) => 40 + dtype_index(d),
            KernelId::Fp8QuantX(d) => 43 + dtype_index(d),
            KernelId::Fp8AbsmaxPartials(d) => 46 + dtype_index(d),
            KernelId::DecodeFp8Gemm1(q, v) => 49 + fp8_slot(q, v),
            KernelId::GenericFp8Gemm1(q, v) => 55 + fp8_slot(q, v),
            KernelId::GenericFp8Gemm2(q, v) => 61 + fp8_slot(q, v),
            KernelId::DecodeFp8Gemm2Sum(d, q, v) => 67 + 6 * dtype_index(d) + fp8_slot(q, v),
        }
    }

    /// Every kernel the library can launch (for warm-up and tests).
    pub fn all() -> Vec<KernelId> {
        let mut v = vec![KernelId::RouteAlign];
        for d in FLOAT_DTYPES {
            for w in [1, vector_width(d)] {
                v.push(KernelId::GenericGemm1Act(d, w));
                v.push(KernelId::GenericGemm2(d, w));
                v.push(KernelId::DecodeGemm1Act(d, w));
                v.push(KernelId::DecodeGemm2Sum(d, w));
            }
            v.push(KernelId::GenericTopkReduce(d));
            v.push(KernelId::RouteTopk(d));
        }
        for d in [DType::BF16, DType::F16] {
            for t in MMA_TOKEN_TILES {
                v.push(KernelId::MmaGemm1Act(d, t));
                v.push(KernelId::MmaGemm2(d, t));
            }
        }
        for d in FLOAT_DTYPES {
            v.push(KernelId::Fp8QuantX(d));
            v.push(KernelId::Fp8AbsmaxPartials(d));
        }
        for q in FP8_SCHEMES {
            for w in [1, FP8_VEC] {
                v.push(KernelId::DecodeFp8Gemm1(q, w));
                v.push(KernelId::GenericFp8Gemm1(q, w));
                v.push(KernelId::GenericFp8Gemm2(q, w));
                for d in FLOAT_DTYPES {
                    v.push(KernelId::DecodeFp8Gemm2Sum(d, q, w));
                }
            }
        }
        v
    }
}

/// What one call runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub backend: Backend,
    /// GPU kernels in launch order (empty for the CPU backend).
    pub kernels: Vec<KernelId>,
    /// Vector width (elements) of the GEMM1 and GEMM2 loads.
    pub gemm1_vec: usize,
    pub gemm2_vec: usize,
    pub rows_per_cta: usize,
    pub tokens_per_pass: usize,
    /// Launch with programmatic dependent launch (sm_90+).
    pub pdl: bool,
    /// Why each choice was made or each candidate rejected.
    pub reasons: Vec<String>,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Plan(backend={}", self.backend.name())?;
        if self.backend != Backend::Cpu {
            let names: Vec<String> = self.kernels.iter().map(|k| k.symbol()).collect();
            write!(
                f,
                ", kernels=[{}], rows_per_cta={}, tokens_per_pass={}",
                names.join(", "),
                self.rows_per_cta,
                self.tokens_per_pass
            )?;
        }
        write!(f, ")")
    }
}

fn aligned(addr: usize, bytes: usize) -> bool {
    addr % bytes == 0
}

/// Environment variable that forces a backend for every call (`cpu` is implied by CPU
/// tensors; `cuda_generic` or `cuda_decode` for CUDA tensors).
pub const BACKEND_ENV: &str = "SWAPMOE_BACKEND";

/// The backend forced by the `backend=` argument, else by `$SWAPMOE_BACKEND`.
pub fn forced_backend(argument: Option<&str>) -> Result<Option<Backend>> {
    let env = std::env::var(BACKEND_ENV).ok().filter(|v| !v.is_empty());
    let (source, value) = match (argument, env.as_deref()) {
        (Some(a), _) => ("backend", a.to_string()),
        (None, Some(e)) => (BACKEND_ENV, e.to_string()),
        (None, None) => return Ok(None),
    };
    match Backend::parse(&value) {
        Some(b) => Ok(Some(b)),
        None => {
            let names: Vec<&str> = Backend::ALL.iter().map(|b| b.name()).collect();
            Err(Error::Argument(format!(
                "{source}: expected one of {names:?}, got {value:?}"
            )))
        }
    }
}

/// `plan`, honouring a forced backend: it must be able to run the problem.
pub fn plan_with(
    p: &MoeProblem,
    caps: Option<&DeviceCaps>,
    forced: Option<Backend>,
) -> Result<Plan> {
    if let (Some(q), Some(c)) = (p.quant, caps) {
        if c.capability < FP8_MIN_CAPABILITY && p.device != Device::Cpu {
            return Err(Error::Argument(format!(
                "use_fp8_w8a8: FP8 ({}) needs compute capability >= 8.9 (sm_89, native e4m3 conversions), got {} (sm_{}{})",
                q.scheme.name(),
                c.name,
                c.capability.0,
                c.capability.1
            )));
        }
    }
    let Some(want) = forced else {
        return Ok(plan(p, caps));
    };
    let mut c = Candidates::new(p, caps);
    if let Err(why) = c.eligible(want) {
        return Err(Error::Argument(format!(
            "backend: {} cannot run {p}: {why}; the heuristic choice is {}",
            want.name(),
            plan(p, caps).backend.name()
        )));
    }
    c.reasons.push(format!(
        "override: {} forced by the backend argument or ${BACKEND_ENV}",
        want.name()
    ));
    Ok(c.build(want))
}

/// Picks the backend and kernel variants for a validated problem.
pub fn plan(p: &MoeProblem, caps: Option<&DeviceCaps>) -> Plan {
    let mut c = Candidates::new(p, caps);
    if p.device == Device::Cpu {
        c.reasons
            .push("cpu: the tensors are on the CPU, so the rayon reference path runs".into());
        return c.build(Backend::Cpu);
    }
    let slots = p.slots();
    let per_expert = expected_slots_per_expert(slots, p.local_experts);
    if slots <= DECODE_HEURISTIC_MAX_SLOTS && per_expert <= DECODE_HEURISTIC_MAX_SLOTS_PER_EXPERT {
        c.reasons.push(format!(
            "cuda_decode: M*topk = {slots} <= {DECODE_HEURISTIC_MAX_SLOTS} and ~{per_expert:.1} slots per expert, so each GEMM CTA routes for itself and GEMM2 sums over top-k: 2 launches instead of 4"
        ));
        return c.build(Backend::CudaDecode);
    }
    c.reasons.push(format!(
        "cuda_decode: rejected, M*topk = {slots} (limit {DECODE_HEURISTIC_MAX_SLOTS}) with ~{per_expert:.1} slots per expert (limit {DECODE_HEURISTIC_MAX_SLOTS_PER_EXPERT}): its GEMM2 would re-read weight rows per slot"
    ));
    if p.quant.is_some() {
        c.reasons
            .push("cuda_mma: rejected, it has no FP8 kernels in this build".into());
        c.reasons.push(
            "cuda_generic: the FP8 path for every M beyond decode (SIMT, e4m3 weights as 16-byte vectors)".into(),
        );
        return c.build(Backend::CudaGeneric);
    }
    match c.eligible(Backend::CudaMma) {
        Ok(()) => {
            c.reasons.push(format!(
                "cuda_mma: {:.1} slots per active expert on average, so tensor cores pay; token tile {}",
                c.slots_per_expert(),
                c.mma_token_tile()
            ));
            c.build(Backend::CudaMma)
        }
        Err(why) => {
            c.reasons.push(format!("cuda_mma: rejected, {why}"));
            c.reasons
                .push("cuda_generic: the fallback for every dtype and shape".into());
            c.build(Backend::CudaGeneric)
        }
    }
}

/// Whether the router kernel is launched with programmatic dependent launch, so that it
/// and the experts kernels after it overlap their start-up (sm_90+).
pub fn router_uses_pdl(caps: &DeviceCaps) -> bool {
    caps.capability.0 >= 9
}

/// Devices the oracle knows by name, for offline questions ("what would an H200 do?"):
/// (name, compute capability, SM count).
pub const KNOWN_DEVICES: &[(&str, (i32, i32), i32)] = &[
    ("NVIDIA H200", (9, 0), 132),
    ("NVIDIA H100 80GB HBM3", (9, 0), 132),
    ("NVIDIA H100 PCIe", (9, 0), 114),
    ("NVIDIA A100-SXM4-80GB", (8, 0), 108),
    ("NVIDIA A100-SXM4-40GB", (8, 0), 108),
    ("NVIDIA L40S", (8, 9), 142),
];

/// Device capabilities from a name and/or a compute capability. A known name fills in what
/// is missing; an unknown name needs the capability.
pub fn offline_caps(
    name: Option<&str>,
    capability: Option<(i32, i32)>,
    sm_count: Option<i32>,
) -> Result<DeviceCaps> {
    let known = name.and_then(|n| KNOWN_DEVICES.iter().find(|d| d.0.eq_ignore_ascii_case(n)));
    let capability = match (capability, known) {
        (Some(c), _) => c,
        (None, Some(d)) => d.1,
        (None, None) => {
            let names: Vec<&str> = KNOWN_DEVICES.iter().map(|d| d.0).collect();
            return Err(Error::Argument(format!(
                "device_capability: expected (major, minor) for device {:?}, or a known device_name: one of {names:?}",
                name.unwrap_or("<none>")
            )));
        }
    };
    Ok(DeviceCaps {
        name: name.unwrap_or("(offline)").to_string(),
        capability,
        sm_count: sm_count.or(known.map(|d| d.2)).unwrap_or(132),
    })
}

/// The plan for a shape alone (contiguous, 16-byte aligned tensors on a CUDA device), for
/// `swapmoe.select_backend` and `swapmoe explain`. With `quant`, the weights are e4m3 with
/// that scheme's scales; a per-tensor question assumes static activation scales (as FP8
/// checkpoints ship them).
#[allow(clippy::too_many_arguments)]
pub fn plan_for_shape(
    num_tokens: i64,
    num_experts: i64,
    top_k: i64,
    hidden_size: i64,
    intermediate_size: i64,
    dtype: DType,
    quant: Option<QuantScheme>,
    caps: &DeviceCaps,
    forced: Option<Backend>,
) -> Result<Plan> {
    use crate::problem::{Activation, MoeArgs, QuantArgs, TensorDesc};
    let dev = Device::Cuda(0);
    let t = |d, shape: &[i64]| TensorDesc::contiguous(d, shape, dev, 1 << 20);
    let (m, e, k, n) = (num_tokens, num_experts, hidden_size, intermediate_size);
    if m < 0 || e < 1 || top_k < 1 || top_k > e || k < 1 || n < 1 {
        return Err(Error::Shape(format!(
            "select_backend: expected num_tokens >= 0, num_experts >= 1, 1 <= top_k <= num_experts, hidden_size >= 1 and intermediate_size >= 1, got {m}, {e}, {top_k}, {k}, {n}"
        )));
    }
    let wd = if quant.is_some() {
        DType::F8E4M3
    } else {
        dtype
    };
    let (h, w1, w2) = (t(dtype, &[m, k]), t(wd, &[e, 2 * n, k]), t(wd, &[e, k, n]));
    let (tw, ids) = (t(DType::F32, &[m, top_k]), t(DType::I32, &[m, top_k]));
    let b = crate::problem::FP8_BLOCK as i64;
    let (s1, s2) = match quant {
        Some(QuantScheme::Block) => (
            vec![e, (2 * n + b - 1) / b, (k + b - 1) / b],
            vec![e, (k + b - 1) / b, (n + b - 1) / b],
        ),
        Some(QuantScheme::Channel) => (vec![e, 2 * n], vec![e, k]),
        _ => (vec![e], vec![e]),
    };
    let (w1s, w2s, a_s) = (t(DType::F32, &s1), t(DType::F32, &s2), t(DType::F32, &[1]));
    let block = [b, b];
    let static_act = quant == Some(QuantScheme::Tensor);
    let q = QuantArgs {
        use_fp8_w8a8: quant.is_some(),
        per_channel_quant: quant == Some(QuantScheme::Channel),
        block_shape: (quant == Some(QuantScheme::Block)).then_some(&block[..]),
        w1_scale: quant.map(|_| &w1s),
        w2_scale: quant.map(|_| &w2s),
        a1_scale: static_act.then_some(&a_s),
        a2_scale: static_act.then_some(&a_s),
    };
    let p = MoeProblem::new(&MoeArgs {
        hidden_states: &h,
        w1: &w1,
        w2: &w2,
        topk_weights: &tw,
        topk_ids: &ids,
        out: &h,
        expert_map: None,
        activation: Activation::Silu,
        apply_router_weight_on_input: false,
        global_num_experts: -1,
        quant: q,
    })?;
    plan_with(&p, Some(caps), forced)
}

/// Expected slots per distinct expert when `slots` ids fall uniformly on `experts`
/// (the host cannot look at the ids without a sync).
pub fn expected_slots_per_expert(slots: usize, experts: usize) -> f64 {
    if slots == 0 || experts == 0 {
        return 0.0;
    }
    let e = experts as f64;
    let distinct = e * (1.0 - (1.0 - 1.0 / e).powi(slots.min(i32::MAX as usize) as i32));
    slots as f64 / distinct.max(1.0)
}

/// What the oracle knows about one problem while it decides.
struct Candidates<'a> {
    p: &'a MoeProblem,
    pdl_ok: bool,
    gemm1_vec: usize,
    gemm2_vec: usize,
    reasons: Vec<String>,
}

impl<'a> Candidates<'a> {
    fn new(p: &'a MoeProblem, caps: Option<&DeviceCaps>) -> Self {
        let mut reasons = Vec::new();
        if let Some(c) = caps {
            reasons.push(format!(
                "device: {} (sm_{}{}, {} SMs)",
                c.name, c.capability.0, c.capability.1, c.sm_count
            ));
        }
        let d = p.dtype;
        let fp8 = p.quant.is_some();
        // FP8 GEMM1 reads the quantized input from the workspace, not hidden_states.
        let w = if fp8 { FP8_VEC } else { vector_width(d) } as i64;
        let s = &p.strides;
        let o = &p.operands;
        let gemm1_ok = p.k as i64 % w == 0
            && (fp8 || s.hidden_row % w == 0)
            && s.w1_expert % w == 0
            && s.w1_row % w == 0
            && (fp8 || aligned(o.hidden_states, 16))
            && aligned(o.w1, 16);
        let gemm2_ok =
            p.n as i64 % w == 0 && s.w2_expert % w == 0 && s.w2_row % w == 0 && aligned(o.w2, 16);
        if p.device != Device::Cpu {
            if let Some(q) = p.quant {
                reasons.push(format!(
                    "fp8: W8A8 e4m3, {} scales, input scale {}, intermediate scale {}",
                    q.scheme.name(),
                    if q.a1_scale != 0 { "static" } else { "dynamic" },
                    if q.a2_scale != 0 { "static" } else { "dynamic" }
                ));
            }
            reasons.push(if gemm1_ok {
                format!("gemm1: 16-byte loads, K and the hidden_states/w1 strides are multiples of {w}")
            } else {
                format!(
                    "gemm1: scalar loads, K={} or a hidden_states/w1 stride or address is not a multiple of {w} elements",
                    p.k
                )
            });
            reasons.push(if gemm2_ok {
                format!("gemm2: 16-byte loads, N and the w2 strides are multiples of {w}")
            } else {
                format!("gemm2: scalar loads, N={} or a w2 stride or address is not a multiple of {w} elements", p.n)
            });
        }
        Candidates {
            p,
            pdl_ok: caps.is_none_or(|c| c.capability.0 >= 9),
            gemm1_vec: if gemm1_ok { w as usize } else { 1 },
            gemm2_vec: if gemm2_ok { w as usize } else { 1 },
            reasons,
        }
    }

    fn slots_per_expert(&self) -> f64 {
        let s = self.p.slots();
        s as f64 / self.p.local_experts.min(s).max(1) as f64
    }

    /// Smallest token tile that holds the average expert's slots.
    fn mma_token_tile(&self) -> usize {
        let avg = self.slots_per_expert();
        MMA_TOKEN_TILES
            .into_iter()
            .find(|&t| avg <= t as f64)
            .unwrap_or(MMA_TOKEN_TILES[2])
    }

    /// Whether `b` can run the problem, and why not.
    fn eligible(&self, b: Backend) -> std::result::Result<(), String> {
        let p = self.p;
        let on_cuda = matches!(p.device, Device::Cuda(_));
        match b {
            Backend::Cpu if on_cuda => Err("it needs CPU tensors".into()),
            Backend::Cpu => Ok(()),
            _ if !on_cuda => Err("it needs CUDA tensors".into()),
            Backend::CudaGeneric => Ok(()),
            Backend::CudaDecode if p.slots() > DECODE_MAX_SLOTS => Err(format!(
                "it holds at most M*topk = {DECODE_MAX_SLOTS} slots, got {}",
                p.slots()
            )),
            Backend::CudaDecode => Ok(()),
            Backend::CudaMma => {
                if p.quant.is_some() {
                    Err("it has no FP8 kernels in this build".into())
                } else if !matches!(p.dtype, DType::BF16 | DType::F16) {
                    Err(format!(
                        "it needs bfloat16 or float16, got {}",
                        p.dtype.name()
                    ))
                } else if self.gemm1_vec == 1 || self.gemm2_vec == 1 {
                    Err("it needs K, N and every row stride to be multiples of 8 elements, with 16-byte aligned tensors".into())
                } else {
                    Ok(())
                }
            }
        }
    }

    fn build(self, b: Backend) -> Plan {
        let d = self.p.dtype;
        let (g1, g2) = (self.gemm1_vec, self.gemm2_vec);
        let tile = self.mma_token_tile();
        let mut reasons = self.reasons;
        let fp8_front = |v: &mut Vec<KernelId>| {
            if let Some(q) = self.p.quant {
                if q.scheme == QuantScheme::Tensor && q.a1_scale == 0 {
                    v.push(KernelId::Fp8AbsmaxPartials(d));
                }
                v.push(KernelId::Fp8QuantX(d));
            }
        };
        let (kernels, rows_per_cta, tokens_per_pass, pdl) = match (b, self.p.quant) {
            (Backend::CudaDecode, Some(q)) => {
                reasons.push(if self.pdl_ok {
                    "pdl: sm_90+, the two FP8 GEMMs overlap their start-up with programmatic dependent launch".into()
                } else {
                    "pdl: off, programmatic dependent launch needs sm_90".into()
                });
                let mut v = vec![];
                fp8_front(&mut v);
                v.push(KernelId::DecodeFp8Gemm1(q.scheme, g1));
                v.push(KernelId::DecodeFp8Gemm2Sum(d, q.scheme, g2));
                (v, DECODE_ROWS_PER_CTA, DECODE_TOKENS_PER_PASS, self.pdl_ok)
            }
            (Backend::CudaGeneric, Some(q)) => {
                let mut v = vec![KernelId::RouteAlign];
                fp8_front(&mut v);
                v.push(KernelId::GenericFp8Gemm1(q.scheme, g1));
                v.push(KernelId::GenericFp8Gemm2(q.scheme, g2));
                v.push(KernelId::GenericTopkReduce(d));
                (v, GENERIC_ROWS_PER_CTA, GENERIC_TOKENS_PER_PASS, false)
            }
            (b, _) => match b {
                Backend::Cpu => (vec![], 0, 0, false),
                Backend::CudaDecode => {
                    reasons.push(if self.pdl_ok {
                    "pdl: sm_90+, the two launches overlap their start-up with programmatic dependent launch".into()
                } else {
                    "pdl: off, programmatic dependent launch needs sm_90".into()
                });
                    (
                        vec![
                            KernelId::DecodeGemm1Act(d, g1),
                            KernelId::DecodeGemm2Sum(d, g2),
                        ],
                        DECODE_ROWS_PER_CTA,
                        DECODE_TOKENS_PER_PASS,
                        self.pdl_ok,
                    )
                }
                Backend::CudaGeneric => (
                    vec![
                        KernelId::RouteAlign,
                        KernelId::GenericGemm1Act(d, g1),
                        KernelId::GenericGemm2(d, g2),
                        KernelId::GenericTopkReduce(d),
                    ],
                    GENERIC_ROWS_PER_CTA,
                    GENERIC_TOKENS_PER_PASS,
                    false,
                ),
                Backend::CudaMma => (
                    vec![
                        KernelId::RouteAlign,
                        KernelId::MmaGemm1Act(d, tile),
                        KernelId::MmaGemm2(d, tile),
                        KernelId::GenericTopkReduce(d),
                    ],
                    MMA_ROWS_PER_CTA,
                    tile,
                    false,
                ),
            },
        };
        Plan {
            backend: b,
            kernels,
            gemm1_vec: g1,
            gemm2_vec: g2,
            rows_per_cta,
            tokens_per_pass,
            pdl,
            reasons,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn kernel_indices_are_dense_and_unique() {
        let all = KernelId::all();
        assert_eq!(all.len(), KernelId::COUNT);
        let idx: HashSet<usize> = all.iter().map(|k| k.index()).collect();
        assert_eq!(idx.len(), KernelId::COUNT);
        assert!(idx.iter().all(|&i| i < KernelId::COUNT));
        let names: HashSet<String> = all.iter().map(|k| k.symbol()).collect();
        assert_eq!(names.len(), KernelId::COUNT);
    }

    #[test]
    fn kernel_symbols_match_cuda_names() {
        assert_eq!(
            KernelId::GenericGemm1Act(DType::BF16, 8).symbol(),
            "generic_moe_gemm1_act_bf16_v8"
        );
        assert_eq!(
            KernelId::GenericGemm2(DType::F32, 1).symbol(),
            "generic_moe_gemm2_f32_v1"
        );
        assert_eq!(
            KernelId::GenericTopkReduce(DType::F16).symbol(),
            "generic_moe_topk_reduce_f16"
        );
    }

    use crate::problem::{Activation, MoeArgs, TensorDesc};

    /// A CUDA problem with 16-byte aligned, contiguous tensors (addresses are never read).
    fn problem(m: i64, e: i64, topk: i64, k: i64, n: i64, dtype: DType) -> MoeProblem {
        let dev = Device::Cuda(0);
        let t = |d, shape: &[i64]| TensorDesc::contiguous(d, shape, dev, 1 << 20);
        let (h, w1, w2) = (
            t(dtype, &[m, k]),
            t(dtype, &[e, 2 * n, k]),
            t(dtype, &[e, k, n]),
        );
        let (tw, ids, out) = (
            t(DType::F32, &[m, topk]),
            t(DType::I32, &[m, topk]),
            t(dtype, &[m, k]),
        );
        MoeProblem::new(&MoeArgs {
            hidden_states: &h,
            w1: &w1,
            w2: &w2,
            topk_weights: &tw,
            topk_ids: &ids,
            out: &out,
            expert_map: None,
            activation: Activation::Silu,
            apply_router_weight_on_input: false,
            global_num_experts: -1,
            quant: crate::problem::QuantArgs::default(),
        })
        .unwrap()
    }

    fn h200() -> DeviceCaps {
        DeviceCaps {
            name: "NVIDIA H200".into(),
            capability: (9, 0),
            sm_count: 132,
        }
    }

    #[test]
    fn decode_for_few_slots_with_pdl_on_hopper() {
        let p = problem(4, 128, 8, 2048, 768, DType::BF16);
        let plan = plan(&p, Some(&h200()));
        assert_eq!(plan.backend, Backend::CudaDecode);
        assert!(plan.pdl);
        assert_eq!(
            plan.kernels,
            vec![
                KernelId::DecodeGemm1Act(DType::BF16, 8),
                KernelId::DecodeGemm2Sum(DType::BF16, 8)
            ]
        );
        let a100 = DeviceCaps {
            name: "A100".into(),
            capability: (8, 0),
            sm_count: 108,
        };
        assert!(!super::plan(&p, Some(&a100)).pdl);
    }

    #[test]
    fn offline_questions() {
        let h200 = offline_caps(Some("NVIDIA H200"), None, None).unwrap();
        assert_eq!((h200.capability, h200.sm_count), ((9, 0), 132));
        assert!(offline_caps(Some("Some GPU"), None, None).is_err());
        let custom = offline_caps(Some("Some GPU"), Some((8, 6)), Some(84)).unwrap();
        assert_eq!(custom.sm_count, 84);
        let p = plan_for_shape(1, 128, 8, 2048, 768, DType::BF16, None, &h200, None).unwrap();
        assert_eq!(p.backend, Backend::CudaDecode);
        assert!(p.pdl);
        let p = plan_for_shape(4096, 8, 2, 4096, 14336, DType::BF16, None, &h200, None).unwrap();
        assert_eq!((p.backend, p.tokens_per_pass), (Backend::CudaMma, 128));
        let p = plan_for_shape(64, 8, 2, 4096, 14336, DType::F32, None, &h200, None).unwrap();
        assert_eq!(p.backend, Backend::CudaGeneric);
        let forced = plan_for_shape(
            64,
            8,
            2,
            4096,
            14336,
            DType::BF16,
            None,
            &h200,
            Some(Backend::CudaGeneric),
        )
        .unwrap();
        assert!(forced.reasons.iter().any(|r| r.starts_with("override:")));
        assert!(plan_for_shape(1, 8, 9, 64, 64, DType::BF16, None, &h200, None).is_err());
    }

    #[test]
    fn decode_limits_on_slots_and_slots_per_expert() {
        // qwen3 M=8: 64 slots -> tensor cores; mixtral M=4: 8 slots on 8 experts (~1.5 per
        // expert) -> decode; mixtral M=8: ~2.3 per expert -> tensor cores.
        assert_eq!(
            plan(&problem(8, 128, 8, 2048, 768, DType::BF16), None).backend,
            Backend::CudaMma
        );
        assert_eq!(
            plan(&problem(4, 8, 2, 4096, 14336, DType::BF16), None).backend,
            Backend::CudaDecode
        );
        assert_eq!(
            plan(&problem(8, 8, 2, 4096, 14336, DType::BF16), None).backend,
            Backend::CudaMma
        );
        assert!((expected_slots_per_expert(8, 8) - 1.52).abs() < 0.01);
        assert!((expected_slots_per_expert(1, 128) - 1.0).abs() < 1e-9);
        assert_eq!(expected_slots_per_expert(0, 8), 0.0);
    }

    #[test]
    fn mma_for_many_slots_with_tile_by_slots_per_expert() {
        let p = problem(1024, 128, 8, 2048, 768, DType::BF16); // 64 slots per expert
        let plan = plan(&p, Some(&h200()));
        assert_eq!(plan.backend, Backend::CudaMma);
        assert_eq!(plan.tokens_per_pass, 64);
        let p = problem(4096, 8, 2, 4096, 1024, DType::F16); // 1024 slots per expert
        assert_eq!(super::plan(&p, None).tokens_per_pass, 128);
        let p = problem(16, 128, 8, 2048, 768, DType::BF16); // 128 slots over 128 experts
        assert_eq!(super::plan(&p, None).tokens_per_pass, 16);
    }

    #[test]
    fn generic_for_fp32_and_unaligned_shapes() {
        let p = problem(1024, 8, 2, 256, 128, DType::F32);
        let plan = plan(&p, None);
        assert_eq!(plan.backend, Backend::CudaGeneric);
        assert!(plan
            .reasons
            .iter()
            .any(|r| r.contains("cuda_mma: rejected") && r.contains("float32")));
        let p = problem(1024, 8, 2, 250, 128, DType::BF16); // K not a multiple of 8
        let plan = super::plan(&p, None);
        assert_eq!(plan.backend, Backend::CudaGeneric);
        assert_eq!(plan.gemm1_vec, 1);
        assert_eq!(plan.gemm2_vec, 8);
    }

    #[test]
    fn overrides_are_checked() {
        let p = problem(128, 8, 8, 256, 128, DType::BF16); // 1024 slots: too many for decode
        let err = plan_with(&p, None, Some(Backend::CudaDecode)).unwrap_err();
        assert!(
            matches!(err, Error::Argument(ref m) if m.contains("cuda_decode") && m.contains("512"))
        );
        assert!(plan_with(&p, None, Some(Backend::Cpu)).is_err());
        let forced = plan_with(&p, None, Some(Backend::CudaGeneric)).unwrap();
        assert_eq!(forced.backend, Backend::CudaGeneric);
        assert!(forced.reasons.iter().any(|r| r.starts_with("override:")));
        assert_eq!(Backend::parse("cuda_mma"), Some(Backend::CudaMma));
        assert_eq!(Backend::parse("nope"), None);
    }

    #[test]
    fn fp8_plans_decode_then_generic_and_needs_sm89() {
        let h200 = h200();
        for q in FP8_SCHEMES {
            let p =
                plan_for_shape(1, 128, 8, 2048, 768, DType::BF16, Some(q), &h200, None).unwrap();
            assert_eq!(p.backend, Backend::CudaDecode);
            assert!(p.kernels.contains(&KernelId::Fp8QuantX(DType::BF16)));
            assert_eq!(
                p.kernels.last(),
                Some(&KernelId::DecodeFp8Gemm2Sum(DType::BF16, q, FP8_VEC))
            );
            let p =
                plan_for_shape(1024, 128, 8, 2048, 768, DType::BF16, Some(q), &h200, None).unwrap();
            assert_eq!(p.backend, Backend::CudaGeneric);
            assert!(p.kernels.contains(&KernelId::GenericFp8Gemm1(q, FP8_VEC)));
            // K = 200: 16-byte e4m3 vectors do not fit, scalar loads
            let p = plan_for_shape(1024, 8, 2, 200, 64, DType::F32, Some(q), &h200, None).unwrap();
            assert_eq!((p.gemm1_vec, p.gemm2_vec), (1, FP8_VEC));
            let forced = plan_for_shape(
                1024,
                128,
                8,
                2048,
                768,
                DType::BF16,
                Some(q),
                &h200,
                Some(Backend::CudaMma),
            );
            assert!(matches!(forced, Err(Error::Argument(ref m)) if m.contains("FP8")));
            let a100 = offline_caps(Some("NVIDIA A100-SXM4-80GB"), None, None).unwrap();
            let err = plan_for_shape(1, 128, 8, 2048, 768, DType::BF16, Some(q), &a100, None)
                .unwrap_err();
            assert!(
                matches!(err, Error::Argument(ref m) if m.contains("use_fp8_w8a8") && m.contains("sm_80"))
            );
        }
        // a per-tensor question assumes static scales: no absmax pre-pass
        let p = plan_for_shape(
            1,
            128,
            8,
            2048,
            768,
            DType::BF16,
            Some(QuantScheme::Tensor),
            &h200,
            None,
        )
        .unwrap();
        assert!(!p
            .kernels
            .iter()
            .any(|k| matches!(k, KernelId::Fp8AbsmaxPartials(_))));
    }
}
