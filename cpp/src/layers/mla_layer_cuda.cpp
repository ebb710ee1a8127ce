// MlaLayer on a CUDA device: the chain of MlaLayer::prefill / MlaLayer::indexer (mla_layer.cpp)
// over the CUDA library's ops, one sequence per call (decode loops over its slots, as the CPU
// does). The CUDA path carries no rope columns (d_rope == 0: glm5_next's NoPE MLA) and always
// has query LoRA (q_lora_rank > 0): Kimi-Linear's MLA runs on the CPU.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "memra/layers.h"
#include "memra/op/basic.h"
#include "memra/op/dsa.h"
#include "memra/op/graph_tables.h"
#include "memra/op/mla.h"

namespace memra {

namespace {
constexpr float kIndexerNormEps = 1e-6f;  // as mla_layer.cpp

// absorb / decompress of T rows over the uploaded kv_b (arm 0: auto).
MemraMlaProjParams proj(int which, const float* x, const DeviceWeight& kv_b, int T,
                        const MlaConfig& cfg, float* y) {
  MemraMlaProjParams p{};
  p.which = which;
  p.x = x;
  p.kv_b = kv_b.data();
  p.w_dtype = kv_b.dtype_code();
  p.T = T;
  p.H = cfg.heads;
  p.d_nope = cfg.d_nope;
  p.d_v = cfg.d_v;
  p.R = cfg.kv_rank;
  p.y = y;
  return p;
}
}  // namespace

struct MlaLayer::Gpu {
  // Compute dtype. x's projections are one weight in_proj = q_a | kv_a [| wk | kpool_gate |
  // weights_proj] and q_resid's one weight qb_proj = q_b [| wq_b]; the named weights are row
  // views of them (see project_cuda).
  DeviceWeight in_proj, qb_proj;
  DeviceWeight q_a, q_b, kv_a, kv_b, o_proj;
  DeviceWeight q_a_bias, kv_a_bias, o_bias, q_a_norm, kv_a_norm;  // f32 (biases may be empty)
  DeviceWeight wq_b, wk, weights_proj, kpool_gate;  // compute dtype
  DeviceWeight k_norm_w, k_norm_b, kpool_ape;       // f32
};

Status MlaLayer::to_device(std::shared_ptr<CudaContext> cuda, DType dtype) {
  // Kimi-Linear's forms are not on CUDA yet: refused by name (each one found), the CPU runs them.
  std::string missing;
  auto lack = [&](const std::string& what) { missing += (missing.empty() ? "" : "; ") + what; };
  if (cfg_.d_rope != 0) lack("rope columns (d_rope must be 0, got " + std::to_string(cfg_.d_rope) + ")");
  if (cfg_.q_lora_rank == 0) lack("q_proj without query LoRA (q_lora_rank 0)");
  if (!missing.empty()) {
    return Status(kUnsupportedGeometry, "MlaLayer: the CUDA path does not carry " + missing +
                                            "; the CPU backend runs it");
  }
  auto g = std::make_shared<Gpu>();
  std::vector<const Weight*> in = {&q_a_, &kv_a_}, qb = {&q_b_};
  if (has_indexer()) {
    in.insert(in.end(), {&wk_, &kpool_gate_, &weights_proj_});
    qb.push_back(&wq_b_);
  }
  MEMRA_TRY(DeviceWeight::upload_rows(cuda, in, dtype, &g->in_proj));
  MEMRA_TRY(DeviceWeight::upload_rows(cuda, qb, dtype, &g->qb_proj));
  int64_t r = 0;
  auto view = [&](const DeviceWeight& w, const Weight& part) {
    DeviceWeight v = w.row_view(r, part.rows());
    r += part.rows();
    return v;
  };
  g->q_a = view(g->in_proj, q_a_);
  g->kv_a = view(g->in_proj, kv_a_);
  if (has_indexer()) {
    g->wk = view(g->in_proj, wk_);
    g->kpool_gate = view(g->in_proj, kpool_gate_);
    g->weights_proj = view(g->in_proj, weights_proj_);
  }
  r = 0;
  g->q_b = view(g->qb_proj, q_b_);
  if (has_indexer()) g->wq_b = view(g->qb_proj, wq_b_);
  MEMRA_TRY(DeviceWeight::upload(cuda, kv_b_, dtype, &g->kv_b));
  MEMRA_TRY(DeviceWeight::upload(cuda, o_proj_, dtype, &g->o_proj));
  if (!q_a_bias_.empty()) MEMRA_TRY(DeviceWeight::upload_f32(cuda, q_a_bias_, &g->q_a_bias));
  if (!kv_a_bias_.empty()) MEMRA_TRY(DeviceWeight::upload_f32(cuda, kv_a_bias_, &g->kv_a_bias));
  if (!o_bias_.empty()) MEMRA_TRY(DeviceWeight::upload_f32(cuda, o_bias_, &g->o_bias));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, q_a_norm_, &g->q_a_norm));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, kv_a_norm_, &g->kv_a_norm));
  if (has_indexer()) {
    MEMRA_TRY(DeviceWeight::upload_f32(cuda, k_norm_w_, &g->k_norm_w));
    MEMRA_TRY(DeviceWeight::upload_f32(cuda, k_norm_b_, &g->k_norm_b));
    MEMRA_TRY(DeviceWeight::upload_f32(cuda, kpool_ape_, &g->kpool_ape));
  }
  gpu_ = std::move(g);
  cuda_ = std::move(cuda);
  q_a_ = q_b_ = kv_a_ = kv_b_ = o_proj_ = wq_b_ = wk_ = weights_proj_ = kpool_gate_ = Weight();
  return Status::Ok();
}

