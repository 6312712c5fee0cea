// Decode fused-experts kernels for Hopper (sm_90a): the weights stream through the TMA
// unit (cp.async.bulk) into a ring of shared-memory stages, tracked by mbarriers, so that
// each SM keeps ~96 KiB of weight reads in flight. Same math, arguments and results as
// cuda/decode_moe.cu (two launches; routing in every CTA; GEMM2 sums over top-k in k order,
// deterministic); what changes is how the bytes move.
//
//   bulk_moe_gemm1_act   inter[s, :N] = act(x[t] . w1[e, :N]^T) * (x[t] . w1[e, N:]^T)
//   bulk_moe_gemm2_sum   out[t, :]    = sum over k, in k order, of w[t,k] * inter[s] . w2[e]^T
//
// Both grids are persistent (one CTA per SM, or fewer when there is less work). A CTA has
// 8 consumer warps and 1 producer warp:
// - every CTA first groups the M*topk (<= kMaxSlots) slots by local expert, in order of
//   first appearance (the same order and slot lists in every CTA);
// - The slots of an expert are taken in groups of <= kTok. A stage holds weight rows and
//   the group's activation rows over the same columns, so consumers read only shared memory.
// - GEMM1 work items are (slot group, block of 8 output rows). A stage holds 8 gate rows,
//   the 8 matching up rows and the group's x rows over kChunk1 columns of K; warp w owns row w.
// - GEMM2 work items are blocks of 8 output rows (of K). For each slot group, a stage holds
//   its expert's 8 w2 rows and the group's inter rows over kChunk2 columns of N; warp w owns
//   row w and keeps one partial per slot in shared memory; the CTA then sums each token's
//   slots in k order. GEMM2's producer issues the weight copies of its first stages before
//   waiting for GEMM1 (programmatic dependent launch) and their inter copies after.
// Requirements (checked by the oracle): bf16/fp16, K and N multiples of 8, 16-byte aligned
// weights and row strides, M*topk <= kMaxSlots.
#include "common/moe_common.cuh"
#include "common/sm90.cuh"

namespace swapmoe {
namespace {

constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 1) * 32;  // `BULK_THREADS`
constexpr int kRows = 8;           // output rows per item, one per consumer warp
constexpr int kTok = 4;            // slots per pass
constexpr int kMaxSlots = 64;      // `BULK_MAX_SLOTS`
constexpr int kStages = 5;         // `BULK_STAGES`
constexpr int kStageBytes = 20480; // `BULK_STAGE_BYTES`
// GEMM1 stage: 8 gate rows, 8 up rows and <= 4 token rows of x, kChunk1 columns of K each.
constexpr int kChunk1 = 512;
// GEMM2 stage: 8 w2 rows and <= 4 slot rows of inter, kChunk2 columns of N each.
constexpr int kChunk2 = 768;
static_assert((2 * kRows + kTok) * kChunk1 * 2 <= kStageBytes, "GEMM1 stage");
static_assert((kRows + kTok) * kChunk2 * 2 <= kStageBytes, "GEMM2 stage");

#ifdef SWAPMOE_SM90
// Named barrier for the consumer warps only (the producer warp never joins it).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory");
}
#endif

// The slots grouped by local expert, in order of first appearance; slots of an expert in
// ascending order. Built identically by every CTA, by warp 0 (lane l holds slots l, l+32).
struct Routing {
  int slot_expert[kMaxSlots];  // local expert of each slot, or -1
  float slot_weight[kMaxSlots];  // GEMM2's weight of each slot (slot_sum_weight); GEMM2 only
  int expert[kMaxSlots];     // expert index j -> local expert
  int start[kMaxSlots + 1];  // expert index j -> first position in `sorted`
  int sorted[kMaxSlots];     // slots, grouped by expert index
  int rank_of[kMaxSlots];    // for a slot that is its expert's first: the expert index
  int num_experts;
};

