// KernelOptions: the choices between CUDA kernel arms that stay selectable (docs/options.md says
// which A/B each field is, why it stays, and which arms were settled and deleted instead). Given
// once, when an Engine is made (Python: Engine(..., options=KernelOptions(...)),
// memra.load(..., kernel_options=...)), validated there, and handed to the CUDA library as its
// plain-C twin MemraKernelOptions (cuda_abi/runtime.h), which the context keeps for the kernels'
// host code. Nothing reads the environment. The defaults are the arms the A/B runs kept.
#pragma once

#include <string>

#include "memra/cuda_api.h"
#include "memra/status.h"

namespace memra {

struct KernelOptions {
  // Programmatic dependent launch: kernels are launched so that each may start while the one in
  // front of it finishes (the decode GEMV streams its first weight chunk then); false launches
  // them one after another. Speed only: a kernel reads its predecessor's output only after
  // griddepcontrol.wait, so the bytes are the same. Off is the profiling arm (a kernel's own
  // time without overlap).
  bool pdl = true;
  // The decode GEMV (cuda/gemv.cu) for the one-row GEMMs it takes (bf16 / f32 weight, 16-byte
  // aligned rows); false sends them to cuBLAS. Changes numerics: cuBLAS sums in another order.
  bool gemv = true;
  // Weight rows a decode-GEMV block owns: 0 chooses from N; 1, 2, 4 or 8 force that count.
  // Speed only (a row's sum order depends on K alone).
  int gemv_rows = 0;
  // Rows a block of the decode GEMVs over tall rows (more than 512 16-byte vectors: K > 4096
  // bf16 / 2048 f32, the o / down projections): 0 chooses from N; 1, 2, 4 or 8 force that count
  // (gemv_rows, when set, applies instead). Speed only.
  int gemv_tall_rows = 0;
  // A one-row mHC site leaves its comb's Sinkhorn pending on the context, run by the next
  // decode GEMV in an extra block (or in a launch of its own before any other entry point);
  // false runs it inside the site kernel. Speed only (the same function on the same rows).
  bool mhc_defer = true;
  // The MLA decode kernel over a dense bf16 cache at H = 64, R = 512: 1 the sm_90a wgmma kernel
  // (cuda/mla_decode_sm90.cu), 0 the mma.sync kernel that every other shape runs. Changes
  // numerics (other tiles, other splits).
  int mla_decode_variant = 1;
  // How the wgmma MLA decode kernel (mla_decode_variant 1) merges a sequence's splits
  // (cuda/mla_decode_sm90.cuh, Merge): 0 chooses (in a thread-block cluster where every
  // sequence's cluster is resident at once, else at a grid barrier where the whole grid is,
  // else by a second, combine launch); 1 the combine launch; 2 the cluster (up to 16 splits;
  // more take the combine); 3 the grid barrier (where the whole grid is resident, else the
  // combine). Changes numerics in the last bits (the combine sums the weights in another order).
  int mla_merge = 0;
  // Head tiles of 16 a block of the mma.sync MLA decode kernel: 0 chooses from the batch (2
  // below 32 sequences, 4 from there); 2 or 4 force it (4 only where H > 32). Changes numerics
  // in the last bits (the softmax sums are split over 8 / tiles row groups).
  int mla_tc_mt = 0;
  // 64-row tiles a split of the batched MLA decode kernels (every arm): 0 chooses the splits from
  // the cost model; n > 0 gives ceil(tiles / n) splits (the wgmma arm at most 1024). Changes
  // numerics (the split merge).
  int mla_split_tiles = 0;
  // Tokens from which moe_forward runs the routed experts grouped by expert instead of one
  // (token, slot) pair at a time (a large value keeps the per-pair kernels). moe_forward's bytes
  // do not change (the grouped kernels' every product and sum is the per-pair kernels'), but
  // changes numerics of an MoE layer with a shared expert (moe_forward's shared_* fields): below
  // this T the shared expert rides in the per-pair kernels, from it it runs as an MLP of its own
  // (cuBLAS above one row), which sums in another order.
  int moe_grouped_min_t = 2;
  // The grouped routed experts over bf16 / f16 weights (cuda/moe_tc.cu): true runs them as
  // grouped GEMMs on tensor cores (x and the SwiGLU output rounded to the weights' type, f32
  // accumulation); false keeps the CUDA-core grouped kernels (cuda/moe_grouped.cu, f32
  // activations, the per-pair kernels' bytes), the A/B arm. f32 weights always take the CUDA-core
  // kernels. Changes numerics (rounding and summation order).
  bool moe_tensor_cores = true;
  // The full attention's decode (cuda/attention_decode.cu, AttentionLayer): false splits each
  // sequence's rows over blocks sized from the cache's capacity and merges the splits' partial
  // softmaxes per head in a second launch; true runs one block per (sequence, K/V head) over all
  // of its rows, the A/B arm. Changes numerics (the merge), except where a sequence's rows fit
  // one split: there both give the same bytes.
  bool attn_decode_unsplit = false;
  // Prompt tokens a prefill runs at a time (memra.Model's prefill / logits / generation): a
  // longer prompt is split into chunks of at most this many tokens, each run through every layer
  // and committed before the next, so the prefill's scratch (activations, the MLA prefill's
  // T x heads x rank buffers, the MoE's routed rows) grows with the chunk, not with the prompt.
  // 0 never splits. Read by the Python orchestration on every backend (the CPU engine too); no
  // kernel reads it. Changes numerics on CUDA (a GEMM over fewer rows may pick another cuBLAS
  // algorithm); on the CPU the chunks give the one-shot prefill's bytes.
  int prefill_chunk = 8192;
  // The full attention's prefill over a bf16 cache (memra_cuda_attention's direct form, T > 1,
  // head widths a multiple of 8): true runs the FlashAttention-2-style tensor-core kernel
  // (cuda/attention_tc.cu: q and p rounded to bf16, f32 scores, softmax and accumulation);
  // false the f32 CUDA-core kernel (cuda/attention.cu), which f32 caches always take (the A/B
  // arm and the exact twin of the CPU op). Changes numerics (the bf16 rounding of q and p,
  // another summation order).
  bool attn_prefill_tensor_cores = true;

