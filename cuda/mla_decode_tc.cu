// The tensor-core kernel of the batched MLA decode (cuda/mla_decode.cu has the plan and the
// entry): bf16 latent caches with R in {128, 256, 512}, mma.sync.m16n8k16 bf16 -> f32.
//
// All HB = 16 * MT heads of a block (MT = 4 m-tiles for H > 32 at B >= 32, else 2) share each
// cache row: the row is read from HBM once per (sequence, split) and feeds both products.
// Tiles: 64 rows; 8 warps. QK: warp w computes S[16 heads (m-tile w % MT) x 8 * MT rows
// (row group w / MT)] over the whole rank: per 16-wide k-step one ldmatrix.x4 of Q (A), MT / 2
// ldmatrix.x4 of the cache rows (B, non-transposed), MT mma. Softmax: per-warp row maxima are
// exchanged through shared memory (8 / MT row groups), p = exp2(s * scale * log2e - m) rounded
// to bf16 and stored as P [HB, 64]; each thread keeps partial row sums of the *rounded* p for its
// two heads (so o = sum p~ c / sum p~ is an exact convex combination up to f32 accumulation).
// PV: warp w owns O[all HB heads, columns w * R / 8 ... + R / 8] in registers (MT * R / 16 f32
// per thread: 128 at MT = 4, R = 512): per 16-row k-step MT ldmatrix.x4 of P (A) and R / 128
// ldmatrix.x4.trans of the cache tile (B), MT * R / 64 mma. Every cache byte is read once from
// HBM; from shared memory it is read MT times by QK (each B fragment serves the MT warps of
// its row group), once by PV, and Q once per row group per tile.
// Pipeline: 2 stages; tile t + 1 is fetched by 16-byte cp.async (rows past the range
// zero-filled, never read from global) while tile t is computed.
// Shared memory (R = 512, MT = 4): Q bf16 [64][520] 65 KiB + 2 cache stages [64][520] 130 KiB
// + P [64][72] 9 KiB + maxima / partial sums / running max / alpha 1.75 KiB = 205.75 KiB (rows
// padded by 16 bytes: the 8 row addresses of every ldmatrix phase hit distinct 16-byte bank
// groups); one block per SM (__launch_bounds__(256, 1); O is 128 registers per thread).
// Rope columns (DR = 64, MT = 2 only; Kimi-Linear): rows of D = R + DR, Q = [q_lat | q_pe]; QK
// runs over all D columns (D / 16 k-steps), PV and O over the first R. Shared memory at R = 512:
// Q [32][584] 36.5 KiB + 2 stages [64][584] 146 KiB + P 4.5 KiB + 1.4 KiB = 188.4 KiB (4 m-tiles
// would need 229.75 KiB, above the 227 KiB opt-in).
// Precision: q_lat is rounded to bf16 (2^-9 relative per element) for the QK product; the cache
// is bf16 already; p is rounded to bf16 for the PV product; scores, the softmax statistics
// (running max, alpha, sums) and both accumulations are f32 (the error against the f32 CPU op:
// docs/mla.md).
#include <cfloat>
#include <cstdint>

#include "common.cuh"
#include "mma_bf16.cuh"
#include "mla_common.cuh"
#include "mla_decode.cuh"

using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait_all;
using memra::cuda::launch_status;
using memra::cuda::smem_u32;
using memra::cuda::mla::allow_smem;

