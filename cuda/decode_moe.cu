// Decode fused-experts kernels: the whole op in two launches for few (token, k) slots.
//
//   decode_moe_gemm1_act   inter[s, :N] = act(x[t] . w1[e, :N]^T) * (x[t] . w1[e, N:]^T)
//   decode_moe_gemm2_sum   out[t, :]    = sum over k, in k order, of w[t,k] * inter[s] . w2[e]^T
//
// No routing, alignment or reduction kernel of its own:
// - gemm1: grid x = N row blocks of kRows rows, grid y = an upper bound on the number of
//   distinct local experts (min(E, S), S = M*topk <= kMaxSlots). Warp 0 of each CTA finds
//   the y-th distinct expert (in order of first appearance in topk_ids) and its slots with
//   warp votes; surplus CTAs exit. One warp per output row, gate and up rows together,
//   every slot of the expert per pass over the row (kTok at a time).
// - gemm2: grid x = K row blocks of kRows rows. Warp w takes slots w, w+8, ...: for its
//   slot it computes all kRows rows (kRows independent weight streams, one shared input),
//   stores the per-slot results in shared memory, and the CTA then sums each token's
//   slots in k order. No y buffer, no atomics, deterministic.
//
// Both kernels may be launched with programmatic dependent launch (sm_90): they wait for
// the previous kernel in the stream before reading anything, and let the next one start
// its launch early.
#include "common/moe_common.cuh"
#include "common/fp8_moe.cuh"
#include "common/router.cuh"

