// Functional bindings of the basic CPU ops (ops.h, cpu/basic.cpp) over DLPack arrays.
// Every function checks its arguments (ContractError naming the op and the values), allocates
// its output and releases the GIL while computing.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <optional>

#include "common.h"
#include "memra/ops.h"

namespace memra::py {

void init_ops_basic(nb::module_& m) {
  m.def(
      "embedding",
      [](const Weight& table, const AnyArray& ids) {
        if (table.shape().size() != 2) {
          raise_contract(kContractShape, "embedding: table must be [vocab, D], got shape " + table.shape_str());
        }
        const int32_t* id = i32_arg(ids, "embedding", "ids", {-1});
        const int T = static_cast<int>(dim(ids, 0));
        for (int t = 0; t < T; ++t) {
          if (id[t] < 0 || id[t] >= table.rows()) {
            raise_contract(kContractRange, "embedding: token id " + std::to_string(id[t]) +
                                               " at position " + std::to_string(t) +
                                               " is outside the vocabulary [0, " +
                                               std::to_string(table.rows()) + ")");
          }
        }
        NpF32 out = new_f32({static_cast<size_t>(T), static_cast<size_t>(table.cols())});
        {
          nb::gil_scoped_release nogil;
          cpu::embedding(table, id, T, out.data());
        }
        return out;
      },
      nb::arg("table"), nb::arg("ids"),
      "Rows of `table` [vocab, D] for `ids` [T] int32 -> [T, D] float32. ContractError "
      "(CONTRACT_RANGE) for an id outside [0, vocab). Reference: nn.Embedding.");

  m.def(
      "linear",
      [](const AnyArray& x, const Weight& w, std::optional<AnyArray> bias) {
        if (w.shape().size() != 2) {
          raise_contract(kContractShape, "linear: weight must be [N, K], got shape " + w.shape_str());
        }
        const float* xp = f32_arg(x, "linear", "x", {-1, w.cols()});
        const float* bp = bias ? f32_arg(*bias, "linear", "bias", {w.rows()}) : nullptr;
        const int T = static_cast<int>(dim(x, 0));
        NpF32 y = new_f32({static_cast<size_t>(T), static_cast<size_t>(w.rows())});
        {
          nb::gil_scoped_release nogil;
          cpu::linear(xp, T, w, bp, y.data());
        }
        return y;
      },
      nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(),
      "y [T, N] = x [T, K] @ w [N, K]^T (+ bias [N]), f32 accumulation. Reference: nn.Linear.");

  m.def(
      "rms_norm",
      [](const AnyArray& x, std::optional<AnyArray> weight, float eps) {
        const float* xp = f32_arg(x, "rms_norm", "x", {-1, -1});
        const int T = static_cast<int>(dim(x, 0)), D = static_cast<int>(dim(x, 1));
        const float* wp = weight ? f32_arg(*weight, "rms_norm", "weight", {D}) : nullptr;
        NpF32 y = new_f32({static_cast<size_t>(T), static_cast<size_t>(D)});
        {
          nb::gil_scoped_release nogil;
          cpu::rms_norm(xp, T, D, wp, eps, y.data());
        }
        return y;
      },
      nb::arg("x"), nb::arg("weight") = nb::none(), nb::kw_only(), nb::arg("eps"),
      "RMSNorm over the last dim of x [T, D]; unweighted when weight is None. "
      "Reference: Glm5NextTextRMSNorm / Glm5NextTextUnweightedRMSNorm.");

  m.def(
      "rms_norm_gated",
      [](const AnyArray& x, const AnyArray& gate, const AnyArray& weight, float eps) {
        const float* xp = f32_arg(x, "rms_norm_gated", "x", {-1, -1});
        const int T = static_cast<int>(dim(x, 0)), D = static_cast<int>(dim(x, 1));
        const float* gp = f32_arg(gate, "rms_norm_gated", "gate", {T, D});
        const float* wp = f32_arg(weight, "rms_norm_gated", "weight", {D});
        NpF32 y = new_f32({static_cast<size_t>(T), static_cast<size_t>(D)});
        {
          nb::gil_scoped_release nogil;
          cpu::rms_norm_gated_sigmoid(xp, gp, T, D, wp, eps, y.data());
        }
        return y;
      },
      nb::arg("x"), nb::arg("gate"), nb::arg("weight"), nb::kw_only(), nb::arg("eps"),
      "weight * rmsnorm(x) * sigmoid(gate); x, gate [T, D], weight [D]. "
      "Reference: Glm5NextTextRMSNormGated.");

  m.def(
      "layer_norm",
      [](const AnyArray& x, const AnyArray& weight, const AnyArray& bias, float eps) {
        const float* xp = f32_arg(x, "layer_norm", "x", {-1, -1});
        const int T = static_cast<int>(dim(x, 0)), D = static_cast<int>(dim(x, 1));
        const float* wp = f32_arg(weight, "layer_norm", "weight", {D});
        const float* bp = f32_arg(bias, "layer_norm", "bias", {D});
        NpF32 y = new_f32({static_cast<size_t>(T), static_cast<size_t>(D)});
        {
          nb::gil_scoped_release nogil;
          cpu::layer_norm(xp, T, D, wp, bp, eps, y.data());
        }
        return y;
      },
      nb::arg("x"), nb::arg("weight"), nb::arg("bias"), nb::kw_only(), nb::arg("eps"),
      "LayerNorm with weight and bias over the last dim of x [T, D]. Reference: nn.LayerNorm.");

  m.def(
      "l2norm_heads",
      [](const AnyArray& x, float eps) {
        const float* xp = f32_arg(x, "l2norm_heads", "x", {-1, -1, -1});
        const int T = static_cast<int>(dim(x, 0)), H = static_cast<int>(dim(x, 1)),
                  d = static_cast<int>(dim(x, 2));
        NpF32 y = new_f32({static_cast<size_t>(T), static_cast<size_t>(H), static_cast<size_t>(d)});
        std::memcpy(y.data(), xp, sizeof(float) * T * H * d);
        {
          nb::gil_scoped_release nogil;
          cpu::l2norm_heads(y.data(), T, H, d, eps);
        }
        return y;
      },
      nb::arg("x"), nb::kw_only(), nb::arg("eps") = 1e-6f,
      "x [T, H, d] / sqrt(sum(x^2, -1) + eps). Reference: modeling_glm5_next.l2norm.");

  m.def(
      "rope_interleaved",
      [](const AnyArray& x, const AnyArray& positions, float base) {
        const float* xp = f32_arg(x, "rope_interleaved", "x", {-1, -1, -1});
        const int T = static_cast<int>(dim(x, 0)), n = static_cast<int>(dim(x, 1)),
                  d = static_cast<int>(dim(x, 2));
        const int32_t* pp = i32_arg(positions, "rope_interleaved", "positions", {T});
        NpF32 y = new_f32({static_cast<size_t>(T), static_cast<size_t>(n), static_cast<size_t>(d)});
        std::memcpy(y.data(), xp, sizeof(float) * T * n * d);
        check(cpu::rope_interleaved(y.data(), pp, T, n, d, base));
        return y;
      },
      nb::arg("x"), nb::arg("positions"), nb::kw_only(), nb::arg("base") = 10000.0f,
      "Interleaved RoPE: rotates pairs (2j, 2j+1) of x [T, n_vec, d_rope] by "
      "pos * base^(-2j/d_rope); positions [T] int32. ContractError (CONTRACT_ODD_ROPE) for odd "
      "d_rope. Only applied where the model family rotates (glm5_next and Kimi-Linear never do).");
}

}  // namespace memra::py
