// Helpers of the layers' CUDA paths (host code calling the CUDA library through CudaApi): per-call
// scratch, pointer tables, and the GEMM call shapes over op::linear (linear; round_input +
// linear_in for inputs shared by several GEMMs or read as a column block). The GEMM helpers
// return the CUDA library's status code, for MEMRA_GPU to name with the layer's op.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memra/device.h"
#include "memra/op/linear.h"

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

// The scope of a layer call whose GEMMs read only the layer's own uploaded weights: inside it
// the decode GEMV may start streaming a weight before the previous kernel ends (resident_weights
// ABI, cuda/gemv.cu). A GEMM's weight is written only by its upload (DeviceWeight::upload_rows,
// behind upload / upload_stacked), which synchronises before the DeviceWeight exists, so no
// queued kernel writes it.
class ResidentWeights {
 public:
  explicit ResidentWeights(const CudaContext& c) : c_(c) {
    on_ = c.api().resident_weights(c.ctx(), 1) == kOk;
  }
  ~ResidentWeights() {
    if (on_) c_.api().resident_weights(c_.ctx(), -1);
  }
  ResidentWeights(const ResidentWeights&) = delete;
  ResidentWeights& operator=(const ResidentWeights&) = delete;

 private:
  const CudaContext& c_;
  bool on_ = false;
};

// y[T, w.rows] = x[T, w.cols] w^T (+ bias).
inline int linear(const CudaContext& c, const float* x, int T, const DeviceWeight& w,
                  const float* bias, float* y) {
  MemraLinearParams p = {};
  p.x = x;
  p.T = T;
  p.K = static_cast<int>(w.cols);
  p.w = w.data();
  p.w_dtype = w.dtype_code();
  p.N = static_cast<int>(w.rows);
  p.bias = bias;
  p.y = y;
  return op::linear(op::Backend{&c}, p).code;
}

inline const float* f32p(const DeviceWeight& w) { return static_cast<const float*>(w.data()); }

// A GEMM input in the compute dtype: rows `ld` elements apart. Several GEMMs of one activation
// share one rounding of it (round_input) instead of each rounding it again (linear).
struct Rounded {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t ld = 0;
  // The same rows starting at column `col` (a column block of a fused projection's output).
  Rounded cols_from(int64_t col) const {
    return Rounded{static_cast<const char*>(data) + col * int64_t(dtype_size(dtype)), dtype, ld};
  }
};

// x [N, K] f32 (C-contiguous) as a GEMM input of compute dtype `dtype`: f32 is x itself (no
// launch); bf16 is x rounded (RNE, the rounding linear applies) into `a`'s scratch, one launch,
// except at N <= MEMRA_GEMV_MAX_ROWS, where x stays f32 and each GEMM rounds it on the fly
// (the same values: linear rounds an f32 x against a bf16 weight).
inline Status round_input(const CudaContext& c, Arena& a, const float* x, int64_t N, int64_t K,
                          DType dtype, Rounded* out, const char* op) {
  *out = Rounded{x, DType::kF32, K};
  // f32 weights read x as it is; decode-sized inputs are rounded inside the GEMV.
  if (dtype == DType::kF32 || (dtype == DType::kBF16 && N <= MEMRA_GEMV_MAX_ROWS)) {
    return Status::Ok();
  }
  if (dtype != DType::kBF16) {
    return Status(kContractDType, std::string(op) + ": GEMM inputs are rounded to bfloat16 only");
  }
  uint16_t* h = nullptr;
  MEMRA_TRY(a.take(N * K, &h));
  const int rc = c.api().convert(c.ctx(), x, static_cast<int>(DType::kF32), h,
                                 static_cast<int>(dtype), N * K);
  if (rc != kOk) return c.status(rc, op);
  *out = Rounded{h, dtype, K};
  return Status::Ok();
}

// y[N, w.rows] = x[N, w.cols] w^T (+ bias) over a rounded input (no rounding when x is in w's
// dtype; an f32 x against a bf16 w is rounded as linear does).
inline int linear_in(const CudaContext& c, const Rounded& x, int N, const DeviceWeight& w,
                     const float* bias, float* y) {
  MemraLinearParams p = {};
  p.x = x.data;
  p.x_dtype = static_cast<int>(x.dtype);
  p.ldx = x.ld;
  p.T = N;
  p.K = static_cast<int>(w.cols);
  p.w = w.data();
  p.w_dtype = w.dtype_code();
  p.N = static_cast<int>(w.rows);
  p.bias = bias;
  p.y = y;
  return op::linear(op::Backend{&c}, p).code;
}

// linear_in(x0, w0 -> y0) and linear_in(x1, w1 -> y1): one launch at a decode row when both take
// the decode GEMV (MemraLinearParams::pair), else the two calls.
inline int linear_in_pair(const CudaContext& c, const Rounded& x0, const Rounded& x1, int N,
                          const DeviceWeight& w0, const DeviceWeight& w1, float* y0, float* y1) {
  if (x0.dtype != x1.dtype || x0.ld != x1.ld || w0.cols != w1.cols ||
      w0.dtype_code() != w1.dtype_code()) {
    const int rc = linear_in(c, x0, N, w0, nullptr, y0);
    return rc != kOk ? rc : linear_in(c, x1, N, w1, nullptr, y1);
  }
  MemraLinearParams p = {};
  p.x = x0.data;
  p.x_dtype = static_cast<int>(x0.dtype);
  p.ldx = x0.ld;
  p.T = N;
  p.K = static_cast<int>(w0.cols);
  p.w = w0.data();
  p.w_dtype = w0.dtype_code();
  p.N = static_cast<int>(w0.rows);
  p.y = y0;
  p.pair = 1;
  p.x1 = x1.data;
  p.w1 = w1.data();
  p.N1 = static_cast<int>(w1.rows);
  p.y1 = y1;
  return op::linear(op::Backend{&c}, p).code;
}

}  // namespace memra::gpu
