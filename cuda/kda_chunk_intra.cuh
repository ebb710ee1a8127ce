// KDA area, chunked delta-rule form: the intra-chunk kernel's shared-memory layout, its
// tensor-core tile plan and its element helpers (the kernel: kda_chunk_intra.cu; the algebra and
// the scratch layout: kda_chunk.cuh).
#pragma once

#include "kda_chunk.cuh"

namespace {

// 2^x by ex2.approx.ftz (exp2f's fast form without its fix-up for results under 2^-126, which
// become 0). The arguments are differences of the log2-unit cumulative decay G2.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float2 ld2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}

// Each element of x times b, rounded to TF32: U's B operand (beta v), read without a cvt.
__device__ __forceinline__ float4 scaled_tf32(float4 x, float b) {
  return make_float4(round_tf32(b * x.x), round_tf32(b * x.y), round_tf32(b * x.z),
                     round_tf32(b * x.w));
}

// Eight bf16 (one 16-byte piece, element 0 in the low half of word 0) widened to f32, exactly
// (a bf16 is the high half of its f32): elements 0-3 in lo, 4-7 in hi.
__device__ __forceinline__ void widen_bf16x8(uint4 w, float4& lo, float4& hi) {
  lo = make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                   __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
  hi = make_float4(__uint_as_float(w.z << 16), __uint_as_float(w.z & 0xffff0000u),
                   __uint_as_float(w.w << 16), __uint_as_float(w.w & 0xffff0000u));
}

// lo and hi to dst[0..7] (16-byte aligned shared memory). `swap` stores the second half first:
// with rows kLd = 8 (mod 32) floats apart (below), a quarter warp's eight pieces of one row land
// on distinct bank quads when its threads 4-7 swap (the 128-bit stores' phases are 8 threads).
__device__ __forceinline__ void store_halves(float* dst, float4 lo, float4 hi, bool swap) {
  float4* d = reinterpret_cast<float4*>(dst);
  d[swap ? 1 : 0] = swap ? hi : lo;
  d[swap ? 0 : 1] = swap ? lo : hi;
}

// smem row stride of [64, 128] tiles: the A's channel-pair (float2) operand loads and the
// W / U products' B fragments are conflict free at ld % 32 == 8.
constexpr int kLd = kDk + 8;
constexpr int kLdA = kC + 4;    // smem row stride of [64, 64] tiles
constexpr int kThreads = 256;   // 8 warps
// A KDA chunk whose every g is >= -kSafeG takes its diagonal sub-blocks on tensor cores too,
// through a reference row in the middle of the sub-block: each exponential factor is then at
// most exp(8 kSafeG) = exp(44) and any product of two at most exp(82.5), finite in f32 (the
// lower-bound gate of glm5_next keeps g > -5; other chunks take the element-wise path).
constexpr float kSafeG = 5.5f;

// Three [64, 128] tiles, each reused once its first content is dead, so two blocks fit an SM
// (one block's serial phases hide under the other's): Akk waits in registers (the tensor-core
// tiles) and in x (an unsafe chunk's element-wise diagonal sub-blocks) until q is dead, then
// goes next to Tm in q's tile; v (U's B operand) streams into G's tile with cp.async while the
// inverse runs, so no global latency sits in the W / U products.
// x: the diagonal sub-blocks [64, 16] (row t, column 16 (t / 16) + j), then the block
// inverse's per-level products X, up to three [16, kLdX] (kLdX % 32 == 24: the mma B fragments
// read them conflict free).
constexpr int kLdX = 24;
constexpr int kXFloats = 3 * kSub * kLdX > kC * kSub ? 3 * kSub * kLdX : kC * kSub;
struct IntraSmem {
  float k[kC * kLd];  // k; after the A's: beta k exp(G)
  float q[kC * kLd];  // q; after the A's: Tm = (I + Akk)^-1 [64, kLdA], then Akk [64, kLdA]
  float G[kC * kLd];  // cumulative log decay, log2 units (G2); once dead: beta v [64, kLd]
  float x[kXFloats];
  float beta[kC];
  float gmin[kThreads / 32];  // each cumulative-sum warp's smallest g (KDA)
};
// Tm and Akk share q's tile at row stride kLdA (% 32 == 4: the level products' A fragments
// are conflict free).
static_assert(2 * kC * kLdA <= kC * kLd, "Tm and Akk fit q's tile");
static_assert((kC * kLdA) % 4 == 0 && (kLd * 4) % 16 == 0, "aligned Akk, cp.async rows");

// acc += A B over k0 .. k0 + 7 (one m16n8k8 step; A [16, K] row-major at a, B [K, 8] row-major
// at b) in 3xTF32: each operand split x = hi + lo, both TF32 (x - hi is exact in f32), and
// lo hi + hi lo + hi hi accumulated in that order, so the products keep f32's precision up to
// the dropped lo lo term (under 2^-22 of the product).
__device__ __forceinline__ void mma_3xtf32(float (&acc)[4], const float* a, int lda,
                                           const float* b, int ldb, int k0, int g, int q) {
  const float av[4] = {a[g * lda + k0 + q], a[(g + 8) * lda + k0 + q], a[g * lda + k0 + q + 4],
                       a[(g + 8) * lda + k0 + q + 4]};
  const float bv[2] = {b[(k0 + q) * ldb + g], b[(k0 + q + 4) * ldb + g]};
  uint32_t ahi[4], alo[4], bhi[2], blo[2];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    ahi[e] = tf32(av[e]);
    alo[e] = tf32(av[e] - __uint_as_float(ahi[e]));
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    bhi[e] = tf32(bv[e]);
    blo[e] = tf32(bv[e] - __uint_as_float(bhi[e]));
  }
  mma_tf32(acc, alo, bhi);
  mma_tf32(acc, ahi, blo);
  mma_tf32(acc, ahi, bhi);
}

// The tensor-core sub-block products of the A's, per warp: row block I (16 rows) and `count`
// consecutive column tiles of 8 from tile `first` (tile n covers columns 8 n..). With J <= I
// (safe chunks, GDN) row block I has 2 I + 2 tiles, 20 in all: I = 3 over warps 0-2 (3, 3, 2
// tiles), I = 2 over 3-4 (3, 3), I = 1 over 5-6 (2, 2), I = 0 warp 7 (2). With J < I, 2 I
// tiles, 12 in all: I = 3 over warps 0-2, I = 2 over 3-4, I = 1 warp 5, two tiles each.
constexpr int kMaxTiles = 3;
__device__ __forceinline__ void tile_plan(bool with_diagonal, int warp, int& I, int& first,
                                          int& count) {
  if (with_diagonal) {
    if (warp < 3) {
      I = 3, first = 3 * warp, count = warp < 2 ? 3 : 2;
    } else if (warp < 5) {
      I = 2, first = 3 * (warp - 3), count = 3;
    } else if (warp < 7) {
      I = 1, first = 2 * (warp - 5), count = 2;
    } else {
      I = 0, first = 0, count = 2;
    }
  } else {
    if (warp < 3) {
      I = 3, first = 2 * warp, count = 2;
    } else if (warp < 5) {
      I = 2, first = 2 * (warp - 3), count = 2;
    } else {
      I = 1, first = 0, count = warp == 5 ? 2 : 0;
    }
  }
}
static_assert(kThreads == 256, "tile_plan's eight warps");

}  // namespace
