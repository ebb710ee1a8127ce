// Helpers of the layers' CPU chains: the call shapes of memra::op over the layers' own Weights
// on the CPU backend (op::Backend{}), as gpu_util.h has them for the CUDA chains.
#pragma once

#include "memra/op/linear.h"
#include "memra/tensor.h"

namespace memra::host {

// y [T, w.rows] = x [T, w.cols] w^T (+ bias [w.rows]) through op::linear on the CPU: x f32
// packed rows, w in its stored dtype, the values of cpu::linear(x, T, w, bias, y).
inline Status linear(const float* x, int T, const Weight& w, const float* bias, float* y) {
  MemraLinearParams p = {};
  p.x = x;
  p.T = T;
  p.K = static_cast<int>(w.cols());
  p.w = w.data();
  p.w_dtype = static_cast<int>(w.dtype());
  p.N = static_cast<int>(w.rows());
  p.bias = bias;
  p.y = y;
  return op::linear(op::Backend{}, p);
}

}  // namespace memra::host
