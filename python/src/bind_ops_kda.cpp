// Functional bindings of the KDA ops over DLPack arrays: short conv, forget gate, recurrent scan.
// Every function checks its arguments (ContractError naming the op and the values) before
// anything runs, allocates its outputs on the engine's device, fills the op's parameter struct
// (cuda_abi/kda.h) and calls memra::op (op/kda.h), which runs the CPU reference (cpu/kda.cpp, the
// oracle; the GIL released) or, for a CUDA Engine (keyword `engine`), cuda/kda_*.cu.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/op/kda.h"
#include "memra/ops.h"
#include "op_call.h"

namespace memra::py {

namespace {

size_t sz(int64_t n) { return static_cast<size_t>(n); }

// Tables of per-sequence plane pointers (MEMRA_KDA_PLANES_TABLES): table i holds
// bases[i] + b * stride (b < n). On the CPU the host arrays themselves; on CUDA all tables share
// one upload (one staged copy per call, not one per table), freed stream-ordered after the call.
// A null base gives a null table (table(i) == nullptr) and takes no space.
struct PointerTables {
  std::vector<float*> host;
  std::shared_ptr<DeviceBuffer> buf;  // CUDA: the device copy of host
  std::vector<int64_t> start;         // element offset of table i, -1 for a null base
  float* const* table(size_t i) const {
    if (start[i] < 0) return nullptr;
    return (buf ? static_cast<float* const*>(buf->data()) : host.data()) + start[i];
  }
};

PointerTables pointer_tables(const Engine* engine, std::initializer_list<const float*> bases,
                             int64_t n, int64_t stride) {
  PointerTables t;
  for (const float* base : bases) {
    t.start.push_back(base ? static_cast<int64_t>(t.host.size()) : -1);
    for (int64_t b = 0; base && b < n; ++b) t.host.push_back(const_cast<float*>(base) + b * stride);
  }
  if (on_cuda(engine)) t.buf = device_upload(engine, t.host.data(), t.host.size() * sizeof(float*));
  return t;
}

// The CUDA scan kernels access q / k / g / v and the state planes as float4: a device array
// whose data pointer is not 16-byte aligned (a view at an odd element offset) is refused here
// with its name, before anything runs (the entry point would refuse q / k / g / v too, with
// less to say; it cannot see the planes behind the pointer table).
void require_aligned16(const Engine* engine, const void* p, const char* op, const char* name) {
  if (on_cuda(engine) && (reinterpret_cast<uintptr_t>(p) & 15u) != 0) {
    raise_contract(kContractStride, std::string(op) + ": argument '" + name +
                                        "' must start on a 16-byte boundary on the device "
                                        "(the CUDA kernels load it as float4)");
  }
}

// An async copy on the engine's stream (T == 0: the state / ring passes through unchanged).
void device_copy(const Engine* engine, void* dst, const void* src, size_t bytes, const char* op) {
  const CudaContext& c = cuda_ctx(engine);
  check_cuda(engine, c.api().copy(c.ctx(), dst, src, bytes), op);
}

}  // namespace

void init_ops_kda(nb::module_& m) {
  m.def(
      "kda_conv",
      [](const AnyArray& x, const AnyArray& w, const AnyArray& ring, const std::string& arm,
         bool batch, int l2_dk, const Engine* engine) {
        if (arm != "auto" && arm != "prefill" && arm != "decode") {
          raise_contract(kContractValue,
                         "kda_conv: arm must be 'auto', 'prefill' or 'decode', got '" + arm + "'");
        }
        if (batch && arm == "prefill") {
          raise_contract(kContractValue,
                         "kda_conv: batch=True runs the decode arm (one token per sequence); "
                         "arm='prefill' is not available with it");
        }
        const float* xp = f32_in(engine, x, "kda_conv", "x", {-1, -1});
        const int64_t T = dim(x, 0), C = dim(x, 1);  // batch: T is the number of sequences B
        // An empty kernel is refused first: it is a shape error, whatever its strides say.
        if (w.ndim() == 2 && w.shape(1) == 0) {
          raise_contract(kContractShape, "kda_conv: argument 'w' has shape " + shape_str(w) +
                                             ", the conv kernel K must be >= 1");
        }
        const float* wp = f32_in(engine, w, "kda_conv", "w", {C, -1});
        const int64_t K = dim(w, 1);
        const float* rp = batch ? f32_in(engine, ring, "kda_conv", "ring", {T, C, K - 1})
                                : f32_in(engine, ring, "kda_conv", "ring", {C, K - 1});
        const bool decode = batch || arm == "decode" || (arm == "auto" && T == 1);
        if (decode && !batch && T != 1) {
          raise_contract(kContractShape, "kda_conv: arm='decode' takes one token, got x of shape " +
                                             shape_str(x));
        }
        if (l2_dk < 0 || (l2_dk > 0 && C % l2_dk != 0)) {
          raise_contract(kContractShape, "kda_conv: l2_dk must be 0 or a head size dividing the " +
                                             std::to_string(C) + " channels, got " +
                                             std::to_string(l2_dk));
        }
        const int64_t plane = C * (K - 1);  // one sequence's ring
        // Both kernels write every element of y and ring_out; at T == 0 (prefill) ring_out is
        // the copy below, and an error discards them.
        Out y = out_f32_uninit(engine, {sz(T), sz(C)});
        Out ring_out = batch ? out_f32_uninit(engine, {sz(T), sz(C), sz(K - 1)})
                             : out_f32_uninit(engine, {sz(C), sz(K - 1)});
        float* ro = ring_out.data<float>();
        // The decode arm names each row's ring through pointer tables (one row unless batch),
        // the prefill arm the sequence's two rings; y in one channel group (G = C).
        MemraKdaConvParams p{};
        p.x = xp;
        p.n = int(T);
        p.C = int(C);
        p.G = int(C);
        p.w = wp;
        p.K = int(K);
        p.y = y.data<float>();
        if (l2_dk != 0) {  // the op's fused norm over the one group of C channels
          p.l2_groups = 1;
          p.dk = l2_dk;
          p.eps = 1e-6f;
        }
        PointerTables tabs;
        if (decode) {
          tabs = pointer_tables(engine, {rp, ro}, T, plane);
          p.ring.form = MEMRA_KDA_PLANES_TABLES;
          p.ring.in_table = tabs.table(0);
          p.ring.out_table = tabs.table(1);
        } else {
          p.ring.form = MEMRA_KDA_PLANES_DIRECT;
          p.ring.in = rp;
          p.ring.out = ro;
        }
        run_op(engine, memra::op::kda_conv, p);
        // Zero steps: the CUDA kernel is a no-op; the ring passes through (as on the CPU).
        if (on_cuda(engine) && !decode && T == 0 && K >= 2 && K <= 8) {
          device_copy(engine, ro, rp, sz(plane) * sizeof(float), "kda_conv");
        }
        return std::make_pair(y.obj, ring_out.obj);
      },
      nb::arg("x"), nb::arg("w"), nb::arg("ring"), nb::kw_only(), nb::arg("arm") = "auto",
      nb::arg("batch") = false, nb::arg("l2_dk") = 0, nb::arg("engine").none() = nb::none(),
      "Causal depthwise conv + SiLU over the fused q|k|v channels, continuing from a ring.\n\n"
      "x [T, C] float32 pre-conv projections; w [C, K] float32 taps (tap 0 meets the oldest\n"
      "input); ring [C, K-1] float32, the previous K-1 inputs of each channel, oldest first\n"
      "(zeros for a fresh sequence). Returns (y [T, C], ring_out [C, K-1]) where\n"
      "y = silu(conv(ring ++ x)) and ring_out = the last K-1 inputs of ring ++ x (for T < K-1\n"
      "it still holds some old ring values). arm='auto' runs the decode arm at T == 1 and the\n"
      "prefill arm otherwise; 'prefill' / 'decode' force one ('decode' needs T == 1). The arms\n"
      "agree bit for bit, so kda_conv(x[:T-1]) then kda_conv(x[T-1:]) == kda_conv(x).\n"
      "batch=True: B sequences of one token each through the decode arm (one launch on CUDA):\n"
      "x [B, C], ring [B, C, K-1] -> (y [B, C], ring_out [B, C, K-1]); row b equals\n"
      "kda_conv(x[b:b+1], w, ring[b]) bit for bit.\n"
      "l2_dk != 0: each row of y L2-normalised in heads of l2_dk channels after the conv, as\n"
      "l2norm_heads(y.reshape(T, C // l2_dk, l2_dk), eps=1e-6) (KdaLayer's q and k; C % l2_dk\n"
      "== 0, else CONTRACT_SHAPE); on CUDA the decode arm does it in its launch when l2_dk ==\n"
      "128, with the same bytes.\n"
      "engine: None or a CPU Engine runs the C++ reference on host arrays; a CUDA Engine runs\n"
      "cuda/kda_conv.cu on arrays of its device and returns CUDA arrays (kernels built for K in\n"
      "2..8: another K raises UnsupportedError (UNSUPPORTED_GEOMETRY); the CPU takes any K >= 1).\n"
      "Raises ContractError (CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE /\n"
      "CONTRACT_DEVICE) for a non-float32, mis-shaped, non-C-contiguous or wrong-device array,\n"
      "CONTRACT_VALUE for an unknown arm. Reference: modeling_glm5_next.causal_conv1d_fn /\n"
      "causal_conv1d_update with activation='silu' and the cache's conv state.");

  m.def(
      "kda_gate",
      [](const AnyArray& f, const AnyArray& dt_bias, const AnyArray& A_log,
         const std::string& form, float lower_bound, const Engine* engine) {
        cpu::KdaGateForm gf;
        if (form == "lower_bound") {
          gf = cpu::KdaGateForm::kLowerBound;
        } else if (form == "softplus") {
          gf = cpu::KdaGateForm::kSoftplus;
        } else {
          raise_contract(kContractValue, "kda_gate: form must be 'lower_bound' or 'softplus', got '" +
                                             form + "'");
        }
        if (gf == cpu::KdaGateForm::kLowerBound) {
          check_lower_bound(lower_bound, "kda_gate", "lower_bound");
        } else {
          check_finite(lower_bound, "kda_gate", "lower_bound");
        }
        const float* fp = f32_in(engine, f, "kda_gate", "f", {-1, -1});
        const int64_t T = dim(f, 0), D = dim(f, 1);
        const float* ap = f32_in(engine, A_log, "kda_gate", "A_log", {-1});
        const int64_t H = dim(A_log, 0);
        if (H < 1 || D % H != 0) {
          raise_contract(kContractShape, "kda_gate: argument 'f' has shape " + shape_str(f) +
                                             ", its last dim must be H*dk with H = " +
                                             std::to_string(H) + " heads (the length of A_log)");
        }
        const float* bp = f32_in(engine, dt_bias, "kda_gate", "dt_bias", {D});
        Out g = out_f32_uninit(engine, {sz(T), sz(D)});  // the kernel writes every element
        const MemraKdaGateParams p{fp, bp, ap, int(T), int(H), int(D / H), static_cast<int>(gf),
                                   lower_bound, g.data<float>(), nullptr, 0};
        run_op(engine, memra::op::kda_gate, p);
        return g.obj;
      },
      nb::arg("f"), nb::arg("dt_bias"), nb::arg("A_log"), nb::kw_only(),
      nb::arg("form") = "lower_bound", nb::arg("lower_bound") = -5.0f,
      nb::arg("engine").none() = nb::none(),
      "KDA log forget gate g [T, H*dk] float32 from f [T, H*dk] = f_b(f_a(x)), dt_bias [H*dk]\n"
      "(per channel) and A_log [H] (per head), all float32.\n\n"
      "form='lower_bound' (glm5_next): g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias)).\n"
      "form='softplus' (kimi_linear): g = -exp(A_log) * softplus(f + dt_bias) with\n"
      "softplus(x) = x if x > 20 else log(1 + exp(x)); lower_bound is ignored.\n"
      "engine: None or a CPU Engine runs the C++ reference; a CUDA Engine runs cuda/kda_scan.cu\n"
      "on arrays of its device (any dk; same operations, CUDA's expf/logf within 2 ulp).\n"
      "Raises ContractError: CONTRACT_VALUE for another form, a non-finite lower_bound or (form\n"
      "'lower_bound') one above 0 (the log decay would grow the state),\n"
      "CONTRACT_SHAPE when the last dim of f is not a multiple of len(A_log) or dt_bias does\n"
      "not match it, CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE as usual.\n"
      "Reference: Glm5NextTextForgetGate.forward.");

  m.def(
      "kda_scan",
      [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& g,
         const AnyArray& beta, std::optional<AnyArray> state, std::optional<float> scale,
         bool batch, bool chunked, const std::string& o_dtype, const Engine* engine) {
        const char* op = "kda_scan";
        if (o_dtype != "float32" && o_dtype != "bfloat16") {
          raise_contract(kContractValue, "kda_scan: o_dtype must be 'float32' or 'bfloat16', got '" +
                                             o_dtype + "'");
        }
        const int odt = o_dtype == "bfloat16" ? 1 : 0;
        int64_t B = 1, T, H, dk, dv;
        const void *qp, *kp, *vp, *gp;
        const float *bp, *sp = nullptr;
        int dt = 0, same = 0;  // q's dtype code; k, v and g must share it
        if (batch) {
          qp = f32_or_bf16_in(engine, q, op, "q", {-1, -1, -1, -1}, &dt);
          B = dim(q, 0), T = dim(q, 1), H = dim(q, 2), dk = dim(q, 3);
          kp = f32_or_bf16_in(engine, k, op, "k", {B, T, H, dk}, &same, dt);
          vp = f32_or_bf16_in(engine, v, op, "v", {B, T, H, -1}, &same, dt);
          dv = dim(v, 3);
          gp = f32_or_bf16_in(engine, g, op, "g", {B, T, H, dk}, &same, dt);
          bp = f32_in(engine, beta, op, "beta", {B, T, H});
          if (state) sp = f32_in(engine, *state, op, "state", {B, H, dk, dv});
        } else {
          qp = f32_or_bf16_in(engine, q, op, "q", {-1, -1, -1}, &dt);
          T = dim(q, 0), H = dim(q, 1), dk = dim(q, 2);
          kp = f32_or_bf16_in(engine, k, op, "k", {T, H, dk}, &same, dt);
          vp = f32_or_bf16_in(engine, v, op, "v", {T, H, -1}, &same, dt);
          dv = dim(v, 2);
          gp = f32_or_bf16_in(engine, g, op, "g", {T, H, dk}, &same, dt);
          bp = f32_in(engine, beta, op, "beta", {T, H});
          if (state) sp = f32_in(engine, *state, op, "state", {H, dk, dv});
        }
        if (dk < 1 || dv < 1) {  // no state to carry (and dk**-0.5 undefined)
          raise_contract(kContractShape, "kda_scan: q of shape " + shape_str(q) + " and v of shape " +
                                             shape_str(v) + " need head sizes dk, dv >= 1");
        }
        // transformers: scale = 1 / (dk ** 0.5) in double, applied to f32 q as an f32 scalar.
        if (scale) check_finite(*scale, "kda_scan", "scale");
        const float sc = scale ? *scale : static_cast<float>(1.0 / std::sqrt(double(dk)));
        if ((dt != 0 || odt != 0) && on_cuda(engine) && !chunked) {
          raise_status(Status(kUnsupportedGeometry, "kda_scan: bfloat16 q, k, v, g or o need "
                                                    "chunked=True on CUDA (the sequential scan "
                                                    "reads and writes float32)"));
        }
        for (auto [p, name] : {std::pair<const void*, const char*>{qp, "q"}, {kp, "k"},
                               {vp, "v"}, {gp, "g"}, {sp, "state"}}) {
          require_aligned16(engine, p, op, name);
        }
        const int64_t plane = H * dk * dv;  // one sequence's state
        // The kernels write every element of o and of each state_out plane (T >= 1); at T == 0
        // state_out is the input state (copied below) or zeros, the one case that needs the fill.
        const bool fill = T == 0 && !sp;
        auto state_shaped = [&](std::vector<size_t> shape) {
          return fill ? out_f32(engine, std::move(shape))
                      : out_f32_uninit(engine, std::move(shape));
        };
        std::vector<size_t> o_shape = batch ? std::vector<size_t>{sz(B), sz(T), sz(H), sz(dv)}
                                            : std::vector<size_t>{sz(T), sz(H), sz(dv)};
        Out o = odt ? out_bf16_uninit(engine, std::move(o_shape))
                    : out_f32_uninit(engine, std::move(o_shape));
        Out state_out = batch ? state_shaped({sz(B), sz(H), sz(dk), sz(dv)})
                              : state_shaped({sz(H), sz(dk), sz(dv)});
        float* so = state_out.data<float>();
        // The CUDA decode step (T == 1, not chunked) names the contiguous planes by their stride
        // (STRIDED: no table to upload, no table load ahead of the kernel's state loads); the
        // other forms take pointer tables. A null state_in = every sequence starts from zeros.
        const bool strided = on_cuda(engine) && T == 1 && !chunked;
        const PointerTables tabs =
            strided ? PointerTables{} : pointer_tables(engine, {sp, so}, B, plane);
        MemraKdaScanParams p{};
        p.q = qp;
        p.k = kp;
        p.v = vp;
        p.g = gp;
        p.beta = bp;
        p.B = int(B);
        p.T = int(T);
        p.H = int(H);
        p.dk = int(dk);
        p.dv = int(dv);
        p.scale = sc;
        if (strided) {
          p.state.form = MEMRA_KDA_PLANES_STRIDED;
          p.state.in = sp;
          p.state.out = so;
          p.state.floats = plane;
        } else {
          p.state.form = MEMRA_KDA_PLANES_TABLES;
          p.state.in_table = tabs.table(0);
          p.state.out_table = tabs.table(1);
        }
        p.o = o.ptr;
        p.chunked = chunked ? 1 : 0;
        p.in_dtype = dt;
        p.o_dtype = odt;
        run_op(engine, memra::op::kda_scan, p);
        // Zero steps: the CUDA kernel is a no-op; the state passes through (as on the CPU).
        if (on_cuda(engine) && T == 0 && sp) {
          device_copy(engine, so, sp, sz(B * plane) * sizeof(float), "kda_scan");
        }
        return std::make_pair(o.obj, state_out.obj);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
      nb::arg("state") = nb::none(), nb::kw_only(), nb::arg("scale") = nb::none(),
      nb::arg("batch") = false, nb::arg("chunked") = false, nb::arg("o_dtype") = "float32",
      nb::arg("engine").none() = nb::none(),
      "KDA delta-rule scan, T steps in order (the recurrent form), from `state` (None = zeros).\n\n"
      "q, k [T, H, dk] float32 (already L2-normalised, see l2norm_heads); v [T, H, dv];\n"
      "g [T, H, dk] log forget gate (kda_gate); beta [T, H] (sigmoid of b_proj);\n"
      "q, k, v, g may instead all be bfloat16 (fla chunk_kda's inputs; uint16 raw bits\n"
      "accepted): read at half the bytes and widened exactly to float32, so the results are\n"
      "those of the float32 call on the widened arrays (CUDA: chunked=True only);\n"
      "o_dtype='bfloat16' returns o as bfloat16 (fla chunk_kda's output), the float32 o rounded\n"
      "to nearest even, a NaN's payload unspecified (CUDA: chunked=True only); the state\n"
      "stays float32;\n"
      "state [H, dk, dv] float32 or None. Per step and head:\n"
      "  S = S * exp(g_t)[:, None]; S += k_t (beta_t (v_t - k_t^T S)); o_t = (scale q_t)^T S\n"
      "with scale = dk**-0.5 unless given. Returns (o [T, H, dv], state_out [H, dk, dv]); the\n"
      "input state is not modified. Chaining calls (one T-step call, or T one-step calls\n"
      "passing state_out on) gives the same bits.\n"
      "batch=True: B sequences in one call (one launch on CUDA): q, k, g [B, T, H, dk];\n"
      "v [B, T, H, dv]; beta [B, T, H]; state [B, H, dk, dv] or None -> (o [B, T, H, dv],\n"
      "state_out [B, H, dk, dv]); sequence b equals its own call bit for bit.\n"
      "engine: None or a CPU Engine runs the C++ reference on host arrays; a CUDA Engine runs\n"
      "cuda/kda_scan.cu on arrays of its device (built for dk = dv = 128 only: another head size\n"
      "raises UnsupportedError (UNSUPPORTED_GEOMETRY); its dk-long sums are partial sums plus a\n"
      "warp tree, so it matches the CPU to ~1e-5 relative, not bit for bit).\n"
      "chunked=True: on CUDA the chunked (WY / UT) form on tensor cores (cuda/kda_chunk.cu, the\n"
      "bf16 models' prefill): TF32 operands, f32 accumulation and state, within bf16-input error\n"
      "of the scan; the same outputs and state layout. The CPU runs its reference either way.\n"
      "Raises ContractError (CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE /\n"
      "CONTRACT_DEVICE) for a bad argument (CONTRACT_DTYPE also for k, v or g not of q's\n"
      "dtype; CONTRACT_VALUE for another o_dtype or a scale that is not finite; CONTRACT_STRIDE\n"
      "also for a CUDA array (q, k,\n"
      "v, g, state) whose data does not start on a 16-byte boundary); UnsupportedError for\n"
      "bfloat16 inputs or o on CUDA without chunked=True.\n"
      "Reference: modeling_glm5_next.recurrent_kimi_delta_attention (equal in exact arithmetic\n"
      "to chunk_kimi_delta_attention, which transformers uses for multi-token prefill).");
}

}  // namespace memra::py
