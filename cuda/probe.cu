// C-ABI entry points of the CUDA library that the extension module resolves with dlsym.
// Each returns a status in memra's bands (0 ok, 10000 + cudaError_t).


#include "common.cuh"

extern "C" {

// Number of CUDA devices visible to this process, or the CUDA error that prevented counting
// (10035 = driver too old / absent, 10100 = no device).
int memra_cuda_device_count(int* count) {
  *count = 0;
  cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return memra::kCudaBase + static_cast<int>(err);
  }
  return memra::kOk;
}

// Human-readable name of a CUDA error code (for messages built on the host side).
const char* memra_cuda_error_string(int cuda_error) {
  return cudaGetErrorString(static_cast<cudaError_t>(cuda_error));
}

// Name of device `index` into `buf` (NUL-terminated, at most `len` bytes).
int memra_cuda_device_name(int index, char* buf, int len) {
  cudaDeviceProp prop;
  cudaError_t err = cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) return memra::kCudaBase + static_cast<int>(err);
  int i = 0;
  for (; i + 1 < len && prop.name[i]; ++i) buf[i] = prop.name[i];
  if (len > 0) buf[i] = '\0';
  return memra::kOk;
}

}  // extern "C"
