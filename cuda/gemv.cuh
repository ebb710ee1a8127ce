// The decode GEMV (cuda/gemv.cu), used by the linear entry (cuda/linear.cu) for short inputs.
#pragma once

#include "common.cuh"

namespace memra::cuda {

// Rows of x the GEMV takes; linear_ex sends longer inputs to cuBLAS.
constexpr int kGemvMaxT = MEMRA_GEMV_MAX_ROWS;

// y[T, N] = x[T, K] w[N, K]^T (+ bias[N]) (arguments already validated by linear / linear_ex;
// T <= kGemvMaxT = 1, so x's row stride never matters): *handled = true when the GEMV took the
// call (w bf16 or f32, x f32 or in w's dtype, 16-byte aligned x and w, K a multiple of 16 bytes
// of w), false when the caller must run cuBLAS instead (nothing was enqueued). Returns the launch
// status.
int gemv(MemraCudaCtx* ctx, const void* x, int x_dtype, int T, int K, const void* w, int w_dtype,
         int N, const float* bias, float* y, bool* handled);

// Whether gemv() takes one row of x [K] (x_dtype) against w (w_dtype): the GEMV is on, w bf16
// or f32, x f32 or in w's dtype, K a whole number of 16-byte vectors of w, x and w 16-byte aligned.
bool gemv_takes(const MemraCudaCtx* ctx, const void* x, int x_dtype, int K, const void* w,
                int w_dtype);

// Two GEMVs of one row, the same K and the same dtypes in one launch: y0 = x0 w0^T (+ bias0)
// [N0], y1 = x1 w1^T (+ bias1) [N1], each row computed as gemv() computes it (short rows, K <= 32
// vectors of 16 bytes: KDA's f_b / g_b; longer ones: its q|k|v and f_a|g_a|beta of one x).
// *handled = false (nothing enqueued) when the pair does not qualify.
int gemv_pair(MemraCudaCtx* ctx, const void* x0, const void* x1, int x_dtype, int K,
              const void* w0, const void* w1, int w_dtype, int N0, int N1, const float* bias0,
              const float* bias1, float* y0, float* y1, bool* handled);

}  // namespace memra::cuda
