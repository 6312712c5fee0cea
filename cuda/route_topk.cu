// The router kernels: router logits [M, E] -> topk_weights fp32 [M, topk], topk_ids int32.
//
// swapmoe_route_topk_p{PMAX}: one warp per token, kWarps tokens per CTA; the routing itself
// is route_token_warp (cuda/common/router.cuh), shared with the kernels that route for
// themselves. PMAX = experts per lane at most: 4 (E <= 128), 8 (E <= 256) or 32 (E <= 1024,
// `GPU_ROUTER_MAX_EXPERTS`); the narrower, the fewer instructions per pick.
//
// swapmoe_route_grouped_cta: one CTA per token and one thread per expert, for grouped
// sigmoid routing (DeepSeek-V3) with power-of-two groups of at most 32 experts and E <= 256
// (`oracle::router_kernel` says when). The warp router spends most of its time in serial
// picks over 8 keys per lane plus the group stage; here every stage is a few parallel
// steps: the group's top-2 by shuffles, each group's rank among the groups, each expert's
// rank inside its warp (`rank_in_warp`: 31 butterfly shuffles and one match), then one rank
// over the warps' top-k candidates (in one warp by `rank_in_warp` when they fit 32 lanes,
// as DeepSeek-V3's 4 x 8 do). Same semantics and the same floating-point operations as the
// warp router (sigmoid, group scores, the renormalizing warp sum), so its outputs are
// bitwise equal to route_token_warp's.
#include "common/router.cuh"

namespace {
constexpr int kWarps = 4;              // tokens per CTA (`ROUTER_TOKENS_PER_CTA`)
constexpr int kGroupedThreads = 256;   // experts per CTA at most (`ROUTER_CTA_MAX_EXPERTS`)

// The rank of `key` among its warp's 32 keys, largest first, ties to the lower lane: the
// keys above it (31 butterfly shuffles: every other lane once, no index arithmetic) plus the
// equal keys of lower lanes (one match). Four partial counts, so that the 31 additions are
// four short dependency chains instead of one long one.
__device__ __forceinline__ int rank_in_warp(unsigned key, int lane) {
  int part[4] = {__popc(__match_any_sync(0xffffffffu, key) & ((1u << lane) - 1u)), 0, 0, 0};
#pragma unroll
  for (int o = 1; o < 32; ++o) part[o & 3] += __shfl_xor_sync(0xffffffffu, key, o) > key;
  return (part[0] + part[1]) + (part[2] + part[3]);
}
}  // namespace

#define SWAPMOE_ROUTE(PMAX)                                                                           \
  extern "C" __global__ void __launch_bounds__(kWarps * 32) swapmoe_route_topk_p##PMAX(            \
      swapmoe::RouterArgs a, int M) {                                                                 \
    const int t = blockIdx.x * kWarps + (threadIdx.x >> 5);                                           \
    swapmoe::pdl_wait();                                                                              \
    swapmoe::pdl_launch_dependents();                                                                 \
    if (t >= M) return; /* warp-uniform; no block barrier follows */                                  \
    swapmoe::route_token_to_global<PMAX>(a, t, threadIdx.x & 31);                                     \
  }
SWAPMOE_ROUTE(4)
SWAPMOE_ROUTE(8)
SWAPMOE_ROUTE(32)

