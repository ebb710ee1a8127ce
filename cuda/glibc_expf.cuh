// glibc's expf, bit for bit, on the device: the CPU oracle computes std::exp with glibc (the
// x86-64 FMA build), and the sampler and the attention softmax must reproduce its roundings to
// give the CPU's tokens / bytes. Checked bit-identical to glibc 2.36 on every float in
// (-110, 90) (tests/test_cuda_sample.py, tests/test_cuda_mla.py hold the consequences).
#pragma once

#include <cstdint>

namespace memra::cuda {

// 2^(i/32) as doubles, minus i << 47 (glibc's __exp2f_data.tab, regenerated: correctly rounded
// 2^(i/32) with the exponent adjustment removed).
static __device__ const uint64_t kExp2Tab[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull};

// exp(x) rounded as glibc's expf: x * 32/ln2 = k + r, exp(x) = 2^(k/32) * poly(r) in double with
// the FMAs of glibc's x86-64 FMA build, then one rounding to float.
__device__ __forceinline__ float glibc_expf(float x) {
  constexpr double kInvLn2N = 0x1.71547652b82fep+0 * 32;
  constexpr double kC0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32;
  constexpr double kC1 = 0x1.ebfce50fac4f3p-3 / 32 / 32;
  constexpr double kC2 = 0x1.62e42ff0c52d6p-1 / 32;
  const uint32_t ux = __float_as_uint(x);
  const uint32_t abstop = (ux >> 20) & 0x7ffu;
  if (abstop >= 0x42bu) {  // |x| >= 88, inf or NaN
    if (ux == 0xff800000u) return 0.0f;          // -inf
    if (abstop >= 0x7f8u) return x + x;          // +inf, NaN
    if (x > 0x1.62e42ep6f) return INFINITY;      // overflow
    if (x < -0x1.9fe368p6f) return 0.0f;         // underflow
  }
  const double xd = static_cast<double>(x);
  const double z = __dmul_rn(kInvLn2N, xd);
  const double kd = rint(z);
  const uint64_t ki = static_cast<uint64_t>(static_cast<int64_t>(kd));
  const double r = __fma_rn(kInvLn2N, xd, -kd);
  uint64_t t = kExp2Tab[ki % 32];
  t += ki << 47;
  const double s = __longlong_as_double(static_cast<long long>(t));
  const double zz = __fma_rn(kC0, r, kC1);
  const double r2 = __dmul_rn(r, r);
  double y = __fma_rn(kC2, r, 1.0);
  y = __fma_rn(zz, r2, y);
  y = __dmul_rn(y, s);
  return __double2float_rn(y);
}

}  // namespace memra::cuda
