// Sampling: cpu::sample and uniform_from_counter against values and distributions computed
// here, and op::sample's CPU branch (per-row seeds, the per-row nonfinite flags, the checks in
// the CUDA entry's order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "memra/op/sample.h"
#include "memra/ops.h"
#include "test_util.h"

namespace memra {
namespace {

using memra::testing::randn;

TEST(SampleRng, PinnedValuesOfTheCounterFormula) {
  // Values of the cpu/sample.h formula computed independently (Python big integers); the CUDA backend
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

// ---------------------------------------------------------------- op::sample (CPU)

TEST(OpSample, PerRowSeedsAreOneCallPerRow) {
  const int B = 5, V = 40;
  auto logits = randn(B * V, 90, 1.5f);
  std::vector<uint64_t> ctr(B), seeds(B);
  std::iota(ctr.begin(), ctr.end(), 7);
  for (int b = 0; b < B; ++b) seeds[b] = 1000003ull * (b + 1);
  std::vector<int32_t> out(B, -1), want(B), one_seed(B, -1), want_one(B);
  for (int b = 0; b < B; ++b) {
    cpu::sample(logits.data() + b * V, 1, V, 0.9f, 12, 0.95f, seeds[b], &ctr[b], &want[b]);
  }
  MemraSampleParams p{};
  p.logits = logits.data();
  p.B = B;
  p.V = V;
  p.temperature = 0.9f;
  p.top_k = 12;
  p.top_p = 0.95f;
  p.seed = 5;
  p.seeds = seeds.data();
  p.counters = ctr.data();
  p.out = out.data();
  ASSERT_TRUE(op::sample({}, p).ok());
  EXPECT_EQ(out, want);
  cpu::sample(logits.data(), B, V, 0.9f, 12, 0.95f, 5, ctr.data(), want_one.data());
  p.seeds = nullptr;  // every row draws with p.seed
  p.out = one_seed.data();
  ASSERT_TRUE(op::sample({}, p).ok());
  EXPECT_EQ(one_seed, want_one);
}

TEST(OpSample, CpuChecksAsTheCudaEntry) {
  const int B = 2, V = 6;
  auto logits = randn(B * V, 91);
  const std::vector<uint64_t> ctr = {0, 1};
  std::vector<int32_t> out(B, -1), flags(B, -1);
  MemraSampleParams p{};
  p.logits = logits.data();
  p.B = B;
  p.V = V;
  p.temperature = 1.0f;
  p.top_p = 1.0f;
  p.counters = ctr.data();
  p.out = out.data();
  auto code = [](const MemraSampleParams& q) { return op::sample({}, q).code; };
  MemraSampleParams q = p;
  q.nonfinite = flags.data();
  q.V = 0;  // an error writes no flag
  EXPECT_EQ(code(q), kContractValue);
  EXPECT_EQ(flags, std::vector<int32_t>(B, -1));
  q = p;
  q.V = 0;
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.temperature = NAN;
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.top_p = 0.0f;
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.counters = nullptr;
  EXPECT_EQ(code(q), kContractMissing);
  EXPECT_EQ(out, std::vector<int32_t>(B, -1));  // nothing written on error
  q.temperature = 0.0f;  // greedy reads no counter
  EXPECT_EQ(code(q), kOk);
  std::vector<int32_t> want(B);
  cpu::sample(logits.data(), B, V, 0.0f, 0, 1.0f, 0, ctr.data(), want.data());
  EXPECT_EQ(out, want);
  q = p;
  q.B = 0;
  q.V = 0;  // no rows: nothing to check further
  EXPECT_EQ(code(q), kOk);
}

// The per-row flag: 1 for a row holding NaN, +inf or -inf anywhere (first, middle, last id), 0
// for finite rows (huge values included), greedy and sampled, one seed or per-row seeds; the
// tokens are those drawn without the flag.
TEST(OpSample, NonfiniteFlagsPerRow) {
  const int V = 1100;  // more than one L-block
  const float bad[] = {NAN, INFINITY, -INFINITY};
  const int where[] = {0, 700, V - 1};
  std::vector<float> logits;
  std::vector<int32_t> want_flags;
  int row = 0;
  for (float v : bad) {
    for (int at : where) {
      auto r = randn(V, 300 + row++);
      r[at] = v;
      logits.insert(logits.end(), r.begin(), r.end());
      want_flags.push_back(1);
    }
  }
  for (int i = 0; i < 3; ++i) {
    auto r = randn(V, 400 + i);
    if (i == 1) r[5] = 3.0e38f;  // finite, however large
    if (i == 2) r[9] = -3.0e38f;
    logits.insert(logits.end(), r.begin(), r.end());
    want_flags.push_back(0);
  }
  const int B = static_cast<int>(want_flags.size());
  std::vector<uint64_t> ctr(B), seeds(B);
  for (int b = 0; b < B; ++b) {
    ctr[b] = 3 * b + 1;
    seeds[b] = 1000 + b;
  }
  for (float t : {0.0f, 0.8f}) {
    for (bool per_row : {false, true}) {
      std::vector<int32_t> plain(B, -1), out(B, -1), flags(B, -7);
      MemraSampleParams p{};
      p.logits = logits.data();
      p.B = B;
      p.V = V;
      p.temperature = t;
      p.top_k = 50;
      p.top_p = 0.9f;
      p.seed = 5;
      p.seeds = per_row ? seeds.data() : nullptr;
      p.counters = ctr.data();
      p.out = plain.data();
      ASSERT_TRUE(op::sample({}, p).ok());
      p.out = out.data();
      p.nonfinite = flags.data();
      ASSERT_TRUE(op::sample({}, p).ok());
      EXPECT_EQ(flags, want_flags) << "t=" << t << " per_row=" << per_row;
      EXPECT_EQ(out, plain) << "t=" << t << " per_row=" << per_row;
    }
  }
  std::vector<int32_t> out(B), flags(B, -7);
  cpu::sample(logits.data(), B, V, 1.0f, 0, 1.0f, 9, ctr.data(), out.data(), flags.data());
  EXPECT_EQ(flags, want_flags);
}

}  // namespace
}  // namespace memra
