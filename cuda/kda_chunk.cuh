// Shared by the chunked (WY / UT) delta-rule form's sources (cuda/kda_chunk.cu: the host side;
// kda_chunk_intra.cu, kda_chunk_state.cu: its two kernels): the chunk shape, the scratch layout
// the intra kernel hands the state kernel, the TF32 mma fragments, and the problem the
// host side describes (KDA's per-channel decay and GDN's per-head decay with grouped key heads).
//
// Per sequence and head, chunks of kC = 64 steps; within a chunk (rows t, s; G the inclusive
// cumulative sum of g over the chunk's rows, per channel; S0 the state entering the chunk):
//   Akk[t, s] = beta_t sum_c k_t k_s exp(G_t - G_s)        (s < t)
//   Aqk[t, s] = scale sum_c q_t k_s exp(G_t - G_s)        (s <= t)
//   Tm = (I + Akk)^-1;  W = Tm (beta k exp(G));  U = Tm (beta v)
//   D = U - W S0  (the chunk's beta (v - k^T S'), every step at once)
//   O = (scale q exp(G)) S0 + Aqk D
//   S = exp(G_last) S0 + (k exp(G_last - G))^T D
// which is the scan's recurrence in exact arithmetic (tests/test_cuda_kda_chunk.py checks the
// algebra in float64 against the scan). Every exponent is <= 0: exp(G_t - G_s) is never split
// into exp(G_t) exp(-G_s) (exp(-G) overflows f32 over a chunk of strong decays).
//
// Two kernels (fla's chunk_gated_delta_rule runs three: intra A's + W / U, fwd_h, fwd_o):
//   chunk_intra_kernel (one block per chunk, all in parallel): W, U, KG = k exp(G_last - G),
//     exp(G_last) and the output's A operand [QG | Aqk] (QG = scale q exp(G));
//   chunk_state_kernel (one warpgroup per sequence, head and half of the state's columns, a
//     warp per 16 columns, wgmma; the chunks in order, the only sequential part):
//     D = U - W S, O = [QG | Aqk] [S ; D] and S <- exp(G_last) S + KG^T D, with S and D in
//     registers only. The output is formed in the chain because the alternative, a third
//     kernel over every chunk's entering state, writes and reads back 64 KB of state and 32 KB
//     of D a chunk (fla's fwd_h / fwd_o split): at 8K tokens and 64 heads that traffic alone is
//     ~1.6 GB. O's products share the chain's operands (QG S reads W S's A fragments).
//
// Precision: the intra kernel's products run as mma.sync m16n8k8 TF32 (operands rounded to
// nearest TF32, 10-bit mantissa; f32 accumulation), so the operand error is a quarter of bf16's:
// the bf16 models this form serves carry bf16-rounded weights and activations already. The
// cumulative decay, the exponentials, the diagonal sub-blocks, U and the state itself stay f32;
// the triangular inverse is f32 on its diagonal blocks and 3xTF32 (each operand split into two
// TF32 parts, f32's precision up to 2^-22 of a product) in the products below them. In the
// scratch between the kernels, the bounded operands W, KG, QG and
// Aqk (|q|, |k| <= 1 elementwise, every decay factor <= 1) are f16: its 11-bit significand is
// TF32's, so the state kernel's f16 wgmma (f32 accumulation) sees what TF32 would,
// rounded once (to nearest even instead of away); values under 2^-14 lose bits as subnormals
// (at most 3e-8 absolute). The state kernel's other operands, S and D, are not bounded: each of
// their rows is scaled by a power of two before its f16 rounding and the products are scaled
// back exactly (kda_chunk_state.cu), which keeps the 11-bit significand over f32's normal
// range. The final state leaves in full f32.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "kda_common.cuh"

