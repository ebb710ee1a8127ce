// mHC CPU ops (cpu/mhc.h) against double-precision loops written here (the formulas of
// modeling_glm5_next.py), and op::mhc's CPU forms against the reference ops they chain.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "memra/op/mhc.h"
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

struct MhcRef {
  std::vector<double> post, comb, collapsed;
};

MhcRef mhc_ref(const std::vector<float>& st, int T, int hc, int D, const std::vector<float>& fn,
               const std::vector<float>& base, const std::vector<float>& scale, int iters,
               double hc_eps, double norm_eps) {
  const int mix = (2 + hc) * hc, F = hc * D;
  MhcRef r{std::vector<double>(T * hc), std::vector<double>(T * hc * hc),
           std::vector<double>(T * D, 0.0)};
  for (int t = 0; t < T; ++t) {
    const float* s = st.data() + size_t(t) * F;
    double ss = 0;
    for (int i = 0; i < F; ++i) ss += double(s[i]) * s[i];
    const double inv = 1.0 / std::sqrt(ss / F + norm_eps);
    std::vector<double> flat(F);
    for (int i = 0; i < F; ++i) flat[i] = s[i] * inv;
    auto lg = matvec(fn, flat.data(), mix, F);
    std::vector<double> pre(hc);
    for (int i = 0; i < hc; ++i) {
      pre[i] = sig(lg[i] * scale[0] + base[i]) + hc_eps;
      r.post[t * hc + i] = 2.0 * sig(lg[hc + i] * scale[1] + base[hc + i]);
    }
    double* c = r.comb.data() + size_t(t) * hc * hc;
    for (int i = 0; i < hc; ++i) {
      double mx = -1e300, sum = 0;
      for (int j = 0; j < hc; ++j) {
        c[i * hc + j] = lg[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j];
        mx = std::max(mx, c[i * hc + j]);
      }
      for (int j = 0; j < hc; ++j) sum += (c[i * hc + j] = std::exp(c[i * hc + j] - mx));
      for (int j = 0; j < hc; ++j) c[i * hc + j] = c[i * hc + j] / sum + hc_eps;
    }
    auto cols = [&] {
      for (int j = 0; j < hc; ++j) {
        double sum = 0;
        for (int i = 0; i < hc; ++i) sum += c[i * hc + j];
        for (int i = 0; i < hc; ++i) c[i * hc + j] /= sum + hc_eps;
      }
    };
    auto rows = [&] {
      for (int i = 0; i < hc; ++i) {
        double sum = 0;
        for (int j = 0; j < hc; ++j) sum += c[i * hc + j];
        for (int j = 0; j < hc; ++j) c[i * hc + j] /= sum + hc_eps;
      }
    };
    cols();
    for (int it = 1; it < iters; ++it) {
      rows();
      cols();
    }
    for (int i = 0; i < hc; ++i)
      for (int d = 0; d < D; ++d) r.collapsed[t * D + d] += pre[i] * s[i * D + d];
  }
  return r;
}

TEST(MhcPre, MatchesDoubleLoopAndIsDoublyStochastic) {
  const int T = 3, hc = 4, D = 9, mix = (2 + hc) * hc, iters = 20;
  auto st = randn(T * hc * D, 10);
  auto fn = randn(mix * hc * D, 11, 0.3f);
  auto base = randn(mix, 12, 0.5f);
  // A moderate comb scale: Sinkhorn converges slowly on very peaked matrices, and 20 rounds
  // (the config default) only bring the rows near 1 when the softmax is not too sharp.
  const std::vector<float> scale = {0.7f, 1.3f, 0.5f};
  std::vector<float> post(T * hc), comb(T * hc * hc), col(T * D);
  cpu::mhc_pre(st.data(), T, hc, D, f32_weight(fn, mix, hc * D), base.data(), scale.data(),
               iters, 1e-6f, 1e-6f, post.data(), comb.data(), col.data());
  MhcRef ref = mhc_ref(st, T, hc, D, fn, base, scale, iters, 1e-6, 1e-6);
  double e_post = 0, e_comb = 0, e_col = 0;
  for (int i = 0; i < T * hc; ++i) e_post = std::max(e_post, std::abs(post[i] - ref.post[i]));
  for (int i = 0; i < T * hc * hc; ++i)
    e_comb = std::max(e_comb, std::abs(comb[i] - ref.comb[i]));
  for (int i = 0; i < T * D; ++i) e_col = std::max(e_col, std::abs(col[i] - ref.collapsed[i]));
  EXPECT_LT(e_post, 2e-6);
  EXPECT_LT(e_comb, 2e-6);
  EXPECT_LT(e_col, 1e-5);
  for (int t = 0; t < T; ++t) {
    const float* c = comb.data() + t * hc * hc;
    for (int i = 0; i < hc; ++i) {
      float rs = 0, cs = 0;
      for (int j = 0; j < hc; ++j) {
        rs += c[i * hc + j];
        cs += c[j * hc + i];
      }
      EXPECT_NEAR(rs, 1.0f, 3e-2);  // 20 rounds leave rows within ~1e-2 (geometric convergence)
      EXPECT_NEAR(cs, 1.0f, 1e-5);  // the last step normalises columns
    }
  }
}

