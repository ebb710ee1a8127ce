// Helpers of the layers' CUDA paths (host code calling the CUDA library through CudaApi): per-call
// scratch, pointer tables, and the GEMM call shape.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "memra/device.h"

// Return the named Status of a failed CUDA-library call.
#define MEMRA_GPU(cuda, expr, op)                         \
  do {                                                    \
    const int _memra_rc = (expr);                         \
    if (_memra_rc != ::memra::kOk) return (cuda).status(_memra_rc, op); \
  } while (0)

namespace memra::gpu {

// Device scratch for one layer call, released stream-ordered when the Arena dies (the pool keeps
// the memory, so steady-state calls do not reach cudaMalloc).
class Arena {
 public:
  explicit Arena(std::shared_ptr<CudaContext> cuda) : cuda_(std::move(cuda)) {}
  template <typename T>
  Status take(int64_t n, T** out) {
    std::shared_ptr<DeviceBuffer> b;
    MEMRA_TRY(DeviceBuffer::create(cuda_, size_t(n > 0 ? n : 1) * sizeof(T), &b));
    *out = static_cast<T*>(b->data());
    bufs_.push_back(std::move(b));
    return Status::Ok();
  }
  // A device copy of a host table (pointer tables, small index arrays).
  template <typename T>
  Status upload(const std::vector<T>& host, T** out) {
    MEMRA_TRY(take(int64_t(host.size()), out));
    const int rc = cuda_->api().copy(cuda_->ctx(), *out, host.data(), host.size() * sizeof(T));
    return rc == kOk ? Status::Ok() : cuda_->status(rc, "upload");
  }

 private:
  std::shared_ptr<CudaContext> cuda_;
  std::vector<std::shared_ptr<DeviceBuffer>> bufs_;
};

// y[T, w.rows] = x[T, w.cols] w^T (+ bias).
inline int linear(const CudaContext& c, const float* x, int T, const DeviceWeight& w,
                  const float* bias, float* y) {
  return c.api().linear(c.ctx(), x, T, static_cast<int>(w.cols), w.data(), w.dtype_code(),
                        static_cast<int>(w.rows), bias, y);
}

inline const float* f32p(const DeviceWeight& w) { return static_cast<const float*>(w.data()); }

}  // namespace memra::gpu
