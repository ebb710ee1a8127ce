// The CPU reference of the Gated DeltaNet (GDN) mixer's own ops (cpp/src/cpu/gdn.cpp): the
// per-head gates, the q/k L2 norm in Qwen's form, the grouped-head delta-rule scan and the
// SiLU-gated RMSNorm. Oracle: transformers 5.17 models/qwen3_5/modeling_qwen3_5.py
// (Qwen3_5GatedDeltaNet.forward, l2norm, torch_recurrent_gated_delta_rule, Qwen3_5RMSNormGated;
// models/qwen3_next is the same arithmetic). The causal conv is KDA's (memra/cpu/kda.h
// kda_conv_prefill / kda_conv_decode, op::kda_conv: any channel count, the same arithmetic as
// causal_conv1d_fn / causal_conv1d_update). Both backends: memra/op/gdn.h; CUDA twins:
// cuda_abi/gdn.h.
//
// Conventions as memra/ops.h: f32 activations with the shape beside each argument, no throwing,
// the binding layer checks shapes. A row stride `ld` counts floats between consecutive rows, so
// an op can read q, k and v where the conv leaves them (one [T, 2*Hk*dk + Hv*dv] tensor).
// No reassociation (no -ffast-math); sums run in ascending index order.
#pragma once

#include <cstdint>

namespace memra::cpu {

// The per-value-head gates (Qwen3_5GatedDeltaNet.forward):
//   g[t, h]    = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h])
//   beta[t, h] = 1 / (1 + exp(-b[t, h]))                                   (torch.sigmoid)
// softplus is F.softplus (beta 1, threshold 20): x itself above 20, else log1p(exp(x)).
// a, b [T, H] with rows lda / ldb floats apart (>= H); dt_bias, A_log [H]; g, beta [T, H].
void gdn_gate(const float* a, int64_t lda, const float* b, int64_t ldb, const float* dt_bias,
              const float* A_log, int T, int H, float* g, float* beta);

// In-place L2 norm of `heads` vectors of d per row, Qwen's form (l2norm):
//   x *= 1 / sqrt(sum(x^2) + eps)
// (torch.rsqrt is one division by the square root; KDA's l2norm_heads divides x by the root
// instead, which rounds differently). Vector (r, h) starts at x + r*ld + h*d, ld >= heads*d.
void gdn_l2norm(float* x, int rows, int heads, int d, int64_t ld, float eps);

// The gated delta rule over T steps of one sequence (torch_recurrent_gated_delta_rule), value
// head h reading key head h / (Hv / Hk) (repeat_interleave's order):
//   S = S * exp(g[t, h]);  kv = k^T S;  d = (v - kv) * beta[t, h];  S += k d^T;
//   o[t, h] = (scale q)^T S
// with q, k already L2-normalised (gdn_l2norm). q, k: row t at q + t*qk_ld, key head kh at
// + kh*dk; v: row t at v + t*v_ld, value head h at + h*dv; g, beta [T, Hv]; state_in (nullptr:
// zeros), state_out [Hv, dk, dv] (distinct); o [T, Hv, dv]. Each step is cpu::kda_scan's with the
// head's decay broadcast over dk (bit for bit), and it runs on state_out in place, so T one-step
// calls chained through the state equal one T-step call.
void gdn_scan(const float* q, const float* k, int64_t qk_ld, const float* v, int64_t v_ld,
              const float* g, const float* beta, int T, int Hk, int Hv, int dk, int dv,
              float scale, const float* state_in, float* state_out, float* o);

// The GDN output norm (Qwen3_5RMSNormGated; plain weight, not zero-centred):
//   y = (w * (x * (1 / sqrt(mean(x^2) + eps)))) * silu(gate),  silu(z) = z / (1 + exp(-z))
// x, gate, y [T, D] (y may alias x); w [D].
void rms_norm_gated_silu(const float* x, const float* gate, int T, int D, const float* w,
                         float eps, float* y);

}  // namespace memra::cpu
