// MlpLayer and MoeLayer on a CUDA device (ffn_layers.cpp's chains over the CUDA library's ops).
// Routers and correction biases stay f32 (the router logits are f32 in the reference).
#include <vector>

#include "gpu_util.h"
#include "memra/layers.h"

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
  const CudaContext& c = *cuda_;
  gpu::ResidentWeights resident(c);
  const DeviceView v = device_view();
  MEMRA_GPU(c, c.api().swiglu_mlp_add(c.ctx(), x, T, hidden_, v.gate, v.up, v.down, v.dtype,
                                      intermediate_, limit_, add, y),
            "MlpLayer.forward");
  return Status::Ok();
}

// ------------------------------------------------------------------------------------ MoeLayer
Status MoeLayer::to_device(std::shared_ptr<CudaContext> cuda, DType dtype) {
  MEMRA_TRY(DeviceWeight::upload(cuda, router_, DType::kF32, &d_router_));
  if (!corr_bias_.empty()) MEMRA_TRY(DeviceWeight::upload_f32(cuda, corr_bias_, &d_corr_));
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
  const CudaContext& c = *cuda_;
  gpu::ResidentWeights resident(c);
  const char* op = "MoeLayer.forward";
  const int D = cfg_.hidden, K = cfg_.top_k;
  gpu::Arena a(cuda_);
  // The chosen experts go straight into the caller's topk_idx when it wants them (no copy).
  int32_t* idx = topk_idx;
  float* wts;
  if (!idx) MEMRA_TRY(a.take(int64_t(T) * K, &idx));
  MEMRA_TRY(a.take(int64_t(T) * K, &wts));
  MEMRA_GPU(c, c.api().moe_route(c.ctx(), x, T, D, gpu::f32p(d_router_),
                                 d_corr_.buffer ? gpu::f32p(d_corr_) : nullptr, cfg_.n_experts, K,
                                 cfg_.n_group, cfg_.topk_group, cfg_.norm_topk_prob ? 1 : 0,
                                 cfg_.routed_scaling, idx, wts), op);
  // With a shared expert: y = shared + routed in one op (at decode rows the shared expert is one
  // more slot of the expert kernels; otherwise the routed sum rides into y on the shared
  // expert's down projection).
  if (shared_) {
    const MlpLayer::DeviceView s = shared_->device_view();
    MEMRA_GPU(c, c.api().moe_forward_shared(c.ctx(), x, T, D, idx, wts, K, d_gate_.data(),
                                            d_up_.data(), d_down_.data(), d_gate_.dtype_code(),
                                            cfg_.n_experts, cfg_.intermediate, cfg_.swiglu_limit,
                                            s.gate, s.up, s.down, s.intermediate, s.limit, y), op);
    return Status::Ok();
  }
  MEMRA_GPU(c, c.api().moe_forward(c.ctx(), x, T, D, idx, wts, K, d_gate_.data(), d_up_.data(),
                                   d_down_.data(), d_gate_.dtype_code(), cfg_.n_experts,
                                   cfg_.intermediate, cfg_.swiglu_limit, y), op);
  return Status::Ok();
}

}  // namespace memra
