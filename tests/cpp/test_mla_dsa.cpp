// MLA (absorbed, gathered) and DSA k-pool ops against double-precision references written here:
// the EXPANDED MLA form of transformers (k = W_uk c, v = W_uv c per head, plain softmax attention)
// and direct loops for the indexer's pool keys, scores and selection. Then memra::op's CPU forms
// that are more than a forward (op/mla.h, op/dsa.h): the batched attention and latent append
// against the one-sequence reference ops, the k-pool bookkeeping against cpu::kpool_pool_key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "memra/op/dsa.h"
#include "memra/op/mla.h"
#include "memra/ops.h"
#include "test_util.h"

namespace memra {
namespace {

using memra::testing::randn;

struct MlaShape {
  int t_q, t_kv, H, R, d_nope, d_v, d_rope;
  bool bf16;
};

// Random MLA problem: kv_b [H*(dn+dv), R] (f32 or bf16), cache [t_kv, R + d_rope],
// q_nope [t_q, H, dn], q_pe [t_q, H, d_rope]. `wf` holds kv_b's values as the op reads them.
struct MlaProblem {
  MlaShape s;
  std::vector<float> wf, cache, q_nope, q_pe;
  std::vector<uint16_t> wb;
  Weight kv_b;

  explicit MlaProblem(const MlaShape& shape, uint32_t seed) : s(shape) {
    const int rows = s.H * (s.d_nope + s.d_v);
    wf = randn(static_cast<size_t>(rows) * s.R, seed, 0.5f);
    if (s.bf16) {
      wb.resize(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) {
        wb[i] = f32_to_bf16(wf[i]);
        wf[i] = bf16_to_f32(wb[i]);
      }
      kv_b = Weight(DType::kBF16, {rows, s.R}, wb.data());
    } else {
      kv_b = Weight(DType::kF32, {rows, s.R}, wf.data());
    }
    cache = randn(static_cast<size_t>(s.t_kv) * (s.R + s.d_rope), seed + 1);
    q_nope = randn(static_cast<size_t>(s.t_q) * s.H * s.d_nope, seed + 2);
    q_pe = randn(static_cast<size_t>(s.t_q) * s.H * s.d_rope, seed + 3);
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(s.d_nope + s.d_rope)); }
  double w(int h, int row, int r) const {
    return wf[(static_cast<size_t>(h) * (s.d_nope + s.d_v) + row) * s.R + r];
  }

  // transformers' expanded form in double: out [t_q, H, d_v]. allowed(i, j) says whether query i
  // sees cache row j (the causal or index-list mask).
  template <class Allowed>
  std::vector<double> expanded(Allowed allowed) const {
    const int W = s.R + s.d_rope;
    std::vector<double> out(static_cast<size_t>(s.t_q) * s.H * s.d_v, 0.0);
    for (int h = 0; h < s.H; ++h) {
      // k_h[j] = [W_uk[h] c_j | k_pe_j], v_h[j] = W_uv[h] c_j.
      std::vector<double> k(static_cast<size_t>(s.t_kv) * (s.d_nope + s.d_rope));
      std::vector<double> v(static_cast<size_t>(s.t_kv) * s.d_v);
      for (int j = 0; j < s.t_kv; ++j) {
        const float* c = &cache[static_cast<size_t>(j) * W];
        for (int n = 0; n < s.d_nope; ++n) {
          double a = 0;
          for (int r = 0; r < s.R; ++r) a += w(h, n, r) * c[r];
          k[static_cast<size_t>(j) * (s.d_nope + s.d_rope) + n] = a;
        }
        for (int e = 0; e < s.d_rope; ++e)
          k[static_cast<size_t>(j) * (s.d_nope + s.d_rope) + s.d_nope + e] = c[s.R + e];
        for (int u = 0; u < s.d_v; ++u) {
          double a = 0;
          for (int r = 0; r < s.R; ++r) a += w(h, s.d_nope + u, r) * c[r];
          v[static_cast<size_t>(j) * s.d_v + u] = a;
        }
      }
      for (int i = 0; i < s.t_q; ++i) {
        std::vector<double> q(s.d_nope + s.d_rope);
        for (int n = 0; n < s.d_nope; ++n) q[n] = q_nope[(static_cast<size_t>(i) * s.H + h) * s.d_nope + n];
        for (int e = 0; e < s.d_rope; ++e)
          q[s.d_nope + e] = q_pe[(static_cast<size_t>(i) * s.H + h) * s.d_rope + e];
        std::vector<double> sc(s.t_kv, -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j < s.t_kv; ++j) {
          if (!allowed(i, j)) continue;
          double a = 0;
          for (size_t x = 0; x < q.size(); ++x) a += q[x] * k[j * q.size() + x];
          sc[j] = a * (1.0 / std::sqrt(static_cast<double>(s.d_nope + s.d_rope)));
          m = std::max(m, sc[j]);
        }
        if (m == -INFINITY) continue;  // nothing visible: zeros
        double l = 0;
        for (int j = 0; j < s.t_kv; ++j) l += sc[j] == -INFINITY ? 0.0 : std::exp(sc[j] - m);
        for (int j = 0; j < s.t_kv; ++j) {
          if (sc[j] == -INFINITY) continue;
          const double p = std::exp(sc[j] - m) / l;
          for (int u = 0; u < s.d_v; ++u)
            out[(static_cast<size_t>(i) * s.H + h) * s.d_v + u] += p * v[static_cast<size_t>(j) * s.d_v + u];
        }
      }
    }
    return out;
  }

