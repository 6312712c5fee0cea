//! Launchers: carry out a `Plan` on the caller's stream. No tile or threshold is chosen
//! here; the oracle's plan says which kernels run and with which geometry.

use super::{check, device, stream_is_capturing, DeviceState};
use crate::error::{Error, Result};
use crate::oracle::{
    swap_gemm1_smem_bytes, swap_gemm2_smem_bytes, Backend, KernelId, Plan, RouterPlacement,
    BULK_SMEM_BYTES, BULK_THREADS, REDUCE_THREADS, ROUTE_ALIGN_ROUTED_THREADS, ROUTE_ALIGN_THREADS,
    SWAP_FP8_GEMM2_THREADS, SWAP_ROWS, SWAP_THREADS, WGMMA_GATHER_THREADS, WGMMA_GEMM1_COLUMNS,
    WGMMA_GEMM2_COLUMNS, WGMMA_QUANT_INTER_THREADS, WGMMA_RASTER_GROUP, WGMMA_REDUCE_THREADS,
    WGMMA_THREADS,
};

/// Threads per CTA of the tensor-core kernels (`kThreads` in cuda/sm80_mma_moe.cu).
const MMA_THREADS: u32 = 256;
use crate::problem::{DType, Device, MoeProblem, WorkspaceLayout, FP8_AMAX_PARTIALS};
use crate::routing::RouterProblem;
use cudarc::driver::sys;
use std::ffi::c_void;

/// Kernel arguments are passed to cuLaunchKernel as pointers to each value.
macro_rules! params {
    ($($v:expr),* $(,)?) => {
        [$( &$v as *const _ as *mut c_void ),*]
    };
}

/// `params!` of a routed kernel's arguments: `head`, then the routing and shape run every
/// routed kernel takes in this order (topk_weights pointer, dtype code and row stride;
/// topk_ids pointer, is-int64 and row stride; expert_map; M, topk, global E, local E, N, K)
/// from a `RoutedArgs`, then `tail`.
macro_rules! routed_params {
    ([$($head:expr),* $(,)?], $ra:expr, [$($tail:expr),* $(,)?]) => {
        params!(
            $($head,)*
            $ra.tw, $ra.tw_code, $ra.tw_row, $ra.ids, $ra.ids_i64, $ra.ids_row, $ra.map,
            $ra.m, $ra.topk, $ra.global_e, $ra.local_e, $ra.n, $ra.k,
            $($tail),*
        )
    };
}

/// Launches `id`; with `pdl` the launch may begin while the previous kernel in the stream
/// finishes (programmatic dependent launch; the kernel waits with griddepcontrol.wait).
#[allow(clippy::too_many_arguments)]
fn launch(
    dev: &DeviceState,
    id: KernelId,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    stream: usize,
    pdl: bool,
    params: &mut [*mut c_void],
) -> Result<()> {
    launch_clustered(dev, id, grid, block, smem, stream, pdl, 1, params)
}

/// `launch` with thread-block clusters of `cluster` CTAs along x (1: no cluster).
#[allow(clippy::too_many_arguments)]
fn launch_clustered(
    dev: &DeviceState,
    id: KernelId,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    stream: usize,
    pdl: bool,
    cluster: u32,
    params: &mut [*mut c_void],
) -> Result<()> {
    let f = dev.function(id)?;
    let r = if pdl || cluster > 1 {
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        let mut count = 0;
        if pdl {
            attrs[count].id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[count].value.programmaticStreamSerializationAllowed = 1;
            count += 1;
        }
        if cluster > 1 {
            attrs[count].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[count].value.clusterDim.x = cluster;
            attrs[count].value.clusterDim.y = 1;
            attrs[count].value.clusterDim.z = 1;
            count += 1;
        }
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: stream as sys::CUstream,
            attrs: attrs.as_mut_ptr(),
            numAttrs: count as u32,
        };
        unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }
    } else {
        unsafe {
            sys::cuLaunchKernel(
                f,
                grid.0,
                grid.1,
                grid.2,
                block,
                1,
                1,
                smem,
                stream as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
    };
    check(r, &format!("launching {}", id.symbol()))
}

/// Launches `id` with the router's arguments first when `router` is given (the kernels
/// that route for themselves take a `RouterArgs` before their usual parameters).
#[allow(clippy::too_many_arguments)]
fn launch_routed(
    dev: &DeviceState,
    id: KernelId,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    stream: usize,
    pdl: bool,
    router: Option<&RouterArgs>,
    params: &mut [*mut c_void],
) -> Result<()> {
    match router {
        None => launch(dev, id, grid, block, smem, stream, pdl, params),
        Some(r) => {
            let mut all = Vec::with_capacity(params.len() + 1);
            all.push(r as *const RouterArgs as *mut c_void);
            all.extend_from_slice(params);
            launch(dev, id, grid, block, smem, stream, pdl, &mut all)
        }
    }
}

/// The router's kernel argument, laid out as `swapmoe::RouterArgs` in
/// cuda/common/router.cuh (8-byte fields, then 4-byte ones; 96 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RouterArgs {
    logits: u64,
    logits_row: i64,
    bias: u64,
    weights: u64,
    weights_row: i64,
    ids: u64,
    ids_row: i64,
    logits_code: i32,
    bias_code: i32,
    experts: i32,
    topk: i32,
    renormalize: i32,
    scoring: i32,
    groups: i32,
    topk_group: i32,
    scale: f32,
    pad: i32,
}

impl RouterArgs {
    pub fn new(p: &RouterProblem) -> Self {
        let (groups, topk_group) = p
            .cfg
            .groups
            .map(|(g, t)| (g as i32, t as i32))
            .unwrap_or((1, 1));
        RouterArgs {
            logits: p.logits as u64,
            logits_row: p.logits_row_stride,
            bias: p.bias as u64,
            weights: p.weights_out as u64,
            weights_row: p.weights_row_stride,
            ids: p.ids_out as u64,
            ids_row: p.ids_row_stride,
            logits_code: p.logits_dtype.scalar_code(),
            bias_code: p.bias_dtype.scalar_code(),
            experts: p.experts as i32,
            topk: p.cfg.topk as i32,
            renormalize: i32::from(p.cfg.renormalize),
            scoring: p.cfg.scoring.code(),
            groups,
            topk_group,
            scale: p.cfg.routed_scaling_factor,
            pad: 0,
        }
    }
}

fn ordinal(p: &MoeProblem) -> Result<i32> {
    match p.device {
        Device::Cuda(i) => Ok(i),
        other => Err(Error::Device(format!(
            "hidden_states: expected a CUDA tensor, got device {other}"
        ))),
    }
}

/// Runs the whole op on `stream`. `workspace` is a device buffer of at least
/// `WorkspaceLayout::for_problem(p).total` bytes on the problem's device.
pub fn fused_experts(
    p: &MoeProblem,
    plan: &Plan,
    workspace: usize,
    workspace_bytes: usize,
    stream: usize,
) -> Result<()> {
    experts(
        p,
        plan,
        None,
        plan.first_kernel_pdl,
        workspace,
        workspace_bytes,
        stream,
    )
}

/// fused_moe: routes `r` into the problem's topk_weights / topk_ids (which must be `r`'s
/// outputs) and runs the experts, with the router where the plan placed it
/// (`oracle::place_router`).
pub fn fused_moe(
    r: &RouterProblem,
    p: &MoeProblem,
    plan: &Plan,
    workspace: usize,
    workspace_bytes: usize,
    stream: usize,
) -> Result<()> {
    if r.weights_out != p.operands.topk_weights || r.ids_out != p.operands.topk_ids {
        return Err(Error::Argument(
            "topk_weights, topk_ids: fused_moe's experts must read the router's outputs".into(),
        ));
    }
    match plan.router {
        RouterPlacement::Separate(id) => {
            route(r, id, plan.first_kernel_pdl, stream)?;
            // The experts' first kernel follows the router: PDL wherever the device has it.
            let after_router = crate::oracle::first_kernel_uses_pdl(&device(ordinal(p)?)?.caps);
            experts(
                p,
                plan,
                None,
                after_router,
                workspace,
                workspace_bytes,
                stream,
            )
        }
        RouterPlacement::InAlign | RouterPlacement::InDecodeGemm1 => {
            let args = RouterArgs::new(r);
            experts(
                p,
                plan,
                Some(&args),
                plan.first_kernel_pdl,
                workspace,
                workspace_bytes,
                stream,
            )
        }
        RouterPlacement::NotRouting => Err(Error::Argument(
            "backend: the plan has no router placement (oracle::place_router was not asked)".into(),
        )),
    }
}

