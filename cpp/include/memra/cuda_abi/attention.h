// CUDA ABI, full-attention area (cuda/attention_prep.cu, cuda/attention.cu): the gated attention
// of Qwen3.5 / Qwen3-Next (transformers 5.17 Qwen3_5Attention / Qwen3NextAttention) over a K/V
// cache. The GPU twins of memra/cpu/attention.h; memra::op (memra/op/attention.h) makes the
// CPU / CUDA choice. Activations f32, C-contiguous unless a row stride says otherwise.
//
// Where a row's position comes from, in every struct below: the DIRECT form (slots == NULL) is
// one sequence whose rows t sit at positions pos0 + t (a prefill: the host knows pos0); the
// DEVICE form (slots != NULL) is a decode batch, row t being one token of slot slots[t] at
// position lengths[slots[t]] (the cache's device lengths before the step's commit), read on the
// device, so the launch can be captured once into a CUDA graph and replayed at any position. A
// row with slots[t] < 0 is idle. Device-form slots are not checked on the device (the host
// validates them: memra::DecodeSlots, and each slot's room).
#pragma once

/* Split over the sequence of the device-form attention (memra_cuda_attention): rows a split
   covers, a multiple of 32, from the cache's capacity and the blocks a (sequence, K/V head)
   has for its query heads; never from a length, so the grid (max_len / rows splits, the splits
   past a row's position exiting) is the same at every position, and a row's bytes do not depend
   on the other rows of its batch. About 256 blocks per sequence, at least 32 rows a split. */
static inline int memra_attention_split_rows(int max_len, int kv_blocks) {
  const int want = kv_blocks > 0 ? (256 + kv_blocks - 1) / kv_blocks : 1;
  int rows = (max_len + want - 1) / want;
  rows = (rows + 31) / 32 * 32;
  return rows < 32 ? 32 : rows;
}

/* The prologue of the gated attention (Qwen3_5Attention.forward up to apply_rotary_pos_emb):
   the joint projection split per head (q_proj's output viewed [T, Hq, 2 * hd] and chunked:
   query then gate), the per-head RMSNorm of q and k (x * rsqrt(mean(x^2) + eps) * w, f32) and
   partial NeoX RoPE over the first n_rot dims of each q and k head (rotate_half over those
   dims: out[j] = x[j] cos - x[j + n_rot/2] sin, out[j + n_rot/2] = x[j + n_rot/2] cos + x[j] sin,
   angle = float(position) * inv_freq[j], j < n_rot / 2; dims past n_rot pass through). */
typedef struct MemraAttnPrepParams {
  const float* qg;       /* [T, ld_qg] f32: row t holds Hq heads of [q (hd) | gate (hd)] */
  int64_t ld_qg;         /* elements between rows of qg, >= 2 * Hq * hd */
  const float* k;        /* [T, ld_k] f32: row t holds Hkv heads of hd (k_proj's output) */
  int64_t ld_k;          /* elements between rows of k, >= Hkv * hd */
  int T, Hq, Hkv, hd;    /* rows; query heads; K/V heads (Hq % Hkv == 0); head width 1..256 */
  const float* q_norm;   /* [hd] f32: the weight the normed q is multiplied by (a zero-centred
                            norm's 1 + w, computed on the host) */
  const float* k_norm;   /* [hd] f32: the same for k */
  float eps;             /* the norms' epsilon (finite, >= 0) */
  int n_rot;             /* rotated dims per head: even, 0..hd (0: no rotation) */
  const float* inv_freq; /* [n_rot / 2] f32 inverse frequencies (memra::cpu::rope_inv_freq, on
                            the host, as transformers computes them); null when n_rot == 0 */
  int pos0;              /* direct form: row t at position pos0 + t */
  const int32_t* slots;  /* device form: [T] int32 slot of each row (-1 idle: position 0) */
  const int32_t* lengths; /* device form: [max_batch] int32 device lengths */
  float* q;              /* [T, Hq, hd] out: normed, rotated query */
  float* gate;           /* [T, Hq, hd] out: the gate half of qg (null: not copied) */
  float* k_out;          /* [T, Hkv, hd] out: normed, rotated key (may be k itself when
                            ld_k == Hkv * hd) */
} MemraAttnPrepParams;

