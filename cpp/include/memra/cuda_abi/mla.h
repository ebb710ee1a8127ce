// CUDA ABI, MLA area: the GPU twins of cpu::mla_absorb_q / mla_decompress_v / mla_attn_absorbed /
// mla_attn_gathered (cpu/mla.h) plus the latent append and the decode row's prologue. One entry
// per op family, each taking its parameter struct; the struct's fields select the form (one
// sequence or B sequences of one query each, dense or index-listed rows, absorb or decompress).
// A null struct is 40024, a form field out of its range 40025; every form then checks and
// launches exactly as its entry point did before the structs (the errors below). memra::op
// (op/mla.h) runs the same structs on either backend.
//
// Files: cuda/mla_proj.cu + mla_proj_stream.cu (absorb / decompress), cuda/mla_append.cu
// (latent append), cuda/mla_attn.cu (attention over one sequence), cuda/mla_decode.cu +
// mla_decode_tc.cu + mla_decode_sm90.cu (batched decode attention), cuda/mla_prologue.cu.
#pragma once

/* ---------------------------------------------------------------- mla_proj */

#define MEMRA_MLA_ABSORB 0     /* y[t, h, :] = W_uk[h]^T x[t, h, :] (cpu::mla_absorb_q) */
#define MEMRA_MLA_DECOMPRESS 1 /* y[t, h, :] = W_uv[h] x[t, h, :] (cpu::mla_decompress_v) */

/* The per-head kv_b projections of the absorbed form. W_uk[h] = kv_b rows [h*(d_nope+d_v),
   h*(d_nope+d_v) + d_nope), W_uv[h] = the d_v rows after them. Errors: 40025 for which outside
   {0, 1}, T, H, d_nope, d_v < 0, R < 1 or an arm outside 0..3; 40020 for w_dtype; 50002 for
   H > 65535; 40024 for a missing pointer (T, H and the outputs per head all > 0); 50000 for arm 3
   with a non-bf16 kv_b. */
typedef struct MemraMlaProjParams {
  int which;        /* MEMRA_MLA_ABSORB or MEMRA_MLA_DECOMPRESS */
  const float* x;   /* absorb: q_nope [T, H, d_nope]; decompress: o_lat [T, H, R] (f32) */
  const void* kv_b; /* [H * (d_nope + d_v), R] of w_dtype (kv_b_proj.weight) */
  int w_dtype;      /* memra::DType code: 0 f32, 1 bf16, 2 f16 */
  int T, H, d_nope, d_v, R;
  /* 0 auto (cuBLASLt bf16 GEMM for bf16 kv_b at T >= 64, falling back to arm 1 when cuBLASLt
     declines; arm 2 below T = 64; otherwise arm 2 when the per-position grid would not fill the
     GPU, else arm 1); 1 per-position kernel; 2 streaming kernel (a head's output tile with its
     weights held in shared memory over all positions; bytes equal to arm 1); 3 cuBLASLt only (x
     rounded to bf16; returns its 2xxxx decline instead of falling back). Arms 1 and 2 do the
     CPU's operations in its order: the CPU's bytes where the CPU build does not contract into
     FMAs. The CPU backend ignores it. */
  int arm;
  float* y;         /* absorb: q_lat [T, H, R]; decompress: out [T, H, d_v] (f32) */
} MemraMlaProjParams;

/* ---------------------------------------------------------------- mla_latent_append */

/* Latent rows (f32) into latent caches of cache_dtype (bf16 by round-to-nearest-even). The
   device cannot check a row against a cache's length: callers do. Errors: 40025 for n < 0,
   W < 1 or (one sequence) start < 0; 40020 for cache_dtype; 40024 for a missing pointer (n > 0). */
typedef struct MemraMlaAppendParams {
  int batched;         /* 0: rows -> cache rows [start, start + n) of one sequence; 1: row b ->
                          caches[b][pos[b], :], one row for each of n sequences, one launch */
  const float* rows;   /* [n, W] f32 */
  int n;               /* rows (0: nothing) */
  int W;               /* row width (R + d_rope) */
  int cache_dtype;     /* 0 f32, 1 bf16 */
  void* cache;         /* batched 0: [max_len, W] */
  int start;           /* batched 0: the first row written */
  void* const* caches; /* batched 1: [n] device pointers to [max_len_b, W] */
  const int32_t* pos;  /* batched 1: [n] device; pos[b] < 0 is an idle row (nothing written) */
} MemraMlaAppendParams;

