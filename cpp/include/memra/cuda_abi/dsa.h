// CUDA ABI, DSA k-pool indexer area (cuda/dsa.cu): the GPU twins of cpu::kpool_pool_key /
// kpool_score / kpool_select (ops.h) and of the row bookkeeping in MlaLayer::indexer
// (cpp/src/layers/mla_layer.cpp). One sequence per call.
#pragma once

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
                   int select_k, int width, int first_pos, int reference, int32_t* idx))
