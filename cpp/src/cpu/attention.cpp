// Full (softmax) attention ops: the CPU reference (memra/cpu/attention.h).
#include "memra/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace memra::cpu {

void rope_inv_freq(double base, int dim, float* out) {
  const float b = static_cast<float>(base);
  for (int j = 0; 2 * j < dim; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(dim);
    const float p = static_cast<float>(std::pow(static_cast<double>(b), static_cast<double>(e)));
    out[j] = 1.0f / p;
  }
}

void attn_split_gate(const float* qg, int64_t ld, int T, int H, int hd, float* q, float* gate) {
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      const float* src = qg + t * ld + int64_t(h) * 2 * hd;
      const int64_t dst = (int64_t(t) * H + h) * hd;
      std::copy(src, src + hd, q + dst);
      std::copy(src + hd, src + 2 * hd, gate + dst);
    }
  }
}

void rope_neox(float* x, const int32_t* positions, int T, int H, int hd, int n_rot,
               const float* inv_freq) {
  const int half = n_rot / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int t = 0; t < T; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int j = 0; j < half; ++j) {
      const float angle = pos * inv_freq[j];
      c[j] = std::cos(angle);
      s[j] = std::sin(angle);
    }
    for (int h = 0; h < H; ++h) {
      float* r = x + (int64_t(t) * H + h) * hd;
      for (int j = 0; j < half; ++j) {
        const float a = r[j], b = r[j + half];
        r[j] = a * c[j] + (-b) * s[j];
        r[j + half] = b * c[j] + a * s[j];
      }
    }
  }
}

void attention(const float* q, const float* k, const float* v, const int32_t* n_keys, int T,
               int Hq, int Hkv, int hd, float scale, const float* gate, float* o) {
  const int group = Hq / Hkv;
  const int64_t row = int64_t(Hkv) * hd;  // one cache row: every K/V head
  std::vector<float> p;
  for (int t = 0; t < T; ++t) {
    const int n = std::max(n_keys[t], 0);
    p.assign(static_cast<size_t>(n), 0.0f);
    for (int h = 0; h < Hq; ++h) {
      const int g = h / group;
      const float* qh = q + (int64_t(t) * Hq + h) * hd;
      float* oh = o + (int64_t(t) * Hq + h) * hd;
      std::fill(oh, oh + hd, 0.0f);
      if (n == 0) continue;
      float m = -INFINITY;
      for (int j = 0; j < n; ++j) {
        const float* kj = k + j * row + int64_t(g) * hd;
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d) dot += qh[d] * kj[d];
        p[j] = dot * scale;
        m = std::max(m, p[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        p[j] = std::exp(p[j] - m);
        sum += p[j];
      }
      for (int j = 0; j < n; ++j) {
        const float w = p[j] / sum;
        const float* vj = v + j * row + int64_t(g) * hd;
        for (int d = 0; d < hd; ++d) oh[d] += w * vj[d];
      }
      if (gate) {
        const float* gh = gate + (int64_t(t) * Hq + h) * hd;
        for (int d = 0; d < hd; ++d) oh[d] *= 1.0f / (1.0f + std::exp(-gh[d]));
      }
    }
  }
}

}  // namespace memra::cpu
