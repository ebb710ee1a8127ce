// Counter-based RNG and temperature / top-k / top-p sampling: the CPU reference (cpu/sample.h).
// The arithmetic is spelled out in cpu/sample.h so the CUDA twin draws the same tokens;
// every sum runs in the spec's blocked order (kSampleBlock terms per block).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "memra/cpu/sample.h"

namespace memra::cpu {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

int32_t argmax(const float* v, int V) {
  int32_t best = 0;
  for (int i = 1; i < V; ++i) {
    // strict: ties keep the lower id; a NaN never takes the lead, and a NaN at id 0 keeps it
    // (every comparison with it is false)
    if (v[i] > v[best]) best = i;
  }
  return best;
}

struct Walk {
  int found;  // the first index whose running sum is done, or -1
  float sum;  // the running sum there, or the whole sum when found < 0
};

// cpu/sample.h's blocked sum of term(0), ..., term(n - 1): block b holds the terms [b L, b L + L) and is
// summed left to right from 0 (w); the running sum at index i of block b is P_b + w, where P_b is
// the sum of the block sums 0 .. b - 1 left to right (P_0 = 0); the whole sum is P over every
// block. Stops at the first index whose running sum satisfies `done`.
template <class Term, class Done>
Walk blocked_walk(int n, Term term, Done done) {
  float prefix = 0.0f;  // P_b
  for (int lo = 0; lo < n; lo += kSampleBlock) {
    const int hi = std::min(n, lo + kSampleBlock);
    float w = 0.0f;
    for (int i = lo; i < hi; ++i) {
      w += term(i);
      const float run = prefix + w;
      if (done(run)) return Walk{i, run};
    }
    prefix += w;  // P_{b+1} = P_b + S_b: the running sum at the block's last index
  }
  return Walk{-1, prefix};
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
            uint64_t seed, const uint64_t* counters, int32_t* out, int32_t* nonfinite) {
  std::vector<float> p(V);
  std::vector<int32_t> order(V);
  auto never = [](float) { return false; };
  for (int b = 0; b < B; ++b) {
    const float* lb = logits + static_cast<int64_t>(b) * V;
    if (nonfinite) {
      int32_t bad = 0;
      for (int i = 0; i < V && !bad; ++i) bad = std::isfinite(lb[i]) ? 0 : 1;
      nonfinite[b] = bad;
    }
    if (temperature <= 0.0f) {
      out[b] = argmax(lb, V);
      continue;
    }
    float m = -INFINITY;
    for (int i = 0; i < V; ++i) {
      p[i] = lb[i] / temperature;
      m = std::max(m, p[i]);
    }
    for (int i = 0; i < V; ++i) p[i] = std::exp(p[i] - m);
    // s = blocked sum of e over ascending id.
    const float s = blocked_walk(V, [&](int i) { return p[i]; }, never).sum;
    if (!(s > 0.0f) || !std::isfinite(s)) {  // all -inf, or NaN / inf: no distribution to draw from
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
    // Mk = blocked sum of p over the first k in sorted order; q = p / Mk over them.
    const float mk = blocked_walk(k, [&](int i) { return p[order[i]]; }, never).sum;
    for (int i = 0; i < k; ++i) p[order[i]] = p[order[i]] / mk;
    auto q_at = [&](int i) { return p[order[i]]; };
    // top_p keeps up to and including the first entry whose running q-mass reaches it.
    const Walk cut =
        blocked_walk(k, q_at, [top_p](float mass) { return top_p < 1.0f && mass >= top_p; });
    const int n = cut.found >= 0 ? cut.found + 1 : k;
    const float mass = cut.sum;  // M: the running sum at n - 1
    const float r = uniform_from_counter(seed, counters[b]) * mass;
    // The draw: the first kept entry whose running c (the same blocked running sum) exceeds r.
    const Walk draw = blocked_walk(n, q_at, [r](float c) { return c > r; });
    int32_t pick = draw.found >= 0 ? order[draw.found] : -1;
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