/// The experts of `plan`; `router` is given when the plan's first kernel routes;
/// `first_pdl`: launch the first kernel with programmatic dependent launch.
fn experts(
    p: &MoeProblem,
    plan: &Plan,
    router: Option<&RouterArgs>,
    first_pdl: bool,
    workspace: usize,
    workspace_bytes: usize,
    stream: usize,
) -> Result<()> {
    if !matches!(
        plan.backend,
        Backend::CudaGeneric
            | Backend::CudaDecode
            | Backend::CudaMma
            | Backend::CudaBulkDecode
            | Backend::CudaWgmma
            | Backend::CudaWgmmaSwap
    ) {
        return Err(Error::Argument(format!(
            "backend: the CUDA launcher runs the cuda_* backends, the plan says {:?}",
            plan.backend.name()
        )));
    }
    let dev = device(ordinal(p)?)?;
    let _current = dev.make_current()?;
    if p.m == 0 {
        return Ok(());
    }
    let layout = WorkspaceLayout::for_problem(p);
    if layout.overflows() {
        return Err(WorkspaceLayout::problem_overflow_error(p));
    }
    if workspace_bytes < layout.total {
        return Err(Error::Shape(format!(
            "workspace: expected at least {} bytes, got {workspace_bytes}",
            layout.total
        )));
    }

    let ws = |off: usize| (workspace + off) as u64;
    let slot_expert = ws(layout.slot_expert);
    let expert_offsets = ws(layout.expert_offsets);
    let sorted_slots = ws(layout.sorted_slots);
    let active_experts = ws(layout.active_experts);
    let num_active = ws(layout.num_active);
    let inter = ws(layout.intermediate);
    let slot_out = ws(layout.slot_out);

    let o = p.operands;
    let s = p.strides;
    let (m, k, n, topk) = (p.m as i32, p.k as i32, p.n as i32, p.topk as i32);
    let local_e = p.local_experts as i32;
    let global_e = p.global_experts as i32;

    if plan.backend == Backend::CudaWgmmaSwap {
        if p.quant.is_some() {
            return swap_fp8(dev, p, plan, &layout, workspace, first_pdl, stream);
        }
        return swap_decode(dev, p, plan, inter, first_pdl, stream);
    }
    if matches!(plan.backend, Backend::CudaDecode | Backend::CudaBulkDecode) {
        if p.quant.is_some() {
            return fp8_decode(dev, p, plan, &layout, workspace, first_pdl, stream);
        }
        return decode(dev, p, plan, router, inter, first_pdl, stream);
    }

    // 1. Routing metadata (and the token tiles of the tensor-core GEMMs), unless GEMM1
    // groups the slots itself (`Plan::align_in_gemm1`).
    let tile_tokens = if matches!(plan.backend, Backend::CudaMma | Backend::CudaWgmma) {
        plan.tokens_per_pass as i32
    } else {
        0
    };
    let tile_expert = ws(layout.tile_expert);
    let tile_start = ws(layout.tile_start);
    let num_tiles = ws(layout.num_tiles);
    if !plan.align_in_gemm1 {
        let ids = o.topk_ids as u64;
        let ids_i64 = i32::from(p.topk_ids_dtype == DType::I64);
        let ids_row = s.topk_ids_row;
        let map = o.expert_map as u64;
        let mut args = params!(
            ids,
            ids_i64,
            ids_row,
            map,
            m,
            topk,
            global_e,
            local_e,
            slot_expert,
            expert_offsets,
            sorted_slots,
            active_experts,
            num_active,
            tile_tokens,
            tile_expert,
            tile_start,
            num_tiles
        );
        if router.is_some() {
            // The routing twin (one CTA) takes RouterArgs in place of the three topk_ids arguments.
            launch_routed(
                dev,
                plan.kernels[0],
                (1, 1, 1),
                ROUTE_ALIGN_ROUTED_THREADS as u32,
                (4 * p.local_experts) as u32,
                stream,
                first_pdl,
                router,
                &mut args[3..],
            )?;
        } else {
            // One cluster of `align_ctas` CTAs; past one, each also keeps its scatter cursors.
            let ctas = plan.align_ctas as u32;
            let smem = (4 * p.local_experts * if ctas > 1 { 2 } else { 1 }) as u32;
            launch_clustered(
                dev,
                plan.kernels[0],
                (ctas, 1, 1),
                ROUTE_ALIGN_THREADS as u32,
                smem,
                stream,
                first_pdl,
                ctas,
                &mut args,
            )?;
        }
    }

    if p.quant.is_some() {
        if plan.backend == Backend::CudaWgmma {
            return wgmma_fp8(dev, p, plan, &layout, workspace, first_pdl, stream);
        }
        fp8_generic(dev, p, plan, &layout, workspace, first_pdl, stream)?;
        return reduce(dev, p, plan, slot_out, slot_expert, stream);
    }

    if plan.backend == Backend::CudaWgmma {
        return wgmma_gemms(dev, p, plan, &layout, workspace, first_pdl, stream);
    }

    if plan.backend == Backend::CudaMma {
        mma_gemms(
            dev,
            p,
            plan,
            [
                expert_offsets,
                sorted_slots,
                tile_expert,
                tile_start,
                num_tiles,
                inter,
                slot_out,
            ],
            stream,
        )?;
        return reduce(dev, p, plan, slot_out, slot_expert, stream);
    }

    // Grid y: an upper bound on the active experts; surplus CTAs exit at once.
    let active_bound = p.max_active_experts() as u32;
    let rows = plan.rows_per_cta;
    let block = (rows * 32) as u32;
    let tw = o.topk_weights as u64;
    let tw_code = p.topk_weights_dtype.scalar_code();
    let tw_row = s.topk_weights_row;
    let act = p.activation.code();
    let on_input = i32::from(p.apply_router_weight_on_input);

    // 2. GEMM1 + act-and-mul.
    {
        let x = o.hidden_states as u64;
        let x_row = s.hidden_row;
        let w1 = o.w1 as u64;
        let (w1_e, w1_r) = (s.w1_expert, s.w1_row);
        let mut args = params!(
            x,
            x_row,
            w1,
            w1_e,
            w1_r,
            tw,
            tw_code,
            tw_row,
            expert_offsets,
            sorted_slots,
            active_experts,
            num_active,
            topk,
            n,
            k,
            act,
            on_input,
            inter
        );
        let grid = (p.n.div_ceil(rows) as u32, active_bound, 1);
        launch(
            dev,
            plan.kernels[1],
            grid,
            block,
            0,
            stream,
            false,
            &mut args,
        )?;
    }

    // 3. GEMM2 + router weight.
    {
        let w2 = o.w2 as u64;
        let (w2_e, w2_r) = (s.w2_expert, s.w2_row);
        let mut args = params!(
            inter,
            w2,
            w2_e,
            w2_r,
            tw,
            tw_code,
            tw_row,
            expert_offsets,
            sorted_slots,
            active_experts,
            num_active,
            topk,
            n,
            k,
            on_input,
            slot_out
        );
        let grid = (p.k.div_ceil(rows) as u32, active_bound, 1);
        launch(
            dev,
            plan.kernels[2],
            grid,
            block,
            0,
            stream,
            false,
            &mut args,
        )?;
    }

    reduce(dev, p, plan, slot_out, slot_expert, stream)
}

/// out[t] = sum over k of y[t*topk + k] (the last kernel of the generic and mma paths).
fn reduce(
    dev: &DeviceState,
    p: &MoeProblem,
    plan: &Plan,
    slot_out: u64,
    slot_expert: u64,
    stream: usize,
) -> Result<()> {
    let out = p.operands.out as u64;
    let out_row = p.strides.out_row;
    let (topk, k) = (p.topk as i32, p.k as i32);
    let mut args = params!(slot_out, slot_expert, topk, k, out, out_row);
    let grid = (p.k.div_ceil(REDUCE_THREADS) as u32, p.m as u32, 1);
    let id = *plan.kernels.last().expect("a CUDA plan has kernels");
    launch(
        dev,
        id,
        grid,
        REDUCE_THREADS as u32,
        0,
        stream,
        false,
        &mut args,
    )
}

/// The tensor-core GEMMs (cuda/sm80_mma_moe.cu) over the token tiles of route_align.
/// `bufs` = [expert_offsets, sorted_slots, tile_expert, tile_start, num_tiles, inter, y].
fn mma_gemms(
    dev: &DeviceState,
    p: &MoeProblem,
    plan: &Plan,
    bufs: [u64; 7],
    stream: usize,
) -> Result<()> {
    let [expert_offsets, sorted_slots, tile_expert, tile_start, num_tiles, inter, slot_out] = bufs;
    let o = p.operands;
    let s = p.strides;
    let (k, n, topk) = (p.k as i32, p.n as i32, p.topk as i32);
    let tw = o.topk_weights as u64;
    let tw_code = p.topk_weights_dtype.scalar_code();
    let tw_row = s.topk_weights_row;
    let act = p.activation.code();
    let on_input = i32::from(p.apply_router_weight_on_input);
    let tile = plan.tokens_per_pass;
    let tiles_bound = WorkspaceLayout::max_tiles(p.slots(), p.local_experts, tile) as u32;
    let smem = crate::oracle::mma_smem_bytes(tile) as u32;
    {
        let x = o.hidden_states as u64;
        let x_row = s.hidden_row;
        let w1 = o.w1 as u64;
        let (w1_e, w1_r) = (s.w1_expert, s.w1_row);
        let mut args = params!(
            x,
            x_row,
            w1,
            w1_e,
            w1_r,
            tw,
            tw_code,
            tw_row,
            expert_offsets,
            sorted_slots,
            tile_expert,
            tile_start,
            num_tiles,
            topk,
            n,
            k,
            act,
            on_input,
            inter
        );
        // GEMM1 CTAs cover 64 gate rows and their 64 up rows.
        let grid = (p.n.div_ceil(plan.rows_per_cta / 2) as u32, tiles_bound, 1);
        launch(
            dev,
            plan.kernels[1],
            grid,
            MMA_THREADS,
            smem,
            stream,
            false,
            &mut args,
        )?;
    }
    {
        let w2 = o.w2 as u64;
        let (w2_e, w2_r) = (s.w2_expert, s.w2_row);
        let mut args = params!(
            inter,
            w2,
            w2_e,
            w2_r,
            tw,
            tw_code,
            tw_row,
            expert_offsets,
            sorted_slots,
            tile_expert,
            tile_start,
            num_tiles,
            topk,
            n,
            k,
            on_input,
            slot_out
        );
        let grid = (p.k.div_ceil(plan.rows_per_cta) as u32, tiles_bound, 1);
        launch(
            dev,
            plan.kernels[2],
            grid,
            MMA_THREADS,
            smem,
            stream,
            false,
            &mut args,
        )?;
    }
    Ok(())
}

