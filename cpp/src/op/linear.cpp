// memra::op for the linear family: the one CPU / CUDA choice (op/backend.h). The CPU branch
// checks MemraLinearParams as the CUDA entry does (cuda/linear.cu: value, dtype, stride, then a
// missing array of a GEMM that runs) and runs cpu::linear.
#include "memra/op/linear.h"

#include <algorithm>
#include <string>
#include <vector>

#include "memra/cpu/linear.h"

namespace memra::op {

namespace {

Status refuse(int code, const char* what) { return Status(code, std::string("linear: ") + what); }

// One GEMM of the family on the CPU: y [T, N] = x [T, K] (row stride ldx, x_dtype) w [N, K]^T
// (+ bias).
void gemm(const void* x, int x_dtype, int64_t ldx, int T, int K, const void* w, int w_dtype,
          int N, const float* bias, float* y) {
  if (K == 0) {  // an empty sum, as cpu::linear adds it (w may be null here)
    for (int64_t t = 0; t < T; ++t) {
      for (int n = 0; n < N; ++n) y[t * N + n] = bias ? 0.0f + bias[n] : 0.0f;
    }
    return;
  }
  const WeightView wv = host_view(w, w_dtype, N, K);
  if (x_dtype == 0 && ldx == K) {
    cpu::linear(static_cast<const float*>(x), T, wv, bias, y);
    return;
  }
  // Rows widened to f32 (exact for bf16 / f16) and packed.
  const WeightView xv = host_view(x, x_dtype, T, ldx);
  std::vector<float> xs(static_cast<size_t>(T) * K);
  for (int64_t t = 0; t < T; ++t) xv.read_f32(t, 0, K, xs.data() + t * K);
  cpu::linear(xs.data(), T, wv, bias, y);
}

}  // namespace

Status linear(const Backend& b, const MemraLinearParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().linear(b.cuda->ctx(), &p), "linear");
  const int N1 = p.pair ? p.N1 : 0;
  if (p.T < 0 || p.K < 0 || p.N < 0 || N1 < 0) {
    return refuse(kContractValue, "T, K, N, N1 must be >= 0");
  }
  if (p.w_dtype < 0 || p.w_dtype > 2 || p.x_dtype < 0 || p.x_dtype > 2) {
    return refuse(kContractDType, "dtype codes are 0 f32, 1 bf16, 2 f16");
  }
  if (p.x_dtype != p.w_dtype && p.x_dtype != 0) {
    return refuse(kContractDType, "x must be f32 or in w's dtype");
  }
  const int64_t ldx = p.ldx != 0 ? p.ldx : p.K;
  if (ldx < p.K || ldx > 0x7fffffffLL) return refuse(kContractStride, "ldx must be in [K, 2^31)");
  if (p.T == 0) return Status::Ok();
  const bool run0 = p.N > 0, run1 = N1 > 0;
  if ((run0 && (!p.y || (p.K > 0 && (!p.x || !p.w)))) ||
      (run1 && (!p.y1 || (p.K > 0 && (!p.x1 || !p.w1))))) {
    return refuse(kContractMissing, "x, w and y are required for a GEMM that runs");
  }
  if (run0) gemm(p.x, p.x_dtype, ldx, p.T, p.K, p.w, p.w_dtype, p.N, p.bias, p.y);
  if (run1) gemm(p.x1, p.x_dtype, ldx, p.T, p.K, p.w1, p.w_dtype, N1, p.bias1, p.y1);
  return Status::Ok();
}

}  // namespace memra::op