  // Absorb -> attention (absorbed or gathered) -> decompress, all through memra.
  std::vector<float> run(const std::vector<int32_t>* idx, int width, Status* st) const {
    std::vector<float> q_lat(static_cast<size_t>(s.t_q) * s.H * s.R);
    std::vector<float> o_lat(q_lat.size());
    std::vector<float> out(static_cast<size_t>(s.t_q) * s.H * s.d_v);
    cpu::mla_absorb_q(q_nope.data(), kv_b, s.t_q, s.H, s.d_nope, s.d_v, q_lat.data());
    const float* qpe = s.d_rope ? q_pe.data() : nullptr;
    *st = idx ? cpu::mla_attn_gathered(q_lat.data(), qpe, cache.data(), idx->data(), s.H, s.R,
                                       s.d_rope, s.t_q, s.t_kv, width, scale(), o_lat.data())
              : cpu::mla_attn_absorbed(q_lat.data(), qpe, cache.data(), s.H, s.R, s.d_rope,
                                       s.t_q, s.t_kv, scale(), o_lat.data());
    cpu::mla_decompress_v(o_lat.data(), kv_b, s.t_q, s.H, s.d_nope, s.d_v, out.data());
    return out;
  }
};

// Largest |got - want| / (1 + |want|) over all elements, also asserting every value is finite.
double max_rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got[i])) << "element " << i;
    e = std::max(e, std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i])));
  }
  return e;
}

const MlaShape kShapes[] = {
    {1, 1, 3, 5, 4, 6, 0, false},   {1, 7, 3, 5, 4, 6, 2, false},  {7, 7, 3, 5, 3, 7, 4, false},
    {3, 37, 3, 5, 4, 6, 2, false},  {37, 37, 2, 8, 16, 16, 0, true}, {5, 37, 1, 33, 9, 11, 6, true},
};

TEST(Mla, AbsorbedMatchesExpandedForm) {
  uint32_t seed = 10;
  for (const MlaShape& sh : kShapes) {
    MlaProblem p(sh, seed += 10);
    Status st;
    auto got = p.run(nullptr, 0, &st);
    ASSERT_TRUE(st.ok()) << st.message;
    const int off = sh.t_kv - sh.t_q;
    const double e = max_rel_err(got, p.expanded([off](int i, int j) { return j <= off + i; }));
    std::printf("[mla absorbed] t_q=%d t_kv=%d H=%d R=%d dn=%d dv=%d dr=%d bf16=%d max rel err %.3g\n",
                sh.t_q, sh.t_kv, sh.H, sh.R, sh.d_nope, sh.d_v, sh.d_rope, sh.bf16, e);
    // f32 dots of length <= 33 and a softmax over <= 37 rows: a few ulp per step.
    EXPECT_LT(e, 2e-5);
  }
}

