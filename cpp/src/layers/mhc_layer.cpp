// mHC hyper-connection site: the layer's weights and one op::mhc call a method, on the CPU
// reference or on the CUDA device the weights were moved to. Reference:
// Glm5NextTextHyperConnection (transformers 5.17, modeling_glm5_next.py).
#include <cmath>
#include <optional>
#include <string>

#include "gpu_util.h"
#include "memra/layers.h"
#include "memra/op/mhc.h"

namespace memra {

Status HyperConnection::create(int hidden, int hc, int sinkhorn_iters, float hc_eps, float norm_eps,
                               WeightMap& w, std::unique_ptr<HyperConnection>* out) {
  if (hidden < 1 || hc < 1 || sinkhorn_iters < 1) {
    return Status(kContractValue, "HyperConnection: hidden, hc_mult and hc_sinkhorn_iters must be >= 1");
  }
  MEMRA_TRY(check_sizes("HyperConnection", {{"hidden", hidden}, {"hc_mult", hc}}));
  if (sinkhorn_iters > op::kMaxSinkhornIters) {
    return Status(kContractValue, "HyperConnection: sinkhorn_iters must be in [1, " +
                                      std::to_string(op::kMaxSinkhornIters) + "], got " +
                                      std::to_string(sinkhorn_iters));
  }
  std::unique_ptr<HyperConnection> l(new HyperConnection());
  l->hidden_ = hidden;
  l->hc_ = hc;
  l->iters_ = sinkhorn_iters;
  l->hc_eps_ = hc_eps;
  l->norm_eps_ = norm_eps;
  const int64_t mix = (int64_t(hc) + 2) * hc;
  MEMRA_TRY(w.take("fn", {mix, int64_t(hc) * hidden}, &l->fn_));
  MEMRA_TRY(w.take_f32("base", {mix}, &l->base_));
  MEMRA_TRY(w.take_f32("scale", {3}, &l->scale_));
  MEMRA_TRY(w.finish());
  *out = std::move(l);
  return Status::Ok();
}

// The mapping's weights stay f32 on the device (they are small).
Status HyperConnection::to_device(std::shared_ptr<CudaContext> cuda, DType /*dtype*/) {
  MEMRA_TRY(DeviceWeight::upload(cuda, fn_, DType::kF32, &d_fn_));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, base_, &d_base_));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, scale_, &d_scale_));
  cuda_ = std::move(cuda);
  fn_ = Weight();
  return Status::Ok();
}

MemraMhcParams HyperConnection::site(int T) const {
  MemraMhcParams p = {};
  p.T = T;
  p.hc = hc_;
  p.D = hidden_;
  if (cuda_) {
    p.fn = d_fn_.data();
    p.fn_dtype = d_fn_.dtype_code();
    p.base = gpu::f32p(d_base_);
    p.scale = gpu::f32p(d_scale_);
  } else {
    p.fn = fn_.data();
    p.fn_dtype = static_cast<int>(fn_.dtype());
    p.base = base_.data();
    p.scale = scale_.data();
  }
  p.sinkhorn_iters = iters_;
  p.hc_eps = hc_eps_;
  p.norm_eps = norm_eps_;
  return p;
}

Status HyperConnection::run(const MemraMhcParams& p, const char* method) const {
  std::optional<gpu::ResidentWeights> resident;
  if (cuda_) resident.emplace(*cuda_);
  const Status st = op::mhc(op::Backend{cuda_.get()}, p);
  return st.ok() ? st : Status(st.code, std::string(method) + ": " + st.message);
}

Status HyperConnection::pre(const float* streams, int T, float* post, float* comb, float* collapsed) const {
  MemraMhcParams p = site(T);
  p.pre = 1;
  p.streams = streams;
  p.post = post;
  p.comb = comb;
  p.out = collapsed;
  return run(p, "HyperConnection.pre");
}

Status HyperConnection::pre_norm(const float* streams, int T, const float* rms_w, float rms_eps,
                                 float* post, float* comb, float* out) const {
  if (!(rms_eps >= 0.0f && std::isfinite(rms_eps))) {
    return Status(kContractValue, "HyperConnection.pre: the norm's eps must be finite and >= 0");
  }
  MemraMhcParams p = site(T);
  p.pre = 1;
  p.norm = 1;
  p.streams = streams;
  p.post = post;
  p.comb = comb;
  p.rms_w = rms_w;
  p.rms_eps = rms_eps;
  p.out = out;
  return run(p, "HyperConnection.pre");
}

Status HyperConnection::post_pre_norm(const float* y, const float* post_prev, const float* comb_prev,
                                      const float* residual, int T, const float* rms_w,
                                      float rms_eps, float* streams, float* post, float* comb,
                                      float* out) const {
  if (!(rms_eps >= 0.0f && std::isfinite(rms_eps))) {
    return Status(kContractValue, "HyperConnection.post_pre: the norm's eps must be finite and >= 0");
  }
  const size_t n = size_t(T) * hc_ * hidden_;
  if (n > 0 && streams < residual + n && residual < streams + n) {
    return Status(kContractValue, "HyperConnection.post_pre: the new streams overlap the residual");
  }
  MemraMhcParams p = site(T);
  p.expand = 1;
  p.pre = 1;
  p.norm = 1;
  p.y = y;
  p.post_prev = post_prev;
  p.comb_prev = comb_prev;
  p.residual = residual;
  p.streams_out = streams;
  p.post = post;
  p.comb = comb;
  p.rms_w = rms_w;
  p.rms_eps = rms_eps;
  p.out = out;
  return run(p, "HyperConnection.post_pre");
}

}  // namespace memra
