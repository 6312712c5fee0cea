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
  pdl_launch_dependents();  // a routing or align kernel launched after it may start early
  const int t = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= K) return;
  // kChunk slots' experts, then their values, are loaded before any is added, so that the
  // loads of a chunk are in flight together (one at a time, each slot cost two dependent
  // round trips).
  constexpr int kChunk = 8;
  float s = 0.f;
  const long long first = (long long)t * topk;
  for (int k0 = 0; k0 < topk; k0 += kChunk) {
    int ex[kChunk];
    float v[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) ex[i] = k0 + i < topk ? slot_expert[first + k0 + i] : -1;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = ex[i] >= 0 ? y[(first + k0 + i) * K + c] : 0.f;
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      if (ex[i] >= 0) s += v[i];  // in k order
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

// --------------------------------------------------------------------------- FP8 W8A8
//
// FP8 call on the generic path (S = M*topk slots):
//   swapmoe_route_align       slot groups per local expert
//   swapmoe_fp8_absmax_T      (dynamic per-tensor input scale only) partial absmax of x
//   swapmoe_fp8_quant_x_T     x -> x_q (e4m3) + scales, one CTA per token; zeroes the
//                             intermediate's absmax accumulators
//   generic_moe_fp8_gemm1     inter[s] = act(g) * u (f32) + intermediate absmax
//   generic_moe_fp8_gemm2     y[s] = w * (quantize(inter[s]) . w2_q[e]^T) dequantized
//   generic_moe_topk_reduce   out[t] = sum over k (as the bf16 path)
// The per-token and per-group scales need the whole row or group before the first element
// can be quantized, and every GEMM1 CTA of an expert would redo that for the same tokens,
// so one CTA per token quantizes x once; GEMM1 then streams x_q as 16-byte e4m3 vectors.
// The intermediate's scales span N (or 128 columns), which 8-row GEMM1 CTAs do not hold
// whole: GEMM1 writes f32 plus absmax, and GEMM2 quantizes as it loads.
#include "common/fp8_moe.cuh"

namespace swapmoe {
namespace {

constexpr int kQuantThreads = 256;  // threads of the quantize-x and absmax kernels (`FP8_QUANT_THREADS`)

constexpr int kQuantUnroll = 8;     // columns of a row each quantize-x thread loads at once

// v[u] = row[c0 + u * blockDim.x] as f32 (0 past K): kQuantUnroll independent, coalesced
// loads, all issued before any is used.
template <typename T>
__device__ __forceinline__ void load_row_step(const T* __restrict__ row, int c0, int K, float (&v)[kQuantUnroll]) {
#pragma unroll
  for (int u = 0; u < kQuantUnroll; ++u) {
    const int c = c0 + u * (int)blockDim.x;
    v[u] = c < K ? to_f32(row[c]) : 0.f;
  }
}

// The vector path of quantize-x: 16-byte loads of x (16 / sizeof(T) elements) and as many
// bytes of x_q per store, kQuantVecUnroll vectors per thread at once. The scalar path's
// 2-byte loads and 1-byte stores moved x at 1.5-1.9 TB/s (ncu, M = 4096, 2026-12-02).
constexpr int kQuantVecUnroll = 4;
template <typename T>
constexpr int kQuantVecElems = 16 / (int)sizeof(T);

// v[u][j] = element j of vector v0 + u * blockDim.x of row (0 past nvec vectors).
template <typename T>
__device__ __forceinline__ void load_row_vectors(const T* __restrict__ row, int v0, int nvec,
                                                 float (&v)[kQuantVecUnroll][kQuantVecElems<T>]) {
  uint4 raw[kQuantVecUnroll];
#pragma unroll
  for (int u = 0; u < kQuantVecUnroll; ++u) {
    const int i = v0 + u * (int)blockDim.x;
    raw[u] = i < nvec ? reinterpret_cast<const uint4*>(row)[i] : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int u = 0; u < kQuantVecUnroll; ++u) {
    const T* e = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
    for (int j = 0; j < kQuantVecElems<T>; ++j) v[u][j] = to_f32(e[j]);
  }
}

// Max over the CTA (non-negative values; result broadcast to every thread).
__device__ __forceinline__ float cta_max(float v, unsigned* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned m = __reduce_max_sync(0xffffffffu, __float_as_uint(v));
  __syncthreads();  // red may hold the previous call's values
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = 0u;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) m = max(m, red[w]);
  return __uint_as_float(m);
}

// partials[b] = finite absmax of the elements b, b + P*blockDim, ... of x [M, K].
template <typename T>
__device__ __forceinline__ void fp8_absmax(const T* __restrict__ x, long long x_row_stride, int M, int K,
                                           float* __restrict__ partials) {
  __shared__ unsigned red[kQuantThreads / 32];
  pdl_wait();  // launched with PDL on sm_90: x may be the previous kernel's output
  pdl_launch_dependents();
  const long long total = (long long)M * K, stride = (long long)gridDim.x * blockDim.x;
  float m = 0.f;
  // kQuantUnroll independent loads per step, issued before any is used (see fp8_quant_x)
  for (long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x; i0 < total; i0 += stride * kQuantUnroll) {
    float v[kQuantUnroll];
#pragma unroll
    for (int u = 0; u < kQuantUnroll; ++u) {
      const long long i = i0 + u * stride, r = i / K, c = i - r * K;
      v[u] = i < total ? to_f32(x[r * x_row_stride + c]) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kQuantUnroll; ++u) m = fmaxf(m, finite_abs(v[u]));
  }
  m = cta_max(m, red);
  if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

// Token blockIdx.x of x to e4m3 (x_q row stride xq_row) and its scale(s); also zeroes the
// intermediate absmax accumulators (amax_count floats) for GEMM1.
template <typename T>
__device__ __forceinline__ void fp8_quant_x(const T* __restrict__ x, long long x_row_stride, int K, int scheme,
                                            const float* __restrict__ a1_static, const float* __restrict__ partials,
                                            int num_partials, uint8_t* __restrict__ xq, long long xq_row,
                                            float* __restrict__ x_scale, int groups_k,
                                            float* __restrict__ inter_amax, long long amax_count) {
  __shared__ unsigned red[kQuantThreads / 32];
  // Launched with PDL on sm_90: the previous kernel may still read inter_amax or write x.
  // The next kernel (GEMM1) may start its set-up now; it waits for this grid before reading.
  pdl_wait();
  pdl_launch_dependents();
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < amax_count;
       i += (long long)gridDim.x * blockDim.x)
    inter_amax[i] = 0.f;
  const int t = blockIdx.x;
  const T* xr = x + (long long)t * x_row_stride;
  uint8_t* qr = xq + (long long)t * xq_row;
  if (scheme == kQBlock) {
    // one warp per 128-column group, 4 columns per lane
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int g = warp; g < groups_k; g += blockDim.x >> 5) {
      float v[4];
      float m = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = g * kFp8Block + i * 32 + lane;
        v[i] = c < K ? to_f32(xr[c]) : 0.f;
        m = fmaxf(m, finite_abs(v[i]));
      }
      m = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(m)));
      const float s = fp8_group_scale(m);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = g * kFp8Block + i * 32 + lane;
        if (c < K) qr[c] = fp8_quantize(v[i], s, 0.f, false);
      }
      if (lane == 0) x_scale[(long long)t * groups_k + g] = s;
    }
    return;
  }
  // The row is read kQuantUnroll columns per thread at a time, every load issued before the
  // first use, so a row of up to kQuantThreads * kQuantUnroll columns costs one memory
  // latency instead of one per column step (the loop was latency-bound: 4.6 us at K = 2048).
  // Vectors where the row allows them (K a multiple of the vector, both rows aligned: x_q's
  // rows are 16-byte aligned in the workspace), the scalar loops otherwise; the same values.
  constexpr int kVec = kQuantVecElems<T>;
  const bool vec = K % kVec == 0 && (reinterpret_cast<uintptr_t>(xr) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(qr) & (uintptr_t)(kVec - 1)) == 0;
  const int nvec = K / kVec;
  float s;
  if (scheme == kQTensor) {
    if (a1_static) {
      s = *a1_static;
    } else {
      float m = 0.f;
      for (int i = 0; i < num_partials; ++i) m = fmaxf(m, partials[i]);
      s = fp8_dynamic_scale(m);
    }
  } else {
    float m = 0.f;
    if (vec) {
      for (int v0 = threadIdx.x; v0 < nvec; v0 += blockDim.x * kQuantVecUnroll) {
        float v[kQuantVecUnroll][kVec];
        load_row_vectors(xr, v0, nvec, v);
#pragma unroll
        for (int u = 0; u < kQuantVecUnroll; ++u)
#pragma unroll
          for (int j = 0; j < kVec; ++j) m = fmaxf(m, finite_abs(v[u][j]));
      }
    } else {
      for (int c0 = threadIdx.x; c0 < K; c0 += blockDim.x * kQuantUnroll) {
        float v[kQuantUnroll];
        load_row_step(xr, c0, K, v);
#pragma unroll
        for (int u = 0; u < kQuantUnroll; ++u) m = fmaxf(m, finite_abs(v[u]));
      }
    }
    s = fp8_dynamic_scale(cta_max(m, red));
  }
  const float inv = __frcp_rn(s);
  if (vec) {
    for (int v0 = threadIdx.x; v0 < nvec; v0 += blockDim.x * kQuantVecUnroll) {
      float v[kQuantVecUnroll][kVec];
      load_row_vectors(xr, v0, nvec, v);
#pragma unroll
      for (int u = 0; u < kQuantVecUnroll; ++u) {
        const int i = v0 + u * (int)blockDim.x;
        if (i >= nvec) continue;
        alignas(8) __nv_fp8_storage_t q[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) q[j] = fp8_quantize(v[u][j], s, inv, scheme == kQTensor);
        if constexpr (kVec == 8)
          reinterpret_cast<uint2*>(qr)[i] = *reinterpret_cast<const uint2*>(q);
        else
          reinterpret_cast<uint32_t*>(qr)[i] = *reinterpret_cast<const uint32_t*>(q);
      }
    }
    if (threadIdx.x == 0) x_scale[t] = s;
    return;
  }
  for (int c0 = threadIdx.x; c0 < K; c0 += blockDim.x * kQuantUnroll) {
    float v[kQuantUnroll];
    load_row_step(xr, c0, K, v);
#pragma unroll
    for (int u = 0; u < kQuantUnroll; ++u) {
      const int c = c0 + u * (int)blockDim.x;
      if (c < K) qr[c] = fp8_quantize(v[u], s, inv, scheme == kQTensor);
    }
  }
  if (threadIdx.x == 0) x_scale[t] = s;
}

