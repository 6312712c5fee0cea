// Tensor-core fused-experts GEMMs (mma.sync m16n8k16, sm_80 and later; bf16 and fp16).
//
// Swap-AB orientation: the weight rows fill the 16-row A side of every mma and the tokens
// of one expert are the narrow N side, C^T = W . X^T. A CTA computes 128 weight rows by
// BN tokens of one expert's token tile (tiles come from swapmoe_route_align):
//   gemm1: rows [0, 64) are gate rows j0 .. j0+63 and rows [64, 128) the matching up rows,
//          so act(gate) * up is formed in registers: inter[slot, j] (no activation pass).
//   gemm2: 128 output rows of w2; y[slot, r] = router_weight * (inter[slot] . w2[e, r]).
// 8 warps: 4 along the weight rows (each takes rows [16w, 16w+16) and [64+16w, 64+16w+16),
// i.e. a gate tile and its up tile), 2 along the tokens (BN/2 tokens each).
// Operands stream through a 3-stage cp.async pipeline into XOR-swizzled shared memory
// (conflict-free ldmatrix). Rows past the end and K tails are zero-filled.
// Requirements (checked by the oracle): reduction dimension a multiple of 8 elements, rows
// 16-byte aligned.
#include "common/moe_common.cuh"

namespace swapmoe {
namespace {

constexpr int kBM = 128;    // weight rows per CTA
constexpr int kBK = 64;     // reduction elements per stage (128 bytes per row)
constexpr int kStages = 3;  // cp.async pipeline depth
constexpr int kThreads = 256;

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;  // 0: zero-fill the 16 bytes
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                            unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                                        unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                                 unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of (row, 16-byte chunk) in a [rows][kBK] tile with the XOR swizzle.
__device__ __forceinline__ unsigned swz(int row, int chunk) {
  return (unsigned)(row * (kBK * 2) + ((chunk ^ (row & 7)) << 4));
}

// The shared main loop. `wrow(i)` gives the global address of weight row i of the CTA's
// 128 rows (nullptr when the row does not exist); `brow(j)` that of token row j (nullptr
// past the tile). Accumulates acc[tile 0/1][n8 tile][4] for this warp.
template <typename T, int BN, typename WRow, typename BRow>
__device__ __forceinline__ void mainloop(int Kdim, WRow wrow, BRow brow, unsigned char* smem,
                                         float (&acc)[2][BN / 16][4]) {
  constexpr int kNT = BN / 16;  // n8 tiles per warp (2 warps along tokens)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp & 3, wn = warp >> 2;
  constexpr int kABytes = kBM * kBK * 2, kBBytes = BN * kBK * 2;
  unsigned char* a_s = smem;
  unsigned char* b_s = smem + kStages * kABytes;
  const int ktiles = (Kdim + kBK - 1) / kBK;

  // Per-thread load assignments (fixed across stages): 16-byte chunks.
  constexpr int kAChunks = kBM * 8 / kThreads;            // 4
  constexpr int kBChunks = (BN * 8 + kThreads - 1) / kThreads;
  const T* a_src[kAChunks];
  unsigned a_dst[kAChunks];
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int idx = tid + i * kThreads, row = idx >> 3, chunk = idx & 7;
    const T* base = wrow(row);
    a_src[i] = base ? base + chunk * 8 : nullptr;
    a_dst[i] = swz(row, chunk);
  }
  const T* b_src[kBChunks];
  unsigned b_dst[kBChunks];
#pragma unroll
  for (int i = 0; i < kBChunks; ++i) {
    const int idx = tid + i * kThreads, row = idx >> 3, chunk = idx & 7;
    const T* base = (idx < BN * 8) ? brow(row) : nullptr;
    b_src[i] = base ? base + chunk * 8 : nullptr;
    b_dst[i] = (idx < BN * 8) ? swz(row, chunk) : 0xffffffffu;
  }
  auto load_stage = [&](int kt, int stage) {
    const int k0 = kt * kBK;
    const unsigned a_base = smem_u32(a_s + stage * kABytes), b_base = smem_u32(b_s + stage * kBBytes);
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      const int kk = k0 + ((tid + i * kThreads) & 7) * 8;
      const bool ok = a_src[i] != nullptr && kk < Kdim;
      cp_async_16(a_base + a_dst[i], ok ? a_src[i] + k0 : wrow(-1), ok);
    }
#pragma unroll
    for (int i = 0; i < kBChunks; ++i) {
      if (b_dst[i] == 0xffffffffu) continue;
      const int kk = k0 + ((tid + i * kThreads) & 7) * 8;
      const bool ok = b_src[i] != nullptr && kk < Kdim;
      cp_async_16(b_base + b_dst[i], ok ? b_src[i] + k0 : wrow(-1), ok);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    {
      const int nk = kt + kStages - 1;
      if (nk < ktiles) load_stage(nk, nk % kStages);
      cp_async_commit();
    }
    const int stage = kt % kStages;
    const unsigned a_base = smem_u32(a_s + stage * kABytes), b_base = smem_u32(b_s + stage * kBBytes);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      unsigned a[2][4];
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int row = t * 64 + wm * 16 + (lane & 15);
        const int chunk = ks * 2 + (lane >> 4);
        ldmatrix_x4(a_base + swz(row, chunk), a[t][0], a[t][1], a[t][2], a[t][3]);
      }
#pragma unroll
      for (int nt = 0; nt < kNT; nt += 2) {
        // Two n8 tiles per ldmatrix.x4: lanes 0-15 address tile nt, lanes 16-31 tile nt+1.
        const int row = wn * (BN / 2) + nt * 8 + (lane & 7) + ((lane >> 4) << 3);
        const int chunk = ks * 2 + ((lane >> 3) & 1);
        unsigned b0, b1, b2, b3;
        if (kNT == 1) {
          // One n8 tile: lanes 16-31 repeat it (results of b2/b3 unused).
          const int row1 = wn * (BN / 2) + (lane & 7);
          ldmatrix_x4(b_base + swz(row1, chunk), b0, b1, b2, b3);
        } else {
          ldmatrix_x4(b_base + swz(row, chunk), b0, b1, b2, b3);
        }
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          mma16816<T>(acc[t][nt], a[t], b0, b1);
          if (nt + 1 < kNT) mma16816<T>(acc[t][nt + 1], a[t], b2, b3);
        }
      }
    }
  }
  cp_async_wait<0>();
}