/* ---------------------------------------------------------------- mla_attn */

#define MEMRA_MLA_ROWS_CAUSAL 0  /* every row up to the query's own */
#define MEMRA_MLA_ROWS_INDEXED 1 /* the rows idx lists (compacted by the entry) */
#define MEMRA_MLA_ROWS_LISTED 2  /* lists compacted already (list, counts; batched only) */

/* Absorbed attention over a latent cache: o_lat = softmax(scale * (q_lat . c + q_pe . k_pe)) c
   per (query, head), c the latent part of the rows it attends.
   One sequence (batched 0, cuda/mla_attn.cu): t_q queries, query i at row t_kv - t_q + i;
     CAUSAL: rows <= its own (cpu::mla_attn_absorbed); INDEXED: the rows of idx[i, :]
     (cpu::mla_attn_gathered; -1 skipped, entries outside [0, query row] skipped too: the GPU
     cannot refuse without a host sync, callers validate host lists first; a row listed twice
     counts once; a query with no row gets zeros). Errors: 40025 for H, t_q, t_kv, d_rope < 0, R
     < 1 or (INDEXED) width < 0; 40020 cache_dtype; 40004 t_q > t_kv; 40024 q_pe null with
     d_rope > 0, or a missing pointer.
   Batched decode (batched 1, cuda/mla_decode.cu): B sequences, one query each, one launch plan;
     the query of sequence b sits at row t_kv[b] - 1 and sees rows [0, n_b), n_b = t_kv[b]
     clamped to [0, max_t_kv]; n_b == 0 is an idle row: o_lat[b] = 0 and nothing of it is read
     (caches[b] may be null). Rows are R + d_rope wide; with d_rope > 0 the score adds q_pe[b] .
     k_pe (Kimi-Linear's unrotated rope columns). CAUSAL: every row < n_b;
     INDEXED: idx [B, width] (null: as CAUSAL), -1 and entries outside [0, n_b) skipped, a row
     listed twice counts once, an empty list gives zeros; LISTED: list [B, width] and counts [B]
     as kpool_select's compaction writes them (the same bytes as INDEXED, without the compaction
     launch). The launch shape depends on B, H, R, width, cache_dtype and max_t_kv only, so a
     captured graph replays at any t_kv <= max_t_kv. bf16 cache with R in {128, 256, 512} and
     d_rope 0 or 64: tensor cores (q_lat, q_pe and p rounded to bf16, f32 softmax and
     accumulation; dense at H = 64, R = 512, d_rope 0 the sm_90a wgmma arm
     KernelOptions::mla_decode_variant selects); otherwise f32 CUDA cores (R <= 1024, else 50002;
     50002 too when R + d_rope rows do not fit its shared memory). Errors: 40025 for B, H,
     max_t_kv, width, d_rope < 0 or R < 1; 40020 cache_dtype; 40024 a missing pointer (LISTED:
     list or counts; q_pe with d_rope > 0); 50002 B or H > 65535. */
typedef struct MemraMlaAttnParams {
  int batched;          /* 0 one sequence, 1 B sequences of one query each */
  int rows;             /* MEMRA_MLA_ROWS_CAUSAL / _INDEXED / _LISTED (LISTED: batched only) */
  const float* q_lat;   /* [t_q or B, H, R] f32 */
  const float* q_pe;    /* [t_q or B, H, d_rope] f32, null when d_rope == 0 */
  int H, R, d_rope;
  float scale;          /* qk_head_dim ** -0.5 */
  int cache_dtype;      /* 0 f32, 1 bf16 */
  float* o_lat;         /* [t_q or B, H, R] f32 */
  /* one sequence */
  const void* cache;    /* [t_kv, R + d_rope] (normalised latent, then the rope part) */
  int t_q, t_kv;
  /* batched */
  const void* const* caches; /* [B] device pointers to [max_len_b, R + d_rope], 16-byte aligned */
  const int32_t* seq_t_kv;   /* [B] device: rows visible to each sequence */
  int B;
  int max_t_kv;              /* host bound of seq_t_kv (the launch is sized from it) */
  /* INDEXED / LISTED */
  const int32_t* idx;   /* INDEXED: [t_q or B, width] int32 */
  int width;            /* entries a list */
  const int32_t* list;  /* LISTED: [B, width] rows in [0, n_b), each once, ascending */
  const int* counts;    /* LISTED: [B] entries of each list */
  /* one sequence: 1 for bf16 models: a bf16 cache with R in {128, 256, 512} and d_rope 0 or 64
     runs on tensor cores (cuda/mla_prefill_tc.cu: the batched decode's tensor-core kernels over
     the t_q queries, query i as a sequence of t_kv - t_q + i + 1 rows; q_lat, q_pe and p rounded
     to bf16, f32 softmax and accumulation: the decode's bf16 limits); other geometries, and 0:
     the f32 CUDA-core kernel. 40025 outside {0, 1}. Batched forms and the CPU ignore it. */
  int tensor_cores;
} MemraMlaAttnParams;

