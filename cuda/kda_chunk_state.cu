// KDA area, chunked delta-rule form (cuda/kda_chunk.cuh has the algebra and the scratch layout):
// the one sequential kernel. Per chunk, in order: D = U - W S and O = QG S, then O += Aqk D and
// S <- exp(G_last) S + KG^T D; O goes to the output rows.
//
// Each warp owns 16 of the state's value columns with all 128 key rows, the f32 state in mma
// accumulator registers, transposed: S^T [16, 128], 64 registers a thread. A column of D, O and
// the next state depends on the same column of S only, so each warp's chain is its own: no
// exchange between warps, no shared-memory copy of S or D. The products run transposed
// (D^T = U^T - S^T W^T, O^T = S^T QG^T + D^T Aqk^T, S^T <- S^T exp(G_last) + D^T KG), with S^T
// and D^T as the A operands straight from their accumulators (FlashAttention-2's P trick: an
// m16n8 accumulator pair is an m16n8k16 A fragment) and the f16 tiles as B operands through
// ldmatrix, as stored.
//
// Precision: the products are mma.sync m16n8k16 with f16 operands and f32 accumulation. The
// tiles are f16 already (cuda/kda_chunk.cuh). S^T and D^T are not bounded, so each row (a state
// column) is scaled by a power of two that puts its largest magnitude in [2^14, 2^15) before
// its f16 rounding, and every product that read it is scaled back exactly: the operand keeps
// f16's 11-bit significand, TF32's, for every element within 2^-28 of its row's largest (below,
// an absolute error under 2^-39 of that largest), over f32's normal range. The sums, the
// carried state and the output stay f32.
#include "kda_chunk.cuh"
#include "mma_bf16.cuh"

using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::launch_status;
using memra::cuda::ldsm_x4;
using memra::cuda::ldsm_x4_trans;
using memra::cuda::mma_f16;