template <int SCHEME, int VEC>
__device__ __forceinline__ void fp8_generic_gemm1(
    const uint8_t* __restrict__ xq, long long xq_row, const float* __restrict__ x_scale, int groups_k,
    const uint8_t* __restrict__ w1, long long w1_expert_stride, long long w1_row_stride,
    const float* __restrict__ w1s, long long w1s_e, long long w1s_r, long long w1s_c,
    const void* __restrict__ topk_weights, int topk_weights_code, long long topk_weights_row_stride,
    const int* __restrict__ expert_offsets, const int* __restrict__ sorted_slots,
    const int* __restrict__ active_experts, const int* __restrict__ num_active, int topk, int N, int K, int act,
    int weight_on_input, float* __restrict__ inter, float* __restrict__ inter_amax, int groups_n) {
  __shared__ unsigned smax[kAmaxChunk];
  if ((int)blockIdx.y >= *num_active) return;  // CTA-uniform
  const int e = active_experts[blockIdx.y];
  const int row0 = blockIdx.x * kRows;
  const int row = row0 + (threadIdx.x >> 5);
  const int begin = expert_offsets[e], end = expert_offsets[e + 1];
  fp8_gemm1_rows<SCHEME, VEC, kTok>(sorted_slots + begin, end - begin, e, row, row < N, row0, xq, xq_row, x_scale,
                                    groups_k, w1, w1_expert_stride, w1_row_stride, w1s, w1s_e, w1s_r, w1s_c,
                                    topk_weights, topk_weights_code, topk_weights_row_stride, topk, N, K, act,
                                    weight_on_input, inter, inter_amax, groups_n, smax);
}

