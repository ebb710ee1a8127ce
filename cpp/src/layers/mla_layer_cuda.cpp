// MlaLayer on a CUDA device: the chain of MlaLayer::prefill / MlaLayer::indexer (mla_layer.cpp)
// over the CUDA library's ops: a prefill of one sequence, a decode step of B sequences in one
// batched chain. Both query forms (q_a / q_b with query LoRA, glm5_next; q_proj without,
// Kimi-Linear) and unrotated rope columns (d_rope > 0: Kimi-Linear; cache rows [latent | k_pe],
// scores plus q_pe . k_pe) run here; rotated rope columns (rotate with d_rope > 0) do not.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "mla_layer_gpu.h"
#include "memra/layers.h"
#include "memra/op/basic.h"
#include "memra/op/dsa.h"
#include "memra/op/graph_tables.h"
#include "memra/op/mla.h"

namespace memra {

namespace {
constexpr float kIndexerNormEps = 1e-6f;  // as mla_layer.cpp

// The query weight's rows [H * (d_nope + d_rope), K] regrouped as every head's d_nope rows, then
// every head's d_rope rows: its GEMM's output is then [q_nope | q_pe] with both parts contiguous
// (what mla_absorb_q and mla_attn read) instead of the heads' interleaved [nope, rope] columns.
void split_heads(const Weight& w, int H, int dn, int dr, Weight* nope, Weight* pe) {
  const size_t row = static_cast<size_t>(w.cols()) * dtype_size(w.dtype());
  const auto* src = static_cast<const uint8_t*>(w.data());
  std::vector<uint8_t> a(size_t(H) * dn * row), b(size_t(H) * dr * row);
  for (int h = 0; h < H; ++h) {
    const uint8_t* head = src + size_t(h) * (dn + dr) * row;
    std::memcpy(a.data() + size_t(h) * dn * row, head, size_t(dn) * row);
    std::memcpy(b.data() + size_t(h) * dr * row, head + size_t(dn) * row, size_t(dr) * row);
  }
  *nope = Weight(w.dtype(), {int64_t(H) * dn, w.cols()}, a.data());
  *pe = Weight(w.dtype(), {int64_t(H) * dr, w.cols()}, b.data());
}

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

Status MlaLayer::to_device(std::shared_ptr<CudaContext> cuda, DType dtype) {
  const int H = cfg_.heads, dn = cfg_.d_nope, dr = cfg_.d_rope;
  const bool lora = cfg_.q_lora_rank > 0;
  if (cfg_.rotate && dr > 0) {
    return Status(kUnsupportedGeometry,
                  "MlaLayer: the CUDA path does not rotate rope columns (rotate with d_rope " +
                      std::to_string(dr) + "); the CPU backend runs it");
  }
  auto g = std::make_shared<Gpu>();
  // The query weight, regrouped [q_nope rows | q_pe rows] when it has rope columns.
  const Weight& qw = lora ? q_b_ : q_proj_;
  Weight q_nope_w, q_pe_w;
  std::vector<const Weight*> q = {&qw};
  if (dr > 0) {
    split_heads(qw, H, dn, dr, &q_nope_w, &q_pe_w);
    q = {&q_nope_w, &q_pe_w};
  }
  std::vector<const Weight*> in, qb;
  if (lora) {
    in = {&q_a_, &kv_a_};
    qb = q;
  } else {
    in = q;
    in.push_back(&kv_a_);
  }
  if (has_indexer()) {
    in.insert(in.end(), {&wk_, &kpool_gate_, &weights_proj_});
    qb.push_back(&wq_b_);
  }
  MEMRA_TRY(DeviceWeight::upload_rows(cuda, in, dtype, &g->in_proj));
  if (lora) MEMRA_TRY(DeviceWeight::upload_rows(cuda, qb, dtype, &g->qb_proj));
  int64_t r = 0;
  auto view = [&](const DeviceWeight& w, const Weight& part) {
    DeviceWeight v = w.row_view(r, part.rows());
    r += part.rows();
    return v;
  };
  // The query rows: q_b's d_nope part and (rope) its q_pe part, in in_proj or qb_proj.
  auto query = [&](const DeviceWeight& w) {
    g->q_b = view(w, *q[0]);
    if (dr > 0) g->q_pe = view(w, *q[1]);
  };
  if (lora) {
    g->q_a = view(g->in_proj, q_a_);
  } else {
    query(g->in_proj);
  }
  g->kv_a = view(g->in_proj, kv_a_);
  if (has_indexer()) {
    g->wk = view(g->in_proj, wk_);
    g->kpool_gate = view(g->in_proj, kpool_gate_);
    g->weights_proj = view(g->in_proj, weights_proj_);
  }
  if (lora) {
    r = 0;
    query(g->qb_proj);
    if (has_indexer()) g->wq_b = view(g->qb_proj, wq_b_);
  }
  MEMRA_TRY(DeviceWeight::upload(cuda, kv_b_, dtype, &g->kv_b));
  MEMRA_TRY(DeviceWeight::upload(cuda, o_proj_, dtype, &g->o_proj));
  if (!q_a_bias_.empty()) MEMRA_TRY(DeviceWeight::upload_f32(cuda, q_a_bias_, &g->q_a_bias));
  if (!kv_a_bias_.empty()) MEMRA_TRY(DeviceWeight::upload_f32(cuda, kv_a_bias_, &g->kv_a_bias));
  if (!o_bias_.empty()) MEMRA_TRY(DeviceWeight::upload_f32(cuda, o_bias_, &g->o_bias));
  if (lora) MEMRA_TRY(DeviceWeight::upload_f32(cuda, q_a_norm_, &g->q_a_norm));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, kv_a_norm_, &g->kv_a_norm));
  if (has_indexer()) {
    MEMRA_TRY(DeviceWeight::upload_f32(cuda, k_norm_w_, &g->k_norm_w));
    MEMRA_TRY(DeviceWeight::upload_f32(cuda, k_norm_b_, &g->k_norm_b));
    MEMRA_TRY(DeviceWeight::upload_f32(cuda, kpool_ape_, &g->kpool_ape));
  }
  gpu_ = std::move(g);
  cuda_ = std::move(cuda);
  q_a_ = q_b_ = q_proj_ = kv_a_ = kv_b_ = o_proj_ = wq_b_ = wk_ = weights_proj_ = kpool_gate_ =
      Weight();
  return Status::Ok();
}

