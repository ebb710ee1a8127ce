// The mHC streams without a transcendental, the twins of cpu::mhc_post, cpu::hc_head_mean and
// cpu::hc_expand: the post-block expansion (the expand form of the mhc entry, cuda_abi/mhc.h),
// the final head mean and the residual streams from the embedding. They sum in the CPU's order
// without contraction: their outputs are bit-identical to the CPU's.
#include <cstdint>

#include "common.cuh"
#include "mhc.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::mhc::expand_quad;

namespace {

// out[t, j, d] = post[t, j] * y[t, d] + sum_i comb[t, i, j] * residual[t, i, d]. Block x walks
// d, block y walks the rows r = t * hc + j.
__global__ void mhc_post_kernel(const float* __restrict__ y, const float* __restrict__ post,
                                const float* __restrict__ comb, const float* __restrict__ residual,
                                int64_t rows, int hc, int D, float* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int d = blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t t = r / hc;
    const int j = static_cast<int>(r % hc);
    const float* ct = comb + t * hc * hc;
    const float* rt = residual + t * hc * D;
    float acc = 0.0f;
    for (int i = 0; i < hc; ++i) acc = __fadd_rn(acc, __fmul_rn(ct[i * hc + j], rt[int64_t(i) * D + d]));
    out[r * D + d] = __fadd_rn(__fmul_rn(post[r], y[t * D + d]), acc);
  }
}

// mhc_post_kernel's outputs at a compile-time hc (D % 4 == 0, 16-byte aligned rows): a thread
// owns four columns d..d+3 of token t = blockIdx.y and writes all HC output rows j of them, so
// each residual value is loaded once (HC float4 loads issued together, not hc dependent
// rounds a row) and the loads and stores are 16 bytes wide. Per element the same operations
// in the same order as mhc_post_kernel (acc over i ascending from 0, then post * y + acc): the
// same bytes. At decode with B rows (B * hc rows of D) this replaced a latency-bound grid of
// one column a thread.
template <int HC>
__global__ void mhc_post_quad_kernel(const float* __restrict__ y, const float* __restrict__ post,
                                     const float* __restrict__ comb,
                                     const float* __restrict__ residual, int D,
                                     float* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int d = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
  if (d >= D) return;
  const int64_t t = blockIdx.y;
  const float* rt = residual + t * HC * D + d;
  float4 r[HC];
#pragma unroll
  for (int i = 0; i < HC; ++i) r[i] = *reinterpret_cast<const float4*>(rt + int64_t(i) * D);
  const float4 yv = *reinterpret_cast<const float4*>(y + t * D + d);
  float c[HC][HC];
  float pj[HC];
#pragma unroll
  for (int i = 0; i < HC; ++i) {
    pj[i] = __ldg(post + t * HC + i);
#pragma unroll
    for (int j = 0; j < HC; ++j) c[i][j] = __ldg(comb + t * HC * HC + i * HC + j);
  }
#pragma unroll
  for (int j = 0; j < HC; ++j) {
    float cj[HC];
#pragma unroll
    for (int i = 0; i < HC; ++i) cj[i] = c[i][j];
    *reinterpret_cast<float4*>(out + (t * HC + j) * D + d) = expand_quad<HC>(r, cj, pj[j], yv);
  }
}

constexpr int kPostQuadThreads = 128;

// out[t, d] = (sum_s streams[t, s, d]) / hc.
__global__ void hc_head_mean_kernel(const float* __restrict__ streams, int64_t T, int hc, int D,
                                    float* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int d = blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const float* st = streams + t * hc * D;
    float acc = 0.0f;
    for (int s = 0; s < hc; ++s) acc += st[int64_t(s) * D + d];
    out[t * D + d] = acc / static_cast<float>(hc);
  }
}

// out[t, s, d] = x[t, d] for s < n: block (x, y) covers 256 columns of rows y, y + gridDim.y.
// One launch instead of n strided copies (n graph nodes at decode).
__global__ void hc_expand_kernel(const float* __restrict__ x, int64_t T, int D, int n,
                                 float* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int d = blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const float v = x[t * D + d];
    float* o = out + t * n * D + d;
    for (int s = 0; s < n; ++s) o[int64_t(s) * D] = v;
  }
}

dim3 rows_grid(int D, int64_t rows, int threads) {
  return dim3(ceil_div(D, threads), static_cast<unsigned>(rows < 65535 ? rows : 65535));
}

int threads_for(int D) { return D >= 256 ? 256 : (D >= 128 ? 128 : (D >= 64 ? 64 : 32)); }

}  // namespace

namespace memra::cuda::mhc {

int post_impl(MemraCudaCtx* ctx, const float* y, const float* post, const float* comb,
              const float* residual, int T, int hc, int D, float* out) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || hc < 0 || D < 0) return memra::kContractValue;
  const int64_t rows = static_cast<int64_t>(T) * hc;
  if (rows == 0 || D == 0) return memra::kOk;
  if (!y || !post || !comb || !residual || !out) return memra::kContractMissing;
  if (hc == 4 && D % 4 == 0 && T <= 65535 && memra::cuda::aligned16(y) &&
      memra::cuda::aligned16(residual) && memra::cuda::aligned16(out)) {
    const dim3 grid(ceil_div(D / 4, kPostQuadThreads), static_cast<unsigned>(T));
    memra::cuda::launch(ctx, true, mhc_post_quad_kernel<4>, grid, dim3(kPostQuadThreads), 0, y,
                        post, comb, residual, D, out);
    return launch_status();
  }
  const int threads = threads_for(D);
  memra::cuda::launch(ctx, true, mhc_post_kernel, dim3(rows_grid(D, rows, threads)), dim3(threads),
      0, y, post, comb, residual, rows, hc, D, out);
  return launch_status();
}


}  // namespace memra::cuda::mhc

extern "C" {

int memra_cuda_hc_head_mean(MemraCudaCtx* ctx, const float* streams, int T, int hc, int D,
                            float* out) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || hc < 1 || D < 0) return memra::kContractValue;
  if (T == 0 || D == 0) return memra::kOk;
  if (!streams || !out) return memra::kContractMissing;
  const int threads = threads_for(D);
  memra::cuda::launch(ctx, true, hc_head_mean_kernel, dim3(rows_grid(D, T, threads)), dim3(threads),
      0, streams, T, hc, D, out);
  return launch_status();
}

int memra_cuda_hc_expand(MemraCudaCtx* ctx, const float* x, int T, int D, int n, float* out) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || D < 0 || n < 0) return memra::kContractValue;
  if (T == 0 || D == 0 || n == 0) return memra::kOk;
  if (!x || !out) return memra::kContractMissing;
  const dim3 grid(ceil_div(D, 256), static_cast<unsigned>(T < 65535 ? T : 65535));
  memra::cuda::launch(ctx, true, hc_expand_kernel, grid, dim3(256), 0, x, T, D, n, out);
  return launch_status();
}

}  // extern "C"
