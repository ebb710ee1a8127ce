// memra::op for the MLP area: the one CPU / CUDA choice per op (op/backend.h).
#include "memra/op/mlp.h"

#include <string>

#include "memra/ops.h"

namespace memra::op {

Status swiglu_mlp(const Backend& b, const MemraMlpParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().swiglu_mlp(b.cuda->ctx(), &p), "swiglu_mlp");
  // The CUDA entry's checks, in its order.
  if (p.T < 0 || p.D < 0 || p.I < 0) {
    return Status(kContractValue, "swiglu_mlp: T, D and I must be >= 0, got T=" +
                                      std::to_string(p.T) + ", D=" + std::to_string(p.D) +
                                      ", I=" + std::to_string(p.I));
  }
  if (p.w_dtype < 0 || p.w_dtype > 2) {
    return Status(kContractDType, "swiglu_mlp: unknown weight dtype code " + std::to_string(p.w_dtype));
  }
  if (!(p.limit > 0.0f)) {
    return Status(kContractValue, "swiglu_mlp: limit must be > 0, got " + std::to_string(p.limit));
  }
  if (p.T == 0 || p.D == 0) return Status::Ok();
  if (!p.x || !p.y || (p.I > 0 && (!p.gate_w || !p.up_w || !p.down_w))) {
    return Status(kContractMissing, "swiglu_mlp: x, y and the weights must not be null");
  }
  cpu::swiglu_mlp(p.x, p.T, host_view(p.gate_w, p.w_dtype, p.I, p.D),
                  host_view(p.up_w, p.w_dtype, p.I, p.D), host_view(p.down_w, p.w_dtype, p.D, p.I),
                  p.limit, p.y);
  if (p.add) {
    const int64_t n = int64_t(p.T) * p.D;
    for (int64_t i = 0; i < n; ++i) p.y[i] += p.add[i];
  }
  return Status::Ok();
}

}  // namespace memra::op
