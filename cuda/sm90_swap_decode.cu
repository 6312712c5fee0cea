// Hopper (sm_90a) swap-AB decode kernels: the expert weights fill wgmma's 64-row A slot and
// the few tokens are the narrow N side (m64nNTk16 with NT = 8, 16, 32 or 64 >= M), so at
// decode the weights stream as whole TMA boxes and no token rows are padded to 64.
//
//   swap_moe_gemm1_act   h[a, t, j] = sum over t's slots on e of
//                                     w * act(x[t] . w1[e, j]) * (x[t] . w1[e, N + j])
//                        (with the router weight on the input: act(w x[t] . w1[e, j]) * (w x[t] . ...))
//                        e = the a-th active local expert in ascending id order; 0 for a token
//                        that does not route to e
//   swap_moe_gemm2_sum   out[t, r] = sum over the active experts a, in order, of h[a, t] . w2[e_a, r]
//
// h has one row per (active expert, token) with the router weight already applied, so GEMM2
// accumulates all of a token's experts in one accumulator column: no per-slot output, no
// top-k sum kernel, no atomics, and the order of every sum is fixed (deterministic). A token
// that lists an expert twice gets both slots summed into its row of h.
// No align kernel: every CTA reads topk_ids (M*topk <= kMaxSlots) into a shared bitmap of
// the active experts.
//
// GEMM1 CTA: 64 inter columns j0.. of active expert a = blockIdx.y, and one part of K when a
//   cluster of CTAs splits K. Each stage holds 64 gate rows and the 64 matching up rows of
//   w1[e] x 64 of K (two TMA boxes, 128-byte swizzle) and the NT token rows of x x 64 (one
//   TMA box; rows >= M are zero-filled). The gate and up accumulators have the same layout,
//   so act-and-mul is elementwise in registers.
// GEMM2 CTA: 64 output rows r0.., and a contiguous run of the active experts when a cluster
//   splits them. Each stage holds 64 rows of w2[e] x 64 of N and h[a]'s NT token rows x 64.
// With a split, the CTAs of a cluster add their fp32 accumulators through distributed
// shared memory in rank order, and rank 0 stores.
// GEMM2's producer issues its first stages' weight copies before griddepcontrol.wait (the
// weights do not depend on GEMM1), so its weight stream starts under GEMM1's tail.
// Warps 0-3 are the consumer warpgroup (wgmma, fp32 accumulators in registers), warp 4
// the producer (one thread issues the TMA copies). Stages are sized so that two CTAs fit
// an SM.
// Requirements (checked by the oracle and the launcher): sm_90a; bf16/fp16; K and N
// multiples of 8 with 16-byte aligned tensors and rows (TMA); M <= 64, M*topk <= 512.
#include "common/fp8_moe.cuh"
#include "common/moe_common.cuh"
#include "common/sm90.cuh"
#include "common/wgmma_ops.cuh"

namespace swapmoe {
namespace {

constexpr int kRows = 64;                // weight rows per CTA: wgmma's A slot (`SWAP_ROWS`)
constexpr int kBK = 64;                  // reduction elements per stage: one 128-byte row
constexpr int kThreads = 160;            // `SWAP_THREADS`: a consumer warpgroup + a producer warp
constexpr int kMaxSlots = 512;           // `SWAP_MAX_SLOTS`
constexpr int kMaxExperts = 8192;        // `MAX_GPU_LOCAL_EXPERTS`

// The token (B row) that register 4j + q of a thread's m64nNk16 accumulator holds: n8 block j,
// token 8j + 2 * (lane % 4) + (q & 1). Callers that count a thread's columns c = 2j + parity
// pass (c >> 1, c).
__device__ __forceinline__ int accumulator_token(int j, int q, int lane) { return 8 * j + 2 * (lane & 3) + (q & 1); }

// A stage: for each of kSub consecutive 64-wide K slices, kBoxes boxes of 64 weight rows x 64
// (so each weight row is read as kSub * 128 contiguous bytes at once), then the NT token
// rows x 64 of each slice (`swap_smem_bytes`). As many stages as fit 102 KiB (two CTAs per
// SM) when that is at least three, else as many as fit 200 KiB (one CTA per SM).
template <int NT, int kBoxes, int kSub>
struct Stages {
  static constexpr int kBoxBytes = kRows * kBK * 2;
  static constexpr int kTokenBytes = NT * kBK * 2;
  static constexpr int kWeightBytes = kBoxes * kSub * kBoxBytes;
  static constexpr int kStageBytes = kWeightBytes + kSub * kTokenBytes;
  static constexpr int kTwoPerSm = 102 * 1024 / kStageBytes;
  static constexpr int kCount = kTwoPerSm >= 3 ? kTwoPerSm : 200 * 1024 / kStageBytes;
  static constexpr int kSmemBytes = kCount * kStageBytes + 1024;  // + 1 KiB to align stages
  static_assert(kStageBytes % 1024 == 0, "stages keep the 1024-byte swizzle alignment");
  static_assert(kCount >= 2, "at least two stages in flight");
  static_assert(kSmemBytes + 6 * 1024 <= 227 * 1024, "stages and routing fit an SM");
  // Shared offsets in a stage: weight box b of slice j, and the token rows of slice j.
  __device__ static constexpr int weight(int b, int j) { return (b * kSub + j) * kBoxBytes; }
  __device__ static constexpr int tokens(int j) { return kWeightBytes + j * kTokenBytes; }
};

struct Routing {
  unsigned bits[kMaxExperts / 32];  // active local experts
  int slot_expert[kMaxSlots];       // local expert of each slot, or -1
  float slot_weight[kMaxSlots];     // router weight of each slot (GEMM1)
  int active;                       // number of active local experts
  int expert;                       // GEMM1: this CTA's expert, or -1
};

// Probe builds only (SWAPMOE_CUDA_PROBE=no_mma at build time, see build.rs): `consume` and
// `consume_fp8` release each stage as soon as it is full, with no wgmma and no scales, so the
// swap kernels stream exactly their release bytes through the same rings, barriers, clusters
// and launches, and write zeros: what the memory pipeline alone costs (A/B: benches/ab.sh).
// Profiling builds only (SWAPMOE_CUDA_STAMPS=1 at build time, see build.rs): thread 0 of
// every CTA of the 16-bit swap kernels and of the FP8 swap GEMM1 and static-scale GEMM2
// records %globaltimer at fixed points and appends a record to `swapmoe_stamps` (no printf:
// a call would serialize the wgmma pipeline); benches/stamps.py reads it through
// `_core._module_global`. Release builds compile none of it. Record: kernel (1 = GEMM1,
// 2 = GEMM2, 3 = FP8 GEMM1, 4 = FP8 static-scale GEMM2), blockIdx.x, blockIdx.y, cluster
// rank, SM, expert (GEMM1) or first active index (GEMM2), items, then t0..t5 in ns (see
// benches/stamps.py for the points; t3 is the first full stage), then the ring's other stages
// already full at t3 and when its last first-round stage was (SWAPMOE_STAMP_FULL); and, in
// `swapmoe_stage_stamps` at the same index, when thread 0's wait for each of the first 16
// stages returned (with the math, that includes consuming the stages before it; in a probe
// build, SWAPMOE_CUDA_PROBE=no_mma, it is when the stage landed).
#if defined(SWAPMOE_STAMPS) && defined(SWAPMOE_SM90A)
}  // namespace
constexpr unsigned kStampRecords = 1u << 16, kStampWords = 16;
constexpr int kStageStamps = 16;  // per record: when thread 0's wait for stage k returned, k < 16
}  // namespace swapmoe
__device__ unsigned long long swapmoe_stamps[swapmoe::kStampRecords * swapmoe::kStampWords];
__device__ unsigned long long swapmoe_stage_stamps[swapmoe::kStampRecords * swapmoe::kStageStamps];
__device__ unsigned swapmoe_stamp_count;  // global scope: unmangled for cuModuleGetGlobal
namespace swapmoe {
namespace {
struct Stamps {
  unsigned long long t[6];
};
// When the first stage landed, how many of the ring's other first-round stages had landed
// too (in issue order they would not have); and when thread 0's wait for the ring's last
// first-round stage returned (0: the CTA has fewer items than its ring).
__shared__ unsigned stamp_ready_at_first;
__shared__ unsigned long long stamp_ring_full;
__shared__ unsigned long long stamp_stage[kStageStamps];  // thread 0's full-barrier returns
__device__ __forceinline__ void stamp_record(const Stamps& st, int kernel, int expert, int items) {
  const unsigned i = atomicAdd(&swapmoe_stamp_count, 1u);
  if (i >= kStampRecords) return;
  unsigned long long* r = swapmoe_stamps + (unsigned long long)i * kStampWords;
  r[0] = kernel;
  r[1] = blockIdx.x;
  r[2] = blockIdx.y;
  r[3] = cluster_ctarank();
  r[4] = sm_id();
  r[5] = (unsigned long long)(long long)expert;
  r[6] = items;
  for (int k = 0; k < 6; ++k) r[7 + k] = st.t[k];
  r[10] = items > 0 ? stamp_stage[0] : 0ull;  // t3: the first full stage
  r[13] = items > 0 ? stamp_ready_at_first : 0ull;
  r[14] = items > 0 ? stamp_ring_full : 0ull;
  unsigned long long* stages = swapmoe_stage_stamps + (unsigned long long)i * kStageStamps;
  for (int k = 0; k < kStageStamps; ++k) stages[k] = k < items ? stamp_stage[k] : 0ull;
}
#define SWAPMOE_STAMP(st, i)                            \
  do {                                                  \
    if (threadIdx.x == 0) (st).t[i] = globaltimer_ns(); \
  } while (0)
#define SWAPMOE_STAMP_FULL(it, full, ring)                                \
  do {                                                                    \
    if (threadIdx.x == 0) {                                               \
      if ((it) < kStageStamps) stamp_stage[it] = globaltimer_ns();        \
      if ((it) == 0) {                                                    \
        unsigned ready = 0;                                               \
        for (int s_ = 1; s_ < (ring); ++s_) ready += mbar_test(&(full)[s_], 0); \
        stamp_ready_at_first = ready;                                     \
        stamp_ring_full = 0ull;                                           \
      }                                                                   \
      if ((it) == (ring) - 1) stamp_ring_full = globaltimer_ns();         \
    }                                                                     \
  } while (0)
#define SWAPMOE_STAMP_RECORD(st, kernel, expert, items)            \
  do {                                                             \
    if (threadIdx.x == 0) stamp_record(st, kernel, expert, items); \
  } while (0)
#define SWAPMOE_STAMPS_DECLARE(st) Stamps st = {{0, 0, 0, 0, 0, 0}}
#else
#define SWAPMOE_STAMP(st, i) \
  do {                       \
  } while (0)
#define SWAPMOE_STAMP_FULL(it, full, ring) \
  do {                                     \
  } while (0)
#define SWAPMOE_STAMP_RECORD(st, kernel, expert, items) \
  do {                                                  \
  } while (0)
#define SWAPMOE_STAMPS_DECLARE(st) \
  do {                             \
  } while (0)
#endif

#ifdef SWAPMOE_SM90A
constexpr int kProducerWarp = 4;
constexpr int kConsumerThreads = 128;

// Every thread (kCtaThreads of them): the slots' local experts (and router weights when
// `topk_weights` is given) and the bitmap of active experts, in shared memory.
template <int kCtaThreads = kThreads>
__device__ __forceinline__ void mark_active(Routing& r, const void* __restrict__ topk_ids, int ids_is_i64,
                                            long long ids_row_stride, const int* __restrict__ expert_map,
                                            const void* __restrict__ topk_weights, int topk_weights_code,
                                            long long topk_weights_row_stride, int M, int topk, int global_E,
                                            int local_E) {
  const int S = M * topk, words = (local_E + 31) / 32;
  for (int w = threadIdx.x; w < words; w += kCtaThreads) r.bits[w] = 0u;
  __syncthreads();
  for (int s = threadIdx.x; s < S; s += kCtaThreads) {
    const int e = slot_local_expert(topk_ids, ids_is_i64, ids_row_stride, expert_map, topk, global_E, local_E, s);
    r.slot_expert[s] = e;
    if (topk_weights)
      r.slot_weight[s] = slot_router_weight(topk_weights, topk_weights_code, topk_weights_row_stride, topk, s);
    if (e >= 0) atomicOr(&r.bits[e >> 5], 1u << (e & 31));
  }
  __syncthreads();
}

// One whole warp: the number of active experts, and the `which`-th of them in ascending id
// order (-1 when there is none), in every lane.
__device__ __forceinline__ void count_and_pick(const unsigned* bits, int words, int which, int& count,
                                               int& picked) {
  const int lane = threadIdx.x & 31;
  int before = 0, mine = -1;
  for (int base = 0; base < words; base += 32) {
    unsigned w = base + lane < words ? bits[base + lane] : 0u;
    const int c = __popc(w);
    int incl = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int first = before + incl - c;
    if (which >= first && which < first + c) {
      for (int i = which - first; i > 0; --i) w &= w - 1;
      mine = (base + lane) * 32 + __ffs(w) - 1;
    }
    before += __shfl_sync(0xffffffffu, incl, 31);
  }
  const unsigned has = __ballot_sync(0xffffffffu, mine >= 0);
  picked = has ? __shfl_sync(0xffffffffu, mine, __ffs(has) - 1) : -1;
  count = before;
}

// Every thread of a GEMM1 CTA, after mark_active: its expert, the blockIdx.y-th active local
// expert in ascending id order, or -1 when there are fewer.
__device__ __forceinline__ int pick_expert(Routing& r, int local_E, int warp, int lane) {
  if (warp == 0) {
    int count, picked;
    count_and_pick(r.bits, (local_E + 31) / 32, blockIdx.y, count, picked);
    if (lane == 0) r.expert = picked;
  }
  __syncthreads();
  return r.expert;
}

// Every thread of a GEMM2 CTA, after mark_active: r.active = the number of active local experts.
__device__ __forceinline__ void count_active(Routing& r, int words, int warp, int lane) {
  if (warp == 0) {
    int count, picked;
    count_and_pick(r.bits, words, -1, count, picked);
    if (lane == 0) r.active = count;
  }
  __syncthreads();
}

// The next active expert after `after`, or -1.
__device__ __forceinline__ int next_active(const unsigned* bits, int words, int after) {
  const int e = after + 1;
  int w = e >> 5;
  if (w >= words) return -1;
  unsigned m = bits[w] & (0xffffffffu << (e & 31));
  while (m == 0u) {
    if (++w >= words) return -1;
    m = bits[w];
  }
  return w * 32 + __ffs(m) - 1;
}

#ifdef SWAPMOE_SM90A
// The barrier on which a split cluster's rank 0 receives its peers' sums (cluster_sum); set up
// with the ring's barriers (init_barriers, the FP8 GEMM2's own), used once per launch.
__shared__ __align__(8) uint64_t cluster_sum_bar;
#endif

__device__ __forceinline__ unsigned char* aligned_stages(unsigned char* smem) {
  const uint32_t base = smem_u32(smem);
  return smem + (((base + 1023u) & ~1023u) - base);
}

// `empty_arrivals`: the consumer warps' lane 0 (16-bit kernels), or every consumer thread
// (FP8: each thread's own reads of the stage are released by its arrival).
template <int kCount>
__device__ __forceinline__ void init_barriers(uint64_t* full, uint64_t* empty, const TensorMap* a,
                                              const TensorMap* b, int empty_arrivals = kConsumerThreads / 32) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < kCount; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], empty_arrivals);
    }
    mbar_init(&cluster_sum_bar, 1);
    mbar_init_fence();
    tma_prefetch_map(a);
    tma_prefetch_map(b);
  }
}

