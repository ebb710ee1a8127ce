// KDA area, chunked delta-rule form (cuda/kda_chunk.cuh has the algebra and the scratch layout):
// the one sequential kernel, on sm_90a warpgroup MMA. Per chunk, in order: D = U - W S and
// O = QG S, then O += Aqk D and S <- exp(G_last) S + KG^T D; O goes to the output rows.
//
// A block is one warpgroup owning 64 of the state's value columns (a head's half). Warp w holds
// 16 of them with all 128 key rows, the f32 state transposed in its accumulator registers:
// S^T [16, 128], 64 registers a thread, m row g the column j0 + 16 w + 2 g and m row g + 8 the
// next one (a thread's two columns adjacent: its state, U and output accesses are float2). A
// column of D, O and the next state depends on the same column of S only, so no warp exchanges
// S or D. The products run transposed (D^T = U^T - S^T W^T, O^T = S^T QG^T + D^T Aqk^T,
// S^T <- S^T exp(G_last) + D^T KG) as wgmma: S^T and D^T are the A operands straight from the
// accumulators (an m16n8 accumulator pair is an m16n8k16 A fragment, FlashAttention-2's P trick),
// the f16 tiles the B operands, read once by the warpgroup from shared memory, where the copies
// lay them out in the 128-byte swizzle of the descriptors. D's product and O's run as separate
// groups, so the D^T epilogue (on the chain from one chunk's state to the next) runs while O's
// product is still in the tensor cores; likewise the state's update runs before O2's product is
// waited for and the output formed.
//
// Precision: the products are wgmma m64nNk16 with f16 operands and f32 accumulation. The
// tiles are f16 already (cuda/kda_chunk.cuh). S^T and D^T are not bounded, so each row (a state
// column) is scaled by a power of two that puts its largest magnitude in [2^14, 2^15) before
// its f16 rounding, and every product that read it is scaled back exactly: the operand keeps
// f16's 11-bit significand, TF32's, for every element within 2^-28 of its row's largest (below,
// an absolute error under 2^-39 of that largest), over f32's normal range. The sums, the
// carried state and the output stay f32. Non-finite inputs: the O2 product runs over Aqk's
// zero-filled blocks above the diagonal too (a wgmma covers the whole tile), and 0 x inf is NaN,
// so an inf / NaN row of D reaches every output row of its chunk, not only the later ones (the
// state, and so every later chunk, is non-finite from there on either way).
#include <cuda_bf16.h>

#include <type_traits>

#include "kda_chunk.cuh"
#include "mma_bf16.cuh"
#include "wgmma.cuh"

using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::launch_status;
using memra::cuda::pack_f16x2;
using memra::cuda::smem_u32;

namespace {

// The power of two sc (and 1 / sc) that puts m, a row's largest magnitude, in [2^14, 2^15):
// under f16's largest finite 65504. s is kept in [-126, 126], so both powers are normal floats;
// the bound binds only for rows of zeros or f32 subnormals (largest magnitude under 2^-126:
// the scaled row is under 1) and for inf / NaN rows (which stay inf / NaN through the products,
// as in f32).
__device__ __forceinline__ void pow2_scale(float m, float& sc, float& inv) {
  const int e = (__float_as_int(m) >> 23) & 0xff;
  const int s = max(-126, min(126, 141 - e));
  sc = __int_as_float((127 + s) << 23);
  inv = __int_as_float((127 - s) << 23);
}

// Row scales of an m16 accumulator tile set X[N][4] (rows g: slots 0, 1; g + 8: slots 2, 3),
// the maxima reduced over the quad of lanes that shares a row.
template <int N>
__device__ __forceinline__ void row_scales(const float (&X)[N][4], float (&sc)[2],
                                           float (&inv)[2]) {
  // Two chains a row (the maximum is exact in any order: fmaxf drops NaN either way).
  static_assert(N % 2 == 0, "tile pairs");
  float m0 = 0.f, m1 = 0.f, m0b = 0.f, m1b = 0.f;
#pragma unroll
  for (int n = 0; n < N; n += 2) {
    m0 = fmaxf(m0, fmaxf(fabsf(X[n][0]), fabsf(X[n][1])));
    m1 = fmaxf(m1, fmaxf(fabsf(X[n][2]), fabsf(X[n][3])));
    m0b = fmaxf(m0b, fmaxf(fabsf(X[n + 1][0]), fabsf(X[n + 1][1])));
    m1b = fmaxf(m1b, fmaxf(fabsf(X[n + 1][2]), fabsf(X[n + 1][3])));
  }
  m0 = fmaxf(m0, m0b);
  m1 = fmaxf(m1, m1b);
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, o));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, o));
  }
  pow2_scale(m0, sc[0], inv[0]);
  pow2_scale(m1, sc[1], inv[1]);
}

