// The layers' geometry arithmetic at absurd sizes: every size above kMaxLayerSize (2^20) is
// refused by name before any shape is computed, shapes of sizes up to the bound are computed in
// int64 (no wrapped, negative extents in the messages), an extent past int is refused by the
// WeightMap, and the Sinkhorn count has the same bound in the layer and in op::mhc.
#include <gtest/gtest.h>

#include <climits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "memra/layers.h"
#include "memra/op/mhc.h"

namespace memra {
namespace {

Weight zeros(std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(size_t(n), 0.0f);
  return Weight(DType::kF32, std::move(shape), v.data());
}

// A valid mHC site's weights for hc streams of `hidden`.
std::map<std::string, Weight> hc_weights(int hc, int hidden) {
  const int64_t mix = int64_t(2 + hc) * hc;
  return {{"fn", zeros({mix, int64_t(hc) * hidden})}, {"base", zeros({mix})}, {"scale", zeros({3})}};
}

bool has(const Status& st, const std::string& text) {
  return st.message.find(text) != std::string::npos;
}

TEST(LayerGeometry, SizeAboveTheBoundIsRefusedByName) {
  WeightMap w(hc_weights(2, 4), "HyperConnection");
  std::unique_ptr<HyperConnection> l;
  const Status st = HyperConnection::create(4, INT_MAX, 20, 1e-6f, 1e-6f, w, &l);
  EXPECT_EQ(st.code, kContractValue);
  EXPECT_TRUE(has(st, "HyperConnection: hc_mult must be at most 1048576 (2^20), got 2147483647")) << st.message;
}

TEST(LayerGeometry, MhcShapesAtTheBoundAreInt64) {
  // (2 + hc) * hc and hc * hidden at hc = hidden = 2^20: the products are exact, and an extent
  // past int is refused by the WeightMap instead of matched or wrapped.
  WeightMap w(hc_weights(2, 4), "HyperConnection");
  std::unique_ptr<HyperConnection> l;
  const Status st = HyperConnection::create(kMaxLayerSize, kMaxLayerSize, 20, 1e-6f, 1e-6f, w, &l);
  EXPECT_EQ(st.code, kContractValue);
  EXPECT_TRUE(has(st, "tensor 'fn' would have shape [1099513724928, 1099511627776]")) << st.message;
}

TEST(LayerGeometry, MlaQueryRowsAtTheBoundAreInt64) {
  // H * (d_nope + d_rope) = 2^20 * (2^20 + 2^20) = 2^41.
  MlaConfig c;
  c.hidden = 4;
  c.heads = kMaxLayerSize;
  c.kv_rank = 4;
  c.d_nope = kMaxLayerSize;
  c.d_rope = kMaxLayerSize;
  c.d_v = 4;
  WeightMap w({{"q_proj.weight", zeros({1, 4})}}, "MlaLayer");
  std::unique_ptr<MlaLayer> l;
  const Status st = MlaLayer::create(c, w, &l);
  EXPECT_EQ(st.code, kContractValue);
  EXPECT_TRUE(has(st, "tensor 'q_proj.weight' would have shape [2199023255552, 4]")) << st.message;
}

TEST(LayerGeometry, MlaSizeAboveTheBoundIsRefusedByName) {
  // The fuzzer's v_head_dim = 2^31 - 1, which made d_nope + d_v wrap in int.
  MlaConfig c;
  c.hidden = 64;
  c.heads = 4;
  c.q_lora_rank = 32;
  c.kv_rank = 32;
  c.d_nope = 16;
  c.d_v = INT_MAX;
  WeightMap w({}, "MlaLayer");
  std::unique_ptr<MlaLayer> l;
  const Status st = MlaLayer::create(c, w, &l);
  EXPECT_EQ(st.code, kContractValue);
  EXPECT_TRUE(has(st, "MlaLayer: d_v must be at most 1048576 (2^20), got 2147483647")) << st.message;
}

TEST(LayerGeometry, SinkhornItersBoundInTheLayer) {
  for (int iters : {op::kMaxSinkhornIters + 1, INT_MAX}) {
    WeightMap w(hc_weights(2, 4), "HyperConnection");
    std::unique_ptr<HyperConnection> l;
    const Status st = HyperConnection::create(4, 2, iters, 1e-6f, 1e-6f, w, &l);
    EXPECT_EQ(st.code, kContractValue);
    EXPECT_TRUE(has(st, "sinkhorn_iters must be in [1, 1000], got " + std::to_string(iters))) << st.message;
  }
  WeightMap w(hc_weights(2, 4), "HyperConnection");
  std::unique_ptr<HyperConnection> l;
  EXPECT_TRUE(HyperConnection::create(4, 2, op::kMaxSinkhornIters, 1e-6f, 1e-6f, w, &l).ok());
}

TEST(LayerGeometry, SinkhornItersBoundInTheOp) {
  const int T = 1, hc = 2, D = 4, mix = (2 + hc) * hc;
  std::vector<float> streams(T * hc * D, 1.0f), fn(size_t(mix) * hc * D, 0.0f), base(mix, 0.0f),
      scale(3, 1.0f), post(T * hc), comb(T * hc * hc), out(T * D);
  MemraMhcParams p = {};
  p.T = T;
  p.hc = hc;
  p.D = D;
  p.pre = 1;
  p.streams = streams.data();
  p.fn = fn.data();
  p.base = base.data();
  p.scale = scale.data();
  p.hc_eps = 1e-6f;
  p.norm_eps = 1e-6f;
  p.post = post.data();
  p.comb = comb.data();
  p.out = out.data();
  p.sinkhorn_iters = op::kMaxSinkhornIters;
  EXPECT_TRUE(op::mhc(op::Backend{}, p).ok());
  p.sinkhorn_iters = op::kMaxSinkhornIters + 1;
  const Status st = op::mhc(op::Backend{}, p);
  EXPECT_EQ(st.code, kContractValue);
  EXPECT_TRUE(has(st, "sinkhorn_iters must be <= 1000")) << st.message;
}

}  // namespace
}  // namespace memra
