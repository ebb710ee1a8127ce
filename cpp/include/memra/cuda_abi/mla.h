// CUDA ABI, MLA area (cuda/mla.cu): the GPU twins of cpu::mla_absorb_q / mla_decompress_v /
// mla_attn_absorbed / mla_attn_gathered (ops.h) plus the latent append. One sequence per call;
// the latent cache is f32 or bf16 (cache_dtype).
#pragma once

// arm for absorb / decompress: 0 auto (cuBLASLt strided-batched bf16 GEMM at prefill widths with
// a fallback to the per-position kernel when cuBLASLt declines; the split arm when T is small),
// 1 per-position kernel, 2 output-range split kernel (bytes equal to arm 1), 3 cuBLASLt only
// (returns its 2xxxx decline instead of falling back).
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
                        int d_rope, int t_q, int t_kv, int width, float scale, float* o_lat))
