// The CUDA side of the runtime as seen from memra_core (no CUDA types): the CUDA library's entry
// points (CudaApi, resolved once by dlsym), a context per CUDA engine, device buffers and device
// weights. Everything a device allocation needs to free itself holds the context alive, so an
// array or weight may outlive the Engine object that made it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memra/cuda_api.h"
#include "memra/options.h"
#include "memra/status.h"
#include "memra/tensor.h"

namespace memra {

// The CUDA library (loaded once per process). `error` is empty when every entry point resolved.
struct CudaLibrary {
  void* handle = nullptr;
  std::string error;
  CudaApi api;
  int (*device_count)(int*) = nullptr;
  const char* (*error_string)(int) = nullptr;
};
const CudaLibrary& cuda_library();

// A CUDA context (stream, cuBLAS handles, memory pool) on one device, with the kernel options
// its ops run with (validated by the caller; the CUDA library checks them again).
class CudaContext {
 public:
  static Status create(int device, const KernelOptions& options, std::shared_ptr<CudaContext>* out);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  const CudaApi& api() const { return *api_; }
  MemraCudaCtx* ctx() const { return ctx_; }
  int device() const { return device_; }
  const KernelOptions& options() const { return options_; }
  // rc (a CUDA-library status) as a Status whose message names `op` and the CUDA error.
  Status status(int rc, const std::string& op) const;

 private:
  CudaContext() = default;
  const CudaApi* api_ = nullptr;
  MemraCudaCtx* ctx_ = nullptr;
  int device_ = 0;
  KernelOptions options_;
};

// One stream-ordered device allocation, released on the context's stream when destroyed.
class DeviceBuffer {
 public:
  static Status create(std::shared_ptr<CudaContext> ctx, size_t bytes, std::shared_ptr<DeviceBuffer>* out);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  const std::shared_ptr<CudaContext>& context() const { return ctx_; }

 private:
  DeviceBuffer() = default;
  std::shared_ptr<CudaContext> ctx_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A weight on the device, converted once at load to f32 or bf16.
// Shape conventions as Weight: [rows, cols] with rows = product of the leading dims.
struct DeviceWeight {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t rows = 0, cols = 0;
  std::shared_ptr<DeviceBuffer> buffer;
  size_t offset = 0;  // bytes into buffer (a row view of a fused weight)

  const void* data() const {
    return buffer ? static_cast<const char*>(buffer->data()) + offset : nullptr;
  }
  // Rows [row0, row0 + n) of a 2-D weight as a weight of its own, sharing the buffer.
  DeviceWeight row_view(int64_t row0, int64_t n) const {
    DeviceWeight v = *this;
    v.offset = offset + size_t(row0 * cols) * dtype_size(dtype);
    v.rows = n;
    v.shape = {n, cols};
    return v;
  }
  int dtype_code() const { return static_cast<int>(dtype); }
  int64_t numel() const { return rows * cols; }
  std::string shape_str() const;

  // Upload `w` converted to `target` (kF32 or kBF16). Conversion happens on the device.
  static Status upload(const std::shared_ptr<CudaContext>& ctx, const Weight& w, DType target,
                       DeviceWeight* out);
  // Upload several weights of one shape stacked as [n, rows, cols] (MoE experts).
  static Status upload_stacked(const std::shared_ptr<CudaContext>& ctx,
                               const std::vector<const Weight*>& ws, DType target, DeviceWeight* out);
  // Upload weights of one column count concatenated along rows as one [sum of rows, cols] weight
  // (fused projections of one input: row block i is ws[i], converted to `target` as upload does;
  // the file dtypes may differ). ContractError 40000 when the column counts differ.
  static Status upload_rows(const std::shared_ptr<CudaContext>& ctx,
                            const std::vector<const Weight*>& ws, DType target, DeviceWeight* out);
  // Upload a host f32 vector as an f32 device weight of shape [n].
  static Status upload_f32(const std::shared_ptr<CudaContext>& ctx, const std::vector<float>& v,
                           DeviceWeight* out);
};

}  // namespace memra
