// sm_90 tensor memory accelerator and mbarrier helpers shared by the TMA kernels
// (mla_decode_sm90.cu, linear_skinny.cu): cta-scope mbarriers (init, arrive, transaction
// counts, parity waits), the 2-D tiled bulk load, and the host's cuTensorMapEncodeTiled reached
// through the runtime's driver entry point (no libcuda link). In an anonymous namespace, as the
// kernels that use them.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

// mbarrier in shared memory (cta scope): init with the number of arrivals a phase takes; wait
// until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// One arrival that also expects `bytes` more of transactions (the TMA loads completing on it).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Box (columns from col, rows from row: the map's box) of the tensor map at gmap into shared
// memory at dst, completing on the mbarrier bar; elements past the map's dims arrive as zeros.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* gmap, uint32_t bar, int col,
                                            int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(gmap), "r"(bar), "r"(col), "r"(row)
      : "memory");
}

// cuTensorMapEncodeTiled, or null where the driver does not provide it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace
