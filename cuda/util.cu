// Utility entry points (cpp/include/memra/cuda_abi/util.h): elementwise add and the mHC stream
// expansion the layers chain between ops.
#include <algorithm>

#include "common.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;

namespace {

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = a[i] + b[i];
  }
}

// out[t, s, d] = x[t, d] for s < n: block (x, y) covers 256 columns of rows y, y + gridDim.y.
// One launch where n strided copies took n graph nodes (~1 us each at decode).
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

}  // namespace

extern "C" {

int memra_cuda_add(MemraCudaCtx* ctx, const float* a, const float* b, int64_t n, float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (n <= 0) return memra::kOk;
  const unsigned blocks = std::min<unsigned>(ceil_div(n, 256), 4096u);
  memra::cuda::launch(ctx, true, add_kernel, dim3(blocks), dim3(256), 0, a, b, n, y);
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
