// Functional bindings of the basic ops over DLPack arrays, through memra::op (op/basic.h): the
// CPU reference (engine None or a CPU Engine; cpu/basic.cpp, the oracle) or the CUDA backend
// (keyword `engine` = a CUDA Engine; cuda/basic.cu). On CUDA every array argument must live on
// the engine's device, weights are memra.DeviceWeight, outputs are allocated there and the work
// is enqueued on the engine's stream (read results with engine.to_host, which waits). Every
// function checks its arguments (ContractError naming the op and the values) before anything
// runs and, on the CPU, releases the GIL while computing. The linear family is
// bind_ops_linear.cpp's.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/op/basic.h"
#include "op_call.h"

namespace memra::py {

namespace {

size_t sz(int64_t n) { return static_cast<size_t>(n); }

// dst = src (bytes) on the engine's device: an async copy on a CUDA engine's stream.
void copy_array(const Engine* engine, void* dst, const void* src, size_t bytes, const char* op) {
  if (!on_cuda(engine)) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
  const CudaContext& c = cuda_ctx(engine);
  check_cuda(engine, c.api().copy(c.ctx(), dst, src, bytes), op);
}

std::string odd_rope_message(const AnyArray& x) {
  return "rope_interleaved: x has shape " + shape_str(x) + ": its last extent d_rope=" +
         std::to_string(x.ndim() ? x.shape(x.ndim() - 1) : 0) +
         " must be even (interleaved pairs (2j, 2j+1) are rotated)";
}

}  // namespace

void init_ops_linear(nb::module_& m);  // bind_ops_linear.cpp

void init_ops_basic(nb::module_& m) {
  m.def(
      "embedding",
      [](nb::handle table, const AnyArray& ids, bool check_range, std::optional<int64_t> expand,
         const Engine* engine) {
        const char* op = "embedding";
        if (expand && (*expand < 1 || *expand > INT32_MAX)) {
          raise_contract(kContractValue, "embedding: expand must be in [1, 2^31), got " +
                                             std::to_string(*expand));
        }
        const int hc = expand ? static_cast<int>(*expand) : 1;
        int64_t vocab = 0, D = 0;
        const Weight* hw = nullptr;
        const DeviceWeight* dw = nullptr;
        if (on_cuda(engine)) {
          dw = &device_weight(engine, table, op, "table");
          if (dw->shape.size() != 2) {
            raise_contract(kContractShape, "embedding: table must be [vocab, D], got shape " + dw->shape_str());
          }
          vocab = dw->rows;
          D = dw->cols;
        } else {
          hw = &host_weight(table, op, "table");
          if (hw->shape().size() != 2) {
            raise_contract(kContractShape, "embedding: table must be [vocab, D], got shape " + hw->shape_str());
          }
          vocab = hw->rows();
          D = hw->cols();
        }
        const int32_t* id = i32_in(engine, ids, op, "ids", {-1});
        const int T = dim32(ids, 0, op, "ids");
        const int32_t* host_ids = id;
        std::vector<int32_t> copied;
        if (on_cuda(engine) && check_range && T > 0) {
          copied.resize(sz(T));
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine, c.api().copy_to_host(c.ctx(), copied.data(), id, sizeof(int32_t) * sz(T)), op);
          host_ids = copied.data();
        }
        if (!on_cuda(engine) || check_range) {
          for (int t = 0; t < T; ++t) {
            if (host_ids[t] < 0 || host_ids[t] >= vocab) {
              raise_contract(kContractRange, "embedding: token id " + std::to_string(host_ids[t]) +
                                                 " at position " + std::to_string(t) +
                                                 " is outside the vocabulary [0, " +
                                                 std::to_string(vocab) + ")");
            }
          }
        }
        Out out = expand ? out_f32(engine, {sz(T), sz(hc), sz(D)}) : out_f32(engine, {sz(T), sz(D)});
        const MemraEmbeddingParams p{dw ? dw->data() : hw->data(),
                                     dw ? dw->dtype_code() : static_cast<int>(hw->dtype()),
                                     vocab, int(D), id, T, hc, out.data<float>()};
        run_op(engine, [&] { return op::embedding(backend(engine), p); });
        return out.obj;
      },
      nb::arg("table"), nb::arg("ids"), nb::kw_only(), nb::arg("check_range") = true,
      nb::arg("expand").none() = nb::none(), nb::arg("engine").none() = nb::none(),
      "Rows of `table` [vocab, D] for `ids` [T] int32 -> [T, D] float32 (with expand = hc: [T, "
      "hc, D], each row repeated hc times, hc_expand(embedding(...), hc) in one launch: a "
      "hyper-connection model's residual streams).\n\n"
      "table: memra.Weight (CPU) or memra.DeviceWeight (CUDA; float32 or bfloat16, converted "
      "exactly to float32). ids and the result live on the engine's device.\n"
      "check_range (CUDA only): copy the ids to the host to range-check them (one wait on the "
      "engine's stream); with False an id outside the vocabulary gives a zero row. The CPU "
      "always checks.\nRaises ContractError (CONTRACT_RANGE for an id outside [0, vocab); "
      "CONTRACT_VALUE for expand outside [1, 2^31); "
      "CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE for a bad argument).\n"
      "Reference: nn.Embedding.");

