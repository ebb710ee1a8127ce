// The CPU reference of the full (softmax) attention's ops (cpp/src/cpu/attention.cpp): the gated
// attention of Qwen3.5 / Qwen3-Next, transformers 5.17 models/qwen3_5/modeling_qwen3_5.py
// Qwen3_5Attention (Qwen3NextAttention is the same arithmetic). Conventions as memra/ops.h: f32
// C-contiguous activations with the shape beside each argument, no throwing, the binding layer
// checks shapes. Both backends: memra/op/attention.h; CUDA twins: cuda_abi/attention.h.
#pragma once

#include <cstdint>

namespace memra::cpu {

// The inverse RoPE frequencies of Qwen3_5TextRotaryEmbedding.compute_default_rope_parameters:
//   inv_freq[j] = 1.0 / (base ** (arange(0, dim, 2, dtype=float32) / dim)),  j < dim / 2,
// in torch's float32 arithmetic: base is taken as f32, the exponent 2j / dim is an f32
// division, the power is rounded once to f32 (torch's own pow is within one ulp of it), and the
// reciprocal is an f32 division. dim = int(head_dim * partial_rotary_factor) (the rotated
// dims), even. out [dim / 2].
void rope_inv_freq(double base, int dim, float* out);

// The joint [q | gate] projection split per head: q_proj's output viewed as [T, H, 2 * hd] and
// chunked in two along the last dim (torch.chunk(q_proj(x).view(T, -1, 2 * hd), 2, dim=-1)).
// qg [T, ld] (row t at qg + t * ld, ld >= 2 * H * hd); q, gate [T, H, hd].
void attn_split_gate(const float* qg, int64_t ld, int T, int H, int hd, float* q, float* gate);

// Partial NeoX (rotate-half) RoPE in place over x [T, H, hd]: for each head, with
// half = n_rot / 2, j < half, angle = float(positions[t]) * inv_freq[j] (one f32 product, as
// the reference's inv_freq @ position_ids), c = cos(angle), s = sin(angle) in f32:
//   x[j]        <- x[j] * c + (-x[j + half]) * s
//   x[j + half] <- x[j + half] * c + x[j] * s
// (apply_rotary_pos_emb: q_rot * cos + rotate_half(q_rot) * sin over the first n_rot dims, cos
// and sin being cat(freqs, freqs)); dims n_rot..hd-1 unchanged. n_rot even, 0..hd;
// inv_freq [n_rot / 2]. Text-only positions: the three mRoPE grids carry the same position, so
// Qwen3_5TextRotaryEmbedding.recomposition_frequencies keeps plain RoPE.
void rope_neox(float* x, const int32_t* positions, int T, int H, int hd, int n_rot,
               const float* inv_freq);

// Grouped causal attention with the optional sigmoid output gate (eager_attention_forward with
// repeat_kv; then attn_output * sigmoid(gate)). Query t, head h reads K/V head h / (Hq / Hkv)
// over the rows j < n_keys[t]:
//   s_j = (q . k_j) * scale; p_j = exp(s_j - max s) / sum_j exp(s_j - max s) (ascending j);
//   o = sum_j p_j v_j (ascending j); o *= 1 / (1 + exp(-gate)) when gate != nullptr.
// q, gate, o [T, Hq, hd]; k, v [rows, Hkv, hd] (rows >= max n_keys); n_keys [T] (0: o = 0).
void attention(const float* q, const float* k, const float* v, const int32_t* n_keys, int T,
               int Hq, int Hkv, int hd, float scale, const float* gate, float* o);

}  // namespace memra::cpu
