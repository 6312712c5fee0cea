// The router kernel: router logits [M, E] -> topk_weights fp32 [M, topk], topk_ids int32.
// One warp per token, kWarps tokens per CTA; the routing itself is route_token_warp
// (cuda/common/router.cuh), shared with the kernels that route for themselves.
// PMAX = experts per lane at most: 4 (E <= 128), 8 (E <= 256) or 32 (E <= 1024,
// `GPU_ROUTER_MAX_EXPERTS`); the narrower, the fewer instructions per pick.
#include "common/router.cuh"

namespace {
constexpr int kWarps = 4;  // tokens per CTA (`ROUTER_TOKENS_PER_CTA`)
}

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
