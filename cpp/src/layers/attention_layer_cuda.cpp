// AttentionLayer on a CUDA device: the chain of attention_layer.cpp over the CUDA library (one
// GEMM for q_proj | k_proj | v_proj, then AttentionLayer::attend's ops on the device
// backend, then o_proj). The decode reads every position from the cache's device lengths and
// copies nothing from the host: the shape a captured CUDA graph replays.
#include <vector>

#include "attention_step.h"
#include "gpu_util.h"
#include "memra/attention_layer.h"

namespace memra {

struct AttentionLayer::Gpu {
  DeviceWeight in_proj;   // [Hq * 2 * hd + 2 * Hkv * hd, hidden]: q_proj | k_proj | v_proj rows
  DeviceWeight in_bias;   // f32 [in_proj.rows] (empty: no bias)
  DeviceWeight o_proj;    // [hidden, Hq * hd]
  DeviceWeight o_bias;    // f32 [hidden] (empty: no bias)
  DeviceWeight q_norm, k_norm, inv_freq;  // f32 [hd], [hd], [rotary_dim / 2] (empty when 0)
};

Status AttentionLayer::to_device(std::shared_ptr<CudaContext> cuda, DType dtype) {
  auto g = std::make_shared<Gpu>();
  MEMRA_TRY(DeviceWeight::upload_rows(cuda, {&q_proj_, &k_proj_, &v_proj_}, dtype, &g->in_proj));
  if (!q_bias_.empty() || !k_bias_.empty() || !v_bias_.empty()) {
    // One bias for the fused GEMM: a projection without its own adds zeros.
    std::vector<float> bias;
    for (const auto* part : {&q_bias_, &k_bias_, &v_bias_}) {
      const size_t n = part == &q_bias_ ? q_proj_.rows() : part == &k_bias_ ? k_proj_.rows() : v_proj_.rows();
      if (part->empty()) {
        bias.insert(bias.end(), n, 0.0f);
      } else {
        bias.insert(bias.end(), part->begin(), part->end());
      }
    }
    MEMRA_TRY(DeviceWeight::upload_f32(cuda, bias, &g->in_bias));
  }
  MEMRA_TRY(DeviceWeight::upload(cuda, o_proj_, dtype, &g->o_proj));
  if (!o_bias_.empty()) MEMRA_TRY(DeviceWeight::upload_f32(cuda, o_bias_, &g->o_bias));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, q_norm_, &g->q_norm));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, k_norm_, &g->k_norm));
  if (!inv_freq_.empty()) MEMRA_TRY(DeviceWeight::upload_f32(cuda, inv_freq_, &g->inv_freq));
  gpu_ = std::move(g);
  cuda_ = std::move(cuda);
  q_proj_ = k_proj_ = v_proj_ = o_proj_ = Weight();
  return Status::Ok();
}

namespace {

const float* bias_of(const DeviceWeight& w) { return w.buffer ? gpu::f32p(w) : nullptr; }

}  // namespace

// The step of s.T rows (AttentionLayer::run_cpu's chain): the rows' fields of `s` come from
// prefill / decode (one slot at pos0, or device slots at their device lengths).
Status AttentionLayer::run_cuda(const float* x, Step s, float* y) const {
  const CudaContext& c = *cuda_;
  gpu::ResidentWeights resident(c);
  const Gpu& g = *gpu_;
  const char* op = s.slots ? "AttentionLayer.decode" : "AttentionLayer.prefill";
  const int N = s.T, Hq = cfg_.heads, Hkv = cfg_.kv_heads, hd = cfg_.head_dim;
  const int64_t W = g.in_proj.rows;  // q | gate per head, then k, then v
  gpu::Arena a(cuda_);
  float *proj = nullptr, *q = nullptr, *gate = nullptr, *k = nullptr, *o = nullptr;
  MEMRA_TRY(a.take(int64_t(N) * W, &proj));
  MEMRA_TRY(a.take(int64_t(N) * Hq * hd, &q));
  MEMRA_TRY(a.take(int64_t(N) * Hq * hd, &gate));
  MEMRA_TRY(a.take(int64_t(N) * Hkv * hd, &k));
  MEMRA_TRY(a.take(int64_t(N) * Hq * hd, &o));
  MEMRA_GPU(c, gpu::linear(c, x, N, g.in_proj, bias_of(g.in_bias), proj), op);
  s.qg = proj;
  s.ld_qg = W;
  s.k = proj + int64_t(Hq) * 2 * hd;
  s.ld_k = W;
  s.v = s.k + int64_t(Hkv) * hd;
  s.ld_v = W;
  s.q = q;
  s.gate = gate;
  s.k_out = k;
  s.o = o;
  MEMRA_TRY(attend(op::Backend{cuda_.get()}, s, gpu::f32p(g.q_norm), gpu::f32p(g.k_norm),
                   bias_of(g.inv_freq)));
  MEMRA_GPU(c, gpu::linear(c, o, N, g.o_proj, bias_of(g.o_bias), y), op);
  return Status::Ok();
}

}  // namespace memra
