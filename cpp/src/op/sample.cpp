// memra::op for the sampling area: the one CPU / CUDA choice per op (op/backend.h).
#include "memra/op/sample.h"

#include <cmath>
#include <string>

#include "memra/ops.h"

namespace memra::op {

Status sample(const Backend& b, const MemraSampleParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().sample(b.cuda->ctx(), &p), "sample");
  // The CUDA entry's checks, in its order.
  if (p.B < 0 || p.V < 0) {
    return Status(kContractValue, "sample: B and V must be >= 0, got B=" + std::to_string(p.B) +
                                      ", V=" + std::to_string(p.V));
  }
  if (p.B == 0) return Status::Ok();
  if (p.V < 1) return Status(kContractValue, "sample: logits must have at least one column");
  if (std::isnan(p.temperature)) return Status(kContractValue, "sample: temperature is NaN");
  if (!(p.top_p > 0.0f)) {
    return Status(kContractValue, "sample: top_p must be > 0, got " + std::to_string(p.top_p));
  }
  if (!p.logits || !p.out) return Status(kContractMissing, "sample: logits and out must not be null");
  if (p.temperature > 0.0f && !p.counters) {
    return Status(kContractMissing, "sample: counters are required unless greedy");
  }
  if (!p.seeds) {
    cpu::sample(p.logits, p.B, p.V, p.temperature, p.top_k, p.top_p, p.seed, p.counters, p.out,
                p.nonfinite);
    return Status::Ok();
  }
  // One row at a time with its own seed (cpu::sample takes one seed per call).
  for (int64_t r = 0; r < p.B; ++r) {
    cpu::sample(p.logits + r * p.V, 1, p.V, p.temperature, p.top_k, p.top_p, p.seeds[r],
                p.counters ? p.counters + r : nullptr, p.out + r,
                p.nonfinite ? p.nonfinite + r : nullptr);
  }
  return Status::Ok();
}

}  // namespace memra::op
