// Hopper (sm_90a) swap-AB decode kernels: the expert weights fill wgmma's 64-row A slot and
// the few tokens are the narrow N side (m64nNTk16 with NT = 8, 16, 32 or 64 >= M), so at
// decode the weights stream as whole TMA boxes and no token rows are padded to 64.
//
//   swap_moe_gemm1_act   h[a, t, j] = sum over t's slots on e of
//                                     w * act(x[t] . w1[e, j]) * (x[t] . w1[e, N + j])
//                        (with the router weight on the input: act(w x[t] . w1[e, j]) * (w x[t] . ...))
//                        e = the a-th active local expert in ascending id order; 0 for a token
//                        that does not route to e
//   swap_moe_gemm2_sum   out[t, r] = sum over the active experts a, in order, of h[a, t] . w2[e_a, r]
//
// h has one row per (active expert, token) with the router weight already applied, so GEMM2
// accumulates all of a token's experts in one accumulator column: no per-slot output, no
// top-k sum kernel, no atomics, and the order of every sum is fixed (deterministic). A token
// that lists an expert twice gets both slots summed into its row of h.
// No align kernel: every CTA reads topk_ids (M*topk <= kMaxSlots) into a shared bitmap of
// the active experts.
//
// GEMM1 CTA: 64 inter columns j0.. of active expert a = blockIdx.y, and one part of K when a
//   cluster of CTAs splits K. Each stage holds 64 gate rows and the 64 matching up rows of
//   w1[e] x 64 of K (two TMA boxes, 128-byte swizzle) and the NT token rows of x x 64 (one
//   TMA box; rows >= M are zero-filled). The gate and up accumulators have the same layout,
//   so act-and-mul is elementwise in registers.
// GEMM2 CTA: 64 output rows r0.., and a contiguous run of the active experts when a cluster
//   splits them. Each stage holds 64 rows of w2[e] x 64 of N and h[a]'s NT token rows x 64.
// With a split, the CTAs of a cluster add their fp32 accumulators through distributed
// shared memory in rank order, and rank 0 stores.
// GEMM2's producer issues its first stages' weight copies before griddepcontrol.wait (the
// weights do not depend on GEMM1), so its weight stream starts under GEMM1's tail.
// Warps 0-3 are the consumer warpgroup (wgmma, fp32 accumulators in registers), warp 4
// the producer (one thread issues the TMA copies). Stages are sized so that two CTAs fit
// an SM.
// Requirements (checked by the oracle and the launcher): sm_90a; bf16/fp16; K and N
// multiples of 8 with 16-byte aligned tensors and rows (TMA); M <= 64, M*topk <= 512.
#include "common/moe_common.cuh"
#include "common/sm90.cuh"
#include "common/wgmma_ops.cuh"

