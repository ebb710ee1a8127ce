// The forms of the linear entry (cuda/linear.cu, cuda_abi/linear.h) as C++ functions, for the
// library's other entries that run a GEMM on the way (the MLP, the router, mHC's logits, KDA's
// gate pair): each is the body memra_cuda_linear runs for that form of MemraLinearParams, with
// its checks and error codes.
#pragma once

#include <cstdint>

#include "common.cuh"

namespace memra::cuda {

// Packed f32 rows: y[T, N] = x[T, K] w[N, K]^T (+ bias[N]), w of w_dtype.
int linear(MemraCudaCtx* ctx, const float* x, int T, int K, const void* w, int w_dtype, int N,
           const float* bias, float* y);

// x of x_dtype with rows ldx elements apart (K <= ldx < 2^31): read in place when x_dtype ==
// w_dtype, rounded (RNE) first when x is f32 against a bf16 / f16 w.
int linear_ex(MemraCudaCtx* ctx, const void* x, int x_dtype, int64_t ldx, int T, int K,
              const void* w, int w_dtype, int N, const float* bias, float* y);

// linear_ex(x0, w0, N0, bias0, y0) and linear_ex(x1, w1, N1, bias1, y1) with the bytes of the two
// calls, in one launch when both take the decode GEMV.
int linear_ex_pair(MemraCudaCtx* ctx, const void* x0, const void* x1, int x_dtype, int64_t ldx,
                   int T, int K, const void* w0, const void* w1, int w_dtype, int N0, int N1,
                   const float* bias0, const float* bias1, float* y0, float* y1);

}  // namespace memra::cuda
