// GdnLayer on a CUDA device: GdnLayer::run's chain (gdn_layer.cpp) over the CUDA library's ops:
// - x rounded to the compute dtype once for the GEMMs that read it; z, b and a uploaded as one
//   [Hv*dv + 2*Hv, hidden] weight (z's rows, then b's, then a's: b's logits at columns [0, Hv) of
//   ba's rows, a's at [Hv, 2*Hv)); at one row q | k | v and z | b | a in one launch
//   (MemraLinearParams::pair: the same bytes as separate GEMVs, whose order depends on K alone),
//   z and b | a then adjacent in one output row; at more rows q | k | v with z (the pair form)
//   and b | a, over row views of the joint weight;
// - the causal conv over the 2*Hk*dk + Hv*dv channels is KDA's (op::kda_conv, any channel
//   count): a prefill names the slot's planes (DIRECT), a decode step finds each row's ring and
//   state planes from the device slots and the cache's ping-pong flags (op::kda_tables, one
//   launch; then TABLES), so nothing in the step depends on host-side cache state and it can be
//   captured into a CUDA graph and replayed at any position; an idle row (slot -1) reads zeros
//   and writes no state;
// - q and k L2-normalised in place in the conv's output (its first 2*Hk heads of each row), the
//   gates (one launch, op::gdn_l2norm_gate), the scan (reading q, k and v where the conv left
//   them), the SiLU-gated norm and out_proj: one op each (memra::op, op/gdn.h).
#include <cmath>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "memra/gdn_layer.h"
#include "memra/op/gdn.h"
#include "memra/op/kda.h"

namespace memra {

namespace {

constexpr float kL2Eps = 1e-6f;  // as gdn_layer.cpp

// KDA's conv over GDN's q | k | v channels: n rows of C, one channel group (G = C: y plain
// [n, C]), no fused L2 norm or GEMV pair; the caller names the ring planes.
MemraKdaConvParams conv_params(const float* x, int n, int C, const float* w, int K, float* y) {
  MemraKdaConvParams p{};
  p.x = x;
  p.n = n;
  p.C = C;
  p.G = C;
  p.w = w;
  p.K = K;
  p.y = y;
  return p;
}

}  // namespace

struct GdnLayer::Gpu {
  DeviceWeight qkv;      // in_proj_qkv [C, hidden], compute dtype
  DeviceWeight zba;      // in_proj_z | in_proj_b | in_proj_a [Hv*dv + 2*Hv, hidden]
  DeviceWeight z;        // row view of zba: in_proj_z [Hv*dv, hidden]
  DeviceWeight ba;       // row view of zba: in_proj_b | in_proj_a [2*Hv, hidden]
  DeviceWeight out_proj;  // [hidden, Hv*dv]
  DeviceWeight conv_w, dt_bias, a_log, norm_w;  // f32
};

Status GdnLayer::to_device(std::shared_ptr<CudaContext> cuda, DType dtype) {
  if (cfg_.key_head_dim != 128 || cfg_.value_head_dim != 128) {
    return Status(kUnsupportedGeometry,
                  "GdnLayer: the CUDA scan is instantiated for key_head_dim = value_head_dim = 128, "
                  "got " + std::to_string(cfg_.key_head_dim) + " and " +
                      std::to_string(cfg_.value_head_dim) + " (the CPU backend runs it)");
  }
  if (cfg_.conv_kernel < 2 || cfg_.conv_kernel > 8) {
    return Status(kUnsupportedGeometry,
                  "GdnLayer: the CUDA conv kernel is instantiated for conv_kernel 2..8, got " +
                      std::to_string(cfg_.conv_kernel) + " (the CPU backend runs it)");
  }
  auto g = std::make_shared<Gpu>();
  MEMRA_TRY(DeviceWeight::upload(cuda, qkv_, dtype, &g->qkv));
  MEMRA_TRY(DeviceWeight::upload_rows(cuda, {&z_, &b_, &a_}, dtype, &g->zba));
  const int64_t vd_rows = int64_t(cfg_.value_heads) * cfg_.value_head_dim;
  g->z = g->zba.row_view(0, vd_rows);
  g->ba = g->zba.row_view(vd_rows, 2 * int64_t(cfg_.value_heads));
  MEMRA_TRY(DeviceWeight::upload(cuda, out_proj_, dtype, &g->out_proj));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, conv_w_, &g->conv_w));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, dt_bias_, &g->dt_bias));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, a_log_, &g->a_log));
  MEMRA_TRY(DeviceWeight::upload_f32(cuda, norm_w_, &g->norm_w));
  gpu_ = std::move(g);
  cuda_ = std::move(cuda);
  // The host copies are no longer used; drop them (a real model's weights live once, on the GPU).
  qkv_ = z_ = b_ = a_ = out_proj_ = Weight();
  return Status::Ok();
}

