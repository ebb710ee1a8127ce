// memra::op for the decode graph's bookkeeping (CUDA only; op/graph_tables.h).
#include "memra/op/graph_tables.h"

#include <string>

namespace memra::op {

namespace {

Status cuda_only(const char* op) {
  return Status(kUnsupported, std::string(op) + ": a CUDA engine's decode bookkeeping (the CPU "
                                                "cache commits on the host)");
}

}  // namespace

Status commit_decode(const Backend& b, const int32_t* slots, int B, int32_t* lengths,
                     int32_t* cur) {
  if (!b.on_cuda()) return cuda_only("commit_decode");
  return cuda_status(b, b.cuda->api().commit_decode(b.cuda->ctx(), slots, B, lengths, cur),
                     "commit_decode");
}

Status decode_tables(const Backend& b, const MemraDecodeTablesParams& p) {
  if (!b.on_cuda()) return cuda_only("decode_tables");
  return cuda_status(b, b.cuda->api().decode_tables(b.cuda->ctx(), &p), "decode_tables");
}

}  // namespace memra::op
