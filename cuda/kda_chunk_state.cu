// KDA area, chunked delta-rule form (cuda/kda_chunk.cuh has the algebra and the scratch layout):
// the one sequential kernel. Per chunk, in order: D = U - W S and O = QG S, then O += Aqk D and
// S <- exp(G_last) S + KG^T D; O goes to the output rows, S and D stay in shared memory,
// TF32-rounded there (mma operands only; the carried state is f32, in registers).
//
// A block owns one (sequence, head) and half (or a quarter) of the state's columns, the state in
// mma accumulator registers. The chain's cost per chunk is two barriers and 64 mma per warp (and
// O's 48 beside them, independent of the chain); the next chunk's W, KG and [QG | Aqk] tiles
// are copied into shared memory with cp.async while this chunk computes, so no global latency
// sits on the chain. Two column halves keep the L2 re-reads of those tiles at two per chunk and
// the grid at one wave for 64 heads; where halves would leave over half of the SMs idle (GDN's
// 32 heads), quarters of half the warps (the same work per warp) spread the chains over twice
// the SMs.
#include "kda_chunk.cuh"

using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::launch_status;

namespace {

// W and KG tiles are f16, rows of 136 halves (68 words: 16-byte aligned rows for cp.async).
// W's row-major A fragments: lanes g = 0..7 land on words 68 g + {0, 1} = 4 g + {0, 1} mod 32.
// KG read transposed (A[m][t] = KG[t][m]): lanes q = 0..3 on words 4 q + g / 2 mod 32.
constexpr int kLdH = kDk + 8;
static_assert((kLdH / 2) % 32 == 4 && (kLdH * 2) % 16 == 0,
              "conflict-free fragments, aligned rows");

// The block's shape for kParts blocks per (sequence, head): kDvb state columns, 8 warps per 32
// of them (8 x kDvb / 32 state tiles of 16 x 32; 4 x kDvb / 16 D tiles of 16 x 16).
template <int kParts>
struct StateShape {
  static constexpr int kDvb = kDv / kParts;        // state columns per block
  static constexpr int kThreads = 8 * kDvb;        // a warp per 16 x 32 of the state
  static constexpr int kLdS = kDvb + 8;            // S [128, kDvb] and D [64, kDvb]: ld % 32 == 8
  static_assert(kLdS % 32 == 8 && kDk == 8 * kSub && kC == 4 * kSub && kDvb % 32 == 0,
                "conflict-free B fragments; the warp roles of chunk_state_kernel");
};

// [QG | Aqk] tiles: rows of 200 halves (100 words: load_a_h's ld / 2 % 32 == 4).
constexpr int kLdAo = kLdOutA + 8;
static_assert((kLdAo / 2) % 32 == 4 && (kLdAo * 2) % 16 == 0,
              "conflict-free fragments, aligned rows");

template <int kParts>
struct StateSmem {
  static constexpr int kLdS = StateShape<kParts>::kLdS;
  __half w[2][kC * kLdH];   // W of this chunk / the next (double buffer)
  __half kg[2][kC * kLdH];  // KG likewise
  __half a[2][kC * kLdAo];  // [QG | Aqk] likewise
  float s[kDk * kLdS];     // the state entering the chunk (B operand of W S and QG S)
  float d[kC * kLdS];      // D (B operand of KG^T D and Aqk D)
};

// cp.async of chunk `in`'s W, KG and [QG | Aqk] tiles into buffer `buf` (every thread its share).
template <int kParts>
__device__ __forceinline__ void prefetch(StateSmem<kParts>& sm, int buf, const float* in,
                                         int tid) {
  constexpr int kThreads = StateShape<kParts>::kThreads;
  constexpr int kVec = kDk / 8;  // 16-byte pieces per row
  const __half* w = reinterpret_cast<const __half*>(in + kOffW);
  const __half* kg = reinterpret_cast<const __half*>(in + kOffKG);
  for (int i = tid; i < kC * kVec; i += kThreads) {
    const int r = i / kVec, c8 = i % kVec;
    cp_async_16(&sm.w[buf][r * kLdH + 8 * c8], w + r * kDk + 8 * c8);
    cp_async_16(&sm.kg[buf][r * kLdH + 8 * c8], kg + r * kDk + 8 * c8);
  }
  constexpr int kVecA = kLdOutA / 8;
  const __half* a = reinterpret_cast<const __half*>(in + kOffA);
  for (int i = tid; i < kC * kVecA; i += kThreads) {
    const int r = i / kVecA, c8 = i % kVecA;
    cp_async_16(&sm.a[buf][r * kLdAo + 8 * c8], a + r * kLdOutA + 8 * c8);
  }
}

// One block per (sequence b, head h, column part): blockIdx.x = (b * H + h) * kParts + part.
// Warp w holds state rows 16 (w % 8).., columns 32 (w / 8).. of the block's kDvb (4 mma tiles),
// and computes D and O rows 16 (w % 4).., columns 16 (w / 4).. (2 mma tiles each). Per chunk:
//   store S (smem); wait for this chunk's tiles; barrier 1 (every warp is past the previous
//   chunk's products: the other buffers and D may be rewritten); prefetch the next chunk;
//   D = U - W S (smem) and O = QG S, which read the same B fragments; barrier 2;
//   O += Aqk D (O's K order is the one [QG | Aqk] [S ; D] product's), the output rows;
//   S = exp(G_last) S + KG^T D.
// S is rewritten only after barrier 2 of the previous chunk (its last readers are before it).
template <int kParts>
__global__ void __launch_bounds__(StateShape<kParts>::kThreads, 1)
    chunk_state_kernel(const memra::cuda::kda::ChunkProblem p, int nc,
                       const float* __restrict__ scratch) {
  constexpr int kDvb = StateShape<kParts>::kDvb;
  constexpr int kLdS = StateShape<kParts>::kLdS;
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float4 smem_raw[];
  StateSmem<kParts>& sm = *reinterpret_cast<StateSmem<kParts>*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, qq = lane & 3;
  const int H = p.H, T = p.T;
  const int part = static_cast<int>(blockIdx.x % kParts);
  const int64_t bh = blockIdx.x / kParts;
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int j0 = part * kDvb;                 // the block's first state column
  const int64_t plane = int64_t(h) * kDk * kDv;
  const int m0 = (warp & 7) * kSub, cs = (warp >> 3) * 32;  // state tile of this warp
  const int dm = (warp & 3) * kSub, dn = (warp >> 2) * 16;  // D and O tile of this warp
  const float* const first = scratch + bh * nc * kChunkFloats;

  // S rows m0 + gq (+ 8), columns cs + 8 n + 2 qq (+ 1) of the block's part.
  float S[4][4];
  const float* sin = p.state_in ? p.state_in[b] : nullptr;
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = m0 + gq + (e >> 1) * 8, col = j0 + cs + n * 8 + 2 * qq + (e & 1);
      S[n][e] = sin ? sin[plane + int64_t(r) * kDv + col] : 0.f;
    }
  }

  // U for this thread's D elements (it overwrites them with D) and exp(G_last) of its state
  // rows, a chunk ahead in registers, so their global latency hides under a whole chunk (chunk
  // c + 1's U is rewritten only in iteration c + 1, by the thread that read it).
  float2 u_next[2][2];
  float el_next[2];
  auto load_u = [&](const float* in) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = dm + gq + hh * 8, col = j0 + dn + n * 8 + 2 * qq;
        u_next[n][hh] = *reinterpret_cast<const float2*>(in + kOffU + r * kDv + col);
      }
    }
    el_next[0] = in[kOffEl + m0 + gq];
    el_next[1] = in[kOffEl + m0 + gq + 8];
  };
  load_u(first);
  prefetch(sm, 0, first, tid);
  cp_async_commit();
  for (int c = 0; c < nc; ++c) {
    const int buf = c & 1;
    const float* in = first + int64_t(c) * kChunkFloats;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = m0 + gq + hh * 8, col = cs + n * 8 + 2 * qq;
        *reinterpret_cast<float2*>(&sm.s[r * kLdS + col]) =
            make_float2(round_tf32(S[n][2 * hh]), round_tf32(S[n][2 * hh + 1]));
      }
    }
    float2 u[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) u[n][hh] = u_next[n][hh];
    }
    const float e_lo = el_next[0], e_hi = el_next[1];
    if (c + 1 < nc) load_u(in + kChunkFloats);
    cp_async_wait<0>();
    __syncthreads();
    if (c + 1 < nc) {
      prefetch(sm, buf ^ 1, in + kChunkFloats, tid);
      cp_async_commit();
    }

    // D = U - W S and O = QG S.
    float dacc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    float oacc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    const __half* w = sm.w[buf];
    const __half* qg = sm.a[buf];
