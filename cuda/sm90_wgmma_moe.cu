// Hopper (sm_90a) grouped GEMMs for many tokens per expert (prefill): wgmma with the tokens
// in the 64-row A slot, operands streamed into a ring of 128-byte-swizzled shared-memory
// stages by a producer warpgroup, consumed by two consumer warpgroups.
//
//   wgmma_moe_gather       xs[p, :]    = x[sorted_slots[p] / topk, :]   (the _xs GEMM1 only)
//   wgmma_moe_gemm1_act    inter[p, j] = act(x[t] . w1[e, j]) * (x[t] . w1[e, N + j]),
//                          t = sorted_slots[p] / topk (p: sorted position, in expert order)
//   wgmma_moe_gemm2        y[slot, r]  = w(slot) * (inter[p] . w2[e, r]),  slot = sorted_slots[p]
//   wgmma_moe_topk_reduce  out[t, :]   = sum over k, in k order, of y[t * topk + k, :]
// y is kept in the activation dtype (rounded once, as vLLM's per-slot cache), which halves
// the bytes GEMM2 writes and the reduction reads against fp32: at deepseek-v3-tp8 M=4096
// that is 0.94 GB less each way.
//
// The tiles come from swapmoe_route_align with a token tile BM of 64 or 128: a tile holds up
// to BM consecutive sorted positions of one expert. Or, at decode sizes (`Plan::align_in_gemm1`),
// GEMM1 groups the slots itself, each CTA in its own shared memory (gemm1_tiles), and its CTA 0
// writes the grouping in route_align's layout for GEMM2 and the top-k sum.
// A operand: GEMM1 gathers the tile's token rows of x with cp.async (all 128 producer
//   threads; rows past the tile's expert and K tails are zero-filled), so no gathered copy
//   of x is written; or (the _xs variant, which the oracle takes for wide N, where the copy
//   is cheap against the GEMMs and TMA keeps the compute-bound loop fed better) reads xs,
//   gathered before, by TMA. GEMM2 reads the intermediate, already in sorted order, as one
//   box of a 2-D tensor map (rows past the tile are computed and dropped, past the end
//   zero-filled).
// B operand: a 3-D tensor map over the weights [E][rows][K], copied by the TMA unit:
//   GEMM1: 128 gate rows j0.. and the 128 up rows N+j0.. (boxes of 128 or 64 rows, see
//          Tile) -> 128 inter columns;
//   GEMM2: 256 rows r0.. of w2 -> 256 output columns.
// K tails are zero-filled by TMA.
// L2: every load takes the cache policy `Tiles::l2_hints` names (the plan's `wgmma_l2_hints`):
// weights evict-first, token rows evict-last, or evict-normal (a load without a hint).
// GEMM2's epilogue stores y in 16-byte vectors (column pairs transposed among each quad's
// lanes) on tiles of at least BM / 2 rows, in 4-byte pairs on sparser ones (gemm2_store).
//
// CTA: 384 threads. Warpgroup 0 produces kStages stages ahead (GEMM1: all its threads;
// GEMM2: thread 0); warps 4-7 and 8-11 are two consumer warpgroups that run wgmma
// (m64n256k16 at BM = 128, m64n128k16 at BM = 64; fp32 accumulators in registers) and
// release each stage through an mbarrier once its wgmmas have completed.
// Grid: one CTA per (token tile, column block), in groups of `raster_group` token tiles
// that sweep the column blocks together, so that the weight block a group shares is read
// from DRAM once and the group's activations stay in L2.
// Requirements (checked by the oracle and the launcher): bf16/fp16; K and N multiples of 8;
// 16-byte aligned tensors and row strides (TMA). FP8: K and N multiples of 16; with 128x128
// block scales N a multiple of 128.
#include "common/cta_align.cuh"
#include "common/fp8_moe.cuh"
#include "common/moe_common.cuh"
#include "common/sm90.cuh"
#include "common/wgmma_ops.cuh"

#include <cstddef>
#include <type_traits>

namespace swapmoe {
namespace {

constexpr int kBN = 256;  // B rows per CTA tile (`WGMMA_GEMM2_COLUMNS`; GEMM1: 128 gate + 128 up)
constexpr int kRowBytes = 128;  // bytes of K per stage and row: one 128-byte swizzle row
// K elements per stage: 64 (bf16, f16) or 128 (e4m3).
template <typename T>
constexpr int kStageK = kRowBytes / (int)sizeof(T);
constexpr int kMmaSteps = kRowBytes / 32;  // wgmmas per stage, each over 32 bytes of every row
constexpr int kConsumerWarps = 8;
constexpr int kThreads = 128 + kConsumerWarps * 32;  // `WGMMA_THREADS`
constexpr int kBBytes = kBN * kRowBytes;
constexpr int kReduceThreads = 128;  // `WGMMA_REDUCE_THREADS`: 8 columns each
constexpr int kPreGatherThreads = 128;  // `WGMMA_GATHER_THREADS`

// The CTA tile by token rows (`WGMMA_TOKEN_TILES`):
//   BM = 128: warpgroup w takes tile rows [64w, 64w + 64) against all 256 B rows (m64n256);
//   BM = 64:  both warpgroups take the 64 rows, warpgroup w B rows [128w, 128w + 128)
//             (m64n128), so a tile of few tokens costs half the MMA work.
// GEMM1's B stage holds gate and up rows so that every warpgroup owns both halves of its
// inter columns: BM = 128: [gate 128][up 128]; BM = 64: [gate 64][up 64][gate 64][up 64].
template <int BM>
struct Tile {
  static constexpr int kWgN = BM == 128 ? kBN : kBN / 2;  // wgmma N per warpgroup
  static constexpr int kAccs = kWgN / 2;                  // fp32 accumulators per thread
  static constexpr int kABytes = BM * kRowBytes;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = BM == 128 ? 4 : 5;       // `wgmma_smem_bytes`
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + 1 KiB to align stages
  static constexpr int kGateBox = BM == 128 ? 128 : 64;   // GEMM1 rows per TMA box (`wgmma_gate_box`)
  static_assert(kSmemBytes <= 227 * 1024, "stages exceed an SM's shared memory");
  // Offsets of this warpgroup's rows in the A tile and in the B tile (bytes).
  __device__ static int a_offset(int cw) { return BM == 128 ? cw * 64 * kRowBytes : 0; }
  __device__ static int b_offset(int cw) { return BM == 128 ? 0 : cw * (kBN / 2) * kRowBytes; }
  // First tile row and first inter column (GEMM1) / output column (GEMM2) of warpgroup cw.
  __device__ static int row_base(int cw) { return BM == 128 ? cw * 64 : 0; }
  __device__ static int gemm1_col_base(int cw) { return BM == 128 ? 0 : cw * 64; }
  __device__ static int gemm2_col_base(int cw) { return BM == 128 ? 0 : cw * (kBN / 2); }
};

struct TileCoord {
  int expert, start, count, block;
};

// The routing metadata of route_align that every wgmma GEMM reads.
struct Tiles {
  const int* expert_offsets;
  const int* sorted_slots;
  const int* tile_expert;
  const int* tile_start;
  const int* num_tiles;
  int tiles_bound, raster_group;
  int l2_hints;  // `WGMMA_L2_*` bits: weights evict first (1), activations evict last (2)
  int gemm2_block_run;  // GEMM2: column blocks per token tile a CTA takes in a row (`for_each_tile`)
};

#ifdef SWAPMOE_SM90A
// The L2 policies of a tile's loads, from `Tiles::l2_hints`.
struct LoadPolicies {
  uint64_t weights, acts;
  __device__ explicit LoadPolicies(int hints)
      : weights(l2_policy(hints & 1 ? kEvictFirst : kEvictNormal)),
        acts(l2_policy(hints & 2 ? kEvictLast : kEvictNormal)) {}
};
#endif

// The CTA is persistent: it runs work items blockIdx.x, blockIdx.x + gridDim.x, ... through
// one ring of stages, so the producer loads the next tile's first stages while the
// consumers run the last tile's epilogue. `Ring::g` counts the stages this thread has
// issued (producer) or consumed (consumer) over all its tiles; stage g lives in buffer
// g % S, in phase (g / S) & 1.
struct Ring {
  unsigned char* stages;
  uint64_t* full;
  uint64_t* empty;
  int g;
};

// What consume_fp8 runs at the start of each stage besides its own work (`hook(kt)`, kt the
// stage's index in the tile): nothing, or the FP8 GEMM2's router-weight loads
// (kRouterWeightStage).
struct NoStageHook {
  __device__ void operator()(int) const {}
};

#ifdef SWAPMOE_SM90A
constexpr int kGatherThreads = 128;  // producer threads that gather GEMM1's A rows

// Decodes work item `bid` into (token tile, column block), in raster groups; false when the
// tile does not exist (route_align made fewer than the bound).
__device__ __forceinline__ bool tile_coord(const int* __restrict__ tile_expert, const int* __restrict__ tile_start,
                                           const int* __restrict__ num_tiles, const int* __restrict__ expert_offsets,
                                           int tiles_bound, int blocks, int raster_group, int bm, int bid,
                                           TileCoord& c) {
  const int per_group = raster_group * blocks;
  const int group = bid / per_group;
  const int first = group * raster_group;
  const int size = min(raster_group, tiles_bound - first);
  const int within = bid - group * per_group;
  const int tile = first + within % size;
  c.block = within / size;
  if (tile >= *num_tiles) return false;
  c.expert = tile_expert[tile];
  c.start = tile_start[tile];
  c.count = min(bm, expert_offsets[c.expert + 1] - c.start);
  return true;
}

// The pipeline. The producer loads stage after stage with `load(kt, a_dst, b_dst, bar)`:
// without kGatherA one thread (TMA for both operands), with kGatherA all 128 threads of
// warpgroup 0 (cp.async gathers of the A rows, and thread 0's TMA of B), each of which then
// arrives on the stage's full barrier (`full_arrivals`).
template <int BM, bool kGatherA, typename Load>
__device__ __forceinline__ void produce(int ktiles, Ring& ring, Load load) {
  using L = Tile<BM>;
  constexpr int S = L::kStages;
  if (kGatherA || threadIdx.x == 0) {
    for (int kt = 0; kt < ktiles; ++kt, ++ring.g) {
      const int st = ring.g % S;
      if (ring.g >= S) mbar_wait(&ring.empty[st], ((ring.g / S) - 1) & 1);
      unsigned char* a = ring.stages + st * L::kStageBytes;
      load(kt, a, a + L::kABytes, &ring.full[st]);
    }
  }
}

// A consumer's wait for stage ring.g (its full barrier; with kGatherA, the cp.async rows made
// visible to the wgmmas), then the shared addresses of its warpgroup's A and B rows there.
template <int BM, bool kGatherA>
__device__ __forceinline__ void wait_stage(const Ring& ring, int cw, uint32_t& a, uint32_t& b) {
  using L = Tile<BM>;
  const int st = ring.g % L::kStages;
  mbar_wait(&ring.full[st], (ring.g / L::kStages) & 1);
  if (kGatherA) fence_proxy_async_shared();
  a = smem_u32(ring.stages + st * L::kStageBytes) + L::a_offset(cw);
  b = smem_u32(ring.stages + st * L::kStageBytes + L::kABytes) + L::b_offset(cw);
}

// Each consumer warpgroup accumulates its 64 rows x kWgN into acc (bf16/f16: in the
// wgmma accumulators, releasing each stage once the next one's wgmmas are issued).
template <typename T, int BM, bool kGatherA>
__device__ __forceinline__ void consume(int ktiles, Ring& ring, float (&acc)[Tile<BM>::kAccs]) {
  using L = Tile<BM>;
  constexpr int S = L::kStages;
  const int lane = threadIdx.x & 31;
  const int cw = ((threadIdx.x >> 5) - 4) >> 2;  // consumer warpgroup
#pragma unroll
  for (int i = 0; i < L::kAccs; ++i) acc[i] = 0.f;
  for (int kt = 0; kt < ktiles; ++kt, ++ring.g) {
    uint32_t a, b;
    wait_stage<BM, kGatherA>(ring, cw, a, b);
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kMmaSteps; ++kk)
      wgmma::Mma<L::kWgN, T>::run(acc, wgmma_desc_sw128(a + kk * 32), wgmma_desc_sw128(b + kk * 32), 1);
    wgmma_commit();
    fence_accumulators(acc);
    // The previous stage's wgmmas are complete: hand its buffers back to the producer.
    wgmma_wait<1>();
    fence_accumulators(acc);
    if (kt > 0 && lane == 0) mbar_arrive(&ring.empty[(ring.g - 1) % S]);
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  if (lane == 0) mbar_arrive(&ring.empty[(ring.g - 1) % S]);  // the tile's last stage
}

// The scales an FP8 main loop applies per stage. Per-tensor and per-channel scales apply in
// the epilogues, so their loops promote with a plain add (NoStageScales).
struct NoStageScales {
  static constexpr bool kApply = false;
  __device__ void load(int, float (&)[4]) const {}
};
// 128x128 blocks: a stage's 128 of K is one scale block, so each stage's sums are promoted
// times (the scale of the thread's row) x (the weight scale of the column group), as
// DeepGEMM and CUTLASS's blockwise GEMMs do. A thread's accumulators lie on two rows
// (row0, row0 + 8) and, per promotion set, on at most two column groups of 128.
struct BlockStageScales {
  static constexpr bool kApply = true;
  const float* row[2];    // the two rows' scales: one float per stage (activation groups of 128)
  const float* col[2];    // the column groups' weight scales, col_stride apart per stage
  long long col_stride;
  // s[2 * r + g]: stage kt's factor for row r and column group g.
  __device__ void load(int kt, float (&s)[4]) const {
    const float c0 = col[0][kt * col_stride], c1 = col[1][kt * col_stride];
    const float r0 = row[0][kt], r1 = row[1][kt];
    s[0] = r0 * c0;
    s[1] = r0 * c1;
    s[2] = r1 * c0;
    s[3] = r1 * c1;
  }
};

// acc[i] += p[i] (times stage scale s of i's row and of column group `group` with block scales).
template <typename Scale, int R>
__device__ __forceinline__ void promote(float* acc, const float (&p)[R], const float (&s)[4], int group_of_upper_half) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
    if constexpr (Scale::kApply) {
      // register 4j + h lies on row row0 + 8 * (h >> 1); `group_of_upper_half` < 0: the group
      // is -1 - it for every register, else registers past R / 2 are in group 1
      const int r = (i >> 1) & 1;
      const int g = group_of_upper_half < 0 ? -1 - group_of_upper_half : (i >= R / 2 ? 1 : 0);
      acc[i] = fmaf(p[i], s[2 * r + g], acc[i]);
    } else {
      acc[i] += p[i];
    }
  }
}

