// KdaLayer on a CUDA device: the same chain as KdaLayer::run (kda_layer.cpp) over the CUDA
// library's ops, with the launches of one call fused where the arithmetic allows it:
// - x is rounded to the compute dtype once and read by the three GEMMs of x (linear_in; at
//   N = 1 each GEMM rounds it itself, gpu::round_input);
// - q | k | v is one [3*qkv, D] weight, one GEMM into the fused channel order of the conv
//   (raw [N, 3*qkv], as KdaLayer::run's `mixed`), and one conv launch over the 3*qkv channels
//   with group width qkv, which writes q, k and v as three contiguous [N, H, dk] tensors (the
//   conv is depthwise and the cache's ring is [3*qkv, K-1], so this is the arithmetic of three
//   per-group launches); the L2 norm of q and k is one launch over their 2N adjacent rows;
// - f_a | g_a | b_proj is one [rank_f + rank_g + H, D] weight; at a decode step all of it is
//   one GEMM into low [N, rank_f + rank_g + H], beta's logits being each row's last H columns
//   (the scan reads them with that row stride), and at N == 1 that GEMM shares q|k|v's launch
//   (linear_ex_pair: two problems of one x in one GEMV grid); a prefill's f_a | g_a (a row view)
//   is one GEMM into low [N, rank_f + rank_g] and b_proj another (kda_gate takes beta
//   contiguous); low is rounded once and f_b and g_b read its two column blocks;
// - a decode step's conv and scan find each row's ring and state planes from the device slots
//   themselves (kda_conv / kda_scan's SLOTS planes), and read them before they wait for the
//   launch in front of them. The scan turns f and beta's logits into gates as it loads them, and
//   runs the per-head gated RMSNorm before it stores o (the bytes of the norm's own launch); at
//   B == 1 the gates' up-projections f_b | g_b ride in the conv's launch (kda_conv's GEMV pair;
//   both read only the projection's outputs; the bytes of the GEMV's own launch).
// The KDA ops run through memra::op (op/kda.h) on the layer's CUDA backend.
// Only the GEMMs' summation order can differ from separate projections (cuBLAS may pick other
// kernels for the wider shapes).
#include <cmath>
#include <vector>

#include "gpu_util.h"
#include "memra/layers.h"
#include "memra/op/basic.h"
#include "memra/op/kda.h"

namespace memra {

namespace {
constexpr float kL2Eps = 1e-6f;  // as kda_layer.cpp

// A failed KDA op's Status, named after the layer call it ran in as well.
Status in_layer(Status st, const char* op) {
  if (!st.ok()) st.message = std::string(op) + ": " + st.message;
  return st;
}

// A layer's planes found from the device slots (MEMRA_KDA_PLANES_SLOTS): plane c of slot s at
// base<c> + s * floats, read before the kernel's wait (early; see run_cuda).
MemraKdaPlanes slot_planes(const int32_t* slots_d, const int32_t* cur_d, float* base0,
                           float* base1, int64_t floats) {
  MemraKdaPlanes p{};
  p.form = MEMRA_KDA_PLANES_SLOTS;
  p.slots = slots_d;
  p.cur = cur_d;
  p.base0 = base0;
  p.base1 = base1;
  p.floats = floats;
  p.early = 1;
  return p;
}
}  // namespace

struct KdaLayer::Gpu {
  DeviceWeight qkv;   // q | k | v projections [3*qkv, D] in the compute dtype
  DeviceWeight x_small;  // f_a | g_a | b_proj [rank_f + rank_g + H, D]: x's small GEMMs
  DeviceWeight fg_a;     // f_a | g_a: a row view of x_small (the gates' low-rank halves)
  int64_t rank_f = 0;    // f_a's rows: g_b's input starts at this column of low's rows
  DeviceWeight f_b, b_proj, g_b, o_proj;  // b_proj: a row view of x_small
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
  MEMRA_TRY(DeviceWeight::upload_rows(cuda, {&q_proj_, &k_proj_, &v_proj_}, dtype, &g->qkv));
  // f_a, g_a and b_proj all read x ([rank, D], [rank, D], [H, D]; concatenated along rows).
  MEMRA_TRY(DeviceWeight::upload_rows(cuda, {&f_a_, &g_a_, &b_proj_}, dtype, &g->x_small));
  g->rank_f = f_a_.rows();
  g->fg_a = g->x_small.row_view(0, f_a_.rows() + g_a_.rows());
  g->b_proj = g->x_small.row_view(g->fg_a.rows, b_proj_.rows());
  MEMRA_TRY(DeviceWeight::upload(cuda, f_b_, dtype, &g->f_b));
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
// -1 = idle row) and the conv and the scan find the planes there from the cache's ping-pong
// flags, so nothing in the step depends on host-side cache state (the shape a CUDA graph
// replays).
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
  gpu::ResidentWeights resident(c);
  const op::Backend be{&c};
  const Gpu& g = *gpu_;
  const int H = cfg_.heads, dk = cfg_.head_dim, qkv = H * dk, C = 3 * qkv, K = cfg_.conv_kernel;
  const int N = B * T;
  const int64_t n_low = g.fg_a.rows;  // rank_f + rank_g
  const bool decode = planes.slots_d != nullptr;
  const char* op = decode ? "KdaLayer.decode" : "KdaLayer.prefill";
  gpu::Arena a(cuda_);
  float *raw = nullptr, *act = nullptr, *low = nullptr, *gate_f = nullptr, *beta = nullptr,
        *o = nullptr, *gate_o = nullptr;
  MEMRA_TRY(a.take(int64_t(N) * C, &raw));
  MEMRA_TRY(a.take(int64_t(N) * C, &act));  // q [N, qkv] | k [N, qkv] | v [N, qkv]
  // One row, or a decode step's rows: low and beta's logits are rows [f | g | beta] of one
  // x_small GEMM (the scan reads the logits ld_low apart); a prefill's rows take beta apart,
  // contiguous, as kda_gate turns it into its sigmoid in place.
  const bool one_gemm = N == 1 || decode;
  const int64_t ld_low = one_gemm ? g.x_small.rows : n_low;
  MEMRA_TRY(a.take(int64_t(N) * ld_low, &low));
  MEMRA_TRY(a.take(int64_t(N) * qkv, &gate_f));
  if (one_gemm) {
    beta = low + n_low;
  } else {
    MEMRA_TRY(a.take(int64_t(N) * H, &beta));
  }
  // A decode step of several rows against a bf16 o_proj: the scan's gated norm stores o in bf16,
  // the rounding the projection's GEMM would apply in a launch of its own (one row: the GEMV
  // rounds it as it reads), and no f32 o is made.
  uint16_t* o16 = nullptr;
  if (decode && N > MEMRA_GEMV_MAX_ROWS && g.o_proj.dtype == DType::kBF16) {
    MEMRA_TRY(a.take(int64_t(N) * qkv, &o16));
  } else {
    MEMRA_TRY(a.take(int64_t(N) * qkv, &o));
  }
  MEMRA_TRY(a.take(int64_t(N) * qkv, &gate_o));
  const float* q = act;
  const float* k = act + int64_t(N) * qkv;
  const float* v = act + 2 * int64_t(N) * qkv;

