// CUDA ABI, Gated DeltaNet area (cuda/gdn.cu; memra::op in op/gdn.h): the GPU twins of
// cpu::gdn_gate / gdn_l2norm / gdn_scan / rms_norm_gated_silu (memra/cpu/gdn.h). The causal conv
// is KDA's (cuda_abi/kda.h: any channel count). The scan is instantiated for dk = dv = 128
// (50002 otherwise; the CPU backend runs any size); the other entries take any size.
#pragma once

/* The per-value-head gates (cpu::gdn_gate): g = -exp(A_log) * softplus(a + dt_bias) with
   F.softplus' threshold 20 (log1p form below it), beta = 1 / (1 + exp(-b)). */
typedef struct MemraGdnGateParams {
  const float* a;       /* [T, H] f32 logits of the decay, row t at a + t*lda (in_proj_a) */
  int64_t lda;          /* floats between rows of a, >= H (else 40000) */
  const float* b;       /* [T, H] f32 logits of beta, row t at b + t*ldb (in_proj_b) */
  int64_t ldb;          /* floats between rows of b, >= H (else 40000) */
  const float* dt_bias; /* [H] f32 */
  const float* A_log;   /* [H] f32 */
  int T, H;             /* >= 0 (else 40000); T == 0 or H == 0: nothing runs */
  float* g;             /* [T, H] f32 log decay; must not overlap a or b */
  float* beta;          /* [T, H] f32; must not overlap a or b */
} MemraGdnGateParams;

/* The grouped-head gated delta rule (cpu::gdn_scan) over B sequences of T steps each (a prefill:
   B == 1; a decode step: T == 1). Row n = b*T + t of q, k and v. Value head h reads key head
   h / (Hv / Hk) (transformers' repeat_interleave order). On CUDA the sequential scan expands the
   q and k heads to the value heads and broadcasts the decay over dk into scratch (one launch),
   then KDA's scan runs them (cuda_abi/kda.h kda_scan: the same per-element arithmetic as the CPU
   reference; its dk-long sums in a fixed tree order); the chunked form reads them in place. */
typedef struct MemraGdnScanParams {
  const float* q;   /* L2-normalised queries: row n at q + n*qk_ld, key head kh at + kh*dk, f32 */
  const float* k;   /* L2-normalised keys, the layout of q */
  int64_t qk_ld;    /* floats between rows of q and of k, >= Hk*dk (else 40000) */
  const float* v;   /* values: row n at v + n*v_ld, value head h at + h*dv, f32 */
  int64_t v_ld;     /* floats between rows of v, >= Hv*dv (else 40000) */
  const float* g;   /* [B, T, Hv] f32 log decay (gdn_gate) */
  const float* beta; /* [B, T, Hv] f32 */
  int B, T;         /* >= 0 (else 40000); B == 0 or T == 0: nothing runs, no state written */
  int Hk, Hv;       /* >= 1 with Hv % Hk == 0 (else 40000) */
  int dk, dv;       /* >= 1 (else 40000); CUDA: dk == dv == 128 (else 50002) */
  float scale;      /* q's scale: dk**-0.5 in transformers */
  const float* const* state_in; /* [B] table of [Hv, dk, dv] f32 input planes (a device array
                                   of device pointers on CUDA, a host array on the CPU); null,
                                   or a null entry, starts from zeros */
  float* const* state_out;      /* [B] table of output planes, each distinct from the inputs;
                                   required (40024); a null entry is not written */
  float* o;         /* [B, T, Hv, dv] f32; 16-byte aligned on CUDA (40022) */
  int chunked;      /* != 0: KDA's chunked tensor-core form (MemraKdaScanParams::chunked),
                       reading key head h / (Hv / Hk) and the per-head g in place (q, k, v
                       16-byte aligned with qk_ld, v_ld multiples of 4; otherwise after the
                       expansion); 0 the sequential scan. The CPU reference ignores it. */
} MemraGdnScanParams;

#define MEMRA_CUDA_GDN_OPS(X)                                                                     \
  /* The gates (MemraGdnGateParams), one elementwise launch. */                                  \
  X(gdn_gate, (MemraCudaCtx * ctx, const MemraGdnGateParams* p))                                  \
  /* cpu::gdn_l2norm in place: `heads` vectors of d per row, vector (r, h) at x + r*ld + h*d,      \
     x *= 1 / sqrt(sum(x^2) + eps) (the sum in tree order). rows, heads >= 0, d >= 1 and           \
     ld >= heads*d (else 40000). rows == 0 or heads == 0: nothing runs. */                        \
  X(gdn_l2norm, (MemraCudaCtx * ctx, float* x, int rows, int heads, int d, int64_t ld,             \
                 float eps))                                                                      \
  /* gdn_l2norm(x, rows, heads, d, ld, eps) and gdn_gate(p) in one launch (the bytes of the two   \
     calls; their checks and codes; x must not overlap p's arrays). A GDN layer's step. */        \
  X(gdn_l2norm_gate, (MemraCudaCtx * ctx, float* x, int rows, int heads, int d, int64_t ld,       \
                      float eps, const MemraGdnGateParams* p))                                    \
  /* The delta-rule scan (MemraGdnScanParams): the chunked form in place, or expand, then       \
     kda_scan (scratch from the context's stream-ordered pool; capturable). */                   \
  X(gdn_scan, (MemraCudaCtx * ctx, const MemraGdnScanParams* p))                                  \
  /* cpu::rms_norm_gated_silu: x, gate, y [T, D] (y may alias x); w [D]. T, D >= 0 (else         \
     40025, as rms_norm_gated_sigmoid). */                                                       \
  X(rms_norm_gated_silu, (MemraCudaCtx * ctx, const float* x, const float* gate, int T, int D,    \
                          const float* w, float eps, float* y))
