// KDA area: the chunked (WY / UT) form of the delta-rule scan on tensor cores, the TABLES scan
// with MemraKdaScanParams::chunked (cpp/include/memra/cuda_abi/kda.h), which a bf16 model's
// prefill asks for; f32 models and the decode step keep the sequential scan (cuda/kda_scan.cu,
// the CPU oracle's twin). GDN runs it after its head expansion (cuda/gdn.cu).
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
// into exp(G_t) exp(-G_s) (exp(-G) overflows f32 over a chunk of strong decays). The 16-row
// sub-blocks off the diagonal take it as exp(G_t - G_r) exp(G_r - G_s) with r the first row of
// t's sub-block (s < r <= t: both factors <= 1) on tensor cores; the diagonal sub-blocks are
// summed element by element in f32.
//
// Two kernels, as fla's chunk_gated_delta_rule: chunk_intra_kernel (one block per chunk, all
// chunks in parallel) writes W, U, scale q exp(G), k exp(G_last - G), Aqk and exp(G_last) into
// scratch; chunk_state_kernel (one block per sequence, head and 32 state columns) runs the
// chunks in order with the f32 state in registers.
//
// Precision: matrix products run as mma.sync m16n8k8 TF32 (operands rounded to nearest TF32,
// 10-bit mantissa; f32 accumulation), so the operand error is a quarter of bf16's: the bf16
// models this form serves carry bf16-rounded weights and activations already. The cumulative
// decay, the exponentials, the diagonal sub-blocks, the triangular inverse (forward
// substitution) and the state itself stay f32; the state's decay and update accumulate in f32
// (the update's product adds onto the decayed state in the mma accumulator).
#include <cstdint>

#include "common.cuh"
#include "kda_common.cuh"

using memra::cuda::launch_status;
using memra::cuda::status_of;

namespace {

constexpr int kC = 64;          // chunk length
constexpr int kSub = 16;        // sub-block rows (an mma's M)
constexpr int kDk = kScanDk;    // 128
constexpr int kDv = kScanDv;    // 128
constexpr int kLd = kDk + 4;    // smem row stride of [64, 128] tiles (A fragments conflict free)
constexpr int kLdA = kC + 4;    // smem row stride of [64, 64] tiles
constexpr int kThreads = 256;   // 8 warps, both kernels
constexpr int kDvb = 32;        // state columns per chunk_state_kernel block
constexpr int kLdS = kDvb + 8;  // smem row stride of [*, 32] tiles (B fragments conflict free)

// Scratch per (sequence, head, chunk), in floats.
constexpr int64_t kTile = int64_t(kC) * kDk;  // W, U, QG, KG: [64, 128] each
constexpr int64_t kOffW = 0, kOffU = kTile, kOffQG = 2 * kTile, kOffKG = 3 * kTile;
constexpr int64_t kOffAq = 4 * kTile;               // Aqk [64, 64]
constexpr int64_t kOffEl = kOffAq + int64_t(kC) * kC;  // exp(G_last) [128]
constexpr int64_t kChunkFloats = kOffEl + kDk;
static_assert(kDk == kDv, "one [64, 128] tile shape for k-side and v-side scratch");

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

// A fragment of rows r0.., columns k0.. of a row-major smem tile.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const float* s, int ld, int r0, int k0,
                                       int g, int q) {
  a[0] = tf32(s[(r0 + g) * ld + k0 + q]);
  a[1] = tf32(s[(r0 + g + 8) * ld + k0 + q]);
  a[2] = tf32(s[(r0 + g) * ld + k0 + q + 4]);
  a[3] = tf32(s[(r0 + g + 8) * ld + k0 + q + 4]);
}

// B fragment (k0.. rows, n0.. columns) of a row-major [K, N] smem tile.
__device__ __forceinline__ void load_b(uint32_t (&b)[2], const float* s, int ld, int k0, int n0,
                                       int g, int q) {
  b[0] = tf32(s[(k0 + q) * ld + n0 + g]);
  b[1] = tf32(s[(k0 + q + 4) * ld + n0 + g]);
}

// ---------------------------------------------------------------- intra-chunk

