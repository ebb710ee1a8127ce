// CUDA ABI, mHC area (cuda/mhc_pre.cu, mhc_site.cu, mhc_post.cu, mhc_head.cu): the GPU twins of
// cpu/mhc.h (hyper-connections: the mapping, the post-block expansion, the head), same
// arguments, device pointers. Oracle: transformers Glm5NextTextHyperConnection.
#pragma once

/* One mHC site, or the model's head, as steps of cpu/mhc.h chained in one entry. The flags say
   which steps run; a step's fields are read only when it runs. The forms (any other combination
   of flags is 40025):
     pre                 post, comb, out = cpu::mhc_pre(streams) (out: the collapsed row)
     pre, norm           the same with out = cpu::rms_norm(collapsed, rms_w, rms_eps), the bytes
                         of mhc_pre followed by rms_norm (at decode rows fused into the mapping's
                         last kernel)
     expand              streams_out = cpu::mhc_post(y, post_prev, comb_prev, residual)
     expand, pre, norm   the previous site's expansion then this site's pre, norm over
                         streams_out: the bytes of the two (one launch at one decode row of hc 4)
     expand, head, norm  the model's head: out = rms_norm(hc_head_mean(mhc_post(...)), rms_w,
                         rms_eps), the bytes of the three (one launch for hc <= 8, D <= 4096;
                         streams_out is not written)
   Errors: T, D < 0, hc < 1 (expand alone: hc < 0), sinkhorn_iters < 1, hc * D > 2^31 - 1, a
   negative or non-finite rms_eps (with norm), streams_out overlapping residual (expand, pre),
   40025; fn_dtype outside 0..2, 40020; hc > 64 with pre, 50002; a null pointer a step reads or
   writes, 40024 (nothing runs when T == 0 or, without pre, D == 0). */
typedef struct MemraMhcParams {
  int T;  /* rows (tokens) */
  int hc; /* residual streams a row (hc_mult) */
  int D;  /* hidden size */
  /* Steps (nonzero: runs). */
  int expand; /* the previous site's expansion (cpu::mhc_post) first */
  int pre;    /* the mapping (cpu::mhc_pre) */
  int norm;   /* out = RMSNorm of the mapping's collapsed row (pre) or of the streams' mean (head) */
  int head;   /* the head: the mean of the expanded streams (cpu::hc_head_mean) */
  /* expand */
  const float* y;         /* [T, D] f32: the sublayer's output */
  const float* post_prev; /* [T, hc] f32: the previous site's post */
  const float* comb_prev; /* [T, hc, hc] f32: the previous site's comb */
  const float* residual;  /* [T, hc, D] f32: the streams before the sublayer */
  float* streams_out;     /* [T, hc, D] f32: the expansion (expand without head); with pre the
                             mapping's input, and it must not overlap residual */
  /* pre */
  const float* streams;   /* [T, hc, D] f32: the mapping's input without expand */
  const void* fn;         /* [(2 + hc) * hc, hc * D] of fn_dtype */
  int fn_dtype;           /* memra::DType code: 0 f32, 1 bf16, 2 f16 */
  const float* base;      /* [(2 + hc) * hc] f32 */
  const float* scale;     /* [3] f32 */
  int sinkhorn_iters;     /* >= 1 (memra::op::mhc also refuses above 1000 on either backend) */
  float hc_eps;           /* the sigmoid floor and the Sinkhorn denominators' eps */
  float norm_eps;         /* the unweighted RMSNorm of the flattened streams */
  float* post;            /* [T, hc] f32 */
  float* comb;            /* [T, hc, hc] f32. With norm at one decode row of hc 4 its Sinkhorn
                             may be left pending on the context (KernelOptions::mhc_defer): the
                             next decode GEMV or any other entry point runs it before anything
                             later on the stream reads comb, which must then be an allocation of
                             its own (releasing that pointer runs the pending Sinkhorn first) */
  /* norm */
  const float* rms_w;     /* [D] f32 or null (unweighted) */
  float rms_eps;          /* >= 0 and finite */
  /* the row output of pre or head */
  float* out;             /* [T, D] f32: collapsed (pre), its RMSNorm (pre, norm), the head's
                             norm (head) */
} MemraMhcParams;

#define MEMRA_CUDA_MHC_OPS(X)                                                                     \
  /* The mHC site forms of MemraMhcParams (see there). */                                        \
  X(mhc, (MemraCudaCtx * ctx, const MemraMhcParams* p))                                           \
  /* cpu::hc_head_mean: streams [T, hc, D] -> out [T, D]. */                                      \
  X(hc_head_mean, (MemraCudaCtx * ctx, const float* streams, int T, int hc, int D, float* out))  \
  /* cpu::hc_expand: out[t, s, :] = x[t, :] for s < n: x [T, D] -> out [T, n, D] (the residual   \
     streams from the embedding). */                                                              \
  X(hc_expand, (MemraCudaCtx * ctx, const float* x, int T, int D, int n, float* out))