namespace {

// W and KG tiles are f16, rows of 136 halves (68 words: 16-byte aligned rows for cp.async; the
// eight rows of an ldmatrix tile start on words 4 r mod 32, conflict free).
constexpr int kLdH = kDk + 8;
static_assert((kLdH / 2) % 32 == 4 && (kLdH * 2) % 16 == 0,
              "conflict-free fragments, aligned rows");
// [QG | Aqk] tiles: rows of 200 halves (100 words, likewise).
constexpr int kLdAo = kLdOutA + 8;
static_assert((kLdAo / 2) % 32 == 4 && (kLdAo * 2) % 16 == 0,
              "conflict-free fragments, aligned rows");

// The block's shape for kParts blocks per (sequence, head): kDvb state columns, a warp per 16.
template <int kParts>
struct StateShape {
  static constexpr int kDvb = kDv / kParts;   // state columns per block
  static constexpr int kWarps = kDvb / 16;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kLdU = kDvb + 4;       // float2 U reads, rows 2 q: banks 8 q + 2 g, + 1
  static_assert(kLdU % 32 == 4 && kDvb % 16 == 0 && kC == 64 && kDk == 128,
                "conflict-free U reads; the unrolled tile counts of chunk_state_kernel");
};

template <int kParts>
struct StateSmem {
  static constexpr int kLdU = StateShape<kParts>::kLdU;
  __half w[2][kC * kLdH];   // W of this chunk / the next (double buffer)
  __half kg[2][kC * kLdH];  // KG likewise
  __half a[2][kC * kLdAo];  // [QG | Aqk] likewise
  float u[2][kC * kLdU];    // the block's columns of U likewise
  float el[2][kDk];         // exp(G_last) likewise
};

// cp.async of chunk `in`'s tiles into buffer `buf` (every thread its share). Each loop has a
// compile-time trip count and a row step that is a multiple of the thread count's rows, so a
// thread's copies sit at constant offsets from one address pair (no per-copy index arithmetic).
template <int kParts>
__device__ __forceinline__ void prefetch(StateSmem<kParts>& sm, int buf, const float* in, int j0,
                                         int tid) {
  constexpr int kThreads = StateShape<kParts>::kThreads;
  constexpr int kDvb = StateShape<kParts>::kDvb;
  constexpr int kLdU = StateShape<kParts>::kLdU;
  // W and KG: rows of 16 pieces of 16 bytes.
  constexpr int kVec = kDk / 8, kRowsW = kThreads / kVec;
  static_assert(kThreads % kVec == 0 && kC % kRowsW == 0, "whole passes");
  {
    const int r0 = tid / kVec, c8 = 8 * (tid % kVec);
    const __half* w = reinterpret_cast<const __half*>(in + kOffW) + r0 * kDk + c8;
    const __half* kg = reinterpret_cast<const __half*>(in + kOffKG) + r0 * kDk + c8;
    __half* sw = &sm.w[buf][r0 * kLdH + c8];
    __half* skg = &sm.kg[buf][r0 * kLdH + c8];
#pragma unroll
    for (int r = 0; r < kC; r += kRowsW) {
      cp_async_16(sw + r * kLdH, w + r * kDk);
      cp_async_16(skg + r * kLdH, kg + r * kDk);
    }
  }
  // [QG | Aqk]: rows of 24 pieces, as three groups of 8.
  constexpr int kRowsA = kThreads / 8;
  static_assert(kLdOutA == 3 * 64 && kC % kRowsA == 0, "whole passes");
  {
    const int r0 = tid / 8, c8 = 8 * (tid % 8);
    const __half* a = reinterpret_cast<const __half*>(in + kOffA) + r0 * kLdOutA + c8;
    __half* sa = &sm.a[buf][r0 * kLdAo + c8];
#pragma unroll
    for (int r = 0; r < kC; r += kRowsA) {
#pragma unroll
      for (int grp = 0; grp < 3; ++grp) {
        cp_async_16(sa + r * kLdAo + 64 * grp, a + r * kLdOutA + 64 * grp);
      }
    }
  }
  // The block's U columns: rows of kDvb / 4 pieces.
  constexpr int kVecU = kDvb / 4, kRowsU = kThreads / kVecU;
  static_assert(kThreads % kVecU == 0 && kC % kRowsU == 0, "whole passes");
  {
    const int r0 = tid / kVecU, c4 = 4 * (tid % kVecU);
    const float* u = in + kOffU + r0 * kDv + j0 + c4;
    float* su = &sm.u[buf][r0 * kLdU + c4];
#pragma unroll
    for (int r = 0; r < kC; r += kRowsU) cp_async_16(su + r * kLdU, u + r * kDv);
  }
  static_assert(kThreads >= kDk / 4, "exp(G_last) in one pass");
  if (tid < kDk / 4) cp_async_16(&sm.el[buf][4 * tid], in + kOffEl + 4 * tid);
}

// One block per (sequence b, head h, column part): blockIdx.x = (b * H + h) * kParts + part.
// Warp w owns state columns v0 = j0 + 16 w.. (the m rows of its transposed tiles, interleaved:
// m row g is column v0 + 2 g and m row g + 8 is column v0 + 2 g + 1, so a thread's two columns
// are adjacent and its state, U and output accesses are float2). Thread (g, q) holds, of 8-wide
// tile n: S^T[g (+ 8)][8 n + 2 q (+ 1)] (state rows 8 n + 2 q, + 1 of columns v0 + 2 g, + 1),
// likewise D^T and O^T with chunk rows for state rows. Per chunk: wait for
// its tiles, barrier (every warp is past the previous chunk: the other buffer may be rewritten),
// prefetch the next chunk; then the warp's chain alone.
template <int kParts>
__global__ void __launch_bounds__(StateShape<kParts>::kThreads, 1)
    chunk_state_kernel(const memra::cuda::kda::ChunkProblem p, int nc,
                       const float* __restrict__ scratch) {
  constexpr int kDvb = StateShape<kParts>::kDvb;
  constexpr int kLdU = StateShape<kParts>::kLdU;
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float4 smem_raw[];
  StateSmem<kParts>& sm = *reinterpret_cast<StateSmem<kParts>*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int H = p.H, T = p.T;
  const int part = static_cast<int>(blockIdx.x % kParts);
  const int64_t bh = blockIdx.x / kParts;
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int j0 = part * kDvb;      // the block's first state column
  const int vl = 16 * warp;        // the warp's first column within the block's
  const int v0 = j0 + vl;
  const int64_t plane = int64_t(h) * kDk * kDv;
  const float* const first = scratch + bh * nc * kChunkFloats;

  float ST[kDk / 8][4];
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

  prefetch(sm, 0, first, j0, tid);
  cp_async_commit();
  for (int c = 0; c < nc; ++c) {
    const int buf = c & 1;
    const float* in = first + int64_t(c) * kChunkFloats;
    cp_async_wait<0>();
    __syncthreads();
    if (c + 1 < nc) {
      prefetch(sm, buf ^ 1, in + kChunkFloats, j0, tid);
      cp_async_commit();
    }

    // S^T W^T (D^T's accumulators, subtracted from U^T below) and O^T = S^T QG^T (k = state
    // rows), sharing S^T's fragments. The ldmatrix tiles: lanes 8 i.. address tile
    // i = (chunk rows 8 (2 np + i / 2).., k half i % 2).
    float DT[kC / 8][4], OT[kC / 8][4];
#pragma unroll
    for (int nt = 0; nt < kC / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) DT[nt][e] = OT[nt][e] = 0.f;
    }
    float scS[2], invS[2];
    row_scales(ST, scS, invS);
    const __half* w = sm.w[buf] + (8 * (lane >> 4) + (lane & 7)) * kLdH + 8 * ((lane >> 3) & 1);
    const __half* at =
        sm.a[buf] + (8 * (lane >> 4) + (lane & 7)) * kLdAo + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int j = 0; j < kDk / 16; ++j) {
      uint32_t a[4];
      acc_as_a(a, ST, j, scS);
#pragma unroll
      for (int np = 0; np < kC / 16; ++np) {
        uint32_t bw[4], bq[4];
        ldsm_x4(bw, w + 16 * np * kLdH + 16 * j);
        ldsm_x4(bq, at + 16 * np * kLdAo + 16 * j);
        mma_f16(DT[2 * np], a, bw[0], bw[1]);
        mma_f16(DT[2 * np + 1], a, bw[2], bw[3]);
        mma_f16(OT[2 * np], a, bq[0], bq[1]);
        mma_f16(OT[2 * np + 1], a, bq[2], bq[3]);
      }
    }
    // D^T = U^T minus that product (scaled back); O^T scaled back.
    const float* u = sm.u[buf] + 2 * q * kLdU + vl + 2 * g;  // chunk row 2 q, columns 2 g, + 1
#pragma unroll
    for (int nt = 0; nt < kC / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // chunk row 8 nt + 2 q + e
        const float2 u2 = *reinterpret_cast<const float2*>(&u[(8 * nt + e) * kLdU]);
        DT[nt][e] = fmaf(-DT[nt][e], invS[0], u2.x);
        DT[nt][e + 2] = fmaf(-DT[nt][e + 2], invS[1], u2.y);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) OT[nt][e] *= invS[e >> 1];
    }
    float scD[2], invD[2];
    row_scales(DT, scD, invD);
    uint32_t DA[kC / 16][4];
