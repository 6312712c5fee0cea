// Routing alignment inside one CTA, for the kernels that group the slots themselves instead
// of reading swapmoe_route_align's output (the wgmma GEMM1 at decode sizes, `Plan::align_in_gemm1`).
//
// Every CTA of the kernel runs it on its own shared memory, so the grouping must come out
// the same in every CTA: within an expert the slots are in ascending slot order (route_align's
// order there is unspecified, which is fine where one kernel writes it for all). CTA 0 also
// writes the grouping to global memory in route_align's layout, for the kernels after it.
//
// Outputs (shared memory, and CTA 0's copy in global memory):
//   slot_expert[s]     local expert of slot s, or -1 (id out of range, expert_map -1, id -1)
//   expert_offsets[e]  start of expert e's slots in sorted_slots; [local_E] is the total
//   sorted_slots[i]    slot indices grouped by expert, ascending within an expert
//   active_experts[j]  the j-th local expert with at least one slot, j < num_active
//   tile_expert[i], tile_start[i], num_tiles   the token tiles of tile_tokens rows
// An id outside [0, global_E) or mapped outside [0, local_E) is never used to index memory.
#pragma once
#include <cstddef>

#include "moe_common.cuh"

namespace swapmoe {

// The exclusive prefix sums of the three counts in v over the block's THREADS threads, in one
// pass (every thread calls it; two block barriers, where three separate scans took nine); total
// gets the three sums. warp_sums: 3 * THREADS / 32 ints of shared memory, left holding the
// warps' prefixes (a caller that reuses it puts a block barrier first).
struct Counts3 {
  int v[3];
};
template <int THREADS>
__device__ __forceinline__ Counts3 block_exclusive_scan3(const Counts3& v, int (*warp_sums)[THREADS / 32],
                                                         int* total) {
  static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps, at most 32");
  constexpr int kWarps = THREADS / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  Counts3 inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const int n = __shfl_up_sync(0xffffffffu, inc.v[i], o);
      if (lane >= o) inc.v[i] += n;
    }
  }
  if (lane == 31) {
#pragma unroll
    for (int i = 0; i < 3; ++i) warp_sums[i][warp] = inc.v[i];
  }
  __syncthreads();
  if (warp < 3) {  // warp i scans the warp totals of count i
    const int w = lane < kWarps ? warp_sums[warp][lane] : 0;
    int winc = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, winc, o);
      if (lane >= o) winc += n;
    }
    if (lane < kWarps) warp_sums[warp][lane] = winc - w;  // exclusive prefix of warp totals
    if (lane == 31) total[warp] = winc;
  }
  __syncthreads();
  Counts3 r;
#pragma unroll
  for (int i = 0; i < 3; ++i) r.v[i] = warp_sums[i][warp] + inc.v[i] - v.v[i];
  return r;
}

// What a kernel needs to group the slots itself; topk_ids == nullptr: it does not (it reads
// route_align's output). The global outputs CTA 0 writes besides the tile metadata, which
// go where the kernel's Tiles point.
struct CtaAlign {
  const void* topk_ids;  // [M, topk] int32 (ids_is_i64 == 0) or int64
  long long ids_row_stride;
  const int* expert_map;  // [global_E] or nullptr
  int* slot_expert;
  int* active_experts;
  int* num_active;
  int ids_is_i64, M, global_E, local_E;
};
// The launcher's #[repr(C)] twin (src/cuda/launch.rs) has these offsets.
static_assert(sizeof(CtaAlign) == 64 && alignof(CtaAlign) == 8, "CtaAlign's size");
static_assert(offsetof(CtaAlign, ids_row_stride) == 8 && offsetof(CtaAlign, num_active) == 40 &&
                  offsetof(CtaAlign, ids_is_i64) == 48 && offsetof(CtaAlign, local_E) == 60,
              "CtaAlign's layout");

// Ints of shared memory align_in_cta takes (`oracle::cta_align_smem_bytes` / 4).
__host__ __device__ constexpr int cta_align_ints(int slots, int local_E, int tiles_bound) {
  return 3 * local_E + 1 + 3 * slots + 2 * tiles_bound;
}

// Where align_in_cta leaves its outputs in shared memory.
struct CtaAlignOut {
  const int* expert_offsets;
  const int* sorted_slots;
  const int* tile_expert;
  const int* tile_start;
  const int* num_tiles;
};

