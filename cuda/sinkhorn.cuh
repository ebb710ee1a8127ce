// The mHC Sinkhorn of one token's comb at a compile-time hc, by one warp (cuda/mhc_pre.cu,
// mhc_site.cu), and the deferred form of it that a later launch runs (MemraCudaCtx::pending,
// KernelOptions::mhc_defer).
#pragma once

#include "common.cuh"

namespace memra::cuda {

// Sinkhorn of sinkhorn_warp at a compile-time hc (HC * HC <= 32): the gathers of a row / column
// are independent shuffles, added in ascending order as in the generic loop (same bits).
template <int HC>
__device__ __forceinline__ void sinkhorn_warp_fixed(float* c, int iters, float hc_eps, int lane) {
  const bool own = lane < HC * HC;
  const int i = own ? lane / HC : 0, j = own ? lane % HC : 0;
  float v = own ? c[lane] : 1.0f;  // not 0: a zero dividend takes the IEEE division's slow path
  for (int h = 0; h < 2 * iters - 1; ++h) {
    const bool col = (h & 1) == 0;
    float g[HC];
#pragma unroll
    for (int r = 0; r < HC; ++r) g[r] = __shfl_sync(0xffffffffu, v, col ? r * HC + j : i * HC + r);
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < HC; ++r) s += g[r];
    v = v / (s + hc_eps);
  }
  if (own) c[lane] = v;
}

// A deferred Sinkhorn (SinkTask, common.cuh) run by warp 0 of the calling block, in place over
// the softmaxed rows the site kernel stored; a programmatic dependent, so it waits first.
__device__ __forceinline__ void run_sink_task(const SinkTask& t) {
  pdl_wait();
  pdl_trigger();
  if (threadIdx.x < 32) sinkhorn_warp_fixed<kSinkHc>(t.comb, t.iters, t.eps, threadIdx.x);
}

}  // namespace memra::cuda
