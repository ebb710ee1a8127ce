// KdaLayer on a CUDA device: the same chain as KdaLayer::run (kda_layer.cpp) over the CUDA
// library's ops. q, k and v are projected and convolved as three channel groups (the conv is
// depthwise, so the fused ring's planes p*qkv.. are independent), which keeps each of them a
// contiguous [N, H, dk] tensor for the L2 norm and the scan.
#include <cmath>
#include <vector>

#include "gpu_util.h"
#include "memra/layers.h"

namespace memra {

namespace {
constexpr float kL2Eps = 1e-6f;  // as kda_layer.cpp
}

struct KdaLayer::Gpu {
  DeviceWeight proj[3];  // q, k, v projections [qkv, D] in the compute dtype
  DeviceWeight f_a, f_b, b_proj, g_a, g_b, o_proj;
  DeviceWeight conv_w;                  // [3*qkv, K] f32
  DeviceWeight dt_bias, a_log, o_norm;  // f32
};

Status KdaLayer::to_device(std::shared_ptr<CudaContext> cuda, DType dtype) {
  if (cfg_.head_dim != 128) {
    return Status(kUnsupportedGeometry, "KdaLayer: the CUDA kernels are instantiated for head_dim 128, got " +
                                            std::to_string(cfg_.head_dim) + " (the CPU backend runs it)");
  }
  if (cfg_.conv_kernel < 2 || cfg_.conv_kernel > 8) {
    return Status(kUnsupportedGeometry, "KdaLayer: the CUDA conv kernel is instantiated for conv_kernel 2..8, got " +
                                            std::to_string(cfg_.conv_kernel) + " (the CPU backend runs it)");
  }
  auto g = std::make_shared<Gpu>();
  const Weight* p3[3] = {&q_proj_, &k_proj_, &v_proj_};
  for (int p = 0; p < 3; ++p) MEMRA_TRY(DeviceWeight::upload(cuda, *p3[p], dtype, &g->proj[p]));
  MEMRA_TRY(DeviceWeight::upload(cuda, f_a_, dtype, &g->f_a));
  MEMRA_TRY(DeviceWeight::upload(cuda, f_b_, dtype, &g->f_b));
  MEMRA_TRY(DeviceWeight::upload(cuda, b_proj_, dtype, &g->b_proj));
  MEMRA_TRY(DeviceWeight::upload(cuda, g_a_, dtype, &g->g_a));
  MEMRA_TRY(DeviceWeight::upload(cuda, g_b_, dtype, &g->g_b));
  MEMRA_TRY(DeviceWeight::upload(cuda, o_proj_, dtype, &g->o_proj));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, conv_w_, &g->conv_w));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, dt_bias_, &g->dt_bias));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, a_log_, &g->a_log));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, o_norm_, &g->o_norm));
  gpu_ = std::move(g);
  cuda_ = std::move(cuda);
  // The host copies are no longer used; drop them (a real model's weights live once, on the GPU).
  q_proj_ = k_proj_ = v_proj_ = f_a_ = f_b_ = b_proj_ = g_a_ = g_b_ = o_proj_ = Weight();
  return Status::Ok();
}

// The recurrent planes the N = B * T rows read and write: a prefill (B == 1) names the slot's
// planes directly; a decode step (T == 1) names its rows' slots on the device (slots_d [B],
// -1 = idle row) and the tables are built there from the cache's ping-pong flags, so nothing in
// the step depends on host-side cache state (the shape a CUDA graph replays).
struct KdaLayer::Planes {
  const float* ring_in = nullptr;
  float* ring_out = nullptr;
  const float* state_in = nullptr;
  float* state_out = nullptr;
  const int32_t* slots_d = nullptr;
};

Status KdaLayer::prefill_cuda(Cache& cache, int layer, int slot, const float* x, int T,
                              float* y) const {
  const int cur = cache.cur(slot);
  Planes p;
  p.ring_in = cache.conv(layer, slot, cur);
  p.ring_out = cache.conv(layer, slot, cur ^ 1);
  p.state_in = cache.state(layer, slot, cur);
  p.state_out = cache.state(layer, slot, cur ^ 1);
  return run_cuda(cache, layer, 1, T, p, x, y);
}

Status KdaLayer::decode_device(Cache& cache, int layer, const int32_t* slots_d, int B,
                               const float* x, float* y) const {
  MEMRA_TRY(cache.check_layer(layer, state_spec(), "KdaLayer.decode"));
  MEMRA_TRY(cache.check_device(cuda_, "KdaLayer.decode"));
  if (!gpu_) return Status(kUnsupported, "KdaLayer.decode: device slots need a CUDA layer");
  Planes p;
  p.slots_d = slots_d;
  return run_cuda(cache, layer, B, 1, p, x, y);
}

