#include "memra/engine.h"

#include <string>

namespace memra {

Status cuda_probe(std::string* reason, int* device_count) {
  *device_count = 0;
  const CudaLibrary& lib = cuda_library();
  if (!lib.handle || !lib.device_count) {
    *reason = lib.error;
    return Status(kUnsupportedNoCuda, *reason);
  }
  const int rc = lib.device_count(device_count);
  if (rc != kOk) {
    // The runtime's words for a machine without a driver (35) or a GPU (100) name neither plainly.
    const int cuda_rc = rc - kCudaBase;
    const std::string what =
        cuda_rc == 35 ? "no NVIDIA driver, or one older than the CUDA 13 runtime memra was built with, "
                        "is installed; "
        : cuda_rc == 100 ? "no CUDA-capable GPU was found; "
                         : "";
    *reason = what + "cudaGetDeviceCount failed: " + std::string(lib.error_string(cuda_rc)) +
              " (code " + std::to_string(rc) + ")";
    return Status(rc, *reason);
  }
  if (*device_count == 0) {
    *reason = "no CUDA device is visible to this process";
    return Status(kUnsupportedNoCuda, *reason);
  }
  if (!lib.error.empty()) {  // the library loads and sees a device but lacks ops
    *reason = lib.error;
    return Status(kUnsupportedNoCuda, *reason);
  }
  reason->clear();
  return Status::Ok();
}

Status Engine::create(const std::string& device, int device_index, const KernelOptions& options,
                      std::unique_ptr<Engine>* out) {
  MEMRA_TRY(options.validate());
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  if (device == "cpu") {
    if (device_index != 0) {
      return Status(kContractRange, "Engine(device='cpu'): device_index must be 0, got " +
                                        std::to_string(device_index));
    }
    e->kind_ = DeviceKind::kCpu;
  } else if (device == "cuda") {
    std::string reason;
    int count = 0;
    const Status st = cuda_probe(&reason, &count);
    if (!st.ok()) {
      return Status(kUnsupportedNoCuda, "Engine(device='cuda', device_index=" + std::to_string(device_index) +
                                            "): CUDA is not available: " + reason);
    }
    if (device_index < 0 || device_index >= count) {
      return Status(kContractRange, "Engine(device='cuda', device_index=" + std::to_string(device_index) +
                                        "): device_index " + std::to_string(device_index) +
                                        " is outside [0, " + std::to_string(count) + ")");
    }
    e->kind_ = DeviceKind::kCuda;
    MEMRA_TRY(CudaContext::create(device_index, options, &e->cuda_));
  } else {
    return Status(kContractValue, "Engine: unknown device '" + device + "' (expected 'cpu' or 'cuda')");
  }
  e->index_ = device_index;
  *out = std::move(e);
  return Status::Ok();
}

}  // namespace memra
