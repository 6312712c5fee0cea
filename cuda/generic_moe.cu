// Generic fused-experts kernels (sm_80 and sm_90a, any dtype of f32/bf16/f16, any N and K).
//
// This is the first GPU path: correct for every shape the problem validator accepts, and
// shaped for decode (weights stream once per token chunk). Swap-AB WGMMA kernels replace
// it where the oracle says so.
//
// Layout of a call (S = M * topk slots, one per (token, k)):
//   swapmoe_route_align   -> slot groups per local expert (route_align.cu)
//   gemm1_act             inter[s, :N] = act(x[t] . w1[e, :N]^T) * (x[t] . w1[e, N:2N]^T)
//   gemm2                 y[s, :K]     = router_weight[s] * inter[s] . w2[e]^T      (fp32)
//   topk_reduce           out[t, :]    = sum_k y[t*topk + k, :] over valid slots, in k order
// Every slot's arithmetic is independent of the others, so results are deterministic.
//
// Grid of both GEMMs: x = row blocks of kRows output rows, y = active expert index (an
// upper bound on the number of active experts, min(local_E, S)); surplus CTAs exit.
// One warp computes one output row for up to kTok tokens at a time, lanes striding over
// the reduction dimension with VEC-element (16-byte when VEC > 1) loads.
#include "common/moe_common.cuh"

namespace swapmoe {
namespace {

constexpr int kRows = 8;  // warps per CTA = output rows per CTA; see `GENERIC_ROWS_PER_CTA`
constexpr int kTok = 4;   // tokens per pass over a weight row; see `GENERIC_TOKENS_PER_PASS`

template <typename T, int VEC, int NT>
__device__ __forceinline__ void dot_row1(const T* __restrict__ w, const T* const (&xr)[kTok],
                                         int K, int lane, float (&acc)[kTok]) {
#pragma unroll 4
  for (int k = lane * VEC; k < K; k += 32 * VEC) {
    float a[VEC];
    load_vec_f32<T, VEC>(w + k, a);
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      float xv[VEC];
      load_vec_f32<T, VEC>(xr[i] + k, xv);
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[i] = fmaf(a[v], xv[v], acc[i]);
    }
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void gemm1_act(
    const T* __restrict__ x, long long x_row_stride, const T* __restrict__ w1,
    long long w1_expert_stride, long long w1_row_stride, const void* __restrict__ topk_weights,
    int topk_weights_code, long long topk_weights_row_stride, const int* __restrict__ expert_offsets,
    const int* __restrict__ sorted_slots, const int* __restrict__ active_experts,
    const int* __restrict__ num_active, int topk, int N, int K, int act, int weight_on_input,
    T* __restrict__ inter) {
  if ((int)blockIdx.y >= *num_active) return;
  const int e = active_experts[blockIdx.y];
  const int row = blockIdx.x * kRows + (threadIdx.x >> 5);
  if (row >= N) return;  // warp-uniform
  const int lane = threadIdx.x & 31;
  const T* wg = w1 + e * w1_expert_stride + (long long)row * w1_row_stride;
  const T* wu = w1 + e * w1_expert_stride + (long long)(row + N) * w1_row_stride;
  const int begin = expert_offsets[e], end = expert_offsets[e + 1];
  gemm1_row<T, VEC, kTok>(wg, wu, x, x_row_stride, sorted_slots + begin, end - begin, topk, N, K, row, lane, act,
                          weight_on_input, topk_weights, topk_weights_code, topk_weights_row_stride, inter);
}

template <typename T, int VEC>
__device__ __forceinline__ void gemm2(
    const T* __restrict__ inter, const T* __restrict__ w2, long long w2_expert_stride,
    long long w2_row_stride, const void* __restrict__ topk_weights, int topk_weights_code,
    long long topk_weights_row_stride, const int* __restrict__ expert_offsets,
    const int* __restrict__ sorted_slots, const int* __restrict__ active_experts,
    const int* __restrict__ num_active, int topk, int N, int K, int weight_on_input,
    float* __restrict__ y) {
  if ((int)blockIdx.y >= *num_active) return;
  const int e = active_experts[blockIdx.y];
  const int row = blockIdx.x * kRows + (threadIdx.x >> 5);
  if (row >= K) return;
  const int lane = threadIdx.x & 31;
  const T* w = w2 + e * w2_expert_stride + (long long)row * w2_row_stride;
  const int begin = expert_offsets[e], end = expert_offsets[e + 1];
  for (int t0 = begin; t0 < end; t0 += kTok) {
    const int nt = min(kTok, end - t0);
    int slot[kTok];
    const T* ar[kTok];
#pragma unroll
    for (int i = 0; i < kTok; ++i) {
      slot[i] = sorted_slots[t0 + min(i, nt - 1)];
      ar[i] = inter + (long long)slot[i] * N;
    }
    float acc[kTok] = {};
    switch (nt) {
      case 1: dot_row1<T, VEC, 1>(w, ar, N, lane, acc); break;
      case 2: dot_row1<T, VEC, 2>(w, ar, N, lane, acc); break;
      case 3: dot_row1<T, VEC, 3>(w, ar, N, lane, acc); break;
      default: dot_row1<T, VEC, 4>(w, ar, N, lane, acc); break;
    }
#pragma unroll
    for (int i = 0; i < kTok; ++i) acc[i] = warp_sum(acc[i]);
    if (lane < nt) {
      float a = 0.f;
      int si = 0;
#pragma unroll
      for (int i = 0; i < kTok; ++i)
        if (i == lane) { a = acc[i]; si = slot[i]; }
      if (!weight_on_input) {
        const int t = si / topk, k = si - t * topk;
        a *= load_scalar(topk_weights, topk_weights_code, (long long)t * topk_weights_row_stride + k);
      }
      y[(long long)si * K + row] = a;
    }
  }
}

// out[t, c] = sum over k of y[t*topk + k, c] for slots with a local expert, in k order.
template <typename T>
__device__ __forceinline__ void topk_reduce(const float* __restrict__ y,
                                            const int* __restrict__ slot_expert, int topk, int K,
                                            T* __restrict__ out, long long out_row_stride) {
  const int t = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= K) return;
  float s = 0.f;
  for (int k = 0; k < topk; ++k) {
    const long long slot = (long long)t * topk + k;
    if (slot_expert[slot] >= 0) s += y[slot * K + c];
  }
  out[(long long)t * out_row_stride + c] = from_f32<T>(s);
}

}  // namespace
}  // namespace swapmoe

