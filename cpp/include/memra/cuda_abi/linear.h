// CUDA ABI, linear area (cuda/linear.cu, cuda/gemv.cu): y = x w^T (+ bias), the GPU twin of
// cpu::linear (cpu/linear.h), over cuBLAS and the decode GEMV.
#pragma once

/* linear with at most this many rows (a decode step at batch 1) runs the GEMV of cuda/gemv.cu
   (bf16 or f32 weights, 16-byte aligned rows), which rounds an f32 x to bf16 itself: callers
   need not round such inputs first (gpu::round_input). */
#define MEMRA_GEMV_MAX_ROWS 1

/* y[T, N] = x[T, K] w[N, K]^T (+ bias[N]), f32 out, and with `pair` a second GEMM of the same
   x_dtype, ldx, T, K and w_dtype: y1[T, N1] = x1 w1^T (+ bias1), with the bytes of two calls.
   f32 w: SGEMM with TF32 off. bf16 / f16 w: an f32 x rounded to w's type (RNE) first, then a
   16-bit GEMM with f32 accumulation and f32 output (cuBLAS); x already in w's type is read in
   place (no rounding). T <= MEMRA_GEMV_MAX_ROWS with a bf16 or f32 w, K a whole number of
   16-byte vectors of w and 16-byte aligned x and w: the decode GEMV instead (the same rounding
   of x, f32 accumulation in another order, bias in its epilogue); with `pair`, both GEMMs in one
   launch when both take it (KDA's f_b and g_b, its q|k|v and f_a|g_a|beta).
   Errors: T, K, N or N1 < 0, 40025; a dtype code outside 0..2 or an x_dtype that is neither f32
   nor w_dtype, 40020; ldx out of range, 40022; a null y (or x, w with K > 0) of a GEMM that
   runs (N > 0, T > 0), 40024.
   A deferred mHC Sinkhorn (KernelOptions::mhc_defer) stays pending for the GEMV to run unless
   x, w, bias or y overlaps its comb. */
typedef struct MemraLinearParams {
  const void* x;      /* [T, ldx] of x_dtype: row t at x + t * ldx elements, columns [0, K) read */
  int x_dtype;        /* memra::DType code of x: 0 f32, 1 bf16, 2 f16 (bf16 / f16 only == w_dtype) */
  int64_t ldx;        /* elements between rows of x: 0 for packed rows (ldx = K), else
                         K <= ldx < 2^31 */
  int T;              /* rows of x and y */
  int K;              /* columns of w (an empty sum, K == 0, gives y = bias or 0) */
  const void* w;      /* [N, K] of w_dtype */
  int w_dtype;        /* memra::DType code of w: 0 f32, 1 bf16, 2 f16 */
  int N;              /* rows of w, columns of y */
  const float* bias;  /* [N] f32 or null */
  float* y;           /* [T, N] f32 */
  int pair;           /* nonzero: also the GEMM of x1, w1, N1, bias1, y1 below (else unread) */
  const void* x1;     /* [T, ldx] of x_dtype (the same x_dtype and ldx as x) */
  const void* w1;     /* [N1, K] of w_dtype */
  int N1;
  const float* bias1; /* [N1] f32 or null */
  float* y1;          /* [T, N1] f32 */
} MemraLinearParams;

#define MEMRA_CUDA_LINEAR_OPS(X)                                                                  \
  /* cpu::linear over MemraLinearParams (see there). */                                          \
  X(linear, (MemraCudaCtx * ctx, const MemraLinearParams* p))
