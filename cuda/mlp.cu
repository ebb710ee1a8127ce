// The dense SwiGLU MLP of the CUDA backend (cpp/include/memra/cuda_abi/mlp.h): the GPU twin of
// cpu::swiglu_mlp (cpu/mlp.cpp). Three cuBLAS GEMMs (memra_cuda_linear: f32 SGEMM with TF32 off,
// or x rounded to bf16 for bf16 weights) around an elementwise clamped-SwiGLU kernel that writes
// the CPU's formula element by element. When up_w directly follows gate_w in memory (one [2I, D]
// matrix, as MlpLayer uploads them) gate and up are one GEMM with N = 2I and the activation reads
// its [T, 2I] output; at one row, where the decode GEMV takes that matrix, the activation rides in
// the GEMV's epilogue.
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemv.cuh"
#include "gemv_rows.cuh"
#include "linear.cuh"
#include "moe_common.cuh"
#include "swiglu.cuh"

using memra::cuda::clamped_swiglu;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
namespace grow = memra::cuda::gemv_rows_detail;  // the decode GEMV's row body

namespace {

// g[i] = clamped_swiglu(g[i], u[i]) over n elements (in place over g).
__global__ void swiglu_act_kernel(float* __restrict__ g, const float* __restrict__ u, int64_t n,
                                  float limit) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    g[i] = clamped_swiglu(g[i], u[i], limit);
  }
}

// h[t, i] = clamped_swiglu(gu[t, i], gu[t, I + i]) over T * I elements: the activation of the
// fused gate|up GEMM's output [T, 2I], written as [T, I] for the down GEMM.
// H = float, or the down weight's 16-bit dtype: h is then written already rounded (RNE, the
// rounding memra_cuda_linear would apply to an f32 h), so the down GEMM reads it as it is.
__device__ __forceinline__ void store_h(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_h(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_h(__half* p, float v) { *p = __float2half_rn(v); }

template <typename H>
__global__ void swiglu_pair_kernel(const float* __restrict__ gu, int64_t T, int I, float limit,
                                   H* __restrict__ h) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t n = T * I;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += stride) {
    const int64_t t = k / I, i = k - t * I;
    const float* row = gu + t * 2 * I;
    store_h(h + k, clamped_swiglu(row[i], row[I + i], limit));
  }
}

// The gate|up GEMV with the SwiGLU in its epilogue (one row, T == 1): grow::SwigluRows makes
// block b sum gate rows b * R/2 .. and their up rows, each as
// the decode GEMV sums a row, and store h = swiglu_pair_kernel's value of that pair, so h (and
// the down GEMV after it) has the bytes of the GEMV, then swiglu_pair_kernel: one launch (and
// one memory round trip) fewer per dense MLP at batch 1. A deferred Sinkhorn rides in block 0,
// as on the GEMV.
template <typename H>
struct SwigluStore {
  float limit;
  __device__ __forceinline__ void operator()(H* p, float g, float u) const {
    store_h(p, clamped_swiglu(g, u, limit));
  }
};

template <typename W, typename X, typename H, int R, int P>
__global__ void __launch_bounds__(grow::kGemvThreads, P == 1 ? 4 : 0)
    gemv_swiglu_kernel(const X* __restrict__ x, const W* __restrict__ w, int K, int I,
                       float limit, H* __restrict__ h, int prefetch, memra::cuda::SinkTask task) {
  if (task.comb && blockIdx.x == 0) return memra::cuda::run_sink_task(task);
  const grow::SwigluRows<H, SwigluStore<H>> out{h, I, SwigluStore<H>{limit}};
  grow::gemv_rows<W, X, R, P>(x, w, K, 2 * I, nullptr, nullptr, prefetch,
                              blockIdx.x - (task.comb ? 1 : 0), out);
}

