// FFN (SwiGLU clamp, grouped router, routed experts) and sampling CPU ops against
// double-precision loops written here (the formulas of modeling_glm5_next.py). mHC: test_mhc.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "memra/ops.h"
#include "test_util.h"

namespace memra {
namespace {

using memra::testing::randn;

Weight f32_weight(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return Weight(DType::kF32, {rows, cols}, v.data());
}

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// y [N] = w [N, K] x [K] in double.
std::vector<double> matvec(const std::vector<float>& w, const double* x, int N, int K) {
  std::vector<double> y(N, 0.0);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) y[n] += double(w[size_t(n) * K + k]) * x[k];
  return y;
}

struct ClampStats {
  int gate_clamped = 0, up_clamped = 0;
};

// Glm5NextTextMLP.forward on one token, in double.
std::vector<double> mlp_ref(const float* x, int D, int I, const std::vector<float>& gw,
                            const std::vector<float>& uw, const std::vector<float>& dw,
                            double limit, ClampStats* st = nullptr) {
  std::vector<double> xd(x, x + D);
  auto g = matvec(gw, xd.data(), I, D), u = matvec(uw, xd.data(), I, D);
  std::vector<double> h(I);
  for (int i = 0; i < I; ++i) {
    if (st && g[i] > limit) st->gate_clamped++;
    if (st && std::abs(u[i]) > limit) st->up_clamped++;
    const double gc = std::min(g[i], limit), uc = std::max(-limit, std::min(u[i], limit));
    h[i] = gc * sig(gc) * uc;
  }
  return matvec(dw, h.data(), D, I);
}

// ---------------------------------------------------------------- SwiGLU MLP

TEST(FfnSwiglu, MatchesDoubleLoopWithClampEngaged) {
  const int T = 5, D = 13, I = 11;
  const float limit = 1.5f;
  auto x = randn(T * D, 1, 1.0f);
  auto gw = randn(I * D, 2, 0.8f), uw = randn(I * D, 3, 0.8f), dw = randn(D * I, 4, 0.3f);
  std::vector<float> y(T * D);
  cpu::swiglu_mlp(x.data(), T, f32_weight(gw, I, D), f32_weight(uw, I, D), f32_weight(dw, D, I),
                  limit, y.data());
  ClampStats st;
  double max_err = 0;
  for (int t = 0; t < T; ++t) {
    auto ref = mlp_ref(x.data() + t * D, D, I, gw, uw, dw, limit, &st);
    for (int d = 0; d < D; ++d) max_err = std::max(max_err, std::abs(y[t * D + d] - ref[d]));
  }
  EXPECT_LT(max_err, 2e-5);
  EXPECT_GT(st.gate_clamped, 0);  // the clamp must be exercised, in both directions for up
  EXPECT_GT(st.up_clamped, 0);
}

// ---------------------------------------------------------------- router

struct Route {
  std::vector<int32_t> idx;
  std::vector<float> w;
};

// Router with identity gate weights, so x holds the router logits directly.
Route route(const std::vector<float>& logits, const std::vector<float>* bias, int E, int top_k,
            int n_group, int topk_group, bool norm, float scaling) {
  const int T = static_cast<int>(logits.size()) / E;
  std::vector<float> eye(E * E, 0.0f);
  for (int e = 0; e < E; ++e) eye[e * E + e] = 1.0f;
  Route r{std::vector<int32_t>(T * top_k), std::vector<float>(T * top_k)};
  cpu::moe_route(logits.data(), T, E, f32_weight(eye, E, E), bias ? bias->data() : nullptr, E,
                 top_k, n_group, topk_group, norm, scaling, r.idx.data(), r.w.data());
  return r;
}

// Glm5NextTextTopkRouter.forward in double, with the documented tie rules.
Route route_ref(const std::vector<float>& x, int T, int D, const std::vector<float>& gw,
                const std::vector<float>* bias, int E, int top_k, int n_group, int topk_group,
                bool norm, double scaling) {
  Route r{std::vector<int32_t>(T * top_k), std::vector<float>(T * top_k)};
  const int per = E / n_group;
  for (int t = 0; t < T; ++t) {
    std::vector<double> xd(x.begin() + t * D, x.begin() + (t + 1) * D);
    auto logit = matvec(gw, xd.data(), E, D);
    std::vector<double> s(E), c(E);
    for (int e = 0; e < E; ++e) {
      s[e] = sig(logit[e]);
      c[e] = s[e] + (bias ? (*bias)[e] : 0.0);
    }
    std::vector<double> gs(n_group);
    for (int g = 0; g < n_group; ++g) {
      std::vector<double> v(c.begin() + g * per, c.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gs[g] = v[0] + (per > 1 ? v[1] : 0.0);
    }
    std::vector<int> go(n_group);
    std::iota(go.begin(), go.end(), 0);
    std::stable_sort(go.begin(), go.end(), [&](int a, int b) { return gs[a] > gs[b]; });
    std::vector<int> cand;
    for (int e = 0; e < E; ++e)
      if (std::find(go.begin(), go.begin() + topk_group, e / per) != go.begin() + topk_group)
        cand.push_back(e);
    std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return c[a] > c[b]; });
    double sum = 0;
    for (int j = 0; j < top_k; ++j) sum += s[cand[j]];
    for (int j = 0; j < top_k; ++j) {
      r.idx[t * top_k + j] = cand[j];
      r.w[t * top_k + j] = static_cast<float>((norm ? s[cand[j]] / (sum + 1e-20) : s[cand[j]]) *
                                              scaling);
    }
  }
  return r;
}

