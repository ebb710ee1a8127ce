// mHC hyper-connections: the mapping (pre / post / Sinkhorn comb), the post-block expansion and
// the final head mean: the CPU reference (cpu/mhc.h). Oracle: Glm5NextTextHyperConnection,
// Glm5NextTextDecoderLayer.forward, Glm5NextTextHyperHead.
#include <algorithm>
#include <cmath>
#include <vector>

#include "memra/cpu/basic.h"
#include "memra/cpu/linear.h"
#include "memra/cpu/mhc.h"

namespace memra::cpu {

namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// c [hc, hc] row-major, c[i, j]: divide every column j by (sum_i c[i, j] + eps).
void normalise_columns(float* c, int hc, float eps) {
  for (int j = 0; j < hc; ++j) {
    float s = 0.0f;
    for (int i = 0; i < hc; ++i) s += c[i * hc + j];
    const float d = s + eps;
    for (int i = 0; i < hc; ++i) c[i * hc + j] /= d;
  }
}

void normalise_rows(float* c, int hc, float eps) {
  for (int i = 0; i < hc; ++i) {
    float s = 0.0f;
    for (int j = 0; j < hc; ++j) s += c[i * hc + j];
    const float d = s + eps;
    for (int j = 0; j < hc; ++j) c[i * hc + j] /= d;
  }
}

}  // namespace

void mhc_pre(const float* streams, int T, int hc, int D, const WeightView& fn, const float* base,
             const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* post,
             float* comb, float* collapsed) {
  const int64_t flat = static_cast<int64_t>(hc) * D;
  const int64_t mix = (int64_t(hc) + 2) * hc;
  std::vector<float> normed(static_cast<size_t>(T) * flat);
  rms_norm(streams, T, static_cast<int>(flat), nullptr, norm_eps, normed.data());
  std::vector<float> logits(static_cast<size_t>(T) * mix);
  linear(normed.data(), T, fn, nullptr, logits.data());

  std::vector<float> pre(hc);
  for (int t = 0; t < T; ++t) {
    const float* lt = logits.data() + static_cast<int64_t>(t) * mix;
    float* pt = post + static_cast<int64_t>(t) * hc;
    float* ct = comb + static_cast<int64_t>(t) * hc * hc;
    for (int s = 0; s < hc; ++s) {
      pre[s] = sigmoid(lt[s] * scale[0] + base[s]) + hc_eps;
      pt[s] = 2.0f * sigmoid(lt[hc + s] * scale[1] + base[hc + s]);
    }
    // comb = softmax over the last dim + eps, one column normalisation, then (iters - 1) rounds
    // of row then column normalisation (each denominator + eps).
    for (int i = 0; i < hc; ++i) {
      float* row = ct + i * hc;
      const float* lc = lt + 2 * hc + i * hc;
      const float* bc = base + 2 * hc + i * hc;
      for (int j = 0; j < hc; ++j) row[j] = lc[j] * scale[2] + bc[j];
      float m = row[0];
      for (int j = 1; j < hc; ++j) m = std::max(m, row[j]);
      float s = 0.0f;
      for (int j = 0; j < hc; ++j) {
        row[j] = std::exp(row[j] - m);
        s += row[j];
      }
      for (int j = 0; j < hc; ++j) row[j] = row[j] / s + hc_eps;
    }
    normalise_columns(ct, hc, hc_eps);
    for (int it = 1; it < sinkhorn_iters; ++it) {
      normalise_rows(ct, hc, hc_eps);
      normalise_columns(ct, hc, hc_eps);
    }
    // collapsed = sum over streams (ascending) of pre[s] * streams[s].
    const float* st = streams + static_cast<int64_t>(t) * flat;
    float* out = collapsed + static_cast<int64_t>(t) * D;
    for (int d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int s = 0; s < hc; ++s) acc += pre[s] * st[static_cast<int64_t>(s) * D + d];
      out[d] = acc;
    }
  }
}

void mhc_post(const float* y, const float* post, const float* comb, const float* residual, int T,
              int hc, int D, float* out) {
  for (int t = 0; t < T; ++t) {
    const float* yt = y + static_cast<int64_t>(t) * D;
    const float* pt = post + static_cast<int64_t>(t) * hc;
    const float* ct = comb + static_cast<int64_t>(t) * hc * hc;
    const float* rt = residual + static_cast<int64_t>(t) * hc * D;
    float* ot = out + static_cast<int64_t>(t) * hc * D;
    for (int j = 0; j < hc; ++j) {
      for (int d = 0; d < D; ++d) {
        // matmul(comb^T, residual): out row j mixes residual rows i with comb[i, j].
        float acc = 0.0f;
        for (int i = 0; i < hc; ++i) acc += ct[i * hc + j] * rt[static_cast<int64_t>(i) * D + d];
        ot[static_cast<int64_t>(j) * D + d] = pt[j] * yt[d] + acc;
      }
    }
  }
}

void hc_head_mean(const float* streams, int T, int hc, int D, float* out) {
  for (int t = 0; t < T; ++t) {
    const float* st = streams + static_cast<int64_t>(t) * hc * D;
    for (int d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int s = 0; s < hc; ++s) acc += st[static_cast<int64_t>(s) * D + d];
      out[static_cast<int64_t>(t) * D + d] = acc / static_cast<float>(hc);
    }
  }
}

void hc_expand(const float* x, int T, int D, int n, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    for (int s = 0; s < n; ++s) std::copy(x + t * D, x + (t + 1) * D, out + (t * n + s) * D);
  }
}

}  // namespace memra::cpu
