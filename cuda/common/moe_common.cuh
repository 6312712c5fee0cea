// Shared device helpers for swapmoe kernels: dtype traits, activations, reductions.
// Kernels take raw pointers and plain integers; nothing here knows about torch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace swapmoe {

// Activation codes; keep in step with `Activation` in src/problem.rs.
enum Activation : int { kSilu = 0, kGelu = 1 };

// Scalar dtype codes for small side inputs (router weights); keep in step with
// `ScalarCode` in src/problem.rs.
enum ScalarCode : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// Reads element `i` of a router-weight tensor of dtype `code`.
__device__ __forceinline__ float load_scalar(const void* p, int code, long long i) {
  switch (code) {
    case kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Router weight of slot s = (token s / topk, k = s % topk).
__device__ __forceinline__ float slot_router_weight(const void* p, int code, long long row_stride, int topk,
                                                    int s) {
  const int t = s / topk, k = s - t * topk;
  return load_scalar(p, code, (long long)t * row_stride + k);
}

// Router weights of N slots in two steps, so that a caller can issue other loads between the
// two and wait on all of them at once: the raw bits (every load issued, none waited on; the
// dtype picks predicated loads, not branches), then the values (slot < 0: weight 0). One
// slot_router_weight per slot, each behind its own branch, converted each value before the
// next load issued: one memory round trip per slot (SASS of the wgmma GEMM2 epilogue).
template <int N>
struct RouterWeightBits {
  unsigned bits[N];
};

template <int N>
__device__ __forceinline__ RouterWeightBits<N> load_router_weight_bits(const void* p, int code, long long row_stride,
                                                                       int topk, const int (&slots)[N]) {
  const bool two_bytes = code == kBF16 || code == kF16;
  RouterWeightBits<N> r;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int s = slots[i] >= 0 ? slots[i] : 0;  // slot 0 exists wherever a slot does
    const int t = s / topk;
    const long long at = (long long)t * row_stride + (s - t * topk);
    r.bits[i] = two_bytes ? (unsigned)__ldg(static_cast<const unsigned short*>(p) + at)
                          : __float_as_uint(__ldg(static_cast<const float*>(p) + at));
  }
  return r;
}

template <int N>
__device__ __forceinline__ void router_weights_from_bits(const RouterWeightBits<N>& r, int code, const int (&slots)[N],
                                                         float (&w)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const unsigned b = r.bits[i];
    const float v = code == kBF16  ? __uint_as_float(b << 16)
                    : code == kF16 ? __half2float(__ushort_as_half((unsigned short)b))
                                   : __uint_as_float(b);
    w[i] = slots[i] >= 0 ? v : 0.f;
  }
}

template <int N>
__device__ __forceinline__ void slot_router_weights(const void* p, int code, long long row_stride, int topk,
                                                    const int (&slots)[N], float (&w)[N]) {
  router_weights_from_bits(load_router_weight_bits<N>(p, code, row_stride, topk, slots), code, slots, w);
}

// 2^x with subnormal results flushed to 0 (ex2.approx.ftz). __expf(x) is ex2.approx of
// x * log2(e) without the flush, which costs a compare and two predicated multiplies around
// the MUFU. In silu the flush cannot change a bit: 2^x < 2^-126 only ever adds to 1.0f.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// silu(g) = g * sigmoid(g); gelu is the exact (erf) form, as vLLM's gelu_and_mul.
// The activation as a template argument: an epilogue that loops over values calls this
// inside with_activation, so that no branch on `act` sits between the values and the
// compiler can interleave their dependent chains (exp, add, reciprocal, multiply). With the
// branch inside the loop, each value's chain ran alone in its own basic block (SASS of the
// wgmma GEMM1 epilogues).
template <int A>
__device__ __forceinline__ float activate_as(float g) {
  if constexpr (A == kGelu) {
    return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f));
  } else {
    // __fdividef (reciprocal and multiply, 2 ulp) instead of the IEEE division, whose
    // Newton steps and slow-path branch made it most of the wgmma GEMM1 epilogue's silu
    // (ncu, benches/NOTES.md "FP8 wgmma v4"). Large negative g gives -0 (rcp(inf) = 0).
    // g * -log2(e) is exactly the product __expf(-g) forms.
    return __fdividef(g, 1.0f + exp2_ftz(g * -1.44269504088896341f));
  }
}