  // Decode: the ring entries name each slot's whole [3*qkv, K-1] ring (plane offset 0), which
  // the fused conv reads channel by channel.
  const LayerStateSpec spec = state_spec();

  // x in the compute dtype, once for the three GEMMs that read it.
  gpu::Rounded xr;
  MEMRA_TRY(gpu::round_input(c, a, x, N, cfg_.hidden, g.qkv.dtype, &xr, op));

  // Projections (fused channel order q | k | v per row) and the causal conv + SiLU, split back
  // into q, k, v by the conv's group width qkv.
  // At N == 1 the x_small GEMM (f_a | g_a | beta's logits, below) rides in the same launch.
  const float* conv_w = gpu::f32p(g.conv_w);
  if (N == 1) {
    MEMRA_GPU(c, gpu::linear_in_pair(c, xr, xr, N, g.qkv, g.x_small, raw, low), op);
  } else {
    MEMRA_GPU(c, gpu::linear_in(c, xr, N, g.qkv, nullptr, raw), op);
  }
  // Then q and k (the first 2 channel groups, 2N rows of [H, dk]) L2-normalised: inside the conv
  // kernel at decode (the bytes of the two launches prefill runs).
  // early = 1: the launch in front of the conv (the q|k|v projection) and the one in front of
  // the scan (g_b's GEMM of linear_in_pair at N > 1; the conv itself at N == 1 with `pair`; a
  // decode step runs no b_proj launch) write none of the planes, slots or flags they read before
  // their wait, and every kernel before those has completed by then.
  // N == 1: the forget and output gates' up-projections f_b | g_b over x_small's
  // f | g columns ride in the conv's launch (kda_conv's GEMV pair, the bytes of the conv and
  // linear_in_pair below; both read only the projection's outputs).
  gpu::Rounded lowr;  // N == 1: low itself, rounded in the GEMV (no launch); N > 1: below
  if (N == 1) MEMRA_TRY(gpu::round_input(c, a, low, N, n_low, g.f_b.dtype, &lowr, op));
  const bool pair = decode && N == 1 && lowr.dtype == DType::kF32 &&
                    g.f_b.cols == g.g_b.cols && g.f_b.dtype_code() == g.g_b.dtype_code();
  MemraKdaConvParams cp{};
  cp.x = raw;
  cp.n = N;
  cp.C = C;
  cp.G = qkv;
  cp.w = conv_w;
  cp.K = K;
  cp.y = act;
  cp.l2_groups = 2;
  cp.dk = dk;
  cp.eps = kL2Eps;
  if (decode) {
    cp.ring = slot_planes(planes.slots_d, cache.cur_d(), cache.conv(layer, 0, 0),
                          cache.conv(layer, 0, 1), spec.conv_floats());
  } else {
    cp.ring.form = MEMRA_KDA_PLANES_DIRECT;
    cp.ring.in = planes.ring_in;
    cp.ring.out = planes.ring_out;
  }
  if (pair) {
    cp.pair.run = 1;
    cp.pair.x0 = low;
    cp.pair.x1 = low + g.rank_f;
    cp.pair.K = static_cast<int>(g.f_b.cols);
    cp.pair.w0 = g.f_b.data();
    cp.pair.w1 = g.g_b.data();
    cp.pair.w_dtype = g.f_b.dtype_code();
    cp.pair.N0 = static_cast<int>(g.f_b.rows);
    cp.pair.N1 = static_cast<int>(g.g_b.rows);
    cp.pair.y0 = gate_f;
    cp.pair.y1 = gate_o;
  }
  MEMRA_TRY(in_layer(op::kda_conv(be, cp), op));

