// Hopper (sm_90a) grouped GEMMs for many tokens per expert (prefill): wgmma with the tokens
// in the 64-row A slot, operands streamed into a ring of 128-byte-swizzled shared-memory
// stages by a producer warpgroup, consumed by two consumer warpgroups.
//
//   wgmma_moe_gather       xs[p, :]    = x[sorted_slots[p] / topk, :]   (the _xs GEMM1 only)
//   wgmma_moe_gemm1_act    inter[p, j] = act(x[t] . w1[e, j]) * (x[t] . w1[e, N + j]),
//                          t = sorted_slots[p] / topk (p: sorted position, in expert order)
//   wgmma_moe_gemm2        y[slot, r]  = w(slot) * (inter[p] . w2[e, r]),  slot = sorted_slots[p]
//   wgmma_moe_topk_reduce  out[t, :]   = sum over k, in k order, of y[t * topk + k, :]
// y is kept in the activation dtype (rounded once, as vLLM's per-slot cache), which halves
// the bytes GEMM2 writes and the reduction reads against fp32: at deepseek-v3-tp8 M=4096
// that is 0.94 GB less each way.
//
// The tiles come from swapmoe_route_align with a token tile BM of 64 or 128: a tile holds up
// to BM consecutive sorted positions of one expert.
// A operand: GEMM1 gathers the tile's token rows of x with cp.async (all 128 producer
//   threads; rows past the tile's expert and K tails are zero-filled), so no gathered copy
//   of x is written; or (the _xs variant, which the oracle takes for wide N, where the copy
//   is cheap against the GEMMs and TMA keeps the compute-bound loop fed better) reads xs,
//   gathered before, by TMA. GEMM2 reads the intermediate, already in sorted order, as one
//   box of a 2-D tensor map (rows past the tile are computed and dropped, past the end
//   zero-filled).
// B operand: a 3-D tensor map over the weights [E][rows][K], copied by the TMA unit:
//   GEMM1: 128 gate rows j0.. and the 128 up rows N+j0.. (boxes of 128 or 64 rows, see
//          Tile) -> 128 inter columns;
//   GEMM2: 256 rows r0.. of w2 -> 256 output columns.
// K tails are zero-filled by TMA.
//
// CTA: 384 threads. Warpgroup 0 produces kStages stages ahead (GEMM1: all its threads;
// GEMM2: thread 0); warps 4-7 and 8-11 are two consumer warpgroups that run wgmma
// (m64n256k16 at BM = 128, m64n128k16 at BM = 64; fp32 accumulators in registers) and
// release each stage through an mbarrier once its wgmmas have completed.
// Grid: one CTA per (token tile, column block), in groups of `raster_group` token tiles
// that sweep the column blocks together, so that the weight block a group shares is read
// from DRAM once and the group's activations stay in L2.
// Requirements (checked by the oracle and the launcher): bf16/fp16; K and N multiples of 8;
// 16-byte aligned tensors and row strides (TMA).
#include "common/moe_common.cuh"
#include "common/sm90.cuh"
#include "common/wgmma_ops.cuh"

