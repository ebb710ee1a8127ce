#include "memra/engine.h"

#include <dlfcn.h>

#include <string>

namespace memra {

namespace {

// Directory of the shared object this code is linked into (the extension module), where the
// CUDA library is installed beside it.
std::string own_directory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || !info.dli_fname) return ".";
  std::string path(info.dli_fname);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

struct CudaLibrary {
  void* handle = nullptr;
  std::string error;
  int (*device_count)(int*) = nullptr;
  const char* (*error_string)(int) = nullptr;
};

const CudaLibrary& cuda_library() {
  static const CudaLibrary lib = [] {
    CudaLibrary l;
#ifdef MEMRA_CUDA_LIBRARY_NAME
    const std::string path = own_directory() + "/" + MEMRA_CUDA_LIBRARY_NAME;
    l.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!l.handle) {
      const char* e = dlerror();
      l.error = "the CUDA library could not be loaded from " + path + ": " + (e ? e : "unknown error");
      return l;
    }
    l.device_count = reinterpret_cast<int (*)(int*)>(dlsym(l.handle, "memra_cuda_device_count"));
    l.error_string = reinterpret_cast<const char* (*)(int)>(dlsym(l.handle, "memra_cuda_error_string"));
    if (!l.device_count || !l.error_string) l.error = "the CUDA library at " + path + " lacks its entry points";
#else
    l.error = "memra was built without the CUDA backend (MEMRA_CUDA=OFF or no nvcc at build time)";
#endif
    return l;
  }();
  return lib;
}

}  // namespace

Status cuda_probe(std::string* reason, int* device_count) {
  *device_count = 0;
  const CudaLibrary& lib = cuda_library();
  if (!lib.error.empty()) {
    *reason = lib.error;
    return Status(kUnsupportedNoCuda, *reason);
  }
  const int rc = lib.device_count(device_count);
  if (rc != kOk) {
    *reason = "cudaGetDeviceCount failed: " + std::string(lib.error_string(rc - kCudaBase)) +
              " (code " + std::to_string(rc) + ")";
    return Status(rc, *reason);
  }
  if (*device_count == 0) {
    *reason = "no CUDA device is visible to this process";
    return Status(kUnsupportedNoCuda, *reason);
  }
  reason->clear();
  return Status::Ok();
}

Status Engine::create(const std::string& device, int device_index, std::unique_ptr<Engine>* out) {
  std::unique_ptr<Engine> e(new Engine());
  if (device == "cpu") {
    e->kind_ = DeviceKind::kCpu;
  } else if (device == "cuda") {
    std::string reason;
    int count = 0;
    const Status st = cuda_probe(&reason, &count);
    if (!st.ok()) {
      return Status(kUnsupportedNoCuda, "Engine(device='cuda'): CUDA is not available: " + reason);
    }
    if (device_index < 0 || device_index >= count) {
      return Status(kContractRange, "Engine(device='cuda'): device_index " + std::to_string(device_index) +
                                        " is outside [0, " + std::to_string(count) + ")");
    }
    // The CUDA backend's ops are a separate library; until they are built into it, a CUDA engine
    // is refused by name rather than silently falling back to the CPU.
    return Status(kUnsupported, "Engine(device='cuda'): the CUDA backend's ops are not available "
                                "in this build; use device='cpu'");
  } else {
    return Status(kContractValue, "Engine: unknown device '" + device + "' (expected 'cpu' or 'cuda')");
  }
  e->index_ = device_index;
  *out = std::move(e);
  return Status::Ok();
}

}  // namespace memra