/// A tiled tensor map for the TMA unit over a row-major tensor of `dtype`: `dims` and the
/// box innermost first, `strides` in bytes for every dimension but the innermost; 128-byte
/// swizzle (the layout the wgmma descriptors expect), zero fill out of range.
fn tensor_map(
    dtype: DType,
    base: u64,
    dims: &[u64],
    strides: &[u64],
    box_: &[u32],
    what: &str,
) -> Result<sys::CUtensorMap> {
    let data_type = match dtype {
        DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F8E4M3 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        other => {
            return Err(Error::Argument(format!(
                "{what}: tensor maps are built for bfloat16, float16 or float8_e4m3fn, got {}",
                other.name()
            )))
        }
    };
    let element_strides = [1u32; 3];
    let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            dims.len() as u32,
            base as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            box_.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    check(
        r,
        &format!("encoding the tensor map of {what} (dims {dims:?}, byte strides {strides:?}, box {box_:?})"),
    )?;
    Ok(map)
}

/// The arguments and launch shape every wgmma GEMM (cuda/sm90_wgmma_moe.cu) shares: the
/// router weights, route_align's tile metadata (`SWAPMOE_WGMMA_TILES`), the sizes, and the
/// token tile's shared memory and tile bound.
struct WgmmaArgs {
    tw: u64,
    tw_code: i32,
    tw_row: i64,
    expert_offsets: u64,
    sorted_slots: u64,
    tile_expert: u64,
    tile_start: u64,
    num_tiles: u64,
    tiles: i32,
    raster: i32,
    l2_hints: i32,
    gemm2_block_run: i32,
    topk: i32,
    n: i32,
    k: i32,
    act: i32,
    on_input: i32,
    tile: usize,
    tiles_bound: usize,
    smem: u32,
    /// GEMM1's own grouping of the slots (`Plan::align_in_gemm1`; null ids: route_align's)
    align: CtaAlign,
    /// GEMM1's dynamic shared memory: the stages, and the grouping when it groups the slots
    gemm1_smem: u32,
}

/// What a GEMM1 that groups the slots itself reads and writes besides its tiles (`CtaAlign`
/// in cuda/common/cta_align.cuh, passed by value); all zero when route_align groups them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CtaAlign {
    topk_ids: u64,
    ids_row_stride: i64,
    expert_map: u64,
    slot_expert: u64,
    active_experts: u64,
    num_active: u64,
    ids_is_i64: i32,
    m: i32,
    global_e: i32,
    local_e: i32,
}

/// `params!` of a wgmma GEMM's arguments: `head`, the router weights (pointer, dtype code,
/// row stride), the tile metadata (expert_offsets, sorted_slots, tile_expert, tile_start,
/// num_tiles, tile bound, raster group, L2 hints, GEMM2 block run), topk, N, K from a
/// `WgmmaArgs`, then `tail`.
macro_rules! wgmma_params {
    ([$($head:expr),* $(,)?], $wa:expr, [$($tail:expr),* $(,)?]) => {
        params!(
            $($head,)*
            $wa.tw, $wa.tw_code, $wa.tw_row, $wa.expert_offsets, $wa.sorted_slots,
            $wa.tile_expert, $wa.tile_start, $wa.num_tiles, $wa.tiles, $wa.raster,
            $wa.l2_hints, $wa.gemm2_block_run, $wa.topk, $wa.n, $wa.k,
            $($tail),*
        )
    };
}

impl WgmmaArgs {
    fn new(p: &MoeProblem, plan: &Plan, layout: &WorkspaceLayout, workspace: usize) -> Self {
        let ws = |off: usize| (workspace + off) as u64;
        let tile = plan.tokens_per_pass;
        let tiles_bound = WorkspaceLayout::max_tiles(p.slots(), p.local_experts, tile);
        let stages_smem = crate::oracle::wgmma_smem_bytes(tile);
        let (align, align_smem) = if plan.align_in_gemm1 {
            let align = CtaAlign {
                topk_ids: p.operands.topk_ids as u64,
                ids_row_stride: p.strides.topk_ids_row,
                expert_map: p.operands.expert_map as u64,
                slot_expert: ws(layout.slot_expert),
                active_experts: ws(layout.active_experts),
                num_active: ws(layout.num_active),
                ids_is_i64: i32::from(p.topk_ids_dtype == DType::I64),
                m: p.m as i32,
                global_e: p.global_experts as i32,
                local_e: p.local_experts as i32,
            };
            let bytes =
                crate::oracle::cta_align_smem_bytes(p.slots(), p.local_experts, tiles_bound);
            (align, bytes)
        } else {
            (CtaAlign::default(), 0)
        };
        WgmmaArgs {
            tw: p.operands.topk_weights as u64,
            tw_code: p.topk_weights_dtype.scalar_code(),
            tw_row: p.strides.topk_weights_row,
            expert_offsets: ws(layout.expert_offsets),
            sorted_slots: ws(layout.sorted_slots),
            tile_expert: ws(layout.tile_expert),
            tile_start: ws(layout.tile_start),
            num_tiles: ws(layout.num_tiles),
            tiles: tiles_bound as i32,
            raster: WGMMA_RASTER_GROUP as i32,
            l2_hints: i32::from(plan.wgmma_l2_hints),
            gemm2_block_run: i32::from(plan.wgmma_gemm2_block_run),
            topk: p.topk as i32,
            n: p.n as i32,
            k: p.k as i32,
            act: p.activation.code(),
            on_input: i32::from(p.apply_router_weight_on_input),
            tile,
            tiles_bound,
            smem: stages_smem as u32,
            align,
            gemm1_smem: (stages_smem + align_smem) as u32,
        }
    }

    /// The 3-D tensor map over w1 [E][2N][K] (`esize`-byte elements, `stage_k` of K per box)
    /// in gate/up boxes of the token tile's height.
    fn w1_map(&self, p: &MoeProblem, dtype: DType, stage_k: u32) -> Result<sys::CUtensorMap> {
        let (e, kk, nn, es) = self.dims(p, dtype);
        let s = p.strides;
        tensor_map(
            dtype,
            p.operands.w1 as u64,
            &[kk, 2 * nn, e],
            &[s.w1_row as u64 * es, s.w1_expert as u64 * es],
            &[stage_k, crate::oracle::wgmma_gate_box(self.tile) as u32, 1],
            "w1",
        )
    }

    /// The 2-D tensor map over GEMM2's A rows (the intermediate [S][N], sorted order) and the
    /// 3-D one over w2 [E][K][N].
    fn gemm2_maps(
        &self,
        p: &MoeProblem,
        dtype: DType,
        stage_k: u32,
        inter: u64,
    ) -> Result<(sys::CUtensorMap, sys::CUtensorMap)> {
        let (e, kk, nn, es) = self.dims(p, dtype);
        let s = p.strides;
        let inter_map = tensor_map(
            dtype,
            inter,
            &[nn, p.slots() as u64],
            &[nn * es],
            &[stage_k, self.tile as u32],
            "the intermediate",
        )?;
        let w2_map = tensor_map(
            dtype,
            p.operands.w2 as u64,
            &[nn, kk, e],
            &[s.w2_row as u64 * es, s.w2_expert as u64 * es],
            &[stage_k, WGMMA_GEMM2_COLUMNS as u32, 1],
            "w2",
        )?;
        Ok((inter_map, w2_map))
    }

    fn dims(&self, p: &MoeProblem, dtype: DType) -> (u64, u64, u64, u64) {
        let es = dtype.size() as u64;
        (p.local_experts as u64, p.k as u64, p.n as u64, es)
    }

    /// Launches wgmma GEMM `id` (GEMM1: N inter columns per token tile in blocks of
    /// WGMMA_GEMM1_COLUMNS; GEMM2: K output columns in blocks of WGMMA_GEMM2_COLUMNS), as the
    /// plan's persistent grid or one CTA per (token tile, column block) item; `pdl`: with
    /// programmatic dependent launch (GEMM1 waits before it reads what the kernels before it
    /// wrote).
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        dev: &DeviceState,
        plan: &Plan,
        id: KernelId,
        gemm: WgmmaGemm,
        pdl: bool,
        stream: usize,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let (columns, block, persistent) = match gemm {
            WgmmaGemm::One => (
                self.n as usize,
                WGMMA_GEMM1_COLUMNS,
                plan.wgmma_persistent.0,
            ),
            WgmmaGemm::Two => (
                self.k as usize,
                WGMMA_GEMM2_COLUMNS,
                plan.wgmma_persistent.1,
            ),
        };
        let items = self.tiles_bound * columns.div_ceil(block);
        let grid = if persistent && plan.ctas > 0 {
            items.min(plan.ctas)
        } else {
            items
        };
        let smem = match gemm {
            WgmmaGemm::One => self.gemm1_smem,
            WgmmaGemm::Two => self.smem,
        };
        launch(
            dev,
            id,
            (grid as u32, 1, 1),
            WGMMA_THREADS as u32,
            smem,
            stream,
            pdl,
            args,
        )
    }
}

