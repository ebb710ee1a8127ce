// KDA CPU ops (cpu/kda.cpp) against double-precision references written here, and the
// bit-exactness contracts between arms: conv decode == conv prefill at T=1, prefill(T-1) +
// decode(1) == prefill(T) (values, ring, scan state), chained one-step scans == one T-step scan.
//
// The scan reference is deliberately NOT the recurrence the kernel implements: it is
// transformers' chunk_kimi_delta_attention (WY/UT chunked form, per-channel cumulative log gate)
// re-derived in double with chunk 16, so a shared misreading of the recurrence cannot pass.
//
// Tolerances (f32 kernel vs f64 reference): conv and gate are a handful of roundings per output
// -> 1e-6 relative + 1e-6 absolute. The scan accumulates over dk-long dot products and T steps
// of state, with |q|, |k| = 1 and v ~ N(0, 1): observed max |err| <= 1e-7 for T <= 200 and
// ~5e-7 with g = 0 (no decay, the state grows) -> bound 2e-6 absolute + 2e-6 relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "memra/ops.h"
#include "test_util.h"

namespace memra {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

using memra::testing::randn;

bool bits_equal(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// max |got - want| / (atol + rtol |want|) <= 1 means a pass; also returns the max abs error.
struct Err {
  double max_abs = 0, worst_ratio = 0;
  bool finite = true;
};
Err compare(const float* got, const double* want, size_t n, double atol, double rtol) {
  Err e;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) e.finite = false;
    const double d = std::fabs(double(got[i]) - want[i]);
    e.max_abs = std::max(e.max_abs, d);
    e.worst_ratio = std::max(e.worst_ratio, d / (atol + rtol * std::fabs(want[i])));
  }
  return e;
}

// ------------------------------------------------------------------ double references

// causal_conv1d_update: cat(ring, x) per channel, cross-correlate with w, silu; ring_out = the
// last K-1 of the concatenation. x [T, C]; w [C, K]; ring [C, K-1]; y [T, C]; ring_out [C, K-1].
void ref_conv(const Vec& x, int T, int C, const Vec& w, int K, const Vec& ring, DVec& y,
              DVec& ring_out) {
  const int R = K - 1;
  y.assign(size_t(T) * C, 0.0);
  ring_out.assign(size_t(C) * R, 0.0);
  for (int c = 0; c < C; ++c) {
    DVec cat;
    for (int j = 0; j < R; ++j) cat.push_back(ring[size_t(c) * R + j]);
    for (int t = 0; t < T; ++t) cat.push_back(x[size_t(t) * C + c]);
    for (int t = 0; t < T; ++t) {
      double acc = 0;
      for (int k = 0; k < K; ++k) acc += double(w[size_t(c) * K + k]) * cat[t + k];
      y[size_t(t) * C + c] = acc / (1.0 + std::exp(-acc));
    }
    for (int j = 0; j < R; ++j) ring_out[size_t(c) * R + j] = cat[cat.size() - R + j];
  }
}

// Glm5NextTextForgetGate.forward in double. f [T, H*dk]; dt_bias [H*dk]; A_log [H].
DVec ref_gate(const Vec& f, const Vec& dt_bias, const Vec& A_log, int T, int H, int dk,
              cpu::KdaGateForm form, double lb) {
  DVec g(size_t(T) * H * dk);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < dk; ++i) {
        const size_t c = size_t(h) * dk + i, idx = size_t(t) * H * dk + c;
        const double x = double(f[idx]) + dt_bias[c];
        const double rate = std::exp(double(A_log[h]));
        if (form == cpu::KdaGateForm::kLowerBound) {
          g[idx] = lb / (1.0 + std::exp(-rate * x));
        } else {
          g[idx] = -rate * (x > 20.0 ? x : std::log(1.0 + std::exp(x)));
        }
      }
  return g;
}