struct IntraSmem {
  float k[kC * kLd];   // k, later beta k exp(G)
  float qv[kC * kLd];  // q, later beta v
  float G[kC * kLd];   // cumulative log decay
  float akk[kC * kLdA];
  float aqk[kC * kLdA];
  float tm[kC * kLdA];           // (I + Akk)^-1
  float x[3 * kSub * (kSub + 1)];  // the block inverse's per-level products
  float beta[kC];
};

// One block per (sequence b, head h, chunk c): blockIdx.x = (b * H + h) * nc + c.
__global__ void __launch_bounds__(kThreads)
    chunk_intra_kernel(const float* __restrict__ q, const float* __restrict__ k,
                       const float* __restrict__ v, const float* __restrict__ g,
                       const float* __restrict__ beta, int T, int H, int nc, float scale,
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
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int t0 = c * kC;
  const int L = min(kC, T - t0);
  float* out = scratch + bhc * kChunkFloats;
  // Row t of the chunk: ((b * T + t0 + t) * H + h) of [B, T, H, *].
  const int64_t row0 = (b * T + t0) * H + h;

  // Inputs (rows past L read as zeros: they add nothing anywhere), and zeroed matrices.
  for (int i = tid; i < kC * (kDk / 4); i += kThreads) {
    const int r = i / (kDk / 4), c4 = i % (kDk / 4);
    float4 kk = make_float4(0.f, 0.f, 0.f, 0.f), qv = kk, gg = kk;
    if (r < L) {
      const int64_t off = (row0 + int64_t(r) * H) * kDk;
      kk = __ldg(reinterpret_cast<const float4*>(k + off) + c4);
      qv = __ldg(reinterpret_cast<const float4*>(q + off) + c4);
      gg = __ldg(reinterpret_cast<const float4*>(g + off) + c4);
    }
    *reinterpret_cast<float4*>(&sm.k[r * kLd + 4 * c4]) = kk;
    *reinterpret_cast<float4*>(&sm.qv[r * kLd + 4 * c4]) = qv;
    *reinterpret_cast<float4*>(&sm.G[r * kLd + 4 * c4]) = gg;
  }
  for (int i = tid; i < kC * kLdA; i += kThreads) {
    sm.akk[i] = 0.f;
    sm.aqk[i] = 0.f;
    sm.tm[i] = 0.f;
  }
  if (tid < kC) sm.beta[tid] = tid < L ? __ldg(beta + row0 + int64_t(tid) * H) : 0.f;
  __syncthreads();

  // G: the inclusive cumulative sum over the chunk's rows, one channel per thread.
  if (tid < kDk) {
    float acc = 0.f;
    for (int r = 0; r < kC; ++r) {
      acc = __fadd_rn(acc, sm.G[r * kLd + tid]);
      sm.G[r * kLd + tid] = acc;
    }
  }
  __syncthreads();

  // scale q exp(G), k exp(G_last - G) (rows past L are zeros; G_last = G of row L - 1, which
  // the zero-padded rows repeat up to row 63) and exp(G_last).
  for (int i = tid; i < kC * kDk; i += kThreads) {
    const int r = i / kDk, ch = i % kDk;
    const float gr = sm.G[r * kLd + ch], gl = sm.G[(kC - 1) * kLd + ch];
    out[kOffQG + i] = __fmul_rn(__fmul_rn(sm.qv[r * kLd + ch], scale), expf(gr));
    out[kOffKG + i] = __fmul_rn(sm.k[r * kLd + ch], expf(__fsub_rn(gl, gr)));
    if (r == 0) out[kOffEl + ch] = expf(gl);
  }

  // Diagonal sub-blocks, element by element: a warp per (t, s) pair, a lane per 4 channels.
  for (int p = warp; p < (kC / kSub) * kSub * kSub; p += kThreads / 32) {
    const int blk = p / (kSub * kSub), i = (p / kSub) % kSub, j = p % kSub;
    if (j > i) continue;  // warp-uniform
    const int t = blk * kSub + i, s = blk * kSub + j;
    const float4 kt = *reinterpret_cast<const float4*>(&sm.k[t * kLd + 4 * lane]);
    const float4 qt = *reinterpret_cast<const float4*>(&sm.qv[t * kLd + 4 * lane]);
    const float4 ks = *reinterpret_cast<const float4*>(&sm.k[s * kLd + 4 * lane]);
    const float4 gt = *reinterpret_cast<const float4*>(&sm.G[t * kLd + 4 * lane]);
    const float4 gs = *reinterpret_cast<const float4*>(&sm.G[s * kLd + 4 * lane]);
    const float e0 = expf(gt.x - gs.x), e1 = expf(gt.y - gs.y), e2 = expf(gt.z - gs.z),
                e3 = expf(gt.w - gs.w);
    float akk = kt.x * ks.x * e0 + kt.y * ks.y * e1 + kt.z * ks.z * e2 + kt.w * ks.w * e3;
    float aqk = qt.x * ks.x * e0 + qt.y * ks.y * e1 + qt.z * ks.z * e2 + qt.w * ks.w * e3;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      akk += __shfl_xor_sync(0xffffffffu, akk, o);
      aqk += __shfl_xor_sync(0xffffffffu, aqk, o);
    }
    if (lane == 0) {
      if (j < i) sm.akk[t * kLdA + s] = sm.beta[t] * akk;
      sm.aqk[t * kLdA + s] = scale * aqk;
    }
  }

  // Off-diagonal sub-blocks (I > J) on tensor cores: 6 block pairs x 2 column halves, a warp per
  // task. Row t of block I meets column s of block J through exp(G_t - G_r) exp(G_r - G_s),
  // r = 16 I.
  for (int task = warp; task < 12; task += kThreads / 32) {
    const int pair = task >> 1, half = task & 1;
    const int I = pair < 1 ? 1 : (pair < 3 ? 2 : 3);
    const int J = pair - (I * (I - 1)) / 2;
    const int r = I * kSub, n0 = J * kSub + half * 8;
    float dk4[4] = {0.f, 0.f, 0.f, 0.f}, dq4[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k0 = 0; k0 < kDk; k0 += 8) {
      uint32_t ak[4], aq[4], bb[2];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = r + gq + (e & 1) * 8, ch = k0 + qq + (e >> 1) * 4;
        const float f = expf(sm.G[t * kLd + ch] - sm.G[r * kLd + ch]);
        ak[e] = tf32(sm.k[t * kLd + ch] * f);
        aq[e] = tf32(sm.qv[t * kLd + ch] * f);
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int s = n0 + gq, ch = k0 + qq + e * 4;
        bb[e] = tf32(sm.k[s * kLd + ch] * expf(sm.G[r * kLd + ch] - sm.G[s * kLd + ch]));
      }
      mma_tf32(dk4, ak, bb);
      mma_tf32(dq4, aq, bb);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int t = r + gq + (e >> 1) * 8, s = n0 + 2 * qq + (e & 1);
      sm.akk[t * kLdA + s] = sm.beta[t] * dk4[e];
      sm.aqk[t * kLdA + s] = scale * dq4[e];
    }
  }
  __syncthreads();

  // (I + Akk)^-1, unit lower triangular, in f32. The four diagonal 16 x 16 blocks by forward
  // substitution (warps 0-3, a lane per column; each lane reads only its own column back), while
  // warps 4-7 load beta v over q (q is no longer read).
  if (warp < 4) {
    if (lane < kSub) {
      const int base = warp * kSub, col = base + lane;
      for (int i = 0; i < kSub; ++i) {
        const int row = base + i;
        float x = 0.f;
        if (i == lane) {
          x = 1.f;
        } else if (i > lane) {
          for (int m = lane; m < i; ++m) {
            x -= sm.akk[row * kLdA + base + m] * sm.tm[(base + m) * kLdA + col];
          }
        }
        sm.tm[row * kLdA + col] = x;
      }
    }
  } else {
    for (int i = tid - 128; i < kC * (kDv / 4); i += 128) {
      const int r = i / (kDv / 4), c4 = i % (kDv / 4);
      float4 vv = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < L) {
        vv = __ldg(reinterpret_cast<const float4*>(v + (row0 + int64_t(r) * H) * kDv) + c4);
      }
      const float bt = sm.beta[r];
      vv.x *= bt;
      vv.y *= bt;
      vv.z *= bt;
      vv.w *= bt;
      *reinterpret_cast<float4*>(&sm.qv[r * kLd + 4 * c4]) = vv;
    }
  }
  __syncthreads();

  // The blocks below the diagonal by levels (d = I - J): T_IJ = -T_II sum_{M=J}^{I-1} A_IM T_MJ.
  // A thread per element of a 16 x 16 block.
  {
    const int ri = tid / kSub, ci = tid % kSub;
    for (int d = 1; d < 4; ++d) {
      const int npairs = 4 - d;
      for (int pj = 0; pj < npairs; ++pj) {
        const int J = pj, I = pj + d;
        float acc = 0.f;
        for (int M = J; M < I; ++M) {
          for (int m = 0; m < kSub; ++m) {
            acc += sm.akk[(I * kSub + ri) * kLdA + M * kSub + m] *
                   sm.tm[(M * kSub + m) * kLdA + J * kSub + ci];
          }
        }
        sm.x[pj * kSub * (kSub + 1) + ri * (kSub + 1) + ci] = acc;
      }
      __syncthreads();
      for (int pj = 0; pj < npairs; ++pj) {
        const int J = pj, I = pj + d;
        float acc = 0.f;
        for (int m = 0; m <= ri; ++m) {
          acc += sm.tm[(I * kSub + ri) * kLdA + I * kSub + m] *
                 sm.x[pj * kSub * (kSub + 1) + m * (kSub + 1) + ci];
        }
        sm.tm[(I * kSub + ri) * kLdA + J * kSub + ci] = -acc;
      }
      __syncthreads();
    }
  }

  // beta k exp(G) over k (k's other uses are done); Aqk to scratch.
  for (int i = tid; i < kC * kDk; i += kThreads) {
    const int r = i / kDk, ch = i % kDk;
    sm.k[r * kLd + ch] = sm.beta[r] * sm.k[r * kLd + ch] * expf(sm.G[r * kLd + ch]);
  }
  for (int i = tid; i < kC * kC; i += kThreads) out[kOffAq + i] = sm.aqk[(i / kC) * kLdA + i % kC];
  __syncthreads();

  // W = Tm (beta k exp(G)) (warps 0-3), U = Tm (beta v) (warps 4-7); warp w's rows 16 (w % 4)..,
  // all 128 columns; Tm is lower triangular, so k runs to the block's last row.
  {
    const int mi = warp & 3;
    const float* src = warp < 4 ? sm.k : sm.qv;
    float* dst = out + (warp < 4 ? kOffW : kOffU);
    float acc[kDk / 8][4];
#pragma unroll
    for (int n = 0; n < kDk / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    for (int k0 = 0; k0 < (mi + 1) * kSub; k0 += 8) {
      uint32_t a[4];
      load_a(a, sm.tm, kLdA, mi * kSub, k0, gq, qq);
#pragma unroll
      for (int n = 0; n < kDk / 8; ++n) {
        uint32_t bb[2];
        load_b(bb, src, kLd, k0, n * 8, gq, qq);
        mma_tf32(acc[n], a, bb);
      }
    }
#pragma unroll
    for (int n = 0; n < kDk / 8; ++n) {
      const int r = mi * kSub + gq, col = n * 8 + 2 * qq;
      *reinterpret_cast<float2*>(dst + r * kDk + col) = make_float2(acc[n][0], acc[n][1]);
      *reinterpret_cast<float2*>(dst + (r + 8) * kDk + col) = make_float2(acc[n][2], acc[n][3]);
    }
  }
}