#[derive(Clone, Copy)]
enum WgmmaGemm {
    One,
    Two,
}

/// The Hopper wgmma GEMMs (cuda/sm90_wgmma_moe.cu) over the token tiles (64 or 128 rows) of
/// route_align: GEMM1 gathers each tile's rows of hidden_states and writes the intermediate
/// in sorted order, GEMM2 writes each row's output to its slot (in the activation dtype, in
/// the slot-output space), then the top-k sum.
fn wgmma_gemms(
    dev: &DeviceState,
    p: &MoeProblem,
    plan: &Plan,
    layout: &WorkspaceLayout,
    workspace: usize,
    first_pdl: bool,
    stream: usize,
) -> Result<()> {
    let wa = WgmmaArgs::new(p, plan, layout, workspace);
    let ws = |off: usize| (workspace + off) as u64;
    let (inter, slot_out) = (ws(layout.intermediate), ws(layout.slot_out));
    let o = p.operands;
    let s = p.strides;
    let d = p.dtype;
    let esize = d.size() as u64;
    let stage_k = (128 / esize) as u32;
    // GEMM1's token rows: gathered inside GEMM1, or (a plan with the gather kernel) first
    // copied in sorted order into the slot-output space, which GEMM2 only writes after
    // GEMM1 has read them.
    let x = o.hidden_states as u64;
    let x_row = s.hidden_row;
    let rows = SortedRows {
        src: x,
        src_row_bytes: s.hidden_row * esize as i64,
        dtype: d,
        stage_k,
        dst: slot_out,
    };
    let xs_map = rows.map_for(dev, p, &wa, plan, stream)?;
    {
        let w1_map = wa.w1_map(p, d, stage_k)?;
        let mut args = wgmma_params!(
            [x, x_row, xs_map, w1_map],
            wa,
            [wa.act, wa.on_input, inter, wa.align]
        );
        let id = find_kernel(plan, "a GEMM1", |k| {
            matches!(
                k,
                KernelId::WgmmaGemm1Act(..) | KernelId::WgmmaGemm1Grouping(..)
            )
        })?;
        // Grouping the slots itself, GEMM1 is the first kernel (it waits before reading ids);
        // otherwise it follows route_align (or the gather), by PDL where the plan says.
        let pdl = if plan.align_in_gemm1 {
            first_pdl
        } else {
            plan.wgmma_gemm1_pdl
        };
        wa.launch(dev, plan, id, WgmmaGemm::One, pdl, stream, &mut args)?;
    }
    {
        let (inter_map, w2_map) = wa.gemm2_maps(p, d, stage_k, inter)?;
        let mut args = wgmma_params!([inter_map, w2_map], wa, [wa.on_input, slot_out]);
        let id = find_kernel(plan, "a GEMM2", |k| matches!(k, KernelId::WgmmaGemm2(..)))?;
        wa.launch(dev, plan, id, WgmmaGemm::Two, false, stream, &mut args)?;
    }
    let slot_expert = ws(layout.slot_expert);
    let reduce = find_kernel(plan, "a top-k sum", |k| {
        matches!(k, KernelId::WgmmaTopkReduce(..))
    })?;
    wgmma_topk_reduce(dev, p, reduce, slot_out, slot_expert, stream)
}

/// The wgmma path's top-k sum: out[t] = the sum over k of the per-slot outputs (in the
/// activation dtype) of t's local slots.
fn wgmma_topk_reduce(
    dev: &DeviceState,
    p: &MoeProblem,
    id: KernelId,
    slot_out: u64,
    slot_expert: u64,
    stream: usize,
) -> Result<()> {
    let (k, topk) = (p.k as i32, p.topk as i32);
    let out = p.operands.out as u64;
    let out_row = p.strides.out_row;
    let mut args = params!(slot_out, slot_expert, topk, k, out, out_row);
    let grid = (
        p.k.div_ceil(8).div_ceil(WGMMA_REDUCE_THREADS) as u32,
        p.m as u32,
        1,
    );
    launch(
        dev,
        id,
        grid,
        WGMMA_REDUCE_THREADS as u32,
        0,
        stream,
        false,
        &mut args,
    )
}

/// The scales an FP8 wgmma GEMM reads (`WgmmaFp8Scales` in cuda/sm90_wgmma_moe.cu), passed
/// by value: pointers and element strides of the scales, then (128x128 blocks) the groups.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct WgmmaFp8Scales {
    x_scale: u64,
    w_scale: u64,
    w_scale_expert: i64,
    w_scale_row: i64,
    a2_static: u64,
    /// the intermediate's absmax; with block scales its group scales by sorted position
    inter_amax: u64,
    w_scale_col: i64,
    x_groups: i32,
    inter_groups: i32,
    /// rows of blocks of the weight scale (block scales)
    w_scale_rows: i32,
}

/// GEMM1's token rows copied into sorted order by the gather kernel before GEMM1 (plans
/// that take it: wide N), into the slot-output space, which GEMM2 writes only after GEMM1
/// has read them; GEMM1 then reads them by TMA.
struct SortedRows {
    /// the rows to gather: hidden_states, or (FP8) its quantized copy
    src: u64,
    src_row_bytes: i64,
    dtype: DType,
    /// elements of K per TMA box (128 bytes)
    stage_k: u32,
    dst: u64,
}

impl SortedRows {
    /// Whether the plan gathers GEMM1's rows before it (the gather kernel is in the plan).
    fn planned(plan: &Plan) -> bool {
        plan.kernels.contains(&KernelId::WgmmaGather)
    }

    /// GEMM1's `xs_map` argument: with the gather kernel in the plan, launches it and
    /// returns the tensor map over the gathered [S][K] rows; otherwise a zeroed map, which
    /// the GEMM1 that gathers its rows itself does not read.
    fn map_for(
        &self,
        dev: &DeviceState,
        p: &MoeProblem,
        wa: &WgmmaArgs,
        plan: &Plan,
        stream: usize,
    ) -> Result<sys::CUtensorMap> {
        if !Self::planned(plan) {
            return Ok(unsafe { std::mem::zeroed() });
        }
        let id = KernelId::WgmmaGather;
        let esize = self.dtype.size();
        let row_vectors = (p.k * esize / 16) as i32;
        let src_row_vectors = self.src_row_bytes / 16;
        let local_e = p.local_experts as i32;
        let (src, dst) = (self.src, self.dst);
        let (sorted_slots, expert_offsets, topk) = (wa.sorted_slots, wa.expert_offsets, wa.topk);
        let mut args = params!(
            src,
            src_row_vectors,
            sorted_slots,
            expert_offsets,
            local_e,
            topk,
            row_vectors,
            dst
        );
        launch(
            dev,
            id,
            (p.slots() as u32, 1, 1),
            WGMMA_GATHER_THREADS as u32,
            0,
            stream,
            false,
            &mut args,
        )?;
        tensor_map(
            self.dtype,
            dst,
            &[p.k as u64, p.slots() as u64],
            &[(p.k * esize) as u64],
            &[self.stage_k, wa.tile as u32],
            "the gathered hidden_states",
        )
    }
}

