// Routing metadata for the grouped expert GEMMs, built on the GPU with no host sync.
//
// One CTA groups the M*topk (token, k) slots by local expert:
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
#include "common/moe_common.cuh"

#include "common/router.cuh"

namespace {
constexpr int kThreads = 1024;  // `ROUTE_ALIGN_THREADS`

template <int THREADS>
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  if (lane == 31) warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = (lane < (THREADS / 32)) ? warp_sums[lane] : 0;
    int winc = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int n = __shfl_up_sync(0xffffffffu, winc, o);
      if (lane >= o) winc += n;
    }
    warp_sums[lane] = winc - w;  // exclusive prefix of warp totals
    if (lane == 31) *total = winc;
  }
  __syncthreads();
  int r = warp_sums[warp] + inc - v;
  __syncthreads();
  return r;
}
}  // namespace

// topk_ids: [M, topk] int32 (ids_is_i64 == 0) or int64, row stride ids_row_stride elements.
// expert_map: [global_E] int32 or nullptr. counts: local_E ints of shared memory.
// Every thread of the block (THREADS of them) calls it.
template <int THREADS>
__device__ __forceinline__ void align_slots(
    const void* topk_ids, int ids_is_i64, long long ids_row_stride,
    const int* __restrict__ expert_map, int M, int topk, int global_E, int local_E,
    int* __restrict__ slot_expert, int* __restrict__ expert_offsets, int* __restrict__ sorted_slots,
    int* __restrict__ active_experts, int* __restrict__ num_active, int tile_tokens,
    int* __restrict__ tile_expert, int* __restrict__ tile_start, int* __restrict__ num_tiles, int* counts) {
  __shared__ int warp_sums[32];
  __shared__ int total_slots, total_active, total_tiles;
  const int tid = threadIdx.x;
  const long long S = (long long)M * topk;

  for (int e = tid; e < local_E; e += THREADS) counts[e] = 0;
  __syncthreads();

  for (long long s = tid; s < S; s += THREADS) {
    const long long m = s / topk, k = s - m * topk;
    const long long off = m * ids_row_stride + k;
    long long g = ids_is_i64 ? static_cast<const long long*>(topk_ids)[off]
                             : (long long)static_cast<const int*>(topk_ids)[off];
    int local = -1;
    if (g >= 0 && g < global_E) {
      local = expert_map ? expert_map[g] : (int)g;
      if (local < 0 || local >= local_E) local = -1;
    }
    slot_expert[s] = local;
    if (local >= 0) atomicAdd(&counts[local], 1);
  }
  __syncthreads();

  // Each thread owns a contiguous chunk of experts; scan chunk sums across the block.
  const int per = (local_E + THREADS - 1) / THREADS;
  const int e0 = min(tid * per, local_E), e1 = min(e0 + per, local_E);
  int my_slots = 0, my_active = 0, my_tiles = 0;
  for (int e = e0; e < e1; ++e) {
    my_slots += counts[e];
    my_active += counts[e] > 0;
    if (tile_tokens > 0) my_tiles += (counts[e] + tile_tokens - 1) / tile_tokens;
  }
  int slot_base = block_exclusive_scan<THREADS>(my_slots, warp_sums, &total_slots);
  int active_base = block_exclusive_scan<THREADS>(my_active, warp_sums, &total_active);
  int tile_base = block_exclusive_scan<THREADS>(my_tiles, warp_sums, &total_tiles);
  for (int e = e0; e < e1; ++e) {
    const int c = counts[e];
    expert_offsets[e] = slot_base;
    counts[e] = slot_base;  // becomes the scatter cursor
    if (tile_tokens > 0) {
      for (int t = 0; t < c; t += tile_tokens) {
        tile_expert[tile_base] = e;
        tile_start[tile_base] = slot_base + t;
        ++tile_base;
      }
    }
    slot_base += c;
    if (c > 0) active_experts[active_base++] = e;
  }
  if (tid == 0) {
    expert_offsets[local_E] = total_slots;
    num_active[0] = total_active;
    if (tile_tokens > 0) num_tiles[0] = total_tiles;
  }
  __syncthreads();

  for (long long s = tid; s < S; s += THREADS) {
    const int local = slot_expert[s];
    if (local >= 0) sorted_slots[atomicAdd(&counts[local], 1)] = (int)s;
  }
}

#define SWAPMOE_ALIGN_ARGS                                                                         \
  const int *__restrict__ expert_map, int M, int topk, int global_E, int local_E,                  \
      int *__restrict__ slot_expert, int *__restrict__ expert_offsets, int *__restrict__ sorted_slots, \
      int *__restrict__ active_experts, int *__restrict__ num_active, int tile_tokens,             \
      int *__restrict__ tile_expert, int *__restrict__ tile_start, int *__restrict__ num_tiles
#define SWAPMOE_ALIGN_CALL                                                                         \
  expert_map, M, topk, global_E, local_E, slot_expert, expert_offsets, sorted_slots, active_experts, \
      num_active, tile_tokens, tile_expert, tile_start, num_tiles, counts

// Dynamic shared memory: local_E ints.
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