// Stages in the ring of a kernel whose launcher may give it fewer than L::kCount (the swap
// GEMM1s and the e4m3 GEMM2s: `Plan::swap_gemm1_ring`, `Plan::swap_gemm2_ring`, so that more
// CTAs fit an SM): as many as the dynamic shared memory holds past its 1 KiB of alignment, at most
// L::kCount (the barriers' count).
template <typename L>
__device__ __forceinline__ int ring_stages() {
  uint32_t bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return min(L::kCount, (int)((bytes - 1024u) / (uint32_t)L::kStageBytes));
}

// The consumer warpgroup: `items` stages, each kBK / 16 wgmmas per weight box against the
// stage's token rows, accumulated into acc[box], through a ring of `ring` stages. Releases
// each stage to the producer once its wgmmas have completed: with the kernel's own ring one
// stage later (the next stage's wgmmas are issued before the previous ones are waited for,
// so the consumer holds two stages and ring - 1 loads stay in flight); with a smaller ring
// (the swap GEMM1's `Plan::swap_gemm1_ring`) at once, so that all `ring` stages can be
// loading while the tensor core is idle.
template <typename T, int NT, int kBoxes, int kSub>
__device__ __forceinline__ void consume(int items, int ring, unsigned char* stages, uint64_t* full, uint64_t* empty,
                                        float (&acc)[kBoxes][NT / 2]) {
  using L = Stages<NT, kBoxes, kSub>;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int b = 0; b < kBoxes; ++b)
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[b][i] = 0.f;
  const bool release_at_once = ring < L::kCount;
  RingCursor stage;
  for (int it = 0; it < items; ++it) {
    const int st = stage.slot;
    mbar_wait(&full[st], stage.phase());
    SWAPMOE_STAMP_FULL(it, full, ring);
#ifdef SWAPMOE_PROBE_NO_MMA
    // Probe build: the stage is released unread (the memory pipeline alone).
    if (lane == 0) mbar_arrive(&empty[st]);
    stage.advance(ring);
    continue;
#endif
    const uint32_t base = smem_u32(stages + st * L::kStageBytes);
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) fence_accumulators(acc[b]);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kSub; ++j)
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
#pragma unroll
        for (int b = 0; b < kBoxes; ++b)
          wgmma::Mma<NT, T>::run(acc[b], wgmma_desc_sw128(base + L::weight(b, j) + kk * 32),
                                 wgmma_desc_sw128(base + L::tokens(j) + kk * 32), 1);
    wgmma_commit();
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) fence_accumulators(acc[b]);
    if (release_at_once) {
      wgmma_wait<0>();
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) fence_accumulators(acc[b]);
      if (lane == 0) mbar_arrive(&empty[st]);
    } else {
      wgmma_wait<1>();
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) fence_accumulators(acc[b]);
      if (it > 0 && lane == 0) mbar_arrive(&empty[st == 0 ? ring - 1 : st - 1]);
    }
    stage.advance(ring);
  }
  wgmma_wait<0>();
#pragma unroll
  for (int b = 0; b < kBoxes; ++b) fence_accumulators(acc[b]);
}