/// The FP8 Hopper wgmma path after route_align (cuda/sm90_wgmma_moe.cu): quantize x, GEMM1
/// (e4m3 wgmma over each token tile, gathering its quantized rows), the intermediate's
/// quantization (dynamic scales; with a static a2_scale GEMM1 writes e4m3 itself), GEMM2 by
/// TMA from the e4m3 intermediate into the per-slot outputs, then the top-k sum.
fn wgmma_fp8(
    dev: &DeviceState,
    p: &MoeProblem,
    plan: &Plan,
    layout: &WorkspaceLayout,
    workspace: usize,
    first_pdl: bool,
    stream: usize,
) -> Result<()> {
    let f = fp8_quantize_after_align(dev, p, plan, layout, workspace, first_pdl, stream)?;
    let wa = WgmmaArgs::new(p, plan, layout, workspace);
    let ws = |off: usize| (workspace + off) as u64;
    let inter_q = ws(layout.inter_q);
    let e4m3 = DType::F8E4M3;
    // 128 e4m3 of K per stage: one 128-byte swizzle row.
    let stage_k = 128u32;

    let gemm1 = find(plan, |k| {
        matches!(
            k,
            KernelId::WgmmaFp8Gemm1(..) | KernelId::WgmmaFp8Gemm1Grouping(..)
        )
    })?;
    let q = p.quant.expect("an FP8 problem");
    // GEMM1 writes the e4m3 intermediate itself, or a kernel quantizes its f32 rows after it
    let gemm1_quantizes = crate::oracle::wgmma_gemm1_quantizes(&q);
    let block_rows = |groups: usize| i32::try_from(groups).unwrap_or(i32::MAX);
    let rows = SortedRows {
        src: f.xq,
        src_row_bytes: f.xq_row,
        dtype: e4m3,
        stage_k,
        dst: ws(layout.slot_out),
    };
    let xs_map = rows.map_for(dev, p, &wa, plan, stream)?;
    {
        let w1_map = wa.w1_map(p, e4m3, stage_k)?;
        let (w1s_e, w1s_r, w1s_c) = f.w1s_strides;
        let scales = WgmmaFp8Scales {
            x_scale: f.x_scale,
            w_scale: f.w1s,
            w_scale_expert: w1s_e,
            w_scale_row: w1s_r,
            a2_static: f.a2,
            inter_amax: f.inter_amax,
            w_scale_col: w1s_c,
            x_groups: f.groups_k,
            inter_groups: f.groups_n,
            w_scale_rows: block_rows(q.scheme.groups(2 * p.n)),
        };
        let inter = if gemm1_quantizes { inter_q } else { f.inter };
        let mut args = wgmma_params!(
            [f.xq, f.xq_row, xs_map, w1_map, scales],
            wa,
            [wa.act, wa.on_input, inter, wa.align]
        );
        // GEMM1 waits for the kernel before it (griddepcontrol.wait) before it reads anything,
        // so its launch may overlap it: always where it groups the slots itself (after the
        // quantization), else where the plan says (after quantize-x, route_align or the gather).
        let pdl = if plan.align_in_gemm1 {
            crate::oracle::first_kernel_uses_pdl(&dev.caps)
        } else {
            plan.wgmma_gemm1_pdl
        };
        wa.launch(dev, plan, gemm1, WgmmaGemm::One, pdl, stream, &mut args)?;
    }
    if !gemm1_quantizes {
        let id = find(plan, |k| matches!(k, KernelId::WgmmaFp8QuantInter(..)))?;
        let local_e = p.local_experts as i32;
        let mut args = params!(
            f.inter,
            f.inter_amax,
            wa.sorted_slots,
            wa.expert_offsets,
            local_e,
            wa.n,
            inter_q
        );
        launch(
            dev,
            id,
            (p.slots() as u32, 1, 1),
            WGMMA_QUANT_INTER_THREADS as u32,
            0,
            stream,
            false,
            &mut args,
        )?;
    }
    let slot_out = ws(layout.slot_out);
    {
        let (inter_map, w2_map) = wa.gemm2_maps(p, e4m3, stage_k, inter_q)?;
        let (w2s_e, w2s_r, w2s_c) = f.w2s_strides;
        let scales = WgmmaFp8Scales {
            x_scale: 0,
            w_scale: f.w2s,
            w_scale_expert: w2s_e,
            w_scale_row: w2s_r,
            a2_static: f.a2,
            inter_amax: f.inter_amax,
            w_scale_col: w2s_c,
            x_groups: f.groups_k,
            inter_groups: f.groups_n,
            w_scale_rows: block_rows(q.scheme.groups(p.k)),
        };
        let mut args = wgmma_params!([inter_map, w2_map, scales], wa, [wa.on_input, slot_out]);
        let id = find(plan, |k| matches!(k, KernelId::WgmmaFp8Gemm2(..)))?;
        wa.launch(dev, plan, id, WgmmaGemm::Two, false, stream, &mut args)?;
    }
    let reduce = find(plan, |k| matches!(k, KernelId::WgmmaTopkReduce(..)))?;
    wgmma_topk_reduce(dev, p, reduce, slot_out, ws(layout.slot_expert), stream)
}

/// The kernel arguments of the kernels that read topk_ids themselves (the decode, FP8 decode
/// and swap-AB paths): sizes, router weights, ids, expert map, activation, weight placement.
struct RoutedArgs {
    m: i32,
    k: i32,
    n: i32,
    topk: i32,
    local_e: i32,
    global_e: i32,
    tw: u64,
    tw_code: i32,
    tw_row: i64,
    ids: u64,
    ids_i64: i32,
    ids_row: i64,
    map: u64,
    act: i32,
    on_input: i32,
}

impl RoutedArgs {
    fn new(p: &MoeProblem) -> Self {
        let o = p.operands;
        let s = p.strides;
        RoutedArgs {
            m: p.m as i32,
            k: p.k as i32,
            n: p.n as i32,
            topk: p.topk as i32,
            local_e: p.local_experts as i32,
            global_e: p.global_experts as i32,
            tw: o.topk_weights as u64,
            tw_code: p.topk_weights_dtype.scalar_code(),
            tw_row: s.topk_weights_row,
            ids: o.topk_ids as u64,
            ids_i64: i32::from(p.topk_ids_dtype == DType::I64),
            ids_row: s.topk_ids_row,
            map: o.expert_map as u64,
            act: p.activation.code(),
            on_input: i32::from(p.apply_router_weight_on_input),
        }
    }
}

/// The swap-AB decode kernels (cuda/sm90_swap_decode.cu): GEMM1 writes one row per
/// (active expert, token) into the workspace's intermediate, GEMM2 sums them into `out`.
/// Clusters split GEMM1's K and GEMM2's experts as `plan.splits` says.
fn swap_decode(
    dev: &DeviceState,
    p: &MoeProblem,
    plan: &Plan,
    h: u64,
    first_pdl: bool,
    stream: usize,
) -> Result<()> {
    let o = p.operands;
    let s = p.strides;
    let esize = p.dtype.size() as u64;
    let ra = RoutedArgs::new(p);
    let tile = plan.tokens_per_pass as u32;
    let rows = SWAP_ROWS as u32;
    let (g1_split, g2_split) = (plan.splits.0 as u32, plan.splits.1 as u32);
    let (e, kk, nn, mm) = (p.local_experts as u64, p.k as u64, p.n as u64, p.m as u64);
    let active_bound = p.max_active_experts() as u64;
    {
        let x_map = tensor_map(
            p.dtype,
            o.hidden_states as u64,
            &[kk, mm],
            &[s.hidden_row as u64 * esize],
            &[64, tile],
            "hidden_states",
        )?;
        let w1_map = tensor_map(
            p.dtype,
            o.w1 as u64,
            &[kk, 2 * nn, e],
            &[s.w1_row as u64 * esize, s.w1_expert as u64 * esize],
            &[64, rows, 1],
            "w1",
        )?;
        let mut args = routed_params!([x_map, w1_map], ra, [ra.act, ra.on_input, h]);
        let grid = (
            p.n.div_ceil(SWAP_ROWS) as u32 * g1_split,
            active_bound as u32,
            1,
        );
        launch_clustered(
            dev,
            plan.kernels[0],
            grid,
            SWAP_THREADS as u32,
            swap_gemm1_smem(plan.kernels[0], plan),
            stream,
            plan.pdl && first_pdl,
            g1_split,
            &mut args,
        )?;
    }
    let h_map = tensor_map(
        p.dtype,
        h,
        &[nn, mm, active_bound.max(1)],
        &[nn * esize, mm * nn * esize],
        &[64, tile, 1],
        "the intermediate",
    )?;
    let w2_map = tensor_map(
        p.dtype,
        o.w2 as u64,
        &[nn, kk, e],
        &[s.w2_row as u64 * esize, s.w2_expert as u64 * esize],
        &[64, rows, 1],
        "w2",
    )?;
    let out = o.out as u64;
    let out_row = s.out_row;
    let mut args = params!(
        h_map,
        w2_map,
        ra.ids,
        ra.ids_i64,
        ra.ids_row,
        ra.map,
        ra.m,
        ra.topk,
        ra.global_e,
        ra.local_e,
        ra.n,
        ra.k,
        out,
        out_row
    );
    let grid = (p.k.div_ceil(SWAP_ROWS) as u32 * g2_split, 1, 1);
    launch_clustered(
        dev,
        plan.kernels[1],
        grid,
        SWAP_THREADS as u32,
        swap_gemm2_smem(plan.kernels[1], plan),
        stream,
        plan.swap_gemm2_pdl,
        g2_split,
        &mut args,
    )
}