__device__ __forceinline__ void build_routing(Routing& r, const void* __restrict__ topk_ids, int ids_is_i64,
                                              long long ids_row_stride, const int* __restrict__ expert_map,
                                              int S, int topk, int global_E, int local_E) {
  if (threadIdx.x >= 32) return;
  const unsigned full = 0xffffffffu;
  const int lane = threadIdx.x;
  const int sa = lane, sb = lane + 32;
  const int ea = sa < S ? slot_local_expert(topk_ids, ids_is_i64, ids_row_stride, expert_map, topk,
                                           global_E, local_E, sa)
                        : -1;
  const int eb = sb < S ? slot_local_expert(topk_ids, ids_is_i64, ids_row_stride, expert_map, topk,
                                           global_E, local_E, sb)
                        : -1;
  if (sa < S) r.slot_expert[sa] = ea;
  if (sb < S) r.slot_expert[sb] = eb;
  // For each of this lane's two slots: its expert's first slot, how many slots of that
  // expert come before it, and how many the expert has.
  int first_a = 64, first_b = 64, before_a = 0, before_b = 0, count_a = 0, count_b = 0;
  for (int q = 0; q < 32; ++q) {
    const int qa = __shfl_sync(full, ea, q), qb = __shfl_sync(full, eb, q);  // slots q, q+32
    if (qa == ea) { first_a = min(first_a, q); count_a++; before_a += q < lane; }
    if (qb == ea) { count_a++; }
    if (qa == eb) { first_b = min(first_b, q); count_b++; before_b++; }
    if (qb == eb) { first_b = min(first_b, q + 32); count_b++; before_b += q < lane; }
  }
  const bool lead_a = ea >= 0 && first_a == sa;
  const bool lead_b = eb >= 0 && first_b == sb;
  const unsigned lt = (1u << lane) - 1u;
  const unsigned ba = __ballot_sync(full, lead_a), bb = __ballot_sync(full, lead_b);
  const int rank_a = __popc(ba & lt), rank_b = __popc(ba) + __popc(bb & lt);
  const int num = __popc(ba) + __popc(bb);
  if (lead_a) { r.rank_of[sa] = rank_a; r.expert[rank_a] = ea; r.start[rank_a + 1] = count_a; }
  if (lead_b) { r.rank_of[sb] = rank_b; r.expert[rank_b] = eb; r.start[rank_b + 1] = count_b; }
  __syncwarp();
  if (lane == 0) {
    r.start[0] = 0;
    for (int j = 0; j < num; ++j) r.start[j + 1] += r.start[j];
    r.num_experts = num;
  }
  __syncwarp();
  if (ea >= 0) r.sorted[r.start[r.rank_of[first_a]] + before_a] = sa;
  if (eb >= 0) r.sorted[r.start[r.rank_of[first_b]] + before_b] = sb;
}

#ifdef SWAPMOE_SM90
// Barrier setup shared by both kernels: `full` completes when a stage's bytes have landed
// (one arrival from the producer plus the transaction bytes); `empty` when every consumer
// warp is done reading it.
__device__ __forceinline__ void init_barriers(uint64_t* full, uint64_t* empty) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kConsumerWarps);
    }
    mbar_init_fence();
  }
}

template <typename T>
__device__ __forceinline__ void load8_shared(const T* p, float (&out)[8]) {
  const Vec<T, 8> v = *reinterpret_cast<const Vec<T, 8>*>(p);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = to_f32(v.v[i]);
}

#endif

// Groups of <= kTok slots of one expert, in expert order: (expert index, first position in
// r.sorted, slot count). Built by thread 0 after build_routing.
struct Groups {
  int3 g[kMaxSlots];
  int count;
};

__device__ __forceinline__ void build_groups(Groups& groups, const Routing& r) {
  if (threadIdx.x == 0) {
    int n = 0;
    for (int j = 0; j < r.num_experts; ++j)
      for (int q = r.start[j]; q < r.start[j + 1]; q += kTok)
        groups.g[n++] = make_int3(j, q, min(kTok, r.start[j + 1] - q));
    groups.count = n;
  }
}

