// The functional binding of the dense SwiGLU MLP over DLPack arrays: memra::op::swiglu_mlp
// (op/mlp.h) on the CPU reference (cpu/mlp.cpp) or, with keyword `engine` = a CUDA Engine, the CUDA
// library (cuda/mlp.cu, cuda_abi/mlp.h). It checks its arguments (ContractError naming the op and
// the values) before anything runs, allocates its output on the engine's device and, on the CPU,
// releases the GIL while computing.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/op/mlp.h"
#include "nogil.h"

namespace memra::py {

namespace {

size_t sz(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

void init_ops_mlp(nb::module_& m) {
  m.def(
      "swiglu_mlp",
      [](const AnyArray& x, nb::handle gate_w, nb::handle up_w, nb::handle down_w, float limit,
         const Engine* engine) {
        const char* op = "swiglu_mlp";
        const float* xp = f32_in(engine, x, op, "x", {-1, -1});
        const int64_t T = dim(x, 0), D = dim(x, 1);
        MemraMlpParams p{};
        Weight gate, up, down;  // CPU: the weights in one dtype (MemraMlpParams::w_dtype)
        int64_t I = 0;
        if (on_cuda(engine)) {
          const DeviceWeight& g = device_weight(engine, gate_w, op, "gate_w");
          const DeviceWeight& u = device_weight(engine, up_w, op, "up_w");
          const DeviceWeight& d = device_weight(engine, down_w, op, "down_w");
          I = g.shape.empty() ? 0 : g.shape[0];
          check_weight_2d(g, op, "gate_w", I, D);
          check_weight_2d(u, op, "up_w", I, D);
          check_weight_2d(d, op, "down_w", D, I);
          if (u.dtype != g.dtype || d.dtype != g.dtype) {
            raise_contract(kContractDType,
                           std::string(op) + ": gate_w, up_w and down_w must share one dtype, got " +
                               dtype_name(g.dtype) + ", " + dtype_name(u.dtype) + ", " +
                               dtype_name(d.dtype));
          }
          p.gate_w = g.data();
          p.up_w = u.data();
          p.down_w = d.data();
          p.w_dtype = g.dtype_code();
        } else {
          gate = host_weight(gate_w, op, "gate_w");
          up = host_weight(up_w, op, "up_w");
          down = host_weight(down_w, op, "down_w");
          I = gate.rows();
          check_weight_2d(gate, op, "gate_w", I, D);
          check_weight_2d(up, op, "up_w", I, D);
          check_weight_2d(down, op, "down_w", D, I);
          if (up.dtype() != gate.dtype() || down.dtype() != gate.dtype()) {
            // Mixed dtypes are read as f32, as the reference reads every dtype (exact).
            for (Weight* w : {&gate, &up, &down}) {
              *w = Weight(DType::kF32, w->shape(), w->to_f32().data());
            }
          }
          p.gate_w = gate.data();
          p.up_w = up.data();
          p.down_w = down.data();
          p.w_dtype = static_cast<int>(gate.dtype());
        }
        check_value(limit > 0.0f, op, "limit must be > 0, got " + std::to_string(limit));
        Out y = out_f32(engine, {sz(T), sz(D)});
        p.x = xp;
        p.T = int(T);
        p.D = int(D);
        p.I = int(I);
        p.limit = limit;
        p.y = y.data<float>();
        {
          std::optional<ReleasedGil> nogil;
          if (!on_cuda(engine)) nogil.emplace();
          check(op::swiglu_mlp(backend(engine), p));
        }
        return y.obj;
      },
      nb::arg("x"), nb::arg("gate_w"), nb::arg("up_w"), nb::arg("down_w"), nb::kw_only(),
      nb::arg("limit"), nb::arg("engine").none() = nb::none(),
      "SwiGLU MLP with the clamp: y = (silu(min(x gate_w^T, limit)) * clamp(x up_w^T, +-limit)) "
      "down_w^T.\n\nx [T, D] float32; gate_w, up_w [I, D]; down_w [D, I]; limit > 0 "
      "(swiglu_limit; inf for no clamp). Returns y [T, D] float32.\n"
      "engine: None or a CPU Engine: memra.Weight arguments, host arrays, the C++ reference "
      "(f32 accumulation over the weights widened to f32).\nA CUDA Engine: memra.DeviceWeight "
      "arguments of one dtype, arrays on its device; three cuBLAS GEMMs (float32 weights: SGEMM, "
      "TF32 off; bfloat16 weights: x and the hidden activation rounded to bfloat16 before each "
      "GEMM, f32 accumulation) around the CPU's elementwise clamp/SiLU formula.\n"
      "Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; "
      "CONTRACT_VALUE for limit <= 0), LibraryError for a cuBLAS failure.\n"
      "Reference: transformers Glm5NextTextMLP.forward.");
}

}  // namespace memra::py
