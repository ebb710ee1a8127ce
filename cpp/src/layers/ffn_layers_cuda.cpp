// MlpLayer and MoeLayer on a CUDA device (ffn_layers.cpp's chains over the CUDA library's ops).
// Routers and correction biases stay f32 (the router logits are f32 in the reference).
#include <vector>

#include "gpu_util.h"
#include "memra/layers.h"
#include "memra/op/mlp.h"
#include "memra/op/moe.h"

namespace memra {

// ------------------------------------------------------------------------------------ MlpLayer
// gate and up go up as one weight [2I, hidden] (upload_rows converts each from its own file
// dtype): up's rows follow gate's in memory, and swiglu_mlp then runs them as one GEMM with
// N = 2I.
Status MlpLayer::to_device(std::shared_ptr<CudaContext> cuda, DType dtype) {
  MEMRA_TRY(DeviceWeight::upload_rows(cuda, {&gate_, &up_}, dtype, &d_gate_up_));
  MEMRA_TRY(DeviceWeight::upload(cuda, down_, dtype, &d_down_));
  cuda_ = std::move(cuda);
  gate_ = up_ = down_ = Weight();
  return Status::Ok();
}

MlpLayer::DeviceView MlpLayer::device_view() const {
  DeviceView v;
  const char* gate = static_cast<const char*>(d_gate_up_.data());
  v.gate = gate;
  v.up = gate + size_t(intermediate_) * size_t(hidden_) * dtype_size(d_gate_up_.dtype);
  v.down = d_down_.data();
  v.dtype = d_gate_up_.dtype_code();
  v.intermediate = intermediate_;
  v.limit = limit_;
  return v;
}

Status MlpLayer::forward_cuda(const float* x, int T, const float* add, float* y) const {
  gpu::ResidentWeights resident(*cuda_);
  const DeviceView v = device_view();
  MemraMlpParams p{};
  p.x = x;
  p.T = T;
  p.D = hidden_;
  p.gate_w = v.gate;
  p.up_w = v.up;
  p.down_w = v.down;
  p.w_dtype = v.dtype;
  p.I = intermediate_;
  p.limit = limit_;
  p.add = add;
  p.y = y;
  return op::swiglu_mlp(op::Backend{cuda_.get()}, p);
}

// ------------------------------------------------------------------------------------ MoeLayer
Status MoeLayer::to_device(std::shared_ptr<CudaContext> cuda, DType dtype) {
  MEMRA_TRY(DeviceWeight::upload(cuda, router_, DType::kF32, &d_router_));
  if (!corr_bias_.empty()) MEMRA_TRY(DeviceWeight::upload_f32(cuda, corr_bias_, &d_corr_));
  if (!shared_gate_.empty()) MEMRA_TRY(DeviceWeight::upload_f32(cuda, shared_gate_, &d_shared_gate_));
  std::vector<const Weight*> g, u, d;
  for (int e = 0; e < cfg_.n_experts; ++e) {
    g.push_back(&gate_[e]);
    u.push_back(&up_[e]);
    d.push_back(&down_[e]);
  }
  MEMRA_TRY(DeviceWeight::upload_stacked(cuda, g, dtype, &d_gate_));
  MEMRA_TRY(DeviceWeight::upload_stacked(cuda, u, dtype, &d_up_));
  MEMRA_TRY(DeviceWeight::upload_stacked(cuda, d, dtype, &d_down_));
  if (shared_) MEMRA_TRY(shared_->to_device(cuda, dtype));
  cuda_ = std::move(cuda);
  gate_.clear();
  up_.clear();
  down_.clear();
  return Status::Ok();
}

Status MoeLayer::forward_cuda(const float* x, int T, float* y, int32_t* topk_idx) const {
  gpu::ResidentWeights resident(*cuda_);
  const op::Backend b{cuda_.get()};
  const int D = cfg_.hidden, K = cfg_.top_k;
  gpu::Arena a(cuda_);
  // The chosen experts go straight into the caller's topk_idx when it wants them (no copy).
  int32_t* idx = topk_idx;
  float* wts = nullptr;
  if (!idx) MEMRA_TRY(a.take(int64_t(T) * K, &idx));
  MEMRA_TRY(a.take(int64_t(T) * K, &wts));
  MemraMoeRouteParams r{};
  r.x = x;
  r.T = T;
  r.D = D;
  r.gate_w = gpu::f32p(d_router_);
  r.corr_bias = d_corr_.buffer ? gpu::f32p(d_corr_) : nullptr;
  r.E = cfg_.n_experts;
  r.top_k = K;
  r.n_group = cfg_.n_group;
  r.topk_group = cfg_.topk_group;
  r.norm_topk_prob = cfg_.norm_topk_prob ? 1 : 0;
  r.scaling = cfg_.routed_scaling;
  r.topk_idx = idx;
  r.topk_w = wts;
  r.scoring = cfg_.scoring;
  MEMRA_TRY(op::moe_route(b, r));
  MemraMoeForwardParams f{};
  f.x = x;
  f.T = T;
  f.D = D;
  f.topk_idx = idx;
  f.topk_w = wts;
  f.top_k = K;
  f.gate_w = d_gate_.data();
  f.up_w = d_up_.data();
  f.down_w = d_down_.data();
  f.w_dtype = d_gate_.dtype_code();
  f.E = cfg_.n_experts;
  f.I = cfg_.intermediate;
  f.limit = cfg_.swiglu_limit;
  f.y = y;
  if (cfg_.shared_gate) {
    // Qwen: the routed sum into y, then y += sigmoid(x . shared_expert_gate) * shared(x).
    MEMRA_TRY(op::moe_forward(b, f));
    return shared_gated_cuda(x, T, y);
  }
  // With a shared expert: y = shared + routed in one op (at decode rows the shared expert is one
  // more slot of the expert kernels; otherwise the routed sum rides into y on the shared
  // expert's down projection).
  if (shared_) {
    const MlpLayer::DeviceView s = shared_->device_view();
    f.shared_gate_w = s.gate;
    f.shared_up_w = s.up;
    f.shared_down_w = s.down;
    f.shared_I = s.intermediate;
    f.shared_limit = s.limit;
  }
  return op::moe_forward(b, f);
}

}  // namespace memra

namespace memra {

// The gated shared expert (MoeConfig::shared_gate) added to the routed sum already in y: the
// shared expert's MLP into scratch, then moe_shared_gate in place.
Status MoeLayer::shared_gated_cuda(const float* x, int T, float* y) const {
  gpu::Arena a(cuda_);
  float* shared = nullptr;
  MEMRA_TRY(a.take(int64_t(T) * cfg_.hidden, &shared));
  MEMRA_TRY(shared_->forward(x, T, shared));
  MemraMoeSharedGateParams g{};
  g.x = x;
  g.T = T;
  g.D = cfg_.hidden;
  g.gate_w = gpu::f32p(d_shared_gate_);
  g.shared = shared;
  g.routed = y;
  g.y = y;
  return op::moe_shared_gate(op::Backend{cuda_.get()}, g);
}

}  // namespace memra
