// The DSA k-pool indexer ops on either backend (memra::op, cpp/include/memra/op/backend.h): CPU
// reference in cpp/src/cpu/dsa.cpp (cpu/dsa.h), CUDA in cuda/dsa.cu + cuda/dsa_decode.cu,
// parameter structs in cuda_abi/dsa.h. Pointers live on the backend's device (host memory on the
// CPU). The batched forms (p.batched == 1: device pointer tables and device positions, one launch
// for B sequences) are CUDA only: kUnsupportedGeometry on the CPU. Statuses name the op.
#pragma once

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// The indexer's per-sequence bookkeeping for rows [pos, pos + n) (MemraKpoolAppendParams): the
// key of every pool whose last row lands in them (its earlier rows from the tail ring), then the
// newest min(n, tail_rows) rows into the ring at row % tail_rows. CPU: cpu::kpool_pool_key over
// the rows as MlaLayer::indexer gathers them. Reference: Glm5NextTextIndexer.get_pooled_states.
Status kpool_append(const Backend& b, const MemraKpoolAppendParams& p);

// Head-mixed pool scores (MemraKpoolScoreParams). CPU: cpu::kpool_score; p.reference is CUDA's
// only. Reference: Glm5NextTextIndexer.forward (scores, weights, valid_candidates mask).
Status kpool_score(const Backend& b, const MemraKpoolScoreParams& p);

// Index lists from pool scores (MemraKpoolSelectParams). CPU: cpu::kpool_select; p.reference is
// CUDA's only. Reference: Glm5NextTextIndexer.forward top-k + append_visible_tail (as sets).
Status kpool_select(const Backend& b, const MemraKpoolSelectParams& p);

}  // namespace memra::op