// chunk_kimi_delta_attention in double, chunk L, one head at a time. q, k, g [T, H, dk];
// v [T, H, dv]; beta [T, H]; state [H, dk, dv] (empty = zeros) updated in place; o [T, H, dv].
void ref_scan_chunked(const Vec& q, const Vec& k, const Vec& v, const Vec& g, const Vec& beta,
                      int T, int H, int dk, int dv, double scale, const Vec& state_in,
                      DVec& state, DVec& o, int L = 16) {
  state.assign(size_t(H) * dk * dv, 0.0);
  if (!state_in.empty()) std::copy(state_in.begin(), state_in.end(), state.begin());
  o.assign(size_t(T) * H * dv, 0.0);
  for (int h = 0; h < H; ++h) {
    double* S = state.data() + size_t(h) * dk * dv;  // [dk, dv]
    for (int t0 = 0; t0 < T; t0 += L) {
      // Chunk rows, zero-padded past T (padding rows have k = v = beta = g = 0: inert).
      DVec qc(size_t(L) * dk, 0), kc(size_t(L) * dk, 0), gc(size_t(L) * dk, 0),
          vc(size_t(L) * dv, 0), bc(L, 0);
      for (int a = 0; a < L && t0 + a < T; ++a) {
        const size_t th = size_t(t0 + a) * H + h;
        for (int i = 0; i < dk; ++i) {
          qc[size_t(a) * dk + i] = q[th * dk + i] * scale;
          kc[size_t(a) * dk + i] = k[th * dk + i];
          gc[size_t(a) * dk + i] = g[th * dk + i];
        }
        for (int j = 0; j < dv; ++j) vc[size_t(a) * dv + j] = v[th * dv + j];
        bc[a] = beta[th];
      }
      for (int a = 1; a < L; ++a)  // per-channel cumulative log gate within the chunk
        for (int i = 0; i < dk; ++i) gc[size_t(a) * dk + i] += gc[size_t(a - 1) * dk + i];
      auto G = [&](int a, int i) { return gc[size_t(a) * dk + i]; };

      // attn[a][b] = -(beta_a k_a . k_b decayed from b to a) for b < a, then the forward
      // substitution that turns (I - A) into its inverse (transformers' row loop), then + I.
      DVec A(size_t(L) * L, 0);
      for (int a = 0; a < L; ++a)
        for (int b = 0; b < a; ++b) {
          double s = 0;
          for (int i = 0; i < dk; ++i)
            s += bc[a] * kc[size_t(a) * dk + i] * kc[size_t(b) * dk + i] *
                 std::exp(G(a, i) - G(b, i));
          A[size_t(a) * L + b] = -s;
        }
      for (int a = 1; a < L; ++a) {
        DVec row(A.begin() + size_t(a) * L, A.begin() + size_t(a) * L + a);
        for (int b = 0; b < a; ++b) {
          double s = row[b];
          for (int m = 0; m < a; ++m) s += row[m] * A[size_t(m) * L + b];
          A[size_t(a) * L + b] = s;
        }
      }
      for (int a = 0; a < L; ++a) A[size_t(a) * L + a] += 1.0;

      // u = A (beta v); w = A (beta k exp(Gcum)); v_new = u - w S.
      DVec vnew(size_t(L) * dv, 0);
      for (int a = 0; a < L; ++a) {
        DVec wrow(dk, 0);
        for (int b = 0; b < L; ++b) {
          const double ab = A[size_t(a) * L + b];
          if (ab == 0) continue;
          for (int j = 0; j < dv; ++j) vnew[size_t(a) * dv + j] += ab * bc[b] * vc[size_t(b) * dv + j];
          for (int i = 0; i < dk; ++i)
            wrow[i] += ab * bc[b] * kc[size_t(b) * dk + i] * std::exp(G(b, i));
        }
        for (int j = 0; j < dv; ++j) {
          double s = 0;
          for (int i = 0; i < dk; ++i) s += wrow[i] * S[size_t(i) * dv + j];
          vnew[size_t(a) * dv + j] -= s;
        }
      }
      // o_a = (q_a exp(Gcum_a)) S + sum_{b <= a} (q_a . k_b decayed b -> a) v_new_b.
      for (int a = 0; a < L && t0 + a < T; ++a) {
        double* oa = o.data() + (size_t(t0 + a) * H + h) * dv;
        for (int j = 0; j < dv; ++j) {
          double s = 0;
          for (int i = 0; i < dk; ++i) s += qc[size_t(a) * dk + i] * std::exp(G(a, i)) * S[size_t(i) * dv + j];
          oa[j] = s;
        }
        for (int b = 0; b <= a; ++b) {
          double s = 0;
          for (int i = 0; i < dk; ++i)
            s += qc[size_t(a) * dk + i] * kc[size_t(b) * dk + i] * std::exp(G(a, i) - G(b, i));
          for (int j = 0; j < dv; ++j) oa[j] += s * vnew[size_t(b) * dv + j];
        }
      }
      // S = S exp(Gcum_last) + sum_a (k_a exp(Gcum_last - Gcum_a)) v_new_a^T.
      for (int i = 0; i < dk; ++i) {
        const double last = G(L - 1, i);
        for (int j = 0; j < dv; ++j) {
          double s = S[size_t(i) * dv + j] * std::exp(last);
          for (int a = 0; a < L; ++a)
            s += kc[size_t(a) * dk + i] * std::exp(last - G(a, i)) * vnew[size_t(a) * dv + j];
          S[size_t(i) * dv + j] = s;
        }
      }
    }
  }
}