// ---------------------------------------------------------------- across chunks

// A fragment of rows r0.., columns k0.. of a row-major global tile (scratch: read through L1,
// each 32-byte sector a lane group touches is used whole).
__device__ __forceinline__ void load_a_g(uint32_t (&a)[4], const float* __restrict__ s, int ld,
                                         int r0, int k0, int g, int q) {
  a[0] = tf32(__ldg(s + (r0 + g) * ld + k0 + q));
  a[1] = tf32(__ldg(s + (r0 + g + 8) * ld + k0 + q));
  a[2] = tf32(__ldg(s + (r0 + g) * ld + k0 + q + 4));
  a[3] = tf32(__ldg(s + (r0 + g + 8) * ld + k0 + q + 4));
}

// Shared memory of chunk_state_kernel: the two operands that cross warps. W, QG, Aqk and KG^T
// are A operands read by their own warps straight from scratch; a small footprint keeps several
// blocks an SM, whose loads cover each other's latency.
struct StateSmem {
  float s[kDk * kLdS];  // the state entering the chunk (B operand)
  float d[kC * kLdS];   // D = U - W S (B operand)
};

// One block per (sequence b, head h, 32-column part): blockIdx.x = (b * H + h) * 4 + part. Warp
// w holds state rows 16 w.. (all 32 columns) in mma accumulator registers; per chunk:
//   D = U - W S (and QG S), then O = QG S + Aqk D, S = exp(G_last) S + KG^T D.
// Two barriers a chunk: S is in shared memory before anyone reads it, D before anyone reads it;
// the next chunk's writes of S and D come after every warp's last reads of them (each warp
// passes the next chunk's first barrier only after its own reads).
__global__ void __launch_bounds__(kThreads)
    chunk_state_kernel(const float* __restrict__ scratch, int T, int H, int nc,
                       const float* const* state_in, float* const* state_out,
                       float* __restrict__ o) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float4 smem_raw[];
  StateSmem& sm = *reinterpret_cast<StateSmem*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, qq = lane & 3;
  constexpr int kParts = kDv / kDvb;
  const int part = static_cast<int>(blockIdx.x % kParts);
  const int64_t bh = blockIdx.x / kParts;
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int j0 = part * kDvb;
  const int64_t plane = int64_t(h) * kDk * kDv;
  const int m0 = warp * kSub;  // this warp's state rows

  // S rows m0 + gq (+ 8), columns 8 n + 2 qq (+ 1), as the update's accumulators.
  float S[kDvb / 8][4];
  const float* sin = state_in ? state_in[b] : nullptr;