// The m16n8k16 A fragment of k-block j of an accumulator tile set (tiles 2 j, 2 j + 1), scaled
// per row and rounded to f16.
template <int N>
__device__ __forceinline__ void acc_as_a(uint32_t (&a)[4], const float (&X)[N][4], int j,
                                         const float (&sc)[2]) {
  a[0] = pack_f16x2(X[2 * j][0] * sc[0], X[2 * j][1] * sc[0]);
  a[1] = pack_f16x2(X[2 * j][2] * sc[1], X[2 * j][3] * sc[1]);
  a[2] = pack_f16x2(X[2 * j + 1][0] * sc[0], X[2 * j + 1][1] * sc[0]);
  a[3] = pack_f16x2(X[2 * j + 1][2] * sc[1], X[2 * j + 1][3] * sc[1]);
}

constexpr int kThreads = 128;  // one warpgroup
constexpr int kCols = 64;      // state columns a block: a half
constexpr int kLdU = kCols + 4;  // float2 U reads, rows 2 q: banks 8 q + 2 g, + 1
// An f16 sub-tile: 64 rows of 64 halves, 128-byte rows, the 16-byte pieces of row r at
// (piece ^ (r & 7)) (the 128-byte swizzle; the stage base is 1024-aligned).
constexpr int kSub64 = kC * 128;
// One stage (bytes from its base): W and QG as two sub-tiles each (key columns 0-63, 64-127),
// KG likewise, Aqk one sub-tile (chunk columns), U's 64 columns f32 [64, kLdU], exp(G_last).
constexpr int kSW = 0, kSQG = 2 * kSub64, kSKG = 4 * kSub64, kSAqk = 6 * kSub64;
constexpr int kSU = 7 * kSub64;
constexpr int kSEl = kSU + kC * kLdU * 4;
constexpr int kStage = (kSEl + kDk * 4 + 1023) / 1024 * 1024;
// Three stages: two chunks' copies in flight while one is computed (with two, nothing was in
// flight between one chunk's copies landing and the next chunk's start).
constexpr int kStages = 3;
constexpr int kSmemBytes = kStages * kStage + 1024;  // + the base's alignment
static_assert(kC == 64 && kDk == 128 && kDv == 128 && kLdOutA == 192,
              "the unrolled copy and product counts below");

__device__ __forceinline__ int swz(int r, int piece) { return r * 128 + ((piece ^ (r & 7)) << 4); }

