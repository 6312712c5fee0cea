// Hopper (sm_90) building blocks shared by the sm90_* kernels, as inline PTX:
// mbarriers, 1-D bulk copies and tensor-map (2-D/3-D tile) copies by the TMA unit, and the
// wgmma fences and shared-memory descriptors. Everything but smem_u32 is compiled only for
// sm_90 and later (SWAPMOE_SM90); the sm_80 build of a module leaves its kernels empty.
#pragma once
#include <stdint.h>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define SWAPMOE_SM90 1
#endif
// wgmma needs the architecture-specific target (sm_90a), not only sm_90.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SWAPMOE_SM90A 1
#endif

namespace swapmoe {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A CUDA tensor map (CUtensorMap: 128 opaque bytes, 64-byte aligned), built on the host by
// cuTensorMapEncodeTiled and passed by value as a `const __grid_constant__` kernel
// parameter, so that its generic address can be handed to the TMA unit.
struct alignas(64) TensorMap {
  uint64_t opaque[16];
};

#ifdef SWAPMOE_SM90
// `uint32_t fn()` reading the 32-bit special register %reg.
#define SWAPMOE_SPECIAL_REGISTER_U32(fn, reg)          \
  __device__ __forceinline__ uint32_t fn() {           \
    uint32_t r;                                        \
    asm volatile("mov.u32 %0, %%" #reg ";" : "=r"(r)); \
    return r;                                          \
  }
// Nanoseconds of the GPU's global timer (same clock on every SM), and this CTA's SM.
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
SWAPMOE_SPECIAL_REGISTER_U32(sm_id, smid)

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes barrier initialization visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arrives once and raises the barrier's expected transaction bytes for this phase.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_test(bar, parity)) {
  }
}
// A position in a ring of mbarrier-guarded stages whose size is known only at run time:
// the stage's slot and how many times the ring has wrapped. A stage's `full` barrier completes
// once per round, so its consumer waits with `phase()`; its `empty` barrier was last released
// in the round before, so its producer waits with `previous_phase()` (from round 1 on). A
// counter and a compare per step, no division by the runtime ring size.
struct RingCursor {
  int slot = 0, round = 0;
  __device__ __forceinline__ void advance(int ring) {
    if (++slot == ring) {
      slot = 0;
      ++round;
    }
  }
  __device__ __forceinline__ uint32_t phase() const { return round & 1; }
  __device__ __forceinline__ uint32_t previous_phase() const { return (round - 1) & 1; }
};
// One bulk copy global -> shared; completion is counted in bytes on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
// One tile of a tensor map into shared memory at `dst` (box as encoded in the map;
// out-of-range elements are zero); completion is counted in bytes on `bar`.
// Coordinates are in elements, innermost first.
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
      "[%2];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, const TensorMap* map, int c0, int c1, int c2,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
      "%5}], [%2];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// L2 eviction priorities of loads, as cache policies for the `.L2::cache_hint` forms below