TEST(MhcPre, OneSinkhornIterIsSoftmaxThenColumns) {
  const int T = 2, hc = 3, D = 5, mix = (2 + hc) * hc;
  auto st = randn(T * hc * D, 13);
  auto fn = randn(mix * hc * D, 14, 0.5f);
  auto base = randn(mix, 15);
  const std::vector<float> scale = {1.0f, 1.0f, 3.0f};
  std::vector<float> post(T * hc), comb(T * hc * hc), col(T * D);
  cpu::mhc_pre(st.data(), T, hc, D, f32_weight(fn, mix, hc * D), base.data(), scale.data(), 1,
               1e-3f, 1e-5f, post.data(), comb.data(), col.data());
  MhcRef ref = mhc_ref(st, T, hc, D, fn, base, scale, 1, 1e-3, 1e-5);
  for (int i = 0; i < T * hc * hc; ++i) EXPECT_NEAR(comb[i], ref.comb[i], 2e-6);
  for (int i = 0; i < T * D; ++i) EXPECT_NEAR(col[i], ref.collapsed[i], 1e-5);
}

TEST(MhcPost, MatchesDoubleLoop) {
  const int T = 3, hc = 4, D = 7;
  auto y = randn(T * D, 16), post = randn(T * hc, 17), comb = randn(T * hc * hc, 18),
       res = randn(T * hc * D, 19);
  std::vector<float> out(T * hc * D);
  cpu::mhc_post(y.data(), post.data(), comb.data(), res.data(), T, hc, D, out.data());
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < hc; ++j)
      for (int d = 0; d < D; ++d) {
        double ref = double(post[t * hc + j]) * y[t * D + d];
        for (int i = 0; i < hc; ++i)
          ref += double(comb[(t * hc + i) * hc + j]) * res[(t * hc + i) * D + d];
        EXPECT_NEAR(out[(t * hc + j) * D + d], ref, 2e-6);
      }
}

TEST(MhcHead, MeanOverStreams) {
  const int T = 2, hc = 4, D = 3;
  auto st = randn(T * hc * D, 20);
  std::vector<float> out(T * D);
  cpu::hc_head_mean(st.data(), T, hc, D, out.data());
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < D; ++d) {
      double ref = 0;
      for (int s = 0; s < hc; ++s) ref += st[(t * hc + s) * D + d];
      EXPECT_NEAR(out[t * D + d], ref / hc, 1e-6);
    }
}

// ---------------------------------------------------------------- op::mhc on the CPU

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Site {
  static constexpr int T = 2, hc = 4, D = 6, mix = (2 + hc) * hc, iters = 5;
  std::vector<float> fn = randn(mix * hc * D, 60, 0.3f), base = randn(mix, 61, 0.5f);
  std::vector<float> scale = {0.7f, 1.3f, 0.5f}, rms_w = randn(D, 62);
  std::vector<float> y = randn(T * D, 63), post_prev = randn(T * hc, 64);
  std::vector<float> comb_prev = randn(T * hc * hc, 65), residual = randn(T * hc * D, 66);
  std::vector<float> streams = randn(T * hc * D, 67);
  Weight w() const { return f32_weight(fn, mix, hc * D); }
  MemraMhcParams params() const {
    MemraMhcParams p = {};
    p.T = T;
    p.hc = hc;
    p.D = D;
    p.fn = fn.data();
    p.fn_dtype = 0;
    p.base = base.data();
    p.scale = scale.data();
    p.sinkhorn_iters = iters;
    p.hc_eps = 1e-6f;
    p.norm_eps = 1e-6f;
    p.rms_w = rms_w.data();
    p.rms_eps = 1e-5f;
    p.y = y.data();
    p.post_prev = post_prev.data();
    p.comb_prev = comb_prev.data();
    p.residual = residual.data();
    return p;
  }
};

TEST(OpMhc, PreAndPreNormAreTheReferenceChain) {
  const Site s;
  std::vector<float> post(s.T * s.hc), comb(s.T * s.hc * s.hc), out(s.T * s.D);
  std::vector<float> rpost(post.size()), rcomb(comb.size()), rout(out.size());
  cpu::mhc_pre(s.streams.data(), s.T, s.hc, s.D, s.w(), s.base.data(), s.scale.data(), s.iters,
               1e-6f, 1e-6f, rpost.data(), rcomb.data(), rout.data());
  MemraMhcParams p = s.params();
  p.pre = 1;
  p.streams = s.streams.data();
  p.post = post.data();
  p.comb = comb.data();
  p.out = out.data();
  ASSERT_TRUE(op::mhc(op::Backend{}, p).ok());
  EXPECT_TRUE(same_bytes(post, rpost) && same_bytes(comb, rcomb) && same_bytes(out, rout));
  cpu::rms_norm(rout.data(), s.T, s.D, s.rms_w.data(), 1e-5f, rout.data());
  p.norm = 1;
  ASSERT_TRUE(op::mhc(op::Backend{}, p).ok());
  EXPECT_TRUE(same_bytes(out, rout));
}

