//! Tuned tables: measured backend choices, one JSON file per (E, N, device, dtype/quant),
//! keyed by M. The oracle (src/oracle.rs) reads them between an explicit override and its
//! heuristics.
//!
//! File names follow vLLM's tuned configs: `E=128,N=768,device_name=NVIDIA_H200,dtype=bf16.json`
//! (E = local experts, w1.shape[0]; N = intermediate size, w2.shape[2]; spaces of the device
//! name become `_`). Quantized schemes put their own key in place of the dtype:
//! `dtype=fp8_w8a8` (per-tensor), `dtype=fp8_w8a8,per_channel=true`,
//! `dtype=fp8_w8a8,block_shape=[128,128]`.
//!
//! A file may also name the hidden size K after N (`E=128,N=384,K=2048,device_name=...`,
//! [`file_name_for_hidden`]): vLLM's key leaves K out, so two models with the same (E, N) and
//! different K would share one table. The oracle reads the file named with the call's K first
//! and the (E, N) file, whose entries stand for every K, only where there is none. A named K
//! must agree with `metadata.K`.
//!
//! Content: a JSON object. `"metadata"` (optional) describes the run (E, N, K, topk,
//! device_name, dtype, quant, swapmoe version, date, method). Every other key is a token
//! count M (a positive integer) whose value is an entry:
//!
//! ```json
//! {"backend": "cuda_mma", "token_tile": 64, "time_us": 544.3,
//!  "times_us": {"cuda_mma:t16": 601.0, "cuda_mma:t64": 544.3, "vllm_triton": 560.0},
//!  "source": "swapmoe tune 0.1.0, 2026-12-01"}
//! ```
//!
//! - `backend`: a swapmoe backend (`cuda_decode`, `cuda_mma`, `cuda_generic`) or an external
//!   one (`vllm_triton`, `flashinfer_cutlass`) that only a caller running inside vLLM can use.
//!   A name this build does not know is kept and rejected when planned (tables of newer
//!   builds degrade to the heuristics instead of failing).
//! - `token_tile`: the tensor-core token tile (cuda_mma and cuda_wgmma; absent: the heuristic's tile).
//! - `swap_gemm1_ring`, `swap_gemm2_pdl` (cuda_wgmma_swap, both or neither; absent: the
//!   oracle's rules): how its kernels (bf16/fp16 and e4m3) launch ([`SwapLaunch`]);
//!   `swap_gemm2_ring` (optional, with those two): the e4m3 GEMM2's ring (0: its own; absent:
//!   the oracle's rule).
//! - `time_us`, `times_us` (optional): measured times; labels are `backend`,
//!   `cuda_mma:t<tile>` or `cuda_wgmma_swap:r<ring>p<0|1>[g<ring>]`. When an external backend is not allowed, the fastest swapmoe
//!   label of `times_us` that can run the call is used.
//! - Anything else (`source`, notes) is ignored.
//!
//! Nearest M wins, by |M - key|; a tie goes to the smaller key. An entry stands only for
//! calls within a factor of [`MAX_M_RATIO`] (2) of its M: of the entries that cover M, the
//! nearest wins, and with none the heuristics decide, so a sparse table never stretches one
//! measurement over a range it did not measure.
//!
//! Files may spell the separators `;` instead of `,` (the shipped files do: a wheel's RECORD
//! is CSV, and maturin does not quote commas); both spellings name the same table.
//!
//! A file that does not parse or breaks these rules is *ignored with a reason*: lookups of
//! its shape say why and use the heuristics (a bad file in a user folder must never make the
//! op fail).
//!
//! Where tables come from: the folder shipped in the package (set by the Python package at
//! import, see [`set_shipped_dir`]) and `$SWAPMOE_TABLES_DIR`, whose files replace shipped
//! files of the same name. `$SWAPMOE_TABLES=off` turns all tables off. Both are read once, on the first lookup, and again only when
//! either location changes; a lookup is a hash-map probe.

use crate::error::{Error, Result};
use crate::oracle::Backend;
use crate::problem::DType;
use serde_json::Value;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// Folder of user tables; its files replace shipped files of the same name.
pub const TABLES_DIR_ENV: &str = "SWAPMOE_TABLES_DIR";
/// `off` (or `0`, `none`) turns every table off: the heuristics decide (for A/B runs).
pub const TABLES_ENV: &str = "SWAPMOE_TABLES";

/// Weight quantization of a problem, as far as tables are concerned (the FP8 kernels are
/// not in this build; the names are fixed so that their tables can be named already).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quant {
    None,
    /// FP8 W8A8, one scale per tensor.
    Fp8Tensor,
    /// FP8 W8A8, one scale per output channel.
    Fp8Channel,
    /// FP8 W8A8, 128x128 weight blocks.
    Fp8Block128,
}

impl Quant {
    pub const ALL: [Quant; 4] = [
        Quant::None,
        Quant::Fp8Tensor,
        Quant::Fp8Channel,
        Quant::Fp8Block128,
    ];

    /// The Python name (`None` for no quantization).
    pub fn name(&self) -> Option<&'static str> {
        match self {
            Quant::None => None,
            Quant::Fp8Tensor => Some("fp8_tensor"),
            Quant::Fp8Channel => Some("fp8_channel"),
            Quant::Fp8Block128 => Some("fp8_block128"),
        }
    }

    /// `None`, `"none"` or one of the Python names.
    pub fn parse(s: Option<&str>) -> Result<Quant> {
        let Some(s) = s else { return Ok(Quant::None) };
        if s == "none" {
            return Ok(Quant::None);
        }
        Quant::ALL
            .into_iter()
            .find(|q| q.name() == Some(s))
            .ok_or_else(|| {
                Error::Argument(format!(
                    "quant: expected None, 'fp8_tensor', 'fp8_channel' or 'fp8_block128', got {s:?}"
                ))
            })
    }
}