// Stages (of 128 of K) the BM = 128 FP8 consumers accumulate in the tensor core between two
// promotions when no stage scale is applied: 2 drains the tensor core every 256 of K instead
// of 128. Mixtral fp8_tensor M = 4096 ran 7.3% faster (3078 -> 2853 us, H200) while the
// error against float64 rose from 3.6-4.0e-3 to 4.1-5.0e-3 (bf16 out; the tests allow 1e-2).
// Block scales change at every stage, so their promotions stay per stage.
constexpr int kFp8StagesPerPromotion = 2;
static_assert(kFp8StagesPerPromotion == 1 || kFp8StagesPerPromotion == 2, "consume_fp8 pairs at most two stages");

// e4m3: each stage's wgmmas go into fresh accumulators that are then added to acc in f32
// ("promotion", every 128 of K, as the FP8 swap-AB kernels, DeepGEMM and CUTLASS do): the
// tensor core's FP8 accumulation keeps only about 14 bits, too few for a long K. Two sets
// of them alternate, so stage kt's wgmmas run while stage kt - 1's set is promoted and its
// buffers released (one set drained the tensor core at every stage: 1030 cycles a stage
// of 512 cycles of MMA, ncu at Mixtral M = 4096). 64 + 2 x 64 registers of accumulators
// per thread: the kernels that call it give the consumers `kFp8ConsumerRegs`.
// With block scales (`scale`) the promotion multiplies by the stage's scales, loaded when
// the stage's wgmmas are issued so that their latency hides under them; at BM = 64 the
// warpgroup's first 64 columns (GEMM1: gate) are column group 0, the rest group 1.
//
// At BM = 128 a warpgroup's 64 rows x 256 columns take 128 accumulators, so a second full
// set does not fit: each stage runs as two halves of 128 columns (GEMM1: gate, then up;
// with block scales column groups 0 and 1) through one set of 64, drained before its
// promotion; the other warpgroup's wgmmas keep the tensor core busy meanwhile. The larger
// tile reads 40% fewer bytes from L2 per MMA than BM = 64, whose FP8 GEMMs ran at 60-74% of
// L2 throughput (ncu, Mixtral M = 4096).
// Without block scales (per-tensor and per-channel weights, scaled in the epilogue) a BM = 128
// warpgroup takes `kFp8StagesPerPromotion` stages into `part` before each promotion, so the
// tensor core is drained half as often (see the constant's reason).
// `hook(kt)` runs at the start of each stage kt, before its wait (NoStageHook: nothing).
template <int BM, bool kGatherA, typename Scale, typename Hook = NoStageHook>
__device__ __forceinline__ void consume_fp8(int ktiles, Ring& ring, float (&acc)[Tile<BM>::kAccs],
                                            const Scale& scale, Hook hook = {}) {
  using L = Tile<BM>;
  constexpr int S = L::kStages;
  const int lane = threadIdx.x & 31;
  const int cw = ((threadIdx.x >> 5) - 4) >> 2;
  if constexpr (BM == 128) {
    constexpr int kHalf = L::kAccs / 2;  // accumulators of 128 columns
    float part[kHalf];
#pragma unroll
    for (int i = 0; i < L::kAccs; ++i) acc[i] = 0.f;
    // Issues the wgmmas of column half h of the stage at (a, b) into part; `fresh`: the first
    // overwrites part instead of adding to it.
    auto mma_half = [&](uint32_t a, uint32_t b, int h, bool fresh) {
#pragma unroll
      for (int kk = 0; kk < kMmaSteps; ++kk)
        wgmma::Mma<L::kWgN / 2, __nv_fp8_e4m3>::run(part, wgmma_desc_sw128(a + kk * 32),
                                                    wgmma_desc_sw128(b + h * (kBN / 2) * kRowBytes + kk * 32),
                                                    !fresh || kk > 0);
    };
    int kt = 0;
    if constexpr (!Scale::kApply && kFp8StagesPerPromotion == 2) {
      constexpr float kNoScale[4] = {1.f, 1.f, 1.f, 1.f};
      for (; kt + 1 < ktiles; kt += 2, ring.g += 2) {
        uint32_t a0, b0, a1, b1;
        hook(kt);
        wait_stage<BM, kGatherA>(ring, cw, a0, b0);
        hook(kt + 1);
        Ring next = ring;
        ++next.g;
        wait_stage<BM, kGatherA>(next, cw, a1, b1);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          fence_accumulators(part);
          wgmma_fence();
          mma_half(a0, b0, h, true);
          mma_half(a1, b1, h, false);
          wgmma_commit();
          wgmma_wait<0>();
          fence_accumulators(part);
          if (h == 1 && lane == 0) {
            mbar_arrive(&ring.empty[ring.g % S]);
            mbar_arrive(&ring.empty[(ring.g + 1) % S]);
          }
          promote<Scale>(acc + h * kHalf, part, kNoScale, -1 - h);
        }
      }
    }
    for (; kt < ktiles; ++kt, ++ring.g) {  // every stage (block scales), or an odd last one
      hook(kt);
      float s[4];
      scale.load(kt, s);
      uint32_t a, b;
      wait_stage<BM, kGatherA>(ring, cw, a, b);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        fence_accumulators(part);
        wgmma_fence();
        mma_half(a, b, h, true);
        wgmma_commit();
        wgmma_wait<0>();
        fence_accumulators(part);
        if (h == 1 && lane == 0) mbar_arrive(&ring.empty[ring.g % S]);
        promote<Scale>(acc + h * kHalf, part, s, -1 - h);
      }
    }
  } else {
    float part0[L::kAccs], part1[L::kAccs];
    float s0[4], s1[4];  // the stage scales of the stage in part0 / part1 (block scales)
#pragma unroll
    for (int i = 0; i < L::kAccs; ++i) acc[i] = 0.f;
    int kt = 0;  // stages issued in this tile
    // Issues stage ring.g's wgmmas into p (one commit group), its scales into s.
    auto issue = [&](float (&p)[L::kAccs], float (&s)[4]) {
      hook(kt);
      scale.load(kt++, s);
      uint32_t a, b;
      wait_stage<BM, kGatherA>(ring, cw, a, b);
      fence_accumulators(p);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kMmaSteps; ++kk)
        wgmma::Mma<L::kWgN, __nv_fp8_e4m3>::run(p, wgmma_desc_sw128(a + kk * 32), wgmma_desc_sw128(b + kk * 32),
                                                kk > 0);
      wgmma_commit();
      fence_accumulators(p);
      ++ring.g;
    };
    // Stage g's wgmmas (in p) are complete: hand its buffers back, then promote.
    auto retire = [&](float (&p)[L::kAccs], const float (&s)[4], int g) {
      fence_accumulators(p);
      if (lane == 0) mbar_arrive(&ring.empty[g % S]);
      promote<Scale>(acc, p, s, 0);
    };
    if (ktiles <= 0) return;  // (K and N are > 0: the launcher refuses empty shapes)
    // Unrolled by two without branches on the parity, so that ptxas can see which set each
    // instruction touches (with a branch per stage it serialized every wgmma).
    issue(part0, s0);  // stage 0
    while (kt + 1 < ktiles) {
      issue(part1, s1);  // stage kt
      wgmma_wait<1>();   // stage kt - 1 (part0) is complete
      retire(part0, s0, ring.g - 2);
      issue(part0, s0);  // stage kt + 1
      wgmma_wait<1>();
      retire(part1, s1, ring.g - 2);
    }
    if (kt < ktiles) {  // an even number of stages: the last one goes into part1
      issue(part1, s1);
      wgmma_wait<1>();
      retire(part0, s0, ring.g - 2);
      wgmma_wait<0>();
      retire(part1, s1, ring.g - 1);
    } else {
      wgmma_wait<0>();
      retire(part0, s0, ring.g - 1);
    }
  }
}

// Register budgets of the FP8 kernels' roles (setmaxnreg): 128 x 40 + 256 x 232 = 64512 of
// an SM's 65536, the 168 x 384 they launch with.
constexpr int kFp8ProducerRegs = 40;
constexpr int kFp8ConsumerRegs = 232;
static_assert(128 * kFp8ProducerRegs + 256 * kFp8ConsumerRegs <= 168 * kThreads, "register budget");

__device__ __forceinline__ unsigned char* aligned_stages(unsigned char* smem) {
  const uint32_t base = smem_u32(smem);
  return smem + (((base + 1023u) & ~1023u) - base);
}

// `full_arrivals`: 1 (the TMA thread), or 1 + 128 when the producer warpgroup gathers A.
template <int S>
__device__ __forceinline__ void init_barriers(uint64_t* full, uint64_t* empty, int full_arrivals, const TensorMap* a,
                                              const TensorMap* b) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(&full[i], full_arrivals);
      mbar_init(&empty[i], kConsumerWarps);
    }
    mbar_init_fence();
    if (a) tma_prefetch_map(a);
    tma_prefetch_map(b);
  }
  __syncthreads();
}

// The ring's barriers: one pair of arrays per tile size, the same wherever in the kernel they
// are asked for.
struct RingBarriers {
  uint64_t* full;
  uint64_t* empty;
};
template <int BM>
__device__ __forceinline__ RingBarriers ring_barriers() {
  __shared__ __align__(8) uint64_t full[Tile<BM>::kStages], empty[Tile<BM>::kStages];
  return RingBarriers{full, empty};
}

