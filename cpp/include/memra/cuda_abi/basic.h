// CUDA ABI, basic area (cuda/basic.cu): the GPU twins of cpu/basic.h (embedding, the per-row
// norms, interleaved RoPE, sigmoid and add), same arguments, device pointers. The linear family
// is in linear.h, mHC in mhc.h.
#pragma once

/* Token embedding: out[t, j, :] = table[ids[t], :] as f32 for j < hc (hc_expand's layout: the
   residual streams of a hyper-connection model in the same launch; hc == 1 is plain [T, D]). */
typedef struct MemraEmbeddingParams {
  const void* table; /* [vocab, D], dtype table_dtype (memra::DType code: 0 f32, 1 bf16, 2 f16) */
  int table_dtype;
  int64_t vocab;     /* rows of table */
  int D;             /* columns of table */
  const int32_t* ids; /* [T] int32; an id outside [0, vocab) gives zero rows on CUDA (callers
                         range-check on the host: the device cannot refuse without a sync) */
  int T;
  int hc;            /* copies of each row, >= 1 (else 40025) */
  float* out;        /* [T, hc, D] f32 */
} MemraEmbeddingParams;

/* Up to three one-row norms in one launch (the MLA projections' norms at a decode row): rows 0
   and 1 are RMSNorms (cpu::rms_norm at T = 1), row 2 a LayerNorm (cpu::layer_norm at T = 1);
   each row gets the bytes of its own rms_norm / layer_norm call. A row whose x is null or whose
   D is 0 is skipped; a row that runs needs its y (40024). All f32, device pointers. */
typedef struct MemraNormRowsParams {
  const float* x0; /* [D0]: RMSNorm input (null: no row 0) */
  int D0;          /* >= 0 (else 40025) */
  const float* w0; /* [D0] or null (unweighted) */
  float eps0;
  float* y0;       /* [D0], may alias x0 */
  const float* x1; /* [D1]: RMSNorm input (null: no row 1) */
  int D1;          /* >= 0 (else 40025) */
  const float* w1; /* [D1] or null (unweighted) */
  float eps1;
  float* y1;       /* [D1], may alias x1 */
  const float* x2; /* [D2]: LayerNorm input (null: no row 2) */
  int D2;          /* >= 0 (else 40025) */
  const float* w2; /* [D2], required when row 2 runs (40024) */
  const float* b2; /* [D2], required when row 2 runs (40024) */
  float eps2;
  float* y2;       /* [D2], may alias x2 */
} MemraNormRowsParams;

/* The plain pre-norm residual step (op::add_rms_norm): sum = x + y, then h = rms_norm(sum, w,
   eps) (cpu::add then cpu::rms_norm), all f32 device arrays. */
typedef struct MemraAddRmsNormParams {
  const float* x;  /* [T, D] */
  const float* y;  /* [T, D] */
  int T, D;        /* rows, columns */
  const float* w;  /* [D] or null (unweighted) */
  float eps;
  float* sum;      /* [T, D] out: x + y (may alias x or y) */
  float* h;        /* [T, D] out: the normed sum (may alias sum, x or y) */
} MemraAddRmsNormParams;

#define MEMRA_CUDA_BASIC_OPS(X)                                                                   \
  /* cpu::embedding, each row written p->hc times (MemraEmbeddingParams). */                     \
  X(embedding, (MemraCudaCtx * ctx, const MemraEmbeddingParams* p))                               \
  /* cpu::rms_norm: x, y [T, D] (may alias); w [D] or null. */                                    \
  X(rms_norm, (MemraCudaCtx * ctx, const float* x, int T, int D, const float* w, float eps,       \
               float* y))                                                                         \
  /* cpu::add then cpu::rms_norm in one launch (MemraAddRmsNormParams): the bytes of add         \
     followed by rms_norm. T, D >= 0 (else 40025); a null array when T * D > 0: 40024. */        \
  X(add_rms_norm, (MemraCudaCtx * ctx, const MemraAddRmsNormParams* p))                           \
  /* cpu::rms_norm_gated_sigmoid: x, gate, y [T, D] (y may alias x); w [D]. */                    \
  X(rms_norm_gated_sigmoid, (MemraCudaCtx * ctx, const float* x, const float* gate, int T, int D, \
                             const float* w, float eps, float* y))                                \
  /* cpu::layer_norm: x, y [T, D] (may alias); w, b [D]. */                                       \
  X(layer_norm, (MemraCudaCtx * ctx, const float* x, int T, int D, const float* w,                \
                 const float* b, float eps, float* y))                                            \
  /* The one-row norms of MemraNormRowsParams in one launch (no launch when every row is        \
     skipped). */                                                                                 \
  X(norm_rows, (MemraCudaCtx * ctx, const MemraNormRowsParams* p))                                \
  /* cpu::l2norm_heads in place: x [T, H, d]. */                                                  \
  X(l2norm_heads, (MemraCudaCtx * ctx, float* x, int T, int H, int d, float eps))                 \
  /* cpu::rope_interleaved in place: x [T, n_vec, d_rope]; positions [T] (device). No launch when  \
     d_rope == 0; 40001 when d_rope is odd. */                                                    \
  X(rope_interleaved, (MemraCudaCtx * ctx, float* x, const int32_t* positions, int T, int n_vec,  \
                       int d_rope, float base))                                                   \
  /* cpu::sigmoid: y[i] = 1 / (1 + exp(-x[i])), n elements (may alias). */                       \
  X(sigmoid, (MemraCudaCtx * ctx, const float* x, int64_t n, float* y))                           \
  /* cpu::add: y[i] = a[i] + b[i], n elements (y may alias a or b). */                            \
  X(add, (MemraCudaCtx * ctx, const float* a, const float* b, int64_t n, float* y))
