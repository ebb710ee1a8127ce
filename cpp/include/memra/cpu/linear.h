// The linear op of the CPU reference backend (cpu/linear.cpp). memra/ops.h, the umbrella header,
// states the conventions (f32 activations, C-contiguous row-major, shapes beside arguments).
#pragma once

#include <cstdint>

#include "memra/status.h"
#include "memra/tensor.h"

namespace memra::cpu {

// y[T, N] = x[T, K] @ w[N, K]^T (+ bias[N] when bias != nullptr). Reference: nn.Linear.
void linear(const float* x, int T, const WeightView& w, const float* bias, float* y);

}  // namespace memra::cpu