TEST(Mla, AbsorbedRejectsMoreQueriesThanCacheRows) {
  std::vector<float> q(4 * 2 * 3), c(3 * 3), o(4 * 2 * 3, 7.0f);
  Status st = cpu::mla_attn_absorbed(q.data(), nullptr, c.data(), 2, 3, 0, 4, 3, 1.0f, o.data());
  EXPECT_EQ(st.code, kContractQuerySuffix);
  EXPECT_NE(st.message.find("t_q=4"), std::string::npos) << st.message;
  EXPECT_NE(st.message.find("t_kv=3"), std::string::npos) << st.message;
  for (float x : o) EXPECT_EQ(x, 7.0f);  // nothing written
}

// Causal index lists written in a scrambled order, with -1 holes and duplicates.
std::vector<int32_t> causal_lists(int t_q, int t_kv, int width, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> idx(static_cast<size_t>(t_q) * width, -1);
  for (int i = 0; i < t_q; ++i) {
    std::vector<int32_t> rows;
    for (int j = 0; j <= t_kv - t_q + i; ++j) rows.push_back(j);
    rows.push_back(rows.front());  // a duplicate must count once
    while (static_cast<int>(rows.size()) < width) rows.push_back(-1);
    std::shuffle(rows.begin(), rows.end(), gen);
    std::copy(rows.begin(), rows.end(), idx.begin() + static_cast<size_t>(i) * width);
  }
  return idx;
}

TEST(Mla, GatheredWithFullListsEqualsAbsorbed) {
  uint32_t seed = 100;
  for (const MlaShape& sh : kShapes) {
    MlaProblem p(sh, seed += 10);
    const int width = sh.t_kv + 4;
    auto idx = causal_lists(sh.t_q, sh.t_kv, width, seed);
    Status st_a, st_g;
    auto absorbed = p.run(nullptr, 0, &st_a);
    auto gathered = p.run(&idx, width, &st_g);
    ASSERT_TRUE(st_a.ok() && st_g.ok()) << st_a.message << st_g.message;
    // Rows are walked in ascending order in both, so the sums are the same sums.
    for (size_t i = 0; i < absorbed.size(); ++i) ASSERT_EQ(absorbed[i], gathered[i]) << i;
  }
}

TEST(Mla, GatheredMatchesExpandedWithListAsMask) {
  const MlaShape sh{5, 37, 3, 5, 4, 6, 2, false};
  MlaProblem p(sh, 7);
  const int width = 9;
  std::mt19937 gen(3);
  std::vector<int32_t> idx(sh.t_q * width);
  for (int e = 0; e < sh.t_q * width; ++e) {  // -1 .. the query's row (later rows are refused)
    const int row = sh.t_kv - sh.t_q + e / width;
    idx[e] = static_cast<int32_t>(gen() % (row + 2)) - 1;
  }
  Status st;
  auto got = p.run(&idx, width, &st);
  ASSERT_TRUE(st.ok()) << st.message;
  auto want = p.expanded([&](int i, int j) {
    return std::find(idx.begin() + i * width, idx.begin() + (i + 1) * width, j) !=
           idx.begin() + (i + 1) * width;
  });
  const double e = max_rel_err(got, want);
  std::printf("[mla gathered] random lists with repeats, max rel err %.3g\n", e);
  EXPECT_LT(e, 2e-5);
}

TEST(Mla, GatheredLeadingMinusOnesAreFinite) {
  const int H = 3, R = 5, d_rope = 2, t_kv = 7, t_q = 2, width = 6;
  auto cache = randn(t_kv * (R + d_rope), 1);
  auto q_lat = randn(t_q * H * R, 2, 30.0f);  // large logits: softmax must still be exact
  auto q_pe = randn(t_q * H * d_rope, 3);
  // Query 0: all -1. Query 1: all -1 except the last entry (row 4).
  std::vector<int32_t> idx = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 4};
  std::vector<float> o(t_q * H * R, 123.0f);
  Status st = cpu::mla_attn_gathered(q_lat.data(), q_pe.data(), cache.data(), idx.data(), H, R,
                                     d_rope, t_q, t_kv, width, 0.3f, o.data());
  ASSERT_TRUE(st.ok()) << st.message;
  for (int h = 0; h < H; ++h)
    for (int r = 0; r < R; ++r) {
      EXPECT_EQ(o[(0 * H + h) * R + r], 0.0f);
      // One visible row: softmax weight exactly 1, so o_lat is that row's latent.
      EXPECT_EQ(o[(1 * H + h) * R + r], cache[4 * (R + d_rope) + r]);
    }
}