// The input projections of N rows (MlaLayer::prefill's chain up to the latent rows):
//   q_resid = q_a_layernorm(q_a_proj(x)) [N, ql], q = q_b_proj(q_resid) [N, H * d_nope],
//   ckv = kv_a_layernorm(kv_a_proj(x)) [N, R], and with an own indexer its rows: q = wq_b(q_resid),
//   k = k_norm(wk(x)), gate = kpool_gate(x), w = weights_proj(x).
// x is rounded to the compute dtype once, q_resid once (at N == 1 inside each GEMV instead,
// gpu::round_input). N == 1 without biases (a decode step of one sequence; GLM): x's GEMMs are
// one GEMM over in_proj and q_resid's one over qb_proj, a row's outputs being contiguous column
// blocks of theirs (at T = 1 a GEMM pays a fixed ramp: one large GEMM costs less than five small
// ones). N > 1: one GEMM per projection over the row views (the
// column blocks of N rows interleave).
Status MlaLayer::project_cuda(gpu::Arena& a, const float* x, int N, Projected* out,
                              const NormAppend* append) const {
  const CudaContext& c = *cuda_;
  const op::Backend b{&c};
  const Gpu& g = *gpu_;
  const char* op = "MlaLayer projections";
  const int H = cfg_.heads, R = cfg_.kv_rank, dn = cfg_.d_nope, ql = cfg_.q_lora_rank;
  const int Hi = cfg_.index_heads, di = cfg_.index_head_dim;
  const bool idx = has_indexer();
  auto bias = [](const DeviceWeight& w) { return w.buffer ? gpu::f32p(w) : nullptr; };
  const bool fused = N == 1 && !g.q_a_bias.buffer && !g.kv_a_bias.buffer;
  IndexerRows& rows = out->rows;

  gpu::Rounded xr;
  MEMRA_TRY(gpu::round_input(c, a, x, N, cfg_.hidden, g.in_proj.dtype, &xr, op));
  if (fused) {
    float* in_out = nullptr;  // [1, ql | R | di | di | Hi]
    MEMRA_TRY(a.take(g.in_proj.rows, &in_out));
    MEMRA_GPU(c, gpu::linear_in(c, xr, 1, g.in_proj, nullptr, in_out), op);
    out->q_resid = in_out;
    out->ckv = in_out + ql;
    if (idx) {
      rows.k = out->ckv + R;
      rows.gate = rows.k + di;
      rows.w = rows.gate + di;
    }
  } else {
    MEMRA_TRY(a.take(int64_t(N) * ql, &out->q_resid));
    MEMRA_TRY(a.take(int64_t(N) * R, &out->ckv));
    MEMRA_GPU(c, gpu::linear_in(c, xr, N, g.q_a, bias(g.q_a_bias), out->q_resid), op);
    MEMRA_GPU(c, gpu::linear_in(c, xr, N, g.kv_a, bias(g.kv_a_bias), out->ckv), op);
    if (idx) {
      MEMRA_TRY(a.take(int64_t(N) * di, &rows.k));
      MEMRA_TRY(a.take(int64_t(N) * di, &rows.gate));
      MEMRA_TRY(a.take(int64_t(N) * Hi, &rows.w));
      MEMRA_GPU(c, gpu::linear_in(c, xr, N, g.wk, nullptr, rows.k), op);
      MEMRA_GPU(c, gpu::linear_in(c, xr, N, g.kpool_gate, nullptr, rows.gate), op);
      MEMRA_GPU(c, gpu::linear_in(c, xr, N, g.weights_proj, nullptr, rows.w), op);
    }
  }
  if (N == 1 && append) {  // the norms, with the decode row's tables and cache appends
    const NormAppend& ap = *append;
    const bool ring = idx && ap.n == 4;  // the indexer's planes are in the tables (sparse)
    MemraMlaNormAppendParams p{};
    p.q = MemraMlaNormRow{out->q_resid, ql, gpu::f32p(g.q_a_norm), nullptr, cfg_.rms_eps,
                          out->q_resid};
    p.latent =
        MemraMlaNormRow{out->ckv, R, gpu::f32p(g.kv_a_norm), nullptr, cfg_.rms_eps, out->ckv};
    if (ring) {
      p.index_k = MemraMlaNormRow{rows.k, di, gpu::f32p(g.k_norm_w), gpu::f32p(g.k_norm_b),
                                  kIndexerNormEps, rows.k};
      p.gate = rows.gate;
      p.ape = gpu::f32p(g.kpool_ape);
    } else {
      p.index_k.eps = kIndexerNormEps;
    }
    p.slots = ap.slots;
    p.lengths = ap.lengths;
    p.pos = ap.pos;
    p.t_kv = ap.t_kv;
    p.n = ap.n;
    p.bases = ap.bases;
    p.strides = ap.strides;
    p.outs = ap.outs;
    p.cache_dtype = ap.cache_dtype;
    p.pool = cfg_.kpool;
    p.tail_rows = cfg_.tail_rows;
    MEMRA_TRY(op::mla_norm_append_decode(b, p));
  } else if (N == 1) {  // one launch for the row's two or three norms (the bytes of the three below)
    const MemraNormRowsParams norms{out->q_resid, ql, gpu::f32p(g.q_a_norm), cfg_.rms_eps,
                                    out->q_resid, out->ckv, R, gpu::f32p(g.kv_a_norm),
                                    cfg_.rms_eps, out->ckv, idx ? rows.k : nullptr, idx ? di : 0,
                                    idx ? gpu::f32p(g.k_norm_w) : nullptr,
                                    idx ? gpu::f32p(g.k_norm_b) : nullptr, kIndexerNormEps,
                                    idx ? rows.k : nullptr};
    MEMRA_GPU(c, op::norm_rows(b, norms).code, op);
  } else {
    MEMRA_GPU(c, op::rms_norm(b, out->q_resid, N, ql, gpu::f32p(g.q_a_norm), cfg_.rms_eps,
                              out->q_resid).code, op);
    MEMRA_GPU(c, op::rms_norm(b, out->ckv, N, R, gpu::f32p(g.kv_a_norm), cfg_.rms_eps,
                              out->ckv).code, op);
    if (idx) {
      MEMRA_GPU(c, op::layer_norm(b, rows.k, N, di, gpu::f32p(g.k_norm_w), gpu::f32p(g.k_norm_b),
                                  kIndexerNormEps, rows.k).code, op);
    }
  }

  gpu::Rounded qr;
  MEMRA_TRY(gpu::round_input(c, a, out->q_resid, N, ql, g.qb_proj.dtype, &qr, op));
  if (fused) {
    MEMRA_TRY(a.take(g.qb_proj.rows, &out->q));  // [1, H * dn | Hi * di]
    MEMRA_GPU(c, gpu::linear_in(c, qr, 1, g.qb_proj, nullptr, out->q), op);
    if (idx) rows.q = out->q + int64_t(H) * dn;
  } else {
    MEMRA_TRY(a.take(int64_t(N) * H * dn, &out->q));
    MEMRA_GPU(c, gpu::linear_in(c, qr, N, g.q_b, nullptr, out->q), op);
    if (idx) {
      MEMRA_TRY(a.take(int64_t(N) * Hi * di, &rows.q));
      MEMRA_GPU(c, gpu::linear_in(c, qr, N, g.wq_b, nullptr, rows.q), op);
    }
  }
  return Status::Ok();
}

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