// Initializes the ring's barriers (and prefetches the tensor maps): once per CTA, in make_ring
// or earlier (the GEMM1s, before their PDL wait).
template <int BM>
__device__ __forceinline__ void init_ring_barriers(int full_arrivals, const TensorMap* a, const TensorMap* b) {
  const RingBarriers bars = ring_barriers<BM>();
  init_barriers<Tile<BM>::kStages>(bars.full, bars.empty, full_arrivals, a, b);
}

// The CTA's ring: shared-memory stages and their barriers, initialized here (kInit) or already
// by the kernel (init_ring_barriers).
template <int BM, bool kInit = true>
__device__ __forceinline__ Ring make_ring(int full_arrivals, const TensorMap* a, const TensorMap* b) {
  extern __shared__ unsigned char smem_raw[];
  if constexpr (kInit) init_ring_barriers<BM>(full_arrivals, a, b);
  const RingBarriers bars = ring_barriers<BM>();
  return Ring{aligned_stages(smem_raw), bars.full, bars.empty, 0};
}

#endif

// Calls body(c) for each existing tile of this CTA's work items (CTA-uniform). With run > 1
// (GEMM2's `Tiles::gemm2_block_run`) a work item is a run of `run` consecutive column blocks
// of one token tile, items in token tile order (an expert's tiles are neighbors, so they run
// at the same time and share each w2 block through L2), and body sees the run's blocks in
// order: the producer then finds the tile's rows still in the ring (`HeldRows`).
template <typename Body>
__device__ __forceinline__ void for_each_tile(const Tiles& tl, int blocks, int bm, Body body, int run = 1) {
  const int items = tl.tiles_bound * blocks;
#ifdef SWAPMOE_SM90A
  if (run > 1) {
    const int runs = (blocks + run - 1) / run;
    for (int item = blockIdx.x; item < tl.tiles_bound * runs; item += gridDim.x) {
      const int tile = item / runs, first = (item - tile * runs) * run;
      if (tile >= *tl.num_tiles) break;  // items go in tile order
      TileCoord c;
      c.expert = tl.tile_expert[tile];
      c.start = tl.tile_start[tile];
      c.count = min(bm, tl.expert_offsets[c.expert + 1] - c.start);
      for (c.block = first; c.block < min(blocks, first + run); ++c.block) body(c);
    }
    return;
  }
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    TileCoord c;
    if (tile_coord(tl.tile_expert, tl.tile_start, tl.num_tiles, tl.expert_offsets, tl.tiles_bound, blocks,
                   tl.raster_group, bm, item, c))
      body(c);
  }
#else
  (void)items;
#endif
}

// GEMM1's loads for one tile c (token tile, kBN / 2 inter columns; the producer
// warpgroup). TA is the element type of both operands: bf16/f16, or e4m3 (x quantized
// first, e4m3 weights). kGatherA: the producer warpgroup gathers the A rows from x
// (cp.async); otherwise they were gathered before (wgmma_moe_gather into xs, sorted order)
// and thread 0 copies them by TMA.
template <typename TA, int BM, bool kGatherA>
__device__ __forceinline__ void gemm1_produce(const TA* __restrict__ x, long long x_row_stride,
                                              const TensorMap* xs_map, const TensorMap* w1_map, const Tiles& tl,
                                              int topk, int N, int K, const TileCoord& c, Ring& ring) {
#ifdef SWAPMOE_SM90A
  using L = Tile<BM>;
  constexpr int kCols = kBN / 2;  // inter columns per CTA tile
  constexpr int kK = kStageK<TA>;
  constexpr int kChunkElems = 16 / (int)sizeof(TA);  // elements per 16-byte chunk
  const int j0 = c.block * kCols;
  // The A rows are gathered straight from x: producer thread t copies 16-byte chunk t % 8
  // of tile rows t / 8 + 16 i, into the 128-byte swizzle layout the wgmma descriptors read.
  constexpr int kRowsPerThread = BM / 16;
  const int chunk = threadIdx.x & 7;
  const TA* src[kRowsPerThread];
  uint32_t dst[kRowsPerThread];
  if (kGatherA && threadIdx.x < kGatherThreads) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int r = (threadIdx.x >> 3) + 16 * i;
      src[i] = r < c.count ? x + (long long)(tl.sorted_slots[c.start + r] / topk) * x_row_stride + chunk * kChunkElems
                           : nullptr;
      dst[i] = r * kRowBytes + ((chunk ^ (r & 7)) << 4);
    }
  }
  const LoadPolicies pol(tl.l2_hints);
  auto load = [&](int kt, unsigned char* a, unsigned char* b, uint64_t* bar) {
    const int k0 = kt * kK;
    if (threadIdx.x == 0) {
      mbar_arrive_expect(bar, kGatherA ? kBBytes : L::kStageBytes);
      if (!kGatherA) tma_load_2d_hint(a, xs_map, k0, c.start, bar, pol.acts);
      constexpr int kBox = L::kGateBox, kBoxBytes = kBox * kRowBytes;
#pragma unroll
      for (int h = 0; h < kCols / kBox; ++h) {
        tma_load_3d_hint(b + 2 * h * kBoxBytes, w1_map, k0, j0 + h * kBox, c.expert, bar, pol.weights);
        tma_load_3d_hint(b + (2 * h + 1) * kBoxBytes, w1_map, k0, N + j0 + h * kBox, c.expert, bar, pol.weights);
      }
    }
    if (!kGatherA) return;
    const uint32_t a_base = smem_u32(a);
    const bool k_ok = k0 + chunk * kChunkElems < K;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const bool ok = k_ok && src[i] != nullptr;
      cp_async_16_zfill_hint(a_base + dst[i], ok ? src[i] + k0 : x, ok, pol.acts);
    }
    cp_async_arrive_noinc(bar);
  };
  produce<BM, kGatherA>((K + kK - 1) / kK, ring, load);
#endif
}

// The tile rows (GEMM2's A) each ring buffer holds, as 8 * tile start + k-stage (-1: none
// known), kept by GEMM2's producer thread across its tiles.
template <int S>
struct HeldRows {
  int tag[S];
  __device__ HeldRows() {
#pragma unroll
    for (int i = 0; i < S; ++i) tag[i] = -1;
  }
};

// GEMM2's loads for one tile c (token tile, kBN output columns): A is the intermediate in
// sorted order (a 2-D tensor map), B the expert's w2 rows. With a block run (`keep_rows`) a
// k-stage whose buffer still holds the same tile rows (the run's previous block put them
// there: N's k-stages divide the ring's stages, which the oracle checks) loads B alone.
template <typename TA, int BM>
__device__ __forceinline__ void gemm2_produce(const TensorMap* inter_map, const TensorMap* w2_map, int N,
                                              const TileCoord& c, int l2_hints, bool keep_rows,
                                              HeldRows<Tile<BM>::kStages>& held, Ring& ring) {
#ifdef SWAPMOE_SM90A
  using L = Tile<BM>;
  constexpr int kK = kStageK<TA>;
  const int r0 = c.block * kBN;
  const LoadPolicies pol(l2_hints);
  auto load = [&](int kt, unsigned char* a, unsigned char* b, uint64_t* bar) {
    const int k0 = kt * kK, st = (int)(bar - ring.full), tag = 8 * c.start + kt;
    const bool have = keep_rows && held.tag[st] == tag;
    mbar_arrive_expect(bar, have ? kBBytes : L::kStageBytes);
    if (!have) {
      tma_load_2d_hint(a, inter_map, k0, c.start, bar, pol.acts);
      held.tag[st] = tag;
    }
    tma_load_3d_hint(b, w2_map, k0, r0, c.expert, bar, pol.weights);
  };
  produce<BM, false>((N + kK - 1) / kK, ring, load);
#endif
}

// The main loops of the bf16/f16 GEMMs for one tile, both roles: the producer warpgroup runs
// produce_tile() and returns false (it goes on to the next tile as soon as this one's loads
// are issued); the consumer warpgroups fill acc (GEMM1: gate and up) and return true.
template <typename T, int BM, bool kGatherA, typename Produce>
__device__ __forceinline__ bool both_roles(Produce produce_tile, int ktiles, Ring& ring,
                                           float (&acc)[Tile<BM>::kAccs]) {
#ifdef SWAPMOE_SM90A
  if (threadIdx.x < 128) {
    produce_tile();
    return false;
  }
  consume<T, BM, kGatherA>(ktiles, ring, acc);
  return true;
#else
  return false;
#endif
}

// The FP8 kernels' roles, split once per CTA so that each can take its register budget
// (setmaxnreg): the producer warpgroup runs produce_tile(c) for each of the CTA's tiles, the
// consumers consume_tile(c) (main loop and epilogue), in the same tile order.
template <typename Produce, typename Consume>
__device__ __forceinline__ void fp8_roles(const Tiles& tl, int blocks, int bm, Produce produce_tile,
                                          Consume consume_tile, int run = 1) {
#ifdef SWAPMOE_SM90A
  if (threadIdx.x < 128) {
    setmaxnreg_dec<kFp8ProducerRegs>();
    for_each_tile(tl, blocks, bm, produce_tile, run);
  } else {
    setmaxnreg_inc<kFp8ConsumerRegs>();
    for_each_tile(tl, blocks, bm, consume_tile, run);
  }
#endif
}

// The CTA's ring for GEMM1 (full barriers: the TMA thread, plus the 128 gathering threads),
// whose barriers every GEMM1 has initialized already, before its PDL wait (gemm1_tiles).
template <bool kGatherA>
__device__ __forceinline__ constexpr int gemm1_full_arrivals() {
  return kGatherA ? 1 + kGatherThreads : 1;
}
template <int BM, bool kGatherA>
__device__ __forceinline__ Ring gemm1_ring(const TensorMap* xs_map, const TensorMap* w1_map) {
#ifdef SWAPMOE_SM90A
  return make_ring<BM, false>(gemm1_full_arrivals<kGatherA>(), kGatherA ? nullptr : xs_map, w1_map);
#else
  return Ring{};
#endif
}
template <int BM>
__device__ __forceinline__ Ring gemm2_ring(const TensorMap* inter_map, const TensorMap* w2_map) {
#ifdef SWAPMOE_SM90A
  return make_ring<BM>(1, inter_map, w2_map);
#else
  return Ring{};
#endif
}

// Where a consumer thread's accumulators lie. Accumulator layout of m64nNk16 (and k32):
// n8 block j, register 4j + h holds row 16 * warp + lane / 4 + 8 * (h >> 1), column
// 8j + 2 * (lane % 4) + (h & 1). In GEMM1 a warpgroup's first kWgN / 2 columns are gate
// columns, the rest the matching up columns.
template <int BM>
struct Frag {
  int row0;  // tile row of the thread's registers with h >> 1 == 0 (+ 8 for the others)
  int cw;    // consumer warpgroup
  int lane;
  __device__ Frag() {
    const int warp = threadIdx.x >> 5;
    lane = threadIdx.x & 31;
    cw = (warp - 4) >> 2;
    row0 = Tile<BM>::row_base(cw) + (warp & 3) * 16 + (lane >> 2);
  }
  __device__ int col(int j) const { return 8 * j + 2 * (lane & 3); }
};

// The slots of a consumer thread's two row halves (-1 past the tile's expert). The FP8 GEMM2s
// issue these loads before their main loop and first wait on them after it; what depends on
// them (router weights, per-row scales) is loaded after it, both halves' loads together, so
// the epilogue waits on one round of loads (GEMM1 and the 16-bit GEMM2 read them after the
// main loop: two rounds). (Waited on half by half, or with the slots read
// after the main loop, each tile's epilogue waited on two to four dependent loads: ncu source
// view, benches/NOTES.md "GEMM2 epilogue loads" and "GEMM2 rows: one round of loads". The
// dependent loads read before the main loop instead cost the sparse tiles of FP8 GEMM2 at
// deepseek-v3-tp8 M = 128 17%: they sat in front of the first stage's wait, "GEMM2 16-byte
// stores".)
struct RowSlots {
  int slot[2];
};