#pragma unroll 4
    for (int k0 = 0; k0 < kDk; k0 += 8) {
      uint32_t a[4], aq[4];
      load_a_h(a, w, kLdH, dm, k0, gq, qq);
      load_a_h(aq, qg, kLdAo, dm, k0, gq, qq);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        uint32_t bb[2];
        load_b_rounded(bb, sm.s, kLdS, k0, dn + n * 8, gq, qq);
        mma_tf32(dacc[n], a, bb);
        mma_tf32(oacc[n], aq, bb);
      }
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = dm + gq + hh * 8, col = dn + n * 8 + 2 * qq;
        *reinterpret_cast<float2*>(&sm.d[r * kLdS + col]) =
            make_float2(round_tf32(u[n][hh].x - dacc[n][2 * hh]),
                        round_tf32(u[n][hh].y - dacc[n][2 * hh + 1]));
      }
    }
    __syncthreads();

    // O += Aqk D; rows past the chunk's length (zero padding) are not stored.
    const __half* aqk = sm.a[buf] + kDk;
#pragma unroll
    for (int k0 = 0; k0 < kC; k0 += 8) {
      uint32_t a[4];
      load_a_h(a, aqk, kLdAo, dm, k0, gq, qq);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        uint32_t bb[2];
        load_b_rounded(bb, sm.d, kLdS, k0, dn + n * 8, gq, qq);
        mma_tf32(oacc[n], a, bb);
      }
    }
    const int t0 = c * kC, L = min(kC, T - t0);
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = dm + gq + hh * 8, col = j0 + dn + n * 8 + 2 * qq;
        if (r < L) {
          float* dst = p.o + ((b * T + t0 + r) * H + h) * int64_t(kDv) + col;
          *reinterpret_cast<float2*>(dst) = make_float2(oacc[n][2 * hh], oacc[n][2 * hh + 1]);
        }
      }
    }

    // S = exp(G_last) S + KG^T D: A (m = state row, k = chunk row) reads KG transposed.
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      S[n][0] *= e_lo;
      S[n][1] *= e_lo;
      S[n][2] *= e_hi;
      S[n][3] *= e_hi;
    }
    const __half* kg = sm.kg[buf];