namespace swapmoe {
namespace {

constexpr int kBN = 256;  // B rows per CTA tile (`WGMMA_GEMM2_COLUMNS`; GEMM1: 128 gate + 128 up)
constexpr int kBK = 64;   // reduction elements per stage: one 128-byte swizzle row
constexpr int kConsumerWarps = 8;
constexpr int kThreads = 128 + kConsumerWarps * 32;  // `WGMMA_THREADS`
constexpr int kBBytes = kBN * kBK * 2;
constexpr int kReduceThreads = 128;  // `WGMMA_REDUCE_THREADS`: 8 columns each
constexpr int kPreGatherThreads = 128;  // `WGMMA_GATHER_THREADS`

// The CTA tile by token rows (`WGMMA_TOKEN_TILES`):
//   BM = 128: warpgroup w takes tile rows [64w, 64w + 64) against all 256 B rows (m64n256);
//   BM = 64:  both warpgroups take the 64 rows, warpgroup w B rows [128w, 128w + 128)
//             (m64n128), so a tile of few tokens costs half the MMA work.
// GEMM1's B stage holds gate and up rows so that every warpgroup owns both halves of its
// inter columns: BM = 128: [gate 128][up 128]; BM = 64: [gate 64][up 64][gate 64][up 64].
template <int BM>
struct Tile {
  static constexpr int kWgN = BM == 128 ? kBN : kBN / 2;  // wgmma N per warpgroup
  static constexpr int kAccs = kWgN / 2;                  // fp32 accumulators per thread
  static constexpr int kABytes = BM * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = BM == 128 ? 4 : 5;       // `wgmma_smem_bytes`
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + 1 KiB to align stages
  static constexpr int kGateBox = BM == 128 ? 128 : 64;   // GEMM1 rows per TMA box (`wgmma_gate_box`)
  static_assert(kSmemBytes <= 227 * 1024, "stages exceed an SM's shared memory");
  // Offsets of this warpgroup's rows in the A tile and in the B tile (bytes).
  __device__ static int a_offset(int cw) { return BM == 128 ? cw * 64 * kBK * 2 : 0; }
  __device__ static int b_offset(int cw) { return BM == 128 ? 0 : cw * (kBN / 2) * kBK * 2; }
  // First tile row and first inter column (GEMM1) / output column (GEMM2) of warpgroup cw.
  __device__ static int row_base(int cw) { return BM == 128 ? cw * 64 : 0; }
  __device__ static int gemm1_col_base(int cw) { return BM == 128 ? 0 : cw * 64; }
  __device__ static int gemm2_col_base(int cw) { return BM == 128 ? 0 : cw * (kBN / 2); }
};

struct TileCoord {
  int expert, start, count, block;
};

#ifdef SWAPMOE_SM90A
constexpr int kGatherThreads = 128;  // producer threads that gather GEMM1's A rows

// Decodes blockIdx.x into (token tile, column block), in raster groups; false when the tile
// does not exist (route_align made fewer than the bound).
__device__ __forceinline__ bool tile_coord(const int* __restrict__ tile_expert, const int* __restrict__ tile_start,
                                           const int* __restrict__ num_tiles, const int* __restrict__ expert_offsets,
                                           int tiles_bound, int blocks, int raster_group, int bm, TileCoord& c) {
  const int bid = blockIdx.x;
  const int per_group = raster_group * blocks;
  const int group = bid / per_group;
  const int first = group * raster_group;
  const int size = min(raster_group, tiles_bound - first);
  const int within = bid - group * per_group;
  const int tile = first + within % size;
  c.block = within / size;
  if (tile >= *num_tiles) return false;
  c.expert = tile_expert[tile];
  c.start = tile_start[tile];
  c.count = min(bm, expert_offsets[c.expert + 1] - c.start);
  return true;
}

// The pipeline. The producer loads stage after stage with `load(kt, a_dst, b_dst, bar)`:
// without kGatherA one thread (TMA for both operands), with kGatherA all 128 threads of
// warpgroup 0 (cp.async gathers of the A rows, and thread 0's TMA of B), each of which then
// arrives on the stage's full barrier (`full_arrivals`). Each consumer warpgroup
// accumulates its 64 rows x kWgN into acc.
template <typename T, int BM, bool kGatherA, typename Load>
__device__ __forceinline__ bool pipeline(int ktiles, unsigned char* stages, uint64_t* full, uint64_t* empty,
                                         Load load, float (&acc)[Tile<BM>::kAccs]) {
  using L = Tile<BM>;
  constexpr int S = L::kStages;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < 4) {
    if (kGatherA || threadIdx.x == 0) {
      for (int kt = 0; kt < ktiles; ++kt) {
        const int st = kt % S;
        if (kt >= S) mbar_wait(&empty[st], ((kt / S) - 1) & 1);
        unsigned char* a = stages + st * L::kStageBytes;
        load(kt, a, a + L::kABytes, &full[st]);
      }
    }
    return false;
  }
  const int cw = (warp - 4) >> 2;  // consumer warpgroup
#pragma unroll
  for (int i = 0; i < L::kAccs; ++i) acc[i] = 0.f;
  for (int kt = 0; kt < ktiles; ++kt) {
    const int st = kt % S;
    mbar_wait(&full[st], (kt / S) & 1);
    if (kGatherA) fence_proxy_async_shared();  // the cp.async rows, seen by the wgmmas
    const uint32_t a = smem_u32(stages + st * L::kStageBytes) + L::a_offset(cw);
    const uint32_t b = smem_u32(stages + st * L::kStageBytes + L::kABytes) + L::b_offset(cw);
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      wgmma::Mma<L::kWgN, T>::run(acc, wgmma_desc_sw128(a + kk * 32), wgmma_desc_sw128(b + kk * 32), 1);
    wgmma_commit();
    fence_accumulators(acc);
    // The previous stage's wgmmas are complete: hand its buffers back to the producer.
    wgmma_wait<1>();
    fence_accumulators(acc);
    if (kt > 0 && lane == 0) mbar_arrive(&empty[(kt - 1) % S]);
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  return true;
}

__device__ __forceinline__ unsigned char* aligned_stages(unsigned char* smem) {
  const uint32_t base = smem_u32(smem);
  return smem + (((base + 1023u) & ~1023u) - base);
}

// `full_arrivals`: 1 (the TMA thread), or 1 + 128 when the producer warpgroup gathers A.
template <int S>
__device__ __forceinline__ void init_barriers(uint64_t* full, uint64_t* empty, int full_arrivals, const TensorMap* a,
                                              const TensorMap* b) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(&full[i], full_arrivals);
      mbar_init(&empty[i], kConsumerWarps);
    }
    mbar_init_fence();
    if (a) tma_prefetch_map(a);
    tma_prefetch_map(b);
  }
  __syncthreads();
}
#endif