// A GEMM1 that groups the slots itself passes kGlobal = false: its Tiles point into its own
// shared memory (`align_in_cta`), which the read-only data path cannot load. The kGlobal form
// is the original expression: rewritten, it changed the GEMM2s' instruction schedule.
template <int BM, bool kGlobal = true>
__device__ __forceinline__ RowSlots row_slots(const Tiles& tl, const TileCoord& c) {
  const Frag<BM> f;
  RowSlots s;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = f.row0 + half * 8;
    if constexpr (kGlobal)
      s.slot[half] = r < c.count ? __ldg(tl.sorted_slots + c.start + r) : -1;
    else
      s.slot[half] = r < c.count ? tl.sorted_slots[c.start + r] : -1;
  }
  return s;
}

// The stage at whose start a per-tensor or per-channel FP8 GEMM2 tile issues its rows'
// router-weight loads: the second. The slots they index (row_slots) were read before the main
// loop and have arrived by then (the first stage's wait and wgmmas lie between), so the
// loads' round trip runs under the tile's remaining stages rather than between its main loop
// and its epilogue, where the ncu source view of the FP8 per-tensor GEMM2 (qwen3-30b-a3b
// M = 4096) put 6% of the kernel's stall samples on the weights' first use. Not the first
// stage: "GEMM2 16-byte stores" measured slot-dependent loads in front of the first stage's
// wait 17% slower on sparse tiles. The bf16/f16 and 128x128-block GEMM2s load them after the
// main loop: measured the same way they were 0.6-2% slower whole op at M = 4096 (NOTES
// "GEMM2's router weights loaded during the main loop").
constexpr int kRouterWeightStage = 1;

// The router weights of a thread's two row halves where they apply to the input (both
// halves' loads at once), else 1: GEMM1's factor w in activate_gate_up.
__device__ __forceinline__ void input_router_weights(int weight_on_input, const void* __restrict__ topk_weights,
                                                     int topk_weights_code, long long topk_weights_row_stride,
                                                     int topk, const RowSlots& slots, float (&w)[2]) {
  w[0] = w[1] = 1.f;
  if (weight_on_input)
    slot_router_weights<2>(topk_weights, topk_weights_code, topk_weights_row_stride, topk, slots.slot, w);
}

// A 4 x 4 transpose of 32-bit words among the 4 lanes of a quad (lane q = lane % 4): lane q
// holds w[b], its word of n8 block b (columns 2q, 2q + 1 of the block); it gets block q's
// four words in column order, 16 contiguous bytes. Two butterfly steps (lanes q ^ 1, then
// q ^ 2), each moving half of the words. Every lane of the warp must call it.
__device__ __forceinline__ uint4 quad_transpose(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int q) {
  const bool odd = q & 1, upper = q & 2;
  // Step 1: keep the blocks of q's parity (q & 1 and (q & 1) + 2), send the other two.
  const uint32_t r0 = __shfl_xor_sync(0xffffffffu, odd ? w0 : w1, 1);  // the partner's word of block q & 1
  const uint32_t r2 = __shfl_xor_sync(0xffffffffu, odd ? w2 : w3, 1);  // ... of block (q & 1) + 2
  const uint32_t own0 = odd ? w1 : w0, own2 = odd ? w3 : w2;
  // The two kept blocks' words from lanes (q & 2) and (q & 2) + 1, in that order.
  const uint32_t a0 = odd ? r0 : own0, a1 = odd ? own0 : r0;  // block q & 1
  const uint32_t b0 = odd ? r2 : own2, b1 = odd ? own2 : r2;  // block (q & 1) + 2
  // Step 2: keep block q, send the other to lane q ^ 2, which holds block q's other two words.
  const uint32_t s0 = __shfl_xor_sync(0xffffffffu, upper ? a0 : b0, 2);
  const uint32_t s1 = __shfl_xor_sync(0xffffffffu, upper ? a1 : b1, 2);
  const uint32_t k0 = upper ? b0 : a0, k1 = upper ? b1 : a1;
  return upper ? make_uint4(s0, s1, k0, k1) : make_uint4(k0, k1, s0, s1);
}

// Epilogue stores go out 16 bytes per lane (quad_transpose) on tiles holding at least this
// many rows. Sparser tiles store each thread's words alone: there the per-tile latency of the
// epilogue is what counts, and the transpose's shuffles added to it (FP8 GEMM2 at deepseek
// M = 128, t64 tiles of ~4 rows: 142 -> 161 µs with wide stores on every tile).
// benches/NOTES.md "GEMM2 16-byte stores".
template <int BM>
constexpr int kWideStoreMinRows = BM / 2;

// A consumer thread's two output rows of a GEMM1 tile in `out` (rows of N elements, the tile's
// first row at c.start): row[h] is tile row row0 + 8h at column col0 (the warpgroup's first),
// as bytes; valid[h] is false past the tile's expert, whose pointer is then row 0's.
struct Gemm1OutRows {
  unsigned char* row[2];
  bool valid[2];
};

template <int BM, typename E>
__device__ __forceinline__ Gemm1OutRows gemm1_out_rows(const Frag<BM>& f, const TileCoord& c, E* out, int N,
                                                       int col0) {
  Gemm1OutRows o;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = f.row0 + half * 8;
    o.valid[half] = r < c.count;
    o.row[half] = reinterpret_cast<unsigned char*>(out + (long long)(c.start + (o.valid[half] ? r : 0)) * N + col0);
  }
  return o;
}

// The 32-bit word of e4m3 pairs that gemm1_store_rows takes for row half `half` and piece b:
// n8 block 2b's pair (low half) and block 2b + 1's, quantized as fp8x2_quantize(.., s, inv,
// per_tensor), from the activated values in place of the gate accumulators (activate_gate_up).
template <int kAccs>
__device__ __forceinline__ uint32_t e4m3_pairs_word(const float (&acc)[kAccs], int half, int b, float s, float inv,
                                                    bool per_tensor) {
  return fp8x2_quantize(acc[8 * b + 2 * half], acc[8 * b + 2 * half + 1], s, inv, per_tensor) |
         ((uint32_t)fp8x2_quantize(acc[8 * b + 4 + 2 * half], acc[8 * b + 5 + 2 * half], s, inv, per_tensor) << 16);
}

// GEMM1's stores of a consumer thread's two row halves, as 32-bit words: word(h, b) is the
// thread's (quad lane q's) word of 16-byte piece b of row half h, at rows.row[h]
// (gemm1_out_rows; rows.valid[h] false past the tile's expert), pieces at or past
// `bytes_left` dropped. 16-bit values: the word is columns 8b + 2q, + 1 (n8 block b).
// e4m3 (kE4m3): the low half is n8 block 2b's pair (columns 16b + 2q, + 1), the high half
// block 2b + 1's (16b + 8 + 2q, + 1). `wide` (CTA-uniform): each quad transposes its words so
// that lane q stores piece 4g + q whole, and a warp writes 8 rows x 64 contiguous bytes;
// otherwise every lane stores its own words (4 bytes, or e4m3's two 2-byte pairs), which
// leaves whole sectors to be merged in L2: 27 of the per-tensor FP8 GEMM1's 285 µs at qwen3
// M = 4096 were its 2-byte stores (benches/NOTES.md "Where the wgmma GEMM1's fixed cost per
// tile goes").
template <bool kE4m3, int kPieces, typename Word>
__device__ __forceinline__ void gemm1_store_rows(Word word, const Gemm1OutRows& rows, int bytes_left, bool wide,
                                                 int q) {
  static_assert(kPieces % 4 == 0, "pieces go through the quad transpose in fours");
  unsigned char* const(&row)[2] = rows.row;
  const bool(&valid)[2] = rows.valid;
  if (!wide) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (!valid[half]) continue;
#pragma unroll
      for (int b = 0; b < kPieces; ++b) {
        if (16 * b >= bytes_left) continue;
        const uint32_t w = word(half, b);
        if constexpr (kE4m3) {
          *reinterpret_cast<unsigned short*>(row[half] + 16 * b + 2 * q) = (unsigned short)(w & 0xffffu);
          *reinterpret_cast<unsigned short*>(row[half] + 16 * b + 8 + 2 * q) = (unsigned short)(w >> 16);
        } else {
          *reinterpret_cast<uint32_t*>(row[half] + 16 * b + 4 * q) = w;
        }
      }
    }
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (__all_sync(0xffffffffu, !valid[half])) continue;  // warp-uniform: no row of this warp's half
#pragma unroll
    for (int g = 0; g < kPieces / 4; ++g) {
      uint4 v = quad_transpose(word(half, 4 * g), word(half, 4 * g + 1), word(half, 4 * g + 2),
                               word(half, 4 * g + 3), q);
      if constexpr (kE4m3) {  // lanes 0..3's words -> bytes in column order
        v = make_uint4(__byte_perm(v.x, v.y, 0x5410), __byte_perm(v.z, v.w, 0x5410), __byte_perm(v.x, v.y, 0x7632),
                       __byte_perm(v.z, v.w, 0x7632));
      }
      const int piece = 4 * g + q;  // the piece this lane now holds
      if (valid[half] && 16 * piece < bytes_left) *reinterpret_cast<uint4*>(row[half] + 16 * piece) = v;
    }
  }
}

// GEMM1's activated values in place of its gate accumulators: acc[4j + 2h + e] =
// act(g * s[h] * w[h]) * (u * s[h] * w[h]) for gate accumulator g = acc[4j + 2h + e] and its
// up twin u = acc[4(j + kGateBlocks) + 2h + e], with row half h's input scale s (1 for 16-bit
// inputs) and router weight w (1 unless the weights apply to the input). All values with no
// condition between them (with_activation): rows past the tile's expert and columns past N
// are the callers' to drop at their stores.
template <int kGateBlocks, int kAccs>
__device__ __forceinline__ void activate_gate_up(float (&acc)[kAccs], const float (&s)[2], const float (&w)[2],
                                                 int act) {
  static_assert(8 * kGateBlocks <= kAccs, "gate and up blocks");
  with_activation(act, [&](auto a) {
    constexpr int A = decltype(a)::value;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int j = 0; j < kGateBlocks; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float g = acc[4 * j + 2 * half + e] * s[half] * w[half];
          const float u = acc[4 * (j + kGateBlocks) + 2 * half + e] * s[half] * w[half];
          acc[4 * j + 2 * half + e] = activate_as<A>(g) * u;
        }
      }
    }
  });
}

// GEMM1's tiles: route_align's (kGroup false), or its own grouping of the slots
// (`Plan::align_in_gemm1`: no align kernel) in the shared memory past its stages
// (`oracle::cta_align_smem_bytes` more than the stages' bytes). Every thread calls it. Only the
// _ga GEMM1s group (kGroup); the others keep route_align's tiles, read from the kernel's
// parameters (a grouping chosen at run time measured 1.6-1.8 us per layer slower where it did
// not group, H100 2026-12-06). The code after the `if constexpr` return is dead in those (an
// `else` around it rescheduled half of the _ga kernels, so it stays as they were tested).
template <int BM, bool kGatherA, bool kGroup>
__device__ __forceinline__ Tiles gemm1_tiles(const Tiles& tl, const CtaAlign& align, int topk,
                                             const TensorMap* xs_map, const TensorMap* w1_map) {
#ifdef SWAPMOE_SM90A
  // What needs nothing of the kernel before runs ahead of the wait: the ring's barriers and
  // the prefetch of the tensor maps (gemm1_ring then leaves the barriers as they are). Launched
  // with PDL (the first kernel, or `Plan::wgmma_gemm1_pdl`), GEMM1 reads the ids, the tile list
  // or the token rows only once the kernel before is done; without PDL the wait returns at once.
  init_ring_barriers<BM>(gemm1_full_arrivals<kGatherA>(), kGatherA ? nullptr : xs_map, w1_map);
  pdl_wait();
  if constexpr (!kGroup) return tl;
  extern __shared__ unsigned char smem_raw[];
  int* ints = reinterpret_cast<int*>(smem_raw + Tile<BM>::kSmemBytes);
  const CtaAlignOut o = align_in_cta<kThreads>(
      align, topk, BM, tl.tiles_bound, ints, const_cast<int*>(tl.expert_offsets), const_cast<int*>(tl.sorted_slots),
      const_cast<int*>(tl.tile_expert), const_cast<int*>(tl.tile_start), const_cast<int*>(tl.num_tiles));
  return Tiles{o.expert_offsets, o.sorted_slots, o.tile_expert,   o.tile_start,
               o.num_tiles,      tl.tiles_bound, tl.raster_group, tl.l2_hints, tl.gemm2_block_run};
#else
  return tl;
#endif
}