// ------------------------------------------------------------------ inputs

struct ScanInputs {
  int T, H, dk, dv;
  Vec q, k, v, g, beta, state;  // state empty = start from zeros
};

// q, k L2-normalised as the mixer does (l2norm, eps 1e-6); g from the lower-bound gate;
// beta = sigmoid(N(0, 1)). `g_value`/`beta_value` override with a constant when finite.
ScanInputs make_scan(int T, int H, int dk, int dv, uint32_t seed, bool with_state,
                     float g_value = NAN, float beta_value = NAN) {
  ScanInputs in;
  in.T = T, in.H = H, in.dk = dk, in.dv = dv;
  in.q = randn(size_t(T) * H * dk, seed + 1);
  in.k = randn(size_t(T) * H * dk, seed + 2);
  in.v = randn(size_t(T) * H * dv, seed + 3);
  cpu::l2norm_heads(in.q.data(), T, H, dk, 1e-6f);
  cpu::l2norm_heads(in.k.data(), T, H, dk, 1e-6f);
  Vec f = randn(size_t(T) * H * dk, seed + 4, 2.0f);
  Vec dt_bias = randn(size_t(H) * dk, seed + 5);
  Vec A_log = randn(H, seed + 6, 0.5f);
  in.g.resize(f.size());
  cpu::kda_gate(f.data(), dt_bias.data(), A_log.data(), T, H, dk, cpu::KdaGateForm::kLowerBound,
                -5.0f, in.g.data());
  if (std::isfinite(g_value)) std::fill(in.g.begin(), in.g.end(), g_value);
  in.beta = randn(size_t(T) * H, seed + 7);
  for (auto& b : in.beta) b = std::isfinite(beta_value) ? beta_value : 1.0f / (1.0f + std::exp(-b));
  if (with_state) in.state = randn(size_t(H) * dk * dv, seed + 8, 0.3f);
  return in;
}

float default_scale(int dk) { return static_cast<float>(1.0 / std::sqrt(double(dk))); }

// Runs the kernel on rows [t0, t0 + n) of `in`, from `state_in` (nullptr = zeros).
void run_scan(const ScanInputs& in, int t0, int n, const float* state_in, Vec& state_out, Vec& o) {
  const size_t rk = size_t(in.H) * in.dk, rv = size_t(in.H) * in.dv;
  state_out.assign(size_t(in.H) * in.dk * in.dv, 0.0f);
  o.assign(size_t(n) * rv, 0.0f);
  cpu::kda_scan(in.q.data() + t0 * rk, in.k.data() + t0 * rk, in.v.data() + t0 * rv,
                in.g.data() + t0 * rk, in.beta.data() + size_t(t0) * in.H, n, in.H, in.dk, in.dv,
                default_scale(in.dk), state_in, state_out.data(), o.data());
}

// ------------------------------------------------------------------ conv

constexpr int kConvK = 4;  // glm5_next / Kimi-Linear's linear_conv_kernel_dim

TEST(KdaConv, MatchesDoubleReference) {
  const int C = 37;
  for (int T : {1, 2, 3, 63, 65, 200}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    Vec x = randn(size_t(T) * C, 10 + T), w = randn(size_t(C) * kConvK, 11, 0.5f);
    Vec ring = randn(size_t(C) * (kConvK - 1), 12);
    Vec y(size_t(T) * C), ring_out(size_t(C) * (kConvK - 1));
    cpu::kda_conv_prefill(x.data(), T, C, w.data(), kConvK, ring.data(), ring_out.data(),
                          y.data());
    DVec ry, rring;
    ref_conv(x, T, C, w, kConvK, ring, ry, rring);
    Err ey = compare(y.data(), ry.data(), y.size(), 1e-6, 1e-6);
    EXPECT_LE(ey.worst_ratio, 1.0) << "max abs err " << ey.max_abs;
    // The ring is a copy of inputs: exact, including when T < K-1 mixes old ring and new x.
    for (size_t i = 0; i < ring_out.size(); ++i) ASSERT_EQ(double(ring_out[i]), rring[i]) << i;
    std::printf("[kda] conv T=%d max|err| = %.3g\n", T, ey.max_abs);
  }
}

