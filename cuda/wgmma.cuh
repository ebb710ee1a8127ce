// sm_90a warpgroup matrix-multiply helpers shared by the wgmma kernels (mla_decode_sm90.cu
// through mla_sm90.cuh, kda_chunk_state.cu): the fences and waits, the shared-memory matrix
// descriptor of the 128-byte swizzle, and the f16 register-A shapes. In an anonymous namespace,
// as the kernels that use them.
#pragma once

#include <cstdint>

// The accumulator operands of a wgmma's inline asm, d[o] .. d[o + n - 1] as "+f" constraints,
// and (MEMRA_WGMMA_R<n>) their register list in the instruction string, operands %0 .. %(n - 1).
#define MEMRA_WGMMA_R32                                                                      \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MEMRA_WGMMA_R64                                                                   \
  MEMRA_WGMMA_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, " \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MEMRA_WGMMA_R128                                                                  \
  MEMRA_WGMMA_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, " \
  "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "  \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "     \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, "  \
  "%126, %127"
#define MEMRA_WGMMA_D8(d, o) \
  "+f"(d[(o)]), "+f"(d[(o) + 1]), "+f"(d[(o) + 2]), "+f"(d[(o) + 3]), "+f"(d[(o) + 4]), \
      "+f"(d[(o) + 5]), "+f"(d[(o) + 6]), "+f"(d[(o) + 7])
#define MEMRA_WGMMA_D32(d, o) \
  MEMRA_WGMMA_D8(d, (o)), MEMRA_WGMMA_D8(d, (o) + 8), MEMRA_WGMMA_D8(d, (o) + 16), \
      MEMRA_WGMMA_D8(d, (o) + 24)
#define MEMRA_WGMMA_D64(d) MEMRA_WGMMA_D32(d, 0), MEMRA_WGMMA_D32(d, 32)
#define MEMRA_WGMMA_D128(d) MEMRA_WGMMA_D64(d), MEMRA_WGMMA_D32(d, 64), MEMRA_WGMMA_D32(d, 96)

namespace {

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Ties accumulator registers to this point (after a wgmma wait): later reads cannot be hoisted
// above the wait.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Shared memory written through the generic proxy (st.shared, cp.async) made visible to the
// async proxy that wgmma reads its shared-memory operands through (before the block barrier).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets (all in 16-byte units in the descriptor).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

// D[64 x 64] (+)= A[64 x 16] B[16 x 64], f16 operands, f32 accumulators: A in registers (each
// warp's 16 rows as an m16n8k16 A fragment), B K-major in shared memory; scale_d = 0 overwrites D.
__device__ __forceinline__ void wgmma_f16_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db,
                                              int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      MEMRA_WGMMA_R32 "}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : MEMRA_WGMMA_D32(d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// D[64 x 128] (+)= A[64 x 16] B[16 x 128] as wgmma_f16_n64, B N-major in shared memory
// (imm-trans-b = 1).
__device__ __forceinline__ void wgmma_f16_n128_tb(float (&d)[64], const uint32_t (&a)[4],
                                                  uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      MEMRA_WGMMA_R64 "}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : MEMRA_WGMMA_D64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

}  // namespace
