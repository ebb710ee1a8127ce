// GdnLayer: the Gated DeltaNet mixer over the CPU reference ops (memra/gdn_layer.h). Reference:
// transformers 5.17 Qwen3_5GatedDeltaNet.forward:
//   qkv = in_proj_qkv(x); z = in_proj_z(x); b = in_proj_b(x); a = in_proj_a(x)
//   q | k | v = silu(causal_conv1d(qkv))            (the conv over the 2*Hk*dk + Hv*dv channels)
//   q, k = l2norm(q), l2norm(k)                      (per head, eps 1e-6, inside the scan)
//   beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)
//   o = gated delta rule(q, k, v, g, beta)           (value head h reads key head h // (Hv/Hk))
//   y = out_proj(norm(o, z))                         (w * rmsnorm(o) * silu(z) per value head)
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "host_util.h"
#include "memra/gdn_layer.h"
#include "memra/op/gdn.h"
#include "memra/op/kda.h"

namespace memra {

namespace {

constexpr float kL2Eps = 1e-6f;  // modeling_qwen3_5.l2norm's epsilon; not the norm's rms eps

// The rows `rows` of w, in that order, as a weight of their own (same dtype and bytes).
Weight take_rows(const Weight& w, const std::vector<int64_t>& rows) {
  const size_t row_bytes = size_t(w.cols()) * dtype_size(w.dtype());
  std::vector<uint8_t> bytes(rows.size() * row_bytes);
  const auto* src = static_cast<const uint8_t*>(w.data());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(bytes.data() + i * row_bytes, src + size_t(rows[i]) * row_bytes, row_bytes);
  }
  return Weight(w.dtype(), {int64_t(rows.size()), w.cols()}, bytes.data());
}

}  // namespace

int64_t GdnLayer::conv_channels() const {
  return 2 * int64_t(cfg_.key_heads) * cfg_.key_head_dim + int64_t(cfg_.value_heads) * cfg_.value_head_dim;
}