TEST(FfnRoute, MatchesDoubleReference) {
  const int T = 7, D = 9, E = 12, top_k = 3, n_group = 4, topk_group = 2;
  auto x = randn(T * D, 5);
  auto gw = randn(E * D, 6, 0.7f);
  auto bias = randn(E, 7, 0.1f);
  for (bool norm : {true, false}) {
    std::vector<int32_t> idx(T * top_k);
    std::vector<float> w(T * top_k);
    cpu::moe_route(x.data(), T, D, f32_weight(gw, E, D), bias.data(), E, top_k, n_group,
                   topk_group, norm, 2.5f, idx.data(), w.data());
    Route ref = route_ref(x, T, D, gw, &bias, E, top_k, n_group, topk_group, norm, 2.5);
    EXPECT_EQ(idx, ref.idx);
    for (int i = 0; i < T * top_k; ++i) EXPECT_NEAR(w[i], ref.w[i], 2e-6);
  }
}

TEST(FfnRoute, GroupMaskChangesTheChoice) {
  // Groups of 2: g0 = {0: 0.95, 1: 0.007}, g1 = {2, 3: 0.73}, g2 = {4, 5: 0.69}, g3 = {6, 7: 0.05}.
  // Expert 0 has the best single score, but its group's top-2 sum (0.96) loses to g1 and g2.
  const std::vector<float> logits = {3.0f, -5.0f, 1.0f, 1.0f, 0.8f, 0.8f, -3.0f, -3.0f};
  Route grouped = route(logits, nullptr, 8, 2, 4, 2, true, 1.0f);
  EXPECT_EQ(grouped.idx, (std::vector<int32_t>{2, 3}));  // equal scores: lower id first
  EXPECT_NEAR(grouped.w[0], 0.5f, 1e-6);
  Route flat = route(logits, nullptr, 8, 2, 1, 1, true, 1.0f);
  EXPECT_EQ(flat.idx, (std::vector<int32_t>{0, 2}));
  // Three kept groups: now g0 is in, and expert 0 leads.
  Route three = route(logits, nullptr, 8, 3, 4, 3, false, 2.0f);
  EXPECT_EQ(three.idx, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_NEAR(three.w[0], 2.0 * sig(3.0), 1e-6);
}

TEST(FfnRoute, BiasChoosesButWeightsStayUnbiased) {
  const std::vector<float> logits = {0.5f, 0.4f, -2.0f, 0.3f};
  const std::vector<float> bias = {0.0f, 0.0f, 1.0f, 0.0f};
  Route r = route(logits, &bias, 4, 2, 1, 1, true, 1.0f);
  EXPECT_EQ(r.idx, (std::vector<int32_t>{2, 0}));
  const double s2 = sig(-2.0), s0 = sig(0.5);
  EXPECT_NEAR(r.w[0], s2 / (s2 + s0), 1e-6);
  EXPECT_NEAR(r.w[1], s0 / (s2 + s0), 1e-6);
}

TEST(FfnRoute, TiedGroupsAndExpertsGoToLowerIndex) {
  const std::vector<float> logits(8, 0.25f);
  Route r = route(logits, nullptr, 8, 3, 4, 2, true, 1.0f);
  EXPECT_EQ(r.idx, (std::vector<int32_t>{0, 1, 2}));
}

// ---------------------------------------------------------------- routed experts

TEST(FfnMoe, ForwardMatchesDoubleLoopInExpertOrder) {
  const int T = 6, D = 10, I = 7, E = 5, top_k = 3;
  const float limit = 2.0f;
  auto x = randn(T * D, 8, 1.5f);
  std::vector<std::vector<float>> gws, uws, dws;
  std::vector<Weight> gw, uw, dw;
  for (int e = 0; e < E; ++e) {
    gws.push_back(randn(I * D, 100 + e, 0.6f));
    uws.push_back(randn(I * D, 200 + e, 0.6f));
    dws.push_back(randn(D * I, 300 + e, 0.4f));
    gw.push_back(f32_weight(gws[e], I, D));
    uw.push_back(f32_weight(uws[e], I, D));
    dw.push_back(f32_weight(dws[e], D, I));
  }
  // Descending-score order, as the router returns it; expert 4 is never hit.
  const std::vector<int32_t> idx = {3, 0, 1, 1, 2, 0, 0, 3, 2, 2, 1, 3, 0, 1, 2, 3, 2, 1};
  auto wv = randn(T * top_k, 9, 0.5f);
  std::vector<float> y(T * D);
  cpu::moe_forward(x.data(), T, D, idx.data(), wv.data(), top_k, views_of(gw).data(),
                   views_of(uw).data(), views_of(dw).data(), E, limit, y.data());
  ClampStats st;
  double max_err = 0;
  for (int t = 0; t < T; ++t) {
    std::vector<double> ref(D, 0.0);
    for (int j = 0; j < top_k; ++j) {
      const int e = idx[t * top_k + j];
      auto o = mlp_ref(x.data() + t * D, D, I, gws[e], uws[e], dws[e], limit, &st);
      for (int d = 0; d < D; ++d) ref[d] += wv[t * top_k + j] * o[d];
    }
    for (int d = 0; d < D; ++d) max_err = std::max(max_err, std::abs(y[t * D + d] - ref[d]));
  }
  EXPECT_LT(max_err, 2e-5);
  EXPECT_GT(st.gate_clamped + st.up_clamped, 0);
}

TEST(FfnMoe, SumsInAscendingExpertIdPerToken) {
  // One token, two experts listed as (3, 1): the result must be exactly 0 + term(1) + term(3)
  // in f32, the order of transformers' per-expert index_add_.
  const int D = 1, I = 1, E = 4;
  std::vector<float> one = {1.0f};
  std::vector<std::vector<float>> dws = {{1.0f}, {1e8f}, {1.0f}, {1.0f}};
  std::vector<Weight> gw, uw, dw;
  const float g = 50.0f;  // silu(50) == 50 in f32
  std::vector<float> gv = {g};
  for (int e = 0; e < E; ++e) {
    gw.push_back(f32_weight(gv, I, D));
    uw.push_back(f32_weight(one, I, D));
    dw.push_back(f32_weight(dws[e], D, I));
  }
  const std::vector<int32_t> idx = {3, 1};
  const std::vector<float> w = {1.0f / 64.0f, 1.0f};
  float y = 0.0f;
  cpu::moe_forward(one.data(), 1, D, idx.data(), w.data(), 2, views_of(gw).data(),
                   views_of(uw).data(), views_of(dw).data(), E, 1e9f, &y);
  const float term1 = (1e8f * (g / (1.0f + std::exp(-g)))) * 1.0f;
  const float term3 = (1.0f * (g / (1.0f + std::exp(-g)))) * (1.0f / 64.0f);
  EXPECT_EQ(y, (0.0f + term1) + term3);
}

// ---------------------------------------------------------------- sampling

TEST(SampleRng, PinnedValuesOfTheCounterFormula) {
  // Values of the ops.h formula computed independently (Python big integers); the CUDA backend
  // must give the same.
  EXPECT_EQ(cpu::uniform_from_counter(0, 0), 7239838.0f / 16777216.0f);
  EXPECT_EQ(cpu::uniform_from_counter(0, 1), 443485.0f / 16777216.0f);
  EXPECT_EQ(cpu::uniform_from_counter(12345, 7), 12610706.0f / 16777216.0f);
  EXPECT_EQ(cpu::uniform_from_counter(~0ull, ~0ull), 14997873.0f / 16777216.0f);
}

TEST(SampleRng, UniformMoments) {
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = cpu::uniform_from_counter(42, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sq += u * u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_NEAR(sq / n - (sum / n) * (sum / n), 1.0 / 12.0, 0.002);
}

TEST(Sample, GreedyTiesGoToLowerId) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f, 2.0f, 1.9f,   //
                                     -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -3.0f};
  const std::vector<uint64_t> ctr = {0, 1};
  std::vector<int32_t> out(2);
  cpu::sample(logits.data(), 2, 6, 0.0f, 0, 1.0f, 7, ctr.data(), out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 5}));
  cpu::sample(logits.data(), 2, 6, -1.0f, 3, 0.5f, 7, ctr.data(), out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 5}));
}