TEST(KdaConv, FreshSequenceZeroRingEqualsPaddedConv) {
  // causal_conv1d_fn pads with K-1 zeros on the left: the same as a zero ring.
  const int T = 5, C = 6;
  Vec x = randn(size_t(T) * C, 20), w = randn(size_t(C) * kConvK, 21);
  Vec ring(size_t(C) * (kConvK - 1), 0.0f), ring_out(ring.size()), y(size_t(T) * C);
  cpu::kda_conv_prefill(x.data(), T, C, w.data(), kConvK, ring.data(), ring_out.data(), y.data());
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) {
      double acc = 0;
      for (int k = 0; k < kConvK; ++k) {
        const int src = t + k - (kConvK - 1);
        if (src >= 0) acc += double(w[c * kConvK + k]) * x[src * C + c];
      }
      EXPECT_NEAR(y[t * C + c], acc / (1 + std::exp(-acc)), 1e-6);
    }
}

TEST(KdaConv, PrefillThenDecodeIsBitExact) {
  const int C = 29;
  for (int T : {1, 2, 3, 4, 63, 65, 200}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    Vec x = randn(size_t(T) * C, 30 + T), w = randn(size_t(C) * kConvK, 31);
    Vec ring0 = randn(size_t(C) * (kConvK - 1), 32);
    Vec y_full(size_t(T) * C), ring_full(ring0.size());
    cpu::kda_conv_prefill(x.data(), T, C, w.data(), kConvK, ring0.data(), ring_full.data(),
                          y_full.data());
    // prefill(T-1) (T-1 may be 0) then decode(1).
    Vec y_split(size_t(T) * C), ring_mid(ring0.size()), ring_end(ring0.size());
    cpu::kda_conv_prefill(x.data(), T - 1, C, w.data(), kConvK, ring0.data(), ring_mid.data(),
                          y_split.data());
    cpu::kda_conv_decode(x.data() + size_t(T - 1) * C, C, w.data(), kConvK, ring_mid.data(),
                         ring_end.data(), y_split.data() + size_t(T - 1) * C);
    EXPECT_TRUE(bits_equal(y_full.data(), y_split.data(), y_full.size()));
    EXPECT_TRUE(bits_equal(ring_full.data(), ring_end.data(), ring_full.size()));
    // Decode alone equals prefill at T = 1.
    Vec yd(C), yp(C), rd(ring0.size()), rp(ring0.size());
    cpu::kda_conv_decode(x.data(), C, w.data(), kConvK, ring0.data(), rd.data(), yd.data());
    cpu::kda_conv_prefill(x.data(), 1, C, w.data(), kConvK, ring0.data(), rp.data(), yp.data());
    EXPECT_TRUE(bits_equal(yd.data(), yp.data(), C));
    EXPECT_TRUE(bits_equal(rd.data(), rp.data(), rd.size()));
  }
}

TEST(KdaConv, ChainedDecodesEqualPrefill) {
  // Token-by-token decode from a fresh ring over a prompt shorter than, equal to and longer
  // than the kernel.
  const int C = 11, T = 7;
  Vec x = randn(size_t(T) * C, 40), w = randn(size_t(C) * kConvK, 41);
  Vec ring(size_t(C) * (kConvK - 1), 0.0f), ring_full(ring.size()), y_full(size_t(T) * C);
  cpu::kda_conv_prefill(x.data(), T, C, w.data(), kConvK, ring.data(), ring_full.data(),
                        y_full.data());
  Vec y(size_t(T) * C), next(ring.size());
  for (int t = 0; t < T; ++t) {
    cpu::kda_conv_decode(x.data() + size_t(t) * C, C, w.data(), kConvK, ring.data(), next.data(),
                         y.data() + size_t(t) * C);
    ring.swap(next);
  }
  EXPECT_TRUE(bits_equal(y.data(), y_full.data(), y.size()));
  EXPECT_TRUE(bits_equal(ring.data(), ring_full.data(), ring.size()));
}

// ------------------------------------------------------------------ gate