/* The K/V row append (the cache update of past_key_values.update): row t's key and value
   [Hkv * hd] written to the cache at its position, converted to the cache's dtype (bf16: RNE). */
typedef struct MemraKvAppendParams {
  const float* k;        /* [T, ld_k] f32: Hkv * hd values a row */
  int64_t ld_k;          /* >= Hkv * hd */
  const float* v;        /* [T, ld_v] f32 */
  int64_t ld_v;          /* >= Hkv * hd */
  int T, Hkv, hd;
  void* k_cache;         /* direct form: the sequence's key rows [max_len, Hkv, hd]; device form:
                            slot 0's, slot s's at + s * slot_stride elements */
  void* v_cache;         /* the same for the value rows */
  int cache_dtype;       /* 0 f32, 1 bf16 */
  int max_len;           /* rows of a plane; direct: pos0 + T > max_len is 40023; device: a row
                            whose position is >= max_len writes nothing */
  int64_t slot_stride;   /* device form: elements between slots' planes (max_len * Hkv * hd) */
  int pos0;              /* direct form */
  const int32_t* slots;  /* device form: [T] (-1: nothing written) */
  const int32_t* lengths; /* device form: [max_batch] */
} MemraKvAppendParams;

/* Causal grouped attention over the cache with the sigmoid output gate (eager_attention_forward
   with repeat_kv, then attn_output * sigmoid(gate)): query head h reads K/V head h / (Hq / Hkv);
   o[t, h] = sum_j softmax_j(scale * q[t, h] . k[j]) v[j] over the rows j < n_t, times
   sigmoid(gate[t, h]) elementwise when gate is given. Direct form: n_t = pos0 + t + 1 over the
   given planes (a prefill chunk whose rows are already appended; one block per tile of queries
   and K/V head, online softmax, f32 on CUDA cores; over a bf16 cache at T > 1 with hd a multiple
   of 8 and 16-byte aligned planes, on tensor cores instead when the context's
   KernelOptions::attn_prefill_tensor_cores is set: q and the softmax weights rounded to bf16,
   f32 accumulation, cuda/attention_tc.cu). Device form: n_t = lengths[slots[t]] + 1 (the
   row appended at the step's position included; capped at max_len), an idle row's o is zero;
   split over the sequence (memra_attention_split_rows) with a per-head merge, or one block per
   (row, K/V head) when the context's KernelOptions::attn_decode_unsplit is set. */
typedef struct MemraAttnParams {
  const float* q;        /* [T, Hq, hd] f32 */
  const float* gate;     /* [T, Hq, hd] f32, or null: no gate */
  float* o;              /* [T, Hq, hd] f32 out */
  const void* k_cache;   /* as MemraKvAppendParams */
  const void* v_cache;
  int cache_dtype;       /* 0 f32, 1 bf16 */
  int max_len;
  int64_t slot_stride;   /* device form */
  int T, Hq, Hkv, hd;    /* Hq % Hkv == 0; hd 1..256 */
  float scale;           /* the scores' factor (transformers: head_dim ** -0.5), finite */
  int pos0;              /* direct form: pos0 + T <= max_len (else 40023) */
  const int32_t* slots;  /* device form: [T] */
  const int32_t* lengths; /* device form: [max_batch] */
} MemraAttnParams;

/* The contract checks of the three entries, shared by the CUDA library and memra::op's CPU
   branch so both refuse a struct with the same code: 0 ok, 40024 a null struct or array, 40025
   a count or scalar out of its domain, 40001 an odd n_rot, 40022 a row stride below a row,
   40020 a cache dtype other than f32 / bf16, 40023 a direct-form chunk past max_len or a
   negative pos0, 50002 hd > 256 (the kernels' widest head). */