template <typename T, int BM, bool kGatherA, bool kGroup>
__device__ __forceinline__ void gemm1_act(const T* __restrict__ x, long long x_row_stride, const TensorMap* xs_map,
                                          const TensorMap* w1_map, const void* __restrict__ topk_weights,
                                          int topk_weights_code, long long topk_weights_row_stride, const Tiles& tl,
                                          int topk, int N, int K, int act, int weight_on_input, T* __restrict__ inter) {
  using L = Tile<BM>;
  Ring ring = gemm1_ring<BM, kGatherA>(xs_map, w1_map);
  for_each_tile(tl, (N + kBN / 2 - 1) / (kBN / 2), BM, [&](const TileCoord& c) {
    float acc[L::kAccs];
    if (!both_roles<T, BM, kGatherA>(
            [&] { gemm1_produce<T, BM, kGatherA>(x, x_row_stride, xs_map, w1_map, tl, topk, N, K, c, ring); },
            (K + kStageK<T> - 1) / kStageK<T>, ring, acc))
      return;
    const Frag<BM> f;
    const int col0 = c.block * (kBN / 2) + L::gemm1_col_base(f.cw);
    constexpr int kGateBlocks = L::kWgN / 16;
    float w[2];
    input_router_weights(weight_on_input, topk_weights, topk_weights_code, topk_weights_row_stride, topk,
                         row_slots<BM, !kGroup>(tl, c), w);
    constexpr float kNoScale[2] = {1.f, 1.f};
    activate_gate_up<kGateBlocks>(acc, kNoScale, w, act);
    auto word = [&](int half, int j) {  // n8 block j's pair of row half `half`
      T pair[2] = {from_f32<T>(acc[4 * j + 2 * half]), from_f32<T>(acc[4 * j + 2 * half + 1])};
      return *reinterpret_cast<const uint32_t*>(pair);
    };
    const bool wide = c.count >= kWideStoreMinRows<BM>;  // CTA-uniform
    const Gemm1OutRows rows = gemm1_out_rows(f, c, inter, N, col0);
    gemm1_store_rows<false, kGateBlocks>(word, rows, (N - col0) * (int)sizeof(T), wide, f.lane & 3);
  });
}

// The rows a consumer thread stores in GEMM2's epilogue: slot[h] of tile row row0 + 8h (-1:
// past the tile's expert) and a value per row (rv: what the epilogue multiplies the row by;
// 0 for rows past the expert).
template <typename RV>
struct Gemm2Rows {
  int slot[2];
  RV rv[2];
};

// The rows from their slots and their router weights' raw bits (load_router_weight_bits,
// issued earlier): the router weight per row, 1 where it applies to the input, 0 past the
// tile's expert.
__device__ __forceinline__ Gemm2Rows<float> gemm2_weight_rows(const RowSlots& s, const RouterWeightBits<2>& bits,
                                                              int topk_weights_code, int weight_on_input) {
  Gemm2Rows<float> rows;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    rows.slot[half] = s.slot[half];
    rows.rv[half] = s.slot[half] >= 0 ? 1.f : 0.f;
  }
  if (!weight_on_input) router_weights_from_bits(bits, topk_weights_code, s.slot, rows.rv);
  return rows;
}

// The same in one step: both halves' router weights loaded (both loads issued before either
// is converted), then converted.
__device__ __forceinline__ Gemm2Rows<float> gemm2_weight_rows(const RowSlots& s, const void* __restrict__ topk_weights,
                                                              int topk_weights_code,
                                                              long long topk_weights_row_stride, int topk,
                                                              int weight_on_input) {
  RouterWeightBits<2> bits{};
  if (!weight_on_input)
    bits = load_router_weight_bits<2>(topk_weights, topk_weights_code, topk_weights_row_stride, topk, s.slot);
  return gemm2_weight_rows(s, bits, topk_weights_code, weight_on_input);
}

// GEMM2's epilogue for one tile: y[slot, col] = value(acc, rv, col) for the consumer
// thread's rows (`rows`, from gemm2_weight_rows) and columns, in the activation dtype; rows past the
// tile's expert and columns past K are dropped (K is a multiple of 8: whole n8 blocks).
// Tiles holding at least kWideStoreMinRows rows transpose the quad's words (quad_transpose)
// so that each lane stores 16 bytes, 8 columns of one block: a warp's store then writes whole
// 32-byte sectors, where 4-byte stores of column pairs leave half of every sector to another
// instruction (ncu, deepseek-v3-tp8 M = 4096: 49% of GEMM2's store sectors excessive, L2 at
// 85% of its peak; the whole op 1442 -> 1350 µs with the wide stores). Sparser tiles keep the
// 4-byte stores (kWideStoreMinRows).
template <typename T, int BM, typename RV, typename Value>
__device__ __forceinline__ void gemm2_store(const float (&acc)[Tile<BM>::kAccs], const Gemm2Rows<RV>& rows,
                                            const TileCoord& c, int K, T* __restrict__ y, Value value) {
  static_assert(sizeof(T) == 2, "y holds 16-bit values");
  constexpr int kBlocks = Tile<BM>::kWgN / 8;  // n8 blocks per warpgroup row
  static_assert(kBlocks % 4 == 0, "blocks go through the quad transpose in fours");
  const Frag<BM> f;
  const int q = f.lane & 3;
  const int col0 = c.block * kBN + Tile<BM>::gemm2_col_base(f.cw);
  // The thread's two values of block j in row half `half`, as one word (columns 8j + 2q, + 1).
  auto word = [&](int half, int j) {
    const int col = col0 + 8 * j + 2 * q;
    T pair[2] = {from_f32<T>(value(acc[4 * j + 2 * half], rows.rv[half], col)),
                 from_f32<T>(value(acc[4 * j + 2 * half + 1], rows.rv[half], col + 1))};
    return *reinterpret_cast<const uint32_t*>(pair);
  };
  if (c.count < kWideStoreMinRows<BM>) {  // CTA-uniform
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (rows.slot[half] < 0) continue;
      T* out = y + (long long)rows.slot[half] * K + col0;
#pragma unroll
      for (int j = 0; j < kBlocks; ++j)
        if (col0 + 8 * j < K) *reinterpret_cast<uint32_t*>(out + 8 * j + 2 * q) = word(half, j);
    }
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int slot = rows.slot[half];
    if (__all_sync(0xffffffffu, slot < 0)) continue;  // warp-uniform: no row of this warp's half
    T* out = y + (long long)(slot < 0 ? 0 : slot) * K + col0;
#pragma unroll
    for (int g = 0; g < kBlocks / 4; ++g) {
      uint32_t w[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) w[b] = col0 + 8 * (4 * g + b) < K ? word(half, 4 * g + b) : 0u;
      const uint4 v = quad_transpose(w[0], w[1], w[2], w[3], q);
      const int block = 4 * g + q;  // the block this lane now holds
      if (slot >= 0 && col0 + 8 * block < K) *reinterpret_cast<uint4*>(out + 8 * block) = v;
    }
  }
}

template <typename T, int BM>
__device__ __forceinline__ void gemm2(const TensorMap* inter_map, const TensorMap* w2_map,
                                      const void* __restrict__ topk_weights, int topk_weights_code,
                                      long long topk_weights_row_stride, const Tiles& tl, int topk, int N, int K,
                                      int weight_on_input, T* __restrict__ y) {
  using L = Tile<BM>;
  Ring ring = gemm2_ring<BM>(inter_map, w2_map);
  HeldRows<L::kStages> held;
  const int run = tl.gemm2_block_run;
  for_each_tile(
      tl, (K + kBN - 1) / kBN, BM,
      [&](const TileCoord& c) {
        float acc[L::kAccs];
        if (!both_roles<T, BM, false>(
                [&] { gemm2_produce<T, BM>(inter_map, w2_map, N, c, tl.l2_hints, run > 1, held, ring); },
                (N + kStageK<T> - 1) / kStageK<T>, ring, acc))
          return;
        const auto rows = gemm2_weight_rows(row_slots<BM>(tl, c), topk_weights, topk_weights_code,
                                            topk_weights_row_stride, topk, weight_on_input);
        gemm2_store<T, BM>(acc, rows, c, K, y, [](float a, float w, int) { return a * w; });
      },
      run);
}

// ---- FP8 (e4m3) W8A8 GEMMs: the same main loops over e4m3 operands (wgmma ... e4m3, 128 of K
// per stage), with the semantics of the SIMT FP8 kernels (cuda/common/fp8_moe.cuh).
// Per-tensor and per-channel scales are applied in the epilogues; 128x128 block scales at
// each stage's promotion (BlockStageScales), and GEMM1 then quantizes the intermediate in
// 1 x 128 groups itself, each group's absmax taken over one CTA tile's columns.

// Pulls the line holding *p into L1 (no register written).
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// Per-channel weight scales of a thread's accumulator columns: s[j] = base[col * stride] and
// base[(col + 1) * stride] for col = col0 + 8 j + 2 (lane & 3), its column pair in n8 block j
// (0 where col >= limit), read-only loads issued together. Contiguous and 8-byte aligned
// scales take one 8-byte load per pair at fixed offsets from one address. Reading them per
// value in the store loop instead (one load per value and row half, in dependent batches)
// made the fp8_channel GEMM2 4x slower than the per-tensor one (benches/NOTES.md
// "fp8_channel GEMM2").
template <int kBlocks>
__device__ __forceinline__ void load_column_pairs(float (&s)[kBlocks][2], const float* __restrict__ base,
                                                  long long stride, int col0, int limit) {
  const int c = col0 + 2 * (threadIdx.x & 3);
  if (stride == 1 && (reinterpret_cast<uintptr_t>(base + c) & 7u) == 0) {
    const float2* p = reinterpret_cast<const float2*>(base + c);
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
      const float2 v = c + 8 * j < limit ? __ldg(p + 4 * j) : make_float2(0.f, 0.f);
      s[j][0] = v.x;
      s[j][1] = v.y;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
    const int col = c + 8 * j;
#pragma unroll
    for (int e = 0; e < 2; ++e) s[j][e] = col < limit ? __ldg(base + (long long)(col + e) * stride) : 0.f;
  }
}

// acc[4 (a0 + j) + a] *= s[j][a & 1]: a block's 4 accumulators are its pair in two row halves.
template <int kBlocks, int kAccs>
__device__ __forceinline__ void apply_column_pairs(float (&acc)[kAccs], const float (&s)[kBlocks][2], int a0) {
  static_assert(4 * kBlocks <= kAccs, "4 accumulators per n8 block");
#pragma unroll
  for (int j = 0; j < kBlocks; ++j)
#pragma unroll
    for (int a = 0; a < 4; ++a) acc[4 * (a0 + j) + a] *= s[j][a & 1];
}

