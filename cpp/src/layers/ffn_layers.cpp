// Feed-forward layers (dense SwiGLU MLP, routed MoE with shared expert). References:
// Glm5NextTextMLP, Glm5NextTextMoE (transformers 5.17, modeling_glm5_next.py); the Qwen MoE's
// softmax router and shared-expert gate: Qwen3_5MoeSparseMoeBlock, Qwen3NextSparseMoeBlock. The FFN layers run
// their ops through memra::op (op/mlp.h, op/moe.h) on either backend; the mHC site is in
// mhc_layer.cpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "memra/layers.h"
#include "memra/op/mlp.h"
#include "memra/op/moe.h"

namespace memra {

namespace {

// A weight widened to f32 (exact: the CPU reference reads every dtype as f32 anyway).
Weight widened(const Weight& w) { return Weight(DType::kF32, w.shape(), w.to_f32().data()); }

}  // namespace

Status MlpLayer::create(int hidden, int intermediate, float swiglu_limit, WeightMap& w,
                        std::unique_ptr<MlpLayer>* out) {
  if (hidden < 1 || intermediate < 1) {
    return Status(kContractValue, "MlpLayer: hidden and intermediate must be >= 1");
  }
  MEMRA_TRY(check_sizes("MlpLayer", {{"hidden", hidden}, {"intermediate", intermediate}}));
  std::unique_ptr<MlpLayer> l(new MlpLayer());
  l->hidden_ = hidden;
  l->intermediate_ = intermediate;
  l->limit_ = swiglu_limit;
  MEMRA_TRY(w.take("gate_proj.weight", {intermediate, hidden}, &l->gate_));
  MEMRA_TRY(w.take("up_proj.weight", {intermediate, hidden}, &l->up_));
  MEMRA_TRY(w.take("down_proj.weight", {hidden, intermediate}, &l->down_));
  // The op reads one MLP's weights in one dtype (MemraMlpParams::w_dtype): a checkpoint that mixes
  // them is read as f32.
  if (l->up_.dtype() != l->gate_.dtype() || l->down_.dtype() != l->gate_.dtype()) {
    for (Weight* t : {&l->gate_, &l->up_, &l->down_}) *t = widened(*t);
  }
  *out = std::move(l);
  return Status::Ok();
}

Status MlpLayer::forward(const float* x, int T, float* y) const {
  return forward_add(x, T, nullptr, y);
}

Status MlpLayer::forward_add(const float* x, int T, const float* add, float* y) const {
  if (cuda_) return forward_cuda(x, T, add, y);
  MemraMlpParams p{};
  p.x = x;
  p.T = T;
  p.D = hidden_;
  p.gate_w = gate_.data();
  p.up_w = up_.data();
  p.down_w = down_.data();
  p.w_dtype = static_cast<int>(gate_.dtype());
  p.I = intermediate_;
  p.limit = limit_;
  p.add = add;
  p.y = y;
  return op::swiglu_mlp(op::Backend{}, p);
}

Status MoeLayer::create(const MoeConfig& cfg, WeightMap& w, std::unique_ptr<MoeLayer>* out) {
  // The sizes first, each named: the routing message below states only the routing rules.
  for (const auto& [name, value] : {std::pair<const char*, int>{"hidden", cfg.hidden},
                                    {"n_experts", cfg.n_experts}, {"intermediate", cfg.intermediate}}) {
    if (value < 1) {
      return Status(kContractValue, std::string("MoeLayer: ") + name + " must be >= 1, got " +
                                        std::to_string(value));
    }
  }
  if (cfg.top_k < 1 || cfg.top_k > cfg.n_experts || cfg.n_group < 1 || cfg.n_experts % cfg.n_group ||
      cfg.topk_group < 1 || cfg.topk_group > cfg.n_group) {
    return Status(kContractValue,
                  "MoeLayer: need 1 <= top_k <= n_experts (" + std::to_string(cfg.n_experts) +
                      "), n_experts divisible by n_group (" + std::to_string(cfg.n_group) +
                      "), 1 <= topk_group <= n_group, got top_k=" + std::to_string(cfg.top_k) +
                      ", topk_group=" + std::to_string(cfg.topk_group));
  }
  // The grouped router keeps the topk_group best groups and picks top_k experts among them
  // (moe_route refuses a top_k past those at every call: refused once, here).
  if (cfg.top_k > cfg.topk_group * (cfg.n_experts / cfg.n_group)) {
    return Status(kContractValue, "MoeLayer: top_k (" + std::to_string(cfg.top_k) + ") exceeds the " +
                                      std::to_string(cfg.topk_group * (cfg.n_experts / cfg.n_group)) +
                                      " experts of the topk_group (" + std::to_string(cfg.topk_group) +
                                      ") groups the router keeps");
  }
  MEMRA_TRY(check_sizes("MoeLayer", {{"hidden", cfg.hidden}, {"n_experts", cfg.n_experts},
                                     {"intermediate", cfg.intermediate},
                                     {"shared_intermediate", cfg.shared_intermediate}}));
  if (cfg.scoring != MEMRA_MOE_SCORE_SIGMOID && cfg.scoring != MEMRA_MOE_SCORE_SOFTMAX) {
    return Status(kContractValue, "MoeLayer: unknown router scoring " + std::to_string(cfg.scoring));
  }
  if (cfg.scoring == MEMRA_MOE_SCORE_SOFTMAX && cfg.n_group != 1) {
    return Status(kContractValue, "MoeLayer: the softmax router takes no expert groups, got n_group=" +
                                      std::to_string(cfg.n_group));
  }
  std::unique_ptr<MoeLayer> l(new MoeLayer());
  l->cfg_ = cfg;
  // A zero-width shared expert adds nothing (its gate scales a zero vector): the layer is one
  // without a shared expert, gated or not.
  if (cfg.shared_intermediate == 0) l->cfg_.shared_gate = false;
  const int64_t D = cfg.hidden, E = cfg.n_experts, I = cfg.intermediate;
  MEMRA_TRY(w.take("gate.weight", {E, D}, &l->router_));
  // Router logits are f32 (MemraMoeRouteParams::gate_w), as in the reference.
  if (l->router_.dtype() != DType::kF32) l->router_ = widened(l->router_);
  // The sigmoid router's reference registers the bias as a buffer and every release carries it:
  // a checkpoint without it is broken (zeros would choose other experts), so it is required.
  if (cfg.scoring == MEMRA_MOE_SCORE_SIGMOID) {
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
  // The shared expert's tensors at its width S. transformers builds a zero-width shared MLP for
  // n_shared_experts = 0 / shared_expert_intermediate_size = 0 and save_pretrained writes its
  // empty tensors (and Qwen's [1, hidden] gate): at S = 0 they are optional, taken at their
  // shapes when present, then dropped.
  const int64_t S = cfg.shared_intermediate;
  std::map<std::string, Weight> shared;
  for (const char* n : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
    const std::string name = std::string("shared_experts.") + n;
    if (S == 0 && !w.has(name)) continue;
    const bool down = std::string(n) == "down_proj.weight";
    MEMRA_TRY(w.take(name, down ? std::vector<int64_t>{D, S} : std::vector<int64_t>{S, D}, &shared[n]));
  }
  if (S > 0) {
    WeightMap sw(std::move(shared), "MoeLayer.shared_experts");
    MEMRA_TRY(MlpLayer::create(cfg.hidden, cfg.shared_intermediate, cfg.swiglu_limit, sw, &l->shared_));
  }
  std::vector<float> dropped_gate;
  if (cfg.shared_gate && (S > 0 || w.has("shared_expert_gate.weight"))) {
    MEMRA_TRY(w.take_f32("shared_expert_gate.weight", {1, D}, S > 0 ? &l->shared_gate_ : &dropped_gate));
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
  MemraMoeRouteParams r{};
  r.x = x;
  r.T = T;
  r.D = D;
  r.gate_w = static_cast<const float*>(router_.data());
  r.corr_bias = corr_bias_.empty() ? nullptr : corr_bias_.data();
  r.E = cfg_.n_experts;
  r.top_k = K;
  r.n_group = cfg_.n_group;
  r.topk_group = cfg_.topk_group;
  r.norm_topk_prob = cfg_.norm_topk_prob ? 1 : 0;
  r.scaling = cfg_.routed_scaling;
  r.topk_idx = idx.data();
  r.topk_w = wts.data();
  r.scoring = cfg_.scoring;
  MEMRA_TRY(op::moe_route(op::Backend{}, r));
  // The experts as loaded, one weight each (no stacked copy on the host).
  const std::vector<WeightView> g = views_of(gate_), u = views_of(up_), d = views_of(down_);
  const op::HostExperts experts{g.data(), u.data(), d.data()};
  // With a shared expert: the routed sum first, then y = shared(x) + it (MlpLayer::forward_add).
  std::vector<float> routed(shared_ ? size_t(T) * D : 0);
  MemraMoeForwardParams f{};
  f.x = x;
  f.T = T;
  f.D = D;
  f.topk_idx = idx.data();
  f.topk_w = wts.data();
  f.top_k = K;
  f.w_dtype = static_cast<int>(gate_[0].dtype());
  f.E = cfg_.n_experts;
  f.I = cfg_.intermediate;
  f.limit = cfg_.swiglu_limit;
  f.y = shared_ ? routed.data() : y;
  MEMRA_TRY(op::moe_forward(op::Backend{}, f, &experts));
  if (shared_ && cfg_.shared_gate) {
    // Qwen: y = routed + sigmoid(x . shared_expert_gate) * shared(x).
    std::vector<float> shared(size_t(T) * D);
    MEMRA_TRY(shared_->forward(x, T, shared.data()));
    MemraMoeSharedGateParams g{};
    g.x = x;
    g.T = T;
    g.D = D;
    g.gate_w = shared_gate_.data();
    g.shared = shared.data();
    g.routed = routed.data();
    g.y = y;
    MEMRA_TRY(op::moe_shared_gate(op::Backend{}, g));
  } else if (shared_) {
    MEMRA_TRY(shared_->forward_add(x, T, routed.data(), y));
  }
  if (topk_idx) std::copy(idx.begin(), idx.end(), topk_idx);
  return Status::Ok();
}

}  // namespace memra
