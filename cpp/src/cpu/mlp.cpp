// The SwiGLU MLP with the clamp: the CPU reference (cpu/mlp.h). Oracle: Glm5NextTextMLP.
#include <algorithm>
#include <cmath>
#include <vector>

#include "memra/ops.h"

namespace memra::cpu {

void clamped_swiglu(float* g, const float* u, int64_t n, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float gate = std::min(g[i], limit);
    const float up = std::min(std::max(u[i], -limit), limit);
    g[i] = gate / (1.0f + std::exp(-gate)) * up;  // silu as torch's CPU kernel writes it
  }
}

void swiglu_mlp(const float* x, int T, const WeightView& gate_w, const WeightView& up_w,
                const WeightView& down_w, float limit, float* y) {
  const int64_t I = gate_w.rows;
  std::vector<float> g(static_cast<size_t>(T) * I), u(static_cast<size_t>(T) * I);
  linear(x, T, gate_w, nullptr, g.data());
  linear(x, T, up_w, nullptr, u.data());
  clamped_swiglu(g.data(), u.data(), static_cast<int64_t>(T) * I, limit);
  linear(g.data(), T, down_w, nullptr, y);
}

}  // namespace memra::cpu
