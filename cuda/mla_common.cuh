// Host helpers shared by the MLA area's sources (cuda/mla_*.cu): device attributes and the
// dynamic shared-memory opt-in of a kernel.
#pragma once

#include "common.cuh"

namespace memra::cuda::mla {

inline int device_attr(MemraCudaCtx* ctx, cudaDeviceAttr attr, int* out) {
  return status_of(cudaDeviceGetAttribute(out, attr, ctx->device));
}

inline int smem_optin(MemraCudaCtx* ctx, int* out) {
  return device_attr(ctx, cudaDevAttrMaxSharedMemoryPerBlockOptin, out);
}

// Allow `bytes` of dynamic shared memory for `kernel` (opt-in above 48 KiB); 50002 when the
// device cannot give that much to one block.
template <typename K>
int allow_smem(MemraCudaCtx* ctx, K* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return memra::kOk;
  int optin = 0;
  MEMRA_CUDA_RETURN_IF(smem_optin(ctx, &optin));
  if (bytes > static_cast<size_t>(optin)) return memra::kUnsupportedGeometry;
  return status_of(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
}

}  // namespace memra::cuda::mla