TEST(KdaGate, BothFormsMatchDoubleReference) {
  const int T = 13, H = 3, dk = 5;
  Vec f = randn(size_t(T) * H * dk, 50, 4.0f), dt_bias = randn(size_t(H) * dk, 51);
  Vec A_log = randn(H, 52);
  // Probe the softplus threshold and the saturation of both forms: +-20 neighbourhood and
  // |f + dt_bias| ~ 1e4.
  const float probes[] = {19.9f, 20.0f, 20.1f, 25.0f, -20.0f, -30.0f, 1e4f, -1e4f, 0.0f};
  for (size_t i = 0; i < std::size(probes); ++i) f[i] = probes[i] - dt_bias[i];
  for (auto form : {cpu::KdaGateForm::kLowerBound, cpu::KdaGateForm::kSoftplus}) {
    Vec g(f.size());
    cpu::kda_gate(f.data(), dt_bias.data(), A_log.data(), T, H, dk, form, -5.0f, g.data());
    DVec rg = ref_gate(f, dt_bias, A_log, T, H, dk, form, -5.0);
    // Relative: the f32 sum f + dt_bias rounds once, then exp/sigmoid/log each a few ulp.
    Err e = compare(g.data(), rg.data(), g.size(), 1e-6, 2e-6);
    EXPECT_TRUE(e.finite);
    EXPECT_LE(e.worst_ratio, 1.0) << "max abs err " << e.max_abs;
    for (size_t i = 0; i < g.size(); ++i) EXPECT_LE(g[i], 0.0f) << i;  // log decay: never > 0
    if (form == cpu::KdaGateForm::kLowerBound) {
      for (float gi : g) EXPECT_GE(gi, -5.0f);
    }
    std::printf("[kda] gate form=%d max|err| = %.3g\n", int(form), e.max_abs);
  }
}

TEST(KdaGate, SoftplusThresholdIsTransformers) {
  // Above 20 softplus is the identity; the aliasing form g == f works.
  const int H = 1, dk = 4;
  Vec f = {20.5f, 21.0f, 100.0f, -100.0f}, dt_bias(dk, 0.0f), A_log = {0.0f};
  cpu::kda_gate(f.data(), dt_bias.data(), A_log.data(), 1, H, dk, cpu::KdaGateForm::kSoftplus,
                0.0f, f.data());
  EXPECT_EQ(f[0], -20.5f);
  EXPECT_EQ(f[1], -21.0f);
  EXPECT_EQ(f[2], -100.0f);
  // log(1 + exp(-100)) is exactly 0 in f32 (transformers uses log, not log1p): no decay.
  EXPECT_EQ(f[3], 0.0f);
}

// ------------------------------------------------------------------ scan

void check_scan_against_chunked(const ScanInputs& in, double atol, double rtol) {
  Vec state, o;
  run_scan(in, 0, in.T, in.state.empty() ? nullptr : in.state.data(), state, o);
  DVec rstate, ro;
  ref_scan_chunked(in.q, in.k, in.v, in.g, in.beta, in.T, in.H, in.dk, in.dv,
                   default_scale(in.dk), in.state, rstate, ro);
  Err eo = compare(o.data(), ro.data(), o.size(), atol, rtol);
  Err es = compare(state.data(), rstate.data(), state.size(), atol, rtol);
  EXPECT_TRUE(eo.finite && es.finite);
  EXPECT_LE(eo.worst_ratio, 1.0) << "o max abs err " << eo.max_abs;
  EXPECT_LE(es.worst_ratio, 1.0) << "state max abs err " << es.max_abs;
  std::printf("[kda] scan T=%d H=%d dk=%d dv=%d state=%d: max|err| o %.3g state %.3g\n", in.T,
              in.H, in.dk, in.dv, int(!in.state.empty()), eo.max_abs, es.max_abs);
}

TEST(KdaScan, MatchesChunkedDoubleReference) {
  for (int T : {1, 3, 15, 16, 17, 63, 65, 200}) {
    for (bool with_state : {false, true}) {
      SCOPED_TRACE("T=" + std::to_string(T) + " state=" + std::to_string(with_state));
      check_scan_against_chunked(make_scan(T, 2, 16, 16, 100 + T, with_state), 2e-6, 2e-6);
    }
  }
}

TEST(KdaScan, MatchesChunkedDoubleReferenceRectangularAndWide) {
  // dk != dv catches a transposed state; dk = dv = 128 is the shipped head width.
  check_scan_against_chunked(make_scan(65, 3, 16, 24, 200, true), 2e-6, 2e-6);
  check_scan_against_chunked(make_scan(65, 1, 128, 128, 201, true), 2e-6, 2e-6);
}

