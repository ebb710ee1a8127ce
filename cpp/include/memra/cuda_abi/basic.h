// CUDA ABI, basic area (cuda/basic.cu, cuda/gemm.cu, cuda/mhc.cu): the GPU twins of cpu::
// embedding, linear, norms, RoPE and mHC (ops.h), same arguments, device pointers.
#pragma once

/* linear / linear_ex with at most this many rows (a decode step at batch 1) run the GEMV of cuda/gemv.cu (bf16 or
   f32 weights, 16-byte aligned rows), which rounds an f32 x to bf16 itself: callers need not
   round such inputs first (gpu::round_input). */
#define MEMRA_GEMV_MAX_ROWS 1

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

#define MEMRA_CUDA_BASIC_OPS(X)                                                                   \
  /* cpu::embedding, each row written p->hc times (MemraEmbeddingParams). */                     \
  X(embedding, (MemraCudaCtx * ctx, const MemraEmbeddingParams* p))                               \
  /* y[T, N] = x[T, K] w[N, K]^T (+ bias[N]). f32 w: SGEMM with TF32 off. bf16 w: x rounded to   \
     bf16 (RNE) then a bf16 GEMM with f32 accumulation and f32 output (cuBLAS/cuBLASLt). */       \
  X(linear, (MemraCudaCtx * ctx, const float* x, int T, int K, const void* w, int w_dtype, int N, \
             const float* bias, float* y))                                                        \
  /* linear over an input already in the GEMM's type and/or with a row stride: x [T, K] of       \
     x_dtype (0 f32, 1 bf16, 2 f16), row t at x + t*ldx elements (K <= ldx < 2^31); w, bias, y   \
     as linear. x_dtype == w_dtype: the GEMM reads x in place (ldb = ldx; no rounding). x f32     \
     and w bf16 / f16: x rounded (RNE) into packed scratch first, as linear (which equals         \
     linear_ex(x, 0, K, ...)). Any other pair is 40020; ldx out of range is 40022. */            \
  X(linear_ex, (MemraCudaCtx * ctx, const void* x, int x_dtype, int64_t ldx, int T, int K,        \
                const void* w, int w_dtype, int N, const float* bias, float* y))                  \
  /* linear_ex(x0, w0, N0, bias0, y0) and linear_ex(x1, w1, N1, bias1, y1) over inputs of the    \
     same x_dtype, ldx, T, K and w_dtype, with the bytes of those two calls: one launch when     \
     both take the decode GEMV (T == 1; KDA's f_b and g_b, and its q|k|v and f_a|g_a|beta). */   \
  X(linear_ex_pair, (MemraCudaCtx * ctx, const void* x0, const void* x1, int x_dtype,            \
                     int64_t ldx, int T, int K, const void* w0, const void* w1, int w_dtype,     \
                     int N0, int N1, const float* bias0, const float* bias1, float* y0,          \
                     float* y1))                                                                  \
  /* cpu::rms_norm: x, y [T, D] (may alias); w [D] or null. */                                    \
  X(rms_norm, (MemraCudaCtx * ctx, const float* x, int T, int D, const float* w, float eps,       \
               float* y))                                                                         \
  /* cpu::rms_norm_gated_sigmoid: x, gate, y [T, D] (y may alias x); w [D]. */                    \
  X(rms_norm_gated_sigmoid, (MemraCudaCtx * ctx, const float* x, const float* gate, int T, int D, \
                             const float* w, float eps, float* y))                                \
  /* cpu::layer_norm: x, y [T, D] (may alias); w, b [D]. */                                       \
  X(layer_norm, (MemraCudaCtx * ctx, const float* x, int T, int D, const float* w,                \
                 const float* b, float eps, float* y))                                            \
  /* Three one-row norms in one launch (the MLA projections' at a decode row): y0 [D0] =        \
     rms_norm(x0, w0, eps0), y1 [D1] = rms_norm(x1, w1, eps1), y2 [D2] = layer_norm(x2, w2, b2,  \
     eps2), each the bytes of its own rms_norm / layer_norm call at T = 1 (x_i and y_i may       \
     alias; a null x_i or D_i == 0 skips that row; w0, w1 may be null). */                        \
  X(norm_rows, (MemraCudaCtx * ctx, const float* x0, int D0, const float* w0, float eps0,         \
                float* y0, const float* x1, int D1, const float* w1, float eps1, float* y1,       \
                const float* x2, int D2, const float* w2, const float* b2, float eps2, float* y2)) \
  /* cpu::l2norm_heads in place: x [T, H, d]. */                                                  \
  X(l2norm_heads, (MemraCudaCtx * ctx, float* x, int T, int H, int d, float eps))                 \
  /* cpu::rope_interleaved in place: x [T, n_vec, d_rope]; positions [T] (device). No launch when  \
     d_rope == 0; 40001 when d_rope is odd. */                                                    \
  X(rope_interleaved, (MemraCudaCtx * ctx, float* x, const int32_t* positions, int T, int n_vec,  \
                       int d_rope, float base))                                                   \
  /* y[i] = 1 / (1 + exp(-x[i])), n elements (may alias). */                                     \
  X(sigmoid, (MemraCudaCtx * ctx, const float* x, int64_t n, float* y))                           \
  /* cpu::mhc_pre: streams [T, hc, D]; fn [(2+hc)*hc, hc*D] (fn_dtype); base [(2+hc)*hc];        \
     scale [3]; post [T, hc]; comb [T, hc, hc]; collapsed [T, D]. */                              \
  X(mhc_pre, (MemraCudaCtx * ctx, const float* streams, int T, int hc, int D, const void* fn,     \
              int fn_dtype, const float* base, const float* scale, int sinkhorn_iters,            \
              float hc_eps, float norm_eps, float* post, float* comb, float* collapsed))          \
  /* mhc_pre, then cpu::rms_norm of collapsed: out [T, D] = rms_norm(collapsed, rms_w [D] or     \
     null, rms_eps); equal byte for byte to mhc_pre followed by rms_norm. 40025 for a negative or \
     non-finite rms_eps. At one decode row of hc 4 (this and mhc_post_pre_norm) comb's Sinkhorn   \
     may be left pending on the context (KernelOptions::mhc_defer): the next decode GEMV or any  \
     other entry point runs it before anything later on the stream reads comb; comb must then be \
     its own allocation (releasing that pointer runs the pending Sinkhorn first). */              \
  X(mhc_pre_norm, (MemraCudaCtx * ctx, const float* streams, int T, int hc, int D, const void* fn,\
                   int fn_dtype, const float* base, const float* scale, int sinkhorn_iters,       \
                   float hc_eps, float norm_eps, const float* rms_w, float rms_eps, float* post,  \
                   float* comb, float* out))                                                      \
  /* mhc_post then mhc_pre_norm at the next site: streams [T, hc, D] = mhc_post(y [T, D],        \
     post_prev [T, hc], comb_prev [T, hc, hc], residual [T, hc, D]), then post, comb, out as      \
     mhc_pre_norm of streams; the bytes of those two calls (at one decode row of hc 4, one        \
     launch). streams must not overlap residual (40025), nor rms_eps be negative / not finite.   \
   */                                                                                            \
  X(mhc_post_pre_norm, (MemraCudaCtx * ctx, const float* y, const float* post_prev,              \
                        const float* comb_prev, const float* residual, int T, int hc, int D,     \
                        const void* fn, int fn_dtype, const float* base, const float* scale,     \
                        int sinkhorn_iters, float hc_eps, float norm_eps, const float* rms_w,    \
                        float rms_eps, float* streams, float* post, float* comb, float* out))    \
  /* cpu::mhc_post: y [T, D]; post [T, hc]; comb [T, hc, hc]; residual, out [T, hc, D]. */       \
  X(mhc_post, (MemraCudaCtx * ctx, const float* y, const float* post, const float* comb,          \
               const float* residual, int T, int hc, int D, float* out))                          \
  /* The model's head: out [T, D] = rms_norm(hc_head_mean(mhc_post(y, post, comb, residual)),    \
     rms_w [D] or null, eps), the bytes of those three calls (one launch for hc <= 8, D <= 4096;   \
     the expanded streams are not written). 40025 for a negative or non-finite eps. */             \
  X(mhc_post_head_norm, (MemraCudaCtx * ctx, const float* y, const float* post, const float* comb, \
                         const float* residual, int T, int hc, int D, const float* rms_w,          \
                         float eps, float* out))                                                   \
  /* cpu::hc_head_mean: streams [T, hc, D] -> out [T, D]. */                                      \
  X(hc_head_mean, (MemraCudaCtx * ctx, const float* streams, int T, int hc, int D, float* out))
