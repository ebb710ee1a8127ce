// Helpers shared by the C++ tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace memra::testing {

// n normal samples N(0, scale^2) from a fixed seed (inputs are never zeros: zeros hide unwritten
// outputs and wrong indexing).
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

}  // namespace memra::testing
