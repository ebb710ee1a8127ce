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

// slots [B] (host); prefill: B == 1 and T tokens; decode: T == 1 and B sequences.
Status KdaLayer::run_cuda(Cache& cache, int layer, const int32_t* slots, int B, int T,
                          const float* x, float* y) const {
  const CudaContext& c = *cuda_;
  const CudaApi& api = c.api();
  MemraCudaCtx* ctx = c.ctx();
  const Gpu& g = *gpu_;
  const int H = cfg_.heads, dk = cfg_.head_dim, qkv = H * dk, K = cfg_.conv_kernel;
  const int N = B * T;
  const char* op = T > 1 || B == 1 ? "KdaLayer.prefill" : "KdaLayer.decode";
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

  // Projections and the causal conv + SiLU per channel group.
  const int64_t ring_plane = int64_t(qkv) * (K - 1);
  std::vector<const float*> ring_in(size_t(3) * B), state_in(B);
  std::vector<float*> ring_out(size_t(3) * B), state_out(B);
  for (int b = 0; b < B; ++b) {
    const int cur = cache.cur(slots[b]);
    for (int p = 0; p < 3; ++p) {
      ring_in[size_t(p) * B + b] = cache.conv(layer, slots[b], cur) + p * ring_plane;
      ring_out[size_t(p) * B + b] = cache.conv(layer, slots[b], cur ^ 1) + p * ring_plane;
    }
    state_in[b] = cache.state(layer, slots[b], cur);
    state_out[b] = cache.state(layer, slots[b], cur ^ 1);
  }
  const float* conv_w = gpu::f32p(g.conv_w);
  for (int p = 0; p < 3; ++p) {
    MEMRA_GPU(c, gpu::linear(c, x, N, g.proj[p], nullptr, raw[p]), op);
    const float* w = conv_w + int64_t(p) * qkv * K;
    if (B == 1) {
      MEMRA_GPU(c, api.kda_conv_prefill(ctx, raw[p], T, qkv, w, K, ring_in[p], ring_out[p], act[p]), op);
    } else {
      const float** rin;
      float** rout;
      MEMRA_TRY(a.upload(std::vector<const float*>(ring_in.begin() + p * B, ring_in.begin() + (p + 1) * B), &rin));
      MEMRA_TRY(a.upload(std::vector<float*>(ring_out.begin() + p * B, ring_out.begin() + (p + 1) * B), &rout));
      MEMRA_GPU(c, api.kda_conv_decode(ctx, raw[p], B, qkv, w, K, rin, rout, act[p]), op);
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
  const float** sin;
  float** sout;
  MEMRA_TRY(a.upload(state_in, &sin));
  MEMRA_TRY(a.upload(state_out, &sout));
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  MEMRA_GPU(c, api.kda_scan(ctx, act[0], act[1], act[2], gate_f, beta, B, T, H, dk, dk, scale, sin,
                            sout, o), op);

  // Output gate, sigmoid-gated RMSNorm per head, output projection.
  MEMRA_GPU(c, gpu::linear(c, x, N, g.g_a, nullptr, low), op);
  MEMRA_GPU(c, gpu::linear(c, low, N, g.g_b, nullptr, gate_o), op);
  MEMRA_GPU(c, api.rms_norm_gated_sigmoid(ctx, o, gate_o, N * H, dk, gpu::f32p(g.o_norm), cfg_.rms_eps, o), op);
  MEMRA_GPU(c, gpu::linear(c, o, N, g.o_proj, nullptr, y), op);
  return Status::Ok();
}

}  // namespace memra
