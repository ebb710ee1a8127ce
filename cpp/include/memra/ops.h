// The CPU reference backend: every op glm5_next needs, in f32 arithmetic (weights are read in
// their file dtype and converted per row). These functions are the numeric oracle for the CUDA
// backend; transformers 5.17 (models/glm5_next/modeling_glm5_next.py) is the oracle for them.
//
// Conventions: all activation pointers are f32, C-contiguous, row-major, with the shape written
// beside each argument. T is the number of tokens in the call. Ops never throw and never
// allocate on behalf of the caller except scratch; those that can refuse a scalar argument
// return a Status, the rest are void (the binding layer checks shapes before calling).
#pragma once

#include <cstdint>

#include "memra/status.h"
#include "memra/tensor.h"

// The areas whose declarations live in their own headers (memra/cpu/<area>.h); ops.h includes
// them so that it stays the one header for every reference op.
#include "memra/cpu/mlp.h"
#include "memra/cpu/moe.h"
#include "memra/cpu/sample.h"

namespace memra::cpu {

// ---------------------------------------------------------------- basic (cpu/basic.cpp)

// out[t, :] = table[ids[t], :]. table [vocab, D]; ids [T] (already range-checked); out [T, D].
void embedding(const WeightView& table, const int32_t* ids, int T, float* out);

// y[T, N] = x[T, K] @ w[N, K]^T (+ bias[N] when bias != nullptr). Reference: nn.Linear.
void linear(const float* x, int T, const WeightView& w, const float* bias, float* y);

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

// ---------------------------------------------------------------- KDA (cpu/kda.cpp)

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

// ---------------------------------------------------------------- MLA (cpu/mla.cpp)

// Absorb: q_lat[t, h, :] = W_uk[h]^T q_nope[t, h, :], where W_uk[h] = kv_b rows
// [h*(d_nope+d_v), h*(d_nope+d_v)+d_nope). q_nope [T, H, d_nope]; kv_b [H*(d_nope+d_v), R];
// q_lat [T, H, R].
void mla_absorb_q(const float* q_nope, const WeightView& kv_b, int T, int H, int d_nope, int d_v,
                  float* q_lat);

// Decompress: out[t, h, :] = W_uv[h] o_lat[t, h, :], W_uv[h] = kv_b rows
// [h*(d_nope+d_v)+d_nope, (h+1)*(d_nope+d_v)). o_lat [T, H, R]; out [T, H, d_v].
void mla_decompress_v(const float* o_lat, const WeightView& kv_b, int T, int H, int d_nope, int d_v,
                      float* out);

// Absorbed causal attention over a latent cache. cache [t_kv, R + d_rope] (normalised latent,
// then the rope part); queries are the last t_q rows: query i sits at row t_kv - t_q + i and sees
// rows <= that. q_lat [t_q, H, R]; q_pe [t_q, H, d_rope] or nullptr when d_rope == 0;
// o_lat [t_q, H, R]. score = (q_lat . c + q_pe . k_pe) * scale.
// Returns kContractQuerySuffix when t_q > t_kv.
Status mla_attn_absorbed(const float* q_lat, const float* q_pe, const float* cache, int H, int R,
                         int d_rope, int t_q, int t_kv, float scale, float* o_lat);

// Gathered attention: query i attends over the cache rows listed in idx[i, :] (entries -1 are
// skipped; order does not matter). idx [t_q, width]; other arguments as mla_attn_absorbed.
// A query whose list is all -1 gets o_lat = 0 (finite). Rows must be < t_kv
// (kContractRange otherwise).
Status mla_attn_gathered(const float* q_lat, const float* q_pe, const float* cache,
                         const int32_t* idx, int H, int R, int d_rope, int t_q, int t_kv,
                         int width, float scale, float* o_lat);

// ---------------------------------------------------------------- DSA k-pool indexer (cpu/dsa.cpp)

// Pool key of one complete pool: p = softmax over the pool's rows of (gate + ape) per channel,
// key = sum_rows p * k. k_rows, gate_rows [pool, d] (the pool's rows in order); ape [pool, d];
// key [d]. Reference: Glm5NextTextIndexer.get_pooled_states.
void kpool_pool_key(const float* k_rows, const float* gate_rows, const float* ape, int pool, int d,
                    float* key);

// Head-mixed pool scores for t_q queries at absolute positions first_pos + i:
//   score[i, p] = sum_h w[i, h] * head_scale * relu(qk_scale * q[i, h, :] . pool_keys[p, :])
// summed over h in ascending order, and -inf where the pool's last row p*pool + pool - 1 is
// after the query's position. q [t_q, Hi, d]; w [t_q, Hi]; pool_keys [n_pools, d];
// score [t_q, n_pools].
void kpool_score(const float* q, const float* w, const float* pool_keys, int t_q, int Hi, int d,
                 int n_pools, int pool, int first_pos, float qk_scale, float head_scale,
                 float* score);

// Selection and index list: per query i (position first_pos + i), take the top select_k pools by
// (score desc, pool index asc) among the pools with a finite score, write their rows in ascending
// pool order, then the visible tail rows [(pos+1) - (pos+1) % pool, pos], then -1 up to width.
// score [t_q, n_pools]; idx [t_q, width]. Returns kContractIndexWidth when
// width < select_k*pool + pool - 1. Reference: Glm5NextTextIndexer.forward + append_visible_tail
// (as a set; always_select_tail = true).
Status kpool_select(const float* score, int t_q, int n_pools, int pool, int select_k, int width,
                    int first_pos, int32_t* idx);

// ---------------------------------------------------------------- mHC (cpu/mhc.cpp)

// Hyper-connection mapping. streams [T, hc, D]; fn [(2+hc)*hc, hc*D]; base [(2+hc)*hc];
// scale [3]; post [T, hc]; comb [T, hc, hc]; collapsed [T, D] = sum_s pre[s] * streams[s].
// norm_eps = rms_norm_eps (unweighted RMSNorm of the flattened streams), hc_eps for the
// sigmoid floor and the Sinkhorn denominators. Reference: Glm5NextTextHyperConnection.forward.
void mhc_pre(const float* streams, int T, int hc, int D, const WeightView& fn, const float* base,
             const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* post,
             float* comb, float* collapsed);

// out[t, j, :] = post[t, j] * y[t, :] + sum_i comb[t, i, j] * residual[t, i, :].
// y [T, D]; post [T, hc]; comb [T, hc, hc]; residual, out [T, hc, D] (out may not alias).
// Reference: Glm5NextTextDecoderLayer.forward.
void mhc_post(const float* y, const float* post, const float* comb, const float* residual, int T,
              int hc, int D, float* out);

// out[t, :] = mean over s of streams[t, s, :]. Reference: Glm5NextTextHyperHead.
void hc_head_mean(const float* streams, int T, int hc, int D, float* out);

}  // namespace memra::cpu
