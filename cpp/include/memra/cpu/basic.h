// The basic ops of the CPU reference backend (cpu/basic.cpp). memra/ops.h, the umbrella header,
// states the conventions (f32 activations, C-contiguous row-major, shapes beside arguments).
#pragma once

#include <cstdint>

#include "memra/status.h"
#include "memra/tensor.h"

namespace memra::cpu {

// out[t, :] = table[ids[t], :]. table [vocab, D]; ids [T] (already range-checked); out [T, D].
void embedding(const WeightView& table, const int32_t* ids, int T, float* out);

// RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) (* w when w != nullptr).
// x, y [T, D] (may alias); w [D] or nullptr (unweighted). Reference: Glm5NextTextRMSNorm,
// Glm5NextTextUnweightedRMSNorm.
void rms_norm(const float* x, int T, int D, const float* w, float eps, float* y);

// Sigmoid-gated RMSNorm: y = w * x * rsqrt(mean(x^2) + eps) * sigmoid(gate).
// x, gate, y [T, D] (y may alias x); w [D]. Reference: Glm5NextTextRMSNormGated.
void rms_norm_gated_sigmoid(const float* x, const float* gate, int T, int D, const float* w,
                            float eps, float* y);

// LayerNorm with weight and bias: y = (x - mean) * rsqrt(var + eps) * w + b (biased variance).
// x, y [T, D]; w, b [D]. Reference: nn.LayerNorm.
void layer_norm(const float* x, int T, int D, const float* w, const float* b, float eps, float* y);

// In-place per-head L2 norm: x[t, h, :] /= sqrt(sum(x^2) + eps). x [T, H, d].
// Reference: modeling_glm5_next.l2norm (eps inside the sqrt, FLA's form).
void l2norm_heads(float* x, int T, int H, int d, float eps);

// Interleaved ("NORM") RoPE in place over pairs (2j, 2j+1) of the last dim:
// x [T, n_vec, d_rope], positions [T]; theta_j = pos * base^(-2j/d_rope).
// Returns kContractOddRope when d_rope is odd. d_rope == 0 is a no-op.
// Reference: DeepSeek-V3 apply_rotary_pos_emb_interleave (kimi_linear/deepseek_v3 modeling).
Status rope_interleaved(float* x, const int32_t* positions, int T, int n_vec, int d_rope,
                        float base);

// y[i] = 1 / (1 + exp(-x[i])) over n elements (may alias). Reference: torch.sigmoid.
void sigmoid(const float* x, int64_t n, float* y);

// out[i] = x[i] + y[i] over n elements (out may alias x or y).
void add(const float* x, const float* y, int64_t n, float* out);

}  // namespace memra::cpu