/// Backends outside swapmoe that a table may name. They are candidates only when the
/// caller says it runs inside vLLM and can call them (`external_backends`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExternalBackend {
    /// vLLM's Triton `fused_experts`.
    VllmTriton,
    /// FlashInfer's CUTLASS fused MoE, as vLLM wraps it.
    FlashinferCutlass,
}

impl ExternalBackend {
    pub const ALL: [ExternalBackend; 2] = [
        ExternalBackend::VllmTriton,
        ExternalBackend::FlashinferCutlass,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            ExternalBackend::VllmTriton => "vllm_triton",
            ExternalBackend::FlashinferCutlass => "flashinfer_cutlass",
        }
    }

    pub fn parse(s: &str) -> Option<ExternalBackend> {
        ExternalBackend::ALL.into_iter().find(|b| b.name() == s)
    }

    /// The `external_backends` argument: every name must be known.
    pub fn parse_list<S: AsRef<str>>(names: &[S]) -> Result<Vec<ExternalBackend>> {
        names
            .iter()
            .map(|n| {
                ExternalBackend::parse(n.as_ref()).ok_or_else(|| {
                    let known: Vec<&str> = ExternalBackend::ALL.iter().map(|b| b.name()).collect();
                    Error::Argument(format!(
                        "external_backends: expected names from {known:?}, got {:?}",
                        n.as_ref()
                    ))
                })
            })
            .collect()
    }
}

/// How a table runs cuda_wgmma_swap's kernels (bf16/fp16 and e4m3), where it measured that faster than
/// the oracle's rules: GEMM1's ring of stages (`Plan::swap_gemm1_ring`, 0: the kernel's own)
/// and whether GEMM2 starts under GEMM1 by PDL (`Plan::swap_gemm2_pdl`), and optionally the
/// e4m3 GEMM2's ring (`Plan::swap_gemm2_ring`). Label suffix `:r<ring>p<0|1>[g<ring>]`
/// (`cuda_wgmma_swap:r2p0`, `cuda_wgmma_swap:r0p1g7`); entry fields `swap_gemm1_ring`,
/// `swap_gemm2_pdl`, `swap_gemm2_ring`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwapLaunch {
    pub gemm1_ring: usize,
    pub gemm2_pdl: bool,
    /// The e4m3 GEMM2's ring: 0 its own, else 2 or more stages; None: the oracle's rule
    /// (`swap_gemm2_ring_rule`). The bf16/fp16 GEMM2's ring is fixed at compile time.
    pub gemm2_ring: Option<usize>,
}

/// A swap-AB ring length as a table or label gives it: 0 (the kernel's own) or at least 2.
fn swap_ring_value(r: usize) -> Option<usize> {
    (r == 0 || r >= 2).then_some(r)
}

impl SwapLaunch {
    /// `r2p0` -> ring 2, GEMM2 without PDL; `r0p1g7` -> GEMM1's own ring, GEMM2 by PDL with a
    /// ring of 7.
    pub fn parse(s: &str) -> Option<SwapLaunch> {
        let (ring, rest) = s.strip_prefix('r')?.split_once('p')?;
        let gemm1_ring = swap_ring_value(ring.parse().ok()?)?;
        let (pdl, gemm2_ring) = match rest.split_once('g') {
            Some((pdl, g)) => (pdl, Some(swap_ring_value(g.parse().ok()?)?)),
            None => (rest, None),
        };
        let gemm2_pdl = match pdl {
            "0" => false,
            "1" => true,
            _ => return None,
        };
        Some(SwapLaunch {
            gemm1_ring,
            gemm2_pdl,
            gemm2_ring,
        })
    }
    pub fn suffix(&self) -> String {
        let g = self.gemm2_ring.map(|r| format!("g{r}")).unwrap_or_default();
        format!("r{}p{}{g}", self.gemm1_ring, u8::from(self.gemm2_pdl))
    }
}

/// What a table entry (or one of its measured labels) names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    Swapmoe {
        backend: Backend,
        /// cuda_mma only; None: the heuristic's tile.
        token_tile: Option<usize>,
        /// cuda_wgmma_swap only (bf16/fp16); None: the oracle's rules.
        swap: Option<SwapLaunch>,
    },
    External(ExternalBackend),
    /// A name this build does not know (a table of a newer build): rejected when planned.
    Unknown(String),
}

impl Choice {
    /// From an entry's `backend` and `token_tile`.
    pub fn new(backend: &str, token_tile: Option<usize>) -> Choice {
        if let Some(b) = Backend::parse(backend) {
            Choice::Swapmoe {
                backend: b,
                token_tile,
                swap: None,
            }
        } else if let Some(x) = ExternalBackend::parse(backend) {
            Choice::External(x)
        } else {
            Choice::Unknown(backend.to_string())
        }
    }

    /// From a `times_us` label: `cuda_decode`, `cuda_mma:t64`, `cuda_wgmma_swap:r2p0`,
    /// `vllm_triton`, ...
    pub fn from_label(label: &str) -> Choice {
        if let Some(v) = label.strip_prefix("cuda_wgmma_swap:") {
            return match SwapLaunch::parse(v) {
                Some(swap) => Choice::Swapmoe {
                    backend: Backend::CudaWgmmaSwap,
                    token_tile: None,
                    swap: Some(swap),
                },
                None => Choice::Unknown(label.to_string()),
            };
        }
        match label.split_once(":t") {
            Some((b, t))
                if matches!(
                    Backend::parse(b),
                    Some(Backend::CudaMma | Backend::CudaWgmma)
                ) =>
            {
                match t.parse() {
                    Ok(t) => Choice::new(b, Some(t)),
                    Err(_) => Choice::Unknown(label.to_string()),
                }
            }
            _ => Choice::new(label, None),
        }
    }