namespace swapmoe {
namespace {

constexpr int kRows = 8;          // warps per CTA = output rows per CTA (`DECODE_ROWS_PER_CTA`)
constexpr int kTok = 4;           // slots per pass over a weight row (`DECODE_TOKENS_PER_PASS`)
constexpr int kMaxSlots = 512;    // largest M*topk (`DECODE_MAX_SLOTS`)
constexpr int kMaxExperts = 8192; // largest local E (`MAX_GPU_LOCAL_EXPERTS`)
constexpr int kThreads = kRows * 32;
// GEMM2 CTAs per SM the register budget must allow (__launch_bounds__): its grid has K/kRows
// CTAs, so at decode most of them must be resident at once (deepseek-v3-tp8: 896 CTAs).
// Left to itself ptxas gave GEMM2 104 registers (2 CTAs per SM), and deepseek-v3-tp8 at
// M=1 took 42.9 us instead of 34. 5 (<= 51 registers) spills nothing in the 16-bit kernels;
// the FP8 ones need 4.
constexpr int kGemm2MinBlocks = 5;
constexpr int kFp8Gemm2MinBlocks = 4;

// GEMM2's tail, after every warp has written its items' partials: fold the N segments of
// each slot in segment order (when a slot was split into `parts`), then store each token's
// sum over its top-k slots in k order. Every thread of the CTA calls it.
template <typename T>
__device__ __forceinline__ void finish_gemm2(float (*partial)[kRows], float (*partial_folded)[kRows],
                                             const int* slot_expert, const float* slot_weight, int S, int parts,
                                             int M, int topk, int rows, int r0, T* __restrict__ out,
                                             long long out_row_stride) {
  __syncthreads();
  if (parts > 1) {
    for (int idx = threadIdx.x; idx < S * kRows; idx += kThreads) {
      const int s = idx / kRows, i = idx - s * kRows;
      float v = 0.f;
      for (int q = 0; q < parts; ++q) v += partial[s * parts + q][i];
      partial_folded[s][i] = v;
    }
    __syncthreads();
  }
  store_topk_sums<T, kRows>(parts > 1 ? partial_folded : partial, slot_expert, slot_weight, M, topk, rows, r0,
                            out, out_row_stride, threadIdx.x, kThreads);
}

struct ExpertSlots {
  unsigned seen[kMaxExperts / 32];  // experts met in earlier 32-slot chunks
  int local[kMaxSlots];
  int slots[kMaxSlots];
  int expert;  // the CTA's expert, or -1
  int count;   // its number of slots
};

// Warp 0 finds the `which`-th distinct local expert, in order of first appearance, and
// its slots in ascending order. Deterministic: chunks of 32 slots are taken in order.
__device__ void find_expert_slots(ExpertSlots& r, const void* __restrict__ topk_ids, int ids_is_i64,
                                  long long ids_row_stride, const int* __restrict__ expert_map,
                                  int M, int topk, int global_E, int local_E, int which) {
  const int tid = threadIdx.x, lane = tid & 31;
  const int S = M * topk;
  const bool multi_chunk = S > 32;
  if (multi_chunk)
    for (int w = tid; w < (local_E + 31) / 32; w += kThreads) r.seen[w] = 0u;
  __syncthreads();
  if (tid < 32) {
    int distinct = 0, expert = -1;
    for (int base = 0; base < S; base += 32) {
      const int s = base + lane;
      const int e = s < S ? slot_local_expert(topk_ids, ids_is_i64, ids_row_stride, expert_map, topk,
                                              global_E, local_E, s)
                          : -1;
      if (s < S) r.local[s] = e;
      const unsigned same = __match_any_sync(0xffffffffu, e);
      const bool leader = e >= 0 && (same & ((1u << lane) - 1u)) == 0;
      bool first = leader;
      if (multi_chunk && leader) {
        const unsigned bit = 1u << (e & 31);
        first = (r.seen[e >> 5] & bit) == 0;  // only earlier chunks have set bits
      }
      const unsigned firsts = __ballot_sync(0xffffffffu, first);
      if (first && distinct + __popc(firsts & ((1u << lane) - 1u)) == which) expert = e;
      distinct += __popc(firsts);
      __syncwarp();
      if (multi_chunk && leader) atomicOr(&r.seen[e >> 5], 1u << (e & 31));
      __syncwarp();
    }
    // Broadcast the chosen expert (at most one lane holds it).
    const unsigned has = __ballot_sync(0xffffffffu, expert >= 0);
    expert = has ? __shfl_sync(0xffffffffu, expert, __ffs(has) - 1) : -1;
    int count = 0;
    if (expert >= 0) {
      __syncwarp();
      for (int base = 0; base < S; base += 32) {
        const int s = base + lane;
        const bool mine = s < S && r.local[s] == expert;
        const unsigned m = __ballot_sync(0xffffffffu, mine);
        if (mine) r.slots[count + __popc(m & ((1u << lane) - 1u))] = s;
        count += __popc(m);
      }
    }
    if (lane == 0) {
      r.expert = expert;
      r.count = count;
    }
  }
  __syncthreads();
}

template <typename T, int VEC>
__device__ __forceinline__ void gemm1_act(
    const T* __restrict__ x, long long x_row_stride, const T* __restrict__ w1,
    long long w1_expert_stride, long long w1_row_stride, const void* __restrict__ topk_weights,
    int topk_weights_code, long long topk_weights_row_stride, const void* __restrict__ topk_ids,
    int ids_is_i64, long long ids_row_stride, const int* __restrict__ expert_map, int M, int topk,
    int global_E, int local_E, int N, int K, int act, int weight_on_input, T* __restrict__ inter,
    ExpertSlots& r) {
  find_expert_slots(r, topk_ids, ids_is_i64, ids_row_stride, expert_map, M, topk, global_E, local_E,
                    blockIdx.y);
  const int e = r.expert;
  if (e < 0) return;  // fewer distinct experts than grid rows
  const int row = blockIdx.x * kRows + (threadIdx.x >> 5);
  if (row >= N) return;  // warp-uniform; no barrier follows
  const int lane = threadIdx.x & 31;
  const T* wg = w1 + e * w1_expert_stride + (long long)row * w1_row_stride;
  const T* wu = w1 + e * w1_expert_stride + (long long)(row + N) * w1_row_stride;
  gemm1_row<T, VEC, kTok>(wg, wu, x, x_row_stride, r.slots, r.count, topk, N, K, row, lane, act,
                          weight_on_input, topk_weights, topk_weights_code, topk_weights_row_stride, inter);
}

// GEMM1 of fused_moe at decode with $SWAPMOE_ROUTER_FUSION=on: each CTA routes the M tokens itself (warp w takes tokens
// w, w + kRows, ...; E <= 256) into shared memory, then runs gemm1_act on its own copy of
// the routing. CTA (0, 0) also writes the routing to router.weights / router.ids for GEMM2,
// which waits for this grid. No router launch and no dependent global round trip.
template <typename T, int VEC>
__device__ __forceinline__ void gemm1_act_routed(
    const RouterArgs& router, const T* __restrict__ x, long long x_row_stride, const T* __restrict__ w1,
    long long w1_expert_stride, long long w1_row_stride, const int* __restrict__ expert_map, int M, int topk,
    int global_E, int local_E, int N, int K, int act, int weight_on_input, T* __restrict__ inter) {
  __shared__ ExpertSlots r;
  __shared__ int ids_s[kMaxSlots];
  __shared__ float weights_s[kMaxSlots];
  pdl_wait();
  pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool writer = blockIdx.x == 0 && blockIdx.y == 0;
  for (int t = warp; t < M; t += kRows) {
    float w;
    int id;
    route_token_warp<8>(router, t, lane, w, id);
    if (lane < topk) {
      ids_s[t * topk + lane] = id;
      weights_s[t * topk + lane] = w;
      if (writer) {
        router.ids[(long long)t * router.ids_row + lane] = id;
        router.weights[(long long)t * router.weights_row + lane] = w;
      }
    }
  }
  __syncthreads();
  gemm1_act<T, VEC>(x, x_row_stride, w1, w1_expert_stride, w1_row_stride, weights_s, kF32, topk, ids_s, 0, topk,
                    expert_map, M, topk, global_E, local_E, N, K, act, weight_on_input, inter, r);
}

template <typename T, int VEC>
__device__ __forceinline__ void gemm2_sum(
    const T* __restrict__ inter, const T* __restrict__ w2, long long w2_expert_stride,
    long long w2_row_stride, const void* __restrict__ topk_weights, int topk_weights_code,
    long long topk_weights_row_stride, const void* __restrict__ topk_ids, int ids_is_i64,
    long long ids_row_stride, const int* __restrict__ expert_map, int M, int topk, int global_E,
    int local_E, int N, int K, int weight_on_input, T* __restrict__ out, long long out_row_stride) {
  __shared__ float partial[kMaxSlots][kRows];        // item (slot, segment), row r0 + i
  __shared__ float partial_folded[kRows][kRows];     // slot s < kRows, row r0 + i
  __shared__ int slot_expert[kMaxSlots];
  __shared__ float slot_weight[kMaxSlots];
  pdl_wait();
  pdl_launch_dependents();
  const int S = M * topk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = blockIdx.x * kRows;
  const int rows = min(kRows, K - r0);
  for (int s = threadIdx.x; s < S; s += kThreads) {
    slot_expert[s] = slot_local_expert(topk_ids, ids_is_i64, ids_row_stride, expert_map, topk,
                                       global_E, local_E, s);
    slot_weight[s] = slot_sum_weight(weight_on_input, topk_weights, topk_weights_code, topk_weights_row_stride,
                                     topk, s);
  }
  __syncthreads();
  // With fewer slots than warps, each slot's N is split into `parts` segments so that every
  // warp streams weights: item i = (slot i / parts, segment i % parts).
  const int parts = S >= kRows ? 1 : (kRows + S - 1) / S;
  const int seg = ((N + parts - 1) / parts + 32 * VEC - 1) / (32 * VEC) * (32 * VEC);
  for (int item = warp; item < S * parts; item += kRows) {
    const int s = item / parts, q = item - s * parts;
    const int e = slot_expert[s];
    if (e < 0) continue;
    const T* a = inter + (long long)s * N;
    const T* w = w2 + e * w2_expert_stride + (long long)r0 * w2_row_stride;
    const int n_end = min(N, (q + 1) * seg);
    float acc[kRows] = {};
#pragma unroll 2
    for (int n = q * seg + lane * VEC; n < n_end; n += 32 * VEC) {
      float av[VEC];
      load_vec_f32<T, VEC>(a + n, av);
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if (i < rows) {
          float wv[VEC];
          load_vec_f32<T, VEC>(w + (long long)i * w2_row_stride + n, wv);
#pragma unroll
          for (int v = 0; v < VEC; ++v) acc[i] = fmaf(wv[v], av[v], acc[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) acc[i] = warp_sum(acc[i]);
    if (lane < kRows) {
      float mine = 0.f;
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        if (i == lane) mine = acc[i];
      partial[item][lane] = mine;
    }
  }
  finish_gemm2<T>(partial, partial_folded, slot_expert, slot_weight, S, parts, M, topk, rows, r0, out,
                  out_row_stride);
}


// --------------------------------------------------------------------------- FP8 W8A8
//
// decode_moe_fp8_gemm1 / decode_moe_fp8_gemm2_sum: the same two GEMMs with e4m3 weights.
// GEMM1 reads the input quantized by swapmoe_fp8_quant_x (cuda/generic_moe.cu: one CTA
// per token, launched first) and writes the f32 intermediate plus its absmax; GEMM2
// quantizes the intermediate as it loads it (its scales span N or 128 columns, more
// than one GEMM1 CTA holds) and dequantizes with the weight scales. See
// cuda/common/fp8_moe.cuh for the rules.
template <int SCHEME, int VEC>
__device__ __forceinline__ void fp8_gemm1(
    const uint8_t* __restrict__ xq, long long xq_row, const float* __restrict__ x_scale, int groups_k,
    const uint8_t* __restrict__ w1, long long w1_expert_stride, long long w1_row_stride,
    const float* __restrict__ w1s, long long w1s_e, long long w1s_r, long long w1s_c,
    const void* __restrict__ topk_weights, int topk_weights_code, long long topk_weights_row_stride,
    const void* __restrict__ topk_ids, int ids_is_i64, long long ids_row_stride, const int* __restrict__ expert_map,
    int M, int topk, int global_E, int local_E, int N, int K, int act, int weight_on_input,
    float* __restrict__ inter, float* __restrict__ inter_amax, int groups_n) {
  __shared__ ExpertSlots r;
  __shared__ unsigned smax[kAmaxChunk];
  pdl_wait();
  pdl_launch_dependents();
  find_expert_slots(r, topk_ids, ids_is_i64, ids_row_stride, expert_map, M, topk, global_E, local_E, blockIdx.y);
  const int e = r.expert;
  if (e < 0) return;  // CTA-uniform: fewer distinct experts than grid rows
  const int row0 = blockIdx.x * kRows;
  const int row = row0 + (threadIdx.x >> 5);
  fp8_gemm1_rows<SCHEME, VEC, kTok>(r.slots, r.count, e, row, row < N, row0, xq, xq_row, x_scale, groups_k, w1,
                                    w1_expert_stride, w1_row_stride, w1s, w1s_e, w1s_r, w1s_c, topk_weights,
                                    topk_weights_code, topk_weights_row_stride, topk, N, K, act, weight_on_input,
                                    inter, inter_amax, groups_n, smax);
}

template <typename T, int SCHEME, int VEC>
__device__ __forceinline__ void fp8_gemm2_sum(
    const float* __restrict__ inter, const float* __restrict__ inter_amax, const float* __restrict__ a2_static,
    int groups_n, const uint8_t* __restrict__ w2, long long w2_expert_stride, long long w2_row_stride,
    const float* __restrict__ w2s, long long w2s_e, long long w2s_r, long long w2s_c,
    const void* __restrict__ topk_weights, int topk_weights_code, long long topk_weights_row_stride,
    const void* __restrict__ topk_ids, int ids_is_i64, long long ids_row_stride, const int* __restrict__ expert_map,
    int M, int topk, int global_E, int local_E, int N, int K, int weight_on_input, T* __restrict__ out,
    long long out_row_stride) {
  __shared__ float partial[kMaxSlots][kRows];
  __shared__ float partial_folded[kRows][kRows];
  __shared__ int slot_expert[kMaxSlots];
  __shared__ float slot_weight[kMaxSlots];
  pdl_wait();
  pdl_launch_dependents();
  const int S = M * topk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = blockIdx.x * kRows;
  const int rows = min(kRows, K - r0);
  const int rb = SCHEME == kQBlock ? r0 / kFp8Block : r0;  // the CTA's rows share one 128-row block
  for (int s = threadIdx.x; s < S; s += kThreads) {
    slot_expert[s] = slot_local_expert(topk_ids, ids_is_i64, ids_row_stride, expert_map, topk, global_E, local_E, s);
    slot_weight[s] = slot_sum_weight(weight_on_input, topk_weights, topk_weights_code, topk_weights_row_stride,
                                     topk, s);
  }
  __syncthreads();
  const int parts = S >= kRows ? 1 : (kRows + S - 1) / S;
  const int seg = ((N + parts - 1) / parts + 32 * VEC - 1) / (32 * VEC) * (32 * VEC);
  for (int item = warp; item < S * parts; item += kRows) {
    const int s = item / parts, q = item - s * parts;
    const int e = slot_expert[s];
    if (e < 0) continue;
    const float* a = inter + (long long)s * N;
    const uint8_t* w = w2 + e * w2_expert_stride + (long long)r0 * w2_row_stride;
    const int n_end = min(N, (q + 1) * seg);
    const float st = SCHEME == kQBlock ? 1.f : inter_scale<SCHEME>(inter_amax, a2_static, s, 0, groups_n);
    const float it = __frcp_rn(st);
    float acc[kRows] = {};
    for (int n = q * seg + lane * VEC; n < n_end; n += 32 * VEC) {
      float sn = st, inv = it, wsg[kRows];
      if constexpr (SCHEME == kQBlock) {
        const int g = n / kFp8Block;
        sn = inter_scale<SCHEME>(inter_amax, a2_static, s, g, groups_n);
        inv = 0.f;
        const float ws = w2s[scale_off(e, rb, g, w2s_e, w2s_r, w2s_c)];
#pragma unroll
        for (int i = 0; i < kRows; ++i) wsg[i] = sn * ws;
      }
      float av[VEC];
      load_inter_q<SCHEME, VEC>(a + n, sn, inv, av);
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if (i < rows) {
          float wv[VEC];
          load_fp8_f32<VEC>(w + (long long)i * w2_row_stride + n, wv);
          float d = 0.f;
#pragma unroll
          for (int v = 0; v < VEC; ++v) d = fmaf(wv[v], av[v], d);
          if constexpr (SCHEME == kQBlock) acc[i] = fmaf(d, wsg[i], acc[i]);
          else acc[i] += d;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) acc[i] = warp_sum(acc[i]);
    if (lane < kRows) {
      float mine = 0.f;
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        if (i == lane) mine = acc[i];
      if (lane < rows) {
        if constexpr (SCHEME == kQTensor) mine *= st * w2s[scale_off(e, 0, 0, w2s_e, 0, 0)];
        else if constexpr (SCHEME == kQChannel) mine *= st * w2s[scale_off(e, r0 + lane, 0, w2s_e, w2s_r, 0)];
      }
      partial[item][lane] = mine;
    }
  }
  finish_gemm2<T>(partial, partial_folded, slot_expert, slot_weight, S, parts, M, topk, rows, r0, out,
                  out_row_stride);
}

}  // namespace
}  // namespace swapmoe

#define SWAPMOE_DECODE_GEMM1_ARGS(T)                                                             \
  const T *x, long long x_row_stride, const T *w1, long long w1_expert_stride,                   \
      long long w1_row_stride, const void *topk_weights, int topk_weights_code,                  \
      long long topk_weights_row_stride, const void *topk_ids, int ids_is_i64,                   \
      long long ids_row_stride, const int *expert_map, int M, int topk, int global_E,            \
      int local_E, int N, int K, int act, int weight_on_input, T *inter
#define SWAPMOE_DECODE_GEMM1_CALL                                                                \
  x, x_row_stride, w1, w1_expert_stride, w1_row_stride, topk_weights, topk_weights_code,         \
      topk_weights_row_stride, topk_ids, ids_is_i64, ids_row_stride, expert_map, M, topk,        \
      global_E, local_E, N, K, act, weight_on_input, inter
#define SWAPMOE_DECODE_GEMM2_ARGS(T)                                                             \
  const T *inter, const T *w2, long long w2_expert_stride, long long w2_row_stride,              \
      const void *topk_weights, int topk_weights_code, long long topk_weights_row_stride,        \
      const void *topk_ids, int ids_is_i64, long long ids_row_stride, const int *expert_map,     \
      int M, int topk, int global_E, int local_E, int N, int K, int weight_on_input, T *out,     \
      long long out_row_stride
#define SWAPMOE_DECODE_GEMM2_CALL                                                                \
  inter, w2, w2_expert_stride, w2_row_stride, topk_weights, topk_weights_code,                   \
      topk_weights_row_stride, topk_ids, ids_is_i64, ids_row_stride, expert_map, M, topk,        \
      global_E, local_E, N, K, weight_on_input, out, out_row_stride

#define SWAPMOE_DECODE_INSTANTIATE(SUFFIX, T, VEC)                                               \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads)                               \
      decode_moe_gemm1_act_##SUFFIX##_v##VEC(SWAPMOE_DECODE_GEMM1_ARGS(T)) {                     \
    __shared__ swapmoe::ExpertSlots r;                                                           \
    swapmoe::pdl_wait();                                                                         \
    swapmoe::pdl_launch_dependents();                                                            \
    swapmoe::gemm1_act<T, VEC>(SWAPMOE_DECODE_GEMM1_CALL, r);                                    \
  }                                                                                              \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads)                               \
      decode_moe_gemm1_act_routed_##SUFFIX##_v##VEC(swapmoe::RouterArgs router,                   \
                                                    SWAPMOE_DECODE_GEMM1_ARGS(T)) {               \
    swapmoe::gemm1_act_routed<T, VEC>(router, x, x_row_stride, w1, w1_expert_stride,             \
                                      w1_row_stride, expert_map, M, topk, global_E, local_E, N,  \
                                      K, act, weight_on_input, inter);                           \
  }                                                                                              \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, swapmoe::kGemm2MinBlocks)   \
      decode_moe_gemm2_sum_##SUFFIX##_v##VEC(SWAPMOE_DECODE_GEMM2_ARGS(T)) {                     \
    swapmoe::gemm2_sum<T, VEC>(SWAPMOE_DECODE_GEMM2_CALL);                                       \
  }                                                                                              \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads)                               \
      decode_moe_gemm2_sum_wide_##SUFFIX##_v##VEC(SWAPMOE_DECODE_GEMM2_ARGS(T)) {                \
    swapmoe::gemm2_sum<T, VEC>(SWAPMOE_DECODE_GEMM2_CALL);                                       \
  }

