// memra::op for the Gated DeltaNet area on the CPU backend (op/gdn.h): what the op layer adds to
// the reference ops (cpu/gdn.cpp), which the Python tests cover against transformers: the scan's
// per-sequence pointer tables (a null input entry starts from zeros, a null output entry is not
// written, every sequence equals its own call), the row strides, and the refusals with the CUDA
// entries' codes before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "memra/cpu/gdn.h"
#include "memra/op/gdn.h"
#include "test_util.h"

namespace memra {
namespace {

using Vec = std::vector<float>;
using memra::testing::randn;

constexpr int Hk = 2, Hv = 4, dk = 8, dv = 6, T = 5;
constexpr int64_t kPlane = int64_t(Hv) * dk * dv;

bool same(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * 4) == 0; }

struct Inputs {
  Vec q, k, v, g, beta, state;
  explicit Inputs(uint32_t seed, int B)
      : q(randn(size_t(B) * T * Hk * dk, seed)),
        k(randn(size_t(B) * T * Hk * dk, seed + 1)),
        v(randn(size_t(B) * T * Hv * dv, seed + 2)),
        g(randn(size_t(B) * T * Hv, seed + 3, 0.3f)),
        beta(randn(size_t(B) * T * Hv, seed + 4)),
        state(randn(size_t(B) * kPlane, seed + 5, 0.3f)) {
    for (auto& x : g) x = -std::fabs(x);
    for (auto& x : beta) x = 1.0f / (1.0f + std::exp(-x));
    cpu::gdn_l2norm(q.data(), B * T, Hk, dk, int64_t(Hk) * dk, 1e-6f);
    cpu::gdn_l2norm(k.data(), B * T, Hk, dk, int64_t(Hk) * dk, 1e-6f);
  }
};

MemraGdnScanParams params(const Inputs& in, int B, const float* const* sin, float* const* sout,
                          float* o) {
  return MemraGdnScanParams{in.q.data(), in.k.data(), int64_t(Hk) * dk, in.v.data(),
                            int64_t(Hv) * dv, in.g.data(), in.beta.data(), B, T, Hk, Hv, dk, dv,
                            0.35f, sin, sout, o};
}

TEST(GdnOp, ScanTablesPerSequence) {
  const int B = 3;
  const Inputs in(7, B);
  Vec o(size_t(B) * T * Hv * dv), out(size_t(B) * kPlane, 9.0f);
  // Row 1 starts from zeros (null input entry); row 2's state is dropped (null output entry).
  const float* sin[B] = {in.state.data(), nullptr, in.state.data() + 2 * kPlane};
  float* sout[B] = {out.data(), out.data() + kPlane, nullptr};
  ASSERT_TRUE(op::gdn_scan(op::Backend{}, params(in, B, sin, sout, o.data())).ok());
  for (int s = 0; s < B; ++s) {
    Vec o1(size_t(T) * Hv * dv), s1(kPlane);
    const int64_t r = int64_t(s) * T;
    cpu::gdn_scan(in.q.data() + r * Hk * dk, in.k.data() + r * Hk * dk, int64_t(Hk) * dk,
                  in.v.data() + r * Hv * dv, int64_t(Hv) * dv, in.g.data() + r * Hv,
                  in.beta.data() + r * Hv, T, Hk, Hv, dk, dv, 0.35f, sin[s], s1.data(), o1.data());
    EXPECT_TRUE(same(o.data() + r * Hv * dv, o1.data(), o1.size())) << "sequence " << s;
    if (sout[s]) EXPECT_TRUE(same(sout[s], s1.data(), s1.size())) << "sequence " << s;
  }
  for (int64_t i = 2 * kPlane; i < 3 * kPlane; ++i) ASSERT_EQ(out[i], 9.0f);  // not written
}

TEST(GdnOp, ScanReadsStridedRows) {
  // q | k | v in one [T, 2*Hk*dk + Hv*dv] row (where the layer's conv leaves them) gives the
  // bytes of the packed tensors.
  const Inputs in(11, 1);
  const int64_t C = 2 * Hk * dk + Hv * dv;
  Vec rows(size_t(T) * C);
  for (int t = 0; t < T; ++t) {
    std::memcpy(&rows[t * C], &in.q[t * Hk * dk], Hk * dk * 4);
    std::memcpy(&rows[t * C + Hk * dk], &in.k[t * Hk * dk], Hk * dk * 4);
    std::memcpy(&rows[t * C + 2 * Hk * dk], &in.v[t * Hv * dv], Hv * dv * 4);
  }
  Vec o1(size_t(T) * Hv * dv), o2(o1.size()), s1(kPlane), s2(kPlane);
  const float* sin[1] = {in.state.data()};
  float* sout1[1] = {s1.data()};
  float* sout2[1] = {s2.data()};
  ASSERT_TRUE(op::gdn_scan(op::Backend{}, params(in, 1, sin, sout1, o1.data())).ok());
  MemraGdnScanParams p = params(in, 1, sin, sout2, o2.data());
  p.q = rows.data();
  p.k = rows.data() + Hk * dk;
  p.qk_ld = C;
  p.v = rows.data() + 2 * Hk * dk;
  p.v_ld = C;
  ASSERT_TRUE(op::gdn_scan(op::Backend{}, p).ok());
  EXPECT_TRUE(same(o1.data(), o2.data(), o1.size()));
  EXPECT_TRUE(same(s1.data(), s2.data(), s1.size()));
}

TEST(GdnOp, RefusalsWriteNothing) {
  const Inputs in(3, 1);
  Vec o(size_t(T) * Hv * dv, 5.0f), s(kPlane, 5.0f);
  float* sout[1] = {s.data()};
  MemraGdnScanParams p = params(in, 1, nullptr, sout, o.data());
  p.Hk = 3;  // 4 value heads over 3 key heads
  EXPECT_EQ(op::gdn_scan(op::Backend{}, p).code, kContractShape);
  p = params(in, 1, nullptr, sout, o.data());
  p.qk_ld = Hk * dk - 1;
  EXPECT_EQ(op::gdn_scan(op::Backend{}, p).code, kContractShape);
  p = params(in, 1, nullptr, nullptr, o.data());
  EXPECT_EQ(op::gdn_scan(op::Backend{}, p).code, kContractMissing);
  for (float x : o) ASSERT_EQ(x, 5.0f);
  for (float x : s) ASSERT_EQ(x, 5.0f);

  Vec a(8), g(8, 5.0f), beta(8, 5.0f), bias(4), alog(4);
  MemraGdnGateParams gp{a.data(), 3, a.data(), 4, bias.data(), alog.data(), 2, 4, g.data(),
                        beta.data()};  // lda 3 < H 4
  EXPECT_EQ(op::gdn_gate(op::Backend{}, gp).code, kContractShape);
  EXPECT_EQ(op::gdn_l2norm(op::Backend{}, a.data(), 2, 2, 4, 7, 1e-6f).code, kContractShape);
  EXPECT_EQ(op::rms_norm_gated_silu(op::Backend{}, a.data(), a.data(), -1, 4, bias.data(), 1e-6f,
                                    g.data())
                .code,
            kContractValue);
  for (float x : g) ASSERT_EQ(x, 5.0f);
}

TEST(GdnOp, GateSoftplusThresholdAndLog1p) {
  // F.softplus: x itself above 20; below, log1p(exp(x)), which keeps exp(-30) where
  // log(1 + exp(-30)) rounds to 0 in f32.
  const float a[3] = {25.0f, -30.0f, 0.0f}, b[3] = {0.0f, 30.0f, -30.0f};
  const float bias[3] = {0.0f, 0.0f, 0.0f}, alog[3] = {0.0f, 0.0f, std::log(2.0f)};
  float g[3], beta[3];
  cpu::gdn_gate(a, 3, b, 3, bias, alog, 1, 3, g, beta);
  EXPECT_EQ(g[0], -25.0f);
  EXPECT_LT(g[1], 0.0f);
  EXPECT_NEAR(g[1], -std::exp(-30.0), 1e-20);
  EXPECT_NEAR(g[2], -2.0 * std::log(2.0), 1e-6);
  EXPECT_EQ(beta[0], 0.5f);
  EXPECT_EQ(beta[1], 1.0f);
  EXPECT_GT(beta[2], 0.0f);
}

}  // namespace
}  // namespace memra