/// The FP8 swap-AB path (cuda/sm90_swap_decode.cu): quantize x, then GEMM1 writes the f32
/// intermediate per slot with its absmax, and GEMM2 quantizes it as it loads and sums the
/// experts into `out`. With a static per-tensor intermediate scale (the plan's
/// `SwapFp8StaticGemm1`) GEMM1 writes e4m3 rows per (active expert, token) instead, and
/// GEMM2 reads them by TMA. Clusters as in `swap_decode`.
fn swap_fp8(
    dev: &DeviceState,
    p: &MoeProblem,
    plan: &Plan,
    layout: &WorkspaceLayout,
    workspace: usize,
    first_pdl: bool,
    stream: usize,
) -> Result<()> {
    fp8_quantize_input(dev, p, plan, layout, workspace, first_pdl, stream)?;
    let f = Fp8Args::new(p, layout, workspace);
    let o = p.operands;
    let s = p.strides;
    let ra = RoutedArgs::new(p);
    let tile = plan.tokens_per_pass as u32;
    let rows = SWAP_ROWS as u32;
    let (g1_split, g2_split) = (plan.splits.0 as u32, plan.splits.1 as u32);
    let (e, kk, nn, mm) = (p.local_experts as u64, p.k as u64, p.n as u64, p.m as u64);
    let (w1s_e, w1s_r, w1s_c) = f.w1s_strides;
    let active_bound = p.max_active_experts() as u64;
    let static_inter = plan
        .kernels
        .iter()
        .any(|k| matches!(k, KernelId::SwapFp8StaticGemm1(..)));
    {
        let xq_map = tensor_map(
            DType::F8E4M3,
            f.xq,
            &[kk, mm],
            &[f.xq_row as u64],
            &[128, tile],
            "the quantized hidden_states",
        )?;
        let w1_map = tensor_map(
            DType::F8E4M3,
            o.w1 as u64,
            &[kk, 2 * nn, e],
            &[s.w1_row as u64, s.w1_expert as u64],
            &[128, rows, 1],
            "w1",
        )?;
        let args = routed_params!(
            [xq_map, w1_map, f.x_scale, f.groups_k, f.w1s, w1s_e, w1s_r, w1s_c],
            ra,
            [ra.act, ra.on_input]
        );
        // The tail: where the intermediate goes.
        let tail = if static_inter {
            params!(f.a2, f.inter).to_vec()
        } else {
            params!(f.inter, f.inter_amax, f.groups_n).to_vec()
        };
        let mut args: Vec<*mut c_void> = args.into_iter().chain(tail).collect();
        let grid = (
            p.n.div_ceil(SWAP_ROWS) as u32 * g1_split,
            active_bound as u32,
            1,
        );
        let id = find(plan, |k| {
            matches!(
                k,
                KernelId::SwapFp8Gemm1(..) | KernelId::SwapFp8StaticGemm1(..)
            )
        })?;
        launch_clustered(
            dev,
            id,
            grid,
            SWAP_THREADS as u32,
            swap_gemm1_smem(id, plan),
            stream,
            plan.pdl,
            g1_split,
            &mut args,
        )?;
    }
    let w2_map = tensor_map(
        DType::F8E4M3,
        o.w2 as u64,
        &[nn, kk, e],
        &[s.w2_row as u64, s.w2_expert as u64],
        &[128, rows, 1],
        "w2",
    )?;
    let tail = Fp8Gemm2Tail::new(p, &f);
    let grid = (p.k.div_ceil(SWAP_ROWS) as u32 * g2_split, 1, 1);
    // GEMM1's e4m3 rows [active_bound, M, N] (static intermediate scale), rows >= M
    // zero-filled by the copy.
    let hq_map = if static_inter {
        Some(tensor_map(
            DType::F8E4M3,
            f.inter,
            &[nn, mm, active_bound.max(1)],
            &[nn, mm * nn],
            &[128, tile, 1],
            "the quantized intermediate",
        )?)
    } else {
        None
    };
    let (id, threads, head) = match &hq_map {
        Some(hq_map) => (
            find(plan, |k| matches!(k, KernelId::SwapFp8StaticGemm2Sum(..)))?,
            SWAP_THREADS,
            params!(*hq_map, w2_map, f.a2).to_vec(),
        ),
        None => (
            find(plan, |k| matches!(k, KernelId::SwapFp8Gemm2Sum(..)))?,
            SWAP_FP8_GEMM2_THREADS,
            params!(w2_map, f.inter, f.inter_amax, f.a2, f.groups_n).to_vec(),
        ),
    };
    let mut args: Vec<*mut c_void> = head.into_iter().chain(tail.params()).collect();
    launch_clustered(
        dev,
        id,
        grid,
        threads as u32,
        swap_gemm2_smem(id, plan),
        stream,
        plan.swap_gemm2_pdl,
        g2_split,
        &mut args,
    )
}

/// Dynamic shared memory of the swap-AB GEMM1 (bf16/fp16 or e4m3): its own ring or the plan's
/// smaller one (`Plan::swap_gemm1_ring`, `swap_gemm1_smem_bytes`; the kernel takes as many
/// stages as the dynamic shared memory holds).
fn swap_gemm1_smem(id: KernelId, plan: &Plan) -> u32 {
    swap_gemm1_smem_bytes(id, plan.swap_gemm1_ring) as u32
}

/// Dynamic shared memory of a swap-AB GEMM2: its own, the plan's smaller ring
/// (`Plan::swap_gemm2_ring`, `swap_gemm2_smem_bytes`), or, where the plan runs it one CTA per
/// SM, the most its attribute allows (`KernelId::max_dynamic_smem_bytes`: more than half an
/// SM's; the ring stays the kernel's own).
fn swap_gemm2_smem(id: KernelId, plan: &Plan) -> u32 {
    if plan.swap_gemm2_one_per_sm {
        id.max_dynamic_smem_bytes().unwrap_or(0) as u32
    } else {
        swap_gemm2_smem_bytes(id, plan.swap_gemm2_ring) as u32
    }
}

/// The two-launch decode path (cuda/decode_moe.cu): only the intermediate of the workspace
/// is used.
fn decode(
    dev: &DeviceState,
    p: &MoeProblem,
    plan: &Plan,
    router: Option<&RouterArgs>,
    inter: u64,
    first_pdl: bool,
    stream: usize,
) -> Result<()> {
    let o = p.operands;
    let s = p.strides;
    let ra = RoutedArgs::new(p);
    let rows = plan.rows_per_cta;
    // The bulk-copy kernels run on a persistent grid with a producer warp and 96 KiB of
    // stages; the SIMT decode kernels take one CTA per row block (and per expert, GEMM1).
    let bulk = plan.backend == Backend::CudaBulkDecode;
    let (block, smem) = if bulk {
        (BULK_THREADS as u32, BULK_SMEM_BYTES as u32)
    } else {
        ((rows * 32) as u32, 0)
    };
    {
        let x = o.hidden_states as u64;
        let x_row = s.hidden_row;
        let w1 = o.w1 as u64;
        let (w1_e, w1_r) = (s.w1_expert, s.w1_row);
        let mut args = routed_params!([x, x_row, w1, w1_e, w1_r], ra, [ra.act, ra.on_input, inter]);
        let grid = if bulk {
            (plan.ctas.max(1) as u32, 1, 1)
        } else {
            (p.n.div_ceil(rows) as u32, p.max_active_experts() as u32, 1)
        };
        launch_routed(
            dev,
            plan.kernels[0],
            grid,
            block,
            smem,
            stream,
            plan.pdl && first_pdl,
            router,
            &mut args,
        )?;
    }
    {
        let w2 = o.w2 as u64;
        let (w2_e, w2_r) = (s.w2_expert, s.w2_row);
        let out = o.out as u64;
        let out_row = s.out_row;
        let mut args = routed_params!([inter, w2, w2_e, w2_r], ra, [ra.on_input, out, out_row]);
        let row_blocks = p.k.div_ceil(rows);
        let grid = if bulk {
            (plan.ctas.clamp(1, row_blocks) as u32, 1, 1)
        } else {
            (row_blocks as u32, 1, 1)
        };
        launch(
            dev,
            plan.kernels[1],
            grid,
            block,
            smem,
            stream,
            plan.pdl,
            &mut args,
        )?;
    }
    Ok(())
}

/// Opt-in id check for CUDA tensors: waits for `stream`, copies the ids (and the expert
/// map) to the host and checks them. Refused while the stream captures a graph.
pub fn check_ids(p: &MoeProblem, stream: usize) -> Result<()> {
    let dev = device(ordinal(p)?)?;
    let _current = dev.make_current()?;
    if stream_is_capturing(stream)? {
        return Err(Error::Argument(
            "check_ids: expected False while the stream captures a CUDA graph (the check waits for the device), got True"
                .into(),
        ));
    }
    check(
        unsafe { sys::cuStreamSynchronize(stream as sys::CUstream) },
        "cuStreamSynchronize",
    )?;
    let esz = p.topk_ids_dtype.size();
    let row = p.strides.topk_ids_row as usize;
    let span = if p.m == 0 {
        0
    } else {
        (p.m - 1) * row + p.topk
    };
    let mut ids = vec![0u8; span * esz];
    if span > 0 {
        check(
            unsafe {
                sys::cuMemcpyDtoH_v2(
                    ids.as_mut_ptr() as *mut c_void,
                    p.operands.topk_ids as u64,
                    ids.len(),
                )
            },
            "copying topk_ids to the host",
        )?;
    }
    let mut map = vec![
        0i32;
        if p.has_expert_map {
            p.global_experts
        } else {
            0
        }
    ];
    if !map.is_empty() {
        check(
            unsafe {
                sys::cuMemcpyDtoH_v2(
                    map.as_mut_ptr() as *mut c_void,
                    p.operands.expert_map as u64,
                    map.len() * 4,
                )
            },
            "copying expert_map to the host",
        )?;
    }
    let i64_ids = p.topk_ids_dtype == DType::I64;
    let read = |t: usize, k: usize| -> i64 {
        let i = t * row + k;
        if i64_ids {
            i64::from_ne_bytes(ids[8 * i..8 * i + 8].try_into().unwrap())
        } else {
            i32::from_ne_bytes(ids[4 * i..4 * i + 4].try_into().unwrap()) as i64
        }
    };
    crate::cpu::check_ids_with(p, read, |g| map.get(g).map(|&v| v as i64))
}

/// Tokens per CTA of the router kernel, one warp each (`kWarps` in cuda/route_topk.cu).
const ROUTER_TOKENS_PER_CTA: usize = 4;

