// linear's tensor-core arm for a few rows (cuda/linear.cu dispatches here: 2..kSkinnyMaxT rows
// against a bf16 weight, KernelOptions::skinny_gemm): y[T, N] = x[T, K] w[N, K]^T (+ bias)
// as one stream of the weight, the batched decode's dense projections. cuBLAS answers these
// shapes with split-K GEMMs plus a reduction kernel, neither of which can join the decode
// graph's programmatic chain; this kernel does, and reads the first stages of its weight tile
// before it waits for the kernel in front (the weights are never written by the chain). Split-K
// partials are summed by skinny_reduce_kernel, in the chain too.
//
// Block: kThreads (4 warps), a tile of kBN weight rows (32 a warp, two m16 tiles: the MMA's M is
// the weight's N, so that a few rows of x waste at most one n8 tile) against all BT rows of x
// (n8 tiles), K streamed in kBK-wide stages through a kStages cp.async ring. Grid: n_tiles x
// splits, split s summing k tiles [s * k_tiles, (s + 1) * k_tiles) of kBK.
//
// Numerics: products of two bf16 values are exact in f32; an output's sum runs over k in
// ascending 16-wide steps within a split, and the splits' partials are added in ascending split
// order, then the bias. The splits depend on N and K alone, so a row's bytes do not depend on T
// (the batch it rides in). Against cpu::linear on x rounded to the weight's type only the
// summation order differs.
#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "linear.cuh"
#include "mma_bf16.cuh"

using memra::cuda::ceil_div;
using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::launch_status;
using memra::cuda::ldsm_x4;
using memra::cuda::mma_bf16;
using memra::cuda::Scratch;
using memra::cuda::status_of;

namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kBN = 128;       // weight rows a block: 32 a warp
constexpr int kBK = 64;        // k a stage: rows of 128 bytes, 8 chunks of 16 bytes
// cp.async ring stages: as deep as two blocks a multiprocessor allow (the bytes in flight are
// what a weight stream needs).
__host__ __device__ constexpr int stages_for(int BT) { return BT <= 32 ? 5 : 4; }
constexpr int kMinSplitTiles = 8;  // kBK tiles a split at least (the ring's fill amortised)
constexpr int kMaxSplits = 16;

template <typename W>
struct SkinnyArgs {
  const W* x;          // [T, ldx] rows in the weight's type, 16-byte aligned rows
  int64_t ldx;         // elements between x rows (% 8 == 0)
  int T;               // rows of x, 1..BT
  int K;               // % 8 == 0
  const W* w;          // [N, K], 16-byte aligned
  int N;               // outputs a row
  int k_tiles;         // kBK tiles a split
  int splits;          // blocks along K a weight tile
  int early;           // 1: the weights are resident (read before the wait)
  const float* bias;   // [N] or null
  float* y;            // [T, N] f32
  float* part;         // splits > 1: [splits, T, N] f32, each split's sums
};