namespace {

using memra::cuda::ldsm_x4;
using memra::cuda::ldsm_x4_trans;
using memra::cuda::mma_bf16;
using memra::cuda::pack_bf16x2;

constexpr int kStages = 2;
constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------- PTX helpers

// ---------------------------------------------------------------- tensor-core kernel

// Q pairs a thread loads before storing any (the rope form): the largest divisor of its pairs up
// to 16 (36 at MT = 2, R = 512, DR = 64: batches of 12).
constexpr int q_batch(int per) {
  for (int b = 16; b > 1; --b) {
    if (per % b == 0) return b;
  }
  return 1;
}

// DR: rope columns after the R latent ones (0: latent-only rows). QK runs over the D = R + DR
// columns of Q and the cache rows, PV and the output over the first R.
template <int MT, int R, int DR = 0>
struct Tc {
  static constexpr int D = R + DR;            // columns of a Q / cache row
  static constexpr int HB = 16 * MT;          // heads per block
  static constexpr int QS = D + 8;            // Q / cache row stride in bf16 (+16 bytes)
  static constexpr int PS = kTileRows + 8;    // P row stride in bf16 (+16 bytes)
  static constexpr int NRG = kWarps / MT;     // QK row groups
  static constexpr int RW = kTileRows / NRG;  // rows per QK warp (8 * MT)
  static constexpr int NTS = RW / 8;          // S n-tiles per warp
  static constexpr int CW = R / kWarps;       // O columns per warp
  static constexpr int NTO = CW / 8;          // O n-tiles per warp
  static constexpr int CPR = D / 8;           // 16-byte chunks per cache row
  static constexpr size_t q_off = 0;
  static constexpr size_t c_off = q_off + sizeof(__nv_bfloat16) * HB * QS;
  static constexpr size_t p_off = c_off + sizeof(__nv_bfloat16) * kStages * kTileRows * QS;
  static constexpr size_t red_off = p_off + sizeof(__nv_bfloat16) * HB * PS;  // f32 [NRG][HB]
  static constexpr size_t lpart_off = red_off + sizeof(float) * NRG * HB;    // f32 [NRG][HB]
  static constexpr size_t mrun_off = lpart_off + sizeof(float) * NRG * HB;   // f32 [2][HB]
  static constexpr size_t alpha_off = mrun_off + sizeof(float) * 2 * HB;     // f32 [HB]
  static constexpr size_t bytes = alpha_off + sizeof(float) * HB;
  static_assert(NTS % 2 == 0 && NTO % 2 == 0, "fragments are loaded in pairs of n-tiles");
  static_assert(R % 128 == 0 && R <= 512, "R in {128, 256, 512}");
  static_assert(DR % 16 == 0, "rope columns in whole 16-wide k-steps");
  static_assert(c_off % 16 == 0 && p_off % 16 == 0 && red_off % 16 == 0, "16-byte alignment");
};

// Block (split blockIdx.x, sequence blockIdx.y, head group blockIdx.z). See the file comment.
// DR > 0: rows of R + DR, Q = [q_lat | q_pe] (both rounded to bf16) over the same columns.
template <int MT, int R, int DR, bool kGather>
__device__ __forceinline__ void decode_tc_body(const DecodeArgs& a) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  using S = Tc<MT, R, DR>;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem + S::q_off);
  __nv_bfloat16* cs = reinterpret_cast<__nv_bfloat16*>(smem + S::c_off);
  __nv_bfloat16* ps = reinterpret_cast<__nv_bfloat16*>(smem + S::p_off);
  float* red_max = reinterpret_cast<float*>(smem + S::red_off);
  float* l_part = reinterpret_cast<float*>(smem + S::lpart_off);
  float* m_run = reinterpret_cast<float*>(smem + S::mrun_off);
  float* alpha_s = reinterpret_cast<float*>(smem + S::alpha_off);

  const int split = blockIdx.x, b = blockIdx.y, h0 = blockIdx.z * S::HB;
  const int nh = min(S::HB, a.H - h0);
  const int n = rows_of(a, b);
  if (n <= 0) {  // idle row / empty list: zeros, nothing read (uniform over the block)
    if (split == 0) zero_heads(a, b, h0, nh);
    return;
  }
  const int begin = split * a.chunk;
  if (begin >= n) return;
  const int end = min(n, begin + a.chunk);
  const int nsb = (n + a.chunk - 1) / a.chunk;  // active splits of this sequence
  const int ntiles = (end - begin + kTileRows - 1) / kTileRows;
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(a.caches[b]);
  const int32_t* list = kGather ? a.list + static_cast<int64_t>(b) * a.width : nullptr;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // Tile t of this split into stage st: 64 rows x D, 16 bytes per cp.async; rows past `end`
  // zero-filled (their scores are masked; zeros keep 0 * c finite in PV).
  auto load_tile = [&](int t, int st) {
    const int t0 = begin + t * kTileRows;
    __nv_bfloat16* dst = cs + static_cast<size_t>(st) * kTileRows * S::QS;
#pragma unroll 4
    for (int c = tid; c < kTileRows * S::CPR; c += kThreads) {
      const int j = c / S::CPR, k = c - j * S::CPR;
      const int e = t0 + j;
      const bool valid = e < end;
      int64_t row = 0;
      if (valid) row = kGather ? list[e] : e;
      cp_async_16(dst + j * S::QS + k * 8, cache + row * S::D + k * 8, valid ? 16 : 0);
    }
    cp_async_commit();
  };
  load_tile(0, 0);

  // Q rounded to bf16 (heads past nh zero), running max init. Scalar loads (no alignment
  // needed), kQBatch pairs per thread issued before any is stored: one pass per batch instead of
  // one L2 round trip per pair (64 of them at HB = 64, R = 512, in a row).
  if constexpr (DR == 0) {
    const float* qb = a.q_lat + (static_cast<int64_t>(b) * a.H + h0) * R;
    constexpr int kQPer = S::HB * (R / 2) / kThreads;  // pairs per thread
    static_assert(S::HB * (R / 2) % kThreads == 0, "whole batches of Q pairs");
    constexpr int kQBatch = kQPer < 16 ? kQPer : 16;
    static_assert(kQPer % kQBatch == 0, "whole batches of Q pairs");
    for (int k0 = 0; k0 < kQPer; k0 += kQBatch) {
      float v0[kQBatch], v1[kQBatch];
#pragma unroll
      for (int u = 0; u < kQBatch; ++u) {
        const int k = tid + (k0 + u) * kThreads;
        const int h = k / (R / 2), c2 = k - h * (R / 2);
        v0[u] = h < nh ? __ldg(qb + static_cast<int64_t>(h) * R + 2 * c2) : 0.0f;
        v1[u] = h < nh ? __ldg(qb + static_cast<int64_t>(h) * R + 2 * c2 + 1) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kQBatch; ++u) {
        const int k = tid + (k0 + u) * kThreads;
        const int h = k / (R / 2), c2 = k - h * (R / 2);
        *reinterpret_cast<uint32_t*>(qs + h * S::QS + 2 * c2) = pack_bf16x2(v0[u], v1[u]);
      }
    }
    if (tid < S::HB) m_run[tid] = -INFINITY;  // m_run[0][h]
  } else {
    // The same over the D / 2 column pairs of [q_lat | q_pe] (R and DR even: a pair never
    // straddles the two); batches of the largest divisor of the pairs per thread up to 16.
    constexpr int D = S::D;
    const int64_t bh0 = static_cast<int64_t>(b) * a.H + h0;
    const float* qb = a.q_lat + bh0 * R;
    const float* pb = a.q_pe + bh0 * DR;
    constexpr int kQPer = S::HB * (D / 2) / kThreads;  // pairs per thread
    static_assert(S::HB * (D / 2) % kThreads == 0, "whole batches of Q pairs");
    constexpr int kQBatch = q_batch(kQPer);
    static_assert(kQPer % kQBatch == 0, "whole batches of Q pairs");
    for (int k0 = 0; k0 < kQPer; k0 += kQBatch) {
      float v0[kQBatch], v1[kQBatch];
#pragma unroll
      for (int u = 0; u < kQBatch; ++u) {
        const int k = tid + (k0 + u) * kThreads;
        const int h = k / (D / 2), c = 2 * (k - h * (D / 2));
        const float* src = c < R ? qb + static_cast<int64_t>(h) * R + c
                                 : pb + static_cast<int64_t>(h) * DR + (c - R);
        v0[u] = h < nh ? __ldg(src) : 0.0f;
        v1[u] = h < nh ? __ldg(src + 1) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kQBatch; ++u) {
        const int k = tid + (k0 + u) * kThreads;
        const int h = k / (D / 2), c2 = k - h * (D / 2);
        *reinterpret_cast<uint32_t*>(qs + h * S::QS + 2 * c2) = pack_bf16x2(v0[u], v1[u]);
      }
    }
    if (tid < S::HB) m_run[tid] = -INFINITY;  // m_run[0][h]
  }

  // Fragment addressing (see mma_bf16): A / transposed-B lanes: row (lane & 7) + 8 * bit 3,
  // column 8 * bit 4; non-transposed B lanes: row (lane & 7) + 8 * bit 4, column 8 * bit 3.
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
  const int b_row = (lane & 7) + ((lane >> 4) & 1) * 8, b_col = ((lane >> 3) & 1) * 8;
  const int g = lane >> 2, tq = lane & 3;
  const int qk_mt = warp % MT, qk_rg = warp / MT;
  const float sl2 = a.scale * kLog2e;

  float o[MT][S::NTO][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < S::NTO; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.0f;
  float l_thr[2] = {0.0f, 0.0f};  // partial sums of heads qk_mt*16 + g (+8) over this thread's cols

  for (int t = 0; t < ntiles; ++t) {
    cp_async_wait_all();
    __syncthreads();  // S1: tile t visible; PV of t-1 done (its stage and P are free)
    if (t + 1 < ntiles) load_tile(t + 1, (t + 1) & 1);
    const __nv_bfloat16* ct = cs + static_cast<size_t>(t & 1) * kTileRows * S::QS;
    const int nvalid = min(kTileRows, end - (begin + t * kTileRows));

    // ---- S = Q C^T for 16 heads x RW rows
    float sacc[S::NTS][4];
#pragma unroll
    for (int nt = 0; nt < S::NTS; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[nt][e] = 0.0f;
    {
      const __nv_bfloat16* qa = qs + (qk_mt * 16 + a_row) * S::QS + a_col;
      const __nv_bfloat16* cb = ct + (qk_rg * S::RW + b_row) * S::QS + b_col;
#pragma unroll 4
      for (int ks = 0; ks < S::D / 16; ++ks) {
        uint32_t af[4];
        ldsm_x4(af, qa + ks * 16);
#pragma unroll
        for (int np = 0; np < S::NTS / 2; ++np) {
          uint32_t bf[4];
          ldsm_x4(bf, cb + np * 16 * S::QS + ks * 16);
          mma_bf16(sacc[2 * np], af, bf[0], bf[1]);
          mma_bf16(sacc[2 * np + 1], af, bf[2], bf[3]);
        }
      }
    }

    // ---- scores in the log2 domain, masked; per-warp maxima of the two heads
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < S::NTS; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = qk_rg * S::RW + nt * 8 + 2 * tq + (e & 1);
        const float v = col < nvalid ? sacc[nt][e] * sl2 : -INFINITY;
        sacc[nt][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFull, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFull, mx[i], 2));
    }
    if (tq == 0) {
      red_max[qk_rg * S::HB + qk_mt * 16 + g] = mx[0];
      red_max[qk_rg * S::HB + qk_mt * 16 + g + 8] = mx[1];
    }
    __syncthreads();  // S2: maxima of all row groups

    // ---- online softmax: new max, alpha, p~ = bf16(exp2(s - m)) into P, partial sums of p~
    {
      const float* m_old_row = m_run + (t & 1) * S::HB;
      float* m_new_row = m_run + ((t + 1) & 1) * S::HB;
      float m_new[2], alpha[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int hh = qk_mt * 16 + g + 8 * i;
        const float m_old = m_old_row[hh];
        float m = m_old;
#pragma unroll
        for (int rg = 0; rg < S::NRG; ++rg) m = fmaxf(m, red_max[rg * S::HB + hh]);
        // m is finite: row 0 of the tile is valid (nvalid >= 1). m_old = -inf gives alpha 0.
        m_new[i] = m;
        alpha[i] = exp2f(m_old - m);
        l_thr[i] *= alpha[i];
        if (qk_rg == 0 && tq == 0) {
          m_new_row[hh] = m;
          alpha_s[hh] = alpha[i];
        }
      }
#pragma unroll
      for (int nt = 0; nt < S::NTS; ++nt) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float p0 = exp2f(sacc[nt][2 * i] - m_new[i]);  // masked: exp2(-inf) = 0
          const float p1 = exp2f(sacc[nt][2 * i + 1] - m_new[i]);
          const uint32_t u = pack_bf16x2(p0, p1);
          __nv_bfloat162 r;
          memcpy(&r, &u, sizeof(r));
          l_thr[i] += __low2float(r) + __high2float(r);
          const int hh = qk_mt * 16 + g + 8 * i;
          const int col = qk_rg * S::RW + nt * 8 + 2 * tq;
          *reinterpret_cast<uint32_t*>(ps + hh * S::PS + col) = u;
        }
      }
    }
    __syncthreads();  // S3: P and alpha of every head

    // ---- O = O * alpha + P C for all heads x this warp's columns
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float a0 = alpha_s[mt * 16 + g], a1 = alpha_s[mt * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < S::NTO; ++nt) {
        o[mt][nt][0] *= a0;
        o[mt][nt][1] *= a0;
        o[mt][nt][2] *= a1;
        o[mt][nt][3] *= a1;
      }
    }
    {
      const __nv_bfloat16* pa = ps + a_row * S::PS + a_col;
      const __nv_bfloat16* cv = ct + a_row * S::QS + warp * S::CW + a_col;
#pragma unroll
      for (int ks = 0; ks < kTileRows / 16; ++ks) {
        uint32_t pf[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4(pf[mt], pa + mt * 16 * S::PS + ks * 16);
#pragma unroll
        for (int np = 0; np < S::NTO / 2; ++np) {
          uint32_t bf[4];
          ldsm_x4_trans(bf, cv + ks * 16 * S::QS + np * 16);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(o[mt][2 * np], pf[mt], bf[0], bf[1]);
            mma_bf16(o[mt][2 * np + 1], pf[mt], bf[2], bf[3]);
          }
        }
      }
    }
  }

  // ---- epilogue: l per head = sum over the quad, then over the row groups
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = l_thr[i];
    l += __shfl_xor_sync(kFull, l, 1);
    l += __shfl_xor_sync(kFull, l, 2);
    if (tq == 0) l_part[qk_rg * S::HB + qk_mt * 16 + g + 8 * i] = l;
  }
  __syncthreads();  // S4: l_part complete (m_run of the last tile was written before S3)

  const float* m_fin = m_run + (ntiles & 1) * S::HB;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int hh = mt * 16 + g + 8 * i;
      if (hh >= nh) continue;
      float L = 0.0f;
