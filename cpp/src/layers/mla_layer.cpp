// MlaLayer: multi-head latent attention (absorbed form) with the DSA k-pool indexer, over the CPU
// reference ops. Reference: transformers Glm5NextTextAttention + Glm5NextTextIndexer, and
// KimiLinearAttention (q_proj without query LoRA, rope columns that are never rotated).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "host_util.h"
#include "memra/layers.h"
#include "memra/op/basic.h"
#include "memra/op/dsa.h"
#include "memra/op/mla.h"

namespace memra {

namespace {
constexpr float kIndexerNormEps = 1e-6f;  // Glm5NextTextIndexer.k_norm = LayerNorm(eps=1e-6)

// absorb / decompress over the layer's kv_b on the CPU (op::mla_proj's fields).
MemraMlaProjParams proj(int which, const float* x, const Weight& kv_b, int T, int H, int d_nope,
                        int d_v, float* y) {
  MemraMlaProjParams p{};
  p.which = which;
  p.x = x;
  p.kv_b = kv_b.data();
  p.w_dtype = static_cast<int>(kv_b.dtype());
  p.T = T;
  p.H = H;
  p.d_nope = d_nope;
  p.d_v = d_v;
  p.R = static_cast<int>(kv_b.cols());
  p.y = y;
  return p;
}

// A host index list's row for the query at position `pos`: entries are -1 (padding) or a row the
// query sees (<= pos). `what` names the row as the caller's argument does.
Status check_index_row(const int32_t* row, int W, int pos, const char* op,
                       const std::string& what) {
  for (int j = 0; j < W; ++j) {
    if (row[j] < -1 || row[j] > pos) {
      return Status(kContractRange, std::string(op) + ": topk" + what + "[" + std::to_string(j) +
                                        "] = " + std::to_string(row[j]) + " is outside [-1, " +
                                        std::to_string(pos) + "] (the query is at position " +
                                        std::to_string(pos) + " and sees no later row)");
    }
  }
  return Status::Ok();
}
}  // namespace

Status MlaLayer::create(const MlaConfig& cfg, WeightMap& w, std::unique_ptr<MlaLayer>* out) {
  if (cfg.hidden < 1 || cfg.heads < 1 || cfg.q_lora_rank < 0 || cfg.kv_rank < 1 || cfg.d_nope < 1 ||
      cfg.d_v < 1 || cfg.d_rope < 0) {
    return Status(kContractValue, "MlaLayer: hidden, heads, kv_rank, d_nope and d_v must be >= 1, "
                                  "q_lora_rank and d_rope >= 0");
  }
  MEMRA_TRY(check_sizes("MlaLayer", {{"hidden", cfg.hidden}, {"heads", cfg.heads},
                                     {"q_lora_rank", cfg.q_lora_rank}, {"kv_rank", cfg.kv_rank},
                                     {"d_nope", cfg.d_nope}, {"d_rope", cfg.d_rope}, {"d_v", cfg.d_v},
                                     {"index_heads", cfg.index_heads},
                                     {"index_head_dim", cfg.index_head_dim}, {"kpool", cfg.kpool},
                                     {"topk", cfg.topk}}));
  if (cfg.q_lora_rank == 0 && cfg.index_heads > 0) {
    return Status(kContractValue, "MlaLayer: the DSA indexer reads the query LoRA latent; "
                                  "q_lora_rank 0 (q_proj) has none");
  }
  if (cfg.rotate && cfg.d_rope % 2) {
    return Status(kContractOddRope, "MlaLayer: d_rope must be even to rotate, got " +
                                        std::to_string(cfg.d_rope));
  }
  if (cfg.index_heads > 0 && !cfg.sparse) {  // its indexer's lists would be computed and never read
    return Status(kContractValue, "MlaLayer: index_heads=" + std::to_string(cfg.index_heads) +
                                      " builds a DSA indexer, which only a sparse layer runs; pass "
                                      "sparse=True (a full DSA layer) or index_heads=0 (dense)");
  }
  // A dense layer reads no index list: the list's sizes would be taken and never used.
  if (!cfg.sparse && (cfg.index_head_dim || cfg.kpool || cfg.topk || cfg.tail_rows)) {
    return Status(kContractValue,
                  "MlaLayer: a dense layer (sparse=False) takes no DSA sizes; got index_head_dim=" +
                      std::to_string(cfg.index_head_dim) + ", kpool=" + std::to_string(cfg.kpool) +
                      ", topk=" + std::to_string(cfg.topk) + ", tail_rows=" +
                      std::to_string(cfg.tail_rows) + " (each must be 0)");
  }
  if (cfg.index_heads > 0 || cfg.sparse) {
    if (cfg.kpool < 1 || cfg.topk < cfg.kpool || cfg.topk % cfg.kpool) {
      return Status(kContractPool, "MlaLayer: index_topk (" + std::to_string(cfg.topk) +
                                       ") must be a positive multiple of index_kpool (" +
                                       std::to_string(cfg.kpool) + ")");
    }
  }
  if (cfg.index_heads > 0 && (cfg.tail_rows < cfg.kpool || cfg.tail_rows % cfg.kpool)) {
    return Status(kContractPool, "MlaLayer: indexer tail_rows must be a positive multiple of kpool");
  }
  std::unique_ptr<MlaLayer> l(new MlaLayer());
  l->cfg_ = cfg;
  const int64_t D = cfg.hidden, H = cfg.heads, ql = cfg.q_lora_rank, R = cfg.kv_rank;
  const int64_t dq = int64_t(cfg.d_nope) + cfg.d_rope;
  if (ql > 0) {
    MEMRA_TRY(w.take("q_a_proj.weight", {ql, D}, &l->q_a_));
    MEMRA_TRY(w.take_f32("q_a_layernorm.weight", {ql}, &l->q_a_norm_));
    MEMRA_TRY(w.take("q_b_proj.weight", {H * dq, ql}, &l->q_b_));
  } else {
    MEMRA_TRY(w.take("q_proj.weight", {H * dq, D}, &l->q_proj_));
  }
  MEMRA_TRY(w.take("kv_a_proj_with_mqa.weight", {R + cfg.d_rope, D}, &l->kv_a_));
  MEMRA_TRY(w.take_f32("kv_a_layernorm.weight", {R}, &l->kv_a_norm_));
  MEMRA_TRY(w.take("kv_b_proj.weight", {H * (int64_t(cfg.d_nope) + cfg.d_v), R}, &l->kv_b_));
  MEMRA_TRY(w.take("o_proj.weight", {D, H * cfg.d_v}, &l->o_proj_));
  if (ql > 0 && w.has("q_a_proj.bias")) MEMRA_TRY(w.take_f32("q_a_proj.bias", {ql}, &l->q_a_bias_));
  if (w.has("kv_a_proj_with_mqa.bias")) {
    MEMRA_TRY(w.take_f32("kv_a_proj_with_mqa.bias", {R + cfg.d_rope}, &l->kv_a_bias_));
  }
  if (w.has("o_proj.bias")) MEMRA_TRY(w.take_f32("o_proj.bias", {D}, &l->o_bias_));
  if (cfg.index_heads > 0) {
    const int64_t Hi = cfg.index_heads, di = cfg.index_head_dim;
    MEMRA_TRY(w.take("indexer.wq_b.weight", {Hi * di, ql}, &l->wq_b_));
    MEMRA_TRY(w.take("indexer.wk.weight", {di, D}, &l->wk_));
    MEMRA_TRY(w.take_f32("indexer.k_norm.weight", {di}, &l->k_norm_w_));
    MEMRA_TRY(w.take_f32("indexer.k_norm.bias", {di}, &l->k_norm_b_));
    MEMRA_TRY(w.take("indexer.weights_proj.weight", {Hi, D}, &l->weights_proj_));
    MEMRA_TRY(w.take_f32("indexer.index_kpool_compress_ape", {cfg.kpool, di}, &l->kpool_ape_));
    MEMRA_TRY(w.take("indexer.index_kpool_compress_gate", {di, D}, &l->kpool_gate_));
  }
  MEMRA_TRY(w.finish());
  *out = std::move(l);
  return Status::Ok();
}

LayerStateSpec MlaLayer::state_spec() const {
  LayerStateSpec s;
  s.kind = LayerStateSpec::Kind::kMla;
  s.row_width = cfg_.kv_rank + cfg_.d_rope;
  if (has_indexer()) {
    s.index_head_dim = cfg_.index_head_dim;
    s.kpool = cfg_.kpool;
    s.tail_rows = cfg_.tail_rows;
  }
  return s;
}

// Indexer rows for tokens [pos, pos + T) of `slot`: completes the pool keys of every pool whose
// last row lands in this call (pools already resident are not recomputed), keeps the newest raw
// rows in the tail ring, scores the complete pools and writes the index list idx [T, width].
Status MlaLayer::indexer(Cache& cache, int layer, int slot, int pos, const float* x,
                         const float* q_resid, int T, int32_t* idx) const {
  const int Hi = cfg_.index_heads, di = cfg_.index_head_dim, P = cfg_.kpool;
  std::vector<float> q(size_t(T) * Hi * di), k(size_t(T) * di), gate(size_t(T) * di),
      wts(size_t(T) * Hi);
  MEMRA_TRY(host::linear(q_resid, T, wq_b_, nullptr, q.data()));
  MEMRA_TRY(host::linear(x, T, wk_, nullptr, k.data()));
  MEMRA_TRY(op::layer_norm(op::Backend{}, k.data(), T, di, k_norm_w_.data(), k_norm_b_.data(),
                           kIndexerNormEps, k.data()));
  MEMRA_TRY(host::linear(x, T, kpool_gate_, nullptr, gate.data()));
  MEMRA_TRY(host::linear(x, T, weights_proj_, nullptr, wts.data()));

  const op::Backend host;  // the CPU reference
  MemraKpoolAppendParams ap{};
  ap.k = k.data();
  ap.gate = gate.data();
  ap.n = T;
  ap.d = di;
  ap.ape = kpool_ape_.data();
  ap.pool = P;
  ap.tail_rows = cfg_.tail_rows;
  ap.pos = pos;
  ap.tail_k = cache.tail_k(layer, slot);
  ap.tail_gate = cache.tail_gate(layer, slot);
  ap.pool_keys = cache.pool_keys(layer, slot);
  MEMRA_TRY(op::kpool_append(host, ap));

  const int n_pools = (pos + T) / P;
  std::vector<float> score(size_t(T) * std::max(n_pools, 1));
  MemraKpoolScoreParams sp{};
  sp.q = q.data();
  sp.w = wts.data();
  sp.Hi = Hi;
  sp.d = di;
  sp.pool = P;
  sp.qk_scale = 1.0f / std::sqrt(static_cast<float>(di));
  sp.head_scale = 1.0f / std::sqrt(static_cast<float>(Hi));
  sp.score = score.data();
  sp.pool_keys = ap.pool_keys;
  sp.t_q = T;
  sp.n_pools = n_pools;
  sp.first_pos = pos;
  MEMRA_TRY(op::kpool_score(host, sp));
  MemraKpoolSelectParams sel{};
  sel.score = score.data();
  sel.pool = P;
  sel.select_k = cfg_.topk / P;
  sel.width = index_width();
  sel.idx = idx;
  sel.t_q = T;
  sel.n_pools = n_pools;
  sel.first_pos = pos;
  return op::kpool_select(host, sel);
}

// Only a shared DSA layer (sparse, no indexer of its own) reads an index list: a full DSA layer
// computes its own and a dense layer attends to every row, so a list given to either would be
// dropped without a word; the caller meant something else and is told so.
Status MlaLayer::check_topk_given(const int32_t* topk_in, const char* op) const {
  const bool takes = cfg_.sparse && !has_indexer();
  if (takes && !topk_in) {
    return Status(kContractMissing, std::string(op) + ": a shared DSA layer needs topk, the index "
                                                      "list of the full DSA layer before it");
  }
  if (!takes && topk_in) {
    return Status(kContractMissing,
                  std::string(op) + ": topk was given, but " +
                      (cfg_.sparse ? "a full DSA layer computes its own index list"
                                   : "a dense MLA layer attends to every row") +
                      " (only a shared DSA layer takes topk)");
  }
  return Status::Ok();
}

Status MlaLayer::prefill(Cache& cache, int layer, int slot, const float* x, int T,
                         const int32_t* topk_in, float* y, int32_t* topk_out) const {
  const char* op = "MlaLayer.prefill";
  MEMRA_TRY(cache.check_layer(layer, state_spec(), op));
  MEMRA_TRY(cache.check_device(cuda_, op));
  MEMRA_TRY(cache.check_room(slot, T, op));
  MEMRA_TRY(check_topk_given(topk_in, op));
  // Device index lists cannot be read here without a sync; the gathered kernel skips entries
  // outside [0, query row] instead.
  if (gpu_) return prefill_cuda(cache, layer, slot, x, T, topk_in, y, topk_out);
  if (topk_in) {
    const int pos = cache.length(slot), W = index_width();
    for (int t = 0; t < T; ++t) {
      MEMRA_TRY(check_index_row(topk_in + int64_t(t) * W, W, pos + t, op,
                                "[" + std::to_string(t) + "]"));
    }
  }
  return prefill_host(cache, layer, slot, x, T, topk_in, y, topk_out);
}

Status MlaLayer::prefill_host(Cache& cache, int layer, int slot, const float* x, int T,
                              const int32_t* topk_in, float* y, int32_t* topk_out) const {
  const int pos = cache.length(slot), end = pos + T;
  const int H = cfg_.heads, R = cfg_.kv_rank, dr = cfg_.d_rope, dn = cfg_.d_nope, dv = cfg_.d_v;
  const int ql = cfg_.q_lora_rank, row = R + dr, W = index_width();
  const int64_t dq = int64_t(dn) + dr;  // a query head's width

  // Queries: q_resid = q_a_layernorm(q_a_proj(x)); q = q_b_proj(q_resid) [T, H, d_nope + d_rope];
  // without query LoRA (q_lora_rank 0, KimiLinearAttention) q = q_proj(x).
  std::vector<float> q_resid(size_t(T) * ql), q(size_t(T) * H * dq);
  if (ql > 0) {
    MEMRA_TRY(host::linear(x, T, q_a_, q_a_bias_.empty() ? nullptr : q_a_bias_.data(),
                           q_resid.data()));
    MEMRA_TRY(op::rms_norm(op::Backend{}, q_resid.data(), T, ql, q_a_norm_.data(), cfg_.rms_eps,
                           q_resid.data()));
    MEMRA_TRY(host::linear(q_resid.data(), T, q_b_, nullptr, q.data()));
  } else {
    MEMRA_TRY(host::linear(x, T, q_proj_, nullptr, q.data()));
  }

  // Latent rows [kv_a_layernorm(latent) | k_pe] appended at rows [pos, end); k_pe is the raw
  // last d_rope columns of kv_a_proj_with_mqa, rotated only when the family says so.
  std::vector<float> ckv(size_t(T) * row);
  MEMRA_TRY(host::linear(x, T, kv_a_, kv_a_bias_.empty() ? nullptr : kv_a_bias_.data(),
                         ckv.data()));
  float* cache_rows = cache.latent(layer, slot);
  std::vector<int32_t> positions(T);
  for (int t = 0; t < T; ++t) positions[t] = pos + t;
  for (int t = 0; t < T; ++t) {
    float* dst = cache_rows + size_t(pos + t) * row;
    MEMRA_TRY(op::rms_norm(op::Backend{}, ckv.data() + size_t(t) * row, 1, R, kv_a_norm_.data(),
                           cfg_.rms_eps, dst));
    std::copy_n(ckv.data() + size_t(t) * row + R, dr, dst + R);
    if (cfg_.rotate) {
      MEMRA_TRY(op::rope_interleaved(op::Backend{}, dst + R, &positions[t], 1, 1, dr,
                                     cfg_.rope_base));
    }
  }

  std::vector<float> q_nope(size_t(T) * H * dn), q_pe(size_t(T) * H * dr);
  for (int64_t th = 0; th < int64_t(T) * H; ++th) {
    std::copy_n(q.data() + th * dq, dn, q_nope.data() + th * dn);
    std::copy_n(q.data() + th * dq + dn, dr, q_pe.data() + th * dr);
  }
  if (cfg_.rotate) {
    MEMRA_TRY(op::rope_interleaved(op::Backend{}, q_pe.data(), positions.data(), T, H, dr,
                                   cfg_.rope_base));
  }
  std::vector<float> q_lat(size_t(T) * H * R), o_lat(size_t(T) * H * R);
  const op::Backend host;  // the CPU reference
  MEMRA_TRY(op::mla_proj(host, proj(MEMRA_MLA_ABSORB, q_nope.data(), kv_b_, T, H, dn, dv,
                                   q_lat.data())));

  const float scale = 1.0f / std::sqrt(static_cast<float>(dq));
  MemraMlaAttnParams at{};
  at.rows = cfg_.sparse ? MEMRA_MLA_ROWS_INDEXED : MEMRA_MLA_ROWS_CAUSAL;
  at.q_lat = q_lat.data();
  at.q_pe = dr > 0 ? q_pe.data() : nullptr;
  at.H = H;
  at.R = R;
  at.d_rope = dr;
  at.scale = scale;
  at.o_lat = o_lat.data();
  at.cache = cache_rows;
  at.t_q = T;
  at.t_kv = end;
  std::vector<int32_t> own;
  if (cfg_.sparse) {
    const int32_t* idx = topk_in;
    if (has_indexer()) {
      own.resize(size_t(T) * W);
      MEMRA_TRY(indexer(cache, layer, slot, pos, x, q_resid.data(), T, own.data()));
      idx = own.data();
    }
    at.idx = idx;
    at.width = W;
  }
  MEMRA_TRY(op::mla_attn(host, at));
  if (cfg_.sparse && topk_out) std::copy_n(at.idx, size_t(T) * W, topk_out);
  std::vector<float> attn(size_t(T) * H * dv);
  MEMRA_TRY(op::mla_proj(host, proj(MEMRA_MLA_DECOMPRESS, o_lat.data(), kv_b_, T, H, dn, dv,
                                   attn.data())));
  return host::linear(attn.data(), T, o_proj_, o_bias_.empty() ? nullptr : o_bias_.data(), y);
}

Status MlaLayer::decode_device(Cache& cache, int layer, const int32_t* slots_d, int B,
                               const float* x, const int32_t* topk_in, float* y,
                               int32_t* topk_out) const {
  const char* op = "MlaLayer.decode";
  MEMRA_TRY(cache.check_layer(layer, state_spec(), op));
  MEMRA_TRY(cache.check_device(cuda_, op));
  if (!gpu_) return Status(kUnsupported, "MlaLayer.decode: device slots need a CUDA layer");
  MEMRA_TRY(check_topk_given(topk_in, op));
  return decode_cuda(cache, layer, slots_d, B, x, topk_in, y, topk_out);
}

Status MlaLayer::decode(Cache& cache, int layer, const int32_t* slots, int B, const float* x,
                        const int32_t* topk_in, float* y, int32_t* topk_out) const {
  const char* op = "MlaLayer.decode";
  MEMRA_TRY(cache.check_layer(layer, state_spec(), op));
  MEMRA_TRY(cache.check_device(cuda_, op));
  for (int b = 0; b < B; ++b) MEMRA_TRY(cache.check_room(slots[b], 1, op));
  MEMRA_TRY(check_topk_given(topk_in, op));
  if (gpu_) {
    int32_t* slots_d = nullptr;
    gpu::Arena a(cuda_);
    MEMRA_TRY(a.upload(std::vector<int32_t>(slots, slots + B), &slots_d));
    return decode_cuda(cache, layer, slots_d, B, x, topk_in, y, topk_out);
  }
  const int W = index_width();
  // Every row's list is checked before any row runs, so a refused call appends nothing.
  for (int b = 0; topk_in && b < B; ++b) {
    MEMRA_TRY(check_index_row(topk_in + int64_t(b) * W, W, cache.length(slots[b]), op,
                              "[" + std::to_string(b) + "]"));
  }
  for (int b = 0; b < B; ++b) {
    MEMRA_TRY(prefill_host(cache, layer, slots[b], x + size_t(b) * cfg_.hidden, 1,
                           topk_in ? topk_in + size_t(b) * W : nullptr, y + size_t(b) * cfg_.hidden,
                           topk_out ? topk_out + size_t(b) * W : nullptr));
  }
  return Status::Ok();
}

}  // namespace memra
