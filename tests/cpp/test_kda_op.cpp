// memra::op's KDA functions on the CPU backend (cpp/src/op/kda.cpp) against the memra::cpu
// reference ops they are built from (themselves tested in test_kda.cpp): what the op layer adds
// on the CPU is more than a forward (pointer tables with null entries, y's channel groups, the
// fused L2 norm and beta's sigmoid, the T == 0 ring pass-through, the CUDA-only fields refused),
// and each of those must give the reference's bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "memra/op/kda.h"
#include "memra/ops.h"
#include "memra/tensor.h"
#include "test_util.h"

namespace memra {
namespace {

using Vec = std::vector<float>;
using memra::testing::randn;

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

const op::Backend kCpu;  // the CPU reference backend
constexpr int kK = 4;

MemraKdaConvParams conv_params(const Vec& x, int n, int C, int G, const Vec& w, float* y) {
  MemraKdaConvParams p{};
  p.x = x.data();
  p.n = n;
  p.C = C;
  p.G = G;
  p.w = w.data();
  p.K = kK;
  p.y = y;
  return p;
}

// The scan's inputs over B sequences of T steps, H heads, scale 0.5; state and output unset.
MemraKdaScanParams scan_params(const Vec& q, const Vec& k, const Vec& v, const Vec& g,
                               const Vec& beta, int B, int T, int H, int dk, int dv) {
  MemraKdaScanParams p{};
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.g = g.data();
  p.beta = beta.data();
  p.B = B;
  p.T = T;
  p.H = H;
  p.dk = dk;
  p.dv = dv;
  p.scale = 0.5f;
  return p;
}

TEST(KdaOp, ConvGroupsAndL2NormEqualTheReferenceOps) {
  // KdaLayer's form: C = 3 groups of qkv = H * dk, q and k L2-normalised per head.
  const int T = 5, H = 2, dk = 4, qkv = H * dk, C = 3 * qkv;
  const Vec x = randn(size_t(T) * C, 1), w = randn(size_t(C) * kK, 2, 0.5f);
  const Vec ring = randn(size_t(C) * (kK - 1), 3);
  Vec y(size_t(T) * C), ring_out(ring.size());
  MemraKdaConvParams p = conv_params(x, T, C, qkv, w, y.data());
  p.ring.form = MEMRA_KDA_PLANES_DIRECT;
  p.ring.in = ring.data();
  p.ring.out = ring_out.data();
  p.l2_groups = 2;
  p.dk = dk;
  p.eps = 1e-6f;
  ASSERT_EQ(op::kda_conv(kCpu, p).code, kOk);

  Vec plain(size_t(T) * C), want_ring(ring.size()), want(size_t(T) * C);
  cpu::kda_conv_prefill(x.data(), T, C, w.data(), kK, ring.data(), want_ring.data(), plain.data());
  for (int g = 0; g < 3; ++g) {
    for (int t = 0; t < T; ++t) {
      std::memcpy(&want[(size_t(g) * T + t) * qkv], &plain[size_t(t) * C + g * qkv],
                  qkv * sizeof(float));
    }
  }
  cpu::l2norm_heads(want.data(), 2 * T, H, dk, 1e-6f);
  EXPECT_TRUE(same_bits(y.data(), want.data(), y.size()));
  EXPECT_TRUE(same_bits(ring_out.data(), want_ring.data(), ring.size()));
}

TEST(KdaOp, ConvTablesReadNullAsZerosAndSkipNullOutputs) {
  const int B = 3, C = 7, R = C * (kK - 1);
  const Vec x = randn(size_t(B) * C, 10), w = randn(size_t(C) * kK, 11, 0.5f);
  const Vec ring0 = randn(R, 12), ring2 = randn(R, 13), zeros(R, 0.0f);
  Vec out0(R), out1(R), out2(R, 7.0f), y(size_t(B) * C);
  const float* in[B] = {ring0.data(), nullptr, ring2.data()};
  float* out[B] = {out0.data(), out1.data(), nullptr};
  MemraKdaConvParams p = conv_params(x, B, C, C, w, y.data());
  p.ring.form = MEMRA_KDA_PLANES_TABLES;
  p.ring.in_table = in;
  p.ring.out_table = out;
  ASSERT_EQ(op::kda_conv(kCpu, p).code, kOk);
  const float* want_in[B] = {ring0.data(), zeros.data(), ring2.data()};
  for (int b = 0; b < B; ++b) {
    Vec wy(C), wr(R);
    cpu::kda_conv_decode(x.data() + b * C, C, w.data(), kK, want_in[b], wr.data(), wy.data());
    EXPECT_TRUE(same_bits(y.data() + b * C, wy.data(), C)) << b;
    if (out[b]) EXPECT_TRUE(same_bits(out[b], wr.data(), R)) << b;
  }
  for (float v : out2) EXPECT_EQ(v, 7.0f);  // the null entry's plane is not written
}

TEST(KdaOp, ConvZeroStepsPassTheRingThrough) {
  const int C = 5, R = C * (kK - 1);
  const Vec x, w = randn(size_t(C) * kK, 20), ring = randn(R, 21);
  Vec ring_out(R);
  MemraKdaConvParams p = conv_params(x, 0, C, C, w, nullptr);
  p.ring.form = MEMRA_KDA_PLANES_DIRECT;
  p.ring.in = ring.data();
  p.ring.out = ring_out.data();
  ASSERT_EQ(op::kda_conv(kCpu, p).code, kOk);
  EXPECT_TRUE(same_bits(ring_out.data(), ring.data(), R));
}

TEST(KdaOp, CudaOnlyFieldsAndBadValuesAreRefused) {
  const int C = 4;
  const Vec x = randn(C, 30), w = randn(size_t(C) * kK, 31);
  Vec y(C), r(size_t(C) * (kK - 1));
  MemraKdaConvParams p = conv_params(x, 1, C, C, w, y.data());
  p.ring.form = MEMRA_KDA_PLANES_SLOTS;
  EXPECT_EQ(op::kda_conv(kCpu, p).code, kUnsupportedGeometry);
  p.ring.form = MEMRA_KDA_PLANES_DIRECT;
  p.ring.out = r.data();
  p.pair.run = 1;
  EXPECT_EQ(op::kda_conv(kCpu, p).code, kUnsupportedGeometry);
  p.pair.run = 0;
  p.ring.form = 7;
  EXPECT_EQ(op::kda_conv(kCpu, p).code, kContractValue);
  p.ring.form = MEMRA_KDA_PLANES_DIRECT;
  p.K = 0;
  EXPECT_EQ(op::kda_conv(kCpu, p).code, kContractValue);
  p.K = kK;
  p.G = 3;  // C % G != 0
  EXPECT_EQ(op::kda_conv(kCpu, p).code, kContractShape);

  MemraKdaScanParams s{};
  s.B = s.T = s.H = 1;
  s.dk = s.dv = 4;
  s.state.form = MEMRA_KDA_PLANES_SLOTS;
  EXPECT_EQ(op::kda_scan(kCpu, s).code, kUnsupportedGeometry);
  s.state.form = MEMRA_KDA_PLANES_TABLES;
  s.fuse_gates = 1;
  EXPECT_EQ(op::kda_scan(kCpu, s).code, kUnsupportedGeometry);
  s.fuse_gates = 0;
  s.beta_ld = 3;  // a row stride of beta: the fused gates' (CUDA) only
  EXPECT_EQ(op::kda_scan(kCpu, s).code, kContractValue);
  s.beta_ld = 0;
  s.in_dtype = 2;  // q, k, v, g: 0 f32 or 1 bf16 only
  EXPECT_EQ(op::kda_scan(kCpu, s).code, kContractValue);
  s.in_dtype = 0;
  s.o_dtype = -1;
  EXPECT_EQ(op::kda_scan(kCpu, s).code, kContractValue);
  s.o_dtype = 0;
  s.state.form = MEMRA_KDA_PLANES_DIRECT;
  EXPECT_EQ(op::kda_scan(kCpu, s).code, kContractValue);

  MemraKdaGateParams g{};
  g.form = 2;
  EXPECT_EQ(op::kda_gate(kCpu, g).code, kContractValue);
}

TEST(KdaOp, GateWithBetaEqualsTheGateThenTheSigmoid) {
  const int T = 3, H = 2, dk = 5, D = H * dk;
  const Vec f = randn(size_t(T) * D, 40, 3.0f), dt_bias = randn(D, 41), A_log = randn(H, 42);
  const Vec logits = randn(size_t(T) * H, 43, 4.0f);
  Vec g(f.size()), beta = logits, want_g(f.size());
  const MemraKdaGateParams p{f.data(), dt_bias.data(), A_log.data(), T, H, dk, 1, -5.0f,
                             g.data(), beta.data(), int64_t(T) * H};
  ASSERT_EQ(op::kda_gate(kCpu, p).code, kOk);
  cpu::kda_gate(f.data(), dt_bias.data(), A_log.data(), T, H, dk, cpu::KdaGateForm::kSoftplus,
                -5.0f, want_g.data());
  EXPECT_TRUE(same_bits(g.data(), want_g.data(), g.size()));
  for (size_t i = 0; i < beta.size(); ++i) {
    EXPECT_EQ(beta[i], 1.0f / (1.0f + std::exp(-logits[i]))) << i;
  }
}

TEST(KdaOp, ScanTablesEqualEachSequenceAlone) {
  const int B = 2, T = 3, H = 2, dk = 4, dv = 3;
  const size_t qk = size_t(T) * H * dk, ov = size_t(T) * H * dv, plane = size_t(H) * dk * dv;
  const Vec q = randn(B * qk, 50, 0.5f), k = randn(B * qk, 51, 0.5f), v = randn(B * ov, 52);
  const Vec g = randn(B * qk, 53, 0.1f), beta = randn(size_t(B) * T * H, 54, 0.3f);
  const Vec state1 = randn(plane, 55);
  Vec o(B * ov), out0(plane);
  const float* in[B] = {nullptr, state1.data()};  // sequence 0 starts from zeros
  float* out[B] = {out0.data(), nullptr};          // sequence 1's state is not written
  MemraKdaScanParams p = scan_params(q, k, v, g, beta, B, T, H, dk, dv);
  p.state.form = MEMRA_KDA_PLANES_TABLES;
  p.state.in_table = in;
  p.state.out_table = out;
  p.o = o.data();
  ASSERT_EQ(op::kda_scan(kCpu, p).code, kOk);
  for (int b = 0; b < B; ++b) {
    Vec wo(ov), ws(plane);
    cpu::kda_scan(q.data() + b * qk, k.data() + b * qk, v.data() + b * ov, g.data() + b * qk,
                  beta.data() + size_t(b) * T * H, T, H, dk, dv, 0.5f, in[b], ws.data(), wo.data());
    EXPECT_TRUE(same_bits(o.data() + b * ov, wo.data(), ov)) << b;
    if (out[b]) EXPECT_TRUE(same_bits(out[b], ws.data(), plane)) << b;
  }
}

TEST(KdaOp, ScanBf16InputsAndOutputAreTheF32ScanWidenedAndRounded) {
  // bf16 q / k / v / g are widened exactly, so the scan equals the f32 one on the widened
  // values; a bf16 o is that o rounded to nearest even (f32_to_bf16).
  const int B = 2, T = 3, H = 2, dk = 4, dv = 3;
  const size_t qk = size_t(T) * H * dk, ov = size_t(T) * H * dv, plane = size_t(H) * dk * dv;
  Vec q = randn(B * qk, 70, 0.5f), k = randn(B * qk, 71, 0.5f), v = randn(B * ov, 72);
  Vec g = randn(B * qk, 73, 0.1f);
  const Vec beta = randn(size_t(B) * T * H, 74, 0.3f);
  std::vector<std::vector<uint16_t>> bits;
  for (Vec* x : {&q, &k, &v, &g}) {  // round to bf16; keep the bits and the widened values
    bits.emplace_back(x->size());
    for (size_t i = 0; i < x->size(); ++i) {
      bits.back()[i] = f32_to_bf16((*x)[i]);
      (*x)[i] = bf16_to_f32(bits.back()[i]);
    }
  }
  Vec o32(B * ov), s32(B * plane), s16(B * plane);
  std::vector<uint16_t> o16(B * ov);
  float* out32[B] = {s32.data(), s32.data() + plane};
  float* out16[B] = {s16.data(), s16.data() + plane};
  MemraKdaScanParams p = scan_params(q, k, v, g, beta, B, T, H, dk, dv);
  p.state.form = MEMRA_KDA_PLANES_TABLES;
  p.state.out_table = out32;
  p.o = o32.data();
  ASSERT_EQ(op::kda_scan(kCpu, p).code, kOk);
  p.q = bits[0].data();
  p.k = bits[1].data();
  p.v = bits[2].data();
  p.g = bits[3].data();
  p.in_dtype = 1;
  p.o_dtype = 1;
  p.o = o16.data();
  p.state.out_table = out16;
  ASSERT_EQ(op::kda_scan(kCpu, p).code, kOk);
  EXPECT_TRUE(same_bits(s16.data(), s32.data(), s32.size()));
  for (size_t i = 0; i < o32.size(); ++i) EXPECT_EQ(o16[i], f32_to_bf16(o32[i])) << i;
}

TEST(KdaOp, ScanStridedPlanesEqualTheTables) {
  // STRIDED: row b's planes at in / out + b * floats (a stride past the plane here), the bytes
  // of the TABLES form over the same planes; a stride shorter than a plane is refused.
  const int B = 3, T = 2, H = 2, dk = 4, dv = 3;
  const size_t qk = size_t(T) * H * dk, ov = size_t(T) * H * dv, plane = size_t(H) * dk * dv;
  const int64_t floats = int64_t(plane) + 5;
  const Vec q = randn(B * qk, 60, 0.5f), k = randn(B * qk, 61, 0.5f), v = randn(B * ov, 62);
  const Vec g = randn(B * qk, 63, 0.1f), beta = randn(size_t(B) * T * H, 64, 0.3f);
  const Vec states = randn(size_t(B) * floats, 65);
  Vec o_s(B * ov), o_t(B * ov), out_s(size_t(B) * floats, -7.0f), out_t(size_t(B) * floats, -7.0f);
  const float* in[B];
  float* out[B];
  for (int b = 0; b < B; ++b) {
    in[b] = states.data() + b * floats;
    out[b] = out_t.data() + b * floats;
  }
  MemraKdaScanParams p = scan_params(q, k, v, g, beta, B, T, H, dk, dv);
  p.state.form = MEMRA_KDA_PLANES_TABLES;
  p.state.in_table = in;
  p.state.out_table = out;
  p.o = o_t.data();
  ASSERT_EQ(op::kda_scan(kCpu, p).code, kOk);
  MemraKdaScanParams s = p;
  s.state = MemraKdaPlanes{};
  s.state.form = MEMRA_KDA_PLANES_STRIDED;
  s.state.in = states.data();
  s.state.out = out_s.data();
  s.state.floats = floats;
  s.o = o_s.data();
  ASSERT_EQ(op::kda_scan(kCpu, s).code, kOk);
  EXPECT_TRUE(same_bits(o_s.data(), o_t.data(), o_s.size()));
  EXPECT_TRUE(same_bits(out_s.data(), out_t.data(), out_s.size()));  // gaps untouched in both
  s.state.in = nullptr;  // zeros, as a null in table
  ASSERT_EQ(op::kda_scan(kCpu, s).code, kOk);
  for (int b = 0; b < B; ++b) in[b] = nullptr;
  p.state.in_table = nullptr;
  ASSERT_EQ(op::kda_scan(kCpu, p).code, kOk);
  EXPECT_TRUE(same_bits(out_s.data(), out_t.data(), out_s.size()));
  s.state.floats = int64_t(plane) - 1;
  EXPECT_EQ(op::kda_scan(kCpu, s).code, kContractValue);
}

}  // namespace
}  // namespace memra