// kGatherA: the producer warpgroup gathers the A rows from x (cp.async); otherwise they were
// gathered before (wgmma_moe_gather into xs, sorted order) and thread 0 copies them by TMA.
template <typename T, int BM, bool kGatherA>
__device__ __forceinline__ void gemm1_act(const T* __restrict__ x, long long x_row_stride, const TensorMap* xs_map,
                                          const TensorMap* w1_map,
                                          const void* __restrict__ topk_weights, int topk_weights_code,
                                          long long topk_weights_row_stride, const int* __restrict__ expert_offsets,
                                          const int* __restrict__ sorted_slots, const int* __restrict__ tile_expert,
                                          const int* __restrict__ tile_start, const int* __restrict__ num_tiles,
                                          int tiles_bound, int raster_group, int topk, int N, int K, int act,
                                          int weight_on_input, T* __restrict__ inter) {
#ifdef SWAPMOE_SM90A
  using L = Tile<BM>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[L::kStages], empty[L::kStages];
  TileCoord c;
  constexpr int kCols = kBN / 2;  // inter columns per CTA
  const int blocks = (N + kCols - 1) / kCols;
  if (!tile_coord(tile_expert, tile_start, num_tiles, expert_offsets, tiles_bound, blocks, raster_group, BM, c))
    return;
  init_barriers<L::kStages>(full, empty, kGatherA ? 1 + kGatherThreads : 1, kGatherA ? nullptr : xs_map,
                            w1_map);
  unsigned char* stages = aligned_stages(smem_raw);
  const int j0 = c.block * kCols;
  // The A rows are gathered straight from x: producer thread t copies 16-byte chunk t % 8
  // of tile rows t / 8 + 16 i, into the 128-byte swizzle layout the wgmma descriptors read.
  constexpr int kRowsPerThread = BM / 16;
  const int chunk = threadIdx.x & 7;
  const T* src[kRowsPerThread];
  uint32_t dst[kRowsPerThread];
  if (kGatherA && threadIdx.x < kGatherThreads) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int r = (threadIdx.x >> 3) + 16 * i;
      src[i] = r < c.count ? x + (long long)(sorted_slots[c.start + r] / topk) * x_row_stride + chunk * 8 : nullptr;
      dst[i] = r * (kBK * 2) + ((chunk ^ (r & 7)) << 4);
    }
  }
  auto load = [&](int kt, unsigned char* a, unsigned char* b, uint64_t* bar) {
    const int k0 = kt * kBK;
    if (threadIdx.x == 0) {
      mbar_arrive_expect(bar, kGatherA ? kBBytes : L::kStageBytes);
      if (!kGatherA) tma_load_2d(a, xs_map, k0, c.start, bar);
      constexpr int kBox = L::kGateBox, kBoxBytes = kBox * kBK * 2;
#pragma unroll
      for (int h = 0; h < kCols / kBox; ++h) {
        tma_load_3d(b + 2 * h * kBoxBytes, w1_map, k0, j0 + h * kBox, c.expert, bar);
        tma_load_3d(b + (2 * h + 1) * kBoxBytes, w1_map, k0, N + j0 + h * kBox, c.expert, bar);
      }
    }
    if (!kGatherA) return;
    const uint32_t a_base = smem_u32(a);
    const bool k_ok = k0 + chunk * 8 < K;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const bool ok = k_ok && src[i] != nullptr;
      cp_async_16_zfill(a_base + dst[i], ok ? src[i] + k0 : x, ok);
    }
    cp_async_arrive_noinc(bar);
  };
  float acc[L::kAccs];
  if (!pipeline<T, BM, kGatherA>((K + kBK - 1) / kBK, stages, full, empty, load, acc)) return;

  // Accumulator layout of m64nNk16: n8 block j, register 4j + h holds row
  // 16 * warp + lane / 4 + 8 * (h >> 1), column 8j + 2 * (lane % 4) + (h & 1).
  // A warpgroup's first kWgN / 2 columns are gate columns, the rest the matching up columns.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, cw = (warp - 4) >> 2;
  const int row0 = L::row_base(cw) + (warp & 3) * 16 + (lane >> 2);
  const int col0 = j0 + L::gemm1_col_base(cw);
  constexpr int kGateBlocks = L::kWgN / 16;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + half * 8;
    if (r >= c.count) continue;
    const int p = c.start + r;
    float w = 1.f;
    if (weight_on_input)
      w = slot_router_weight(topk_weights, topk_weights_code, topk_weights_row_stride, topk, sorted_slots[p]);
    T* out = inter + (long long)p * N + col0;