TEST(Sample, TopK1AndTinyTopPAreGreedy) {
  const int B = 16, V = 37;
  auto logits = randn(B * V, 21, 2.0f);
  for (int b = 0; b < B; b += 3) logits[b * V + 5] = logits[b * V + 9] = 10.0f;  // ties at the top
  std::vector<uint64_t> ctr(B);
  std::iota(ctr.begin(), ctr.end(), 1000);
  std::vector<int32_t> greedy(B), k1(B), p0(B);
  cpu::sample(logits.data(), B, V, 0.0f, 0, 1.0f, 3, ctr.data(), greedy.data());
  cpu::sample(logits.data(), B, V, 1.7f, 1, 1.0f, 3, ctr.data(), k1.data());
  cpu::sample(logits.data(), B, V, 0.8f, 0, 1e-6f, 3, ctr.data(), p0.data());
  EXPECT_EQ(k1, greedy);
  EXPECT_EQ(p0, greedy);
}

TEST(Sample, SameSeedAndCounterGiveTheSameToken) {
  const int V = 50;
  auto logits = randn(V, 22);
  std::vector<int32_t> seen;
  for (uint64_t c = 0; c < 64; ++c) {
    int32_t a, b, other;
    cpu::sample(logits.data(), 1, V, 1.0f, 0, 1.0f, 99, &c, &a);
    cpu::sample(logits.data(), 1, V, 1.0f, 0, 1.0f, 99, &c, &b);
    cpu::sample(logits.data(), 1, V, 1.0f, 0, 1.0f, 100, &c, &other);
    EXPECT_EQ(a, b);
    seen.push_back(a);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_GT(std::unique(seen.begin(), seen.end()) - seen.begin(), 10);  // counters do vary it
}

// Draw n tokens over consecutive counters and compare the histogram with the expected
// renormalised probabilities (within 5 standard errors, and zero outside the kept set).
void check_histogram(const std::vector<float>& logits, float temp, int top_k, float top_p,
                     const std::vector<double>& expect) {
  const int V = static_cast<int>(logits.size()), n = 100000;
  std::vector<int> hist(V, 0);
  for (uint64_t c = 0; c < uint64_t(n); ++c) {
    int32_t tok;
    cpu::sample(logits.data(), 1, V, temp, top_k, top_p, 2024, &c, &tok);
    hist[tok]++;
  }
  for (int i = 0; i < V; ++i) {
    const double f = double(hist[i]) / n, se = std::sqrt(expect[i] * (1 - expect[i]) / n);
    if (expect[i] == 0.0) {
      EXPECT_EQ(hist[i], 0) << "token " << i;
    } else {
      EXPECT_NEAR(f, expect[i], 5 * se + 1e-4) << "token " << i;
    }
  }
}

TEST(Sample, HistogramMatchesTheDistribution) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f, 1.5f, -0.5f};
  const int V = 7;
  const float temp = 0.9f;
  std::vector<double> p(V);
  double s = 0;
  for (int i = 0; i < V; ++i) s += (p[i] = std::exp(logits[i] / temp));
  for (auto& v : p) v /= s;
  check_histogram(logits, temp, 0, 1.0f, p);

  // top_k = 3 keeps ids {2, 5, 0}.
  std::vector<double> k3(V, 0.0);
  const double m3 = p[2] + p[5] + p[0];
  for (int i : {2, 5, 0}) k3[i] = p[i] / m3;
  check_histogram(logits, temp, 3, 1.0f, k3);

  // top_k = 4 then top_p = 0.8 of the top-4 mass: q = {2, 5, 0, 4} renormalised; the prefix
  // {2, 5} has q-mass < 0.8 and {2, 5, 0} >= 0.8 (checked here), so {2, 5, 0} are kept.
  const double m4 = p[2] + p[5] + p[0] + p[4];
  ASSERT_LT((p[2] + p[5]) / m4, 0.8);
  ASSERT_GE((p[2] + p[5] + p[0]) / m4, 0.8);
  check_histogram(logits, temp, 4, 0.8f, k3);
}

}  // namespace
}  // namespace memra