SWAPMOE_DECODE_INSTANTIATE(f32, float, 1)
SWAPMOE_DECODE_INSTANTIATE(f32, float, 4)
SWAPMOE_DECODE_INSTANTIATE(bf16, __nv_bfloat16, 1)
SWAPMOE_DECODE_INSTANTIATE(bf16, __nv_bfloat16, 8)
SWAPMOE_DECODE_INSTANTIATE(f16, __half, 1)
SWAPMOE_DECODE_INSTANTIATE(f16, __half, 8)

#define SWAPMOE_DECODE_FP8_GEMM1(NAME, SCHEME, VEC)                                               \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads) decode_moe_fp8_gemm1_##NAME##_v##VEC( \
      const uint8_t *xq, long long xq_row, const float *x_scale, int groups_k, const uint8_t *w1,  \
      long long w1_expert_stride, long long w1_row_stride, const float *w1s, long long w1s_e,     \
      long long w1s_r, long long w1s_c, const void *topk_weights, int topk_weights_code,          \
      long long topk_weights_row_stride, const void *topk_ids, int ids_is_i64,                    \
      long long ids_row_stride, const int *expert_map, int M, int topk, int global_E, int local_E, \
      int N, int K, int act, int weight_on_input, float *inter, float *inter_amax, int groups_n) { \
    swapmoe::fp8_gemm1<SCHEME, VEC>(xq, xq_row, x_scale, groups_k, w1, w1_expert_stride,          \
                                    w1_row_stride, w1s, w1s_e, w1s_r, w1s_c, topk_weights,        \
                                    topk_weights_code, topk_weights_row_stride, topk_ids,         \
                                    ids_is_i64, ids_row_stride, expert_map, M, topk, global_E,    \
                                    local_E, N, K, act, weight_on_input, inter, inter_amax,       \
                                    groups_n);                                                    \
  }