// cp.async of chunk `in`'s tiles into the stage at `st` (every thread its share; the row steps
// keep r & 7 fixed per thread, so each copy sits at a constant offset). Aqk's 16 x 16 blocks
// above the diagonal are zero-filled without a read (the intra kernel leaves them unwritten;
// the O product reads the whole tile).
__device__ __forceinline__ void prefetch(unsigned char* st, const float* in, int j0, int tid) {
  {  // W and KG: rows of 16 pieces, thread (row r0 + 8 k, piece p)
    const int r0 = tid / 16, p = tid % 16;
    const int so = (p >> 3) * kSub64 + swz(r0, p & 7);
    const __half* w = reinterpret_cast<const __half*>(in + kOffW) + r0 * kDk + 8 * p;
    const __half* kg = reinterpret_cast<const __half*>(in + kOffKG) + r0 * kDk + 8 * p;
#pragma unroll
    for (int k = 0; k < kC / 8; ++k) {
      cp_async_16(st + kSW + so + k * 1024, w + 8 * k * kDk);
      cp_async_16(st + kSKG + so + k * 1024, kg + 8 * k * kDk);
    }
  }
  {  // [QG | Aqk]: rows of 24 pieces, thread (row r0 + 16 k, pieces c, 8 + c, 16 + c)
    const int r0 = tid / 8, c = tid % 8;
    const __half* a = reinterpret_cast<const __half*>(in + kOffA) + r0 * kLdOutA + 8 * c;
    const int so = swz(r0, c);
#pragma unroll
    for (int k = 0; k < kC / 16; ++k) {
      cp_async_16(st + kSQG + so + k * 2048, a + 16 * k * kLdOutA);
      cp_async_16(st + kSQG + kSub64 + so + k * 2048, a + 16 * k * kLdOutA + 64);
      // Aqk columns 8 c.. of rows 16 k..: above the diagonal blocks when c / 2 > k.
      cp_async_16(st + kSAqk + so + k * 2048, a + 16 * k * kLdOutA + 128, c / 2 > k ? 0 : 16);
    }
  }
  {  // the block's U columns: rows of 16 pieces
    const int r0 = tid / 16, c4 = 4 * (tid % 16);
    const float* u = in + kOffU + r0 * kDv + j0 + c4;
    unsigned char* su = st + kSU + (r0 * kLdU + c4) * 4;
#pragma unroll
    for (int k = 0; k < kC / 8; ++k) cp_async_16(su + k * 8 * kLdU * 4, u + 8 * k * kDv);
  }
  if (tid < kDk / 4) cp_async_16(st + kSEl + 16 * tid, in + kOffEl + 4 * tid);
}

