// The clamped SwiGLU activation of one element, shared by the dense MLP (cuda/mlp.cu) and the
// routed experts (cuda/moe_experts.cu, cuda/moe_grouped.cu): cpu::clamped_swiglu (cpu/mlp.h)
// operation for operation.
#pragma once

#include <cmath>

namespace memra::cuda {

// cpu clamped_swiglu for one element, with std::min / std::max spelled out (NaN handling as the
// CPU's: std::min(a, b) is (b < a) ? b : a).
__device__ __forceinline__ float clamped_swiglu(float g, float u, float limit) {
  const float gate = (limit < g) ? limit : g;
  const float up0 = (u < -limit) ? -limit : u;
  const float up = (limit < up0) ? limit : up0;
  return __fmul_rn(__fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate))), up);
}

}  // namespace memra::cuda
