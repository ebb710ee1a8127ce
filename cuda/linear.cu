// linear (cpp/include/memra/cuda_abi/linear.h): y[T, N] = x[T, K] w[N, K]^T (+ bias[N]) through
// cuBLAS, the GPU twin of cpu::linear.
//   f32 w:       SGEMM (cublasGemmEx, CUBLAS_COMPUTE_32F, default math: TF32 off).
//   bf16 / f16 w: x rounded to the weight's type (RNE) into stream-ordered scratch, then a
//                bf16 x bf16 (f16 x f16) GEMM with f32 accumulation and f32 output. Products of
//                two bf16 values are exact in f32, so against cpu::linear on the same weight with
//                x rounded to bf16 first only the summation order differs.
//   bias:        added by a small kernel after the GEMM (acc, then + bias[n], as on the CPU).
// cuBLAS is column-major: the row-major y[T, N] is the column-major N x T matrix
//   y_cm = w_cm^T x_cm, with w_cm = w viewed as K x N (ld K), x_cm = x viewed as K x T (ld K),
// i.e. gemm(op(A) = T, op(B) = N, m = N, n = T, k = K, A = w, lda = K, B = x, ldb = K, ldc = N).
//
// T = 1 row (MEMRA_GEMV_MAX_ROWS) with a bf16 or f32 weight, K % (16 / sizeof w) == 0 and
// 16-byte aligned x and w: the GEMV of cuda/gemv.cu instead (same rounding of x, f32
// accumulation in another order, bias in its epilogue).
//
// A strided or 16-bit input (MemraLinearParams::ldx, x_dtype; memra::cuda::linear_ex): the same
// GEMM over rows ldx elements apart (ldb = ldx) which may already be in the weight's type (a
// layer rounds one activation once and feeds several GEMMs with it, or reads a column slice of a
// wider activation); an f32 input against a bf16 / f16 weight is rounded as for packed rows (row
// by row into packed scratch when ldx != K). The pair (MemraLinearParams::pair) is one GEMV
// launch when both GEMMs take it, else the two GEMMs.
#include <cstdint>

#include "common.cuh"
#include "gemv.cuh"
#include "linear.cuh"

using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;

using memra::cuda::from_f32;

namespace {

unsigned grid_stride_blocks(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 * 16 ? b : 65535 * 16);
}


// x f32 -> H (RNE), n elements; four at a time when both ends are aligned.
template <typename H>
__global__ void round_kernel(const float* __restrict__ x, H* __restrict__ out, int64_t n,
                             bool vec4) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (vec4) {
    const int64_t n4 = n / 4;
    for (int64_t q = i; q < n4; q += stride) {
      const float4 v = reinterpret_cast<const float4*>(x)[q];
      H* o = out + 4 * q;
      o[0] = from_f32<H>(v.x);
      o[1] = from_f32<H>(v.y);
      o[2] = from_f32<H>(v.z);
      o[3] = from_f32<H>(v.w);
    }
    for (int64_t k = 4 * n4 + i; k < n; k += stride) out[k] = from_f32<H>(x[k]);
  } else {
    for (; i < n; i += stride) out[i] = from_f32<H>(x[i]);
  }
}

// x f32 [T, K] with rows ldx apart -> packed out [T, K] (RNE): the round_kernel of a strided x.
template <typename H>
__global__ void round_strided_kernel(const float* __restrict__ x, int64_t ldx, H* __restrict__ out,
                                     int64_t T, int K) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t n = T * K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / K, k = i - t * K;
    out[i] = from_f32<H>(x[t * ldx + k]);
  }
}

// y[t, n] += bias[n] over T * N elements.
__global__ void bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t total,
                            int N) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = y[i] + bias[i % N];
  }
}

__global__ void bias_fill_kernel(float* __restrict__ y, const float* __restrict__ bias,
                                 int64_t total, int N) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = bias ? bias[i % N] : 0.0f;
  }
}

