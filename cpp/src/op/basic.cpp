// memra::op for the basic area: the one CPU / CUDA choice per op (op/backend.h).
#include "memra/op/basic.h"

#include <algorithm>
#include <vector>

#include "memra/ops.h"

namespace memra::op {

Status embedding(const Backend& b, const MemraEmbeddingParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().embedding(b.cuda->ctx(), &p), "embedding");
  if (p.T < 0 || p.D < 0 || p.vocab < 0 || p.hc < 1) {
    return Status(kContractValue, "embedding: T, D, vocab must be >= 0 and hc >= 1");
  }
  const WeightView table = host_view(p.table, p.table_dtype, p.vocab, p.D);
  const int64_t D = p.D;
  if (p.hc == 1) {
    cpu::embedding(table, p.ids, p.T, p.out);
    return Status::Ok();
  }
  std::vector<float> rows(static_cast<size_t>(p.T) * D);
  cpu::embedding(table, p.ids, p.T, rows.data());
  for (int64_t t = 0; t < p.T; ++t) {
    for (int j = 0; j < p.hc; ++j) {
      std::copy(rows.data() + t * D, rows.data() + (t + 1) * D, p.out + (t * p.hc + j) * D);
    }
  }
  return Status::Ok();
}

}  // namespace memra::op
