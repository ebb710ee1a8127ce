// Engine: owns one device. On the CPU it is the reference backend;
// a CUDA engine loads the CUDA library (libmemra_cuda.so, built when MEMRA_CUDA is on) on first
// use and owns a CUDA context (stream, cuBLAS handles, memory pool), so a process without a
// driver can still import memra and use the CPU.
#pragma once

#include <memory>
#include <string>

#include "memra/device.h"
#include "memra/options.h"
#include "memra/status.h"

namespace memra {

enum class DeviceKind : int { kCpu = 0, kCuda = 1 };

// Whether a usable CUDA device is reachable from this process. On failure `reason` says why
// (not built with CUDA, library missing, driver absent, no device) and the status carries the
// band code (50001 when not built / missing, 10000 + cudaError_t from the driver probe).
Status cuda_probe(std::string* reason, int* device_count);

class Engine {
 public:
  // device: "cpu" or "cuda"; device_index selects the GPU; options: the CUDA kernels' arms
  // (kept, and ignored, by a CPU engine). kUnsupportedNoCuda when a CUDA engine cannot be made
  // here, kContractValue for an unknown device string or options out of their domain,
  // kContractRange for a bad index.
  static Status create(const std::string& device, int device_index, const KernelOptions& options,
                       std::unique_ptr<Engine>* out);
  DeviceKind kind() const { return kind_; }
  bool is_cuda() const { return kind_ == DeviceKind::kCuda; }
  int device_index() const { return index_; }
  std::string device() const { return kind_ == DeviceKind::kCpu ? "cpu" : "cuda:" + std::to_string(index_); }
  // The CUDA context (nullptr for a CPU engine).
  const std::shared_ptr<CudaContext>& cuda() const { return cuda_; }
  const KernelOptions& options() const { return options_; }

 private:
  Engine() = default;
  DeviceKind kind_ = DeviceKind::kCpu;
  int index_ = 0;
  KernelOptions options_;
  std::shared_ptr<CudaContext> cuda_;
};

}  // namespace memra
