// KDA area, chunked delta-rule form (cuda/kda_chunk.cuh has the algebra and the scratch layout):
// the intra-chunk kernel, every chunk in parallel. It forms the chunk's Akk and Aqk, the
// triangular inverse Tm = (I + Akk)^-1, then W = Tm (beta k exp(G)), U = Tm (beta v), and the
// elementwise tiles KG, QG and exp(G_last), all into the chunk's scratch (W, KG, QG, Aqk f16).
//
// The 16-row sub-blocks off the diagonal take exp(G_t - G_r) exp(G_r - G_s) with r the first row
// of t's sub-block (s < r <= t: both factors <= 1) on tensor cores; the diagonal sub-blocks are
// summed element by element in f32, unless every g of the chunk is >= -kSafeG: then r is the
// sub-block's middle row and the diagonal blocks are tensor-core products too (fla's safe gate).
// The cumulative decay is kept in log2 units (G2 = log2(e) G, each step one fma), so the
// exponentials (up to 100K a chunk, the largest share of the kernel's instructions) are one
// ex2.approx.ftz each (exp2_ftz, kda_chunk_intra.cuh: relative error within about 1e-5
// wherever the result is a normal float, far under the TF32 operands' 2^-11; results below
// 2^-126 are 0).
//
// KDA reads q / k / g of the state head itself; GDN (kScalarG) reads q / k of key head h / group
// and one g per (row, head), broadcast over the channels: the values of KDA's kernel on GDN's
// expanded heads, without materialising them.
//
// Inputs in f32 or (kBf16, KDA) bf16: bf16 q / k / v / g are read at half the bytes and widened
// on load, exactly (a bf16 is the high half of its f32), into the same f32 tiles, so everything
// after the loads is one code path and the kernel's values are those of the f32 kernel on the
// widened inputs, bit for bit.
#include <cuda_bf16.h>

#include <type_traits>

#include "kda_chunk_intra.cuh"

using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::launch_status;

namespace {

// One block per (sequence b, head h, chunk c): blockIdx.x = (b * H + h) * nc + c.
template <bool kScalarG, bool kBf16>
__global__ void __launch_bounds__(kThreads, 2)
    chunk_intra_kernel(const memra::cuda::kda::ChunkProblem p, int nc,
                       float* __restrict__ scratch) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float4 smem_raw[];
  IntraSmem& sm = *reinterpret_cast<IntraSmem*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, qq = lane & 3;
  const int64_t bhc = blockIdx.x;
  const int c = static_cast<int>(bhc % nc);
  const int64_t bh = bhc / nc;
  const int H = p.H, T = p.T;
  const float scale = p.scale;
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int t0 = c * kC;
  const int L = min(kC, T - t0);
  float* out = scratch + bhc * kChunkFloats;
  // Row t of the chunk is row n0 + t of the inputs; (n0 + t) * H + h indexes beta (and g).
  const int64_t n0 = b * T + t0;
  using In = std::conditional_t<kBf16, __nv_bfloat16, float>;
  const In* qh = static_cast<const In*>(p.q) + n0 * p.ld_qk + int64_t(h / p.group) * kDk;
  const In* kh = static_cast<const In*>(p.k) + n0 * p.ld_qk + int64_t(h / p.group) * kDk;
  const In* vh = static_cast<const In*>(p.v) + n0 * p.ld_v + int64_t(h) * kDv;
  const In* gp = static_cast<const In*>(p.g);
  float* const tm = sm.q;
  float* const akk = sm.q + kC * kLdA;  // [64, kLdA]
  float* const x = sm.x;
  float* const sv = sm.G;  // beta v (TF32-rounded), once G is dead
  __half* const a_h = reinterpret_cast<__half*>(out + kOffA);  // [QG | Aqk], ld kLdOutA
  __half* const aqk_h = a_h + kDk;