    /// The label (`cuda_mma:t64`, `cuda_wgmma_swap:r2p0`, `cuda_decode`, `vllm_triton`).
    pub fn label(&self) -> String {
        match self {
            Choice::Swapmoe {
                backend,
                token_tile: Some(t),
                ..
            } => format!("{}:t{t}", backend.name()),
            Choice::Swapmoe {
                backend,
                swap: Some(v),
                ..
            } => format!("{}:{}", backend.name(), v.suffix()),
            Choice::Swapmoe { backend, .. } => backend.name().to_string(),
            Choice::External(x) => x.name().to_string(),
            Choice::Unknown(s) => s.clone(),
        }
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Choice::Swapmoe {
                backend,
                token_tile: Some(t),
                ..
            } => write!(f, "{} (token tile {t})", backend.name()),
            Choice::Swapmoe {
                backend,
                swap: Some(v),
                ..
            } => {
                let ring = |r: usize| {
                    if r == 0 {
                        "its own".to_string()
                    } else {
                        r.to_string()
                    }
                };
                write!(
                    f,
                    "{} (GEMM1 ring {}, GEMM2 {}",
                    backend.name(),
                    ring(v.gemm1_ring),
                    if v.gemm2_pdl { "by PDL" } else { "after GEMM1" }
                )?;
                if let Some(r) = v.gemm2_ring {
                    write!(f, ", GEMM2 ring {}", ring(r))?;
                }
                f.write_str(")")
            }
            _ => f.write_str(&self.label()),
        }
    }
}

/// One M point of a table.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub m: usize,
    pub choice: Choice,
    pub time_us: Option<f64>,
    /// Measured candidates, fastest first.
    pub times_us: Vec<(Choice, f64)>,
}

/// What the metadata says about the run (all optional).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Meta {
    pub e: Option<usize>,
    pub n: Option<usize>,
    pub k: Option<usize>,
    pub topk: Option<usize>,
    pub device_name: Option<String>,
    /// FP8 tables: whether the run gave the activation scales (`a1_scale`, `a2_scale`) or
    /// let the kernels compute them. The kernels differ (a static intermediate scale lets
    /// GEMM1 write e4m3), so a table stands only for calls with the same kind of scales.
    pub activation_scales: Option<ActivationScales>,
}

/// How an FP8 call gets its activation scales (`"activation_scales"` in a table's metadata).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActivationScales {
    /// `a1_scale` and `a2_scale` given (calibrated checkpoints).
    Static,
    /// Computed by the op from the activations (absmax / 448).
    Dynamic,
}

impl ActivationScales {
    pub fn name(&self) -> &'static str {
        match self {
            ActivationScales::Static => "static",
            ActivationScales::Dynamic => "dynamic",
        }
    }

    /// `"static"` or `"dynamic"`; `what` names the argument in the error.
    pub fn parse(s: &str, what: &str) -> Result<ActivationScales> {
        match s {
            "static" => Ok(ActivationScales::Static),
            "dynamic" => Ok(ActivationScales::Dynamic),
            other => Err(Error::Argument(format!(
                "{what}: expected 'static' or 'dynamic', got {other:?}"
            ))),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Shipped in the package.
    Shipped,
    /// From `$SWAPMOE_TABLES_DIR` (or a folder given to [`TableSet::load`] as the user's).
    User,
}

impl Origin {
    pub fn name(&self) -> &'static str {
        match self {
            Origin::Shipped => "shipped",
            Origin::User => "user",
        }
    }
}

/// A parsed table.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// The file name, which is the lookup key.
    pub file: String,
    pub path: PathBuf,
    pub origin: Origin,
    pub meta: Meta,
    /// Sorted by M.
    pub entries: Vec<Entry>,
}

/// `dtype=...` part of a table name.
pub fn dtype_key(dtype: DType, quant: Quant) -> String {
    match quant {
        Quant::None => {
            let d = match dtype {
                DType::BF16 => "bf16",
                DType::F16 => "fp16",
                DType::F32 => "fp32",
                _ => "other",
            };
            format!("dtype={d}")
        }
        Quant::Fp8Tensor => "dtype=fp8_w8a8".into(),
        Quant::Fp8Channel => "dtype=fp8_w8a8,per_channel=true".into(),
        Quant::Fp8Block128 => "dtype=fp8_w8a8,block_shape=[128,128]".into(),
    }
}

/// The table file name of a shape on a device: vLLM's key, (E, N), for every hidden size K.
pub fn file_name(
    experts: usize,
    intermediate: usize,
    device_name: &str,
    dtype: DType,
    quant: Quant,
) -> String {
    format!(
        "E={experts},N={intermediate},device_name={},{}.json",
        device_name.trim().replace(' ', "_"),
        dtype_key(dtype, quant)
    )
}

/// The file name of a table for one hidden size K: `E=..,N=..,K=..,device_name=..` (vLLM's key
/// with K after N). The oracle reads it ahead of the (E, N) table of [`file_name`], whose
/// entries then stand for every other K: two models whose (E, N) match (Qwen3-30B-A3B TP2 and
/// Qwen3-235B-A22B TP4, K 2048 and 4096) can each have their own measurements.
pub fn file_name_for_hidden(
    experts: usize,
    intermediate: usize,
    hidden: usize,
    device_name: &str,
    dtype: DType,
    quant: Quant,
) -> String {
    let any_k = file_name(experts, intermediate, device_name, dtype, quant);
    let head = format!("E={experts},N={intermediate},");
    format!("{head}K={hidden},{}", &any_k[head.len()..])
}

/// The lookup key of a table file name: `;` separators (the spelling of the files shipped
/// in the package, because a wheel's RECORD is CSV and maturin does not quote commas) read
/// as vLLM's `,`.
pub fn canonical_name(file: &str) -> String {
    file.replace(';', ",")
}

/// E, N and (where the name has it) K from a file name that starts `E=..,N=..,[K=..,]` (or
/// with `;`).
fn name_e_n_k(file: &str) -> Option<(usize, usize, Option<usize>)> {
    let file = canonical_name(file);
    let mut parts = file.split(',');
    let e = parts.next()?.strip_prefix("E=")?.parse().ok()?;
    let n = parts.next()?.strip_prefix("N=")?.parse().ok()?;
    let k = parts.next().and_then(|p| p.strip_prefix("K="));
    let k = match k {
        Some(k) => Some(k.parse().ok()?),
        None => None,
    };
    Some((e, n, k))
}