TEST(Mla, GatheredRejectsRowsOutsideCache) {
  const int H = 1, R = 2, t_kv = 3, t_q = 2, width = 2;
  std::vector<float> q(t_q * H * R, 1.0f), c(t_kv * R, 1.0f), o(t_q * H * R, 9.0f);
  for (int32_t bad : {t_kv, -2}) {
    std::vector<int32_t> idx = {0, 1, 2, bad};
    Status st = cpu::mla_attn_gathered(q.data(), nullptr, c.data(), idx.data(), H, R, 0, t_q,
                                       t_kv, width, 1.0f, o.data());
    EXPECT_EQ(st.code, kContractRange);
    EXPECT_NE(st.message.find(std::to_string(bad)), std::string::npos) << st.message;
    for (float x : o) EXPECT_EQ(x, 9.0f);  // validated before any write
  }
}

// ---------------------------------------------------------------- DSA k-pool

TEST(Dsa, PoolKeyMatchesDoubleLoop) {
  const int d = 7;
  for (int pool : {1, 3, 4, 5}) {
    auto k = randn(pool * d, pool, 1.0f);
    auto gate = randn(pool * d, pool + 10, 3.0f);
    auto ape = randn(pool * d, pool + 20, 1.0f);
    std::vector<float> key(d);
    cpu::kpool_pool_key(k.data(), gate.data(), ape.data(), pool, d, key.data());
    for (int c = 0; c < d; ++c) {
      double l = 0, acc = 0;
      for (int r = 0; r < pool; ++r) l += std::exp(double(gate[r * d + c]) + ape[r * d + c]);
      for (int r = 0; r < pool; ++r)
        acc += std::exp(double(gate[r * d + c]) + ape[r * d + c]) / l * k[r * d + c];
      EXPECT_NEAR(key[c], acc, 1e-6 * (1 + std::abs(acc))) << "pool " << pool << " c " << c;
    }
  }
}

TEST(Dsa, ScoreMatchesDoubleLoopAndMasksUnfinishedPools) {
  const int t_q = 5, Hi = 3, d = 7, pool = 3, n_pools = 6, first_pos = 9;
  auto q = randn(t_q * Hi * d, 1), w = randn(t_q * Hi, 2), keys = randn(n_pools * d, 3);
  const float qk_scale = 1.0f / std::sqrt(float(d)), head_scale = 1.0f / std::sqrt(float(Hi));
  std::vector<float> score(t_q * n_pools);
  cpu::kpool_score(q.data(), w.data(), keys.data(), t_q, Hi, d, n_pools, pool, first_pos, qk_scale,
                   head_scale, score.data());
  for (int i = 0; i < t_q; ++i)
    for (int p = 0; p < n_pools; ++p) {
      const float s = score[i * n_pools + p];
      if (p * pool + pool - 1 > first_pos + i) {
        EXPECT_EQ(s, -INFINITY) << "query " << i << " pool " << p;
        continue;
      }
      double acc = 0;
      for (int h = 0; h < Hi; ++h) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(q[(i * Hi + h) * d + c]) * keys[p * d + c];
        acc += double(w[i * Hi + h]) * head_scale * std::max(dot * qk_scale, 0.0);
      }
      EXPECT_NEAR(s, acc, 1e-6 * (1 + std::abs(acc))) << "query " << i << " pool " << p;
    }
  // Positions 9..13 see pools 0..2 (last rows 2, 5, 8); pool 3 (last row 11) from position 11.
  EXPECT_TRUE(std::isfinite(score[2 * n_pools + 3]));
  EXPECT_EQ(score[1 * n_pools + 3], -INFINITY);
}

TEST(Dsa, SelectBreaksTiesTowardsTheLowerPoolAndLaysOutRows) {
  const int pool = 3, n_pools = 4, select_k = 2, width = select_k * pool + pool - 1 + 2;
  // Position 13: pools 0..3 are complete (last row 11), tail rows 12, 13.
  const float score[n_pools] = {1.0f, 3.0f, 3.0f, 3.0f};
  std::vector<int32_t> idx(width, 77);
  Status st = cpu::kpool_select(score, 1, n_pools, pool, select_k, width, 13, idx.data());
  ASSERT_TRUE(st.ok()) << st.message;
  const std::vector<int32_t> want = {3, 4, 5, 6, 7, 8, 12, 13, -1, -1};
  EXPECT_EQ(idx, want);
}