namespace swapmoe {
namespace {

constexpr int kRows = 64;                // weight rows per CTA: wgmma's A slot (`SWAP_ROWS`)
constexpr int kBK = 64;                  // reduction elements per stage: one 128-byte row
constexpr int kThreads = 160;            // `SWAP_THREADS`: a consumer warpgroup + a producer warp
constexpr int kMaxSlots = 512;           // `SWAP_MAX_SLOTS`
constexpr int kMaxExperts = 8192;        // `MAX_GPU_LOCAL_EXPERTS`

// A stage: for each of kSub consecutive 64-wide K slices, kBoxes boxes of 64 weight rows x 64
// (so each weight row is read as kSub * 128 contiguous bytes at once), then the NT token
// rows x 64 of each slice (`swap_smem_bytes`). As many stages as fit 102 KiB (two CTAs per
// SM) when that is at least three, else as many as fit 200 KiB (one CTA per SM).
template <int NT, int kBoxes, int kSub>
struct Stages {
  static constexpr int kBoxBytes = kRows * kBK * 2;
  static constexpr int kTokenBytes = NT * kBK * 2;
  static constexpr int kWeightBytes = kBoxes * kSub * kBoxBytes;
  static constexpr int kStageBytes = kWeightBytes + kSub * kTokenBytes;
  static constexpr int kTwoPerSm = 102 * 1024 / kStageBytes;
  static constexpr int kCount = kTwoPerSm >= 3 ? kTwoPerSm : 200 * 1024 / kStageBytes;
  static constexpr int kSmemBytes = kCount * kStageBytes + 1024;  // + 1 KiB to align stages
  static_assert(kStageBytes % 1024 == 0, "stages keep the 1024-byte swizzle alignment");
  static_assert(kCount >= 2, "at least two stages in flight");
  static_assert(kSmemBytes + 6 * 1024 <= 227 * 1024, "stages and routing fit an SM");
  // Shared offsets in a stage: weight box b of slice j, and the token rows of slice j.
  __device__ static constexpr int weight(int b, int j) { return (b * kSub + j) * kBoxBytes; }
  __device__ static constexpr int tokens(int j) { return kWeightBytes + j * kTokenBytes; }
};

struct Routing {
  unsigned bits[kMaxExperts / 32];  // active local experts
  int slot_expert[kMaxSlots];       // local expert of each slot, or -1
  float slot_weight[kMaxSlots];     // router weight of each slot (GEMM1)
  int active;                       // number of active local experts
  int expert;                       // GEMM1: this CTA's expert, or -1
};

#ifdef SWAPMOE_SM90A
constexpr int kProducerWarp = 4;
constexpr int kConsumerThreads = 128;

// Every thread: the slots' local experts (and router weights when `topk_weights` is given)
// and the bitmap of active experts, in shared memory.
__device__ __forceinline__ void mark_active(Routing& r, const void* __restrict__ topk_ids, int ids_is_i64,
                                            long long ids_row_stride, const int* __restrict__ expert_map,
                                            const void* __restrict__ topk_weights, int topk_weights_code,
                                            long long topk_weights_row_stride, int M, int topk, int global_E,
                                            int local_E) {
  const int S = M * topk, words = (local_E + 31) / 32;
  for (int w = threadIdx.x; w < words; w += kThreads) r.bits[w] = 0u;
  __syncthreads();
  for (int s = threadIdx.x; s < S; s += kThreads) {
    const int e = slot_local_expert(topk_ids, ids_is_i64, ids_row_stride, expert_map, topk, global_E, local_E, s);
    r.slot_expert[s] = e;
    if (topk_weights)
      r.slot_weight[s] = slot_router_weight(topk_weights, topk_weights_code, topk_weights_row_stride, topk, s);
    if (e >= 0) atomicOr(&r.bits[e >> 5], 1u << (e & 31));
  }
  __syncthreads();
}

// One whole warp: the number of active experts, and the `which`-th of them in ascending id
// order (-1 when there is none), in every lane.
__device__ __forceinline__ void count_and_pick(const unsigned* bits, int words, int which, int& count,
                                               int& picked) {
  const int lane = threadIdx.x & 31;
  int before = 0, mine = -1;
  for (int base = 0; base < words; base += 32) {
    unsigned w = base + lane < words ? bits[base + lane] : 0u;
    const int c = __popc(w);
    int incl = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int first = before + incl - c;
    if (which >= first && which < first + c) {
      for (int i = which - first; i > 0; --i) w &= w - 1;
      mine = (base + lane) * 32 + __ffs(w) - 1;
    }
    before += __shfl_sync(0xffffffffu, incl, 31);
  }
  const unsigned has = __ballot_sync(0xffffffffu, mine >= 0);
  picked = has ? __shfl_sync(0xffffffffu, mine, __ffs(has) - 1) : -1;
  count = before;
}

// The next active expert after `after`, or -1.
__device__ __forceinline__ int next_active(const unsigned* bits, int words, int after) {
  const int e = after + 1;
  int w = e >> 5;
  if (w >= words) return -1;
  unsigned m = bits[w] & (0xffffffffu << (e & 31));
  while (m == 0u) {
    if (++w >= words) return -1;
    m = bits[w];
  }
  return w * 32 + __ffs(m) - 1;
}

__device__ __forceinline__ unsigned char* aligned_stages(unsigned char* smem) {
  const uint32_t base = smem_u32(smem);
  return smem + (((base + 1023u) & ~1023u) - base);
}

template <int kCount>
__device__ __forceinline__ void init_barriers(uint64_t* full, uint64_t* empty, const TensorMap* a,
                                              const TensorMap* b) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < kCount; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kConsumerThreads / 32);
    }
    mbar_init_fence();
    tma_prefetch_map(a);
    tma_prefetch_map(b);
  }
}

