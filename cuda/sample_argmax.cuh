// The block argmax of the sampling kernels: greedy rows (cuda/sample_greedy.cu) and the rows
// without a distribution (cuda/sample.cu's keys kernel) pick the token as cpu::sample's argmax.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "common.cuh"

// An anonymous namespace, as in the kernels' own files: ArgBest is a parameter type of the greedy
// kernels, and each file keeps its own copy of these helpers.
namespace {

struct ArgBest {
  float v;
  int i;  // INT_MAX: none
};

__device__ __forceinline__ bool better(const ArgBest& a, const ArgBest& b) {
  if (a.i == INT_MAX) return false;
  if (b.i == INT_MAX) return true;
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

// The best entry of v[lo, hi) (the largest non-NaN value, the lowest id among equal ones;
// {-inf, INT_MAX} when every entry is NaN or the range is empty). Call with the whole block; the
// result is valid in every thread. `red` holds blockDim.x / 32 ArgBest. *nonfinite (in every
// thread) = 1 when some entry of v[lo, hi) is NaN or +-inf, else 0 (cuda_abi/sample.h's flag:
// one predicate per loaded entry, OR-reduced by the block's first barrier).
__device__ ArgBest block_best(const float* __restrict__ v, int lo, int hi, ArgBest* red,
                              int* nonfinite) {
  ArgBest b{-INFINITY, INT_MAX};
  int bad = 0;  // this thread saw a NaN or +-inf
  // Each thread visits its ids in ascending order, so a strict > keeps the lowest of equal values.
  int rest = lo;
  if ((lo & 3) == 0 && (reinterpret_cast<uintptr_t>(v) & 15) == 0) {
    const float4* v4 = reinterpret_cast<const float4*>(v);
    const int end4 = hi >> 2;
    for (int j = (lo >> 2) + threadIdx.x; j < end4; j += blockDim.x) {
      const float4 q = v4[j];
      const float x[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        bad |= !isfinite(x[k]);
        if (!isnan(x[k]) && (b.i == INT_MAX || x[k] > b.v)) b = ArgBest{x[k], 4 * j + k};
      }
    }
    rest = end4 > (lo >> 2) ? 4 * end4 : lo;
  }
  for (int i = rest + threadIdx.x; i < hi; i += blockDim.x) {
    const float x = v[i];
    bad |= !isfinite(x);
    if (!isnan(x) && (b.i == INT_MAX || x > b.v)) b = ArgBest{x, i};
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const ArgBest c{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
    if (better(c, b)) b = c;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = b;
  *nonfinite = __syncthreads_or(bad) ? 1 : 0;  // the barrier that publishes red, OR-reducing bad
  ArgBest r = red[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
    if (better(red[w], r)) r = red[w];
  }
  __syncthreads();  // red may be reused at once
  return r;
}

// cpu argmax over v[0, V) (best = 0; v[i] > v[best] takes i): index 0 when v[0] is NaN, otherwise
// the lowest index of the largest non-NaN value. Call with the whole block; the result is valid
// in every thread. `red` holds blockDim.x / 32 ArgBest; *nonfinite as block_best's.
__device__ int block_argmax(const float* __restrict__ v, int V, ArgBest* red, int* nonfinite) {
  const ArgBest r = block_best(v, 0, V, red, nonfinite);
  if (isnan(v[0]) || r.i == INT_MAX) return 0;
  return r.i;
}

}  // namespace

namespace memra::cuda {

// memra_cuda_sample's greedy rows (temperature <= 0): out [B] = each row's argmax of logits
// [B, V] (B >= 1, V >= 1, pointers checked by the entry); nonfinite [B] (or null: not written)
// = 1 where the row holds a NaN or +-inf, else 0.
int sample_greedy(MemraCudaCtx* ctx, const float* logits, int B, int V, int32_t* out,
                  int32_t* nonfinite);

}  // namespace memra::cuda
