// sm_90a device helpers of cuda/mla_decode_sm90.cu (the batched MLA decode's wgmma arm): bf16
// packing, the three wgmma shapes the kernel issues (the fences, waits and descriptors are
// cuda/wgmma.cuh's), mbarriers, named barriers, the tensor map and its loads, and the
// per-block softmax of the seesaw schedule. In an anonymous namespace, as the kernel that uses
// them.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda.h>

#include "common.cuh"
#include "mma_bf16.cuh"
#include "wgmma.cuh"

namespace {

using memra::cuda::pack_bf16x2;
using memra::cuda::bf16x2_sum;
using memra::cuda::smem_u32;

constexpr int kTile = 64;  // cache rows a block
constexpr unsigned kFull = 0xffffffffu;
constexpr float kLazy = 8.0f;  // log2 units the running max may lag a block's max by


// D[64 x 256] += A[64 x 16] * B[16 x 256], A in registers (bf16 pairs), B N-major in shared
// memory (imm-trans-b = 1).
__device__ __forceinline__ void wgmma_rs_n256_tb(float (&d)[128], const uint32_t (&a)[4],
                                                 uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      MEMRA_WGMMA_R128 "}, "
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : MEMRA_WGMMA_D128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// D[64 x 64] (+)= A[64 x 16] * B[64 x 16]^T, A and B K-major in shared memory (the query and
// the cache rows); scale_d = 0 overwrites D.
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db,
                                             int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      MEMRA_WGMMA_R32
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : MEMRA_WGMMA_D32(d, 0)
      : "l"(da), "l"(db), "r"(scale_d));
}

// D[64 x 256] (+)= A[64 x 16] * B[16 x 256], A K-major in shared memory (the other warpgroup's
// P), B N-major in shared memory (imm-trans-b = 1, the cache rows as V).
__device__ __forceinline__ void wgmma_ss_n256_tb(float (&d)[128], uint64_t da, uint64_t db,
                                                 int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      MEMRA_WGMMA_R128
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : MEMRA_WGMMA_D128(d)
      : "l"(da), "l"(db), "r"(scale_d));
}

// mbarrier in shared memory (cta scope): init with the number of arrivals a phase takes; wait
// until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// 2^x (MUFU.EX2, subnormals flushed: p is rounded to bf16 next; 2^-inf = 0).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// The block's own tensor map: the template's 128 bytes into shared memory, its global address
// and row count replaced, then copied to its global slot with a release fence for the tensor-map
// proxy (one warp; cp_fenceproxy is warp-collective).
__device__ __forceinline__ void make_map(const CUtensorMap& tmpl, unsigned char* smap,
                                         void* gmap, const void* addr, int rows) {
  const int lane = threadIdx.x & 31;
  if (lane < 8) {
    reinterpret_cast<uint4*>(smap)[lane] = reinterpret_cast<const uint4*>(&tmpl)[lane];
  }
  __syncwarp();
  const uint64_t sm = smem_u32(smap);
  if (lane == 0) {
    asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;\n"
                 ::"l"(sm), "l"(addr)
                 : "memory");
    asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;\n"
                 ::"l"(sm), "r"(rows)
                 : "memory");
  }
  __syncwarp();
  asm volatile(
      "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned "
      "[%0], [%1], 128;\n" ::"l"(gmap),
      "r"(static_cast<uint32_t>(sm))
      : "memory");
}

__device__ __forceinline__ void map_acquire(const void* gmap) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(gmap) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Box (64 columns from col, 64 rows from row) of the map into shared memory, 128-byte swizzled;
// rows past the map's row count arrive as zeros.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* gmap, uint32_t bar, int col,
                                            int row, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
      "l"(gmap), "r"(bar), "r"(col), "r"(row), "l"(policy)
      : "memory");
}

// An L2 policy that evicts the lines it fills first: each cache row is read once, so it should
// not push out what is read again (the query, the partials, the next kernel's weights).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// Compile-time arguments of the kernel's lambdas.
template <int V>
using I = std::integral_constant<int, V>;
template <bool V>
using B = std::integral_constant<bool, V>;

// Shared-memory helpers of the kernel: 32- and 128-bit stores, a non-blocking arrival at a named
// barrier (the producer side of a one-way hand-over between the warpgroups).
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                             uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c),
               "r"(d)
               : "memory");
}
__device__ __forceinline__ void st_shared_v2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
// Every thread of every block of the cluster (release / acquire: shared-memory writes before it
// are visible to the cluster's blocks after it).
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}
// A float / float4 of block `rank`'s shared memory at this block's shared address `addr`.
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_cluster_v4(uint32_t addr, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// The softmax of one 64-row block in the warpgroup that computed its scores s (the m64n64
// accumulator layout: heads head0 and head0 + 8, rows 8 (i / 4) + 2 tq + i % 2): scores scaled
// to log2 units, rows at or past nvalid -inf, the shared running max sm moved to the block's max
// only when that exceeds it by more than kLazy, p = 2^(s - m) rounded to bf16 into the A-fragment
// layout pf, their sums into psum, and per head the factor `scale` = 2^(m_old - m_new) by which
// everything summed at the old max is to be multiplied (1 when the max did not move). The new
// max and scale are written to shared memory (sm, ss) by the quad's first thread.
__device__ __forceinline__ void block_softmax(float (&s)[32], int nvalid, float sl2, int tq,
                                              int head0, float* sm, float* ss, uint32_t (&pf)[8][2],
                                              float (&psum)[2], float (&scale)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
  if (nvalid >= kTile) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] *= sl2;
      mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int col = 8 * (i >> 2) + 2 * tq + (i & 1);
      s[i] = col < nvalid ? s[i] * sl2 : -INFINITY;
      mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    }
  }
  float m[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 2));
    const float m_old = sm[head0 + 8 * r];
    m[r] = mx[r] > m_old + kLazy ? mx[r] : m_old;
    scale[r] = ex2(m_old - m[r]);  // 1 when the max stays; 0 from the initial -1e30
  }
  __syncwarp();  // the quad's reads of sm before its first thread writes
  if (tq == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sm[head0 + 8 * r] = m[r];
      ss[head0 + 8 * r] = scale[r];
    }
  }
  psum[0] = psum[1] = 0.0f;
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    pf[c][0] = pack_bf16x2(ex2(s[4 * c] - m[0]), ex2(s[4 * c + 1] - m[0]));
    pf[c][1] = pack_bf16x2(ex2(s[4 * c + 2] - m[1]), ex2(s[4 * c + 3] - m[1]));
    psum[0] += bf16x2_sum(pf[c][0]);  // the sums of what the PV products multiply
    psum[1] += bf16x2_sum(pf[c][1]);
  }
}

// o (the m64n256 accumulator layout: heads head0, head0 + 8 alternate by pairs) times f per head;
// skipped when every f of the warp is 1 (the lazy max's usual case).
__device__ __forceinline__ void rescale_o(float (&o)[128], const float (&f)[2]) {
  if (__any_sync(kFull, f[0] != 1.0f || f[1] != 1.0f)) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= f[(i >> 1) & 1];
  }
}

}  // namespace