TEST(OpMhc, ExpandFormsAreTheReferenceChains) {
  const Site s;
  const size_t nst = size_t(s.T) * s.hc * s.D;
  std::vector<float> rst(nst), rpost(s.T * s.hc), rcomb(s.T * s.hc * s.hc), rout(s.T * s.D);
  cpu::mhc_post(s.y.data(), s.post_prev.data(), s.comb_prev.data(), s.residual.data(), s.T, s.hc,
                s.D, rst.data());
  // expand alone
  std::vector<float> st(nst);
  MemraMhcParams p = s.params();
  p.expand = 1;
  p.streams_out = st.data();
  ASSERT_TRUE(op::mhc(op::Backend{}, p).ok());
  EXPECT_TRUE(same_bytes(st, rst));
  // expand, pre, norm: the expansion, then the next site's mapping and norm over it
  cpu::mhc_pre(rst.data(), s.T, s.hc, s.D, s.w(), s.base.data(), s.scale.data(), s.iters, 1e-6f,
               1e-6f, rpost.data(), rcomb.data(), rout.data());
  cpu::rms_norm(rout.data(), s.T, s.D, s.rms_w.data(), 1e-5f, rout.data());
  std::vector<float> post(rpost.size()), comb(rcomb.size()), out(rout.size());
  std::fill(st.begin(), st.end(), 0.0f);
  p.pre = 1;
  p.norm = 1;
  p.post = post.data();
  p.comb = comb.data();
  p.out = out.data();
  ASSERT_TRUE(op::mhc(op::Backend{}, p).ok());
  EXPECT_TRUE(same_bytes(st, rst) && same_bytes(post, rpost) && same_bytes(comb, rcomb) &&
              same_bytes(out, rout));
  // expand, head, norm: rms_norm(hc_head_mean(mhc_post(...)))
  std::vector<float> mean(s.T * s.D), rhead(s.T * s.D), head(s.T * s.D);
  cpu::hc_head_mean(rst.data(), s.T, s.hc, s.D, mean.data());
  cpu::rms_norm(mean.data(), s.T, s.D, s.rms_w.data(), 1e-5f, rhead.data());
  MemraMhcParams h = s.params();
  h.expand = 1;
  h.head = 1;
  h.norm = 1;
  h.out = head.data();
  ASSERT_TRUE(op::mhc(op::Backend{}, h).ok());
  EXPECT_TRUE(same_bytes(head, rhead));
}

TEST(OpMhc, RefusesLikeTheCudaEntry) {
  const Site s;
  std::vector<float> post(s.T * s.hc), comb(s.T * s.hc * s.hc), out(s.T * s.D);
  MemraMhcParams p = s.params();
  p.pre = 1;
  p.streams = s.streams.data();
  p.post = post.data();
  p.comb = comb.data();
  p.out = out.data();
  auto code = [](const MemraMhcParams& q) { return op::mhc(op::Backend{}, q).code; };
  MemraMhcParams q = p;
  q.head = 1;  // pre and head together are not a form
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.pre = 0;  // no step at all
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.fn_dtype = 5;
  EXPECT_EQ(code(q), kContractDType);
  q = p;
  q.sinkhorn_iters = 0;
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.norm = 1;
  q.rms_eps = -1.0f;
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.comb = nullptr;
  EXPECT_EQ(code(q), kContractMissing);
  // The expansion written over the residual it reads is refused before anything runs.
  std::vector<float> res = s.residual;
  q = p;
  q.expand = 1;
  q.norm = 1;
  q.residual = res.data();
  q.streams_out = res.data() + 1;
  EXPECT_EQ(code(q), kContractValue);
  EXPECT_TRUE(same_bytes(res, s.residual));
}

TEST(OpMhc, HeadMeanAndExpandAreTheReference) {
  const int T = 2, hc = 3, D = 4;
  auto x = randn(T * D, 70);
  std::vector<float> st(T * hc * D), rst(T * hc * D), mean(T * D), rmean(T * D);
  ASSERT_TRUE(op::hc_expand(op::Backend{}, x.data(), T, D, hc, st.data()).ok());
  for (int t = 0; t < T; ++t)
    for (int s = 0; s < hc; ++s)
      for (int d = 0; d < D; ++d) rst[(t * hc + s) * D + d] = x[t * D + d];
  EXPECT_TRUE(same_bytes(st, rst));
  ASSERT_TRUE(op::hc_head_mean(op::Backend{}, st.data(), T, hc, D, mean.data()).ok());
  cpu::hc_head_mean(st.data(), T, hc, D, rmean.data());
  EXPECT_TRUE(same_bytes(mean, rmean));
  EXPECT_EQ(op::hc_head_mean(op::Backend{}, st.data(), T, 0, D, mean.data()).code, kContractValue);
  EXPECT_EQ(op::hc_expand(op::Backend{}, nullptr, T, D, hc, st.data()).code, kContractMissing);
}

}  // namespace
}  // namespace memra