#define SWAPMOE_GEMM1_ARGS(T)                                                                    \
  const T *x, long long x_row_stride, const T *w1, long long w1_expert_stride,                   \
      long long w1_row_stride, const void *topk_weights, int topk_weights_code,                  \
      long long topk_weights_row_stride, const int *expert_offsets, const int *sorted_slots,     \
      const int *active_experts, const int *num_active, int topk, int N, int K, int act,         \
      int weight_on_input, T *inter
#define SWAPMOE_GEMM1_CALL                                                                       \
  x, x_row_stride, w1, w1_expert_stride, w1_row_stride, topk_weights, topk_weights_code,         \
      topk_weights_row_stride, expert_offsets, sorted_slots, active_experts, num_active, topk,   \
      N, K, act, weight_on_input, inter
#define SWAPMOE_GEMM2_ARGS(T)                                                                    \
  const T *inter, const T *w2, long long w2_expert_stride, long long w2_row_stride,              \
      const void *topk_weights, int topk_weights_code, long long topk_weights_row_stride,        \
      const int *expert_offsets, const int *sorted_slots, const int *active_experts,             \
      const int *num_active, int topk, int N, int K, int weight_on_input, float *y
#define SWAPMOE_GEMM2_CALL                                                                       \
  inter, w2, w2_expert_stride, w2_row_stride, topk_weights, topk_weights_code,                   \
      topk_weights_row_stride, expert_offsets, sorted_slots, active_experts, num_active, topk,   \
      N, K, weight_on_input, y

#define SWAPMOE_INSTANTIATE(SUFFIX, T, VEC)                                                      \
  extern "C" __global__ void __launch_bounds__(swapmoe::kRows * 32)                             \
      generic_moe_gemm1_act_##SUFFIX##_v##VEC(SWAPMOE_GEMM1_ARGS(T)) {                           \
    swapmoe::gemm1_act<T, VEC>(SWAPMOE_GEMM1_CALL);                                              \
  }                                                                                              \
  extern "C" __global__ void __launch_bounds__(swapmoe::kRows * 32)                             \
      generic_moe_gemm2_##SUFFIX##_v##VEC(SWAPMOE_GEMM2_ARGS(T)) {                               \
    swapmoe::gemm2<T, VEC>(SWAPMOE_GEMM2_CALL);                                                  \
  }

SWAPMOE_INSTANTIATE(f32, float, 1)
SWAPMOE_INSTANTIATE(f32, float, 4)
SWAPMOE_INSTANTIATE(bf16, __nv_bfloat16, 1)
SWAPMOE_INSTANTIATE(bf16, __nv_bfloat16, 8)
SWAPMOE_INSTANTIATE(f16, __half, 1)
SWAPMOE_INSTANTIATE(f16, __half, 8)

#define SWAPMOE_REDUCE(SUFFIX, T)                                                                \
  extern "C" __global__ void generic_moe_topk_reduce_##SUFFIX(                                  \
      const float *y, const int *slot_expert, int topk, int K, T *out, long long out_row_stride) { \
    swapmoe::topk_reduce<T>(y, slot_expert, topk, K, out, out_row_stride);                      \
  }
SWAPMOE_REDUCE(f32, float)
SWAPMOE_REDUCE(bf16, __nv_bfloat16)
SWAPMOE_REDUCE(f16, __half)