#pragma unroll
    for (int j = 0; j < kC / 16; ++j) acc_as_a(DA[j], DT, j, scD);

    // O^T += D^T Aqk^T (k = chunk rows s, n = chunk rows t; Aqk is zero for s > t, so the tile
    // pairs of t below s are skipped); rows past the chunk's length (zero padding) are not
    // stored.
#pragma unroll
    for (int nt = 0; nt < kC / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) DT[nt][e] = 0.f;  // O2^T, D^T's registers
    }
#pragma unroll
    for (int j = 0; j < kC / 16; ++j) {
#pragma unroll
      for (int np = j; np < kC / 16; ++np) {
        uint32_t bq[4];
        ldsm_x4(bq, at + 16 * np * kLdAo + kDk + 16 * j);
        mma_f16(DT[2 * np], DA[j], bq[0], bq[1]);
        mma_f16(DT[2 * np + 1], DA[j], bq[2], bq[3]);
      }
    }
    // Rows 8 nt + 2 q + e, columns v0 + 2 g, + 1 as float2, through two row pointers stepped
    // by 8 rows (the bounds check only in a sequence's last, partial chunk); streaming stores,
    // as nothing here reads o again.
    const int t0 = c * kC, L = min(kC, T - t0);
    const int64_t rs = int64_t(H) * kDv;  // floats from one output row to the next
    float* o0 = p.o + ((b * T + t0 + 2 * q) * H + h) * int64_t(kDv) + v0 + 2 * g;
    float* o1 = o0 + rs;
