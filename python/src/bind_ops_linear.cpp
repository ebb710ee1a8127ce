// Functional bindings of the linear family over DLPack arrays, through op::linear
// (op/linear.h): linear on either backend (the CPU reference cpu::linear, or cuBLAS / the decode
// GEMV of cuda/linear.cu and cuda/gemv.cu), and the CUDA-only forms over a strided or 16-bit
// input (linear_ex) and the one-launch pair (linear_ex_pair). Arguments are checked
// (ContractError naming the op and the values) before anything runs.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/op/linear.h"
#include "op_call.h"

namespace memra::py {

namespace {

size_t sz(int64_t n) { return static_cast<size_t>(n); }

// x of linear_ex / linear_ex_pair: rows [T, ldx] of float32, bfloat16 (uint16 raw bits accepted)
// or float16 on the engine's device, read from column `col` on for K columns.
struct ExInput {
  int dtype;  // 0 f32, 1 bf16, 2 f16
  int64_t T, ldx;
  const char* at(const AnyArray& x, int64_t col) const {
    return static_cast<const char*>(x.data()) + col * (dtype == 0 ? 4 : 2);
  }
};
ExInput ex_input(const AnyArray& x, const char* op, const Engine* engine) {
  const bool f32 = has_dtype(x, nb::dlpack::dtype_code::Float, 32);
  const bool f16 = has_dtype(x, nb::dlpack::dtype_code::Float, 16);
  const bool bf16 = has_bf16(x);
  check_array(x, op, "x", {-1, -1}, "float32, bfloat16 (uint16 raw bits accepted) or float16",
              f32 || f16 || bf16, nb::device::cuda::value, engine->device_index());
  return ExInput{f32 ? 0 : bf16 ? 1 : 2, dim(x, 0), dim(x, 1)};
}
// CONTRACT_SHAPE unless columns [col, col + K) lie in x's rows; `what` ends the message.
void check_cols(const char* op, const AnyArray& x, int64_t col, int64_t K, const std::string& what) {
  if (col < 0 || col + K > dim(x, 1)) {
    raise_contract(kContractShape, std::string(op) + ": columns [" + std::to_string(col) + ", " +
                                       std::to_string(col + K) + ") of x " + shape_str(x) +
                                       " do not fit (" + what + ")");
  }
}

}  // namespace

void init_ops_linear(nb::module_& m) {
  m.def(
      "linear",
      [](const AnyArray& x, nb::handle w, std::optional<AnyArray> bias, const Engine* engine) {
        const char* op = "linear";
        int64_t N = 0, K = 0;
        const Weight* hw = nullptr;
        const DeviceWeight* dw = nullptr;
        if (on_cuda(engine)) {
          dw = &device_weight(engine, w, op, "w");
          if (dw->shape.size() != 2) {
            raise_contract(kContractShape, "linear: weight must be [N, K], got shape " + dw->shape_str());
          }
          N = dw->rows;
          K = dw->cols;
        } else {
          hw = &host_weight(w, op, "w");
          if (hw->shape().size() != 2) {
            raise_contract(kContractShape, "linear: weight must be [N, K], got shape " + hw->shape_str());
          }
          N = hw->rows();
          K = hw->cols();
        }
        const float* xp = f32_in(engine, x, op, "x", {-1, K});
        const float* bp = bias ? f32_in(engine, *bias, op, "bias", {N}) : nullptr;
        const int T = dim32(x, 0, op, "x");
        Out y = out_f32_uninit(engine, {sz(T), sz(N)});
        MemraLinearParams p = {};
        p.x = xp;
        p.T = T;
        p.K = int(K);
        p.w = dw ? dw->data() : hw->data();
        p.w_dtype = dw ? dw->dtype_code() : static_cast<int>(hw->dtype());
        p.N = int(N);
        p.bias = bp;
        p.y = y.data<float>();
        run_op(engine, [&] { return op::linear(backend(engine), p); });
        return y.obj;
      },
      nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(), nb::kw_only(),
      nb::arg("engine").none() = nb::none(),
      "y [T, N] = x [T, K] @ w [N, K]^T (+ bias [N]), float32 in and out.\n\n"
      "CPU: w a memra.Weight (any stored dtype, converted exactly per row), f32 accumulation.\n"
      "CUDA: w a memra.DeviceWeight; float32 w: SGEMM with TF32 off; bfloat16 w: x is rounded "
      "to bfloat16 (RNE) and multiplied on the tensor cores with f32 accumulation and output "
      "(so it equals the CPU op on x rounded to bfloat16 up to the summation order).\n"
      "Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE), "
      "LibraryError for a cuBLAS failure. Reference: nn.Linear.");

  m.def(
      "linear_ex",
      [](const AnyArray& x, nb::handle w, std::optional<AnyArray> bias, int64_t col0,
         const Engine* engine) {
        const char* op = "linear_ex";
        cuda_ctx(engine);  // UnsupportedError without a CUDA engine
        const DeviceWeight& dw = device_weight(engine, w, op, "w");
        if (dw.shape.size() != 2) {
          raise_contract(kContractShape, "linear_ex: weight must be [N, K], got shape " + dw.shape_str());
        }
        const int64_t N = dw.rows, K = dw.cols;
        const ExInput xi = ex_input(x, op, engine);
        check_cols(op, x, col0, K, "w is " + dw.shape_str());
        const float* bp = bias ? f32_in(engine, *bias, op, "bias", {N}) : nullptr;
        Out y = out_f32_uninit(engine, {sz(xi.T), sz(N)});
        MemraLinearParams p = {};
        p.x = xi.at(x, col0);
        p.x_dtype = xi.dtype;
        p.ldx = xi.ldx;
        p.T = int(xi.T);
        p.K = int(K);
        p.w = dw.data();
        p.w_dtype = dw.dtype_code();
        p.N = int(N);
        p.bias = bp;
        p.y = y.data<float>();
        run_op(engine, [&] { return op::linear(backend(engine), p); });
        return y.obj;
      },
      nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(), nb::kw_only(),
      nb::arg("col0") = 0, nb::arg("engine").none() = nb::none(),
      "CUDA only: y [T, N] = x[:, col0:col0+K] @ w [N, K]^T (+ bias [N]) read in place from the "
      "rows of x [T, L] (row stride L; the layers' GEMM over a column block of a fused "
      "projection's output, or over an input rounded once for several GEMMs).\n\n"
      "x: float32, bfloat16 (DLPack bfloat16 or uint16 raw bits) or float16, C-contiguous on the "
      "engine's device. w: memra.DeviceWeight. x in w's dtype is multiplied as it is (no "
      "rounding); float32 x against a bfloat16 w is rounded to bfloat16 (RNE) first, as linear "
      "does; any other pair raises ContractError (CONTRACT_DTYPE). Raises ContractError "
      "(CONTRACT_SHAPE when the columns do not fit in x, CONTRACT_STRIDE, CONTRACT_DEVICE), "
      "UnsupportedError without a CUDA engine.");

  m.def(
      "linear_ex_pair",
      [](const AnyArray& x, nb::handle w0, nb::handle w1, int64_t col0, int64_t col1,
         const Engine* engine) {
        const char* op = "linear_ex_pair";
        cuda_ctx(engine);  // UnsupportedError without a CUDA engine
        const DeviceWeight& d0 = device_weight(engine, w0, op, "w0");
        const DeviceWeight& d1 = device_weight(engine, w1, op, "w1");
        if (d0.shape.size() != 2 || d1.shape.size() != 2 || d0.cols != d1.cols ||
            d0.dtype_code() != d1.dtype_code()) {
          raise_contract(kContractShape, "linear_ex_pair: w0 and w1 must be [N0, K] and [N1, K] of "
                                         "one dtype, got " + d0.shape_str() + " and " + d1.shape_str());
        }
        const int64_t K = d0.cols;
        const ExInput xi = ex_input(x, op, engine);
        for (int64_t col : {col0, col1}) check_cols(op, x, col, K, "K is " + std::to_string(K));
        Out y0 = out_f32_uninit(engine, {sz(xi.T), sz(d0.rows)});
        Out y1 = out_f32_uninit(engine, {sz(xi.T), sz(d1.rows)});
        MemraLinearParams p = {};
        p.x = xi.at(x, col0);
        p.x_dtype = xi.dtype;
        p.ldx = xi.ldx;
        p.T = int(xi.T);
        p.K = int(K);
        p.w = d0.data();
        p.w_dtype = d0.dtype_code();
        p.N = int(d0.rows);
        p.y = y0.data<float>();
        p.pair = 1;
        p.x1 = xi.at(x, col1);
        p.w1 = d1.data();
        p.N1 = int(d1.rows);
        p.y1 = y1.data<float>();
        run_op(engine, [&] { return op::linear(backend(engine), p); });
        return nb::make_tuple(y0.obj, y1.obj);
      },
      nb::arg("x"), nb::arg("w0"), nb::arg("w1"), nb::kw_only(), nb::arg("col0") = 0,
      nb::arg("col1") = 0, nb::arg("engine").none() = nb::none(),
      "CUDA only: (linear_ex(x, w0, col0=col0), linear_ex(x, w1, col1=col1)) -> (y0 [T, N0], "
      "y1 [T, N1]) float32 with the bytes of the two calls; one launch at a single row when both "
      "weights have short rows (K <= 32 vectors of 16 bytes; KDA's f_b and g_b).\n\nx, w0, w1 as "
      "linear_ex (w0 [N0, K] and w1 [N1, K], one dtype). Raises ContractError (CONTRACT_SHAPE when "
      "the weights differ in K or dtype or the columns do not fit in x, CONTRACT_DTYPE, "
      "CONTRACT_STRIDE, CONTRACT_DEVICE), UnsupportedError without a CUDA engine.");
}

}  // namespace memra::py
