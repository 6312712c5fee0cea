// FP8 (e4m3) W8A8 helpers shared by the decode and generic FP8 kernels.
//
// Semantics (the CPU path, src/cpu/fp8.rs, is the reference): quantizing v with scale s
// gives the e4m3 value nearest to v/s (ties to even) after clamping to +-448; per-tensor
// scales multiply by the correctly rounded reciprocal 1/s, per-token and per-group scales
// divide. NaN and +-inf quantize to NaN (0x7F) and never enter an absmax. Dynamic scales:
// per tensor / per token max(absmax / 448, 1/(448*512)), per 128-column group
// max(absmax, 1e-10) / 448. Weights are dequantized by their scales after the f32 dot
// product (per 16-element vector for 128x128 blocks).
//
// Absmax accumulators hold the float bits of |v| (non-negative floats order like their
// bits as unsigned), combined with atomicMax. The quantize-x kernel zeroes them first.
#pragma once
#include <cuda_fp8.h>

#include "moe_common.cuh"

namespace swapmoe {

// Scheme codes; keep in step with `QuantScheme::code` in src/problem.rs.
enum QuantSchemeCode : int { kQTensor = 0, kQChannel = 1, kQBlock = 2 };

constexpr int kFp8Block = 128;  // `FP8_BLOCK`
constexpr float kFp8Max = 448.0f;
constexpr float kFp8GroupEps = 1e-10f;  // `FP8_GROUP_EPS`

__device__ __forceinline__ float fp8_min_scale() { return 1.0f / (448.0f * 512.0f); }  // `FP8_MIN_SCALE`

__device__ __forceinline__ float fp8_dynamic_scale(float amax) {
  return fmaxf(__fdiv_rn(amax, kFp8Max), fp8_min_scale());
}
__device__ __forceinline__ float fp8_group_scale(float amax) {
  return __fdiv_rn(fmaxf(amax, kFp8GroupEps), kFp8Max);
}

// |v| for an absmax: non-finite values count as 0.
__device__ __forceinline__ float finite_abs(float v) { return isfinite(v) ? fabsf(v) : 0.0f; }

// e4m3 byte of v quantized with scale s (`inv` = 1/s for per-tensor scales). Branch-free:
// the saturating conversion clamps to +-448 (inf included), and a select gives NaN's 0x7F
// (the conversion would keep a NaN's sign) for a non-finite v or a NaN quotient.
__device__ __forceinline__ __nv_fp8_storage_t fp8_quantize(float v, float s, float inv, bool per_tensor) {
  const float t = per_tensor ? __fmul_rn(v, inv) : __fdiv_rn(v, s);
  const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(t, __NV_SATFINITE, __NV_E4M3);
  return (isfinite(v) && !isnan(t)) ? q : (__nv_fp8_storage_t)0x7F;
}

// The e4m3 bytes of two values, v0 in the low byte: each byte is fp8_quantize(v, s, inv,
// per_tensor)'s. One conversion for the pair (cvt ... e4m3x2), and a select before it that
// turns what fp8_quantize sends to 0x7F into a positive NaN (the conversion keeps a NaN's
// sign: 0x7F). fp8_quantize per value converted each byte alone, then selected and packed:
// ~11 instructions per value against ~5 here (SASS of the wgmma FP8 GEMM1 epilogue,
// benches/NOTES.md "... e4m3 pairs in one conversion").
__device__ __forceinline__ unsigned short fp8x2_quantize(float v0, float v1, float s, float inv, bool per_tensor) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  auto scaled = [=](float v) {
    const float t = per_tensor ? __fmul_rn(v, inv) : __fdiv_rn(v, s);
    return (isfinite(v) && !isnan(t)) ? t : __uint_as_float(0x7fffffffu);
  };
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(scaled(v1)), "f"(scaled(v0)));
  return pair;
#else
  return (unsigned short)fp8_quantize(v0, s, inv, per_tensor) |
         (unsigned short)((unsigned)fp8_quantize(v1, s, inv, per_tensor) << 8);
#endif
}

__device__ __forceinline__ float fp8_to_f32(__nv_fp8_storage_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

// Two e4m3 values (low byte first) as floats.
__device__ __forceinline__ float2 fp8x2_to_f32x2(__nv_fp8x2_storage_t b) {
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(b, __NV_E4M3)));
}