TEST(Dsa, SelectWritesPoolsInAscendingOrderNotScoreOrder) {
  const int pool = 2, n_pools = 5, select_k = 3, width = select_k * pool + pool - 1;
  const float score[n_pools] = {0.5f, 0.1f, 4.0f, 2.0f, 9.0f};
  std::vector<int32_t> idx(width);
  ASSERT_TRUE(cpu::kpool_select(score, 1, n_pools, pool, select_k, width, 9, idx.data()).ok());
  // Position 9: (9+1) % 2 == 0, so no tail row; top 3 = pools 4, 2, 3 -> ascending 2, 3, 4.
  const std::vector<int32_t> want = {4, 5, 6, 7, 8, 9, -1};
  EXPECT_EQ(idx, want);
}

TEST(Dsa, SelectWithFewerVisiblePoolsThanSelectK) {
  // Prefill of 11 rows from position 0, pool 4, select_k 2: early queries see 0 or 1 pools.
  const int t_q = 11, pool = 4, n_pools = 2, select_k = 2, width = 2 * pool + pool - 1;
  const int Hi = 2, d = 5;
  auto q = randn(t_q * Hi * d, 5), w = randn(t_q * Hi, 6), keys = randn(n_pools * d, 7);
  std::vector<float> score(t_q * n_pools);
  cpu::kpool_score(q.data(), w.data(), keys.data(), t_q, Hi, d, n_pools, pool, 0, 0.4f, 0.7f,
                   score.data());
  std::vector<int32_t> idx(t_q * width);
  ASSERT_TRUE(cpu::kpool_select(score.data(), t_q, n_pools, pool, select_k, width, 0, idx.data()).ok());
  for (int i = 0; i < t_q; ++i) {
    // With select_k * pool >= every visible complete row, the list is exactly rows 0..i.
    std::vector<int32_t> got;
    for (int e = 0; e < width; ++e)
      if (idx[i * width + e] >= 0) got.push_back(idx[i * width + e]);
    std::sort(got.begin(), got.end());
    std::vector<int32_t> want(i + 1);
    for (int j = 0; j <= i; ++j) want[j] = j;
    EXPECT_EQ(got, want) << "query " << i;
    // -1 only as trailing padding.
    for (int e = static_cast<int>(got.size()); e < width; ++e) EXPECT_EQ(idx[i * width + e], -1);
  }
}

TEST(Dsa, SelectPoolOfOneHasNoTail) {
  const float score[3] = {2.0f, 1.0f, 3.0f};
  std::vector<int32_t> idx(2);
  ASSERT_TRUE(cpu::kpool_select(score, 1, 3, 1, 2, 2, 2, idx.data()).ok());
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 2}));
}

TEST(Dsa, SelectRejectsNarrowWidthAndBadPool) {
  const float score[4] = {1, 2, 3, 4};
  std::vector<int32_t> idx(16);
  Status st = cpu::kpool_select(score, 1, 4, 3, 2, 7, 20, idx.data());  // needs 2*3 + 2 = 8
  EXPECT_EQ(st.code, kContractIndexWidth);
  EXPECT_NE(st.message.find("7"), std::string::npos) << st.message;
  EXPECT_NE(st.message.find("8"), std::string::npos) << st.message;
  EXPECT_EQ(cpu::kpool_select(score, 1, 4, 0, 2, 16, 20, idx.data()).code, kContractPool);
  EXPECT_TRUE(cpu::kpool_select(score, 1, 4, 3, 2, 8, 20, idx.data()).ok());
}

// ---------------------------------------------------------------- memra::op on the CPU