#pragma unroll
    for (int nt = 0; nt < kC / 8; ++nt) {
      const float2 x0 = make_float2(fmaf(DT[nt][0], invD[0], OT[nt][0]),
                                    fmaf(DT[nt][2], invD[1], OT[nt][2]));
      const float2 x1 = make_float2(fmaf(DT[nt][1], invD[0], OT[nt][1]),
                                    fmaf(DT[nt][3], invD[1], OT[nt][3]));
      const int t = 8 * nt + 2 * q;
      if (L == kC || t < L) __stcs(reinterpret_cast<float2*>(o0), x0);
      if (L == kC || t + 1 < L) __stcs(reinterpret_cast<float2*>(o1), x1);
      o0 += 8 * rs;
      o1 += 8 * rs;
    }

    // S^T = S^T exp(G_last) + D^T KG (k = chunk rows, n = state rows), the product in its own
    // accumulators (scaled back as it is added). KG's tiles through ldmatrix.trans: lanes 8 i..
    // address tile i = (chunk rows 16 j + 8 (i % 2).., state rows 8 (2 np + i / 2)..).
    float dS[kDk / 8][4];
#pragma unroll
    for (int n = 0; n < kDk / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dS[n][e] = 0.f;
    }
    const __half* kg = sm.kg[buf] + (8 * ((lane >> 3) & 1) + (lane & 7)) * kLdH + 8 * (lane >> 4);
#pragma unroll
    for (int j = 0; j < kC / 16; ++j) {
#pragma unroll
      for (int np = 0; np < kDk / 16; ++np) {
        uint32_t bk[4];
        ldsm_x4_trans(bk, kg + 16 * j * kLdH + 16 * np);
        mma_f16(dS[2 * np], DA[j], bk[0], bk[1]);
        mma_f16(dS[2 * np + 1], DA[j], bk[2], bk[3]);
      }
    }
    const float* el = sm.el[buf];
#pragma unroll
    for (int n = 0; n < kDk / 8; ++n) {
      const float2 e2 = *reinterpret_cast<const float2*>(&el[8 * n + 2 * q]);
      ST[n][0] = fmaf(ST[n][0], e2.x, dS[n][0] * invD[0]);
      ST[n][1] = fmaf(ST[n][1], e2.y, dS[n][1] * invD[0]);
      ST[n][2] = fmaf(ST[n][2], e2.x, dS[n][2] * invD[1]);
      ST[n][3] = fmaf(ST[n][3], e2.y, dS[n][3] * invD[1]);
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

// Quarters where halves would fill at most half of the SMs (each chain is a warp; a chain's
// speed is its SM's, so idle SMs are lost time).
int launch_chunk_state(MemraCudaCtx* ctx, const ChunkProblem& p, int nc, const float* scratch) {
  int sms = 0;
  MEMRA_CUDA_RETURN_IF(memra::cuda::status_of(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device)));
  const int64_t halves = int64_t(p.B) * p.H * 2;
  if (2 * halves <= sms) return launch_parts<4>(ctx, p, nc, scratch);
  return launch_chunk_state_sm90(ctx, p, nc, scratch);
}

}  // namespace memra::cuda::kda