// Grid: M CTAs (token = blockIdx.x); block: 32 * ceil(E / 32) threads (thread e = expert e).
// The launcher guarantees scoring = sigmoid, groups > 1, E / groups a power of two <= 32,
// E <= kGroupedThreads and topk <= 32 (so a warp's top-k candidates fit its 32 lanes).
extern "C" __global__ void __launch_bounds__(kGroupedThreads) swapmoe_route_grouped_cta(swapmoe::RouterArgs a,
                                                                                      int M) {
  using namespace swapmoe;
  __shared__ unsigned group_keys[32];
  __shared__ unsigned cand_key[kGroupedThreads];  // each warp's top-k, warp-major, in pick order
  __shared__ int cand_id[kGroupedThreads];
  __shared__ float cand_score[kGroupedThreads];
  __shared__ int pick_id[32];
  __shared__ float pick_score[32];
  __shared__ unsigned warps_with_candidates;  // bit w: warp w wrote its top-k slots

  if (threadIdx.x == 0) warps_with_candidates = 0u;  // published by the first barrier below
  pdl_wait();
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
  const int E = a.E, G = a.groups, gs = E / G, topk = a.topk;
  const int gs_log2 = __ffs(gs) - 1;  // expert e lies in group e >> gs_log2
  const bool valid = e < E;

  float x[1], b[1] = {0.f};
  load_lane_scalars<1>(a.logits, a.logits_code, (long long)t * a.logits_row, e, 1, E, x);
  if (a.bias) load_lane_scalars<1>(a.bias, a.bias_code, 0, e, 1, E, b);
  const float sc = __frcp_rn(1.f + expf(-x[0]));  // the unbiased score, as route_token_warp
  unsigned key = valid ? order_key(a.bias ? sc + b[0] : sc) : 0u;

  // Group scores: each aligned run of gs lanes is one group (E = G * gs, so a run is all
  // valid or all invalid); its first lane stores the score.
  unsigned k1 = key, k2 = 0u;
  top2_key_merge(k1, k2, gs);
  if (valid && (lane & (gs - 1)) == 0) group_keys[e >> gs_log2] = group_key(k1, k2, a.bias != nullptr);
  __syncthreads();

  // A group stays if fewer than topk_group groups beat it (larger key, or an equal key and a
  // lower index): the picks route_token_warp makes one reduction at a time.
  bool chosen = false;
  if (valid) {
    const int g = e >> gs_log2;
    const unsigned mine = group_keys[g];
    int beaten_by = 0;
    for (int q = 0; q < G; ++q) {
      const unsigned other = group_keys[q];
      beaten_by += (other > mine) | ((other == mine) & (q < g));
    }
    chosen = beaten_by < a.topk_group;
  }
  if (!chosen) key = 0u;

  // Each warp's top-k in order: an expert's rank among its warp's 32 keys (ties to the lower
  // lane, which is the lower expert). Only warps with a candidate write their slots (all
  // topk of them: the ranks are a permutation of 0..31) and mark themselves.
  if (__ballot_sync(0xffffffffu, key != 0u) != 0u) {
    if (lane == 0) atomicOr(&warps_with_candidates, 1u << warp);
    const int rank = rank_in_warp(key, lane);
    if (rank < topk) {
      const int slot = warp * topk + rank;
      cand_key[slot] = key;
      cand_id[slot] = e;
      cand_score[slot] = sc;
    }
  }
  __syncthreads();

  // The token's top-k: each candidate's rank among the slots of the warps that wrote theirs
  // (DeepSeek-V3: the 4 chosen groups' 32 slots of 64). Slot order is expert order among
  // equal keys (warps hold ascending experts, each warp's slots ascend on ties), so "equal
  // key, lower slot" is route_token_warp's "equal key, lower index". The chosen groups hold
  // at least topk experts (validated), so slots with key 0 never rank below topk.
  const int candidates = (blockDim.x >> 5) * topk;
  const unsigned written = warps_with_candidates;
  if (__popc(written) * topk <= 32) {
    // Every written slot fits one warp: lane j takes the j-th written slot (warp-major, so
    // lane order is slot order) and ranks it among the others as the warps ranked their keys.
    if (warp == 0) {
      int j = lane;
      unsigned rest = written;
      while (rest && j >= topk) {
        j -= topk;
        rest &= rest - 1;
      }
      const int slot = rest ? (__ffs(rest) - 1) * topk + j : -1;
      const unsigned mine = slot >= 0 ? cand_key[slot] : 0u;
      const int rank = rank_in_warp(mine, lane);
      if (slot >= 0 && rank < topk) {
        pick_id[rank] = cand_id[slot];
        pick_score[rank] = cand_score[slot];
      }
    }
  } else if (e < candidates && ((written >> (e / topk)) & 1u)) {
    const unsigned mine = cand_key[e];
    int beaten_by = 0;
    for (unsigned rest = written; rest; rest &= rest - 1) {
      const int base = (__ffs(rest) - 1) * topk;
#pragma unroll 8
      for (int j = 0; j < topk; ++j) {
        const int q = base + j;
        const unsigned other = cand_key[q];
        beaten_by += (other > mine) | ((other == mine) & (q < e));
      }
    }
    if (beaten_by < topk) {
      pick_id[beaten_by] = cand_id[e];
      pick_score[beaten_by] = cand_score[e];
    }
  }
  __syncthreads();

  // Weights as route_token_warp: the same warp sum over lanes < topk, the same divisions.
  if (warp == 0) {
    const float w = finish_weight(a, lane < topk ? pick_score[lane] : 0.f, lane < topk);
    if (lane < topk) {
      a.weights[(long long)t * a.weights_row + lane] = w;
      a.ids[(long long)t * a.ids_row + lane] = pick_id[lane];
    }
  }
  (void)M;
}