namespace {

constexpr int kC = 64;        // chunk length
constexpr int kSub = 16;      // sub-block rows (an mma's M)
constexpr int kDk = kScanDk;  // 128
constexpr int kDv = kScanDv;  // 128
static_assert(kDk == kDv, "one [64, 128] tile shape for k-side and v-side scratch");
static_assert(kC % kSub == 0 && kDk % 8 == 0, "whole mma tiles");

// Scratch per (sequence, head, chunk), written by the intra kernel and read by the state
// kernel; offsets in floats (an f16 tile takes half a float per element); every part starts on
// a 16-byte boundary.
//   W   [64, 128]  f16  Tm (beta k exp(G))
//   KG  [64, 128]  f16  k exp(G_last - G)
//   EL  [128]      f32  exp(G_last)
//   A   [64, 192]  f16  [QG | Aqk] (Aqk zero above the diagonal)
//   U   [64, 128]  f32  Tm (beta v)
constexpr int kLdOutA = kDk + kC;  // 192: A's row length (the output product's K)
constexpr int64_t kTileH = int64_t(kC) * kDk / 2;  // a [64, 128] f16 tile, in floats
constexpr int64_t kOffW = 0;
constexpr int64_t kOffKG = kTileH;
constexpr int64_t kOffEl = 2 * kTileH;
constexpr int64_t kOffA = kOffEl + kDk;
constexpr int64_t kOffU = kOffA + int64_t(kC) * kLdOutA / 2;
constexpr int64_t kChunkFloats = kOffU + int64_t(kC) * kDv;
static_assert(kOffKG % 4 == 0 && kOffEl % 4 == 0 && kOffA % 4 == 0 && kOffU % 4 == 0 &&
                  kChunkFloats % 4 == 0,
              "float4 / cp.async 16-byte parts");

__device__ __forceinline__ uint32_t tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// d += a * b, m16n8k8 TF32 -> f32. Fragments (g = lane / 4, q = lane % 4):
// a0 (g, q), a1 (g + 8, q), a2 (g, q + 4), a3 (g + 8, q + 4); b0 (k = q, n = g), b1 (q + 4, g);
// d0 (g, 2q), d1 (g, 2q + 1), d2 (g + 8, 2q), d3 (g + 8, 2q + 1).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A fragment of rows r0.., columns k0.. of a row-major smem tile (conflict free for ld % 32 == 4).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const float* s, int ld, int r0, int k0,
                                       int g, int q) {
  a[0] = tf32(s[(r0 + g) * ld + k0 + q]);
  a[1] = tf32(s[(r0 + g + 8) * ld + k0 + q]);
  a[2] = tf32(s[(r0 + g) * ld + k0 + q + 4]);
  a[3] = tf32(s[(r0 + g + 8) * ld + k0 + q + 4]);
}

// x rounded to TF32 (cvt.rna), kept as a float: its low 13 bits are zero, so a tile stored
// so is read as mma operands without a cvt (load_b_rounded), to the same bits.
__device__ __forceinline__ float round_tf32(float x) { return __uint_as_float(tf32(x)); }

// B fragment (k0.. rows, n0.. columns) of a row-major [K, N] smem tile whose elements are
// TF32-rounded already (round_tf32) (conflict free for ld % 32 == 8 or 24).
__device__ __forceinline__ void load_b_rounded(uint32_t (&b)[2], const float* s, int ld, int k0,
                                               int n0, int g, int q) {
  b[0] = __float_as_uint(s[(k0 + q) * ld + n0 + g]);
  b[1] = __float_as_uint(s[(k0 + q + 4) * ld + n0 + g]);
}

// Allow `bytes` of dynamic shared memory for `kernel` (50002 beyond the device's opt-in limit).
template <typename K>
int allow_smem(MemraCudaCtx* ctx, K* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return memra::kOk;
  int optin = 0;
  MEMRA_CUDA_RETURN_IF(memra::cuda::status_of(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device)));
  if (bytes > static_cast<size_t>(optin)) return memra::kUnsupportedGeometry;
  return memra::cuda::status_of(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace

namespace memra::cuda::kda {

// The launches (each file's kernel; scratch of chunks * kChunkFloats floats, chunks = B H nc).
int launch_chunk_intra(MemraCudaCtx* ctx, const ChunkProblem& p, int nc, float* scratch);
int launch_chunk_state(MemraCudaCtx* ctx, const ChunkProblem& p, int nc, const float* scratch);

}  // namespace memra::cuda::kda