  init_ops_linear(m);  // the module lists the linear family after embedding

  m.def(
      "rms_norm",
      [](const AnyArray& x, std::optional<AnyArray> weight, float eps, const Engine* engine) {
        const char* op = "rms_norm";
        check_eps(eps, op);
        const float* xp = f32_in(engine, x, op, "x", {-1, -1});
        const int T = dim32(x, 0, op, "x"), D = dim32(x, 1, op, "x");
        const float* wp = weight ? f32_in(engine, *weight, op, "weight", {D}) : nullptr;
        Out y = out_f32_uninit(engine, {sz(T), sz(D)});
        run_op(engine, [&] {
          return op::rms_norm(backend(engine), xp, T, D, wp, eps, y.data<float>());
        });
        return y.obj;
      },
      nb::arg("x"), nb::arg("weight") = nb::none(), nb::kw_only(), nb::arg("eps"),
      nb::arg("engine").none() = nb::none(),
      "RMSNorm over the last dim of x [T, D] float32: (weight *) x / sqrt(mean(x^2) + eps); "
      "unweighted when weight is None. Arrays on the engine's device (host for the CPU).\n"
      "Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; "
      "CONTRACT_VALUE for an eps that is negative or not finite).\n"
      "Reference: Glm5NextTextRMSNorm / Glm5NextTextUnweightedRMSNorm.");

  m.def(
      "add_rms_norm",
      [](const AnyArray& x, const AnyArray& y, std::optional<AnyArray> weight, float eps,
         const Engine* engine) {
        const char* op = "add_rms_norm";
        check_eps(eps, op);
        const float* xp = f32_in(engine, x, op, "x", {-1, -1});
        const int T = dim32(x, 0, op, "x"), D = dim32(x, 1, op, "x");
        const float* yp = f32_in(engine, y, op, "y", {T, D});
        const float* wp = weight ? f32_in(engine, *weight, op, "weight", {D}) : nullptr;
        Out sum = out_f32_uninit(engine, {sz(T), sz(D)});
        Out h = out_f32_uninit(engine, {sz(T), sz(D)});
        run_op(engine, [&] {
          return op::add_rms_norm(backend(engine), xp, yp, T, D, wp, eps, sum.data<float>(),
                                  h.data<float>());
        });
        return nb::make_tuple(sum.obj, h.obj);
      },
      nb::arg("x"), nb::arg("y"), nb::arg("weight") = nb::none(), nb::kw_only(), nb::arg("eps"),
      nb::arg("engine").none() = nb::none(),
      "The plain pre-norm residual step: (residual, normed) = (x + y, rms_norm(x + y, weight, "
      "eps)), both [T, D] float32, the bytes of an f32 add followed by rms_norm. x (the residual "
      "stream) and y (a sublayer's output) [T, D] float32 and weight [D] (None: unweighted) on "
      "the engine's device.\nRaises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, "
      "CONTRACT_DEVICE; CONTRACT_VALUE for an eps that is negative or not finite).\nReference: "
      "the decoder layers of transformers' Kimi-Linear and Qwen3.5 (residual + hidden_states, then "
      "the next RMSNorm).");

  m.def(
      "rms_norm_gated",
      [](const AnyArray& x, const AnyArray& gate, const AnyArray& weight, float eps,
         const Engine* engine) {
        const char* op = "rms_norm_gated";
        check_eps(eps, op);
        const float* xp = f32_in(engine, x, op, "x", {-1, -1});
        const int T = dim32(x, 0, op, "x"), D = dim32(x, 1, op, "x");
        const float* gp = f32_in(engine, gate, op, "gate", {T, D});
        const float* wp = f32_in(engine, weight, op, "weight", {D});
        Out y = out_f32(engine, {sz(T), sz(D)});
        run_op(engine, [&] {
          return op::rms_norm_gated_sigmoid(backend(engine), xp, gp, T, D, wp, eps, y.data<float>());
        });
        return y.obj;
      },
      nb::arg("x"), nb::arg("gate"), nb::arg("weight"), nb::kw_only(), nb::arg("eps"),
      nb::arg("engine").none() = nb::none(),
      "weight * rmsnorm(x) * sigmoid(gate); x, gate [T, D], weight [D], float32 on the engine's "
      "device.\nRaises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, "
      "CONTRACT_DEVICE; CONTRACT_VALUE for an eps that is negative or not finite).\nReference: "
      "Glm5NextTextRMSNormGated.");