// Every thread of the cluster: rank 0's consumers end with the sum over the cluster's ranks,
// in rank order, of acc. `scratch` is this CTA's drained stage memory.
// Push form, where rank 0's stage memory holds every peer's sums ((ranks - 1) x kBoxes x NT / 2
// floats per consumer thread): once every CTA's ring is drained (a relaxed barrier: nothing is
// published by it), each peer stores its sums into rank 0's stage memory by st.async, counted
// on rank 0's cluster_sum_bar, and rank 0 waits for those bytes and adds them from its own
// shared memory. No memory barrier and one one-way trip, against the pull form's release
// (a MEMBAR.ALL.GPU on sm_90a) and one remote round trip per peer. Otherwise the pull form:
// the peers publish their sums in their own stage memory (a release) and rank 0 reads them.
// Either way a last relaxed barrier keeps every CTA until rank 0 has what it reads.
template <int NT, int kBoxes>
__device__ __forceinline__ void cluster_sum(float (&acc)[kBoxes][NT / 2], float* scratch, bool consumer) {
  static_assert((NT / 2) % 4 == 0, "a thread's sums go as 16-byte vectors");
  constexpr uint32_t kPeerFloats = kBoxes * (NT / 2) * kConsumerThreads;  // one peer's sums
  const uint32_t rank = cluster_ctarank(), ranks = cluster_nctarank();
  uint32_t smem_bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem_bytes));
  const bool push = (ranks - 1) * kPeerFloats * 4u <= smem_bytes - 1024u;  // the same in every rank
  // Peer q's sums at rank 0: scratch[(q - 1) * kPeerFloats + (b * kConsumerThreads + thread) *
  // NT / 2 + i] (a thread's NT / 2 sums of a box are contiguous: one 16-byte store per 4).
  auto slot = [&](uint32_t q, int b, int i) {
    return (q - 1) * kPeerFloats + (uint32_t)(b * kConsumerThreads + (int)threadIdx.x) * (NT / 2) + i;
  };
  // A peer's own sums for the pull form, thread-minor (scalar accesses without bank conflicts).
  auto own = [&](int b, int i) { return (b * (NT / 2) + i) * kConsumerThreads + (int)threadIdx.x; };
  if (push) {
    cluster_arrive_relaxed();
    cluster_wait();  // every ring drained: rank 0's stage memory is free
    if (consumer && rank != 0) {
#pragma unroll
      for (int b = 0; b < kBoxes; ++b)
#pragma unroll
        for (int i = 0; i < NT / 2; i += 4) {
          const float v[4] = {acc[b][i], acc[b][i + 1], acc[b][i + 2], acc[b][i + 3]};
          st_async_cluster_v4(smem_u32(&scratch[slot(rank, b, i)]), smem_u32(&cluster_sum_bar), 0, v);
        }
    } else if (consumer) {
      if (threadIdx.x == 0) mbar_arrive_expect(&cluster_sum_bar, (ranks - 1) * kPeerFloats * 4u);
      mbar_wait(&cluster_sum_bar, 0);
      for (uint32_t q = 1; q < ranks; ++q)  // in rank order
#pragma unroll
        for (int b = 0; b < kBoxes; ++b)
#pragma unroll
          for (int i = 0; i < NT / 2; ++i) acc[b][i] += scratch[slot(q, b, i)];
    }
  } else {
    // The peers publish their sums (a release); rank 0 has nothing to publish, so its arrive is
    // relaxed and its path to the sum carries no memory barrier.
    if (rank != 0) {
      if (consumer) {
#pragma unroll
        for (int b = 0; b < kBoxes; ++b)
#pragma unroll
          for (int i = 0; i < NT / 2; ++i) scratch[own(b, i)] = acc[b][i];
      }
      cluster_arrive_release();
    } else {
      cluster_arrive_relaxed();
    }
    cluster_wait();
    if (consumer && rank == 0) {
      for (uint32_t q = 1; q < ranks; ++q)  // in rank order
#pragma unroll
        for (int b = 0; b < kBoxes; ++b)
#pragma unroll
          for (int i = 0; i < NT / 2; ++i) acc[b][i] += ld_shared_cluster_f32(smem_u32(&scratch[own(b, i)]), q);
    }
  }
  // Every CTA stays until rank 0 has its peers' sums (pull: has read their stage memory; push:
  // has received their stores; without this barrier in the push form the split tests did not
  // finish on an H100, 2026-12-05, read as a CTA leaving with its st.async in flight). A
  // relaxed arrive: rank 0's reads have returned (the fence keeps the adds that use them ahead
  // of it) and nothing else needs ordering, while the release form costs every CTA a
  // MEMBAR.ALL.GPU (and a MEMBAR.ALL.CTA) on its way out.
#pragma unroll
  for (int b = 0; b < kBoxes; ++b) fence_accumulators(acc[b]);
  cluster_arrive_relaxed();
  cluster_wait();
}
#endif

template <typename T, int NT, int kSub>
__device__ __forceinline__ void gemm1_act(const TensorMap* x_map, const TensorMap* w1_map,
                                          const void* __restrict__ topk_weights, int topk_weights_code,
                                          long long topk_weights_row_stride, const void* __restrict__ topk_ids,
                                          int ids_is_i64, long long ids_row_stride,
                                          const int* __restrict__ expert_map, int M, int topk, int global_E,
                                          int local_E, int N, int K, int act, int weight_on_input,
                                          T* __restrict__ h) {
#ifdef SWAPMOE_SM90A
  using L = Stages<NT, 2, kSub>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ Routing r;
  __shared__ __align__(8) uint64_t full[L::kCount], empty[L::kCount];
  SWAPMOE_STAMPS_DECLARE(stamps);
  SWAPMOE_STAMP(stamps, 0);
  init_barriers<L::kCount>(full, empty, x_map, w1_map);  // made visible by mark_active's barriers
  pdl_wait();
  SWAPMOE_STAMP(stamps, 1);
  pdl_launch_dependents();
  mark_active(r, topk_ids, ids_is_i64, ids_row_stride, expert_map, topk_weights, topk_weights_code,
              topk_weights_row_stride, M, topk, global_E, local_E);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int e = pick_expert(r, local_E, warp, lane);
  SWAPMOE_STAMP(stamps, 2);
  if (e < 0) {  // fewer active experts than grid rows: the whole cluster leaves
    SWAPMOE_STAMP_RECORD(stamps, 1, -1, 0);
    return;
  }
  const int ranks = cluster_nctarank(), rank = cluster_ctarank();
  const int j0 = (blockIdx.x / ranks) * kRows;
  const int ktiles = (K + kBK * kSub - 1) / (kBK * kSub), per = (ktiles + ranks - 1) / ranks;
  const int kt0 = min(ktiles, rank * per), items = min(ktiles, kt0 + per) - kt0;
  unsigned char* stages = aligned_stages(smem_raw);
  const int ring = ring_stages<L>();
  float acc[2][NT / 2];
  if (warp == kProducerWarp) {
    if (lane == 0) {
      RingCursor stage;
      for (int it = 0; it < items; ++it) {
        const int st = stage.slot;
        if (it >= ring) mbar_wait(&empty[st], stage.previous_phase());
        unsigned char* s = stages + st * L::kStageBytes;
        mbar_arrive_expect(&full[st], L::kStageBytes);
#pragma unroll
        for (int j = 0; j < kSub; ++j) {
          const int k0 = ((kt0 + it) * kSub + j) * kBK;
          tma_load_3d(s + L::weight(0, j), w1_map, k0, j0, e, &full[st]);
          tma_load_3d(s + L::weight(1, j), w1_map, k0, N + j0, e, &full[st]);
          tma_load_2d(s + L::tokens(j), x_map, k0, 0, &full[st]);
        }
        stage.advance(ring);
      }
    }
  } else {
    consume<T, NT, 2, kSub>(items, ring, stages, full, empty, acc);
    SWAPMOE_STAMP(stamps, 4);
  }
  if (ranks > 1) cluster_sum<NT, 2>(acc, reinterpret_cast<float*>(stages), warp != kProducerWarp);
  if (rank != 0) {
    SWAPMOE_STAMP(stamps, 5);
    SWAPMOE_STAMP_RECORD(stamps, 1, e, items);
  }
  if (rank != 0 || warp == kProducerWarp) return;

  // Accumulator layout of m64nNk16: n8 block j, register 4j + q holds A row
  // 16 * warp + lane / 4 + 8 * (q >> 1) (an inter column) and B row 8j + 2 * (lane % 4) + (q & 1)
  // (a token).
  T* out = h + (long long)blockIdx.y * M * N;
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = accumulator_token(j, q, lane);
      const int col = j0 + 16 * warp + (lane >> 2) + 8 * (q >> 1);
      if (t >= M || col >= N) continue;
      const float g = acc[0][4 * j + q], u = acc[1][4 * j + q];
      const float gu = weight_on_input ? 0.f : activate(act, g) * u;
      float v = 0.f;
      for (int k = 0; k < topk; ++k) {
        const int s = t * topk + k;
        if (r.slot_expert[s] != e) continue;
        const float w = r.slot_weight[s];
        v += weight_on_input ? activate(act, g * w) * (u * w) : w * gu;
      }
      out[(long long)t * N + col] = from_f32<T>(v);
    }
  }
  SWAPMOE_STAMP(stamps, 5);
  SWAPMOE_STAMP_RECORD(stamps, 1, e, items);
#endif
}

#ifdef SWAPMOE_SM90A
// A GEMM2 consumer thread's accumulators (64 output rows from r0, NT token columns; layout
// as in gemm1_act's epilogue) into out[t, row], for the rows < K and tokens < M it holds.
template <typename T, int NT>
__device__ __forceinline__ void store_gemm2_out(const float (&acc)[NT / 2], T* __restrict__ out,
                                                long long out_row_stride, int r0, int M, int K, int warp,
                                                int lane) {
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = accumulator_token(j, q, lane);
      const int row = r0 + 16 * warp + (lane >> 2) + 8 * (q >> 1);
      if (t < M && row < K) out[(long long)t * out_row_stride + row] = from_f32<T>(acc[4 * j + q]);
    }
  }
}
#endif

