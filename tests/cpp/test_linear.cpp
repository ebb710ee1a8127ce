// cpu::linear against a double-precision loop written here, and op::linear's CPU branch against
// cpu::linear: every form of MemraLinearParams (a strided or 16-bit input, the pair, an empty
// sum) gives the bytes of the reference over the same values, and a bad field the CUDA entry's
// code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "memra/op/linear.h"
#include "memra/ops.h"
#include "test_util.h"

namespace memra {
namespace {

using memra::testing::randn;

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

MemraLinearParams gemm(const void* x, int x_dtype, int64_t ldx, int T, int K, const void* w,
                       int w_dtype, int N, const float* bias, float* y) {
  MemraLinearParams p = {};
  p.x = x;
  p.x_dtype = x_dtype;
  p.ldx = ldx;
  p.T = T;
  p.K = K;
  p.w = w;
  p.w_dtype = w_dtype;
  p.N = N;
  p.bias = bias;
  p.y = y;
  return p;
}

TEST(Linear, Bf16MatchesDoubleLoop) {
  const int T = 3, N = 5, K = 7;
  auto x = randn(T * K, 1);
  auto wf = randn(N * K, 2);
  std::vector<uint16_t> wb(N * K);
  for (int i = 0; i < N * K; ++i) wb[i] = f32_to_bf16(wf[i]);
  Weight w(DType::kBF16, {N, K}, wb.data());
  auto bias = randn(N, 3);
  std::vector<float> y(T * N);
  cpu::linear(x.data(), T, w, bias.data(), y.data());
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double acc = bias[n];
      for (int k = 0; k < K; ++k) acc += double(x[t * K + k]) * bf16_to_f32(wb[n * K + k]);
      EXPECT_NEAR(y[t * N + n], acc, 1e-5);
    }
}

TEST(OpLinear, PackedAndStridedRowsAreCpuLinear) {
  const int T = 3, N = 4, K = 6, L = 10, col = 3;
  auto x = randn(T * L, 50), wv = randn(N * K, 51), bias = randn(N, 52);
  const Weight w(DType::kF32, {N, K}, wv.data());
  std::vector<float> packed(T * K), ref(T * N), y(T * N);
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) packed[t * K + k] = x[t * L + col + k];
  cpu::linear(packed.data(), T, w, bias.data(), ref.data());
  ASSERT_TRUE(op::linear(op::Backend{}, gemm(packed.data(), 0, 0, T, K, wv.data(), 0, N,
                                             bias.data(), y.data())).ok());
  EXPECT_TRUE(same_bytes(y, ref));
  std::fill(y.begin(), y.end(), 0.0f);
  ASSERT_TRUE(op::linear(op::Backend{}, gemm(x.data() + col, 0, L, T, K, wv.data(), 0, N,
                                             bias.data(), y.data())).ok());
  EXPECT_TRUE(same_bytes(y, ref));
}

TEST(OpLinear, Bf16InputIsWidenedExactly) {
  const int T = 2, N = 3, K = 8;
  auto xf = randn(T * K, 53), wf = randn(N * K, 54);
  const auto xb = to_bf16(xf), wb = to_bf16(wf);
  std::vector<float> xw(T * K), ref(T * N), y(T * N);
  for (int i = 0; i < T * K; ++i) xw[i] = bf16_to_f32(xb[i]);
  cpu::linear(xw.data(), T, Weight(DType::kBF16, {N, K}, wb.data()), nullptr, ref.data());
  ASSERT_TRUE(op::linear(op::Backend{}, gemm(xb.data(), 1, K, T, K, wb.data(), 1, N, nullptr,
                                             y.data())).ok());
  EXPECT_TRUE(same_bytes(y, ref));
}

TEST(OpLinear, PairIsTwoCalls) {
  const int T = 2, N0 = 3, N1 = 5, K = 4, L = 9;
  auto x = randn(T * L, 55), w0 = randn(N0 * K, 56), w1 = randn(N1 * K, 57), b1 = randn(N1, 58);
  std::vector<float> y0(T * N0), y1(T * N1), r0(T * N0), r1(T * N1);
  ASSERT_TRUE(op::linear(op::Backend{}, gemm(x.data(), 0, L, T, K, w0.data(), 0, N0, nullptr,
                                             r0.data())).ok());
  ASSERT_TRUE(op::linear(op::Backend{}, gemm(x.data() + 5, 0, L, T, K, w1.data(), 0, N1, b1.data(),
                                             r1.data())).ok());
  MemraLinearParams p = gemm(x.data(), 0, L, T, K, w0.data(), 0, N0, nullptr, y0.data());
  p.pair = 1;
  p.x1 = x.data() + 5;
  p.w1 = w1.data();
  p.N1 = N1;
  p.bias1 = b1.data();
  p.y1 = y1.data();
  ASSERT_TRUE(op::linear(op::Backend{}, p).ok());
  EXPECT_TRUE(same_bytes(y0, r0));
  EXPECT_TRUE(same_bytes(y1, r1));
}

TEST(OpLinear, EmptySumIsTheBias) {
  const int T = 2, N = 3;
  const std::vector<float> bias = {1.5f, -2.0f, 0.25f};
  std::vector<float> y(T * N, 7.0f);
  ASSERT_TRUE(op::linear(op::Backend{}, gemm(nullptr, 0, 0, T, 0, nullptr, 1, N, bias.data(),
                                             y.data())).ok());
  EXPECT_EQ(y, (std::vector<float>{1.5f, -2.0f, 0.25f, 1.5f, -2.0f, 0.25f}));
}

TEST(OpLinear, RefusesLikeTheCudaEntry) {
  std::vector<float> x(8), w(8), y(8);
  auto code = [&](MemraLinearParams p) { return op::linear(op::Backend{}, p).code; };
  EXPECT_EQ(code(gemm(x.data(), 0, 0, -1, 4, w.data(), 0, 2, nullptr, y.data())), kContractValue);
  EXPECT_EQ(code(gemm(x.data(), 0, 0, 1, 4, w.data(), 3, 2, nullptr, y.data())), kContractDType);
  // A 16-bit x must be in w's dtype (an f32 x is the one that gets rounded).
  EXPECT_EQ(code(gemm(x.data(), 1, 0, 1, 4, w.data(), 0, 2, nullptr, y.data())), kContractDType);
  EXPECT_EQ(code(gemm(x.data(), 0, 3, 1, 4, w.data(), 0, 2, nullptr, y.data())), kContractStride);
  EXPECT_EQ(code(gemm(x.data(), 0, 0, 1, 4, nullptr, 0, 2, nullptr, y.data())), kContractMissing);
  EXPECT_EQ(code(gemm(x.data(), 0, 0, 1, 4, w.data(), 0, 2, nullptr, nullptr)), kContractMissing);
  EXPECT_EQ(code(gemm(nullptr, 0, 0, 0, 4, nullptr, 0, 2, nullptr, nullptr)), kOk);  // T == 0
  MemraLinearParams p = gemm(x.data(), 0, 0, 1, 4, w.data(), 0, 2, nullptr, y.data());
  p.pair = 1;
  p.N1 = 2;  // the second GEMM runs, and has no arrays
  EXPECT_EQ(code(p), kContractMissing);
  p.N1 = -1;
  EXPECT_EQ(code(p), kContractValue);
}

}  // namespace
}  // namespace memra