// One block per (sequence b, head h, column half): blockIdx.x = (b * H + h) * 2 + half.
// kOBf16: o stored as bf16 (round to nearest even from the f32 result).
template <bool kOBf16>
__global__ void __launch_bounds__(kThreads, 1)
    chunk_state_kernel(const memra::cuda::kda::ChunkProblem p, int nc,
                       const float* __restrict__ scratch) {
  memra::cuda::pdl_wait();  // a no-op (launched without PDL) but for the trace build's record
  memra::cuda::pdl_trigger();
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* const smem = smem_raw + (base - raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int H = p.H, T = p.T;
  const int part = static_cast<int>(blockIdx.x & 1);
  const int64_t bh = blockIdx.x >> 1;
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int j0 = part * kCols;
  const int vl = 16 * warp;  // the warp's first column within the block's
  const int v0 = j0 + vl;
  const int64_t plane = int64_t(h) * kDk * kDv;
  const float* const first = scratch + bh * nc * kChunkFloats;

  float ST[kDk / 8][4];  // S^T (thread (g, q), tile n: rows g, g + 8, columns 8 n + 2 q, + 1)
  const float* sin = p.state_in ? p.state_in[b] : nullptr;
#pragma unroll
  for (int n = 0; n < kDk / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {  // state row 8 n + 2 q + e, columns v0 + 2 g, + 1
      const int r = 8 * n + 2 * q + e;
      const float2 s2 = sin ? *reinterpret_cast<const float2*>(&sin[plane + int64_t(r) * kDv +
                                                                    v0 + 2 * g])
                            : make_float2(0.f, 0.f);
      ST[n][e] = s2.x;
      ST[n][e + 2] = s2.y;
    }
  }

  // One commit group a chunk (empty past the last), so chunk c's copies are complete once at
  // most kStages - 2 groups are pending.
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {
    if (c < nc) prefetch(smem + c * kStage, first + int64_t(c) * kChunkFloats, j0, tid);
    cp_async_commit();
  }
  int buf = 0;
  for (int c = 0; c < nc; ++c) {
    unsigned char* const st = smem + buf * kStage;
    const uint32_t sa = base + static_cast<uint32_t>(buf * kStage);
    cp_async_wait<kStages - 2>();
    fence_proxy_async_smem();  // the copies, read by wgmma below
    __syncthreads();  // every warp is past chunk c - 1: its stage may be rewritten
    const int ahead = buf == 0 ? kStages - 1 : buf - 1;  // chunk c - 1's stage
    if (c + kStages - 1 < nc) {
      prefetch(smem + ahead * kStage, first + int64_t(c + kStages - 1) * kChunkFloats, j0, tid);
    }
    cp_async_commit();
    buf = buf + 1 == kStages ? 0 : buf + 1;

    // D^T's product S^T W^T (subtracted from U^T below) as one group, O^T = S^T QG^T as the
    // next: K = the 128 key rows in 8 steps, sub-tile kk / 4 at 32 bytes a step (K-major B).
    float scS[2], invS[2];
    row_scales(ST, scS, invS);
    uint32_t a[kDk / 16][4];
#pragma unroll
    for (int j = 0; j < kDk / 16; ++j) acc_as_a(a[j], ST, j, scS);
    float DT[32], OT[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {
      const uint32_t off = (kk >> 2) * kSub64 + (kk & 3) * 32;
      wgmma_f16_n64(DT, a[kk], smem_desc(sa + kSW + off, 16, 1024), kk > 0);
    }
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {
      const uint32_t off = (kk >> 2) * kSub64 + (kk & 3) * 32;
      wgmma_f16_n64(OT, a[kk], smem_desc(sa + kSQG + off, 16, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<1>();  // D's group (O's may still run)
    reg_fence(DT);

    // D^T = U^T minus that product (scaled back), its row scales and A fragments.
    const float* u = reinterpret_cast<const float*>(st + kSU) + 2 * q * kLdU + vl + 2 * g;
#pragma unroll
    for (int nt = 0; nt < kC / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // chunk row 8 nt + 2 q + e
        const float2 u2 = *reinterpret_cast<const float2*>(&u[(8 * nt + e) * kLdU]);
        DT[4 * nt + e] = fmaf(-DT[4 * nt + e], invS[0], u2.x);
        DT[4 * nt + e + 2] = fmaf(-DT[4 * nt + e + 2], invS[1], u2.y);
      }
    }
    float (&D4)[kC / 8][4] = *reinterpret_cast<float (*)[kC / 8][4]>(DT);
    float scD[2], invD[2];
    row_scales(D4, scD, invD);
    uint32_t DA[kC / 16][4];
#pragma unroll
    for (int j = 0; j < kC / 16; ++j) acc_as_a(DA[j], D4, j, scD);
    wgmma_wait<0>();  // O's group: S^T's fragments are free
    reg_fence(OT);

    // dS^T = D^T KG (K = chunk rows, N = the 128 key rows, KG N-major: 16 rows a step), then
    // O2^T = D^T Aqk^T (K = chunk rows s, N = chunk rows t; into D^T's registers).
    float dS[64];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) {
      wgmma_f16_n128_tb(dS, DA[kk], smem_desc(sa + kSKG + kk * 2048, kSub64, 1024), kk > 0);
    }
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) {
      wgmma_f16_n64(DT, DA[kk], smem_desc(sa + kSAqk + kk * 32, 16, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<1>();  // dS's group (O2's may still run)
    reg_fence(dS);

    // The state's update (the chain to the next chunk), then the output.
    const float* el = reinterpret_cast<const float*>(st + kSEl);
#pragma unroll
    for (int n = 0; n < kDk / 8; ++n) {
      const float2 e2 = *reinterpret_cast<const float2*>(&el[8 * n + 2 * q]);
      ST[n][0] = fmaf(ST[n][0], e2.x, dS[4 * n] * invD[0]);
      ST[n][1] = fmaf(ST[n][1], e2.y, dS[4 * n + 1] * invD[0]);
      ST[n][2] = fmaf(ST[n][2], e2.x, dS[4 * n + 2] * invD[1]);
      ST[n][3] = fmaf(ST[n][3], e2.y, dS[4 * n + 3] * invD[1]);
    }
    wgmma_wait<0>();
    reg_fence(DT);

    // O = O^T invS + O2^T invD: rows 8 nt + 2 q + e, columns v0 + 2 g, + 1 as float2, through two
    // row pointers stepped by 8 rows (the bounds check only in a sequence's last, partial
    // chunk); streaming stores, as nothing here reads o again.
    const int t0 = c * kC, L = min(kC, T - t0);
    const int64_t rs = int64_t(H) * kDv;  // elements from one output row to the next
    using Out = std::conditional_t<kOBf16, __nv_bfloat16, float>;
    Out* o0 = static_cast<Out*>(p.o) + ((b * T + t0 + 2 * q) * H + h) * int64_t(kDv) + v0 + 2 * g;
    Out* o1 = o0 + rs;
#pragma unroll
    for (int nt = 0; nt < kC / 8; ++nt) {
      const float2 x0 = make_float2(fmaf(DT[4 * nt], invD[0], OT[4 * nt] * invS[0]),
                                    fmaf(DT[4 * nt + 2], invD[1], OT[4 * nt + 2] * invS[1]));
      const float2 x1 = make_float2(fmaf(DT[4 * nt + 1], invD[0], OT[4 * nt + 1] * invS[0]),
                                    fmaf(DT[4 * nt + 3], invD[1], OT[4 * nt + 3] * invS[1]));
      const int t = 8 * nt + 2 * q;
      if constexpr (kOBf16) {
        const __nv_bfloat162 y0 = __floats2bfloat162_rn(x0.x, x0.y);
        const __nv_bfloat162 y1 = __floats2bfloat162_rn(x1.x, x1.y);
        if (L == kC || t < L) {
          __stcs(reinterpret_cast<unsigned*>(o0), *reinterpret_cast<const unsigned*>(&y0));
        }
        if (L == kC || t + 1 < L) {
          __stcs(reinterpret_cast<unsigned*>(o1), *reinterpret_cast<const unsigned*>(&y1));
        }
      } else {
        if (L == kC || t < L) __stcs(reinterpret_cast<float2*>(o0), x0);
        if (L == kC || t + 1 < L) __stcs(reinterpret_cast<float2*>(o1), x1);
      }
      o0 += 8 * rs;
      o1 += 8 * rs;
    }
  }

  float* sout = p.state_out[b];
  if (sout) {
#pragma unroll
    for (int n = 0; n < kDk / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 8 * n + 2 * q + e;
        *reinterpret_cast<float2*>(&sout[plane + int64_t(r) * kDv + v0 + 2 * g]) =
            make_float2(ST[n][e], ST[n][e + 2]);
      }
    }
  }
}

}  // namespace

namespace memra::cuda::kda {

int launch_chunk_state(MemraCudaCtx* ctx, const ChunkProblem& p, int nc, const float* scratch) {
  const int64_t blocks = int64_t(p.B) * p.H * 2;
  if (blocks > 0x7fffffffLL) return memra::kContractShape;
  auto* kernel = p.o_bf16 ? chunk_state_kernel<true> : chunk_state_kernel<false>;
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, kernel, kSmemBytes));
  // Not a programmatic dependent of the intra kernel: launched early, its blocks (a whole SM's
  // shared memory each) cost the call time (docs/kda.md, session 16).
  memra::cuda::launch(ctx, false, kernel, dim3(static_cast<unsigned>(blocks)),
                      dim3(kThreads), kSmemBytes, p, nc, scratch);
  return launch_status();
}

}  // namespace memra::cuda::kda