// Tile lookup shared by both GEMMs.
struct TileInfo {
  int expert, start, count;
};
__device__ __forceinline__ bool load_tile(const int* __restrict__ tile_expert, const int* __restrict__ tile_start,
                                          const int* __restrict__ num_tiles, const int* __restrict__ expert_offsets,
                                          int BN, TileInfo& t) {
  const int i = blockIdx.y;
  if (i >= *num_tiles) return false;
  t.expert = tile_expert[i];
  t.start = tile_start[i];
  t.count = min(BN, expert_offsets[t.expert + 1] - t.start);
  return true;
}

template <typename T, int BN>
__device__ __forceinline__ void gemm1_act(
    const T* __restrict__ x, long long x_row_stride, const T* __restrict__ w1, long long w1_expert_stride,
    long long w1_row_stride, const void* __restrict__ topk_weights, int topk_weights_code,
    long long topk_weights_row_stride, const int* __restrict__ expert_offsets,
    const int* __restrict__ sorted_slots, const int* __restrict__ tile_expert,
    const int* __restrict__ tile_start, const int* __restrict__ num_tiles, int topk, int N, int K, int act,
    int weight_on_input, T* __restrict__ inter) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int slot_of[BN];
  TileInfo tile;
  if (!load_tile(tile_expert, tile_start, num_tiles, expert_offsets, BN, tile)) return;
  const int j0 = blockIdx.x * 64;
  for (int j = threadIdx.x; j < BN; j += kThreads)
    slot_of[j] = j < tile.count ? sorted_slots[tile.start + j] : -1;
  __syncthreads();
  const T* wexp = w1 + tile.expert * w1_expert_stride;
  auto wrow = [&](int i) -> const T* {
    if (i < 0) return w1;  // a valid address for zero-fill copies
    const int j = j0 + (i & 63);
    if (j >= N) return nullptr;
    return wexp + (long long)(j + (i >= 64 ? N : 0)) * w1_row_stride;
  };
  auto brow = [&](int r) -> const T* {
    const int s = slot_of[r];
    return s >= 0 ? x + (long long)(s / topk) * x_row_stride : nullptr;
  };
  float acc[2][BN / 16][4] = {};
  mainloop<T, BN>(K, wrow, brow, smem, acc);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp & 3, wn = warp >> 2;
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int nt = 0; nt < BN / 16; ++nt) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const int row = wm * 16 + g + ((h >> 1) << 3);   // gate row within the 64
      const int col = wn * (BN / 2) + nt * 8 + 2 * c + (h & 1);
      const int j = j0 + row;
      const int s = slot_of[col];
      if (j < N && s >= 0) {
        float gv = acc[0][nt][h], uv = acc[1][nt][h];
        if (weight_on_input) {
          const int t = s / topk, k = s - t * topk;
          const float w = load_scalar(topk_weights, topk_weights_code, (long long)t * topk_weights_row_stride + k);
          gv *= w;
          uv *= w;
        }
        inter[(long long)s * N + j] = from_f32<T>(activate(act, gv) * uv);
      }
    }
  }
}