// B = 4 sequences of one query, latent-only caches of their own lengths: t_kv {5, 0, 12, 9}
// with max_t_kv 9 (row 1 idle, row 2 clamped to 9 rows).
struct BatchedAttn {
  static constexpr int B = 4, H = 3, R = 6, width = 5, max_t_kv = 9;
  std::vector<std::vector<float>> caches;
  std::vector<const void*> ptrs;
  std::vector<int32_t> t_kv{5, 0, 12, 9};
  std::vector<float> q_lat = memra::testing::randn(size_t(B) * H * R, 21);
  // Row 0 lists rows past its 5 and a duplicate; row 3 only -1 and out-of-range entries.
  std::vector<int32_t> idx{4, 7, 1, 1, -1, /**/ 0, 1, 2, 3, 4, /**/ 8, 0, 11, 3, -1,
                           /**/ -1, 9, 12, -1, -1};
  BatchedAttn() {
    for (int b = 0; b < B; ++b) {
      caches.push_back(memra::testing::randn(size_t(12) * R, 30 + b));
      ptrs.push_back(caches.back().data());
    }
  }
  MemraMlaAttnParams params(int rows, float* o) const {
    MemraMlaAttnParams p{};
    p.batched = 1;
    p.rows = rows;
    p.q_lat = q_lat.data();
    p.H = H;
    p.R = R;
    p.scale = 0.3f;
    p.o_lat = o;
    p.caches = ptrs.data();
    p.seq_t_kv = t_kv.data();
    p.B = B;
    p.max_t_kv = max_t_kv;
    p.idx = idx.data();
    p.width = width;
    return p;
  }
  // Sequence b by the one-sequence reference: one query at row n - 1 over rows (all of them
  // when null).
  std::vector<float> reference(int b, const std::vector<int32_t>* rows) const {
    std::vector<float> o(size_t(H) * R, 0.0f);
    const int n = std::min(t_kv[b], max_t_kv);
    if (n == 0) return o;
    const float* q = q_lat.data() + size_t(b) * H * R;
    const Status st =
        rows ? cpu::mla_attn_gathered(q, nullptr, caches[b].data(), rows->data(), H, R, 0, 1, n,
                                      static_cast<int>(rows->size()), 0.3f, o.data())
             : cpu::mla_attn_absorbed(q, nullptr, caches[b].data(), H, R, 0, 1, n, 0.3f, o.data());
    EXPECT_TRUE(st.ok()) << st.message;
    return o;
  }
  std::vector<float> row(const std::vector<float>& o, int b) const {
    return {o.begin() + size_t(b) * H * R, o.begin() + size_t(b + 1) * H * R};
  }
};

TEST(OpMla, BatchedDenseAttentionIsEachSequenceAlone) {
  BatchedAttn t;
  std::vector<float> o(size_t(t.B) * t.H * t.R, 7.0f);
  ASSERT_TRUE(op::mla_attn(op::Backend{}, t.params(MEMRA_MLA_ROWS_CAUSAL, o.data())).ok());
  for (int b = 0; b < t.B; ++b) EXPECT_EQ(t.row(o, b), t.reference(b, nullptr)) << "row " << b;
}

TEST(OpMla, BatchedIndexedAndListedAttentionDropRowsOutsideTheSequence) {
  BatchedAttn t;
  const std::vector<std::vector<int32_t>> kept = {
      {4, -1, 1, 1, -1}, {}, {8, 0, -1, 3, -1}, {-1, -1, -1, -1, -1}};
  std::vector<float> o(size_t(t.B) * t.H * t.R, 7.0f);
  ASSERT_TRUE(op::mla_attn(op::Backend{}, t.params(MEMRA_MLA_ROWS_INDEXED, o.data())).ok());
  for (int b = 0; b < t.B; ++b) {
    EXPECT_EQ(t.row(o, b), t.reference(b, b == 1 ? nullptr : &kept[b])) << "row " << b;
  }
  // The same rows compacted (ascending, once each; kpool_select's compact form) give the same
  // bytes; entries past counts[b] are not read.
  std::vector<int32_t> list{1, 4, 99, 99, 99, /**/ 99, 99, 99, 99, 99, /**/ 0, 3, 8, 99, 99,
                            /**/ 99, 99, 99, 99, 99};
  std::vector<int> counts{2, 0, 3, 0};
  std::vector<float> o2(o.size(), 7.0f);
  MemraMlaAttnParams p = t.params(MEMRA_MLA_ROWS_LISTED, o2.data());
  p.list = list.data();
  p.counts = counts.data();
  ASSERT_TRUE(op::mla_attn(op::Backend{}, p).ok());
  EXPECT_EQ(o2, o);
  p.counts = nullptr;
  EXPECT_EQ(op::mla_attn(op::Backend{}, p).code, kContractMissing);
}

