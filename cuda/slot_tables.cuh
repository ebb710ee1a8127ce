// The MLA decode step's per-row positions and plane tables (memra_cuda_decode_tables in
// cuda/graph_tables.cu, and the MLA decode prologue of cuda/mla_prologue.cu, which writes the
// same entries inside its norm launch): row b of slot s = slots[b] (s < 0: an idle row) gets
// pos[b] = lengths[s] (-1 idle), t_kv[b] = pos[b] + 1, and out[j][b] = base[j] + s * stride[j]
// (null idle). One definition, so the two forms write the same tables.
#pragma once

#include <cstdint>

#include "common.cuh"

namespace memra::cuda {

constexpr int kMaxTables = 8;
struct SlotTables {
  uint8_t* base[kMaxTables];
  int64_t stride[kMaxTables];
  void** out[kMaxTables];
  int n;
};

// t from the ABI's n bases, strides (bytes between slots) and output tables [B]: kOk, or 40025
// for n outside [0, kMaxTables] or a negative stride, 40024 for a null array or entry.
inline int make_slot_tables(int n, void* const* bases, const int64_t* strides, void** const* outs,
                            SlotTables* t) {
  *t = SlotTables{};
  if (n < 0 || n > kMaxTables) return kContractValue;
  if (n > 0 && (!bases || !strides || !outs)) return kContractMissing;
  t->n = n;
  for (int j = 0; j < n; ++j) {
    if (!bases[j] || !outs[j]) return kContractMissing;
    if (strides[j] < 0) return kContractValue;
    t->base[j] = static_cast<uint8_t*>(bases[j]);
    t->stride[j] = strides[j];
    t->out[j] = outs[j];
  }
  return kOk;
}

// Row b's entries for slot s (len = lengths[s], unused when s < 0); pos / t_kv may be null.
__device__ __forceinline__ void decode_table_row(int b, int s, int len, int32_t* pos,
                                                 int32_t* t_kv, const SlotTables& t) {
  if (pos) {
    const int p = s < 0 ? -1 : len;
    pos[b] = p;
    t_kv[b] = p + 1;
  }
  for (int j = 0; j < t.n; ++j) {
    t.out[j][b] = s < 0 ? nullptr : static_cast<void*>(t.base[j] + static_cast<int64_t>(s) * t.stride[j]);
  }
}

}  // namespace memra::cuda