// The input projections of N rows (MlaLayer::prefill's chain up to the latent rows):
//   q_resid = q_a_layernorm(q_a_proj(x)) [N, ql], q = q_b_proj(q_resid) [N, H * d_nope] (without
//   query LoRA q = q_proj(x)), with rope columns q_pe [N, H * d_rope] the query's rope part,
//   ckv = [kv_a_layernorm(latent) | k_pe] [N, R + d_rope] (kv_a_proj_with_mqa's rows, the norm
//   over the first R columns, k_pe raw), and with an own indexer its rows: q = wq_b(q_resid),
//   k = k_norm(wk(x)), gate = kpool_gate(x), w = weights_proj(x).
// x is rounded to the compute dtype once, q_resid once (at N == 1 inside each GEMV instead,
// gpu::round_input). N == 1 without biases (a decode step of one sequence): x's GEMMs are one
// GEMM over in_proj and q_resid's one over qb_proj, a row's outputs being contiguous column
// blocks of theirs (at T = 1 a GEMM pays a fixed ramp: one large GEMM costs less than five small
// ones; the GEMV's sum order is fixed by K alone, so the fusion changes no byte). N > 1: one GEMM
// per projection over the row views (the column blocks of N rows interleave).
Status MlaLayer::project_cuda(gpu::Arena& a, const float* x, int N, Projected* out,
                              const NormAppend* append) const {
  const CudaContext& c = *cuda_;
  const op::Backend b{&c};
  const Gpu& g = *gpu_;
  const char* op = "MlaLayer projections";
  const int H = cfg_.heads, R = cfg_.kv_rank, dn = cfg_.d_nope, dr = cfg_.d_rope;
  const int ql = cfg_.q_lora_rank, row = R + dr;
  const int Hi = cfg_.index_heads, di = cfg_.index_head_dim;
  const bool idx = has_indexer(), lora = ql > 0;
  auto bias = [](const DeviceWeight& w) { return w.buffer ? gpu::f32p(w) : nullptr; };
  const bool fused = N == 1 && !g.q_a_bias.buffer && !g.kv_a_bias.buffer;
  IndexerRows& rows = out->rows;

  gpu::Rounded xr;
  MEMRA_TRY(gpu::round_input(c, a, x, N, cfg_.hidden, g.in_proj.dtype, &xr, op));
  if (fused) {
    // [1, ql | R + dr | di | di | Hi], or without query LoRA [1, H * dn | H * dr | R + dr]
    float* in_out = nullptr;
    MEMRA_TRY(a.take(g.in_proj.rows, &in_out));
    MEMRA_GPU(c, gpu::linear_in(c, xr, 1, g.in_proj, nullptr, in_out), op);
    if (lora) {
      out->q_resid = in_out;
      out->ckv = in_out + ql;
    } else {
      out->q = in_out;
      out->q_pe = dr > 0 ? in_out + int64_t(H) * dn : nullptr;
      out->ckv = in_out + int64_t(H) * (dn + dr);
    }
    if (idx) {
      rows.k = out->ckv + row;
      rows.gate = rows.k + di;
      rows.w = rows.gate + di;
    }
  } else {
    if (lora) {
      MEMRA_TRY(a.take(int64_t(N) * ql, &out->q_resid));
      MEMRA_TRY(a.take(int64_t(N) * row, &out->ckv));
      MEMRA_GPU(c, gpu::linear_in(c, xr, N, g.q_a, bias(g.q_a_bias), out->q_resid), op);
    } else {
      MEMRA_TRY(a.take(int64_t(N) * H * dn, &out->q));
      MEMRA_TRY(a.take(int64_t(N) * row, &out->ckv));
      MEMRA_GPU(c, gpu::linear_in(c, xr, N, g.q_b, nullptr, out->q), op);
      if (dr > 0) {
        MEMRA_TRY(a.take(int64_t(N) * H * dr, &out->q_pe));
        MEMRA_GPU(c, gpu::linear_in(c, xr, N, g.q_pe, nullptr, out->q_pe), op);
      }
    }
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
    // The fused prologue appends latent-only rows after a q_resid norm (decode_cuda routes any
    // other form to the unfused calls).
    if (!lora || dr != 0) {
      return Status(kUnsupportedGeometry,
                    std::string(op) + ": the fused decode prologue needs query LoRA and no rope "
                                      "columns");
    }
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
    // One row: the latent norm over its first R columns leaves k_pe as it is. Without query
    // LoRA q_resid is null: no q row.
    const MemraNormRowsParams norms{out->q_resid, lora ? ql : 0,
                                    lora ? gpu::f32p(g.q_a_norm) : nullptr, cfg_.rms_eps,
                                    out->q_resid, out->ckv, R, gpu::f32p(g.kv_a_norm),
                                    cfg_.rms_eps, out->ckv, idx ? rows.k : nullptr, idx ? di : 0,
                                    idx ? gpu::f32p(g.k_norm_w) : nullptr,
                                    idx ? gpu::f32p(g.k_norm_b) : nullptr, kIndexerNormEps,
                                    idx ? rows.k : nullptr};
    MEMRA_GPU(c, op::norm_rows(b, norms).code, op);
  } else {
    if (lora) {
      MEMRA_GPU(c, op::rms_norm(b, out->q_resid, N, ql, gpu::f32p(g.q_a_norm), cfg_.rms_eps,
                                out->q_resid).code, op);
    }
    if (dr == 0) {
      MEMRA_GPU(c, op::rms_norm(b, out->ckv, N, R, gpu::f32p(g.kv_a_norm), cfg_.rms_eps,
                                out->ckv).code, op);
    } else {
      // The norm reads contiguous rows: the latent columns out and back (strided copies).
      float* lat = nullptr;
      MEMRA_TRY(a.take(int64_t(N) * R, &lat));
      const size_t lat_b = sizeof(float) * size_t(R), row_b = sizeof(float) * size_t(row);
      MEMRA_GPU(c, c.api().copy_2d(c.ctx(), lat, lat_b, out->ckv, row_b, lat_b, size_t(N)), op);
      MEMRA_GPU(c, op::rms_norm(b, lat, N, R, gpu::f32p(g.kv_a_norm), cfg_.rms_eps, lat).code, op);
      MEMRA_GPU(c, c.api().copy_2d(c.ctx(), out->ckv, row_b, lat, lat_b, lat_b, size_t(N)), op);
    }
    if (idx) {
      MEMRA_GPU(c, op::layer_norm(b, rows.k, N, di, gpu::f32p(g.k_norm_w), gpu::f32p(g.k_norm_b),
                                  kIndexerNormEps, rows.k).code, op);
    }
  }
  if (!lora) return Status::Ok();

  gpu::Rounded qr;
  MEMRA_TRY(gpu::round_input(c, a, out->q_resid, N, ql, g.qb_proj.dtype, &qr, op));
  if (fused) {
    MEMRA_TRY(a.take(g.qb_proj.rows, &out->q));  // [1, H * dn | H * dr | Hi * di]
    MEMRA_GPU(c, gpu::linear_in(c, qr, 1, g.qb_proj, nullptr, out->q), op);
    if (dr > 0) out->q_pe = out->q + int64_t(H) * dn;
    if (idx) rows.q = out->q + int64_t(H) * (dn + dr);
  } else {
    MEMRA_TRY(a.take(int64_t(N) * H * dn, &out->q));
    MEMRA_GPU(c, gpu::linear_in(c, qr, N, g.q_b, nullptr, out->q), op);
    if (dr > 0) {
      MEMRA_TRY(a.take(int64_t(N) * H * dr, &out->q_pe));
      MEMRA_GPU(c, gpu::linear_in(c, qr, N, g.q_pe, nullptr, out->q_pe), op);
    }
    if (idx) {
      MEMRA_TRY(a.take(int64_t(N) * Hi * di, &rows.q));
      MEMRA_GPU(c, gpu::linear_in(c, qr, N, g.wq_b, nullptr, rows.q), op);
    }
  }
  return Status::Ok();
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
  const int H = cfg_.heads, R = cfg_.kv_rank, dn = cfg_.d_nope, dv = cfg_.d_v, dr = cfg_.d_rope;
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
  // Cache rows [kv_a_layernorm(latent) | k_pe] appended at rows [pos, end).
  void* rows = cache.latent_raw(layer, slot);
  const int cdt = static_cast<int>(cache.latent_dtype());
  MemraMlaAppendParams ap{};
  ap.rows = ckv;
  ap.n = T;
  ap.W = R + dr;
  ap.cache_dtype = cdt;
  ap.cache = rows;
  ap.start = pos;
  MEMRA_TRY(op::mla_latent_append(b, ap));
  MEMRA_TRY(op::mla_proj(b, proj(MEMRA_MLA_ABSORB, q, g.kv_b, T, cfg_, q_lat)));

  MemraMlaAttnParams at{};
  at.rows = cfg_.sparse ? MEMRA_MLA_ROWS_INDEXED : MEMRA_MLA_ROWS_CAUSAL;
  at.q_lat = q_lat;
  at.q_pe = p.q_pe;
  at.H = H;
  at.R = R;
  at.d_rope = dr;
  at.scale = 1.0f / std::sqrt(static_cast<float>(dn + dr));  // qk_head_dim ** -0.5
  at.cache_dtype = cdt;
  at.o_lat = o_lat;
  at.cache = rows;
  at.t_q = T;
  at.t_kv = end;
  at.tensor_cores = cdt == static_cast<int>(DType::kBF16) ? 1 : 0;  // bf16 models
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
  const int H = cfg_.heads, R = cfg_.kv_rank, dn = cfg_.d_nope, dv = cfg_.d_v, dr = cfg_.d_rope;
  const int W = index_width();
  auto bias = [](const DeviceWeight& w) { return w.buffer ? gpu::f32p(w) : nullptr; };
  gpu::Arena a(cuda_);
  float *q_lat = nullptr, *o_lat = nullptr, *attn = nullptr;
  MEMRA_TRY(a.take(int64_t(B) * H * R, &q_lat));
  MEMRA_TRY(a.take(int64_t(B) * H * R, &o_lat));
  MEMRA_TRY(a.take(int64_t(B) * H * dv, &attn));
  // Per-row positions and plane tables from the device slots (idle rows: pos -1, t_kv 0, null),
  // the indexer's included, in one launch; at B == 1 with query LoRA and no rope columns
  // (glm5_next) inside the projections' norm launch, with the latent and k-pool appends
  // (mla_norm_append_decode: four launches fewer on the step's critical path).
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
  const bool fused = B == 1 && cfg_.q_lora_rank > 0 && dr == 0;
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
    ap.W = R + dr;
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
  at.q_pe = p.q_pe;
  at.H = H;
  at.R = R;
  at.d_rope = dr;
  at.scale = 1.0f / std::sqrt(static_cast<float>(dn + dr));  // qk_head_dim ** -0.5
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

}  // namespace memra