TEST(OpMla, BatchedLatentAppendWritesActiveRowsOnly) {
  std::vector<float> c0(4 * 3, 0.0f), c1(4 * 3, 0.0f), c2(4 * 3, 0.0f);
  void* caches[3] = {c0.data(), c1.data(), c2.data()};
  const std::vector<float> rows = memra::testing::randn(3 * 3, 5);
  const int32_t pos[3] = {2, -1, 0};
  MemraMlaAppendParams p{};
  p.batched = 1;
  p.rows = rows.data();
  p.n = 3;
  p.W = 3;
  p.caches = caches;
  p.pos = pos;
  ASSERT_TRUE(op::mla_latent_append(op::Backend{}, p).ok());
  EXPECT_EQ(std::vector<float>(c0.begin() + 6, c0.begin() + 9),
            std::vector<float>(rows.begin(), rows.begin() + 3));
  EXPECT_EQ(c1, std::vector<float>(12, 0.0f));
  EXPECT_EQ(std::vector<float>(c2.begin(), c2.begin() + 3),
            std::vector<float>(rows.begin() + 6, rows.begin() + 9));
  p.cache_dtype = 1;  // bf16 caches: CUDA only
  EXPECT_EQ(op::mla_latent_append(op::Backend{}, p).code, kUnsupportedGeometry);
}

TEST(OpDsa, AppendInChunksGivesEveryPoolKeyAndTheNewestRows) {
  const int d = 3, P = 2, ring = 4, n = 11;
  const std::vector<float> k = memra::testing::randn(size_t(n) * d, 1);
  const std::vector<float> gate = memra::testing::randn(size_t(n) * d, 2);
  const std::vector<float> ape = memra::testing::randn(size_t(P) * d, 3);
  std::vector<float> tk(size_t(ring) * d), tg(size_t(ring) * d), keys(size_t(n / P) * d, 9.0f);
  MemraKpoolAppendParams p{};
  p.d = d;
  p.ape = ape.data();
  p.pool = P;
  p.tail_rows = ring;
  p.tail_k = tk.data();
  p.tail_gate = tg.data();
  p.pool_keys = keys.data();
  for (int pos : {0, 3, 4, 9}) {  // chunks [0, 3), [3, 4), [4, 9), [9, 11)
    p.pos = pos;
    p.n = (pos == 0 ? 3 : pos == 3 ? 1 : pos == 4 ? 5 : 2);
    p.k = k.data() + size_t(pos) * d;
    p.gate = gate.data() + size_t(pos) * d;
    ASSERT_TRUE(op::kpool_append(op::Backend{}, p).ok());
  }
  for (int q = 0; q < n / P; ++q) {
    std::vector<float> want(d);
    cpu::kpool_pool_key(k.data() + size_t(q) * P * d, gate.data() + size_t(q) * P * d, ape.data(),
                        P, d, want.data());
    EXPECT_EQ(std::vector<float>(keys.begin() + q * d, keys.begin() + (q + 1) * d), want) << q;
  }
  for (int r = n - ring; r < n; ++r) {
    EXPECT_EQ(std::vector<float>(tk.begin() + (r % ring) * d, tk.begin() + (r % ring + 1) * d),
              std::vector<float>(k.begin() + r * d, k.begin() + (r + 1) * d)) << r;
  }
  p.tail_rows = 3;  // not a multiple of the pool
  EXPECT_EQ(op::kpool_append(op::Backend{}, p).code, kContractPool);
}

TEST(OpDsa, BatchedFormsAndThePrologueAreCudaOnly) {
  MemraKpoolAppendParams ap{};
  ap.batched = 1;
  MemraKpoolScoreParams sp{};
  sp.batched = 1;
  MemraKpoolSelectParams sel{};
  sel.batched = 1;
  EXPECT_EQ(op::kpool_append(op::Backend{}, ap).code, kUnsupportedGeometry);
  EXPECT_EQ(op::kpool_score(op::Backend{}, sp).code, kUnsupportedGeometry);
  EXPECT_EQ(op::kpool_select(op::Backend{}, sel).code, kUnsupportedGeometry);
  sel.batched = 2;
  EXPECT_EQ(op::kpool_select(op::Backend{}, sel).code, kContractValue);
  EXPECT_EQ(op::mla_norm_append_decode(op::Backend{}, MemraMlaNormAppendParams{}).code,
            kUnsupportedGeometry);
}

}  // namespace
}  // namespace memra