// The scales an FP8 wgmma GEMM reads (`WgmmaFp8Scales` in src/cuda/launch.rs, by value).
struct WgmmaFp8Scales {
  const float* x_scale;      // GEMM1: the input's scales, per token [M] (per tensor: all equal)
                             // or per token and group of 128 [M, x_groups] (block)
  const float* w_scale;      // w1_scale (GEMM1) or w2_scale (GEMM2)
  long long w_scale_expert;  // element strides of w_scale: per expert, per row (per channel;
  long long w_scale_row;     // block: per row of blocks) and per column of blocks (block)
  const float* a2_static;    // the static intermediate scale, or nullptr (dynamic)
  float* inter_amax;         // the intermediate's absmax as float bits: per tensor [0], per channel
                             // [slot]; block: its group scales [sorted position, inter_groups]
                             // (GEMM1 writes them, GEMM2 reads them)
  long long w_scale_col;
  int x_groups;              // groups of 128 of K (block)
  int inter_groups;          // groups of 128 of N (block)
  int w_scale_rows;          // rows of blocks of w_scale (block)
};
static_assert(sizeof(WgmmaFp8Scales) == 72 && offsetof(WgmmaFp8Scales, inter_amax) == 40 &&
                  offsetof(WgmmaFp8Scales, w_scale_col) == 48 && offsetof(WgmmaFp8Scales, x_groups) == 56 &&
                  offsetof(WgmmaFp8Scales, w_scale_rows) == 64,
              "the layout src/cuda/launch.rs passes");

// The column-group scales of a block-scaled weight: row of blocks `group` (clamped to the
// last one: a group past it holds only columns past the end, which are dropped).
__device__ __forceinline__ const float* block_col_scales(const WgmmaFp8Scales& sc, const float* ws, int group) {
  return ws + (long long)min(group, sc.w_scale_rows - 1) * sc.w_scale_row;
}

// The block-scaled GEMM1's epilogue: inter_q[p, j] = e4m3(act(g) * u / s) and s =
// group_scale(absmax of the row's 128 columns) into inter_s[p, block] (the CTA tile's 128
// inter columns are one group: N is a multiple of 128). At BM = 128 a warpgroup holds its
// rows' 128 columns (4 lanes); at BM = 64 the two warpgroups hold 64 each, and exchange
// their row maxima through shared memory (`row_max`, one buffer per tile parity, so that one
// barrier per tile separates a buffer's writes from its previous reads). `acc` holds the
// activated values in place of the gate accumulators (activate_gate_up): row half h's value
// pair j is acc[4j + 2h], acc[4j + 2h + 1]. Rows past the tile's expert are computed as any
// other (their maxima and values only reach their own rows) and dropped at the stores.
template <int BM>
__device__ __forceinline__ void fp8_gemm1_block_store(const float (&acc)[Tile<BM>::kAccs], const Frag<BM>& f,
                                                      const TileCoord& c, int N, int inter_groups, int parity,
                                                      uint8_t* __restrict__ inter_q, float* __restrict__ inter_s) {
  constexpr int kPairs = Tile<BM>::kWgN / 16;  // value pairs per thread and row (the gate blocks)
  const int col0 = c.block * (kBN / 2) + Tile<BM>::gemm1_col_base(f.cw);
  unsigned m[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    unsigned a = 0u;
#pragma unroll
    for (int j = 0; j < kPairs; ++j)
      a = max(a, max(__float_as_uint(finite_abs(acc[4 * j + 2 * half])),
                     __float_as_uint(finite_abs(acc[4 * j + 2 * half + 1]))));
    a = max(a, __shfl_xor_sync(0xffffffffu, a, 1));
    m[half] = max(a, __shfl_xor_sync(0xffffffffu, a, 2));
  }
  if constexpr (BM == 64) {
    __shared__ unsigned row_max[2][2][64];  // [tile parity][warpgroup][tile row]
#pragma unroll
    for (int half = 0; half < 2; ++half) row_max[parity][f.cw][f.row0 + 8 * half] = m[half];
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory");  // the consumer warpgroups
#pragma unroll
    for (int half = 0; half < 2; ++half) m[half] = max(m[half], row_max[parity][f.cw ^ 1][f.row0 + 8 * half]);
  }
  const Gemm1OutRows rows = gemm1_out_rows(f, c, inter_q, N, col0);
  float s[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    s[half] = fp8_group_scale(__uint_as_float(m[half]));
    const int p = c.start + (rows.valid[half] ? f.row0 + 8 * half : 0);
    if (rows.valid[half] && (f.lane & 3) == 0 && (BM == 128 || f.cw == 0))
      inter_s[(long long)p * inter_groups + c.block] = s[half];
  }
  auto word = [&](int half, int b) { return e4m3_pairs_word(acc, half, b, s[half], 0.f, false); };
  // Narrow stores on every tile: the wide ones measured slower here (a 16-byte spill in the
  // t128 kernel; qwen3-30b-a3b M = 1024 253-257 -> 266-269 µs, deepseek-v3-tp8 M = 4096 +5 µs;
  // benches/NOTES.md "GEMM1 16-byte stores").
  gemm1_store_rows<true, kPairs / 2>(word, rows, N - col0, /*wide=*/false, f.lane & 3);
}

// GEMM1: inter[p, j] = act(g) * u, g and u dequantized by the input's and w1's scales.
// kQ8 (per tensor, static a2_scale): writes the e4m3 intermediate quantized with a2_scale.
// Block scales: writes the e4m3 intermediate and its 1 x 128 group scales
// (fp8_gemm1_block_store). Otherwise it writes it in f32 and folds |inter| into inter_amax
// (per tensor: element 0, per channel: the slot's), which the quantize-intermediate kernel
// turns into the dynamic scale.
// The consumer warpgroups' side of one tile (the CTA's `tile_index`-th): main loop and epilogue.
template <int SCHEME, int BM, bool kQ8, bool kGatherA, bool kGroup>
__device__ __forceinline__ void fp8_gemm1_tile(const WgmmaFp8Scales& sc,
                                               const void* __restrict__ topk_weights, int topk_weights_code,
                                               long long topk_weights_row_stride, const Tiles& tl, int topk, int N,
                                               int K, int act, int weight_on_input, void* __restrict__ inter,
                                               const TileCoord& c, int tile_index, Ring& ring) {
#ifdef SWAPMOE_SM90A  // consume_fp8 is sm_90a code
  static_assert(!kQ8 || SCHEME == kQTensor, "a static intermediate scale is per tensor");
  using L = Tile<BM>;
  using E4 = __nv_fp8_e4m3;
  float acc[L::kAccs];
  const Frag<BM> f;
  const int ktiles = (K + kStageK<E4> - 1) / kStageK<E4>;
  if constexpr (SCHEME == kQBlock) {
    // Rows past the tile's expert take row 0's scales (their sums are dropped).
    BlockStageScales bs;
    const float* ws = sc.w_scale + (long long)c.expert * sc.w_scale_expert;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = f.row0 + half * 8;
      const int token = tl.sorted_slots[c.start + (r < c.count ? r : 0)] / topk;
      bs.row[half] = sc.x_scale + (long long)token * sc.x_groups;
    }
    bs.col[0] = block_col_scales(sc, ws, c.block);               // gate rows j0 ..
    bs.col[1] = block_col_scales(sc, ws, N / kFp8Block + c.block);  // up rows N + j0 ..
    bs.col_stride = sc.w_scale_col;
    consume_fp8<BM, kGatherA>(ktiles, ring, acc, bs);
  } else {
    consume_fp8<BM, kGatherA>(ktiles, ring, acc, NoStageScales{});
  }
  const int col0 = c.block * (kBN / 2) + L::gemm1_col_base(f.cw);
  constexpr int kGateBlocks = L::kWgN / 16;
  if constexpr (SCHEME == kQBlock) {
    float w[2];
    input_router_weights(weight_on_input, topk_weights, topk_weights_code, topk_weights_row_stride, topk,
                         row_slots<BM, !kGroup>(tl, c), w);
    constexpr float kNoScale[2] = {1.f, 1.f};  // the block scales are in acc already
    activate_gate_up<kGateBlocks>(acc, kNoScale, w, act);
    fp8_gemm1_block_store<BM>(acc, f, c, N, sc.inter_groups, tile_index & 1, static_cast<uint8_t*>(inter),
                              sc.inter_amax);
    return;
  }
  const float* ws = sc.w_scale + (long long)c.expert * sc.w_scale_expert;
  // The loads of the epilogue in two rounds (as GEMM2's, "GEMM2 epilogue loads"): the rows'
  // slots with w1's per-tensor scale or all of its per-channel gate and up scales, then each
  // row's input scale (and router weight where it applies to the input).
  const RowSlots slots = row_slots<BM, !kGroup>(tl, c);
  const float w1_tensor = SCHEME == kQTensor ? __ldg(ws) : 1.f;
  if constexpr (SCHEME == kQChannel) {  // gate blocks: rows col of w1; up blocks: rows N + col
    float gate_s[kGateBlocks][2], up_s[kGateBlocks][2];
    load_column_pairs<kGateBlocks>(gate_s, ws, sc.w_scale_row, col0, N);
    load_column_pairs<kGateBlocks>(up_s, ws + (long long)N * sc.w_scale_row, sc.w_scale_row, col0, N);
    apply_column_pairs<kGateBlocks>(acc, gate_s, 0);
    apply_column_pairs<kGateBlocks>(acc, up_s, kGateBlocks);
  }
  float row_xs[2], row_w[2];
#pragma unroll
  for (int half = 0; half < 2; ++half)
    row_xs[half] = slots.slot[half] >= 0 ? __ldg(sc.x_scale + slots.slot[half] / topk) : 0.f;
  input_router_weights(weight_on_input, topk_weights, topk_weights_code, topk_weights_row_stride, topk, slots, row_w);
  float q_inv = 1.f;  // kQ8: 1 / a2_scale
  if constexpr (kQ8) q_inv = __frcp_rn(*sc.a2_static);
  // Every value first (activate_gate_up), then the stores. Rows past the tile's expert have
  // xs = 0; per channel w1's scales are in acc already.
  const float row_s[2] = {row_xs[0] * w1_tensor, row_xs[1] * w1_tensor};
  activate_gate_up<kGateBlocks>(acc, row_s, row_w, act);
  if constexpr (kQ8) {
    // The e4m3 pairs are converted with no condition around them (gemm1_store_rows predicates
    // only the stores: rows past the tile's expert, columns past N); with the conversions
    // inside the stores' conditions each pair sat in its own branch.
    auto word = [&](int half, int b) { return e4m3_pairs_word(acc, half, b, 0.f, q_inv, true); };
    // N is a multiple of 16: a 16-column piece is whole or past N
    const bool wide = c.count >= kWideStoreMinRows<BM>;  // CTA-uniform
    const Gemm1OutRows rows = gemm1_out_rows(f, c, static_cast<uint8_t*>(inter), N, col0);
    gemm1_store_rows<true, kGateBlocks / 2>(word, rows, N - col0, wide, f.lane & 3);
    return;
  }
  unsigned amax = 0u;  // per tensor: this thread's |inter| as float bits
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = f.row0 + half * 8;
    const bool valid = r < c.count;
    unsigned row_amax = 0u;
    const int slot = valid ? slots.slot[half] : 0;
    if (valid) {
      const int p = c.start + r;
#pragma unroll
      for (int j = 0; j < kGateBlocks; ++j) {
        const int col = col0 + f.col(j);  // even; N is a multiple of 16, so col + 1 < N too
        if (col >= N) continue;
        const float a0 = acc[4 * j + 2 * half], a1 = acc[4 * j + 2 * half + 1];
        *reinterpret_cast<float2*>(static_cast<float*>(inter) + (long long)p * N + col) = make_float2(a0, a1);
        row_amax = max(row_amax, max(__float_as_uint(finite_abs(a0)), __float_as_uint(finite_abs(a1))));
      }
    }
    if constexpr (!kQ8 && SCHEME == kQChannel) {
      // The 4 lanes that hold a row's columns; then one atomic per row and warp.
      row_amax = max(row_amax, __shfl_xor_sync(0xffffffffu, row_amax, 1));
      row_amax = max(row_amax, __shfl_xor_sync(0xffffffffu, row_amax, 2));
      if (valid && (f.lane & 3) == 0 && row_amax)
        atomicMax(reinterpret_cast<unsigned*>(sc.inter_amax) + slot, row_amax);
    }
    amax = max(amax, row_amax);
  }
  if constexpr (!kQ8 && SCHEME == kQTensor) {
    amax = __reduce_max_sync(0xffffffffu, amax);
    if (f.lane == 0 && amax) atomicMax(reinterpret_cast<unsigned*>(sc.inter_amax), amax);
  }
#endif
}