template <typename T>
__device__ __forceinline__ void bulk_gemm1_act(
    const T* __restrict__ x, long long x_row_stride, const T* __restrict__ w1,
    long long w1_expert_stride, long long w1_row_stride, const void* __restrict__ topk_weights,
    int topk_weights_code, long long topk_weights_row_stride, const void* __restrict__ topk_ids,
    int ids_is_i64, long long ids_row_stride, const int* __restrict__ expert_map, int M, int topk,
    int global_E, int local_E, int N, int K, int act, int weight_on_input, T* __restrict__ inter) {
#ifdef SWAPMOE_SM90
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ __align__(8) uint64_t empty[kStages];
  __shared__ Routing r;
  __shared__ Groups groups;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (M * topk > kMaxSlots) __trap();  // the oracle never plans this; never read past the lists
  init_barriers(full, empty);
  pdl_wait();
  pdl_launch_dependents();
  build_routing(r, topk_ids, ids_is_i64, ids_row_stride, expert_map, M * topk, topk, global_E, local_E);
  __syncthreads();
  build_groups(groups, r);
  __syncthreads();
  const int row_blocks = (N + kRows - 1) / kRows;
  const int items = groups.count * row_blocks;
  const int chunks = (K + kChunk1 - 1) / kChunk1;
  T* stages = reinterpret_cast<T*>(stage_mem);
  constexpr int kStageElems = kStageBytes / (int)sizeof(T);
  if (warp == kConsumerWarps) {
    uint32_t it = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      const int grp = item / row_blocks, rb = item - grp * row_blocks;
      const int3 gr = groups.g[grp];
      const int e = r.expert[gr.x];
      const int r0 = rb * kRows, nrows = min(kRows, N - r0);
      const T* gate = w1 + e * w1_expert_stride + (long long)r0 * w1_row_stride;
      const T* up = gate + (long long)N * w1_row_stride;
      // Lanes 0-7 copy gate rows, 8-15 up rows, 16-19 x rows of the group's slots.
      const T* src = nullptr;
      if (lane < nrows) src = gate + (long long)lane * w1_row_stride;
      else if (lane >= kRows && lane < kRows + nrows) src = up + (long long)(lane - kRows) * w1_row_stride;
      else if (lane >= 2 * kRows && lane < 2 * kRows + gr.z)
        src = x + (long long)(r.sorted[gr.y + lane - 2 * kRows] / topk) * x_row_stride;
      for (int c = 0; c < chunks; ++c, ++it) {
        const int st = it % kStages;
        const int k0 = c * kChunk1, kl = min(kChunk1, K - k0);
        if (it >= kStages) mbar_wait(&empty[st], ((it / kStages) - 1) & 1);
        if (lane == 0) mbar_arrive_expect(&full[st], (uint32_t)((2 * nrows + gr.z) * kl * sizeof(T)));
        __syncwarp();
        if (src) bulk_load(stages + st * kStageElems + lane * kChunk1, src + k0, kl * sizeof(T), &full[st]);
      }
    }
    return;
  }
  uint32_t it = 0;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int grp = item / row_blocks, rb = item - grp * row_blocks;
    const int3 gr = groups.g[grp];
    const int nt = gr.z;
    const int r0 = rb * kRows;
    const bool valid = r0 + warp < N;
    float g[kTok] = {}, u[kTok] = {};
    for (int c = 0; c < chunks; ++c, ++it) {
      const int st = it % kStages;
      const int kl = min(kChunk1, K - c * kChunk1);
      mbar_wait(&full[st], (it / kStages) & 1);
      if (valid) {
        const T* base = stages + st * kStageElems;
        const T* gs = base + warp * kChunk1;
        const T* us = base + (kRows + warp) * kChunk1;
        const T* xs = base + 2 * kRows * kChunk1;
#pragma unroll 2
        for (int k = lane * 8; k < kl; k += 256) {
          float a[8], b[8];
          load8_shared<T>(gs + k, a);
          load8_shared<T>(us + k, b);
#pragma unroll
          for (int i = 0; i < kTok; ++i) {
            if (i < nt) {
              float xv[8];
              load8_shared<T>(xs + i * kChunk1 + k, xv);
#pragma unroll
              for (int v = 0; v < 8; ++v) {
                g[i] = fmaf(a[v], xv[v], g[i]);
                u[i] = fmaf(b[v], xv[v], u[i]);
              }
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[st]);
    }
    if (!valid) continue;  // warp-uniform
#pragma unroll
    for (int i = 0; i < kTok; ++i) {
      g[i] = warp_sum(g[i]);
      u[i] = warp_sum(u[i]);
    }
    if (lane < nt) {
      float gi = 0.f, ui = 0.f;
#pragma unroll
      for (int i = 0; i < kTok; ++i)
        if (i == lane) { gi = g[i]; ui = u[i]; }
      const int si = r.sorted[gr.y + lane];
      store_gate_up<T>(inter, si, N, r0 + warp, gi, ui, act, weight_on_input, topk_weights,
                       topk_weights_code, topk_weights_row_stride, topk);
    }
  }
#else
  __trap();
#endif
}

template <typename T>
__device__ __forceinline__ void bulk_gemm2_sum(
    const T* __restrict__ inter, const T* __restrict__ w2, long long w2_expert_stride,
    long long w2_row_stride, const void* __restrict__ topk_weights, int topk_weights_code,
    long long topk_weights_row_stride, const void* __restrict__ topk_ids, int ids_is_i64,
    long long ids_row_stride, const int* __restrict__ expert_map, int M, int topk, int global_E,
    int local_E, int N, int K, int weight_on_input, T* __restrict__ out, long long out_row_stride) {
#ifdef SWAPMOE_SM90
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ __align__(8) uint64_t empty[kStages];
  __shared__ Routing r;
  __shared__ Groups groups;
  __shared__ float part[kMaxSlots][kRows];  // slot s, row r0 + i
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int S = M * topk;
  if (S > kMaxSlots) __trap();  // the oracle never plans this; never read past the lists
  init_barriers(full, empty);
  // The routing and the weights do not depend on GEMM1: read them before waiting for it.
  build_routing(r, topk_ids, ids_is_i64, ids_row_stride, expert_map, S, topk, global_E, local_E);
  for (int s = threadIdx.x; s < S; s += blockDim.x)
    r.slot_weight[s] = slot_sum_weight(weight_on_input, topk_weights, topk_weights_code, topk_weights_row_stride,
                                       topk, s);
  __syncthreads();
  build_groups(groups, r);
  __syncthreads();
  const int row_blocks = (K + kRows - 1) / kRows;
  const int chunks = (N + kChunk2 - 1) / kChunk2;
  const int per_block = groups.count * chunks;  // chunks of one row block
  T* stages = reinterpret_cast<T*>(stage_mem);
  constexpr int kStageElems = kStageBytes / (int)sizeof(T);
  if (warp == kConsumerWarps) {
    const int my_blocks = blockIdx.x < row_blocks ? (row_blocks - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int total = my_blocks * per_block;
    // When a chunk spans whole, densely packed rows, lane 0 copies the 8 rows at once: one
    // large copy instead of 8 small ones (the TMA unit pays per request).
    const bool whole_rows = chunks == 1 && w2_row_stride == N;
    // Chunk q of this CTA: row block, slot group, column chunk. Lanes 0-7 copy w2 rows,
    // lanes 8-11 the group's inter rows.
    auto source = [&](int q, int& n0, int& nl, int& nrows, int& nt) -> const T* {
      const int b = q / per_block, rem = q - b * per_block;
      const int grp = rem / chunks, c = rem - grp * chunks;
      const int r0 = (blockIdx.x + b * gridDim.x) * kRows;
      const int3 gr = groups.g[grp];
      n0 = c * kChunk2;
      nl = min(kChunk2, N - n0);
      nrows = min(kRows, K - r0);
      nt = gr.z;
      if (lane < nrows && (!whole_rows || lane == 0))
        return w2 + r.expert[gr.x] * w2_expert_stride + (long long)(r0 + lane) * w2_row_stride + n0;
      if (lane >= kRows && lane < kRows + nt) return inter + (long long)r.sorted[gr.y + lane - kRows] * N + n0;
      return nullptr;
    };
    // The first stages: weights now, inter once GEMM1 has finished.
    const int early = min(total, kStages);
    for (int q = 0; q < early; ++q) {
      int n0, nl, nrows, nt;
      const T* src = source(q, n0, nl, nrows, nt);
      if (lane == 0) mbar_arrive_expect(&full[q], (uint32_t)((nrows + nt) * nl * sizeof(T)));
      __syncwarp();
      if (src && lane < kRows)
        bulk_load(stages + q * kStageElems + lane * kChunk2, src, (whole_rows ? nrows : 1) * nl * sizeof(T), &full[q]);
    }
    pdl_wait();
    for (int q = 0; q < early; ++q) {
      int n0, nl, nrows, nt;
      const T* src = source(q, n0, nl, nrows, nt);
      if (src && lane >= kRows) bulk_load(stages + q * kStageElems + lane * kChunk2, src, nl * sizeof(T), &full[q]);
    }
    for (int q = early; q < total; ++q) {
      const int st = q % kStages;
      int n0, nl, nrows, nt;
      const T* src = source(q, n0, nl, nrows, nt);
      mbar_wait(&empty[st], ((q / kStages) - 1) & 1);
      if (lane == 0) mbar_arrive_expect(&full[st], (uint32_t)((nrows + nt) * nl * sizeof(T)));
      __syncwarp();
      if (src)
        bulk_load(stages + st * kStageElems + lane * kChunk2, src,
                  (whole_rows && lane < kRows ? nrows : 1) * nl * sizeof(T), &full[st]);
    }
    return;
  }
  pdl_wait();  // out may alias GEMM1's input
  pdl_launch_dependents();
  // Whole densely packed rows land back to back (see the producer); else one row per kChunk2.
  const int row_pitch = (chunks == 1 && w2_row_stride == N) ? N : kChunk2;
  uint32_t it = 0;
  for (int rb = blockIdx.x; rb < row_blocks; rb += gridDim.x) {
    const int r0 = rb * kRows, nrows = min(kRows, K - r0);
    const bool valid = warp < nrows;
    for (int grp = 0; grp < groups.count; ++grp) {
      const int3 gr = groups.g[grp];
      const int nt = gr.z;
      float acc[kTok] = {};
      for (int c = 0; c < chunks; ++c, ++it) {
        const int st = it % kStages;
        const int nl = min(kChunk2, N - c * kChunk2);
        mbar_wait(&full[st], (it / kStages) & 1);
        if (valid) {
          const T* ws = stages + st * kStageElems + warp * row_pitch;
          const T* as = stages + st * kStageElems + kRows * kChunk2;
#pragma unroll 2
          for (int n = lane * 8; n < nl; n += 256) {
            float wv[8];
            load8_shared<T>(ws + n, wv);
#pragma unroll
            for (int i = 0; i < kTok; ++i) {
              if (i < nt) {
                float av[8];
                load8_shared<T>(as + i * kChunk2 + n, av);
#pragma unroll
                for (int v = 0; v < 8; ++v) acc[i] = fmaf(wv[v], av[v], acc[i]);
              }
            }
          }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[st]);
      }
      if (valid) {
#pragma unroll
        for (int i = 0; i < kTok; ++i) acc[i] = warp_sum(acc[i]);
        if (lane == 0) {
#pragma unroll
          for (int i = 0; i < kTok; ++i)
            if (i < nt) part[r.sorted[gr.y + i]][warp] = acc[i];
        }
      }
    }
    consumers_sync();
    store_topk_sums<T, kRows>(part, r.slot_expert, r.slot_weight, M, topk, nrows, r0, out, out_row_stride,
                              threadIdx.x, kConsumerWarps * 32);
    consumers_sync();  // part is rewritten by the next row block
  }
#else
  __trap();
#endif
}

}  // namespace
}  // namespace swapmoe