Status GdnLayer::create(const GdnConfig& cfg, WeightMap& w, std::unique_ptr<GdnLayer>* out) {
  if (cfg.hidden < 1 || cfg.key_heads < 1 || cfg.value_heads < 1 || cfg.key_head_dim < 1 ||
      cfg.value_head_dim < 1) {
    return Status(kContractValue, "GdnLayer: hidden, key_heads, value_heads, key_head_dim and "
                                  "value_head_dim must be >= 1");
  }
  if (cfg.value_heads % cfg.key_heads != 0) {
    return Status(kContractValue, "GdnLayer: value_heads (" + std::to_string(cfg.value_heads) +
                                      ") must be a multiple of key_heads (" +
                                      std::to_string(cfg.key_heads) + ")");
  }
  if (cfg.conv_kernel < 1) {
    return Status(kContractValue,
                  "GdnLayer: conv_kernel must be >= 1, got " + std::to_string(cfg.conv_kernel));
  }
  MEMRA_TRY(check_sizes("GdnLayer", {{"hidden", cfg.hidden}, {"key_heads", cfg.key_heads},
                                     {"value_heads", cfg.value_heads}, {"key_head_dim", cfg.key_head_dim},
                                     {"value_head_dim", cfg.value_head_dim},
                                     {"conv_kernel", cfg.conv_kernel}}));
  std::unique_ptr<GdnLayer> l(new GdnLayer());
  l->cfg_ = cfg;
  const int64_t D = cfg.hidden, Hk = cfg.key_heads, Hv = cfg.value_heads, dk = cfg.key_head_dim,
                dv = cfg.value_head_dim, K = cfg.conv_kernel;
  const int64_t kd = Hk * dk, vd = Hv * dv, C = 2 * kd + vd, r = Hv / Hk;
  l->interleaved_ = w.has("in_proj_qkvz.weight") || w.has("in_proj_ba.weight");
  if (l->interleaved_) {
    // Qwen3-Next: per key head i, rows q_i [dk] | k_i [dk] | v_i [r*dv] | z_i [r*dv] of
    // in_proj_qkvz and b_i [r] | a_i [r] of in_proj_ba (fix_query_key_value_ordering); value
    // head i*r + j is the j-th of group i. Gathered into the Qwen3.5 layout, row by row.
    Weight qkvz, ba;
    MEMRA_TRY(w.take("in_proj_qkvz.weight", {C + vd, D}, &qkvz));
    MEMRA_TRY(w.take("in_proj_ba.weight", {2 * Hv, D}, &ba));
    const int64_t W = 2 * dk + 2 * r * dv;  // rows of one key head's group
    std::vector<int64_t> qkv_rows, z_rows, b_rows, a_rows;
    for (int part = 0; part < 2; ++part) {  // q, then k
      for (int64_t i = 0; i < Hk; ++i) {
        for (int64_t c = 0; c < dk; ++c) qkv_rows.push_back(i * W + part * dk + c);
      }
    }
    for (int64_t i = 0; i < Hk; ++i) {
      for (int64_t c = 0; c < r * dv; ++c) {
        qkv_rows.push_back(i * W + 2 * dk + c);
        z_rows.push_back(i * W + 2 * dk + r * dv + c);
      }
      for (int64_t j = 0; j < r; ++j) {
        b_rows.push_back(i * 2 * r + j);
        a_rows.push_back(i * 2 * r + r + j);
      }
    }
    l->qkv_ = take_rows(qkvz, qkv_rows);
    l->z_ = take_rows(qkvz, z_rows);
    l->b_ = take_rows(ba, b_rows);
    l->a_ = take_rows(ba, a_rows);
  } else {
    MEMRA_TRY(w.take("in_proj_qkv.weight", {C, D}, &l->qkv_));
    MEMRA_TRY(w.take("in_proj_z.weight", {vd, D}, &l->z_));
    MEMRA_TRY(w.take("in_proj_b.weight", {Hv, D}, &l->b_));
    MEMRA_TRY(w.take("in_proj_a.weight", {Hv, D}, &l->a_));
  }
  MEMRA_TRY(w.take_f32("conv1d.weight", {C, 1, K}, &l->conv_w_));  // [C, K]: the ring's order
  MEMRA_TRY(w.take_f32("A_log", {Hv}, &l->a_log_));
  MEMRA_TRY(w.take_f32("dt_bias", {Hv}, &l->dt_bias_));
  MEMRA_TRY(w.take_f32("norm.weight", {dv}, &l->norm_w_));
  MEMRA_TRY(w.take("out_proj.weight", {D, vd}, &l->out_proj_));
  MEMRA_TRY(w.finish());
  *out = std::move(l);
  return Status::Ok();
}

LayerStateSpec GdnLayer::state_spec() const {
  LayerStateSpec s;
  s.kind = LayerStateSpec::Kind::kGdn;
  s.heads = cfg_.value_heads;
  s.head_dim = cfg_.key_head_dim;
  s.key_heads = cfg_.key_heads;
  s.value_dim = cfg_.value_head_dim;
  s.conv_kernel = cfg_.conv_kernel;
  return s;
}