template <typename T, int NT, int kSub>
__device__ __forceinline__ void gemm2_sum(const TensorMap* h_map, const TensorMap* w2_map,
                                          const void* __restrict__ topk_ids, int ids_is_i64,
                                          long long ids_row_stride, const int* __restrict__ expert_map, int M,
                                          int topk, int global_E, int local_E, int N, int K, T* __restrict__ out,
                                          long long out_row_stride) {
#ifdef SWAPMOE_SM90A
  using L = Stages<NT, 1, kSub>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ Routing r;
  __shared__ __align__(8) uint64_t full[L::kCount], empty[L::kCount];
  // topk_ids were complete before GEMM1 passed its griddepcontrol.wait, which it did before
  // letting this grid launch; so they are read before this grid's wait.
  SWAPMOE_STAMPS_DECLARE(stamps);
  SWAPMOE_STAMP(stamps, 0);
  pdl_launch_dependents();
  init_barriers<L::kCount>(full, empty, h_map, w2_map);  // made visible by mark_active's barriers
  mark_active(r, topk_ids, ids_is_i64, ids_row_stride, expert_map, nullptr, 0, 0, M, topk, global_E, local_E);
  const int words = (local_E + 31) / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  count_active(r, words, warp, lane);
  SWAPMOE_STAMP(stamps, 1);
  const int ranks = cluster_nctarank(), rank = cluster_ctarank();
  const int r0 = (blockIdx.x / ranks) * kRows;
  const int A = r.active, per = (A + ranks - 1) / ranks;
  const int a0 = min(A, rank * per), a1 = min(A, a0 + per);
  const int ktiles = (N + kBK * kSub - 1) / (kBK * kSub), items = (a1 - a0) * ktiles;
  unsigned char* stages = aligned_stages(smem_raw);
  float acc[1][NT / 2];
  if (warp == kProducerWarp) {
    int count, first;
    count_and_pick(r.bits, words, a0, count, first);
    if (lane == 0) {
      // The first stages' weights, before waiting for GEMM1.
      const int pre = min(items, L::kCount);
      int e = first, kt = 0;
      for (int it = 0; it < pre; ++it) {
        mbar_arrive_expect(&full[it], L::kStageBytes);
#pragma unroll
        for (int j = 0; j < kSub; ++j)
          tma_load_3d(stages + it * L::kStageBytes + L::weight(0, j), w2_map, (kt * kSub + j) * kBK, r0, e,
                      &full[it]);
        if (++kt == ktiles) {
          kt = 0;
          e = next_active(r.bits, words, e);
        }
      }
      pdl_wait();
      e = first;
      kt = 0;
      int a = a0;
      for (int it = 0; it < items; ++it) {
        const int st = it % L::kCount;
        unsigned char* s = stages + st * L::kStageBytes;
        if (it >= pre) {
          mbar_wait(&empty[st], ((it / L::kCount) - 1) & 1);
          mbar_arrive_expect(&full[st], L::kStageBytes);
#pragma unroll
          for (int j = 0; j < kSub; ++j)
            tma_load_3d(s + L::weight(0, j), w2_map, (kt * kSub + j) * kBK, r0, e, &full[st]);
        }
#pragma unroll
        for (int j = 0; j < kSub; ++j) tma_load_3d(s + L::tokens(j), h_map, (kt * kSub + j) * kBK, 0, a, &full[st]);
        if (++kt == ktiles) {
          kt = 0;
          ++a;
          e = next_active(r.bits, words, e);
        }
      }
    }
  } else {
    pdl_wait();  // before this grid writes out
    SWAPMOE_STAMP(stamps, 2);
    consume<T, NT, 1, kSub>(items, L::kCount, stages, full, empty, acc);
    SWAPMOE_STAMP(stamps, 4);
  }
  if (ranks > 1) cluster_sum<NT, 1>(acc, reinterpret_cast<float*>(stages), warp != kProducerWarp);
  if (rank != 0) {
    SWAPMOE_STAMP(stamps, 5);
    SWAPMOE_STAMP_RECORD(stamps, 2, a0, items);
  }
  if (rank != 0 || warp == kProducerWarp) return;
  store_gemm2_out<T, NT>(acc[0], out, out_row_stride, r0, M, K, warp, lane);
  SWAPMOE_STAMP(stamps, 5);
  SWAPMOE_STAMP_RECORD(stamps, 2, a0, items);
#endif
}


// ---------------------------------------------------------------------------------------
// FP8 (e4m3) W8A8: the same swap-AB layout with wgmma m64nNTk32 e4m3 (QGMMA), after
// swapmoe_fp8_quant_x has written x_q and its scales and zeroed the intermediate's absmax.
// Quantization follows cuda/common/fp8_moe.cuh (the CPU path's rules):
//
//   swap_moe_fp8_gemm1   inter[s, j] = act(g) * u for every slot s of token t on expert e,
//                        g = (x_q[t] . w1[e, j]) dequantized, u likewise with row N + j; the
//                        absmax of inter folded into inter_amax (per tensor, slot or group)
//   swap_moe_fp8_gemm2   out[t, r] = sum over the active experts a, in order, of
//                        w(t, e_a) * (q(inter[s(t, e_a)]) . w2[e_a, r]) dequantized
//
// A stage is one 128-byte row of K per weight row (128 e4m3). Each stage's wgmmas go into
// fresh accumulators that are then scaled and added to the running sums ("promotion"): per
// 128 of K for 128x128 block scales, and so that no long K runs in the tensor core's
// reduced-precision FP8 accumulation for the other schemes.
// GEMM1's token rows are x_q by TMA. GEMM2's token rows are the intermediate quantized as
// it is loaded: a producer warpgroup reads each stage's f32 rows, quantizes them with the
// scale GEMM1's absmax gives, and writes them in the 128-byte swizzle wgmma reads; the
// column's dequantizing factor (scale x router weight) rides in the stage.
// ---------------------------------------------------------------------------------------
constexpr int kFp8BK = 128;              // e4m3 of K per stage row: one 128-byte swizzle row
constexpr int kFp8Gemm2Threads = 256;    // `SWAP_FP8_GEMM2_THREADS`: consumers + a producer warpgroup
constexpr int kFp8ProducerThreads = 128;

// A stage: kBoxes boxes of 64 weight rows x 128 e4m3, the NT token rows x 128 e4m3, and with
// kColScale NT floats (1 KiB, keeping stages 1024-byte aligned) (`swap_fp8_smem_bytes`).
template <int NT, int kBoxes, bool kColScale>
struct Fp8Stages {
  static constexpr int kBoxBytes = kRows * kFp8BK;
  static constexpr int kTokenBytes = NT * kFp8BK;
  static constexpr int kWeightBytes = kBoxes * kBoxBytes;
  static constexpr int kStageBytes = kWeightBytes + kTokenBytes + (kColScale ? 1024 : 0);
  static constexpr int kTwoPerSm = 102 * 1024 / kStageBytes;
  static constexpr int kCount = kTwoPerSm >= 3 ? kTwoPerSm : 200 * 1024 / kStageBytes;
  static constexpr int kSmemBytes = kCount * kStageBytes + 1024;
  static_assert(kStageBytes % 1024 == 0, "stages keep the 1024-byte swizzle alignment");
  static_assert(kSmemBytes + 6 * 1024 <= 227 * 1024, "stages and routing fit an SM");
  __host__ __device__ static constexpr int weight(int b) { return b * kBoxBytes; }
  __host__ __device__ static constexpr int tokens() { return kWeightBytes; }
  __host__ __device__ static constexpr int colscale() { return kWeightBytes + kTokenBytes; }
};

#ifdef SWAPMOE_SM90A
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, 128;" ::: "memory"); }

// The FP8 consumer warpgroup: `items` stages; each stage's wgmmas (kFp8BK / 32 per weight
// box) go into tmp, which is added to acc as acc += tmp * row(b, h) * col(c) with the
// factors `scales(it, stage, row, col)` gives for the stage (h: the thread's two rows per
// box; c = 2 j + (q & 1): its NT / 4 token columns). Every thread releases each stage once
// it has read it (the empty barriers count kConsumerThreads arrivals). The stages form a ring of
// `ring` (at most L::kCount: the launcher may give fewer, `ring_stages`).
template <typename L, int NT, int kBoxes, typename Scales>
__device__ __forceinline__ void consume_fp8(int items, int ring, unsigned char* stages, uint64_t* full,
                                            uint64_t* empty, float (&acc)[kBoxes][NT / 2], Scales scales) {
  constexpr int kStageBytes = L::kStageBytes, kTokens = L::tokens();
#pragma unroll
  for (int b = 0; b < kBoxes; ++b)
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[b][i] = 0.f;
  RingCursor ring_at;
  for (int it = 0; it < items; ++it) {
    const int st = ring_at.slot;
    unsigned char* stage = stages + st * kStageBytes;
    mbar_wait(&full[st], ring_at.phase());
    SWAPMOE_STAMP_FULL(it, full, ring);
#ifdef SWAPMOE_PROBE_NO_MMA
    // Probe build: the stage is released unread (the memory pipeline alone).
    mbar_arrive(&empty[st]);
    ring_at.advance(ring);
    continue;
#endif
    const uint32_t base = smem_u32(stage);
    float tmp[kBoxes][NT / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kFp8BK / 32; ++kk)
#pragma unroll
      for (int b = 0; b < kBoxes; ++b)
        wgmma::Mma<NT, __nv_fp8_e4m3>::run(tmp[b], wgmma_desc_sw128(base + b * kRows * kFp8BK + kk * 32),
                                           wgmma_desc_sw128(base + kTokens + kk * 32), kk > 0);
    wgmma_commit();
    float row[kBoxes][2], col[NT / 4];
    scales(it, stage, row, col);  // under the wgmmas
    wgmma_wait<0>();
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) {
      fence_accumulators(tmp[b]);
#pragma unroll
      for (int i = 0; i < NT / 2; ++i) {
        const int j = i >> 2, q = i & 3;
        acc[b][i] = fmaf(tmp[b][i], row[b][q >> 1] * col[2 * j + (q & 1)], acc[b][i]);
      }
    }
    mbar_arrive(&empty[st]);
    ring_at.advance(ring);
  }
}
#endif

