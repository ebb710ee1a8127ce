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
  /* mla_attn_decode over index lists already compacted (kpool_select_compact_decode's list      \
     [B, width] and counts [B]) instead of idx: the same bytes, without its compaction launch. */  \
  X(mla_attn_decode_listed, (MemraCudaCtx * ctx, const float* q_lat, const void* const* caches,    \
                             int cache_dtype, const int32_t* t_kv, const int32_t* list,            \
                             const int* counts, int width, int B, int H, int R, int max_t_kv,      \
                             float scale, float* o_lat))                                           \
  X(mla_latent_append_decode, (MemraCudaCtx * ctx, const float* rows, int B, int W,               \
                               void* const* caches, int cache_dtype, const int32_t* pos))          \
  /* One decode row's MLA prologue in one launch (cuda/mla_prologue.cu), the bytes of:            \
     norm_rows(x0, D0, w0, eps0, y0, x1, D1, w1, eps1, y1, x2, D2, w2, b2, eps2, y2) (row 0 the q  \
     low-rank row, row 1 the latent row, row 2 the indexer's k or x2 null for none), then         \
     decode_tables(slots, 1, lengths, pos, t_kv, n, bases, strides, outs), then                   \
     mla_latent_append_decode(y1, 1, D1, outs[0], cache_dtype, pos) and, with row 2 (n == 4:       \
     tables 1, 2, 3 the tail_k, tail_gate and pool_keys planes; without it n == 1),               \
     kpool_append_decode(y2, gate, 1, D2, ape, pool, pos, outs[1], outs[2], tail_rows, outs[3]).   \
     y1 and y2 must not overlap a cache plane. An indexer row of D2 > 256 (wider than the one  \
     launch stages) runs those four calls.                                                       \
     Errors: as those calls (40024 missing pointers, 40025 values, 40020 cache_dtype, 40010       \
     pool / tail_rows), and 40025 for n other than 1 (no row 2) / 4 (row 2). */                      \
  X(mla_norm_append_decode, (MemraCudaCtx * ctx, const float* x0, int D0, const float* w0,        \
                             float eps0, float* y0, const float* x1, int D1, const float* w1,      \
                             float eps1, float* y1, const float* x2, int D2, const float* w2,      \
                             const float* b2, float eps2, float* y2, const int32_t* slots,         \
                             const int32_t* lengths, int32_t* pos, int32_t* t_kv, int n,           \
                             void* const* bases, const int64_t* strides, void** const* outs,       \
                             int cache_dtype, const float* gate, const float* ape, int pool,       \
                             int tail_rows))