/// Routes every token of `p` on `stream` (cuda/route_topk.cu).
pub fn select_experts(p: &RouterProblem, stream: usize) -> Result<()> {
    let request = crate::oracle::RouterRequest::from_env()?;
    let (id, _) = crate::oracle::router_kernel(p.experts, &p.cfg, request.kernel);
    let dev = device(router_ordinal(p)?)?;
    route(
        p,
        id,
        crate::oracle::first_kernel_uses_pdl(&dev.caps),
        stream,
    )
}

fn router_ordinal(p: &RouterProblem) -> Result<i32> {
    match p.device {
        Device::Cuda(i) => Ok(i),
        other => Err(Error::Device(format!(
            "gating_output: expected a CUDA tensor, got device {other}"
        ))),
    }
}

/// The router kernel `id`; `pdl`: launched with programmatic dependent launch.
fn route(p: &RouterProblem, id: KernelId, pdl: bool, stream: usize) -> Result<()> {
    let dev = device(router_ordinal(p)?)?;
    let _current = dev.make_current()?;
    if p.m == 0 {
        return Ok(());
    }
    let router = RouterArgs::new(p);
    let m = p.m as i32;
    let mut args = params!(router, m);
    let (grid, threads) = match id {
        // One CTA per token, one thread per expert (`oracle::router_kernel` bounds E).
        KernelId::RouteGroupedCta => ((p.m as u32, 1, 1), 32 * p.experts.div_ceil(32)),
        _ => (
            (p.m.div_ceil(ROUTER_TOKENS_PER_CTA) as u32, 1, 1),
            ROUTER_TOKENS_PER_CTA * 32,
        ),
    };
    launch(dev, id, grid, threads as u32, 0, stream, pdl, &mut args)
}

/// Threads per CTA of the FP8 quantize-x and absmax kernels (`kQuantThreads`).
const FP8_QUANT_THREADS: usize = 256;