// FP8 GEMM1: as gemm1_act, with e4m3 weights and x_q; writes the f32 intermediate per slot
// (the layout of the other FP8 paths) and its absmax.
template <int SCHEME, int NT, bool kQ8Out = false>
__device__ __forceinline__ void fp8_gemm1(const TensorMap* xq_map, const TensorMap* w1_map,
                                          const float* __restrict__ x_scale, int groups_k,
                                          const float* __restrict__ w1s, long long w1s_e, long long w1s_r,
                                          long long w1s_c, const void* __restrict__ topk_weights,
                                          int topk_weights_code, long long topk_weights_row_stride,
                                          const void* __restrict__ topk_ids, int ids_is_i64,
                                          long long ids_row_stride, const int* __restrict__ expert_map, int M,
                                          int topk, int global_E, int local_E, int N, int K, int act,
                                          int weight_on_input, float* __restrict__ inter,
                                          float* __restrict__ inter_amax, int groups_n,
                                          const float* __restrict__ a2_static = nullptr,
                                          unsigned char* __restrict__ inter_q = nullptr) {
#ifdef SWAPMOE_SM90A
  static_assert(!kQ8Out || SCHEME == kQTensor, "e4m3 intermediate rows need a static per-tensor scale");
  using L = Fp8Stages<NT, 2, false>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ Routing r;
  __shared__ __align__(8) uint64_t full[L::kCount], empty[L::kCount];
  __shared__ unsigned token_amax[NT];
  SWAPMOE_STAMPS_DECLARE(stamps);
  SWAPMOE_STAMP(stamps, 0);
  init_barriers<L::kCount>(full, empty, xq_map, w1_map, kConsumerThreads);  // visible after mark_active
  for (int t = threadIdx.x; t < NT; t += kThreads) token_amax[t] = 0u;
  // The routing is read before griddepcontrol.wait, so that it runs under quantize-x (-2 µs
  // at M = 1-8; benches/NOTES.md "FP8 swap v4"): this grid launches (PDL) only once
  // quantize-x has passed its own wait, so whatever wrote topk_ids (the caller's work, the
  // router kernel) is complete. x_q, its scales and the zeroed absmax come from quantize-x;
  // the first stages' weights stream before the wait ("FP8 swap v5").
  mark_active(r, topk_ids, ids_is_i64, ids_row_stride, expert_map, topk_weights, topk_weights_code,
              topk_weights_row_stride, M, topk, global_E, local_E);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int e = pick_expert(r, local_E, warp, lane);
  SWAPMOE_STAMP(stamps, 1);
  if (e < 0) {  // fewer active experts than grid rows: the whole cluster leaves
    SWAPMOE_STAMP_RECORD(stamps, 3, -1, 0);
    return;
  }
  const int ranks = cluster_nctarank(), rank = cluster_ctarank();
  const int j0 = (blockIdx.x / ranks) * kRows;
  const int ktiles = (K + kFp8BK - 1) / kFp8BK, per = (ktiles + ranks - 1) / ranks;
  const int kt0 = min(ktiles, rank * per), items = min(ktiles, kt0 + per) - kt0;
  unsigned char* stages = aligned_stages(smem_raw);
  // The launcher may give a smaller ring than L::kCount (`Plan::swap_gemm1_ring`), so that
  // more CTAs share an SM.
  const int ring = ring_stages<L>();
  float acc[2][NT / 2];
  // The thread's accumulator rows (per box, h = 0/1) and token columns (c = 2j + parity).
  const int row_in = 16 * warp + (lane >> 2);
  // The epilogue's per-tensor and per-channel scales, loaded by the consumers before their
  // main loop so that no rank-0 CTA pays a round trip for them after the cluster sum (whose
  // barriers no load crosses): the token columns' x scales, the rows' weight scales (gate,
  // up; one per expert per tensor), the static intermediate scale.
  float ep_xs[NT / 4], ep_wg[2], ep_wu[2], ep_a2 = 1.f;
  if (warp == kProducerWarp) {
    // The weights of the ring's first stages before waiting for quantize-x (the weights are
    // the caller's, not an earlier kernel's output); their x_q rows after.
    const int pre = min(items, ring);
    // Stage st's full barrier expects the whole stage; this issues its gate and up rows of
    // k-tile it (its x_q rows follow in the main loop).
    auto issue_weights = [&](int it, int st) {
      unsigned char* s = stages + st * L::kStageBytes;
      const int k0 = (kt0 + it) * kFp8BK;
      mbar_arrive_expect(&full[st], L::kStageBytes);
      tma_load_3d(s + L::weight(0), w1_map, k0, j0, e, &full[st]);
      tma_load_3d(s + L::weight(1), w1_map, k0, N + j0, e, &full[st]);
    };
    if (lane == 0) {
      for (int it = 0; it < pre; ++it) issue_weights(it, it);
    }
    pdl_wait();
    pdl_launch_dependents();  // after the wait: GEMM2 reads topk_ids before its own
    if (lane == 0) {
      RingCursor stage;
      for (int it = 0; it < items; ++it) {
        const int st = stage.slot;
        if (it >= pre) {
          mbar_wait(&empty[st], stage.previous_phase());
          issue_weights(it, st);
        }
        tma_load_2d(stages + st * L::kStageBytes + L::tokens(), xq_map, (kt0 + it) * kFp8BK, 0, &full[st]);
        stage.advance(ring);
      }
    }
  } else {
    pdl_wait();  // x_q's scales, the zeroed absmax; before this grid writes out
    pdl_launch_dependents();
    SWAPMOE_STAMP(stamps, 2);
    if constexpr (SCHEME != kQBlock) {
#pragma unroll
      for (int c = 0; c < NT / 4; ++c) {
        const int t = accumulator_token(c >> 1, c, lane);
        ep_xs[c] = t < M ? x_scale[(long long)t * groups_k] : 0.f;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = min(j0 + row_in + 8 * h, N - 1);
        ep_wg[h] = w1s[scale_off(e, SCHEME == kQChannel ? col : 0, 0, w1s_e, w1s_r, 0)];
        ep_wu[h] = w1s[scale_off(e, SCHEME == kQChannel ? N + col : 0, 0, w1s_e, w1s_r, 0)];
      }
      if constexpr (kQ8Out) ep_a2 = *a2_static;
    }
    // 128x128 blocks: the weight block scale of each row, the token's group scale, per stage.
    const int last_row = 2 * N - 1;
    auto scales = [&](int it, const unsigned char*, float (&row)[2][2], float (&col)[NT / 4]) {
      if constexpr (SCHEME == kQBlock) {
        const int kb = kt0 + it;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int g = min(j0 + row_in + 8 * h, last_row) / kFp8Block;
          const int u = min(N + j0 + row_in + 8 * h, last_row) / kFp8Block;
          row[0][h] = w1s[scale_off(e, g, kb, w1s_e, w1s_r, w1s_c)];
          row[1][h] = w1s[scale_off(e, u, kb, w1s_e, w1s_r, w1s_c)];
        }
#pragma unroll
        for (int c = 0; c < NT / 4; ++c) {
          const int t = accumulator_token(c >> 1, c, lane);
          col[c] = t < M ? x_scale[(long long)t * groups_k + kb] : 0.f;
        }
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) row[0][h] = row[1][h] = 1.f;
#pragma unroll
        for (int c = 0; c < NT / 4; ++c) col[c] = 1.f;
      }
    };
    consume_fp8<L, NT, 2>(items, ring, stages, full, empty, acc, scales);
    SWAPMOE_STAMP(stamps, 4);
  }
  if (ranks > 1) cluster_sum<NT, 2>(acc, reinterpret_cast<float*>(stages), warp != kProducerWarp);
  if (rank != 0) {
    SWAPMOE_STAMP(stamps, 5);
    SWAPMOE_STAMP_RECORD(stamps, 3, e, items);
  }
  if (rank != 0 || warp == kProducerWarp) return;

  // Accumulator layout as in gemm1_act: register 4j + q is inter column j0 + row_in + 8 (q >> 1)
  // and token 8j + 2 (lane % 4) + (q & 1).
  if constexpr (kQ8Out) {
    // The static scale is known: quantize here, one e4m3 row per (active expert, token), the
    // value of the token's first slot on e (GEMM2 multiplies by the summed router weights),
    // 0 for a token that does not route to e. The same arithmetic as the GEMM2 producer of
    // the f32 layout, so the bytes are the same.
    const float sc = ep_a2, inv = __frcp_rn(sc);
    const float w1_scale = ep_wg[0];  // gate and up: one per expert
    unsigned char* q8 = inter_q + (long long)blockIdx.y * M * N;
#pragma unroll
    for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int t = accumulator_token(j, q, lane);
        const int col = j0 + row_in + 8 * (q >> 1);
        if (t >= M || col >= N) continue;
        int first = -1;
        for (int k = 0; k < topk && first < 0; ++k)
          if (r.slot_expert[t * topk + k] == e) first = t * topk + k;
        __nv_fp8_storage_t b = 0;
        if (first >= 0) {
          const float xw = ep_xs[2 * j + (q & 1)] * w1_scale;
          float g = acc[0][4 * j + q] * xw;
          float u = acc[1][4 * j + q] * xw;
          if (weight_on_input) {
            g *= r.slot_weight[first];
            u *= r.slot_weight[first];
          }
          b = fp8_quantize(activate(act, g) * u, sc, inv, true);
        }
        q8[(long long)t * N + col] = b;
      }
    }
  } else {
    float tmax[NT / 4];
#pragma unroll
    for (int c = 0; c < NT / 4; ++c) tmax[c] = 0.f;
#pragma unroll
    for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int t = accumulator_token(j, q, lane);
        const int col = j0 + row_in + 8 * (q >> 1);
        if (t >= M || col >= N) continue;
        float g = acc[0][4 * j + q], u = acc[1][4 * j + q];
        if constexpr (SCHEME != kQBlock) {
          const float xs = ep_xs[2 * j + (q & 1)];
          g *= xs * ep_wg[q >> 1];
          u *= xs * ep_wu[q >> 1];
        }
        for (int k = 0; k < topk; ++k) {
          const int s = t * topk + k;
          if (r.slot_expert[s] != e) continue;
          float gi = g, ui = u;
          if (weight_on_input) {
            gi *= r.slot_weight[s];
            ui *= r.slot_weight[s];
          }
          const float a = activate(act, gi) * ui;
          inter[(long long)s * N + col] = a;
          tmax[2 * j + (q & 1)] = fmaxf(tmax[2 * j + (q & 1)], finite_abs(a));
        }
      }
    }
    // Lanes with equal lane % 4 hold the same tokens: fold them, then one shared atomic each.