// VEC consecutive e4m3 values as floats: one 16-byte load when VEC == 16.
template <int VEC>
__device__ __forceinline__ void load_fp8_f32(const uint8_t* __restrict__ p, float (&out)[VEC]) {
  static_assert(VEC == 1 || VEC == 16, "16-byte vectors or scalars");
  if constexpr (VEC == 1) {
    out[0] = fp8_to_f32(__ldg(p));
  } else {
    const int4 raw = __ldg(reinterpret_cast<const int4*>(p));
    const unsigned w[4] = {(unsigned)raw.x, (unsigned)raw.y, (unsigned)raw.z, (unsigned)raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 lo = fp8x2_to_f32x2((__nv_fp8x2_storage_t)(w[i] & 0xFFFFu));
      const float2 hi = fp8x2_to_f32x2((__nv_fp8x2_storage_t)(w[i] >> 16));
      out[4 * i] = lo.x;
      out[4 * i + 1] = lo.y;
      out[4 * i + 2] = hi.x;
      out[4 * i + 3] = hi.y;
    }
  }
}

// VEC float32 intermediate values, quantized with scale s (inv = 1/s) and read back as
// the e4m3 values (what GEMM2 multiplies with).
template <int SCHEME, int VEC>
__device__ __forceinline__ void load_inter_q(const float* __restrict__ a, float s, float inv, float (&out)[VEC]) {
  float v[VEC];
  if constexpr (VEC == 1) {
    v[0] = a[0];
  } else {
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(a + i);
      v[i] = f.x;
      v[i + 1] = f.y;
      v[i + 2] = f.z;
      v[i + 3] = f.w;
    }
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = fp8_to_f32(fp8_quantize(v[i], s, inv, SCHEME == kQTensor));
}

// The intermediate's scale for `slot` and 128-column group `g`: static (per tensor), or
// from the absmax accumulators GEMM1 filled.
template <int SCHEME>
__device__ __forceinline__ float inter_scale(const float* __restrict__ inter_amax, const float* __restrict__ a2_static,
                                             int slot, int g, int groups_n) {
  if constexpr (SCHEME == kQTensor) {
    return a2_static ? *a2_static : fp8_dynamic_scale(inter_amax[0]);
  } else if constexpr (SCHEME == kQChannel) {
    return fp8_dynamic_scale(inter_amax[slot]);
  } else {
    return fp8_group_scale(inter_amax[(long long)slot * groups_n + g]);
  }
}

// Element offset of a weight scale: expert e, scale row r, scale column c.
__device__ __forceinline__ long long scale_off(int e, int r, int c, long long se, long long sr, long long sc) {
  return (long long)e * se + (long long)r * sr + (long long)c * sc;
}

// Slots whose GEMM1 absmax one CTA keeps in shared memory at a time.
constexpr int kAmaxChunk = 256;