#pragma unroll 2
    for (int k0 = 0; k0 < kC; k0 += 8) {
      uint32_t a[4];
      a[0] = tf32_h(kg[(k0 + qq) * kLdH + m0 + gq]);
      a[1] = tf32_h(kg[(k0 + qq) * kLdH + m0 + gq + 8]);
      a[2] = tf32_h(kg[(k0 + qq + 4) * kLdH + m0 + gq]);
      a[3] = tf32_h(kg[(k0 + qq + 4) * kLdH + m0 + gq + 8]);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        uint32_t bb[2];
        load_b_rounded(bb, sm.d, kLdS, k0, cs + n * 8, gq, qq);
        mma_tf32(S[n], a, bb);
      }
    }
  }

  float* sout = p.state_out[b];
  if (sout) {
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = m0 + gq + hh * 8, col = j0 + cs + n * 8 + 2 * qq;
        *reinterpret_cast<float2*>(sout + plane + int64_t(r) * kDv + col) =
            make_float2(S[n][2 * hh], S[n][2 * hh + 1]);
      }
    }
  }
}

template <int kParts>
int launch_parts(MemraCudaCtx* ctx, const memra::cuda::kda::ChunkProblem& p, int nc,
                 const float* scratch) {
  const int64_t blocks = int64_t(p.B) * p.H * kParts;
  if (blocks > 0x7fffffffLL) return memra::kContractShape;
  MEMRA_CUDA_RETURN_IF(
      allow_smem(ctx, chunk_state_kernel<kParts>, sizeof(StateSmem<kParts>)));
  memra::cuda::launch(ctx, true, chunk_state_kernel<kParts>, dim3(static_cast<unsigned>(blocks)),
                      dim3(StateShape<kParts>::kThreads), sizeof(StateSmem<kParts>), p, nc,
                      scratch);
  return launch_status();
}

}  // namespace

namespace memra::cuda::kda {

// Quarters where halves would fill at most half of the SMs (each chain is a block; a chain's
// speed is its SM's, so idle SMs are lost time).
int launch_chunk_state(MemraCudaCtx* ctx, const ChunkProblem& p, int nc, const float* scratch) {
  int sms = 0;
  MEMRA_CUDA_RETURN_IF(memra::cuda::status_of(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device)));
  const int64_t halves = int64_t(p.B) * p.H * 2;
  if (2 * halves <= sms) return launch_parts<4>(ctx, p, nc, scratch);
  return launch_parts<2>(ctx, p, nc, scratch);
}

}  // namespace memra::cuda::kda
