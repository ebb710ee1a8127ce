// CUDA ABI, DSA k-pool indexer area (cuda/dsa.cu): the GPU twins of cpu::kpool_pool_key /
// kpool_score / kpool_select (ops.h) and of the row bookkeeping in MlaLayer::indexer
// (cpp/src/layers/mla_layer.cpp). One sequence per call.
#pragma once

/* The longest cache (rows) kpool_select_compact_decode compacts: its bitmap of ceil(rows / 32)
   words and 16 warp totals within 40 KB of shared memory. */
#define MEMRA_SELECT_COMPACT_MAX_ROWS 327168

#define MEMRA_CUDA_DSA_OPS(X)                                                                     \
  /* Rows [pos, pos + T) of a sequence: k, gate [T, d] (the new rows); tail_k, tail_gate           \
     [tail_rows, d] the ring (row r at r % tail_rows); pool_keys [max_pools, d]. Writes the key of \
     every pool whose last row lands in [pos, pos + T) (pools before pos / pool are resident:     \
     final, not recomputed; bytes equal a rebuild), then the newest rows into the ring exactly as \
     MlaLayer::indexer does. ape [pool, d]. */                                                    \
  X(kpool_append, (MemraCudaCtx * ctx, const float* k, const float* gate, int T, int d,           \
                   const float* ape, int pool, int pos, float* tail_k, float* tail_gate,          \
                   int tail_rows, float* pool_keys))                                              \
  /* cpu::kpool_score: q [t_q, Hi, d]; w [t_q, Hi]; pool_keys [n_pools, d]; score [t_q, n_pools]. \
     reference = 1 runs the simple one-thread-per-score scorer; 0 the tiled scorer (same bytes). */\
  X(kpool_score, (MemraCudaCtx * ctx, const float* q, const float* w, const float* pool_keys,     \
                  int t_q, int Hi, int d, int n_pools, int pool, int first_pos, float qk_scale,   \
                  float head_scale, int reference, float* score))                                 \
  /* cpu::kpool_select: score [t_q, n_pools]; idx [t_q, width]. reference = 1 runs the simple     \
     select; 0 the radix select on (score desc, pool asc) (same bytes). 40014 when width is too   \
     small. */                                                                                    \
  X(kpool_select, (MemraCudaCtx * ctx, const float* score, int t_q, int n_pools, int pool,        \
                   int select_k, int width, int first_pos, int reference, int32_t* idx))            \
  /* Batched decode forms (cuda/dsa_decode.cu): B sequences, one token each, one launch per op;   \
     per-sequence state through DEVICE arrays [B] of device pointers, pos [B] DEVICE int32: the   \
     tokens sequence b held before this one; pos[b] < 0 marks an idle row (nothing of it read or  \
     written; its score row -inf, its idx row all -1). Launch shapes depend on B, d, Hi,          \
     max_pools only (never on pos), so a captured graph replays at any position. The device      \
     cannot check pos against the per-sequence buffers: callers do. Per sequence the bytes equal  \
     the per-sequence op with T = t_q = 1, first_pos = pos, n_pools = (pos + 1) / pool.           \
     kpool_append_decode: k, gate [B, d]; tail_k, tail_gate [B] -> [tail_rows, d];               \
     pool_keys [B] -> [>= (pos + 1) / pool, d]. */                                                  \
  X(kpool_append_decode, (MemraCudaCtx * ctx, const float* k, const float* gate, int B, int d,    \
                          const float* ape, int pool, const int32_t* pos, float* const* tail_k,    \
                          float* const* tail_gate, int tail_rows, float* const* pool_keys))        \
  /* q [B, Hi, d]; w [B, Hi]; pool_keys [B] -> [>= n_pools_b, d]; score [B, max_pools]:          \
     row b scores pools [0, n_pools_b), n_pools_b = min((pos[b] + 1) / pool, max_pools) (0 for an  \
     idle row), -inf past them. max_pools: a host bound (the launch is sized from it). */          \
  X(kpool_score_decode, (MemraCudaCtx * ctx, const float* q, const float* w,                      \
                         const float* const* pool_keys, const int32_t* pos, int B, int Hi, int d,  \
                         int pool, int max_pools, float qk_scale, float head_scale, float* score)) \
  /* score [B, max_pools] (kpool_score_decode); idx [B, width]: per row kpool_select over pools   \
     [0, n_pools_b) at first_pos = pos[b] (radix select on (score desc, pool asc), the visible     \
     tail rows, -1 padding); an idle row is all -1. 40014 when width is too small. */             \
  X(kpool_select_decode, (MemraCudaCtx * ctx, const float* score, const int32_t* pos, int B,      \
                          int max_pools, int pool, int select_k, int width, int32_t* idx))        \
  /* kpool_select_decode, then in the same launch each row's list compacted as mla_attn_decode    \
     compacts it (the rows r in [0, n_b) it names, each once, ascending, n_b = t_kv[b] clamped to  \
     [0, max_t_kv]) into list [B, width] and counts [B], for mla_attn_decode_listed. 50002 when   \
     max_t_kv > MEMRA_SELECT_COMPACT_MAX_ROWS (the bitmap in shared memory; callers fall back to   \
     kpool_select_decode + mla_attn_decode, which take any length). */                             \
  X(kpool_select_compact_decode, (MemraCudaCtx * ctx, const float* score, const int32_t* pos,     \
                                  int B, int max_pools, int pool, int select_k, int width,         \
                                  int32_t* idx, const int32_t* t_kv, int max_t_kv, int32_t* list,  \
                                  int* counts))
