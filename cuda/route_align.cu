// Routing metadata for the grouped expert GEMMs, built on the GPU with no host sync.
//
// One CTA, or a thread-block cluster of up to 8 CTAs (`Plan::align_ctas`, for many slots: the
// work is shared memory atomics and scattered stores, which one SM does at ~1.3 ns a slot),
// groups the M*topk (token, k) slots by local expert:
//   slot_expert[s]     local expert of slot s, or -1 (id out of range, expert_map -1, id -1)
//   expert_offsets[e]  start of expert e's slots in sorted_slots; [local_E] is the total
//   sorted_slots[i]    slot indices grouped by expert (order within an expert is unspecified;
//                      every slot is computed independently, so results do not depend on it)
//   active_experts[j]  the j-th local expert with at least one slot (ascending), j < num_active
//   num_active[0]      number of local experts with at least one slot
//   tile_expert[i], tile_start[i], num_tiles[0]   (when tile_tokens > 0) the token tiles of
//                      the tensor-core GEMMs: tile i covers sorted_slots[tile_start[i] ..
//                      min(tile_start[i] + tile_tokens, expert_offsets[tile_expert[i] + 1]))
// An id outside [0, global_E) or mapped outside [0, local_E) is never used to index memory.
// In a cluster, CTA r takes the r-th of C equal runs of slots and counts them in its own shared
// memory; after a cluster barrier every CTA reads all C counts of its experts (distributed
// shared memory), so each knows the totals (the same offsets in every CTA) and where its own
// slots of an expert start: after those of the CTAs of lower rank. CTA 0 writes the per-expert
// outputs; each CTA scatters its own slots.
#include "common/cta_align.cuh"
#include "common/moe_common.cuh"
#include "common/router.cuh"
#include "common/sm90.cuh"

namespace {
constexpr int kThreads = 1024;  // `ROUTE_ALIGN_THREADS`
}  // namespace

// Slots whose loads one thread issues together before it uses any of them: the passes over
// the slots wait one memory latency per batch, not one per slot (at M*topk = 32768 with 1024
// threads the per-slot loop took 54 µs, nearly all of it in latencies).
constexpr int kAlignBatch = 8;

// The ids at offsets off[u] (-1: none) into g[u], every load issued before any is used.
template <typename Id>
__device__ __forceinline__ void load_ids(const Id* ids, const long long (&off)[kAlignBatch],
                                         long long (&g)[kAlignBatch]) {
#pragma unroll
  for (int u = 0; u < kAlignBatch; ++u) g[u] = off[u] >= 0 ? (long long)ids[off[u]] : -1;
}