// The consumer warpgroup: `items` stages, each kBK / 16 wgmmas per weight box against the
// stage's token rows, accumulated into acc[box]. Releases each stage to the producer once
// its wgmmas have completed.
template <typename T, int NT, int kBoxes, int kSub>
__device__ __forceinline__ void consume(int items, unsigned char* stages, uint64_t* full, uint64_t* empty,
                                        float (&acc)[kBoxes][NT / 2]) {
  using L = Stages<NT, kBoxes, kSub>;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int b = 0; b < kBoxes; ++b)
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[b][i] = 0.f;
  for (int it = 0; it < items; ++it) {
    const int st = it % L::kCount;
    mbar_wait(&full[st], (it / L::kCount) & 1);
    const uint32_t base = smem_u32(stages + st * L::kStageBytes);
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) fence_accumulators(acc[b]);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kSub; ++j)
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
#pragma unroll
        for (int b = 0; b < kBoxes; ++b)
          wgmma::Mma<NT, T>::run(acc[b], wgmma_desc_sw128(base + L::weight(b, j) + kk * 32),
                                 wgmma_desc_sw128(base + L::tokens(j) + kk * 32), 1);
    wgmma_commit();
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) fence_accumulators(acc[b]);
    wgmma_wait<1>();
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) fence_accumulators(acc[b]);
    if (it > 0 && lane == 0) mbar_arrive(&empty[(it - 1) % L::kCount]);
  }
  wgmma_wait<0>();
#pragma unroll
  for (int b = 0; b < kBoxes; ++b) fence_accumulators(acc[b]);
}

// Every thread of the cluster: rank 0's consumers end with the sum over the cluster's ranks,
// in rank order, of acc. `scratch` (kBoxes * NT / 2 * 128 floats) is this CTA's drained
// stage memory.
template <int NT, int kBoxes>
__device__ __forceinline__ void cluster_sum(float (&acc)[kBoxes][NT / 2], float* scratch, bool consumer) {
  const uint32_t rank = cluster_ctarank(), ranks = cluster_nctarank();
  if (consumer) {
#pragma unroll
    for (int b = 0; b < kBoxes; ++b)
#pragma unroll
      for (int i = 0; i < NT / 2; ++i) scratch[(b * (NT / 2) + i) * kConsumerThreads + threadIdx.x] = acc[b][i];
  }
  cluster_sync();
  if (consumer && rank == 0) {
    for (uint32_t q = 1; q < ranks; ++q)
#pragma unroll
      for (int b = 0; b < kBoxes; ++b)
#pragma unroll
        for (int i = 0; i < NT / 2; ++i)
          acc[b][i] += ld_shared_cluster_f32(
              smem_u32(&scratch[(b * (NT / 2) + i) * kConsumerThreads + threadIdx.x]), q);
  }
  cluster_sync();  // the peers' scratch stays alive until rank 0 has read it
}
#endif