#pragma unroll
  for (int n = 0; n < kDvb / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = m0 + gq + (e >> 1) * 8, col = j0 + n * 8 + 2 * qq + (e & 1);
      S[n][e] = sin ? sin[plane + int64_t(r) * kDv + col] : 0.f;
    }
  }

  // D / O tiles of warp w: rows 16 (w / 2).., columns 16 (w % 2).. of the block's 32.
  const int mi = warp >> 1, nb = (warp & 1) * 2;
  for (int c = 0; c < nc; ++c) {
    const float* in = scratch + (bh * nc + c) * kChunkFloats;
    const int t0 = c * kC;
    const int L = min(kC, T - t0);
#pragma unroll
    for (int n = 0; n < kDvb / 8; ++n) {
      const int r = m0 + gq, col = n * 8 + 2 * qq;
      *reinterpret_cast<float2*>(&sm.s[r * kLdS + col]) = make_float2(S[n][0], S[n][1]);
      *reinterpret_cast<float2*>(&sm.s[(r + 8) * kLdS + col]) = make_float2(S[n][2], S[n][3]);
    }
    __syncthreads();

    // D = U - W S and O = QG S.
    float dacc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    float oacc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll 4
    for (int k0 = 0; k0 < kDk; k0 += 8) {
      uint32_t aw[4], aqg[4];
      load_a_g(aw, in + kOffW, kDk, mi * kSub, k0, gq, qq);
      load_a_g(aqg, in + kOffQG, kDk, mi * kSub, k0, gq, qq);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        uint32_t bs[2];
        load_b(bs, sm.s, kLdS, k0, (nb + n) * 8, gq, qq);
        mma_tf32(dacc[n], aw, bs);
        mma_tf32(oacc[n], aqg, bs);
      }
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = mi * kSub + gq + hh * 8, col = (nb + n) * 8 + 2 * qq;
        const float2 u = __ldg(reinterpret_cast<const float2*>(in + kOffU + r * kDv + j0 + col));
        *reinterpret_cast<float2*>(&sm.d[r * kLdS + col]) =
            make_float2(u.x - dacc[n][2 * hh], u.y - dacc[n][2 * hh + 1]);
      }
    }
    __syncthreads();

    // O += Aqk D (Aqk lower triangular: k up to the block's last row); rows past L not stored.
    for (int k0 = 0; k0 < (mi + 1) * kSub; k0 += 8) {
      uint32_t a[4];
      load_a_g(a, in + kOffAq, kC, mi * kSub, k0, gq, qq);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        uint32_t bd[2];
        load_b(bd, sm.d, kLdS, k0, (nb + n) * 8, gq, qq);
        mma_tf32(oacc[n], a, bd);
      }
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = mi * kSub + gq + hh * 8, col = j0 + (nb + n) * 8 + 2 * qq;
        if (r < L) {
          float* dst = o + ((b * T + t0 + r) * H + h) * int64_t(kDv) + col;
          *reinterpret_cast<float2*>(dst) = make_float2(oacc[n][2 * hh], oacc[n][2 * hh + 1]);
        }
      }
    }

    // S = exp(G_last) S + KG^T D: A (m = state row, k = chunk row) reads KG transposed (a lane
    // group's 8 rows m are 32 contiguous bytes of one KG row).
    const float e_lo = __ldg(in + kOffEl + m0 + gq), e_hi = __ldg(in + kOffEl + m0 + gq + 8);