fn uint(v: &Value, what: &str) -> std::result::Result<usize, String> {
    v.as_u64()
        .map(|x| x as usize)
        .ok_or_else(|| format!("{what}: expected a non-negative integer, got {v}"))
}

fn boolean(v: &Value, what: &str) -> std::result::Result<bool, String> {
    v.as_bool()
        .ok_or_else(|| format!("{what}: expected true or false, got {v}"))
}

/// Field `key` of an entry parsed by `parse` (`uint`, `number`, `boolean`); None when it is
/// absent or null.
fn optional<T>(
    e: &serde_json::Map<String, Value>,
    key: &str,
    parse: fn(&Value, &str) -> std::result::Result<T, String>,
) -> std::result::Result<Option<T>, String> {
    e.get(key)
        .filter(|v| !v.is_null())
        .map(|v| parse(v, key))
        .transpose()
}

fn number(v: &Value, what: &str) -> std::result::Result<f64, String> {
    match v.as_f64() {
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("{what}: expected a non-negative number, got {v}")),
    }
}

impl Table {
    /// Parses the text of file `file`. Errors say what is wrong and where.
    pub fn parse(
        text: &str,
        file: &str,
        path: &Path,
        origin: Origin,
    ) -> std::result::Result<Table, String> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| format!("not valid JSON ({e})"))?;
        let obj = root
            .as_object()
            .ok_or("expected a JSON object keyed by M")?;
        let mut meta = Meta::default();
        let mut entries = Vec::new();
        for (key, v) in obj {
            if key == "metadata" {
                let m = v.as_object().ok_or("metadata: expected an object")?;
                let opt = |k: &str| -> std::result::Result<Option<usize>, String> {
                    m.get(k)
                        .filter(|v| !v.is_null())
                        .map(|v| uint(v, &format!("metadata.{k}")))
                        .transpose()
                };
                meta.e = opt("E")?;
                meta.n = opt("N")?;
                meta.k = opt("K")?;
                meta.topk = opt("topk")?;
                meta.device_name = m
                    .get("device_name")
                    .and_then(|v| v.as_str())
                    .map(String::from);
                meta.activation_scales = match m.get("activation_scales") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(v)) => Some(
                        ActivationScales::parse(v, "metadata.activation_scales")
                            .map_err(|e| e.to_string())?,
                    ),
                    Some(v) => {
                        return Err(format!(
                            "metadata.activation_scales: expected 'static' or 'dynamic', got {v}"
                        ))
                    }
                };
                continue;
            }
            if key.starts_with('_') {
                continue; // comments
            }
            let m: usize = match key.parse() {
                Ok(m) if m >= 1 => m,
                _ => {
                    return Err(format!(
                        "key {key:?}: expected a token count M >= 1, \"metadata\" or a \"_comment\""
                    ))
                }
            };
            let at = |s: String| format!("M={m}: {s}");
            let e = v
                .as_object()
                .ok_or_else(|| at("expected an object".into()))?;
            let backend = e
                .get("backend")
                .and_then(|b| b.as_str())
                .ok_or_else(|| at("expected a \"backend\" string".into()))?;
            let tile = optional(e, "token_tile", uint).map_err(at)?;
            let ring = optional(e, "swap_gemm1_ring", uint).map_err(at)?;
            let pdl = optional(e, "swap_gemm2_pdl", boolean).map_err(at)?;
            let gemm2_ring = optional(e, "swap_gemm2_ring", uint).map_err(at)?;
            let mut choice = Choice::new(backend, tile);
            if gemm2_ring.is_some() && (ring.is_none() || pdl.is_none()) {
                return Err(at(
                    "swap_gemm2_ring goes with swap_gemm1_ring and swap_gemm2_pdl".into(),
                ));
            }
            // a ring is 0 (the kernel's own) or at least 2 stages
            for (name, r) in [("swap_gemm1_ring", ring), ("swap_gemm2_ring", gemm2_ring)] {
                if let Some(r) = r.filter(|r| swap_ring_value(*r).is_none()) {
                    return Err(at(format!(
                        "{name}: expected 0 (the kernel's own ring) or at least 2, got {r}"
                    )));
                }
            }
            if ring.is_some() || pdl.is_some() {
                let (Some(gemm1_ring), Some(gemm2_pdl)) = (ring, pdl) else {
                    return Err(at(
                        "swap_gemm1_ring and swap_gemm2_pdl go together (both or neither)".into(),
                    ));
                };
                match &mut choice {
                    Choice::Swapmoe {
                        backend: Backend::CudaWgmmaSwap,
                        swap,
                        ..
                    } => {
                        *swap = Some(SwapLaunch {
                            gemm1_ring,
                            gemm2_pdl,
                            gemm2_ring,
                        })
                    }
                    _ => {
                        return Err(at(format!(
                            "swap_gemm1_ring and swap_gemm2_pdl are only for cuda_wgmma_swap, the backend is {backend}"
                        )))
                    }
                }
            }
            if tile.is_some()
                && matches!(&choice, Choice::Swapmoe { backend, .. } if !matches!(backend, Backend::CudaMma | Backend::CudaWgmma))
            {
                return Err(at(format!(
                    "token_tile is only for cuda_mma and cuda_wgmma, the backend is {backend}"
                )));
            }
            let time_us = optional(e, "time_us", number).map_err(at)?;
            let mut times_us = Vec::new();
            if let Some(t) = e.get("times_us").filter(|v| !v.is_null()) {
                let t = t
                    .as_object()
                    .ok_or_else(|| at("times_us: expected an object of label: µs".into()))?;
                for (label, v) in t {
                    let us = number(v, &format!("times_us.{label}")).map_err(at)?;
                    times_us.push((Choice::from_label(label), us));
                }
                times_us.sort_by(|a, b| a.1.total_cmp(&b.1));
            }
            entries.push(Entry {
                m,
                choice,
                time_us,
                times_us,
            });
        }
        entries.sort_by_key(|e| e.m);
        let canonical = canonical_name(file);
        if let Some(k) = canonical
            .split(',')
            .nth(2)
            .and_then(|p| p.strip_prefix("K="))
        {
            if k.parse::<usize>().is_err() {
                return Err(format!(
                    "the file name's K={k} is not a hidden size (expected K=<integer> after N)"
                ));
            }
        }
        if let Some((e, n, k)) = name_e_n_k(file) {
            let named_k = k.map(|k| ("K", k, meta.k));
            for (what, named, said) in [("E", e, meta.e), ("N", n, meta.n)]
                .into_iter()
                .chain(named_k)
            {
                if let Some(s) = said.filter(|&s| s != named) {
                    return Err(format!(
                        "metadata.{what} = {s} but the file name says {what}={named}"
                    ));
                }
            }
        }
        Ok(Table {
            file: file.to_string(),
            path: path.to_path_buf(),
            origin,
            meta,
            entries,
        })
    }

    /// Reads and parses a table file.
    pub fn read(path: &Path, origin: Origin) -> std::result::Result<Table, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot be read ({e})"))?;
        let file = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        Table::parse(&text, &file, path, origin)
    }

    /// Of the entries that cover `m` (see [`covers`]), the nearest (|m - key|; a tie goes
    /// to the smaller key). None: the heuristics decide.
    pub fn lookup(&self, m: usize) -> Option<&Entry> {
        let mut best: Option<&Entry> = None;
        for e in self.entries.iter().filter(|e| covers(e.m, m)) {
            if best.is_none_or(|b| e.m.abs_diff(m) < b.m.abs_diff(m)) {
                best = Some(e);
            }
        }
        best
    }

    /// The entry whose M is nearest to `m` (|m - key|; a tie goes to the smaller key).
    pub fn nearest(&self, m: usize) -> Option<&Entry> {
        let mut best: Option<&Entry> = None;
        for e in &self.entries {
            // entries are sorted: the first of equal distances is the smaller M
            if best.is_none_or(|b| e.m.abs_diff(m) < b.m.abs_diff(m)) {
                best = Some(e);
            }
        }
        best
    }
}