  m.def(
      "layer_norm",
      [](const AnyArray& x, const AnyArray& weight, const AnyArray& bias, float eps,
         const Engine* engine) {
        const char* op = "layer_norm";
        check_eps(eps, op);
        const float* xp = f32_in(engine, x, op, "x", {-1, -1});
        const int T = dim32(x, 0, op, "x"), D = dim32(x, 1, op, "x");
        const float* wp = f32_in(engine, weight, op, "weight", {D});
        const float* bp = f32_in(engine, bias, op, "bias", {D});
        Out y = out_f32(engine, {sz(T), sz(D)});
        run_op(engine, [&] {
          return op::layer_norm(backend(engine), xp, T, D, wp, bp, eps, y.data<float>());
        });
        return y.obj;
      },
      nb::arg("x"), nb::arg("weight"), nb::arg("bias"), nb::kw_only(), nb::arg("eps"),
      nb::arg("engine").none() = nb::none(),
      "LayerNorm with weight and bias over the last dim of x [T, D] float32 (two-pass mean and "
      "variance), arrays on the engine's device.\nRaises ContractError (CONTRACT_DTYPE, "
      "CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for an eps that is "
      "negative or not finite).\nReference: nn.LayerNorm.");

  m.def(
      "norm_rows",
      [](const AnyArray& x0, std::optional<AnyArray> w0, const AnyArray& x1,
         std::optional<AnyArray> w1, std::optional<AnyArray> x2, std::optional<AnyArray> w2,
         std::optional<AnyArray> b2, float eps0, float eps1, float eps2, const Engine* engine) {
        const char* op = "norm_rows";
        check_eps(eps0, op, "eps0");
        check_eps(eps1, op, "eps1");
        check_eps(eps2, op, "eps2");
        if (x2.has_value() != w2.has_value() || x2.has_value() != b2.has_value()) {
          raise_contract(kContractMissing, std::string(op) + ": x2, w2 and b2 come together");
        }
        const float* p0 = f32_in(engine, x0, op, "x0", {1, -1});
        const float* p1 = f32_in(engine, x1, op, "x1", {1, -1});
        const int D0 = dim32(x0, 1, op, "x0"), D1 = dim32(x1, 1, op, "x1");
        const float* q0 = w0 ? f32_in(engine, *w0, op, "w0", {D0}) : nullptr;
        const float* q1 = w1 ? f32_in(engine, *w1, op, "w1", {D1}) : nullptr;
        const float* p2 = x2 ? f32_in(engine, *x2, op, "x2", {1, -1}) : nullptr;
        const int D2 = x2 ? dim32(*x2, 1, op, "x2") : 0;
        const float* q2 = x2 ? f32_in(engine, *w2, op, "w2", {D2}) : nullptr;
        const float* c2 = x2 ? f32_in(engine, *b2, op, "b2", {D2}) : nullptr;
        Out y0 = out_f32(engine, {1, sz(D0)});
        Out y1 = out_f32(engine, {1, sz(D1)});
        Out y2 = out_f32(engine, {1, sz(D2)});
        const MemraNormRowsParams p{p0, D0, q0, eps0, y0.data<float>(), p1, D1, q1, eps1,
                                    y1.data<float>(), p2, D2, q2, c2, eps2,
                                    x2 ? y2.data<float>() : nullptr};
        run_op(engine, [&] { return op::norm_rows(backend(engine), p); });
        return nb::make_tuple(y0.obj, y1.obj, y2.obj);
      },
      nb::arg("x0"), nb::arg("w0").none(), nb::arg("x1"), nb::arg("w1").none(),
      nb::arg("x2").none() = nb::none(), nb::arg("w2").none() = nb::none(),
      nb::arg("b2").none() = nb::none(), nb::kw_only(), nb::arg("eps0"), nb::arg("eps1"),
      nb::arg("eps2") = 1e-6f, nb::arg("engine").none() = nb::none(),
      "The MLA projections' norms of one decode row in one launch: (rms_norm(x0, w0, eps0), "
      "rms_norm(x1, w1, eps1), layer_norm(x2, w2, b2, eps2)) -> (y0 [1, D0], y1 [1, D1], y2 [1, "
      "D2]) float32, each the bytes of its own rms_norm / layer_norm call; x_i [1, D_i] float32 on "
      "the engine's device, w0 / w1 may be None (unweighted), x2 None: no third row (y2 [1, 0]).\n"
      "Raises ContractError (CONTRACT_MISSING when x2, w2, b2 do not come together, "
      "CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for an "
      "eps_i that is negative or not finite).\nReference: "
      "Glm5NextTextRMSNorm (q_a_layernorm, kv_a_layernorm) and nn.LayerNorm (the indexer's k_norm).");