template <typename T, int NT, int kSub>
__device__ __forceinline__ void gemm1_act(const TensorMap* x_map, const TensorMap* w1_map,
                                          const void* __restrict__ topk_weights, int topk_weights_code,
                                          long long topk_weights_row_stride, const void* __restrict__ topk_ids,
                                          int ids_is_i64, long long ids_row_stride,
                                          const int* __restrict__ expert_map, int M, int topk, int global_E,
                                          int local_E, int N, int K, int act, int weight_on_input,
                                          T* __restrict__ h) {
#ifdef SWAPMOE_SM90A
  using L = Stages<NT, 2, kSub>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ Routing r;
  __shared__ __align__(8) uint64_t full[L::kCount], empty[L::kCount];
  init_barriers<L::kCount>(full, empty, x_map, w1_map);  // made visible by mark_active's barriers
  pdl_wait();
  pdl_launch_dependents();
  mark_active(r, topk_ids, ids_is_i64, ids_row_stride, expert_map, topk_weights, topk_weights_code,
              topk_weights_row_stride, M, topk, global_E, local_E);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp == 0) {
    int count, picked;
    count_and_pick(r.bits, (local_E + 31) / 32, blockIdx.y, count, picked);
    if (lane == 0) r.expert = picked;
  }
  __syncthreads();
  const int e = r.expert;
  if (e < 0) return;  // fewer active experts than grid rows: the whole cluster leaves
  const int ranks = cluster_nctarank(), rank = cluster_ctarank();
  const int j0 = (blockIdx.x / ranks) * kRows;
  const int ktiles = (K + kBK * kSub - 1) / (kBK * kSub), per = (ktiles + ranks - 1) / ranks;
  const int kt0 = min(ktiles, rank * per), items = min(ktiles, kt0 + per) - kt0;
  unsigned char* stages = aligned_stages(smem_raw);
  float acc[2][NT / 2];
  if (warp == kProducerWarp) {
    if (lane == 0) {
      for (int it = 0; it < items; ++it) {
        const int st = it % L::kCount;
        if (it >= L::kCount) mbar_wait(&empty[st], ((it / L::kCount) - 1) & 1);
        unsigned char* s = stages + st * L::kStageBytes;
        mbar_arrive_expect(&full[st], L::kStageBytes);
#pragma unroll
        for (int j = 0; j < kSub; ++j) {
          const int k0 = ((kt0 + it) * kSub + j) * kBK;
          tma_load_3d(s + L::weight(0, j), w1_map, k0, j0, e, &full[st]);
          tma_load_3d(s + L::weight(1, j), w1_map, k0, N + j0, e, &full[st]);
          tma_load_2d(s + L::tokens(j), x_map, k0, 0, &full[st]);
        }
      }
    }
  } else {
    consume<T, NT, 2, kSub>(items, stages, full, empty, acc);
  }
  if (ranks > 1) cluster_sum<NT, 2>(acc, reinterpret_cast<float*>(stages), warp != kProducerWarp);
  if (rank != 0 || warp == kProducerWarp) return;

  // Accumulator layout of m64nNk16: n8 block j, register 4j + q holds A row
  // 16 * warp + lane / 4 + 8 * (q >> 1) (an inter column) and B row 8j + 2 * (lane % 4) + (q & 1)
  // (a token).
  T* out = h + (long long)blockIdx.y * M * N;
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = 8 * j + 2 * (lane & 3) + (q & 1);
      const int col = j0 + 16 * warp + (lane >> 2) + 8 * (q >> 1);
      if (t >= M || col >= N) continue;
      const float g = acc[0][4 * j + q], u = acc[1][4 * j + q];
      const float gu = weight_on_input ? 0.f : activate(act, g) * u;
      float v = 0.f;
      for (int k = 0; k < topk; ++k) {
        const int s = t * topk + k;
        if (r.slot_expert[s] != e) continue;
        const float w = r.slot_weight[s];
        v += weight_on_input ? activate(act, g * w) * (u * w) : w * gu;
      }
      out[(long long)t * N + col] = from_f32<T>(v);
    }
  }
#endif
}

template <typename T, int NT, int kSub>
__device__ __forceinline__ void gemm2_sum(const TensorMap* h_map, const TensorMap* w2_map,
                                          const void* __restrict__ topk_ids, int ids_is_i64,
                                          long long ids_row_stride, const int* __restrict__ expert_map, int M,
                                          int topk, int global_E, int local_E, int N, int K, T* __restrict__ out,
                                          long long out_row_stride) {
#ifdef SWAPMOE_SM90A
  using L = Stages<NT, 1, kSub>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ Routing r;
  __shared__ __align__(8) uint64_t full[L::kCount], empty[L::kCount];
  // topk_ids were complete before GEMM1 passed its griddepcontrol.wait, which it did before
  // letting this grid launch; so they are read before this grid's wait.
  pdl_launch_dependents();
  init_barriers<L::kCount>(full, empty, h_map, w2_map);  // made visible by mark_active's barriers
  mark_active(r, topk_ids, ids_is_i64, ids_row_stride, expert_map, nullptr, 0, 0, M, topk, global_E, local_E);
  const int words = (local_E + 31) / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp == 0) {
    int count, picked;
    count_and_pick(r.bits, words, -1, count, picked);
    if (lane == 0) r.active = count;
  }
  __syncthreads();
  const int ranks = cluster_nctarank(), rank = cluster_ctarank();
  const int r0 = (blockIdx.x / ranks) * kRows;
  const int A = r.active, per = (A + ranks - 1) / ranks;
  const int a0 = min(A, rank * per), a1 = min(A, a0 + per);
  const int ktiles = (N + kBK * kSub - 1) / (kBK * kSub), items = (a1 - a0) * ktiles;
  unsigned char* stages = aligned_stages(smem_raw);
  float acc[1][NT / 2];
  if (warp == kProducerWarp) {
    int count, first;
    count_and_pick(r.bits, words, a0, count, first);
    if (lane == 0) {
      // The first stages' weights, before waiting for GEMM1.
      const int pre = min(items, L::kCount);
      int e = first, kt = 0;
      for (int it = 0; it < pre; ++it) {
        mbar_arrive_expect(&full[it], L::kStageBytes);
#pragma unroll
        for (int j = 0; j < kSub; ++j)
          tma_load_3d(stages + it * L::kStageBytes + L::weight(0, j), w2_map, (kt * kSub + j) * kBK, r0, e,
                      &full[it]);
        if (++kt == ktiles) {
          kt = 0;
          e = next_active(r.bits, words, e);
        }
      }
      pdl_wait();
      e = first;
      kt = 0;
      int a = a0;
      for (int it = 0; it < items; ++it) {
        const int st = it % L::kCount;
        unsigned char* s = stages + st * L::kStageBytes;
        if (it >= pre) {
          mbar_wait(&empty[st], ((it / L::kCount) - 1) & 1);
          mbar_arrive_expect(&full[st], L::kStageBytes);
#pragma unroll
          for (int j = 0; j < kSub; ++j)
            tma_load_3d(s + L::weight(0, j), w2_map, (kt * kSub + j) * kBK, r0, e, &full[st]);
        }
#pragma unroll
        for (int j = 0; j < kSub; ++j) tma_load_3d(s + L::tokens(j), h_map, (kt * kSub + j) * kBK, 0, a, &full[st]);
        if (++kt == ktiles) {
          kt = 0;
          ++a;
          e = next_active(r.bits, words, e);
        }
      }
    }
  } else {
    pdl_wait();  // before this grid writes out
    consume<T, NT, 1, kSub>(items, stages, full, empty, acc);
  }
  if (ranks > 1) cluster_sum<NT, 1>(acc, reinterpret_cast<float*>(stages), warp != kProducerWarp);
  if (rank != 0 || warp == kProducerWarp) return;
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = 8 * j + 2 * (lane & 3) + (q & 1);
      const int row = r0 + 16 * warp + (lane >> 2) + 8 * (q >> 1);
      if (t < M && row < K) out[(long long)t * out_row_stride + row] = from_f32<T>(acc[0][4 * j + q]);
    }
  }
