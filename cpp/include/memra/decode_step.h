// What a captured decode step reads and how it is replayed (docs/decode_graphs.md):
//   DecodeSlots: a decode batch's slot ids on the device at a fixed address, validated on the host
//                when set (so device-driven layers never see an out-of-range or repeated slot);
//   CudaGraph:   one instantiated CUDA graph of an engine's stream, replayed with launch().
#pragma once

#include <memory>
#include <vector>

#include "memra/cache.h"
#include "memra/device.h"
#include "memra/status.h"

namespace memra {

class DecodeSlots {
 public:
  // `size` rows (>= 1) for a CUDA cache; all rows idle (-1) until set. kUnsupported on a CPU cache.
  static Status create(const Cache& cache, int size, std::unique_ptr<DecodeSlots>* out);
  // Rows [0, n) take slots [n] (distinct, in [0, max_batch)); rows [n, size) become idle (-1).
  // Checked first (kContractShape / kContractRange / kContractValue; nothing changes on a
  // refusal), then one asynchronous upload on the cache's stream (not allowed while capturing).
  Status set(const int32_t* slots, int n);
  const int32_t* data() const { return static_cast<const int32_t*>(buf_->data()); }
  int size() const { return static_cast<int>(host_.size()); }
  int active() const { return active_; }
  // The host copy: rows [0, size), -1 for idle rows.
  const std::vector<int32_t>& host() const { return host_; }
  const Cache* cache() const { return cache_; }

 private:
  DecodeSlots() = default;
  const Cache* cache_ = nullptr;
  std::shared_ptr<DeviceBuffer> buf_;
  std::vector<int32_t> host_;
  int active_ = 0;
};

class CudaGraph {
 public:
  // Start capturing the context's stream (every op enqueued until end() is recorded instead of
  // run); kContractValue when a capture is already running.
  static Status begin(const std::shared_ptr<CudaContext>& cuda);
  // Finish the capture begun on `cuda` and instantiate it.
  static Status end(const std::shared_ptr<CudaContext>& cuda, std::unique_ptr<CudaGraph>* out);
  // Discard a running capture (after an op failed inside it); the stream is usable again.
  static Status abort(const std::shared_ptr<CudaContext>& cuda);
  static bool capturing(const std::shared_ptr<CudaContext>& cuda);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  // Replay on the context's stream (asynchronous).
  Status launch() const;

 private:
  CudaGraph() = default;
  std::shared_ptr<CudaContext> cuda_;
  void* exec_ = nullptr;
};

}  // namespace memra