int gemm(MemraCudaCtx* ctx, const void* x, int64_t ldx, const void* w, cudaDataType_t ab_type,
         int T, int K, int N, float* y) {
  const float one = 1.0f, zero = 0.0f;
  return status_of(cublasGemmEx(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, ab_type, K,
                                x, ab_type, static_cast<int>(ldx), &zero, y, CUDA_R_32F, N,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <typename H>
int rounded_gemm(MemraCudaCtx* ctx, const float* x, int64_t ldx, int T, int K, const void* w,
                 cudaDataType_t ab_type, int N, float* y) {
  const int64_t n = static_cast<int64_t>(T) * K;
  Scratch xs(ctx, static_cast<size_t>(n) * sizeof(H));
  MEMRA_CUDA_RETURN_IF(xs.status());
  if (ldx == K || T == 1) {  // packed rows (linear's case): one flat pass, float4 when aligned
    const bool vec4 = memra::cuda::aligned16(x);
    memra::cuda::launch(ctx, true, round_kernel<H>,
        dim3(grid_stride_blocks(vec4 ? n / 4 + 1 : n, 256)), dim3(256), 0, x, xs.as<H>(), n, vec4);
  } else {
    memra::cuda::launch(ctx, true, round_strided_kernel<H>, dim3(grid_stride_blocks(n, 256)),
        dim3(256), 0, x, ldx, xs.as<H>(), T, K);
  }
  MEMRA_CUDA_RETURN_IF(launch_status());
  return gemm(ctx, xs.as<H>(), K, w, ab_type, T, K, N, y);
}

cudaDataType_t ab_type_of(int dtype) {
  return dtype == 0 ? CUDA_R_32F : dtype == 1 ? CUDA_R_16BF : CUDA_R_16F;
}

// The argument contract linear_ex and linear_ex_pair share (x of x_dtype with row stride ldx,
// T rows of K against w of w_dtype with N0 (and N1) outputs), in linear_ex's order of checks.
int ex_contract(int x_dtype, int64_t ldx, int T, int K, int w_dtype, int N0, int N1) {
  if (T < 0 || K < 0 || N0 < 0 || N1 < 0) return memra::kContractValue;
  if (w_dtype < 0 || w_dtype > 2 || x_dtype < 0 || x_dtype > 2) return memra::kContractDType;
  if (x_dtype != w_dtype && x_dtype != 0) return memra::kContractDType;  // f32 x is rounded
  if (ldx < K || ldx > 0x7fffffffLL) return memra::kContractStride;
  return memra::kOk;
}

// The shared body of linear and linear_ex (arguments validated by the callers).
int linear_impl(MemraCudaCtx* ctx, const void* x, int x_dtype, int64_t ldx, int T, int K,
                const void* w, int w_dtype, int N, const float* bias, float* y) {
  const int64_t total = static_cast<int64_t>(T) * N;
  if (K == 0) {  // an empty sum: y = bias (or 0); cuBLAS is not asked about k = 0
    MEMRA_CUDA_RETURN_IF(memra::cuda::flush_pending(ctx));  // no GEMV to carry a deferred Sinkhorn
    memra::cuda::launch(ctx, true, bias_fill_kernel, dim3(grid_stride_blocks(total, 256)),
        dim3(256), 0, y, bias, total, N);
    return launch_status();
  }
  bool handled = false;
  MEMRA_CUDA_RETURN_IF(memra::cuda::gemv(ctx, x, x_dtype, T, K, w, w_dtype, N, bias, y, &handled));
  if (handled) return memra::kOk;
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_pending(ctx));  // cuBLAS cannot run a deferred Sinkhorn
  if (x_dtype == w_dtype) {
    MEMRA_CUDA_RETURN_IF(gemm(ctx, x, ldx, w, ab_type_of(w_dtype), T, K, N, y));
  } else if (w_dtype == 1) {  // x f32 (the callers refuse any other pair)
    MEMRA_CUDA_RETURN_IF(rounded_gemm<__nv_bfloat16>(ctx, static_cast<const float*>(x), ldx, T, K,
                                                     w, CUDA_R_16BF, N, y));
  } else {
    MEMRA_CUDA_RETURN_IF(rounded_gemm<__half>(ctx, static_cast<const float*>(x), ldx, T, K, w,
                                              CUDA_R_16F, N, y));
  }
  if (bias) {
    memra::cuda::launch(ctx, true, bias_kernel, dim3(grid_stride_blocks(total, 256)), dim3(256), 0,
        y, bias, total, N);
  }
  return launch_status();
}

}  // namespace

namespace {

// The GEMM entries leave a deferred mHC Sinkhorn to the decode GEMV (common.cuh), unless one of
// their arguments (x, w, bias, or the output y [T, N]) overlaps that comb.
int keep_pending(MemraCudaCtx* ctx, const void* x, size_t x_bytes, const void* w, size_t w_bytes,
                 const float* bias, int N, const float* y, int T) {
  MEMRA_CUDA_RETURN_IF(memra::cuda::enter_keep(ctx));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, x, x_bytes));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, w, w_bytes));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, y, sizeof(float) * size_t(T > 0 ? T : 0) *
                                                               size_t(N > 0 ? N : 0)));
  return memra::cuda::flush_if_reads(ctx, bias, sizeof(float) * static_cast<size_t>(N > 0 ? N : 0));
}

size_t elt(int dtype) { return dtype == 0 ? 4 : 2; }

}  // namespace