/* ---------------------------------------------------------------- mla_norm_append_decode */

/* One row of the prologue's norms: y = rms_norm(x, w, eps), or layer_norm(x, w, b, eps) with b. */
typedef struct MemraMlaNormRow {
  const float* x; /* [D] f32 */
  int D;
  const float* w; /* [D] or null (an RMSNorm without weight) */
  const float* b; /* [D]: the LayerNorm's bias (row index_k only; null for the RMSNorms) */
  float eps;
  float* y;       /* [D], may alias x */
} MemraMlaNormRow;

/* One decode row's MLA prologue in one launch (cuda/mla_prologue.cu), the bytes of:
   norm_rows(q, latent, index_k), then decode_tables(slots, 1, lengths, pos, t_kv, n, bases,
   strides, outs), then mla_latent_append (batched, latent.y -> outs[0] at pos) and, with index_k
   (n == 4: tables 1, 2, 3 the tail_k, tail_gate and pool_keys planes; without it n == 1),
   kpool_append (batched, index_k.y and gate at pos into outs[1], outs[2], outs[3]). latent.y and
   index_k.y must not overlap a cache plane. An index_k row of D > 256 (wider than the one launch
   stages) runs those four calls. Errors: as those calls (40024 missing pointers, 40025 values,
   40020 cache_dtype, 40010 pool / tail_rows), and 40025 for n other than 1 (no index_k) / 4. */
typedef struct MemraMlaNormAppendParams {
  MemraMlaNormRow q;       /* q's low-rank row (RMSNorm) */
  MemraMlaNormRow latent;  /* the latent row (RMSNorm), appended to the latent cache */
  MemraMlaNormRow index_k; /* the indexer's k (LayerNorm), appended to the k-pool; x null: none */
  const int32_t* slots;    /* [1] device: the row's cache slot (< 0: idle, nothing appended) */
  const int32_t* lengths;  /* [max_batch] device: tokens each slot holds */
  int32_t* pos;            /* [1] device out: the row's position (-1 idle) */
  int32_t* t_kv;           /* [1] device out: pos + 1 (0 idle) */
  int n;                   /* plane tables (decode_tables' n) */
  void* const* bases;      /* [n] host array: plane j's slot-0 base (device) */
  const int64_t* strides;  /* [n] host: bytes from one slot's plane j to the next */
  void** const* outs;      /* [n] host array of device [1] tables, written */
  int cache_dtype;         /* the latent cache's: 0 f32, 1 bf16 */
  const float* gate;       /* index_k: [D] the k-pool gate row */
  const float* ape;        /* index_k: [pool, D] */
  int pool, tail_rows;     /* index_k: as kpool_append */
} MemraMlaNormAppendParams;

#define MEMRA_CUDA_MLA_OPS(X)                                                                     \
  X(mla_proj, (MemraCudaCtx * ctx, const MemraMlaProjParams* p))                                  \
  X(mla_latent_append, (MemraCudaCtx * ctx, const MemraMlaAppendParams* p))                       \
  X(mla_attn, (MemraCudaCtx * ctx, const MemraMlaAttnParams* p))                                  \
  X(mla_norm_append_decode, (MemraCudaCtx * ctx, const MemraMlaNormAppendParams* p))
