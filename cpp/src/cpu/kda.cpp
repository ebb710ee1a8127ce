// KDA (Kimi Delta Attention) mixer pieces: short causal conv, forget gate, recurrent scan.
// The CPU reference (memra/cpu/kda.h); oracle: transformers 5.17
// models/glm5_next/modeling_glm5_next.py (causal_conv1d_fn / causal_conv1d_update,
// Glm5NextTextForgetGate, recurrent_kimi_delta_attention).
//
// Bit-exactness between arms is a contract, not an accident: the conv's prefill and decode arms
// call the same per-output helper, and the scan runs every step on its state buffer in place, so
// the arithmetic of a step does not depend on whether its state came from memory or from the
// step before. No reassociation anywhere (no -ffast-math); sums run in ascending index order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "memra/cpu/kda.h"

namespace memra::cpu {

namespace {

// Element p of channel c's extended input sequence (ring_in ++ x): positions [0, K-1) are the
// ring, oldest first; position K-1+t is x[t, c]. This is the tensor causal_conv1d_update
// builds with torch.cat([conv_state, hidden_states]), read without materialising it.
// x [T, C]; ring_c [K-1] (channel c's ring).
inline float extended_at(const float* x, int C, const float* ring_c, int K, int p, int c) {
  return p < K - 1 ? ring_c[p] : x[static_cast<int64_t>(p - (K - 1)) * C + c];
}

// One conv output: silu(sum_k w[c, k] * ext[t + k]) over the K-wide window ending at x[t, c].
// F.conv1d is a cross-correlation, so tap k = 0 meets the oldest input. Both arms call this,
// which is what makes decode == prefill(T=1) bit for bit.
// x [T, C]; ring_c [K-1]; w_c [K].
inline float conv_silu_at(const float* x, int C, const float* ring_c, const float* w_c, int K,
                          int t, int c) {
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += w_c[k] * extended_at(x, C, ring_c, K, t + k, c);
  return acc / (1.0f + std::exp(-acc));  // silu, ATen's form x / (1 + exp(-x))
}

// ring_out[c, :] = the last K-1 elements of (ring_in[c, :] ++ x[:, c]). When T < K-1 the new
// ring still holds some old ring values (shifted towards the front), then all T inputs.
// x [T, C]; ring_in, ring_out [C, K-1].
void conv_ring_advance(const float* x, int T, int C, int K, const float* ring_in,
                       float* ring_out) {
  const int R = K - 1;
  for (int c = 0; c < C; ++c) {
    const float* ring_c = ring_in + static_cast<int64_t>(c) * R;
    float* out_c = ring_out + static_cast<int64_t>(c) * R;
    for (int j = 0; j < R; ++j) out_c[j] = extended_at(x, C, ring_c, K, T + j, c);
  }
}

}  // namespace

void kda_conv_prefill(const float* x, int T, int C, const float* w, int K, const float* ring_in,
                      float* ring_out, float* y) {
  const int R = K - 1;
  // Token-major outer loop: x and y rows are read and written contiguously.
  for (int t = 0; t < T; ++t) {
    float* yt = y + static_cast<int64_t>(t) * C;
    for (int c = 0; c < C; ++c) {
      yt[c] = conv_silu_at(x, C, ring_in + static_cast<int64_t>(c) * R,
                           w + static_cast<int64_t>(c) * K, K, t, c);
    }
  }
  conv_ring_advance(x, T, C, K, ring_in, ring_out);
}

void kda_conv_decode(const float* x, int C, const float* w, int K, const float* ring_in,
                     float* ring_out, float* y) {
  const int R = K - 1;
  for (int c = 0; c < C; ++c) {
    y[c] = conv_silu_at(x, C, ring_in + static_cast<int64_t>(c) * R,
                        w + static_cast<int64_t>(c) * K, K, /*t=*/0, c);
  }
  conv_ring_advance(x, /*T=*/1, C, K, ring_in, ring_out);
}

void kda_gate(const float* f, const float* dt_bias, const float* A_log, int T, int H, int dk,
              KdaGateForm form, float lower_bound, float* g) {
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      // A_log is per head, dt_bias per channel (h*dk + i), as in Glm5NextTextForgetGate.
      const float decay_rate = std::exp(A_log[h]);
      const int64_t row = (static_cast<int64_t>(t) * H + h) * dk;
      for (int i = 0; i < dk; ++i) {
        const float x = f[row + i] + dt_bias[h * dk + i];
        float out;
        if (form == KdaGateForm::kLowerBound) {
          // lb * sigmoid(exp(A_log) * x): g in (lb, 0), so exp(g) >= exp(lb) never underflows.
          out = lower_bound * (1.0f / (1.0f + std::exp(-(decay_rate * x))));
        } else {
          // transformers' softplus is log(1 + exp(x)) (not log1p) with x passed through above
          // 20; for x below about -17 it is exactly 0 in f32, i.e. no decay at all.
          const float sp = x > 20.0f ? x : std::log(1.0f + std::exp(x));
          out = -decay_rate * sp;
        }
        g[row + i] = out;  // written last: g may alias f
      }
    }
  }
}

