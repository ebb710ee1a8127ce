// CUDA ABI, sampling area (cuda/sample.cu, cuda/sample_greedy.cu): the GPU twin of cpu::sample
// (cpu/sample.h), drawing the same token as the CPU for the same seed and counter.
#pragma once

/* One token per row: temperature <= 0 the argmax (ties to the lower id; a NaN never wins unless it
   sits at id 0), otherwise softmax(logits / temperature), the top_k most likely, then the shortest
   prefix whose top-k-renormalised mass reaches top_p, drawn with uniform_from_counter(seed,
   counter), every sum in cpu/sample.h's blocked order. */
typedef struct MemraSampleParams {
  const float* logits;       /* [B, V] f32 */
  int B;                     /* rows, >= 0 (else 40025) */
  int V;                     /* columns, >= 1 when B > 0 (else 40025) */
  float temperature;         /* <= 0: greedy; NaN: 40025 */
  int top_k;                 /* <= 0 or > V: all */
  float top_p;               /* > 0 (else 40025); >= 1: all */
  uint64_t seed;             /* every row's seed when seeds is null */
  const uint64_t* seeds;     /* [B] uint64: row b draws with seeds[b]; or null */
  const uint64_t* counters;  /* [B] uint64, the rows' draw indices (not read when greedy; else
                                required: 40024) */
  int32_t* out;              /* [B] int32 */
  int32_t* nonfinite;        /* [B] int32, or null: not written. nonfinite[b] = 1 where row b's
                                logits hold a NaN or +-inf and 0 elsewhere, written by the same
                                launches as out (so inside a captured graph, no host sync);
                                out[b] is drawn as without it (memra.batch ends a flagged row's
                                request with memra.NonFiniteError, kNonFinite, instead of using
                                its draw). Written only once the checks above pass (B > 0). */
} MemraSampleParams;

#define MEMRA_CUDA_SAMPLE_OPS(X)                                                                  \
  /* cpu::sample, with per-row seeds (MemraSampleParams). A null p is 40024. */                   \
  X(sample, (MemraCudaCtx * ctx, const MemraSampleParams* p))
