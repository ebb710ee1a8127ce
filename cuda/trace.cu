// The trace build's recorder (common.cuh trace_wait_return; CMake MEMRA_TRACE=ON): a device
// buffer of TraceRec that every kernel's block 0 appends to when its pdl_wait returns. Not part
// of the ABI the engine loads: benchmarks/trace_model_step.py calls these through ctypes. In a
// build without MEMRA_TRACE both return kUnsupported (50000).
#include <cstdint>

#include "common.cuh"

using memra::cuda::status_of;

#if MEMRA_TRACE
namespace memra::cuda {
__device__ TraceRec* g_trace = nullptr;
__device__ unsigned g_trace_cap = 0;
__device__ unsigned g_trace_n = 0;
}  // namespace memra::cuda
#endif

extern "C" {

// Starts recording up to cap records (16 bytes each) on the current device.
int memra_cuda_trace_begin(unsigned cap) {
#if MEMRA_TRACE
  using memra::cuda::TraceRec;
  TraceRec* buf = nullptr;
  MEMRA_CUDA_RETURN_IF(status_of(cudaMalloc(&buf, sizeof(TraceRec) * cap)));
  const unsigned zero = 0;
  using memra::cuda::g_trace;
  using memra::cuda::g_trace_cap;
  using memra::cuda::g_trace_n;
  MEMRA_CUDA_RETURN_IF(status_of(cudaMemcpyToSymbol(g_trace_n, &zero, sizeof zero)));
  MEMRA_CUDA_RETURN_IF(status_of(cudaMemcpyToSymbol(g_trace_cap, &cap, sizeof cap)));
  MEMRA_CUDA_RETURN_IF(status_of(cudaMemcpyToSymbol(g_trace, &buf, sizeof buf)));
  return memra::kOk;
#else
  (void)cap;
  return memra::kUnsupported;
#endif
}

// Waits for the device, stops recording and copies the records (t_ns u64, blocks u32, threads
// u32 each) to host [cap]; *n gets how many were recorded (may exceed cap: the rest dropped).
int memra_cuda_trace_end(void* host, unsigned cap, unsigned* n) {
#if MEMRA_TRACE
  using memra::cuda::TraceRec;
  MEMRA_CUDA_RETURN_IF(status_of(cudaDeviceSynchronize()));
  TraceRec* buf = nullptr;
  using memra::cuda::g_trace;
  using memra::cuda::g_trace_n;
  MEMRA_CUDA_RETURN_IF(status_of(cudaMemcpyFromSymbol(&buf, g_trace, sizeof buf)));
  MEMRA_CUDA_RETURN_IF(status_of(cudaMemcpyFromSymbol(n, g_trace_n, sizeof *n)));
  TraceRec* none = nullptr;
  MEMRA_CUDA_RETURN_IF(status_of(cudaMemcpyToSymbol(g_trace, &none, sizeof none)));
  const unsigned k = *n < cap ? *n : cap;
  if (buf && k) {
    MEMRA_CUDA_RETURN_IF(
        status_of(cudaMemcpy(host, buf, sizeof(TraceRec) * k, cudaMemcpyDeviceToHost)));
  }
  if (buf) cudaFree(buf);
  return memra::kOk;
#else
  (void)host;
  (void)cap;
  *n = 0;
  return memra::kUnsupported;
#endif
}

}  // extern "C"
