// The router: one warp routes one token, with everything in registers.
//
// Semantics as src/routing.rs (vLLM's fused_topk / grouped_topk): softmax or sigmoid scores
// in f32; an optional correction bias steers selection only; grouped selection keeps the
// `topk_group` best groups (group score = best biased score, or with a bias the sum of the
// two best); the top-k come in descending order, NaN first (torch.topk), ties to the
// lowest index; weights = unbiased scores, renormalized, times routed_scaling_factor.
//
// Layout: lane l owns the P = ceil(E/32) consecutive experts [l*P, l*P + P), so the lowest
// lane among equal keys holds the lowest index. Selection compares 32-bit order keys
// (NaN > +inf > ... > -inf > 0 = "not a candidate") with one warp max reduction (redux.sync,
// sm_80+) and a ballot per pick: no shared memory, no serial scan.
//
// Used by the router kernel (cuda/route_topk.cu), and by the two routing twins that
// $SWAPMOE_ROUTER_FUSION=on selects (measured slower, see benches/NOTES.md "Router v3"):
// the route-and-align kernel (cuda/route_align.cu) and the decode GEMM1 that routes for
// itself (cuda/decode_moe.cu).
#pragma once
#include "moe_common.cuh"

namespace swapmoe {

// Everything a router needs, passed by value to the kernels. The layout must match
// `RouterArgs` in src/cuda/launch.rs (#[repr(C)]): 8-byte fields first, then 4-byte ones.
struct RouterArgs {
  const void* logits;      // [M, E] fp32 / bf16 / fp16 (ScalarCode logits_code)
  long long logits_row;    // row stride in elements
  const void* bias;        // [E] or nullptr (ScalarCode bias_code)
  float* weights;          // [M, topk] fp32 out
  long long weights_row;
  int* ids;                // [M, topk] int32 out
  long long ids_row;
  int logits_code;
  int bias_code;
  int E;
  int topk;
  int renormalize;
  int scoring;             // 0 softmax, 1 sigmoid (`Scoring::code`)
  int groups;              // 1: no grouped selection
  int topk_group;
  float scale;             // routed_scaling_factor
  int pad_;
};
static_assert(sizeof(RouterArgs) == 96 && alignof(RouterArgs) == 8, "RouterArgs: layout shared with Rust");

// Order key of a selection value: larger ranks first; NaN above everything; -0 == +0;
// every number (even -inf) above 0, which marks "not a candidate".
__device__ __forceinline__ unsigned order_key(float v) {
  if (isnan(v)) return 0xffffffffu;
  const unsigned u = __float_as_uint(v == 0.f ? 0.f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The number an order key stands for (order_key's inverse; NaN for the NaN key).
__device__ __forceinline__ float key_value(unsigned k) {
  if (k == 0xffffffffu) return NAN;
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// A pick's final weight (every lane of the warp; `picked`: the lane holds one of the token's
// topk picks, its unbiased score in w): renormalized over the picks when asked, times
// routed_scaling_factor. Lanes past topk divide 1 (their result is dropped): a 0 numerator
// sends the whole warp through the division's slow path (FCHK).
__device__ __forceinline__ float finish_weight(const RouterArgs& a, float w, bool picked) {
  if (a.renormalize) {
    const float s = warp_sum(picked ? w : 0.f);
    w = (picked ? w : 1.f) / s;
  }
  return w * a.scale;
}

// Keeps k1 >= k2 the two largest keys seen (equal keys both kept; 0 = none).
__device__ __forceinline__ void top2_key_insert(unsigned k, unsigned& k1, unsigned& k2) {
  k2 = max(k2, min(k1, k));
  k1 = max(k1, k);
}

// Merges the top-2 pairs of the lanes in aligned runs of `width` lanes (a power of two).
__device__ __forceinline__ void top2_key_merge(unsigned& k1, unsigned& k2, int width) {
  for (int o = 1; o < width; o <<= 1) {
    const unsigned o1 = __shfl_xor_sync(0xffffffffu, k1, o), o2 = __shfl_xor_sync(0xffffffffu, k2, o);
    k2 = max(min(k1, o1), max(k2, o2));
    k1 = max(k1, o1);
  }
}

// A group's score as an order key: its best selection value, or with a correction bias the
// sum of its two best.
__device__ __forceinline__ unsigned group_key(unsigned k1, unsigned k2, bool two_best) {
  return order_key(two_best ? key_value(k1) + key_value(k2) : key_value(k1));
}

__device__ __forceinline__ float router_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The lane holding the warp's largest key (the lowest such lane on ties).
__device__ __forceinline__ int lane_of_max(unsigned key) {
  const unsigned best = __reduce_max_sync(0xffffffffu, key);
  return __ffs(__ballot_sync(0xffffffffu, key == best)) - 1;
}

template <typename T, int PMAX>
__device__ __forceinline__ void load_lane_values(const T* __restrict__ row, int e0, int P, int E,
                                                 float (&x)[PMAX]) {
  // A lane's PMAX values are contiguous: with P == PMAX, a 16-byte aligned row and the
  // lane's range inside E, load them as 16-byte (or 8-byte) vectors. Element by element,
  // every load instruction touched 32 sectors (lanes PMAX elements apart).
  constexpr int kBytes = PMAX * (int)sizeof(T);
  const T* p = row + e0;
  if constexpr (kBytes % 8 == 0) {
    constexpr int kChunk = kBytes % 16 == 0 ? 16 : 8;
    if (P == PMAX && e0 + PMAX <= E && (reinterpret_cast<uintptr_t>(p) % kChunk) == 0) {
      constexpr int kPer = kChunk / (int)sizeof(T);
#pragma unroll
      for (int c = 0; c < PMAX / kPer; ++c) {
        T v[kPer];
        if constexpr (kChunk == 16) {
          *reinterpret_cast<int4*>(v) = __ldg(reinterpret_cast<const int4*>(p) + c);
        } else {
          *reinterpret_cast<int2*>(v) = __ldg(reinterpret_cast<const int2*>(p) + c);
        }
#pragma unroll
        for (int i = 0; i < kPer; ++i) x[c * kPer + i] = to_f32(v[i]);
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < PMAX; ++j) x[j] = (j < P && e0 + j < E) ? to_f32(row[e0 + j]) : 0.f;
}

template <int PMAX>
__device__ __forceinline__ void load_lane_scalars(const void* p, int code, long long base, int e0, int P, int E,
                                                  float (&x)[PMAX]) {
  switch (code) {
    case kBF16: load_lane_values<__nv_bfloat16, PMAX>(static_cast<const __nv_bfloat16*>(p) + base, e0, P, E, x); break;
    case kF16: load_lane_values<__half, PMAX>(static_cast<const __half*>(p) + base, e0, P, E, x); break;
    default: load_lane_values<float, PMAX>(static_cast<const float*>(p) + base, e0, P, E, x); break;
  }
}

// Routes token t. On return lane r < topk holds pick r: `id` and its final `weight`.
// Every lane of the warp must call it (E <= 32 * PMAX, topk <= 32).
template <int PMAX>
__device__ __forceinline__ void route_token_warp(const RouterArgs& a, int t, int lane, float& weight, int& id) {
  const int E = a.E;
  const int P = (E + 31) >> 5;  // experts per lane
  const int e0 = lane * P;
  float x[PMAX], b[PMAX];
  load_lane_scalars<PMAX>(a.logits, a.logits_code, (long long)t * a.logits_row, e0, P, E, x);
  if (a.bias) load_lane_scalars<PMAX>(a.bias, a.bias_code, 0, e0, P, E, b);
  bool valid[PMAX];
#pragma unroll
  for (int j = 0; j < PMAX; ++j) valid[j] = j < P && e0 + j < E;

  float sc[PMAX];  // unbiased scores
  if (a.scoring == 0) {  // softmax
    float mx = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int j = 0; j < PMAX; ++j)
      if (valid[j]) {
        mx = fmaxf(mx, x[j]);
        nan |= isnan(x[j]);
      }
    mx = router_warp_max(mx);
    nan = __any_sync(0xffffffffu, nan);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < PMAX; ++j) {
      sc[j] = valid[j] ? expf(x[j] - mx) : 0.f;
      sum += sc[j];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int j = 0; j < PMAX; ++j) sc[j] = nan ? NAN : sc[j] / sum;
  } else {  // sigmoid
#pragma unroll
    for (int j = 0; j < PMAX; ++j) sc[j] = __frcp_rn(1.f + expf(-x[j]));  // == 1.f / (...), rounded once
  }
  unsigned key[PMAX];  // order keys of the selection values (score + bias)
#pragma unroll
  for (int j = 0; j < PMAX; ++j) key[j] = valid[j] ? order_key(a.bias ? sc[j] + b[j] : sc[j]) : 0u;

  if (a.groups > 1) {
    const int G = a.groups, gs = E / G;
    unsigned group_ok = 0u;  // bit g: group g may be picked from
    unsigned gkey = 0u;      // a group's score (as an order key) in the lane that holds it
    const int L = gs % P == 0 ? gs / P : 0;  // lanes per group when groups align with lanes
    if (L > 0 && (L & (L - 1)) == 0) {
      // Fast: lane l lies in group l*P/gs; the L lanes of a group merge their top-2.
      unsigned k1 = 0u, k2 = 0u;
#pragma unroll
      for (int j = 0; j < PMAX; ++j) top2_key_insert(key[j], k1, k2);
      top2_key_merge(k1, k2, L);
      if (e0 < E && lane % L == 0) gkey = group_key(k1, k2, a.bias != nullptr);
      const int lanes_log2 = __ffs(L) - 1;  // lane l lies in group l >> lanes_log2
      for (int r = 0; r < a.topk_group; ++r) {
        const int src = lane_of_max(gkey);
        group_ok |= 1u << (src >> lanes_log2);
        if (lane == src) gkey = 0u;
      }
      if (e0 < E && !((group_ok >> (lane >> lanes_log2)) & 1u)) {
#pragma unroll
        for (int j = 0; j < PMAX; ++j) key[j] = 0u;
      }
    } else {
      // General: one warp-wide top-2 per group; lane g holds group g's score.
      for (int g = 0; g < G; ++g) {
        unsigned k1 = 0u, k2 = 0u;
#pragma unroll
        for (int j = 0; j < PMAX; ++j)
          if ((e0 + j) / gs == g) top2_key_insert(key[j], k1, k2);
        top2_key_merge(k1, k2, 32);
        if (lane == g) gkey = group_key(k1, k2, a.bias != nullptr);
      }
      for (int r = 0; r < a.topk_group; ++r) {
        const int src = lane_of_max(gkey);
        group_ok |= 1u << src;
        if (lane == src) gkey = 0u;
      }
#pragma unroll
      for (int j = 0; j < PMAX; ++j)
        if (valid[j] && !((group_ok >> ((e0 + j) / gs)) & 1u)) key[j] = 0u;
    }
  }

  // Top-k: per pick, every lane offers its largest key, the warp takes the largest of those
  // (the lowest lane on ties), and that lane gives its lowest index with that key and the
  // score there, then drops it. One reduction, one ballot and two shuffles per pick.
  weight = 0.f;
  id = 0;
  for (int r = 0; r < a.topk; ++r) {
    unsigned best = 0u;
#pragma unroll
    for (int j = 0; j < PMAX; ++j) best = max(best, key[j]);
    const int src = lane_of_max(best);
    int bj = 0;
    float bw = 0.f;
#pragma unroll
    for (int j = PMAX - 1; j >= 0; --j)
      if (key[j] == best) {
        bj = j;
        bw = sc[j];
      }
    const int j = __shfl_sync(0xffffffffu, bj, src);
    const float w = __shfl_sync(0xffffffffu, bw, src);
    if (lane == src) {
#pragma unroll
      for (int q = 0; q < PMAX; ++q)
        if (q == j) key[q] = 0u;
    }
    if (lane == r) {
      id = src * P + j;
      weight = w;
    }
  }
  weight = finish_weight(a, weight, lane < a.topk);
}

// Routes token t and writes its picks to a.weights / a.ids (lanes < topk).
template <int PMAX>
__device__ __forceinline__ void route_token_to_global(const RouterArgs& a, int t, int lane) {
  float w;
  int id;
  route_token_warp<PMAX>(a, t, lane, w, id);
  if (lane < a.topk) {
    a.weights[(long long)t * a.weights_row + lane] = w;
    a.ids[(long long)t * a.ids_row + lane] = id;
  }
}

}  // namespace swapmoe