#pragma unroll
    for (int j = 0; j < kGateBlocks; ++j) {
      const int col = 8 * j + 2 * (lane & 3);
      if (col0 + col >= N) continue;
      const float g0 = acc[4 * j + 2 * half] * w, g1 = acc[4 * j + 2 * half + 1] * w;
      const float u0 = acc[4 * (j + kGateBlocks) + 2 * half] * w;
      const float u1 = acc[4 * (j + kGateBlocks) + 2 * half + 1] * w;
      const T v0 = from_f32<T>(activate(act, g0) * u0), v1 = from_f32<T>(activate(act, g1) * u1);
      T pair[2] = {v0, v1};
      *reinterpret_cast<uint32_t*>(out + col) = *reinterpret_cast<const uint32_t*>(pair);
    }
  }
#endif
}

template <typename T, int BM>
__device__ __forceinline__ void gemm2(const TensorMap* inter_map, const TensorMap* w2_map,
                                      const void* __restrict__ topk_weights, int topk_weights_code,
                                      long long topk_weights_row_stride, const int* __restrict__ expert_offsets,
                                      const int* __restrict__ sorted_slots, const int* __restrict__ tile_expert,
                                      const int* __restrict__ tile_start, const int* __restrict__ num_tiles,
                                      int tiles_bound, int raster_group, int topk, int N, int K, int weight_on_input,
                                      T* __restrict__ y) {
#ifdef SWAPMOE_SM90A
  using L = Tile<BM>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[L::kStages], empty[L::kStages];
  TileCoord c;
  const int blocks = (K + kBN - 1) / kBN;
  if (!tile_coord(tile_expert, tile_start, num_tiles, expert_offsets, tiles_bound, blocks, raster_group, BM, c))
    return;
  init_barriers<L::kStages>(full, empty, 1, inter_map, w2_map);
  unsigned char* stages = aligned_stages(smem_raw);
  const int r0 = c.block * kBN;
  auto load = [&](int kt, unsigned char* a, unsigned char* b, uint64_t* bar) {
    const int k0 = kt * kBK;
    mbar_arrive_expect(bar, L::kStageBytes);
    tma_load_2d(a, inter_map, k0, c.start, bar);
    tma_load_3d(b, w2_map, k0, r0, c.expert, bar);
  };
  float acc[L::kAccs];
  if (!pipeline<T, BM, false>((N + kBK - 1) / kBK, stages, full, empty, load, acc)) return;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, cw = (warp - 4) >> 2;
  const int row0 = L::row_base(cw) + (warp & 3) * 16 + (lane >> 2);
  const int col0 = r0 + L::gemm2_col_base(cw);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + half * 8;
    if (r >= c.count) continue;
    const int slot = sorted_slots[c.start + r];
    const float w = weight_on_input
                        ? 1.f
                        : slot_router_weight(topk_weights, topk_weights_code, topk_weights_row_stride, topk, slot);
    T* out = y + (long long)slot * K + col0;
#pragma unroll
    for (int j = 0; j < L::kWgN / 8; ++j) {
      const int col = 8 * j + 2 * (lane & 3);
      if (col0 + col >= K) continue;
      T pair[2] = {from_f32<T>(acc[4 * j + 2 * half] * w), from_f32<T>(acc[4 * j + 2 * half + 1] * w)};
      *reinterpret_cast<uint32_t*>(out + col) = *reinterpret_cast<const uint32_t*>(pair);
    }
  }