#pragma unroll
    for (int c = 0; c < NT / 4; ++c) {
      float m = tmax[c];
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
      const int t = accumulator_token(c >> 1, c, lane);
      if (lane < 4 && t < M && m > 0.f) atomicMax(&token_amax[t], __float_as_uint(m));
    }
    consumer_sync();
    if constexpr (SCHEME == kQTensor) {
      if (warp == 0) {
        unsigned m = 0u;
        for (int t = lane; t < M; t += 32) m = max(m, token_amax[t]);
        m = __reduce_max_sync(0xffffffffu, m);
        if (lane == 0 && m) atomicMax(reinterpret_cast<unsigned*>(inter_amax), m);
      }
    } else {
      const int g = SCHEME == kQBlock ? j0 / kFp8Block : 0;  // 64 columns lie in one 128-group
      for (int t = threadIdx.x; t < M; t += kConsumerThreads) {
        const unsigned m = token_amax[t];
        if (!m) continue;
        for (int k = 0; k < topk; ++k) {
          const int s = t * topk + k;
          if (r.slot_expert[s] == e)
            atomicMax(reinterpret_cast<unsigned*>(inter_amax) + (long long)s * groups_n + g, m);
        }
      }
    }
  }
  SWAPMOE_STAMP(stamps, 5);
  SWAPMOE_STAMP_RECORD(stamps, 3, e, items);
#endif
}

#ifdef SWAPMOE_SM90A
// An FP8 GEMM2 CTA's share when its cluster splits the active experts (every thread, after
// mark_active): output rows r0.., the active experts from the a0-th (local expert `first`),
// `items` stages of kFp8BK columns of N (ktiles per expert).
struct Fp8Gemm2Share {
  int ranks, rank, r0, a0, first, ktiles, items;
};

__device__ __forceinline__ Fp8Gemm2Share fp8_gemm2_share(Routing& r, int words, int N) {
  count_active(r, words, threadIdx.x >> 5, threadIdx.x & 31);
  Fp8Gemm2Share w;
  w.ranks = cluster_nctarank();
  w.rank = cluster_ctarank();
  w.r0 = (blockIdx.x / w.ranks) * kRows;
  const int A = r.active, per = (A + w.ranks - 1) / w.ranks;
  w.a0 = min(A, w.rank * per);
  w.ktiles = (N + kFp8BK - 1) / kFp8BK;
  w.items = (min(A, w.a0 + per) - w.a0) * w.ktiles;
  int count;
  count_and_pick(r.bits, words, w.a0, count, w.first);
  return w;
}

// A GEMM2 producer thread's token rows of one stage: warp pw of the producer warpgroup takes
// rows pw, pw + 4, ... (NT / 4 of them), lane l the stage's columns 4l .. 4l + 3.
template <int NT>
struct Fp8Rows {
  static constexpr int R = NT / 4;
  int slot[R];     // the first slot of token t on the expert, or -1
  float wsum[R];   // the router weights of t's slots on the expert (1 with the weight on the input)
  float scale[R];  // the intermediate's scale of the slot (per tensor or per token)
  float amax[R];   // 128x128 blocks: the slot's group absmax of the stage
  float4 v[R];     // the four f32 values

  // Which slot feeds each row for expert e, and (per tensor / per token) its scale.
  template <int SCHEME>
  __device__ __forceinline__ void source(const Routing& r, int e, int M, int topk, int weight_on_input,
                                         const float* __restrict__ inter_amax, const float* __restrict__ a2_static,
                                         int groups_n, int pw) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int t = pw + 4 * i;
      slot[i] = -1;
      wsum[i] = 0.f;
      if (t < M) {
        for (int k = 0; k < topk; ++k) {
          const int sl = t * topk + k;
          if (r.slot_expert[sl] != e) continue;
          if (slot[i] < 0) slot[i] = sl;  // a repeated expert's slots hold the same row
          wsum[i] += weight_on_input ? 1.f : r.slot_weight[sl];
        }
      }
      if constexpr (SCHEME != kQBlock)
        scale[i] = slot[i] >= 0 ? inter_scale<SCHEME>(inter_amax, a2_static, slot[i], 0, groups_n) : 0.f;
    }
  }

  // Issues the loads of stage kt (independent of each other).
  template <int SCHEME>
  __device__ __forceinline__ void fetch(const float* __restrict__ inter, const float* __restrict__ inter_amax,
                                        int groups_n, int N, int kt, int lane) {
    const int c0 = kt * kFp8BK + 4 * lane;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (slot[i] >= 0 && c0 < N) v[i] = __ldg(reinterpret_cast<const float4*>(inter + (long long)slot[i] * N + c0));
      if constexpr (SCHEME == kQBlock) amax[i] = slot[i] >= 0 ? __ldg(inter_amax + (long long)slot[i] * groups_n + kt) : 0.f;
    }
  }

  // Quantizes the rows into the stage's 128-byte-swizzled token tile (16-byte chunk c of row
  // t at chunk c ^ (t % 8)) and writes each row's dequantizing factor (scale x weight).
  template <int SCHEME>
  __device__ __forceinline__ void store(unsigned char* tile, float* colscale, int N, int kt, int lane, int pw) const {
    const bool per_tensor = SCHEME == kQTensor;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int t = pw + 4 * i;
      unsigned packed = 0u;
      float sc = 0.f;
      if (slot[i] >= 0) {
        sc = SCHEME == kQBlock ? fp8_group_scale(amax[i]) : scale[i];
        const float inv = per_tensor ? __frcp_rn(sc) : 0.f;
        if (kt * kFp8BK + 4 * lane < N)
          packed = (unsigned)fp8_quantize(v[i].x, sc, inv, per_tensor) |
                   ((unsigned)fp8_quantize(v[i].y, sc, inv, per_tensor) << 8) |
                   ((unsigned)fp8_quantize(v[i].z, sc, inv, per_tensor) << 16) |
                   ((unsigned)fp8_quantize(v[i].w, sc, inv, per_tensor) << 24);
      }
      const int chunk = lane >> 2;
      *reinterpret_cast<unsigned*>(tile + t * kFp8BK + ((chunk ^ (t & 7)) << 4) + 4 * (lane & 3)) = packed;
      if (lane == 0) colscale[t] = sc * wsum[i];
    }
  }
};
#endif

