// CUDA ABI, DSA k-pool indexer area: the GPU twins of cpu::kpool_pool_key / kpool_score /
// kpool_select (cpu/dsa.h) and of the row bookkeeping in MlaLayer::indexer. One entry per op
// family; `batched` selects the form: one sequence (cuda/dsa.cu) or B sequences of one token
// each in one launch (cuda/dsa_decode.cu). A null struct is 40024, `batched` outside {0, 1}
// 40025. memra::op (op/dsa.h) runs the same structs on either backend.
//
// Batched forms: per-sequence state through DEVICE arrays [B] of device pointers; seq_pos [B]
// DEVICE int32: the tokens sequence b held before this one; seq_pos[b] < 0 marks an idle row
// (nothing of it read or written; its score row -inf, its idx row all -1). Launch shapes depend
// on B, d, Hi, max_pools only (never on a position), so a captured graph replays at any
// position. The device cannot check a position against the per-sequence buffers: callers do.
// Per sequence the bytes equal the one-sequence form with T = t_q = 1, first_pos = pos, n_pools
// = (pos + 1) / pool.
#pragma once

/* The longest cache (rows) kpool_select's compaction takes: its bitmap of ceil(rows / 32) words
   and 16 warp totals within 40 KB of shared memory. */
#define MEMRA_SELECT_COMPACT_MAX_ROWS 327168

/* kpool_append: the key of every pool whose last row lands in the new rows (pools before them
   are resident: final, not recomputed; bytes equal a rebuild), then the newest rows into the
   tail ring (row r at r % tail_rows) exactly as MlaLayer::indexer does. Errors: 40010 for pool <
   1, tail_rows < pool or tail_rows % pool != 0; 40025 for n < 0, d < 1 or (one sequence) pos <
   0; 40023 when pos + n overflows int32. */
typedef struct MemraKpoolAppendParams {
  int batched;           /* 0: rows pos .. pos + n - 1 of one sequence; 1: row b of sequence b */
  const float* k;        /* [n, d] f32: the new rows (normalised k) */
  const float* gate;     /* [n, d] f32 */
  int n, d;
  const float* ape;      /* [pool, d] f32 */
  int pool;              /* rows a pool */
  int tail_rows;         /* ring rows, a positive multiple of pool */
  /* one sequence */
  int pos;               /* rows the sequence held before */
  float* tail_k;         /* [tail_rows, d] */
  float* tail_gate;      /* [tail_rows, d] */
  float* pool_keys;      /* [>= (pos + n) / pool, d] */
  /* batched */
  const int32_t* seq_pos;          /* [n] device */
  float* const* seq_tail_k;        /* [n] device pointers to [tail_rows, d] */
  float* const* seq_tail_gate;     /* [n] device pointers to [tail_rows, d] */
  float* const* seq_pool_keys;     /* [n] device pointers to [>= (pos[b] + 1) / pool, d] */
} MemraKpoolAppendParams;

/* kpool_score: score[i, p] = sum_h w[i, h] * head_scale * relu(qk_scale * q[i, h, :] .
   pool_keys[p, :]) (h ascending), -inf where pool p's last row is after the query's position.
   Errors: 40010 pool < 1; 40025 for a negative extent or position, reference outside {0, 1} or a
   non-finite scale; 40023 when first_pos + t_q overflows int32. */
typedef struct MemraKpoolScoreParams {
  int batched;        /* 0: t_q queries of one sequence; 1: B sequences of one query each */
  const float* q;     /* [t_q or B, Hi, d] f32 */
  const float* w;     /* [t_q or B, Hi] f32 */
  int Hi, d;
  int pool;
  float qk_scale;     /* index_head_dim ** -0.5 */
  float head_scale;   /* index_n_heads ** -0.5 */
  float* score;       /* one sequence: [t_q, n_pools]; batched: [B, max_pools] */
  /* one sequence */
  const float* pool_keys; /* [n_pools, d] */
  int t_q, n_pools;
  int first_pos;      /* position of query 0 */
  int reference;      /* 1: the one-thread-per-score scorer; 0: the tiled one (same bytes; the
                         CPU backend ignores it) */
  int tensor_cores;   /* one sequence, reference 0: 1 for bf16 models: the tensor-core scorer
                         (cuda/dsa_score_tc.cu; q and pool_keys rounded to bf16, products exact,
                         f32 sums in the tensor cores' order, the scaling / relu / head sum in f32
                         as the CPU) where d is 64 or 128 and Hi <= 128, else as 0; 0: the f32
                         scorers (the CPU's bytes). 40025 outside {0, 1}. The batched form and the
                         CPU backend ignore it. */
  /* batched: row b scores pools [0, n_b), n_b = min((seq_pos[b] + 1) / pool, max_pools) (0 for
     an idle row), -inf past them */
  const float* const* seq_pool_keys; /* [B] device pointers to [>= n_b, d] */
  const int32_t* seq_pos;            /* [B] device */
  int B;
  int max_pools;      /* host bound: the score width the launch is sized from */
} MemraKpoolScoreParams;

/* kpool_select: per query the top select_k pools among the finite scores by (score desc, pool
   asc), expanded to their rows in ascending pool order, then the visible tail rows, then -1 up
   to width (cpu::kpool_select). Errors, in cpu::kpool_select's order: 40010 pool < 1; 40025 a
   negative select_k, extent or position; 40014 width < select_k * pool + pool - 1; 40025
   reference outside {0, 1}; 40023 a position or row past int32. */
typedef struct MemraKpoolSelectParams {
  int batched;        /* 0: t_q queries of one sequence; 1: B sequences of one query each */
  const float* score; /* one sequence: [t_q, n_pools]; batched: [B, max_pools] (kpool_score) */
  int pool, select_k, width;
  int32_t* idx;       /* [t_q or B, width] int32 */
  /* one sequence */
  int t_q, n_pools;
  int first_pos;
  int reference;      /* 1: the simple select; 0: the radix select (same bytes; CPU ignores it) */
  /* batched: row b selects over pools [0, n_b) at first_pos = seq_pos[b]; an idle row is -1 */
  const int32_t* seq_pos; /* [B] device */
  int B;
  int max_pools;
  /* batched, compact 1: in the same launch each row's list compacted as mla_attn's INDEXED
     decode compacts it (the rows r in [0, n_b) it names, each once, ascending, n_b =
     seq_t_kv[b] clamped to [0, max_t_kv]) into list and counts, for mla_attn's LISTED form.
     40024 without list, counts or seq_t_kv; 40025 max_t_kv < 0; 50002 max_t_kv >
     MEMRA_SELECT_COMPACT_MAX_ROWS (the bitmap in shared memory: callers take mla_attn's INDEXED
     form instead, which takes any length). */
  int compact;
  const int32_t* seq_t_kv; /* [B] device: rows visible to each sequence */
  int max_t_kv;
  int32_t* list;           /* [B, width] */
  int* counts;             /* [B] */
} MemraKpoolSelectParams;

#define MEMRA_CUDA_DSA_OPS(X)                                                                     \
  X(kpool_append, (MemraCudaCtx * ctx, const MemraKpoolAppendParams* p))                          \
  X(kpool_score, (MemraCudaCtx * ctx, const MemraKpoolScoreParams* p))                            \
  X(kpool_select, (MemraCudaCtx * ctx, const MemraKpoolSelectParams* p))
