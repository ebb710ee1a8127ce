// The latent append (memra_cuda_mla_latent_append, cpp/include/memra/cuda_abi/mla.h): f32 latent
// rows into a latent cache of f32 or bf16 (round to nearest even), for one sequence (rows
// [start, start + n) of one cache) or batched (one row for each of n sequences through a device
// table of cache pointers and device positions, so a captured graph replays at any position).
#include <cstdint>
#include <algorithm>

#include "common.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::from_f32;
using memra::cuda::launch_status;

namespace {

template <typename Tc>
__global__ void latent_append_kernel(const float* __restrict__ rows, int64_t n,
                                     Tc* __restrict__ dst) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = from_f32<Tc>(rows[i]);
  }
}

// Block b: caches[b][pos[b], :] = rows[b, :] (pos < 0: nothing).
template <typename Tcache>
__global__ void append_decode_kernel(const float* __restrict__ rows, int W,
                                     void* const* __restrict__ caches,
                                     const int32_t* __restrict__ pos) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int b = blockIdx.x;
  const int p = pos[b];
  if (p < 0) return;
  Tcache* dst = static_cast<Tcache*>(caches[b]) + static_cast<int64_t>(p) * W;
  const float* src = rows + static_cast<int64_t>(b) * W;
  for (int w = threadIdx.x; w < W; w += blockDim.x) dst[w] = from_f32<Tcache>(src[w]);
}

int append_rows(MemraCudaCtx* ctx, const float* rows, int T, int W, void* cache, int cache_dtype,
                int start) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || W < 1 || start < 0) return memra::kContractValue;
  if (cache_dtype != 0 && cache_dtype != 1) return memra::kContractDType;
  if (T == 0) return memra::kOk;
  if (!rows || !cache) return memra::kContractMissing;
  const int64_t n = static_cast<int64_t>(T) * W;
  const int64_t off = static_cast<int64_t>(start) * W;
  const unsigned blocks = std::min<unsigned>(ceil_div(n, 256), 65535u * 8);
  if (cache_dtype == 0) {
    memra::cuda::launch(ctx, true, latent_append_kernel<float>, dim3(blocks), dim3(256), 0, rows, n,
        static_cast<float*>(cache) + off);
  } else {
    memra::cuda::launch(ctx, true, latent_append_kernel<__nv_bfloat16>, dim3(blocks), dim3(256), 0,
        rows, n, static_cast<__nv_bfloat16*>(cache) + off);
  }
  return launch_status();
}

int append_decode(MemraCudaCtx* ctx, const float* rows, int B, int W, void* const* caches,
                  int cache_dtype, const int32_t* pos) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (B < 0 || W < 1) return memra::kContractValue;
  if (cache_dtype != 0 && cache_dtype != 1) return memra::kContractDType;
  if (B == 0) return memra::kOk;
  if (!rows || !caches || !pos) return memra::kContractMissing;
  // A thread a value up to 1024: the latent row in one pass (with fewer threads each pass waits
  // for the previous one's store).
  const int threads = std::min(1024, ((W + 31) / 32) * 32);
  if (cache_dtype == 0) {
    memra::cuda::launch(ctx, true, append_decode_kernel<float>, dim3(B), dim3(threads), 0, rows, W,
        caches, pos);
  } else {
    memra::cuda::launch(ctx, true, append_decode_kernel<__nv_bfloat16>, dim3(B), dim3(threads), 0,
        rows, W, caches, pos);
  }
  return launch_status();
}

}  // namespace

extern "C" {

int memra_cuda_mla_latent_append(MemraCudaCtx* ctx, const MemraMlaAppendParams* p) {
  if (!p) return memra::kContractMissing;
  if (p->batched == 0) {
    return append_rows(ctx, p->rows, p->n, p->W, p->cache, p->cache_dtype, p->start);
  }
  if (p->batched == 1) {
    return append_decode(ctx, p->rows, p->n, p->W, p->caches, p->cache_dtype, p->pos);
  }
  return memra::kContractValue;
}

}  // extern "C"