#pragma unroll
    for (int n = 0; n < kDvb / 8; ++n) {
      S[n][0] *= e_lo;
      S[n][1] *= e_lo;
      S[n][2] *= e_hi;
      S[n][3] *= e_hi;
    }
    const float* kg = in + kOffKG;
#pragma unroll 4
    for (int k0 = 0; k0 < kC; k0 += 8) {
      uint32_t a[4];
      a[0] = tf32(__ldg(kg + (k0 + qq) * kDk + m0 + gq));
      a[1] = tf32(__ldg(kg + (k0 + qq) * kDk + m0 + gq + 8));
      a[2] = tf32(__ldg(kg + (k0 + qq + 4) * kDk + m0 + gq));
      a[3] = tf32(__ldg(kg + (k0 + qq + 4) * kDk + m0 + gq + 8));
#pragma unroll
      for (int n = 0; n < kDvb / 8; ++n) {
        uint32_t bd[2];
        load_b(bd, sm.d, kLdS, k0, n * 8, gq, qq);
        mma_tf32(S[n], a, bd);
      }
    }
  }

  float* sout = state_out[b];
  if (sout) {
#pragma unroll
    for (int n = 0; n < kDvb / 8; ++n) {
      const int r = m0 + gq, col = j0 + n * 8 + 2 * qq;
      *reinterpret_cast<float2*>(sout + plane + int64_t(r) * kDv + col) =
          make_float2(S[n][0], S[n][1]);
      *reinterpret_cast<float2*>(sout + plane + int64_t(r + 8) * kDv + col) =
          make_float2(S[n][2], S[n][3]);
    }
  }
}