// grid (n_tiles * splits); block kThreads; dynamic shared memory stages_for(BT) x (W: kBN x kBK,
// X: BT x kBK) elements, each 128-byte row's 16-byte chunks XOR-swizzled by (row & 7), so the 8
// rows an ldmatrix phase reads fall in distinct bank groups.
template <typename W, int BT>
__global__ void __launch_bounds__(kThreads) skinny_kernel(const SkinnyArgs<W> a) {
  constexpr int kStages = stages_for(BT);
  constexpr int NT = BT / 8;                    // n8 tiles of x rows (every warp takes all)
  constexpr int kStage = (kBN + BT) * kBK;      // elements a stage
  constexpr int JW = kBN * 8 / kThreads;        // weight chunks a thread copies a stage
  constexpr int JX = BT * 8 / kThreads;         // x chunks a thread copies a stage
  static_assert(NT % 2 == 0 && JX >= 1, "BT");
  extern __shared__ __align__(128) unsigned char sk_smem[];
  W* const sm = reinterpret_cast<W*>(sk_smem);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tile = static_cast<int>(blockIdx.x) / a.splits;
  const int split = static_cast<int>(blockIdx.x) - tile * a.splits;
  const int n0 = tile * kBN;
  const int kt0 = split * a.k_tiles;
  const int KT = min(a.k_tiles, (a.K + kBK - 1) / kBK - kt0);  // >= 1 (the host's splits)

  // Chunk cc = tid % 8 of rows tid / 8 + 16 j: weight rows (j < JW), then x rows (j < JX).
  // null: a zero-filled row (past N, or past T).
  const int cc = threadIdx.x & 7;
  const int r0 = threadIdx.x >> 3;
  const W* wsrc[JW];
  const W* xsrc[JX];
#pragma unroll
  for (int j = 0; j < JW; ++j) {
    const int n = n0 + r0 + 16 * j;
    wsrc[j] = n < a.N ? a.w + static_cast<int64_t>(n) * a.K + cc * 8 : nullptr;
  }
#pragma unroll
  for (int j = 0; j < JX; ++j) {
    const int t = r0 + 16 * j;
    xsrc[j] = t < a.T ? a.x + static_cast<int64_t>(t) * a.ldx + cc * 8 : nullptr;
  }
  auto dst = [&](int r) { return r * kBK + ((cc ^ (r & 7)) << 3); };
  auto load_w = [&](int buf, int kt) {
    W* const st = sm + buf * kStage;
    const int k = (kt0 + kt) * kBK;
    const bool kin = k + cc * 8 < a.K;  // K % 8 == 0: a chunk is whole or past K
#pragma unroll
    for (int j = 0; j < JW; ++j) {
      const bool ok = wsrc[j] != nullptr && kin;
      cp_async_16(st + dst(r0 + 16 * j), ok ? wsrc[j] + k : a.w, ok ? 16 : 0);
    }
  };
  auto load_x = [&](int buf, int kt) {
    W* const st = sm + buf * kStage + kBN * kBK;
    const int k = (kt0 + kt) * kBK;
    const bool kin = k + cc * 8 < a.K;
#pragma unroll
    for (int j = 0; j < JX; ++j) {
      const bool ok = xsrc[j] != nullptr && kin;
      cp_async_16(st + dst(r0 + 16 * j), ok ? xsrc[j] + k : a.w, ok ? 16 : 0);
    }
  };

  // The ring's first kStages - 1 stages. Resident weights: their rows as one cp.async group
  // before the wait (the previous kernel is still draining), then each stage's x rows as a
  // group of its own after it; so stage s has landed once groups 0..s + 1 have (B-group
  // counting: at step kt, cp_async_wait<kStages - 2> leaves only groups newer than kt + 1
  // pending). Else one group a stage with both, after the wait.
  if (a.early) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < KT) load_w(s, s);
    }
    cp_async_commit();
  }
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) {
      if (!a.early) load_w(s, s);
      load_x(s, s);
    }
    cp_async_commit();
  }
  float acc[2][NT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;
    }
  }
  const int sw = lane & 7;  // every ldmatrix row's (row & 7): row bases are multiples of 8
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1's buffer is free
    if (kt + kStages - 1 < KT) {
      load_w((kt + kStages - 1) % kStages, kt + kStages - 1);
      load_x((kt + kStages - 1) % kStages, kt + kStages - 1);
    }
    cp_async_commit();
    const W* const sw_ = sm + (kt % kStages) * kStage;
    const W* const sx = sw_ + kBN * kBK;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = warp * 32 + i * 16 + (lane & 15);
        ldsm_x4(af[i], sw_ + r * kBK + (((kk * 2 + (lane >> 4)) ^ sw) << 3));
      }
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        uint32_t bf[4];  // b0 b1 of n8 tile j, then of tile j + 1
        const int q = lane >> 3;
        const int r = (j + (q >> 1)) * 8 + (lane & 7);
        ldsm_x4(bf, sx + r * kBK + (((kk * 2 + (q & 1)) ^ sw) << 3));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma_bf16(acc[i][j], af[i], bf[0], bf[1]);
          mma_bf16(acc[i][j + 1], af[i], bf[2], bf[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // acc[i][j]: weight rows n = n0 + warp * 32 + i * 16 + g (v 0, 1) and + 8 (v 2, 3), x rows
  // t = j * 8 + 2 qd (v 0, 2) and + 1 (v 1, 3).
  const int g = lane >> 2, qd = lane & 3;
  float* const out = a.splits > 1 ? a.part + static_cast<int64_t>(split) * a.T * a.N : a.y;
  const bool direct = a.splits == 1;  // else a partial, its bias added by the reduction
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int n = n0 + warp * 32 + i * 16 + g + (v >> 1) * 8;
      if (n >= a.N) continue;
      const bool add_bias = direct && a.bias != nullptr;
      const float b = add_bias ? a.bias[n] : 0.0f;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int t = j * 8 + 2 * qd + (v & 1);
        if (t < a.T) {
          const float s = acc[i][j][v];
          out[static_cast<int64_t>(t) * a.N + n] = add_bias ? s + b : s;
        }
      }
    }
  }
}