  m.def(
      "l2norm_heads",
      [](const AnyArray& x, float eps, const Engine* engine) {
        const char* op = "l2norm_heads";
        check_eps(eps, op);
        const float* xp = f32_in(engine, x, op, "x", {-1, -1, -1});
        const int T = dim32(x, 0, op, "x"), H = dim32(x, 1, op, "x"),
                  d = dim32(x, 2, op, "x");
        Out y = out_f32(engine, {sz(T), sz(H), sz(d)});
        copy_array(engine, y.ptr, xp, sizeof(float) * sz(T) * sz(H) * sz(d), op);
        run_op(engine, [&] {
          return op::l2norm_heads(backend(engine), y.data<float>(), T, H, d, eps);
        });
        return y.obj;
      },
      nb::arg("x"), nb::kw_only(), nb::arg("eps") = 1e-6f, nb::arg("engine").none() = nb::none(),
      "x [T, H, d] / sqrt(sum(x^2, -1) + eps), float32 on the engine's device (a new array).\n"
      "Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; "
      "CONTRACT_VALUE for an eps that is negative or not finite).\n"
      "Reference: modeling_glm5_next.l2norm.");

  m.def(
      "rope_interleaved",
      [](const AnyArray& x, const AnyArray& positions, float base, const Engine* engine) {
        const char* op = "rope_interleaved";
        const float* xp = f32_in(engine, x, op, "x", {-1, -1, -1});
        const int T = dim32(x, 0, op, "x"), n = dim32(x, 1, op, "x"),
                  d = dim32(x, 2, op, "x");
        const int32_t* pp = i32_in(engine, positions, op, "positions", {T});
        if (d % 2 != 0) raise_contract(kContractOddRope, odd_rope_message(x));
        check_value(std::isfinite(base) && base > 0.0f, op,
                    "base must be finite and > 0, got " + std::to_string(base));
        Out y = out_f32(engine, {sz(T), sz(n), sz(d)});
        // Rotated in place on a copy: the input is never written, and on error (an odd d_rope,
        // 40001, refused before anything runs) the copy is dropped.
        copy_array(engine, y.ptr, xp, sizeof(float) * sz(T) * sz(n) * sz(d), op);
        run_op(engine, [&] {
          return op::rope_interleaved(backend(engine), y.data<float>(), pp, T, n, d, base);
        });
        return y.obj;
      },
      nb::arg("x"), nb::arg("positions"), nb::kw_only(), nb::arg("base") = 10000.0f,
      nb::arg("engine").none() = nb::none(),
      "Interleaved RoPE: rotates pairs (2j, 2j+1) of x [T, n_vec, d_rope] float32 by "
      "pos * base^(-2j/d_rope) (angles in double, rounded once); positions [T] int32; both on the "
      "engine's device. Returns a new array. ContractError (CONTRACT_ODD_ROPE, 40001) for odd "
      "d_rope, CONTRACT_VALUE for a base that is not finite and > 0; d_rope == 0 returns the "
      "input unchanged. Only applied where the model family "
      "rotates (glm5_next and Kimi-Linear never do).");

  m.def(
      "sigmoid",
      [](const AnyArray& x, const Engine* engine) {
        const char* op = "sigmoid";
        const float* xp = f32_in(engine, x, op, "x", {-1});
        const int64_t n = dim(x, 0);
        Out y = out_f32(engine, {sz(n)});
        run_op(engine, [&] { return op::sigmoid(backend(engine), xp, n, y.data<float>()); });
        return y.obj;
      },
      nb::arg("x"), nb::kw_only(), nb::arg("engine").none() = nb::none(),
      "y = 1 / (1 + exp(-x)) elementwise; x [n] float32 (reshape(-1) first) on the engine's "
      "device.\nRaises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, "
      "CONTRACT_DEVICE). Reference: torch.sigmoid.");
}

}  // namespace memra::py
