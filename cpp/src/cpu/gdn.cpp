// Gated DeltaNet pieces: gates, q/k L2 norm, grouped-head delta-rule scan, SiLU-gated RMSNorm.
// The CPU reference (memra/cpu/gdn.h); oracle: transformers 5.17 models/qwen3_5 (see there).
#include "memra/cpu/gdn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace memra::cpu {

void gdn_gate(const float* a, int64_t lda, const float* b, int64_t ldb, const float* dt_bias,
              const float* A_log, int T, int H, float* g, float* beta) {
  for (int t = 0; t < T; ++t) {
    const float* at = a + t * lda;
    const float* bt = b + t * ldb;
    for (int h = 0; h < H; ++h) {
      const float x = at[h] + dt_bias[h];
      // F.softplus(x, beta=1, threshold=20): x itself above the threshold, log1p(exp(x))
      // below (ATen's softplus kernel; not log(1 + exp(x)) as KDA's kimi form).
      const float sp = x > 20.0f ? x : std::log1p(std::exp(x));
      g[int64_t(t) * H + h] = -std::exp(A_log[h]) * sp;
      beta[int64_t(t) * H + h] = 1.0f / (1.0f + std::exp(-bt[h]));
    }
  }
}

void gdn_l2norm(float* x, int rows, int heads, int d, int64_t ld, float eps) {
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      float* v = x + r * ld + int64_t(h) * d;
      float ss = 0.0f;
      for (int i = 0; i < d; ++i) ss += v[i] * v[i];
      const float inv = 1.0f / std::sqrt(ss + eps);  // torch.rsqrt: 1 / sqrt
      for (int i = 0; i < d; ++i) v[i] = v[i] * inv;
    }
  }
}

void gdn_scan(const float* q, const float* k, int64_t qk_ld, const float* v, int64_t v_ld,
              const float* g, const float* beta, int T, int Hk, int Hv, int dk, int dv,
              float scale, const float* state_in, float* state_out, float* o) {
  const int64_t plane = int64_t(dk) * dv;
  const int group = Hv / Hk;  // value heads per key head
  // Step 0 reads the state from state_out like every later step does (copied exactly), so
  // T one-step calls chained through memory equal one T-step call bit for bit.
  if (state_in) {
    std::memcpy(state_out, state_in, sizeof(float) * plane * Hv);
  } else {
    std::memset(state_out, 0, sizeof(float) * plane * Hv);
  }
  std::vector<float> delta(static_cast<size_t>(dv));  // kv_mem, then beta * (v - kv_mem)
  std::vector<float> acc(static_cast<size_t>(dv));    // o_t before it is stored
  for (int h = 0; h < Hv; ++h) {
    float* S = state_out + h * plane;  // [dk, dv]
    const int kh = h / group;          // repeat_interleave: value head h reads key head h / group
    for (int t = 0; t < T; ++t) {
      const float* qt = q + t * qk_ld + int64_t(kh) * dk;  // [dk]
      const float* kt = k + t * qk_ld + int64_t(kh) * dk;  // [dk]
      const float* vt = v + t * v_ld + int64_t(h) * dv;    // [dv]
      const int64_t th = int64_t(t) * Hv + h;
      const float decay = std::exp(g[th]);  // one per head and step, the same for every row
      const float bt = beta[th];
      float* ot = o + th * dv;  // [dv]

      // Decay every row, and accumulate kv_mem = k^T S over the decayed rows (cpu::kda_scan's
      // fused pass with exp(g) broadcast over dk).
      std::fill(delta.begin(), delta.end(), 0.0f);
      for (int i = 0; i < dk; ++i) {
        const float ki = kt[i];
        float* Si = S + int64_t(i) * dv;
        for (int j = 0; j < dv; ++j) {
          Si[j] = Si[j] * decay;
          delta[j] += Si[j] * ki;
        }
      }
      for (int j = 0; j < dv; ++j) delta[j] = (vt[j] - delta[j]) * bt;

      // Rank-1 update S += k delta^T, and o = (scale q)^T S over the updated rows (q scaled
      // once, as the reference scales the query before the product).
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int i = 0; i < dk; ++i) {
        const float ki = kt[i];
        const float qi = qt[i] * scale;
        float* Si = S + int64_t(i) * dv;
        for (int j = 0; j < dv; ++j) {
          Si[j] = Si[j] + ki * delta[j];
          acc[j] += Si[j] * qi;
        }
      }
      for (int j = 0; j < dv; ++j) ot[j] = acc[j];
    }
  }
}

void rms_norm_gated_silu(const float* x, const float* gate, int T, int D, const float* w,
                         float eps, float* y) {
  for (int t = 0; t < T; ++t) {
    const float* xt = x + int64_t(t) * D;
    const float* zt = gate + int64_t(t) * D;
    float* yt = y + int64_t(t) * D;
    float ss = 0.0f;
    for (int i = 0; i < D; ++i) ss += xt[i] * xt[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
    for (int i = 0; i < D; ++i) {
      const float silu = zt[i] / (1.0f + std::exp(-zt[i]));  // ATen's silu: x / (1 + exp(-x))
      yt[i] = (w[i] * (xt[i] * inv)) * silu;  // written last: y may alias x
    }
  }
}

}  // namespace memra::cpu
