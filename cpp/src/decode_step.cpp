// DecodeSlots and CudaGraph (decode_step.h).
#include "memra/decode_step.h"

#include <algorithm>
#include <set>
#include <string>

namespace memra {

Status DecodeSlots::create(const Cache& cache, int size, std::unique_ptr<DecodeSlots>* out) {
  if (!cache.on_device()) {
    return Status(kUnsupported, "DecodeSlots: device slot rows need a CUDA cache (the CPU backend "
                                "decodes from host slots)");
  }
  if (size < 1) {
    return Status(kContractShape, "DecodeSlots: size must be >= 1, got " + std::to_string(size));
  }
  std::unique_ptr<DecodeSlots> d(new DecodeSlots());
  d->cache_ = &cache;
  d->host_.assign(size_t(size), -1);
  MEMRA_TRY(DeviceBuffer::create(cache.cuda(), size_t(size) * sizeof(int32_t), &d->buf_));
  const auto& c = *cache.cuda();
  const int rc = c.api().copy(c.ctx(), d->buf_->data(), d->host_.data(), d->host_.size() * sizeof(int32_t));
  if (rc != kOk) return c.status(rc, "DecodeSlots");
  *out = std::move(d);
  return Status::Ok();
}

Status DecodeSlots::set(const int32_t* slots, int n) {
  const char* op = "DecodeSlots.set";
  if (n < 0 || n > size()) {
    return Status(kContractShape, std::string(op) + ": " + std::to_string(n) + " slots for " +
                                      std::to_string(size()) + " rows");
  }
  std::set<int32_t> seen;
  for (int b = 0; b < n; ++b) {
    MEMRA_TRY(cache_->check_slot(slots[b], op));
    if (!seen.insert(slots[b]).second) {
      return Status(kContractValue, std::string(op) + ": slot " + std::to_string(slots[b]) +
                                        " appears twice in one decode step");
    }
  }
  std::vector<int32_t> rows(host_.size(), -1);
  std::copy(slots, slots + n, rows.begin());
  if (rows != host_) {
    const auto& c = *cache_->cuda();
    const int rc = c.api().copy(c.ctx(), buf_->data(), rows.data(), rows.size() * sizeof(int32_t));
    if (rc != kOk) return c.status(rc, op);
    host_ = std::move(rows);
  }
  active_ = n;
  return Status::Ok();
}

Status CudaGraph::begin(const std::shared_ptr<CudaContext>& cuda) {
  const int rc = cuda->api().graph_begin(cuda->ctx());
  if (rc == kContractValue) return Status(rc, "CudaGraph.begin: a capture is already running");
  return rc == kOk ? Status::Ok() : cuda->status(rc, "CudaGraph.begin");
}

Status CudaGraph::end(const std::shared_ptr<CudaContext>& cuda, std::unique_ptr<CudaGraph>* out) {
  void* exec = nullptr;
  const int rc = cuda->api().graph_end(cuda->ctx(), &exec);
  if (rc == kContractValue) return Status(rc, "CudaGraph.end: no capture is running");
  if (rc != kOk) return cuda->status(rc, "CudaGraph.end");
  std::unique_ptr<CudaGraph> g(new CudaGraph());
  g->cuda_ = cuda;
  g->exec_ = exec;
  *out = std::move(g);
  return Status::Ok();
}

Status CudaGraph::abort(const std::shared_ptr<CudaContext>& cuda) {
  const int rc = cuda->api().graph_abort(cuda->ctx());
  if (rc == kContractValue) return Status(rc, "CudaGraph.abort: no capture is running");
  return rc == kOk ? Status::Ok() : cuda->status(rc, "CudaGraph.abort");
}

bool CudaGraph::capturing(const std::shared_ptr<CudaContext>& cuda) {
  int on = 0;
  cuda->api().capturing(cuda->ctx(), &on);
  return on != 0;
}

CudaGraph::~CudaGraph() {
  if (exec_) cuda_->api().graph_destroy(cuda_->ctx(), exec_);
}

Status CudaGraph::launch() const {
  const int rc = cuda_->api().graph_launch(cuda_->ctx(), exec_);
  return rc == kOk ? Status::Ok() : cuda_->status(rc, "CudaGraph.launch");
}

}  // namespace memra