void kda_scan(const float* q, const float* k, const float* v, const float* g, const float* beta,
              int T, int H, int dk, int dv, float scale, const float* state_in, float* state_out,
              float* o) {
  const int64_t plane = static_cast<int64_t>(dk) * dv;
  // Step 0 reads the state from state_out like every later step does (copied exactly), so
  // T one-step calls chained through memory equal one T-step call bit for bit.
  if (state_in) {
    std::memcpy(state_out, state_in, sizeof(float) * plane * H);
  } else {
    std::memset(state_out, 0, sizeof(float) * plane * H);
  }
  std::vector<float> delta(static_cast<size_t>(dv));  // kv_mem, then beta * (v - kv_mem)
  std::vector<float> acc(static_cast<size_t>(dv));    // o_t before it is stored
  for (int h = 0; h < H; ++h) {
    float* S = state_out + h * plane;  // [dk, dv]
    for (int t = 0; t < T; ++t) {
      const int64_t th = static_cast<int64_t>(t) * H + h;
      const float* qt = q + th * dk;  // [dk]
      const float* kt = k + th * dk;  // [dk]
      const float* gt = g + th * dk;  // [dk]
      const float* vt = v + th * dv;  // [dv]
      const float bt = beta[th];
      float* ot = o + th * dv;  // [dv]

      // Decay row i by exp(g_i), and accumulate kv_mem = k^T S over the decayed rows (fused
      // pass; each element sees the same operations as the two separate reference passes).
      std::fill(delta.begin(), delta.end(), 0.0f);
      for (int i = 0; i < dk; ++i) {
        const float decay = std::exp(gt[i]);
        const float ki = kt[i];
        float* Si = S + static_cast<int64_t>(i) * dv;
        for (int j = 0; j < dv; ++j) {
          Si[j] = Si[j] * decay;
          delta[j] += Si[j] * ki;
        }
      }
      // delta = (v - kv_mem) * beta, as the reference orders it.
      for (int j = 0; j < dv; ++j) delta[j] = (vt[j] - delta[j]) * bt;

      // Rank-1 update S += k delta^T, and o = (scale q)^T S over the updated rows. The
      // reference scales q once (query * scale) before the dot product; so do we.
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int i = 0; i < dk; ++i) {
        const float ki = kt[i];
        const float qi = qt[i] * scale;
        float* Si = S + static_cast<int64_t>(i) * dv;
        for (int j = 0; j < dv; ++j) {
          Si[j] = Si[j] + ki * delta[j];
          acc[j] += Si[j] * qi;
        }
      }
      for (int j = 0; j < dv; ++j) ot[j] = acc[j];
    }
  }
}

}  // namespace memra::cpu