// Groups the M * topk slots in `smem` (cta_align_ints(M * topk, local_E, tiles_bound) ints);
// CTA 0 (blockIdx.x == 0) also writes every output to global memory (g_* and the CtaAlign's).
// Every thread of the block (THREADS of them) calls it. The shared outputs are complete when it
// returns (a block barrier precedes CTA 0's global stores, the last thing it does). The place of
// a slot among its expert's costs a pass over the expert's slots, so an expert with c slots
// costs c^2 / THREADS steps: cheap at decode sizes (the oracle's bound, M * topk <= 512).
template <int THREADS>
__device__ __forceinline__ CtaAlignOut align_in_cta(const CtaAlign& a, int topk, int tile_tokens, int tiles_bound,
                                                    int* smem, int* g_expert_offsets, int* g_sorted_slots,
                                                    int* g_tile_expert, int* g_tile_start, int* g_num_tiles) {
  __shared__ int warp_sums[3][THREADS / 32];
  __shared__ int totals[3];  // slots, active experts, tiles
  const int tid = threadIdx.x, E = a.local_E, S = a.M * topk;
  int* counts = smem;                    // [E], then each expert's scatter cursor
  int* offsets = counts + E;             // [E + 1]
  int* active = offsets + E + 1;         // [E]
  int* slot_e = active + E;              // [S]
  int* unordered = slot_e + S;           // [S]: each expert's slots in atomic order
  int* sorted = unordered + S;           // [S]: ascending within each expert
  int* tile_e = sorted + S;              // [tiles_bound]
  int* tile_s = tile_e + tiles_bound;    // [tiles_bound]
  for (int e = tid; e < E; e += THREADS) counts[e] = 0;
  __syncthreads();
  // Slots tid, tid + THREADS, ...: two ids loaded before either is used.
  for (int s0 = tid; s0 < S; s0 += 2 * THREADS) {
    long long g[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int s = s0 + u * THREADS;
      const int m = s / topk;
      const long long off = (long long)m * a.ids_row_stride + (s - m * topk);
      g[u] = s >= S ? -1
             : a.ids_is_i64 ? static_cast<const long long*>(a.topk_ids)[off]
                            : (long long)static_cast<const int*>(a.topk_ids)[off];
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int s = s0 + u * THREADS;
      if (s >= S) continue;
      int id = g[u] >= 0 && g[u] < a.global_E ? (int)g[u] : -1;
      if (a.expert_map && id >= 0) id = a.expert_map[id];
      const int local = id >= 0 && id < E ? id : -1;
      slot_e[s] = local;
      if (local >= 0) atomicAdd(&counts[local], 1);
    }
  }
  __syncthreads();
  // Each thread a contiguous run of experts; the runs' sums scanned over the block.
  const int per = (E + THREADS - 1) / THREADS;
  const int e0 = min(tid * per, E), e1 = min(e0 + per, E);
  int my_slots = 0, my_active = 0, my_tiles = 0;
  for (int e = e0; e < e1; ++e) {
    const int c = counts[e];
    my_slots += c;
    my_active += c > 0;
    my_tiles += (c + tile_tokens - 1) / tile_tokens;
  }
  const Counts3 bases = block_exclusive_scan3<THREADS>(Counts3{{my_slots, my_active, my_tiles}}, warp_sums, totals);
  int slot_base = bases.v[0], active_base = bases.v[1], tile_base = bases.v[2];
  const int total_slots = totals[0], total_active = totals[1], total_tiles = totals[2];
  for (int e = e0; e < e1; ++e) {
    const int c = counts[e];
    offsets[e] = slot_base;
    counts[e] = slot_base;  // the scatter cursor
    for (int t = 0; t < c; t += tile_tokens) {
      tile_e[tile_base] = e;
      tile_s[tile_base] = slot_base + t;
      ++tile_base;
    }
    if (c > 0) active[active_base++] = e;
    slot_base += c;
  }
  if (tid == 0) offsets[E] = total_slots;
  __syncthreads();
  for (int s = tid; s < S; s += THREADS) {
    const int e = slot_e[s];
    if (e >= 0) unordered[atomicAdd(&counts[e], 1)] = s;
  }
  __syncthreads();
  // A slot's place among its expert's: how many of them have a lower index (at decode an
  // expert has a few slots; the loop is over the expert's own).
  for (int s = tid; s < S; s += THREADS) {
    const int e = slot_e[s];
    if (e < 0) continue;
    const int lo = offsets[e], hi = offsets[e + 1];
    int rank = 0;
    for (int i = lo; i < hi; ++i) rank += unordered[i] < s;
    sorted[lo + rank] = s;
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int s = tid; s < S; s += THREADS) {
      a.slot_expert[s] = slot_e[s];
      if (s < total_slots) g_sorted_slots[s] = sorted[s];
    }
    for (int e = tid; e <= E; e += THREADS) g_expert_offsets[e] = offsets[e];
    for (int j = tid; j < total_active; j += THREADS) a.active_experts[j] = active[j];
    for (int i = tid; i < total_tiles; i += THREADS) {
      g_tile_expert[i] = tile_e[i];
      g_tile_start[i] = tile_s[i];
    }
    if (tid == 0) {
      a.num_active[0] = total_active;
      g_num_tiles[0] = total_tiles;
    }
  }
  return CtaAlignOut{offsets, sorted, tile_e, tile_s, &totals[2]};
}

}  // namespace swapmoe