Status MlaLayer::prefill_cuda(Cache& cache, int layer, int slot, const float* x, int T,
                              const int32_t* topk_in, float* y, int32_t* topk_out) const {
  const CudaContext& c = *cuda_;
  gpu::ResidentWeights resident(c);
  const CudaApi& api = c.api();
  MemraCudaCtx* ctx = c.ctx();
  const op::Backend b{&c};
  const Gpu& g = *gpu_;
  const char* op = "MlaLayer.prefill";
  const int pos = cache.length(slot), end = pos + T;
  const int H = cfg_.heads, R = cfg_.kv_rank, dn = cfg_.d_nope, dv = cfg_.d_v;
  const int W = index_width();
  auto bias = [](const DeviceWeight& w) { return w.buffer ? gpu::f32p(w) : nullptr; };
  gpu::Arena a(cuda_);
  float *q_lat = nullptr, *o_lat = nullptr, *attn = nullptr;
  MEMRA_TRY(a.take(int64_t(T) * H * R, &q_lat));
  MEMRA_TRY(a.take(int64_t(T) * H * R, &o_lat));
  MEMRA_TRY(a.take(int64_t(T) * H * dv, &attn));
  Projected p;
  MEMRA_TRY(project_cuda(a, x, T, &p));
  const float* q = p.q;
  const float* ckv = p.ckv;
  // Latent rows: kv_a_layernorm(kv_a_proj(x)) appended at rows [pos, end).
  void* rows = cache.latent_raw(layer, slot);
  const int cdt = static_cast<int>(cache.latent_dtype());
  MemraMlaAppendParams ap{};
  ap.rows = ckv;
  ap.n = T;
  ap.W = R;
  ap.cache_dtype = cdt;
  ap.cache = rows;
  ap.start = pos;
  MEMRA_TRY(op::mla_latent_append(b, ap));
  MEMRA_TRY(op::mla_proj(b, proj(MEMRA_MLA_ABSORB, q, g.kv_b, T, cfg_, q_lat)));

  MemraMlaAttnParams at{};
  at.rows = cfg_.sparse ? MEMRA_MLA_ROWS_INDEXED : MEMRA_MLA_ROWS_CAUSAL;
  at.q_lat = q_lat;
  at.H = H;
  at.R = R;
  at.scale = 1.0f / std::sqrt(static_cast<float>(dn));
  at.cache_dtype = cdt;
  at.o_lat = o_lat;
  at.cache = rows;
  at.t_q = T;
  at.t_kv = end;
  if (cfg_.sparse) {
    const int32_t* idx = topk_in;
    if (has_indexer()) {
      // The index lists go straight into the caller's topk_out when it wants them (no copy).
      int32_t* own = topk_out;
      if (!own) MEMRA_TRY(a.take(int64_t(T) * W, &own));
      MEMRA_TRY(indexer_cuda(a, cache, layer, slot, pos, p.rows, 0, T, own));
      idx = own;
    }
    at.idx = idx;
    at.width = W;
    MEMRA_TRY(op::mla_attn(b, at));
    if (topk_out && idx != topk_out) {
      MEMRA_GPU(c, api.copy(ctx, topk_out, idx, size_t(T) * W * sizeof(int32_t)), op);
    }
  } else {
    MEMRA_TRY(op::mla_attn(b, at));
  }
  MEMRA_TRY(op::mla_proj(b, proj(MEMRA_MLA_DECOMPRESS, o_lat, g.kv_b, T, cfg_, attn)));
  MEMRA_GPU(c, gpu::linear(c, attn, T, g.o_proj, bias(g.o_bias), y), op);
  return Status::Ok();
}