namespace memra::cuda {

int linear(MemraCudaCtx* ctx, const float* x, int T, int K, const void* w, int w_dtype, int N,
           const float* bias, float* y) {
  MEMRA_CUDA_RETURN_IF(keep_pending(ctx, x, sizeof(float) * size_t(T > 0 ? T : 0) * size_t(K > 0 ? K : 0),
                                    w, elt(w_dtype) * size_t(N > 0 ? N : 0) * size_t(K > 0 ? K : 0),
                                    bias, N, y, T));
  if (T < 0 || K < 0 || N < 0) return memra::kContractValue;
  if (w_dtype < 0 || w_dtype > 2) return memra::kContractDType;
  if (T == 0 || N == 0) return memra::kOk;
  if (!y || (K > 0 && (!x || !w))) return memra::kContractMissing;
  return linear_impl(ctx, x, 0, K, T, K, w, w_dtype, N, bias, y);
}

int linear_ex(MemraCudaCtx* ctx, const void* x, int x_dtype, int64_t ldx, int T, int K,
              const void* w, int w_dtype, int N, const float* bias, float* y) {
  MEMRA_CUDA_RETURN_IF(ex_contract(x_dtype, ldx, T, K, w_dtype, N, 0));
  MEMRA_CUDA_RETURN_IF(keep_pending(ctx, x, elt(x_dtype) * size_t(ldx) * size_t(T),
                                    w, elt(w_dtype) * size_t(N) * size_t(K), bias, N, y, T));
  if (T == 0 || N == 0) return memra::kOk;
  if (!y || (K > 0 && (!x || !w))) return memra::kContractMissing;
  return linear_impl(ctx, x, x_dtype, ldx, T, K, w, w_dtype, N, bias, y);
}

int linear_ex_pair(MemraCudaCtx* ctx, const void* x0, const void* x1, int x_dtype, int64_t ldx,
                   int T, int K, const void* w0, const void* w1, int w_dtype, int N0, int N1,
                   const float* bias0, const float* bias1, float* y0, float* y1) {
  MEMRA_CUDA_RETURN_IF(ex_contract(x_dtype, ldx, T, K, w_dtype, N0, N1));
  MEMRA_CUDA_RETURN_IF(keep_pending(ctx, x0, elt(x_dtype) * size_t(ldx) * size_t(T),
                                    w0, elt(w_dtype) * size_t(N0) * size_t(K), bias0, N0, y0, T));
  MEMRA_CUDA_RETURN_IF(keep_pending(ctx, x1, elt(x_dtype) * size_t(ldx) * size_t(T),
                                    w1, elt(w_dtype) * size_t(N1) * size_t(K), bias1, N1, y1, T));
  if (T == 0) return memra::kOk;
  if ((N0 > 0 && (!y0 || (K > 0 && (!x0 || !w0)))) || (N1 > 0 && (!y1 || (K > 0 && (!x1 || !w1))))) {
    return memra::kContractMissing;
  }
  if (T == 1 && K > 0) {
    bool handled = false;
    MEMRA_CUDA_RETURN_IF(gemv_pair(ctx, x0, x1, x_dtype, K, w0, w1, w_dtype, N0, N1, bias0, bias1,
                                   y0, y1, &handled));
    if (handled) return memra::kOk;
  }
  if (N0 > 0) MEMRA_CUDA_RETURN_IF(linear_impl(ctx, x0, x_dtype, ldx, T, K, w0, w_dtype, N0, bias0, y0));
  if (N1 > 0) return linear_impl(ctx, x1, x_dtype, ldx, T, K, w1, w_dtype, N1, bias1, y1);
  return memra::kOk;
}

}  // namespace memra::cuda

// The three forms of MemraLinearParams, each the body of the entry it replaced (linear: packed
// f32 rows, checked after the context; linear_ex: a strided or 16-bit x, checked before it;
// linear_ex_pair), so every check, error code and launch is the old entry's.
extern "C" int memra_cuda_linear(MemraCudaCtx* ctx, const MemraLinearParams* p) {
  if (!p) {
    MEMRA_CUDA_RETURN_IF(memra::cuda::enter_keep(ctx));
    return memra::kContractMissing;
  }
  const int64_t ldx = p->ldx != 0 ? p->ldx : p->K;
  if (p->pair) {
    return memra::cuda::linear_ex_pair(ctx, p->x, p->x1, p->x_dtype, ldx, p->T, p->K, p->w, p->w1,
                                       p->w_dtype, p->N, p->N1, p->bias, p->bias1, p->y, p->y1);
  }
  if (p->x_dtype == 0 && p->ldx == 0) {
    return memra::cuda::linear(ctx, static_cast<const float*>(p->x), p->T, p->K, p->w, p->w_dtype,
                               p->N, p->bias, p->y);
  }
  return memra::cuda::linear_ex(ctx, p->x, p->x_dtype, ldx, p->T, p->K, p->w, p->w_dtype, p->N,
                                p->bias, p->y);
}