#pragma unroll
      for (int rg = 0; rg < S::NRG; ++rg) L += l_part[rg * S::HB + hh];  // >= 1 (the max row)
      const int h = h0 + hh;
      if (nsb == 1) {
        const float inv = 1.0f / L;
        float* out = a.o_lat + (static_cast<int64_t>(b) * a.H + h) * R + warp * S::CW + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < S::NTO; ++nt) {
          *reinterpret_cast<float2*>(out + nt * 8) =
              make_float2(o[mt][nt][2 * i] * inv, o[mt][nt][2 * i + 1] * inv);
        }
      } else {
        const int64_t k = partial_index(a, b, split, h);
        float* out = a.po + k * R + warp * S::CW + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < S::NTO; ++nt) {
          *reinterpret_cast<float2*>(out + nt * 8) =
              make_float2(o[mt][nt][2 * i], o[mt][nt][2 * i + 1]);
        }
        if (warp == 0 && tq == 0) {
          a.pm[k] = m_fin[hh];
          a.pl[k] = L;
        }
      }
    }
  }
}

// The latent-only kernel and the rope kernel: separate kernels so the former keeps its code.
template <int MT, int R, bool kGather>
__global__ void __launch_bounds__(kThreads, 1) decode_tc_kernel(DecodeArgs a) {
  decode_tc_body<MT, R, 0, kGather>(a);
}
template <int MT, int R, int DR, bool kGather>
__global__ void __launch_bounds__(kThreads, 1) decode_tc_rope_kernel(DecodeArgs a) {
  decode_tc_body<MT, R, DR, kGather>(a);
}