#endif
}

// out[t, c .. c + 8) = sum over k, in k order, of y[t * topk + k, c .. c + 8) for the slots
// of local experts (slot_expert >= 0), as 16-byte loads (K a multiple of 8).
template <typename T>
__device__ __forceinline__ void topk_reduce(const T* __restrict__ y, const int* __restrict__ slot_expert, int topk,
                                            int K, T* __restrict__ out, long long out_row_stride) {
  pdl_launch_dependents();
  const int t = blockIdx.y;
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (c >= K) return;
  float s[8] = {};
  const long long first = (long long)t * topk;
  constexpr int kChunk = 8;  // slots whose experts, then values, are loaded together
  for (int k0 = 0; k0 < topk; k0 += kChunk) {
    int ex[kChunk];
    uint4 v[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) ex[i] = k0 + i < topk ? slot_expert[first + k0 + i] : -1;
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      v[i] = ex[i] >= 0 ? *reinterpret_cast<const uint4*>(y + (first + k0 + i) * K + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (ex[i] < 0) continue;
      const T* e = reinterpret_cast<const T*>(&v[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) s[j] += to_f32(e[j]);
    }
  }
  T* o = out + (long long)t * out_row_stride + c;
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = from_f32<T>(s[j]);
}

// xs[p, :] = x[sorted_slots[p] / topk, :] for the sorted positions of local experts, as
// 16-byte vectors (row bytes a multiple of 16). One CTA per position.
__device__ __forceinline__ void gather_rows(const uint4* __restrict__ x, long long x_row_vectors,
                                            const int* __restrict__ sorted_slots,
                                            const int* __restrict__ expert_offsets, int local_experts, int topk,
                                            int row_vectors, uint4* __restrict__ xs) {
  const int p = blockIdx.x;
  if (p >= expert_offsets[local_experts]) return;
  const uint4* src = x + (long long)(sorted_slots[p] / topk) * x_row_vectors;
  uint4* dst = xs + (long long)p * row_vectors;
  for (int i = threadIdx.x; i < row_vectors; i += kPreGatherThreads) dst[i] = src[i];
}

}  // namespace
}  // namespace swapmoe