// FP8 GEMM2: as gemm2_sum; threads 0-127 consume, 128-255 produce (thread 128 issues the
// weight copies, all 128 quantize the token rows).
template <typename T, int SCHEME, int NT>
__device__ __forceinline__ void fp8_gemm2(const TensorMap* w2_map, const float* __restrict__ inter,
                                          const float* __restrict__ inter_amax, const float* __restrict__ a2_static,
                                          int groups_n, const float* __restrict__ w2s, long long w2s_e,
                                          long long w2s_r, long long w2s_c, const void* __restrict__ topk_weights,
                                          int topk_weights_code, long long topk_weights_row_stride,
                                          const void* __restrict__ topk_ids, int ids_is_i64,
                                          long long ids_row_stride, const int* __restrict__ expert_map, int M,
                                          int topk, int global_E, int local_E, int N, int K, int weight_on_input,
                                          T* __restrict__ out, long long out_row_stride) {
#ifdef SWAPMOE_SM90A
  using L = Fp8Stages<NT, 1, true>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ Routing r;
  __shared__ __align__(8) uint64_t full[L::kCount], empty[L::kCount];
  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    // full: the weight copy's expected bytes (thread 128) + every producer thread's rows
    for (int i = 0; i < L::kCount; ++i) {
      mbar_init(&full[i], 1 + kFp8ProducerThreads);
      mbar_init(&empty[i], kConsumerThreads);
    }
    mbar_init(&cluster_sum_bar, 1);
    mbar_init_fence();
    tma_prefetch_map(w2_map);
  }
  // The router weights are read unless GEMM1 applied them to the input.
  mark_active<kFp8Gemm2Threads>(r, topk_ids, ids_is_i64, ids_row_stride, expert_map,
                                weight_on_input ? nullptr : topk_weights, topk_weights_code,
                                topk_weights_row_stride, M, topk, global_E, local_E);
  const int words = (local_E + 31) / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const Fp8Gemm2Share w = fp8_gemm2_share(r, words, N);
  unsigned char* stages = aligned_stages(smem_raw);
  const int ring = ring_stages<L>();  // `Plan::swap_gemm2_ring`: CTAs that fit beside GEMM1's
  float acc[1][NT / 2];
  if (threadIdx.x >= kConsumerThreads) {
    const int pt = threadIdx.x - kConsumerThreads, pw = pt >> 5;
    const int pre = min(w.items, ring);
    if (pt == 0) {
      // The first stages' weights, before waiting for GEMM1.
      int e = w.first, kt = 0;
      for (int it = 0; it < pre; ++it) {
        mbar_arrive_expect(&full[it], L::kWeightBytes);
        tma_load_3d(stages + it * L::kStageBytes + L::weight(0), w2_map, kt * kFp8BK, w.r0, e, &full[it]);
        if (++kt == w.ktiles) {
          kt = 0;
          e = next_active(r.bits, words, e);
        }
      }
    }
    pdl_wait();  // GEMM1's intermediate and absmax are complete
    // Each stage's rows are fetched one stage ahead, so their L2 latency overlaps the stores
    // of the stage before (and the wait for a free stage).
    Fp8Rows<NT> cur, next;
    int e = w.first, kt = 0;
    if (w.items > 0) {
      cur.template source<SCHEME>(r, e, M, topk, weight_on_input, inter_amax, a2_static, groups_n, pw);
      cur.template fetch<SCHEME>(inter, inter_amax, groups_n, N, kt, lane);
    }
    RingCursor stage;
    for (int it = 0; it < w.items; ++it) {
      const int st = stage.slot;
      unsigned char* s = stages + st * L::kStageBytes;
      int e_next = e, kt_next = kt + 1;
      if (kt_next == w.ktiles) {
        kt_next = 0;
        e_next = next_active(r.bits, words, e);
      }
      if (it + 1 < w.items) {
        next = cur;
        if (e_next != e)
          next.template source<SCHEME>(r, e_next, M, topk, weight_on_input, inter_amax, a2_static, groups_n, pw);
        next.template fetch<SCHEME>(inter, inter_amax, groups_n, N, kt_next, lane);
      }
      if (stage.round > 0) mbar_wait(&empty[st], stage.previous_phase());
      if (pt == 0 && it >= pre) {
        mbar_arrive_expect(&full[st], L::kWeightBytes);
        tma_load_3d(s + L::weight(0), w2_map, kt * kFp8BK, w.r0, e, &full[st]);
      }
      cur.template store<SCHEME>(s + L::tokens(), reinterpret_cast<float*>(s + L::colscale()), N, kt, lane, pw);
      fence_proxy_async_shared();  // the rows, seen by the wgmmas
      mbar_arrive(&full[st]);
      cur = next;
      e = e_next;
      kt = kt_next;
      stage.advance(ring);
    }
  } else {
    pdl_wait();  // before this grid writes out
    const int row_in = 16 * warp + (lane >> 2);
    int e = w.first, kt = 0;
    auto scales = [&](int, const unsigned char* stage, float (&row)[1][2], float (&col)[NT / 4]) {
      const float* cs = reinterpret_cast<const float*>(stage + L::colscale());
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = min(w.r0 + row_in + 8 * h, K - 1);
        if constexpr (SCHEME == kQTensor) row[0][h] = w2s[scale_off(e, 0, 0, w2s_e, 0, 0)];
        else if constexpr (SCHEME == kQChannel) row[0][h] = w2s[scale_off(e, rr, 0, w2s_e, w2s_r, 0)];
        else row[0][h] = w2s[scale_off(e, rr / kFp8Block, kt, w2s_e, w2s_r, w2s_c)];
      }
#pragma unroll
      for (int c = 0; c < NT / 4; ++c) col[c] = cs[accumulator_token(c >> 1, c, lane)];
      if (++kt == w.ktiles) {
        kt = 0;
        e = next_active(r.bits, words, e);
      }
    };
    consume_fp8<L, NT, 1>(w.items, ring, stages, full, empty, acc, scales);
  }
  if (w.ranks > 1) cluster_sum<NT, 1>(acc, reinterpret_cast<float*>(stages), threadIdx.x < kConsumerThreads);
  if (w.rank != 0 || threadIdx.x >= kConsumerThreads) return;
  store_gemm2_out<T, NT>(acc[0], out, out_row_stride, w.r0, M, K, warp, lane);
#endif
}

// FP8 GEMM2 on the e4m3 intermediate rows that GEMM1 quantized with the static scale
// (fp8_gemm1<kQTensor, NT, true>): the bf16 GEMM2's layout, with both the w2 box and the
// NT token rows of h_q[a] brought by TMA (warp 4, one thread), no producer warpgroup. The
// column factor a2 x (t's router weights on e) and w2's scale for e are set once per expert.
template <typename T, int NT>
__device__ __forceinline__ void fp8_gemm2_q8(const TensorMap* hq_map, const TensorMap* w2_map,
                                             const float* __restrict__ a2_static, const float* __restrict__ w2s,
                                             long long w2s_e, const void* __restrict__ topk_weights,
                                             int topk_weights_code, long long topk_weights_row_stride,
                                             const void* __restrict__ topk_ids, int ids_is_i64,
                                             long long ids_row_stride, const int* __restrict__ expert_map, int M,
                                             int topk, int global_E, int local_E, int N, int K, int weight_on_input,
                                             T* __restrict__ out, long long out_row_stride) {
#ifdef SWAPMOE_SM90A
  using L = Fp8Stages<NT, 1, false>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ Routing r;
  __shared__ __align__(8) uint64_t full[L::kCount], empty[L::kCount];
  // topk_ids were complete before GEMM1 passed its griddepcontrol.wait, which it did before
  // letting this grid launch; so they are read before this grid's wait.
  SWAPMOE_STAMPS_DECLARE(stamps);
  SWAPMOE_STAMP(stamps, 0);
  pdl_launch_dependents();
  init_barriers<L::kCount>(full, empty, hq_map, w2_map, kConsumerThreads);  // visible after mark_active
  // The router weights are read unless GEMM1 applied them to the input.
  mark_active(r, topk_ids, ids_is_i64, ids_row_stride, expert_map, weight_on_input ? nullptr : topk_weights,
              topk_weights_code, topk_weights_row_stride, M, topk, global_E, local_E);
  const int words = (local_E + 31) / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const Fp8Gemm2Share w = fp8_gemm2_share(r, words, N);
  SWAPMOE_STAMP(stamps, 1);
  unsigned char* stages = aligned_stages(smem_raw);
  const int ring = ring_stages<L>();  // `Plan::swap_gemm2_ring`: CTAs that fit beside GEMM1's
  float acc[1][NT / 2];
  if (warp == kProducerWarp) {
    if (lane == 0) {
      // The first stages' weights, before waiting for GEMM1.
      const int pre = min(w.items, ring);
      int e = w.first, kt = 0;
      for (int it = 0; it < pre; ++it) {
        mbar_arrive_expect(&full[it], L::kStageBytes);
        tma_load_3d(stages + it * L::kStageBytes + L::weight(0), w2_map, kt * kFp8BK, w.r0, e, &full[it]);
        if (++kt == w.ktiles) {
          kt = 0;
          e = next_active(r.bits, words, e);
        }
      }
      pdl_wait();  // GEMM1's rows are complete
      e = w.first;
      kt = 0;
      int a = w.a0;
      RingCursor stage;
      for (int it = 0; it < w.items; ++it) {
        const int st = stage.slot;
        unsigned char* s = stages + st * L::kStageBytes;
        if (it >= pre) {
          mbar_wait(&empty[st], stage.previous_phase());
          mbar_arrive_expect(&full[st], L::kStageBytes);
          tma_load_3d(s + L::weight(0), w2_map, kt * kFp8BK, w.r0, e, &full[st]);
        }
        tma_load_3d(s + L::tokens(), hq_map, kt * kFp8BK, 0, a, &full[st]);
        if (++kt == w.ktiles) {
          kt = 0;
          ++a;
          e = next_active(r.bits, words, e);
        }
        stage.advance(ring);
      }
    }
  } else {
    pdl_wait();  // before this grid writes out
    SWAPMOE_STAMP(stamps, 2);
    const float a2 = *a2_static;
    int e = w.first, kt = 0;
    float w2_scale = 0.f, colf[NT / 4];
    auto scales = [&](int, const unsigned char*, float (&row)[1][2], float (&col)[NT / 4]) {
      if (kt == 0) {
        w2_scale = w2s[scale_off(e, 0, 0, w2s_e, 0, 0)];
#pragma unroll
        for (int c = 0; c < NT / 4; ++c) {
          const int t = accumulator_token(c >> 1, c, lane);
          float wsum = 0.f;
          if (t < M)
            for (int k = 0; k < topk; ++k) {
              const int sl = t * topk + k;
              if (r.slot_expert[sl] == e) wsum += weight_on_input ? 1.f : r.slot_weight[sl];
            }
          colf[c] = a2 * wsum;
        }
      }
      row[0][0] = row[0][1] = w2_scale;
#pragma unroll
      for (int c = 0; c < NT / 4; ++c) col[c] = colf[c];
      if (++kt == w.ktiles) {
        kt = 0;
        e = next_active(r.bits, words, e);
      }
    };
    consume_fp8<L, NT, 1>(w.items, ring, stages, full, empty, acc, scales);
    SWAPMOE_STAMP(stamps, 4);
  }
  if (w.ranks > 1) cluster_sum<NT, 1>(acc, reinterpret_cast<float*>(stages), warp != kProducerWarp);
  if (w.rank != 0) {
    SWAPMOE_STAMP(stamps, 5);
    SWAPMOE_STAMP_RECORD(stamps, 4, w.a0, w.items);
  }
  if (w.rank != 0 || warp == kProducerWarp) return;
  store_gemm2_out<T, NT>(acc[0], out, out_row_stride, w.r0, M, K, warp, lane);
  SWAPMOE_STAMP(stamps, 5);
  SWAPMOE_STAMP_RECORD(stamps, 4, w.a0, w.items);
#endif
}

}  // namespace
}  // namespace swapmoe

