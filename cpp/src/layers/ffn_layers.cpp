// Feed-forward layers (dense SwiGLU MLP, routed MoE with shared expert). References:
// Glm5NextTextMLP, Glm5NextTextMoE (transformers 5.17, modeling_glm5_next.py).
#include <algorithm>
#include <cmath>
#include <vector>

#include "memra/layers.h"

namespace memra {

Status MlpLayer::create(int hidden, int intermediate, float swiglu_limit, WeightMap& w,
                        std::unique_ptr<MlpLayer>* out) {
  if (hidden < 1 || intermediate < 1) {
    return Status(kContractValue, "MlpLayer: hidden and intermediate must be >= 1");
  }
  std::unique_ptr<MlpLayer> l(new MlpLayer());
  l->hidden_ = hidden;
  l->intermediate_ = intermediate;
  l->limit_ = swiglu_limit;
  MEMRA_TRY(w.take("gate_proj.weight", {intermediate, hidden}, &l->gate_));
  MEMRA_TRY(w.take("up_proj.weight", {intermediate, hidden}, &l->up_));
  MEMRA_TRY(w.take("down_proj.weight", {hidden, intermediate}, &l->down_));
  *out = std::move(l);
  return Status::Ok();
}

Status MlpLayer::forward(const float* x, int T, float* y) const {
  if (cuda_) return forward_cuda(x, T, nullptr, y);
  cpu::swiglu_mlp(x, T, gate_, up_, down_, limit_, y);
  return Status::Ok();
}

Status MlpLayer::forward_add(const float* x, int T, const float* add, float* y) const {
  if (cuda_) return forward_cuda(x, T, add, y);
  cpu::swiglu_mlp(x, T, gate_, up_, down_, limit_, y);
  const int64_t n = int64_t(T) * hidden_;
  for (int64_t i = 0; i < n; ++i) y[i] += add[i];
  return Status::Ok();
}

Status MoeLayer::create(const MoeConfig& cfg, WeightMap& w, std::unique_ptr<MoeLayer>* out) {
  if (cfg.hidden < 1 || cfg.n_experts < 1 || cfg.top_k < 1 || cfg.top_k > cfg.n_experts ||
      cfg.n_group < 1 || cfg.n_experts % cfg.n_group || cfg.topk_group < 1 ||
      cfg.topk_group > cfg.n_group || cfg.intermediate < 1) {
    return Status(kContractValue,
                  "MoeLayer: need 1 <= top_k <= n_experts (" + std::to_string(cfg.n_experts) +
                      "), n_experts divisible by n_group (" + std::to_string(cfg.n_group) +
                      "), 1 <= topk_group <= n_group, got top_k=" + std::to_string(cfg.top_k) +
                      ", topk_group=" + std::to_string(cfg.topk_group));
  }
  std::unique_ptr<MoeLayer> l(new MoeLayer());
  l->cfg_ = cfg;
  const int64_t D = cfg.hidden, E = cfg.n_experts, I = cfg.intermediate;
  MEMRA_TRY(w.take("gate.weight", {E, D}, &l->router_));
  if (w.has("gate.e_score_correction_bias")) {
    MEMRA_TRY(w.take_f32("gate.e_score_correction_bias", {E}, &l->corr_bias_));
  }
  l->gate_.resize(E);
  l->up_.resize(E);
  l->down_.resize(E);
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "experts." + std::to_string(e) + ".";
    MEMRA_TRY(w.take(p + "gate_proj.weight", {I, D}, &l->gate_[e]));
    MEMRA_TRY(w.take(p + "up_proj.weight", {I, D}, &l->up_[e]));
    MEMRA_TRY(w.take(p + "down_proj.weight", {D, I}, &l->down_[e]));
  }
  if (cfg.shared_intermediate > 0) {
    std::map<std::string, Weight> shared;
    for (const char* n : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
      Weight t;
      const bool down = std::string(n) == "down_proj.weight";
      MEMRA_TRY(w.take(std::string("shared_experts.") + n,
                       down ? std::vector<int64_t>{D, cfg.shared_intermediate}
                            : std::vector<int64_t>{cfg.shared_intermediate, D},
                       &t));
      shared[n] = t;
    }
    WeightMap sw(std::move(shared), "MoeLayer.shared_experts");
    MEMRA_TRY(MlpLayer::create(cfg.hidden, cfg.shared_intermediate, cfg.swiglu_limit, sw, &l->shared_));
  }
  MEMRA_TRY(w.finish());
  *out = std::move(l);
  return Status::Ok();
}

Status MoeLayer::forward(const float* x, int T, float* y, int32_t* topk_idx) const {
  if (cuda_) return forward_cuda(x, T, y, topk_idx);
  const int D = cfg_.hidden, K = cfg_.top_k;
  std::vector<int32_t> idx(size_t(T) * K);
  std::vector<float> wts(size_t(T) * K);
  cpu::moe_route(x, T, D, router_, corr_bias_.empty() ? nullptr : corr_bias_.data(), cfg_.n_experts,
                 K, cfg_.n_group, cfg_.topk_group, cfg_.norm_topk_prob, cfg_.routed_scaling,
                 idx.data(), wts.data());
  cpu::moe_forward(x, T, D, idx.data(), wts.data(), K, views_of(gate_).data(),
                   views_of(up_).data(), views_of(down_).data(), cfg_.n_experts, cfg_.swiglu_limit, y);
  if (shared_) {
    std::vector<float> s(size_t(T) * D);
    MEMRA_TRY(shared_->forward(x, T, s.data()));
    for (size_t i = 0; i < s.size(); ++i) y[i] += s[i];
  }
  if (topk_idx) std::copy(idx.begin(), idx.end(), topk_idx);
  return Status::Ok();
}

}  // namespace memra