// h [I] (H: f32, or bf16 for bf16 weights) = swiglu over the fused gate|up GEMV of one row x [K]
// f32 against w [2I, K] (f32 or bf16): *handled = false (nothing enqueued) when the decode GEMV
// would not take the GEMV (gemv_takes, rows past the short-row form).
template <typename H>
int gemv_swiglu(MemraCudaCtx* ctx, const float* x, int K, const void* w, int w_dtype, int I,
                float limit, H* h, bool* handled) {
  *handled = false;
  const int E = w_dtype == 0 ? 4 : 8;
  if (I < 1 || !memra::cuda::gemv_takes(ctx, x, 0, K, w, w_dtype) ||
      K / E <= grow::kShortMaxV || (w_dtype == 0) != std::is_same_v<H, float>) {
    return memra::kOk;
  }
  // The GEMV's own check (memra_cuda_linear): a weight that overlaps a pending comb.
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, w, 16 * size_t(K / E) * 2 * size_t(I)));
  *handled = true;
  const int prefetch = ctx->resident_weights > 0 ? 1 : 0;
  const int N = 2 * I;  // the decode GEMV's rows a block for N (gemv.cu rows_for), even
  const int R = N >= 16384 ? 8 : N >= 2048 ? 4 : 2;
  // One 16-byte vector a thread per row and chunk (P = 1), as the decode GEMV.
  auto go = [&](auto wt, auto r) {
    using W = decltype(wt);
    constexpr int RR = decltype(r)::value;
    return grow::launch_gemv(ctx, gemv_swiglu_kernel<W, float, H, RR, 1>,
                             (I + RR / 2 - 1) / (RR / 2), x, static_cast<const W*>(w), K, I,
                             limit, h, prefetch);
  };
  auto with_r = [&](auto wt) {
    if (R == 8) return go(wt, std::integral_constant<int, 8>());
    if (R == 4) return go(wt, std::integral_constant<int, 4>());
    return go(wt, std::integral_constant<int, 2>());
  };
  if constexpr (std::is_same_v<H, float>) {
    return with_r(float{});
  } else {
    return with_r(__nv_bfloat16{});
  }
}

unsigned act_blocks(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 65535 * 16 ? b : 65535 * 16);
}