// y = the splits' partials [splits, n] summed in ascending split order, then + bias[i % N]
// (n = T * N). Every split's load is issued before the first add, so a thread waits for one
// round trip, not one a split.
__global__ void skinny_reduce_kernel(const float* __restrict__ part, int splits, int64_t n, int N,
                                     const float* __restrict__ bias, float* __restrict__ y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v[kMaxSplits];
#pragma unroll
    for (int k = 0; k < kMaxSplits; ++k) v[k] = k < splits ? part[k * n + i] : 0.0f;
    float s = v[0];
#pragma unroll
    for (int k = 1; k < kMaxSplits; ++k) {
      if (k < splits) s += v[k];
    }
    if (bias) s += bias[i % N];
    y[i] = s;
  }
}

template <typename W, int BT>
int launch_skinny(MemraCudaCtx* ctx, const SkinnyArgs<W>& a, int n_tiles) {
  constexpr size_t smem = static_cast<size_t>(stages_for(BT)) * (kBN + BT) * kBK * sizeof(W);
  static_assert(smem > 48 * 1024, "opt-in below");
  MEMRA_CUDA_RETURN_IF(status_of(cudaFuncSetAttribute(
      skinny_kernel<W, BT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem))));
  memra::cuda::launch(ctx, true, skinny_kernel<W, BT>, dim3(n_tiles * a.splits), dim3(kThreads),
                      smem, a);
  return launch_status();
}

template <typename W>
int run_skinny(MemraCudaCtx* ctx, const W* x, int64_t ldx, int T, int K, const W* w, int N,
               const float* bias, float* y) {
  SkinnyArgs<W> a{};
  a.x = x;
  a.ldx = ldx;
  a.T = T;
  a.K = K;
  a.w = w;
  a.N = N;
  a.bias = bias;
  a.y = y;
  a.early = ctx->resident_weights > 0 ? 1 : 0;
  const int n_tiles = static_cast<int>(ceil_div(N, kBN));
  const int k_all = static_cast<int>(ceil_div(K, kBK));
  int sms = 0;
  MEMRA_CUDA_RETURN_IF(
      status_of(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device)));
  // Splits from N and K alone (never T: a row's bytes stay those of any batch): enough blocks
  // for two a multiprocessor where the weight's tiles are fewer, each split at least
  // kMinSplitTiles stages long.
  int splits = 1;
  if (n_tiles < 2 * sms) {
    splits = std::min({2 * sms / n_tiles, k_all / kMinSplitTiles, kMaxSplits});
    if (splits < 1) splits = 1;
  }
  a.k_tiles = static_cast<int>(ceil_div(k_all, splits));
  a.splits = static_cast<int>(ceil_div(k_all, a.k_tiles));  // no split without k tiles
  Scratch part(ctx, a.splits > 1 ? sizeof(float) * static_cast<size_t>(a.splits) * T * N : 0);
  MEMRA_CUDA_RETURN_IF(part.status());
  if (a.splits > 1) a.part = part.as<float>();
  if (T <= 16) {
    MEMRA_CUDA_RETURN_IF((launch_skinny<W, 16>(ctx, a, n_tiles)));
  } else if (T <= 32) {
    MEMRA_CUDA_RETURN_IF((launch_skinny<W, 32>(ctx, a, n_tiles)));
  } else {
    MEMRA_CUDA_RETURN_IF((launch_skinny<W, 64>(ctx, a, n_tiles)));
  }
  if (a.splits == 1) return memra::kOk;
  const int64_t n = static_cast<int64_t>(T) * N;
  memra::cuda::launch(ctx, true, skinny_reduce_kernel, dim3(static_cast<unsigned>(ceil_div(n, 256))),
                      dim3(256), 0, a.part, a.splits, n, N, bias, y);
  return launch_status();
}

}  // namespace

namespace memra::cuda {

bool skinny_fits(const MemraCudaCtx* ctx, int T, int K, int N, const void* w, int w_dtype) {
  return ctx->options.skinny_gemm && w_dtype == 1 && T >= 2 &&
         T <= kSkinnyMaxT && K > 0 && K % 8 == 0 && N > 0 && aligned16(w);
}

int skinny_gemm(MemraCudaCtx* ctx, const void* x, int64_t ldx, int T, int K, const void* w,
                int N, const float* bias, float* y) {
  return run_skinny<__nv_bfloat16>(ctx, static_cast<const __nv_bfloat16*>(x), ldx, T, K,
                                   static_cast<const __nv_bfloat16*>(w), N, bias, y);
}

}  // namespace memra::cuda