  // Inputs, every tile with cp.async (all of a thread's copies in flight at once; the host
  // side guarantees 16-byte aligned rows: kda_scan.cu, gdn.cu); rows past L are zero-filled
  // (they add nothing anywhere). GDN's g is one value per row, broadcast over the channels.
  // A thread's copies: channels c4.. of rows r0, r0 + 8, ... (a compile-time trip count, so
  // its addresses sit at constant offsets).
  constexpr int kVec4 = kDk / 4, kLoadRows = kThreads / kVec4;
  static_assert(kThreads % kVec4 == 0 && kC % kLoadRows == 0, "whole passes");
  // bf16: 16-byte pieces of eight elements into registers, all in flight, then widened into
  // the tiles (widen_bf16x8, store_halves); a thread's pieces are channels c8.. of rows r8,
  // r8 + 16, ...
  constexpr int kVec8 = kDk / 8, kLoadRows8 = kThreads / kVec8;
  static_assert(kThreads % kVec8 == 0 && kC % kLoadRows8 == 0, "whole passes");
  const int r8 = tid / kVec8, c8 = 8 * (tid % kVec8);
  const bool swap8 = (tid >> 2) & 1;
  if constexpr (kBf16) {
    static_assert(!kScalarG, "bf16 inputs: KDA's per-channel g");
    constexpr int kIt = kC / kLoadRows8;
    uint4 kw[kIt], qw[kIt], gw[kIt];
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int r = r8 + it * kLoadRows8;
      const uint4 z = make_uint4(0u, 0u, 0u, 0u);
      const bool in = r < L;
      const int rr = in ? r : 0;  // rows past L: no address past the input
      const int64_t off = int64_t(rr) * p.ld_qk + c8;
      kw[it] = in ? __ldg(reinterpret_cast<const uint4*>(kh + off)) : z;
      qw[it] = in ? __ldg(reinterpret_cast<const uint4*>(qh + off)) : z;
      gw[it] = in ? __ldg(reinterpret_cast<const uint4*>(gp + ((n0 + rr) * H + h) * kDk + c8)) : z;
    }
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int r = r8 + it * kLoadRows8;
      float4 lo, hi;
      widen_bf16x8(kw[it], lo, hi);
      store_halves(&sm.k[r * kLd + c8], lo, hi, swap8);
      widen_bf16x8(qw[it], lo, hi);
      store_halves(&sm.q[r * kLd + c8], lo, hi, swap8);
      widen_bf16x8(gw[it], lo, hi);
      store_halves(&sm.G[r * kLd + c8], lo, hi, swap8);
    }
  } else {
    const int r0 = tid / kVec4, c4 = 4 * (tid % kVec4);
#pragma unroll
    for (int it = 0; it < kC / kLoadRows; ++it) {
      const int r = r0 + it * kLoadRows;
      const bool in = r < L;
      const int64_t off = int64_t(in ? r : 0) * p.ld_qk + c4;
      const int bytes = in ? 16 : 0;
      cp_async_16(&sm.k[r * kLd + c4], kh + off, bytes);
      cp_async_16(&sm.q[r * kLd + c4], qh + off, bytes);
      const int64_t gi = (n0 + (in ? r : 0)) * H + h;
      if constexpr (kScalarG) {
        const float gs = in ? __ldg(gp + gi) : 0.f;
        *reinterpret_cast<float4*>(&sm.G[r * kLd + c4]) = make_float4(gs, gs, gs, gs);
      } else {
        cp_async_16(&sm.G[r * kLd + c4], gp + gi * kDk + c4, bytes);
      }
    }
  }
  cp_async_commit();
  if (tid < kC) sm.beta[tid] = tid < L ? __ldg(p.beta + (n0 + tid) * H + h) : 0.f;
  cp_async_wait<0>();
  __syncthreads();

  // G2 = log2(e) G: the inclusive cumulative sum over the chunk's rows in log2 units (every
  // exponential below is a power of two of a difference of G2), one channel per thread of warps
  // 0-3, the column in registers (its loads all in flight, then the chain of fmas); the smallest
  // g of the chunk on the way (KDA's safe gate; the zero rows past L change no decision).
  static_assert(kDk == 4 * 32, "the cumulative sum's four warps");
  if (tid < kDk) {
    float gv[kC];
#pragma unroll
    for (int r = 0; r < kC; ++r) gv[r] = sm.G[r * kLd + tid];
    float acc = 0.f, gmin = 0.f;
#pragma unroll
    for (int r = 0; r < kC; ++r) {
      gmin = fminf(gmin, gv[r]);
      acc = __fmaf_rn(gv[r], kLog2e, acc);
      sm.G[r * kLd + tid] = acc;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) gmin = fminf(gmin, __shfl_xor_sync(0xffffffffu, gmin, o));
    if (lane == 0) sm.gmin[warp] = gmin;
  }
  __syncthreads();
  bool safe = !kScalarG;  // block-uniform
