//! The backend oracle: (problem, device) -> Plan. Every choice of backend, kernel variant
//! and tile lives here, with a one-line reason; launch code only carries a plan out.

use crate::problem::{DType, Device, MoeProblem};
use std::fmt;

/// Output rows per CTA of the generic GEMM kernels (`kRows` in cuda/generic_moe.cu).
pub const GENERIC_ROWS_PER_CTA: usize = 8;
/// Tokens a generic GEMM warp computes per pass over a weight row (`kTok`).
pub const GENERIC_TOKENS_PER_PASS: usize = 4;
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
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::CudaGeneric => "cuda_generic",
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
}

const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

fn dtype_index(d: DType) -> usize {
    FLOAT_DTYPES.iter().position(|x| *x == d).unwrap_or(0)
}

/// Widest vector (16 bytes) for a dtype.
pub fn vector_width(d: DType) -> usize {
    16 / d.size().max(1)
}

impl KernelId {
    pub const COUNT: usize = 1 + 3 * 2 + 3 * 2 + 3;

    pub fn module(&self) -> &'static str {
        match self {
            KernelId::RouteAlign => "route_align",
            _ => "generic_moe",
        }
    }

    pub fn symbol(&self) -> String {
        match *self {
            KernelId::RouteAlign => "swapmoe_route_align".into(),
            KernelId::GenericGemm1Act(d, v) => format!("generic_moe_gemm1_act_{}_v{v}", d.suffix()),
            KernelId::GenericGemm2(d, v) => format!("generic_moe_gemm2_{}_v{v}", d.suffix()),
            KernelId::GenericTopkReduce(d) => format!("generic_moe_topk_reduce_{}", d.suffix()),
        }
    }

    pub fn index(&self) -> usize {
        let vec_slot = |d: DType, v: usize| usize::from(v > 1) + 2 * dtype_index(d);
        match *self {
            KernelId::RouteAlign => 0,
            KernelId::GenericGemm1Act(d, v) => 1 + vec_slot(d, v),
            KernelId::GenericGemm2(d, v) => 7 + vec_slot(d, v),
            KernelId::GenericTopkReduce(d) => 13 + dtype_index(d),
        }
    }

    /// Every kernel the library can launch (for warm-up and tests).
    pub fn all() -> Vec<KernelId> {
        let mut v = vec![KernelId::RouteAlign];
        for d in FLOAT_DTYPES {
            for w in [1, vector_width(d)] {
                v.push(KernelId::GenericGemm1Act(d, w));
                v.push(KernelId::GenericGemm2(d, w));
            }
            v.push(KernelId::GenericTopkReduce(d));
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

/// Picks the backend and kernel variants for a validated problem.
pub fn plan(p: &MoeProblem, caps: Option<&DeviceCaps>) -> Plan {
    let mut reasons = Vec::new();
    if p.device == Device::Cpu {
        reasons.push("cpu: the tensors are on the CPU, so the rayon reference path runs".into());
        return Plan {
            backend: Backend::Cpu,
            kernels: vec![],
            gemm1_vec: 1,
            gemm2_vec: 1,
            rows_per_cta: 0,
            tokens_per_pass: 0,
            reasons,
        };
    }
    if let Some(c) = caps {
        reasons.push(format!(
            "cuda_generic: {} (sm_{}{}) runs the generic sm_80+ kernels for every dtype and shape",
            c.name, c.capability.0, c.capability.1
        ));
    }
    let d = p.dtype;
    let w = vector_width(d);
    let esz = d.size();
    let s = &p.strides;
    let o = &p.operands;
    let gemm1_vec = if p.k % w == 0
        && s.hidden_row % w as i64 == 0
        && s.w1_expert % w as i64 == 0
        && s.w1_row % w as i64 == 0
        && aligned(o.hidden_states, 16)
        && aligned(o.w1, 16)
    {
        reasons.push(format!(
            "gemm1: 16-byte loads ({w} x {}), K and the w1/hidden strides are multiples of {w}",
            d.name()
        ));
        w
    } else {
        reasons.push(format!(
            "gemm1: scalar loads, K={} or a stride or address of hidden_states/w1 is not a multiple of {w} elements ({} bytes each)",
            p.k, esz
        ));
        1
    };
    let gemm2_vec = if p.n % w == 0
        && s.w2_expert % w as i64 == 0
        && s.w2_row % w as i64 == 0
        && aligned(o.w2, 16)
    {
        reasons.push(format!(
            "gemm2: 16-byte loads, N and the w2 strides are multiples of {w}"
        ));
        w
    } else {
        reasons.push(format!(
            "gemm2: scalar loads, N={} or a stride or address of w2 is not a multiple of {w} elements",
            p.n
        ));
        1
    };
    Plan {
        backend: Backend::CudaGeneric,
        kernels: vec![
            KernelId::RouteAlign,
            KernelId::GenericGemm1Act(d, gemm1_vec),
            KernelId::GenericGemm2(d, gemm2_vec),
            KernelId::GenericTopkReduce(d),
        ],
        gemm1_vec,
        gemm2_vec,
        rows_per_cta: GENERIC_ROWS_PER_CTA,
        tokens_per_pass: GENERIC_TOKENS_PER_PASS,
        reasons,
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
}
