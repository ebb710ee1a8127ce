// The dense SwiGLU MLP of the CPU reference backend (cpu/mlp.cpp); the CUDA twin is cuda/mlp.cu.
// Conventions: those of memra/ops.h, the umbrella header of the CPU reference backend.
#pragma once

#include <cstdint>

#include "memra/status.h"
#include "memra/tensor.h"

namespace memra::cpu {

// h = silu(min(g, limit)) * clamp(u, -limit, limit), in place over g (n values): the activation of
// swiglu_mlp and of every routed expert (cpu/moe.h).
void clamped_swiglu(float* g, const float* u, int64_t n, float limit);

// SwiGLU MLP with the asymmetric clamp: gate = min(x W_g^T, limit), up = clamp(x W_u^T, +-limit),
// y = (silu(gate) * up) W_d^T. x [T, D]; gate_w, up_w [I, D]; down_w [D, I]; y [T, D].
// Reference: Glm5NextTextMLP.forward.
void swiglu_mlp(const float* x, int T, const WeightView& gate_w, const WeightView& up_w,
                const WeightView& down_w, float limit, float* y);

}  // namespace memra::cpu