// kGatherA: the producer gathers the tile's rows of xq (cp.async); otherwise they were
// gathered into sorted order before (wgmma_moe_gather over xq) and come by TMA (xs_map).
template <int SCHEME, int BM, bool kQ8, bool kGatherA, bool kGroup>
__device__ __forceinline__ void fp8_gemm1(const uint8_t* __restrict__ xq, long long xq_row, const TensorMap* xs_map,
                                          const TensorMap* w1_map, WgmmaFp8Scales sc,
                                          const void* __restrict__ topk_weights, int topk_weights_code,
                                          long long topk_weights_row_stride, const Tiles& tl, int topk, int N, int K,
                                          int act, int weight_on_input, void* __restrict__ inter) {
  Ring ring = gemm1_ring<BM, kGatherA>(xs_map, w1_map);
  int tiles_done = 0;  // the consumers' count of this CTA's tiles (the block epilogue's parity)
  fp8_roles(
      tl, (N + kBN / 2 - 1) / (kBN / 2), BM,
      [&](const TileCoord& c) {
        gemm1_produce<__nv_fp8_e4m3, BM, kGatherA>(reinterpret_cast<const __nv_fp8_e4m3*>(xq), xq_row, xs_map,
                                                   w1_map, tl, topk, N, K, c, ring);
      },
      [&](const TileCoord& c) {
        fp8_gemm1_tile<SCHEME, BM, kQ8, kGatherA, kGroup>(sc, topk_weights, topk_weights_code,
                                                          topk_weights_row_stride, tl, topk, N, K, act,
                                                          weight_on_input, inter, c, tiles_done++, ring);
      });
}

// inter_q[p, :] = e4m3(inter[p, :]) with the dynamic scale of GEMM1's absmax (per tensor:
// one; per channel: the row's slot's), as SIMT GEMM2 quantizes its rows (load_inter_q).
// One CTA of kQuantInterThreads per sorted row; 4 columns per thread and step.
constexpr int kQuantInterThreads = 128;  // `WGMMA_QUANT_INTER_THREADS`
template <int SCHEME>
__device__ __forceinline__ void fp8_quant_inter(const float* __restrict__ inter, const float* __restrict__ inter_amax,
                                                const int* __restrict__ sorted_slots,
                                                const int* __restrict__ expert_offsets, int local_experts, int N,
                                                uint8_t* __restrict__ inter_q) {
  const int p = blockIdx.x;
  if (p >= expert_offsets[local_experts]) return;
  const float s = inter_scale<SCHEME>(inter_amax, nullptr, SCHEME == kQChannel ? sorted_slots[p] : 0, 0, 1);
  const float inv = SCHEME == kQTensor ? __frcp_rn(s) : 0.f;
  const float* src = inter + (long long)p * N;
  uint8_t* dst = inter_q + (long long)p * N;
  for (int c = threadIdx.x * 4; c < N; c += kQuantInterThreads * 4) {
    const float4 v = *reinterpret_cast<const float4*>(src + c);
    const bool t = SCHEME == kQTensor;
    *reinterpret_cast<unsigned*>(dst + c) = (unsigned)fp8_quantize(v.x, s, inv, t) |
                                            ((unsigned)fp8_quantize(v.y, s, inv, t) << 8) |
                                            ((unsigned)fp8_quantize(v.z, s, inv, t) << 16) |
                                            ((unsigned)fp8_quantize(v.w, s, inv, t) << 24);
  }
}

#ifdef SWAPMOE_SM90A
// A per-tensor or per-channel FP8 GEMM2 tile's main loop (consume_fp8, no stage scales) with
// its rows' router-weight bits loaded during it (kRouterWeightStage; after it for a tile with
// no such stage). Where the weights apply to the input the bits stay 0 and nothing is loaded.
template <int BM>
__device__ __forceinline__ RouterWeightBits<2> consume_fp8_loading_router_weights(
    int ktiles, Ring& ring, float (&acc)[Tile<BM>::kAccs], const RowSlots& slots,
    const void* __restrict__ topk_weights, int topk_weights_code, long long topk_weights_row_stride, int topk,
    int weight_on_input) {
  RouterWeightBits<2> bits{};
  auto load = [&] {
    if (!weight_on_input)
      bits = load_router_weight_bits<2>(topk_weights, topk_weights_code, topk_weights_row_stride, topk, slots.slot);
  };
  consume_fp8<BM, false>(ktiles, ring, acc, NoStageScales{}, [&](int kt) {
    if (kt == kRouterWeightStage) load();
  });
  if (ktiles <= kRouterWeightStage) load();
  return bits;
}
#endif

// GEMM2: y[slot, r] = w(slot) * s2 * w2_scale * (inter_q[p] . w2_q[e, r]), s2 the
// intermediate's scale (static, or from the absmax), in the activation dtype. The consumer
// warpgroups' side of one tile.
template <typename T, int SCHEME, int BM>
__device__ __forceinline__ void fp8_gemm2_tile(const WgmmaFp8Scales& sc, const void* __restrict__ topk_weights,
                                               int topk_weights_code, long long topk_weights_row_stride,
                                               const Tiles& tl, int topk, int N, int K, int weight_on_input,
                                               T* __restrict__ y, const TileCoord& c, Ring& ring) {
#ifdef SWAPMOE_SM90A  // consume_fp8 is sm_90a code
  using L = Tile<BM>;
  float acc[L::kAccs];
  const int ktiles = (N + kStageK<__nv_fp8_e4m3> - 1) / kStageK<__nv_fp8_e4m3>;
  if constexpr (SCHEME == kQBlock) {
    // Rows: the intermediate's group scales at the tile's sorted positions (rows past the
    // tile's expert take row 0's). Column groups of 128 output columns: BM = 64, the
    // warpgroup's 128 columns; BM = 128, the two halves of 256.
    const Frag<BM> f;
    const float* ws = sc.w_scale + (long long)c.expert * sc.w_scale_expert;
    BlockStageScales bs;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = f.row0 + half * 8;
      bs.row[half] = sc.inter_amax + (long long)(c.start + (r < c.count ? r : 0)) * sc.inter_groups;
    }
    const int group0 = (c.block * kBN + L::gemm2_col_base(f.cw)) / kFp8Block;
    bs.col[0] = block_col_scales(sc, ws, group0);
    bs.col[1] = block_col_scales(sc, ws, BM == 128 ? group0 + 1 : group0);
    bs.col_stride = sc.w_scale_col;
    // The router weights load after the main loop here (kRouterWeightStage says why).
    const RowSlots slots = row_slots<BM>(tl, c);  // issued before the main loop (row_slots)
    consume_fp8<BM, false>(ktiles, ring, acc, bs);
    const auto rows =
        gemm2_weight_rows(slots, topk_weights, topk_weights_code, topk_weights_row_stride, topk, weight_on_input);
    gemm2_store<T, BM>(acc, rows, c, K, y, [](float a, float w, int) { return a * w; });
    return;
  }
  const float* ws = sc.w_scale + (long long)c.expert * sc.w_scale_expert;
  // Per channel: w2's scales of the warpgroup's output columns are pulled into L1 before the
  // main loop, then multiplied into acc after it. (Held in registers across the loop instead,
  // they spilled 320 bytes a thread at BM = 128; the prefetch gained 0.6-2% on the whole op.)
  const Frag<BM> f;
  const int col0 = c.block * kBN + L::gemm2_col_base(f.cw);
  if constexpr (SCHEME == kQChannel) {
    const int col = col0 + f.lane * (L::kWgN / 32);
    if (((threadIdx.x >> 5) & 3) == 0 && col < K) prefetch_l1(ws + (long long)col * sc.w_scale_row);
  }
  // Issued before the main loop, used after it (row_slots): the slots, and per tensor w2's
  // scale and the intermediate's (static, or its absmax: GEMM1 has finished, as this kernel is
  // launched without PDL).
  const RowSlots slots = row_slots<BM>(tl, c);
  float w2_tensor = 1.f, s2_raw = 1.f;
  if constexpr (SCHEME == kQTensor) {
    w2_tensor = __ldg(ws);
    s2_raw = __ldg(sc.a2_static ? sc.a2_static : sc.inter_amax);
  }
  const auto weight_bits =
      consume_fp8_loading_router_weights<BM>(ktiles, ring, acc, slots, topk_weights, topk_weights_code,
                                             topk_weights_row_stride, topk, weight_on_input);
  // One round of loads after the main loop: per channel w2's scales, all of them (the
  // promotion's registers are free now; in batches of 8 blocks each batch was one more
  // round, "GEMM2 epilogue loads") and each row's intermediate absmax.
  constexpr int kBlocks = L::kWgN / 8;
  float w2_pairs[SCHEME == kQChannel ? kBlocks : 1][2];
  float row_amax[2] = {0.f, 0.f};
  if constexpr (SCHEME == kQChannel) {
    load_column_pairs<kBlocks>(w2_pairs, ws, sc.w_scale_row, col0, K);
#pragma unroll
    for (int half = 0; half < 2; ++half)
      row_amax[half] = slots.slot[half] >= 0 ? __ldg(sc.inter_amax + slots.slot[half]) : 0.f;
  }
  Gemm2Rows<float> rows = gemm2_weight_rows(slots, weight_bits, topk_weights_code, weight_on_input);
  // Per tensor: one scalar rather than a copy per row (216 fewer instructions in the t128
  // kernel, SASS).
  const float s2w2_tensor = (sc.a2_static ? s2_raw : fp8_dynamic_scale(s2_raw)) * w2_tensor;
  if constexpr (SCHEME == kQChannel) apply_column_pairs<kBlocks>(acc, w2_pairs, 0);
  // Each row's factor once: the intermediate's scale (per channel the row's; per tensor times
  // w2's) times the router weight, so each value takes one multiply here.
#pragma unroll
  for (int half = 0; half < 2; ++half)
    rows.rv[half] *= SCHEME == kQTensor ? s2w2_tensor : fp8_dynamic_scale(row_amax[half]);
  gemm2_store<T, BM>(acc, rows, c, K, y, [](float a, float factor, int) { return a * factor; });
#endif
}

template <typename T, int SCHEME, int BM>
__device__ __forceinline__ void fp8_gemm2(const TensorMap* inter_map, const TensorMap* w2_map, WgmmaFp8Scales sc,
                                          const void* __restrict__ topk_weights, int topk_weights_code,
                                          long long topk_weights_row_stride, const Tiles& tl, int topk, int N, int K,
                                          int weight_on_input, T* __restrict__ y) {
  Ring ring = gemm2_ring<BM>(inter_map, w2_map);
  HeldRows<Tile<BM>::kStages> held;
  const int run = tl.gemm2_block_run;
  fp8_roles(
      tl, (K + kBN - 1) / kBN, BM,
      [&](const TileCoord& c) {
        gemm2_produce<__nv_fp8_e4m3, BM>(inter_map, w2_map, N, c, tl.l2_hints, run > 1, held, ring);
      },
      [&](const TileCoord& c) {
        fp8_gemm2_tile<T, SCHEME, BM>(sc, topk_weights, topk_weights_code, topk_weights_row_stride, tl, topk, N, K,
                                      weight_on_input, y, c, ring);
      },
      run);
}

