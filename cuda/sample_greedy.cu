// Greedy rows of the CUDA sampler (cuda_abi/sample.h `sample` with temperature <= 0): the CPU's
// argmax (ties to the lower id; a NaN never wins unless it sits at id 0). One block per row up to
// V = 8192; above it each row is split over 2048-id blocks whose partial bests one warp per row
// combines. With a non-null nonfinite [B] the same launches also write the row's flag
// (cuda_abi/sample.h): each block ORs `!isfinite` of the entries it loads for its argmax.
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
    greedy_kernel(const float* __restrict__ logits, int V, int32_t* __restrict__ out,
                  int32_t* __restrict__ nonfinite) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ ArgBest red[kThreads / 32];
  const int64_t b = blockIdx.x;
  int bad;
  const int best = block_argmax(logits + b * V, V, red, &bad);
  if (threadIdx.x == 0) {
    out[b] = best;
    if (nonfinite) nonfinite[b] = bad;
  }
}

// Greedy over a large vocabulary at a few rows: one block per row streams V floats with one
// block's worth of loads in flight; split, block (s, b) finds the best of
// its kGreedyChunk ids of row b and one warp per row combines the partials (better() is
// associative and commutative, so the split gives the same id as the single block). With
// flags (non-null), block (s, b) also writes whether its ids held a NaN or +-inf to
// flags[b S + s], which the final kernel ORs into nonfinite[b].
constexpr int kGreedyChunk = 2048;
constexpr int kGreedyThreads = 256;

__global__ void __launch_bounds__(kGreedyThreads)
    greedy_partial_kernel(const float* __restrict__ logits, int V, ArgBest* __restrict__ part,
                          int* __restrict__ flags) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ ArgBest red[kGreedyThreads / 32];
  const int s = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int lo = s * kGreedyChunk;
  const int hi = V - lo < kGreedyChunk ? V : lo + kGreedyChunk;
  int bad;
  const ArgBest r = block_best(logits + b * V, lo, hi, red, &bad);
  if (threadIdx.x == 0) {
    part[b * gridDim.x + s] = r;
    if (flags) flags[b * gridDim.x + s] = bad;
  }
}

__global__ void greedy_final_kernel(const float* __restrict__ logits, int V,
                                    const ArgBest* __restrict__ part,
                                    const int* __restrict__ flags, int S,
                                    int32_t* __restrict__ out, int32_t* __restrict__ nonfinite) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x;
  ArgBest r{-INFINITY, INT_MAX};
  int bad = 0;
  for (int s = lane; s < S; s += 32) {
    if (better(part[b * S + s], r)) r = part[b * S + s];
    if (flags) bad |= flags[b * S + s];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const ArgBest c{__shfl_xor_sync(0xffffffffu, r.v, o), __shfl_xor_sync(0xffffffffu, r.i, o)};
    if (better(c, r)) r = c;
  }
  if (nonfinite) bad = __any_sync(0xffffffffu, bad);  // uniform branch: all 32 lanes
  if (lane == 0) {
    out[b] = (isnan(logits[b * V]) || r.i == INT_MAX) ? 0 : r.i;
    if (nonfinite) nonfinite[b] = bad ? 1 : 0;
  }
}

}  // namespace

namespace memra::cuda {

int sample_greedy(MemraCudaCtx* ctx, const float* logits, int B, int V, int32_t* out,
                  int32_t* nonfinite) {
  if (V <= 4 * kGreedyChunk) {
    memra::cuda::launch(ctx, true, greedy_kernel, dim3(B), dim3(kThreads), 0, logits, V, out,
        nonfinite);
    return launch_status();
  }
  if (B > 65535) return memra::kUnsupportedGeometry;  // grid.y of the partial pass
  const int S = static_cast<int>(ceil_div(V, kGreedyChunk));
  const size_t parts = static_cast<size_t>(S) * B;
  // The partial bests, then (with nonfinite) the partial flags [B, S] int.
  Scratch part(ctx, sizeof(ArgBest) * parts + (nonfinite ? sizeof(int) * parts : 0));
  MEMRA_CUDA_RETURN_IF(part.status());
  int* flags = nonfinite ? reinterpret_cast<int*>(part.as<ArgBest>() + parts) : nullptr;
  memra::cuda::launch(ctx, true, greedy_partial_kernel, dim3(dim3(S, B)), dim3(kGreedyThreads), 0,
      logits, V, part.as<ArgBest>(), flags);
  MEMRA_CUDA_RETURN_IF(launch_status());
  memra::cuda::launch(ctx, true, greedy_final_kernel, dim3(B), dim3(32), 0, logits, V,
      static_cast<const ArgBest*>(part.as<ArgBest>()), static_cast<const int*>(flags), S, out,
      nonfinite);
  return launch_status();
}

}  // namespace memra::cuda
