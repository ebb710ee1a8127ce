// Greedy rows of the CUDA sampler (cuda_abi/sample.h `sample` with temperature <= 0): the CPU's
// argmax (ties to the lower id; a NaN never wins unless it sits at id 0). One block per row up to
// V = 8192; above it each row is split over 2048-id blocks whose partial bests one warp per row
// combines.
#include <climits>
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "sample_argmax.cuh"

using memra::cuda::ceil_div;
using memra::cuda::launch_status;
using memra::cuda::Scratch;

namespace {

constexpr int kThreads = 512;  // threads per row block

__global__ void __launch_bounds__(kThreads)
    greedy_kernel(const float* __restrict__ logits, int V, int32_t* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ ArgBest red[kThreads / 32];
  const int64_t b = blockIdx.x;
  const int best = block_argmax(logits + b * V, V, red);
  if (threadIdx.x == 0) out[b] = best;
}

// Greedy over a large vocabulary at a few rows: one block per row streams V floats with one
// block's worth of loads in flight; split, block (s, b) finds the best of
// its kGreedyChunk ids of row b and one warp per row combines the partials (better() is
// associative and commutative, so the split gives the same id as the single block).
constexpr int kGreedyChunk = 2048;
constexpr int kGreedyThreads = 256;

__global__ void __launch_bounds__(kGreedyThreads)
    greedy_partial_kernel(const float* __restrict__ logits, int V, ArgBest* __restrict__ part) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ ArgBest red[kGreedyThreads / 32];
  const int s = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int lo = s * kGreedyChunk;
  const int hi = V - lo < kGreedyChunk ? V : lo + kGreedyChunk;
  const ArgBest r = block_best(logits + b * V, lo, hi, red);
  if (threadIdx.x == 0) part[b * gridDim.x + s] = r;
}

__global__ void greedy_final_kernel(const float* __restrict__ logits, int V,
                                    const ArgBest* __restrict__ part, int S,
                                    int32_t* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x;
  ArgBest r{-INFINITY, INT_MAX};
  for (int s = lane; s < S; s += 32) {
    if (better(part[b * S + s], r)) r = part[b * S + s];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const ArgBest c{__shfl_xor_sync(0xffffffffu, r.v, o), __shfl_xor_sync(0xffffffffu, r.i, o)};
    if (better(c, r)) r = c;
  }
  if (lane == 0) out[b] = (isnan(logits[b * V]) || r.i == INT_MAX) ? 0 : r.i;
}

}  // namespace

namespace memra::cuda {

int sample_greedy(MemraCudaCtx* ctx, const float* logits, int B, int V, int32_t* out) {
  if (V <= 4 * kGreedyChunk) {
    memra::cuda::launch(ctx, true, greedy_kernel, dim3(B), dim3(kThreads), 0, logits, V, out);
    return launch_status();
  }
  const int S = static_cast<int>(ceil_div(V, kGreedyChunk));
  Scratch part(ctx, sizeof(ArgBest) * static_cast<size_t>(S) * B);
  MEMRA_CUDA_RETURN_IF(part.status());
  memra::cuda::launch(ctx, true, greedy_partial_kernel, dim3(dim3(S, B)), dim3(kGreedyThreads), 0,
      logits, V, part.as<ArgBest>());
  MEMRA_CUDA_RETURN_IF(launch_status());
  memra::cuda::launch(ctx, true, greedy_final_kernel, dim3(B), dim3(32), 0, logits, V,
      part.as<ArgBest>(), S, out);
  return launch_status();
}

}  // namespace memra::cuda
