// The small-GEMM arm of linear (cuda/linear.cu, cuda_abi/linear.h): y[T, N] = x[T, K] w[N, K]^T
// (+ bias) for a few rows (2 <= T <= kSmallMaxT, batched decode) against a small bf16 / f16
// weight, on CUDA cores in one launch (two when K is split), instead of a rounding kernel, a
// cuBLAS GEMM and, for these shapes, cuBLAS's split-K reduction.
//
// Why: at B = 32 the bench model's step ran ~40 such GEMMs (KDA's gate and beta projections, MLA's
// small ones; 0.1-2 MB each) through cuBLAS at 5-6 us each plus a reduction launch, outside the
// programmatic chain (results/2026-12-02-h200-s4-ncu-step32.txt): latency, not bytes.
//
// Arithmetic: x is rounded to the weight's type (RNE) as the cuBLAS arm rounds it, products of
// two 16-bit values are exact in f32, and each output is one f32 FMA chain over k ascending
// within a split, the splits' partials then summed in split order, then + bias (the CPU's
// order for the bias). The split count depends on N and K only, so a row's bytes do not depend
// on T or on the other rows.
//
// Block (column tile of kSmallCols, split s): lane t of every warp is row t; warp w owns columns
// n0 + 8 w .. + 7. Per stage of kSmallKC k: x [T, KC] staged transposed in shared memory (xs[k][t],
// conflict-free per lane), w [64 cols, KC] widened to f32 (ws[col][k]); every k step reads one xs
// value and eight broadcast ws values (two float4) for eight FMAs.
#include <cstdint>

#include "common.cuh"
#include "linear.cuh"

using memra::cuda::aligned16;
using memra::cuda::ceil_div;
using memra::cuda::from_f32;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::to_f32;

namespace {

constexpr int kSmallThreads = 256;                  // 8 warps
constexpr int kSmallWarpCols = 8;                   // output columns a warp
constexpr int kSmallCols = 8 * kSmallWarpCols;      // output columns a block
constexpr int kSmallKC = 64;                        // k a stage
constexpr int kSmallMaxT = 32;                      // rows: a lane each
constexpr int64_t kSmallMaxFma = int64_t(1) << 26;  // T * N * K: beyond, cuBLAS's tensor cores win
constexpr int kSmallTargetBlocks = 256;             // splits of K fill ~2 blocks an H200 SM
constexpr int kSmallMinSplitK = 2 * kSmallKC;       // k a split at least
static_assert(kSmallMaxT == 32, "a lane a row");

template <typename W, typename X>
struct SmallArgs {
  const X* x;         // [T, ldx]: f32 (rounded to W here) or W
  int64_t ldx;        // row stride of x (elements; % 4 == 0 for f32, % 8 for W)
  int T, K, N;        // rows (<= 32), reduction length (% 8 == 0), outputs
  const W* w;         // [N, K], 16-byte aligned
  const float* bias;  // [N] or null (added by the block when splits == 1, else by the reduce)
  int kc;             // k a split (a multiple of kSmallKC)
  int splits;         // ceil(K / kc)
  float* out;         // splits == 1: y [T, N]; else partials [splits, T, N]
};

template <typename W, typename X>
__global__ void __launch_bounds__(kSmallThreads) small_gemm_kernel(const SmallArgs<W, X> a) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ __align__(16) float xs[kSmallKC][kSmallMaxT + 1];
  __shared__ __align__(16) float ws[kSmallCols][kSmallKC + 4];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n0 = blockIdx.x * kSmallCols;
  const int split = blockIdx.y;
  const int k_begin = split * a.kc;
  const int k_end = min(a.K, k_begin + a.kc);
  float acc[kSmallWarpCols];
#pragma unroll
  for (int c = 0; c < kSmallWarpCols; ++c) acc[c] = 0.0f;

