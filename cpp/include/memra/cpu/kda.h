// The CPU reference of the KDA (Kimi Delta Attention) mixer's ops (cpp/src/cpu/kda.cpp): short
// causal conv, forget gate, recurrent scan. Conventions as memra/ops.h (which includes this
// header): f32 C-contiguous activations with the shape beside each argument, no throwing, the
// binding layer checks shapes. Both backends: memra/op/kda.h; CUDA twins: cuda_abi/kda.h.
#pragma once

#include <cstdint>

namespace memra::cpu {

enum class KdaGateForm : int {
  kLowerBound = 0,  // g = lb * sigmoid(exp(A_log) * (f + dt_bias))      (glm5_next)
  kSoftplus = 1,    // g = -exp(A_log) * softplus(f + dt_bias), softplus(x) = x for x > 20 (kimi)
};

// Causal depthwise conv + SiLU over the fused q|k|v channels, prefill arm.
// x [T, C] pre-conv projections (C = 3*qkv); w [C, K]; ring_in [C, K-1] the previous K-1 inputs
// of each channel, oldest first (zeros for a fresh sequence); ring_out [C, K-1] the last K-1
// inputs after this call (distinct from ring_in); y [T, C] = silu(conv). Reference:
// causal_conv1d_fn / causal_conv1d_update with the cache's conv state.
void kda_conv_prefill(const float* x, int T, int C, const float* w, int K, const float* ring_in,
                      float* ring_out, float* y);

// The T = 1 decode arm: same values as kda_conv_prefill at T = 1 (it must agree bit for bit).
// x [C], ring_in/ring_out [C, K-1], y [C].
void kda_conv_decode(const float* x, int C, const float* w, int K, const float* ring_in,
                     float* ring_out, float* y);

// Raw log gate. f [T, H*dk] = f_b(f_a(x)); dt_bias [H*dk]; A_log [H]; g [T, H*dk] (may alias f).
// Reference: Glm5NextTextForgetGate.forward (both forms).
void kda_gate(const float* f, const float* dt_bias, const float* A_log, int T, int H, int dk,
              KdaGateForm form, float lower_bound, float* g);

// Delta-rule scan, T steps sequentially (the recurrent reference form):
//   S = S * exp(g_t)[:, None];  S += k_t (beta_t (v_t - k_t^T S));  o_t = (scale q_t)^T S
// q, k [T, H, dk] (already L2-normalised); v, o [T, H, dv]; g [T, H, dk] log gate;
// beta [T, H]; state_in, state_out [H, dk, dv] (distinct buffers; state_in may be nullptr for
// zeros). Reference: recurrent_kimi_delta_attention.
void kda_scan(const float* q, const float* k, const float* v, const float* g, const float* beta,
              int T, int H, int dk, int dv, float scale, const float* state_in, float* state_out,
              float* o);

}  // namespace memra::cpu