Status KdaLayer::run_cuda(Cache& cache, int layer, int B, int T, const Planes& planes,
                          const float* x, float* y) const {
  const CudaContext& c = *cuda_;
  const CudaApi& api = c.api();
  MemraCudaCtx* ctx = c.ctx();
  const Gpu& g = *gpu_;
  const int H = cfg_.heads, dk = cfg_.head_dim, qkv = H * dk, K = cfg_.conv_kernel;
  const int N = B * T;
  const bool decode = planes.slots_d != nullptr;
  const char* op = decode ? "KdaLayer.decode" : "KdaLayer.prefill";
  gpu::Arena a(cuda_);
  float *raw[3], *act[3], *low, *gate_f, *beta, *o, *gate_o;
  for (int p = 0; p < 3; ++p) {
    MEMRA_TRY(a.take(int64_t(N) * qkv, &raw[p]));
    MEMRA_TRY(a.take(int64_t(N) * qkv, &act[p]));
  }
  MEMRA_TRY(a.take(int64_t(N) * dk, &low));
  MEMRA_TRY(a.take(int64_t(N) * qkv, &gate_f));
  MEMRA_TRY(a.take(int64_t(N) * H, &beta));
  MEMRA_TRY(a.take(int64_t(N) * qkv, &o));
  MEMRA_TRY(a.take(int64_t(N) * qkv, &gate_o));

  // Decode: the rows' pointer tables, built on the device (idle rows get null entries, which
  // the conv and the scan read as zeros and never write).
  const float** ring_in[3] = {nullptr, nullptr, nullptr};
  float** ring_out[3] = {nullptr, nullptr, nullptr};
  const float** state_in = nullptr;
  float** state_out = nullptr;
  if (decode) {
    const LayerStateSpec spec = state_spec();
    const int64_t ring_plane = int64_t(qkv) * (K - 1);
    for (int p = 0; p < 3; ++p) {
      const float** sin;
      float** sout;
      MEMRA_TRY(a.take(B, &ring_in[p]));
      MEMRA_TRY(a.take(B, &ring_out[p]));
      MEMRA_TRY(a.take(B, &sin));
      MEMRA_TRY(a.take(B, &sout));
      MEMRA_GPU(c, api.kda_tables(ctx, planes.slots_d, cache.cur_d(), B, cache.conv(layer, 0, 0),
                                  cache.conv(layer, 0, 1), cache.state(layer, 0, 0),
                                  cache.state(layer, 0, 1), spec.conv_floats(), spec.state_floats(),
                                  p * ring_plane, ring_in[p], ring_out[p], sin, sout, nullptr,
                                  nullptr), op);
      if (p == 0) {
        state_in = sin;
        state_out = sout;
      }
    }
  }

  // Projections and the causal conv + SiLU per channel group.
  const int64_t ring_plane = int64_t(qkv) * (K - 1);
  const float* conv_w = gpu::f32p(g.conv_w);
  for (int p = 0; p < 3; ++p) {
    MEMRA_GPU(c, gpu::linear(c, x, N, g.proj[p], nullptr, raw[p]), op);
    const float* w = conv_w + int64_t(p) * qkv * K;
    if (decode) {
      MEMRA_GPU(c, api.kda_conv_decode(ctx, raw[p], B, qkv, w, K, ring_in[p], ring_out[p], act[p]), op);
    } else {
      MEMRA_GPU(c, api.kda_conv_prefill(ctx, raw[p], T, qkv, w, K,
                                        planes.ring_in ? planes.ring_in + p * ring_plane : nullptr,
                                        planes.ring_out + p * ring_plane, act[p]), op);
    }
  }
  MEMRA_GPU(c, api.l2norm_heads(ctx, act[0], N, H, dk, kL2Eps), op);
  MEMRA_GPU(c, api.l2norm_heads(ctx, act[1], N, H, dk, kL2Eps), op);

  // Forget gate (raw log gate) and beta.
  MEMRA_GPU(c, gpu::linear(c, x, N, g.f_a, nullptr, low), op);
  MEMRA_GPU(c, gpu::linear(c, low, N, g.f_b, nullptr, gate_f), op);
  MEMRA_GPU(c, api.kda_gate(ctx, gate_f, gpu::f32p(g.dt_bias), gpu::f32p(g.a_log), N, H, dk,
                            static_cast<int>(cfg_.gate_form), cfg_.lower_bound, gate_f), op);
  MEMRA_GPU(c, gpu::linear(c, x, N, g.b_proj, nullptr, beta), op);
  MEMRA_GPU(c, api.sigmoid(ctx, beta, int64_t(N) * H, beta), op);

  // The delta-rule scan: B sequences of T steps, state planes cur -> 1 - cur.
  if (!decode) {
    const float** sin;
    float** sout;
    MEMRA_TRY(a.upload(std::vector<const float*>{planes.state_in}, &sin));
    MEMRA_TRY(a.upload(std::vector<float*>{planes.state_out}, &sout));
    state_in = sin;
    state_out = sout;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  MEMRA_GPU(c, api.kda_scan(ctx, act[0], act[1], act[2], gate_f, beta, B, T, H, dk, dk, scale,
                            state_in, state_out, o), op);

  // Output gate, sigmoid-gated RMSNorm per head, output projection.
  MEMRA_GPU(c, gpu::linear(c, x, N, g.g_a, nullptr, low), op);
  MEMRA_GPU(c, gpu::linear(c, low, N, g.g_b, nullptr, gate_o), op);
  MEMRA_GPU(c, api.rms_norm_gated_sigmoid(ctx, o, gate_o, N * H, dk, gpu::f32p(g.o_norm), cfg_.rms_eps, o), op);
  MEMRA_GPU(c, gpu::linear(c, o, N, g.o_proj, nullptr, y), op);
  return Status::Ok();
}

}  // namespace memra
