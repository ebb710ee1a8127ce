// The MLA ops on either backend (memra::op, cpp/include/memra/op/backend.h): CPU reference in
// cpp/src/cpu/mla.cpp (cpu/mla.h), CUDA in cuda/mla_*.cu, parameter structs in cuda_abi/mla.h.
// Pointers live on the backend's device (host memory on the CPU, where the batched forms' pointer
// tables and per-sequence arrays are host arrays too). The CPU runs f32 caches only (cache_dtype
// 1 is kUnsupportedGeometry there). Statuses name the op ("mla_attn: ...").
#pragma once

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// Absorb (p.which MEMRA_MLA_ABSORB) or decompress (MEMRA_MLA_DECOMPRESS) over kv_b
// (MemraMlaProjParams). CPU: cpu::mla_absorb_q / mla_decompress_v; p.arm is CUDA's only.
// Reference: Glm5NextTextAttention.expand_kv (k_nope = W_uk c, v = W_uv c) folded into q and o.
Status mla_proj(const Backend& b, const MemraMlaProjParams& p);

// Latent rows into latent caches (MemraMlaAppendParams): rows [start, start + n) of one cache, or
// (batched) row b at caches[b][pos[b]] (pos[b] < 0 writes nothing). Nobody checks a row against
// a cache's length here: the callers do. Reference: MlaLayer's cache rows.
Status mla_latent_append(const Backend& b, const MemraMlaAppendParams& p);

// Absorbed attention over latent caches (MemraMlaAttnParams). CPU: one sequence is
// cpu::mla_attn_absorbed (CAUSAL) / cpu::mla_attn_gathered (INDEXED: an entry outside [-1, t_kv)
// is kContractRange); batched, each sequence b with n_b = seq_t_kv[b] clamped to [0, max_t_kv]
// runs the same ops with one query at row n_b - 1 over its rows (INDEXED: entries outside [0,
// n_b) dropped, as the device does; LISTED: list[b, :counts[b]]), n_b == 0 giving zeros, and
// with d_rope > 0 the query's q_pe[b]. Reference: Glm5NextTextAttention.forward (eager attention;
// the index mask of build_attention_mask_from_topk); KimiLinearAttention (the unrotated rope
// columns' q_pe . k_pe term).
Status mla_attn(const Backend& b, const MemraMlaAttnParams& p);

// One decode row's norms, tables and cache appends in one launch (MemraMlaNormAppendParams).
// CUDA only (device slots and plane tables): kUnsupportedGeometry on the CPU.
Status mla_norm_append_decode(const Backend& b, const MemraMlaNormAppendParams& p);

}  // namespace memra::op