#pragma unroll
  for (int w = 0; w < kDk / 32; ++w) safe = safe && sm.gmin[w] >= -kSafeG;

  // Aqk is zero above the diagonal within the diagonal 16 x 16 blocks, which the state kernel
  // reads whole; it never reads the blocks above them (left unwritten). A thread per (row, four
  // columns) of those blocks; the products below write the elements on and under the diagonal.
  static_assert(kThreads == (kC / kSub) * kSub * (kSub / 4), "one pass");
  {
    const int rr = (tid >> 2) & (kSub - 1), t = (tid >> 6) * kSub + rr, c0 = 4 * (tid & 3);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (c0 + e > rr) aqk_h[t * kLdOutA + (t - rr) + c0 + e] = __float2half_rn(0.f);
    }
  }

  // Akk's tensor-core tiles, beta applied, stay in registers until q's tile is dead (tile_plan).
  int I, first, count;
  tile_plan(kScalarG || safe, warp, I, first, count);
  float dk4[kMaxTiles][4];
#pragma unroll
  for (int j = 0; j < kMaxTiles; ++j) dk4[j][0] = dk4[j][1] = dk4[j][2] = dk4[j][3] = 0.f;

  if constexpr (!kScalarG) {
    // Diagonal sub-blocks of a chunk that is not safe, element by element: a warp per (t, s)
    // pair (s <= t: 136 a block), a lane per 4 channels.
    constexpr int kPairs = kSub * (kSub + 1) / 2;
    for (int pr = safe ? (kC / kSub) * kPairs : warp; pr < (kC / kSub) * kPairs;
         pr += kThreads / 32) {
      const int blk = pr / kPairs, idx = pr % kPairs;
      // idx = i (i + 1) / 2 + j, j <= i (warp-uniform). sqrtf is correctly rounded and exact at
      // the perfect squares 8 idx + 1 = (2 i + 1)^2; elsewhere the root is over 0.1 from an odd
      // integer (idx <= 135), so the floor is right; the two checks are belt and braces.
      int i = static_cast<int>((sqrtf(float(8 * idx + 1)) - 1.f) * 0.5f);
      if ((i + 1) * (i + 2) / 2 <= idx) ++i;
      if (i * (i + 1) / 2 > idx) --i;
      const int j = idx - i * (i + 1) / 2;
      const int t = blk * kSub + i, s = blk * kSub + j;
      const float4 kt = *reinterpret_cast<const float4*>(&sm.k[t * kLd + 4 * lane]);
      const float4 qt = *reinterpret_cast<const float4*>(&sm.q[t * kLd + 4 * lane]);
      const float4 ks = *reinterpret_cast<const float4*>(&sm.k[s * kLd + 4 * lane]);
      const float4 gt = *reinterpret_cast<const float4*>(&sm.G[t * kLd + 4 * lane]);
      const float4 gs = *reinterpret_cast<const float4*>(&sm.G[s * kLd + 4 * lane]);
      const float e0 = exp2_ftz(gt.x - gs.x), e1 = exp2_ftz(gt.y - gs.y),
                  e2 = exp2_ftz(gt.z - gs.z), e3 = exp2_ftz(gt.w - gs.w);
      float skk = kt.x * ks.x * e0 + kt.y * ks.y * e1 + kt.z * ks.z * e2 + kt.w * ks.w * e3;
      float sqk = qt.x * ks.x * e0 + qt.y * ks.y * e1 + qt.z * ks.z * e2 + qt.w * ks.w * e3;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        skk += __shfl_xor_sync(0xffffffffu, skk, o);
        sqk += __shfl_xor_sync(0xffffffffu, sqk, o);
      }
      if (lane == 0) {
        if (j < i) x[t * kSub + j] = sm.beta[t] * skk;
        aqk_h[t * kLdOutA + s] = __float2half_rn(scale * sqk);
      }
    }

    // Sub-blocks on tensor cores. Row t of block I meets column s of block J through
    // exp(G_t - G_r) exp(G_r - G_s), r a reference row of block I. A safe chunk: r = 16 I + 8
    // for every J <= I (the products above the diagonal are dropped). Otherwise J < I with
    // r = 16 I (s < r <= t: both factors <= 1). A warp forms its row block's A operands once
    // per k-step for all its column tiles (tile_plan). The channel sum's order is free, so the
    // fragment's k = q and q + 4 are channels k0 + 2 q and k0 + 2 q + 1 in A and B alike: every
    // shared-memory operand is one float2 load.
    if (count > 0) {
      const int rb = I * kSub, r = rb + (safe ? kSub / 2 : 0);
      float dq4[kMaxTiles][4];
#pragma unroll
      for (int j = 0; j < kMaxTiles; ++j) dq4[j][0] = dq4[j][1] = dq4[j][2] = dq4[j][3] = 0.f;
#pragma unroll 2
      for (int k0 = 0; k0 < kDk; k0 += 8) {
        uint32_t ak[4], aq[4];
        const int ch = k0 + 2 * qq;
        const float2 gr = ld2(&sm.G[r * kLd + ch]);
#pragma unroll
        for (int h8 = 0; h8 < 2; ++h8) {  // rows t = rb + gq (a0, a2), + 8 (a1, a3)
          const int t = rb + gq + 8 * h8;
          const float2 gt = ld2(&sm.G[t * kLd + ch]), kt = ld2(&sm.k[t * kLd + ch]),
                       qt = ld2(&sm.q[t * kLd + ch]);
          const float f0 = exp2_ftz(gt.x - gr.x), f1 = exp2_ftz(gt.y - gr.y);
          ak[h8] = tf32(kt.x * f0);
          ak[h8 + 2] = tf32(kt.y * f1);
          aq[h8] = tf32(qt.x * f0);
          aq[h8 + 2] = tf32(qt.y * f1);
        }
#pragma unroll
        for (int j = 0; j < kMaxTiles; ++j) {
          if (j < count) {  // warp-uniform
            const int s = 8 * (first + j) + gq;
            const float2 ks = ld2(&sm.k[s * kLd + ch]), gs = ld2(&sm.G[s * kLd + ch]);
            const uint32_t bb[2] = {tf32(ks.x * exp2_ftz(gr.x - gs.x)),
                                    tf32(ks.y * exp2_ftz(gr.y - gs.y))};
            mma_tf32(dk4[j], ak, bb);
            mma_tf32(dq4[j], aq, bb);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kMaxTiles; ++j) {
        if (j < count) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int t = rb + gq + (e >> 1) * 8, s = 8 * (first + j) + 2 * qq + (e & 1);
            if (s < t) dk4[j][e] = sm.beta[t] * dk4[j][e];
          }
          // Aqk in column pairs (s even; the odd one zero above the diagonal, as the fill).
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int t = rb + gq + hh * 8, s = 8 * (first + j) + 2 * qq;
            if (s <= t) {
              *reinterpret_cast<__half2*>(&aqk_h[t * kLdOutA + s]) = __floats2half2_rn(
                  scale * dq4[j][2 * hh], s + 1 <= t ? scale * dq4[j][2 * hh + 1] : 0.f);
            }
          }
        }
      }
    }
  } else {
    // GDN: one decay per (row, head), so exp(G_t - G_s) leaves the channel sums: Akk and Aqk are
    // k k^T and q k^T on tensor cores over the sub-blocks J <= I (tile_plan's safe plan), each
    // element then scaled by its exp(G_t - G_s) (s <= t: exponent <= 0). Channel 0 of the G
    // tile holds the head's G.
    const int r0 = I * kSub;
    float dq4[kMaxTiles][4];
#pragma unroll
    for (int j = 0; j < kMaxTiles; ++j) dq4[j][0] = dq4[j][1] = dq4[j][2] = dq4[j][3] = 0.f;
#pragma unroll 2
    for (int k0 = 0; k0 < kDk; k0 += 8) {
      // k = q, q + 4 are channels k0 + 2 q, + 1 (as in KDA's products above): float2 loads.
      const int ch = k0 + 2 * qq;
      uint32_t ak[4], aq[4];
#pragma unroll
      for (int h8 = 0; h8 < 2; ++h8) {
        const int t = r0 + gq + 8 * h8;
        const float2 kt = ld2(&sm.k[t * kLd + ch]), qt = ld2(&sm.q[t * kLd + ch]);
        ak[h8] = tf32(kt.x);
        ak[h8 + 2] = tf32(kt.y);
        aq[h8] = tf32(qt.x);
        aq[h8 + 2] = tf32(qt.y);
      }
#pragma unroll
      for (int j = 0; j < kMaxTiles; ++j) {
        if (j < count) {
          const int s = 8 * (first + j) + gq;
          const float2 ks = ld2(&sm.k[s * kLd + ch]);  // B(channel, s) = k_s[channel]
          const uint32_t bb[2] = {tf32(ks.x), tf32(ks.y)};
          mma_tf32(dk4[j], ak, bb);
          mma_tf32(dq4[j], aq, bb);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kMaxTiles; ++j) {
      if (j < count) {
        float av[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = r0 + gq + (e >> 1) * 8, s = 8 * (first + j) + 2 * qq + (e & 1);
          av[e] = 0.f;  // zero above the diagonal, as the fill
          if (s <= t) {
            const float f = exp2f(sm.G[t * kLd] - sm.G[s * kLd]);
            if (s < t) dk4[j][e] = sm.beta[t] * (dk4[j][e] * f);
            av[e] = scale * (dq4[j][e] * f);
          }
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {  // Aqk in column pairs (s even)
          const int t = r0 + gq + hh * 8, s = 8 * (first + j) + 2 * qq;
          if (s <= t) {
            *reinterpret_cast<__half2*>(&aqk_h[t * kLdOutA + s]) =
                __floats2half2_rn(av[2 * hh], av[2 * hh + 1]);
          }
        }
      }
    }
  }
  __syncthreads();

  // Once the A's have read k: scale q exp(G) and k exp(G_last - G) to scratch (f16; rows past L
  // are zeros; G_last = G of row L - 1, which the zero-padded rows repeat up to row 63),
  // exp(G_last), and beta k exp(G) over k (each element read and written by one thread). The
  // stored factors are f16 or TF32 operands: exp2_ftz's error does not show. beta k exp(G) is
  // stored TF32-rounded (the W product's B operand, read without a cvt).
  __half* const kg_h = reinterpret_cast<__half*>(out + kOffKG);
  // A thread keeps a pair of channels (8-byte shared loads, 4-byte f16 pair stores) and takes
  // every fourth row, its loads for four rows issued together (the stores to k would otherwise
  // order them one row at a time).
  {
    constexpr int kPairs = kDk / 2;
    constexpr int kRowStep = kThreads / kPairs, kBatch = 4;
    static_assert(kThreads % kPairs == 0 && kC % (kRowStep * kBatch) == 0, "whole batches");
    const int ch = 2 * (tid % kPairs);
    const float2 gl = *reinterpret_cast<const float2*>(&sm.G[(kC - 1) * kLd + ch]);
    if (tid < kPairs) {  // the state's decay: the accurate exp
      *reinterpret_cast<float2*>(&out[kOffEl + ch]) = make_float2(exp2f(gl.x), exp2f(gl.y));
    }
    for (int r0 = tid / kPairs; r0 < kC; r0 += kRowStep * kBatch) {
      float2 gr[kBatch], kv[kBatch], qv[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = r0 + u * kRowStep;
        gr[u] = *reinterpret_cast<const float2*>(&sm.G[r * kLd + ch]);
        kv[u] = *reinterpret_cast<const float2*>(&sm.k[r * kLd + ch]);
        qv[u] = *reinterpret_cast<const float2*>(&sm.q[r * kLd + ch]);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = r0 + u * kRowStep;
        const float b = sm.beta[r];
        const float egx = exp2_ftz(gr[u].x), egy = exp2_ftz(gr[u].y);
        *reinterpret_cast<__half2*>(&a_h[r * kLdOutA + ch]) =
            __floats2half2_rn(__fmul_rn(__fmul_rn(qv[u].x, scale), egx),
                              __fmul_rn(__fmul_rn(qv[u].y, scale), egy));
        *reinterpret_cast<__half2*>(&kg_h[r * kDk + ch]) =
            __floats2half2_rn(__fmul_rn(kv[u].x, exp2_ftz(__fsub_rn(gl.x, gr[u].x))),
                              __fmul_rn(kv[u].y, exp2_ftz(__fsub_rn(gl.y, gr[u].y))));
        *reinterpret_cast<float2*>(&sm.k[r * kLd + ch]) =
            make_float2(round_tf32(b * kv[u].x * egx), round_tf32(b * kv[u].y * egy));
      }
    }
  }
  __syncthreads();
  // G and q are dead: v streams into G's tile (waited for before the W / U products) while Akk
  // goes into q's tile and the inverse runs.
  static_assert(kDv == kDk, "v's copies take q / k's pattern");
  // bf16 v lands as it is, [64, 128] contiguous, at the end of G's tile, and is widened there
  // once the inverse is done (the widened rows overlap it: a barrier between the two).
  __nv_bfloat16* const v_stage =
      reinterpret_cast<__nv_bfloat16*>(sm.G + kC * kLd - kC * kDv / 2);
  static_assert((kC * kLd - kC * kDv / 2) % 4 == 0, "16-byte aligned staging");
  if constexpr (kBf16) {
#pragma unroll
    for (int it = 0; it < kC / kLoadRows8; ++it) {
      const int r = r8 + it * kLoadRows8;
      const bool in = r < L;
      cp_async_16(v_stage + r * kDv + c8, vh + int64_t(in ? r : 0) * p.ld_v + c8, in ? 16 : 0);
    }
  } else {
#pragma unroll
    for (int it = 0; it < kC / kLoadRows; ++it) {
      const int r = tid / kVec4 + it * kLoadRows, c4 = 4 * (tid % kVec4);
      const bool in = r < L;
      cp_async_16(&sv[r * kLd + c4], vh + int64_t(in ? r : 0) * p.ld_v + c4, in ? 16 : 0);
    }
  }
  cp_async_commit();
  // Akk's strictly lower part (the only part the inverse reads): every warp's tensor-core tiles
  // from its registers, an unsafe chunk's diagonal sub-blocks from x.
#pragma unroll
  for (int j = 0; j < kMaxTiles; ++j) {
    if (j < count) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = I * kSub + gq + (e >> 1) * 8, s = 8 * (first + j) + 2 * qq + (e & 1);
        if (s < t) akk[t * kLdA + s] = dk4[j][e];
      }
    }
  }
  if (!kScalarG && !safe) {
    for (int i = tid; i < kC * kSub; i += kThreads) {
      const int t = i / kSub, j = i % kSub;
      if (j < t % kSub) akk[t * kLdA + (t / kSub) * kSub + j] = x[i];
    }
  }
  __syncthreads();

  // (I + Akk)^-1, unit lower triangular, at f32 precision (over q: no longer read). The four
  // diagonal 16 x 16 blocks in f32 by forward substitution (warps 0-3, a lane per column, the
  // column in registers: the chain is the adds alone); every element of those blocks is
  // written. The column's entries above the diagonal are zeros, so the sums may start at m = 0:
  // each term m < lane subtracts an exact zero.
  if (warp < 4 && lane < kSub) {
    const int base = warp * kSub, col = base + lane;
    float tc[kSub];
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      const int row = base + i;
      float xv = 0.f;
#pragma unroll
      for (int m = 0; m < i; ++m) xv -= akk[row * kLdA + base + m] * tc[m];
      xv = i < lane ? 0.f : (i == lane ? 1.f : xv);
      tc[i] = xv;
      tm[row * kLdA + col] = xv;
    }
  }
  __syncthreads();

  // The blocks below the diagonal by levels (d = I - J): T_IJ = -T_II sum_{M=J}^{I-1} A_IM T_MJ,
  // each level in two steps (X = the sum, then -T_II X), on tensor cores in 3xTF32: every
  // operand split x = hi + lo (both TF32, x - hi exact), the products lo hi + hi lo + hi hi
  // summed in f32, which keeps the inverse at f32's precision (the dropped lo lo term is under
  // 2^-22 of each product) where one TF32 product would round each operand to 2^-11. A warp per
  // (block, 8-column half) of the level: 6, 4 and 2 of the 8 warps.
  {
    const int pj = warp >> 1, n8 = 8 * (warp & 1);
#pragma unroll
    for (int d = 1; d < 4; ++d) {
      if (pj < 4 - d) {
        const int J = pj, I = pj + d;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k0 = 16 * J; k0 < 16 * I; k0 += 8) {  // A_IM T_MJ over M = J .. I - 1
          mma_3xtf32(acc, akk + 16 * I * kLdA, kLdA, tm + 16 * J + n8, kLdA, k0, gq, qq);
        }
        float* const xo = x + pj * kSub * kLdX + n8 + 2 * qq;
        *reinterpret_cast<float2*>(&xo[gq * kLdX]) = make_float2(acc[0], acc[1]);
        *reinterpret_cast<float2*>(&xo[(gq + 8) * kLdX]) = make_float2(acc[2], acc[3]);
      }
      __syncthreads();
      if (pj < 4 - d) {
        const int J = pj, I = pj + d;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k0 = 0; k0 < kSub; k0 += 8) {  // T_II X (T_II is zero above its diagonal)
          mma_3xtf32(acc, tm + 16 * I * kLdA + 16 * I, kLdA, x + pj * kSub * kLdX + n8, kLdX,
                     k0, gq, qq);
        }
        float* const to = tm + (16 * I + gq) * kLdA + 16 * J + n8 + 2 * qq;
        *reinterpret_cast<float2*>(to) = make_float2(-acc[0], -acc[1]);
        *reinterpret_cast<float2*>(to + 8 * kLdA) = make_float2(-acc[2], -acc[3]);
      }
      __syncthreads();
    }
  }
  // v: each thread waits for its own copies and turns them into beta v rounded to TF32 in place
  // (U's B operand, then read without a cvt, the bits the products formed before), so the
  // barrier below covers them.
  cp_async_wait<0>();
  if constexpr (kBf16) {
    constexpr int kIt = kC / kLoadRows8;
    uint4 vw[kIt];
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      vw[it] = *reinterpret_cast<const uint4*>(v_stage + (r8 + it * kLoadRows8) * kDv + c8);
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int r = r8 + it * kLoadRows8;
      const float b = sm.beta[r];
      float4 lo, hi;
      widen_bf16x8(vw[it], lo, hi);
      store_halves(&sv[r * kLd + c8], scaled_tf32(lo, b), scaled_tf32(hi, b), swap8);
    }
  } else {
#pragma unroll
    for (int it = 0; it < kC / kLoadRows; ++it) {
      const int r = tid / kVec4 + it * kLoadRows, c4 = 4 * (tid % kVec4);
      float4* const pv = reinterpret_cast<float4*>(&sv[r * kLd + c4]);
      *pv = scaled_tf32(*pv, sm.beta[r]);
    }
  }
  __syncthreads();

  // W = Tm (beta k exp(G)) (warps 0-3), U = Tm (beta v) (warps 4-7). Tm is lower triangular,
  // so row block I's products run over k < 16 (I + 1): 2 (I + 1) k-steps. A warp takes row
  // blocks {0, 3} or {1, 2} (10 k-steps either way) for one half of the columns, so every warp
  // carries the same work (v's rows past L are zeros, and so is their beta v).
  {
    const bool is_w = warp < 4;
    const float* const bsrc = is_w ? sm.k : sv;  // both stored TF32-rounded
    const int pair = (warp >> 1) & 1, n0 = (warp & 1) * (kDk / 16);  // n0: first column tile
#pragma unroll 1
    for (int blk = 0; blk < 2; ++blk) {
      const int mi = pair == 0 ? (blk == 0 ? 3 : 0) : (blk == 0 ? 2 : 1);
      float acc[kDk / 16][4];
#pragma unroll
      for (int n = 0; n < kDk / 16; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
      for (int k0 = 0; k0 < (mi + 1) * kSub; k0 += 8) {
        uint32_t a[4];
        load_a(a, tm, kLdA, mi * kSub, k0, gq, qq);
#pragma unroll
        for (int n = 0; n < kDk / 16; ++n) {
          uint32_t bb[2];
          load_b_rounded(bb, bsrc, kLd, k0, (n0 + n) * 8, gq, qq);
          mma_tf32(acc[n], a, bb);
        }
      }
#pragma unroll
      for (int n = 0; n < kDk / 16; ++n) {
        const int r = mi * kSub + gq, col = (n0 + n) * 8 + 2 * qq;
        if (is_w) {  // W, f16
          __half* w = reinterpret_cast<__half*>(out + kOffW);
          *reinterpret_cast<__half2*>(w + r * kDk + col) =
              __floats2half2_rn(acc[n][0], acc[n][1]);
          *reinterpret_cast<__half2*>(w + (r + 8) * kDk + col) =
              __floats2half2_rn(acc[n][2], acc[n][3]);
        } else {  // U, f32
          float* u = out + kOffU;
          *reinterpret_cast<float2*>(u + r * kDv + col) = make_float2(acc[n][0], acc[n][1]);
          *reinterpret_cast<float2*>(u + (r + 8) * kDv + col) =
              make_float2(acc[n][2], acc[n][3]);
        }
      }
    }
  }
}

}  // namespace

namespace memra::cuda::kda {

int launch_chunk_intra(MemraCudaCtx* ctx, const ChunkProblem& p, int nc, float* scratch) {
  const int64_t chunks = int64_t(p.B) * p.H * nc;
  if (chunks > 0x7fffffffLL) return memra::kContractShape;
  if (p.scalar_g && p.in_bf16) return memra::kUnsupportedGeometry;  // not instantiated
  auto* kernel = p.scalar_g ? chunk_intra_kernel<true, false>
                            : (p.in_bf16 ? chunk_intra_kernel<false, true>
                                         : chunk_intra_kernel<false, false>);
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, kernel, sizeof(IntraSmem)));
  memra::cuda::launch(ctx, true, kernel, dim3(static_cast<unsigned>(chunks)), dim3(kThreads),
                      sizeof(IntraSmem), p, nc, scratch);
  return launch_status();
}

}  // namespace memra::cuda::kda