#define SWAPMOE_BULK_INSTANTIATE(SUFFIX, T)                                                            \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1) bulk_moe_gemm1_act_##SUFFIX(      \
      const T* x, long long x_row_stride, const T* w1, long long w1_expert_stride,                     \
      long long w1_row_stride, const void* topk_weights, int topk_weights_code,                        \
      long long topk_weights_row_stride, const void* topk_ids, int ids_is_i64, long long ids_row_stride, \
      const int* expert_map, int M, int topk, int global_E, int local_E, int N, int K, int act,        \
      int weight_on_input, T* inter) {                                                                 \
    swapmoe::bulk_gemm1_act<T>(x, x_row_stride, w1, w1_expert_stride, w1_row_stride, topk_weights,     \
                               topk_weights_code, topk_weights_row_stride, topk_ids, ids_is_i64,       \
                               ids_row_stride, expert_map, M, topk, global_E, local_E, N, K, act,      \
                               weight_on_input, inter);                                                \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1) bulk_moe_gemm2_sum_##SUFFIX(      \
      const T* inter, const T* w2, long long w2_expert_stride, long long w2_row_stride,                \
      const void* topk_weights, int topk_weights_code, long long topk_weights_row_stride,              \
      const void* topk_ids, int ids_is_i64, long long ids_row_stride, const int* expert_map, int M,    \
      int topk, int global_E, int local_E, int N, int K, int weight_on_input, T* out,                  \
      long long out_row_stride) {                                                                      \
    swapmoe::bulk_gemm2_sum<T>(inter, w2, w2_expert_stride, w2_row_stride, topk_weights,               \
                               topk_weights_code, topk_weights_row_stride, topk_ids, ids_is_i64,       \
                               ids_row_stride, expert_map, M, topk, global_E, local_E, N, K,           \
                               weight_on_input, out, out_row_stride);                                  \
  }

SWAPMOE_BULK_INSTANTIATE(bf16, __nv_bfloat16)
SWAPMOE_BULK_INSTANTIATE(f16, __half)