// topk_ids: [M, topk] int32 (ids_is_i64 == 0) or int64, row stride ids_row_stride elements.
// expert_map: [global_E] int32 or nullptr. counts: local_E ints of shared memory, and as many
// again (the scatter cursors) when the launch is a cluster of more than one CTA.
// M*topk < 2^31 (checked on the host). Every thread of the block (THREADS of them) calls it.
template <int THREADS>
__device__ __forceinline__ void align_slots(
    const void* topk_ids, int ids_is_i64, long long ids_row_stride,
    const int* __restrict__ expert_map, int M, int topk, int global_E, int local_E,
    int* __restrict__ slot_expert, int* __restrict__ expert_offsets, int* __restrict__ sorted_slots,
    int* __restrict__ active_experts, int* __restrict__ num_active, int tile_tokens,
    int* __restrict__ tile_expert, int* __restrict__ tile_start, int* __restrict__ num_tiles, int* counts) {
  __shared__ int warp_sums[3][THREADS / 32];
  __shared__ int totals[3];  // slots, active experts, tiles
  const int tid = threadIdx.x;
  const int S = M * topk;
  constexpr long long kSweep = THREADS * kAlignBatch;  // slots per batch of the whole block
#ifdef SWAPMOE_SM90
  const int rank = (int)swapmoe::cluster_ctarank(), ctas = (int)swapmoe::cluster_nctarank();
#else
  const int rank = 0, ctas = 1;
#endif
  // This CTA's run of slots, and where the scatter cursors live (the counts themselves when
  // no other CTA reads them).
  const long long s_begin = (long long)S * rank / ctas, s_end = (long long)S * (rank + 1) / ctas;
  int* cursor = ctas > 1 ? counts + local_E : counts;

  for (int e = tid; e < local_E; e += THREADS) counts[e] = 0;
  __syncthreads();

  // Slot s = s_begin + base + u * THREADS + tid: the same thread maps it here and scatters it below.
  for (long long base = s_begin; base < s_end; base += kSweep) {
    long long off[kAlignBatch];  // -1 past the run
#pragma unroll
    for (int u = 0; u < kAlignBatch; ++u) {
      const long long s = base + u * THREADS + tid;
      const int m = (int)s / topk;
      off[u] = s >= s_end ? -1 : ids_row_stride == topk ? s : (long long)m * ids_row_stride + ((int)s - m * topk);
    }
    long long g[kAlignBatch];
    if (ids_is_i64)
      load_ids(static_cast<const long long*>(topk_ids), off, g);
    else
      load_ids(static_cast<const int*>(topk_ids), off, g);
    int id[kAlignBatch];
#pragma unroll
    for (int u = 0; u < kAlignBatch; ++u) id[u] = g[u] >= 0 && g[u] < global_E ? (int)g[u] : -1;
    if (expert_map) {
#pragma unroll
      for (int u = 0; u < kAlignBatch; ++u) id[u] = id[u] >= 0 ? expert_map[id[u]] : -1;
    }
#pragma unroll
    for (int u = 0; u < kAlignBatch; ++u) {
      const long long s = base + u * THREADS + tid;
      const int local = id[u] >= 0 && id[u] < local_E ? id[u] : -1;
      if (s < s_end) slot_expert[s] = local;
      if (local >= 0) atomicAdd(&counts[local], 1);
    }
  }
#ifdef SWAPMOE_SM90
  if (ctas > 1)
    swapmoe::cluster_sync();  // every CTA's counts are complete and visible to the cluster
  else
#endif
    __syncthreads();

  // Expert e's slots over the cluster, and those of the CTAs before this one.
  auto cluster_count = [&](int e, int& before) {
    before = 0;
    if (ctas == 1) return counts[e];
    int total = 0;
#ifdef SWAPMOE_SM90
    const uint32_t addr = swapmoe::smem_u32(&counts[e]);
    for (int r = 0; r < ctas; ++r) {
      const int c = r == rank ? counts[e] : swapmoe::ld_shared_cluster_s32(addr, (uint32_t)r);
      total += c;
      if (r < rank) before += c;
    }
#endif
    return total;
  };

  // Each thread owns a contiguous chunk of experts; scan chunk sums across the block.
  const int per = (local_E + THREADS - 1) / THREADS;
  const int e0 = min(tid * per, local_E), e1 = min(e0 + per, local_E);
  int my_slots = 0, my_active = 0, my_tiles = 0;
  for (int e = e0; e < e1; ++e) {
    int before;
    const int c = cluster_count(e, before);
    cursor[e] = c;  // the total, until the loop below
    my_slots += c;
    my_active += c > 0;
    if (tile_tokens > 0) my_tiles += (c + tile_tokens - 1) / tile_tokens;
  }
  const swapmoe::Counts3 bases =
      swapmoe::block_exclusive_scan3<THREADS>(swapmoe::Counts3{{my_slots, my_active, my_tiles}}, warp_sums, totals);
  int slot_base = bases.v[0], active_base = bases.v[1], tile_base = bases.v[2];
  for (int e = e0; e < e1; ++e) {
    const int c = cursor[e];
    int before = 0;
    if (ctas > 1) cluster_count(e, before);
    cursor[e] = slot_base + before;  // this CTA's scatter cursor for e
    if (rank == 0) {
      expert_offsets[e] = slot_base;
      if (tile_tokens > 0) {
        for (int t = 0; t < c; t += tile_tokens) {
          tile_expert[tile_base] = e;
          tile_start[tile_base] = slot_base + t;
          ++tile_base;
        }
      }
      if (c > 0) active_experts[active_base++] = e;
    }
    slot_base += c;
  }
  if (tid == 0 && rank == 0) {
    expert_offsets[local_E] = totals[0];
    num_active[0] = totals[1];
    if (tile_tokens > 0) num_tiles[0] = totals[2];
  }
#ifdef SWAPMOE_SM90
  if (ctas > 1) swapmoe::cluster_arrive_relaxed();  // done reading the other CTAs' counts
#endif
  __syncthreads();

  // Each thread reads back the slot_expert entries it wrote itself.
  for (long long base = s_begin; base < s_end; base += kSweep) {
    int local[kAlignBatch];
#pragma unroll
    for (int u = 0; u < kAlignBatch; ++u) {
      const long long s = base + u * THREADS + tid;
      local[u] = s < s_end ? slot_expert[s] : -1;
    }
#pragma unroll
    for (int u = 0; u < kAlignBatch; ++u)
      if (local[u] >= 0) sorted_slots[atomicAdd(&cursor[local[u]], 1)] = (int)(base + u * THREADS + tid);
  }
#ifdef SWAPMOE_SM90
  if (ctas > 1) swapmoe::cluster_wait();  // no CTA leaves while another may read its counts
#endif
}

