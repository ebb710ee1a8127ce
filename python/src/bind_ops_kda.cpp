// Functional bindings of the KDA CPU ops (ops.h, cpu/kda.cpp) over DLPack arrays: short conv,
// forget gate, recurrent scan. Every function checks its arguments (ContractError naming the op
// and the values), allocates its outputs and releases the GIL while computing.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "common.h"
#include "memra/ops.h"

namespace memra::py {

namespace {

size_t sz(int64_t n) { return static_cast<size_t>(n); }

}  // namespace

void init_ops_kda(nb::module_& m) {
  m.def(
      "kda_conv",
      [](const AnyArray& x, const AnyArray& w, const AnyArray& ring) {
        const float* xp = f32_arg(x, "kda_conv", "x", {-1, -1});
        const int64_t T = dim(x, 0), C = dim(x, 1);
        // An empty kernel is refused first: it is a shape error, whatever its strides say.
        if (w.ndim() == 2 && w.shape(1) == 0) {
          raise_contract(kContractShape, "kda_conv: argument 'w' has shape " + shape_str(w) +
                                             ", the conv kernel K must be >= 1");
        }
        const float* wp = f32_arg(w, "kda_conv", "w", {C, -1});
        const int64_t K = dim(w, 1);
        const float* rp = f32_arg(ring, "kda_conv", "ring", {C, K - 1});
        NpF32 y = new_f32({sz(T), sz(C)});
        NpF32 ring_out = new_f32({sz(C), sz(K - 1)});
        {
          nb::gil_scoped_release nogil;
          if (T == 1) {
            cpu::kda_conv_decode(xp, int(C), wp, int(K), rp, ring_out.data(), y.data());
          } else {
            cpu::kda_conv_prefill(xp, int(T), int(C), wp, int(K), rp, ring_out.data(), y.data());
          }
        }
        return std::make_pair(y, ring_out);
      },
      nb::arg("x"), nb::arg("w"), nb::arg("ring"),
      "Causal depthwise conv + SiLU over the fused q|k|v channels, continuing from a ring.\n\n"
      "x [T, C] float32 pre-conv projections; w [C, K] float32 taps (tap 0 meets the oldest\n"
      "input); ring [C, K-1] float32, the previous K-1 inputs of each channel, oldest first\n"
      "(zeros for a fresh sequence). Returns (y [T, C], ring_out [C, K-1]) where\n"
      "y = silu(conv(ring ++ x)) and ring_out = the last K-1 inputs of ring ++ x (for T < K-1\n"
      "it still holds some old ring values). T == 1 runs the decode arm, which equals the\n"
      "prefill arm bit for bit, so kda_conv(x[:T-1]) then kda_conv(x[T-1:]) == kda_conv(x).\n"
      "Raises ContractError (CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE /\n"
      "CONTRACT_DEVICE) for a non-float32, mis-shaped, non-C-contiguous or device array.\n"
      "Reference: modeling_glm5_next.causal_conv1d_fn / causal_conv1d_update with\n"
      "activation='silu' and the cache's conv state.");

  m.def(
      "kda_gate",
      [](const AnyArray& f, const AnyArray& dt_bias, const AnyArray& A_log,
         const std::string& form, float lower_bound) {
        cpu::KdaGateForm gf;
        if (form == "lower_bound") {
          gf = cpu::KdaGateForm::kLowerBound;
        } else if (form == "softplus") {
          gf = cpu::KdaGateForm::kSoftplus;
        } else {
          raise_contract(kContractValue, "kda_gate: form must be 'lower_bound' or 'softplus', got '" +
                                             form + "'");
        }
        const float* fp = f32_arg(f, "kda_gate", "f", {-1, -1});
        const int64_t T = dim(f, 0), D = dim(f, 1);
        const float* ap = f32_arg(A_log, "kda_gate", "A_log", {-1});
        const int64_t H = dim(A_log, 0);
        if (H < 1 || D % H != 0) {
          raise_contract(kContractShape, "kda_gate: argument 'f' has shape " + shape_str(f) +
                                             ", its last dim must be H*dk with H = " +
                                             std::to_string(H) + " heads (the length of A_log)");
        }
        const float* bp = f32_arg(dt_bias, "kda_gate", "dt_bias", {D});
        NpF32 g = new_f32({sz(T), sz(D)});
        {
          nb::gil_scoped_release nogil;
          cpu::kda_gate(fp, bp, ap, int(T), int(H), int(D / H), gf, lower_bound, g.data());
        }
        return g;
      },
      nb::arg("f"), nb::arg("dt_bias"), nb::arg("A_log"), nb::kw_only(),
      nb::arg("form") = "lower_bound", nb::arg("lower_bound") = -5.0f,
      "KDA log forget gate g [T, H*dk] float32 from f [T, H*dk] = f_b(f_a(x)), dt_bias [H*dk]\n"
      "(per channel) and A_log [H] (per head), all float32.\n\n"
      "form='lower_bound' (glm5_next): g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias)).\n"
      "form='softplus' (kimi_linear): g = -exp(A_log) * softplus(f + dt_bias) with\n"
      "softplus(x) = x if x > 20 else log(1 + exp(x)); lower_bound is ignored.\n"
      "Raises ContractError: CONTRACT_VALUE for another form, CONTRACT_SHAPE when the last dim\n"
      "of f is not a multiple of len(A_log) or dt_bias does not match it, CONTRACT_DTYPE /\n"
      "CONTRACT_STRIDE / CONTRACT_DEVICE as usual. Reference: Glm5NextTextForgetGate.forward.");

  m.def(
      "kda_scan",
      [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& g,
         const AnyArray& beta, std::optional<AnyArray> state, std::optional<float> scale) {
        const float* qp = f32_arg(q, "kda_scan", "q", {-1, -1, -1});
        const int64_t T = dim(q, 0), H = dim(q, 1), dk = dim(q, 2);
        const float* kp = f32_arg(k, "kda_scan", "k", {T, H, dk});
        const float* vp = f32_arg(v, "kda_scan", "v", {T, H, -1});
        const int64_t dv = dim(v, 2);
        const float* gp = f32_arg(g, "kda_scan", "g", {T, H, dk});
        const float* bp = f32_arg(beta, "kda_scan", "beta", {T, H});
        const float* sp = state ? f32_arg(*state, "kda_scan", "state", {H, dk, dv}) : nullptr;
        if (dk < 1 && !scale) {
          raise_contract(kContractShape, "kda_scan: argument 'q' has shape " + shape_str(q) +
                                             ", the default scale dk**-0.5 needs dk >= 1");
        }
        // transformers: scale = 1 / (dk ** 0.5) in double, applied to f32 q as an f32 scalar.
        const float sc = scale ? *scale : static_cast<float>(1.0 / std::sqrt(double(dk)));
        NpF32 o = new_f32({sz(T), sz(H), sz(dv)});
        NpF32 state_out = new_f32({sz(H), sz(dk), sz(dv)});
        {
          nb::gil_scoped_release nogil;
          cpu::kda_scan(qp, kp, vp, gp, bp, int(T), int(H), int(dk), int(dv), sc, sp,
                        state_out.data(), o.data());
        }
        return std::make_pair(o, state_out);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
      nb::arg("state") = nb::none(), nb::kw_only(), nb::arg("scale") = nb::none(),
      "KDA delta-rule scan, T steps in order (the recurrent form), from `state` (None = zeros).\n\n"
      "q, k [T, H, dk] float32 (already L2-normalised, see l2norm_heads); v [T, H, dv];\n"
      "g [T, H, dk] log forget gate (kda_gate); beta [T, H] (sigmoid of b_proj);\n"
      "state [H, dk, dv] float32 or None. Per step and head:\n"
      "  S = S * exp(g_t)[:, None]; S += k_t (beta_t (v_t - k_t^T S)); o_t = (scale q_t)^T S\n"
      "with scale = dk**-0.5 unless given. Returns (o [T, H, dv], state_out [H, dk, dv]); the\n"
      "input state is not modified. Chaining calls (one T-step call, or T one-step calls\n"
      "passing state_out on) gives the same bits. Raises ContractError (CONTRACT_DTYPE /\n"
      "CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE) for a bad argument.\n"
      "Reference: modeling_glm5_next.recurrent_kimi_delta_attention (equal in exact arithmetic\n"
      "to chunk_kimi_delta_attention, which transformers uses for multi-token prefill).");
}

}  // namespace memra::py