  for (int kb = k_begin; kb < k_end; kb += kSmallKC) {
    // x: T rows x 16 quads of k; rows past T and k past the split are zeros.
    for (int i = tid; i < kSmallMaxT * (kSmallKC / 4); i += kSmallThreads) {
      const int t = i / (kSmallKC / 4), q = i % (kSmallKC / 4);
      const int k = kb + 4 * q;
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (t < a.T && k < k_end) {  // K % 8 == 0 and kb % 64 == 0: the quad is whole
        const X* p = a.x + int64_t(t) * a.ldx + k;
        if constexpr (sizeof(X) == 4) {
          const float4 f = *reinterpret_cast<const float4*>(p);
          v[0] = to_f32(from_f32<W>(f.x));
          v[1] = to_f32(from_f32<W>(f.y));
          v[2] = to_f32(from_f32<W>(f.z));
          v[3] = to_f32(from_f32<W>(f.w));
        } else {
          const uint2 u = *reinterpret_cast<const uint2*>(p);
          const X* h = reinterpret_cast<const X*>(&u);
#pragma unroll
          for (int j = 0; j < 4; ++j) v[j] = to_f32(h[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) xs[4 * q + j][t] = v[j];
    }
    // w: 64 columns x 8 chunks of 8 k (16 bytes).
    for (int i = tid; i < kSmallCols * (kSmallKC / 8); i += kSmallThreads) {
      const int col = i / (kSmallKC / 8), q = i % (kSmallKC / 8);
      const int n = n0 + col, k = kb + 8 * q;
      float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      if (n < a.N && k < k_end) {
        const uint4 u = *reinterpret_cast<const uint4*>(a.w + int64_t(n) * a.K + k);
        const W* h = reinterpret_cast<const W*>(&u);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = to_f32(h[j]);
      }
      float4* d = reinterpret_cast<float4*>(&ws[col][8 * q]);
      d[0] = make_float4(v[0], v[1], v[2], v[3]);
      d[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    __syncthreads();
    const int kn = min(kSmallKC, k_end - kb);  // a multiple of 8
    for (int kk = 0; kk < kn; kk += 4) {
      float xv[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) xv[j] = xs[kk + j][lane];
#pragma unroll
      for (int c = 0; c < kSmallWarpCols; ++c) {
        const float4 wv = *reinterpret_cast<const float4*>(&ws[warp * kSmallWarpCols + c][kk]);
        acc[c] = fmaf(xv[0], wv.x, acc[c]);
        acc[c] = fmaf(xv[1], wv.y, acc[c]);
        acc[c] = fmaf(xv[2], wv.z, acc[c]);
        acc[c] = fmaf(xv[3], wv.w, acc[c]);
      }
    }
    __syncthreads();  // xs / ws are restaged by the next stage
  }
  if (lane >= a.T) return;
#pragma unroll
  for (int c = 0; c < kSmallWarpCols; ++c) {
    const int n = n0 + warp * kSmallWarpCols + c;
    if (n >= a.N) break;
    if (a.splits == 1) {
      a.out[int64_t(lane) * a.N + n] = a.bias ? acc[c] + a.bias[n] : acc[c];
    } else {
      a.out[(int64_t(split) * a.T + lane) * a.N + n] = acc[c];
    }
  }
}

// y[t, n] = the splits' partials summed in split order (+ bias[n]).
__global__ void small_gemm_reduce_kernel(const float* __restrict__ part, int splits, int64_t total,
                                         const float* __restrict__ bias, int N,
                                         float* __restrict__ y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  float s = part[i];
  for (int p = 1; p < splits; ++p) s += part[p * total + i];
  y[i] = bias ? s + bias[i % N] : s;
}

template <typename W, typename X>
int launch_small(MemraCudaCtx* ctx, const X* x, int64_t ldx, int T, int K, const W* w, int N,
                 const float* bias, float* y) {
  const int tiles = static_cast<int>(ceil_div(N, kSmallCols));
  int splits = static_cast<int>(ceil_div(kSmallTargetBlocks, tiles));
  const int max_splits = static_cast<int>(ceil_div(K, kSmallMinSplitK));
  splits = splits < 1 ? 1 : (splits > max_splits ? max_splits : splits);
  const int kc = static_cast<int>(ceil_div(ceil_div(K, splits), kSmallKC)) * kSmallKC;
  splits = static_cast<int>(ceil_div(K, kc));
  const int64_t total = static_cast<int64_t>(T) * N;
  Scratch part(ctx, splits > 1 ? sizeof(float) * static_cast<size_t>(total) * splits : 0);
  MEMRA_CUDA_RETURN_IF(part.status());
  SmallArgs<W, X> a{x, ldx, T, K, N, w, bias, kc, splits, splits > 1 ? part.as<float>() : y};
  memra::cuda::launch(ctx, true, small_gemm_kernel<W, X>, dim3(tiles, splits), dim3(kSmallThreads),
                      0, a);
  MEMRA_CUDA_RETURN_IF(launch_status());
  if (splits == 1) return memra::kOk;
  memra::cuda::launch(ctx, true, small_gemm_reduce_kernel, dim3(ceil_div(total, 256)), dim3(256), 0,
                      static_cast<const float*>(part.as<float>()), splits, total, bias, N, y);
  return launch_status();
}

}  // namespace

namespace memra::cuda {

int small_gemm(MemraCudaCtx* ctx, const void* x, int x_dtype, int64_t ldx, int T, int K,
               const void* w, int w_dtype, int N, const float* bias, float* y, bool* handled) {
  *handled = false;
  if (!ctx->options.small_gemm) return kOk;
  if (T < 2 || T > kSmallMaxT || K < 1 || N < 1 || K % 8 != 0) return kOk;
  if (w_dtype != 1 && w_dtype != 2) return kOk;
  if (static_cast<int64_t>(T) * N * K > kSmallMaxFma) return kOk;
  if (!aligned16(w) || !aligned16(x) || ldx % (x_dtype == 0 ? 4 : 8) != 0) return kOk;
  *handled = true;
  if (w_dtype == 1) {
    const auto* wb = static_cast<const __nv_bfloat16*>(w);
    return x_dtype == 0
               ? launch_small(ctx, static_cast<const float*>(x), ldx, T, K, wb, N, bias, y)
               : launch_small(ctx, static_cast<const __nv_bfloat16*>(x), ldx, T, K, wb, N, bias, y);
  }
  const auto* wh = static_cast<const __half*>(w);
  return x_dtype == 0 ? launch_small(ctx, static_cast<const float*>(x), ldx, T, K, wh, N, bias, y)
                      : launch_small(ctx, static_cast<const __half*>(x), ldx, T, K, wh, N, bias, y);
}

}  // namespace memra::cuda