  // Both gates' low-rank halves in one GEMM, with beta's logits at a decode step (N == 1: all
  // of it launched above with q|k|v), rounded once for f_b and g_b, which read their column
  // blocks ld_low apart.
  if (N != 1) {
    MEMRA_GPU(c, gpu::linear_in(c, xr, N, one_gemm ? g.x_small : g.fg_a, nullptr, low), op);
    MEMRA_TRY(gpu::round_input(c, a, low, N, ld_low, g.f_b.dtype, &lowr, op));
  }

  // The forget gate's f_b; the output gate's g_b, read after the scan, in the same call
  // (linear_ex_pair: one launch at a decode row; with `pair`, done in the conv's launch).
  if (!pair) {
    MEMRA_GPU(c, gpu::linear_in_pair(c, lowr, lowr.cols_from(g.rank_f), N, g.f_b, g.g_b, gate_f,
                                     gate_o), op);
  }
  if (!one_gemm) MEMRA_GPU(c, gpu::linear_in(c, xr, N, g.b_proj, nullptr, beta), op);
  MemraKdaScanParams sp{};
  sp.q = q;
  sp.k = k;
  sp.v = v;
  sp.g = gate_f;
  sp.beta = beta;
  sp.B = B;
  sp.T = T;
  sp.H = H;
  sp.dk = dk;
  sp.dv = dk;
  sp.scale = 1.0f / std::sqrt(static_cast<float>(dk));
  sp.o = o16 ? static_cast<void*>(o16) : static_cast<void*>(o);
  sp.o_dtype = o16 ? 1 : 0;
  const int form = static_cast<int>(cfg_.gate_form);
  if (decode) {
    // One step: the gates (forget gate and beta's sigmoid) inside the scan's launch, with the
    // bytes of the two launches prefill runs; state planes cur -> 1 - cur; and the gated norm
    // below, with the bytes of its own launch.
    sp.state = slot_planes(planes.slots_d, cache.cur_d(), cache.state(layer, 0, 0),
                           cache.state(layer, 0, 1), spec.state_floats());
    sp.fuse_gates = 1;
    sp.beta_ld = ld_low;
    sp.dt_bias = gpu::f32p(g.dt_bias);
    sp.A_log = gpu::f32p(g.a_log);
    sp.gate_form = form;
    sp.lower_bound = cfg_.lower_bound;
    sp.fuse_norm = 1;
    sp.gate_o = gate_o;
    sp.o_norm = gpu::f32p(g.o_norm);
    sp.norm_eps = cfg_.rms_eps;
  } else {
    const MemraKdaGateParams gp{gate_f, gpu::f32p(g.dt_bias), gpu::f32p(g.a_log), N, H, dk, form,
                                cfg_.lower_bound, gate_f, beta, int64_t(N) * H};
    MEMRA_TRY(in_layer(op::kda_gate(be, gp), op));
    // The delta-rule scan: one sequence of T steps, state planes cur -> 1 - cur.
    const float** sin = nullptr;
    float** sout = nullptr;
    MEMRA_TRY(a.upload(std::vector<const float*>{planes.state_in}, &sin));
    MEMRA_TRY(a.upload(std::vector<float*>{planes.state_out}, &sout));
    sp.state.form = MEMRA_KDA_PLANES_TABLES;
    sp.state.in_table = sin;
    sp.state.out_table = sout;
    // A bf16 model's multi-token prefill runs the chunked tensor-core form; f32 models the
    // sequential scan (the oracle's twin), and a one-token prefill the decode step's kernel
    // (its bytes: a one-token prefill equals a decode step bit for bit).
    sp.chunked = (T > 1 && g.qkv.dtype != DType::kF32) ? 1 : 0;
  }
  MEMRA_TRY(in_layer(op::kda_scan(be, sp), op));

  // The sigmoid-gated RMSNorm per head (gate_o: g_b over low's second block, above; at decode
  // inside the scan), output projection.
  if (!decode) {
    MEMRA_TRY(in_layer(op::rms_norm_gated_sigmoid(be, o, gate_o, N * H, dk, gpu::f32p(g.o_norm),
                                                  cfg_.rms_eps, o),
                       op));
  }
  if (o16) {
    MEMRA_GPU(c, gpu::linear_in(c, gpu::Rounded{o16, DType::kBF16, qkv}, N, g.o_proj, nullptr, y), op);
  } else {
    MEMRA_GPU(c, gpu::linear(c, o, N, g.o_proj, nullptr, y), op);
  }
  return Status::Ok();
}

}  // namespace memra