// GEMM1 of the FP8 path for one expert `e`, one gate/up row per warp (`row`, valid when
// `active`), every slot of `slots[0, count)` (global or shared memory): the input is
// x_q [M, xq_row] (e4m3, from the quantize-x kernel) with scales x_scale [M, groups_k].
// Writes inter[s, row] = act(g) * u in f32 and folds |inter| into inter_amax (per
// tensor: [0]; per token: [s]; per group: [s, row/128]). Every thread of the CTA must
// call it (it holds barriers); `cta_row0` is the CTA's first row (rows of one CTA lie in
// one 128-row group).
template <int SCHEME, int VEC, int TOK>
__device__ __forceinline__ void fp8_gemm1_rows(
    const int* slots, int count, int e, int row, bool active, int cta_row0, const uint8_t* __restrict__ xq,
    long long xq_row, const float* __restrict__ x_scale, int groups_k, const uint8_t* __restrict__ w1,
    long long w1_expert_stride, long long w1_row_stride, const float* __restrict__ w1s, long long w1s_e,
    long long w1s_r, long long w1s_c, const void* __restrict__ topk_weights, int topk_weights_code,
    long long topk_weights_row_stride, int topk, int N, int K, int act, int weight_on_input,
    float* __restrict__ inter, float* __restrict__ inter_amax, int groups_n, unsigned* smax) {
  const int lane = threadIdx.x & 31;
  const uint8_t* wg = w1 + e * w1_expert_stride + (long long)row * w1_row_stride;
  const uint8_t* wu = w1 + e * w1_expert_stride + (long long)(row + N) * w1_row_stride;
  const int rg = SCHEME == kQBlock ? row / kFp8Block : row;
  const int ru = SCHEME == kQBlock ? (row + N) / kFp8Block : row + N;
  for (int c0 = 0; c0 < count; c0 += kAmaxChunk) {
    const int cn = min(kAmaxChunk, count - c0);
    for (int i = threadIdx.x; i < cn; i += blockDim.x) smax[i] = 0u;
    __syncthreads();
    if (active) {
      for (int t0 = 0; t0 < cn; t0 += TOK) {
        const int nt = min(TOK, cn - t0);
        int slot[TOK];
        const uint8_t* xr[TOK];
        const float* xs[TOK];
#pragma unroll
        for (int i = 0; i < TOK; ++i) {
          slot[i] = slots[c0 + t0 + min(i, nt - 1)];
          const int t = slot[i] / topk;
          xr[i] = xq + (long long)t * xq_row;
          xs[i] = x_scale + (long long)t * groups_k;
        }
        float g[TOK] = {}, u[TOK] = {};
        for (int k = lane * VEC; k < K; k += 32 * VEC) {
          float a[VEC], b[VEC];
          load_fp8_f32<VEC>(wg + k, a);
          load_fp8_f32<VEC>(wu + k, b);
          float sg = 1.f, su = 1.f;
          if constexpr (SCHEME == kQBlock) {
            const int kb = k / kFp8Block;
            sg = w1s[scale_off(e, rg, kb, w1s_e, w1s_r, w1s_c)];
            su = w1s[scale_off(e, ru, kb, w1s_e, w1s_r, w1s_c)];
          }
#pragma unroll
          for (int i = 0; i < TOK; ++i) {
            if (i < nt) {
              float xv[VEC];
              load_fp8_f32<VEC>(xr[i] + k, xv);
              float dg = 0.f, du = 0.f;
#pragma unroll
              for (int v = 0; v < VEC; ++v) {
                dg = fmaf(a[v], xv[v], dg);
                du = fmaf(b[v], xv[v], du);
              }
              if constexpr (SCHEME == kQBlock) {
                const float xsv = xs[i][k / kFp8Block];
                g[i] = fmaf(dg, xsv * sg, g[i]);
                u[i] = fmaf(du, xsv * su, u[i]);
              } else {
                g[i] += dg;
                u[i] += du;
              }
            }
          }
        }
#pragma unroll
        for (int i = 0; i < TOK; ++i) {
          g[i] = warp_sum(g[i]);
          u[i] = warp_sum(u[i]);
        }
        if (lane < nt) {
          float gi = 0.f, ui = 0.f;
          int si = 0;
          const float* xsi = xs[0];
#pragma unroll
          for (int i = 0; i < TOK; ++i)
            if (i == lane) { gi = g[i]; ui = u[i]; si = slot[i]; xsi = xs[i]; }
          if constexpr (SCHEME == kQTensor) {
            gi *= xsi[0] * w1s[scale_off(e, 0, 0, w1s_e, 0, 0)];
            ui *= xsi[0] * w1s[scale_off(e, 0, 0, w1s_e, 0, 0)];
          } else if constexpr (SCHEME == kQChannel) {
            gi *= xsi[0] * w1s[scale_off(e, rg, 0, w1s_e, w1s_r, 0)];
            ui *= xsi[0] * w1s[scale_off(e, ru, 0, w1s_e, w1s_r, 0)];
          }
          if (weight_on_input) {
            const int t = si / topk, k = si - t * topk;
            const float w = load_scalar(topk_weights, topk_weights_code, (long long)t * topk_weights_row_stride + k);
            gi *= w;
            ui *= w;
          }
          const float a = activate(act, gi) * ui;
          inter[(long long)si * N + row] = a;
          atomicMax(&smax[t0 + lane], __float_as_uint(finite_abs(a)));
        }
      }
    }
    __syncthreads();
    if constexpr (SCHEME == kQTensor) {
      if (threadIdx.x < 32) {
        unsigned m = 0u;
        for (int i = lane; i < cn; i += 32) m = max(m, smax[i]);
        m = __reduce_max_sync(0xffffffffu, m);
        if (lane == 0 && m) atomicMax(reinterpret_cast<unsigned*>(inter_amax), m);
      }
    } else {
      const int g = SCHEME == kQBlock ? cta_row0 / kFp8Block : 0;
      for (int i = threadIdx.x; i < cn; i += blockDim.x)
        if (smax[i])
          atomicMax(reinterpret_cast<unsigned*>(inter_amax) + (long long)slots[c0 + i] * groups_n + g, smax[i]);
    }
    __syncthreads();
  }
}

}  // namespace swapmoe
