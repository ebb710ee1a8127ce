// Counter-based RNG and temperature / top-k / top-p sampling: the CPU reference (ops.h
// "sampling"). The arithmetic is spelled out in ops.h so the CUDA twin draws the same tokens.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "memra/ops.h"

namespace memra::cpu {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

int32_t argmax(const float* v, int V) {
  int32_t best = 0;
  for (int i = 1; i < V; ++i) {
    if (v[i] > v[best]) best = i;  // strict: ties keep the lower id (NaN never wins)
  }
  return best;
}

}  // namespace

float uniform_from_counter(uint64_t seed, uint64_t counter) {
  uint64_t z = seed ^ (kGolden * (counter + 1));
  z += kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

void sample(const float* logits, int B, int V, float temperature, int top_k, float top_p,
            uint64_t seed, const uint64_t* counters, int32_t* out) {
  std::vector<float> p(V);
  std::vector<int32_t> order(V);
  for (int b = 0; b < B; ++b) {
    const float* lb = logits + static_cast<int64_t>(b) * V;
    if (temperature <= 0.0f) {
      out[b] = argmax(lb, V);
      continue;
    }
    float m = -INFINITY;
    for (int i = 0; i < V; ++i) {
      p[i] = lb[i] / temperature;
      m = std::max(m, p[i]);
    }
    float s = 0.0f;
    for (int i = 0; i < V; ++i) {
      p[i] = std::exp(p[i] - m);
      s += p[i];
    }
    if (!(s > 0.0f) || !std::isfinite(s)) {  // all -inf, or NaN: no distribution to draw from
      out[b] = argmax(lb, V);
      continue;
    }
    for (int i = 0; i < V; ++i) p[i] = p[i] / s;

    const int k = (top_k <= 0 || top_k > V) ? V : top_k;
    std::iota(order.begin(), order.end(), 0);
    const float* pp = p.data();
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [pp](int32_t a, int32_t c) {
      return pp[a] > pp[c] || (pp[a] == pp[c] && a < c);
    });
    float mk = 0.0f;
    for (int i = 0; i < k; ++i) mk += p[order[i]];
    // q = p / mk over the kept top-k; top_p keeps the shortest prefix whose q-mass reaches it.
    int n = k;
    float mass = 0.0f;
    for (int i = 0; i < k; ++i) {
      p[order[i]] = p[order[i]] / mk;
      mass += p[order[i]];
      if (top_p < 1.0f && mass >= top_p) {
        n = i + 1;
        break;
      }
    }
    const float r = uniform_from_counter(seed, counters[b]) * mass;
    int32_t pick = -1;
    float c = 0.0f;
    for (int i = 0; i < n; ++i) {
      c += p[order[i]];
      if (c > r) {
        pick = order[i];
        break;
      }
    }
    if (pick < 0) {  // rounding left u * M at the very end: the last kept entry with q > 0
      pick = order[0];
      for (int i = n; i-- > 0;) {
        if (p[order[i]] > 0.0f) {
          pick = order[i];
          break;
        }
      }
    }
    out[b] = pick;
  }
}

}  // namespace memra::cpu
