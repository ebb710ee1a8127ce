// Functional bindings of the FFN, mHC and sampling CPU ops (ops.h, cpu/ffn.cpp, cpu/mhc.cpp,
// cpu/sample.cpp) over DLPack arrays. Every function checks its arguments (ContractError naming
// the op and the values), allocates its outputs and releases the GIL while computing.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <optional>
#include "memra/msg.h"
#include <string>
#include <vector>

#include "common.h"
#include "memra/ops.h"

namespace memra::py {

namespace {

using NpU64 = nb::ndarray<nb::numpy, uint64_t>;

std::string shape_of(const Weight& w) { return w.shape_str(); }

// A weight of exactly `rows` x `cols` (as [rows, cols] after folding leading dims).
void check_weight(const Weight& w, const char* op, const char* name, int64_t rows, int64_t cols) {
  if (w.rows() != rows || w.cols() != cols || w.shape().size() != 2) {
    Msg os;
    os << op << ": weight '" << name << "' has shape " << shape_of(w) << ", expected [" << rows
       << ", " << cols << "]";
    raise_contract(kContractShape, os.str());
  }
}

void check_value(bool ok, const char* op, const std::string& what) {
  if (!ok) raise_contract(kContractValue, std::string(op) + ": " + what);
}

// Counters for sampling: int64 or uint64, 1-D [B], C-contiguous, host. int64 values must be
// non-negative (they are reinterpreted as uint64). common.h's checkers cover f32/i32 only.
std::vector<uint64_t> counter_arg(const AnyArray& a, const char* op, const char* name, int64_t B) {
  Msg os;
  if (a.device_type() != nb::device::cpu::value) {
    os << op << ": argument '" << name << "' must live in host memory for the CPU backend, got "
       << "a tensor on DLPack device type " << a.device_type();
    raise_contract(kContractDevice, os.str());
  }
  const auto code = static_cast<nb::dlpack::dtype_code>(a.dtype().code);
  const bool is_i64 = code == nb::dlpack::dtype_code::Int && a.dtype().bits == 64;
  const bool is_u64 = code == nb::dlpack::dtype_code::UInt && a.dtype().bits == 64;
  if (!(is_i64 || is_u64) || a.dtype().lanes != 1) {
    os << op << ": argument '" << name << "' must be int64 or uint64, got a "
       << static_cast<int>(a.dtype().bits) << "-bit array of DLPack type code "
       << static_cast<int>(a.dtype().code);
    raise_contract(kContractDType, os.str());
  }
  if (a.ndim() != 1 || static_cast<int64_t>(a.shape(0)) != B) {
    os << op << ": argument '" << name << "' has shape " << shape_str(a) << ", expected [" << B
       << "]";
    raise_contract(kContractShape, os.str());
  }
  if (B > 1 && a.stride(0) != 1) {
    os << op << ": argument '" << name << "' with shape " << shape_str(a)
       << " must be C-contiguous (call np.ascontiguousarray first)";
    raise_contract(kContractStride, os.str());
  }
  std::vector<uint64_t> out(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    if (is_i64) {
      const int64_t v = static_cast<const int64_t*>(a.data())[b];
      if (v < 0) {
        os << op << ": argument '" << name << "' holds the negative counter " << v
           << " at row " << b;
        raise_contract(kContractRange, os.str());
      }
      out[b] = static_cast<uint64_t>(v);
    } else {
      out[b] = static_cast<const uint64_t*>(a.data())[b];
    }
  }
  return out;
}

size_t sz(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

void init_ops_ffn(nb::module_& m) {
  m.def(
      "swiglu_mlp",
      [](const AnyArray& x, const Weight& gate_w, const Weight& up_w, const Weight& down_w,
         float limit) {
        const char* op = "swiglu_mlp";
        const float* xp = f32_arg(x, op, "x", {-1, -1});
        const int64_t T = dim(x, 0), D = dim(x, 1), I = gate_w.rows();
        check_weight(gate_w, op, "gate_w", I, D);
        check_weight(up_w, op, "up_w", I, D);
        check_weight(down_w, op, "down_w", D, I);
        check_value(limit > 0.0f, op, "limit must be > 0, got " + std::to_string(limit));
        NpF32 y = new_f32({sz(T), sz(D)});
        {
          nb::gil_scoped_release nogil;
          cpu::swiglu_mlp(xp, static_cast<int>(T), gate_w, up_w, down_w, limit, y.data());
        }
        return y;
      },
      nb::arg("x"), nb::arg("gate_w"), nb::arg("up_w"), nb::arg("down_w"), nb::kw_only(),
      nb::arg("limit"),
      "SwiGLU MLP with the clamp: y = (silu(min(x gate_w^T, limit)) * clamp(x up_w^T, +-limit)) "
      "down_w^T.\n\nx [T, D] float32; gate_w, up_w Weight [I, D]; down_w Weight [D, I]; "
      "limit > 0 (swiglu_limit). Returns y [T, D] float32.\nRaises ContractError (CONTRACT_DTYPE, "
      "CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for limit <= 0).\n"
      "Reference: transformers Glm5NextTextMLP.forward.");

  m.def(
      "moe_route",
      [](const AnyArray& x, const Weight& gate_w, std::optional<AnyArray> corr_bias, int top_k,
         int n_group, int topk_group, bool norm_topk_prob, float scaling) {
        const char* op = "moe_route";
        const float* xp = f32_arg(x, op, "x", {-1, -1});
        const int64_t T = dim(x, 0), D = dim(x, 1), E = gate_w.rows();
        check_weight(gate_w, op, "gate_w", E, D);
        const float* bp = corr_bias ? f32_arg(*corr_bias, op, "corr_bias", {E}) : nullptr;
        check_value(n_group >= 1 && E % n_group == 0, op,
                    "n_group=" + std::to_string(n_group) + " must divide the " +
                        std::to_string(E) + " experts");
        check_value(topk_group >= 1 && topk_group <= n_group, op,
                    "topk_group=" + std::to_string(topk_group) + " must be in [1, n_group=" +
                        std::to_string(n_group) + "]");
        const int64_t kept = static_cast<int64_t>(topk_group) * (E / n_group);
        check_value(top_k >= 1 && top_k <= kept, op,
                    "top_k=" + std::to_string(top_k) + " must be in [1, " + std::to_string(kept) +
                        "] (topk_group * experts per group)");
        NpI32 idx = new_i32({sz(T), sz(top_k)});
        NpF32 w = new_f32({sz(T), sz(top_k)});
        {
          nb::gil_scoped_release nogil;
          cpu::moe_route(xp, static_cast<int>(T), static_cast<int>(D), gate_w, bp,
                         static_cast<int>(E), top_k, n_group, topk_group, norm_topk_prob, scaling,
                         idx.data(), w.data());
        }
        return nb::make_tuple(idx, w);
      },
      nb::arg("x"), nb::arg("gate_w"), nb::arg("corr_bias") = nb::none(), nb::kw_only(),
      nb::arg("top_k"), nb::arg("n_group"), nb::arg("topk_group"), nb::arg("norm_topk_prob"),
      nb::arg("scaling"),
      "Sigmoid router with grouped selection.\n\nx [T, D] float32; gate_w Weight [E, D]; "
      "corr_bias [E] float32 or None (e_score_correction_bias: used only to choose).\n"
      "Logits in f32 -> sigmoid scores s; choice c = s + bias; group score = sum of the top-2 c "
      "of each of the n_group groups; keep the best topk_group groups (ties: lower group); "
      "top_k experts by c among them (ties: lower id), sorted by c desc. Weights = s of the "
      "chosen experts, / (sum + 1e-20) when norm_topk_prob, times scaling.\nReturns (idx [T, "
      "top_k] int32, w [T, top_k] float32).\nRaises ContractError (CONTRACT_DTYPE, "
      "CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE when n_group does not "
      "divide E, topk_group is outside [1, n_group] or top_k outside [1, topk_group * E / "
      "n_group]).\nReference: transformers Glm5NextTextTopkRouter.forward.");

  m.def(
      "moe_forward",
      [](const AnyArray& x, const AnyArray& idx, const AnyArray& w,
         const std::vector<Weight>& gate_ws, const std::vector<Weight>& up_ws,
         const std::vector<Weight>& down_ws, float limit) {
        const char* op = "moe_forward";
        const float* xp = f32_arg(x, op, "x", {-1, -1});
        const int64_t T = dim(x, 0), D = dim(x, 1);
        const int32_t* ip = i32_arg(idx, op, "idx", {T, -1});
        const int64_t K = dim(idx, 1);
        const float* wp = f32_arg(w, op, "w", {T, K});
        const int64_t E = static_cast<int64_t>(gate_ws.size());
        if (E == 0 || static_cast<int64_t>(up_ws.size()) != E ||
            static_cast<int64_t>(down_ws.size()) != E) {
          raise_contract(kContractShape,
                         std::string(op) + ": gate_ws, up_ws, down_ws must be non-empty lists " +
                             "of one weight per expert, got " + std::to_string(gate_ws.size()) +
                             ", " + std::to_string(up_ws.size()) + ", " +
                             std::to_string(down_ws.size()));
        }
        const int64_t I = gate_ws[0].rows();
        for (int64_t e = 0; e < E; ++e) {
          const std::string g = "gate_ws[" + std::to_string(e) + "]",
                            u = "up_ws[" + std::to_string(e) + "]",
                            d = "down_ws[" + std::to_string(e) + "]";
          check_weight(gate_ws[e], op, g.c_str(), I, D);
          check_weight(up_ws[e], op, u.c_str(), I, D);
          check_weight(down_ws[e], op, d.c_str(), D, I);
        }
        for (int64_t r = 0; r < T * K; ++r) {
          if (ip[r] < 0 || ip[r] >= E) {
            raise_contract(kContractRange, std::string(op) + ": expert id " +
                                               std::to_string(ip[r]) + " at idx[" +
                                               std::to_string(r / K) + ", " +
                                               std::to_string(r % K) + "] is outside [0, " +
                                               std::to_string(E) + ")");
          }
        }
        check_value(limit > 0.0f, op, "limit must be > 0, got " + std::to_string(limit));
        NpF32 y = new_f32({sz(T), sz(D)});
        {
          nb::gil_scoped_release nogil;
          cpu::moe_forward(xp, static_cast<int>(T), static_cast<int>(D), ip, wp,
                           static_cast<int>(K), gate_ws.data(), up_ws.data(), down_ws.data(),
                           static_cast<int>(E), limit, y.data());
        }
        return y;
      },
      nb::arg("x"), nb::arg("idx"), nb::arg("w"), nb::arg("gate_ws"), nb::arg("up_ws"),
      nb::arg("down_ws"), nb::kw_only(), nb::arg("limit"),
      "Routed experts: y[t] = sum_j w[t, j] * expert_{idx[t, j]}(x[t]), each expert the clamped "
      "SwiGLU MLP; per token the terms are added in ascending expert id. The shared expert is "
      "NOT included (add swiglu_mlp of it).\n\nx [T, D] float32; idx [T, k] int32 in [0, E); "
      "w [T, k] float32; gate_ws, up_ws: lists of E Weights [I, D]; down_ws: E Weights [D, I]. "
      "Returns y [T, D] float32.\nRaises ContractError (CONTRACT_RANGE for an expert id outside "
      "[0, E); CONTRACT_SHAPE for a mismatched list or weight; CONTRACT_DTYPE, CONTRACT_STRIDE, "
      "CONTRACT_DEVICE; CONTRACT_VALUE for limit <= 0).\nReference: transformers "
      "Glm5NextTextExperts.forward.");

  m.def(
      "sample",
      [](const AnyArray& logits, const AnyArray& counters, float temperature, int top_k,
         float top_p, uint64_t seed) {
        const char* op = "sample";
        const float* lp = f32_arg(logits, op, "logits", {-1, -1});
        const int64_t B = dim(logits, 0), V = dim(logits, 1);
        check_value(V >= 1, op, "logits must have at least one column");
        check_value(!std::isnan(temperature), op, "temperature is NaN");
        check_value(top_p > 0.0f, op, "top_p must be > 0, got " + std::to_string(top_p));
        std::vector<uint64_t> ctr = counter_arg(counters, op, "counters", B);
        NpI32 out = new_i32({sz(B)});
        {
          nb::gil_scoped_release nogil;
          cpu::sample(lp, static_cast<int>(B), static_cast<int>(V), temperature, top_k, top_p,
                      seed, ctr.data(), out.data());
        }
        return out;
      },
      nb::arg("logits"), nb::arg("counters"), nb::kw_only(), nb::arg("temperature"),
      nb::arg("top_k") = 0, nb::arg("top_p") = 1.0f, nb::arg("seed") = 0,
      "One token per row.\n\nlogits [B, V] float32; counters [B] uint64 or int64 (>= 0), the "
      "per-row draw index. temperature <= 0: argmax (ties to the lower id). Otherwise "
      "softmax(logits / temperature) in f32; keep the top_k most likely (0: all), then the "
      "shortest prefix in (p desc, id asc) order whose top-k-renormalised mass reaches top_p "
      "(>= 1: all); draw by inverse CDF with u = uniform_from_counter(seed, counter) (splitmix64; "
      "the exact formula is in ops.h). Returns int32 [B].\nRaises ContractError (CONTRACT_DTYPE "
      "for counters not int64/uint64 or logits not float32, CONTRACT_SHAPE, CONTRACT_STRIDE, "
      "CONTRACT_DEVICE, CONTRACT_RANGE for a negative int64 counter, CONTRACT_VALUE for top_p <= "
      "0 or a NaN temperature).\nReference: transformers' temperature / TopK / TopP logits "
      "warpers followed by multinomial, with a counter-based draw.");

  m.def(
      "uniform_from_counter",
      [](uint64_t seed, uint64_t counter) { return cpu::uniform_from_counter(seed, counter); },
      nb::arg("seed"), nb::arg("counter"),
      "The counter-based uniform in [0, 1) that sample draws with (exact formula in ops.h).");
}

}  // namespace memra::py