// memra_cuda_swiglu_mlp after its context check: y = mlp(x), plus add [T, D] (or null) summed into
// y: at T = 1 as the down GEMV's bias (its s += bias[n] after the row's sum: mlp + add, the same
// bits as the add kernel's a + b in either order), otherwise memra_cuda_add after the down GEMM.
// xr: null, or x already rounded to w_dtype (16-bit weights, T > MEMRA_GEMV_MAX_ROWS), which the
// gate / up GEMMs then read instead of rounding x themselves (the same bytes).
int swiglu_mlp_impl(MemraCudaCtx* ctx, const float* x, int T, int D, const void* gate_w,
                    const void* up_w, const void* down_w, int w_dtype, int I, float limit,
                    const float* add, float* y, const void* xr = nullptr) {
  const size_t rows = sizeof(float) * size_t(T > 0 ? T : 0) * size_t(D > 0 ? D : 0);
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, x, rows));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, add, rows));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, y, rows));
  if (T < 0 || D < 0 || I < 0) return memra::kContractValue;
  if (w_dtype < 0 || w_dtype > 2) return memra::kContractDType;
  if (!(limit > 0.0f)) return memra::kContractValue;  // as the binding: swiglu_limit > 0 (inf ok)
  if (T == 0 || D == 0) return memra::kOk;
  if (!x || !y || (I > 0 && (!gate_w || !up_w || !down_w))) return memra::kContractMissing;
  if (xr && (w_dtype == 0 || T <= MEMRA_GEMV_MAX_ROWS)) return memra::kContractValue;
  // y [T, N] = x w^T over x itself or its rounded copy.
  auto gemm_x = [&](const void* w, int N, float* out) {
    return xr ? memra::cuda::linear_ex(ctx, xr, w_dtype, D, T, D, w, w_dtype, N, nullptr, out)
              : memra::cuda::linear(ctx, x, T, D, w, w_dtype, N, nullptr, out);
  };
  const int64_t n = static_cast<int64_t>(T) * I;
  // gate and up stored as one [2I, D] matrix (up right after gate): one GEMM with N = 2I.
  const size_t wbytes = w_dtype == 0 ? sizeof(float) : sizeof(uint16_t);
  if (I > 0 && 2LL * I <= INT_MAX &&
      static_cast<const char*>(up_w) ==
          static_cast<const char*>(gate_w) + static_cast<size_t>(I) * D * wbytes) {
    Scratch buf(ctx, sizeof(float) * 3 * static_cast<size_t>(n));  // gu [T, 2I], h [T, I]
    MEMRA_CUDA_RETURN_IF(buf.status());
    float* gu = buf.as<float>();
    float* h = gu + 2 * n;  // f32, or the 16-bit down dtype in its first half
    bool fused = false;
    if (T == 1 && w_dtype == 0) {
      MEMRA_CUDA_RETURN_IF(gemv_swiglu(ctx, x, D, gate_w, w_dtype, I, limit, h, &fused));
    } else if (T == 1 && w_dtype == 1) {
      MEMRA_CUDA_RETURN_IF(gemv_swiglu(ctx, x, D, gate_w, w_dtype, I, limit,
                                       reinterpret_cast<__nv_bfloat16*>(h), &fused));
    }
    if (!fused) {  // the GEMM, then the activation's own launch
      MEMRA_CUDA_RETURN_IF(gemm_x(gate_w, 2 * I, gu));
      if (w_dtype == 0) {
        memra::cuda::launch(ctx, true, swiglu_pair_kernel<float>, dim3(act_blocks(n)), dim3(256),
                            0, gu, T, I, limit, h);
      } else if (w_dtype == 1) {
        memra::cuda::launch(ctx, true, swiglu_pair_kernel<__nv_bfloat16>, dim3(act_blocks(n)),
                            dim3(256), 0, gu, T, I, limit, reinterpret_cast<__nv_bfloat16*>(h));
      } else {
        memra::cuda::launch(ctx, true, swiglu_pair_kernel<__half>, dim3(act_blocks(n)),
                            dim3(256), 0, gu, T, I, limit, reinterpret_cast<__half*>(h));
      }
    }
    MEMRA_CUDA_RETURN_IF(launch_status());
    // h already in the down weight's dtype: no rounding launch before the GEMM.
    const bool bias = add && T == 1;
    MEMRA_CUDA_RETURN_IF(
        memra::cuda::linear_ex(ctx, h, w_dtype, I, T, I, down_w, w_dtype, D, bias ? add : nullptr, y));
    return add && !bias ? memra_cuda_add(ctx, y, add, static_cast<int64_t>(T) * D, y) : memra::kOk;
  }
  Scratch gu(ctx, sizeof(float) * 2 * static_cast<size_t>(n));
  MEMRA_CUDA_RETURN_IF(gu.status());
  float* g = gu.as<float>();
  float* u = g + n;
  MEMRA_CUDA_RETURN_IF(gemm_x(gate_w, I, g));
  MEMRA_CUDA_RETURN_IF(gemm_x(up_w, I, u));
  if (n > 0) {
    memra::cuda::launch(ctx, true, swiglu_act_kernel, dim3(act_blocks(n)), dim3(256), 0, g, u, n,
        limit);
    MEMRA_CUDA_RETURN_IF(launch_status());
  }
  // I == 0: linear writes y = 0 (an empty sum), as cpu::linear does.
  MEMRA_CUDA_RETURN_IF(memra::cuda::linear(ctx, g, T, I, down_w, w_dtype, D, nullptr, y));
  return add ? memra_cuda_add(ctx, y, add, static_cast<int64_t>(T) * D, y) : memra::kOk;
}

}  // namespace

namespace memra::cuda {

int swiglu_mlp_rounded(MemraCudaCtx* ctx, const float* x, const void* xr, int T, int D,
                       const void* gate_w, const void* up_w, const void* down_w, int w_dtype,
                       int I, float limit, const float* add, float* y) {
  MEMRA_CUDA_RETURN_IF(memra::cuda::enter_keep(ctx));
  return swiglu_mlp_impl(ctx, x, T, D, gate_w, up_w, down_w, w_dtype, I, limit, add, y, xr);
}

}  // namespace memra::cuda

extern "C" int memra_cuda_swiglu_mlp(MemraCudaCtx* ctx, const MemraMlpParams* p) {
  // A deferred mHC Sinkhorn rides on the gate|up GEMV (common.cuh) unless it reads the comb.
  MEMRA_CUDA_RETURN_IF(memra::cuda::enter_keep(ctx));
  if (!p) return memra::kContractMissing;
  return swiglu_mlp_impl(ctx, p->x, p->T, p->D, p->gate_w, p->up_w, p->down_w, p->w_dtype, p->I,
                         p->limit, p->add, p->y);
}