template <typename T, int BN>
__device__ __forceinline__ void gemm2(
    const T* __restrict__ inter, const T* __restrict__ w2, long long w2_expert_stride, long long w2_row_stride,
    const void* __restrict__ topk_weights, int topk_weights_code, long long topk_weights_row_stride,
    const int* __restrict__ expert_offsets, const int* __restrict__ sorted_slots,
    const int* __restrict__ tile_expert, const int* __restrict__ tile_start, const int* __restrict__ num_tiles,
    int topk, int N, int K, int weight_on_input, float* __restrict__ y) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int slot_of[BN];
  TileInfo tile;
  if (!load_tile(tile_expert, tile_start, num_tiles, expert_offsets, BN, tile)) return;
  const int r0 = blockIdx.x * kBM;
  for (int j = threadIdx.x; j < BN; j += kThreads)
    slot_of[j] = j < tile.count ? sorted_slots[tile.start + j] : -1;
  __syncthreads();
  const T* wexp = w2 + tile.expert * w2_expert_stride;
  auto wrow = [&](int i) -> const T* {
    if (i < 0) return w2;
    const int r = r0 + i;
    return r < K ? wexp + (long long)r * w2_row_stride : nullptr;
  };
  auto brow = [&](int r) -> const T* {
    const int s = slot_of[r];
    return s >= 0 ? inter + (long long)s * N : nullptr;
  };
  float acc[2][BN / 16][4] = {};
  mainloop<T, BN>(N, wrow, brow, smem, acc);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp & 3, wn = warp >> 2;
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int nt = 0; nt < BN / 16; ++nt) {
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const int r = r0 + t * 64 + wm * 16 + g + ((h >> 1) << 3);
        const int col = wn * (BN / 2) + nt * 8 + 2 * c + (h & 1);
        const int s = slot_of[col];
        if (r < K && s >= 0) {
          float v = acc[t][nt][h];
          if (!weight_on_input) {
            const int tok = s / topk, k = s - tok * topk;
            v *= load_scalar(topk_weights, topk_weights_code, (long long)tok * topk_weights_row_stride + k);
          }
          y[(long long)s * K + r] = v;
        }
      }
    }
  }
}

}  // namespace
}  // namespace swapmoe

#define SWAPMOE_MMA_GEMM1_ARGS(T)                                                                  \
  const T *x, long long x_row_stride, const T *w1, long long w1_expert_stride,                     \
      long long w1_row_stride, const void *topk_weights, int topk_weights_code,                    \
      long long topk_weights_row_stride, const int *expert_offsets, const int *sorted_slots,       \
      const int *tile_expert, const int *tile_start, const int *num_tiles, int topk, int N, int K, \
      int act, int weight_on_input, T *inter
#define SWAPMOE_MMA_GEMM1_CALL                                                                     \
  x, x_row_stride, w1, w1_expert_stride, w1_row_stride, topk_weights, topk_weights_code,           \
      topk_weights_row_stride, expert_offsets, sorted_slots, tile_expert, tile_start, num_tiles,   \
      topk, N, K, act, weight_on_input, inter
#define SWAPMOE_MMA_GEMM2_ARGS(T)                                                                  \
  const T *inter, const T *w2, long long w2_expert_stride, long long w2_row_stride,                \
      const void *topk_weights, int topk_weights_code, long long topk_weights_row_stride,          \
      const int *expert_offsets, const int *sorted_slots, const int *tile_expert,                  \
      const int *tile_start, const int *num_tiles, int topk, int N, int K, int weight_on_input,    \
      float *y
#define SWAPMOE_MMA_GEMM2_CALL                                                                     \
  inter, w2, w2_expert_stride, w2_row_stride, topk_weights, topk_weights_code,                     \
      topk_weights_row_stride, expert_offsets, sorted_slots, tile_expert, tile_start, num_tiles,   \
      topk, N, K, weight_on_input, y

#define SWAPMOE_MMA_INSTANTIATE(SUFFIX, T, BN)                                                     \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads)                                 \
      sm80_moe_gemm1_act_##SUFFIX##_t##BN(SWAPMOE_MMA_GEMM1_ARGS(T)) {                             \
    swapmoe::gemm1_act<T, BN>(SWAPMOE_MMA_GEMM1_CALL);                                             \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(swapmoe::kThreads)                                 \
      sm80_moe_gemm2_##SUFFIX##_t##BN(SWAPMOE_MMA_GEMM2_ARGS(T)) {                                 \
    swapmoe::gemm2<T, BN>(SWAPMOE_MMA_GEMM2_CALL);                                                 \
  }

SWAPMOE_MMA_INSTANTIATE(bf16, __nv_bfloat16, 16)
SWAPMOE_MMA_INSTANTIATE(bf16, __nv_bfloat16, 64)
SWAPMOE_MMA_INSTANTIATE(bf16, __nv_bfloat16, 128)
SWAPMOE_MMA_INSTANTIATE(f16, __half, 16)
SWAPMOE_MMA_INSTANTIATE(f16, __half, 64)
SWAPMOE_MMA_INSTANTIATE(f16, __half, 128)