/// An entry measured at `key` tokens stands for calls of `m` tokens within this factor
/// (`key / 2 <= m <= 2 * key`); further away the heuristics decide. A table swept over
/// powers of two covers every M from 1 to twice its largest key; a sparse one (the seed
/// tables) leaves its gaps to the heuristics instead of stretching one measurement over them.
pub const MAX_M_RATIO: usize = 2;

/// Whether an entry at `key` tokens covers a call of `m` tokens (M = 0 counts as 1).
pub fn covers(key: usize, m: usize) -> bool {
    let m = m.max(1);
    m <= key.saturating_mul(MAX_M_RATIO) && key <= m.saturating_mul(MAX_M_RATIO)
}

/// A table file as loaded: parsed, or ignored with the reason.
#[derive(Clone, Debug, PartialEq)]
pub enum Loaded {
    Ok(Arc<Table>),
    Bad {
        path: PathBuf,
        origin: Origin,
        error: String,
    },
}

impl Loaded {
    pub fn path(&self) -> &Path {
        match self {
            Loaded::Ok(t) => &t.path,
            Loaded::Bad { path, .. } => path,
        }
    }
    pub fn origin(&self) -> Origin {
        match self {
            Loaded::Ok(t) => t.origin,
            Loaded::Bad { origin, .. } => *origin,
        }
    }
}

/// Every table the oracle can see, by file name.
#[derive(Clone, Debug, Default)]
pub struct TableSet {
    pub shipped_dir: Option<PathBuf>,
    pub user_dir: Option<PathBuf>,
    files: HashMap<String, Loaded>,
    /// Folders that could not be listed, with the reason.
    pub dir_errors: Vec<String>,
    /// `$SWAPMOE_TABLES=off`: no table is used.
    pub disabled: bool,
}

