// CUDA ABI, MLA area (cuda/mla.cu): the GPU twins of cpu::mla_absorb_q / mla_decompress_v /
// mla_attn_absorbed / mla_attn_gathered (ops.h) plus the latent append. One sequence per call;
// the latent cache is f32 or bf16 (cache_dtype). mla_attn_decode / mla_latent_append_decode
// (cuda/mla_decode.cu) serve B sequences of one query each per call.
#pragma once

// arm for absorb / decompress: 0 auto (cuBLASLt strided-batched bf16 GEMM at prefill widths with
// a fallback to the per-position kernel when cuBLASLt declines; the streaming arm when T is
// small), 1 per-position kernel, 2 streaming kernel (a head's output tile with its weights held
// in shared memory over all positions; bytes equal to arm 1), 3 cuBLASLt only (returns its 2xxxx
// decline instead of falling back).
#define MEMRA_CUDA_MLA_OPS(X)                                                                     \
  /* q_nope [T, H, d_nope]; kv_b [H*(d_nope+d_v), R] (w_dtype); q_lat [T, H, R]. */               \
  X(mla_absorb_q, (MemraCudaCtx * ctx, const float* q_nope, const void* kv_b, int w_dtype, int T, \
                   int H, int d_nope, int d_v, int R, int arm, float* q_lat))                     \
  /* o_lat [T, H, R]; out [T, H, d_v]. */                                                         \
  X(mla_decompress_v, (MemraCudaCtx * ctx, const float* o_lat, const void* kv_b, int w_dtype,     \
                       int T, int H, int d_nope, int d_v, int R, int arm, float* out))            \
  /* rows [T, W] f32 -> cache rows [start, start + T) of cache [max_len, W] (cache_dtype). */     \
  X(mla_latent_append, (MemraCudaCtx * ctx, const float* rows, int T, int W, void* cache,         \
                        int cache_dtype, int start))                                              \
  /* cache [t_kv, R + d_rope] (cache_dtype); q_lat [t_q, H, R]; q_pe [t_q, H, d_rope] or null;    \
     o_lat [t_q, H, R]; query i at row t_kv - t_q + i. 40004 when t_q > t_kv. */                 \
  X(mla_attn_absorbed, (MemraCudaCtx * ctx, const float* q_lat, const float* q_pe,                \
                        const void* cache, int cache_dtype, int H, int R, int d_rope, int t_q,    \
                        int t_kv, float scale, float* o_lat))                                     \
  /* idx [t_q, width] rows (-1 skipped; entries outside [0, query row] are skipped too: the GPU    \
     cannot refuse without a host sync, callers validate host lists first; a row listed twice    \
     counts once); a query with no row gets zeros. 40004 when t_q > t_kv. */                     \
  X(mla_attn_gathered, (MemraCudaCtx * ctx, const float* q_lat, const float* q_pe,                \
                        const void* cache, int cache_dtype, const int32_t* idx, int H, int R,     \
                        int d_rope, int t_q, int t_kv, int width, float scale, float* o_lat))      \
  /* Batched decode (cuda/mla_decode.cu): B sequences, one query each, one launch plan. q_lat [B,  \
     H, R]; caches [B] (a device array of device pointers) to per-sequence latent caches           \
     [max_len_b, R] (cache_dtype; latent-only rows, d_rope == 0: callers with rope columns use     \
     mla_attn_absorbed), 16-byte aligned; t_kv [B] device: rows visible to sequence b (its query   \
     sits at row t_kv[b] - 1), clamped to [0, max_t_kv]; t_kv[b] == 0 marks an idle row: o_lat[b]  \
     = 0 and nothing of it is read (caches[b] may be null). idx: null (dense) or [B, width]        \
     device index lists (-1 and entries outside [0, t_kv[b]) skipped, a row listed twice counts    \
     once; an empty list gives zeros). max_t_kv: a host upper bound of t_kv, the only thing (with  \
     B, H, R, width, dtype) the launch shape depends on, so a captured graph replays at any t_kv   \
     <= max_t_kv. o_lat [B, H, R]. bf16 cache with R in {128, 256, 512}: tensor cores (q_lat and   \
     p rounded to bf16, f32 softmax and accumulation); otherwise f32 CUDA cores (R <= 1024, else   \
     50002). */                                                                                    \
  X(mla_attn_decode, (MemraCudaCtx * ctx, const float* q_lat, const void* const* caches,         \
                      int cache_dtype, const int32_t* t_kv, const int32_t* idx, int width, int B, \
                      int H, int R, int max_t_kv, float scale, float* o_lat))                     \
  /* rows [B, W] f32 -> caches[b][pos[b], :] (caches [B] device pointers, cache_dtype; bf16 by    \
     round-to-nearest-even); pos [B] device, pos[b] < 0 = idle row (nothing written). The device \
     cannot check pos[b] against a cache's length: callers do. */                                \
  X(mla_latent_append_decode, (MemraCudaCtx * ctx, const float* rows, int B, int W,               \
                               void* const* caches, int cache_dtype, const int32_t* pos))
