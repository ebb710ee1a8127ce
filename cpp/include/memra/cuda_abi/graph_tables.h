// CUDA ABI, decode-graph bookkeeping (cuda/graph_tables.cu; docs/decode_graphs.md): the
// per-sequence state a captured decode step reaches from device slots, lengths and ping-pong
// flags, so the graph replays for any batch composition and position (a KDA layer's pointer
// tables: kda_tables, cuda_abi/kda.h). One thread a batch row, launch shapes from B only, no
// allocation, no host synchronisation. CUDA only (the CPU backend reads its cache on the host).
#pragma once

/* A decode step's positions and plane tables from the device slots, in one launch. With pos and
   t_kv: for s = slots[b] >= 0, pos[b] = lengths[s] (tokens the sequence held before this step)
   and t_kv[b] = lengths[s] + 1; an idle row (s < 0) gets pos = -1 and t_kv = 0. Table j < n:
   outs[j][b] = bases[j] + s * strides[j] bytes, null for an idle row. B == 0, or n == 0 without
   pos, is a no-op. */
typedef struct MemraDecodeTablesParams {
  const int32_t* slots;   /* [B] device int32: the row's cache slot (< max_batch, unchecked), or
                             < 0 for an idle row */
  int B;                  /* rows, >= 0 (else 40025) */
  const int32_t* lengths; /* [max_batch] device int32 (read with pos) */
  int32_t* pos;           /* [B] device int32, or null (then t_kv null too; else 40024) */
  int32_t* t_kv;          /* [B] device int32, or null */
  int n;                  /* tables, 0..8 (else 40025) */
  void* const* bases;     /* host [n]: each table's plane base */
  const int64_t* strides; /* host [n]: bytes between two slots' planes */
  void** const* outs;     /* host [n] of device [B] pointer arrays */
} MemraDecodeTablesParams;

#define MEMRA_CUDA_GRAPH_TABLES_OPS(X)                                                            \
  /* The decode step's commit on the device: lengths[s] += 1 and cur[s] ^= 1 for every row b < B \
     with s = slots[b] >= 0 (Cache::commit(s, 1) without the host; slots distinct, as a decode    \
     batch's are; a repeated slot is counted once per occurrence, atomically). lengths and cur    \
     [max_batch] device int32, updated in place; no capacity check (the host checks room before   \
     the step). B == 0 is a no-op; one launch, shape from B only. */                              \
  X(commit_decode, (MemraCudaCtx * ctx, const int32_t* slots, int B, int32_t* lengths, int32_t* cur)) \
  /* MemraDecodeTablesParams (see there). */                                                      \
  X(decode_tables, (MemraCudaCtx * ctx, const MemraDecodeTablesParams* p))
