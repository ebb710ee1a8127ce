// The grouped sigmoid router and the routed experts: cpu::moe_route / moe_forward against
// double-precision loops (the formulas of modeling_glm5_next.py), and op::moe_route /
// op::moe_forward's CPU branches (stacked or per-expert weights, the shared expert, ids outside
// [0, E), the checks in the CUDA entries' order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "ffn_ref.h"
#include "memra/op/moe.h"
#include "memra/ops.h"
#include "test_util.h"

namespace memra {
namespace {

using memra::testing::ClampStats;
using memra::testing::f32_weight;
using memra::testing::matvec;
using memra::testing::mlp_ref;
using memra::testing::randn;
using memra::testing::sig;

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

// ---------------------------------------------------------------- op::moe_route (CPU)

TEST(OpMoeRoute, CpuIsTheReferenceAndChecksAsTheCudaEntry) {
  const int T = 5, D = 7, E = 8, top_k = 2;
  auto x = randn(T * D, 41), gw = randn(E * D, 42, 0.7f), bias = randn(E, 43, 0.1f);
  std::vector<int32_t> idx(T * top_k), want_idx(T * top_k);
  std::vector<float> w(T * top_k), want_w(T * top_k);
  cpu::moe_route(x.data(), T, D, f32_weight(gw, E, D), bias.data(), E, top_k, 4, 2, true, 2.5f,
                 want_idx.data(), want_w.data());
  MemraMoeRouteParams p{};
  p.x = x.data();
  p.T = T;
  p.D = D;
  p.gate_w = gw.data();
  p.corr_bias = bias.data();
  p.E = E;
  p.top_k = top_k;
  p.n_group = 4;
  p.topk_group = 2;
  p.norm_topk_prob = 1;
  p.scaling = 2.5f;
  p.topk_idx = idx.data();
  p.topk_w = w.data();
  ASSERT_TRUE(op::moe_route({}, p).ok());
  EXPECT_EQ(idx, want_idx);
  EXPECT_EQ(w, want_w);
  auto code = [](const MemraMoeRouteParams& q) { return op::moe_route({}, q).code; };
  MemraMoeRouteParams q = p;
  q.n_group = 3;  // does not divide E
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.topk_group = 5;
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.top_k = 5;  // more than topk_group * E / n_group
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.T = 0;
  q.x = nullptr;
  EXPECT_EQ(code(q), kOk);
  q = p;
  q.gate_w = nullptr;
  EXPECT_EQ(code(q), kContractMissing);
}

// ---------------------------------------------------------------- op::moe_forward (CPU)

struct Experts {
  int E, I, D;
  std::vector<float> gate, up, down;  // stacked [E, I, D], [E, I, D], [E, D, I]
  std::vector<Weight> g, u, d;        // the same, one weight per expert
  std::vector<WeightView> gv, uv, dv;
};

Experts make_experts(int E, int I, int D, uint32_t seed) {
  Experts x{E, I, D, randn(size_t(E) * I * D, seed, 0.6f), randn(size_t(E) * I * D, seed + 1, 0.6f),
            randn(size_t(E) * D * I, seed + 2, 0.4f), {}, {}, {}, {}, {}, {}};
  for (int e = 0; e < E; ++e) {
    x.g.emplace_back(DType::kF32, std::vector<int64_t>{I, D}, x.gate.data() + size_t(e) * I * D);
    x.u.emplace_back(DType::kF32, std::vector<int64_t>{I, D}, x.up.data() + size_t(e) * I * D);
    x.d.emplace_back(DType::kF32, std::vector<int64_t>{D, I}, x.down.data() + size_t(e) * D * I);
  }
  x.gv = views_of(x.g);
  x.uv = views_of(x.u);
  x.dv = views_of(x.d);
  return x;
}

MemraMoeForwardParams forward_params(const Experts& ex, const float* x, int T,
                                     const int32_t* idx, const float* w, int top_k, float* y) {
  MemraMoeForwardParams p{};
  p.x = x;
  p.T = T;
  p.D = ex.D;
  p.topk_idx = idx;
  p.topk_w = w;
  p.top_k = top_k;
  p.gate_w = ex.gate.data();
  p.up_w = ex.up.data();
  p.down_w = ex.down.data();
  p.w_dtype = static_cast<int>(DType::kF32);
  p.E = ex.E;
  p.I = ex.I;
  p.limit = 2.0f;
  p.y = y;
  return p;
}

TEST(OpMoe, StackedAndPerExpertWeightsGiveTheReferenceBytes) {
  const int T = 6, D = 10, I = 7, E = 5, top_k = 3;
  const Experts ex = make_experts(E, I, D, 50);
  auto x = randn(T * D, 53, 1.5f), w = randn(T * top_k, 54, 0.5f);
  const std::vector<int32_t> idx = {3, 0, 1, 1, 2, 0, 0, 3, 2, 2, 1, 3, 0, 1, 2, 3, 2, 1};
  std::vector<float> want(T * D), stacked(T * D), views(T * D);
  cpu::moe_forward(x.data(), T, D, idx.data(), w.data(), top_k, ex.gv.data(), ex.uv.data(),
                   ex.dv.data(), E, 2.0f, want.data());
  ASSERT_TRUE(op::moe_forward({}, forward_params(ex, x.data(), T, idx.data(), w.data(), top_k,
                                                 stacked.data())).ok());
  EXPECT_EQ(stacked, want);
  const op::HostExperts host{ex.gv.data(), ex.uv.data(), ex.dv.data()};
  auto p = forward_params(ex, x.data(), T, idx.data(), w.data(), top_k, views.data());
  p.gate_w = p.up_w = p.down_w = nullptr;  // the views replace the stacked weights
  ASSERT_TRUE(op::moe_forward({}, p, &host).ok());
  EXPECT_EQ(views, want);
}

TEST(OpMoe, IdsOutsideTheExpertsContributeNothing) {
  const int D = 6, I = 5, E = 4;
  const Experts ex = make_experts(E, I, D, 60);
  auto x = randn(D, 63);
  const std::vector<int32_t> idx = {-1, 2, 4}, one = {2};
  const std::vector<float> w = {0.3f, 0.7f, 0.9f}, w1 = {0.7f};
  std::vector<float> y(D), want(D);
  ASSERT_TRUE(op::moe_forward({}, forward_params(ex, x.data(), 1, idx.data(), w.data(), 3,
                                                 y.data())).ok());
  ASSERT_TRUE(op::moe_forward({}, forward_params(ex, x.data(), 1, one.data(), w1.data(), 1,
                                                 want.data())).ok());
  EXPECT_EQ(y, want);
}

TEST(OpMoe, SharedExpertIsItsMlpPlusTheRoutedSum) {
  const int T = 3, D = 8, I = 6, E = 4, top_k = 2, Is = 5;
  const Experts ex = make_experts(E, I, D, 70);
  auto x = randn(T * D, 73), w = randn(T * top_k, 74, 0.5f);
  auto sg = randn(Is * D, 75, 0.6f), su = randn(Is * D, 76, 0.6f), sd = randn(D * Is, 77, 0.4f);
  const std::vector<int32_t> idx = {1, 3, 0, 1, 2, 2};
  std::vector<float> routed(T * D), shared(T * D), y(T * D);
  auto p = forward_params(ex, x.data(), T, idx.data(), w.data(), top_k, routed.data());
  ASSERT_TRUE(op::moe_forward({}, p).ok());
  cpu::swiglu_mlp(x.data(), T, f32_weight(sg, Is, D), f32_weight(su, Is, D),
                  f32_weight(sd, D, Is), 1.25f, shared.data());
  p.shared_gate_w = sg.data();
  p.shared_up_w = su.data();
  p.shared_down_w = sd.data();
  p.shared_I = Is;
  p.shared_limit = 1.25f;
  p.y = y.data();
  ASSERT_TRUE(op::moe_forward({}, p).ok());
  for (int i = 0; i < T * D; ++i) EXPECT_EQ(y[i], shared[i] + routed[i]);
  p.shared_up_w = nullptr;  // a shared expert needs all three weights
  EXPECT_EQ(op::moe_forward({}, p).code, kContractMissing);
  p.shared_up_w = su.data();
  p.shared_limit = 0.0f;
  EXPECT_EQ(op::moe_forward({}, p).code, kContractValue);
}

TEST(OpMoe, CpuChecksAsTheCudaEntry) {
  const int D = 4, I = 3, E = 2;
  const Experts ex = make_experts(E, I, D, 80);
  auto x = randn(D, 83);
  const std::vector<int32_t> idx = {1};
  const std::vector<float> w = {0.5f};
  std::vector<float> y(D, 7.0f);
  const auto p = forward_params(ex, x.data(), 1, idx.data(), w.data(), 1, y.data());
  auto code = [](const MemraMoeForwardParams& q) { return op::moe_forward({}, q).code; };
  MemraMoeForwardParams q = p;
  q.top_k = -1;
  q.w_dtype = 7;  // the value check comes first
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.w_dtype = 7;
  EXPECT_EQ(code(q), kContractDType);
  q = p;
  q.limit = -1.0f;
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.x = nullptr;
  EXPECT_EQ(code(q), kContractMissing);
  q = p;
  q.down_w = nullptr;
  EXPECT_EQ(code(q), kContractMissing);
  EXPECT_EQ(y, std::vector<float>(D, 7.0f));  // nothing written on error
  q = p;
  q.top_k = 0;  // no routed term: y = 0, no id or weight read
  q.topk_idx = nullptr;
  q.topk_w = nullptr;
  EXPECT_EQ(code(q), kOk);
  EXPECT_EQ(y, std::vector<float>(D, 0.0f));
}

}  // namespace
}  // namespace memra