/// Launches the FP8 input quantization (cuda/generic_moe.cu): the absmax partials when the
/// plan holds them (dynamic per-tensor input scale), then one CTA per token writing x_q and
/// its scales and zeroing the intermediate's absmax accumulators. `first_pdl`: launch the
/// first of them with programmatic dependent launch.
fn fp8_quantize_input(
    dev: &DeviceState,
    p: &MoeProblem,
    plan: &Plan,
    layout: &WorkspaceLayout,
    workspace: usize,
    first_pdl: bool,
    stream: usize,
) -> Result<()> {
    let q = p.quant.expect("an FP8 problem");
    let ws = |off: usize| (workspace + off) as u64;
    let x = p.operands.hidden_states as u64;
    let x_row = p.strides.hidden_row;
    let (m, k) = (p.m as i32, p.k as i32);
    let partials = ws(layout.x_partials);
    let mut num_partials = 0i32;
    // Both kernels wait for the previous kernel in the stream (griddepcontrol.wait) before
    // touching memory, so on sm_90 they are launched with PDL: their launch overlaps the
    // previous kernel's tail, and they let GEMM1 start its set-up early (the first of them
    // as `first_pdl` says).
    let mut pdl = first_pdl;
    for &id in &plan.kernels {
        match id {
            KernelId::Fp8AbsmaxPartials(_) => {
                let per_cta = FP8_QUANT_THREADS * 8;
                let grid = (p.m * p.k).div_ceil(per_cta).clamp(1, FP8_AMAX_PARTIALS);
                num_partials = grid as i32;
                let mut args = params!(x, x_row, m, k, partials);
                launch(
                    dev,
                    id,
                    (grid as u32, 1, 1),
                    FP8_QUANT_THREADS as u32,
                    0,
                    stream,
                    pdl,
                    &mut args,
                )?;
                pdl = crate::oracle::first_kernel_uses_pdl(&dev.caps);
            }
            KernelId::Fp8QuantX(_) => {
                let scheme = q.scheme.code();
                let a1 = q.a1_scale as u64;
                let xq = ws(layout.x_q);
                let xq_row = (p.k.div_ceil(16) * 16) as i64;
                let x_scale = ws(layout.x_scale);
                let groups_k = q.scheme.groups(p.k) as i32;
                let inter_amax = ws(layout.inter_amax);
                let amax_count = (p.slots().max(1) * q.scheme.groups(p.n)) as i64;
                let mut args = params!(
                    x,
                    x_row,
                    k,
                    scheme,
                    a1,
                    partials,
                    num_partials,
                    xq,
                    xq_row,
                    x_scale,
                    groups_k,
                    inter_amax,
                    amax_count
                );
                launch(
                    dev,
                    id,
                    (p.m as u32, 1, 1),
                    FP8_QUANT_THREADS as u32,
                    0,
                    stream,
                    pdl,
                    &mut args,
                )?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The FP8 operands every FP8 GEMM takes, as kernel arguments.
struct Fp8Args {
    xq: u64,
    xq_row: i64,
    x_scale: u64,
    groups_k: i32,
    groups_n: i32,
    inter: u64,
    inter_amax: u64,
    a2: u64,
    w1s: u64,
    w1s_strides: (i64, i64, i64),
    w2s: u64,
    w2s_strides: (i64, i64, i64),
}

/// The arguments every FP8 GEMM2 kernel (swap-AB and decode) takes after its own head, in
/// order: w2's scales and their strides, the routing, the shape and the output.
struct Fp8Gemm2Tail {
    w2s: u64,
    w2s_strides: (i64, i64, i64),
    ra: RoutedArgs,
    out: u64,
    out_row: i64,
}

impl Fp8Gemm2Tail {
    fn new(p: &MoeProblem, f: &Fp8Args) -> Self {
        Fp8Gemm2Tail {
            w2s: f.w2s,
            w2s_strides: f.w2s_strides,
            ra: RoutedArgs::new(p),
            out: p.operands.out as u64,
            out_row: p.strides.out_row,
        }
    }

    /// Pointers into `self`: it must outlive the launch they are passed to.
    fn params(&self) -> [*mut c_void; 20] {
        let (ra, (w2s_e, w2s_r, w2s_c)) = (&self.ra, &self.w2s_strides);
        routed_params!(
            [self.w2s, *w2s_e, *w2s_r, *w2s_c],
            ra,
            [ra.on_input, self.out, self.out_row]
        )
    }
}

impl Fp8Args {
    fn new(p: &MoeProblem, layout: &WorkspaceLayout, workspace: usize) -> Self {
        let q = p.quant.expect("an FP8 problem");
        let ws = |off: usize| (workspace + off) as u64;
        Fp8Args {
            xq: ws(layout.x_q),
            xq_row: (p.k.div_ceil(16) * 16) as i64,
            x_scale: ws(layout.x_scale),
            groups_k: q.scheme.groups(p.k) as i32,
            groups_n: q.scheme.groups(p.n) as i32,
            inter: ws(layout.intermediate),
            inter_amax: ws(layout.inter_amax),
            a2: q.a2_scale as u64,
            w1s: q.w1_scale.addr as u64,
            w1s_strides: (q.w1_scale.expert, q.w1_scale.row, q.w1_scale.col),
            w2s: q.w2_scale.addr as u64,
            w2s_strides: (q.w2_scale.expert, q.w2_scale.row, q.w2_scale.col),
        }
    }
}

/// The plan's kernel that `pred` picks (`what`, e.g. "a GEMM1", names it in the error).
fn find_kernel(plan: &Plan, what: &str, pred: impl Fn(&KernelId) -> bool) -> Result<KernelId> {
    plan.kernels
        .iter()
        .copied()
        .find(pred)
        .ok_or_else(|| Error::Argument(format!("backend: the plan {plan} lacks {what} kernel")))
}

/// `find_kernel` for the FP8 paths' kernels.
fn find(plan: &Plan, pred: impl Fn(&KernelId) -> bool) -> Result<KernelId> {
    find_kernel(plan, "an FP8", pred)
}

/// The FP8 decode path: quantize x, then the two decode GEMMs (PDL on sm_90).
fn fp8_decode(
    dev: &DeviceState,
    p: &MoeProblem,
    plan: &Plan,
    layout: &WorkspaceLayout,
    workspace: usize,
    first_pdl: bool,
    stream: usize,
) -> Result<()> {
    fp8_quantize_input(dev, p, plan, layout, workspace, first_pdl, stream)?;
    let f = Fp8Args::new(p, layout, workspace);
    let o = p.operands;
    let s = p.strides;
    let ra = RoutedArgs::new(p);
    let rows = plan.rows_per_cta;
    let block = (rows * 32) as u32;
    let Fp8Args {
        xq,
        xq_row,
        x_scale,
        groups_k,
        groups_n,
        inter,
        inter_amax,
        a2,
        w1s,
        ..
    } = f;
    let (w1s_e, w1s_r, w1s_c) = f.w1s_strides;
    {
        let w1 = o.w1 as u64;
        let (w1_e, w1_r) = (s.w1_expert, s.w1_row);
        let mut args = routed_params!(
            [xq, xq_row, x_scale, groups_k, w1, w1_e, w1_r, w1s, w1s_e, w1s_r, w1s_c],
            ra,
            [ra.act, ra.on_input, inter, inter_amax, groups_n]
        );
        let grid = (p.n.div_ceil(rows) as u32, p.max_active_experts() as u32, 1);
        let id = find(plan, |k| matches!(k, KernelId::DecodeFp8Gemm1(..)))?;
        launch(dev, id, grid, block, 0, stream, plan.pdl, &mut args)?;
    }
    {
        let w2 = o.w2 as u64;
        let (w2_e, w2_r) = (s.w2_expert, s.w2_row);
        let tail = Fp8Gemm2Tail::new(p, &f);
        let head = params!(inter, inter_amax, a2, groups_n, w2, w2_e, w2_r);
        let mut args: Vec<*mut c_void> = head.into_iter().chain(tail.params()).collect();
        let grid = (p.k.div_ceil(rows) as u32, 1, 1);
        let id = find(plan, |k| matches!(k, KernelId::DecodeFp8Gemm2Sum(..)))?;
        launch(dev, id, grid, block, 0, stream, plan.pdl, &mut args)?;
    }
    Ok(())
}

/// The FP8 paths after route_align start by quantizing x: launched with PDL wherever the
/// device has it (the align kernel ran first), or as `first_pdl` says where the plan has no
/// align kernel (`Plan::align_in_gemm1`: the quantization is the first kernel). Returns the
/// FP8 GEMMs' arguments.
fn fp8_quantize_after_align(
    dev: &DeviceState,
    p: &MoeProblem,
    plan: &Plan,
    layout: &WorkspaceLayout,
    workspace: usize,
    first_pdl: bool,
    stream: usize,
) -> Result<Fp8Args> {
    let pdl = if plan.align_in_gemm1 {
        first_pdl
    } else {
        crate::oracle::first_kernel_uses_pdl(&dev.caps)
    };
    fp8_quantize_input(dev, p, plan, layout, workspace, pdl, stream)?;
    Ok(Fp8Args::new(p, layout, workspace))
}

/// The FP8 generic path after route_align: quantize x, GEMM1, GEMM2 into the per-slot
/// outputs (the caller then runs the top-k reduction).
fn fp8_generic(
    dev: &DeviceState,
    p: &MoeProblem,
    plan: &Plan,
    layout: &WorkspaceLayout,
    workspace: usize,
    first_pdl: bool,
    stream: usize,
) -> Result<()> {
    let f = fp8_quantize_after_align(dev, p, plan, layout, workspace, first_pdl, stream)?;
    let ws = |off: usize| (workspace + off) as u64;
    let expert_offsets = ws(layout.expert_offsets);
    let sorted_slots = ws(layout.sorted_slots);
    let active_experts = ws(layout.active_experts);
    let num_active = ws(layout.num_active);
    let slot_out = ws(layout.slot_out);
    let o = p.operands;
    let s = p.strides;
    let (k, n, topk) = (p.k as i32, p.n as i32, p.topk as i32);
    let tw = o.topk_weights as u64;
    let tw_code = p.topk_weights_dtype.scalar_code();
    let tw_row = s.topk_weights_row;
    let act = p.activation.code();
    let on_input = i32::from(p.apply_router_weight_on_input);
    let rows = plan.rows_per_cta;
    let block = (rows * 32) as u32;
    let active_bound = p.max_active_experts() as u32;
    let Fp8Args {
        xq,
        xq_row,
        x_scale,
        groups_k,
        groups_n,
        inter,
        inter_amax,
        a2,
        w1s,
        w2s,
        ..
    } = f;
    let (w1s_e, w1s_r, w1s_c) = f.w1s_strides;
    let (w2s_e, w2s_r, w2s_c) = f.w2s_strides;
    {
        let w1 = o.w1 as u64;
        let (w1_e, w1_r) = (s.w1_expert, s.w1_row);
        let mut args = params!(
            xq,
            xq_row,
            x_scale,
            groups_k,
            w1,
            w1_e,
            w1_r,
            w1s,
            w1s_e,
            w1s_r,
            w1s_c,
            tw,
            tw_code,
            tw_row,
            expert_offsets,
            sorted_slots,
            active_experts,
            num_active,
            topk,
            n,
            k,
            act,
            on_input,
            inter,
            inter_amax,
            groups_n
        );
        let grid = (p.n.div_ceil(rows) as u32, active_bound, 1);
        let id = find(plan, |k| matches!(k, KernelId::GenericFp8Gemm1(..)))?;
        launch(dev, id, grid, block, 0, stream, false, &mut args)?;
    }
    {
        let w2 = o.w2 as u64;
        let (w2_e, w2_r) = (s.w2_expert, s.w2_row);
        let mut args = params!(
            inter,
            inter_amax,
            a2,
            groups_n,
            w2,
            w2_e,
            w2_r,
            w2s,
            w2s_e,
            w2s_r,
            w2s_c,
            tw,
            tw_code,
            tw_row,
            expert_offsets,
            sorted_slots,
            active_experts,
            num_active,
            topk,
            n,
            k,
            on_input,
            slot_out
        );
        let grid = (p.k.div_ceil(rows) as u32, active_bound, 1);
        let id = find(plan, |k| matches!(k, KernelId::GenericFp8Gemm2(..)))?;
        launch(dev, id, grid, block, 0, stream, false, &mut args)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::RouterArgs;
    use std::mem::{align_of, offset_of, size_of};

    /// `wgmma_params!` passes the arguments every wgmma GEMM takes after its head in the
    /// order of the kernels' signatures (cuda/sm90_wgmma_moe.cu): topk_weights, its dtype code
    /// and row stride, then `SWAPMOE_WGMMA_TILES` (expert_offsets, sorted_slots, tile_expert,
    /// tile_start, num_tiles, tiles_bound, raster_group, l2_hints, gemm2_block_run), then topk,
    /// N, K.
    #[test]
    fn wgmma_params_follow_the_kernel_signatures() {
        use super::{c_void, WgmmaArgs}; // c_void: params! names it
        let wa = WgmmaArgs {
            tw: 1,
            tw_code: 2,
            tw_row: 3,
            expert_offsets: 4,
            sorted_slots: 5,
            tile_expert: 6,
            tile_start: 7,
            num_tiles: 8,
            tiles: 9,
            raster: 10,
            l2_hints: 16,
            gemm2_block_run: 17,
            topk: 11,
            n: 12,
            k: 13,
            act: 14,
            on_input: 15,
            tile: 64,
            tiles_bound: 9,
            smem: 0,
            align: super::CtaAlign::default(),
            gemm1_smem: 0,
        };
        let (head, tail) = (100u64, 200i32);
        let args = wgmma_params!([head], wa, [tail]);
        assert_eq!(args.len(), 17);
        fn addr<T>(r: &T) -> usize {
            r as *const T as usize
        }
        let want = [
            addr(&head),
            addr(&wa.tw),
            addr(&wa.tw_code),
            addr(&wa.tw_row),
            addr(&wa.expert_offsets),
            addr(&wa.sorted_slots),
            addr(&wa.tile_expert),
            addr(&wa.tile_start),
            addr(&wa.num_tiles),
            addr(&wa.tiles),
            addr(&wa.raster),
            addr(&wa.l2_hints),
            addr(&wa.gemm2_block_run),
            addr(&wa.topk),
            addr(&wa.n),
            addr(&wa.k),
            addr(&tail),
        ];
        let got: Vec<usize> = args.iter().map(|p| *p as usize).collect();
        assert_eq!(got, want);
    }

    /// The layout cuda/sm90_wgmma_moe.cu's `WgmmaFp8Scales` has (7 eight-byte fields, then
    /// 3 four-byte ones; its static_asserts check the same offsets).
    #[test]
    fn wgmma_fp8_scales_layout_matches_the_cuda_struct() {
        use super::WgmmaFp8Scales;
        assert_eq!(size_of::<WgmmaFp8Scales>(), 72);
        assert_eq!(align_of::<WgmmaFp8Scales>(), 8);
        assert_eq!(offset_of!(WgmmaFp8Scales, w_scale_row), 24);
        assert_eq!(offset_of!(WgmmaFp8Scales, inter_amax), 40);
        assert_eq!(offset_of!(WgmmaFp8Scales, w_scale_col), 48);
        assert_eq!(offset_of!(WgmmaFp8Scales, x_groups), 56);
        assert_eq!(offset_of!(WgmmaFp8Scales, w_scale_rows), 64);
    }

    /// The layout cuda/common/cta_align.cuh's `CtaAlign` has (6 eight-byte fields, then 4
    /// four-byte ones; its static_asserts check the same offsets).
    #[test]
    fn cta_align_layout_matches_the_cuda_struct() {
        use super::CtaAlign;
        assert_eq!(size_of::<CtaAlign>(), 64);
        assert_eq!(align_of::<CtaAlign>(), 8);
        assert_eq!(offset_of!(CtaAlign, ids_row_stride), 8);
        assert_eq!(offset_of!(CtaAlign, num_active), 40);
        assert_eq!(offset_of!(CtaAlign, ids_is_i64), 48);
        assert_eq!(offset_of!(CtaAlign, local_e), 60);
    }

    /// The layout cuda/common/router.cuh's `RouterArgs` has (7 eight-byte fields, then
    /// 10 four-byte ones): a kernel reads the struct by these offsets.
    #[test]
    fn router_args_layout_matches_the_cuda_struct() {
        assert_eq!(size_of::<RouterArgs>(), 96);
        assert_eq!(align_of::<RouterArgs>(), 8);
        assert_eq!(offset_of!(RouterArgs, ids_row), 48);
        assert_eq!(offset_of!(RouterArgs, logits_code), 56);
        assert_eq!(offset_of!(RouterArgs, topk_group), 84);
        assert_eq!(offset_of!(RouterArgs, scale), 88);
    }
}
