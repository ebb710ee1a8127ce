// The CPU reference of the MLA ops (cpp/src/cpu/mla.cpp), in the conventions of memra/ops.h
// (the umbrella header of every reference op): q absorption, v decompression, causal and
// gathered attention over the latent cache. memra::op (op/mla.h) runs them or their CUDA twins.
#pragma once

#include <cstdint>

#include "memra/status.h"
#include "memra/tensor.h"

namespace memra::cpu {

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
// A query whose list is all -1 gets o_lat = 0 (finite). Queries are the last t_q rows
// (kContractQuerySuffix when t_q > t_kv); a listed row must be at most its query's row
// t_kv - t_q + i (kContractRange otherwise, nothing written).
Status mla_attn_gathered(const float* q_lat, const float* q_pe, const float* cache,
                         const int32_t* idx, int H, int R, int d_rope, int t_q, int t_kv,
                         int width, float scale, float* o_lat);

}  // namespace memra::cpu