template <int MT, int R, int DR>
int launch_tc_rope(MemraCudaCtx* ctx, const DecodeArgs& a, int groups) {
  using S = Tc<MT, R, DR>;
  const dim3 grid(static_cast<unsigned>(a.nsplit), static_cast<unsigned>(a.B),
                  static_cast<unsigned>(groups));
  auto* kernel =
      a.list ? decode_tc_rope_kernel<MT, R, DR, true> : decode_tc_rope_kernel<MT, R, DR, false>;
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, kernel, S::bytes));
  memra::cuda::launch(ctx, true, kernel, dim3(grid), dim3(kThreads), S::bytes, a);
  return launch_status();
}

template <int MT, int R>
int launch_tc(MemraCudaCtx* ctx, const DecodeArgs& a, int groups) {
  using S = Tc<MT, R>;
  const dim3 grid(static_cast<unsigned>(a.nsplit), static_cast<unsigned>(a.B),
                  static_cast<unsigned>(groups));
  if (a.list) {
    MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decode_tc_kernel<MT, R, true>, S::bytes));
    memra::cuda::launch(ctx, true, decode_tc_kernel<MT, R, true>, dim3(grid), dim3(kThreads),
        S::bytes, a);
  } else {
    MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decode_tc_kernel<MT, R, false>, S::bytes));
    memra::cuda::launch(ctx, true, decode_tc_kernel<MT, R, false>, dim3(grid), dim3(kThreads),
        S::bytes, a);
  }
  return launch_status();
}