// out[t, c .. c + 8) = sum over k, in k order, of y[t * topk + k, c .. c + 8) for the slots
// of local experts (slot_expert >= 0), as 16-byte loads (K a multiple of 8).
template <typename T>
__device__ __forceinline__ void topk_reduce(const T* __restrict__ y, const int* __restrict__ slot_expert, int topk,
                                            int K, T* __restrict__ out, long long out_row_stride) {
  pdl_launch_dependents();
  const int t = blockIdx.y;
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (c >= K) return;
  float s[8] = {};
  const long long first = (long long)t * topk;
  constexpr int kChunk = 8;  // slots whose experts, then values, are loaded together
  for (int k0 = 0; k0 < topk; k0 += kChunk) {
    int ex[kChunk];
    uint4 v[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) ex[i] = k0 + i < topk ? slot_expert[first + k0 + i] : -1;
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      v[i] = ex[i] >= 0 ? *reinterpret_cast<const uint4*>(y + (first + k0 + i) * K + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (ex[i] < 0) continue;
      const T* e = reinterpret_cast<const T*>(&v[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) s[j] += to_f32(e[j]);
    }
  }
  T* o = out + (long long)t * out_row_stride + c;
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = from_f32<T>(s[j]);
}

// xs[p, :] = x[sorted_slots[p] / topk, :] for the sorted positions of local experts, as
// 16-byte vectors (row bytes a multiple of 16). One CTA per position.
__device__ __forceinline__ void gather_rows(const uint4* __restrict__ x, long long x_row_vectors,
                                            const int* __restrict__ sorted_slots,
                                            const int* __restrict__ expert_offsets, int local_experts, int topk,
                                            int row_vectors, uint4* __restrict__ xs) {
  const int p = blockIdx.x;
  if (p >= expert_offsets[local_experts]) return;
  const uint4* src = x + (long long)(sorted_slots[p] / topk) * x_row_vectors;
  uint4* dst = xs + (long long)p * row_vectors;
  for (int i = threadIdx.x; i < row_vectors; i += kPreGatherThreads) dst[i] = src[i];
}

}  // namespace
}  // namespace swapmoe

extern "C" __global__ void __launch_bounds__(swapmoe::kPreGatherThreads)
    wgmma_moe_gather(const uint4* x, long long x_row_vectors, const int* sorted_slots, const int* expert_offsets,
                     int local_experts, int topk, int row_vectors, uint4* xs) {
  swapmoe::gather_rows(x, x_row_vectors, sorted_slots, expert_offsets, local_experts, topk, row_vectors, xs);
}

// GEMM1 in both A modes: ..._t<BM> gathers in the kernel, ..._t<BM>_xs reads the gathered xs;
// ..._t<BM>_ga gathers in the kernel after grouping the slots itself (`Plan::align_in_gemm1`).
#define SWAPMOE_WGMMA_TILES                                                                                       \
  const int *expert_offsets, const int *sorted_slots, const int *tile_expert, const int *tile_start,             \
      const int *num_tiles, int tiles_bound, int raster_group, int l2_hints, int gemm2_block_run
#define SWAPMOE_WGMMA_MAKE_TILES                                                                                  \
  const swapmoe::Tiles tl{expert_offsets, sorted_slots, tile_expert, tile_start, num_tiles, tiles_bound,         \
                          raster_group, l2_hints, gemm2_block_run}

#define SWAPMOE_WGMMA_GEMM1(NAME, T, BM, GATHER, GROUP)                                                           \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1) NAME(                                       \
      const T* x, long long x_row_stride, const __grid_constant__ swapmoe::TensorMap xs_map,                      \
      const __grid_constant__ swapmoe::TensorMap w1_map, const void* topk_weights, int topk_weights_code,         \
      long long topk_weights_row_stride, SWAPMOE_WGMMA_TILES, int topk, int N, int K, int act,                    \
      int weight_on_input, T* inter, swapmoe::CtaAlign align) {                                                   \
    SWAPMOE_WGMMA_MAKE_TILES;                                                                                     \
    const swapmoe::Tiles tiles = swapmoe::gemm1_tiles<BM, GATHER, GROUP>(tl, align, topk, &xs_map, &w1_map);      \
    swapmoe::gemm1_act<T, BM, GATHER, GROUP>(x, x_row_stride, &xs_map, &w1_map, topk_weights, topk_weights_code,  \
                                             topk_weights_row_stride, tiles, topk, N, K, act, weight_on_input,    \
                                             inter);                                                              \
  }

#define SWAPMOE_WGMMA_INSTANTIATE(SUFFIX, T, BM)                                                                  \
  SWAPMOE_WGMMA_GEMM1(wgmma_moe_gemm1_act_##SUFFIX##_t##BM, T, BM, true, false)                                   \
  SWAPMOE_WGMMA_GEMM1(wgmma_moe_gemm1_act_##SUFFIX##_t##BM##_xs, T, BM, false, false)                             \
  SWAPMOE_WGMMA_GEMM1(wgmma_moe_gemm1_act_##SUFFIX##_t##BM##_ga, T, BM, true, true)                               \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1) wgmma_moe_gemm2_##SUFFIX##_t##BM(            \
      const __grid_constant__ swapmoe::TensorMap inter_map, const __grid_constant__ swapmoe::TensorMap w2_map,    \
      const void* topk_weights, int topk_weights_code, long long topk_weights_row_stride, SWAPMOE_WGMMA_TILES,    \
      int topk, int N, int K, int weight_on_input, T* y) {                                                        \
    SWAPMOE_WGMMA_MAKE_TILES;                                                                                     \
    swapmoe::gemm2<T, BM>(&inter_map, &w2_map, topk_weights, topk_weights_code, topk_weights_row_stride, tl,      \
                          topk, N, K, weight_on_input, y);                                                        \
  }

#define SWAPMOE_WGMMA_REDUCE(SUFFIX, T)                                                                           \
  extern "C" __global__ void __launch_bounds__(swapmoe::kReduceThreads) wgmma_moe_topk_reduce_##SUFFIX(           \
      const T* y, const int* slot_expert, int topk, int K, T* out, long long out_row_stride) {                    \
    swapmoe::topk_reduce<T>(y, slot_expert, topk, K, out, out_row_stride);                                        \
  }

SWAPMOE_WGMMA_REDUCE(bf16, __nv_bfloat16)
SWAPMOE_WGMMA_REDUCE(f16, __half)
SWAPMOE_WGMMA_INSTANTIATE(bf16, __nv_bfloat16, 64)
SWAPMOE_WGMMA_INSTANTIATE(bf16, __nv_bfloat16, 128)
SWAPMOE_WGMMA_INSTANTIATE(f16, __half, 64)
SWAPMOE_WGMMA_INSTANTIATE(f16, __half, 128)

// FP8 W8A8: wgmma_moe_fp8_gemm1_{tensor,channel}_t<BM> (f32 intermediate and its absmax),
// wgmma_moe_fp8_gemm1_tensor_q8_t<BM> (e4m3 intermediate, static a2_scale),
// wgmma_moe_fp8_gemm1_block_t<BM> (128x128 blocks: e4m3 intermediate and its group scales),
// wgmma_moe_fp8_quant_inter_{tensor,channel}, and wgmma_moe_fp8_gemm2_{bf16,f16}_{scheme}_t<BM>.
// Token tiles 64 and 128 (`WGMMA_FP8_TOKEN_TILES`); the consumers run with 232 registers
// per thread (setmaxnreg) for the promotion's accumulators (consume_fp8).
// GEMM1 in both A modes: ..._t<BM> gathers the rows of xq in the kernel, ..._t<BM>_xs reads
// them gathered before (xs_map); ..._t<BM>_ga gathers them and groups the slots itself.
#define SWAPMOE_WGMMA_FP8_GEMM1_ONE(NAME, SCHEME, BM, Q8, GATHER, GROUP)                                          \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1) NAME(                                       \
      const uint8_t* xq, long long xq_row, const __grid_constant__ swapmoe::TensorMap xs_map,                     \
      const __grid_constant__ swapmoe::TensorMap w1_map, swapmoe::WgmmaFp8Scales scales, const void* topk_weights, \
      int topk_weights_code, long long topk_weights_row_stride, SWAPMOE_WGMMA_TILES, int topk, int N, int K,      \
      int act, int weight_on_input, void* inter, swapmoe::CtaAlign align) {                                       \
    SWAPMOE_WGMMA_MAKE_TILES;                                                                                     \
    const swapmoe::Tiles tiles = swapmoe::gemm1_tiles<BM, GATHER, GROUP>(tl, align, topk, &xs_map, &w1_map);      \
    swapmoe::fp8_gemm1<SCHEME, BM, Q8, GATHER, GROUP>(xq, xq_row, &xs_map, &w1_map, scales, topk_weights,         \
                                                      topk_weights_code, topk_weights_row_stride, tiles, topk, N, \
                                                      K, act, weight_on_input, inter);                            \
  }
#define SWAPMOE_WGMMA_FP8_GEMM1(NAME, SCHEME, BM, Q8)                                                             \
  SWAPMOE_WGMMA_FP8_GEMM1_ONE(NAME, SCHEME, BM, Q8, true, false)                                                  \
  SWAPMOE_WGMMA_FP8_GEMM1_ONE(NAME##_xs, SCHEME, BM, Q8, false, false)                                            \
  SWAPMOE_WGMMA_FP8_GEMM1_ONE(NAME##_ga, SCHEME, BM, Q8, true, true)
#define SWAPMOE_WGMMA_FP8_GEMM2(SUFFIX, T, NAME, SCHEME, BM)                                                      \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads, 1) wgmma_moe_fp8_gemm2_##SUFFIX##_##NAME##_t##BM( \
      const __grid_constant__ swapmoe::TensorMap inter_map, const __grid_constant__ swapmoe::TensorMap w2_map,    \
      swapmoe::WgmmaFp8Scales scales, const void* topk_weights, int topk_weights_code,                            \
      long long topk_weights_row_stride, SWAPMOE_WGMMA_TILES, int topk, int N, int K, int weight_on_input, T* y) { \
    SWAPMOE_WGMMA_MAKE_TILES;                                                                                     \
    swapmoe::fp8_gemm2<T, SCHEME, BM>(&inter_map, &w2_map, scales, topk_weights, topk_weights_code,               \
                                      topk_weights_row_stride, tl, topk, N, K, weight_on_input, y);               \
  }
#define SWAPMOE_WGMMA_FP8_TILE(BM)                                                                                \
  SWAPMOE_WGMMA_FP8_GEMM1(wgmma_moe_fp8_gemm1_tensor_t##BM, swapmoe::kQTensor, BM, false)                         \
  SWAPMOE_WGMMA_FP8_GEMM1(wgmma_moe_fp8_gemm1_channel_t##BM, swapmoe::kQChannel, BM, false)                       \
  SWAPMOE_WGMMA_FP8_GEMM1(wgmma_moe_fp8_gemm1_tensor_q8_t##BM, swapmoe::kQTensor, BM, true)                       \
  SWAPMOE_WGMMA_FP8_GEMM1(wgmma_moe_fp8_gemm1_block_t##BM, swapmoe::kQBlock, BM, false)                           \
  SWAPMOE_WGMMA_FP8_GEMM2(bf16, __nv_bfloat16, tensor, swapmoe::kQTensor, BM)                                     \
  SWAPMOE_WGMMA_FP8_GEMM2(bf16, __nv_bfloat16, channel, swapmoe::kQChannel, BM)                                   \
  SWAPMOE_WGMMA_FP8_GEMM2(f16, __half, tensor, swapmoe::kQTensor, BM)                                             \
  SWAPMOE_WGMMA_FP8_GEMM2(f16, __half, channel, swapmoe::kQChannel, BM)                                           \
  SWAPMOE_WGMMA_FP8_GEMM2(bf16, __nv_bfloat16, block, swapmoe::kQBlock, BM)                                       \
  SWAPMOE_WGMMA_FP8_GEMM2(f16, __half, block, swapmoe::kQBlock, BM)
SWAPMOE_WGMMA_FP8_TILE(64)
SWAPMOE_WGMMA_FP8_TILE(128)

#define SWAPMOE_WGMMA_FP8_QUANT_INTER(NAME, SCHEME)                                                               \
  extern "C" __global__ void __launch_bounds__(swapmoe::kQuantInterThreads) wgmma_moe_fp8_quant_inter_##NAME(     \
      const float* inter, const float* inter_amax, const int* sorted_slots, const int* expert_offsets,            \
      int local_experts, int N, uint8_t* inter_q) {                                                               \
    swapmoe::fp8_quant_inter<SCHEME>(inter, inter_amax, sorted_slots, expert_offsets, local_experts, N, inter_q); \
  }
SWAPMOE_WGMMA_FP8_QUANT_INTER(tensor, swapmoe::kQTensor)
SWAPMOE_WGMMA_FP8_QUANT_INTER(channel, swapmoe::kQChannel)
