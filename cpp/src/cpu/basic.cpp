// Embedding, norms, L2 norm, interleaved RoPE, sigmoid and add: the CPU reference (cpu/basic.h).
#include <cmath>
#include <string>
#include <vector>

#include "memra/cpu/basic.h"

namespace memra::cpu {

void embedding(const WeightView& table, const int32_t* ids, int T, float* out) {
  const int64_t D = table.cols;
  for (int t = 0; t < T; ++t) table.row_f32(ids[t], out + static_cast<int64_t>(t) * D);
}

void rms_norm(const float* x, int T, int D, const float* w, float eps, float* y) {
  for (int t = 0; t < T; ++t) {
    const float* xt = x + static_cast<int64_t>(t) * D;
    float* yt = y + static_cast<int64_t>(t) * D;
    float ss = 0.0f;
    for (int i = 0; i < D; ++i) ss += xt[i] * xt[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
    for (int i = 0; i < D; ++i) yt[i] = w ? w[i] * (xt[i] * inv) : xt[i] * inv;
  }
}

void rms_norm_gated_sigmoid(const float* x, const float* gate, int T, int D, const float* w,
                            float eps, float* y) {
  for (int t = 0; t < T; ++t) {
    const float* xt = x + static_cast<int64_t>(t) * D;
    const float* gt = gate + static_cast<int64_t>(t) * D;
    float* yt = y + static_cast<int64_t>(t) * D;
    float ss = 0.0f;
    for (int i = 0; i < D; ++i) ss += xt[i] * xt[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
    for (int i = 0; i < D; ++i) {
      const float sig = 1.0f / (1.0f + std::exp(-gt[i]));
      yt[i] = w[i] * (xt[i] * inv) * sig;
    }
  }
}

void layer_norm(const float* x, int T, int D, const float* w, const float* b, float eps, float* y) {
  for (int t = 0; t < T; ++t) {
    const float* xt = x + static_cast<int64_t>(t) * D;
    float* yt = y + static_cast<int64_t>(t) * D;
    float mean = 0.0f;
    for (int i = 0; i < D; ++i) mean += xt[i];
    mean /= static_cast<float>(D);
    float var = 0.0f;
    for (int i = 0; i < D; ++i) var += (xt[i] - mean) * (xt[i] - mean);
    var /= static_cast<float>(D);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int i = 0; i < D; ++i) yt[i] = (xt[i] - mean) * inv * w[i] + b[i];
  }
}

void l2norm_heads(float* x, int T, int H, int d, float eps) {
  for (int64_t r = 0; r < static_cast<int64_t>(T) * H; ++r) {
    float* v = x + r * d;
    float ss = 0.0f;
    for (int i = 0; i < d; ++i) ss += v[i] * v[i];
    const float n = std::sqrt(ss + eps);
    for (int i = 0; i < d; ++i) v[i] = v[i] / n;
  }
}

Status rope_interleaved(float* x, const int32_t* positions, int T, int n_vec, int d_rope,
                        float base) {
  if (d_rope % 2 != 0) {
    return Status(kContractOddRope, "rope_interleaved: d_rope must be even (interleaved pairs "
                                    "(2j, 2j+1) are rotated), got d_rope=" +
                                        std::to_string(d_rope));
  }
  if (d_rope == 0) return Status::Ok();
  for (int t = 0; t < T; ++t) {
    const double pos = positions[t];
    for (int j = 0; j < d_rope / 2; ++j) {
      // Angles in double, then rounded once: the CUDA twin takes the same host-side frequency.
      const double inv_freq = std::pow(static_cast<double>(base), -2.0 * j / d_rope);
      const float c = static_cast<float>(std::cos(pos * inv_freq));
      const float s = static_cast<float>(std::sin(pos * inv_freq));
      for (int v = 0; v < n_vec; ++v) {
        float* p = x + (static_cast<int64_t>(t) * n_vec + v) * d_rope + 2 * j;
        const float a = p[0], b = p[1];
        p[0] = a * c - b * s;
        p[1] = a * s + b * c;
      }
    }
  }
  return Status::Ok();
}

void sigmoid(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

void add(const float* x, const float* y, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

}  // namespace memra::cpu