// One token for each of the B rows of slots_d (device; -1 = idle row): the projections, absorb,
// decompress and output GEMMs run once over the B rows; positions come from the cache's device
// lengths, the latent rows land through one batched append, the DSA indexer runs its batched
// decode forms and the attention is one batched decode launch over per-sequence cache pointers.
// Every launch shape depends on B and the cache's capacity only (never on a length), and nothing
// is copied from the host: the shape a CUDA graph replays. The attention's split over the
// sequence is sized from max_len, so a row's bytes do not depend on the other rows' lengths.
Status MlaLayer::decode_cuda(Cache& cache, int layer, const int32_t* slots_d, int B, const float* x,
                             const int32_t* topk_in, float* y, int32_t* topk_out) const {
  const CudaContext& c = *cuda_;
  gpu::ResidentWeights resident(c);
  const CudaApi& api = c.api();
  MemraCudaCtx* ctx = c.ctx();
  const op::Backend b{&c};
  const Gpu& g = *gpu_;
  const char* op = "MlaLayer.decode";
  const int H = cfg_.heads, R = cfg_.kv_rank, dn = cfg_.d_nope, dv = cfg_.d_v;
  const int W = index_width();
  auto bias = [](const DeviceWeight& w) { return w.buffer ? gpu::f32p(w) : nullptr; };
  gpu::Arena a(cuda_);
  float *q_lat = nullptr, *o_lat = nullptr, *attn = nullptr;
  MEMRA_TRY(a.take(int64_t(B) * H * R, &q_lat));
  MEMRA_TRY(a.take(int64_t(B) * H * R, &o_lat));
  MEMRA_TRY(a.take(int64_t(B) * H * dv, &attn));
  // Per-row positions and plane tables from the device slots (idle rows: pos -1, t_kv 0, null),
  // the indexer's included, in one launch; at B == 1 inside the projections' norm launch, with
  // the latent and k-pool appends (mla_norm_append_decode: four launches fewer on the step's
  // critical path).
  int32_t *pos_d = nullptr, *t_kv_d = nullptr;
  void** caches_d = nullptr;
  MEMRA_TRY(a.take(B, &pos_d));
  MEMRA_TRY(a.take(B, &t_kv_d));
  MEMRA_TRY(a.take(B, &caches_d));
  std::vector<void*> bases;
  std::vector<int64_t> strides;
  std::vector<void**> outs;
  auto table = [&](void* p0, void* p1, void** out) {
    bases.push_back(p0);
    strides.push_back(static_cast<int64_t>(static_cast<uint8_t*>(p1) - static_cast<uint8_t*>(p0)));
    outs.push_back(out);
  };
  table(cache.latent_raw(layer, 0), cache.latent_raw(layer, 1), caches_d);
  const bool indexer = cfg_.sparse && has_indexer();
  IndexerTables tabs;
  if (indexer) {
    MEMRA_TRY(a.take(B, &tabs.tail_k));
    MEMRA_TRY(a.take(B, &tabs.tail_gate));
    MEMRA_TRY(a.take(B, &tabs.pool_keys));
    table(cache.tail_k(layer, 0), cache.tail_k(layer, 1), tabs.tail_k);
    table(cache.tail_gate(layer, 0), cache.tail_gate(layer, 1), tabs.tail_gate);
    table(cache.pool_keys(layer, 0), cache.pool_keys(layer, 1), tabs.pool_keys);
  }
  const int cdt = static_cast<int>(cache.latent_dtype());
  const bool fused = B == 1;
  NormAppend na;
  na.slots = slots_d;
  na.lengths = cache.lengths_d();
  na.pos = pos_d;
  na.t_kv = t_kv_d;
  na.n = static_cast<int>(bases.size());
  na.bases = bases.data();
  na.strides = strides.data();
  na.outs = outs.data();
  na.cache_dtype = cdt;
  Projected p;
  MEMRA_TRY(project_cuda(a, x, B, &p, fused ? &na : nullptr));
  const float* q = p.q;
  if (!fused) {
    const MemraDecodeTablesParams tables{slots_d, B, cache.lengths_d(), pos_d, t_kv_d, na.n,
                                         na.bases, na.strides, na.outs};
    MEMRA_GPU(c, op::decode_tables(b, tables).code, op);
    MemraMlaAppendParams ap{};
    ap.batched = 1;
    ap.rows = p.ckv;
    ap.n = B;
    ap.W = R;
    ap.cache_dtype = cdt;
    ap.caches = caches_d;
    ap.pos = pos_d;
    MEMRA_TRY(op::mla_latent_append(b, ap));
  }
  const int32_t* idx = nullptr;
  Listed listed;
  if (cfg_.sparse) {
    idx = topk_in;
    if (indexer) {
      int32_t* own = topk_out;  // straight into the caller's lists when it wants them
      if (!own) MEMRA_TRY(a.take(int64_t(B) * W, &own));
      // The selection compacts its lists for the attention itself, in its own launch
      // (kpool_select's compact form + mla_attn's LISTED form; its bitmap bounds the length:
      // longer caches take the attention's own compaction).
      const bool compact = cache.max_len() <= MEMRA_SELECT_COMPACT_MAX_ROWS;
      if (compact) {
        MEMRA_TRY(a.take(int64_t(B) * W, &listed.list));
        MEMRA_TRY(a.take(B, &listed.counts));
        listed.t_kv = t_kv_d;
        listed.max_t_kv = cache.max_len();
      }
      MEMRA_TRY(indexer_decode_cuda(a, cache, pos_d, p.rows, tabs, B, fused, own,
                                    compact ? &listed : nullptr));
      idx = own;
    }
  }
  // The absorb after the indexer (which reads none of it): its weight stream, loaded before its
  // wait, then streams under the indexer's latency-bound launches instead of right behind q_b's
  // stream.
  MEMRA_TRY(op::mla_proj(b, proj(MEMRA_MLA_ABSORB, q, g.kv_b, B, cfg_, q_lat)));
  MemraMlaAttnParams at{};
  at.batched = 1;
  at.q_lat = q_lat;
  at.H = H;
  at.R = R;
  at.scale = 1.0f / std::sqrt(static_cast<float>(dn));
  at.cache_dtype = cdt;
  at.o_lat = o_lat;
  at.caches = const_cast<const void* const*>(caches_d);
  at.seq_t_kv = t_kv_d;
  at.B = B;
  at.max_t_kv = cache.max_len();
  if (listed.list) {
    at.rows = MEMRA_MLA_ROWS_LISTED;
    at.list = listed.list;
    at.counts = listed.counts;
    at.width = W;
  } else {
    at.rows = cfg_.sparse ? MEMRA_MLA_ROWS_INDEXED : MEMRA_MLA_ROWS_CAUSAL;
    at.idx = idx;
    at.width = cfg_.sparse ? W : 0;
  }
  MEMRA_TRY(op::mla_attn(b, at));
  if (topk_out && idx && idx != topk_out) {
    MEMRA_GPU(c, api.copy(ctx, topk_out, idx, size_t(B) * W * sizeof(int32_t)), op);
  }
  MEMRA_TRY(op::mla_proj(b, proj(MEMRA_MLA_DECOMPRESS, o_lat, g.kv_b, B, cfg_, attn)));
  MEMRA_GPU(c, gpu::linear(c, attn, B, g.o_proj, bias(g.o_bias), y), op);
  return Status::Ok();
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
