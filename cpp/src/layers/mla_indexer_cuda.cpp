// MlaLayer's DSA indexer on a CUDA device (the chain of MlaLayer::indexer, mla_layer.cpp): pool
// keys and tail ring appended, complete pools scored and selected, for the rows of a prefill
// (indexer_cuda) and for the B rows of a decode step over their plane tables
// (indexer_decode_cuda). The layer's projections and attention are in mla_layer_cuda.cpp.
#include <algorithm>
#include <cmath>

#include "gpu_util.h"
#include "mla_layer_gpu.h"
#include "memra/layers.h"
#include "memra/op/dsa.h"

namespace memra {

// Rows [row0, row0 + T) of `rows` are tokens [pos, pos + T) of `slot`: pool keys, tail ring,
// scores and the index list idx [T, index_width] (as MlaLayer::indexer on the CPU).
Status MlaLayer::indexer_cuda(gpu::Arena& a, Cache& cache, int layer, int slot, int pos,
                              const IndexerRows& rows, int row0, int T, int32_t* idx) const {
  const op::Backend b{cuda_.get()};
  const Gpu& g = *gpu_;
  const int Hi = cfg_.index_heads, di = cfg_.index_head_dim, P = cfg_.kpool;
  const int n_pools = (pos + T) / P;
  float* score = nullptr;
  MEMRA_TRY(a.take(int64_t(T) * std::max(n_pools, 1), &score));
  MemraKpoolAppendParams ap{};
  ap.k = rows.k + int64_t(row0) * di;
  ap.gate = rows.gate + int64_t(row0) * di;
  ap.n = T;
  ap.d = di;
  ap.ape = gpu::f32p(g.kpool_ape);
  ap.pool = P;
  ap.tail_rows = cfg_.tail_rows;
  ap.pos = pos;
  ap.tail_k = cache.tail_k(layer, slot);
  ap.tail_gate = cache.tail_gate(layer, slot);
  ap.pool_keys = cache.pool_keys(layer, slot);
  MEMRA_TRY(op::kpool_append(b, ap));
  MemraKpoolScoreParams sp{};
  sp.q = rows.q + int64_t(row0) * Hi * di;
  sp.w = rows.w + int64_t(row0) * Hi;
  sp.Hi = Hi;
  sp.d = di;
  sp.pool = P;
  sp.qk_scale = 1.0f / std::sqrt(static_cast<float>(di));
  sp.head_scale = 1.0f / std::sqrt(static_cast<float>(Hi));
  sp.score = score;
  sp.pool_keys = cache.pool_keys(layer, slot);
  sp.t_q = T;
  sp.n_pools = n_pools;
  sp.first_pos = pos;
  // bf16 models (a bf16 latent cache) score on tensor cores; float32 models keep the CPU's bytes.
  sp.tensor_cores = cache.latent_dtype() == DType::kBF16 ? 1 : 0;
  MEMRA_TRY(op::kpool_score(b, sp));
  MemraKpoolSelectParams sel{};
  sel.score = score;
  sel.pool = P;
  sel.select_k = cfg_.topk / P;
  sel.width = index_width();
  sel.idx = idx;
  sel.t_q = T;
  sel.n_pools = n_pools;
  sel.first_pos = pos;
  return op::kpool_select(b, sel);
}

// The indexer's decode step for the B rows at device positions pos_d, over the rows' plane
// tables: pool keys and tail ring appended, pools scored and selected (the batched DSA decode
// forms, cuda/dsa_decode.cu; per row the bytes of indexer_cuda with T = 1).
Status MlaLayer::indexer_decode_cuda(gpu::Arena& a, const Cache& cache, const int32_t* pos_d,
                                     const IndexerRows& rows, const IndexerTables& tabs, int B,
                                     bool appended, int32_t* idx, const Listed* listed) const {
  const op::Backend b{cuda_.get()};
  const Gpu& g = *gpu_;
  const int Hi = cfg_.index_heads, di = cfg_.index_head_dim, P = cfg_.kpool;
  const int max_pools = std::max(cache.max_len() / P, 1);
  float* score = nullptr;
  MEMRA_TRY(a.take(int64_t(B) * max_pools, &score));
  if (!appended) {  // (else done by the projections' norm launch, mla_norm_append_decode)
    MemraKpoolAppendParams ap{};
    ap.batched = 1;
    ap.k = rows.k;
    ap.gate = rows.gate;
    ap.n = B;
    ap.d = di;
    ap.ape = gpu::f32p(g.kpool_ape);
    ap.pool = P;
    ap.tail_rows = cfg_.tail_rows;
    ap.seq_pos = pos_d;
    ap.seq_tail_k = reinterpret_cast<float* const*>(tabs.tail_k);
    ap.seq_tail_gate = reinterpret_cast<float* const*>(tabs.tail_gate);
    ap.seq_pool_keys = reinterpret_cast<float* const*>(tabs.pool_keys);
    MEMRA_TRY(op::kpool_append(b, ap));
  }
  MemraKpoolScoreParams sp{};
  sp.batched = 1;
  sp.q = rows.q;
  sp.w = rows.w;
  sp.Hi = Hi;
  sp.d = di;
  sp.pool = P;
  sp.qk_scale = 1.0f / std::sqrt(static_cast<float>(di));
  sp.head_scale = 1.0f / std::sqrt(static_cast<float>(Hi));
  sp.score = score;
  sp.seq_pool_keys = reinterpret_cast<const float* const*>(tabs.pool_keys);
  sp.seq_pos = pos_d;
  sp.B = B;
  sp.max_pools = max_pools;
  MEMRA_TRY(op::kpool_score(b, sp));
  MemraKpoolSelectParams sel{};
  sel.batched = 1;
  sel.score = score;
  sel.pool = P;
  sel.select_k = cfg_.topk / P;
  sel.width = index_width();
  sel.idx = idx;
  sel.seq_pos = pos_d;
  sel.B = B;
  sel.max_pools = max_pools;
  if (listed) {  // and each row's list compacted for mla_attn's LISTED form, in the same launch
    sel.compact = 1;
    sel.seq_t_kv = listed->t_kv;
    sel.max_t_kv = listed->max_t_kv;
    sel.list = listed->list;
    sel.counts = listed->counts;
  }
  return op::kpool_select(b, sel);
}

}  // namespace memra