static inline int memra_attn_check_heads(int T, int Hq, int Hkv, int hd) {
  if (T < 0 || Hq < 1 || Hkv < 1 || Hq % Hkv != 0 || hd < 1) return 40025;
  if (hd > 256) return 50002;
  return 0;
}
static inline int memra_attn_check_where(int T, int pos0, const int32_t* slots,
                                         const int32_t* lengths, int max_len) {
  if (slots) return lengths ? 0 : 40024;
  if (pos0 < 0) return 40023;
  if (max_len > 0 && (int64_t)pos0 + T > max_len) return 40023;
  return 0;
}
static inline int memra_attn_prep_check(const MemraAttnPrepParams* p) {
  if (!p) return 40024;
  int rc = memra_attn_check_heads(p->T, p->Hq, p->Hkv, p->hd);
  if (rc) return rc;
  if (p->n_rot < 0 || p->n_rot > p->hd) return 40025;
  if (p->n_rot % 2) return 40001;
  if (!(p->eps >= 0.0f && p->eps <= 3.402823466e38f)) return 40025;
  if (p->ld_qg < (int64_t)2 * p->Hq * p->hd || p->ld_k < (int64_t)p->Hkv * p->hd) return 40022;
  rc = memra_attn_check_where(p->T, p->pos0, p->slots, p->lengths, 0);
  if (rc) return rc;
  if (p->T > 0 && (!p->qg || !p->k || !p->q_norm || !p->k_norm || !p->q || !p->k_out ||
                   (p->n_rot > 0 && !p->inv_freq))) {
    return 40024;
  }
  return 0;
}
static inline int memra_kv_append_check(const MemraKvAppendParams* p) {
  if (!p) return 40024;
  int rc = memra_attn_check_heads(p->T, p->Hkv, p->Hkv, p->hd);
  if (rc) return rc;
  if (p->cache_dtype != 0 && p->cache_dtype != 1) return 40020;
  if (p->max_len < 1) return 40025;
  if (p->ld_k < (int64_t)p->Hkv * p->hd || p->ld_v < (int64_t)p->Hkv * p->hd) return 40022;
  if (p->slots && p->slot_stride < (int64_t)p->max_len * p->Hkv * p->hd) return 40025;
  rc = memra_attn_check_where(p->T, p->pos0, p->slots, p->lengths, p->max_len);
  if (rc) return rc;
  if (p->T > 0 && (!p->k || !p->v || !p->k_cache || !p->v_cache)) return 40024;
  return 0;
}
static inline int memra_attention_check(const MemraAttnParams* p) {
  if (!p) return 40024;
  int rc = memra_attn_check_heads(p->T, p->Hq, p->Hkv, p->hd);
  if (rc) return rc;
  if (p->cache_dtype != 0 && p->cache_dtype != 1) return 40020;
  if (p->max_len < 1) return 40025;
  if (!(p->scale >= -3.402823466e38f && p->scale <= 3.402823466e38f)) return 40025;
  if (p->slots && p->slot_stride < (int64_t)p->max_len * p->Hkv * p->hd) return 40025;
  rc = memra_attn_check_where(p->T, p->pos0, p->slots, p->lengths, p->max_len);
  if (rc) return rc;
  if (p->T > 0 && (!p->q || !p->o || !p->k_cache || !p->v_cache)) return 40024;
  return 0;
}

#define MEMRA_CUDA_ATTENTION_OPS(X)                                                               \
  /* The gated attention's prologue (MemraAttnPrepParams); errors: memra_attn_prep_check. */     \
  X(attn_prep, (MemraCudaCtx * ctx, const MemraAttnPrepParams* p))                                \
  /* The K/V row append (MemraKvAppendParams); errors: memra_kv_append_check. */                \
  X(kv_append, (MemraCudaCtx * ctx, const MemraKvAppendParams* p))                                \
  /* attn_prep(prep) then kv_append(app) (errors: the two checks, in that order), in one launch  \
     when app appends prep's output keys at its rows (app->k == prep->k_out, app->ld_k ==       \
     Hkv * hd, the same T, Hkv, hd, slots, lengths and pos0): a key head's block also writes its \
     cache row, extra blocks the value rows. The bytes of the two calls. */                     \
  X(attn_prep_append, (MemraCudaCtx * ctx, const MemraAttnPrepParams* prep,                      \
                       const MemraKvAppendParams* app))                                           \
  /* The causal grouped attention with the output gate (MemraAttnParams); errors:              \
     memra_attention_check. */                                                                   \
  X(attention, (MemraCudaCtx * ctx, const MemraAttnParams* p))