Status GdnLayer::decode_device(Cache& cache, int layer, const int32_t* slots_d, int B,
                               const float* x, float* y) const {
  MEMRA_TRY(cache.check_layer(layer, state_spec(), "GdnLayer.decode"));
  MEMRA_TRY(cache.check_device(cuda_, "GdnLayer.decode"));
  if (!gpu_) return Status(kUnsupported, "GdnLayer.decode: device slots need a CUDA layer");
  Planes p;
  p.slots_d = slots_d;
  return run_cuda(cache, layer, B, 1, p, x, y);
}

Status GdnLayer::run_cuda(Cache& cache, int layer, int B, int T, const Planes& planes,
                          const float* x, float* y) const {
  const CudaContext& c = *cuda_;
  const op::Backend be{&c};
  gpu::ResidentWeights resident(c);
  const Gpu& g = *gpu_;
  const int Hk = cfg_.key_heads, Hv = cfg_.value_heads, dk = cfg_.key_head_dim,
            dv = cfg_.value_head_dim, K = cfg_.conv_kernel, C = conv_channels();
  const int64_t kd = int64_t(Hk) * dk, vd = int64_t(Hv) * dv;
  const int N = B * T;
  const bool decode = planes.slots_d != nullptr;
  const char* where = decode ? "GdnLayer.decode" : "GdnLayer.prefill";
  if (N == 0) return Status::Ok();
  gpu::Arena a(cuda_);
  float *raw = nullptr, *act = nullptr, *z = nullptr, *ba = nullptr, *gate = nullptr,
        *beta = nullptr, *o = nullptr;
  MEMRA_TRY(a.take(int64_t(N) * C, &raw));  // projections, q | k | v per row
  MEMRA_TRY(a.take(int64_t(N) * C, &act));  // the conv's output, the same layout
  // z [N, vd] and ba [N, 2*Hv]; at one row adjacent (z | b | a: one GEMV output row).
  MEMRA_TRY(a.take(int64_t(N) * (vd + 2 * Hv), &z));
  ba = z + int64_t(N) * vd;
  MEMRA_TRY(a.take(int64_t(N) * Hv, &gate));
  MEMRA_TRY(a.take(int64_t(N) * Hv, &beta));
  MEMRA_TRY(a.take(int64_t(N) * vd, &o));

  // A decode step's ring and state tables first (op::kda_tables reads only the device slots and
  // the cache's flags): the conv, two launches later, may then read its tables, ring planes and
  // weights before it waits for the projections in front of it (MemraKdaPlanes::early: those
  // write none of them, and the tables' launch has completed by the time they trigger).
  const float** ring_in_t = nullptr;
  float** ring_out_t = nullptr;
  const float** state_in_t = nullptr;
  float** state_out_t = nullptr;
  if (decode) {
    const LayerStateSpec spec = state_spec();
    MEMRA_TRY(a.take(B, &ring_in_t));
    MEMRA_TRY(a.take(B, &ring_out_t));
    MEMRA_TRY(a.take(B, &state_in_t));
    MEMRA_TRY(a.take(B, &state_out_t));
    // No sinks: an idle row's table entries are null (its conv and scan read zeros and write
    // nothing).
    const MemraKdaTablesParams tp{planes.slots_d, cache.cur_d(), B, cache.conv(layer, 0, 0),
                                  cache.conv(layer, 0, 1), cache.state(layer, 0, 0),
                                  cache.state(layer, 0, 1), spec.conv_floats(),
                                  spec.state_floats(), 0, ring_in_t, ring_out_t, state_in_t,
                                  state_out_t, nullptr, nullptr};
    MEMRA_TRY(op::kda_tables(be, tp));
  }

  gpu::Rounded xr;
  MEMRA_TRY(gpu::round_input(c, a, x, N, cfg_.hidden, g.qkv.dtype, &xr, where));
  if (N == 1) {
    MEMRA_GPU(c, gpu::linear_in_pair(c, xr, xr, N, g.qkv, g.zba, raw, z), where);
  } else {
    MEMRA_GPU(c, gpu::linear_in_pair(c, xr, xr, N, g.qkv, g.z, raw, z), where);
    MEMRA_GPU(c, gpu::linear_in(c, xr, N, g.ba, nullptr, ba), where);
  }

  // The conv (KDA's kernels), and the state tables the scan reads.
  const float* conv_w = gpu::f32p(g.conv_w);
  const float* const* state_in = nullptr;
  float* const* state_out = nullptr;
  if (decode) {
    MemraKdaConvParams cp = conv_params(raw, B, C, conv_w, K, act);
    cp.ring.form = MEMRA_KDA_PLANES_TABLES;
    cp.ring.in_table = ring_in_t;
    cp.ring.out_table = ring_out_t;
    cp.ring.early = 1;
    MEMRA_TRY(op::kda_conv(be, cp));
    state_in = state_in_t;
    state_out = state_out_t;
  } else {
    MemraKdaConvParams cp = conv_params(raw, T, C, conv_w, K, act);
    cp.ring.form = MEMRA_KDA_PLANES_DIRECT;
    cp.ring.in = planes.ring_in;
    cp.ring.out = planes.ring_out;
    MEMRA_TRY(op::kda_conv(be, cp));
    const float** sin = nullptr;
    float** sout = nullptr;
    MEMRA_TRY(a.upload(std::vector<const float*>{planes.state_in}, &sin));
    MEMRA_TRY(a.upload(std::vector<float*>{planes.state_out}, &sout));
    state_in = sin;
    state_out = sout;
  }

  // q and k (the first 2*Hk heads of each row) L2-normalised in place; the gates from b | a (one
  // launch: the bytes of gdn_l2norm then gdn_gate).
  const MemraGdnGateParams gp{ba + Hv, 2 * int64_t(Hv), ba, 2 * int64_t(Hv), gpu::f32p(g.dt_bias),
                              gpu::f32p(g.a_log), N, Hv, gate, beta};
  MEMRA_TRY(op::gdn_l2norm_gate(be, act, N, 2 * Hk, dk, C, kL2Eps, gp));

  // The delta rule over B sequences of T steps, planes cur -> 1 - cur.
  const float scale = static_cast<float>(1.0 / std::sqrt(double(dk)));
  MemraGdnScanParams sp{act, act + kd, C, act + 2 * kd, C, gate, beta, B, T, Hk, Hv, dk, dv,
                        scale, state_in, state_out, o, /*chunked=*/0};
  // A bf16 model's multi-token prefill runs the chunked tensor-core form; f32 models, decode
  // steps and one-token prefills the sequential kernels (a one-token prefill keeps the decode
  // step's bytes).
  sp.chunked = (!decode && T > 1 && g.qkv.dtype != DType::kF32) ? 1 : 0;
  MEMRA_TRY(op::gdn_scan(be, sp));

  // w * rmsnorm(o) * silu(z) per value head, then out_proj.
  MEMRA_TRY(op::rms_norm_gated_silu(be, o, z, N * Hv, dv, gpu::f32p(g.norm_w), cfg_.rms_eps, o));
  MEMRA_GPU(c, gpu::linear(c, o, N, g.out_proj, nullptr, y), where);
  return Status::Ok();
}

}  // namespace memra
