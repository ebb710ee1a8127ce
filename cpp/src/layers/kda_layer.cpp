// KdaLayer: the KDA mixer over the CPU reference ops (the KDA ones through memra::op on the CPU
// backend, op/kda.h). Reference: transformers Glm5NextTextLinearAttention.forward (glm5_next),
// KimiDeltaAttention (kimi_linear).
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "host_util.h"
#include "memra/layers.h"
#include "memra/op/basic.h"
#include "memra/op/kda.h"

namespace memra {

namespace {
constexpr float kL2Eps = 1e-6f;  // FLA's l2norm epsilon, inside the sqrt; not the rms eps
}

Status KdaLayer::create(const KdaConfig& cfg, WeightMap& w, std::unique_ptr<KdaLayer>* out) {
  if (cfg.hidden < 1 || cfg.heads < 1 || cfg.head_dim < 1) {
    return Status(kContractValue, "KdaLayer: hidden, heads and head_dim must be >= 1");
  }
  if (cfg.conv_kernel < 1) {
    return Status(kContractValue,
                  "KdaLayer: conv_kernel must be >= 1, got " + std::to_string(cfg.conv_kernel));
  }
  MEMRA_TRY(check_sizes("KdaLayer", {{"hidden", cfg.hidden}, {"heads", cfg.heads},
                                     {"head_dim", cfg.head_dim}, {"conv_kernel", cfg.conv_kernel}}));
  std::unique_ptr<KdaLayer> l(new KdaLayer());
  l->cfg_ = cfg;
  const int64_t D = cfg.hidden, H = cfg.heads, dk = cfg.head_dim, qkv = H * dk, K = cfg.conv_kernel;
  MEMRA_TRY(w.take("q_proj.weight", {qkv, D}, &l->q_proj_));
  MEMRA_TRY(w.take("k_proj.weight", {qkv, D}, &l->k_proj_));
  MEMRA_TRY(w.take("v_proj.weight", {qkv, D}, &l->v_proj_));
  // The CPU chain and the ops count the fused conv's channels in int.
  if (3 * qkv > INT_MAX) {
    return Status(kContractValue, "KdaLayer: 3 * heads * head_dim (the conv's channels) must be "
                                  "below 2^31, got " + std::to_string(3 * qkv));
  }
  const char* names[3] = {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"};
  std::vector<float> planes[3];
  // On disk each plane is [qkv, 1, K]; fused they are the rows p*qkv.. of [3*qkv, K], which is
  // also the plane's offset in the conv ring. Taken first, so the fused buffer is only sized
  // once the planes it holds exist.
  for (int p = 0; p < 3; ++p) MEMRA_TRY(w.take_f32(names[p], {qkv, 1, K}, &planes[p]));
  l->conv_w_.resize(size_t(3 * qkv * K));
  for (int p = 0; p < 3; ++p) {
    std::copy(planes[p].begin(), planes[p].end(), l->conv_w_.begin() + p * qkv * K);
  }
  MEMRA_TRY(w.take("f_a_proj.weight", {dk, D}, &l->f_a_));
  MEMRA_TRY(w.take("f_b_proj.weight", {qkv, dk}, &l->f_b_));
  MEMRA_TRY(w.take_f32("dt_bias", {qkv}, &l->dt_bias_));
  MEMRA_TRY(w.take_f32("A_log", {H}, &l->a_log_));
  MEMRA_TRY(w.take("b_proj.weight", {H, D}, &l->b_proj_));
  MEMRA_TRY(w.take("g_a_proj.weight", {dk, D}, &l->g_a_));
  MEMRA_TRY(w.take("g_b_proj.weight", {qkv, dk}, &l->g_b_));
  MEMRA_TRY(w.take_f32("o_norm.weight", {dk}, &l->o_norm_));
  MEMRA_TRY(w.take("o_proj.weight", {D, qkv}, &l->o_proj_));
  MEMRA_TRY(w.finish());
  *out = std::move(l);
  return Status::Ok();
}

LayerStateSpec KdaLayer::state_spec() const {
  LayerStateSpec s;
  s.kind = LayerStateSpec::Kind::kKda;
  s.heads = cfg_.heads;
  s.head_dim = cfg_.head_dim;
  s.conv_kernel = cfg_.conv_kernel;
  return s;
}

Status KdaLayer::run(const float* x, int T, const float* ring_in, float* ring_out,
                     const float* state_in, float* state_out, float* y) const {
  const op::Backend cpu;  // the CPU reference backend
  const int H = cfg_.heads, dk = cfg_.head_dim, qkv = H * dk, C = 3 * qkv, K = cfg_.conv_kernel;
  const size_t Tq = size_t(T) * qkv;
  // Projections into the fused channel order q | k | v per token (the conv's channel order).
  std::vector<float> proj(Tq), mixed(size_t(T) * C);
  const Weight* w3[3] = {&q_proj_, &k_proj_, &v_proj_};
  for (int p = 0; p < 3; ++p) {
    MEMRA_TRY(host::linear(x, T, *w3[p], nullptr, proj.data()));
    for (int t = 0; t < T; ++t) {
      std::copy_n(proj.data() + size_t(t) * qkv, qkv, mixed.data() + size_t(t) * C + p * qkv);
    }
  }
  // The causal conv + SiLU (a null ring_in reads zeros), split by the group width qkv into q, k
  // and v [T, qkv] one after another, q and k L2-normalised per head.
  std::vector<float> act(size_t(T) * C);
  MemraKdaConvParams cp{};
  cp.x = mixed.data();
  cp.n = T;
  cp.C = C;
  cp.G = qkv;
  cp.w = conv_w_.data();
  cp.K = K;
  cp.ring.form = MEMRA_KDA_PLANES_DIRECT;
  cp.ring.in = ring_in;
  cp.ring.out = ring_out;
  cp.y = act.data();
  cp.l2_groups = 2;
  cp.dk = dk;
  cp.eps = kL2Eps;
  MEMRA_TRY(op::kda_conv(cpu, cp));
  const float* q = act.data();
  const float* k = q + Tq;
  const float* v = k + Tq;

  // Forget gate (raw log gate) and beta, beta's sigmoid in the gate's call.
  std::vector<float> low(size_t(T) * dk), g(Tq), beta(size_t(T) * H);
  MEMRA_TRY(host::linear(x, T, f_a_, nullptr, low.data()));
  MEMRA_TRY(host::linear(low.data(), T, f_b_, nullptr, g.data()));
  MEMRA_TRY(host::linear(x, T, b_proj_, nullptr, beta.data()));
  const MemraKdaGateParams gp{g.data(), dt_bias_.data(), a_log_.data(), T, H, dk,
                              static_cast<int>(cfg_.gate_form), cfg_.lower_bound, g.data(),
                              beta.data(), int64_t(T) * H};
  MEMRA_TRY(op::kda_gate(cpu, gp));

  // The delta-rule scan, one sequence: its planes as one-entry tables (a null state_in: zeros).
  std::vector<float> o(Tq);
  const float* state_in_table[1] = {state_in};
  float* state_out_table[1] = {state_out};
  MemraKdaScanParams sp{};
  sp.q = q;
  sp.k = k;
  sp.v = v;
  sp.g = g.data();
  sp.beta = beta.data();
  sp.B = 1;
  sp.T = T;
  sp.H = H;
  sp.dk = dk;
  sp.dv = dk;
  sp.scale = 1.0f / std::sqrt(static_cast<float>(dk));
  sp.state.form = MEMRA_KDA_PLANES_TABLES;
  sp.state.in_table = state_in_table;
  sp.state.out_table = state_out_table;
  sp.o = o.data();
  MEMRA_TRY(op::kda_scan(cpu, sp));

  // Output gate, sigmoid-gated RMSNorm per head, output projection.
  std::vector<float> gate(Tq);
  MEMRA_TRY(host::linear(x, T, g_a_, nullptr, low.data()));
  MEMRA_TRY(host::linear(low.data(), T, g_b_, nullptr, gate.data()));
  MEMRA_TRY(op::rms_norm_gated_sigmoid(cpu, o.data(), gate.data(), T * H, dk, o_norm_.data(),
                                       cfg_.rms_eps, o.data()));
  return host::linear(o.data(), T, o_proj_, nullptr, y);
}

Status KdaLayer::forward(const float* x, int T, float* y) const {
  if (gpu_) return Status(kUnsupported, "KdaLayer.forward: a CUDA layer runs against a Cache (prefill / decode)");
  const int64_t C = 3 * int64_t(cfg_.heads) * cfg_.head_dim;
  std::vector<float> ring_out(size_t(C) * (cfg_.conv_kernel - 1));
  std::vector<float> state_out(size_t(cfg_.heads) * cfg_.head_dim * cfg_.head_dim);
  return run(x, T, nullptr, ring_out.data(), nullptr, state_out.data(), y);
}

Status KdaLayer::prefill(Cache& cache, int layer, int slot, const float* x, int T, float* y) const {
  MEMRA_TRY(cache.check_layer(layer, state_spec(), "KdaLayer.prefill"));
  MEMRA_TRY(cache.check_device(cuda_, "KdaLayer.prefill"));
  MEMRA_TRY(cache.check_room(slot, T, "KdaLayer.prefill"));
  if (gpu_) return prefill_cuda(cache, layer, slot, x, T, y);
  const int c = cache.cur(slot);
  return run(x, T, cache.conv(layer, slot, c), cache.conv(layer, slot, c ^ 1),
             cache.state(layer, slot, c), cache.state(layer, slot, c ^ 1), y);
}

Status KdaLayer::decode(Cache& cache, int layer, const int32_t* slots, int B, const float* x,
                        float* y) const {
  MEMRA_TRY(cache.check_layer(layer, state_spec(), "KdaLayer.decode"));
  MEMRA_TRY(cache.check_device(cuda_, "KdaLayer.decode"));
  for (int b = 0; b < B; ++b) MEMRA_TRY(cache.check_room(slots[b], 1, "KdaLayer.decode"));
  if (gpu_) {
    int32_t* slots_d = nullptr;
    gpu::Arena a(cuda_);
    MEMRA_TRY(a.upload(std::vector<int32_t>(slots, slots + B), &slots_d));
    return decode_device(cache, layer, slots_d, B, x, y);
  }
  for (int b = 0; b < B; ++b) {
    const int s = slots[b], c = cache.cur(s);
    MEMRA_TRY(run(x + size_t(b) * cfg_.hidden, 1, cache.conv(layer, s, c),
                  cache.conv(layer, s, c ^ 1), cache.state(layer, s, c), cache.state(layer, s, c ^ 1),
                  y + size_t(b) * cfg_.hidden));
  }
  return Status::Ok();
}

}  // namespace memra
