// CUDA ABI, utility area (cuda/util.cu): the small data movements the layers chain between ops.
#pragma once

#define MEMRA_CUDA_UTIL_OPS(X)                                                                    \
  /* y[i] = a[i] + b[i], n elements (y may alias a or b). */                                      \
  X(add, (MemraCudaCtx * ctx, const float* a, const float* b, int64_t n, float* y))               \
  /* Strided 2-D copy of rows x width_bytes: row r from src + r*src_pitch to dst + r*dst_pitch     \
     (bytes; cudaMemcpy2DAsync). */                                                               \
  X(copy_2d, (MemraCudaCtx * ctx, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, \
              size_t width_bytes, size_t rows))                                                   \
  /* out[t, s, :] = x[t, :] for s < n: x [T, D] -> out [T, n, D] (mHC streams). */               \
  X(hc_expand, (MemraCudaCtx * ctx, const float* x, int T, int D, int n, float* out))