TEST(KdaScan, PrefillThenDecodeIsBitExact) {
  for (int T : {1, 2, 63, 65, 200}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    ScanInputs in = make_scan(T, 2, 16, 16, 300 + T, /*with_state=*/true);
    Vec s_full, o_full, s_mid, o_head, s_end, o_tail;
    run_scan(in, 0, T, in.state.data(), s_full, o_full);
    run_scan(in, 0, T - 1, in.state.data(), s_mid, o_head);
    run_scan(in, T - 1, 1, s_mid.data(), s_end, o_tail);
    const size_t rv = size_t(in.H) * in.dv;
    EXPECT_TRUE(bits_equal(o_full.data(), o_head.data(), o_head.size()));
    EXPECT_TRUE(bits_equal(o_full.data() + (T - 1) * rv, o_tail.data(), rv));
    EXPECT_TRUE(bits_equal(s_full.data(), s_end.data(), s_full.size()));
  }
}

TEST(KdaScan, ChainedOneStepScansEqualOneScan) {
  for (auto [T, dk] : {std::pair{63, 16}, std::pair{17, 128}}) {
    SCOPED_TRACE("T=" + std::to_string(T) + " dk=" + std::to_string(dk));
    ScanInputs in = make_scan(T, 2, dk, dk, 400 + T, /*with_state=*/false);
    Vec s_full, o_full;
    run_scan(in, 0, T, nullptr, s_full, o_full);
    const size_t rv = size_t(in.H) * in.dv;
    Vec state, next, o1;
    for (int t = 0; t < T; ++t) {
      run_scan(in, t, 1, t == 0 ? nullptr : state.data(), next, o1);
      ASSERT_TRUE(bits_equal(o_full.data() + t * rv, o1.data(), rv)) << "step " << t;
      state.swap(next);
    }
    EXPECT_TRUE(bits_equal(s_full.data(), state.data(), s_full.size()));
  }
}

TEST(KdaScan, NullStateEqualsZeroState) {
  ScanInputs in = make_scan(9, 2, 16, 8, 500, false);
  Vec zeros(size_t(in.H) * in.dk * in.dv, 0.0f), s0, o0, s1, o1;
  run_scan(in, 0, in.T, nullptr, s0, o0);
  run_scan(in, 0, in.T, zeros.data(), s1, o1);
  EXPECT_TRUE(bits_equal(o0.data(), o1.data(), o0.size()));
  EXPECT_TRUE(bits_equal(s0.data(), s1.data(), s0.size()));
}

TEST(KdaScan, GateAndBetaExtremesStayFiniteAndMatch) {
  struct Case {
    const char* name;
    int T;
    float g, beta;
  };
  const Case cases[] = {
      {"g=0 (no decay)", 200, 0.0f, NAN},
      {"g=-5 (lower bound) x500", 500, -5.0f, NAN},
      {"beta~0", 65, NAN, 1e-7f},
      {"beta~1", 65, NAN, 1.0f - 1e-7f},
      {"beta=1, g=0", 200, 0.0f, 1.0f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    // g = 0 for 200 steps keeps every contribution (the state grows); the bound is relative.
    check_scan_against_chunked(make_scan(c.T, 2, 16, 16, 600 + c.T, true, c.g, c.beta), 2e-6,
                               2e-6);
  }
}

TEST(KdaScan, SaturatedSoftplusGateResetsState) {
  // |f + dt_bias| = 1e4 through the softplus gate: g = -1e4 * exp(A_log), exp(g) == 0, so the
  // state is forgotten at every step; o_t must be finite and equal a fresh one-step scan.
  const int T = 8, H = 2, dk = 16, dv = 16;
  ScanInputs in = make_scan(T, H, dk, dv, 700, true);
  Vec f(size_t(T) * H * dk, 1e4f), dt_bias(size_t(H) * dk, 0.0f), A_log(H, 0.0f);
  cpu::kda_gate(f.data(), dt_bias.data(), A_log.data(), T, H, dk, cpu::KdaGateForm::kSoftplus,
                0.0f, in.g.data());
  Vec s, o, s1, o1;
  run_scan(in, 0, T, in.state.data(), s, o);
  for (float x : o) ASSERT_TRUE(std::isfinite(x));
  for (float x : s) ASSERT_TRUE(std::isfinite(x));
  run_scan(in, T - 1, 1, nullptr, s1, o1);
  const size_t rv = size_t(H) * dv;
  EXPECT_TRUE(bits_equal(o.data() + (T - 1) * rv, o1.data(), rv));
  EXPECT_TRUE(bits_equal(s.data(), s1.data(), s.size()));
}

}  // namespace
}  // namespace memra
