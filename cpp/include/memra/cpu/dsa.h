// The CPU reference of the DSA k-pool indexer (cpp/src/cpu/dsa.cpp), in the conventions of
// memra/ops.h (the umbrella header of every reference op): pool keys, head-mixed pool scores,
// top-k pool selection. memra::op (op/dsa.h) runs them or their CUDA twins.
#pragma once

#include <cstdint>

#include "memra/status.h"
#include "memra/tensor.h"

namespace memra::cpu {

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

}  // namespace memra::cpu
