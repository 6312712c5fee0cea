// Routers on the GPU: router logits [M, E] -> topk_weights fp32 [M, topk], topk_ids int32.
// One warp per token. Semantics as src/routing.rs (vLLM's fused_topk / grouped_topk):
// softmax or sigmoid scores in f32; optional correction bias for selection; optional
// grouped selection (group score = max, or sum of the two best biased scores with a
// bias); top-k in descending order, NaN first (torch.topk), ties to the lowest index;
// weights = unbiased scores, renormalized, times routed_scaling_factor.
#include "common/moe_common.cuh"

namespace swapmoe {
namespace {

constexpr int kMaxExperts = 1024;  // `GPU_ROUTER_MAX_EXPERTS`
constexpr int kWarps = 4;          // tokens per CTA
constexpr int kNone = 0x7fffffff;

// a ranks before b: NaN first, then larger; equal values go to the lower index.
__device__ __forceinline__ bool ranks_before(float av, int ai, float bv, int bi) {
  const bool an = isnan(av), bn = isnan(bv);
  if (an != bn) return an;
  if (!an && av != bv) return av > bv;
  return ai < bi;
}

// Keeps b1, b2 the two best values seen (in ranks_before order; equal values both kept).
__device__ __forceinline__ void top2_insert(float v, float& b1, float& b2) {
  if (ranks_before(v, 0, b1, 1)) {
    b2 = b1;
    b1 = v;
  } else if (ranks_before(v, 0, b2, 1)) {
    b2 = v;
  }
}

__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ranks_before(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T>
__device__ __forceinline__ void route_topk(const T* __restrict__ logits, long long logits_row_stride, int M,
                                           int E, int topk, int renormalize, int scoring, int num_groups,
                                           int topk_group, const void* __restrict__ bias, int bias_code,
                                           float scale, float* __restrict__ weights, long long weights_row_stride,
                                           int* __restrict__ ids, long long ids_row_stride) {
  __shared__ float score_s[kWarps][kMaxExperts];   // unbiased scores
  __shared__ float select_s[kWarps][kMaxExperts];  // scores used for selection
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kWarps + warp;
  pdl_wait();
  pdl_launch_dependents();
  if (t >= M) return;  // warp-uniform; no block barrier below
  float* sc = score_s[warp];
  float* sel = select_s[warp];
  const T* row = logits + (long long)t * logits_row_stride;

  if (scoring == 0) {  // softmax
    float mx = -INFINITY;
    bool nan = false;
    for (int e = lane; e < E; e += 32) {
      const float x = to_f32(row[e]);
      sc[e] = x;
      nan |= isnan(x);
      mx = fmaxf(mx, x);
    }
    mx = warp_max(mx);
    nan = __any_sync(0xffffffffu, nan);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) {
      const float ex = expf(sc[e] - mx);
      sc[e] = ex;
      sum += ex;
    }
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) sc[e] = nan ? NAN : sc[e] / sum;
  } else {  // sigmoid
    for (int e = lane; e < E; e += 32) sc[e] = 1.f / (1.f + expf(-to_f32(row[e])));
  }
  for (int e = lane; e < E; e += 32) sel[e] = bias ? sc[e] + load_scalar(bias, bias_code, e) : sc[e];
  __syncwarp();

  unsigned group_ok = 0xffffffffu;  // bit g: group g may be picked from
  int group_size = E;
  if (num_groups > 1) {
    group_size = E / num_groups;
    // Lanes per group: L lanes share a group, each scanning every L-th of its experts
    // (bank-conflict free), then the L partial results are merged with shuffles.
    const int L = (32 % num_groups == 0) ? 32 / num_groups : 1;
    const int grp = lane / L, part = lane % L;
    float b1 = -INFINITY, b2 = -INFINITY;  // the two best values, NaN first (-inf: empty)
    if (grp < num_groups) {
      const float* g = sel + grp * group_size;
#pragma unroll 4
      for (int j = part; j < group_size; j += L) top2_insert(g[j], b1, b2);
    }
    for (int o = 1; o < L; o <<= 1) {  // merge the L partial top-2s of a group
      const float o1 = __shfl_xor_sync(0xffffffffu, b1, o), o2 = __shfl_xor_sync(0xffffffffu, b2, o);
      top2_insert(o1, b1, b2);
      top2_insert(o2, b1, b2);
    }
    float gv = -INFINITY;
    int gi = kNone;
    if (grp < num_groups && part == 0) {
      gv = bias ? b1 + b2 : b1;
      gi = grp;
    }
    group_ok = 0u;
    for (int r = 0; r < topk_group; ++r) {
      float v = gv;
      int i = gi;
      warp_best(v, i);
      group_ok |= 1u << i;
      if (i == gi) { gv = -INFINITY; gi = kNone; }
    }
  }

  // Top-k over the allowed experts; lane j keeps pick j.
  unsigned taken = 0u;  // bit q: expert lane + 32*q picked
  const int per_lane = (E + 31) / 32;
  float my_w = 0.f;
  int my_id = 0;
  for (int r = 0; r < topk; ++r) {
    float v = -INFINITY;
    int i = kNone;
#pragma unroll 4
    for (int q = 0; q < per_lane; ++q) {
      const int e = lane + 32 * q;
      if (e >= E || ((taken >> q) & 1u) || !((group_ok >> (e / group_size)) & 1u)) continue;
      const float x = sel[e];
      if (ranks_before(x, e, v, i)) { v = x; i = e; }
    }
    warp_best(v, i);
    if ((i & 31) == lane) taken |= 1u << (i >> 5);
    if (lane == r) { my_id = i; my_w = sc[i]; }
  }
  if (renormalize) {
    const float s = warp_sum(lane < topk ? my_w : 0.f);
    my_w /= s;
  }
  my_w *= scale;
  if (lane < topk) {
    weights[(long long)t * weights_row_stride + lane] = my_w;
    ids[(long long)t * ids_row_stride + lane] = my_id;
  }
}

}  // namespace
}  // namespace swapmoe

#define SWAPMOE_ROUTE(SUFFIX, T)                                                                     \
  extern "C" __global__ void __launch_bounds__(swapmoe::kWarps * 32) swapmoe_route_topk_##SUFFIX(  \
      const T *logits, long long logits_row_stride, int M, int E, int topk, int renormalize,          \
      int scoring, int num_groups, int topk_group, const void *bias, int bias_code, float scale,     \
      float *weights, long long weights_row_stride, int *ids, long long ids_row_stride) {            \
    swapmoe::route_topk<T>(logits, logits_row_stride, M, E, topk, renormalize, scoring, num_groups,  \
                           topk_group, bias, bias_code, scale, weights, weights_row_stride, ids,     \
                           ids_row_stride);                                                          \
  }
SWAPMOE_ROUTE(f32, float)
SWAPMOE_ROUTE(bf16, __nv_bfloat16)
SWAPMOE_ROUTE(f16, __half)