Status GdnLayer::run(const float* x, int T, const float* ring_in, float* ring_out,
                     const float* state_in, float* state_out, float* y) const {
  const op::Backend host;  // the CPU reference
  const int Hk = cfg_.key_heads, Hv = cfg_.value_heads, dk = cfg_.key_head_dim,
            dv = cfg_.value_head_dim, K = cfg_.conv_kernel;
  const int64_t kd = int64_t(Hk) * dk, vd = int64_t(Hv) * dv, C = conv_channels();
  const size_t rows = size_t(T);
  std::vector<float> mixed(rows * C), act(rows * C), z(rows * vd), bl(rows * Hv), al(rows * Hv),
      g(rows * Hv), beta(rows * Hv), o(rows * vd);
  // Projections in the conv's channel order q | k | v (the Qwen3.5 layout; Qwen3-Next's was
  // gathered into it at load), z, and the gates' logits.
  MEMRA_TRY(host::linear(x, T, qkv_, nullptr, mixed.data()));
  MEMRA_TRY(host::linear(x, T, z_, nullptr, z.data()));
  MEMRA_TRY(host::linear(x, T, b_, nullptr, bl.data()));
  MEMRA_TRY(host::linear(x, T, a_, nullptr, al.data()));
  // KDA's conv over the C channels (one group, no fused norm); a null ring_in reads zeros.
  MemraKdaConvParams cp{};
  cp.x = mixed.data();
  cp.n = T;
  cp.C = int(C);
  cp.G = int(C);
  cp.w = conv_w_.data();
  cp.K = K;
  cp.ring.form = MEMRA_KDA_PLANES_DIRECT;
  cp.ring.in = ring_in;
  cp.ring.out = ring_out;
  cp.y = act.data();
  MEMRA_TRY(op::kda_conv(host, cp));
  // q and k are the first 2*Hk heads of dk of each row.
  MEMRA_TRY(op::gdn_l2norm(host, act.data(), T, 2 * Hk, dk, C, kL2Eps));
  const MemraGdnGateParams gp{al.data(), Hv, bl.data(), Hv, dt_bias_.data(), a_log_.data(),
                              T, Hv, g.data(), beta.data()};
  MEMRA_TRY(op::gdn_gate(host, gp));
  // transformers' chunked prefill scales q by dk**-0.5 (a double, applied as an f32 scalar).
  const float scale = static_cast<float>(1.0 / std::sqrt(double(dk)));
  const float* sin[1] = {state_in};
  float* sout[1] = {state_out};
  const MemraGdnScanParams sp{act.data(), act.data() + kd, C, act.data() + 2 * kd, C, g.data(),
                              beta.data(), 1, T, Hk, Hv, dk, dv, scale, sin, sout, o.data(),
                              /*chunked=*/0};
  MEMRA_TRY(op::gdn_scan(host, sp));
  MEMRA_TRY(op::rms_norm_gated_silu(host, o.data(), z.data(), T * Hv, dv, norm_w_.data(),
                                    cfg_.rms_eps, o.data()));
  return host::linear(o.data(), T, out_proj_, nullptr, y);
}

Status GdnLayer::forward(const float* x, int T, float* y) const {
  if (gpu_) {
    return Status(kUnsupported, "GdnLayer.forward: a CUDA layer runs against a Cache (prefill / decode)");
  }
  std::vector<float> ring_out(size_t(conv_channels()) * (cfg_.conv_kernel - 1));
  std::vector<float> state_out(size_t(cfg_.value_heads) * cfg_.key_head_dim * cfg_.value_head_dim);
  return run(x, T, nullptr, ring_out.data(), nullptr, state_out.data(), y);
}

Status GdnLayer::prefill(Cache& cache, int layer, int slot, const float* x, int T, float* y) const {
  MEMRA_TRY(cache.check_layer(layer, state_spec(), "GdnLayer.prefill"));
  MEMRA_TRY(cache.check_device(cuda_, "GdnLayer.prefill"));
  MEMRA_TRY(cache.check_room(slot, T, "GdnLayer.prefill"));
  const int c = cache.cur(slot);
  if (gpu_) {
    Planes p;
    p.ring_in = cache.conv(layer, slot, c);
    p.ring_out = cache.conv(layer, slot, c ^ 1);
    p.state_in = cache.state(layer, slot, c);
    p.state_out = cache.state(layer, slot, c ^ 1);
    return run_cuda(cache, layer, 1, T, p, x, y);
  }
  return run(x, T, cache.conv(layer, slot, c), cache.conv(layer, slot, c ^ 1),
             cache.state(layer, slot, c), cache.state(layer, slot, c ^ 1), y);
}

Status GdnLayer::decode(Cache& cache, int layer, const int32_t* slots, int B, const float* x,
                        float* y) const {
  MEMRA_TRY(cache.check_layer(layer, state_spec(), "GdnLayer.decode"));
  MEMRA_TRY(cache.check_device(cuda_, "GdnLayer.decode"));
  for (int b = 0; b < B; ++b) MEMRA_TRY(cache.check_room(slots[b], 1, "GdnLayer.decode"));
  if (gpu_) {
    int32_t* slots_d = nullptr;
    gpu::Arena a(cuda_);
    MEMRA_TRY(a.upload(std::vector<int32_t>(slots, slots + B), &slots_d));
    return decode_device(cache, layer, slots_d, B, x, y);
  }
  const size_t D = size_t(cfg_.hidden);
  for (int b = 0; b < B; ++b) {
    const int s = slots[b], c = cache.cur(s);
    MEMRA_TRY(run(x + b * D, 1, cache.conv(layer, s, c), cache.conv(layer, s, c ^ 1),
                  cache.state(layer, s, c), cache.state(layer, s, c ^ 1), y + b * D));
  }
  return Status::Ok();
}

}  // namespace memra
