// CUDA ABI, utility area (cuda/util.cu): the small data movements the layers chain between ops.
#pragma once

#define MEMRA_CUDA_UTIL_OPS(X)                                                                    \
  /* y[i] = a[i] + b[i], n elements (y may alias a or b). */                                      \
  X(add, (MemraCudaCtx * ctx, const float* a, const float* b, int64_t n, float* y))               \
  /* out[t, s, :] = x[t, :] for s < n: x [T, D] -> out [T, n, D] (mHC streams). */               \
  X(hc_expand, (MemraCudaCtx * ctx, const float* x, int T, int D, int n, float* out))           \
  /* Decode-graph bookkeeping (cuda/graph_tables.cu; docs/decode_graphs.md): per-sequence state   \
     reached from device slots and ping-pong flags, so a captured graph replays for any of them    \
     (a KDA layer's pointer tables: kda_tables, cuda_abi/kda.h).                                  \
     The decode step's commit on the device: lengths[s] += 1 and cur[s] ^= 1 for every row b < B \
     with s = slots[b] >= 0 (Cache::commit(s, 1) without the host; slots distinct, as a decode    \
     batch's are; a repeated slot is counted once per occurrence, atomically). lengths and cur    \
     [max_batch] device int32, updated in place; no capacity check (the host checks room before   \
     the step). B == 0 is a no-op; one launch, shape from B only. */                              \
  X(commit_decode, (MemraCudaCtx * ctx, const int32_t* slots, int B, int32_t* lengths, int32_t* cur)) \
  /* A decode step's positions and plane tables from the device slots, in one launch. With pos and \
     t_kv (both null: skipped): for s = slots[b] >= 0, pos[b] = lengths[s] (tokens the sequence   \
     held before this step) and t_kv[b] = lengths[s] + 1; an idle row (s < 0) gets pos = -1 and   \
     t_kv = 0. Table j < n (n <= 8; bases / strides / outs host arrays of n): outs[j][b] =        \
     bases[j] + s * strides[j] bytes, null for an idle row. slots, pos, t_kv [B] and lengths      \
     [max_batch] device int32; outs[j] [B] device pointers. n out of [0, 8] is 40025. */          \
  X(decode_tables, (MemraCudaCtx * ctx, const int32_t* slots, int B, const int32_t* lengths,       \
                    int32_t* pos, int32_t* t_kv, int n, void* const* bases,                       \
                    const int64_t* strides, void** const* outs))
