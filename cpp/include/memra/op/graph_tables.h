// The decode graph's bookkeeping ops (memra::op, op/backend.h): CUDA cuda/graph_tables.cu,
// parameter struct MemraDecodeTablesParams (cuda_abi/graph_tables.h). CUDA only: the CPU
// backend keeps its cache's lengths and planes on the host (Cache::commit), so on the CPU these
// return kUnsupported.
#pragma once

#include <cstdint>

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// lengths[s] += 1 and cur[s] ^= 1 for each s = slots[b] >= 0, b < B (device int32 arrays).
Status commit_decode(const Backend& b, const int32_t* slots, int B, int32_t* lengths,
                     int32_t* cur);

// A decode step's positions and plane tables from the device slots (MemraDecodeTablesParams).
Status decode_tables(const Backend& b, const MemraDecodeTablesParams& p);

}  // namespace memra::op