#define SWAPMOE_ALIGN_ARGS                                                                         \
  const int *__restrict__ expert_map, int M, int topk, int global_E, int local_E,                  \
      int *__restrict__ slot_expert, int *__restrict__ expert_offsets, int *__restrict__ sorted_slots, \
      int *__restrict__ active_experts, int *__restrict__ num_active, int tile_tokens,             \
      int *__restrict__ tile_expert, int *__restrict__ tile_start, int *__restrict__ num_tiles
#define SWAPMOE_ALIGN_CALL                                                                         \
  expert_map, M, topk, global_E, local_E, slot_expert, expert_offsets, sorted_slots, active_experts, \
      num_active, tile_tokens, tile_expert, tile_start, num_tiles, counts

// Dynamic shared memory: local_E ints, 2 * local_E in a cluster of more than one CTA.
extern "C" __global__ void __launch_bounds__(kThreads) swapmoe_route_align(
    const void* __restrict__ topk_ids, int ids_is_i64, long long ids_row_stride, SWAPMOE_ALIGN_ARGS) {
  extern __shared__ int counts[];  // [local_E]
  swapmoe::pdl_wait();
  swapmoe::pdl_launch_dependents();
  align_slots<kThreads>(topk_ids, ids_is_i64, ids_row_stride, SWAPMOE_ALIGN_CALL);
}

// fused_moe's first kernel for the grouped GEMMs ($SWAPMOE_ROUTER_FUSION=on): the 16 warps
// route the M tokens (token t in warp t % 16; E <= 256) into router.weights / router.ids,
// then the block groups the slots as swapmoe_route_align does. One launch instead of two.
// 512 threads (`ROUTE_ALIGN_ROUTED_THREADS`): at 1024 the router's 64 registers per thread
// took a whole SM's register file, so the CTA could not start beside another kernel's.
constexpr int kRoutedThreads = 512;
extern "C" __global__ void __launch_bounds__(kRoutedThreads) swapmoe_route_align_routed(
    swapmoe::RouterArgs router, SWAPMOE_ALIGN_ARGS) {
  extern __shared__ int counts[];  // [local_E]
  swapmoe::pdl_wait();
  swapmoe::pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  for (int t = threadIdx.x >> 5; t < M; t += kRoutedThreads / 32) swapmoe::route_token_to_global<8>(router, t, lane);
  __syncthreads();  // the block's global writes are visible to the whole block after it
  align_slots<kRoutedThreads>(router.ids, 0, router.ids_row, SWAPMOE_ALIGN_CALL);
}