  // ContractError 40025 naming the first field out of its domain and its value.
  Status validate() const;
  MemraKernelOptions to_abi() const;
  static KernelOptions from_abi(const MemraKernelOptions& o);
  bool operator==(const KernelOptions& o) const;
  bool operator!=(const KernelOptions& o) const { return !(*this == o); }
};

inline Status KernelOptions::validate() const {
  auto bad = [](const char* field, int value, const char* domain) {
    return Status(kContractValue, std::string("KernelOptions: ") + field + " must be " + domain +
                                      ", got " + std::to_string(value));
  };
  auto rows = [](int r) { return r == 0 || r == 1 || r == 2 || r == 4 || r == 8; };
  if (!rows(gemv_rows)) return bad("gemv_rows", gemv_rows, "0, 1, 2, 4 or 8");
  if (!rows(gemv_tall_rows)) return bad("gemv_tall_rows", gemv_tall_rows, "0, 1, 2, 4 or 8");
  if (mla_decode_variant < 0 || mla_decode_variant > 1) {
    return bad("mla_decode_variant", mla_decode_variant, "0 or 1");
  }
  if (mla_merge < 0 || mla_merge > 3) return bad("mla_merge", mla_merge, "0, 1, 2 or 3");
  if (mla_tc_mt != 0 && mla_tc_mt != 2 && mla_tc_mt != 4) {
    return bad("mla_tc_mt", mla_tc_mt, "0, 2 or 4");
  }
  if (mla_split_tiles < 0) return bad("mla_split_tiles", mla_split_tiles, ">= 0");
  if (moe_grouped_min_t < 1) return bad("moe_grouped_min_t", moe_grouped_min_t, ">= 1");
  if (prefill_chunk < 0) return bad("prefill_chunk", prefill_chunk, ">= 0");
  return Status::Ok();
}

inline MemraKernelOptions KernelOptions::to_abi() const {
  MemraKernelOptions o;
  o.pdl = pdl ? 1 : 0;
  o.gemv = gemv ? 1 : 0;
  o.gemv_rows = gemv_rows;
  o.gemv_tall_rows = gemv_tall_rows;
  o.mhc_defer = mhc_defer ? 1 : 0;
  o.mla_decode_variant = mla_decode_variant;
  o.mla_merge = mla_merge;
  o.mla_tc_mt = mla_tc_mt;
  o.mla_split_tiles = mla_split_tiles;
  o.moe_grouped_min_t = moe_grouped_min_t;
  o.attn_decode_unsplit = attn_decode_unsplit ? 1 : 0;
  o.prefill_chunk = prefill_chunk;
  o.moe_tensor_cores = moe_tensor_cores ? 1 : 0;
  o.attn_prefill_tensor_cores = attn_prefill_tensor_cores ? 1 : 0;
  return o;
}

inline KernelOptions KernelOptions::from_abi(const MemraKernelOptions& o) {
  KernelOptions k;
  k.pdl = o.pdl != 0;
  k.gemv = o.gemv != 0;
  k.gemv_rows = o.gemv_rows;
  k.gemv_tall_rows = o.gemv_tall_rows;
  k.mhc_defer = o.mhc_defer != 0;
  k.mla_decode_variant = o.mla_decode_variant;
  k.mla_merge = o.mla_merge;
  k.mla_tc_mt = o.mla_tc_mt;
  k.mla_split_tiles = o.mla_split_tiles;
  k.moe_grouped_min_t = o.moe_grouped_min_t;
  k.attn_decode_unsplit = o.attn_decode_unsplit != 0;
  k.prefill_chunk = o.prefill_chunk;
  k.moe_tensor_cores = o.moe_tensor_cores != 0;
  k.attn_prefill_tensor_cores = o.attn_prefill_tensor_cores != 0;
  return k;
}

inline bool KernelOptions::operator==(const KernelOptions& o) const {
  return pdl == o.pdl && gemv == o.gemv && gemv_rows == o.gemv_rows &&
         gemv_tall_rows == o.gemv_tall_rows && mhc_defer == o.mhc_defer &&
         mla_decode_variant == o.mla_decode_variant && mla_merge == o.mla_merge &&
         mla_tc_mt == o.mla_tc_mt &&
         mla_split_tiles == o.mla_split_tiles && moe_grouped_min_t == o.moe_grouped_min_t &&
         attn_decode_unsplit == o.attn_decode_unsplit && prefill_chunk == o.prefill_chunk &&
         moe_tensor_cores == o.moe_tensor_cores &&
         attn_prefill_tensor_cores == o.attn_prefill_tensor_cores;
}

}  // namespace memra
