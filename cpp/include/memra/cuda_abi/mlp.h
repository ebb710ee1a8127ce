// CUDA ABI, MLP area (cuda/mlp.cu): the GPU twin of cpu::swiglu_mlp (cpu/mlp.h).
#pragma once

/* The clamped SwiGLU MLP: y = (silu(min(x gate_w^T, limit)) * clamp(x up_w^T, +-limit)) down_w^T
   (+ add). Three GEMMs (memra_cuda_linear's: f32 SGEMM with TF32 off, or x and h rounded to bf16
   for bf16 weights) around the CPU's elementwise formula. */
typedef struct MemraMlpParams {
  const float* x;      /* [T, D] f32 */
  int T;               /* rows of x, >= 0 (else 40025) */
  int D;               /* columns of x, >= 0 (else 40025) */
  const void* gate_w;  /* [I, D], dtype w_dtype. With up_w right after it in memory (one [2I, D]
                          matrix, as MlpLayer uploads them) gate and up run as one GEMM with N = 2I
                          (at T = 1, where the decode GEMV takes the rows, one GEMV with the
                          activation in its epilogue) */
  const void* up_w;    /* [I, D], dtype w_dtype */
  const void* down_w;  /* [D, I], dtype w_dtype */
  int w_dtype;         /* memra::DType code of the three weights: 0 f32, 1 bf16, 2 f16
                          (else 40020) */
  int I;               /* the intermediate size, >= 0 (else 40025; 0: y = add, or 0) */
  float limit;         /* swiglu_limit, > 0 (inf: no clamp; else 40025) */
  const float* add;    /* [T, D] f32, not aliasing y, or null: y = mlp(x) + add (at T = 1 the down
                          GEMV's bias, the same bits as the add after it) */
  float* y;            /* [T, D] f32 */
} MemraMlpParams;

#define MEMRA_CUDA_MLP_OPS(X)                                                                     \
  /* cpu::swiglu_mlp (+ p->add) (MemraMlpParams). A null p is 40024. */                           \
  X(swiglu_mlp, (MemraCudaCtx * ctx, const MemraMlpParams* p))