// y[s, row] = router_weight * dequant(quantize(inter[s]) . w2_q[e, row]); one warp per row.
template <int SCHEME, int VEC>
__device__ __forceinline__ void fp8_generic_gemm2(
    const float* __restrict__ inter, const float* __restrict__ inter_amax, const float* __restrict__ a2_static,
    int groups_n, const uint8_t* __restrict__ w2, long long w2_expert_stride, long long w2_row_stride,
    const float* __restrict__ w2s, long long w2s_e, long long w2s_r, long long w2s_c,
    const void* __restrict__ topk_weights, int topk_weights_code, long long topk_weights_row_stride,
    const int* __restrict__ expert_offsets, const int* __restrict__ sorted_slots,
    const int* __restrict__ active_experts, const int* __restrict__ num_active, int topk, int N, int K,
    int weight_on_input, float* __restrict__ y) {
  if ((int)blockIdx.y >= *num_active) return;
  const int e = active_experts[blockIdx.y];
  const int row = blockIdx.x * kRows + (threadIdx.x >> 5);
  if (row >= K) return;  // warp-uniform; no barrier follows
  const int lane = threadIdx.x & 31;
  const uint8_t* w = w2 + e * w2_expert_stride + (long long)row * w2_row_stride;
  const int rb = SCHEME == kQBlock ? row / kFp8Block : row;
  const int begin = expert_offsets[e], end = expert_offsets[e + 1];
  for (int t0 = begin; t0 < end; t0 += kTok) {
    const int nt = min(kTok, end - t0);
    int slot[kTok];
    float st[kTok], it[kTok];
#pragma unroll
    for (int i = 0; i < kTok; ++i) {
      slot[i] = sorted_slots[t0 + min(i, nt - 1)];
      st[i] = SCHEME == kQBlock ? 1.f : inter_scale<SCHEME>(inter_amax, a2_static, slot[i], 0, groups_n);
      it[i] = __frcp_rn(st[i]);
    }
    float acc[kTok] = {};
    for (int n = lane * VEC; n < N; n += 32 * VEC) {
      float wv[VEC];
      load_fp8_f32<VEC>(w + n, wv);
      const int g = n / kFp8Block;
      const float wsg = SCHEME == kQBlock ? w2s[scale_off(e, rb, g, w2s_e, w2s_r, w2s_c)] : 1.f;
#pragma unroll
      for (int i = 0; i < kTok; ++i) {
        if (i < nt) {
          float s = st[i], inv = it[i];
          if constexpr (SCHEME == kQBlock) {
            s = inter_scale<SCHEME>(inter_amax, a2_static, slot[i], g, groups_n);
            inv = 0.f;
          }
          float av[VEC];
          load_inter_q<SCHEME, VEC>(inter + (long long)slot[i] * N + n, s, inv, av);
          float d = 0.f;
#pragma unroll
          for (int v = 0; v < VEC; ++v) d = fmaf(wv[v], av[v], d);
          if constexpr (SCHEME == kQBlock) acc[i] = fmaf(d, s * wsg, acc[i]);
          else acc[i] += d;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kTok; ++i) acc[i] = warp_sum(acc[i]);
    if (lane < nt) {
      float a = 0.f, s = 1.f;
      int si = 0;
#pragma unroll
      for (int i = 0; i < kTok; ++i)
        if (i == lane) { a = acc[i]; si = slot[i]; s = st[i]; }
      if constexpr (SCHEME == kQTensor) a *= s * w2s[scale_off(e, 0, 0, w2s_e, 0, 0)];
      else if constexpr (SCHEME == kQChannel) a *= s * w2s[scale_off(e, rb, 0, w2s_e, w2s_r, 0)];
      if (!weight_on_input) {
        const int t = si / topk, k = si - t * topk;
        a *= load_scalar(topk_weights, topk_weights_code, (long long)t * topk_weights_row_stride + k);
      }
      y[(long long)si * K + row] = a;
    }
  }
}

}  // namespace
}  // namespace swapmoe