#define SWAPMOE_DECODE_FP8_GEMM2(SUFFIX, T, NAME, SCHEME, VEC)                                    \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, swapmoe::kFp8Gemm2MinBlocks) \
      decode_moe_fp8_gemm2_sum_##SUFFIX##_##NAME##_v##VEC(                                        \
          const float *inter, const float *inter_amax, const float *a2_static, int groups_n,      \
          const uint8_t *w2, long long w2_expert_stride, long long w2_row_stride, const float *w2s, \
          long long w2s_e, long long w2s_r, long long w2s_c, const void *topk_weights,            \
          int topk_weights_code, long long topk_weights_row_stride, const void *topk_ids,         \
          int ids_is_i64, long long ids_row_stride, const int *expert_map, int M, int topk,       \
          int global_E, int local_E, int N, int K, int weight_on_input, T *out,                   \
          long long out_row_stride) {                                                             \
    swapmoe::fp8_gemm2_sum<T, SCHEME, VEC>(                                                       \
        inter, inter_amax, a2_static, groups_n, w2, w2_expert_stride, w2_row_stride, w2s, w2s_e,  \
        w2s_r, w2s_c, topk_weights, topk_weights_code, topk_weights_row_stride, topk_ids,         \
        ids_is_i64, ids_row_stride, expert_map, M, topk, global_E, local_E, N, K,                 \
        weight_on_input, out, out_row_stride);                                                    \
  }
#define SWAPMOE_DECODE_FP8(NAME, SCHEME, VEC)                                                     \
  SWAPMOE_DECODE_FP8_GEMM1(NAME, SCHEME, VEC)                                                     \
  SWAPMOE_DECODE_FP8_GEMM2(f32, float, NAME, SCHEME, VEC)                                         \
  SWAPMOE_DECODE_FP8_GEMM2(bf16, __nv_bfloat16, NAME, SCHEME, VEC)                                \
  SWAPMOE_DECODE_FP8_GEMM2(f16, __half, NAME, SCHEME, VEC)

SWAPMOE_DECODE_FP8(tensor, swapmoe::kQTensor, 1)
SWAPMOE_DECODE_FP8(tensor, swapmoe::kQTensor, 16)
SWAPMOE_DECODE_FP8(channel, swapmoe::kQChannel, 1)
SWAPMOE_DECODE_FP8(channel, swapmoe::kQChannel, 16)
SWAPMOE_DECODE_FP8(block, swapmoe::kQBlock, 1)
SWAPMOE_DECODE_FP8(block, swapmoe::kQBlock, 16)