#endif
}

}  // namespace
}  // namespace swapmoe

#define SWAPMOE_SWAP_INSTANTIATE(SUFFIX, T, NT, SUB)                                                              \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1)                                              \
      swap_moe_gemm1_act_##SUFFIX##_n##NT##_s##SUB(                                                               \
          const __grid_constant__ swapmoe::TensorMap x_map, const __grid_constant__ swapmoe::TensorMap w1_map,    \
          const void* topk_weights, int topk_weights_code, long long topk_weights_row_stride,                     \
          const void* topk_ids, int ids_is_i64, long long ids_row_stride, const int* expert_map, int M, int topk, \
          int global_E, int local_E, int N, int K, int act, int weight_on_input, T* h) {                          \
    swapmoe::gemm1_act<T, NT, SUB>(&x_map, &w1_map, topk_weights, topk_weights_code, topk_weights_row_stride,     \
                                   topk_ids, ids_is_i64, ids_row_stride, expert_map, M, topk, global_E, local_E, \
                                   N, K, act, weight_on_input, h);                                                \
  }                                                                                                               \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1)                                              \
      swap_moe_gemm2_sum_##SUFFIX##_n##NT##_s##SUB(                                                               \
          const __grid_constant__ swapmoe::TensorMap h_map, const __grid_constant__ swapmoe::TensorMap w2_map,    \
          const void* topk_ids, int ids_is_i64, long long ids_row_stride, const int* expert_map, int M, int topk, \
          int global_E, int local_E, int N, int K, T* out, long long out_row_stride) {                            \
    swapmoe::gemm2_sum<T, NT, SUB>(&h_map, &w2_map, topk_ids, ids_is_i64, ids_row_stride, expert_map, M, topk,    \
                                   global_E, local_E, N, K, out, out_row_stride);                                 \
  }
#define SWAPMOE_SWAP_TILES(SUFFIX, T, SUB)          \
  SWAPMOE_SWAP_INSTANTIATE(SUFFIX, T, 8, SUB)       \
  SWAPMOE_SWAP_INSTANTIATE(SUFFIX, T, 16, SUB)      \
  SWAPMOE_SWAP_INSTANTIATE(SUFFIX, T, 32, SUB)      \
  SWAPMOE_SWAP_INSTANTIATE(SUFFIX, T, 64, SUB)

SWAPMOE_SWAP_TILES(bf16, __nv_bfloat16, 1)
SWAPMOE_SWAP_TILES(bf16, __nv_bfloat16, 4)
SWAPMOE_SWAP_TILES(f16, __half, 1)
SWAPMOE_SWAP_TILES(f16, __half, 4)