#define SWAPMOE_SWAP_INSTANTIATE(SUFFIX, T, NT, SUB)                                                              \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1)                                              \
      swap_moe_gemm1_act_##SUFFIX##_n##NT##_s##SUB(                                                               \
          const __grid_constant__ swapmoe::TensorMap x_map, const __grid_constant__ swapmoe::TensorMap w1_map,    \
          const void* topk_weights, int topk_weights_code, long long topk_weights_row_stride,                     \
          const void* topk_ids, int ids_is_i64, long long ids_row_stride, const int* expert_map, int M, int topk, \
          int global_E, int local_E, int N, int K, int act, int weight_on_input, T* h) {                          \
    swapmoe::gemm1_act<T, NT, SUB>(&x_map, &w1_map, topk_weights, topk_weights_code, topk_weights_row_stride,     \
                                   topk_ids, ids_is_i64, ids_row_stride, expert_map, M, topk, global_E, local_E, \
                                   N, K, act, weight_on_input, h);                                                \
  }                                                                                                               \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1)                                              \
      swap_moe_gemm2_sum_##SUFFIX##_n##NT##_s##SUB(                                                               \
          const __grid_constant__ swapmoe::TensorMap h_map, const __grid_constant__ swapmoe::TensorMap w2_map,    \
          const void* topk_ids, int ids_is_i64, long long ids_row_stride, const int* expert_map, int M, int topk, \
          int global_E, int local_E, int N, int K, T* out, long long out_row_stride) {                            \
    swapmoe::gemm2_sum<T, NT, SUB>(&h_map, &w2_map, topk_ids, ids_is_i64, ids_row_stride, expert_map, M, topk,    \
                                   global_E, local_E, N, K, out, out_row_stride);                                 \
  }
#define SWAPMOE_SWAP_TILES(SUFFIX, T, SUB)          \
  SWAPMOE_SWAP_INSTANTIATE(SUFFIX, T, 8, SUB)       \
  SWAPMOE_SWAP_INSTANTIATE(SUFFIX, T, 16, SUB)      \
  SWAPMOE_SWAP_INSTANTIATE(SUFFIX, T, 32, SUB)      \
  SWAPMOE_SWAP_INSTANTIATE(SUFFIX, T, 64, SUB)

SWAPMOE_SWAP_TILES(bf16, __nv_bfloat16, 1)
SWAPMOE_SWAP_TILES(bf16, __nv_bfloat16, 4)
SWAPMOE_SWAP_TILES(f16, __half, 1)
SWAPMOE_SWAP_TILES(f16, __half, 4)

#define SWAPMOE_SWAP_FP8_GEMM1(SCHEME, NAME, NT)                                                                   \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1) swap_moe_fp8_gemm1_##NAME##_n##NT(            \
      const __grid_constant__ swapmoe::TensorMap xq_map, const __grid_constant__ swapmoe::TensorMap w1_map,        \
      const float* x_scale, int groups_k, const float* w1s, long long w1s_e, long long w1s_r, long long w1s_c,     \
      const void* topk_weights, int topk_weights_code, long long topk_weights_row_stride, const void* topk_ids,     \
      int ids_is_i64, long long ids_row_stride, const int* expert_map, int M, int topk, int global_E, int local_E, \
      int N, int K, int act, int weight_on_input, float* inter, float* inter_amax, int groups_n) {                 \
    swapmoe::fp8_gemm1<SCHEME, NT>(&xq_map, &w1_map, x_scale, groups_k, w1s, w1s_e, w1s_r, w1s_c, topk_weights,   \
                                   topk_weights_code, topk_weights_row_stride, topk_ids, ids_is_i64,              \
                                   ids_row_stride, expert_map, M, topk, global_E, local_E, N, K, act,             \
                                   weight_on_input, inter, inter_amax, groups_n);                                 \
  }
#define SWAPMOE_SWAP_FP8_GEMM2(SUFFIX, T, SCHEME, NAME, NT)                                                         \
  extern "C" __global__ void __launch_bounds__(swapmoe::kFp8Gemm2Threads, 1)                                      \
      swap_moe_fp8_gemm2_sum_##SUFFIX##_##NAME##_n##NT(                                                           \
          const __grid_constant__ swapmoe::TensorMap w2_map, const float* inter, const float* inter_amax,         \
          const float* a2_static, int groups_n, const float* w2s, long long w2s_e, long long w2s_r,               \
          long long w2s_c, const void* topk_weights, int topk_weights_code, long long topk_weights_row_stride,    \
          const void* topk_ids, int ids_is_i64, long long ids_row_stride, const int* expert_map, int M, int topk, \
          int global_E, int local_E, int N, int K, int weight_on_input, T* out, long long out_row_stride) {       \
    swapmoe::fp8_gemm2<T, SCHEME, NT>(&w2_map, inter, inter_amax, a2_static, groups_n, w2s, w2s_e, w2s_r, w2s_c,  \
                                      topk_weights, topk_weights_code, topk_weights_row_stride, topk_ids,         \
                                      ids_is_i64, ids_row_stride, expert_map, M, topk, global_E, local_E, N, K,   \
                                      weight_on_input, out, out_row_stride);                                      \
  }
#define SWAPMOE_SWAP_FP8_SCHEME(SCHEME, NAME, NT)                      \
  SWAPMOE_SWAP_FP8_GEMM1(SCHEME, NAME, NT)                             \
  SWAPMOE_SWAP_FP8_GEMM2(bf16, __nv_bfloat16, SCHEME, NAME, NT)        \
  SWAPMOE_SWAP_FP8_GEMM2(f16, __half, SCHEME, NAME, NT)
#define SWAPMOE_SWAP_FP8_TILES(SCHEME, NAME)   \
  SWAPMOE_SWAP_FP8_SCHEME(SCHEME, NAME, 8)     \
  SWAPMOE_SWAP_FP8_SCHEME(SCHEME, NAME, 16)    \
  SWAPMOE_SWAP_FP8_SCHEME(SCHEME, NAME, 32)    \
  SWAPMOE_SWAP_FP8_SCHEME(SCHEME, NAME, 64)

// The static per-tensor intermediate scale ("q8"): swap_moe_fp8_gemm1_tensor_q8_n* writes e4m3
// intermediate rows, which swap_moe_fp8_gemm2_sum_{bf16,f16}_tensor_q8_n* reads by TMA.
#define SWAPMOE_SWAP_FP8_Q8_GEMM1(NT)                                                                               \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1) swap_moe_fp8_gemm1_tensor_q8_n##NT(          \
      const __grid_constant__ swapmoe::TensorMap xq_map, const __grid_constant__ swapmoe::TensorMap w1_map,       \
      const float* x_scale, int groups_k, const float* w1s, long long w1s_e, long long w1s_r, long long w1s_c,    \
      const void* topk_weights, int topk_weights_code, long long topk_weights_row_stride, const void* topk_ids,    \
      int ids_is_i64, long long ids_row_stride, const int* expert_map, int M, int topk, int global_E,             \
      int local_E, int N, int K, int act, int weight_on_input, const float* a2_static, unsigned char* inter_q) {  \
    swapmoe::fp8_gemm1<swapmoe::kQTensor, NT, true>(                                                              \
        &xq_map, &w1_map, x_scale, groups_k, w1s, w1s_e, w1s_r, w1s_c, topk_weights, topk_weights_code,           \
        topk_weights_row_stride, topk_ids, ids_is_i64, ids_row_stride, expert_map, M, topk, global_E, local_E, N, \
        K, act, weight_on_input, nullptr, nullptr, 0, a2_static, inter_q);                                        \
  }
#define SWAPMOE_SWAP_FP8_Q8_GEMM2(SUFFIX, T, NT)                                                                    \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1)                                              \
      swap_moe_fp8_gemm2_sum_##SUFFIX##_tensor_q8_n##NT(                                                          \
          const __grid_constant__ swapmoe::TensorMap hq_map, const __grid_constant__ swapmoe::TensorMap w2_map,   \
          const float* a2_static, const float* w2s, long long w2s_e, long long w2s_r, long long w2s_c,            \
          const void* topk_weights, int topk_weights_code, long long topk_weights_row_stride, const void* topk_ids,\
          int ids_is_i64, long long ids_row_stride, const int* expert_map, int M, int topk, int global_E, int local_E,\
          int N, int K, int weight_on_input, T* out, long long out_row_stride) {                                  \
    (void)w2s_r;                                                                                                   \
    (void)w2s_c;                                                                                                   \
    swapmoe::fp8_gemm2_q8<T, NT>(&hq_map, &w2_map, a2_static, w2s, w2s_e, topk_weights, topk_weights_code,          \
                                 topk_weights_row_stride, topk_ids, ids_is_i64, ids_row_stride, expert_map, M,     \
                                 topk, global_E, local_E, N, K, weight_on_input, out, out_row_stride);             \
  }
#define SWAPMOE_SWAP_FP8_Q8(NT)                        \
  SWAPMOE_SWAP_FP8_Q8_GEMM1(NT)                        \
  SWAPMOE_SWAP_FP8_Q8_GEMM2(bf16, __nv_bfloat16, NT)   \
  SWAPMOE_SWAP_FP8_Q8_GEMM2(f16, __half, NT)

SWAPMOE_SWAP_FP8_TILES(swapmoe::kQTensor, tensor)
SWAPMOE_SWAP_FP8_Q8(8)
SWAPMOE_SWAP_FP8_Q8(16)
SWAPMOE_SWAP_FP8_Q8(32)
SWAPMOE_SWAP_FP8_Q8(64)
SWAPMOE_SWAP_FP8_TILES(swapmoe::kQChannel, channel)
SWAPMOE_SWAP_FP8_TILES(swapmoe::kQBlock, block)