int launch_tc_any(MemraCudaCtx* ctx, int mt, const DecodeArgs& a, int groups) {
  constexpr int DR = memra::cuda::mla::kTcRope;
  if (a.d_rope > 0) {  // the plan checked d_rope == kTcRope and mt == 2
    if (a.d_rope != DR || mt != 2) return memra::kUnsupportedGeometry;
    switch (a.R) {
      case 128: return launch_tc_rope<2, 128, DR>(ctx, a, groups);
      case 256: return launch_tc_rope<2, 256, DR>(ctx, a, groups);
      default: return launch_tc_rope<2, 512, DR>(ctx, a, groups);
    }
  }
  if (mt == 4) {
    switch (a.R) {
      case 128: return launch_tc<4, 128>(ctx, a, groups);
      case 256: return launch_tc<4, 256>(ctx, a, groups);
      default: return launch_tc<4, 512>(ctx, a, groups);
    }
  }
  switch (a.R) {
    case 128: return launch_tc<2, 128>(ctx, a, groups);
    case 256: return launch_tc<2, 256>(ctx, a, groups);
    default: return launch_tc<2, 512>(ctx, a, groups);
  }
}

size_t tc_smem_bytes(int mt, int R, int d_rope) {
  constexpr int DR = memra::cuda::mla::kTcRope;
  if (d_rope > 0) {
    if (d_rope != DR || mt != 2) return SIZE_MAX;  // not instantiated
    return R == 128 ? Tc<2, 128, DR>::bytes
                    : (R == 256 ? Tc<2, 256, DR>::bytes : Tc<2, 512, DR>::bytes);
  }
  if (mt == 4) {
    return R == 128 ? Tc<4, 128>::bytes : (R == 256 ? Tc<4, 256>::bytes : Tc<4, 512>::bytes);
  }
  return R == 128 ? Tc<2, 128>::bytes : (R == 256 ? Tc<2, 256>::bytes : Tc<2, 512>::bytes);
}

}  // namespace

namespace memra::cuda::mla {

size_t decode_tc_smem_bytes(int mt, int R, int d_rope) { return tc_smem_bytes(mt, R, d_rope); }

int launch_decode_tc(MemraCudaCtx* ctx, int mt, const void* args, size_t bytes, int groups) {
  DecodeArgs a;
  if (bytes != sizeof(a)) return memra::kContractValue;
  memcpy(&a, args, sizeof(a));
  return launch_tc_any(ctx, mt, a, groups);
}

}  // namespace memra::cuda::mla