extern "C" __global__ void __launch_bounds__(swapmoe::kPreGatherThreads)
    wgmma_moe_gather(const uint4* x, long long x_row_vectors, const int* sorted_slots, const int* expert_offsets,
                     int local_experts, int topk, int row_vectors, uint4* xs) {
  swapmoe::gather_rows(x, x_row_vectors, sorted_slots, expert_offsets, local_experts, topk, row_vectors, xs);
}

// GEMM1 in both A modes: ..._t<BM> gathers in the kernel, ..._t<BM>_xs reads the gathered xs.
#define SWAPMOE_WGMMA_GEMM1(NAME, T, BM, GATHER)                                                                  \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1) NAME(                                       \
      const T* x, long long x_row_stride, const __grid_constant__ swapmoe::TensorMap xs_map,                      \
      const __grid_constant__ swapmoe::TensorMap w1_map, const void* topk_weights, int topk_weights_code,         \
      long long topk_weights_row_stride, const int* expert_offsets, const int* sorted_slots,                      \
      const int* tile_expert, const int* tile_start, const int* num_tiles, int tiles_bound, int raster_group,     \
      int topk, int N, int K, int act, int weight_on_input, T* inter) {                                           \
    swapmoe::gemm1_act<T, BM, GATHER>(x, x_row_stride, &xs_map, &w1_map, topk_weights, topk_weights_code,         \
                                      topk_weights_row_stride, expert_offsets, sorted_slots, tile_expert,         \
                                      tile_start, num_tiles, tiles_bound, raster_group, topk, N, K, act,          \
                                      weight_on_input, inter);                                                    \
  }

#define SWAPMOE_WGMMA_INSTANTIATE(SUFFIX, T, BM)                                                                  \
  SWAPMOE_WGMMA_GEMM1(wgmma_moe_gemm1_act_##SUFFIX##_t##BM, T, BM, true)                                          \
  SWAPMOE_WGMMA_GEMM1(wgmma_moe_gemm1_act_##SUFFIX##_t##BM##_xs, T, BM, false)                                    \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1) wgmma_moe_gemm2_##SUFFIX##_t##BM(            \
      const __grid_constant__ swapmoe::TensorMap inter_map, const __grid_constant__ swapmoe::TensorMap w2_map,    \
      const void* topk_weights, int topk_weights_code, long long topk_weights_row_stride,                         \
      const int* expert_offsets, const int* sorted_slots, const int* tile_expert, const int* tile_start,          \
      const int* num_tiles, int tiles_bound, int raster_group, int topk, int N, int K, int weight_on_input,       \
      T* y) {                                                                                                     \
    swapmoe::gemm2<T, BM>(&inter_map, &w2_map, topk_weights, topk_weights_code, topk_weights_row_stride,          \
                          expert_offsets, sorted_slots, tile_expert, tile_start, num_tiles, tiles_bound,          \
                          raster_group, topk, N, K, weight_on_input, y);                                          \
  }

#define SWAPMOE_WGMMA_REDUCE(SUFFIX, T)                                                                           \
  extern "C" __global__ void __launch_bounds__(swapmoe::kReduceThreads) wgmma_moe_topk_reduce_##SUFFIX(           \
      const T* y, const int* slot_expert, int topk, int K, T* out, long long out_row_stride) {                    \
    swapmoe::topk_reduce<T>(y, slot_expert, topk, K, out, out_row_stride);                                        \
  }

SWAPMOE_WGMMA_REDUCE(bf16, __nv_bfloat16)
SWAPMOE_WGMMA_REDUCE(f16, __half)
SWAPMOE_WGMMA_INSTANTIATE(bf16, __nv_bfloat16, 64)
SWAPMOE_WGMMA_INSTANTIATE(bf16, __nv_bfloat16, 128)
SWAPMOE_WGMMA_INSTANTIATE(f16, __half, 64)
SWAPMOE_WGMMA_INSTANTIATE(f16, __half, 128)
