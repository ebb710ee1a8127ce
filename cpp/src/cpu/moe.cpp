// The grouped sigmoid router, the softmax router, the shared expert's gate and the routed experts:
// the CPU reference (cpu/moe.h). Oracles: Glm5NextTextTopkRouter, Glm5NextTextExperts,
// Qwen3_5MoeTopKRouter, Qwen3NextTopKRouter, Qwen3_5MoeSparseMoeBlock.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "memra/ops.h"

namespace memra::cpu {

namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Sort key of the router and the group selection: larger score first, lower index on ties.
struct Desc {
  const float* key;
  bool operator()(int a, int b) const { return key[a] > key[b] || (key[a] == key[b] && a < b); }
};

}  // namespace

void moe_route(const float* x, int T, int D, const WeightView& gate_w, const float* corr_bias, int E,
               int top_k, int n_group, int topk_group, bool norm_topk_prob, float scaling,
               int32_t* topk_idx, float* topk_w) {
  const int per_group = E / n_group;
  std::vector<float> logits(static_cast<size_t>(T) * E);
  linear(x, T, gate_w, nullptr, logits.data());

  std::vector<float> scores(E), choice(E), group_score(n_group);
  std::vector<int> groups(n_group), experts(E);
  std::vector<char> kept(n_group);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < T; ++t) {
    const float* lt = logits.data() + static_cast<int64_t>(t) * E;
    for (int e = 0; e < E; ++e) {
      scores[e] = sigmoid(lt[e]);
      choice[e] = corr_bias ? scores[e] + corr_bias[e] : scores[e];
    }
    // Group score: the sum of the two largest choice scores of the group (topk(2).sum()).
    for (int gi = 0; gi < n_group; ++gi) {
      const float* c = choice.data() + static_cast<int64_t>(gi) * per_group;
      float best = neg_inf, second = neg_inf;
      for (int i = 0; i < per_group; ++i) {
        if (c[i] > best) {
          second = best;
          best = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group_score[gi] = per_group >= 2 ? best + second : best;
    }
    std::iota(groups.begin(), groups.end(), 0);
    std::partial_sort(groups.begin(), groups.begin() + topk_group, groups.end(),
                      Desc{group_score.data()});
    std::fill(kept.begin(), kept.end(), 0);
    for (int i = 0; i < topk_group; ++i) kept[groups[i]] = 1;
    // Experts of dropped groups get -inf (masked_fill), then top_k by (choice desc, id asc).
    for (int e = 0; e < E; ++e) {
      if (!kept[e / per_group]) choice[e] = neg_inf;
    }
    std::iota(experts.begin(), experts.end(), 0);
    std::partial_sort(experts.begin(), experts.begin() + top_k, experts.end(),
                      Desc{choice.data()});

    int32_t* idx = topk_idx + static_cast<int64_t>(t) * top_k;
    float* w = topk_w + static_cast<int64_t>(t) * top_k;
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      idx[j] = experts[j];
      w[j] = scores[experts[j]];  // the unbiased score: the bias only chooses
      sum += w[j];
    }
    const float denom = sum + 1e-20f;
    for (int j = 0; j < top_k; ++j) {
      if (norm_topk_prob) w[j] /= denom;
      w[j] *= scaling;
    }
  }
}

void moe_route_softmax(const float* x, int T, int D, const WeightView& gate_w, int E, int top_k,
                       bool norm_topk_prob, float scaling, int32_t* topk_idx, float* topk_w) {
  std::vector<float> logits(static_cast<size_t>(T) * E);
  linear(x, T, gate_w, nullptr, logits.data());
  std::vector<float> probs(E);
  std::vector<int> experts(E);
  for (int t = 0; t < T; ++t) {
    const float* lt = logits.data() + static_cast<int64_t>(t) * E;
    // torch.softmax(logits, dtype=float): exp(l - max), each divided by the sum.
    float mx = lt[0];
    for (int e = 1; e < E; ++e) mx = std::max(mx, lt[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) {
      probs[e] = std::exp(lt[e] - mx);
      sum += probs[e];
    }
    for (int e = 0; e < E; ++e) probs[e] /= sum;
    std::iota(experts.begin(), experts.end(), 0);
    std::partial_sort(experts.begin(), experts.begin() + top_k, experts.end(), Desc{probs.data()});
    int32_t* idx = topk_idx + static_cast<int64_t>(t) * top_k;
    float* w = topk_w + static_cast<int64_t>(t) * top_k;
    float chosen = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      idx[j] = experts[j];
      w[j] = probs[experts[j]];
      chosen += w[j];
    }
    for (int j = 0; j < top_k; ++j) {
      if (norm_topk_prob) w[j] /= chosen;
      w[j] *= scaling;
    }
  }
}

void moe_shared_gate(const float* x, int T, int D, const float* gate_w, const float* shared,
                     const float* routed, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * D;
    float g = 0.0f;
    for (int d = 0; d < D; ++d) g += xt[d] * gate_w[d];
    const float s = sigmoid(g);
    for (int64_t i = t * D; i < (t + 1) * D; ++i) {
      const float scaled = s * shared[i];
      y[i] = routed[i] + scaled;
    }
  }
}

void moe_forward(const float* x, int T, int D, const int32_t* topk_idx, const float* topk_w,
                 int top_k, const WeightView* gate_w, const WeightView* up_w,
                 const WeightView* down_w, int E, float limit, float* y) {
  std::fill(y, y + static_cast<int64_t>(T) * D, 0.0f);
  // Bucket the (token, slot) pairs by expert; visiting experts in ascending id gives every token
  // its terms in ascending expert id, the order of transformers' per-expert index_add_.
  std::vector<std::vector<int64_t>> hits(E);
  for (int64_t r = 0; r < static_cast<int64_t>(T) * top_k; ++r) {
    if (topk_idx[r] >= 0 && topk_idx[r] < E) hits[topk_idx[r]].push_back(r);  // else no term
  }

  std::vector<float> xs, g, u, out;
  for (int e = 0; e < E; ++e) {
    const std::vector<int64_t>& h = hits[e];
    if (h.empty()) continue;
    const int n = static_cast<int>(h.size());
    const int64_t I = gate_w[e].rows;
    xs.resize(static_cast<size_t>(n) * D);
    g.resize(static_cast<size_t>(n) * I);
    u.resize(static_cast<size_t>(n) * I);
    out.resize(static_cast<size_t>(n) * D);
    for (int i = 0; i < n; ++i) {
      const int64_t t = h[i] / top_k;
      std::copy(x + t * D, x + (t + 1) * D, xs.data() + static_cast<int64_t>(i) * D);
    }
    linear(xs.data(), n, gate_w[e], nullptr, g.data());
    linear(xs.data(), n, up_w[e], nullptr, u.data());
    clamped_swiglu(g.data(), u.data(), static_cast<int64_t>(n) * I, limit);
    linear(g.data(), n, down_w[e], nullptr, out.data());
    for (int i = 0; i < n; ++i) {
      const int64_t t = h[i] / top_k;
      const float w = topk_w[h[i]];
      const float* o = out.data() + static_cast<int64_t>(i) * D;
      float* yt = y + t * D;
      for (int d = 0; d < D; ++d) yt[d] += o[d] * w;
    }
  }
}

}  // namespace memra::cpu