__device__ __forceinline__ float activate(int act, float g) {
  return act == kGelu ? activate_as<kGelu>(g) : activate_as<kSilu>(g);
}

template <int A>
struct ActivationConst {
  static constexpr int value = A;
};

// Runs body(ActivationConst<act>{}): one copy of the body per activation, the branch on
// `act` outside it (activate_as).
template <typename Body>
__device__ __forceinline__ void with_activation(int act, Body body) {
  if (act == kGelu) {
    body(ActivationConst<kGelu>{});
  } else {
    body(ActivationConst<kSilu>{});
  }
}

// Programmatic dependent launch (sm_90): wait for the previous kernel in the stream before
// touching its outputs; let the next kernel begin its launch. No-ops before sm_90 and when
// the kernel was launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Local expert of slot s = (token, k) of topk_ids,, or -1 (id out of range, -1 id, expert_map -1 or out of range).
__device__ __forceinline__ int slot_local_expert(const void* __restrict__ topk_ids, int ids_is_i64,
                                                 long long ids_row_stride,
                                                 const int* __restrict__ expert_map, int topk,
                                                 int global_E, int local_E, int s) {
  const int m = s / topk, k = s - m * topk;
  const long long off = (long long)m * ids_row_stride + k;
  const long long g = ids_is_i64 ? static_cast<const long long*>(topk_ids)[off]
                                 : (long long)static_cast<const int*>(topk_ids)[off];
  if (g < 0 || g >= global_E) return -1;
  const int local = expert_map ? expert_map[g] : (int)g;
  return (local < 0 || local >= local_E) ? -1 : local;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A vector of VEC elements of T loaded with one instruction (16 bytes when VEC*sizeof(T)==16).
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// Loads VEC consecutive elements (one 16-byte load when VEC*sizeof(T)==16) as floats,
// through the read-only path.
template <typename T, int VEC>
__device__ __forceinline__ void load_vec_f32(const T* p, float (&out)[VEC]) {
  static_assert(sizeof(T) * VEC == 16 || VEC == 1, "16-byte vectors or scalars");
  if constexpr (VEC == 1) {
    out[0] = to_f32(__ldg(p));
  } else {
    int4 raw = __ldg(reinterpret_cast<const int4*>(p));
    Vec<T, VEC> r = *reinterpret_cast<Vec<T, VEC>*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = to_f32(r.v[i]);
  }
}

// GEMM1's epilogue for slot s and output row `row`: inter[s, row] = act(g) * u, with the
// router weight applied to both dot products when it applies to the input.
template <typename T>
__device__ __forceinline__ void store_gate_up(T* __restrict__ inter, int s, int N, int row, float g, float u,
                                              int act, int weight_on_input, const void* __restrict__ topk_weights,
                                              int topk_weights_code, long long topk_weights_row_stride,
                                              int topk) {
  if (weight_on_input) {
    const float w = slot_router_weight(topk_weights, topk_weights_code, topk_weights_row_stride, topk, s);
    g *= w;
    u *= w;
  }
  inter[(long long)s * N + row] = from_f32<T>(activate(act, g) * u);
}

// Two dot products per token, for up to TOK tokens against rows wa and wb (GEMM1's gate
// and up rows): lanes stride over K with VEC-element loads; NT tokens are live.
template <typename T, int VEC, int NT, int TOK>
__device__ __forceinline__ void dot_rows2(const T* __restrict__ wa, const T* __restrict__ wb,
                                          const T* const (&xr)[TOK], int K, int lane,
                                          float (&acc_a)[TOK], float (&acc_b)[TOK]) {
#pragma unroll 4
  for (int k = lane * VEC; k < K; k += 32 * VEC) {
    float a[VEC], b[VEC];
    load_vec_f32<T, VEC>(wa + k, a);
    load_vec_f32<T, VEC>(wb + k, b);
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      float xv[VEC];
      load_vec_f32<T, VEC>(xr[i] + k, xv);
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        acc_a[i] = fmaf(a[v], xv[v], acc_a[i]);
        acc_b[i] = fmaf(b[v], xv[v], acc_b[i]);
      }
    }
  }
}

