//! The backend oracle: (problem, device) -> Plan. Every choice of backend, kernel variant
//! and tile lives here, with a one-line reason; launch code only carries a plan out.

use crate::error::{Error, Result};
use crate::problem::{
    DType, Device, Fp8Quant, MoeProblem, QuantScheme, FP8_BLOCK, MAX_GPU_LOCAL_EXPERTS,
};
use crate::routing::{RouterConfig, Scoring};
use crate::tables::{self, ActivationScales, Choice, ExternalBackend, Loaded, Quant, TableSet};
use std::collections::HashSet;
use std::fmt;
use std::sync::Mutex;

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
/// Threads per CTA of the Hopper bulk-copy decode kernels: 8 consumer warps and one
/// producer warp (`kThreads` in cuda/sm90_bulk_decode.cu).
pub const BULK_THREADS: usize = 288;
/// Output rows per work item of the bulk-copy decode kernels (`kRows`).
pub const BULK_ROWS_PER_ITEM: usize = 8;
/// Slots per pass of the bulk-copy GEMM1 (`kTok`).
pub const BULK_TOKENS_PER_PASS: usize = 4;
/// Largest M*topk the bulk-copy decode kernels hold (`kMaxSlots`).
pub const BULK_MAX_SLOTS: usize = 64;
/// Dynamic shared memory of a bulk-copy decode kernel: 5 stages of 20 KiB (`kStages`,
/// `kStageBytes`). GEMM1 and GEMM2 CTAs fit on one SM together (2 x 100 KiB), so GEMM2's
/// weight stream starts under GEMM1's tail.
pub const BULK_SMEM_BYTES: usize = 5 * 20480;
/// Token tiles (rows) the Hopper wgmma GEMMs are built for (`Tile<BM>` in
/// cuda/sm90_wgmma_moe.cu): the route_align token tile of a cuda_wgmma plan.
pub const WGMMA_TOKEN_TILES: [usize; 2] = [64, 128];
/// The wgmma token tile the heuristic takes up to this many expected slots per active
/// expert: 64 (fewer padded rows when an expert holds under one 64-row tile), 128 beyond.
/// From the shipped H200 tables (`swapmoe tune` of 2026-12-02/03, t64 against t128 at every
/// public shape): at 32 slots per expert and fewer t64 won every point (at 32: all 7, by
/// 1-20%); at 64 t128 won the three bf16 points (by 7-12%) and the two fp8_tensor ones (by
/// 0.6-3%), t64 the two fp8_block128 ones (by 1-3%); from 128 on t128 won all 15 (by
/// 3-39%). It was 192 from wgmma v1's kernels, which cost deepseek-v3-tp8 M = 4096 (128
/// slots) 8-10% wherever no table held the shape.
pub const WGMMA_SMALL_TILE_MAX_SLOTS_PER_EXPERT: f64 = 48.0;
/// Fewest expected slots per active expert for which the bf16/fp16 heuristic takes the
/// swap-AB kernels no more (past their token range it is the wgmma or mma GEMMs). Measured
/// (H200, `swapmoe tune`, benches/NOTES.md "wgmma v1"): from 16 slots per expert on,
/// cuda_wgmma won at every point of the three public shapes.
pub const WGMMA_HEURISTIC_MIN_SLOTS_PER_EXPERT: f64 = 16.0;
/// Fewest expected slots per active expert for which the heuristic takes cuda_wgmma over
/// cuda_mma on Hopper. Measured (H200, benches/NOTES.md "wgmma over mma from 4 slots per
/// expert"): under expert parallelism (deepseek-v3-tp8 and qwen3-30b-a3b over 8 ranks, each
/// backend forced) cuda_wgmma won from ~4 slots per local expert on by 3-20% and cuda_mma
/// below ~2.2 by up to 18%; in the shipped tables of the whole models the two are within
/// 1.5% of each other at 4-8 slots per expert.
pub const WGMMA_OVER_MMA_MIN_SLOTS_PER_EXPERT: f64 = 4.0;
/// Threads per CTA of cuda_wgmma's FP8 intermediate quantization (`kQuantInterThreads`).
pub const WGMMA_QUANT_INTER_THREADS: usize = 128;
/// Columns per CTA of the wgmma GEMMs: GEMM1 128 inter columns (128 gate + 128 up rows of
/// w1), GEMM2 256 output columns (`kBN`).
pub const WGMMA_GEMM1_COLUMNS: usize = 128;
pub const WGMMA_GEMM2_COLUMNS: usize = 256;
/// Resident CTAs per SM of the wgmma GEMMs (their stages take ~200 KiB of shared memory):
/// a persistent grid is this many CTAs per SM, each looping over work items.
pub const WGMMA_CTAS_PER_SM: usize = 1;
/// Most k-stages per work item for which a wgmma GEMM runs as a persistent grid (the next
/// item's loads under the last one's epilogue) instead of one CTA per item. Measured (H200,
/// benches/NOTES.md "wgmma v3"): deepseek-v3-tp8's GEMM2 (2-4 stages) 4-8% faster per layer;
/// items of 16 and more stages (GEMM1s, Mixtral) within -4% to +4%.
pub const WGMMA_PERSISTENT_MAX_STAGES: usize = 8;
/// The same for the FP8 GEMMs (stages of 128 e4m3 of K). Measured (H200, benches/NOTES.md
/// "FP8 wgmma v3"): qwen3-30b-a3b's GEMM1 (16 stages) persistent 2.6-3.2% faster per layer
/// at M = 1024 and 4096 (per-tensor); deepseek-v3-tp8's (56 stages) -1 to -2%, within the
/// spread; Mixtral with both GEMMs (32 and 112 stages) persistent 6% slower at M = 4096.
pub const WGMMA_FP8_PERSISTENT_MAX_STAGES: usize = 16;
/// GEMM1 also runs as a persistent grid past the stage rule when an expert has at most this
/// many column blocks (`WGMMA_GEMM1_COLUMNS` inter columns each), its items at most
/// `WGMMA_GEMM1_FEW_BLOCKS_MAX_STAGES` k-stages and each expert at least
/// `WGMMA_GEMM1_FEW_BLOCKS_MIN_TOKENS` expected tokens (the loads measured; decode sizes keep
/// the stage rule). Measured (H200, benches/NOTES.md "Persistent GEMM1 by column blocks per
/// expert"), persistent against one CTA per item: qwen3-30b-a3b bf16 (6 blocks, 32 stages)
/// 1-4% faster and deepseek-v3-tp8 FP8 (2 blocks, 56 stages) 0-4% faster at M = 1024-4096
/// (64-256 and 32-128 tokens per expert); deepseek bf16 (2 blocks, 112 stages) 0-1% slower;
/// Mixtral (112 blocks) 0-3% slower in bf16 and FP8.
pub const WGMMA_GEMM1_PERSISTENT_MAX_BLOCKS: usize = 8;
pub const WGMMA_GEMM1_FEW_BLOCKS_MAX_STAGES: usize = 64;
pub const WGMMA_GEMM1_FEW_BLOCKS_MIN_TOKENS: usize = 32;
/// Threads per CTA of the wgmma GEMMs: a producer warpgroup and two consumer warpgroups.
pub const WGMMA_THREADS: usize = 384;
/// Dynamic shared memory of the wgmma GEMMs with token tile `tile`: 4 (tile 128) or 5
/// (tile 64) stages of a tile x 64 token block and a 256 x 64 weight block, plus 1 KiB to
/// align them (`Tile<BM>::kSmemBytes`).
pub fn wgmma_smem_bytes(tile: usize) -> usize {
    wgmma_stages(tile) * (tile * 64 * 2 + 256 * 64 * 2) + 1024
}
/// Shared-memory stages of the wgmma GEMMs' ring at token tile `tile` (`Tile<BM>::kStages`).
pub fn wgmma_stages(tile: usize) -> usize {
    if tile >= 128 {
        4
    } else {
        5
    }
}
/// Rows per TMA box of GEMM1's gate and up blocks (`Tile<BM>::kGateBox`).
pub fn wgmma_gate_box(tile: usize) -> usize {
    if tile >= 128 {
        128
    } else {
        64
    }
}
/// Threads per CTA of the row gather before a pre-gathered GEMM1 (`kPreGatherThreads`).
pub const WGMMA_GATHER_THREADS: usize = 128;
/// Smallest N (intermediate size) for which cuda_wgmma gathers the token rows once before
/// GEMM1 and streams them by TMA, instead of gathering them inside GEMM1 with cp.async.
/// Measured (H200, benches/NOTES.md "wgmma v2"): the in-kernel gather is 5-13% faster on
/// qwen3 (N=768) and deepseek-v3-tp8 (N=256), 8% slower on Mixtral (N=14336) at M=4096.
pub const WGMMA_PREGATHER_MIN_N: usize = 4096;
/// Threads per CTA of the wgmma path's top-k sum, 8 columns each (`kReduceThreads`).
pub const WGMMA_REDUCE_THREADS: usize = 128;
/// Token tiles that sweep the column blocks together (grid rasterization): 8 tiles share
/// each weight block while it is in L2, and 8 x 128 token rows of activations stay in L2.
pub const WGMMA_RASTER_GROUP: usize = 8;
/// Token columns (wgmma N) of the swap-AB decode kernels: the plan takes the smallest that
/// holds M (`NT` in cuda/sm90_swap_decode.cu).
pub const SWAP_TOKEN_TILES: [usize; 4] = [8, 16, 32, 64];
/// Largest M the swap-AB decode kernels take (one accumulator column per token).
pub const SWAP_MAX_TOKENS: usize = 64;
/// Largest M*topk (`kMaxSlots`: the slots' experts are held in shared memory).
pub const SWAP_MAX_SLOTS: usize = 512;
/// Weight rows per swap-AB CTA: wgmma's 64-row A slot (`kRows`).
pub const SWAP_ROWS: usize = 64;
/// Threads per swap-AB CTA: a consumer warpgroup and a producer warp (`kThreads`).
pub const SWAP_THREADS: usize = 160;
/// Largest thread-block cluster the swap-AB kernels split a CTA's work over (portable size).
pub const SWAP_MAX_SPLITS: usize = 8;
/// `$SWAPMOE_SWAP_SPLITS` = "g1,g2": force the swap-AB kernels' cluster sizes (GEMM1's K
/// split, GEMM2's expert split), each 1, 2, 4 or 8; for tuning.
pub const SWAP_SPLITS_ENV: &str = "SWAPMOE_SWAP_SPLITS";
/// 64-wide K slices per stage of the swap-AB kernels (`kSub`): each weight row is read as
/// slices x 128 contiguous bytes at once.
pub const SWAP_K_SLICES: [usize; 2] = [1, 4];
/// The heuristic's range for cuda_wgmma_swap (measured, H200, `swapmoe tune`, benches/NOTES.md
/// "swap v1"): experts at least this wide (Mixtral, N = 14336) ran 0.1-2.3% faster than every
/// other swapmoe backend at M = 1-32 (and 5-25% faster than cuda_decode, whose GEMM2 leaves
/// warps idle on few slots)...
pub const SWAP_WIDE_MIN_N: usize = 4096;
pub const SWAP_WIDE_HEURISTIC_MAX_TOKENS: usize = 32;
/// ...and narrower experts (qwen3, deepseek-v3-tp8) 2-4% faster past cuda_decode's range up to
/// M = 16 (qwen3 M = 16 is 3% slower than cuda_wgmma); from M = 32 GEMM1's grid of many short
/// CTAs, in many waves, loses (up to 3.7x at M = 64).
pub const SWAP_HEURISTIC_MAX_TOKENS: usize = 16;
/// ...and past that, up to this many tokens, where the slots spread so thin that each active
/// expert expects at most `SWAP_SPARSE_MAX_SLOTS_PER_EXPERT` of them (many experts, as
/// DeepSeek-V3's 256): in the shipped tables, deepseek-v3-tp8 bf16 M = 32 (1.58 slots per
/// active expert) ran swap-AB with its own launch 457.5 µs against cuda_mma t16's 499.9 and
/// cuda_wgmma t64's 467.9 (H200), 596.2 against 635.2 and 613.0 (H100); at 2.3 slots per
/// active expert (E = 128 at M = 32) the other GEMMs won in 5 of the 7 tables of that point.
/// Measured with `benches/heuristics_vs_tables.py` (NOTES "The heuristics against every shipped
/// table").
pub const SWAP_SPARSE_HEURISTIC_MAX_TOKENS: usize = 32;
/// The most expected slots per active expert (distinct-expert estimate) for which the
/// heuristic keeps swap-AB past `SWAP_HEURISTIC_MAX_TOKENS` (see above).
pub const SWAP_SPARSE_MAX_SLOTS_PER_EXPERT: f64 = 2.0;
/// Smallest N from which GEMM2 of cuda_wgmma_swap takes 4 K slices per stage: measured
/// (H200, benches/NOTES.md "swap v1", GEMM2 slices 4 against 1) Mixtral (N = 14336) M = 1-16
/// 6-12% faster; qwen3 (N = 768) 5-6% slower, deepseek-v3-tp8 (N = 256) 20% slower at M = 1
/// and within 1% at M = 4-16 (fewer stages in flight).
pub const SWAP_GEMM2_WIDE_SLICE_MIN_N: usize = 4096;
/// Smallest N from which cuda_wgmma_swap's GEMM2 runs one CTA per SM
/// (`Plan::swap_gemm2_one_per_sm`). Measured (H200, FP8 per-tensor static scales, benches/NOTES.md
/// "Swap GEMM2 one CTA per SM"): Mixtral (N = 14336) M = 1 111.1-111.6 -> 97.2-97.3 us; one
/// CTA per SM forced (the ring-sized experiment build, against the release build) qwen3
/// (N = 768) M = 1 / 8 21.2 / 85.7 -> 28.6 / 119.9, deepseek-v3-tp8 (N = 256) 26.9 / 99.2 ->
/// 33.2 / 134.3.
/// Launched under GEMM1 (PDL), two per SM, GEMM2's CTAs took the SMs GEMM1 freed first: 128
/// CTAs on 64-68 SMs, streaming w2 at 2.7-3.9 TB/s (stamps). Where rows are short, GEMM2 is
/// mostly start-up, and waiting for whole SMs costs more than the spread gains.
pub const SWAP_GEMM2_ONE_PER_SM_MIN_N: usize = 4096;
/// `$SWAPMOE_SWAP_GEMM2_ONE_PER_SM` = "0" | "1": force `Plan::swap_gemm2_one_per_sm`; for tuning.
pub const SWAP_GEMM2_ONE_PER_SM_ENV: &str = "SWAPMOE_SWAP_GEMM2_ONE_PER_SM";
/// Dynamic shared memory a swap-AB GEMM2 asks for to run one CTA per SM: more than half of
/// an SM's 228 KiB less its static shared memory (~5.3 KiB) and the 1 KiB every CTA reserves,
/// so two cannot share an SM, while one GEMM1 CTA (~109 KiB with both) still fits beside it.
/// The kernel's ring stays its own; the rest is unused.
pub const SWAP_GEMM2_ONE_PER_SM_SMEM_BYTES: usize = 112 * 1024;
/// `$SWAPMOE_SWAP_GEMM2_PDL` = "0" | "1": force `Plan::swap_gemm2_pdl` (where the plan has
/// PDL at all); for tuning.
pub const SWAP_GEMM2_PDL_ENV: &str = "SWAPMOE_SWAP_GEMM2_PDL";
/// `$SWAPMOE_WGMMA_GEMM1_PDL` = "0" | "1": force `Plan::wgmma_gemm1_pdl` (on sm_90+, where
/// the plan has kernels before GEMM1); for tuning.
pub const WGMMA_GEMM1_PDL_ENV: &str = "SWAPMOE_WGMMA_GEMM1_PDL";
/// Shared memory of one Hopper SM (228 KiB), of which each resident CTA also reserves 1 KiB.
pub const SM_SHARED_MEMORY_BYTES: usize = 228 * 1024;
/// CTAs with `smem` bytes of dynamic shared memory that fit one SM's shared memory.
pub fn resident_ctas_per_sm(smem: usize) -> usize {
    (SM_SHARED_MEMORY_BYTES / (smem + 1024)).max(1)
}
/// Whether a swap-AB kernel whose own ring has `own_ring` stages can run a ring of `ring`
/// (an override's or a table's): 0 (its own) or 2 to `own_ring`.
fn swap_ring_fits(ring: usize, own_ring: usize) -> bool {
    ring == 0 || (2..=own_ring).contains(&ring)
}
/// A ring override `$env` = `v` for the swap-AB `gemm` ("gemm1" or "gemm2") whose own ring
/// has `own_ring` stages: the ring (0 or 2..=own_ring; anything else is ignored: 0) and the
/// reason.
fn swap_ring_override(gemm: &str, env: &str, v: &str, own_ring: usize) -> (usize, String) {
    match v.trim().parse::<usize>() {
        Ok(n) if swap_ring_fits(n, own_ring) => (
            n,
            format!("{gemm}: a ring of {n} stages (0: the kernel's own, {own_ring}), forced by ${env}={v}"),
        ),
        _ => (
            0,
            format!("{gemm}: ${env}={v:?} ignored (expected 0 or 2 to {own_ring})"),
        ),
    }
}
/// The most swap-AB GEMM1 CTAs per SM that a smaller ring (`Plan::swap_gemm1_ring`) may
/// make room for: past 4 the ring has 2 stages, too few to keep a CTA streaming (qwen3-30b-a3b
/// M = 8 at 5 per SM: 2% slower than 2.45 waves of its own ring).
pub const SWAP_GEMM1_RING_MAX_CTAS_PER_SM: usize = 4;
/// The swap-AB GEMM1 ring where about one expert is active (`expected_active_experts` <=
/// `SWAP_FEW_EXPERTS_MAX_ACTIVE`: a rank under expert parallelism at M = 1-2, a top-1 model at
/// M = 1), whatever the wave count. The grid has a row of CTAs for each expert the M * topk
/// slots could reach; under expert parallelism most rows find no active expert and leave after
/// reading the routing: a smaller ring fits more CTAs per SM, so they pass sooner and GEMM2
/// (launched by PDL, which waits for every GEMM1 CTA to have started) starts earlier. With one
/// row (top-1) the ring of 3 measured as fast or faster too (`SWAP_FEW_EXPERTS_RING_ONE_ROW`).
pub const SWAP_FEW_EXPERTS_GEMM1_RING: usize = 3;
/// Most expected active experts for `SWAP_FEW_EXPERTS_GEMM1_RING`: at two (Mixtral at M = 1)
/// the ring of 3 measured 2.6-3.8% slower than the kernel's own.
pub const SWAP_FEW_EXPERTS_MAX_ACTIVE: f64 = 1.5;
/// What the ring of 3 measured where about one expert is active (H100, 2026-12-07; `swapmoe
/// tune` tables and three routing draws each in `swapmoe bench`, benches/NOTES.md "The swap
/// GEMM1 ring where one expert is active").
const SWAP_FEW_EXPERTS_RING_MEASURED: &str = "H100: Qwen3-235B-A22B EP8 M = 1 23.1-23.2 against 28.4-28.6 us with its own ring (bf16), 27.3-27.4 against 31.3-31.7 (128x128 blocks); DeepSeek-V3 EP16 128x128 blocks M = 1-2 36.1-37.6 against 36.4-39.4, EP8 M = 1 55.3 against 61.2; Llama-4-Scout TP8 M = 1 20.4 against 21.3";
/// Why, where the grid has more rows than active experts (H100 stamps, 2026-12-07;
/// benches/NOTES.md "Session of 2026-12-07 (13:46-)", item 4).
const SWAP_FEW_EXPERTS_RING_STAMPS: &str = "per-CTA stamps of Qwen3-235B-A22B EP8 M = 1, one expert active: 192 of GEMM1's 1536 CTAs work and finish by 14.5 us with every ring, while its last CTA enters at 20.6 us with its own ring (2 per SM), 15.1 with 3 stages and 8.9 with 2";
/// The same where every row works (H100, 2026-12-07; benches/NOTES.md "What the swap GEMM1's
/// idle grid rows cost").
const SWAP_FEW_EXPERTS_RING_ONE_ROW: &str = "with every row working (16 experts of N = 1536, K = 4096, top-1, M = 1) the ring of 3 measured 22.9 us against 23.6 with its own ring in bf16, 23.0 against 23.0 in 128x128 blocks";
/// What the one-wave ring measured (H200, swapmoe bench, cuda_wgmma_swap forced, two rounds;
/// benches/NOTES.md "Swap GEMM1 ring sized for one wave, measured" and "The e4m3 swap GEMM1's
/// ring sized for one wave").
const SWAP_GEMM1_RING_MEASURED: &str = "measured at one wave, the small ring releasing each stage as soon as its wgmmas complete: deepseek-v3-tp8 M = 16 (2 stages, 4 per SM) 280.0-281.3 us against 292.6-293.2 with its own ring, qwen3-30b-a3b M = 4 (4 stages, 3 per SM) 84.1 against 85.5, qwen3-30b-a3b M = 8 (2 stages, 5 per SM) 144.1 against 140.9-141.3; the e4m3 GEMM1: qwen3-30b-a3b fp8_tensor M = 4 (4 stages, 3 per SM) 51.2-51.3 against 53.5, mixtral-8x7b fp8_tensor M = 1 (2 stages, 4 per SM) 91.7 against 97.5-97.6";
/// Bytes of one stage of a swap-AB GEMM1 (bf16/fp16 or e4m3); 0 for any other kernel.
pub fn swap_gemm1_stage_bytes(gemm1: KernelId) -> usize {
    match gemm1 {
        KernelId::SwapGemm1Act(_, tile, slices) => swap_stage_bytes(tile, 2, slices),
        KernelId::SwapFp8Gemm1(_, tile) | KernelId::SwapFp8StaticGemm1(tile) => {
            swap_fp8_stage_bytes(tile, 2, false)
        }
        _ => 0,
    }
}
/// The swap-AB GEMM1 for `quant` (None: bf16/fp16 `dtype` with `slices` K slices per stage;
/// a static per-tensor intermediate scale: the kernel that writes e4m3 rows) at token tile
/// `tile`.
fn swap_gemm1_kernel(
    dtype: DType,
    quant: Option<Fp8Quant>,
    tile: usize,
    slices: usize,
) -> KernelId {
    match quant {
        None => KernelId::SwapGemm1Act(dtype, tile, slices),
        Some(q) if q.static_intermediate() => KernelId::SwapFp8StaticGemm1(tile),
        Some(q) => KernelId::SwapFp8Gemm1(q.scheme, tile),
    }
}
/// Dynamic shared memory of a swap-AB kernel with stages of `stage` bytes and a ring of
/// `ring` of them (0: the kernel's own): the stages and 1 KiB to align them. What its
/// launcher asks for; the kernel takes its ring from it.
fn swap_ring_smem_bytes(kernel: KernelId, stage: usize, ring: usize) -> usize {
    if ring > 0 {
        ring * stage + 1024
    } else {
        kernel.dynamic_smem_bytes().unwrap_or(0)
    }
}
/// Stages of a swap-AB kernel's own ring (stages of `stage` bytes): what its own shared
/// memory holds past the 1 KiB of alignment.
fn swap_own_ring(kernel: KernelId, stage: usize) -> usize {
    kernel
        .dynamic_smem_bytes()
        .unwrap_or(1024)
        .saturating_sub(1024)
        / stage.max(1)
}
/// Dynamic shared memory of the swap-AB GEMM1 `gemm1` (bf16/fp16 or e4m3) with a ring of
/// `ring` stages (0: the kernel's own).
pub fn swap_gemm1_smem_bytes(gemm1: KernelId, ring: usize) -> usize {
    swap_ring_smem_bytes(gemm1, swap_gemm1_stage_bytes(gemm1), ring)
}
/// `$SWAPMOE_SWAP_GEMM2_RING` = 0 | 2..: force `Plan::swap_gemm2_ring` of the e4m3 swap-AB
/// GEMM2s (0: the kernel's own ring); for tuning. Else `swap_gemm2_ring_rule`.
pub const SWAP_GEMM2_RING_ENV: &str = "SWAPMOE_SWAP_GEMM2_RING";
/// Static shared memory of the e4m3 swap-AB GEMM2s (their routing; ptxas -v: 5.2 KiB), rounded up.
pub const SWAP_GEMM2_STATIC_SMEM_BYTES: usize = 6 * 1024;
/// The fewest stages `swap_gemm2_ring_rule` gives the e4m3 GEMM2's ring.
pub const SWAP_GEMM2_RING_MIN: usize = 3;
/// The most k-stages per GEMM2 CTA, per stage of its ring, for which `swap_gemm2_ring_rule`
/// shrinks the ring: 5 / 2 (beyond it, a ring that small streams too few bytes once GEMM1 is
/// done: qwen3-30b-a3b M = 2, 24 stages per CTA, measured slower with rings of 7 to 3).
pub const SWAP_GEMM2_RING_MAX_ITEMS_PER_STAGE: (usize, usize) = (5, 2);
/// What the e4m3 GEMM2 ring measured (H200, swapmoe bench, fp8_tensor unless named, two
/// rounds; benches/NOTES.md "The e4m3 swap GEMM2 ring").
const SWAP_GEMM2_RING_MEASURED: &str = "qwen3-30b-a3b M = 1 (12 stages per CTA) 20.2 us with rings of 5 and 4 against 21.1-21.2 with its own 11 (128x128 blocks: 26.7 against 28.1); at qwen3-30b-a3b M = 2 (24 per CTA) rings of 5 and 4 cost +2.6 and +5.6 us";
/// What a smaller e4m3 GEMM2 ring measured where its own ring holds all of a CTA's k-stages
/// (H200, swapmoe bench, three rounds; benches/NOTES.md "The e4m3 swap GEMM2 ring").
const SWAP_GEMM2_RING_OWN_HOLDS_ALL: &str = "deepseek-v3-tp8 M = 1, 8 k-stages per CTA, ring of 5: 24.0-24.1 us against 24.0-24.1 per tensor, 31.6 against 31.2-31.3 with 128x128 blocks";
/// Bytes of one stage of an e4m3 swap-AB GEMM2, the ones whose ring the launcher may shrink;
/// 0 for any other kernel (the bf16/fp16 GEMM2 keeps its own ring: a ring read at run time
/// cost it 0.6-1.1 us at qwen3-30b-a3b M = 1-4, and smaller rings measured no faster).
pub fn swap_gemm2_stage_bytes(gemm2: KernelId) -> usize {
    match gemm2 {
        KernelId::SwapFp8Gemm2Sum(_, _, tile) => swap_fp8_stage_bytes(tile, 1, true),
        KernelId::SwapFp8StaticGemm2Sum(_, tile) => swap_fp8_stage_bytes(tile, 1, false),
        _ => 0,
    }
}
/// Dynamic shared memory of the e4m3 swap-AB GEMM2 `gemm2` with a ring of `ring` stages
/// (0: the kernel's own).
pub fn swap_gemm2_smem_bytes(gemm2: KernelId, ring: usize) -> usize {
    swap_ring_smem_bytes(gemm2, swap_gemm2_stage_bytes(gemm2), ring)
}
/// GEMM2 CTAs of `gemm2_smem` bytes of shared memory each (dynamic and static) that fit beside
/// one wave of `gemm1_ctas` GEMM1 CTAs of `gemm1_smem` bytes each, spread over `sms` SMs in
/// turn (the fullest SMs hold `gemm1_ctas / sms` rounded up, the others one fewer); each CTA
/// also takes 1 KiB the SM reserves.
pub fn swap_gemm2_slots(
    sms: usize,
    gemm1_ctas: usize,
    gemm1_smem: usize,
    gemm2_smem: usize,
) -> usize {
    let sms = sms.max(1);
    let per_sm = gemm1_ctas.div_ceil(sms);
    let fullest = gemm1_ctas + sms - sms * per_sm.max(1);
    let fit = |g1: usize| {
        SM_SHARED_MEMORY_BYTES.saturating_sub(g1 * (gemm1_smem + 1024)) / (gemm2_smem + 1024)
    };
    fullest * fit(per_sm) + (sms - fullest) * fit(per_sm.saturating_sub(1))
}
/// The e4m3 swap-AB GEMM2's ring (`Plan::swap_gemm2_ring`, 0: its own) and why, from the GEMM1
/// beside it (`gemm1` with ring `gemm1_ring`, ~`gemm1_ctas` CTAs) and its own ~`gemm2_ctas`
/// CTAs of `gemm2_items` k-stages each on `sms` SMs. GEMM2 is launched under GEMM1 and
/// prefetches its first stages while GEMM1 runs, but only the CTAs that fit beside GEMM1's
/// get to (the others start as GEMM1's leave, and their stages are what GEMM2 then waits
/// for). So where GEMM1 runs in one wave and its own ring leaves some GEMM2 CTAs out, the
/// largest ring (at least `SWAP_GEMM2_RING_MIN`) under which all of them fit, provided each
/// CTA has more k-stages than its own ring holds (else the CTAs that fit already prefetch all
/// their weights: no faster measured) and at most `SWAP_GEMM2_RING_MAX_ITEMS_PER_STAGE` per
/// stage of that ring.
/// Token tile 8 only (the register files hold two CTAs of each there; larger tiles are not
/// measured).
#[allow(clippy::too_many_arguments)]
pub fn swap_gemm2_ring_rule(
    gemm2: KernelId,
    gemm1: KernelId,
    gemm1_ring: usize,
    gemm1_ctas: usize,
    gemm2_ctas: usize,
    gemm2_items: usize,
    sms: usize,
    wanted: bool,
) -> (usize, Option<String>) {
    let stage = swap_gemm2_stage_bytes(gemm2);
    let own = swap_own_ring(gemm2, stage);
    let tile = match gemm1 {
        KernelId::SwapFp8Gemm1(_, t) | KernelId::SwapFp8StaticGemm1(t) => t,
        _ => 0,
    };
    if stage == 0 || tile != 8 {
        return (
            0,
            wanted.then(|| {
                format!("gemm2: its own ring of {own} stages (smaller rings only at token tile 8)")
            }),
        );
    }
    if gemm2_items <= own {
        return (0, wanted.then(|| format!("gemm2: its own ring of {own} stages (it holds all {gemm2_items} k-stages of a CTA, so the CTAs beside GEMM1's prefetch all their weights; {SWAP_GEMM2_RING_OWN_HOLDS_ALL})")));
    }
    let gemm1_per_sm = gemm1_ctas.div_ceil(sms.max(1));
    if gemm1_per_sm > swap_gemm1_ctas_per_sm(gemm1, tile, gemm1_ring) {
        return (0, wanted.then(|| format!("gemm2: its own ring of {own} stages (GEMM1's ~{gemm1_ctas} CTAs take more than one wave: GEMM2 CTAs beside them would hold back the rest)")));
    }
    let gemm1_smem = swap_gemm1_smem_bytes(gemm1, gemm1_ring) + SWAP_GEMM1_STATIC_SMEM_BYTES;
    let slots = |ring: usize| {
        swap_gemm2_slots(
            sms,
            gemm1_ctas,
            gemm1_smem,
            swap_gemm2_smem_bytes(gemm2, ring) + SWAP_GEMM2_STATIC_SMEM_BYTES,
        )
    };
    let own_slots = slots(own);
    if own_slots >= gemm2_ctas {
        return (0, wanted.then(|| format!("gemm2: its own ring of {own} stages (its ~{gemm2_ctas} CTAs fit beside GEMM1's)")));
    }
    let Some(ring) = (SWAP_GEMM2_RING_MIN..own)
        .rev()
        .find(|&r| slots(r) >= gemm2_ctas)
    else {
        return (0, wanted.then(|| format!("gemm2: its own ring of {own} stages (~{own_slots} of its ~{gemm2_ctas} CTAs fit beside GEMM1's, and no ring of {SWAP_GEMM2_RING_MIN} or more fits them all)")));
    };
    let (num, den) = SWAP_GEMM2_RING_MAX_ITEMS_PER_STAGE;
    if gemm2_items * den > num * ring {
        return (0, wanted.then(|| format!("gemm2: its own ring of {own} stages (~{own_slots} of its ~{gemm2_ctas} CTAs fit beside GEMM1's; a ring of {ring} would fit them all, but {gemm2_items} k-stages per CTA are more than {num}/{den} per stage of it; {SWAP_GEMM2_RING_MEASURED})")));
    }
    (ring, wanted.then(|| format!("gemm2: a ring of {ring} stages (its own: {own}) so that all its ~{gemm2_ctas} CTAs fit beside GEMM1's ~{gemm1_ctas} (~{own_slots} with its own) and prefetch under it ({gemm2_items} k-stages per CTA; {SWAP_GEMM2_RING_MEASURED})")))
}
/// Resident swap-AB GEMM1 CTAs per SM with a ring of `ring` stages (0: the kernel's own):
/// as many as shared memory (dynamic and static) and registers allow (the e4m3 GEMM1s use
/// as many registers per token tile as the bf16 ones, ptxas -v: 64, 80, 127, 255).
fn swap_gemm1_ctas_per_sm(gemm1: KernelId, tile: usize, ring: usize) -> usize {
    let dynamic = swap_gemm1_smem_bytes(gemm1, ring);
    resident_ctas_per_sm(dynamic + SWAP_GEMM1_STATIC_SMEM_BYTES)
        .min(swap_gemm1_max_ctas_per_sm(tile))
}
/// What launching the swap-AB GEMM1 without PDL measured where its grid fits one wave
/// (H200, fused_experts back to back in a graph of 8 layers, benches/NOTES.md "First-kernel
/// PDL"); where it takes more waves, PDL measured 0.2-0.9 us faster (qwen3-30b-a3b M = 4, 8).
const SWAP_ONE_WAVE_FIRST_PDL_MEASURED: &str = "deepseek-v3-tp8 M = 8 took 124.0 us per layer against 141.6 with PDL (routing bench) and 162.3 against 166.2 (swapmoe bench), M = 1 31.7-32.0 against 32.0-32.1";
/// `$SWAPMOE_WGMMA_PREGATHER` = "on" | "off" (else the N rule): whether cuda_wgmma's GEMM1
/// reads token rows gathered beforehand (by TMA) or gathers them itself; for tuning.
pub const WGMMA_PREGATHER_ENV: &str = "SWAPMOE_WGMMA_PREGATHER";
/// `$SWAPMOE_ALIGN_IN_GEMM1` = "on" | "off" | "auto" (else the rule): whether cuda_wgmma's
/// GEMM1 groups the slots itself (`Plan::align_in_gemm1`); "on" still needs the grouping to
/// fit GEMM1's shared memory and no pre-gathered rows. For tuning and tests.
pub const ALIGN_IN_GEMM1_ENV: &str = "SWAPMOE_ALIGN_IN_GEMM1";
/// Most slots (M·topk) for which cuda_wgmma's GEMM1 groups them itself in every CTA instead
/// of after a route_align launch: a CTA's grouping is a few shared-memory passes over the
/// slots, against the align kernel's launch and its own passes on the critical path of every
/// layer (H100, graph timelines of 2026-12-06: 6.0-6.7 us of align, plus the quantize-x
/// kernel's 2 us after it, before GEMM1 starts, at qwen3-30b-a3b and deepseek-v3-tp8
/// M = 16-64). 512 is the decode range (M <= 64 at topk 8).
pub const ALIGN_IN_GEMM1_MAX_SLOTS: usize = 512;
/// Shared memory a CTA may have on sm_90 (227 KiB, static and dynamic together).
pub const SM90_MAX_SMEM_PER_CTA_BYTES: usize = 227 * 1024;
/// Dynamic shared memory a wgmma GEMM1 launch may ask for: an sm_90 CTA's, less 2 KiB for
/// the GEMM1s' static shared memory (barriers, the grouping's scan scratch, the block scales'
/// staging: 1248 bytes at most, `ptxas -v`; a unit test reads the build's ptxas output).
pub const WGMMA_GEMM1_MAX_SMEM_BYTES: usize = SM90_MAX_SMEM_PER_CTA_BYTES - 2048;
/// Bytes of shared memory GEMM1's own grouping of the slots takes past its stages
/// (`cta_align_ints` in cuda/common/cta_align.cuh).
pub fn cta_align_smem_bytes(slots: usize, local_experts: usize, tiles_bound: usize) -> usize {
    4 * (3 * local_experts + 1 + 3 * slots + 2 * tiles_bound)
}
/// `Plan::wgmma_l2_hints` bit: cuda_wgmma's weight loads (TMA) ask L2 to evict their lines
/// first (`createpolicy ... evict_first`), so that the token rows stay.
pub const WGMMA_L2_WEIGHTS_EVICT_FIRST: u8 = 1;
/// `Plan::wgmma_l2_hints` bit: cuda_wgmma's token-row loads (GEMM1's gathered x, GEMM2's
/// intermediate) ask L2 to keep their lines last (`evict_last`).
pub const WGMMA_L2_ACTS_EVICT_LAST: u8 = 2;
/// Smallest N (intermediate size) from which cuda_wgmma's loads carry L2 eviction hints at
/// any number of tokens per expert (`wgmma_l2_hints`).
pub const WGMMA_L2_HINTS_MIN_N: usize = 4096;
/// `$SWAPMOE_WGMMA_L2_HINTS` = 0-3: force `Plan::wgmma_l2_hints` (the bits above); for tuning.
/// Else the tokens-per-expert rule of `wgmma_l2_hints`.
pub const WGMMA_L2_HINTS_ENV: &str = "SWAPMOE_WGMMA_L2_HINTS";
/// `$SWAPMOE_WGMMA_GEMM2_BLOCK_RUN` = 1-255: force `Plan::wgmma_gemm2_block_run` where the
/// GEMM2 can keep its token tile (`wgmma_gemm2_block_run`); for tuning. Else the oracle's rule.
pub const WGMMA_GEMM2_BLOCK_RUN_ENV: &str = "SWAPMOE_WGMMA_GEMM2_BLOCK_RUN";
/// cuda_wgmma's e4m3 GEMM2 column-block run where a token tile's rows fill it (runs of 2 and
/// 4 measured at deepseek-v3-tp8 fp8_tensor M = 4096: 4 is 4% faster, 2 about 2%).
pub const WGMMA_GEMM2_DENSE_E4M3_BLOCK_RUN: u8 = 4;
/// `$SWAPMOE_WGMMA_PERSISTENT` = "on" | "off" | "gemm1" | "gemm2" (else the stage rule,
/// `WGMMA_PERSISTENT_MAX_STAGES`): which of cuda_wgmma's GEMMs run as persistent grids (both,
/// neither, or only the one named).
pub const WGMMA_PERSISTENT_ENV: &str = "SWAPMOE_WGMMA_PERSISTENT";
/// `$SWAPMOE_SWAP_SLICES` = "g1,g2": force the K slices per stage of GEMM1 and GEMM2; for tuning.
pub const SWAP_SLICES_ENV: &str = "SWAPMOE_SWAP_SLICES";
/// Dynamic shared memory of a swap-AB kernel (`Stages<NT, kBoxes, kSub>::kSmemBytes`): stages
/// of `slices` x (`weight_boxes` 64 x 64 weight boxes + NT x 64 token rows); as many as fit
/// 102 KiB (two CTAs per SM) when that is at least 3, else as many as fit 200 KiB; plus 1 KiB
/// to align them. GEMM1 has 2 boxes (gate, up), GEMM2 one.
pub fn swap_smem_bytes(tile: usize, weight_boxes: usize, slices: usize) -> usize {
    swap_stages_smem_bytes(swap_stage_bytes(tile, weight_boxes, slices))
}
/// Bytes of one stage of a swap-AB kernel (`Stages<NT, kBoxes, kSub>::kStageBytes`).
pub fn swap_stage_bytes(tile: usize, weight_boxes: usize, slices: usize) -> usize {
    slices * (weight_boxes * SWAP_ROWS * 64 * 2 + tile * 64 * 2)
}
/// `$SWAPMOE_SWAP_GEMM1_RING` = 0 | 2..: force `Plan::swap_gemm1_ring` (0: the kernel's own
/// ring); for tuning.
pub const SWAP_GEMM1_RING_ENV: &str = "SWAPMOE_SWAP_GEMM1_RING";
/// Static shared memory of the swap-AB GEMM1s, bf16/fp16 and e4m3 (their routing in shared
/// memory; ptxas -v: 5.1-5.5 KiB), rounded up.
pub const SWAP_GEMM1_STATIC_SMEM_BYTES: usize = 6 * 1024;
/// Resident swap-AB GEMM1 CTAs per SM their registers allow (bf16/fp16 and e4m3; ptxas -v,
/// CUDA 13: 64, 80, 127 and 255 registers per thread at token tiles 8, 16, 32 and 64; 160
/// threads).
pub fn swap_gemm1_max_ctas_per_sm(tile: usize) -> usize {
    match tile {
        8 => 6,
        16 => 5,
        32 => 3,
        _ => 1,
    }
}
/// The stage ring of both swap-AB kernel families for stages of `stage` bytes: as many as
/// fit 102 KiB (two CTAs per SM) when that is at least 3, else as many as fit 200 KiB; plus
/// 1 KiB to align them.
fn swap_stages_smem_bytes(stage: usize) -> usize {
    let two_per_sm = 102 * 1024 / stage;
    let count = if two_per_sm >= 3 {
        two_per_sm
    } else {
        200 * 1024 / stage
    };
    count * stage + 1024
}
/// The heuristic's range for the FP8 swap-AB kernels (measured, H200, `swapmoe bench --quant
/// fp8_tensor`, benches/NOTES.md "FP8 swap v1"): against the FP8 SIMT kernels 1.1x at M = 1 and
/// 1.9-3.3x at M = 8, on qwen3-30b-a3b and deepseek-v3-tp8; at M = 64 (token tile 64, one CTA
/// per SM, the producer's rows spilling) 0.5-0.6x.
/// It holds for the schemes cuda_wgmma has no FP8 kernels for (128x128 blocks).
pub const SWAP_FP8_HEURISTIC_MAX_TOKENS: usize = 16;
/// The range where cuda_wgmma's FP8 GEMMs can run the call instead, for per-tensor scales
/// (measured, H200, `swapmoe tune --quant`, benches/NOTES.md "FP8 wgmma v1"): with static scales
/// the swap-AB kernels win at M = 1-8 on qwen3-30b-a3b and deepseek-v3-tp8 by 8-25%, the wgmma
/// GEMMs from M = 16 on all three public shapes (qwen3 M = 64: 183 against 552 µs).
pub const SWAP_FP8_BEFORE_WGMMA_MAX_TOKENS: usize = 8;
/// The same for wide experts (N >= SWAP_WIDE_MIN_N): the wgmma GEMMs from M = 32. Since the
/// swap-AB rings and PDL (2026-12-04) the swap-AB kernels with their default launch are 2-4%
/// faster than the wgmma GEMMs' better tile at M = 2-16 on mixtral-8x7b per tensor, in two tunes
/// (µs, H200, shipped table / 2026-12-05: M = 2 149.6 / 150.8 against 155.5 / 155.0, M = 4
/// 229.1 / 230.5 against 235.6 / 237.6, M = 8 310.0 / 311.1 against 314.4 / 317.4, M = 16 342.5
/// against 351.3), 1.6% slower at M = 32 (362.6 against 357.0). It was M = 1 when the wgmma
/// GEMMs won from M = 2 (157 against 166 µs; benches/NOTES.md "FP8 wgmma v1").
pub const SWAP_FP8_WIDE_BEFORE_WGMMA_MAX_TOKENS: usize = 16;
/// For per-channel and 128x128-block scales (activations quantized per token or per group by
/// the op), where cuda_wgmma's e4m3 GEMMs can run the call: the swap-AB kernels while
/// cuda_wgmma's GEMM1 grid (expected active experts x column blocks of WGMMA_GEMM1_COLUMNS) is
/// under this many waves of one CTA per SM, the wgmma GEMMs from there on. In the shipped H200
/// tables swap-AB is the faster at 0.24-0.91 waves (deepseek-v3-tp8 M = 1-4, qwen3-30b-a3b
/// M = 1) and per channel at qwen3 M = 2 (1.37 waves: 41.0 against 43.3 µs), the wgmma GEMMs at
/// 1.72 waves and more (deepseek M = 8, qwen3 M = 4-8, mixtral-8x7b M = 1-2); 128x128 blocks at
/// qwen3 M = 2 (1.37 waves) are within 5% either way (swap-AB 42.3 against 40.3 µs). A fixed M
/// cannot say this: the two shapes cross over at M = 2-4 and 4-8 (benches/NOTES.md "FP8
/// heuristics by the wgmma grid's waves"). Per tensor the bounds above stand: its swap-AB
/// kernels still win at 4.6 waves (qwen3 M = 8) but lose at 3.1 (deepseek M = 16).
pub const SWAP_FP8_SCALED_MAX_WGMMA_WAVES: f64 = 1.5;
/// Threads of the FP8 swap-AB GEMM2 (`kFp8Gemm2Threads`): the consumer warpgroup and a
/// producer warpgroup that quantizes the intermediate into each stage.
pub const SWAP_FP8_GEMM2_THREADS: usize = 256;
/// Dynamic shared memory of an FP8 swap-AB kernel (`Fp8Stages<NT, kBoxes, kColScale>`):
/// stages of `weight_boxes` 64 x 128 e4m3 boxes + NT x 128 e4m3 token rows (+ 1 KiB of
/// column scales in GEMM2), as many as fit 102 KiB when that is at least 3, else 200 KiB;
/// plus 1 KiB to align them.
pub fn swap_fp8_smem_bytes(tile: usize, weight_boxes: usize, column_scales: bool) -> usize {
    swap_stages_smem_bytes(swap_fp8_stage_bytes(tile, weight_boxes, column_scales))
}
/// Bytes of one stage of an FP8 swap-AB kernel (`Fp8Stages<NT, kBoxes, kColScale>::kStageBytes`).
pub fn swap_fp8_stage_bytes(tile: usize, weight_boxes: usize, column_scales: bool) -> usize {
    weight_boxes * SWAP_ROWS * 128 + tile * 128 + if column_scales { 1024 } else { 0 }
}
/// The swap-AB token tile for M tokens.
pub fn swap_token_tile(m: usize) -> usize {
    SWAP_TOKEN_TILES
        .into_iter()
        .find(|&t| m <= t)
        .unwrap_or(SWAP_MAX_TOKENS)
}
/// Inside vLLM (the caller can run vLLM's Triton), a call that no table measured against
/// vLLM's Triton (no table, no entry near its M, or an entry without a `vllm_triton` time)
/// runs swapmoe's heuristic pick only up to these token counts, on sm_90: there the pick
/// measured faster than vLLM's Triton, by more than 1%, at every shipped H200 shape (the
/// tables' times, vLLM's from the anchor; `tests/test_tables.py` derives both bounds from the
/// shipped tables again). bf16 at M = 1: qwen3-30b-a3b 1.07x, deepseek-v3-tp8 1.37x, Mixtral
/// 1.03x; at M = 2 qwen3-30b-a3b 1.00x (47.8 against 47.8 µs), and from M = 4 vLLM's Triton is
/// the faster at most shapes.
pub const UNTABLED_SWAPMOE_16BIT_MAX_TOKENS: usize = 1;
/// The same for FP8 per tensor with static activation scales: 1.12-1.51x at M = 1, 1.04-1.18x
/// at M = 2; at M = 4 Mixtral 0.78x. The other FP8 kinds have no such range: per channel has
/// no vLLM times, 128x128 blocks lost at Mixtral M = 1 (0.88x), and dynamic per-tensor scales
/// run kernels no shipped table measured.
pub const UNTABLED_SWAPMOE_FP8_TENSOR_STATIC_MAX_TOKENS: usize = 2;

/// The token counts up to which an unmeasured call inside vLLM runs swapmoe rather than vLLM's
/// Triton, and the kind of call that range was measured for; 0 where no range was measured
/// (another architecture than the H200's, fp32, the FP8 kinds without one).
fn untabled_swapmoe_range(p: &MoeProblem, caps: Option<&DeviceCaps>) -> (usize, &'static str) {
    if caps.map(|c| c.capability.0) != Some(9) {
        return (
            0,
            "a device of another architecture than the H200's (sm_90)",
        );
    }
    match p.quant {
        None if matches!(p.dtype, DType::BF16 | DType::F16) => {
            (UNTABLED_SWAPMOE_16BIT_MAX_TOKENS, "16-bit activations")
        }
        None => (0, "fp32 activations"),
        Some(q) if q.scheme == QuantScheme::Tensor && q.a1_scale != 0 && q.a2_scale != 0 => (
            UNTABLED_SWAPMOE_FP8_TENSOR_STATIC_MAX_TOKENS,
            "FP8 per tensor with static activation scales",
        ),
        Some(q) if q.scheme == QuantScheme::Tensor => {
            (0, "FP8 per tensor with dynamic activation scales")
        }
        Some(q) if q.scheme == QuantScheme::Channel => (0, "FP8 per channel"),
        Some(_) => (0, "FP8 128x128 blocks"),
    }
}

/// For a caller that can run vLLM's Triton, whether a call no table measured against it goes
/// there (`untabled_swapmoe_range`); `what` says why the call is unmeasured and `pick` is
/// swapmoe's choice, which runs otherwise and is the fallback either way.
fn unmeasured_call_external(
    c: &mut Candidates,
    caps: Option<&DeviceCaps>,
    pick: Backend,
    what: &str,
) -> Option<ExternalBackend> {
    let (max, kind) = untabled_swapmoe_range(c.p, caps);
    let m = c.p.m;
    if m <= max {
        c.reasons.add(|| format!(
            "vllm_triton: not chosen although the caller can run it; {what}, but for {kind} on sm_90 up to M = {max} swapmoe's heuristic pick measured faster than vLLM's Triton at every shipped H200 shape, so {} runs it",
            pick.name()
        ));
        return None;
    }
    c.reasons.add(|| {
        let measured = if max == 0 {
            format!("for {kind} no range was measured where swapmoe beats it")
        } else {
            format!("for {kind} swapmoe's heuristic pick measured faster only up to M = {max} (at every shipped H200 shape)")
        };
        format!(
            "vllm_triton: {what} and the caller can run vLLM's Triton; {measured}, so vLLM's Triton runs it, {} if it cannot (swapmoe tune measures both for this shape)",
            pick.name()
        )
    });
    Some(ExternalBackend::VllmTriton)
}
/// Smallest compute capability the FP8 path runs on (Ada, Hopper and later).
pub const FP8_MIN_CAPABILITY: (i32, i32) = (8, 9);
/// Threads of the routing-alignment CTA (`kThreads` in cuda/route_align.cu).
pub const ROUTE_ALIGN_THREADS: usize = 1024;
/// Slots per CTA of the routing alignment past which it runs as a thread-block cluster of
/// `ceil(slots / ALIGN_SLOTS_PER_CTA)` CTAs (`Plan::align_ctas`, sm_90+). One CTA groups about
/// 1.3 ns a slot, mostly shared-memory atomics and scattered stores: 42 us at 32768 slots
/// (qwen3-30b-a3b and deepseek-v3-tp8 at M = 4096) and 13 us at 8192 (H200, ncu).
pub const ALIGN_SLOTS_PER_CTA: usize = 4096;
/// Most CTAs of the alignment's cluster: the portable cluster size.
pub const ALIGN_MAX_CTAS: usize = 8;
/// `$SWAPMOE_ALIGN_CTAS` = 1..=8: force `Plan::align_ctas` on sm_90+ (for tuning).
pub const ALIGN_CTAS_ENV: &str = "SWAPMOE_ALIGN_CTAS";
/// Threads per CTA of the top-k reduction.
pub const REDUCE_THREADS: usize = 256;
/// Experts per lane of the router's warp (cuda/common/router.cuh `PMAX`): the narrow
/// variant holds E <= 256 in registers and is the one fused into other kernels; the wide
/// one covers E <= 1024 (`GPU_ROUTER_MAX_EXPERTS`).
pub const ROUTER_NARROW_LANE_EXPERTS: usize = 8;
/// The router kernel for E <= 128 holds 4 experts per lane (half the work per pick).
pub const ROUTER_NARROWEST_LANE_EXPERTS: usize = 4;
pub const ROUTER_WIDE_LANE_EXPERTS: usize = 32;
/// Largest E of the grouped CTA router: one thread per expert (`kGroupedThreads` in
/// cuda/route_topk.cu).
pub const ROUTER_CTA_MAX_EXPERTS: usize = 256;
/// Largest group of the grouped CTA router: a group's top-2 merges inside one warp.
pub const ROUTER_CTA_MAX_GROUP_EXPERTS: usize = 32;
/// Largest E a fused router handles (32 lanes x `ROUTER_NARROW_LANE_EXPERTS`).
pub const ROUTER_FUSED_MAX_EXPERTS: usize = 32 * ROUTER_NARROW_LANE_EXPERTS;
/// Largest M routed inside the align kernel: its 32 warps take M / 32 tokens each, one
/// after another, while the separate router kernel runs them all in parallel.
pub const ROUTER_IN_ALIGN_MAX_TOKENS: usize = 16;
/// Threads of the routing align kernel (`kRoutedThreads` in cuda/route_align.cu).
pub const ROUTE_ALIGN_ROUTED_THREADS: usize = 512;
/// The decode GEMM2 whose registers ptxas may size freely (104 for bf16: 2 CTAs of 256
/// threads per SM, more weight loads in flight per warp) is used while its K / 8 CTAs fit
/// this many per SM; beyond, the occupancy-bounded one (cuda/decode_moe.cu
/// `kGemm2MinBlocks`). qwen3-30b-a3b at M=1: 256 CTAs, 29.8 us wide against 33.8 bounded;
/// deepseek-v3-tp8: 896 CTAs, 42.9 us wide against 34.1 bounded.
pub const DECODE_GEMM2_WIDE_MAX_CTAS_PER_SM: usize = 2;
/// `$SWAPMOE_ROUTER_FUSION=on`: fused_moe routes inside the experts' first kernel where it
/// can (opt-in: measured slower than the router kernel, benches/NOTES.md "Router v3").
pub const ROUTER_FUSION_ENV: &str = "SWAPMOE_ROUTER_FUSION";
/// `$SWAPMOE_ROUTER_KERNEL`: "warp" keeps every call on the warp router; "cta", unset or
/// "auto" take the grouped CTA router wherever it can route the call (`router_kernel`).
pub const ROUTER_KERNEL_ENV: &str = "SWAPMOE_ROUTER_KERNEL";
/// Largest M at which fused_moe launches the grouped CTA router with programmatic dependent
/// launch. Inside fused_moe at deepseek-v3-tp8 M = 32 and 64 (wgmma experts after it) the CTA
/// router with PDL cost 5.7-6.6 us over fused_experts, without PDL 2.7-3.7, and the warp
/// router (with PDL) 3.5-4.5 (two runs, benches/NOTES.md "Router v4b"); at M = 1-16 (swap-AB
/// or decode experts) it measured 1.9-3.4 with PDL. Alone it routes in 3.1-3.3 us at every M
/// against the warp router's 4.2-4.4.
pub const ROUTER_CTA_PDL_MAX_TOKENS: usize = 16;
/// What launching fused_moe's router kernel with PDL measured where the swap-AB experts'
/// one-wave rule starts fused_experts' GEMM1 without it (H200, `benches/routing_bench.py`,
/// its first-kernel-PDL column against the default, four runs on 2026-12-02, benches/NOTES.md
/// "Router PDL before a one-wave GEMM1"). Inside fused_moe GEMM1 follows the router by PDL
/// either way, so the rule's reason (GEMM1's CTAs placed while the previous kernel runs)
/// does not apply to the router.
const ROUTER_PDL_BEFORE_ONE_WAVE_MEASURED: &str = "fused_moe - fused_experts at qwen3-30b-a3b M = 1 1.6-1.7 us against 2.1-2.2 without, deepseek-v3-tp8 M = 1 2.1-2.3 against 2.5, M = 8 2.6-3.7 against 2.6-3.8";

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
    /// The decode kernels' math with the weights streamed by the TMA unit (cp.async.bulk)
    /// into a 6-stage shared-memory ring, on a persistent grid (cuda/sm90_bulk_decode.cu,
    /// sm_90): bf16/fp16, 16-byte aligned rows, M*topk <= BULK_MAX_SLOTS.
    CudaBulkDecode,
    /// Hopper grouped GEMMs for many tokens per expert (cuda/sm90_wgmma_moe.cu, sm_90a):
    /// wgmma with the tokens in the 64-row slot, both operands streamed by TMA from tensor
    /// maps, warp-specialized; bf16/fp16 with K and N multiples of 8.
    CudaWgmma,
    /// Hopper swap-AB decode kernels (cuda/sm90_swap_decode.cu, sm_90a): the weights in
    /// wgmma's 64-row slot, the M <= 64 tokens as its N side; two launches, routing read in
    /// every CTA, the top-k sum in GEMM2's accumulators; bf16/fp16, TMA-aligned shapes.
    CudaWgmmaSwap,
}

impl Backend {
    pub const ALL: [Backend; 7] = [
        Backend::Cpu,
        Backend::CudaGeneric,
        Backend::CudaDecode,
        Backend::CudaMma,
        Backend::CudaBulkDecode,
        Backend::CudaWgmma,
        Backend::CudaWgmmaSwap,
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
            Backend::CudaBulkDecode => "cuda_bulk_decode",
            Backend::CudaWgmma => "cuda_wgmma",
            Backend::CudaWgmmaSwap => "cuda_wgmma_swap",
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
    /// Router (cuda/route_topk.cu), by experts per lane at most (`ROUTER_NARROW_LANE_EXPERTS`
    /// or `ROUTER_WIDE_LANE_EXPERTS`); the logits dtype is an argument.
    RouteTopk(usize),
    /// fused_moe: route the tokens, then align, in one CTA (cuda/route_align.cu).
    RouteAlignRouted,
    /// fused_moe at decode: GEMM1 that routes for itself (cuda/decode_moe.cu).
    DecodeGemm1Routed(DType, usize),
    /// Decode GEMM2 without the occupancy bound (`DECODE_GEMM2_WIDE_MAX_CTAS_PER_SM`).
    DecodeGemm2SumWide(DType, usize),
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
    /// Bulk-copy decode kernels (cuda/sm90_bulk_decode.cu), bf16 or fp16.
    BulkGemm1Act(DType),
    BulkGemm2Sum(DType),
    /// Hopper wgmma GEMMs (cuda/sm90_wgmma_moe.cu): (bf16 or fp16, token tile); GEMM1 also
    /// by where its token rows come from: gathered in the kernel (false) or from the
    /// pre-gathered copy written by WgmmaGather (true).
    WgmmaGemm1Act(DType, usize, bool),
    WgmmaGemm2(DType, usize),
    /// The top-k sum of the wgmma path: per-slot outputs in the activation dtype.
    WgmmaTopkReduce(DType),
    /// The row gather before a pre-gathered GEMM1 (any 2-byte dtype).
    WgmmaGather,
    /// Swap-AB decode kernels (cuda/sm90_swap_decode.cu): (bf16 or fp16, token tile, K slices
    /// per stage).
    SwapGemm1Act(DType, usize, usize),
    SwapGemm2Sum(DType, usize, usize),
    /// Grouped sigmoid router, one CTA per token and one thread per expert
    /// (cuda/route_topk.cu, `router_kernel` says when).
    RouteGroupedCta,
    /// FP8 swap-AB decode kernels (cuda/sm90_swap_decode.cu): (scheme, token tile); GEMM2
    /// also by output dtype (bf16 or fp16).
    SwapFp8Gemm1(QuantScheme, usize),
    SwapFp8Gemm2Sum(DType, QuantScheme, usize),
    /// FP8 swap-AB kernels for per-tensor weights with a static intermediate scale
    /// (`a2_scale` given): GEMM1 writes the e4m3 intermediate rows, GEMM2 reads them by TMA.
    /// (token tile); GEMM2 also by output dtype (bf16 or fp16).
    SwapFp8StaticGemm1(usize),
    SwapFp8StaticGemm2Sum(DType, usize),
    /// FP8 Hopper wgmma GEMMs (cuda/sm90_wgmma_moe.cu), per-tensor, per-channel or 128x128
    /// block scales: GEMM1 by (scheme, token tile, static intermediate scale: it then writes
    /// e4m3 rows, pre-gathered rows of the quantized input: it then reads them by TMA);
    /// the intermediate's quantization with a dynamic scale (not for blocks: their GEMM1
    /// quantizes it in groups itself); GEMM2 also by output dtype.
    WgmmaFp8Gemm1(QuantScheme, usize, bool, bool),
    WgmmaFp8QuantInter(QuantScheme),
    WgmmaFp8Gemm2(DType, QuantScheme, usize),
    /// The wgmma GEMM1s that group the slots themselves (`Plan::align_in_gemm1`, the `_ga`
    /// kernels; they gather their token rows in the kernel): (bf16 or fp16, token tile) and
    /// FP8 (scheme, token tile, static intermediate scale).
    WgmmaGemm1Grouping(DType, usize),
    WgmmaFp8Gemm1Grouping(QuantScheme, usize, bool),
}

/// The token tiles of cuda_wgmma's FP8 GEMMs (the bf16 ones': `WGMMA_TOKEN_TILES`). Each
/// stage's e4m3 wgmmas go into a second set of accumulators that is added to the f32 sums
/// (promotion); the consumer warpgroups take 232 registers per thread for them (setmaxnreg).
pub const WGMMA_FP8_TOKEN_TILES: [usize; 2] = WGMMA_TOKEN_TILES;
/// The FP8 schemes cuda_wgmma is built for: per-tensor and per-channel scales apply in its
/// epilogues, 128x128 block scales at each stage's promotion.
pub const WGMMA_FP8_SCHEMES: [QuantScheme; 3] = [
    QuantScheme::Tensor,
    QuantScheme::Channel,
    QuantScheme::Block,
];

/// Whether cuda_wgmma's FP8 GEMM1 writes the e4m3 intermediate itself (a static per-tensor
/// a2_scale, or 128x128 blocks, whose 1 x 128 groups lie in one CTA tile's columns), so that
/// no quantize-intermediate kernel runs between the GEMMs.
pub fn wgmma_gemm1_quantizes(q: &Fp8Quant) -> bool {
    q.static_intermediate() || q.scheme == QuantScheme::Block
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

fn wgmma_slot(d: DType, tile: usize) -> usize {
    usize::from(tile >= 128) + 2 * usize::from(d == DType::F16)
}

fn swap_slot(d: DType, tile: usize, slices: usize) -> usize {
    let t = SWAP_TOKEN_TILES
        .iter()
        .position(|x| *x == tile)
        .unwrap_or(0);
    let k = SWAP_K_SLICES.iter().position(|x| *x == slices).unwrap_or(0);
    t + SWAP_TOKEN_TILES.len() * (k + SWAP_K_SLICES.len() * usize::from(d == DType::F16))
}

fn swap_fp8_slot(q: QuantScheme, tile: usize) -> usize {
    let t = SWAP_TOKEN_TILES
        .iter()
        .position(|x| *x == tile)
        .unwrap_or(0);
    t + SWAP_TOKEN_TILES.len() * q.code() as usize
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
    pub const COUNT: usize = 1
        + 3 * 2
        + 3 * 2
        + 3
        + 3 * 2
        + 3 * 2
        + 2 * 3 * 2
        + 3
        + 3
        + 3
        + 3 * 2 * 3
        + 3 * 3 * 2
        + 2 * 2
        + 3 * 2
        + 3 * 2
        + 1
        + 2 * 2 * 2
        + 2 * 2
        + 2
        + 1
        + 2 * 2 * 4 * 2
        + 1
        + 3 * 4
        + 2 * 3 * 4
        + 4
        + 2 * 4
        + 3
        + 2
        + 2 * 2
        + 3
        + 2 * 2
        + 2 * 3
        + 2 * 2
        + 2 * 2
        + 2 * 2
        + 4 * 2;

    pub fn module(&self) -> &'static str {
        match self {
            KernelId::RouteAlign | KernelId::RouteAlignRouted => "route_align",
            KernelId::DecodeGemm1Act(..)
            | KernelId::DecodeGemm1Routed(..)
            | KernelId::DecodeGemm2SumWide(..)
            | KernelId::DecodeGemm2Sum(..)
            | KernelId::DecodeFp8Gemm1(..)
            | KernelId::DecodeFp8Gemm2Sum(..) => "decode_moe",
            KernelId::MmaGemm1Act(..) | KernelId::MmaGemm2(..) => "sm80_mma_moe",
            KernelId::RouteTopk(..) | KernelId::RouteGroupedCta => "route_topk",
            KernelId::BulkGemm1Act(..) | KernelId::BulkGemm2Sum(..) => "sm90_bulk_decode",
            KernelId::WgmmaGemm1Act(..)
            | KernelId::WgmmaGather
            | KernelId::WgmmaGemm2(..)
            | KernelId::WgmmaTopkReduce(..)
            | KernelId::WgmmaFp8Gemm1(..)
            | KernelId::WgmmaFp8QuantInter(..)
            | KernelId::WgmmaFp8Gemm2(..)
            | KernelId::WgmmaGemm1Grouping(..)
            | KernelId::WgmmaFp8Gemm1Grouping(..) => "sm90_wgmma_moe",
            KernelId::SwapGemm1Act(..)
            | KernelId::SwapGemm2Sum(..)
            | KernelId::SwapFp8Gemm1(..)
            | KernelId::SwapFp8Gemm2Sum(..)
            | KernelId::SwapFp8StaticGemm1(..)
            | KernelId::SwapFp8StaticGemm2Sum(..) => "sm90_swap_decode",
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
            KernelId::RouteTopk(p) => format!("swapmoe_route_topk_p{p}"),
            KernelId::RouteGroupedCta => "swapmoe_route_grouped_cta".into(),
            KernelId::RouteAlignRouted => "swapmoe_route_align_routed".into(),
            KernelId::DecodeGemm1Routed(d, v) => {
                format!("decode_moe_gemm1_act_routed_{}_v{v}", d.suffix())
            }
            KernelId::DecodeGemm2SumWide(d, v) => {
                format!("decode_moe_gemm2_sum_wide_{}_v{v}", d.suffix())
            }
            KernelId::Fp8QuantX(d) => format!("swapmoe_fp8_quant_x_{}", d.suffix()),
            KernelId::Fp8AbsmaxPartials(d) => format!("swapmoe_fp8_absmax_{}", d.suffix()),
            KernelId::DecodeFp8Gemm1(q, v) => format!("decode_moe_fp8_gemm1_{}_v{v}", q.name()),
            KernelId::DecodeFp8Gemm2Sum(d, q, v) => {
                format!("decode_moe_fp8_gemm2_sum_{}_{}_v{v}", d.suffix(), q.name())
            }
            KernelId::GenericFp8Gemm1(q, v) => format!("generic_moe_fp8_gemm1_{}_v{v}", q.name()),
            KernelId::GenericFp8Gemm2(q, v) => format!("generic_moe_fp8_gemm2_{}_v{v}", q.name()),
            KernelId::BulkGemm1Act(d) => format!("bulk_moe_gemm1_act_{}", d.suffix()),
            KernelId::BulkGemm2Sum(d) => format!("bulk_moe_gemm2_sum_{}", d.suffix()),
            KernelId::WgmmaGemm1Act(d, t, pre) => format!(
                "wgmma_moe_gemm1_act_{}_t{t}{}",
                d.suffix(),
                if pre { "_xs" } else { "" }
            ),
            KernelId::WgmmaGather => "wgmma_moe_gather".into(),
            KernelId::WgmmaGemm2(d, t) => format!("wgmma_moe_gemm2_{}_t{t}", d.suffix()),
            KernelId::WgmmaTopkReduce(d) => format!("wgmma_moe_topk_reduce_{}", d.suffix()),
            KernelId::SwapGemm1Act(d, t, k) => {
                format!("swap_moe_gemm1_act_{}_n{t}_s{k}", d.suffix())
            }
            KernelId::SwapGemm2Sum(d, t, k) => {
                format!("swap_moe_gemm2_sum_{}_n{t}_s{k}", d.suffix())
            }
            KernelId::SwapFp8Gemm1(q, t) => format!("swap_moe_fp8_gemm1_{}_n{t}", q.name()),
            KernelId::SwapFp8Gemm2Sum(d, q, t) => {
                format!("swap_moe_fp8_gemm2_sum_{}_{}_n{t}", d.suffix(), q.name())
            }
            KernelId::SwapFp8StaticGemm1(t) => format!("swap_moe_fp8_gemm1_tensor_q8_n{t}"),
            KernelId::SwapFp8StaticGemm2Sum(d, t) => {
                format!("swap_moe_fp8_gemm2_sum_{}_tensor_q8_n{t}", d.suffix())
            }
            KernelId::WgmmaFp8Gemm1(q, t, q8, pre) => format!(
                "wgmma_moe_fp8_gemm1_{}{}_t{t}{}",
                q.name(),
                if q8 { "_q8" } else { "" },
                if pre { "_xs" } else { "" }
            ),
            KernelId::WgmmaFp8QuantInter(q) => format!("wgmma_moe_fp8_quant_inter_{}", q.name()),
            KernelId::WgmmaGemm1Grouping(d, t) => {
                format!("wgmma_moe_gemm1_act_{}_t{t}_ga", d.suffix())
            }
            KernelId::WgmmaFp8Gemm1Grouping(q, t, q8) => format!(
                "wgmma_moe_fp8_gemm1_{}{}_t{t}_ga",
                q.name(),
                if q8 { "_q8" } else { "" }
            ),
            KernelId::WgmmaFp8Gemm2(d, q, t) => {
                format!("wgmma_moe_fp8_gemm2_{}_{}_t{t}", d.suffix(), q.name())
            }
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
            KernelId::RouteTopk(ROUTER_NARROWEST_LANE_EXPERTS) => 101,
            KernelId::RouteTopk(p) => 40 + usize::from(p > ROUTER_NARROW_LANE_EXPERTS),
            KernelId::RouteAlignRouted => 42,
            KernelId::Fp8QuantX(d) => 43 + dtype_index(d),
            KernelId::Fp8AbsmaxPartials(d) => 46 + dtype_index(d),
            KernelId::DecodeFp8Gemm1(q, v) => 49 + fp8_slot(q, v),
            KernelId::GenericFp8Gemm1(q, v) => 55 + fp8_slot(q, v),
            KernelId::GenericFp8Gemm2(q, v) => 61 + fp8_slot(q, v),
            KernelId::DecodeFp8Gemm2Sum(d, q, v) => 67 + 6 * dtype_index(d) + fp8_slot(q, v),
            KernelId::BulkGemm1Act(d) => 85 + usize::from(d == DType::F16),
            KernelId::BulkGemm2Sum(d) => 87 + usize::from(d == DType::F16),
            KernelId::DecodeGemm1Routed(d, v) => 89 + vec_slot(d, v),
            KernelId::DecodeGemm2SumWide(d, v) => 95 + vec_slot(d, v),
            KernelId::WgmmaGemm1Act(d, t, pre) => 102 + wgmma_slot(d, t) + 4 * usize::from(pre),
            KernelId::WgmmaGemm2(d, t) => 110 + wgmma_slot(d, t),
            KernelId::WgmmaTopkReduce(d) => 114 + usize::from(d == DType::F16),
            KernelId::WgmmaGather => 116,
            KernelId::SwapGemm1Act(d, t, k) => 117 + swap_slot(d, t, k),
            KernelId::SwapGemm2Sum(d, t, k) => 133 + swap_slot(d, t, k),
            KernelId::RouteGroupedCta => 149,
            KernelId::SwapFp8Gemm1(q, t) => 150 + swap_fp8_slot(q, t),
            KernelId::SwapFp8Gemm2Sum(d, q, t) => {
                162 + swap_fp8_slot(q, t) + 12 * usize::from(d == DType::F16)
            }
            KernelId::SwapFp8StaticGemm1(t) => 186 + swap_fp8_slot(QuantScheme::Tensor, t),
            KernelId::SwapFp8StaticGemm2Sum(d, t) => {
                190 + swap_fp8_slot(QuantScheme::Tensor, t) + 4 * usize::from(d == DType::F16)
            }
            KernelId::WgmmaFp8Gemm1(QuantScheme::Block, t, _, pre) => {
                220 + usize::from(t == 128) + 2 * usize::from(pre)
            }
            KernelId::WgmmaFp8Gemm2(d, QuantScheme::Block, t) => {
                224 + usize::from(t == 128) + 2 * usize::from(d == DType::F16)
            }
            KernelId::WgmmaFp8Gemm1(q, t, q8, pre) => {
                let variant = if q8 { 2 } else { q.code() as usize };
                let t128 = usize::from(t == 128);
                if pre {
                    214 + variant + 3 * t128
                } else {
                    198 + variant + 9 * t128
                }
            }
            KernelId::WgmmaFp8QuantInter(q) => 201 + q.code() as usize,
            KernelId::WgmmaGemm1Grouping(d, t) => 228 + wgmma_slot(d, t),
            KernelId::WgmmaFp8Gemm1Grouping(q, t, q8) => {
                232 + if q8 { 3 } else { q.code() as usize } + 4 * usize::from(t == 128)
            }
            KernelId::WgmmaFp8Gemm2(d, q, t) => {
                203 + q.code() as usize
                    + 2 * usize::from(d == DType::F16)
                    + 7 * usize::from(t == 128)
            }
        }
    }

    /// Dynamic shared memory of the kernels that take more than the default 48 KiB (the
    /// launch asks for it, and the function is allowed it when it is loaded).
    pub fn dynamic_smem_bytes(&self) -> Option<usize> {
        match *self {
            KernelId::MmaGemm1Act(_, tile) | KernelId::MmaGemm2(_, tile) => {
                Some(mma_smem_bytes(tile))
            }
            KernelId::BulkGemm1Act(_) | KernelId::BulkGemm2Sum(_) => Some(BULK_SMEM_BYTES),
            KernelId::WgmmaGemm1Act(_, tile, _)
            | KernelId::WgmmaGemm2(_, tile)
            | KernelId::WgmmaFp8Gemm1(_, tile, _, _)
            | KernelId::WgmmaFp8Gemm2(_, _, tile)
            | KernelId::WgmmaGemm1Grouping(_, tile)
            | KernelId::WgmmaFp8Gemm1Grouping(_, tile, _) => Some(wgmma_smem_bytes(tile)),
            KernelId::SwapGemm1Act(_, tile, k) => Some(swap_smem_bytes(tile, 2, k)),
            KernelId::SwapGemm2Sum(_, tile, k) => Some(swap_smem_bytes(tile, 1, k)),
            KernelId::SwapFp8Gemm1(_, tile) => Some(swap_fp8_smem_bytes(tile, 2, false)),
            KernelId::SwapFp8Gemm2Sum(_, _, tile) => Some(swap_fp8_smem_bytes(tile, 1, true)),
            KernelId::SwapFp8StaticGemm1(tile) => Some(swap_fp8_smem_bytes(tile, 2, false)),
            KernelId::SwapFp8StaticGemm2Sum(_, tile) => Some(swap_fp8_smem_bytes(tile, 1, false)),
            _ => None,
        }
    }

    /// The most dynamic shared memory a launch of this kernel may ask for (its attribute):
    /// `dynamic_smem_bytes`, or for a swap-AB GEMM2, what running one CTA per SM asks for, or
    /// for the routing alignment as a cluster, counts and cursors of the most local experts.
    pub fn max_dynamic_smem_bytes(&self) -> Option<usize> {
        let own = self.dynamic_smem_bytes();
        match *self {
            KernelId::RouteAlign => Some(2 * 4 * MAX_GPU_LOCAL_EXPERTS),
            // its stages and the slots' grouping (align_in_gemm1)
            KernelId::WgmmaGemm1Grouping(..) | KernelId::WgmmaFp8Gemm1Grouping(..) => {
                Some(WGMMA_GEMM1_MAX_SMEM_BYTES)
            }
            KernelId::SwapGemm2Sum(..)
            | KernelId::SwapFp8Gemm2Sum(..)
            | KernelId::SwapFp8StaticGemm2Sum(..) => {
                own.map(|b| b.max(SWAP_GEMM2_ONE_PER_SM_SMEM_BYTES))
            }
            _ => own,
        }
    }

    /// Every kernel the library can launch (for warm-up and tests).
    pub fn all() -> Vec<KernelId> {
        let mut v = vec![
            KernelId::RouteAlign,
            KernelId::RouteAlignRouted,
            KernelId::RouteTopk(ROUTER_NARROWEST_LANE_EXPERTS),
            KernelId::RouteTopk(ROUTER_NARROW_LANE_EXPERTS),
            KernelId::RouteTopk(ROUTER_WIDE_LANE_EXPERTS),
            KernelId::RouteGroupedCta,
        ];
        for d in FLOAT_DTYPES {
            for w in [1, vector_width(d)] {
                v.push(KernelId::GenericGemm1Act(d, w));
                v.push(KernelId::GenericGemm2(d, w));
                v.push(KernelId::DecodeGemm1Act(d, w));
                v.push(KernelId::DecodeGemm1Routed(d, w));
                v.push(KernelId::DecodeGemm2Sum(d, w));
                v.push(KernelId::DecodeGemm2SumWide(d, w));
            }
            v.push(KernelId::GenericTopkReduce(d));
        }
        for d in [DType::BF16, DType::F16] {
            for t in MMA_TOKEN_TILES {
                v.push(KernelId::MmaGemm1Act(d, t));
                v.push(KernelId::MmaGemm2(d, t));
            }
            v.push(KernelId::BulkGemm1Act(d));
            v.push(KernelId::BulkGemm2Sum(d));
            for t in WGMMA_TOKEN_TILES {
                v.push(KernelId::WgmmaGemm1Act(d, t, false));
                v.push(KernelId::WgmmaGemm1Act(d, t, true));
                v.push(KernelId::WgmmaGemm1Grouping(d, t));
                v.push(KernelId::WgmmaGemm2(d, t));
            }
            v.push(KernelId::WgmmaTopkReduce(d));
            for t in SWAP_TOKEN_TILES {
                for k in SWAP_K_SLICES {
                    v.push(KernelId::SwapGemm1Act(d, t, k));
                    v.push(KernelId::SwapGemm2Sum(d, t, k));
                }
            }
        }
        v.push(KernelId::WgmmaGather);

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
            for t in SWAP_TOKEN_TILES {
                v.push(KernelId::SwapFp8Gemm1(q, t));
                for d in [DType::BF16, DType::F16] {
                    v.push(KernelId::SwapFp8Gemm2Sum(d, q, t));
                }
            }
        }
        for t in SWAP_TOKEN_TILES {
            v.push(KernelId::SwapFp8StaticGemm1(t));
            for d in [DType::BF16, DType::F16] {
                v.push(KernelId::SwapFp8StaticGemm2Sum(d, t));
            }
        }
        for q in [QuantScheme::Tensor, QuantScheme::Channel] {
            v.push(KernelId::WgmmaFp8QuantInter(q));
        }
        for t in WGMMA_FP8_TOKEN_TILES {
            for q in WGMMA_FP8_SCHEMES {
                for pre in [false, true] {
                    v.push(KernelId::WgmmaFp8Gemm1(q, t, false, pre));
                }
                v.push(KernelId::WgmmaFp8Gemm1Grouping(q, t, false));
                for d in [DType::BF16, DType::F16] {
                    v.push(KernelId::WgmmaFp8Gemm2(d, q, t));
                }
            }
            for pre in [false, true] {
                v.push(KernelId::WgmmaFp8Gemm1(QuantScheme::Tensor, t, true, pre));
            }
            v.push(KernelId::WgmmaFp8Gemm1Grouping(
                QuantScheme::Tensor,
                t,
                true,
            ));
        }
        v
    }
}

/// The sentences a plan gives for its choices and rejections (`swapmoe explain`,
/// `describe_plan`, `select_backend`). A plan made for a launch alone skips them
/// (`Request::quiet`): formatting them was most of a plan's 1.2-2.6 us on the CPU machine.
/// Reads as the list (`Deref`); grows only through `add` and `extend`, which do nothing when
/// the reasons are not wanted.
#[derive(Clone, PartialEq, Eq)]
pub struct Reasons {
    wanted: bool,
    list: Vec<String>,
}

impl Reasons {
    /// An empty list that collects (`wanted`) or ignores what is added.
    pub fn new(wanted: bool) -> Self {
        Reasons {
            wanted,
            list: Vec::new(),
        }
    }
    /// Adds the sentence `why` builds, building it only when the reasons are wanted.
    pub fn add(&mut self, why: impl FnOnce() -> String) {
        if self.wanted {
            self.list.push(why());
        }
    }
    /// Whether sentences are collected.
    pub fn wanted(&self) -> bool {
        self.wanted
    }
    /// The sentences.
    pub fn into_vec(self) -> Vec<String> {
        self.list
    }
}

impl Extend<String> for Reasons {
    fn extend<I: IntoIterator<Item = String>>(&mut self, iter: I) {
        if self.wanted {
            self.list.extend(iter);
        }
    }
}

impl std::ops::Deref for Reasons {
    type Target = Vec<String>;
    fn deref(&self) -> &Vec<String> {
        &self.list
    }
}

impl fmt::Debug for Reasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.list.fmt(f)
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
    /// Launch the op's first kernel (the router's, for fused_moe) with PDL, so that its
    /// start overlaps whatever kernel ran before it in the stream (sm_90+; its kernels wait
    /// with `griddepcontrol.wait` before they read).
    pub first_kernel_pdl: bool,
    /// CTAs of a persistent grid (cuda_bulk_decode, cuda_wgmma: the device's SM count; 0 for
    /// other backends).
    pub ctas: usize,
    /// cuda_wgmma: whether (GEMM1, GEMM2) run as the persistent grid of `ctas` CTAs, each
    /// looping over work items, instead of one CTA per item.
    pub wgmma_persistent: (bool, bool),
    /// cuda_wgmma: L2 eviction hints of the GEMMs' loads (`WGMMA_L2_WEIGHTS_EVICT_FIRST`,
    /// `WGMMA_L2_ACTS_EVICT_LAST`); 0 for none and for other backends.
    pub wgmma_l2_hints: u8,
    /// cuda_wgmma: consecutive column blocks of one token tile that each CTA of the persistent
    /// GEMM2 takes in a row, loading the tile's intermediate rows once for all of them (the
    /// ring's stages keep them); 1: work items one column block each, as route_align's raster
    /// groups order them. 1 for other backends.
    pub wgmma_gemm2_block_run: u8,
    /// cuda_wgmma_swap: thread-block cluster sizes, (GEMM1's split of K, GEMM2's split of
    /// the active experts); (1, 1) for other backends.
    pub splits: (usize, usize),
    /// cuda_wgmma_swap (bf16/fp16 and e4m3): stages of GEMM1's ring when fewer than the
    /// kernel's own (`swap_gemm1_ring`: so that more CTAs share an SM and the grid fits one
    /// wave); 0: the kernel's own ring. 0 for other backends.
    pub swap_gemm1_ring: usize,
    /// cuda_wgmma_swap (e4m3): stages of GEMM2's ring when fewer than the kernel's own
    /// (`swap_gemm2_ring_rule` or `$SWAPMOE_SWAP_GEMM2_RING`: so that its CTAs fit beside
    /// GEMM1's); 0: its own. 0 for other backends and the bf16/fp16 GEMM2.
    pub swap_gemm2_ring: usize,
    /// cuda_wgmma_swap: GEMM2 asks for more than half an SM's shared memory
    /// (`SWAP_GEMM2_ONE_PER_SM_SMEM_BYTES`), so that its CTAs spread one per SM.
    pub swap_gemm2_one_per_sm: bool,
    /// cuda_wgmma_swap: GEMM2 is launched with PDL (its CTAs start under GEMM1's tail and
    /// stream their first weights before they wait). False: it starts once GEMM1 has
    /// finished, on an idle machine. Always false where `pdl` is.
    pub swap_gemm2_pdl: bool,
    /// cuda_wgmma: a GEMM1 after the plan's own kernels (route_align, quantize-x, the gather)
    /// is launched with PDL: its CTAs set up their ring and prefetch their tensor maps under
    /// the kernel before, then wait. False for other backends, before sm_90, and where GEMM1
    /// groups the slots itself (it is then the first kernel: `first_kernel_pdl`). GEMM2 and
    /// the top-k sum stay without PDL: launched by PDL they measured 3-6 us per layer slower
    /// (H100, 2026-12-06, benches/NOTES.md).
    pub wgmma_gemm1_pdl: bool,
    /// cuda_wgmma_swap (bf16/fp16): GEMM1's CTAs fit one resident wave, which is why the
    /// plan starts GEMM1 without PDL (`first_kernel_pdl` false although `pdl` is true).
    /// fused_moe's router, launched before GEMM1, is not bound by that rule (`place_router`).
    pub one_wave_gemm1: bool,
    /// CTAs of the routing alignment (`KernelId::RouteAlign`), launched as one thread-block
    /// cluster when more than 1 (sm_90+); 1 for plans without that kernel.
    pub align_ctas: usize,
    /// cuda_wgmma: GEMM1 groups the slots itself in each CTA (and its CTA 0 writes the
    /// grouping for the kernels after it), so the plan has no route_align kernel.
    pub align_in_gemm1: bool,
    /// Why each choice was made or each candidate rejected (empty for a plan made with
    /// `Request::quiet`).
    pub reasons: Reasons,
    /// What decided: an override, a tuned table or the heuristics.
    pub source: Source,
    /// The table entry used (also when it was rejected: the reasons say why).
    pub table: Option<TableUse>,
    /// An external backend (vLLM's own kernels) chosen by a table for a caller that allowed
    /// it; the swapmoe fields then describe swapmoe's fallback for the same call.
    pub external: Option<ExternalBackend>,
    /// A message to log once: set on the first fallback to the heuristics (or rejection)
    /// per table key, None after that.
    pub log: Option<LogNote>,
    /// Where fused_moe's router runs (`place_router`); `NotRouting` for fused_experts.
    pub router: RouterPlacement,
}

/// Where fused_moe routes the tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterPlacement {
    /// fused_experts: the caller routed.
    NotRouting,
    /// Its own kernel, launched before the plan's kernels.
    Separate(KernelId),
    /// The plan's first kernel routes, then aligns (`KernelId::RouteAlignRouted`).
    InAlign,
    /// The decode GEMM1 routes for itself (`KernelId::DecodeGemm1Routed`).
    InDecodeGemm1,
}

impl RouterPlacement {
    pub fn name(&self) -> &'static str {
        match self {
            RouterPlacement::NotRouting => "none",
            RouterPlacement::Separate(_) => "separate",
            RouterPlacement::InAlign => "in_align",
            RouterPlacement::InDecodeGemm1 => "in_decode_gemm1",
        }
    }
}

/// What decided a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `backend=`, `$SWAPMOE_BACKEND` or `$SWAPMOE_MMA_TOKEN_TILE`.
    Override,
    /// A tuned table entry.
    Table,
    /// The rules of this file.
    Heuristic,
}

impl Source {
    pub fn name(&self) -> &'static str {
        match self {
            Source::Override => "override",
            Source::Table => "table",
            Source::Heuristic => "heuristic",
        }
    }
}

/// The table entry a plan looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableUse {
    pub file: String,
    pub path: String,
    /// The entry's M (the nearest to the call's).
    pub m: usize,
    /// Whether the plan follows it (false: rejected, see the reasons).
    pub used: bool,
}

/// A one-time log message (the Python bindings send it to the `swapmoe` logger).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogNote {
    /// true: warning (a table was malformed or could not be used); false: info.
    pub warning: bool,
    pub message: String,
}

static LOGGED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// True the first time `key` is seen in this process.
fn first_time(key: &str) -> bool {
    let mut seen = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    seen.get_or_insert_with(HashSet::new)
        .insert(key.to_string())
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(x) = self.external {
            write!(
                f,
                "Plan(backend={}, fallback={}",
                x.name(),
                self.backend.name()
            )?;
            return write!(f, ", source={})", self.source.name());
        }
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
        write!(f, ", source={})", self.source.name())
    }
}

fn aligned(addr: usize, bytes: usize) -> bool {
    addr % bytes == 0
}

/// Environment variable that forces a backend for every call that passes no `backend=`
/// (any name of `Backend::ALL`; the call raises where the forced backend cannot run it).
pub const BACKEND_ENV: &str = "SWAPMOE_BACKEND";

/// Environment variable that forces the token tile of the tensor-core kernels whenever the
/// plan is `cuda_mma` (16, 64 or 128) or `cuda_wgmma` (64 or 128): `swapmoe tune` times
/// each tile with it.
pub const MMA_TILE_ENV: &str = "SWAPMOE_MMA_TOKEN_TILE";

/// A backend forced by the `backend=` argument or `$SWAPMOE_BACKEND`: one of swapmoe's, or
/// one outside it that only a caller who can run it may force (`select_backend` with that
/// name in `external_backends`: the vLLM plugin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forced {
    Swapmoe(Backend),
    External(ExternalBackend),
}

/// Where a forced name came from and the name: the argument wins over the variable.
fn forced_name(argument: Option<&str>) -> Option<(&'static str, String)> {
    let env = std::env::var(BACKEND_ENV).ok().filter(|v| !v.is_empty());
    match (argument, env) {
        (Some(a), _) => Some(("backend", a.to_string())),
        (None, Some(e)) => Some((BACKEND_ENV, e)),
        (None, None) => None,
    }
}

impl Forced {
    /// A swapmoe backend's name, else an external one's.
    fn parse(name: &str) -> Option<Forced> {
        Backend::parse(name)
            .map(Forced::Swapmoe)
            .or_else(|| ExternalBackend::parse(name).map(Forced::External))
    }
}

/// The refusal of a name that is no backend, listing `names`, the ones the caller takes.
fn unknown_backend(source: &str, value: &str, names: impl Iterator<Item = &'static str>) -> Error {
    let names: Vec<&str> = names.collect();
    Error::Argument(format!(
        "{source}: expected one of {names:?}, got {value:?}"
    ))
}

/// The backend forced by the `backend=` argument, else by `$SWAPMOE_BACKEND`: swapmoe's or
/// an external one (`select_backend` takes either; the ops take swapmoe's, `forced_backend`).
pub fn forced_choice(argument: Option<&str>) -> Result<Option<Forced>> {
    let Some((source, value)) = forced_name(argument) else {
        return Ok(None);
    };
    let names = || {
        Backend::ALL
            .iter()
            .map(|b| b.name())
            .chain(ExternalBackend::ALL.iter().map(|x| x.name()))
    };
    Forced::parse(&value)
        .map(Some)
        .ok_or_else(|| unknown_backend(source, &value, names()))
}

/// The swapmoe backend forced by the `backend=` argument, else by `$SWAPMOE_BACKEND`, for a
/// call of the op, which runs swapmoe's kernels: an external backend's name is refused.
pub fn forced_backend(argument: Option<&str>) -> Result<Option<Backend>> {
    let Some((source, value)) = forced_name(argument) else {
        return Ok(None);
    };
    let swapmoe = || Backend::ALL.iter().map(|b| b.name());
    match Forced::parse(&value) {
        Some(Forced::Swapmoe(b)) => Ok(Some(b)),
        Some(Forced::External(x)) => {
            let names: Vec<&str> = swapmoe().collect();
            Err(Error::Argument(format!(
                "{source}: {} runs outside swapmoe, so only a caller that can run it forces it (select_backend with it in external_backends, as the vLLM plugin asks); this call runs one of {names:?}",
                x.name()
            )))
        }
        None => Err(unknown_backend(source, &value, swapmoe())),
    }
}

/// Where a forced backend may have come from, for an error about it: the `backend` argument,
/// and `$SWAPMOE_BACKEND` with its value where the environment sets it (the argument wins
/// when both are given; the plan does not keep which one it was).
fn forced_backend_source() -> String {
    match std::env::var(BACKEND_ENV).ok().filter(|v| !v.is_empty()) {
        Some(v) => format!("backend (the argument, else ${BACKEND_ENV}={v:?})"),
        None => "backend".to_string(),
    }
}

/// The token tile forced by `$SWAPMOE_MMA_TOKEN_TILE` (checked against the built tiles).
pub fn forced_mma_tile() -> Result<Option<usize>> {
    let Some(v) = std::env::var(MMA_TILE_ENV).ok().filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match v.trim().parse::<usize>() {
        Ok(t) if MMA_TOKEN_TILES.contains(&t) => Ok(Some(t)),
        _ => Err(Error::Argument(format!(
            "{MMA_TILE_ENV}: expected one of {MMA_TOKEN_TILES:?}, got {v:?}"
        ))),
    }
}

/// `$SWAPMOE_FIRST_KERNEL_PDL` ("on"/"1", "off"/"0", "auto"/unset): whether the op's first
/// kernel is launched with programmatic dependent launch (`Plan::first_kernel_pdl`).
pub const FIRST_KERNEL_PDL_ENV: &str = "SWAPMOE_FIRST_KERNEL_PDL";

/// The first-kernel PDL choice forced by `$SWAPMOE_FIRST_KERNEL_PDL`; None: the oracle's.
pub fn forced_first_kernel_pdl() -> Result<Option<bool>> {
    match env_word(FIRST_KERNEL_PDL_ENV).as_str() {
        "" | "auto" => Ok(None),
        "on" | "1" => Ok(Some(true)),
        "off" | "0" => Ok(Some(false)),
        other => Err(Error::Argument(format!(
            "${FIRST_KERNEL_PDL_ENV}: expected 'on', 'off' or 'auto', got {other:?}"
        ))),
    }
}

/// What a caller asks of the oracle besides the problem and the device.
#[derive(Clone, Copy, Debug, Default)]
pub struct Request<'a> {
    /// A forced backend (`backend=` or `$SWAPMOE_BACKEND`): it must be able to run the call.
    pub backend: Option<Backend>,
    /// A forced external backend (`backend=` or `$SWAPMOE_BACKEND` naming one): it must be in
    /// `external`; swapmoe's fallback is then the heuristics' pick.
    pub forced_external: Option<ExternalBackend>,
    /// A forced tensor-core token tile, applied when the plan is cuda_mma or cuda_wgmma
    /// (a tile cuda_wgmma is not built for is ignored, with a reason).
    pub mma_token_tile: Option<usize>,
    /// The table key's weight quantization; None: the problem's own (its FP8 scheme, if any).
    pub quant: Option<Quant>,
    /// External backends the caller can run (inside vLLM); tables may pick them.
    pub external: &'a [ExternalBackend],
    /// Tuned tables to consult; None: heuristics only.
    pub tables: Option<&'a TableSet>,
    /// `$SWAPMOE_FIRST_KERNEL_PDL`: launch the first kernel with PDL (or not) where the
    /// device has it; None: the oracle's choice.
    pub first_kernel_pdl: Option<bool>,
    /// Plan without reasons (`Plan::reasons` stays empty): for a launch, which reads none.
    pub quiet: bool,
}

/// The plan for a call of the op: forced backend, `$SWAPMOE_MMA_TOKEN_TILE`, the shipped and
/// user tables (no external backends: the op runs swapmoe's kernels), then the heuristics.
pub fn plan_with(
    p: &MoeProblem,
    caps: Option<&DeviceCaps>,
    forced: Option<Backend>,
) -> Result<Plan> {
    plan_for_call(p, caps, forced, false)
}

/// `plan_with` without the reasons: what the op's launches run (the same choices).
pub fn plan_for_launch(
    p: &MoeProblem,
    caps: Option<&DeviceCaps>,
    forced: Option<Backend>,
) -> Result<Plan> {
    plan_for_call(p, caps, forced, true)
}

fn plan_for_call(
    p: &MoeProblem,
    caps: Option<&DeviceCaps>,
    forced: Option<Backend>,
    quiet: bool,
) -> Result<Plan> {
    let tables = tables::global();
    decide(
        p,
        caps,
        &Request {
            backend: forced,
            mma_token_tile: forced_mma_tile()?,
            tables: Some(&tables),
            first_kernel_pdl: forced_first_kernel_pdl()?,
            quiet,
            ..Request::default()
        },
    )
}

/// The heuristics' plan alone (no override, no table).
pub fn plan(p: &MoeProblem, caps: Option<&DeviceCaps>) -> Plan {
    let mut c = Candidates::new(p, caps, true);
    let b = heuristic(&mut c);
    c.build(b)
}

/// FP8 on a CUDA device below sm_89 is refused, naming the caller's argument `arg`
/// (`use_fp8_w8a8` for the op, `quant` for `select_backend`).
pub fn check_fp8_capability(scheme: QuantScheme, caps: &DeviceCaps, arg: &str) -> Result<()> {
    if caps.capability < FP8_MIN_CAPABILITY {
        return Err(Error::Argument(format!(
            "{arg}: FP8 ({}) needs compute capability >= 8.9 (sm_89, native e4m3 conversions), got {} (sm_{}{})",
            scheme.name(),
            caps.name,
            caps.capability.0,
            caps.capability.1
        )));
    }
    Ok(())
}

/// The decision, in order: an explicit override, a tuned table entry that the call can
/// run, the heuristics. Errors: a forced backend or tile that cannot run the call, FP8.
pub fn decide(p: &MoeProblem, caps: Option<&DeviceCaps>, req: &Request) -> Result<Plan> {
    if let (Some(q), Some(c)) = (p.quant, caps) {
        if p.device != Device::Cpu {
            check_fp8_capability(q.scheme, c, "use_fp8_w8a8")?;
        }
    }
    if let Some(t) = req.mma_token_tile {
        if !MMA_TOKEN_TILES.contains(&t) {
            return Err(Error::Argument(format!(
                "mma_token_tile: expected one of {MMA_TOKEN_TILES:?}, got {t}"
            )));
        }
    }
    let mut c = Candidates::new(p, caps, !req.quiet);
    let mut source = Source::Heuristic;
    let mut table = None;
    let mut external = None;
    let mut log = None;
    let backend = if let Some(x) = req.forced_external {
        if !req.external.contains(&x) {
            let allowed: Vec<&str> = req.external.iter().map(|b| b.name()).collect();
            return Err(Error::Argument(format!(
                "{}: {} runs outside swapmoe: forcing it needs it in external_backends (the backends the caller can run), got {allowed:?}",
                forced_backend_source(),
                x.name()
            )));
        }
        c.reasons.add(|| {
            format!(
                "override: {} forced by the backend argument or ${BACKEND_ENV}; swapmoe's fallback is the heuristics' pick",
                x.name()
            )
        });
        source = Source::Override;
        external = Some(x);
        heuristic(&mut c)
    } else if let Some(want) = req.backend {
        if let Err(why) = c.eligible(want) {
            return Err(why.kind.error(format!(
                "{}: {} cannot run {p}: {}; the heuristic choice is {}",
                forced_backend_source(),
                want.name(),
                why.why,
                plan(p, caps).backend.name()
            )));
        }
        c.reasons.add(|| {
            format!(
                "override: {} forced by the backend argument or ${BACKEND_ENV}",
                want.name()
            )
        });
        source = Source::Override;
        want
    } else if p.device == Device::Cpu {
        heuristic(&mut c)
    } else {
        let pick = match (req.tables, caps) {
            (Some(set), Some(caps)) => from_table(&mut c, set, caps, req, &mut table, &mut log),
            _ => None,
        };
        match pick {
            Some((b, x)) => {
                source = Source::Table;
                external = x;
                b
            }
            None => {
                let b = heuristic(&mut c);
                if req.external.contains(&ExternalBackend::VllmTriton) {
                    external =
                        unmeasured_call_external(&mut c, caps, b, "no tuned entry for this call");
                }
                b
            }
        }
    };
    let decided_by = source; // before a forced token tile marks the plan an override
    if let Some(t) = req.mma_token_tile {
        if backend == Backend::CudaWgmma && !WGMMA_TOKEN_TILES.contains(&t) {
            c.reasons.add(|| format!(
                "override: ${MMA_TILE_ENV}={t} ignored, cuda_wgmma is built for token tiles {WGMMA_TOKEN_TILES:?}"
            ));
        } else if matches!(backend, Backend::CudaMma | Backend::CudaWgmma) {
            c.tile = Some(t);
            source = Source::Override;
            c.reasons
                .add(|| format!("override: token tile {t} forced by ${MMA_TILE_ENV}"));
        } else {
            c.reasons.add(|| {
                format!(
                    "override: ${MMA_TILE_ENV}={t} ignored, the plan is {}",
                    backend.name()
                )
            });
        }
    }
    if decided_by != Source::Table {
        c.table_times.clear(); // an entry that did not decide (its pick could not run) is not quoted
    }
    c.account_for_the_rest(
        backend,
        decided_by,
        external,
        req.forced_external.is_some(),
        req.external,
    );
    let can = c.pdl_ok;
    let mut plan = c.build(backend);
    if let (Some(want), true) = (req.first_kernel_pdl, !plan.kernels.is_empty()) {
        plan.first_kernel_pdl = want && can;
        plan.reasons.add(|| match (want, can) {
            (true, true) => format!("override: ${FIRST_KERNEL_PDL_ENV}=on, the first kernel is launched with PDL"),
            (true, false) => format!("override: ${FIRST_KERNEL_PDL_ENV}=on ignored, PDL needs sm_90"),
            (false, _) => format!("override: ${FIRST_KERNEL_PDL_ENV}=off, the first kernel starts after the previous kernel in the stream has finished"),
        });
    }
    plan.source = source;
    plan.table = table;
    plan.external = external;
    plan.log = log;
    Ok(plan)
}

/// cuda_wgmma's grids for `p`: (persistent grid CTAs, (GEMM1, GEMM2) persistent), for stages
/// of `stage_k` elements of K (64 bf16/fp16, 128 e4m3), with the reason.
fn wgmma_grids(
    p: &MoeProblem,
    hopper_sms: Option<usize>,
    stage_k: usize,
    reasons: &mut Reasons,
) -> (usize, (bool, bool)) {
    let ctas = hopper_sms.unwrap_or(132) * WGMMA_CTAS_PER_SM;
    let stages = (p.k.div_ceil(stage_k), p.n.div_ceil(stage_k));
    let max_stages = if p.quant.is_some() {
        WGMMA_FP8_PERSISTENT_MAX_STAGES
    } else {
        WGMMA_PERSISTENT_MAX_STAGES
    };
    let gemm1_blocks = p.n.div_ceil(WGMMA_GEMM1_COLUMNS);
    let tokens = expected_local_slots(p) / p.local_experts.max(1);
    let few_blocks = gemm1_blocks <= WGMMA_GEMM1_PERSISTENT_MAX_BLOCKS
        && stages.0 <= WGMMA_GEMM1_FEW_BLOCKS_MAX_STAGES
        && tokens >= WGMMA_GEMM1_FEW_BLOCKS_MIN_TOKENS;
    let rule = (stages.0 <= max_stages || few_blocks, stages.1 <= max_stages);
    let (persistent, forced) = match env_word(WGMMA_PERSISTENT_ENV).as_str() {
        "on" => (
            (true, true),
            format!(" (forced by ${WGMMA_PERSISTENT_ENV}=on)"),
        ),
        "off" => (
            (false, false),
            format!(" (forced by ${WGMMA_PERSISTENT_ENV}=off)"),
        ),
        which @ ("gemm1" | "gemm2") => (
            (which == "gemm1", which == "gemm2"),
            format!(" (forced by ${WGMMA_PERSISTENT_ENV}={which})"),
        ),
        v if !v.is_empty() && v != "auto" => (
            rule,
            format!(
                " (${WGMMA_PERSISTENT_ENV}={v:?} ignored: expected on, off, gemm1, gemm2 or auto)"
            ),
        ),
        _ => (rule, String::new()),
    };
    // Why the rule gives `on` for a GEMM of `n` stages (GEMM1: with `blocks` column blocks
    // per expert); nothing where the stages alone decide it persistent, or where the
    // environment forced the opposite.
    let grid = |name: &str, n: usize, on: bool, blocks: Option<usize>| {
        let why = match (on, n <= max_stages, blocks) {
            (true, false, Some(b)) if few_blocks => format!(
                " ({b} column blocks per expert <= {WGMMA_GEMM1_PERSISTENT_MAX_BLOCKS}, <= {WGMMA_GEMM1_FEW_BLOCKS_MAX_STAGES} stages and >= {WGMMA_GEMM1_FEW_BLOCKS_MIN_TOKENS} tokens per expert: measured faster persistent)"
            ),
            (false, false, Some(b)) if !few_blocks => format!(
                " (> {max_stages} stages; past that it needs <= {WGMMA_GEMM1_PERSISTENT_MAX_BLOCKS} column blocks per expert (has {b}), <= {WGMMA_GEMM1_FEW_BLOCKS_MAX_STAGES} stages and >= {WGMMA_GEMM1_FEW_BLOCKS_MIN_TOKENS} tokens per expert (expects {tokens}): persistent measured slower or not measured)"
            ),
            (false, false, None) => {
                format!(" (> {max_stages} stages: a persistent grid measured no gain)")
            }
            _ => String::new(),
        };
        if on {
            format!("{name} ({n} k-stages per item) a persistent grid of {ctas} CTAs, each looping over its items so the next one's loads run under the last one's epilogue{why}")
        } else {
            format!("{name} ({n} k-stages per item) one CTA per item{why}")
        }
    };
    reasons.add(|| {
        format!(
            "cuda_wgmma grids: {}; {}{forced}",
            grid("GEMM1", stages.0, persistent.0, Some(gemm1_blocks)),
            grid("GEMM2", stages.1, persistent.1, None)
        )
    });
    let any = persistent.0 || persistent.1;
    (if any { ctas } else { 0 }, persistent)
}

/// `$env` trimmed, "" where it is unset (or not unicode): the value of a knob of words ("on",
/// "off", "auto", ...).
fn env_word(env: &str) -> String {
    std::env::var(env)
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// A "0" | "1" switch in `$env` over the oracle's `rule`: the choice and its reason. `what(on)`
/// says what each choice does; `why` is the rule's reason (None: the plan says nothing when
/// the rule stands, and `what(rule)` after a value it ignores).
fn env_switch(
    env: &str,
    rule: bool,
    what: impl Fn(bool) -> String,
    why: Option<String>,
) -> (bool, Option<String>) {
    match std::env::var(env).as_deref() {
        Ok("1") => (true, Some(format!("{}, forced by ${env}=1", what(true)))),
        Ok("0") => (false, Some(format!("{}, forced by ${env}=0", what(false)))),
        Ok(v) => (
            rule,
            Some(format!(
                "${env}={v:?} ignored (expected \"0\" or \"1\"); {}",
                why.unwrap_or_else(|| what(rule))
            )),
        ),
        Err(_) => (rule, why),
    }
}

/// Tokens (slots) per expert of the whole model on average, M·topk / E: what decides the
/// cuda_wgmma loads' L2 hints and GEMM2's block runs against the token tile.
fn tokens_per_expert(p: &MoeProblem) -> f64 {
    p.slots() as f64 / p.global_experts.max(1) as f64
}

/// The slots expected to land on this rank's experts when the ids fall uniformly on the
/// model's experts: M·topk · E_local / E_global, rounded up (all of them without an
/// `expert_map`). With expert parallelism the other slots are skipped, so the load per local
/// expert is that of the whole model, M·topk / E_global, not M·topk / E_local: at
/// deepseek-v3 with 8 ranks (32 of 256 experts) the latter reads 8x too many tokens per
/// expert. The kernels' own limits (workspace, the decode kernels' slot capacity) still
/// count every slot, since every slot is read.
fn expected_local_slots(p: &MoeProblem) -> usize {
    let (slots, local) = (p.slots(), p.local_experts);
    let global = p.global_experts.max(local).max(1);
    (slots * local).div_ceil(global)
}

/// The L2 eviction hints of cuda_wgmma's loads (`Plan::wgmma_l2_hints`) at token tile `tile`,
/// and the reason: `$SWAPMOE_WGMMA_L2_HINTS`, else both hints (weights evict first, token rows
/// evict last) where
/// - the expected tokens per expert fill at most half a tile (`2 * slots <= tile * E`): nearly
///   every expert's tokens then fit one tile, so each weight block is read by one CTA and
///   nothing shares it in L2, while the token rows are read again by the other column blocks
///   and by the tokens' other experts; or
/// - N >= WGMMA_L2_HINTS_MIN_N: GEMM1's token rows are read by 2N / 256 >= 32 column blocks,
///   and keeping them pays more than keeping the weights the expert's tiles share.
///
/// None elsewhere: at one or more tiles per expert with narrow N, an expert's tiles share its
/// weights through L2, and evict-first weights read up to 31% more from DRAM.
/// Measured (H200, whole op, benches/NOTES.md "L2 eviction hints"): half a tile or less per
/// expert, qwen3-30b-a3b and deepseek-v3-tp8, bf16 and fp8_tensor, M = 256-2048: -5 to -9%;
/// Mixtral (N = 14336) at every M measured: -2.5 to -12%; qwen3 / deepseek at one or more
/// tiles per expert: +0.5 to +6% (deepseek-v3-tp8 M = 4096 bf16: 1460 -> 1550 us).
fn wgmma_l2_hints(p: &MoeProblem, tile: usize, reasons: &mut Reasons) -> u8 {
    let what = |h: u8| match h {
        0 => "no L2 eviction hints".to_string(),
        _ => [
            (WGMMA_L2_WEIGHTS_EVICT_FIRST, "weights evict first"),
            (WGMMA_L2_ACTS_EVICT_LAST, "token rows evict last"),
        ]
        .iter()
        .filter(|(bit, _)| h & bit != 0)
        .map(|(_, name)| *name)
        .collect::<Vec<_>>()
        .join(", "),
    };
    let (slots, experts) = (p.slots(), p.global_experts.max(1));
    let per_expert = tokens_per_expert(p);
    let fit = 2 * slots <= tile * experts;
    let wide = p.n >= WGMMA_L2_HINTS_MIN_N;
    let rule = if fit || wide {
        WGMMA_L2_WEIGHTS_EVICT_FIRST | WGMMA_L2_ACTS_EVICT_LAST
    } else {
        0
    };
    let why = |h: u8| {
        if fit {
            format!("cuda_wgmma loads: {} (~{per_expert:.0} tokens per expert, at most half a {tile}-row tile: each weight block is read by one tile, the token rows again by the others)", what(h))
        } else if wide {
            format!("cuda_wgmma loads: {} (N = {} >= {WGMMA_L2_HINTS_MIN_N}: GEMM1 reads each tile's token rows in {} column blocks)", what(h), p.n, (2 * p.n).div_ceil(WGMMA_GEMM2_COLUMNS))
        } else {
            format!("cuda_wgmma loads: {} (~{per_expert:.0} tokens per expert, over half a {tile}-row tile: an expert's tiles share its weights through L2)", what(h))
        }
    };
    match std::env::var(WGMMA_L2_HINTS_ENV) {
        Err(_) => {
            reasons.add(|| why(rule));
            rule
        }
        Ok(v) => match v.trim().parse::<u8>() {
            Ok(h) if h <= WGMMA_L2_WEIGHTS_EVICT_FIRST | WGMMA_L2_ACTS_EVICT_LAST => {
                reasons.add(|| {
                    format!(
                        "cuda_wgmma loads: {} (forced by ${WGMMA_L2_HINTS_ENV}={v})",
                        what(h)
                    )
                });
                h
            }
            _ => {
                reasons.add(|| {
                    format!(
                        "${WGMMA_L2_HINTS_ENV}={v:?} ignored (expected 0 to 3); {}",
                        why(rule)
                    )
                });
                rule
            }
        },
    }
}

/// The column-block run of cuda_wgmma's GEMM2 (`Plan::wgmma_gemm2_block_run`) at token tile
/// `tile`, stages of `stage_k` elements of K, and the reason. A run of r > 1 blocks lets the
/// producer skip the tile's intermediate rows (64 KB of 192 KB per bf16 stage set at N = 256)
/// on all but the first block, since each k-stage of a tile then lands in a ring buffer that
/// still holds it. That needs a persistent GEMM2 and N's k-stages dividing the ring's stages
/// (deepseek-v3-tp8, N = 256: 4 bf16 or 2 e4m3 k-stages, tile 128's 4 stages); elsewhere 1.
/// Measured (benches/NOTES.md "GEMM2 block runs, measured"): runs of 4 only pay on e4m3 with
/// a full token tile per expert on average; `$SWAPMOE_WGMMA_GEMM2_BLOCK_RUN` overrides.
fn wgmma_gemm2_block_run(
    p: &MoeProblem,
    tile: usize,
    stage_k: usize,
    gemm2_persistent: bool,
    reasons: &mut Reasons,
) -> u8 {
    let (ktiles, stages) = (p.n.div_ceil(stage_k), wgmma_stages(tile));
    let blocks = p.k.div_ceil(WGMMA_GEMM2_COLUMNS);
    // a run is at most the column blocks
    let most = u8::try_from(blocks).unwrap_or(u8::MAX);
    let eligible = gemm2_persistent && stages % ktiles == 0;
    let why_not = if !gemm2_persistent {
        "GEMM2 is not a persistent grid".to_string()
    } else {
        format!("N's {ktiles} k-stages do not divide the ring's {stages} stages, so a tile's stages do not return to the buffers that hold its rows")
    };
    match std::env::var(WGMMA_GEMM2_BLOCK_RUN_ENV) {
        Err(_) => {
            let per_expert = tokens_per_expert(p);
            if !eligible {
                1
            } else if p.quant.is_some() && per_expert >= tile as f64 {
                let r = WGMMA_GEMM2_DENSE_E4M3_BLOCK_RUN.min(most);
                reasons.add(|| format!("cuda_wgmma GEMM2: runs of {r} of the {blocks} column blocks per token tile, the tile's rows loaded once per run (e4m3, ~{per_expert:.0} tokens per expert fill the {tile}-row tile: measured 4% faster at deepseek-v3-tp8 M = 4096)"));
                r
            } else {
                let what = if p.quant.is_some() {
                    format!("~{per_expert:.0} tokens per expert, under the {tile}-row tile")
                } else {
                    "bf16/f16".to_string()
                };
                reasons.add(|| format!("cuda_wgmma GEMM2: one column block per work item ({what}: runs of blocks measured no faster; ${WGMMA_GEMM2_BLOCK_RUN_ENV} asks for them)"));
                1
            }
        }
        Ok(v) => match v.trim().parse::<u8>() {
            Ok(r) if r >= 1 && eligible => {
                let r = r.min(most).max(1);
                reasons.add(|| format!("cuda_wgmma GEMM2: runs of {r} of the {blocks} column blocks per token tile, the tile's rows loaded once per run (forced by ${WGMMA_GEMM2_BLOCK_RUN_ENV}={v})"));
                r
            }
            Ok(r) if r >= 1 => {
                reasons.add(|| format!("${WGMMA_GEMM2_BLOCK_RUN_ENV}={v} ignored: {why_not}"));
                1
            }
            _ => {
                reasons.add(|| {
                    format!("${WGMMA_GEMM2_BLOCK_RUN_ENV}={v:?} ignored (expected 1 to 255)")
                });
                1
            }
        },
    }
}

/// Whether cuda_wgmma's GEMM1 reads its token rows gathered beforehand (the gather
/// kernel, then TMA) or gathers them itself (cp.async), and why (only when `wanted`: a
/// launch's quiet plan formats no reason): `$SWAPMOE_WGMMA_PREGATHER`, else
/// N >= WGMMA_PREGATHER_MIN_N. `rows`: what is gathered.
fn wgmma_pregather(p: &MoeProblem, rows: &str, wanted: bool) -> (bool, Option<String>) {
    let n = p.n;
    let rule = n >= WGMMA_PREGATHER_MIN_N;
    let env = env_word(WGMMA_PREGATHER_ENV);
    let env = env.as_str();
    let on = match env {
        "on" => true,
        "off" => false,
        _ => rule,
    };
    if !wanted {
        return (on, None);
    }
    let why = if rule {
        format!("gemm1: N={n} >= {WGMMA_PREGATHER_MIN_N}: {rows} are gathered once beforehand and read by TMA (the copy is small against 6N flops per element; TMA feeds the compute-bound loop better)")
    } else {
        format!("gemm1: N={n} < {WGMMA_PREGATHER_MIN_N}: GEMM1 gathers {rows} itself with cp.async (no gathered copy to write and read back)")
    };
    let text = match env {
        "on" => format!("gemm1: {rows} gathered beforehand and read by TMA (forced by ${WGMMA_PREGATHER_ENV}=on)"),
        "off" => format!("gemm1: GEMM1 gathers {rows} itself with cp.async (forced by ${WGMMA_PREGATHER_ENV}=off)"),
        "" | "auto" => why,
        v => format!("{why}; ${WGMMA_PREGATHER_ENV}={v:?} ignored (expected on, off or auto)"),
    };
    (on, Some(text))
}

/// Whether cuda_wgmma's GEMM1 groups the slots itself (no route_align launch), and why (only
/// when `wanted`: a launch's quiet plan formats no reason): `$SWAPMOE_ALIGN_IN_GEMM1`, else when
/// GEMM1 is a persistent grid (each CTA groups once; one CTA per item would group once per
/// item) of at most ALIGN_IN_GEMM1_MAX_SLOTS slots. Never with rows gathered beforehand (the
/// gather kernel reads the grouping before GEMM1) or when the grouping does not fit the shared
/// memory past GEMM1's stages.
fn wgmma_align_in_gemm1(
    p: &MoeProblem,
    tile: usize,
    gemm1_persistent: bool,
    pregather: bool,
    wanted: bool,
) -> (bool, Option<String>) {
    enum Why {
        Pregathered,
        SharedMemory,
        Forced,
        PerItem,
        ManySlots,
        Rule,
    }
    let slots = p.slots();
    let tiles = crate::problem::WorkspaceLayout::max_tiles(slots, p.local_experts, tile);
    let smem = wgmma_smem_bytes(tile) + cta_align_smem_bytes(slots, p.local_experts, tiles);
    let env = env_word(ALIGN_IN_GEMM1_ENV);
    let env = env.as_str();
    let (on, why) = if pregather {
        (false, Why::Pregathered)
    } else if smem > WGMMA_GEMM1_MAX_SMEM_BYTES {
        (false, Why::SharedMemory)
    } else if env == "on" || env == "off" {
        (env == "on", Why::Forced)
    } else if !gemm1_persistent {
        (false, Why::PerItem)
    } else if slots > ALIGN_IN_GEMM1_MAX_SLOTS {
        (false, Why::ManySlots)
    } else {
        (true, Why::Rule)
    };
    if !wanted {
        return (on, None);
    }
    let ignored = if matches!(env, "" | "on" | "off" | "auto") {
        String::new()
    } else {
        format!("; ${ALIGN_IN_GEMM1_ENV}={env:?} ignored (expected on, off or auto)")
    };
    let detail = match why {
        Why::Pregathered => {
            format!("GEMM1 reads rows gathered in the grouped order beforehand{ignored}")
        }
        Why::SharedMemory => format!(
            "GEMM1's stages and the grouping of {slots} slots over {} experts take {smem} bytes of shared memory, more than {WGMMA_GEMM1_MAX_SMEM_BYTES}{ignored}",
            p.local_experts
        ),
        Why::Forced if on => format!(" (forced by ${ALIGN_IN_GEMM1_ENV}=on)"),
        Why::Forced => format!("forced by ${ALIGN_IN_GEMM1_ENV}=off"),
        Why::PerItem => format!(
            "GEMM1 runs one CTA per item, each of which would group the slots again{ignored}"
        ),
        Why::ManySlots => format!("{slots} slots > {ALIGN_IN_GEMM1_MAX_SLOTS}: every CTA's grouping would outgrow the launch it saves{ignored}"),
        Why::Rule => format!(" ({slots} slots <= {ALIGN_IN_GEMM1_MAX_SLOTS}, a persistent GEMM1 groups them once per CTA){ignored}"),
    };
    let text = if on {
        format!("align: inside GEMM1, which groups the {slots} slots in each CTA's shared memory ({smem} bytes with its stages) and CTA 0 writes the grouping for the kernels after it: one launch less{detail}")
    } else {
        format!("align: its own kernel before GEMM1 ({detail})")
    };
    (on, Some(text))
}

/// cuda_wgmma's plan up to its GEMMs: whether GEMM1 groups the slots itself
/// (`wgmma_align_in_gemm1`, whose reason it pushes), and the kernels before GEMM1 that this
/// leaves: route_align, or none.
fn wgmma_first_kernels(
    p: &MoeProblem,
    tile: usize,
    gemm1_persistent: bool,
    pregather: bool,
    reasons: &mut Reasons,
) -> (bool, Vec<KernelId>) {
    let (in_gemm1, why) =
        wgmma_align_in_gemm1(p, tile, gemm1_persistent, pregather, reasons.wanted());
    reasons.extend(why);
    let kernels = if in_gemm1 {
        vec![]
    } else {
        vec![KernelId::RouteAlign]
    };
    (in_gemm1, kernels)
}

/// The heuristics: decode for few slots spread over experts, tensor cores when the call
/// can take them, generic otherwise. Pushes its reasons.
fn heuristic(c: &mut Candidates) -> Backend {
    let p = c.p;
    if p.device == Device::Cpu {
        c.reasons
            .add(|| "cpu: the tensors are on the CPU, so the rayon reference path runs".into());
        return Backend::Cpu;
    }
    let slots = p.slots();
    let per_expert = expected_slots_per_expert(expected_local_slots(p), p.local_experts);
    let decode_range =
        slots <= DECODE_HEURISTIC_MAX_SLOTS && per_expert <= DECODE_HEURISTIC_MAX_SLOTS_PER_EXPERT;
    // Where cuda_wgmma_swap measured fastest on the H200 (benches/NOTES.md, "swap v1"):
    // wide experts (N >= SWAP_WIDE_MIN_N) up to SWAP_WIDE_HEURISTIC_MAX_TOKENS tokens, and
    // beyond the decode kernels' range up to SWAP_HEURISTIC_MAX_TOKENS tokens.
    // FP8: the e4m3 wgmma swap-AB kernels up to where cuda_wgmma's FP8 GEMMs (or, for
    // schemes they lack, the SIMT ones) measured faster.
    let fp8 = p.quant.is_some();
    // Whether cuda_wgmma's FP8 GEMMs can run the call (asked once; None without FP8).
    let fp8_wgmma_check = fp8.then(|| c.eligible(Backend::CudaWgmma));
    let fp8_wgmma = matches!(fp8_wgmma_check, Some(Ok(())));
    let fp8_max = match (fp8_wgmma, p.n >= SWAP_WIDE_MIN_N) {
        (false, _) => SWAP_FP8_HEURISTIC_MAX_TOKENS,
        (true, true) => SWAP_FP8_WIDE_BEFORE_WGMMA_MAX_TOKENS,
        (true, false) => SWAP_FP8_BEFORE_WGMMA_MAX_TOKENS,
    };
    // Per-channel and block scales against cuda_wgmma: by the waves of its GEMM1 grid.
    let fp8_waves =
        (fp8_wgmma && p.quant.is_some_and(|q| q.scheme != QuantScheme::Tensor)).then(|| {
            let ctas = c.expected_active_experts() * (2 * p.n).div_ceil(WGMMA_GEMM1_COLUMNS) as f64;
            (ctas, ctas / c.sms as f64)
        });
    let swap_wins = if let Some((_, waves)) = fp8_waves {
        waves < SWAP_FP8_SCALED_MAX_WGMMA_WAVES
    } else if fp8 {
        p.m <= fp8_max
    } else if decode_range {
        // Within cuda_decode's range (M*topk <= DECODE_HEURISTIC_MAX_SLOTS) the 16-bit swap-AB kernels
        // run too, where they can: since "swap v1" (when they lost there) their rings, PDL and GEMM2
        // placement made them the faster at every such point of the shipped H200 tables (swap-AB with
        // its rules against cuda_decode, µs: qwen3-30b-a3b M = 1 / 2 / 4 29.2 / 47.8 / 84.2 against
        // 29.8 / 52.5 / 92.8; deepseek-v3-tp8 31.7 / 52.8 / 92.1 against 33.6 / 60.0 / 104.4;
        // mixtral-8x7b M = 1 173.6 against 185.5). cuda_decode stays where they cannot run (sm_80,
        // unaligned tensors, fp32).
        true
    } else {
        p.m <= SWAP_HEURISTIC_MAX_TOKENS
            || (p.n >= SWAP_WIDE_MIN_N && p.m <= SWAP_WIDE_HEURISTIC_MAX_TOKENS)
            || (p.m <= SWAP_SPARSE_HEURISTIC_MAX_TOKENS
                && c.expected_slots_per_active_expert() <= SWAP_SPARSE_MAX_SLOTS_PER_EXPERT)
    };
    match c.eligible(Backend::CudaWgmmaSwap) {
        Ok(()) if swap_wins && fp8_waves.is_some() => {
            let (ctas, waves) = fp8_waves.unwrap_or_default();
            c.reasons.add(|| format!(
                "cuda_wgmma_swap: FP8 with per-{} scales, cuda_wgmma's GEMM1 would run ~{ctas:.0} CTAs, {waves:.2} waves of one per SM (< {SWAP_FP8_SCALED_MAX_WGMMA_WAVES}): the e4m3 swap-AB kernels measured faster while its grid is under ~1.5 waves on the H200",
                if p.quant.is_some_and(|q| q.scheme == QuantScheme::Block) { "128x128-block" } else { "channel" }
            ));
            return Backend::CudaWgmmaSwap;
        }
        Ok(()) if fp8_waves.is_some() => {
            let (ctas, waves) = fp8_waves.unwrap_or_default();
            c.reasons.add(|| format!(
                "cuda_wgmma_swap: not picked, cuda_wgmma's GEMM1 fills ~{ctas:.0} CTAs, {waves:.2} waves of one per SM (>= {SWAP_FP8_SCALED_MAX_WGMMA_WAVES}), where its e4m3 GEMMs measured faster on the H200 (a tuned table or backend= can pick it)"
            ));
        }
        Ok(()) if fp8 && swap_wins => {
            c.reasons.add(|| format!(
                "cuda_wgmma_swap: M = {} <= {fp8_max}, FP8: the e4m3 wgmma (QGMMA) swap-AB kernels measured fastest here on the H200 ({})",
                p.m,
                if fp8_wgmma {
                    "against cuda_wgmma's FP8 GEMMs, which win beyond"
                } else {
                    "1.1-3.3x the FP8 SIMT kernels"
                }
            ));
            return Backend::CudaWgmmaSwap;
        }
        Ok(()) if fp8 => c.reasons.add(|| format!(
            "cuda_wgmma_swap: not picked, FP8 at M = {} > {fp8_max}: {}",
            p.m,
            if fp8_wgmma {
                "cuda_wgmma's e4m3 GEMMs measured faster (a tuned table or backend= can pick it)"
            } else {
                "with dynamic activation scales its 32- and 64-token tiles measured 0.4-0.9x the fastest FP8 SIMT kernel on qwen3-30b-a3b and deepseek-v3-tp8 (1.5-1.9x on mixtral-8x7b; a tuned table or backend= can pick it)"
            }
        )),
        Ok(()) if swap_wins && c.slots_per_expert() < WGMMA_HEURISTIC_MIN_SLOTS_PER_EXPERT => {
            let per_active = c.expected_slots_per_active_expert();
            c.reasons.add(|| format!(
                "cuda_wgmma_swap: M = {}, N = {}: the swap-AB wgmma kernels measured fastest here on the H200 (wide experts up to M = {SWAP_WIDE_HEURISTIC_MAX_TOKENS}, others up to M = {SWAP_HEURISTIC_MAX_TOKENS}, and up to M = {SWAP_SPARSE_HEURISTIC_MAX_TOKENS} at <= {SWAP_SPARSE_MAX_SLOTS_PER_EXPERT} slots per active expert, here ~{:.2}{})",
                p.m, p.n, per_active,
                if decode_range { ", and 2-13% faster than cuda_decode in its range" } else { "" }
            ));
            return Backend::CudaWgmmaSwap;
        }
        Ok(()) => c.reasons.add(|| format!(
            "cuda_wgmma_swap: not picked, M = {}, N = {} is outside where it measured fastest (a tuned table or backend= can pick it)",
            p.m, p.n
        )),
        Err(why) => c.reasons.add(|| format!("cuda_wgmma_swap: rejected, {why}")),
    }
    if let Some(Err(why)) = fp8_wgmma_check {
        c.reasons.add(|| format!("cuda_wgmma: rejected, {why}"));
    }
    if fp8_wgmma {
        c.reasons.add(||
            "cuda_wgmma: FP8 past the swap-AB kernels' range, so the e4m3 wgmma GEMMs: they measured faster than the FP8 decode and SIMT kernels at every M of the three public shapes on the H200".into(),
        );
        return Backend::CudaWgmma;
    }
    if decode_range {
        c.reasons.add(|| format!(
            "cuda_decode: M*topk = {slots} <= {DECODE_HEURISTIC_MAX_SLOTS} and ~{per_expert:.1} slots per expert, so each GEMM CTA routes for itself and GEMM2 sums over top-k: 2 launches instead of 4"
        ));
        let bulk = c.eligible(Backend::CudaBulkDecode);
        c.reasons.add(|| match bulk {
            Ok(()) => "cuda_bulk_decode: not picked by the heuristic, measured slower than cuda_decode on the H200 (benches/NOTES.md, v6); a tuned table or backend= can pick it".into(),
            Err(why) => format!("cuda_bulk_decode: rejected, {why}"),
        });
        return Backend::CudaDecode;
    }
    c.reasons.add(|| format!(
        "cuda_decode: rejected, M*topk = {slots} (limit {DECODE_HEURISTIC_MAX_SLOTS}) with ~{per_expert:.1} slots per expert (limit {DECODE_HEURISTIC_MAX_SLOTS_PER_EXPERT}): its GEMM2 would re-read weight rows per slot"
    ));
    let per_active = c.slots_per_expert();
    if p.quant.is_some() {
        c.reasons
            .add(|| "cuda_mma: rejected, it has no FP8 kernels in this build".into());
        c.reasons.add(||
            "cuda_generic: the FP8 path beyond decode where no tensor-core FP8 kernel runs (SIMT, e4m3 weights as 16-byte vectors)".into(),
        );
        return Backend::CudaGeneric;
    }
    match c.eligible(Backend::CudaWgmma) {
        Ok(()) if per_active >= WGMMA_OVER_MMA_MIN_SLOTS_PER_EXPERT => {
            let tile = c.wgmma_token_tile();
            c.reasons.add(|| format!(
                "cuda_wgmma: {per_active:.1} slots per active expert on average (>= {WGMMA_OVER_MMA_MIN_SLOTS_PER_EXPERT}), so the Hopper wgmma GEMMs win; token tile {tile}"
            ));
            return Backend::CudaWgmma;
        }
        Ok(()) => c.reasons.add(|| format!(
            "cuda_wgmma: not picked, {per_active:.1} slots per active expert (< {WGMMA_OVER_MMA_MIN_SLOTS_PER_EXPERT}): the 16-token mma.sync tile wastes fewer rows"
        )),
        Err(why) => c.reasons.add(|| format!("cuda_wgmma: rejected, {why}")),
    }
    match c.eligible(Backend::CudaMma) {
        Ok(()) => {
            let tile = c.mma_token_tile();
            c.reasons.add(|| format!(
                "cuda_mma: {per_active:.1} slots per active expert on average, so tensor cores pay; token tile {tile}"
            ));
            Backend::CudaMma
        }
        Err(why) => {
            c.reasons.add(|| format!("cuda_mma: rejected, {why}"));
            c.reasons
                .add(|| "cuda_generic: the fallback for every dtype and shape".into());
            Backend::CudaGeneric
        }
    }
}

/// The table's choice for a CUDA problem, if there is one the call can run: (backend, the
/// external backend chosen with it as swapmoe's fallback). Sets the token tile on `c`,
/// pushes reasons, fills `table` and, the first time per table key and kind, `log`.
fn from_table(
    c: &mut Candidates,
    set: &TableSet,
    caps: &DeviceCaps,
    req: &Request,
    table: &mut Option<TableUse>,
    log: &mut Option<LogNote>,
) -> Option<(Backend, Option<ExternalBackend>)> {
    let p = c.p;
    let quant = req.quant.unwrap_or(match p.quant.map(|q| q.scheme) {
        None => Quant::None,
        Some(QuantScheme::Tensor) => Quant::Fp8Tensor,
        Some(QuantScheme::Channel) => Quant::Fp8Channel,
        Some(QuantScheme::Block) => Quant::Fp8Block128,
    });
    // The table measured at this call's hidden size, else the (E, N) one (vLLM's key).
    let file_k =
        tables::file_name_for_hidden(p.local_experts, p.n, p.k, &caps.name, p.dtype, quant);
    let file_any_k = tables::file_name(p.local_experts, p.n, &caps.name, p.dtype, quant);
    let (file, loaded) = match set.get(&file_k) {
        Some(l) => (file_k.clone(), Some(l)),
        None => {
            let l = set.get(&file_any_k);
            (file_any_k, l)
        }
    };
    if set.disabled {
        c.reasons.add(|| {
            format!(
                "table: tables are off (${}=off), so the heuristics decide",
                tables::TABLES_ENV
            )
        });
        return None;
    }
    let mut note = |kind: &str, warning: bool, message: String| {
        if first_time(&format!("{file}|{kind}")) {
            *log = Some(LogNote { warning, message });
        }
    };
    let t = match loaded {
        None => {
            c.reasons.add(|| {
                format!(
                    "table: none named {file} or {file_k} ({}), so the heuristics decide",
                    set.searched()
                )
            });
            note(
                "none",
                false,
                format!("no tuned table {file} or {file_k}; the heuristics decide for this shape"),
            );
            return None;
        }
        Some(Loaded::Bad { path, error, .. }) => {
            c.reasons.add(|| {
                format!(
                    "table: {} ignored, it is malformed: {error}; the heuristics decide",
                    path.display()
                )
            });
            note(
                "bad",
                true,
                format!(
                    "tuned table {} ignored, it is malformed: {error}",
                    path.display()
                ),
            );
            return None;
        }
        Some(Loaded::Ok(t)) => t.clone(),
    };
    if let (Some(measured), Some(q)) = (t.meta.activation_scales, p.quant.as_ref()) {
        let call = match (q.a1_scale != 0, q.a2_scale != 0) {
            (true, true) => Some(ActivationScales::Static),
            (false, false) => Some(ActivationScales::Dynamic),
            _ => None, // one given, one computed: no table measures that
        };
        if call != Some(measured) {
            c.reasons.add(|| format!(
                "table: {} ({}) was measured with {} activation scales and this call's are {}: the FP8 kernels differ, so the heuristics decide",
                t.file,
                t.origin.name(),
                measured.name(),
                call.map_or("mixed (one of a1_scale, a2_scale given)", |a| a.name())
            ));
            return None;
        }
    }
    let Some(nearest) = t.nearest(p.m) else {
        c.reasons.add(|| {
            format!(
                "table: {} has no M entries; the heuristics decide",
                t.path.display()
            )
        });
        note(
            "empty",
            true,
            format!("tuned table {} has no M entries", t.path.display()),
        );
        return None;
    };
    let Some(entry) = t.lookup(p.m) else {
        c.reasons.add(|| format!(
            "table: {} ({}) has no entry within {}x of M={} (the nearest is M={}); the heuristics decide",
            t.file,
            t.origin.name(),
            tables::MAX_M_RATIO,
            p.m,
            nearest.m
        ));
        *table = Some(TableUse {
            file: file.clone(),
            path: t.path.display().to_string(),
            m: nearest.m,
            used: false,
        });
        return None;
    };
    let mut use_ = TableUse {
        file: file.clone(),
        path: t.path.display().to_string(),
        m: entry.m,
        used: false,
    };
    if c.reasons.wanted() {
        c.table_times = entry.times_us.clone();
    }
    c.reasons.add(|| format!(
        "table: {} ({}) entry M={} (the nearest to M={} within {}x; ties go to the smaller M): {}{}",
        t.file,
        t.origin.name(),
        entry.m,
        p.m,
        tables::MAX_M_RATIO,
        entry.choice,
        entry
            .time_us
            .map(|us| match entry.choice {
                // an external backend's time may be the tune's estimate (a shipped table
                // without vLLM times carries the anchor's GEMMs plus an estimate for the rest)
                Choice::External(_) => format!(", {us:.1} µs in the entry"),
                _ => format!(", {us:.1} µs measured"),
            })
            .unwrap_or_default()
    ));
    let mut differs = Vec::new();
    if let Some(k) = t.meta.k.filter(|&k| k != p.k) {
        differs.push(format!("K={k} (this call K={})", p.k));
    }
    if let Some(k) = t.meta.topk.filter(|&k| k != p.topk) {
        differs.push(format!("topk={k} (this call topk={})", p.topk));
    }
    if !differs.is_empty() {
        c.reasons.add(|| {
            format!(
            "table: measured with {}; used all the same (this (E, N) table stands for every K, as vLLM's; a table named {file_k} would come first)",
            differs.join(", ")
        )
        });
    }
    let result = match &entry.choice {
        Choice::External(x) if req.external.contains(x) => {
            // swapmoe's own fallback: the fastest measured swapmoe label, else the heuristics
            let fb = best_swapmoe(c, entry);
            c.reasons.add(|| format!(
                "table: {} chosen, the caller runs inside vLLM and allows it (external_backends); swapmoe's fallback is below",
                x.name()
            ));
            use_.used = true;
            let b = fb.unwrap_or_else(|| heuristic(c));
            Some((b, Some(*x)))
        }
        Choice::External(x) => {
            c.reasons.add(|| format!(
                "table: {} is a candidate only when the caller runs inside vLLM and says so (external_backends={:?})",
                x.name(),
                req.external.iter().map(|b| b.name()).collect::<Vec<_>>()
            ));
            match best_swapmoe(c, entry) {
                Some(b) => {
                    use_.used = true;
                    Some((b, None))
                }
                None => {
                    c.reasons.add(||
                        "table: no swapmoe time in the entry can run this call, so the heuristics decide"
                            .into(),
                    );
                    note(
                        "external",
                        false,
                        format!(
                            "tuned table {} prefers {} at M={}, which only vLLM can run; the heuristics decide",
                            t.path.display(),
                            x.name(),
                            entry.m
                        ),
                    );
                    None
                }
            }
        }
        choice => match c.table_eligible(choice) {
            Ok(b) => {
                use_.used = true;
                let vllm = ExternalBackend::VllmTriton;
                let vllm_timed = entry
                    .times_us
                    .iter()
                    .any(|(timed, _)| *timed == Choice::External(vllm));
                if req.external.contains(&vllm) && !vllm_timed {
                    // an entry that never timed vLLM's Triton cannot say swapmoe is faster:
                    // the call is decided as an untabled one, with the entry's pick
                    let what = format!(
                        "{} has no vllm_triton time at M={} (tuned without vLLM)",
                        t.file, entry.m
                    );
                    let x = unmeasured_call_external(c, Some(caps), b, &what);
                    if x.is_some() {
                        note(
                            "unmeasured",
                            false,
                            format!(
                                "tuned table {} has no vllm_triton time at M={}: inside vLLM such calls stay on vLLM's Triton",
                                t.path.display(),
                                entry.m
                            ),
                        );
                    }
                    Some((b, x))
                } else {
                    Some((b, None))
                }
            }
            Err(why) => {
                c.reasons.add(|| {
                    format!(
                        "table: rejected {choice} from {} M={}: {why}; the heuristics decide",
                        t.file, entry.m
                    )
                });
                note(
                    "rejected",
                    true,
                    format!(
                        "tuned table {} entry M={} ({choice}) cannot run {p}: {why}; the heuristics decide",
                        t.path.display(),
                        entry.m
                    ),
                );
                None
            }
        },
    };
    *table = Some(use_);
    result
}

/// The fastest swapmoe label of an entry's `times_us` that can run the call (sets the tile).
fn best_swapmoe(c: &mut Candidates, entry: &tables::Entry) -> Option<Backend> {
    for (choice, us) in &entry.times_us {
        if !matches!(choice, Choice::Swapmoe { .. }) {
            continue;
        }
        match c.table_eligible(choice) {
            Ok(b) => {
                c.reasons
                    .add(|| format!("table: best swapmoe time in the entry: {choice}, {us:.1} µs"));
                return Some(b);
            }
            Err(why) => c
                .reasons
                .add(|| format!("table: skipped {choice} from times_us: {why}")),
        }
    }
    None
}

/// Whether the router and align kernels are launched with programmatic dependent launch,
/// so that their start-up overlaps the previous kernel's tail (sm_90+). They wait for it
/// (griddepcontrol.wait) before reading anything.
pub fn first_kernel_uses_pdl(caps: &DeviceCaps) -> bool {
    caps.capability.0 >= 9
}

/// The router kernel for E experts routed as `cfg` says, and why.
///
/// Grouped sigmoid routing (DeepSeek-V3) takes the CTA router when its groups merge inside
/// a warp: at E = 256 the warp router's 8 serial picks over 8 keys per lane plus the group
/// stage cost 3.7-3.9 us over fused_experts (benches/NOTES.md "Router v3"). Softmax stays on
/// the warp router: its denominator is summed in the warp's order, and another order would
/// change the weights' last bits between kernels. Otherwise the narrowest warp router that
/// holds E (the fewer keys per lane, the fewer instructions per pick).
pub fn router_kernel(
    experts: usize,
    cfg: &RouterConfig,
    asked: RouterKernelChoice,
) -> (KernelId, String) {
    if let Some((groups, _)) = cfg.groups.filter(|g| g.0 > 1) {
        let group = experts / groups;
        let why_not = if asked == RouterKernelChoice::Warp {
            Some(format!("${ROUTER_KERNEL_ENV}=warp"))
        } else if cfg.scoring != Scoring::Sigmoid {
            Some("softmax scores are summed in the warp router's order".to_string())
        } else if experts > ROUTER_CTA_MAX_EXPERTS {
            Some(format!(
                "E = {experts} > {ROUTER_CTA_MAX_EXPERTS} threads of the CTA router"
            ))
        } else if !group.is_power_of_two() || group > ROUTER_CTA_MAX_GROUP_EXPERTS {
            Some(format!(
                "groups of {group} experts are not a power of two <= {ROUTER_CTA_MAX_GROUP_EXPERTS} (one warp's shuffles)"
            ))
        } else {
            None
        };
        return match why_not {
            None => (
                KernelId::RouteGroupedCta,
                format!("grouped sigmoid routing, {groups} groups of {group}: one CTA per token, one thread per expert, ranks instead of serial picks"),
            ),
            Some(why) => {
                let (id, lanes) = warp_router_kernel(experts);
                (id, format!("{lanes}; not the grouped CTA router: {why}"))
            }
        };
    }
    warp_router_kernel(experts)
}

/// The narrowest warp router that holds E experts, and a description.
fn warp_router_kernel(experts: usize) -> (KernelId, String) {
    let p = if experts <= 32 * ROUTER_NARROWEST_LANE_EXPERTS {
        ROUTER_NARROWEST_LANE_EXPERTS
    } else if experts <= ROUTER_FUSED_MAX_EXPERTS {
        ROUTER_NARROW_LANE_EXPERTS
    } else {
        ROUTER_WIDE_LANE_EXPERTS
    };
    (
        KernelId::RouteTopk(p),
        format!("one warp per token, up to {p} experts per lane (E = {experts})"),
    )
}

/// Which router kernel `$SWAPMOE_ROUTER_KERNEL` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RouterKernelChoice {
    /// Unset or "auto": `router_kernel`'s rules.
    #[default]
    Auto,
    /// "warp": the warp router even where the CTA router applies.
    Warp,
    /// "cta": the grouped CTA router wherever it can route the call (what "auto" picks).
    Cta,
}

/// What the environment asks of the router's placement and kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouterRequest {
    /// `$SWAPMOE_ROUTER_FUSION=on`: route inside the experts' first kernel where one can.
    pub fusion: bool,
    /// `$SWAPMOE_ROUTER_KERNEL`.
    pub kernel: RouterKernelChoice,
    /// `$SWAPMOE_FIRST_KERNEL_PDL` when set: the router kernel's launch follows it.
    pub first_kernel_pdl: Option<bool>,
}

impl RouterRequest {
    /// Reads `$SWAPMOE_ROUTER_FUSION` ("on"/"1" or "off"/"0"/unset),
    /// `$SWAPMOE_ROUTER_KERNEL` ("auto"/unset, "warp" or "cta") and
    /// `$SWAPMOE_FIRST_KERNEL_PDL`; other values are an ArgumentError naming the variable.
    pub fn from_env() -> Result<Self> {
        let read = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_string());
        let fusion = match read(ROUTER_FUSION_ENV).as_deref() {
            None | Some("" | "off" | "0") => false,
            Some("on" | "1") => true,
            Some(other) => {
                return Err(Error::Argument(format!(
                    "${ROUTER_FUSION_ENV}: expected 'on' or 'off', got {other:?}"
                )))
            }
        };
        let kernel = match read(ROUTER_KERNEL_ENV).as_deref() {
            None | Some("" | "auto") => RouterKernelChoice::Auto,
            Some("warp") => RouterKernelChoice::Warp,
            Some("cta") => RouterKernelChoice::Cta,
            Some(other) => {
                return Err(Error::Argument(format!(
                    "${ROUTER_KERNEL_ENV}: expected 'auto', 'warp' or 'cta', got {other:?}"
                )))
            }
        };
        Ok(RouterRequest {
            fusion,
            kernel,
            first_kernel_pdl: forced_first_kernel_pdl()?,
        })
    }
}

/// Decides where fused_moe routes its M tokens over E experts, given the experts' plan: the
/// router kernel before it, or (`request.fusion`) the plan's first kernel swapped for its
/// routing twin where one exists. Records the choice and its reason in the plan.
///
/// The router kernel is the default because it measured faster at every point of issue 3's
/// grid on the H200 (benches/NOTES.md, "Router v3"): the twins put the router's latency on
/// every GEMM1 CTA's critical path (two waves at qwen3 M=1), or serialize it before the
/// alignment in one CTA, while the router kernel runs once and PDL hides the next launch.
pub fn place_router(
    plan: &mut Plan,
    m: usize,
    experts: usize,
    cfg: &RouterConfig,
    request: RouterRequest,
) {
    let separate = |plan: &mut Plan, why: String| {
        let (id, kernel_why) = router_kernel(experts, cfg, request.kernel);
        plan.reasons
            .add(|| format!("router: its own kernel first, {why}"));
        plan.reasons
            .add(|| format!("router: {}: {kernel_why}", id.symbol()));
        plan.router = RouterPlacement::Separate(id);
        let cta_past_pdl = id == KernelId::RouteGroupedCta && m > ROUTER_CTA_PDL_MAX_TOKENS;
        // The one-wave rule is about GEMM1's CTAs, which here follow the router by PDL.
        if plan.one_wave_gemm1
            && !plan.first_kernel_pdl
            && !cta_past_pdl
            && request.first_kernel_pdl.is_none()
        {
            plan.first_kernel_pdl = true;
            plan.reasons.add(|| format!(
                "router: launched with PDL although fused_experts would start GEMM1 without (its one-wave rule): here GEMM1 follows the router by PDL either way; {ROUTER_PDL_BEFORE_ONE_WAVE_MEASURED}"
            ));
        }
        if cta_past_pdl && request.first_kernel_pdl.is_none() && plan.first_kernel_pdl {
            plan.first_kernel_pdl = false;
            plan.reasons.add(|| format!(
                "router: launched without PDL (M = {m} > {ROUTER_CTA_PDL_MAX_TOKENS}): launched early, the CTA router's M CTAs measured 2-3 us slower inside fused_moe"
            ));
        }
    };
    if plan.backend == Backend::Cpu {
        plan.reasons
            .add(|| "router: on the CPU before the experts".into());
        plan.router = RouterPlacement::NotRouting;
        return;
    }
    if !request.fusion {
        return separate(
            plan,
            format!("measured faster than routing inside the experts' first kernel (${ROUTER_FUSION_ENV}=on does that)"),
        );
    }
    if experts > ROUTER_FUSED_MAX_EXPERTS {
        return separate(
            plan,
            format!(
                "E = {experts} > {ROUTER_FUSED_MAX_EXPERTS} does not fit the fused router's registers"
            ),
        );
    }
    if plan.align_in_gemm1 {
        return separate(
            plan,
            "GEMM1 groups the slots itself (no align kernel to route in; GEMM1 gathers its rows by the ids)".into(),
        );
    }
    match plan.kernels.first().copied() {
        Some(KernelId::RouteAlign) if m <= ROUTER_IN_ALIGN_MAX_TOKENS => {
            plan.kernels[0] = KernelId::RouteAlignRouted;
            plan.align_ctas = 1;  // the routing twin runs as one CTA
            plan.router = RouterPlacement::InAlign;
            plan.reasons.add(|| format!(
                "router: inside the align kernel (M = {m} <= {ROUTER_IN_ALIGN_MAX_TOKENS}: its 32 warps route the tokens, then group them; one launch less)"
            ));
        }
        Some(KernelId::RouteAlign) => separate(
            plan,
            format!("M = {m} > {ROUTER_IN_ALIGN_MAX_TOKENS}: the router kernel's warps run in parallel, the align CTA's would take turns"),
        ),
        Some(KernelId::DecodeGemm1Act(d, v)) if m <= DECODE_ROWS_PER_CTA => {
            plan.kernels[0] = KernelId::DecodeGemm1Routed(d, v);
            plan.router = RouterPlacement::InDecodeGemm1;
            plan.reasons.add(|| format!(
                "router: inside GEMM1 (M = {m} <= {DECODE_ROWS_PER_CTA}: each CTA's warps route one token each before streaming weights; no router launch, no round trip through global memory)"
            ));
        }
        Some(KernelId::DecodeGemm1Act(..)) => separate(
            plan,
            format!("M = {m} > {DECODE_ROWS_PER_CTA} tokens, one per GEMM1 warp"),
        ),
        _ => separate(
            plan,
            format!("the {} plan has no kernel that routes", plan.backend.name()),
        ),
    }
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
/// `swapmoe.select_backend` and `swapmoe explain`: [`decide`] with `req`. With `quant`, the
/// weights are e4m3 with that scheme's scales; `scales` is the kind of FP8
/// activation scales the call has: None is the scheme's usual one (static for per-tensor, as
/// calibrated checkpoints give them; dynamic for per-channel and block, the only kind those
/// kernels take).
/// `global_num_experts`: the model's experts when this rank holds `num_experts` of them
/// (expert parallelism; -1: all of them): the plan the op makes for a call with an
/// `expert_map` of that length, whose ids fall uniformly on the model's experts, so that about
/// `num_experts / global_num_experts` of the slots land on this rank.
#[allow(clippy::too_many_arguments)]
pub fn plan_for_shape(
    num_tokens: i64,
    num_experts: i64,
    global_num_experts: i64,
    top_k: i64,
    hidden_size: i64,
    intermediate_size: i64,
    dtype: DType,
    quant: Option<QuantScheme>,
    scales: Option<ActivationScales>,
    caps: &DeviceCaps,
    req: &Request,
) -> Result<Plan> {
    use crate::problem::{Activation, MoeArgs, QuantArgs};
    let static_act = match (quant, scales) {
        (None, None) => false,
        (None, Some(a)) => {
            return Err(Error::Argument(format!(
                "activation_scales: expected None without quant (scales are for FP8), got {:?}",
                a.name()
            )))
        }
        (Some(QuantScheme::Tensor), a) => a != Some(ActivationScales::Dynamic),
        (Some(_), None | Some(ActivationScales::Dynamic)) => false,
        (Some(s), Some(ActivationScales::Static)) => {
            return Err(Error::Argument(format!(
                "activation_scales: expected None or 'dynamic' for quant={:?} (its activation scales are per token or per 128-column group, computed by the op; 'static' is for 'fp8_tensor'), got 'static'",
                if s == QuantScheme::Channel { "fp8_channel" } else { "fp8_block128" }
            )))
        }
    };
    if let Some(q) = quant {
        check_fp8_capability(q, caps, "quant")?;
    }
    let dev = Device::Cuda(0);
    let addrs = crate::problem::FakeAddresses::default();
    let t = |d, shape: &[i64]| addrs.tensor(d, shape, dev);
    let (m, e, k, n) = (num_tokens, num_experts, hidden_size, intermediate_size);
    if e >= 1 && global_num_experts != -1 && global_num_experts < e {
        return Err(Error::Shape(format!(
            "global_num_experts: expected -1 or at least num_experts ({e}), got {global_num_experts}"
        )));
    }
    let global = if global_num_experts == -1 {
        e
    } else {
        global_num_experts
    };
    if m < 0 || e < 1 || top_k < 1 || top_k > global || k < 1 || n < 1 {
        return Err(Error::Shape(format!(
            "select_backend: expected num_tokens >= 0, num_experts >= 1, 1 <= top_k <= global_num_experts (num_experts without expert parallelism), hidden_size >= 1 and intermediate_size >= 1, got {m}, {e}, {top_k}, {k}, {n} (global_num_experts {global})"
        )));
    }
    // the op's own limits (32-bit indices in the kernels), named by this function's arguments
    let big = i32::MAX as i64;
    if [m, e, global, k, n].iter().any(|&v| v > big) || m.saturating_mul(top_k) > big {
        return Err(Error::Shape(format!(
            "select_backend: expected num_tokens * top_k, num_experts, global_num_experts, hidden_size and intermediate_size each < 2^31, got num_tokens = {m}, top_k = {top_k}, num_experts = {e}, global_num_experts = {global}, hidden_size = {k}, intermediate_size = {n}"
        )));
    }
    let wd = if quant.is_some() {
        DType::F8E4M3
    } else {
        dtype
    };
    let (h, w1, w2) = (t(dtype, &[m, k]), t(wd, &[e, 2 * n, k]), t(wd, &[e, k, n]));
    let (tw, ids) = (t(DType::F32, &[m, top_k]), t(DType::I32, &[m, top_k]));
    // expert parallelism: the op sees an expert_map of the model's experts
    let map = t(DType::I32, &[global]);
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
        expert_map: (global != e).then_some(&map),
        activation: Activation::Silu,
        apply_router_weight_on_input: false,
        global_num_experts: -1,
        quant: q,
    })?;
    decide(&p, Some(caps), req)
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

/// Why a backend cannot run a problem: the reason in words, and which input it is about,
/// which decides the error a forced backend raises (a K or N tail the kernels cannot take is a
/// `ShapeError` naming the multiple they need, an fp32 call on a 16-bit kernel a `DTypeError`).
#[derive(Debug, Clone, PartialEq)]
struct Ineligible {
    kind: IneligibleKind,
    why: String,
}

/// The input an `Ineligible` reason is about.
#[derive(Debug, Clone, Copy, PartialEq)]
enum IneligibleKind {
    /// The tensors' device or the device's architecture.
    Device,
    /// The activation dtype.
    DType,
    /// M, K, N, the slots, or the strides and alignment.
    Shape,
    /// A scheme or option the backend does not take.
    Argument,
}

impl IneligibleKind {
    fn error(self, message: String) -> Error {
        match self {
            IneligibleKind::Device => Error::Device(message),
            IneligibleKind::DType => Error::DType(message),
            IneligibleKind::Shape => Error::Shape(message),
            IneligibleKind::Argument => Error::Argument(message),
        }
    }
}

impl Ineligible {
    fn device(why: impl Into<String>) -> Self {
        Ineligible {
            kind: IneligibleKind::Device,
            why: why.into(),
        }
    }
    fn dtype(why: impl Into<String>) -> Self {
        Ineligible {
            kind: IneligibleKind::DType,
            why: why.into(),
        }
    }
    fn shape(why: impl Into<String>) -> Self {
        Ineligible {
            kind: IneligibleKind::Shape,
            why: why.into(),
        }
    }
    fn argument(why: impl Into<String>) -> Self {
        Ineligible {
            kind: IneligibleKind::Argument,
            why: why.into(),
        }
    }
}

impl fmt::Display for Ineligible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.why)
    }
}

/// What the oracle knows about one problem while it decides.
struct Candidates<'a> {
    p: &'a MoeProblem,
    capability: Option<(i32, i32)>,
    /// The token tile of cuda_mma (from a table or an override); None: the heuristic's.
    tile: Option<usize>,
    /// How a table launches cuda_wgmma_swap's bf16/fp16 kernels; None: the rules.
    swap_launch: Option<tables::SwapLaunch>,
    pdl_ok: bool,
    /// The device is sm_90 (Hopper), known to the oracle; its SM count.
    hopper_sms: Option<usize>,
    /// The device's SM count (132, an H200's, when no device is known).
    sms: usize,
    gemm1_vec: usize,
    gemm2_vec: usize,
    reasons: Reasons,
    /// The measured times of the table entry that decided, when the reasons are wanted (the
    /// other candidates' reasons quote them).
    table_times: Vec<(Choice, f64)>,
}

impl<'a> Candidates<'a> {
    fn new(p: &'a MoeProblem, caps: Option<&DeviceCaps>, reasons_wanted: bool) -> Self {
        let mut reasons = Reasons::new(reasons_wanted);
        if let Some(c) = caps {
            reasons.add(|| {
                format!(
                    "device: {} (sm_{}{}, {} SMs)",
                    c.name, c.capability.0, c.capability.1, c.sm_count
                )
            });
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
                reasons.add(|| {
                    format!(
                        "fp8: W8A8 e4m3, {} scales, input scale {}, intermediate scale {}",
                        q.scheme.name(),
                        if q.a1_scale != 0 { "static" } else { "dynamic" },
                        if q.a2_scale != 0 { "static" } else { "dynamic" }
                    )
                });
            }
            reasons.add(|| if gemm1_ok {
                format!("gemm1: 16-byte loads, K and the hidden_states/w1 strides are multiples of {w}")
            } else {
                format!(
                    "gemm1: scalar loads, K={} or a hidden_states/w1 stride or address is not a multiple of {w} elements",
                    p.k
                )
            });
            reasons.add(|| if gemm2_ok {
                format!("gemm2: 16-byte loads, N and the w2 strides are multiples of {w}")
            } else {
                format!("gemm2: scalar loads, N={} or a w2 stride or address is not a multiple of {w} elements", p.n)
            });
        }
        Candidates {
            p,
            capability: caps.map(|c| c.capability),
            tile: None,
            swap_launch: None,
            pdl_ok: caps.is_none_or(|c| c.capability.0 >= 9),
            hopper_sms: caps
                .filter(|c| c.capability == (9, 0))
                .map(|c| c.sm_count.max(1) as usize),
            sms: caps.map_or(132, |c| c.sm_count.max(1) as usize),
            gemm1_vec: if gemm1_ok { w as usize } else { 1 },
            gemm2_vec: if gemm2_ok { w as usize } else { 1 },
            reasons,
            table_times: Vec::new(),
        }
    }

    /// A reason for every candidate that has none yet, so that a plan says why each one was
    /// taken or not (issue 6): the swapmoe backends the decision never looked at (a table or an
    /// override decided, or the heuristics stopped at an earlier pick), and the external
    /// backends. `picked`: the plan's backend; `decided_by`: what chose it (a forced token tile
    /// alone does not count); `external`: the external backend the caller runs instead, if any,
    /// `forced_external` whether the override named it; `allowed`: the external backends the
    /// caller can run. Only when the reasons are wanted.
    fn account_for_the_rest(
        &mut self,
        picked: Backend,
        decided_by: Source,
        external: Option<ExternalBackend>,
        forced_external: bool,
        allowed: &[ExternalBackend],
    ) {
        if !self.reasons.wanted() {
            return;
        }
        let entry_us = |times: &[(Choice, f64)], hit: &dyn Fn(&Choice) -> bool| {
            times
                .iter()
                .filter(|(c, _)| hit(c))
                .map(|&(_, us)| us)
                .reduce(f64::min)
        };
        let swapmoe_us = |b: Backend| {
            entry_us(
                &self.table_times,
                &|c| matches!(c, Choice::Swapmoe { backend, .. } if *backend == b),
            )
        };
        let external_us =
            |x: ExternalBackend| entry_us(&self.table_times, &|c| *c == Choice::External(x));
        // what the table sentences compare against: the external backend where the entry
        // timed it, else the swapmoe pick (an external one picked without an entry time was
        // sent there by the untabled rule, not by the entry)
        let winner = match external.and_then(|x| external_us(x).map(|us| (x, us))) {
            Some((x, us)) => format!("{} ({us:.1} µs)", x.name()),
            None => match swapmoe_us(picked) {
                Some(us) => format!("{} ({us:.1} µs)", picked.name()),
                None => picked.name().to_string(),
            },
        };
        let forced = match external {
            Some(x) if forced_external => x.name(),
            _ => picked.name(),
        };
        // whether a sentence about `name` is there already ("name: ...")
        let said = |reasons: &Reasons, name: &str| {
            reasons.iter().any(|r| {
                r.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(':'))
            })
        };
        if !said(&self.reasons, picked.name()) {
            let how = match (decided_by, external) {
                (_, Some(x)) => format!(
                    "as swapmoe's fallback where {} cannot run the call",
                    x.name()
                ),
                (Source::Override, None) => "forced (see the override)".to_string(),
                (Source::Table, None) => {
                    format!("the table entry's fastest swapmoe time, {winner}")
                }
                (Source::Heuristic, None) => "by the heuristics".to_string(),
            };
            self.reasons
                .add(|| format!("{}: picked {how}", picked.name()));
        }
        for b in Backend::ALL {
            if b == picked || said(&self.reasons, b.name()) {
                continue;
            }
            let why = match (self.eligible(b), decided_by, swapmoe_us(b)) {
                (Err(why), _, _) => format!("rejected, {why}"),
                (Ok(()), Source::Override, _) => format!("not picked, {forced} is forced"),
                (Ok(()), Source::Table, Some(us)) => {
                    format!("not picked, the table entry measured it at {us:.1} µs against {winner}")
                }
                (Ok(()), Source::Table, None) => {
                    format!("not picked, the table entry did not time it (it measured {winner})")
                }
                (Ok(()), Source::Heuristic, _) => format!(
                    "not picked, the heuristics take {} first here (a tuned table or backend= can pick it)",
                    picked.name()
                ),
            };
            self.reasons.add(|| format!("{}: {why}", b.name()));
        }
        for x in ExternalBackend::ALL {
            if said(&self.reasons, x.name()) {
                continue;
            }
            let why = match (Some(x) == external, allowed.contains(&x), decided_by, external_us(x)) {
                (true, _, Source::Override, _) => format!(
                    "picked, forced (see the override); {} runs the call if it cannot",
                    picked.name()
                ),
                (true, _, _, Some(us)) => format!(
                    "picked, the table entry's fastest time ({us:.1} µs, which may be the tune's estimate of vLLM); {} runs the call if it cannot",
                    picked.name()
                ),
                (true, _, _, None) => format!(
                    "picked; {} runs the call if it cannot",
                    picked.name()
                ),
                (false, false, _, _) => "not a candidate: only a caller that can run it (inside vLLM) allows it, through external_backends".to_string(),
                (false, true, Source::Override, _) => format!("not picked, {forced} is forced"),
                (false, true, Source::Table, Some(us)) => format!(
                    "not picked, the table entry has {us:.1} µs for it (which may be the tune's estimate of vLLM) against {winner}"
                ),
                (false, true, _, _) => format!(
                    "not picked, no table entry has a time for it at this call, so {} runs it",
                    external.map_or(picked.name(), |e| e.name())
                ),
            };
            self.reasons.add(|| format!("{}: {why}", x.name()));
        }
    }

    /// Slots per active local expert expected under uniform routing: expected_local_slots
    /// over the expected number of distinct local experts they touch.
    fn expected_slots_per_active_expert(&self) -> f64 {
        expected_slots_per_expert(expected_local_slots(self.p), self.p.local_experts)
    }

    /// Slots per active local expert expected (expected_local_slots over the local experts
    /// they can fill).
    fn slots_per_expert(&self) -> f64 {
        let s = expected_local_slots(self.p);
        s as f64 / self.p.local_experts.min(s).max(1) as f64
    }

    /// The wgmma token tile for the average expert's slots (see
    /// WGMMA_SMALL_TILE_MAX_SLOTS_PER_EXPERT).
    fn wgmma_token_tile(&self) -> usize {
        if self.slots_per_expert() <= WGMMA_SMALL_TILE_MAX_SLOTS_PER_EXPERT {
            WGMMA_TOKEN_TILES[0]
        } else {
            WGMMA_TOKEN_TILES[1]
        }
    }

    /// Smallest token tile that holds the average expert's slots.
    fn mma_token_tile(&self) -> usize {
        let avg = self.slots_per_expert();
        MMA_TOKEN_TILES
            .into_iter()
            .find(|&t| avg <= t as f64)
            .unwrap_or(MMA_TOKEN_TILES[2])
    }

    /// What every Hopper bf16/fp16 kernel needs: no FP8, an sm_90 device (`needs`: for what),
    /// bfloat16 or float16, and 16-byte aligned rows (`copies`: what copies them).
    fn hopper_16bit(&self, needs: &str, copies: &str) -> std::result::Result<(), Ineligible> {
        let p = self.p;
        if p.quant.is_some() {
            Err(Ineligible::argument("it has no FP8 kernels in this build"))
        } else if self.hopper_sms.is_none() {
            Err(Ineligible::device(format!(
                "it needs an sm_90 (Hopper) device: {needs}"
            )))
        } else if !matches!(p.dtype, DType::BF16 | DType::F16) {
            Err(Ineligible::dtype(format!(
                "it needs bfloat16 or float16, got {}",
                p.dtype.name()
            )))
        } else if self.gemm1_vec == 1 || self.gemm2_vec == 1 {
            Err(Ineligible::shape(format!("{copies} need K, N and every row stride to be multiples of 8 elements, with 16-byte aligned tensors")))
        } else {
            Ok(())
        }
    }

    /// The Hopper FP8 (e4m3 wgmma) kernels' device and output dtype; `needs` names what they use.
    fn hopper_fp8(&self, needs: &str) -> std::result::Result<(), Ineligible> {
        if self.hopper_sms.is_none() {
            Err(Ineligible::device(format!(
                "its FP8 kernels need an sm_90 (Hopper) device: {needs}"
            )))
        } else if !matches!(self.p.dtype, DType::BF16 | DType::F16) {
            Err(Ineligible::dtype(format!(
                "its FP8 kernels write bfloat16 or float16 outputs, got {}",
                self.p.dtype.name()
            )))
        } else {
            Ok(())
        }
    }

    /// The FP8 kernels' tensor maps over the e4m3 weights and rows.
    fn fp8_tensor_maps(&self) -> std::result::Result<(), Ineligible> {
        if self.gemm1_vec == 1 || self.gemm2_vec == 1 {
            Err(Ineligible::shape(format!("its tensor maps need K, N and every w1/w2 stride to be multiples of {FP8_VEC} e4m3, with 16-byte aligned weights")))
        } else {
            Ok(())
        }
    }

    /// Whether `b` can run the problem, and why not.
    fn eligible(&self, b: Backend) -> std::result::Result<(), Ineligible> {
        let p = self.p;
        let on_cuda = matches!(p.device, Device::Cuda(_));
        match b {
            Backend::Cpu if on_cuda => Err(Ineligible::device("it needs CPU tensors")),
            Backend::Cpu => Ok(()),
            _ if !on_cuda => Err(Ineligible::device("it needs CUDA tensors")),
            _ if self.capability.is_some_and(|c| c.0 < 8) => {
                let (major, minor) = self.capability.unwrap_or_default();
                Err(Ineligible::device(format!(
                    "the embedded kernels are built for sm_80 and sm_90a, the device is sm_{major}{minor}"
                )))
            }
            Backend::CudaGeneric => Ok(()),
            Backend::CudaDecode if p.slots() > DECODE_MAX_SLOTS => Err(Ineligible::shape(format!(
                "it holds at most M*topk = {DECODE_MAX_SLOTS} slots, got {}",
                p.slots()
            ))),
            Backend::CudaDecode => Ok(()),
            Backend::CudaBulkDecode => {
                self.hopper_16bit("TMA bulk copies and mbarriers", "its bulk copies")?;
                if p.slots() > BULK_MAX_SLOTS {
                    return Err(Ineligible::shape(format!(
                        "it holds at most M*topk = {BULK_MAX_SLOTS} slots, got {}",
                        p.slots()
                    )));
                }
                Ok(())
            }
            Backend::CudaWgmma if p.quant.is_some() => {
                self.hopper_fp8("wgmma e4m3, TMA tensor maps and mbarriers")?;
                if let Some(q) = p.quant {
                    if !WGMMA_FP8_SCHEMES.contains(&q.scheme) {
                        return Err(Ineligible::argument(format!(
                            "its FP8 kernels take per-tensor, per-channel or 128x128 block scales, got {}",
                            q.scheme.name()
                        )));
                    }
                    if q.scheme == QuantScheme::Block && p.n % FP8_BLOCK != 0 {
                        return Err(Ineligible::shape(format!(
                            "with 128x128 block scales its GEMM1 quantizes the intermediate in groups of {FP8_BLOCK} columns inside one CTA tile, so N must be a multiple of {FP8_BLOCK}, got N = {}",
                            p.n
                        )));
                    }
                }
                self.fp8_tensor_maps()
            }
            Backend::CudaWgmma => {
                self.hopper_16bit("wgmma, TMA tensor maps and mbarriers", "its tensor maps")
            }
            Backend::CudaWgmmaSwap if p.quant.is_some() => {
                self.hopper_fp8(
                    "wgmma e4m3, TMA tensor maps, mbarriers and thread-block clusters",
                )?;
                self.fp8_tensor_maps()?;
                self.swap_limits()
            }
            Backend::CudaWgmmaSwap => {
                self.hopper_16bit(
                    "wgmma, TMA tensor maps, mbarriers and thread-block clusters",
                    "its tensor maps",
                )?;
                self.swap_limits()
            }
            Backend::CudaMma => {
                if p.quant.is_some() {
                    Err(Ineligible::argument("it has no FP8 kernels in this build"))
                } else if !matches!(p.dtype, DType::BF16 | DType::F16) {
                    Err(Ineligible::dtype(format!(
                        "it needs bfloat16 or float16, got {}",
                        p.dtype.name()
                    )))
                } else if self.gemm1_vec == 1 || self.gemm2_vec == 1 {
                    Err(Ineligible::shape("it needs K, N and every row stride to be multiples of 8 elements, with 16-byte aligned tensors"))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// cuda_wgmma_swap's limits on tokens and slots.
    fn swap_limits(&self) -> std::result::Result<(), Ineligible> {
        let p = self.p;
        if p.m > SWAP_MAX_TOKENS {
            Err(Ineligible::shape(format!(
                "it holds at most M = {SWAP_MAX_TOKENS} tokens (one wgmma column each), got {}",
                p.m
            )))
        } else if p.slots() > SWAP_MAX_SLOTS {
            Err(Ineligible::shape(format!(
                "it holds at most M*topk = {SWAP_MAX_SLOTS} slots, got {}",
                p.slots()
            )))
        } else {
            Ok(())
        }
    }

    /// Whether a table's swapmoe choice can run the problem: its backend, and for
    /// cuda_mma its token tile, which then becomes the plan's.
    fn table_eligible(&mut self, choice: &Choice) -> std::result::Result<Backend, String> {
        let (b, tile, swap) = match choice {
            Choice::Swapmoe {
                backend,
                token_tile,
                swap,
            } => (*backend, *token_tile, *swap),
            Choice::External(x) => return Err(format!("{} is not a swapmoe backend", x.name())),
            Choice::Unknown(name) => {
                let names: Vec<&str> = Backend::ALL.iter().map(|b| b.name()).collect();
                return Err(format!(
                    "this build has no backend {name:?} (it has {names:?} and the external vllm_triton, flashinfer_cutlass)"
                ));
            }
        };
        self.eligible(b).map_err(|why| why.to_string())?;
        if let Some(t) = tile {
            let built: &[usize] = if b == Backend::CudaWgmma && self.p.quant.is_some() {
                &WGMMA_FP8_TOKEN_TILES
            } else if b == Backend::CudaWgmma {
                &WGMMA_TOKEN_TILES
            } else {
                &MMA_TOKEN_TILES
            };
            if !built.contains(&t) {
                return Err(format!(
                    "no {} kernels are built for token tile {t} (built: {built:?})",
                    b.name()
                ));
            }
            self.tile = Some(t);
        }
        if let Some(v) = swap {
            // both the bf16/fp16 and the e4m3 swap-AB GEMM1s take their ring from their
            // shared memory, and both GEMM2s launch with or without PDL
            self.swap_launch = Some(v);
        }
        Ok(b)
    }

    /// The active local experts expected when the ids fall uniformly (at least min(topk, E,
    /// the expected local slots): each token's top-k experts are distinct).
    fn expected_active_experts(&self) -> f64 {
        let p = self.p;
        let slots = expected_local_slots(p);
        (slots as f64 / expected_slots_per_expert(slots, p.local_experts).max(1.0))
            .max(p.topk.min(p.local_experts).min(slots) as f64)
            .max(1.0)
    }

    /// cuda_wgmma_swap's cluster sizes (GEMM1's K split, GEMM2's expert split) and why:
    /// `$SWAPMOE_SWAP_SPLITS`, or the smallest power of two that gives each GEMM at least
    /// 90% of an SM's worth of CTAs (GEMM1 keeping >= 4 k-tiles per CTA; GEMM2 no more
    /// ranks than expected active experts).
    /// The sentence `f` builds where the plan's reasons are wanted, else an empty one (for
    /// the rules that return their reason with their value).
    fn why(&self, f: impl FnOnce() -> String) -> String {
        if self.reasons.wanted() {
            f()
        } else {
            String::new()
        }
    }

    fn swap_splits(&self) -> ((usize, usize), String) {
        let allowed = [1usize, 2, 4, 8];
        let mut note = String::new();
        if let Ok(v) = std::env::var(SWAP_SPLITS_ENV) {
            let parsed: Vec<Option<usize>> = v
                .split(',')
                .map(|x| {
                    x.trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|n| allowed.contains(n))
                })
                .collect();
            if let [Some(a), Some(b)] = parsed[..] {
                return ((a, b), format!("splits forced by ${SWAP_SPLITS_ENV}={v}"));
            }
            note = format!(
                "${SWAP_SPLITS_ENV}={v:?} ignored (expected \"g1,g2\", each 1, 2, 4 or 8); "
            );
        }
        let p = self.p;
        let active = self.expected_active_experts();
        let want = 0.9 * self.sms as f64;
        let pick = |base: f64, cap: usize| {
            allowed
                .into_iter()
                .find(|&s| base * s as f64 >= want || s >= cap.min(SWAP_MAX_SPLITS))
                .unwrap_or(SWAP_MAX_SPLITS)
        };
        let g1_base = p.n.div_ceil(SWAP_ROWS) as f64 * active;
        let k_per_stage = if p.quant.is_some() { 128 } else { 64 };
        let g1 = pick(g1_base, (p.k.div_ceil(k_per_stage) / 4).max(1));
        let g2_base = p.k.div_ceil(SWAP_ROWS) as f64;
        let g2 = pick(g2_base, active.ceil() as usize);
        let sms = self.sms;
        (
            (g1, g2),
            self.why(|| format!(
                "{note}~{active:.0} active experts: GEMM1 {g1_base:.0} x {g1} CTAs, GEMM2 {g2_base:.0} x {g2} CTAs for {sms} SMs"
            )),
        )
    }

    /// cuda_wgmma_swap's K slices per stage (GEMM1, GEMM2): `$SWAPMOE_SWAP_SLICES`, or 1 and
    /// (GEMM2, from N >= SWAP_GEMM2_WIDE_SLICE_MIN_N) 4.
    fn swap_slices(&self) -> ((usize, usize), String) {
        let default = (
            1,
            if self.p.n >= SWAP_GEMM2_WIDE_SLICE_MIN_N {
                4
            } else {
                1
            },
        );
        match std::env::var(SWAP_SLICES_ENV) {
            Err(_) => (default, String::new()),
            Ok(v) => {
                let parsed: Vec<Option<usize>> = v
                    .split(',')
                    .map(|x| {
                        x.trim()
                            .parse::<usize>()
                            .ok()
                            .filter(|n| SWAP_K_SLICES.contains(n))
                    })
                    .collect();
                match parsed[..] {
                    [Some(a), Some(b)] => ((a, b), format!("; K slices forced by ${SWAP_SLICES_ENV}={v}")),
                    _ => (default, format!("; ${SWAP_SLICES_ENV}={v:?} ignored (expected \"g1,g2\", each of {SWAP_K_SLICES:?})")),
                }
            }
        }
    }

    /// cuda_wgmma_swap's GEMM1 ring (`Plan::swap_gemm1_ring`) for `ctas` expected CTAs of
    /// `gemm1` (bf16/fp16 or e4m3, token tile `tile`) with `active_experts` expected active
    /// experts, and why: `$SWAPMOE_SWAP_GEMM1_RING`; else the table entry's ring (where it
    /// fits the kernel); else `SWAP_FEW_EXPERTS_GEMM1_RING` where at most
    /// `SWAP_FEW_EXPERTS_MAX_ACTIVE` experts are expected and the CTAs that ring allows per SM
    /// hold the grid in one wave (measured on an H100 only); else 0 (the kernel's own ring, two
    /// CTAs per SM) unless the CTAs need more per SM than that to fit one wave, at most
    /// `SWAP_GEMM1_RING_MAX_CTAS_PER_SM` and what registers allow: then the most stages (at
    /// least 2) that let that many share an SM.
    fn swap_gemm1_ring(
        &self,
        gemm1: KernelId,
        tile: usize,
        ctas: usize,
        active_experts: f64,
    ) -> (usize, Option<String>) {
        let stage = swap_gemm1_stage_bytes(gemm1);
        let own_ring = swap_own_ring(gemm1, stage);
        if let Ok(v) = std::env::var(SWAP_GEMM1_RING_ENV) {
            let (n, why) = swap_ring_override("gemm1", SWAP_GEMM1_RING_ENV, &v, own_ring);
            return (n, Some(why));
        }
        if let Some(v) = self.swap_launch {
            let ring = v.gemm1_ring;
            return if swap_ring_fits(ring, own_ring) {
                (
                    ring,
                    Some(self.why(|| format!("gemm1: a ring of {ring} stages (0: the kernel's own, {own_ring}), as the table measured"))),
                )
            } else {
                (
                    0,
                    Some(self.why(|| format!("gemm1: the table's ring of {ring} stages does not fit this kernel (0 or 2 to {own_ring}): its own ring"))),
                )
            };
        }
        let own_per_sm = swap_gemm1_ctas_per_sm(gemm1, tile, 0);
        let want = ctas.div_ceil(self.sms.max(1));
        let few = SWAP_FEW_EXPERTS_GEMM1_RING;
        if active_experts <= SWAP_FEW_EXPERTS_MAX_ACTIVE
            && want <= swap_gemm1_ctas_per_sm(gemm1, tile, few)
            && few < own_ring
        {
            // the launcher's grid rows: one per expert the slots could reach
            let rows = self.p.max_active_experts();
            return (
                few,
                Some(self.why(|| {
                    let why = if rows as f64 > active_experts + 0.5 {
                        format!("{rows} grid rows for ~{active_experts:.1} active experts, so most rows find no expert and leave; more CTAs per SM let them pass sooner, and GEMM2 starts only after the last has ({SWAP_FEW_EXPERTS_RING_STAMPS})")
                    } else {
                        format!("~{active_experts:.1} active experts in {rows} grid row(s) ({SWAP_FEW_EXPERTS_RING_ONE_ROW})")
                    };
                    format!("gemm1: a ring of {few} stages (its own: {own_ring}): {why}; {SWAP_FEW_EXPERTS_RING_MEASURED}")
                })),
            );
        }
        if want <= own_per_sm {
            return (0, None);
        }
        let regs = swap_gemm1_max_ctas_per_sm(tile);
        if want > SWAP_GEMM1_RING_MAX_CTAS_PER_SM && want <= regs {
            return (
                0,
                Some(self.why(|| format!("gemm1: its own ring of {own_ring} stages ({own_per_sm} CTAs per SM): one wave of its ~{ctas} CTAs needs {want} per SM, more than {SWAP_GEMM1_RING_MAX_CTAS_PER_SM} ({SWAP_GEMM1_RING_MEASURED})"))),
            );
        }
        if want > regs {
            return (
                0,
                Some(self.why(|| format!("gemm1: its own ring of {own_ring} stages ({own_per_sm} CTAs per SM): one wave of its ~{ctas} CTAs needs {want} per SM, its registers allow {regs}"))),
            );
        }
        let ring = ((SM_SHARED_MEMORY_BYTES / want)
            .saturating_sub(2048 + SWAP_GEMM1_STATIC_SMEM_BYTES)
            / stage)
            .min(own_ring);
        if ring < 2 {
            return (
                0,
                Some(self.why(|| format!("gemm1: its own ring of {own_ring} stages: {want} CTAs per SM leave room for {ring} stages each (2 needed)"))),
            );
        }
        (
            ring,
            Some(self.why(|| format!("gemm1: a ring of {ring} stages (its own: {own_ring}) so that its ~{ctas} CTAs fit one wave, {want} per SM ({SWAP_GEMM1_RING_MEASURED})"))),
        )
    }

    /// cuda_wgmma_swap's e4m3 GEMM2 ring (`Plan::swap_gemm2_ring`) and why:
    /// `$SWAPMOE_SWAP_GEMM2_RING` (0 or 2 to the kernel's own), else the table's
    /// (`SwapLaunch::gemm2_ring`, where it fits the kernel), else `rule`.
    fn swap_gemm2_ring(
        gemm2: KernelId,
        table: Option<usize>,
        wanted: bool,
        rule: impl FnOnce() -> (usize, Option<String>),
    ) -> (usize, Option<String>) {
        let own = swap_own_ring(gemm2, swap_gemm2_stage_bytes(gemm2));
        if let Ok(v) = std::env::var(SWAP_GEMM2_RING_ENV) {
            let (n, why) = swap_ring_override("gemm2", SWAP_GEMM2_RING_ENV, &v, own);
            return (n, wanted.then_some(why));
        }
        match table {
            Some(ring) if swap_ring_fits(ring, own) => (
                ring,
                wanted.then(|| format!("gemm2: a ring of {ring} stages (0: the kernel's own, {own}), as the table measured")),
            ),
            Some(ring) => {
                let (n, why) = rule();
                let why = why.map(|w| format!("{w}; the table's GEMM2 ring of {ring} stages does not fit this kernel (0 or 2 to {own})"));
                (n, why)
            }
            None => rule(),
        }
    }

    /// Whether cuda_wgmma_swap's GEMM2 runs one CTA per SM (`Plan::swap_gemm2_one_per_sm`)
    /// and why: `$SWAPMOE_SWAP_GEMM2_ONE_PER_SM`, else from N >= SWAP_GEMM2_ONE_PER_SM_MIN_N.
    fn swap_gemm2_placement(&self) -> (bool, String) {
        let n = self.p.n;
        let rule = n >= SWAP_GEMM2_ONE_PER_SM_MIN_N;
        let why = self.why(|| if rule {
            format!("gemm2: one CTA per SM (N = {n} >= {SWAP_GEMM2_ONE_PER_SM_MIN_N}: long w2 rows; two per SM, its CTAs crowd the SMs GEMM1 frees first)")
        } else {
            format!("gemm2: up to two CTAs per SM (N = {n} < {SWAP_GEMM2_ONE_PER_SM_MIN_N}: short w2 rows, GEMM2 is mostly start-up)")
        });
        let (on, why) = env_switch(
            SWAP_GEMM2_ONE_PER_SM_ENV,
            rule,
            |on| {
                if on {
                    "gemm2: one CTA per SM".into()
                } else {
                    "gemm2: up to two CTAs per SM".into()
                }
            },
            Some(why),
        );
        (on, why.unwrap_or_default())
    }

    /// Whether cuda_wgmma_swap's GEMM2 starts with PDL (`Plan::swap_gemm2_pdl`), for a plan
    /// with PDL, and the reason when that is not the default: `$SWAPMOE_SWAP_GEMM2_PDL`, else
    /// the table's swap-AB launch (`table`), else on. The table's reason is built only when
    /// `reasons_wanted` (an override's always is, as for every knob).
    fn swap_gemm2_pdl(
        table: Option<tables::SwapLaunch>,
        reasons_wanted: bool,
    ) -> (bool, Option<String>) {
        let (rule, why) = match table {
            Some(v) => (
                v.gemm2_pdl,
                reasons_wanted.then(|| {
                    if v.gemm2_pdl {
                        "gemm2: launched with PDL, as the table measured".to_string()
                    } else {
                        "gemm2: starts after GEMM1 has finished (no PDL), as the table measured"
                            .to_string()
                    }
                }),
            ),
            None => (true, None),
        };
        env_switch(
            SWAP_GEMM2_PDL_ENV,
            rule,
            |on| {
                if on {
                    "gemm2: launched with PDL".into()
                } else {
                    "gemm2: starts after GEMM1 has finished (no PDL)".into()
                }
            },
            why,
        )
    }

    /// CTAs of the routing alignment (`Plan::align_ctas`) and why: `$SWAPMOE_ALIGN_CTAS`, else
    /// one per ALIGN_SLOTS_PER_CTA slots, at most ALIGN_MAX_CTAS, on sm_90+ (clusters, which
    /// `sm90` says the device has). Asked only by plans that start with the align kernel.
    fn align_ctas(p: &MoeProblem, sm90: bool, reasons_wanted: bool) -> (usize, String) {
        let slots = p.slots();
        if !sm90 {
            return (
                1,
                "align: one CTA (thread-block clusters need sm_90)".into(),
            );
        }
        let rule = slots.div_ceil(ALIGN_SLOTS_PER_CTA).clamp(1, ALIGN_MAX_CTAS);
        let why = |n: usize| {
            if n == 1 {
                format!("align: one CTA ({slots} slots <= {ALIGN_SLOTS_PER_CTA})")
            } else {
                format!("align: a cluster of {n} CTAs for {slots} slots (one CTA per {ALIGN_SLOTS_PER_CTA}: alone it groups ~1.3 ns a slot, 42 us at 32768)")
            }
        };
        match std::env::var(ALIGN_CTAS_ENV) {
            Err(_) => (
                rule,
                if reasons_wanted {
                    why(rule)
                } else {
                    String::new()
                },
            ),
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=ALIGN_MAX_CTAS).contains(&n) => (
                    n,
                    format!("align: {n} CTAs, forced by ${ALIGN_CTAS_ENV}={v}"),
                ),
                _ => (
                    rule,
                    format!(
                        "${ALIGN_CTAS_ENV}={v:?} ignored (expected 1 to {ALIGN_MAX_CTAS}); {}",
                        why(rule)
                    ),
                ),
            },
        }
    }

    fn build(self, b: Backend) -> Plan {
        let d = self.p.dtype;
        let (g1, g2) = (self.gemm1_vec, self.gemm2_vec);
        let tile = self.tile.unwrap_or_else(|| self.mma_token_tile());
        let wgmma_tile = self.tile.unwrap_or_else(|| self.wgmma_token_tile());
        let swap_split_choice = (b == Backend::CudaWgmmaSwap).then(|| self.swap_splits());
        let swap_slice_choice = (b == Backend::CudaWgmmaSwap).then(|| self.swap_slices());
        let swap_gemm2_placement =
            (b == Backend::CudaWgmmaSwap).then(|| self.swap_gemm2_placement());
        let active_experts = self.expected_active_experts();
        // the swap GEMM1's kernel, expected CTAs and ring (asked here, while `self` still
        // holds the reasons)
        let mut swap_gemm1_grid = (b == Backend::CudaWgmmaSwap).then(|| {
            let tile = swap_token_tile(self.p.m);
            let g1_split = swap_split_choice.as_ref().map_or(1, |((g1, _), _)| *g1);
            let k1 = swap_slice_choice.as_ref().map_or(1, |((k1, _), _)| *k1);
            let gemm1 = swap_gemm1_kernel(d, self.p.quant, tile, k1);
            let ctas =
                (self.p.n.div_ceil(SWAP_ROWS) as f64 * active_experts).ceil() as usize * g1_split;
            (
                gemm1,
                ctas,
                self.swap_gemm1_ring(gemm1, tile, ctas, active_experts),
            )
        });
        // GEMM1's kernel and CTAs, for the GEMM2 ring beside it
        let swap_gemm1_shape = swap_gemm1_grid.as_ref().map(|(g, c, _)| (*g, *c));
        let mut reasons = self.reasons;
        let mut ctas = 0;
        let mut wgmma_persistent = (false, false);
        let mut wgmma_hints = 0;
        let mut wgmma_block_run = 1;
        let mut align_in_gemm1 = false;
        let mut splits = (1, 1);
        let mut swap_gemm1_ring = 0;
        let swap_gemm2_one_per_sm = match swap_gemm2_placement {
            Some((on, why)) => {
                reasons.add(|| why);
                on
            }
            None => false,
        };
        // Set (with the reason) where the first kernel is launched without PDL.
        let mut first_kernel_pdl_off: Option<String> = None;
        // What programmatic dependent launch buys the plan's kernels, or why it is off.
        let pdl_ok = self.pdl_ok;
        let pdl_reason = |gain: &str| -> String {
            if pdl_ok {
                format!("pdl: {gain}")
            } else {
                "pdl: off, programmatic dependent launch needs sm_90".into()
            }
        };
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
                reasons.add(|| pdl_reason("sm_90+, the two FP8 GEMMs overlap their start-up with programmatic dependent launch"));
                let mut v = vec![];
                fp8_front(&mut v);
                v.push(KernelId::DecodeFp8Gemm1(q.scheme, g1));
                v.push(KernelId::DecodeFp8Gemm2Sum(d, q.scheme, g2));
                (v, DECODE_ROWS_PER_CTA, DECODE_TOKENS_PER_PASS, self.pdl_ok)
            }
            (Backend::CudaWgmmaSwap, Some(q)) => {
                let tile = swap_token_tile(self.p.m);
                let (s, why) = swap_split_choice.clone().unwrap_or_default();
                splits = s;
                // With a static intermediate scale GEMM1 quantizes its own output, and GEMM2
                // loads e4m3 rows by TMA instead of quantizing f32 rows per stage
                // (benches/NOTES.md, "FP8 swap v2").
                let static_inter = q.static_intermediate();
                let inter = if static_inter {
                    "GEMM1 quantizes the intermediate with the static a2_scale, GEMM2 reads its e4m3 rows by TMA"
                } else {
                    "the intermediate quantized as GEMM2 loads it, its scale from GEMM1's absmax"
                };
                reasons.add(|| format!(
                    "cuda_wgmma_swap: e4m3 weights in wgmma's {SWAP_ROWS}-row slot streamed by TMA, 128 of K per stage, the M = {} tokens as {tile} columns (x quantized first; {inter}); clusters of {} (GEMM1, K split) and {} (GEMM2, expert split); {why}",
                    self.p.m, s.0, s.1
                ));
                reasons.add(|| pdl_reason("GEMM1 starts under the quantization, GEMM2 streams its first weights while GEMM1 finishes"));
                // GEMM1 is the kernel its ring was sized for
                let (gemm1, _, (ring, ring_why)) = swap_gemm1_grid.take().unwrap_or((
                    swap_gemm1_kernel(d, Some(q), tile, 1),
                    0,
                    (0, None),
                ));
                swap_gemm1_ring = ring;
                reasons.extend(ring_why);
                let mut v = vec![];
                fp8_front(&mut v);
                v.push(gemm1);
                v.push(if static_inter {
                    KernelId::SwapFp8StaticGemm2Sum(d, tile)
                } else {
                    KernelId::SwapFp8Gemm2Sum(d, q.scheme, tile)
                });
                (v, SWAP_ROWS, tile, self.pdl_ok)
            }
            (Backend::CudaWgmma, Some(q)) => {
                (ctas, wgmma_persistent) = wgmma_grids(self.p, self.hopper_sms, 128, &mut reasons);
                let tile = wgmma_tile;
                wgmma_hints = wgmma_l2_hints(self.p, tile, &mut reasons);
                wgmma_block_run =
                    wgmma_gemm2_block_run(self.p, tile, 128, wgmma_persistent.1, &mut reasons);
                let q8 = q.static_intermediate();
                reasons.add(|| format!(
                    "cuda_wgmma: FP8, token tiles of {tile} rows in expert order, e4m3 weights by TMA, warp-specialized e4m3 wgmma GEMMs, 128 of K per stage ({WGMMA_GEMM1_COLUMNS} inter columns per GEMM1 CTA, {WGMMA_GEMM2_COLUMNS} output columns per GEMM2 CTA); x quantized first; {}",
                    if q8 {
                        "GEMM1 quantizes the intermediate with the static a2_scale"
                    } else if q.scheme == QuantScheme::Block {
                        "the block scales multiply each stage's promotion, and GEMM1 quantizes the intermediate in 1 x 128 groups (each group's columns lie in one CTA tile)"
                    } else {
                        "GEMM1 writes the f32 intermediate and its absmax, then one kernel quantizes it with the dynamic scale"
                    }
                ));
                let (pre, why) =
                    wgmma_pregather(self.p, "the quantized token rows", reasons.wanted());
                reasons.extend(why);
                let (in_gemm1, mut v) =
                    wgmma_first_kernels(self.p, tile, wgmma_persistent.0, pre, &mut reasons);
                align_in_gemm1 = in_gemm1;
                fp8_front(&mut v);
                if pre {
                    v.push(KernelId::WgmmaGather);
                }
                v.push(if in_gemm1 {
                    KernelId::WgmmaFp8Gemm1Grouping(q.scheme, tile, q8)
                } else {
                    KernelId::WgmmaFp8Gemm1(q.scheme, tile, q8, pre)
                });
                if !wgmma_gemm1_quantizes(&q) {
                    v.push(KernelId::WgmmaFp8QuantInter(q.scheme));
                }
                v.push(KernelId::WgmmaFp8Gemm2(d, q.scheme, tile));
                v.push(KernelId::WgmmaTopkReduce(d));
                (v, WGMMA_GEMM2_COLUMNS, tile, false)
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
                Backend::CudaBulkDecode => {
                    ctas = self.hopper_sms.unwrap_or(132);
                    reasons.add(|| format!(
                        "cuda_bulk_decode: a persistent grid of {ctas} CTAs streams weights and activations through 5 x 20 KiB bulk-copy stages per SM; GEMM2 starts its weight stream under GEMM1's tail (pdl)"
                    ));
                    (
                        vec![KernelId::BulkGemm1Act(d), KernelId::BulkGemm2Sum(d)],
                        BULK_ROWS_PER_ITEM,
                        BULK_TOKENS_PER_PASS,
                        true,
                    )
                }
                Backend::CudaDecode => {
                    reasons.add(|| pdl_reason("sm_90+, the two launches overlap their start-up with programmatic dependent launch"));
                    let gemm2_ctas = self.p.k.div_ceil(DECODE_ROWS_PER_CTA);
                    let wide = gemm2_ctas <= DECODE_GEMM2_WIDE_MAX_CTAS_PER_SM * self.sms;
                    reasons.add(|| if wide {
                        format!("gemm2: its {gemm2_ctas} CTAs fit {DECODE_GEMM2_WIDE_MAX_CTAS_PER_SM} per SM, so the kernel with unbounded registers keeps more weight loads in flight")
                    } else {
                        format!("gemm2: {gemm2_ctas} CTAs, more than {DECODE_GEMM2_WIDE_MAX_CTAS_PER_SM} per SM: the kernel bounded to 5 CTAs per SM keeps most of them resident")
                    });
                    (
                        vec![
                            KernelId::DecodeGemm1Act(d, g1),
                            if wide {
                                KernelId::DecodeGemm2SumWide(d, g2)
                            } else {
                                KernelId::DecodeGemm2Sum(d, g2)
                            },
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
                Backend::CudaWgmmaSwap => {
                    let tile = swap_token_tile(self.p.m);
                    let (s, why) = swap_split_choice.clone().unwrap_or_default();
                    let ((k1, k2), slice_why) = swap_slice_choice.clone().unwrap_or_default();
                    splits = s;
                    reasons.add(|| format!(
                        "cuda_wgmma_swap: weights in wgmma's {SWAP_ROWS}-row slot streamed by TMA, {k1} (GEMM1) and {k2} (GEMM2) 64-wide K slices per stage, the M = {} tokens as {tile} columns; 2 launches, no align or top-k sum kernel; clusters of {} (GEMM1, K split) and {} (GEMM2, expert split) summed through distributed shared memory; {why}{slice_why}",
                        self.p.m, s.0, s.1
                    ));
                    reasons
                        .add(|| pdl_reason("GEMM2 streams its first weights while GEMM1 finishes"));
                    let (gemm1, gemm1_ctas, (ring, ring_why)) = swap_gemm1_grid.take().unwrap_or((
                        swap_gemm1_kernel(d, None, tile, k1),
                        0,
                        (0, None),
                    ));
                    swap_gemm1_ring = ring;
                    reasons.extend(ring_why);
                    let per_sm = swap_gemm1_ctas_per_sm(gemm1, tile, ring);
                    if pdl_ok && gemm1_ctas <= per_sm * self.sms {
                        first_kernel_pdl_off = Some(if reasons.wanted() {
                            format!("first kernel: GEMM1's ~{gemm1_ctas} CTAs fit one wave ({per_sm} per SM), so it is launched without PDL: launched early, its CTAs take the SMs the previous kernel frees first and stay unevenly placed (hypothesis); {SWAP_ONE_WAVE_FIRST_PDL_MEASURED}")
                        } else {
                            String::new()
                        });
                    }
                    (
                        vec![gemm1, KernelId::SwapGemm2Sum(d, tile, k2)],
                        SWAP_ROWS,
                        tile,
                        self.pdl_ok,
                    )
                }
                Backend::CudaWgmma => {
                    (ctas, wgmma_persistent) =
                        wgmma_grids(self.p, self.hopper_sms, 64, &mut reasons);
                    let tile = wgmma_tile;
                    wgmma_hints = wgmma_l2_hints(self.p, tile, &mut reasons);
                    wgmma_block_run =
                        wgmma_gemm2_block_run(self.p, tile, 64, wgmma_persistent.1, &mut reasons);
                    let (pre, why) = wgmma_pregather(self.p, "the token rows", reasons.wanted());
                    reasons.add(|| format!(
                        "cuda_wgmma: token tiles of {tile} rows in expert order, weights by TMA, warp-specialized wgmma GEMMs ({WGMMA_GEMM1_COLUMNS} inter columns per GEMM1 CTA, {WGMMA_GEMM2_COLUMNS} output columns per GEMM2 CTA), {WGMMA_RASTER_GROUP} token tiles per raster group"
                    ));
                    reasons.extend(why);
                    let (in_gemm1, mut v) =
                        wgmma_first_kernels(self.p, tile, wgmma_persistent.0, pre, &mut reasons);
                    align_in_gemm1 = in_gemm1;
                    if pre {
                        v.push(KernelId::WgmmaGather);
                    }
                    v.extend([
                        if in_gemm1 {
                            KernelId::WgmmaGemm1Grouping(d, tile)
                        } else {
                            KernelId::WgmmaGemm1Act(d, tile, pre)
                        },
                        KernelId::WgmmaGemm2(d, tile),
                        KernelId::WgmmaTopkReduce(d),
                    ]);
                    (v, WGMMA_GEMM2_COLUMNS, tile, false)
                }
            },
        };
        let first_kernel_pdl = pdl_ok && !kernels.is_empty() && first_kernel_pdl_off.is_none();
        let one_wave_gemm1 = first_kernel_pdl_off.is_some();
        if let Some(why) = first_kernel_pdl_off {
            reasons.add(|| why);
        }
        let swap_gemm2 = kernels
            .iter()
            .copied()
            .find(|k| swap_gemm2_stage_bytes(*k) > 0);
        let swap_gemm2_ring = match (swap_gemm2, swap_gemm1_shape) {
            (Some(k), Some((gemm1, gemm1_ctas))) if !swap_gemm2_one_per_sm => {
                let wanted = reasons.wanted();
                let rule = || {
                    let gemm2_ctas = self.p.k.div_ceil(SWAP_ROWS) * splits.1;
                    let experts_per_cta =
                        (active_experts.ceil() as usize).div_ceil(splits.1.max(1));
                    let gemm2_items = experts_per_cta * self.p.n.div_ceil(128);
                    swap_gemm2_ring_rule(
                        k,
                        gemm1,
                        swap_gemm1_ring,
                        gemm1_ctas,
                        gemm2_ctas,
                        gemm2_items,
                        self.sms,
                        wanted,
                    )
                };
                let table = self.swap_launch.and_then(|v| v.gemm2_ring);
                let (n, why) = Self::swap_gemm2_ring(k, table, wanted, rule);
                reasons.extend(why);
                n
            }
            _ => {
                const WHY: &str =
                    "only an e4m3 GEMM2 placed two to an SM beside GEMM1 takes its ring at launch";
                if let Some(ring) = self.swap_launch.and_then(|v| v.gemm2_ring) {
                    reasons.add(|| {
                        format!(
                            "gemm2: the table's GEMM2 ring of {ring} stages is not used ({WHY})"
                        )
                    });
                }
                if b == Backend::CudaWgmmaSwap {
                    if let Ok(v) = std::env::var(SWAP_GEMM2_RING_ENV) {
                        reasons
                            .add(|| format!("gemm2: ${SWAP_GEMM2_RING_ENV}={v} not used ({WHY})"));
                    }
                }
                0
            }
        };
        let swap_gemm2_pdl = if b == Backend::CudaWgmmaSwap && pdl {
            let (on, why) = Self::swap_gemm2_pdl(self.swap_launch, reasons.wanted());
            reasons.extend(why);
            on
        } else {
            false
        };
        let wgmma_gemm1_pdl = if b == Backend::CudaWgmma && pdl_ok && !align_in_gemm1 {
            let what = |on: bool| -> String {
                if on {
                    "gemm1: launched with PDL after the kernel before it, its CTAs setting up their ring and prefetching their tensor maps before they wait".into()
                } else {
                    "gemm1: starts once the kernel before it has finished (no PDL)".into()
                }
            };
            let why = reasons.wanted().then(|| what(true));
            let (on, why) = env_switch(WGMMA_GEMM1_PDL_ENV, true, what, why);
            reasons.extend(why);
            on
        } else {
            false
        };
        let align_ctas = if kernels.first() == Some(&KernelId::RouteAlign) {
            let (n, why) = Self::align_ctas(self.p, pdl_ok, reasons.wanted());
            reasons.add(|| why);
            n
        } else {
            1
        };
        Plan {
            backend: b,
            kernels,
            gemm1_vec: g1,
            gemm2_vec: g2,
            rows_per_cta,
            tokens_per_pass,
            pdl,
            first_kernel_pdl,
            ctas,
            wgmma_persistent,
            wgmma_l2_hints: wgmma_hints,
            wgmma_gemm2_block_run: wgmma_block_run,
            splits,
            swap_gemm2_one_per_sm,
            swap_gemm2_pdl,
            wgmma_gemm1_pdl,
            swap_gemm1_ring,
            swap_gemm2_ring,
            one_wave_gemm1,
            align_ctas,
            align_in_gemm1,
            reasons,
            source: Source::Heuristic,
            table: None,
            external: None,
            log: None,
            router: RouterPlacement::NotRouting,
        }
    }
}

#[cfg(test)]
mod tests {
    /// Tests that set `$SWAPMOE_*` knobs hold it for writing; tests whose plans must not see
    /// another test's knobs mid-way hold it for reading (the harness runs tests in parallel).
    static ENV_KNOBS: std::sync::RwLock<()> = std::sync::RwLock::new(());
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

    use crate::problem::{Activation, MoeArgs};

    /// A CUDA problem with 16-byte aligned, contiguous tensors (addresses are never read).
    fn problem(m: i64, e: i64, topk: i64, k: i64, n: i64, dtype: DType) -> MoeProblem {
        problem_on(Device::Cuda(0), m, e, topk, k, n, dtype)
    }

    /// `problem` with its tensors on `dev`.
    fn problem_on(
        dev: Device,
        m: i64,
        e: i64,
        topk: i64,
        k: i64,
        n: i64,
        dtype: DType,
    ) -> MoeProblem {
        let addrs = crate::problem::FakeAddresses::default();
        let t = |d, shape: &[i64]| addrs.tensor(d, shape, dev);
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

    /// The H200 plan of bf16 cuda_wgmma_swap (forced) at M tokens, E experts, top-8, K, N.
    fn h200_swap_plan(m: i64, e: i64, k: i64, n: i64) -> Plan {
        plan_with(
            &problem(m, e, 8, k, n, DType::BF16),
            Some(&h200()),
            Some(Backend::CudaWgmmaSwap),
        )
        .unwrap()
    }

    /// [`plan_for_shape`] of a whole model (no expert parallelism) with the scheme's usual
    /// activation scales.
    #[allow(clippy::too_many_arguments)]
    fn whole_model_plan(
        m: i64,
        e: i64,
        topk: i64,
        k: i64,
        n: i64,
        dtype: DType,
        quant: Option<QuantScheme>,
        caps: &DeviceCaps,
        req: &Request,
    ) -> Result<Plan> {
        plan_for_shape(m, e, -1, topk, k, n, dtype, quant, None, caps, req)
    }

    fn h200() -> DeviceCaps {
        DeviceCaps {
            name: "NVIDIA H200".into(),
            capability: (9, 0),
            sm_count: 132,
        }
    }

    /// deepseek-v3-tp8's MoE shape (E, topk, K, N).
    const DEEPSEEK: (i64, i64, i64, i64) = (256, 8, 7168, 256);

    /// The plan of a bf16 (or `quant`) problem on an H200 with `backend` forced.
    fn forced(
        m: i64,
        shape: (i64, i64, i64, i64),
        quant: Option<QuantScheme>,
        backend: Backend,
    ) -> Plan {
        let (e, topk, k, n) = shape;
        let req = Request {
            backend: Some(backend),
            ..Request::default()
        };
        whole_model_plan(m, e, topk, k, n, DType::BF16, quant, &h200(), &req).unwrap()
    }

    #[test]
    fn wgmma_l2_hints_where_experts_fill_half_a_tile() {
        let _knobs = ENV_KNOBS.write().unwrap_or_else(|e| e.into_inner());
        let hints = |m: i64, shape: (i64, i64, i64, i64), quant: Option<QuantScheme>| {
            let p = forced(m, shape, quant, Backend::CudaWgmma);
            assert_eq!(p.backend, Backend::CudaWgmma);
            let (e, topk, _, n) = shape;
            let fit = 2 * m * topk <= p.tokens_per_pass as i64 * e || n >= 4096;
            assert_eq!(p.wgmma_l2_hints, if fit { 3 } else { 0 }, "{:?}", p.reasons);
            (p.wgmma_l2_hints, p.reasons)
        };
        // deepseek-v3-tp8: 32 tokens per expert at M = 1024, 128 at M = 4096
        let (on, why) = hints(1024, DEEPSEEK, None);
        assert_eq!(on, 3);
        assert!(why.iter().any(|r| r.starts_with(
            "cuda_wgmma loads: weights evict first, token rows evict last (~32 tokens per expert"
        )));
        let (off, why) = hints(4096, DEEPSEEK, Some(QuantScheme::Tensor));
        assert_eq!(off, 0);
        assert!(why
            .iter()
            .any(|r| r.contains("tokens per expert, over half a")));
        hints(256, (128, 8, 2048, 768), None);
        // Mixtral: wide N, at every M
        let (on, why) = hints(4096, (8, 2, 4096, 14336), Some(QuantScheme::Block));
        assert_eq!(on, 3);
        assert!(why.iter().any(|r| r.ends_with(
            "(N = 14336 >= 4096: GEMM1 reads each tile's token rows in 112 column blocks)"
        )));
        // swap-AB and other plans carry none
        let swap = forced(1, (128, 8, 2048, 768), None, Backend::CudaWgmmaSwap);
        assert_eq!(swap.wgmma_l2_hints, 0);
        // forced either way; a bad value keeps the rule
        std::env::set_var(WGMMA_L2_HINTS_ENV, "1");
        let one = forced(4096, DEEPSEEK, None, Backend::CudaWgmma);
        std::env::set_var(WGMMA_L2_HINTS_ENV, "4");
        let bad = forced(1024, DEEPSEEK, None, Backend::CudaWgmma);
        std::env::remove_var(WGMMA_L2_HINTS_ENV);
        assert_eq!(one.wgmma_l2_hints, 1);
        assert!(one
            .reasons
            .iter()
            .any(|r| r
                == "cuda_wgmma loads: weights evict first (forced by $SWAPMOE_WGMMA_L2_HINTS=1)"));
        assert_eq!(bad.wgmma_l2_hints, 3);
        assert!(bad
            .reasons
            .iter()
            .any(|r| r.starts_with("$SWAPMOE_WGMMA_L2_HINTS=\"4\" ignored (expected 0 to 3)")));
    }

    /// Every wgmma GEMM1's static shared memory (this build's `ptxas -v`, kept beside its
    /// fatbin by build.rs) fits beside WGMMA_GEMM1_MAX_SMEM_BYTES of dynamic shared memory,
    /// the attribute every GEMM1 is given when its module loads.
    #[test]
    fn wgmma_gemm1_static_smem_fits_beside_its_dynamic_limit() {
        let ptxas = include_str!(concat!(env!("OUT_DIR"), "/sm90_wgmma_moe.ptxas.txt"));
        let mut kernel: Option<&str> = None;
        let mut seen = 0;
        for line in ptxas.lines() {
            if let Some(rest) = line.split("Compiling entry function '").nth(1) {
                kernel = rest
                    .split_once("' for 'sm_90a'")
                    .map(|(k, _)| k)
                    .filter(|k| k.contains("gemm1"));
            } else if let (Some(k), Some(smem)) = (kernel, line.split(" bytes smem").next()) {
                if line.contains(" bytes smem") {
                    let bytes: usize = smem.rsplit(' ').next().unwrap().parse().unwrap();
                    assert!(
                        bytes + WGMMA_GEMM1_MAX_SMEM_BYTES <= SM90_MAX_SMEM_PER_CTA_BYTES,
                        "{k}: {bytes} bytes of static shared memory"
                    );
                    seen += 1;
                    kernel = None;
                }
            }
        }
        let gemm1s = KernelId::all()
            .iter()
            .filter(|k| k.module() == "sm90_wgmma_moe" && k.symbol().contains("gemm1"))
            .count();
        assert_eq!(seen, gemm1s, "GEMM1s read from ptxas' output");
    }

    #[test]
    fn wgmma_gemm1_after_the_plans_kernels_starts_by_pdl_unless_forced_off() {
        let _knobs = ENV_KNOBS.write().unwrap_or_else(|e| e.into_inner());
        std::env::remove_var(WGMMA_GEMM1_PDL_ENV);
        std::env::remove_var(ALIGN_IN_GEMM1_ENV);
        let plan = |m: i64, quant: Option<QuantScheme>| {
            let req = Request {
                backend: Some(Backend::CudaWgmma),
                mma_token_tile: Some(64),
                ..Request::default()
            };
            whole_model_plan(m, 256, 8, 7168, 256, DType::BF16, quant, &h200(), &req).unwrap()
        };
        // after route_align (and quantize-x): on, with the reason
        for quant in [None, Some(QuantScheme::Tensor)] {
            let p = plan(128, quant);
            assert!(
                !p.align_in_gemm1 && p.wgmma_gemm1_pdl,
                "{quant:?}: {:?}",
                p.reasons
            );
            assert!(
                has(&p, &["gemm1: launched with PDL after the kernel before it"]),
                "{:?}",
                p.reasons
            );
        }
        // GEMM1 grouping the slots itself is the first kernel: not this knob's
        std::env::set_var(ALIGN_IN_GEMM1_ENV, "on");
        let first = plan(16, None);
        std::env::remove_var(ALIGN_IN_GEMM1_ENV);
        assert!(
            first.align_in_gemm1 && !first.wgmma_gemm1_pdl,
            "{:?}",
            first.reasons
        );
        // forced off; a bad value ignored, with the reasons
        std::env::set_var(WGMMA_GEMM1_PDL_ENV, "0");
        let off = plan(128, None);
        std::env::set_var(WGMMA_GEMM1_PDL_ENV, "2");
        let bad = plan(128, None);
        std::env::remove_var(WGMMA_GEMM1_PDL_ENV);
        assert!(!off.wgmma_gemm1_pdl);
        assert!(
            has(&off, &["forced by $SWAPMOE_WGMMA_GEMM1_PDL=0"]),
            "{:?}",
            off.reasons
        );
        assert!(bad.wgmma_gemm1_pdl);
        assert!(
            has(&bad, &["$SWAPMOE_WGMMA_GEMM1_PDL=\"2\" ignored"]),
            "{:?}",
            bad.reasons
        );
    }

    #[test]
    fn a_rank_shape_plans_for_the_slots_that_land_on_the_rank() {
        // DeepSeek-V3 with EP8: 32 of 256 experts, 128x128 blocks. Planned as a whole model
        // of 32 experts, M = 1's 8 slots fill ~8 experts (cuda_wgmma's GEMM1 ~2 waves: its
        // GEMMs); as a rank of 256, ~1 slot lands here (swap-AB, measured 55.3 against 58.5 µs
        // on an H100, 48.0 against 59.1 at M = 2: benches/NOTES.md "H100 tables of more
        // deployments")
        let _knobs = ENV_KNOBS.read().unwrap_or_else(|e| e.into_inner());
        let req = Request::default();
        let rank = |m: i64, e: i64, global: i64, topk: i64, quant: Option<QuantScheme>| {
            let bf16 = DType::BF16;
            plan_for_shape(
                m,
                e,
                global,
                topk,
                7168,
                2048,
                bf16,
                quant,
                None,
                &h200(),
                &req,
            )
        };
        let block = Some(QuantScheme::Block);
        for m in [1, 2] {
            let whole = whole_model_plan(m, 32, 8, 7168, 2048, DType::BF16, block, &h200(), &req);
            let whole = whole.unwrap();
            assert_eq!(whole.backend, Backend::CudaWgmma, "{:?}", whole.reasons);
            let ep8 = rank(m, 32, 256, 8, block).unwrap();
            assert_eq!(ep8.backend, Backend::CudaWgmmaSwap, "{:?}", ep8.reasons);
            // -1 and E itself are the whole model
            let same = rank(m, 32, 32, 8, block).unwrap();
            assert_eq!((same.backend, same.kernels), (whole.backend, whole.kernels));
        }
        // top_k may exceed the rank's experts
        assert!(rank(1, 4, 256, 8, None).is_ok());
        // fewer global than local experts, top_k past the model's, no local experts and a
        // global count past 2^31 are shape errors naming what is wrong
        for (e, g, needle) in [
            (0, 0, "num_experts >= 1"),
            (32, 1 << 31, "global_num_experts = 2147483648"),
            (
                32,
                16,
                "global_num_experts: expected -1 or at least num_experts (32), got 16",
            ),
            (4, 6, "1 <= top_k <= global_num_experts"),
        ] {
            let err = rank(1, e, g, 8, None).unwrap_err();
            assert!(matches!(err, Error::Shape(_)), "{err:?}");
            assert!(err.to_string().contains(needle), "{err}");
        }
    }

    #[test]
    fn wgmma_gemm1_groups_the_slots_where_its_grid_is_persistent_and_the_slots_few() {
        let _knobs = ENV_KNOBS.write().unwrap_or_else(|e| e.into_inner());
        std::env::remove_var(ALIGN_IN_GEMM1_ENV);
        std::env::remove_var(WGMMA_PERSISTENT_ENV);
        std::env::remove_var(WGMMA_PREGATHER_ENV);
        let plan = |m: i64, e: i64, k: i64, n: i64, quant: Option<QuantScheme>| {
            let req = Request {
                backend: Some(Backend::CudaWgmma),
                mma_token_tile: Some(64),
                ..Request::default()
            };
            whole_model_plan(m, e, 8, k, n, DType::BF16, quant, &h200(), &req).unwrap()
        };
        let aligns = |p: &Plan| p.kernels.contains(&KernelId::RouteAlign);
        // qwen3-30b-a3b FP8 per tensor (static): GEMM1 of 16 k-stages is persistent; up to
        // 512 slots GEMM1 groups them, the quantization first
        for m in [1, 16, 64] {
            let p = plan(m, 128, 2048, 768, Some(QuantScheme::Tensor));
            assert!(
                p.wgmma_persistent.0 && p.align_in_gemm1,
                "M = {m}: {:?}",
                p.reasons
            );
            assert!(!aligns(&p));
            assert_eq!(p.kernels[0], KernelId::Fp8QuantX(DType::BF16));
            assert!(p.first_kernel_pdl);
            assert!(
                has(
                    &p,
                    &["align: inside GEMM1", &format!("({} slots <= 512", 8 * m)]
                ),
                "{:?}",
                p.reasons
            );
        }
        let p = plan(65, 128, 2048, 768, Some(QuantScheme::Tensor));
        assert!(!p.align_in_gemm1 && aligns(&p));
        assert!(
            has(&p, &["align: its own kernel before GEMM1 (520 slots > 512"]),
            "{:?}",
            p.reasons
        );
        // bf16 at K = 2048 (32 k-stages): one CTA per item, each would group again
        let p = plan(16, 128, 2048, 768, None);
        assert!(!p.wgmma_persistent.0 && !p.align_in_gemm1 && aligns(&p));
        assert!(
            has(&p, &["align: its own kernel", "one CTA per item"]),
            "{:?}",
            p.reasons
        );
        // bf16 at K = 256 (4 k-stages): persistent, GEMM1 groups the slots and comes first
        let p = plan(16, 128, 256, 768, None);
        assert!(p.align_in_gemm1 && !aligns(&p), "{:?}", p.reasons);
        assert_eq!(p.kernels[0], KernelId::WgmmaGemm1Grouping(DType::BF16, 64));
        assert!(p.first_kernel_pdl);
        // rows gathered beforehand (N >= 4096) were gathered by route_align's grouping
        let p = plan(16, 8, 256, 4096, None);
        assert!(!p.align_in_gemm1 && aligns(&p));
        assert!(has(
            &p,
            &[
                "align: its own kernel",
                "gathered in the grouped order beforehand"
            ]
        ));
        // the grouping of 8192 local experts does not fit beside the stages
        let p = plan(1, 8192, 256, 768, None);
        assert!(!p.align_in_gemm1 && aligns(&p));
        assert!(
            has(
                &p,
                &["align: its own kernel", "bytes of shared memory, more than"]
            ),
            "{:?}",
            p.reasons
        );
        assert!(
            wgmma_smem_bytes(64) + cta_align_smem_bytes(512, 256, 264)
                <= WGMMA_GEMM1_MAX_SMEM_BYTES
        );
        // forced: on past the rule (one CTA per item), off where the rule takes it, a bad value
        std::env::set_var(ALIGN_IN_GEMM1_ENV, "on");
        let p = plan(16, 128, 2048, 768, None);
        assert!(p.align_in_gemm1 && !aligns(&p));
        assert!(has(
            &p,
            &[
                "align: inside GEMM1",
                "forced by $SWAPMOE_ALIGN_IN_GEMM1=on"
            ]
        ));
        let p = plan(16, 8, 256, 4096, None);
        assert!(
            !p.align_in_gemm1,
            "on cannot force it past pre-gathered rows"
        );
        std::env::set_var(ALIGN_IN_GEMM1_ENV, "off");
        let p = plan(16, 128, 256, 768, None);
        assert!(!p.align_in_gemm1 && aligns(&p));
        assert!(has(&p, &["forced by $SWAPMOE_ALIGN_IN_GEMM1=off"]));
        std::env::set_var(ALIGN_IN_GEMM1_ENV, "sometimes");
        let p = plan(16, 128, 256, 768, None);
        assert!(p.align_in_gemm1);
        assert!(
            has(&p, &["$SWAPMOE_ALIGN_IN_GEMM1=\"sometimes\" ignored"]),
            "{:?}",
            p.reasons
        );
        std::env::remove_var(ALIGN_IN_GEMM1_ENV);
        // fused_moe asked to fuse: no align kernel to route in, so the router runs first
        let mut p = plan(8, 128, 256, 768, None);
        assert!(p.align_in_gemm1);
        let fuse = RouterRequest {
            fusion: true,
            ..RouterRequest::default()
        };
        place_router(&mut p, 8, 128, &softmax_top8(), fuse);
        assert!(matches!(p.router, RouterPlacement::Separate(_)));
        assert!(!p.kernels.contains(&KernelId::RouteAlignRouted));
        assert!(has(
            &p,
            &["router: its own kernel first, GEMM1 groups the slots itself"]
        ));
    }

    #[test]
    fn wgmma_gemm2_block_run_on_dense_e4m3_tiles_or_where_forced() {
        let _knobs = ENV_KNOBS.write().unwrap_or_else(|e| e.into_inner());
        let run = |m: i64, quant: Option<QuantScheme>, tile: usize| {
            let (e, topk, k, n) = DEEPSEEK;
            let req = Request {
                backend: Some(Backend::CudaWgmma),
                mma_token_tile: Some(tile),
                ..Request::default()
            };
            let p = whole_model_plan(m, e, topk, k, n, DType::BF16, quant, &h200(), &req).unwrap();
            assert_eq!((p.backend, p.tokens_per_pass), (Backend::CudaWgmma, tile));
            (p.wgmma_gemm2_block_run, p.reasons)
        };
        // default: bf16 one block per item; e4m3 runs of 4 where ~M·topk/E fills the tile
        let (one, why) = run(4096, None, 128);
        assert_eq!(one, 1);
        assert!(why
            .iter()
            .any(|r| r.starts_with("cuda_wgmma GEMM2: one column block per work item (bf16/f16")));
        let (dense, why_dense) = run(4096, Some(QuantScheme::Tensor), 128);
        assert_eq!(dense, WGMMA_GEMM2_DENSE_E4M3_BLOCK_RUN);
        assert!(why_dense.iter().any(|r| r.starts_with(
            "cuda_wgmma GEMM2: runs of 4 of the 28 column blocks per token tile, the tile's rows loaded once per run (e4m3, ~128 tokens per expert"
        )));
        let (sparse, why_sparse) = run(2048, Some(QuantScheme::Block), 128);
        assert_eq!(sparse, 1);
        assert!(why_sparse.iter().any(|r| r.starts_with(
            "cuda_wgmma GEMM2: one column block per work item (~64 tokens per expert, under the 128-row tile"
        )));
        // tile 64 (5 stages) is not eligible at any M: no run and no reason about it
        let (t64_default, _) = run(8192, Some(QuantScheme::Tensor), 64);
        assert_eq!(t64_default, 1);
        std::env::set_var(WGMMA_GEMM2_BLOCK_RUN_ENV, "7");
        // bf16 N = 256: 4 k-stages in tile 128's 4 stages; e4m3: 2 in 4
        let (bf16, why) = run(4096, None, 128);
        let (fp8, _) = run(4096, Some(QuantScheme::Tensor), 128);
        // tile 64's 5 stages: 4 bf16 k-stages do not divide them, 2 e4m3 ones neither
        let (t64, why64) = run(4096, None, 64);
        std::env::set_var(WGMMA_GEMM2_BLOCK_RUN_ENV, "99");
        let (capped, _) = run(4096, None, 128);
        std::env::set_var(WGMMA_GEMM2_BLOCK_RUN_ENV, "0");
        let (bad, why_bad) = run(4096, None, 128);
        std::env::remove_var(WGMMA_GEMM2_BLOCK_RUN_ENV);
        assert_eq!((bf16, fp8, t64), (7, 7, 1));
        assert!(why.iter().any(|r| r
            == "cuda_wgmma GEMM2: runs of 7 of the 28 column blocks per token tile, the tile's rows loaded once per run (forced by $SWAPMOE_WGMMA_GEMM2_BLOCK_RUN=7)"));
        assert!(why64.iter().any(|r| r.starts_with(
            "$SWAPMOE_WGMMA_GEMM2_BLOCK_RUN=7 ignored: N's 4 k-stages do not divide the ring's 5 stages"
        )));
        assert_eq!(capped, 28, "a run is at most the column blocks");
        assert_eq!(bad, 1);
        assert!(why_bad
            .iter()
            .any(|r| r == "$SWAPMOE_WGMMA_GEMM2_BLOCK_RUN=\"0\" ignored (expected 1 to 255)"));
        // swap-AB plans carry 1
        assert_eq!(
            forced(1, DEEPSEEK, None, Backend::CudaWgmmaSwap).wgmma_gemm2_block_run,
            1
        );
    }

    #[test]
    fn wgmma_grids_are_persistent_for_short_items_only() {
        let h = h200();
        let grids_at = |m: i64, e: i64, topk: i64, k: i64, n: i64, quant: Option<QuantScheme>| {
            let p = whole_model_plan(
                m,
                e,
                topk,
                k,
                n,
                DType::BF16,
                quant,
                &h,
                &Request {
                    backend: Some(Backend::CudaWgmma),
                    ..Request::default()
                },
            )
            .unwrap();
            (p.ctas, p.wgmma_persistent, p.reasons)
        };
        let grids = |e, topk, k, n, quant| grids_at(4096, e, topk, k, n, quant);
        // deepseek-v3-tp8: GEMM2's 4 bf16 (2 e4m3) k-stages per item -> persistent
        // GEMM1: 2 column blocks per expert but 112 stages -> one CTA per item; FP8 (56
        // stages) -> persistent
        let (ctas, on, why) = grids(256, 8, 7168, 256, None);
        assert_eq!((ctas, on), (132, (false, true)));
        assert!(why
            .iter()
            .any(|r| r.contains("GEMM2 (4 k-stages per item) a persistent grid of 132 CTAs")));
        assert!(why.iter().any(|r| r.contains(
            "GEMM1 (112 k-stages per item) one CTA per item (> 8 stages; past that it needs <= 8 column blocks per expert (has 2), <= 64 stages and >= 32 tokens per expert (expects 128): persistent measured slower or not measured)"
        )));
        let (_, on, why) = grids(256, 8, 7168, 256, Some(QuantScheme::Tensor));
        assert_eq!(on, (true, true));
        assert!(why.iter().any(|r| r.contains(
            "GEMM1 (56 k-stages per item) a persistent grid of 132 CTAs, each looping over its items so the next one's loads run under the last one's epilogue (2 column blocks per expert <= 8, <= 64 stages and >= 32 tokens per expert: measured faster persistent)"
        )));
        // qwen3: 12 bf16 stages in GEMM2 -> one CTA per item, GEMM1's 6 column blocks ->
        // persistent; FP8: GEMM1 16 and GEMM2 6 stages -> both persistent
        let (ctas, on, _) = grids(128, 8, 2048, 768, None);
        assert_eq!((ctas, on), (132, (true, false)));
        let (_, on, why) = grids(128, 8, 2048, 768, Some(QuantScheme::Tensor));
        assert_eq!(on, (true, true));
        assert!(why
            .iter()
            .any(|r| r.contains("GEMM1 (16 k-stages per item) a persistent grid")));
        assert_eq!(
            grids(256, 8, 7168, 256, Some(QuantScheme::Block)).2.iter().filter(|r| r.contains("GEMM1 (56 k-stages per item) a persistent grid of 132 CTAs")).count(),
            1
        );
        // Mixtral: long items everywhere, and 112 column blocks per expert
        let (ctas, on, why) = grids(8, 2, 4096, 14336, None);
        assert_eq!((ctas, on), (0, (false, false)));
        assert!(why.iter().any(|r| r.contains(
            "GEMM1 (64 k-stages per item) one CTA per item (> 8 stages; past that it needs <= 8 column blocks per expert (has 112), <= 64 stages and >= 32 tokens per expert (expects 1024): persistent measured slower or not measured)"
        )));
        // 9 column blocks (N = 1152) and long items: one CTA per item
        assert_eq!(grids(64, 8, 4096, 1152, None).1, (false, false));
        // qwen3 bf16 at M = 128 (8 tokens per expert, not measured): the stage rule alone
        assert_eq!(grids_at(128, 128, 8, 2048, 768, None).1, (false, false));
    }

    /// Under expert parallelism each local expert expects the whole model's load per expert
    /// (M·topk / E_global): the heuristic picks for 32 local experts of deepseek-v3's 256
    /// what it picks for all 256 (backend and token tile), not what 8x the load would get.
    #[test]
    fn expert_parallel_load_per_local_expert_is_the_models() {
        let (e, topk, k, n) = DEEPSEEK;
        for m in [1, 4, 8, 16, 64, 256, 1024, 4096] {
            let whole = problem(m, e, topk, k, n, DType::BF16);
            let mut rank = problem(m, e / 8, topk, k, n, DType::BF16);
            rank.global_experts = e as usize;
            assert_eq!(
                expected_local_slots(&rank),
                (m as usize * topk as usize).div_ceil(8)
            );
            assert_eq!(expected_local_slots(&whole), whole.slots());
            let (a, b) = (plan(&whole, Some(&h200())), plan(&rank, Some(&h200())));
            assert_eq!(
                (a.backend, a.tokens_per_pass),
                (b.backend, b.tokens_per_pass),
                "M = {m}: {:?} against {:?}",
                a.reasons,
                b.reasons
            );
        }
    }

    #[test]
    fn wgmma_for_many_slots_per_expert_on_hopper_only() {
        // qwen3 M=4096: 256 slots per expert -> wgmma, tile 128; M=256: 16 -> wgmma, tile 64
        let big = plan(
            &problem(4096, 128, 8, 2048, 768, DType::BF16),
            Some(&h200()),
        );
        assert_eq!(big.backend, Backend::CudaWgmma);
        assert_eq!(big.tokens_per_pass, 128);
        assert_eq!(
            big.kernels,
            vec![
                KernelId::RouteAlign,
                KernelId::WgmmaGemm1Act(DType::BF16, 128, false),
                KernelId::WgmmaGemm2(DType::BF16, 128),
                KernelId::WgmmaTopkReduce(DType::BF16),
            ]
        );
        // Mixtral's N=14336: the rows are gathered first and GEMM1 reads them by TMA
        let wide = plan(
            &problem(4096, 8, 2, 4096, 14336, DType::BF16),
            Some(&h200()),
        );
        assert_eq!(
            wide.kernels,
            vec![
                KernelId::RouteAlign,
                KernelId::WgmmaGather,
                KernelId::WgmmaGemm1Act(DType::BF16, 128, true),
                KernelId::WgmmaGemm2(DType::BF16, 128),
                KernelId::WgmmaTopkReduce(DType::BF16),
            ]
        );
        assert!(wide
            .reasons
            .iter()
            .any(|r| r.contains("gathered once beforehand")));
        let mid = plan(&problem(256, 128, 8, 2048, 768, DType::BF16), Some(&h200()));
        assert_eq!((mid.backend, mid.tokens_per_pass), (Backend::CudaWgmma, 64));
        // 3 slots per expert: the 16-token mma.sync tile, with the reason
        let few = plan(&problem(96, 256, 8, 7168, 256, DType::BF16), Some(&h200()));
        assert_eq!(few.backend, Backend::CudaMma);
        assert!(few
            .reasons
            .iter()
            .any(|r| r.contains("cuda_wgmma: not picked, 3.0 slots per active expert (< 4)")));
        // 8 slots per expert: past WGMMA_OVER_MMA_MIN_SLOTS_PER_EXPERT, the wgmma GEMMs
        let eight = plan(&problem(256, 256, 8, 7168, 256, DType::BF16), Some(&h200()));
        assert_eq!(
            (eight.backend, eight.tokens_per_pass),
            (Backend::CudaWgmma, 64)
        );
        // not on Ampere, not for float32, not for FP8's SIMT fallbacks
        let ampere = DeviceCaps {
            name: "NVIDIA A100-SXM4-80GB".into(),
            capability: (8, 0),
            sm_count: 108,
        };
        let a = plan(
            &problem(4096, 128, 8, 2048, 768, DType::BF16),
            Some(&ampere),
        );
        assert_eq!(a.backend, Backend::CudaMma);
        assert!(a
            .reasons
            .iter()
            .any(|r| r.contains("cuda_wgmma: rejected") && r.contains("sm_90")));
        let f32p = plan(&problem(4096, 128, 8, 2048, 768, DType::F32), Some(&h200()));
        assert_eq!(f32p.backend, Backend::CudaGeneric);
        // every wgmma kernel has its own function-cache slot
        let ids: Vec<usize> = KernelId::all().iter().map(|k| k.index()).collect();
        let unique: HashSet<usize> = ids.iter().copied().collect();
        assert_eq!(unique.len(), ids.len());
        assert!(ids.iter().all(|i| *i < KernelId::COUNT));
    }

    #[test]
    fn wgmma_swap_tiles_splits_slices_and_rejections() {
        let _knobs = ENV_KNOBS.write().unwrap_or_else(|e| e.into_inner());
        let swap =
            |p: &MoeProblem| plan_with(p, Some(&h200()), Some(Backend::CudaWgmmaSwap)).unwrap();
        // qwen3 M=1: 8 token columns, 12 row blocks x 8 experts -> K split 2; GEMM2 32 row
        // blocks -> 4 ranks; one K slice per stage on both (N = 768 < 4096); PDL on Hopper
        let q = swap(&problem(1, 128, 8, 2048, 768, DType::BF16));
        assert_eq!(
            q.kernels,
            vec![
                KernelId::SwapGemm1Act(DType::BF16, 8, 1),
                KernelId::SwapGemm2Sum(DType::BF16, 8, 1),
            ]
        );
        assert_eq!((q.tokens_per_pass, q.splits, q.pdl), (8, (2, 4), true));
        assert!(q
            .reasons
            .iter()
            .any(|r| r.starts_with("cuda_wgmma_swap: weights")));
        // deepseek-v3-tp8 M=1: 4 row blocks x 8 experts -> K split 4; GEMM2 112 -> 2
        let d = swap(&problem(1, 256, 8, 7168, 256, DType::F16));
        assert_eq!(d.splits, (4, 2));
        assert_eq!(d.kernels[0], KernelId::SwapGemm1Act(DType::F16, 8, 1));
        // Mixtral: 2 experts -> GEMM2 split 2 at most; N >= 4096 -> 4 K slices in GEMM2
        let mx = swap(&problem(1, 8, 2, 4096, 14336, DType::BF16));
        assert_eq!(mx.splits, (1, 2));
        assert_eq!(mx.kernels[1], KernelId::SwapGemm2Sum(DType::BF16, 8, 4));
        // the token tile is the smallest that holds M
        for (m, t) in [(2, 8), (8, 8), (9, 16), (17, 32), (33, 64), (64, 64)] {
            assert_eq!(
                swap(&problem(m, 128, 8, 2048, 768, DType::BF16)).tokens_per_pass,
                t
            );
        }
        // rejections, each with its reason
        let refusal = |p: &MoeProblem, caps: &DeviceCaps| {
            plan_with(p, Some(caps), Some(Backend::CudaWgmmaSwap))
                .unwrap_err()
                .to_string()
        };
        let too_many = refusal(&problem(65, 128, 2, 2048, 768, DType::BF16), &h200());
        assert!(too_many.contains("at most M = 64 tokens"));
        let ampere = DeviceCaps {
            name: "NVIDIA A100-SXM4-80GB".into(),
            capability: (8, 0),
            sm_count: 108,
        };
        let on_ampere = refusal(&problem(1, 128, 8, 2048, 768, DType::BF16), &ampere);
        assert!(on_ampere.contains("sm_90"));
        let f32p = refusal(&problem(1, 128, 8, 2048, 768, DType::F32), &h200());
        assert!(f32p.contains("bfloat16 or float16"));
        let odd = refusal(&problem(1, 128, 8, 2044, 768, DType::BF16), &h200());
        assert!(odd.contains("multiples of 8"));
        // shared memory mirrors Stages<NT, kBoxes, kSub>: 6 stages of 17 KiB (two CTAs per
        // SM); 4 slices of the 64-token tile: 2 stages of 96 KiB (one CTA per SM)
        assert_eq!(swap_smem_bytes(8, 2, 1), 6 * 17 * 1024 + 1024);
        assert_eq!(swap_smem_bytes(64, 2, 4), 2 * 96 * 1024 + 1024);
        assert_eq!(swap_smem_bytes(8, 1, 1), 11 * 9 * 1024 + 1024);
        // the heuristic's range on Hopper (no tables): wide experts up to M = 32, others up to
        // M = 16, cuda_decode's range included
        let pick = |m, e, topk, k, n| plan(&problem(m, e, topk, k, n, DType::BF16), Some(&h200()));
        for m in [1, 4, 32] {
            assert_eq!(
                pick(m, 8, 2, 4096, 14336).backend,
                Backend::CudaWgmmaSwap,
                "mixtral M={m}"
            );
        }
        assert_eq!(pick(64, 8, 2, 4096, 14336).backend, Backend::CudaWgmma);
        assert_eq!(pick(1, 128, 8, 2048, 768).backend, Backend::CudaWgmmaSwap);
        assert_eq!(pick(2, 256, 8, 7168, 256).backend, Backend::CudaWgmmaSwap);
        let q8 = pick(8, 128, 8, 2048, 768);
        assert_eq!(q8.backend, Backend::CudaWgmmaSwap);
        assert!(q8
            .reasons
            .iter()
            .any(|r| r.contains("measured fastest here")));
        assert_eq!(pick(16, 256, 8, 7168, 256).backend, Backend::CudaWgmmaSwap);
        // M = 32 over 256 experts: ~1.6 slots per active expert, thin enough for swap-AB;
        // over 128 (~2.3) not, and past M = 32 not at all
        let d32 = pick(32, 256, 8, 7168, 256);
        assert_eq!(d32.backend, Backend::CudaWgmmaSwap);
        assert!(
            d32.reasons.iter().any(|r| r.contains("here ~1.58")),
            "{:?}",
            d32.reasons
        );
        assert_ne!(pick(40, 256, 8, 7168, 256).backend, Backend::CudaWgmmaSwap);
        assert_ne!(pick(64, 1024, 8, 7168, 256).backend, Backend::CudaWgmmaSwap);
        let q32 = pick(32, 128, 8, 2048, 768);
        assert_ne!(q32.backend, Backend::CudaWgmmaSwap);
        assert!(q32
            .reasons
            .iter()
            .any(|r| r.starts_with("cuda_wgmma_swap: not picked")));
        // overrides through the environment, bad values ignored with a reason
        std::env::set_var(SWAP_SPLITS_ENV, "8,1");
        std::env::set_var(SWAP_SLICES_ENV, "4,4");
        let forced = swap(&problem(1, 128, 8, 2048, 768, DType::BF16));
        assert_eq!(forced.splits, (8, 1));
        assert_eq!(forced.kernels[0], KernelId::SwapGemm1Act(DType::BF16, 8, 4));
        std::env::set_var(SWAP_SPLITS_ENV, "3,1");
        std::env::set_var(SWAP_SLICES_ENV, "2");
        let ignored = swap(&problem(1, 128, 8, 2048, 768, DType::BF16));
        std::env::remove_var(SWAP_SPLITS_ENV);
        std::env::remove_var(SWAP_SLICES_ENV);
        assert_eq!(ignored.splits, (2, 4));
        assert!(ignored
            .reasons
            .iter()
            .any(|r| r.contains("SWAPMOE_SWAP_SPLITS=\"3,1\" ignored")
                && r.contains("SWAPMOE_SWAP_SLICES=\"2\" ignored")));
        // GEMM2 one CTA per SM from N >= 4096, forced either way, a bad value ignored; the
        // shared memory asked for keeps two GEMM2 CTAs off one SM but lets a GEMM1 CTA share it
        let mixtral = swap(&problem(1, 8, 2, 4096, 14336, DType::BF16));
        assert!(mixtral.swap_gemm2_one_per_sm);
        assert!(mixtral
            .reasons
            .iter()
            .any(|r| r.starts_with("gemm2: one CTA per SM (N = 14336")));
        let qwen = swap(&problem(1, 128, 8, 2048, 768, DType::BF16));
        assert!(!qwen.swap_gemm2_one_per_sm);
        let gemm2 = KernelId::SwapGemm2Sum(DType::BF16, 8, 1);
        assert_eq!(
            gemm2.max_dynamic_smem_bytes(),
            Some(SWAP_GEMM2_ONE_PER_SM_SMEM_BYTES)
        );
        // (static shared memory of the swap-AB kernels: 5168-5456 bytes, ptxas -v)
        let static_max = 5632;
        const { assert!(2 * (SWAP_GEMM2_ONE_PER_SM_SMEM_BYTES + 5168 + 1024) > SM_SHARED_MEMORY_BYTES) };
        assert!(
            SWAP_GEMM2_ONE_PER_SM_SMEM_BYTES + swap_smem_bytes(8, 2, 1) + 2 * (1024 + static_max)
                <= SM_SHARED_MEMORY_BYTES
        );
        std::env::set_var(SWAP_GEMM2_ONE_PER_SM_ENV, "1");
        assert!(swap(&problem(1, 128, 8, 2048, 768, DType::BF16)).swap_gemm2_one_per_sm);
        std::env::set_var(SWAP_GEMM2_ONE_PER_SM_ENV, "0");
        assert!(!swap(&problem(1, 8, 2, 4096, 14336, DType::BF16)).swap_gemm2_one_per_sm);
        std::env::set_var(SWAP_GEMM2_ONE_PER_SM_ENV, "yes");
        let bad = swap(&problem(1, 8, 2, 4096, 14336, DType::BF16));
        std::env::remove_var(SWAP_GEMM2_ONE_PER_SM_ENV);
        assert!(bad.swap_gemm2_one_per_sm);
        assert!(bad
            .reasons
            .iter()
            .any(|r| r.contains("SWAPMOE_SWAP_GEMM2_ONE_PER_SM=\"yes\" ignored")));
        assert!(
            !plan(&problem(1, 8, 2, 4096, 14336, DType::BF16), Some(&ampere)).swap_gemm2_one_per_sm
        );
        // GEMM2 by PDL where the plan has PDL, unless forced off; a bad value ignored
        assert!(qwen.pdl && qwen.swap_gemm2_pdl);
        std::env::set_var(SWAP_GEMM2_PDL_ENV, "0");
        let off = swap(&problem(1, 128, 8, 2048, 768, DType::BF16));
        std::env::set_var(SWAP_GEMM2_PDL_ENV, "on");
        let bad = swap(&problem(1, 128, 8, 2048, 768, DType::BF16));
        std::env::remove_var(SWAP_GEMM2_PDL_ENV);
        assert!(off.pdl && !off.swap_gemm2_pdl);
        assert!(off
            .reasons
            .iter()
            .any(|r| r.contains("SWAPMOE_SWAP_GEMM2_PDL=0")));
        assert!(bad.swap_gemm2_pdl);
        assert!(bad
            .reasons
            .iter()
            .any(|r| r.contains("SWAPMOE_SWAP_GEMM2_PDL=\"on\" ignored")));
        assert!(!plan(&problem(1, 128, 8, 2048, 768, DType::BF16), Some(&ampere)).swap_gemm2_pdl);
    }

    #[test]
    fn align_runs_as_a_cluster_for_many_slots() {
        let _knobs = ENV_KNOBS.write().unwrap_or_else(|e| e.into_inner());
        let a100 = DeviceCaps {
            name: "A100".into(),
            capability: (8, 0),
            sm_count: 108,
        };
        let wgmma = |m: i64, caps: &DeviceCaps| {
            let p = problem(m, 128, 8, 2048, 768, DType::BF16);
            let b = if caps.capability.0 >= 9 {
                Backend::CudaWgmma
            } else {
                Backend::CudaMma
            };
            plan_with(&p, Some(caps), Some(b)).unwrap()
        };
        // One CTA per ALIGN_SLOTS_PER_CTA slots, at most ALIGN_MAX_CTAS, with the reason.
        for (m, ctas) in [
            (64, 1),
            (512, 1),
            (513, 2),
            (1024, 2),
            (2048, 4),
            (4096, 8),
            (16384, 8),
        ] {
            let plan = wgmma(m, &h200());
            assert_eq!(plan.kernels[0], KernelId::RouteAlign);
            assert_eq!(plan.align_ctas, ctas, "M = {m}");
            let why = if ctas == 1 {
                "align: one CTA ("
            } else {
                "align: a cluster of "
            };
            assert!(
                plan.reasons.iter().any(|r| r.starts_with(why)),
                "{:?}",
                plan.reasons
            );
        }
        // No cluster before sm_90; none for plans without the align kernel.
        let ampere = wgmma(4096, &a100);
        assert_eq!(ampere.align_ctas, 1);
        assert!(ampere
            .reasons
            .iter()
            .any(|r| r == "align: one CTA (thread-block clusters need sm_90)"));
        let swap = h200_swap_plan(1, 128, 2048, 768);
        assert_eq!(swap.align_ctas, 1);
        assert!(!swap.reasons.iter().any(|r| r.starts_with("align:")));
        // The override, and what it does not take.
        std::env::set_var(ALIGN_CTAS_ENV, "3");
        let forced = wgmma(64, &h200());
        assert_eq!(forced.align_ctas, 3);
        assert!(forced
            .reasons
            .iter()
            .any(|r| r == "align: 3 CTAs, forced by $SWAPMOE_ALIGN_CTAS=3"));
        assert_eq!(wgmma(64, &a100).align_ctas, 1);
        std::env::set_var(ALIGN_CTAS_ENV, "9");
        let ignored = wgmma(4096, &h200());
        assert_eq!(ignored.align_ctas, 8);
        assert!(ignored
            .reasons
            .iter()
            .any(|r| r.starts_with("$SWAPMOE_ALIGN_CTAS=\"9\" ignored (expected 1 to 8)")));
        std::env::remove_var(ALIGN_CTAS_ENV);
    }

    #[test]
    fn swap_gemm1_ring_of_three_where_about_one_expert_is_active() {
        let _knobs = ENV_KNOBS.read().unwrap_or_else(|e| e.into_inner());
        let req = Request {
            backend: Some(Backend::CudaWgmmaSwap),
            ..Request::default()
        };
        let ring =
            |m: i64, e: i64, global: i64, topk: i64, k: i64, n: i64, quant: Option<QuantScheme>| {
                let bf16 = DType::BF16;
                let p = plan_for_shape(m, e, global, topk, k, n, bf16, quant, None, &h200(), &req)
                    .unwrap();
                (p.swap_gemm1_ring, p.reasons)
            };
        // Qwen3-235B-A22B EP8 (16 of 128 experts): ~1 slot of M = 1's 8 on the rank, ~2 at M = 2
        for quant in [None, Some(QuantScheme::Block)] {
            let (r, why) = ring(1, 16, 128, 8, 4096, 1536, quant);
            assert_eq!(r, SWAP_FEW_EXPERTS_GEMM1_RING, "{why:?}");
            assert!(
                why.iter()
                    .any(|w| w.starts_with("gemm1: a ring of 3 stages")
                        && w.contains(
                            "8 grid rows for ~1.0 active experts, so most rows find no expert"
                        )),
                "{why:?}"
            );
            assert_eq!(ring(2, 16, 128, 8, 4096, 1536, quant).0, 0);
        }
        // DeepSeek-V3 EP16 (16 of 256): ~1 at M = 1 and 2; Llama-4-Scout (top-1) at M = 1
        assert_eq!(
            ring(2, 16, 256, 8, 7168, 2048, Some(QuantScheme::Block)).0,
            3
        );
        // top-1: one grid row, no idle rows; the reason says what the ring measured there
        let (r, why) = ring(1, 16, -1, 1, 5120, 1024, None);
        assert_eq!(r, 3, "{why:?}");
        assert!(
            why.iter()
                .any(|w| w.starts_with("gemm1: a ring of 3 stages")
                    && w.contains("~1.0 active experts in 1 grid row(s) (with every row working")),
            "{why:?}"
        );
        // two active experts (Mixtral M = 1) and the whole of qwen3-30b-a3b M = 1 keep the
        // one-wave rule (Mixtral: its ring of 2 for 4 CTAs per SM; qwen3: its own ring)
        for (m, e, topk, k, n, want) in [(1, 8, 2, 4096, 14336, 2), (1, 128, 8, 2048, 768, 0)] {
            let (r, why) = ring(m, e, -1, topk, k, n, None);
            assert_eq!(r, want, "{why:?}");
            assert!(!why.iter().any(|w| w.contains("grid row")), "{why:?}");
        }
    }

    #[test]
    fn swap_gemm1_ring_fits_one_wave_where_registers_and_shared_memory_allow() {
        let swap = h200_swap_plan;
        // qwen3-30b-a3b: M = 1 (~192 CTAs with the K split) fits two per SM: the kernel's
        // own ring; M = 4 (~350) three per SM: 4 stages of 17 KiB; M = 8 (~650) would need
        // five (2 stages each: measured slower, so its own ring); M = 16 (~960) would need 8,
        // more than the registers allow (5)
        // the ring of qwen3's plan at M, and a reason of the plan that `why` accepts
        let qwen3 = |m: i64, ring: usize, why: &dyn Fn(&String) -> bool| {
            let plan = swap(m, 128, 2048, 768);
            assert_eq!(plan.swap_gemm1_ring, ring, "M = {m}: {:?}", plan.reasons);
            assert!(plan.reasons.iter().any(why), "M = {m}: {:?}", plan.reasons);
        };
        assert_eq!(swap(1, 128, 2048, 768).swap_gemm1_ring, 0);
        qwen3(4, 4, &|r| {
            r.starts_with("gemm1: a ring of 4 stages (its own: 6)")
        });
        qwen3(8, 0, &|r| {
            r.contains("needs 5 per SM, more than 4 (measured at one wave")
        });
        // deepseek-v3-tp8 M = 16: four per SM, 2 stages of 18 KiB
        assert_eq!(swap(16, 256, 7168, 256).swap_gemm1_ring, 2);
        qwen3(16, 0, &|r| r.contains("its registers allow 5"));
        // token tile 64: one CTA per SM by registers, the kernel's own ring
        assert_eq!(swap(64, 128, 2048, 768).swap_gemm1_ring, 0);
        // the override (parsed apart from the environment: other tests plan swap-AB calls
        // in parallel), and values outside the kernel's ring
        assert_eq!(
            swap_ring_override("gemm1", SWAP_GEMM1_RING_ENV, "3", 6).0,
            3
        );
        assert_eq!(
            swap_ring_override("gemm1", SWAP_GEMM1_RING_ENV, " 0", 6).0,
            0
        );
        for bad in ["1", "7", "x", ""] {
            let (n, why) = swap_ring_override("gemm1", SWAP_GEMM1_RING_ENV, bad, 6);
            assert_eq!(n, 0);
            assert!(why.contains("ignored (expected 0 or 2 to 6)"), "{why}");
        }
        // The e4m3 GEMM1 (stages of 16 KiB + 128 bytes per token column) by the same rule:
        // qwen3-30b-a3b fp8_tensor M = 1 two per SM (its own ring), M = 4 three (4 stages),
        // mixtral-8x7b M = 1 (~448 CTAs) four (2 stages); the kernel in the plan is the one
        // the ring was sized for
        let fp8 = |m: i64, shape: (i64, i64, i64, i64)| {
            let plan = forced(m, shape, Some(QuantScheme::Tensor), Backend::CudaWgmmaSwap);
            assert!(plan
                .kernels
                .iter()
                .any(|k| matches!(k, KernelId::SwapFp8StaticGemm1(_))));
            (plan.swap_gemm1_ring, plan.reasons)
        };
        assert_eq!(fp8(1, (128, 8, 2048, 768)).0, 0);
        let (ring, why) = fp8(4, (128, 8, 2048, 768));
        assert_eq!(ring, 4, "{why:?}");
        assert!(why
            .iter()
            .any(|r| r.starts_with("gemm1: a ring of 4 stages (its own: 6)")));
        assert_eq!(fp8(1, (8, 2, 4096, 14336)).0, 2);
        assert_eq!(
            swap_gemm1_stage_bytes(KernelId::SwapFp8StaticGemm1(8)),
            17 * 1024
        );
        assert_eq!(
            swap_gemm1_smem_bytes(KernelId::SwapFp8Gemm1(QuantScheme::Block, 16), 3),
            3 * (16 * 1024 + 2048) + 1024
        );
        // other backends carry 0
        assert_eq!(
            plan_with(
                &problem(8, 128, 8, 2048, 768, DType::BF16),
                Some(&h200()),
                Some(Backend::CudaWgmma)
            )
            .unwrap()
            .swap_gemm1_ring,
            0
        );
    }

    #[test]
    fn swap_gemm2_ring_by_its_rule_and_override() {
        let _knobs = ENV_KNOBS.write().unwrap_or_else(|e| e.into_inner());
        std::env::remove_var(SWAP_GEMM2_RING_ENV);
        std::env::remove_var(SWAP_GEMM1_RING_ENV);
        let qwen3 = |m: i64, quant: Option<QuantScheme>| {
            forced(m, (128, 8, 2048, 768), quant, Backend::CudaWgmmaSwap)
        };
        let deepseek = |m: i64, quant: Option<QuantScheme>| {
            forced(m, (256, 8, 7168, 256), quant, Backend::CudaWgmmaSwap)
        };
        let mixtral = |m: i64| {
            forced(
                m,
                (8, 2, 4096, 14336),
                Some(QuantScheme::Tensor),
                Backend::CudaWgmmaSwap,
            )
        };
        // The rule (H200, 132 SMs): qwen3 M = 1's 128 GEMM2 CTAs fit beside GEMM1's 192
        // (60 SMs with two, 72 with one) two to an SM from a ring of 5 down, 12 k-stages each
        // (its own ring: 11 at 9 KiB, 10 at 10 KiB with the block scales). deepseek M = 1's
        // would fit from 5 too, but its own ring holds all 8 k-stages of a CTA.
        for quant in [Some(QuantScheme::Tensor), Some(QuantScheme::Block)] {
            let p = qwen3(1, quant);
            assert_eq!(
                (p.splits, p.swap_gemm2_ring),
                ((2, 4), 5),
                "{quant:?} {:?}",
                p.reasons
            );
            assert!(p
                .reasons
                .iter()
                .any(|r| r.starts_with("gemm2: a ring of 5 stages")));
            let p = deepseek(1, quant);
            assert_eq!((p.splits, p.swap_gemm2_ring), ((4, 2), 0), "{quant:?}");
            assert!(
                p.reasons
                    .iter()
                    .any(|r| r.contains("it holds all 8 k-stages of a CTA")),
                "{:?}",
                p.reasons
            );
        }
        // 24 and 16 k-stages per CTA at M = 2 (measured slower with small rings); Mixtral M = 1's
        // GEMM1 takes 4 CTAs an SM and its GEMM2 112 k-stages per CTA
        let p = qwen3(2, Some(QuantScheme::Tensor));
        assert_eq!(p.swap_gemm2_ring, 0);
        assert!(
            p.reasons
                .iter()
                .any(|r| r.contains("24 k-stages per CTA are more than 5/2")),
            "{:?}",
            p.reasons
        );
        assert_eq!(deepseek(2, Some(QuantScheme::Tensor)).swap_gemm2_ring, 0);
        assert_eq!(mixtral(1).swap_gemm2_ring, 0);
        // token tiles past 8, and the bf16 GEMM2 (its ring is fixed), keep their own ring
        assert_eq!(qwen3(16, Some(QuantScheme::Tensor)).swap_gemm2_ring, 0);
        assert_eq!(qwen3(1, None).swap_gemm2_ring, 0);
        // the override, either way
        std::env::set_var(SWAP_GEMM2_RING_ENV, "4");
        for quant in [Some(QuantScheme::Tensor), Some(QuantScheme::Block)] {
            let p = qwen3(2, quant);
            assert_eq!(p.swap_gemm2_ring, 4, "{quant:?}");
            assert!(p
                .reasons
                .iter()
                .any(|r| r.starts_with("gemm2: a ring of 4 stages")));
        }
        assert_eq!(qwen3(1, None).swap_gemm2_ring, 0, "bf16 keeps its ring");
        std::env::set_var(SWAP_GEMM2_RING_ENV, "0");
        assert_eq!(qwen3(1, Some(QuantScheme::Tensor)).swap_gemm2_ring, 0);
        // the e4m3 static-scale GEMM2 at token tile 8: 11 stages of 9 KiB of its own
        std::env::set_var(SWAP_GEMM2_RING_ENV, "12");
        let p = qwen3(1, Some(QuantScheme::Tensor));
        assert_eq!(p.swap_gemm2_ring, 0);
        assert!(p
            .reasons
            .iter()
            .any(|r| r.contains("ignored (expected 0 or 2 to 11)")));
        // one CTA per SM keeps the kernel's own ring
        std::env::set_var(SWAP_GEMM2_RING_ENV, "4");
        std::env::set_var(SWAP_GEMM2_ONE_PER_SM_ENV, "1");
        assert_eq!(qwen3(1, Some(QuantScheme::Tensor)).swap_gemm2_ring, 0);
        std::env::remove_var(SWAP_GEMM2_ONE_PER_SM_ENV);
        std::env::remove_var(SWAP_GEMM2_RING_ENV);
        // the slots: 60 SMs with two GEMM1 CTAs of 110 KiB hold none of 53 KiB, 72 with one hold 2
        assert_eq!(swap_gemm2_slots(132, 192, 109 * 1024, 52 * 1024), 144);
        assert_eq!(swap_gemm2_slots(132, 192, 109 * 1024, 105 * 1024), 72);
        assert_eq!(swap_gemm2_slots(132, 0, 109 * 1024, 105 * 1024), 264);
        let q8 = KernelId::SwapFp8StaticGemm2Sum(DType::BF16, 8);
        assert_eq!(swap_gemm2_stage_bytes(q8), 9 * 1024);
        assert_eq!(swap_gemm2_smem_bytes(q8, 4), 4 * 9 * 1024 + 1024);
        assert_eq!(
            swap_gemm2_smem_bytes(q8, 0),
            q8.dynamic_smem_bytes().unwrap()
        );
        // The smallest ring (2) still holds the K split's cluster sum, which reuses the stages
        // as its scratch (`cluster_sum`: NT / 2 floats per consumer thread, 128 of them).
        for tile in SWAP_TOKEN_TILES {
            let scratch = tile / 2 * 128 * 4;
            assert_eq!(
                swap_gemm2_stage_bytes(KernelId::SwapGemm2Sum(DType::BF16, tile, 1)),
                0
            );
            for k in [
                KernelId::SwapFp8Gemm2Sum(DType::BF16, QuantScheme::Block, tile),
                KernelId::SwapFp8StaticGemm2Sum(DType::BF16, tile),
            ] {
                assert!(2 * swap_gemm2_stage_bytes(k) >= scratch, "{k:?}");
            }
        }
    }

    #[test]
    fn first_kernel_pdl_follows_the_device_and_the_override() {
        let p = problem(8, 256, 8, 7168, 256, DType::BF16);
        let a100 = DeviceCaps {
            name: "A100".into(),
            capability: (8, 0),
            sm_count: 108,
        };
        let swap = h200_swap_plan;
        // The swap-AB GEMM1 that fits one wave starts without PDL, with the reason (deepseek
        // M = 16 through a smaller ring, `swap_gemm1_ring`); one of several waves keeps it
        // (qwen3-30b-a3b M = 8: ~607 CTAs would need 5 per SM, more than the ring rule's 4;
        // M = 16: ~960 CTAs, 8 per SM).
        for (plan, one_wave) in [
            (swap(1, 256, 7168, 256), true),
            (swap(8, 256, 7168, 256), true),
            (swap(16, 256, 7168, 256), true),
            (swap(8, 128, 2048, 768), false),
            (swap(16, 128, 2048, 768), false),
        ] {
            assert_eq!(plan.first_kernel_pdl, !one_wave, "{:?}", plan.reasons);
            assert_eq!(plan.one_wave_gemm1, one_wave);
            assert!(plan.pdl, "GEMM2 keeps PDL");
            assert_eq!(
                plan.reasons
                    .iter()
                    .any(|r| r.starts_with("first kernel: GEMM1's") && r.contains("one wave")),
                one_wave
            );
        }
        let decode = plan_with(&p, Some(&h200()), Some(Backend::CudaDecode)).unwrap();
        assert!(decode.first_kernel_pdl && !decode.one_wave_gemm1);
        assert!(!plan(&p, Some(&a100)).first_kernel_pdl);
        let ask = |caps: &DeviceCaps, want: bool| {
            let req = Request {
                first_kernel_pdl: Some(want),
                ..Request::default()
            };
            decide(&p, Some(caps), &req).unwrap()
        };
        let off = ask(&h200(), false);
        assert!(
            !off.first_kernel_pdl && off.pdl,
            "only the first kernel loses PDL"
        );
        assert!(off
            .reasons
            .iter()
            .any(|r| r.starts_with(&format!("override: ${FIRST_KERNEL_PDL_ENV}=off"))));
        let on_a100 = ask(&a100, true);
        assert!(!on_a100.first_kernel_pdl);
        assert!(on_a100
            .reasons
            .iter()
            .any(|r| r.ends_with("ignored, PDL needs sm_90")));
    }

    #[test]
    fn few_slots_run_swap_ab_on_hopper_and_decode_elsewhere() {
        // cuda_decode's range (M*topk <= 32): on Hopper the swap-AB kernels, which measured
        // faster there; forced, the decode kernels run with PDL
        let p = problem(4, 128, 8, 2048, 768, DType::BF16);
        let plan = plan(&p, Some(&h200()));
        assert_eq!(plan.backend, Backend::CudaWgmmaSwap);
        assert!(has(&plan, &["faster than cuda_decode in its range"]));
        let decode = plan_with(&p, Some(&h200()), Some(Backend::CudaDecode)).unwrap();
        assert_eq!(decode.backend, Backend::CudaDecode);
        assert!(decode.pdl);
        // where the swap-AB kernels cannot run (fp32), the heuristics' decode kernels, with
        // the bulk-copy kernels named as not picked
        let f32p = problem(4, 128, 8, 2048, 768, DType::F32);
        let plan = super::plan(&f32p, Some(&h200()));
        assert_eq!(plan.backend, Backend::CudaDecode);
        assert!(plan.pdl);
        assert!(has(&plan, &["cuda_wgmma_swap: rejected"]));
        // Forced (or from a table), the bulk-copy kernels run on a persistent grid.
        let bulk = plan_with(&p, Some(&h200()), Some(Backend::CudaBulkDecode)).unwrap();
        assert_eq!(bulk.ctas, 132);
        assert!(bulk.pdl);
        assert_eq!(
            bulk.kernels,
            vec![
                KernelId::BulkGemm1Act(DType::BF16),
                KernelId::BulkGemm2Sum(DType::BF16)
            ]
        );
        // Without a known Hopper device the SIMT decode kernels run (PDL from sm_90 on).
        let a100 = DeviceCaps {
            name: "A100".into(),
            capability: (8, 0),
            sm_count: 108,
        };
        let on_a100 = super::plan(&p, Some(&a100));
        assert_eq!(on_a100.backend, Backend::CudaDecode);
        assert!(!on_a100.pdl);
        assert_eq!(on_a100.ctas, 0);
        assert!(on_a100
            .reasons
            .iter()
            .any(|r| r.starts_with("cuda_bulk_decode: rejected") && r.contains("sm_90")));
        assert_eq!(
            on_a100.kernels,
            vec![
                KernelId::DecodeGemm1Act(DType::BF16, 8),
                KernelId::DecodeGemm2Sum(DType::BF16, 8)
            ]
        );
        assert_eq!(super::plan(&p, None).backend, Backend::CudaDecode);
    }

    #[test]
    fn router_placement_rules() {
        let h = h200();
        let placed = |m: i64, e: i64, b: Backend, allowed: bool| {
            let p = problem(m, e, 8, 2048, 768, DType::BF16);
            let mut plan = plan_with(&p, Some(&h), Some(b)).unwrap();
            let request = RouterRequest {
                fusion: allowed,
                ..RouterRequest::default()
            };
            place_router(&mut plan, p.m, p.global_experts, &softmax_top8(), request);
            plan
        };
        let has = |plan: &Plan, needle: &str| {
            plan.reasons
                .iter()
                .any(|r| r.starts_with("router:") && r.contains(needle))
        };
        // Asked to fuse ($SWAPMOE_ROUTER_FUSION=on): decode, M <= 8: GEMM1 routes; its
        // kernel becomes the routing twin.
        let d = placed(8, 128, Backend::CudaDecode, true);
        assert_eq!(d.router, RouterPlacement::InDecodeGemm1);
        assert_eq!(d.kernels[0], KernelId::DecodeGemm1Routed(DType::BF16, 8));
        assert_eq!(d.kernels.len(), 2);
        assert!(has(&d, "inside GEMM1"));
        // Decode, M = 9: one token per GEMM1 warp no longer holds.
        let d9 = placed(9, 128, Backend::CudaDecode, true);
        assert_eq!(d9.router, RouterPlacement::Separate(KernelId::RouteTopk(4)));
        assert_eq!(d9.kernels[0], KernelId::DecodeGemm1Act(DType::BF16, 8));
        assert!(has(&d9, "M = 9 > 8"));
        // Grouped GEMMs: the align kernel routes up to 16 tokens, one per warp.
        for b in [Backend::CudaMma, Backend::CudaGeneric] {
            let a = placed(16, 256, b, true);
            assert_eq!(a.router, RouterPlacement::InAlign);
            assert_eq!(a.kernels[0], KernelId::RouteAlignRouted);
            assert!(has(&a, "inside the align kernel"));
            let a129 = placed(17, 256, b, true);
            assert_eq!(
                a129.router,
                RouterPlacement::Separate(KernelId::RouteTopk(8))
            );
            assert_eq!(a129.kernels[0], KernelId::RouteAlign);
            assert!(has(&a129, "M = 17 > 16"));
        }
        // E > 256 does not fit the fused router: the wide router kernel runs first.
        let wide = placed(1, 512, Backend::CudaDecode, true);
        assert_eq!(
            wide.router,
            RouterPlacement::Separate(KernelId::RouteTopk(32))
        );
        assert!(has(&wide, "E = 512 > 256"));
        // Bulk-copy decode has no routing twin.
        let bulk = placed(1, 128, Backend::CudaBulkDecode, true);
        assert!(matches!(bulk.router, RouterPlacement::Separate(_)));
        assert!(has(
            &bulk,
            "cuda_bulk_decode plan has no kernel that routes"
        ));
        // Without $SWAPMOE_ROUTER_FUSION=on: the router kernel, which measured faster.
        for (m, b) in [
            (1, Backend::CudaDecode),
            (8, Backend::CudaMma),
            (64, Backend::CudaGeneric),
        ] {
            let default = placed(m, 128, b, false);
            assert_eq!(
                default.router,
                RouterPlacement::Separate(KernelId::RouteTopk(4))
            );
            assert!(has(&default, "measured faster"));
            assert!(!default.kernels.iter().any(|k| matches!(
                k,
                KernelId::RouteAlignRouted | KernelId::DecodeGemm1Routed(..)
            )));
        }
        // The CPU routes before the experts.
        let mut cpu = plan(&problem(1, 128, 8, 2048, 768, DType::BF16), None);
        cpu.backend = Backend::Cpu;
        cpu.kernels.clear();
        let fuse = RouterRequest {
            fusion: true,
            ..RouterRequest::default()
        };
        place_router(&mut cpu, 1, 128, &softmax_top8(), fuse);
        assert_eq!(cpu.router, RouterPlacement::NotRouting);
        // fused_experts' plans never route.
        assert_eq!(
            plan(&problem(1, 128, 8, 2048, 768, DType::BF16), Some(&h)).router,
            RouterPlacement::NotRouting
        );
        let kernel = |e: usize| router_kernel(e, &softmax_top8(), RouterKernelChoice::Auto).0;
        assert_eq!(kernel(128), KernelId::RouteTopk(4));
        assert_eq!(kernel(129), KernelId::RouteTopk(8));
        assert_eq!(kernel(256), KernelId::RouteTopk(8));
        assert_eq!(kernel(257), KernelId::RouteTopk(32));
    }

    fn softmax_top8() -> RouterConfig {
        RouterConfig {
            topk: 8,
            renormalize: true,
            scoring: Scoring::Softmax,
            groups: None,
            routed_scaling_factor: 1.0,
        }
    }

    #[test]
    fn grouped_sigmoid_routing_takes_the_cta_router() {
        let grouped = |scoring: Scoring, groups: usize| RouterConfig {
            topk: 8,
            renormalize: true,
            scoring,
            groups: Some((groups, 4.min(groups))),
            routed_scaling_factor: 2.5,
        };
        // DeepSeek-V3: 256 experts, 8 groups of 32, sigmoid.
        let auto = RouterKernelChoice::Auto;
        let (id, why) = router_kernel(256, &grouped(Scoring::Sigmoid, 8), auto);
        assert_eq!(id, KernelId::RouteGroupedCta);
        assert!(why.contains("8 groups of 32"), "{why}");
        // Groups of 8 and of 2 (power-of-two groups inside a warp), E not a multiple of 32.
        let kernel = |e: usize, cfg: RouterConfig| router_kernel(e, &cfg, auto).0;
        assert_eq!(
            kernel(64, grouped(Scoring::Sigmoid, 8)),
            KernelId::RouteGroupedCta
        );
        assert_eq!(
            kernel(48, grouped(Scoring::Sigmoid, 24)),
            KernelId::RouteGroupedCta
        );
        // Each rejection names its reason and falls back to the narrowest warp router.
        for (e, scoring, groups, lanes, needle) in [
            (256, Scoring::Softmax, 8, 8, "softmax"),
            (512, Scoring::Sigmoid, 8, 32, "E = 512 > 256"),
            (160, Scoring::Sigmoid, 8, 8, "groups of 20"),
            (128, Scoring::Sigmoid, 2, 4, "groups of 64"),
        ] {
            let (got, why) = router_kernel(e, &grouped(scoring, groups), auto);
            assert_eq!(got, KernelId::RouteTopk(lanes), "E = {e}: {why}");
            assert!(
                why.contains("not the grouped CTA router") && why.contains(needle),
                "{why}"
            );
        }
        // Ungrouped sigmoid (Llama-4 top-1) and a single group stay on the warp router.
        let mut top1 = grouped(Scoring::Sigmoid, 1);
        assert_eq!(kernel(128, top1.clone()), KernelId::RouteTopk(4));
        top1.groups = None;
        assert_eq!(kernel(16, top1), KernelId::RouteTopk(4));
        // $SWAPMOE_ROUTER_KERNEL=warp keeps the warp router.
        let deepseek = grouped(Scoring::Sigmoid, 8);
        let (id, why) = router_kernel(256, &deepseek, RouterKernelChoice::Warp);
        assert_eq!(id, KernelId::RouteTopk(8));
        assert!(why.contains("SWAPMOE_ROUTER_KERNEL=warp"), "{why}");
        // "cta" asks for what "auto" picks.
        let cta = RouterKernelChoice::Cta;
        assert_eq!(
            router_kernel(256, &deepseek, cta).0,
            KernelId::RouteGroupedCta
        );
        // "cta" cannot route what the CTA router does not hold.
        let (id, why) = router_kernel(512, &grouped(Scoring::Sigmoid, 8), cta);
        assert_eq!(id, KernelId::RouteTopk(32));
        assert!(why.contains("E = 512 > 256"), "{why}");
        // Inside fused_moe past M = 16 the CTA router starts without PDL (measured), unless
        // $SWAPMOE_FIRST_KERNEL_PDL says otherwise; the warp router keeps it.
        let placed_at = |m: i64, request: RouterRequest| {
            let p = problem(m, 256, 8, 7168, 256, DType::BF16);
            let mut plan = plan_with(&p, Some(&h200()), Some(Backend::CudaWgmma)).unwrap();
            place_router(&mut plan, p.m, 256, &deepseek, request);
            plan
        };
        for (m, request, pdl) in [
            (16, RouterRequest::default(), true),
            (17, RouterRequest::default(), false),
            (64, RouterRequest::default(), false),
            (
                64,
                RouterRequest {
                    first_kernel_pdl: Some(true),
                    ..RouterRequest::default()
                },
                true,
            ),
            (
                64,
                RouterRequest {
                    kernel: RouterKernelChoice::Warp,
                    ..RouterRequest::default()
                },
                true,
            ),
        ] {
            let plan = placed_at(m, request);
            assert_eq!(plan.first_kernel_pdl, pdl, "M = {m} {request:?}");
            assert_eq!(
                plan.reasons
                    .iter()
                    .any(|r| r.starts_with("router: launched without PDL")),
                !pdl
            );
        }
        // Where the swap-AB experts' one-wave rule starts fused_experts' GEMM1 without PDL,
        // fused_moe's router (either kernel) still starts with PDL, unless overridden.
        let swap_placed = |m: i64, e: i64, request: RouterRequest, cfg: &RouterConfig| {
            let p = problem(m, e, 8, 7168, 256, DType::BF16);
            let mut plan = plan_with(&p, Some(&h200()), Some(Backend::CudaWgmmaSwap)).unwrap();
            let experts_alone = plan.first_kernel_pdl;
            place_router(&mut plan, p.m, e as usize, cfg, request);
            (experts_alone, plan)
        };
        let softmax = RouterConfig {
            groups: None,
            scoring: Scoring::Softmax,
            ..deepseek.clone()
        };
        for (m, e, cfg) in [(1, 256, &deepseek), (8, 256, &deepseek), (1, 128, &softmax)] {
            let (alone, plan) = swap_placed(m, e, RouterRequest::default(), cfg);
            assert!(!alone, "M = {m}: fused_experts' GEMM1 fits one wave");
            assert!(
                plan.one_wave_gemm1 && plan.first_kernel_pdl,
                "M = {m} E = {e}"
            );
            assert!(plan
                .reasons
                .iter()
                .any(|r| r.starts_with("router: launched with PDL although")));
            let off = RouterRequest {
                first_kernel_pdl: Some(false),
                ..RouterRequest::default()
            };
            let (_, plan) = swap_placed(m, e, off, cfg);
            assert!(!plan.first_kernel_pdl);
            assert!(!plan
                .reasons
                .iter()
                .any(|r| r.starts_with("router: launched with PDL although")));
        }
        // The plan records the kernel and its reason.
        let mut plan = plan(&problem(1, 256, 8, 7168, 256, DType::BF16), Some(&h200()));
        place_router(
            &mut plan,
            1,
            256,
            &grouped(Scoring::Sigmoid, 8),
            RouterRequest::default(),
        );
        assert_eq!(
            plan.router,
            RouterPlacement::Separate(KernelId::RouteGroupedCta)
        );
        assert!(plan
            .reasons
            .iter()
            .any(|r| r.starts_with("router: swapmoe_route_grouped_cta: grouped sigmoid")));
    }

    #[test]
    fn bulk_decode_rejections() {
        let h = h200();
        let why = |p: &MoeProblem| {
            Candidates::new(p, Some(&h), true)
                .eligible(Backend::CudaBulkDecode)
                .unwrap_err()
                .why
        };
        assert!(why(&problem(4, 128, 8, 2048, 768, DType::F32)).contains("float32"));
        assert!(why(&problem(4, 128, 8, 2044, 768, DType::BF16)).contains("multiples of 8"));
        assert!(why(&problem(4, 128, 8, 2048, 764, DType::BF16)).contains("multiples of 8"));
        assert!(why(&problem(9, 128, 8, 2048, 768, DType::BF16)).contains("64 slots"));
        assert!(
            Candidates::new(&problem(8, 128, 8, 2048, 768, DType::F16), Some(&h), true)
                .eligible(Backend::CudaBulkDecode)
                .is_ok()
        );
        // Forcing it where it cannot run names the reason.
        let err = plan_with(
            &problem(4, 128, 8, 2048, 768, DType::F32),
            Some(&h),
            Some(Backend::CudaBulkDecode),
        )
        .unwrap_err();
        assert!(matches!(err, Error::DType(ref m) if m.contains("cuda_bulk_decode")));
        let fp32 = plan(&problem(2, 128, 8, 2048, 768, DType::F32), Some(&h));
        assert_eq!(fp32.backend, Backend::CudaDecode);
    }

    /// A forced backend that cannot run the call raises the error of the input it is about
    /// (issue 5: a K or N tail the layout cannot take is a `ShapeError` naming the multiple),
    /// and every rejection reason of `Candidates::eligible` reads as it should.
    #[test]
    fn forced_backend_errors_by_kind() {
        let h = h200();
        // the error's kind (its variant) and a piece of its message
        let expect = |e: Error, kind: &str, needle: &str| {
            let got = match &e {
                Error::Shape(_) => "Shape",
                Error::DType(_) => "DType",
                Error::Device(_) => "Device",
                Error::Argument(_) => "Argument",
                Error::Cuda(_) => "Cuda",
                Error::Memory(_) => "Memory",
            };
            assert_eq!(got, kind, "{e}");
            assert!(e.to_string().contains(needle), "{e}");
        };
        let a100 = DeviceCaps {
            name: "NVIDIA A100-SXM4-80GB".into(),
            capability: (8, 0),
            sm_count: 108,
        };
        let forced_err = |p: &MoeProblem, caps: &DeviceCaps, b: Backend| {
            plan_with(p, Some(caps), Some(b)).unwrap_err()
        };
        let shape_err = |e: Error, what: &str| expect(e, "Shape", what);
        // K and N tails: every TMA/bulk/mma backend names the multiple of 8
        for b in [
            Backend::CudaWgmmaSwap,
            Backend::CudaWgmma,
            Backend::CudaMma,
            Backend::CudaBulkDecode,
        ] {
            for (k, n) in [(2050, 768), (2048, 770)] {
                let e = forced_err(&problem(1, 128, 8, k, n, DType::BF16), &h, b);
                shape_err(e, "multiples of 8 elements");
            }
        }
        // the slot and token limits
        shape_err(
            forced_err(
                &problem(65, 128, 8, 2048, 768, DType::BF16),
                &h,
                Backend::CudaWgmmaSwap,
            ),
            "at most M = 64 tokens",
        );
        shape_err(
            forced_err(
                &problem(4096, 128, 8, 2048, 768, DType::BF16),
                &h,
                Backend::CudaDecode,
            ),
            "slots",
        );
        // dtypes
        for b in [Backend::CudaWgmmaSwap, Backend::CudaWgmma, Backend::CudaMma] {
            expect(
                forced_err(&problem(4, 128, 8, 2048, 768, DType::F32), &h, b),
                "DType",
                "needs bfloat16 or float16, got float32",
            );
        }
        // devices: Hopper kernels on an A100, CUDA backends on CPU tensors and the CPU backend
        // on CUDA tensors
        expect(
            forced_err(
                &problem(4, 128, 8, 2048, 768, DType::BF16),
                &a100,
                Backend::CudaWgmma,
            ),
            "Device",
            "needs an sm_90 (Hopper) device",
        );
        expect(
            forced_err(
                &problem(4, 128, 8, 2048, 768, DType::BF16),
                &h,
                Backend::Cpu,
            ),
            "Device",
            "it needs CPU tensors",
        );
        let cpu = problem_on(Device::Cpu, 4, 8, 2, 256, 128, DType::BF16);
        expect(
            forced_err(&cpu, &h, Backend::CudaGeneric),
            "Device",
            "it needs CUDA tensors",
        );
        // FP8: a backend without e4m3 kernels (the quantization argument), tails, the block
        // scales' N, and the 16-bit outputs the e4m3 kernels write
        let fp8 = |n: i64, dtype: DType, scheme: QuantScheme, b: Backend| {
            let req = Request {
                backend: Some(b),
                ..Request::default()
            };
            whole_model_plan(4, 128, 8, 2048, n, dtype, Some(scheme), &h, &req).unwrap_err()
        };
        let tensor = QuantScheme::Tensor;
        for b in [Backend::CudaMma, Backend::CudaBulkDecode] {
            expect(
                fp8(768, DType::BF16, tensor, b),
                "Argument",
                "it has no FP8 kernels in this build",
            );
        }
        expect(
            fp8(770, DType::BF16, tensor, Backend::CudaWgmmaSwap),
            "Shape",
            "multiples of 16 e4m3",
        );
        expect(
            fp8(192, DType::BF16, QuantScheme::Block, Backend::CudaWgmma),
            "Shape",
            "N must be a multiple of 128, got N = 192",
        );
        expect(
            fp8(768, DType::F32, tensor, Backend::CudaWgmmaSwap),
            "DType",
            "write bfloat16 or float16 outputs, got float32",
        );
    }

    /// The plan of qwen3-30b-a3b bf16 at M tokens for `req`.
    fn qwen3_bf16(m: i64, caps: &DeviceCaps, req: &Request) -> Result<Plan> {
        whole_model_plan(m, 128, 8, 2048, 768, DType::BF16, None, caps, req)
    }

    /// The heuristics' plan (no table, no override) for qwen3-30b-a3b bf16 at M tokens.
    fn qwen3_bf16_heuristic(m: i64, caps: &DeviceCaps) -> Plan {
        qwen3_bf16(m, caps, &Request::default()).unwrap()
    }

    /// Every candidate, swapmoe's and the external ones, has a reason in a plan, whatever
    /// decided it (issue 6: "why each candidate was taken or rejected").
    #[test]
    fn every_candidate_has_a_reason() {
        let h = h200();
        let said = |plan: &Plan, name: &str| -> Vec<String> {
            plan.reasons
                .iter()
                .filter(|r| r.starts_with(&format!("{name}:")))
                .cloned()
                .collect()
        };
        let names = || {
            Backend::ALL
                .iter()
                .map(|b| b.name())
                .chain(["vllm_triton", "flashinfer_cutlass"])
        };
        for m in [1, 8, 64, 4096] {
            let heuristic = qwen3_bf16_heuristic(m, &h);
            let forced = plan_with(
                &problem(m, 128, 8, 2048, 768, DType::BF16),
                Some(&h),
                Some(Backend::CudaGeneric),
            )
            .unwrap();
            for p in [&heuristic, &forced] {
                for name in names() {
                    assert!(!said(p, name).is_empty(), "M={m} {name}: {:?}", p.reasons);
                }
            }
            assert_eq!(
                said(&heuristic, "cpu"),
                ["cpu: rejected, it needs CPU tensors"]
            );
            assert_eq!(
                said(&forced, "cuda_wgmma"),
                ["cuda_wgmma: not picked, cuda_generic is forced"]
            );
        }
        let p = qwen3_bf16_heuristic(1, &h);
        assert_eq!(p.backend, Backend::CudaWgmmaSwap);
        assert_eq!(
            said(&p, "cuda_mma"),
            ["cuda_mma: not picked, the heuristics take cuda_wgmma_swap first here (a tuned table or backend= can pick it)"]
        );
        // a plan whose reasons are not wanted collects none
        let one = problem(1, 128, 8, 2048, 768, DType::BF16);
        let mut quiet = Candidates::new(&one, Some(&h), false);
        quiet.account_for_the_rest(Backend::CudaWgmmaSwap, Source::Heuristic, None, false, &[]);
        assert!(quiet.reasons.is_empty());
    }

    /// An external backend can be forced only by a caller that runs it (issue 6: the override
    /// comes first, external candidates included); the op refuses the name.
    #[test]
    fn an_external_backend_is_forced_only_where_the_caller_runs_it() {
        let _knobs = ENV_KNOBS.write().unwrap_or_else(|e| e.into_inner());
        let h = h200();
        let ask = |external: &[ExternalBackend]| {
            let req = Request {
                forced_external: Some(ExternalBackend::VllmTriton),
                external,
                ..Request::default()
            };
            qwen3_bf16(8, &h, &req)
        };
        let p = ask(&[ExternalBackend::VllmTriton]).unwrap();
        assert_eq!(p.external, Some(ExternalBackend::VllmTriton));
        assert_eq!(p.source, Source::Override);
        assert_eq!(p.backend, Backend::CudaWgmmaSwap); // the heuristics' fallback
        assert!(p
            .reasons
            .iter()
            .any(|r| r.starts_with("override: vllm_triton forced")));
        match ask(&[]) {
            Err(Error::Argument(m)) => assert!(
                m.contains(
                    "vllm_triton runs outside swapmoe: forcing it needs it in external_backends"
                ),
                "{m}"
            ),
            other => panic!("expected an argument error, got {other:?}"),
        }
        // parsing: the argument names either kind; the op's parse refuses an external name
        std::env::remove_var(BACKEND_ENV);
        assert_eq!(
            forced_choice(Some("flashinfer_cutlass")).unwrap(),
            Some(Forced::External(ExternalBackend::FlashinferCutlass))
        );
        assert_eq!(
            forced_choice(Some("cuda_mma")).unwrap(),
            Some(Forced::Swapmoe(Backend::CudaMma))
        );
        match forced_backend(Some("vllm_triton")) {
            Err(Error::Argument(m)) => assert!(
                m.starts_with("backend: vllm_triton runs outside swapmoe"),
                "{m}"
            ),
            other => panic!("expected an argument error, got {other:?}"),
        }
        match forced_choice(Some("fastest")) {
            Err(Error::Argument(m)) => assert!(
                m.contains("vllm_triton") && m.contains("\"fastest\""),
                "{m}"
            ),
            other => panic!("expected an argument error, got {other:?}"),
        }
        std::env::set_var(BACKEND_ENV, "vllm_triton");
        let env = forced_backend(None);
        std::env::remove_var(BACKEND_ENV);
        match env {
            Err(Error::Argument(m)) => assert!(
                m.starts_with("SWAPMOE_BACKEND: vllm_triton runs outside"),
                "{m}"
            ),
            other => panic!("expected an argument error, got {other:?}"),
        }
    }

    #[test]
    fn offline_questions() {
        let h200 = offline_caps(Some("NVIDIA H200"), None, None).unwrap();
        assert_eq!((h200.capability, h200.sm_count), ((9, 0), 132));
        assert!(offline_caps(Some("Some GPU"), None, None).is_err());
        let custom = offline_caps(Some("Some GPU"), Some((8, 6)), Some(84)).unwrap();
        assert_eq!(custom.sm_count, 84);
        let p = qwen3_bf16_heuristic(1, &h200);
        assert_eq!(p.backend, Backend::CudaWgmmaSwap);
        assert!(p.pdl);
        let p = whole_model_plan(
            4096,
            8,
            2,
            4096,
            14336,
            DType::BF16,
            None,
            &h200,
            &Request::default(),
        )
        .unwrap();
        assert_eq!((p.backend, p.tokens_per_pass), (Backend::CudaWgmma, 128));
        let p = whole_model_plan(
            64,
            8,
            2,
            4096,
            14336,
            DType::F32,
            None,
            &h200,
            &Request::default(),
        )
        .unwrap();
        assert_eq!(p.backend, Backend::CudaGeneric);
        let forced = whole_model_plan(
            64,
            8,
            2,
            4096,
            14336,
            DType::BF16,
            None,
            &h200,
            &Request {
                backend: Some(Backend::CudaGeneric),
                ..Request::default()
            },
        )
        .unwrap();
        assert!(forced.reasons.iter().any(|r| r.starts_with("override:")));
        assert!(whole_model_plan(
            1,
            8,
            9,
            64,
            64,
            DType::BF16,
            None,
            &h200,
            &Request::default()
        )
        .is_err());
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
        let plan = plan(&p, None); // (an H200 takes cuda_wgmma here)
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
            matches!(err, Error::Shape(ref m) if m.contains("cuda_decode") && m.contains("512"))
        );
        assert!(plan_with(&p, None, Some(Backend::Cpu)).is_err());
        let forced = plan_with(&p, None, Some(Backend::CudaGeneric)).unwrap();
        assert_eq!(forced.backend, Backend::CudaGeneric);
        assert!(forced.reasons.iter().any(|r| r.starts_with("override:")));
        assert_eq!(Backend::parse("cuda_mma"), Some(Backend::CudaMma));
        assert_eq!(Backend::parse("nope"), None);
    }

    // ---- tuned tables -----------------------------------------------------------------

    use crate::tables::{Origin, Table};

    /// A table set holding one table for (E, N) on `device` (bf16), parsed from `json`.
    fn tables_with(e: usize, n: usize, device: &str, json: &str) -> TableSet {
        let file = tables::file_name(e, n, device, DType::BF16, Quant::None);
        let t = Table::parse(json, &file, Path::new(&file), Origin::Shipped).unwrap();
        let mut set = TableSet::default();
        set.insert(&file, Loaded::Ok(std::sync::Arc::new(t)));
        set
    }

    fn ask(p: &MoeProblem, caps: &DeviceCaps, set: &TableSet, req: Request) -> Plan {
        decide(
            p,
            Some(caps),
            &Request {
                tables: Some(set),
                ..req
            },
        )
        .unwrap()
    }

    fn has(plan: &Plan, needles: &[&str]) -> bool {
        plan.reasons
            .iter()
            .any(|r| needles.iter().all(|n| r.contains(n)))
    }

    use std::path::Path;

    #[test]
    fn table_entry_beats_the_heuristic_and_sets_the_tile() {
        // mixtral-like M=1: the heuristic says swap-AB, the table generic
        let set = tables_with(
            8,
            1024,
            "NVIDIA H200",
            r#"{"1": {"backend": "cuda_generic"}, "1024": {"backend": "cuda_mma", "token_tile": 16}}"#,
        );
        let p = problem(1, 8, 2, 512, 1024, DType::BF16);
        assert_eq!(plan(&p, Some(&h200())).backend, Backend::CudaWgmmaSwap);
        let t = ask(&p, &h200(), &set, Request::default());
        assert_eq!((t.backend, t.source), (Backend::CudaGeneric, Source::Table));
        let used = t.table.as_ref().unwrap();
        assert!(used.used && used.m == 1 && used.file.starts_with("E=8,N=1024,"));
        assert!(has(&t, &["table:", "entry M=1"]));
        // the tile comes from the table, not from the heuristic (which says 128 here)
        let p = problem(1024, 8, 2, 512, 1024, DType::BF16);
        assert_eq!(plan(&p, Some(&h200())).tokens_per_pass, 128);
        let t = ask(&p, &h200(), &set, Request::default());
        assert_eq!((t.backend, t.tokens_per_pass), (Backend::CudaMma, 16));
        assert_eq!(t.kernels[1], KernelId::MmaGemm1Act(DType::BF16, 16));
        assert_eq!(t.kernels[2], KernelId::MmaGemm2(DType::BF16, 16));
        // a table for another device, dtype or shape is not used
        let a100 = offline_caps(Some("NVIDIA A100-SXM4-80GB"), None, None).unwrap();
        let t = ask(&p, &a100, &set, Request::default());
        assert_eq!(t.source, Source::Heuristic);
        assert!(has(
            &t,
            &["table: none named E=8,N=1024,device_name=NVIDIA_A100-SXM4-80GB"]
        ));
        let p16 = problem(1024, 8, 2, 512, 1024, DType::F16);
        assert_eq!(
            ask(&p16, &h200(), &set, Request::default()).source,
            Source::Heuristic
        );
    }

    #[test]
    fn table_swap_launch_sets_the_ring_and_gemm2_pdl_unless_overridden() {
        let _knobs = ENV_KNOBS.write().unwrap_or_else(|e| e.into_inner());
        // qwen3-30b-a3b: M = 8 measured fastest with a ring of 2 and GEMM2 after GEMM1; M = 16
        // as the rules say; M = 32 on vllm_triton, with the swap variant the fastest swapmoe label
        let set = tables_with(
            128,
            768,
            "NVIDIA H200",
            r#"{"8": {"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 2, "swap_gemm2_pdl": false},
                "16": {"backend": "cuda_wgmma_swap"},
                "32": {"backend": "vllm_triton", "times_us": {"vllm_triton": 250, "cuda_wgmma_swap:r3p1": 260, "cuda_mma:t16": 270}}}"#,
        );
        let q = |m: i64| problem(m, 128, 8, 2048, 768, DType::BF16);
        let t = ask(&q(8), &h200(), &set, Request::default());
        assert_eq!(
            (t.backend, t.source),
            (Backend::CudaWgmmaSwap, Source::Table)
        );
        assert_eq!(
            (t.swap_gemm1_ring, t.swap_gemm2_pdl),
            (2, false),
            "{:?}",
            t.reasons
        );
        assert!(has(
            &t,
            &["gemm1: a ring of 2 stages", "as the table measured"]
        ));
        assert!(has(
            &t,
            &["gemm2: starts after GEMM1 has finished (no PDL), as the table measured"]
        ));
        // the quiet plan of a launch makes the same choice
        let quiet = ask(
            &q(8),
            &h200(),
            &set,
            Request {
                quiet: true,
                ..Request::default()
            },
        );
        assert_eq!((quiet.swap_gemm1_ring, quiet.swap_gemm2_pdl), (2, false));
        // without the fields: the rules (its own ring at M = 16, GEMM2 by PDL)
        let t = ask(&q(16), &h200(), &set, Request::default());
        assert_eq!((t.swap_gemm1_ring, t.swap_gemm2_pdl), (0, true));
        // the fastest swapmoe label of times_us carries its launch when vLLM's is not allowed
        let t = ask(&q(32), &h200(), &set, Request::default());
        assert_eq!(t.backend, Backend::CudaWgmmaSwap);
        assert_eq!(
            (t.swap_gemm1_ring, t.swap_gemm2_pdl),
            (3, true),
            "{:?}",
            t.reasons
        );
        // the environment beats the table
        std::env::set_var(SWAP_GEMM1_RING_ENV, "0");
        std::env::set_var(SWAP_GEMM2_PDL_ENV, "1");
        let t = ask(&q(8), &h200(), &set, Request::default());
        assert_eq!((t.swap_gemm1_ring, t.swap_gemm2_pdl), (0, true));
        std::env::remove_var(SWAP_GEMM1_RING_ENV);
        std::env::remove_var(SWAP_GEMM2_PDL_ENV);
        // a ring the kernel cannot hold falls back to its own, with the reason
        let big = tables_with(
            128,
            768,
            "NVIDIA H200",
            r#"{"8": {"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 40, "swap_gemm2_pdl": true}}"#,
        );
        let t = ask(&q(8), &h200(), &big, Request::default());
        assert_eq!(t.swap_gemm1_ring, 0);
        assert!(has(&t, &["the table's ring of 40 stages does not fit"]));
    }

    #[test]
    fn table_lookup_nearest_m_ties_and_range() {
        let set = tables_with(
            16,
            512,
            "NVIDIA H200",
            r#"{"16": {"backend": "cuda_generic"}, "32": {"backend": "cuda_mma", "token_tile": 64}}"#,
        );
        let at = |m| {
            let p = problem(m, 16, 2, 256, 512, DType::BF16);
            ask(&p, &h200(), &set, Request::default())
        };
        assert_eq!(at(24).backend, Backend::CudaGeneric); // tie: the smaller M
        assert_eq!(at(25).backend, Backend::CudaMma);
        assert_eq!(at(8).backend, Backend::CudaGeneric); // 16 covers 8..32
        let far = at(200); // neither 16 nor 32 is within 2x
        assert_eq!(far.source, Source::Heuristic);
        assert!(has(
            &far,
            &["no entry within 2x of M=200", "nearest is M=32"]
        ));
        assert_eq!(far.table.as_ref().map(|t| (t.m, t.used)), Some((32, false)));
    }

    #[test]
    fn overrides_beat_tables() {
        let set = tables_with(
            24,
            512,
            "NVIDIA H200",
            r#"{"64": {"backend": "cuda_mma", "token_tile": 128}}"#,
        );
        let p = problem(64, 24, 2, 256, 512, DType::BF16);
        let forced = ask(
            &p,
            &h200(),
            &set,
            Request {
                backend: Some(Backend::CudaGeneric),
                ..Request::default()
            },
        );
        assert_eq!(
            (forced.backend, forced.source),
            (Backend::CudaGeneric, Source::Override)
        );
        assert!(forced.table.is_none());
        let tiled = ask(
            &p,
            &h200(),
            &set,
            Request {
                mma_token_tile: Some(64),
                ..Request::default()
            },
        );
        assert_eq!(
            (tiled.backend, tiled.tokens_per_pass),
            (Backend::CudaMma, 64)
        );
        assert_eq!(tiled.source, Source::Override);
        assert!(has(&tiled, &["token tile 64 forced"]));
        // a tile override with a backend that is not cuda_mma changes nothing
        let p1 = problem(1, 24, 2, 256, 512, DType::BF16);
        let d = ask(
            &p1,
            &h200(),
            &TableSet::default(),
            Request {
                mma_token_tile: Some(64),
                ..Request::default()
            },
        );
        assert_eq!(
            (d.backend, d.source),
            (Backend::CudaWgmmaSwap, Source::Heuristic)
        );
        assert!(has(&d, &["ignored", "cuda_wgmma_swap"]));
        let bad_tile = decide(
            &p,
            Some(&h200()),
            &Request {
                mma_token_tile: Some(32),
                ..Request::default()
            },
        );
        assert!(matches!(bad_tile, Err(Error::Argument(m)) if m.contains("32")));
    }

    #[test]
    fn table_entries_that_cannot_run_are_rejected_with_a_reason() {
        let json = r#"{"1": {"backend": "cpu"},
                       "4": {"backend": "cuda_mma", "token_tile": 32},
                       "16": {"backend": "cuda_tcgen05"},
                       "64": {"backend": "cuda_wgmma", "token_tile": 16},
                       "128": {"backend": "cuda_decode"},
                       "1024": {"backend": "cuda_mma", "token_tile": 64},
                       "4096": {"backend": "cuda_wgmma", "token_tile": 64}}"#;
        let set = tables_with(40, 512, "NVIDIA H200", json);
        let case = |m: i64, dtype: DType, caps: &DeviceCaps, set: &TableSet| {
            let p = problem(m, 40, 8, 256, 512, dtype);
            ask(&p, caps, set, Request::default())
        };
        for (m, dtype, needle) in [
            (1, DType::BF16, "it needs CPU tensors"),
            (
                4,
                DType::BF16,
                "no cuda_mma kernels are built for token tile 32",
            ),
            (16, DType::BF16, "no backend \"cuda_tcgen05\""),
            (
                64,
                DType::BF16,
                "no cuda_wgmma kernels are built for token tile 16",
            ),
            (128, DType::BF16, "at most M*topk = 512 slots, got 1024"),
        ] {
            let t = case(m, dtype, &h200(), &set);
            assert_eq!(t.source, Source::Heuristic, "M={m}");
            assert!(
                has(&t, &["table: rejected", needle]),
                "M={m}: {:?}",
                t.reasons
            );
            assert!(t.table.as_ref().is_some_and(|u| !u.used));
        }
        // mma eligibility: float32 (a float32 table of the same shape)
        let f32_file = tables::file_name(40, 512, "NVIDIA H200", DType::F32, Quant::None);
        let t = Table::parse(json, &f32_file, Path::new(&f32_file), Origin::User).unwrap();
        let mut f32_set = TableSet::default();
        f32_set.insert(&f32_file, Loaded::Ok(std::sync::Arc::new(t)));
        let t = case(1024, DType::F32, &h200(), &f32_set);
        assert_eq!(
            (t.backend, t.source),
            (Backend::CudaGeneric, Source::Heuristic)
        );
        assert!(has(&t, &["table: rejected", "float32"]));
        // a wgmma entry: its tile on Hopper; rejected (sm_90 only) on an Ampere table of the
        // same name
        let t = case(4096, DType::BF16, &h200(), &set);
        assert_eq!(
            (t.backend, t.source, t.tokens_per_pass),
            (Backend::CudaWgmma, Source::Table, 64)
        );
        let ampere = offline_caps(Some("NVIDIA H200"), Some((8, 0)), None).unwrap();
        let t = case(4096, DType::BF16, &ampere, &set);
        assert!(has(&t, &["table: rejected", "sm_90"]));
        assert_eq!(t.backend, Backend::CudaMma);
        // sm_75: no embedded kernel image
        let turing = offline_caps(Some("NVIDIA H200"), Some((7, 5)), None).unwrap();
        let t = case(1024, DType::BF16, &turing, &set);
        assert!(has(&t, &["table: rejected", "sm_80 and sm_90a", "sm_75"]));
    }

    #[test]
    fn decode_from_a_table_uses_pdl_only_on_sm90() {
        let json = r#"{"2": {"backend": "cuda_decode"}}"#;
        let p = problem(2, 48, 8, 256, 512, DType::BF16);
        let h = ask(
            &p,
            &h200(),
            &tables_with(48, 512, "NVIDIA H200", json),
            Request::default(),
        );
        let a100 = offline_caps(Some("NVIDIA A100-SXM4-80GB"), None, None).unwrap();
        let a = ask(
            &p,
            &a100,
            &tables_with(48, 512, "NVIDIA A100-SXM4-80GB", json),
            Request::default(),
        );
        assert_eq!(
            (h.backend, h.source, h.pdl),
            (Backend::CudaDecode, Source::Table, true)
        );
        assert_eq!(
            (a.backend, a.source, a.pdl),
            (Backend::CudaDecode, Source::Table, false)
        );
    }

    #[test]
    fn external_backends_only_when_the_caller_allows_them() {
        let set = tables_with(
            56,
            512,
            "NVIDIA H200",
            r#"{"64": {"backend": "vllm_triton",
                       "times_us": {"vllm_triton": 90, "cuda_decode": 95, "cuda_mma:t64": 100, "cuda_mma:t16": 110}},
                "1024": {"backend": "flashinfer_cutlass", "times_us": {"flashinfer_cutlass": 50}}}"#,
        );
        // M=64, topk 8: 512 slots, decode can run; outside vLLM the best swapmoe time wins
        let p = problem(64, 56, 8, 256, 512, DType::BF16);
        let t = ask(&p, &h200(), &set, Request::default());
        assert_eq!(
            (t.backend, t.source, t.external),
            (Backend::CudaDecode, Source::Table, None)
        );
        assert!(has(
            &t,
            &["vllm_triton is a candidate only", "external_backends"]
        ));
        // M=96: 768 slots, decode cannot run: the next swapmoe time, with its tile
        let p = problem(96, 56, 8, 256, 512, DType::BF16);
        let t = ask(&p, &h200(), &set, Request::default());
        assert_eq!((t.backend, t.tokens_per_pass), (Backend::CudaMma, 64));
        assert!(has(&t, &["skipped cuda_decode", "512"]));
        // inside vLLM: the external backend, with swapmoe's fallback beside it
        let vllm = [ExternalBackend::VllmTriton];
        let t = ask(
            &p,
            &h200(),
            &set,
            Request {
                external: &vllm,
                ..Request::default()
            },
        );
        assert_eq!(t.external, Some(ExternalBackend::VllmTriton));
        assert_eq!((t.source, t.backend), (Source::Table, Backend::CudaMma));
        assert!(t
            .to_string()
            .contains("backend=vllm_triton, fallback=cuda_mma"));
        // not allowed and no swapmoe time: the heuristics
        let p = problem(1024, 56, 8, 256, 512, DType::BF16);
        let t = ask(
            &p,
            &h200(),
            &set,
            Request {
                external: &vllm, // vllm_triton allowed, flashinfer_cutlass not
                ..Request::default()
            },
        );
        // ... and no measured range of swapmoe's at M = 1024: vLLM's Triton, the heuristics'
        // pick as the fallback
        assert_eq!(
            (t.source, t.external),
            (Source::Heuristic, Some(ExternalBackend::VllmTriton))
        );
        assert!(has(&t, &["flashinfer_cutlass is a candidate only"]));
        assert!(has(&t, &["no swapmoe time"]));
        assert!(has(&t, &["only up to M = 1", "vLLM's Triton runs it"]));
    }

    #[test]
    fn malformed_and_missing_tables_fall_back_with_a_reason_logged_once() {
        let file = tables::file_name(72, 512, "NVIDIA H200", DType::BF16, Quant::None);
        let mut set = TableSet::default();
        set.insert(
            &file,
            Loaded::Bad {
                path: "/tables/bad.json".into(),
                origin: Origin::User,
                error: "not valid JSON (EOF)".into(),
            },
        );
        let p = problem(64, 72, 8, 256, 512, DType::BF16);
        let first = ask(&p, &h200(), &set, Request::default());
        assert_eq!(
            (first.backend, first.source),
            (Backend::CudaWgmma, Source::Heuristic)
        );
        assert!(has(
            &first,
            &["/tables/bad.json ignored, it is malformed", "EOF"]
        ));
        let note = first.log.expect("the first fallback is logged");
        assert!(note.warning && note.message.contains("malformed"));
        let again = ask(
            &problem(8, 72, 8, 256, 512, DType::BF16),
            &h200(),
            &set,
            Request::default(),
        );
        assert!(again.log.is_none(), "logged once per table key");
        // no table: an info note, once
        let p = problem(64, 80, 8, 256, 512, DType::BF16);
        let t = ask(&p, &h200(), &TableSet::default(), Request::default());
        assert!(has(&t, &["table: none named E=80,N=512"]));
        assert!(t.log.as_ref().is_some_and(|n| !n.warning));
        assert!(ask(&p, &h200(), &TableSet::default(), Request::default())
            .log
            .is_none());
        // an empty table
        let set = tables_with(88, 512, "NVIDIA H200", r#"{"metadata": {"K": 256}}"#);
        let p = problem(64, 88, 8, 256, 512, DType::BF16);
        assert!(has(
            &ask(&p, &h200(), &set, Request::default()),
            &["no M entries"]
        ));
    }

    #[test]
    fn tables_can_be_turned_off() {
        let off = TableSet::disabled();
        let p = problem(1, 104, 8, 256, 512, DType::BF16);
        let t = ask(&p, &h200(), &off, Request::default());
        assert_eq!((t.source, t.log.is_none()), (Source::Heuristic, true));
        assert!(has(&t, &["tables are off"]));
    }

    #[test]
    fn tables_measured_with_another_k_or_topk_are_used_and_say_so() {
        let set = tables_with(
            96,
            512,
            "NVIDIA H200",
            r#"{"metadata": {"E": 96, "N": 512, "K": 4096, "topk": 2}, "8": {"backend": "cuda_generic"}}"#,
        );
        let p = problem(8, 96, 8, 256, 512, DType::BF16);
        let t = ask(&p, &h200(), &set, Request::default());
        assert_eq!((t.backend, t.source), (Backend::CudaGeneric, Source::Table));
        assert!(has(
            &t,
            &["measured with K=4096 (this call K=256), topk=2 (this call topk=8)"]
        ));
    }

    #[test]
    fn a_table_named_with_the_calls_k_comes_before_the_e_n_table() {
        // the (E, N) table, measured at K = 4096, and one named K = 256
        let mut set = tables_with(
            96,
            512,
            "NVIDIA H200",
            r#"{"metadata": {"K": 4096}, "8": {"backend": "cuda_generic"}}"#,
        );
        let file =
            tables::file_name_for_hidden(96, 512, 256, "NVIDIA H200", DType::BF16, Quant::None);
        assert_eq!(
            file,
            "E=96,N=512,K=256,device_name=NVIDIA_H200,dtype=bf16.json"
        );
        let json = r#"{"metadata": {"K": 256}, "8": {"backend": "cuda_decode"}}"#;
        let t = Table::parse(json, &file, Path::new(&file), Origin::Shipped).unwrap();
        set.insert(&file, Loaded::Ok(std::sync::Arc::new(t)));
        let at = |k| {
            ask(
                &problem(8, 96, 8, k, 512, DType::BF16),
                &h200(),
                &set,
                Request::default(),
            )
        };
        let t = at(256);
        assert_eq!((t.backend, t.source), (Backend::CudaDecode, Source::Table));
        assert_eq!(
            t.table.as_ref().map(|u| u.file.as_str()),
            Some(file.as_str())
        );
        assert!(!has(&t, &["measured with K="]));
        // another K reads the (E, N) table and says a K-named one would come first
        let t = at(1024);
        assert_eq!((t.backend, t.source), (Backend::CudaGeneric, Source::Table));
        assert!(has(
            &t,
            &["measured with K=4096 (this call K=1024); used all the same (this (E, N) table stands for every K, as vLLM's; a table named E=96,N=512,K=1024,"]
        ));
        // with no table at all, the reason names both files
        let t = ask(
            &problem(8, 97, 8, 256, 512, DType::BF16),
            &h200(),
            &TableSet::default(),
            Request::default(),
        );
        assert!(has(
            &t,
            &["table: none named E=97,N=512,device_name=NVIDIA_H200,dtype=bf16.json or E=97,N=512,K=256,device_name=NVIDIA_H200,dtype=bf16.json"]
        ));
        // a name whose K disagrees with its metadata is malformed
        let bad = Table::parse(
            r#"{"metadata": {"K": 512}, "8": {"backend": "cuda_decode"}}"#,
            &file,
            Path::new(&file),
            Origin::User,
        );
        assert!(bad.is_err_and(|e| e.contains("metadata.K = 512 but the file name says K=256")));
    }

    #[test]
    fn cpu_problems_never_look_at_tables() {
        let dev = Device::Cpu;
        let addrs = crate::problem::FakeAddresses::default();
        let t = |d, shape: &[i64]| addrs.tensor(d, shape, dev);
        let (h, w1, w2) = (
            t(DType::BF16, &[4, 64]),
            t(DType::BF16, &[8, 64, 64]),
            t(DType::BF16, &[8, 64, 32]),
        );
        let (tw, ids) = (t(DType::F32, &[4, 2]), t(DType::I32, &[4, 2]));
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
            quant: crate::problem::QuantArgs::default(),
        })
        .unwrap();
        let set = tables_with(
            8,
            32,
            "NVIDIA H200",
            r#"{"4": {"backend": "cuda_generic"}}"#,
        );
        let plan = ask(&p, &h200(), &set, Request::default());
        assert_eq!(
            (plan.backend, plan.source),
            (Backend::Cpu, Source::Heuristic)
        );
        assert!(plan.table.is_none() && has(&plan, &["cpu: the tensors are on the CPU"]));
    }

    /// qwen3-30b-a3b's shape (E 128, topk 8, K 2048, N 768) as an FP8 call on the H200.
    fn qwen3_fp8(
        m: i64,
        scheme: QuantScheme,
        set: &TableSet,
        external: &[ExternalBackend],
    ) -> Plan {
        let req = Request {
            tables: Some(set),
            external,
            ..Request::default()
        };
        whole_model_plan(
            m,
            128,
            8,
            2048,
            768,
            DType::BF16,
            Some(scheme),
            &h200(),
            &req,
        )
        .unwrap()
    }

    #[test]
    fn untabled_calls_go_to_vllm_triton_outside_swapmoes_measured_range() {
        let set = TableSet::default();
        let vllm = [ExternalBackend::VllmTriton];
        let ask = |external: &[ExternalBackend]| qwen3_fp8(64, QuantScheme::Tensor, &set, external);
        let inside = ask(&vllm);
        assert_eq!(inside.external, Some(ExternalBackend::VllmTriton));
        // the fallback without vLLM: per-tensor FP8 at M = 64, the e4m3 wgmma GEMMs
        assert_eq!(inside.backend, Backend::CudaWgmma);
        assert!(has(
            &inside,
            &["vllm_triton: no tuned entry", "only up to M = 2"]
        ));
        let alone = ask(&[]);
        assert_eq!(alone.external, None);
        assert_eq!(alone.backend, Backend::CudaWgmma);
        let hopper_other = DeviceCaps {
            name: "NVIDIA H100 80GB HBM3".into(),
            ..h200()
        };
        let ampere = DeviceCaps {
            name: "NVIDIA A100-SXM4-80GB".into(),
            capability: (8, 0),
            sm_count: 108,
        };
        use ActivationScales::{Dynamic, Static};
        // (M, dtype, scheme, activation scales, device) -> whether vLLM's Triton runs it
        type Case<'a> = (
            i64,
            DType,
            Option<QuantScheme>,
            Option<ActivationScales>,
            &'a DeviceCaps,
            bool,
        );
        let cases: &[Case] = &[
            (1, DType::BF16, None, None, &hopper_other, false),
            (1, DType::F16, None, None, &hopper_other, false),
            (2, DType::BF16, None, None, &hopper_other, true),
            (64, DType::BF16, None, None, &hopper_other, true),
            (1, DType::F32, None, None, &hopper_other, true),
            (1, DType::BF16, None, None, &ampere, true),
            (
                2,
                DType::BF16,
                Some(QuantScheme::Tensor),
                Some(Static),
                &hopper_other,
                false,
            ),
            (
                4,
                DType::BF16,
                Some(QuantScheme::Tensor),
                Some(Static),
                &hopper_other,
                true,
            ),
            (
                1,
                DType::BF16,
                Some(QuantScheme::Tensor),
                Some(Dynamic),
                &hopper_other,
                true,
            ),
            (
                1,
                DType::BF16,
                Some(QuantScheme::Channel),
                None,
                &hopper_other,
                true,
            ),
            (
                1,
                DType::BF16,
                Some(QuantScheme::Block),
                None,
                &hopper_other,
                true,
            ),
        ];
        for &(m, dtype, quant, scales, caps, to_vllm) in cases {
            let req = Request {
                tables: Some(&set),
                external: &vllm,
                ..Request::default()
            };
            let p =
                plan_for_shape(m, 128, -1, 8, 2048, 768, dtype, quant, scales, caps, &req).unwrap();
            let case = format!("M={m} {dtype:?} {quant:?} {scales:?} {}", caps.name);
            assert_eq!(p.external.is_some(), to_vllm, "{case}: {:?}", p.reasons);
            assert_eq!(p.source, Source::Heuristic, "{case}");
            assert!(
                has(&p, &["vllm_triton:", "no tuned entry"]),
                "{case}: {:?}",
                p.reasons
            );
            // outside vLLM the heuristics' pick runs, the same backend as the fallback
            let alone = plan_for_shape(
                m,
                128,
                -1,
                8,
                2048,
                768,
                dtype,
                quant,
                scales,
                caps,
                &Request {
                    tables: Some(&set),
                    ..Request::default()
                },
            )
            .unwrap();
            assert_eq!((alone.external, alone.backend), (None, p.backend), "{case}");
        }
    }

    #[test]
    fn fp8_table_entries_without_vllm_times_stay_on_vllm_triton_inside_vllm() {
        // a per-channel table tuned without vLLM: M = 8 has no vllm_triton time, M = 64 has
        // one (slower than swapmoe's)
        let file = tables::file_name(128, 768, "NVIDIA H200", DType::BF16, Quant::Fp8Channel);
        let json = r#"{"8": {"backend": "cuda_wgmma_swap", "times_us": {"cuda_wgmma_swap": 100, "cuda_wgmma:t64": 110}},
                       "64": {"backend": "cuda_wgmma", "token_tile": 64, "times_us": {"cuda_wgmma:t64": 200, "vllm_triton": 250}}}"#;
        let t = Table::parse(json, &file, Path::new(&file), Origin::Shipped).unwrap();
        let mut set = TableSet::default();
        set.insert(&file, Loaded::Ok(std::sync::Arc::new(t)));
        let ask = |m: i64, external: &[ExternalBackend]| {
            qwen3_fp8(m, QuantScheme::Channel, &set, external)
        };
        let vllm = [ExternalBackend::VllmTriton];
        // inside vLLM, no vLLM time: vLLM's Triton, the table's pick as the fallback
        let p = ask(8, &vllm);
        assert_eq!(
            (p.external, p.backend, p.source),
            (
                Some(ExternalBackend::VllmTriton),
                Backend::CudaWgmmaSwap,
                Source::Table
            )
        );
        assert!(has(
            &p,
            &["no vllm_triton time at M=8", "cuda_wgmma_swap if it cannot"]
        ));
        // outside vLLM the table decides alone
        let p = ask(8, &[]);
        assert_eq!((p.external, p.backend), (None, Backend::CudaWgmmaSwap));
        // measured against vLLM and faster: swapmoe inside vLLM too
        let p = ask(64, &vllm);
        assert_eq!(
            (p.external, p.backend, p.tokens_per_pass),
            (None, Backend::CudaWgmma, 64),
            "{:?}",
            p.reasons
        );
    }

    #[test]
    fn fp8_problems_look_up_their_own_tables() {
        let set = TableSet::default();
        let p = whole_model_plan(
            8,
            128,
            8,
            2048,
            768,
            DType::BF16,
            Some(QuantScheme::Block),
            &h200(),
            &Request {
                tables: Some(&set),
                ..Request::default()
            },
        )
        .unwrap();
        assert_eq!(p.source, Source::Heuristic);
        assert!(
            p.reasons
                .iter()
                .any(|r| r.contains("dtype=fp8_w8a8,block_shape=[128,128]")),
            "{:?}",
            p.reasons
        );
    }

    /// A user table for qwen3-30b-a3b FP8 per tensor (static scales) with the given M entries
    /// (the JSON members after the metadata).
    fn qwen3_fp8_tensor_table(entries: &str) -> TableSet {
        let file = tables::file_name(128, 768, "NVIDIA H200", DType::BF16, Quant::Fp8Tensor);
        let json = format!(
            r#"{{"metadata": {{"E": 128, "N": 768, "activation_scales": "static"}}, {entries}}}"#
        );
        let t = Table::parse(&json, &file, Path::new(&file), Origin::User).unwrap();
        let mut set = TableSet::default();
        set.insert(&file, Loaded::Ok(std::sync::Arc::new(t)));
        set
    }

    #[test]
    fn fp8_table_swap_launch_sets_the_ring_and_gemm2_pdl() {
        let _knobs = ENV_KNOBS.write().unwrap_or_else(|e| e.into_inner());
        // an FP8 per-tensor table (static scales) whose M = 8 entry is a swap launch variant,
        // and whose M = 2 entry names one only in times_us (vLLM's the fastest there)
        let set = qwen3_fp8_tensor_table(
            r#""2": {"backend": "vllm_triton", "times_us": {"vllm_triton": 30, "cuda_wgmma_swap:r3p0": 31, "cuda_wgmma_swap": 32}},
            "8": {"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 2, "swap_gemm2_pdl": true, "time_us": 81.4}"#,
        );
        let ask = |m: i64| qwen3_fp8(m, QuantScheme::Tensor, &set, &[]);
        let p = ask(8);
        assert_eq!(
            (p.backend, p.source, p.swap_gemm1_ring, p.swap_gemm2_pdl),
            (Backend::CudaWgmmaSwap, Source::Table, 2, true),
            "{:?}",
            p.reasons
        );
        assert!(p.reasons.iter().any(
            |r| r.contains("gemm1: a ring of 2 stages") && r.contains("as the table measured")
        ));
        assert!(
            p.kernels.contains(&KernelId::SwapFp8StaticGemm1(8)),
            "{:?}",
            p.kernels
        );
        let p = ask(2);
        assert_eq!(
            (p.backend, p.source, p.swap_gemm1_ring, p.swap_gemm2_pdl),
            (Backend::CudaWgmmaSwap, Source::Table, 3, false),
            "{:?}",
            p.reasons
        );
    }

    #[test]
    fn table_gemm2_ring_sets_the_e4m3_gemm2_ring_unless_overridden() {
        let _knobs = ENV_KNOBS.write().unwrap_or_else(|e| e.into_inner());
        std::env::remove_var(SWAP_GEMM2_RING_ENV);
        // FP8 per tensor (static): M = 2 an entry with a GEMM2 ring of 7; M = 4 vLLM's the
        // fastest, the GEMM2-ring label the fastest swapmoe one; M = 8 a ring this kernel has not
        let set = qwen3_fp8_tensor_table(
            r#""2": {"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 0, "swap_gemm2_pdl": true, "swap_gemm2_ring": 7},
            "4": {"backend": "vllm_triton", "times_us": {"vllm_triton": 40, "cuda_wgmma_swap:r0p1g5": 41, "cuda_wgmma_swap": 42}},
            "8": {"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 0, "swap_gemm2_pdl": true, "swap_gemm2_ring": 99}"#,
        );
        let fp8 = |m: i64| qwen3_fp8(m, QuantScheme::Tensor, &set, &[]);
        let p = fp8(2);
        assert_eq!(
            (
                p.backend,
                p.source,
                p.swap_gemm1_ring,
                p.swap_gemm2_pdl,
                p.swap_gemm2_ring
            ),
            (Backend::CudaWgmmaSwap, Source::Table, 0, true, 7),
            "{:?}",
            p.reasons
        );
        assert!(has(
            &p,
            &["gemm2: a ring of 7 stages", "as the table measured"]
        ));
        let p = fp8(4);
        assert_eq!(
            (p.source, p.swap_gemm2_ring),
            (Source::Table, 5),
            "{:?}",
            p.reasons
        );
        // a ring the kernel has not: the rule's, and the reason says why
        let p = fp8(8);
        let rule = qwen3_fp8(8, QuantScheme::Tensor, &TableSet::default(), &[]);
        assert_eq!(p.swap_gemm2_ring, rule.swap_gemm2_ring, "{:?}", p.reasons);
        assert!(has(
            &p,
            &["the table's GEMM2 ring of 99 stages does not fit this kernel"]
        ));
        // the knob beats the table
        std::env::set_var(SWAP_GEMM2_RING_ENV, "0");
        let p = fp8(2);
        std::env::remove_var(SWAP_GEMM2_RING_ENV);
        assert_eq!(p.swap_gemm2_ring, 0, "{:?}", p.reasons);
        assert!(has(&p, &["forced by $SWAPMOE_SWAP_GEMM2_RING=0"]));
        // the bf16 GEMM2's ring is fixed at compile time: the table's is not used, and says so
        let set = tables_with(
            128,
            768,
            "NVIDIA H200",
            r#"{"2": {"backend": "cuda_wgmma_swap", "swap_gemm1_ring": 0, "swap_gemm2_pdl": true, "swap_gemm2_ring": 7}}"#,
        );
        let b = ask(
            &problem(2, 128, 8, 2048, 768, DType::BF16),
            &h200(),
            &set,
            Request::default(),
        );
        assert_eq!(
            (b.backend, b.source, b.swap_gemm2_ring),
            (Backend::CudaWgmmaSwap, Source::Table, 0),
            "{:?}",
            b.reasons
        );
        assert!(has(&b, &["the table's GEMM2 ring of 7 stages is not used"]));
    }

    #[test]
    fn fp8_tables_stand_only_for_calls_with_their_kind_of_activation_scales() {
        // a per-tensor table measured with static scales that picks the generic kernels
        // (the heuristics pick the swap-AB kernels at M = 8)
        let file = tables::file_name(128, 768, "NVIDIA H200", DType::BF16, Quant::Fp8Tensor);
        let table = |scales: &str| {
            let json = format!(
                r#"{{"metadata": {{"E": 128, "N": 768, "activation_scales": {scales}}},
                    "8": {{"backend": "cuda_generic", "time_us": 50.0}}}}"#
            );
            let t = Table::parse(&json, &file, Path::new(&file), Origin::User).unwrap();
            let mut set = TableSet::default();
            set.insert(&file, Loaded::Ok(std::sync::Arc::new(t)));
            set
        };
        let ask = |set: &TableSet, scales: Option<ActivationScales>| {
            plan_for_shape(
                8,
                128,
                -1,
                8,
                2048,
                768,
                DType::BF16,
                Some(QuantScheme::Tensor),
                scales,
                &h200(),
                &Request {
                    tables: Some(set),
                    ..Request::default()
                },
            )
            .unwrap()
        };
        let skipped = |p: &Plan, measured: &str, call: &str| {
            p.source == Source::Heuristic
                && p.reasons.iter().any(|r| {
                    r.contains(&format!(
                        "measured with {measured} activation scales and this call's are {call}"
                    ))
                })
        };
        let static_table = table(r#""static""#);
        // the default per-tensor call has static scales: the table stands
        for scales in [None, Some(ActivationScales::Static)] {
            let p = ask(&static_table, scales);
            assert_eq!(
                (p.backend, p.source),
                (Backend::CudaGeneric, Source::Table),
                "{:?}",
                p.reasons
            );
        }
        let p = ask(&static_table, Some(ActivationScales::Dynamic));
        assert!(skipped(&p, "static", "dynamic"), "{:?}", p.reasons);
        assert_eq!(p.backend, Backend::CudaWgmmaSwap);
        let dynamic_table = table(r#""dynamic""#);
        let p = ask(&dynamic_table, None);
        assert!(skipped(&p, "dynamic", "static"), "{:?}", p.reasons);
        let p = ask(&dynamic_table, Some(ActivationScales::Dynamic));
        assert_eq!((p.backend, p.source), (Backend::CudaGeneric, Source::Table));
        // a table that does not say (older tune runs, hand-written) stands for every call
        for scales in [None, Some(ActivationScales::Dynamic)] {
            let p = ask(&table("null"), scales);
            assert_eq!(p.source, Source::Table, "{:?}", p.reasons);
        }
        // a bad value makes the table malformed
        let err = Table::parse(
            r#"{"metadata": {"activation_scales": "calibrated"}}"#,
            &file,
            Path::new(&file),
            Origin::User,
        )
        .unwrap_err();
        assert!(
            err.contains(
                "metadata.activation_scales: expected 'static' or 'dynamic', got \"calibrated\""
            ),
            "{err}"
        );
        let err = Table::parse(
            r#"{"metadata": {"activation_scales": 1}}"#,
            &file,
            Path::new(&file),
            Origin::User,
        )
        .unwrap_err();
        assert!(err.contains("metadata.activation_scales"), "{err}");
        // scales are an FP8 question, and only per-tensor FP8 takes static ones
        let shape = |q: Option<QuantScheme>, a: ActivationScales| {
            plan_for_shape(
                8,
                128,
                -1,
                8,
                2048,
                768,
                DType::BF16,
                q,
                Some(a),
                &h200(),
                &Request::default(),
            )
        };
        let err = shape(None, ActivationScales::Dynamic)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("activation_scales: expected None without quant"),
            "{err}"
        );
        for (q, name) in [
            (QuantScheme::Channel, "fp8_channel"),
            (QuantScheme::Block, "fp8_block128"),
        ] {
            let err = shape(Some(q), ActivationScales::Static)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("for quant=\"{name}\"")) && err.ends_with("got 'static'"),
                "{err}"
            );
            assert!(shape(Some(q), ActivationScales::Dynamic).is_ok());
        }
        // a dynamic per-tensor call quantizes its intermediate in GEMM2's producer (v1 kernels)
        let p = shape(Some(QuantScheme::Tensor), ActivationScales::Dynamic).unwrap();
        assert!(
            !p.kernels.contains(&KernelId::SwapFp8StaticGemm1(8)),
            "{:?}",
            p.kernels
        );
    }

    #[test]
    fn warmup_loads_every_kernel_a_table_can_pick() {
        let all: HashSet<KernelId> = KernelId::all().into_iter().collect();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for k in [256, 250] {
                // aligned (vector loads) and unaligned (scalar loads)
                let p = problem(4, 8, 2, k, 128, dtype);
                for b in [Backend::CudaDecode, Backend::CudaGeneric, Backend::CudaMma] {
                    for tile in MMA_TOKEN_TILES {
                        let r = Request {
                            backend: Some(b),
                            mma_token_tile: Some(tile),
                            ..Request::default()
                        };
                        if let Ok(plan) = decide(&p, Some(&h200()), &r) {
                            for kernel in &plan.kernels {
                                assert!(all.contains(kernel), "{kernel:?} is not warmed up");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn fp8_below_sm89_names_the_callers_argument() {
        let a100 = offline_caps(Some("NVIDIA A100-SXM4-80GB"), None, None).unwrap();
        let h200 = offline_caps(Some("NVIDIA H200"), None, None).unwrap();
        for arg in ["use_fp8_w8a8", "quant"] {
            let err = check_fp8_capability(QuantScheme::Block, &a100, arg).unwrap_err();
            assert!(
                matches!(err, Error::Argument(ref m) if m.starts_with(&format!("{arg}: FP8 (")) && m.contains("sm_80")),
                "{err:?}"
            );
            assert!(check_fp8_capability(QuantScheme::Block, &h200, arg).is_ok());
        }
    }

    #[test]
    fn fp8_plans_swap_then_wgmma_or_generic_and_need_sm89() {
        let h200 = h200();
        let l40s = offline_caps(Some("NVIDIA L40S"), None, None).unwrap();
        for q in FP8_SCHEMES {
            let shape = |m: i64, k: i64, n: i64, dtype: DType, caps: &DeviceCaps| {
                whole_model_plan(m, 128, 8, k, n, dtype, Some(q), caps, &Request::default())
                    .unwrap()
            };
            // Hopper: the e4m3 wgmma swap-AB kernels after the input quantization, up to M = 8
            // per tensor, and per channel or block while cuda_wgmma's GEMM1 grid is under 1.5
            // waves (this shape: 12 column blocks x ~15.1 experts at M = 2, 1.37 waves; ~28.4
            // at M = 4, 2.58), where cuda_wgmma's FP8 GEMMs take the call beyond
            let swap_max = if q == QuantScheme::Tensor { 8 } else { 2 };
            for (m, tile) in [(1, 8), (2, 8), (4, 8), (8, 8), (9, 16), (16, 16)] {
                let p = shape(m, 2048, 768, DType::BF16, &h200);
                if m > swap_max {
                    assert_eq!(p.backend, Backend::CudaWgmma, "{:?}", p.reasons);
                    let why = if q == QuantScheme::Tensor {
                        format!("cuda_wgmma_swap: not picked, FP8 at M = {m} > {swap_max}: cuda_wgmma's e4m3 GEMMs measured faster")
                    } else {
                        "cuda_wgmma_swap: not picked, cuda_wgmma's GEMM1 fills ~".into()
                    };
                    assert!(has(&p, &[&why]), "{:?}", p.reasons);
                    continue;
                }
                if q != QuantScheme::Tensor {
                    assert!(has(&p, &["waves of one per SM (< 1.5)"]), "{:?}", p.reasons);
                }
                assert_eq!(p.backend, Backend::CudaWgmmaSwap, "{:?}", p.reasons);
                assert_eq!(
                    p.kernels,
                    if q == QuantScheme::Tensor {
                        // plan_for_shape gives per-tensor plans static activation scales
                        vec![
                            KernelId::Fp8QuantX(DType::BF16),
                            KernelId::SwapFp8StaticGemm1(tile),
                            KernelId::SwapFp8StaticGemm2Sum(DType::BF16, tile),
                        ]
                    } else {
                        vec![
                            KernelId::Fp8QuantX(DType::BF16),
                            KernelId::SwapFp8Gemm1(q, tile),
                            KernelId::SwapFp8Gemm2Sum(DType::BF16, q, tile),
                        ]
                    }
                );
                assert!(p.pdl && p.tokens_per_pass == tile);
            }
            // what rejects it, and the SIMT decode kernels that run instead
            for (p, why) in [
                (
                    shape(1, 2048, 768, DType::BF16, &l40s),
                    "its FP8 kernels need an sm_90 (Hopper) device",
                ),
                (
                    shape(1, 2048, 768, DType::F32, &h200),
                    "its FP8 kernels write bfloat16 or float16 outputs, got float32",
                ),
                (
                    shape(1, 2040, 768, DType::BF16, &h200),
                    "its tensor maps need K, N and every w1/w2 stride to be multiples of 16 e4m3",
                ),
            ] {
                assert_eq!(p.backend, Backend::CudaDecode);
                assert!(
                    has(&p, &["cuda_wgmma_swap: rejected", why]),
                    "{:?}",
                    p.reasons
                );
                assert_eq!(
                    p.kernels
                        .last()
                        .map(|k| matches!(k, KernelId::DecodeFp8Gemm2Sum(_, s, _) if *s == q)),
                    Some(true)
                );
            }
            // Wide experts (N >= 4096): cuda_wgmma's FP8 GEMMs from M = 32 per tensor, from
            // M = 1 per channel or block (224 column blocks x 8 experts: 13.6 waves)
            for (m, tensor) in [
                (1, Backend::CudaWgmmaSwap),
                (2, Backend::CudaWgmmaSwap),
                (16, Backend::CudaWgmmaSwap),
                (32, Backend::CudaWgmma),
            ] {
                let p = shape(m, 4096, 14336, DType::BF16, &h200);
                let want = if q == QuantScheme::Tensor {
                    tensor
                } else {
                    Backend::CudaWgmma
                };
                assert_eq!(p.backend, want, "{q:?} M = {m}: {:?}", p.reasons);
            }
            // M = 64: the e4m3 wgmma GEMMs
            let p = shape(64, 2048, 768, DType::BF16, &h200);
            assert_eq!(p.backend, Backend::CudaWgmma, "{:?}", p.reasons);
            assert!(has(
                &p,
                &["cuda_wgmma: FP8 past the swap-AB kernels' range"]
            ));
            let p = whole_model_plan(
                1024,
                128,
                8,
                2048,
                768,
                DType::BF16,
                Some(q),
                &h200,
                &Request::default(),
            )
            .unwrap();
            // M = 1024, 64 slots per expert: the e4m3 wgmma GEMMs at token tile 128; with 128x128 blocks and
            // with a static per-tensor a2_scale GEMM1 quantizes the intermediate itself.
            {
                assert_eq!(p.backend, Backend::CudaWgmma, "{:?}", p.reasons);
                assert!(has(
                    &p,
                    &["cuda_wgmma: FP8 past the swap-AB kernels' range"]
                ));
                let q8 = q == QuantScheme::Tensor; // plan_for_shape: static scales for fp8_tensor
                assert_eq!(
                    p.kernels,
                    [
                        vec![KernelId::RouteAlign, KernelId::Fp8QuantX(DType::BF16)],
                        vec![KernelId::WgmmaFp8Gemm1(q, 128, q8, false)],
                        if q8 || q == QuantScheme::Block {
                            vec![]
                        } else {
                            vec![KernelId::WgmmaFp8QuantInter(q)]
                        },
                        vec![
                            KernelId::WgmmaFp8Gemm2(DType::BF16, q, 128),
                            KernelId::WgmmaTopkReduce(DType::BF16)
                        ],
                    ]
                    .concat()
                );
                // Dynamic per-tensor scales: GEMM1 writes f32 rows and their absmax, one
                // kernel quantizes them; 1024 slots per expert take token tile 128.
                let dynamic = plan_for_shape(
                    4096,
                    8,
                    -1,
                    2,
                    4096,
                    14336,
                    DType::BF16,
                    Some(q),
                    Some(ActivationScales::Dynamic),
                    &h200,
                    &Request::default(),
                )
                .unwrap();
                assert_eq!(dynamic.backend, Backend::CudaWgmma);
                assert_eq!(dynamic.tokens_per_pass, 128);
                assert_eq!(
                    dynamic.kernels.contains(&KernelId::WgmmaFp8QuantInter(q)),
                    q != QuantScheme::Block
                );
                assert!(dynamic
                    .kernels
                    .contains(&KernelId::WgmmaFp8Gemm1(q, 128, false, true)));
                assert!(dynamic
                    .kernels
                    .contains(&KernelId::WgmmaFp8Gemm2(DType::BF16, q, 128)));
                // Ada: no wgmma
                let ada = shape(1024, 2048, 768, DType::BF16, &l40s);
                assert_eq!(ada.backend, Backend::CudaGeneric);
                assert!(has(
                    &ada,
                    &["cuda_wgmma: rejected, its FP8 kernels need an sm_90 (Hopper) device"]
                ));
            }
            // 128x128 blocks with N not a multiple of 128: the SIMT kernels
            if q == QuantScheme::Block {
                let p = shape(1024, 2048, 704, DType::BF16, &h200);
                assert_eq!(p.backend, Backend::CudaGeneric);
                assert!(p.kernels.contains(&KernelId::GenericFp8Gemm1(q, FP8_VEC)));
                assert!(has(
                    &p,
                    &["cuda_wgmma: rejected, with 128x128 block scales its GEMM1 quantizes the intermediate in groups of 128 columns inside one CTA tile, so N must be a multiple of 128, got N = 704"]
                ));
            }
            // K = 200: 16-byte e4m3 vectors do not fit, scalar loads
            let p = whole_model_plan(
                1024,
                8,
                2,
                200,
                64,
                DType::F32,
                Some(q),
                &h200,
                &Request::default(),
            )
            .unwrap();
            assert_eq!((p.gemm1_vec, p.gemm2_vec), (1, FP8_VEC));
            let forced = whole_model_plan(
                1024,
                128,
                8,
                2048,
                768,
                DType::BF16,
                Some(q),
                &h200,
                &Request {
                    backend: Some(Backend::CudaMma),
                    ..Request::default()
                },
            );
            assert!(matches!(forced, Err(Error::Argument(ref m)) if m.contains("FP8")));
            let a100 = offline_caps(Some("NVIDIA A100-SXM4-80GB"), None, None).unwrap();
            let err = whole_model_plan(
                1,
                128,
                8,
                2048,
                768,
                DType::BF16,
                Some(q),
                &a100,
                &Request::default(),
            )
            .unwrap_err();
            assert!(
                matches!(err, Error::Argument(ref m) if m.starts_with("quant: ") && m.contains("sm_80"))
            );
        }
        // a per-tensor question assumes static scales: no absmax pre-pass
        let p = whole_model_plan(
            1,
            128,
            8,
            2048,
            768,
            DType::BF16,
            Some(QuantScheme::Tensor),
            &h200,
            &Request::default(),
        )
        .unwrap();
        assert!(!p
            .kernels
            .iter()
            .any(|k| matches!(k, KernelId::Fp8AbsmaxPartials(_))));
    }
    /// The op's plans skip the reasons and nothing else: every field but the reasons equals
    /// the explained plan's, over the public shapes, decode to prefill, bf16 and FP8 schemes.
    #[test]
    fn launch_plans_make_the_same_choices_without_reasons() {
        let _knobs = ENV_KNOBS.read().unwrap_or_else(|e| e.into_inner());
        let shapes = [
            (128i64, 8i64, 2048i64, 768i64),
            (256, 8, 7168, 256),
            (8, 2, 4096, 14336),
        ];
        let tables = tables::global();
        let mut compared = 0;
        let quants = [
            None,
            Some(QuantScheme::Tensor),
            Some(QuantScheme::Channel),
            Some(QuantScheme::Block),
        ];
        for (e, topk, k, n) in shapes {
            for m in [1i64, 2, 4, 8, 16, 64, 256, 4096] {
                for quant in quants {
                    for backend in [None, Some(Backend::CudaWgmmaSwap)] {
                        let plan = |quiet| {
                            let req = Request {
                                backend,
                                tables: Some(&tables),
                                quiet,
                                ..Request::default()
                            };
                            whole_model_plan(m, e, topk, k, n, DType::BF16, quant, &h200(), &req)
                        };
                        let (Ok(mut told), Ok(mut quiet)) = (plan(false), plan(true)) else {
                            continue;
                        };
                        assert!(!told.reasons.is_empty() && quiet.reasons.is_empty());
                        told.reasons = Reasons::new(false);
                        quiet.reasons = Reasons::new(false);
                        told.log = None;
                        quiet.log = None;
                        assert_eq!(
                            told, quiet,
                            "M = {m}, E = {e}, {quant:?}, forced {backend:?}"
                        );
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared >= 150, "{compared} pairs compared");
    }

    /// What a plan costs on this machine, with and without its reasons (prints; run with
    /// `cargo test --release plan_cost -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn plan_cost() {
        let cases = [
            (1i64, 128i64, 8i64, 2048i64, 768i64),
            (8, 256, 8, 7168, 256),
            (64, 256, 8, 7168, 256),
            (4096, 128, 8, 2048, 768),
            (1, 8, 2, 4096, 14336),
        ];
        let caps = h200();
        let iters = 20000;
        let per_call = |f: &dyn Fn() -> Plan| {
            let t0 = std::time::Instant::now();
            for _ in 0..iters {
                std::hint::black_box(f());
            }
            t0.elapsed().as_secs_f64() / iters as f64 * 1e6
        };
        for (m, e, topk, k, n) in cases {
            let p = problem(m, e, topk, k, n, DType::BF16);
            let told = per_call(&|| plan_with(&p, Some(&caps), None).unwrap());
            let quiet = per_call(&|| plan_for_launch(&p, Some(&caps), None).unwrap());
            let reasons = plan_with(&p, Some(&caps), None).unwrap().reasons.len();
            eprintln!(
                "M = {m}, E = {e}: {told:.2} us with its {reasons} reasons, {quiet:.2} us without"
            );
        }
    }
}
