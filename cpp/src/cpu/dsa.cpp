// DSA k-pool indexer: pool keys, head-mixed pool scores, top-k pool selection expanded to cache
// rows with the visible tail appended (cpu/dsa.h). Reference:
// Glm5NextTextIndexer.get_pooled_states / forward / append_visible_tail (transformers 5.17) for one
// unpadded sequence (first_key = 0, so pool p holds rows [p*pool, (p+1)*pool)).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "memra/cpu/dsa.h"

namespace memra::cpu {

void kpool_pool_key(const float* k_rows, const float* gate_rows, const float* ape, int pool, int d,
                    float* key) {
  // Per channel c: p = softmax over the pool's rows of gate[:, c] + ape[:, c]; key[c] = sum p k.
  for (int c = 0; c < d; ++c) {
    float m = -INFINITY;
    for (int r = 0; r < pool; ++r) m = std::max(m, gate_rows[r * d + c] + ape[r * d + c]);
    float l = 0.0f;
    for (int r = 0; r < pool; ++r) l += std::exp(gate_rows[r * d + c] + ape[r * d + c] - m);
    float acc = 0.0f;
    for (int r = 0; r < pool; ++r) {
      const float p = std::exp(gate_rows[r * d + c] + ape[r * d + c] - m) / l;
      acc += p * k_rows[r * d + c];
    }
    key[c] = acc;
  }
}

void kpool_score(const float* q, const float* w, const float* pool_keys, int t_q, int Hi, int d,
                 int n_pools, int pool, int first_pos, float qk_scale, float head_scale,
                 float* score) {
  for (int i = 0; i < t_q; ++i) {
    const int64_t pos = static_cast<int64_t>(first_pos) + i;
    float* s = score + static_cast<int64_t>(i) * n_pools;
    for (int p = 0; p < n_pools; ++p) {
      // A pool is a candidate only once its last row is visible to the query.
      if (static_cast<int64_t>(p) * pool + pool - 1 > pos) {
        s[p] = -INFINITY;
        continue;
      }
      const float* key = pool_keys + static_cast<int64_t>(p) * d;
      float acc = 0.0f;
      for (int h = 0; h < Hi; ++h) {
        const float* qh = q + (static_cast<int64_t>(i) * Hi + h) * d;
        float dot = 0.0f;
        for (int c = 0; c < d; ++c) dot += qh[c] * key[c];
        // transformers: weights = weights_proj(x) * n_heads**-0.5, then weights @ relu(q.k * s).
        acc += (w[static_cast<int64_t>(i) * Hi + h] * head_scale) * std::max(dot * qk_scale, 0.0f);
      }
      s[p] = acc;
    }
  }
}

Status kpool_select(const float* score, int t_q, int n_pools, int pool, int select_k, int width,
                    int first_pos, int32_t* idx) {
  if (pool < 1) {
    return Status(kContractPool, "kpool_select: pool must be >= 1, got pool=" +
                                     std::to_string(pool));
  }
  if (select_k < 0 || t_q < 0 || n_pools < 0 || first_pos < 0) {
    return Status(kContractValue, "kpool_select: select_k, t_q, n_pools and first_pos must be "
                                  ">= 0, got select_k=" + std::to_string(select_k) +
                                      " t_q=" + std::to_string(t_q) +
                                      " n_pools=" + std::to_string(n_pools) +
                                      " first_pos=" + std::to_string(first_pos));
  }
  const int64_t need = static_cast<int64_t>(select_k) * pool + pool - 1;
  if (width < need) {
    return Status(kContractIndexWidth,
                  "kpool_select: index width " + std::to_string(width) +
                      " is narrower than select_k*pool + pool - 1 = " + std::to_string(select_k) +
                      "*" + std::to_string(pool) + " + " + std::to_string(pool - 1) + " = " +
                      std::to_string(need));
  }
  std::vector<int> cand(static_cast<size_t>(n_pools));
  for (int i = 0; i < t_q; ++i) {
    const int64_t pos = static_cast<int64_t>(first_pos) + i;
    const float* s = score + static_cast<int64_t>(i) * n_pools;
    int32_t* out = idx + static_cast<int64_t>(i) * width;
    // Candidates: finite scores of pools whose last row is visible (kpool_score already gives
    // the others -inf; the visibility test keeps a hand-made score from selecting future rows or
    // a pool that overlaps the tail).
    int n = 0;
    for (int p = 0; p < n_pools; ++p) {
      if (std::isfinite(s[p]) && static_cast<int64_t>(p) * pool + pool - 1 <= pos) cand[n++] = p;
    }
    const int k = std::min(select_k, n);
    // Order (score desc, pool index asc); a strict weak order, so ties go to the lower index.
    std::partial_sort(cand.begin(), cand.begin() + k, cand.begin() + n, [s](int a, int b) {
      return s[a] > s[b] || (s[a] == s[b] && a < b);
    });
    std::sort(cand.begin(), cand.begin() + k);
    int e = 0;
    for (int j = 0; j < k; ++j)
      for (int r = 0; r < pool; ++r) out[e++] = cand[j] * pool + r;
    // Visible tail: the rows of the incomplete pool that holds pos, [pos+1 - (pos+1)%pool, pos].
    for (int64_t r = (pos + 1) - (pos + 1) % pool; r <= pos; ++r) out[e++] = static_cast<int32_t>(r);
    while (e < width) out[e++] = -1;
  }
  return Status::Ok();
}

}  // namespace memra::cpu
