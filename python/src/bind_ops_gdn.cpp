// Functional bindings of the Gated DeltaNet ops over DLPack arrays: gates, q/k L2 norm, the
// grouped-head delta-rule scan and the SiLU-gated RMSNorm. Each checks its arguments
// (ContractError naming the op and the values) before anything runs, allocates its outputs on the
// engine's device, fills the op's parameter struct and calls memra::op (op/gdn.h), which runs the
// CPU reference (cpu/gdn.cpp; the GIL released) or the CUDA entry (cuda/gdn.cu). The causal conv
// is kda_conv (bind_ops_kda.cpp), which takes any channel count.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/op/gdn.h"
#include "op_call.h"

namespace memra::py {

namespace {

size_t sz(int64_t n) { return static_cast<size_t>(n); }

// A copy of `bytes` from src into dst on the engine's device (host memcpy on the CPU).
void copy_on(const Engine* engine, void* dst, const void* src, size_t bytes, const char* op) {
  if (bytes == 0) return;
  if (!on_cuda(engine)) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const CudaContext& c = cuda_ctx(engine);
  check_cuda(engine, c.api().copy(c.ctx(), dst, src, bytes), op);
}

}  // namespace

void init_ops_gdn(nb::module_& m) {
  m.def(
      "gdn_gate",
      [](const AnyArray& a, const AnyArray& b, const AnyArray& dt_bias, const AnyArray& A_log,
         const Engine* engine) {
        const char* op = "gdn_gate";
        const float* ap = f32_in(engine, a, op, "a", {-1, -1});
        const int T = dim32(a, 0, op, "a"), H = dim32(a, 1, op, "a");
        const float* bp = f32_in(engine, b, op, "b", {T, H});
        const float* dp = f32_in(engine, dt_bias, op, "dt_bias", {H});
        const float* lp = f32_in(engine, A_log, op, "A_log", {H});
        Out g = out_f32_uninit(engine, {sz(T), sz(H)});  // the op writes every element
        Out beta = out_f32_uninit(engine, {sz(T), sz(H)});
        const MemraGdnGateParams p{ap, H, bp, H, dp, lp, T, H, g.data<float>(), beta.data<float>()};
        run_op(engine, [&] { return op::gdn_gate(backend(engine), p); });
        return std::make_pair(g.obj, beta.obj);
      },
      nb::arg("a"), nb::arg("b"), nb::arg("dt_bias"), nb::arg("A_log"), nb::kw_only(),
      nb::arg("engine").none() = nb::none(),
      "Gated DeltaNet gates per value head: (g [T, H], beta [T, H]) float32 from a [T, H] =\n"
      "in_proj_a(x), b [T, H] = in_proj_b(x), dt_bias [H] and A_log [H], all float32:\n"
      "  g = -exp(A_log) * softplus(a + dt_bias)   (F.softplus: x above 20, else log1p(exp(x)))\n"
      "  beta = 1 / (1 + exp(-b))\n"
      "engine: None or a CPU Engine runs the C++ reference; a CUDA Engine runs cuda/gdn.cu on\n"
      "arrays of its device (the same operations; CUDA's expf / log1pf within 2 ulp).\n"
      "Raises ContractError (CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE /\n"
      "CONTRACT_DEVICE) for a bad argument.\n"
      "Reference: Qwen3_5GatedDeltaNet.forward (beta = b.sigmoid();\n"
      "g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)).");

  m.def(
      "gdn_l2norm",
      [](const AnyArray& x, float eps, const Engine* engine) {
        const char* op = "gdn_l2norm";
        check_eps(eps, op);
        const float* xp = f32_in(engine, x, op, "x", {-1, -1, -1});
        const int T = dim32(x, 0, op, "x"), H = dim32(x, 1, op, "x"), d = dim32(x, 2, op, "x");
        Out y = out_f32_uninit(engine, {sz(T), sz(H), sz(d)});
        copy_on(engine, y.ptr, xp, sizeof(float) * sz(T) * sz(H) * sz(d), op);
        if (int64_t(T) * H * d > 0) {  // an empty array passes through
          run_op(engine, [&] {
            return op::gdn_l2norm(backend(engine), y.data<float>(), T, H, d, int64_t(H) * d, eps);
          });
        }
        return y.obj;
      },
      nb::arg("x"), nb::kw_only(), nb::arg("eps") = 1e-6f, nb::arg("engine").none() = nb::none(),
      "Per-head L2 norm in Qwen's form: x [T, H, d] * (1 / sqrt(sum(x^2, -1) + eps)), float32 on\n"
      "the engine's device (a new array). Differs in rounding from l2norm_heads (KDA's\n"
      "x / sqrt(...)). Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE,\n"
      "CONTRACT_DEVICE; CONTRACT_VALUE for a negative or non-finite eps).\n"
      "Reference: modeling_qwen3_5.l2norm (x * torch.rsqrt((x * x).sum(-1) + eps)).");

  m.def(
      "gdn_scan",
      [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& g,
         const AnyArray& beta, std::optional<AnyArray> state, std::optional<float> scale,
         bool batch, bool chunked, const Engine* engine) {
        const char* op = "gdn_scan";
        int B = 1, T, Hk, Hv, dk, dv;
        const float *qp, *kp, *vp, *gp, *bp, *sp = nullptr;
        if (batch) {
          qp = f32_in(engine, q, op, "q", {-1, -1, -1, -1});
          B = dim32(q, 0, op, "q"), T = dim32(q, 1, op, "q"), Hk = dim32(q, 2, op, "q"),
          dk = dim32(q, 3, op, "q");
          kp = f32_in(engine, k, op, "k", {B, T, Hk, dk});
          vp = f32_in(engine, v, op, "v", {B, T, -1, -1});
          Hv = dim32(v, 2, op, "v"), dv = dim32(v, 3, op, "v");
          gp = f32_in(engine, g, op, "g", {B, T, Hv});
          bp = f32_in(engine, beta, op, "beta", {B, T, Hv});
          if (state) sp = f32_in(engine, *state, op, "state", {B, Hv, dk, dv});
        } else {
          qp = f32_in(engine, q, op, "q", {-1, -1, -1});
          T = dim32(q, 0, op, "q"), Hk = dim32(q, 1, op, "q"), dk = dim32(q, 2, op, "q");
          kp = f32_in(engine, k, op, "k", {T, Hk, dk});
          vp = f32_in(engine, v, op, "v", {T, -1, -1});
          Hv = dim32(v, 1, op, "v"), dv = dim32(v, 2, op, "v");
          gp = f32_in(engine, g, op, "g", {T, Hv});
          bp = f32_in(engine, beta, op, "beta", {T, Hv});
          if (state) sp = f32_in(engine, *state, op, "state", {Hv, dk, dv});
        }
        if (Hk < 1 || Hv < 1 || Hv % Hk != 0 || dk < 1 || dv < 1) {
          raise_contract(kContractShape,
                         std::string(op) + ": q of shape " + shape_str(q) + " and v of shape " +
                             shape_str(v) + " need key heads Hk >= 1, value heads Hv a multiple "
                             "of Hk, and head sizes dk, dv >= 1");
        }
        // transformers: scale = dk ** -0.5 in double, applied to f32 q as an f32 scalar.
        if (scale) check_finite(*scale, op, "scale");
        const float sc = scale ? *scale : static_cast<float>(1.0 / std::sqrt(double(dk)));
        // The CUDA scan moves each state plane as float4 (KDA's kernels).
        if (on_cuda(engine) && sp && (reinterpret_cast<uintptr_t>(sp) & 15u) != 0) {
          raise_contract(kContractStride, std::string(op) + ": argument 'state' must start on a "
                                          "16-byte boundary on the device (the CUDA scan loads it "
                                          "as float4)");
        }
        const int64_t plane = int64_t(Hv) * dk * dv;
        const std::vector<size_t> o_shape =
            batch ? std::vector<size_t>{sz(B), sz(T), sz(Hv), sz(dv)}
                  : std::vector<size_t>{sz(T), sz(Hv), sz(dv)};
        const std::vector<size_t> s_shape =
            batch ? std::vector<size_t>{sz(B), sz(Hv), sz(dk), sz(dv)}
                  : std::vector<size_t>{sz(Hv), sz(dk), sz(dv)};
        // The op writes every element of o and of each state_out plane when T >= 1; at T == 0
        // state_out is the input state (copied below) or zeros (the one case that needs the fill).
        Out o = out_f32_uninit(engine, o_shape);
        Out so = T == 0 && !sp ? out_f32(engine, s_shape) : out_f32_uninit(engine, s_shape);
        if (T == 0 || B == 0) {
          if (sp) copy_on(engine, so.ptr, sp, sizeof(float) * sz(B) * sz(plane), op);
          return std::make_pair(o.obj, so.obj);
        }
        // Per-sequence plane tables: host arrays on the CPU, device copies on CUDA.
        std::vector<const float*> ins;
        std::vector<float*> outs;
        for (int s = 0; s < B; ++s) {
          if (sp) ins.push_back(sp + s * plane);
          outs.push_back(so.data<float>() + s * plane);
        }
        const float* const* in_t = sp ? ins.data() : nullptr;
        float* const* out_t = outs.data();
        std::shared_ptr<DeviceBuffer> in_d, out_d;
        if (on_cuda(engine)) {
          if (sp) {
            in_d = device_upload(engine, ins.data(), ins.size() * sizeof(float*));
            in_t = static_cast<const float* const*>(in_d->data());
          }
          out_d = device_upload(engine, outs.data(), outs.size() * sizeof(float*));
          out_t = static_cast<float* const*>(out_d->data());
        }
        const MemraGdnScanParams p{qp, kp, int64_t(Hk) * dk, vp, int64_t(Hv) * dv, gp, bp, B, T,
                                   Hk, Hv, dk, dv, sc, in_t, out_t, o.data<float>(),
                                   chunked ? 1 : 0};
        run_op(engine, [&] { return op::gdn_scan(backend(engine), p); });
        return std::make_pair(o.obj, so.obj);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
      nb::arg("state") = nb::none(), nb::kw_only(), nb::arg("scale") = nb::none(),
      nb::arg("batch") = false, nb::arg("chunked") = false,
      nb::arg("engine").none() = nb::none(),
      "Gated delta rule with grouped heads, T steps in order (the recurrent form), from `state`\n"
      "(None = zeros).\n\n"
      "q, k [T, Hk, dk] float32 (already L2-normalised, see gdn_l2norm); v [T, Hv, dv];\n"
      "g [T, Hv] log decay and beta [T, Hv] (gdn_gate); state [Hv, dk, dv] float32 or None.\n"
      "Value head h reads key head h // (Hv // Hk) (transformers' repeat_interleave order).\n"
      "Per step and value head:\n"
      "  S = S * exp(g_t); S += k_t (beta_t (v_t - k_t^T S)); o_t = (scale q_t)^T S\n"
      "with scale = dk**-0.5 unless given. Returns (o [T, Hv, dv], state_out [Hv, dk, dv]); the\n"
      "input state is not modified. Chaining calls (one T-step call, or T one-step calls\n"
      "passing state_out on) gives the same bits.\n"
      "batch=True: B sequences in one call: q, k [B, T, Hk, dk]; v [B, T, Hv, dv]; g, beta\n"
      "[B, T, Hv]; state [B, Hv, dk, dv] or None -> (o [B, T, Hv, dv], state_out [B, Hv, dk, dv]);\n"
      "sequence b equals its own call bit for bit.\n"
      "engine: None or a CPU Engine runs the C++ reference; a CUDA Engine runs cuda/gdn.cu (the\n"
      "key heads expanded to the value heads, then KDA's scan kernels: built for dk = dv = 128\n"
      "only, another head size raises UnsupportedError (UNSUPPORTED_GEOMETRY); its dk-long sums\n"
      "are partial sums plus a warp tree, so it matches the CPU to ~1e-5 relative).\n"
      "chunked=True: on CUDA KDA's chunked tensor-core form after the expansion (the bf16\n"
      "models' prefill; kda_scan's chunked=True); the CPU runs its reference either way.\n"
      "Raises ContractError (CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE /\n"
      "CONTRACT_DEVICE) for a bad argument, CONTRACT_SHAPE when Hv is not a multiple of Hk,\n"
      "CONTRACT_VALUE for a non-finite scale, CONTRACT_STRIDE for a CUDA state whose data does\n"
      "not start on a 16-byte boundary.\n"
      "Reference: modeling_qwen3_5.torch_recurrent_gated_delta_rule after repeat_interleave of\n"
      "q and k (equal in exact arithmetic to torch_chunk_gated_delta_rule, the prefill form).");

  m.def(
      "rms_norm_gated_silu",
      [](const AnyArray& x, const AnyArray& gate, const AnyArray& weight, float eps,
         const Engine* engine) {
        const char* op = "rms_norm_gated_silu";
        check_eps(eps, op);
        const float* xp = f32_in(engine, x, op, "x", {-1, -1});
        const int T = dim32(x, 0, op, "x"), D = dim32(x, 1, op, "x");
        const float* gp = f32_in(engine, gate, op, "gate", {T, D});
        const float* wp = f32_in(engine, weight, op, "weight", {D});
        Out y = out_f32_uninit(engine, {sz(T), sz(D)});  // the op writes every element
        run_op(engine, [&] {
          return op::rms_norm_gated_silu(backend(engine), xp, gp, T, D, wp, eps, y.data<float>());
        });
        return y.obj;
      },
      nb::arg("x"), nb::arg("gate"), nb::arg("weight"), nb::kw_only(), nb::arg("eps"),
      nb::arg("engine").none() = nb::none(),
      "The Gated DeltaNet output norm: weight * rmsnorm(x) * silu(gate), i.e.\n"
      "(weight * (x * (1 / sqrt(mean(x^2) + eps)))) * (gate / (1 + exp(-gate))); x, gate [T, D],\n"
      "weight [D] (a plain weight, not zero-centred), float32 on the engine's device.\n"
      "Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE;\n"
      "CONTRACT_VALUE for a negative or non-finite eps).\n"
      "Reference: Qwen3_5RMSNormGated.forward (models/qwen3_5; Qwen3NextRMSNormGated).");
}

}  // namespace memra::py
