// KDA area, chunked delta-rule form (cuda/kda_chunk.cuh has the algebra and the scratch layout):
// the output, every chunk in parallel once the state kernel has written each chunk's entering
// state S and D: O = QG S + Aqk D = [QG | Aqk] [S ; D], one [64, 192] x [192, 128] product per
// chunk (fla's chunk_fwd_o). K runs in slices of 32 through a cp.async double buffer, so each
// block streams its 120 KB of operands (A f16, B f32) once while the previous slice multiplies.
#include "kda_chunk.cuh"

using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::launch_status;

namespace {

constexpr int kThreads = 256;        // 8 warps: 4 row tiles x 2 column halves
constexpr int kKs = 32;              // K slice
constexpr int kSlices = kLdOutA / kKs;
constexpr int kLdA = kKs + 8;        // A slice [64, 32] f16: 40 halves (80-byte rows)
constexpr int kLdB = kDv + 8;        // B slice [32, 128] f32: B fragments, ld % 32 == 8
static_assert(kLdOutA % kKs == 0 && kKs % 8 == 0, "whole slices of whole mma steps");
static_assert(kLdA == 40 && kLdB % 32 == 8, "conflict-free fragments (load_a_h's note)");
static_assert(kThreads == 4 * 64 && kC == 4 * kSub && kDv == 2 * 64, "warp roles below");

struct OutSmem {
  __half a[2][kC * kLdA];
  float b[2][kKs * kLdB];
};

__device__ __forceinline__ void load_slice(OutSmem& sm, int buf, const float* in, int s,
                                           int tid) {
  constexpr int kVecA = kKs / 8, kVecB = kDv / 4;  // 16-byte pieces per row
  const __half* a = reinterpret_cast<const __half*>(in + kOffA);
  for (int i = tid; i < kC * kVecA; i += kThreads) {
    const int r = i / kVecA, c8 = i % kVecA;
    cp_async_16(&sm.a[buf][r * kLdA + 8 * c8], a + r * kLdOutA + s * kKs + 8 * c8);
  }
  for (int i = tid; i < kKs * kVecB; i += kThreads) {
    const int r = i / kVecB, c4 = i % kVecB;
    cp_async_16(&sm.b[buf][r * kLdB + 4 * c4], in + kOffB + (s * kKs + r) * kDv + 4 * c4);
  }
}

// One block per (sequence b, head h, chunk c): blockIdx.x = (b * H + h) * nc + c. Warp w computes
// O rows 16 (w % 4).., columns 64 (w / 4).. (8 mma tiles); rows past the chunk's length (zero
// padding) are not stored.
__global__ void __launch_bounds__(kThreads)
    chunk_out_kernel(const float* __restrict__ scratch, int T, int H, int nc,
                     float* __restrict__ o) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float4 smem_raw[];
  OutSmem& sm = *reinterpret_cast<OutSmem*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, qq = lane & 3;
  const int64_t bhc = blockIdx.x;
  const int c = static_cast<int>(bhc % nc);
  const int64_t bh = bhc / nc;
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int t0 = c * kC;
  const int L = min(kC, T - t0);
  const float* in = scratch + bhc * kChunkFloats;
  const int mi = (warp & 3) * kSub, nb = (warp >> 2) * 64;

  float acc[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

  load_slice(sm, 0, in, 0, tid);
  cp_async_commit();
  for (int s = 0; s < kSlices; ++s) {
    const int buf = s & 1;
    if (s + 1 < kSlices) {
      load_slice(sm, buf ^ 1, in, s + 1, tid);  // its last readers finished before the barrier
      cp_async_commit();                        // at the end of the previous iteration
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
#pragma unroll
    for (int k0 = 0; k0 < kKs; k0 += 8) {
      uint32_t a[4];
      load_a_h(a, sm.a[buf], kLdA, mi, k0, gq, qq);
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        uint32_t bb[2];
        load_b_rounded(bb, sm.b[buf], kLdB, k0, nb + n * 8, gq, qq);
        mma_tf32(acc[n], a, bb);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = mi + gq + hh * 8, col = nb + n * 8 + 2 * qq;
      if (r < L) {
        float* dst = o + ((b * T + t0 + r) * H + h) * int64_t(kDv) + col;
        *reinterpret_cast<float2*>(dst) = make_float2(acc[n][2 * hh], acc[n][2 * hh + 1]);
      }
    }
  }
}

}  // namespace

namespace memra::cuda::kda {

int launch_chunk_out(MemraCudaCtx* ctx, const ChunkProblem& p, int nc, const float* scratch) {
  const int64_t chunks = int64_t(p.B) * p.H * nc;
  if (chunks > 0x7fffffffLL) return memra::kContractShape;
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, chunk_out_kernel, sizeof(OutSmem)));
  memra::cuda::launch(ctx, true, chunk_out_kernel, dim3(static_cast<unsigned>(chunks)),
                      dim3(kThreads), sizeof(OutSmem), scratch, p.T, p.H, nc, p.o);
  return launch_status();
}

}  // namespace memra::cuda::kda