#define SWAPMOE_FP8_PREP(SUFFIX, T)                                                               \
  extern "C" __global__ void __launch_bounds__(swapmoe::kQuantThreads) swapmoe_fp8_absmax_##SUFFIX(  \
      const T *x, long long x_row_stride, int M, int K, float *partials) {                        \
    swapmoe::fp8_absmax<T>(x, x_row_stride, M, K, partials);                                      \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(swapmoe::kQuantThreads) swapmoe_fp8_quant_x_##SUFFIX( \
      const T *x, long long x_row_stride, int K, int scheme, const float *a1_static,              \
      const float *partials, int num_partials, uint8_t *xq, long long xq_row, float *x_scale,     \
      int groups_k, float *inter_amax, long long amax_count) {                                    \
    swapmoe::fp8_quant_x<T>(x, x_row_stride, K, scheme, a1_static, partials, num_partials, xq,    \
                            xq_row, x_scale, groups_k, inter_amax, amax_count);                   \
  }
SWAPMOE_FP8_PREP(f32, float)
SWAPMOE_FP8_PREP(bf16, __nv_bfloat16)
SWAPMOE_FP8_PREP(f16, __half)

#define SWAPMOE_FP8_GENERIC(NAME, SCHEME, VEC)                                                    \
  extern "C" __global__ void __launch_bounds__(swapmoe::kRows * 32) generic_moe_fp8_gemm1_##NAME##_v##VEC( \
      const uint8_t *xq, long long xq_row, const float *x_scale, int groups_k, const uint8_t *w1,  \
      long long w1_expert_stride, long long w1_row_stride, const float *w1s, long long w1s_e,     \
      long long w1s_r, long long w1s_c, const void *topk_weights, int topk_weights_code,          \
      long long topk_weights_row_stride, const int *expert_offsets, const int *sorted_slots,      \
      const int *active_experts, const int *num_active, int topk, int N, int K, int act,          \
      int weight_on_input, float *inter, float *inter_amax, int groups_n) {                       \
    swapmoe::fp8_generic_gemm1<SCHEME, VEC>(                                                      \
        xq, xq_row, x_scale, groups_k, w1, w1_expert_stride, w1_row_stride, w1s, w1s_e, w1s_r,    \
        w1s_c, topk_weights, topk_weights_code, topk_weights_row_stride, expert_offsets,          \
        sorted_slots, active_experts, num_active, topk, N, K, act, weight_on_input, inter,        \
        inter_amax, groups_n);                                                                    \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(swapmoe::kRows * 32) generic_moe_fp8_gemm2_##NAME##_v##VEC( \
      const float *inter, const float *inter_amax, const float *a2_static, int groups_n,          \
      const uint8_t *w2, long long w2_expert_stride, long long w2_row_stride, const float *w2s,   \
      long long w2s_e, long long w2s_r, long long w2s_c, const void *topk_weights,                \
      int topk_weights_code, long long topk_weights_row_stride, const int *expert_offsets,        \
      const int *sorted_slots, const int *active_experts, const int *num_active, int topk, int N, \
      int K, int weight_on_input, float *y) {                                                     \
    swapmoe::fp8_generic_gemm2<SCHEME, VEC>(                                                      \
        inter, inter_amax, a2_static, groups_n, w2, w2_expert_stride, w2_row_stride, w2s, w2s_e,  \
        w2s_r, w2s_c, topk_weights, topk_weights_code, topk_weights_row_stride, expert_offsets,   \
        sorted_slots, active_experts, num_active, topk, N, K, weight_on_input, y);                \
  }
SWAPMOE_FP8_GENERIC(tensor, swapmoe::kQTensor, 1)
SWAPMOE_FP8_GENERIC(tensor, swapmoe::kQTensor, 16)
SWAPMOE_FP8_GENERIC(channel, swapmoe::kQChannel, 1)
SWAPMOE_FP8_GENERIC(channel, swapmoe::kQChannel, 16)
SWAPMOE_FP8_GENERIC(block, swapmoe::kQBlock, 1)
SWAPMOE_FP8_GENERIC(block, swapmoe::kQBlock, 16)