impl TableSet {
    /// Reads every `*.json` of the shipped folder, then of the user folder (whose files
    /// replace shipped files of the same name).
    pub fn load(shipped: Option<&Path>, user: Option<&Path>) -> TableSet {
        let mut set = TableSet {
            shipped_dir: shipped.map(Path::to_path_buf),
            user_dir: user.map(Path::to_path_buf),
            ..TableSet::default()
        };
        for (dir, origin) in [(shipped, Origin::Shipped), (user, Origin::User)] {
            let Some(dir) = dir else { continue };
            let listing = match std::fs::read_dir(dir) {
                Ok(l) => l,
                Err(e) => {
                    set.dir_errors.push(format!(
                        "{} tables folder {} cannot be listed ({e})",
                        origin.name(),
                        dir.display()
                    ));
                    continue;
                }
            };
            let mut paths: Vec<PathBuf> = listing
                .filter_map(|d| d.ok().map(|d| d.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
                .collect();
            paths.sort();
            for path in paths {
                let file = canonical_name(
                    &path
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                );
                let loaded = match Table::read(&path, origin) {
                    Ok(t) => Loaded::Ok(Arc::new(t)),
                    Err(error) => Loaded::Bad {
                        path,
                        origin,
                        error,
                    },
                };
                set.files.insert(file, loaded);
            }
        }
        set
    }

    /// No tables at all (`$SWAPMOE_TABLES=off`): lookups say so and the heuristics decide.
    pub fn disabled() -> TableSet {
        TableSet {
            disabled: true,
            ..TableSet::default()
        }
    }

    /// Adds (or replaces) a table under its file name (tests, tables built in memory).
    pub fn insert(&mut self, file: &str, loaded: Loaded) {
        self.files.insert(file.to_string(), loaded);
    }

    pub fn get(&self, file: &str) -> Option<&Loaded> {
        self.files.get(file)
    }

    /// (file name, loaded) sorted by name.
    pub fn files(&self) -> Vec<(&str, &Loaded)> {
        let mut v: Vec<(&str, &Loaded)> = self.files.iter().map(|(k, v)| (k.as_str(), v)).collect();
        v.sort_by_key(|x| x.0);
        v
    }

    /// Where tables were looked for, for reasons.
    pub fn searched(&self) -> String {
        let show = |d: &Option<PathBuf>| match d {
            Some(d) => d.display().to_string(),
            None => "unset".into(),
        };
        let mut s = format!(
            "shipped folder {}, ${TABLES_DIR_ENV} {}",
            show(&self.shipped_dir),
            show(&self.user_dir)
        );
        for e in &self.dir_errors {
            s.push_str("; ");
            s.push_str(e);
        }
        s
    }
}

static SHIPPED_DIR: RwLock<Option<PathBuf>> = RwLock::new(None);
type CacheKey = (Option<PathBuf>, Option<String>, Option<String>);
static CACHE: Mutex<Option<(CacheKey, Arc<TableSet>)>> = Mutex::new(None);

/// Sets the folder of the tables shipped with the package (the Python package calls this
/// at import with its `tables/` folder). The next lookup reloads.
pub fn set_shipped_dir(dir: Option<PathBuf>) {
    *SHIPPED_DIR.write().unwrap_or_else(|e| e.into_inner()) = dir;
}

pub fn shipped_dir() -> Option<PathBuf> {
    SHIPPED_DIR
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// `$SWAPMOE_TABLES`: whether the tables are off (`off`, `0`, `none`), and for a value that
/// is neither that nor on (`on`, `1`, `auto`, empty, unset) the reason, kept with the folders'
/// errors (`swapmoe check` and the plans' reasons show it): the tables then stay on, as a
/// bad table never makes the op fail.
pub fn tables_switch(value: Option<&str>) -> (bool, Option<String>) {
    let Some(v) = value else { return (false, None) };
    match v.trim().to_ascii_lowercase().as_str() {
        "off" | "0" | "none" => (true, None),
        "" | "on" | "1" | "auto" => (false, None),
        _ => (
            false,
            Some(format!(
                "${TABLES_ENV}: expected off (or 0, none) to turn the tables off, or on (1, auto, unset), got {v:?}; the tables stay on"
            )),
        ),
    }
}

/// The tables of the shipped folder and `$SWAPMOE_TABLES_DIR`, read on the first call and
/// again only when either location (or `$SWAPMOE_TABLES`) changes: edits inside a folder
/// are seen by the next process.
pub fn global() -> Arc<TableSet> {
    let user = std::env::var(TABLES_DIR_ENV).ok().filter(|v| !v.is_empty());
    let key: CacheKey = (shipped_dir(), user, std::env::var(TABLES_ENV).ok());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((k, set)) = cache.as_ref() {
        if *k == key {
            return set.clone();
        }
    }
    // Read the switch only when the set is rebuilt (a cache hit is every plan's path).
    let (off, switch_error) = tables_switch(key.2.as_deref());
    let mut set = if off {
        TableSet::disabled()
    } else {
        TableSet::load(key.0.as_deref(), key.1.as_deref().map(Path::new))
    };
    set.dir_errors.extend(switch_error);
    let set = Arc::new(set);
    *cache = Some((key, set.clone()));
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> std::result::Result<Table, String> {
        let file = "E=8,N=64,device_name=NVIDIA_H200,dtype=bf16.json";
        Table::parse(text, file, Path::new(file), Origin::User)
    }

    #[test]
    fn file_names_follow_vllm_keys() {
        assert_eq!(
            file_name(128, 768, "NVIDIA H200", DType::BF16, Quant::None),
            "E=128,N=768,device_name=NVIDIA_H200,dtype=bf16.json"
        );
        assert_eq!(
            file_name(8, 14336, "NVIDIA H200", DType::F16, Quant::None),
            "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp16.json"
        );
        assert_eq!(
            file_name(256, 256, "NVIDIA H200", DType::BF16, Quant::Fp8Block128),
            "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
        );
        assert_eq!(
            file_name(256, 256, "NVIDIA H200", DType::BF16, Quant::Fp8Tensor),
            "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
        );
        assert!(file_name(8, 8, "X", DType::BF16, Quant::Fp8Channel).contains("per_channel"));
        assert_eq!(
            name_e_n_k("E=8,N=14336,device_name=x.json"),
            Some((8, 14336, None))
        );
        assert_eq!(
            name_e_n_k("E=8;N=14336;device_name=x.json"),
            Some((8, 14336, None))
        );
        assert_eq!(
            file_name_for_hidden(
                128,
                384,
                2048,
                "NVIDIA H100 80GB HBM3",
                DType::BF16,
                Quant::Fp8Tensor
            ),
            "E=128,N=384,K=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json"
        );
        assert_eq!(
            name_e_n_k("E=128;N=384;K=2048;device_name=x.json"),
            Some((128, 384, Some(2048)))
        );
        assert_eq!(name_e_n_k("E=128;N=384;K=big;device_name=x.json"), None);
        let bad = "E=128;N=384;K=big;device_name=x;dtype=bf16.json";
        let err = Table::parse("{}", bad, Path::new(bad), Origin::User).unwrap_err();
        assert!(err.contains("K=big is not a hidden size"), "{err}");
        assert_eq!(
            canonical_name("E=1;N=2;device_name=X;dtype=fp8_w8a8;block_shape=[128;128].json"),
            file_name(1, 2, "X", DType::BF16, Quant::Fp8Block128)
        );
        assert_eq!(Quant::parse(Some("none")).unwrap(), Quant::None);
        assert_eq!(
            Quant::parse(Some("fp8_block128")).unwrap(),
            Quant::Fp8Block128
        );
        assert!(Quant::parse(Some("int4")).is_err());
    }

    #[test]
    fn labels_round_trip() {
        for label in [
            "cuda_mma:t64",
            "cuda_wgmma:t128",
            "cuda_decode",
            "vllm_triton",
            "flashinfer_cutlass",
        ] {
            assert_eq!(Choice::from_label(label).label(), label);
        }
        assert_eq!(
            Choice::from_label("cuda_mma:t16"),
            Choice::Swapmoe {
                backend: Backend::CudaMma,
                token_tile: Some(16),
                swap: None
            }
        );
        assert_eq!(
            Choice::from_label("cuda_wgmma:t64"),
            Choice::Swapmoe {
                backend: Backend::CudaWgmma,
                token_tile: Some(64),
                swap: None
            }
        );
        assert_eq!(
            Choice::from_label("cuda_tcgen05"),
            Choice::Unknown("cuda_tcgen05".into())
        );
        // cuda_wgmma_swap's launch variants
        let v = Choice::from_label("cuda_wgmma_swap:r2p0");
        assert_eq!(
            v,
            Choice::Swapmoe {
                backend: Backend::CudaWgmmaSwap,
                token_tile: None,
                swap: Some(SwapLaunch {
                    gemm1_ring: 2,
                    gemm2_pdl: false,
                    gemm2_ring: None
                })
            }
        );
        assert_eq!(v.label(), "cuda_wgmma_swap:r2p0");
        assert_eq!(
            v.to_string(),
            "cuda_wgmma_swap (GEMM1 ring 2, GEMM2 after GEMM1)"
        );
        assert_eq!(
            Choice::from_label("cuda_wgmma_swap:r0p1").label(),
            "cuda_wgmma_swap:r0p1"
        );
        // with the e4m3 GEMM2's ring
        let g = Choice::from_label("cuda_wgmma_swap:r0p1g7");
        assert_eq!(g.label(), "cuda_wgmma_swap:r0p1g7");
        assert_eq!(
            g.to_string(),
            "cuda_wgmma_swap (GEMM1 ring its own, GEMM2 by PDL, GEMM2 ring 7)"
        );
        assert_eq!(
            Choice::from_label("cuda_wgmma_swap:r3p1g0").to_string(),
            "cuda_wgmma_swap (GEMM1 ring 3, GEMM2 by PDL, GEMM2 ring its own)"
        );
        for bad in ["r0p1g1", "r0p1g", "r0pg7", "r0p2g7", "r0p1g7x"] {
            assert_eq!(
                Choice::from_label(&format!("cuda_wgmma_swap:{bad}")),
                Choice::Unknown(format!("cuda_wgmma_swap:{bad}")),
                "{bad}"
            );
        }
        for bad in [
            "cuda_wgmma_swap:r1p0",
            "cuda_wgmma_swap:r2p2",
            "cuda_wgmma_swap:x",
            "cuda_wgmma_swap:r2",
        ] {
            assert_eq!(
                Choice::from_label(bad),
                Choice::Unknown(bad.into()),
                "{bad}"
            );
        }
        assert!(ExternalBackend::parse_list(&["vllm_triton"]).is_ok());
        assert!(ExternalBackend::parse_list(&["triton"]).is_err());
    }

    #[test]
    fn parses_entries_sorted_with_times_fastest_first() {
        let t = parse(
            r#"{"metadata": {"E": 8, "N": 64, "K": 256, "topk": 2},
                "_comment": "hand-written",
                "64": {"backend": "cuda_mma", "token_tile": 64,
                       "times_us": {"cuda_mma:t64": 10.0, "cuda_mma:t16": 12.5, "vllm_triton": 9.0}},
                "1": {"backend": "cuda_decode", "time_us": 3.5, "source": "x"}}"#,
        )
        .unwrap();
        assert_eq!((t.meta.k, t.meta.topk), (Some(256), Some(2)));
        assert_eq!(t.entries.iter().map(|e| e.m).collect::<Vec<_>>(), [1, 64]);
        assert_eq!(t.entries[0].time_us, Some(3.5));
        let labels: Vec<String> = t.entries[1].times_us.iter().map(|x| x.0.label()).collect();
        assert_eq!(labels, ["vllm_triton", "cuda_mma:t64", "cuda_mma:t16"]);
    }

    #[test]
    fn nearest_m_with_ties_to_the_smaller() {
        let t = parse(
            r#"{"1": {"backend": "cuda_decode"}, "8": {"backend": "cuda_generic"},
                "64": {"backend": "cuda_mma", "token_tile": 16}}"#,
        )
        .unwrap();
        let at = |m| t.nearest(m).unwrap().m;
        assert_eq!(at(1), 1);
        assert_eq!(at(4), 1); // 3 from 1, 4 from 8
        assert_eq!(at(5), 8);
        assert_eq!(at(36), 8); // tie: 28 from 8 and from 64
        assert_eq!(at(37), 64);
        assert_eq!(at(100000), 64);
        assert!(parse("{}").unwrap().nearest(3).is_none());
        // used only within 2x of the entry's M
        let used = |m| t.lookup(m).map(|e| e.m);
        let pow2 =
            parse(r#"{"16": {"backend": "cuda_mma"}, "32": {"backend": "cuda_mma"}}"#).unwrap();
        assert_eq!(pow2.lookup(24).unwrap().m, 16); // a tie inside the covered range: the smaller M
        assert_eq!(pow2.lookup(25).unwrap().m, 32);
        assert_eq!(used(0), Some(1));
        assert_eq!(used(2), Some(1));
        assert_eq!(used(3), None); // 1 and 8 are both more than 2x away
        assert_eq!(used(4), Some(8));
        assert_eq!(used(16), Some(8));
        assert_eq!(used(20), None); // 8 and 64 are both more than 2x away
        assert_eq!(used(32), Some(64)); // 8 is nearer by |M - key| but does not cover 32
        assert_eq!(used(36), Some(64));
        assert_eq!(used(128), Some(64));
        assert_eq!(used(129), None);
        assert!(covers(64, 128) && covers(64, 32) && !covers(64, 31) && !covers(64, 129));
    }

    #[test]
    fn malformed_tables_say_why() {
        for (text, needle) in [
            ("{not json", "not valid JSON"),
            ("[1, 2]", "JSON object"),
            (r#"{"eight": {"backend": "cuda_decode"}}"#, "token count"),
            (r#"{"0": {"backend": "cuda_decode"}}"#, "token count"),
            (r#"{"8": "cuda_decode"}"#, "M=8: expected an object"),
            (r#"{"8": {"token_tile": 16}}"#, "backend"),
            (
                r#"{"8": {"backend": "cuda_decode", "token_tile": 16}}"#,
                "only for cuda_mma and cuda_wgmma",
            ),
            (
                r#"{"8": {"backend": "cuda_mma", "token_tile": -16}}"#,
                "token_tile",
            ),
            (
                r#"{"8": {"backend": "cuda_mma", "times_us": {"cuda_mma:t16": "fast"}}}"#,
                "times_us.cuda_mma:t16",
            ),
            (
                r#"{"8": {"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 2}}"#,
                "go together",
            ),
            (
                r#"{"8": {"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 1, "swap_gemm2_pdl": true}}"#,
                "expected 0 (the kernel's own ring) or at least 2, got 1",
            ),
            (
                r#"{"8": {"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 2, "swap_gemm2_pdl": 0}}"#,
                "swap_gemm2_pdl: expected true or false",
            ),
            (
                r#"{"8": {"backend": "cuda_mma", "swap_gemm1_ring": 2, "swap_gemm2_pdl": true}}"#,
                "only for cuda_wgmma_swap",
            ),
            (
                r#"{"8": {"backend": "cuda_wgmma_swap", "swap_gemm2_ring": 7}}"#,
                "swap_gemm2_ring goes with swap_gemm1_ring and swap_gemm2_pdl",
            ),
            (
                r#"{"8": {"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 0, "swap_gemm2_pdl": true, "swap_gemm2_ring": 1}}"#,
                "swap_gemm2_ring: expected 0 (the kernel's own ring) or at least 2, got 1",
            ),
            (r#"{"metadata": {"E": 16}}"#, "file name says E=8"),
            (r#"{"metadata": 3}"#, "metadata"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
        // unknown backends parse (newer builds' tables) and are rejected when planned
        let t = parse(r#"{"8": {"backend": "cuda_tcgen05"}}"#).unwrap();
        assert_eq!(t.entries[0].choice, Choice::Unknown("cuda_tcgen05".into()));
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("swapmoe-tables-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn user_folder_replaces_shipped_files_of_the_same_name() {
        let (shipped, user) = (tmpdir("s"), tmpdir("u"));
        let a = "E=8,N=64,device_name=NVIDIA_H200,dtype=bf16.json";
        let b = "E=16,N=64,device_name=NVIDIA_H200,dtype=bf16.json";
        std::fs::write(shipped.join(a), r#"{"1": {"backend": "cuda_decode"}}"#).unwrap();
        std::fs::write(shipped.join(b), r#"{"1": {"backend": "cuda_decode"}}"#).unwrap();
        // the user's file spells the separators ';' and still replaces the shipped one
        std::fs::write(
            user.join(a.replace(',', ";")),
            r#"{"1": {"backend": "cuda_generic"}}"#,
        )
        .unwrap();
        std::fs::write(user.join("notes.txt"), "not a table").unwrap();
        let set = TableSet::load(Some(&shipped), Some(&user));
        assert_eq!(set.files().len(), 2);
        let Some(Loaded::Ok(t)) = set.get(a) else {
            panic!("{a} not loaded")
        };
        assert_eq!(
            (t.origin, t.entries[0].choice.label()),
            (Origin::User, "cuda_generic".into())
        );
        assert_eq!(set.get(b).unwrap().origin(), Origin::Shipped);
        // a malformed user file replaces the shipped one too, and says why
        std::fs::write(user.join(b), "{oops").unwrap();
        let set = TableSet::load(Some(&shipped), Some(&user));
        assert!(
            matches!(set.get(b), Some(Loaded::Bad { origin: Origin::User, error, .. }) if error.contains("JSON"))
        );
        // a missing folder is a reason, not an error
        let set = TableSet::load(Some(&shipped), Some(&user.join("missing")));
        assert_eq!(set.files().len(), 2);
        assert!(set.searched().contains("cannot be listed"));
        let _ = std::fs::remove_dir_all(shipped);
        let _ = std::fs::remove_dir_all(user);
    }

    #[test]
    fn shipped_seed_tables_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/swapmoe/tables");
        let set = TableSet::load(Some(&dir), None);
        assert!(set.dir_errors.is_empty(), "{:?}", set.dir_errors);
        let files = set.files();
        assert!(files.len() >= 3, "{} tables", files.len());
        for (name, loaded) in files {
            match loaded {
                Loaded::Ok(t) => {
                    assert!(!t.entries.is_empty(), "{name} has no entries");
                    let meta = &t.meta;
                    assert!(meta.k.is_some() && meta.topk.is_some(), "{name}: K, topk");
                }
                Loaded::Bad { error, .. } => panic!("{name}: {error}"),
            }
        }
    }

    #[test]
    fn tables_switch_values() {
        for v in ["off", "OFF", " 0 ", "none"] {
            assert_eq!(tables_switch(Some(v)), (true, None), "{v:?}");
        }
        for v in [None, Some(""), Some("on"), Some("1"), Some("auto")] {
            assert_eq!(tables_switch(v), (false, None), "{v:?}");
        }
        // a typo keeps the tables on and says so (swapmoe check, the plans' reasons)
        let (off, why) = tables_switch(Some("of"));
        assert!(!off);
        let why = why.expect("a reason for an unknown value");
        assert!(
            why.starts_with("$SWAPMOE_TABLES: expected off") && why.contains("got \"of\""),
            "{why}"
        );
    }
}