// GEMM1 for one output row j and every slot of one expert: one warp computes
// inter[s, j] = act(gate_j . x[t]) * (up_j . x[t]) (x scaled by the router weight when
// weight_on_input), kTok slots per pass over the two weight rows. `slots` is the expert's
// slot list (global or shared memory), `count` its length. Lane i writes token i.
template <typename T, int VEC, int TOK>
__device__ __forceinline__ void gemm1_row(const T* __restrict__ wg, const T* __restrict__ wu,
                                          const T* __restrict__ x, long long x_row_stride,
                                          const int* slots, int count, int topk, int N, int K,
                                          int row, int lane, int act, int weight_on_input,
                                          const void* __restrict__ topk_weights, int topk_weights_code,
                                          long long topk_weights_row_stride, T* __restrict__ inter) {
  for (int t0 = 0; t0 < count; t0 += TOK) {
    const int nt = min(TOK, count - t0);
    int slot[TOK];
    const T* xr[TOK];
#pragma unroll
    for (int i = 0; i < TOK; ++i) {
      slot[i] = slots[t0 + min(i, nt - 1)];
      xr[i] = x + (long long)(slot[i] / topk) * x_row_stride;
    }
    float g[TOK] = {}, u[TOK] = {};
    static_assert(TOK == 4, "the dispatch below covers 1..4 live slots");
    switch (nt) {
      case 1: dot_rows2<T, VEC, 1, TOK>(wg, wu, xr, K, lane, g, u); break;
      case 2: dot_rows2<T, VEC, 2, TOK>(wg, wu, xr, K, lane, g, u); break;
      case 3: dot_rows2<T, VEC, 3, TOK>(wg, wu, xr, K, lane, g, u); break;
      default: dot_rows2<T, VEC, 4, TOK>(wg, wu, xr, K, lane, g, u); break;
    }
#pragma unroll
    for (int i = 0; i < TOK; ++i) {
      g[i] = warp_sum(g[i]);
      u[i] = warp_sum(u[i]);
    }
    if (lane < nt) {
      // Registers are indexed by a compile-time loop, not by lane.
      float gi = 0.f, ui = 0.f;
      int si = 0;
#pragma unroll
      for (int i = 0; i < TOK; ++i)
        if (i == lane) { gi = g[i]; ui = u[i]; si = slot[i]; }
      store_gate_up<T>(inter, si, N, row, gi, ui, act, weight_on_input, topk_weights, topk_weights_code,
                       topk_weights_row_stride, topk);
    }
  }
}

// The weight GEMM2's sum gives slot s: its router weight, or 1 when that was applied to the
// input. The GEMM2 kernels load every slot's weight into shared memory at their start,
// next to its expert, so that the sum below reads no global memory: loaded inside the
// sum's k loop, the weights were S dependent global round trips at the kernel's end.
__device__ __forceinline__ float slot_sum_weight(int weight_on_input, const void* __restrict__ topk_weights,
                                                 int topk_weights_code, long long topk_weights_row_stride,
                                                 int topk, int s) {
  return weight_on_input ? 1.f
                         : slot_router_weight(topk_weights, topk_weights_code, topk_weights_row_stride, topk, s);
}

// out[t, r0 + i] for every token t < M and row i < rows: the sum over k, in k order, of
// slot_weight[s] times part[s][i] (s = t*topk + k), over the slots with a local expert
// (slot_expert >= 0). slot_expert and slot_weight are per slot, in shared memory. Thread
// `tid` of `nthreads` takes the (t, i) pairs tid, tid + nthreads, ...
template <typename T, int ROWS>
__device__ __forceinline__ void store_topk_sums(const float (*part)[ROWS], const int* slot_expert,
                                                const float* slot_weight, int M, int topk, int rows, int r0,
                                                T* __restrict__ out, long long out_row_stride, int tid,
                                                int nthreads) {
  for (int idx = tid; idx < M * ROWS; idx += nthreads) {
    const int t = idx / ROWS, i = idx - t * ROWS;
    if (i >= rows) continue;
    float sum = 0.f;
    for (int k = 0; k < topk; ++k) {
      const int s = t * topk + k;
      if (slot_expert[s] < 0) continue;
      sum += slot_weight[s] * part[s][i];
    }
    out[(long long)t * out_row_stride + r0 + i] = from_f32<T>(sum);
  }
}

}  // namespace swapmoe