// (createpolicy: the whole access range, fraction 1.0). Normal is what a load without a hint gets.
enum L2Evict { kEvictNormal = 0, kEvictFirst = 1, kEvictLast = 2 };
__device__ __forceinline__ uint64_t l2_policy(int evict) {
  uint64_t p;
  if (evict == kEvictFirst)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  else if (evict == kEvictLast)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  else
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
  return p;
}
// tma_load_2d / tma_load_3d with an L2 cache policy (l2_policy).
__device__ __forceinline__ void tma_load_2d_hint(void* dst, const TensorMap* map, int c0, int c1, uint64_t* bar,
                                                 uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, "
      "{%3, %4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d_hint(void* dst, const TensorMap* map, int c0, int c1, int c2,
                                                 uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, "
      "{%3, %4, %5}], [%2], %6;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "l"(policy)
      : "memory");
}
// 16 bytes global -> shared through L2 (cp.async.cg); `valid` false writes 16 zero bytes.
__device__ __forceinline__ void cp_async_16_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
// cp_async_16_zfill with an L2 cache policy (l2_policy).
__device__ __forceinline__ void cp_async_16_zfill_hint(uint32_t dst, const void* src, bool valid, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}
// Arrives on `bar` once this thread's earlier cp.async copies have landed. `noinc`: the
// arrival is counted in the barrier's initial count (no pending-count increment).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Orders this thread's generic-proxy view of shared memory (e.g. cp.async writes it has
// observed through an mbarrier) before its later async-proxy accesses (wgmma, TMA).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Thread-block clusters: this CTA's rank in its cluster (0 without a cluster launch), the
// cluster's number of CTAs (1 without), a
// barrier over every thread of the cluster (release/acquire: shared-memory writes before it
// are visible to the cluster's loads after it), and 4-byte loads from the shared memory of
// CTA `rank` of the cluster at the address `addr` has in this CTA (distributed shared memory).
SWAPMOE_SPECIAL_REGISTER_U32(cluster_ctarank, cluster_ctarank)
SWAPMOE_SPECIAL_REGISTER_U32(cluster_nctarank, cluster_nctarank)
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_shared_address(uint32_t addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  return remote;
}
__device__ __forceinline__ float ld_shared_cluster_f32(uint32_t addr, uint32_t rank) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_shared_address(addr, rank)) : "memory");
  return v;
}
// Stores v into the shared memory of cluster CTA `rank` at the address `addr` has in this CTA,
// and counts its 16 bytes on that CTA's mbarrier at `bar`'s address (the receiver waits on it
// with the bytes expected; no fence on either side).
__device__ __forceinline__ void st_async_cluster_v4(uint32_t addr, uint32_t bar, uint32_t rank, const float (&v)[4]) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
               ::"r"(cluster_shared_address(addr, rank)), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]),
               "r"(cluster_shared_address(bar, rank))
               : "memory");
}
__device__ __forceinline__ int ld_shared_cluster_s32(uint32_t addr, uint32_t rank) {
  int v;
  asm volatile("ld.shared::cluster.s32 %0, [%1];" : "=r"(v) : "r"(cluster_shared_address(addr, rank)) : "memory");
  return v;
}
// The two halves of cluster_sync, for a CTA that must not exit while others may still read
// its shared memory: arrive once done reading the others' (no ordering of its own writes),
// wait before exiting.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait;" ::: "memory"); }
// The release half alone: this thread's earlier writes (shared memory included) are visible to
// the cluster once the barrier completes. On sm_90a it costs a MEMBAR.ALL.GPU.
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
#endif  // SWAPMOE_SM90

#ifdef SWAPMOE_SM90A
// wgmma ordering: `fence` before the first wgmma that touches accumulator registers written
// by ordinary instructions; `commit` closes a group of issued wgmmas; `wait<N>` returns
// when at most N groups are still in flight.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Sets this warpgroup's registers per thread (a multiple of 8, 24-256); every warp of the
// warpgroup executes it. dec gives registers back to the SM's pool, inc waits for them.
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
#endif

// Keeps the compiler from moving accumulator reads or writes across an asynchronous wgmma.
template <int R>
__device__ __forceinline__ void fence_accumulators(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// wgmma shared-memory descriptor of a K-major tile written with the 128-byte swizzle (the
// layout TMA writes with CU_TENSOR_MAP_SWIZZLE_128B): rows of 128 bytes (64 bf16 of K),
// 8-row groups 1024 bytes apart. `addr` is the shared address of the first row at the
// wanted K offset; the tile base must be 1024-byte aligned. Bits: [0,14) address >> 4,
// [16,30) leading byte offset >> 4 (unused with this swizzle), [32,46) stride byte offset
// >> 4, [62,64) layout (1 = 128-byte swizzle).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
  uint64_t d = (uint64_t)((addr & 0x3FFFF) >> 4);
  d |= (uint64_t)1 << 16;
  d |= (uint64_t)(1024 >> 4) << 32;
  d |= (uint64_t)1 << 62;
  return d;
}

}  // namespace swapmoe