// Allow `bytes` of dynamic shared memory for `kernel` (50002 beyond the device's opt-in limit).
template <typename K>
int allow_smem(MemraCudaCtx* ctx, K* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return memra::kOk;
  int optin = 0;
  MEMRA_CUDA_RETURN_IF(status_of(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device)));
  if (bytes > static_cast<size_t>(optin)) return memra::kUnsupportedGeometry;
  return status_of(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace

namespace memra::cuda::kda {

int scan_chunked_tables(MemraCudaCtx* ctx, const MemraKdaScanParams& p) {
  const int B = p.B, T = p.T, H = p.H;
  const int nc = (T + kC - 1) / kC;
  const int64_t chunks = int64_t(B) * H * nc;
  const int64_t state_blocks = int64_t(B) * H * (kDv / kDvb);
  if (chunks > 0x7fffffffLL || state_blocks > 0x7fffffffLL) return memra::kContractShape;
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, chunk_intra_kernel, sizeof(IntraSmem)));
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, chunk_state_kernel, sizeof(StateSmem)));
  memra::cuda::Scratch scratch(ctx, size_t(chunks) * kChunkFloats * sizeof(float));
  MEMRA_CUDA_RETURN_IF(scratch.status());
  float* sc = scratch.as<float>();
  memra::cuda::launch(ctx, true, chunk_intra_kernel, dim3(static_cast<unsigned>(chunks)),
                      dim3(kThreads), sizeof(IntraSmem), p.q, p.k, p.v, p.g, p.beta, T, H, nc,
                      p.scale, sc);
  MEMRA_CUDA_RETURN_IF(launch_status());
  memra::cuda::launch(ctx, true, chunk_state_kernel, dim3(static_cast<unsigned>(state_blocks)),
                      dim3(kThreads), sizeof(StateSmem), static_cast<const float*>(sc), T, H,
                      nc, p.state.in_table, p.state.out_table, p.o);
  return launch_status();
}

}  // namespace memra::cuda::kda
