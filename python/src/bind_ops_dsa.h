// Shared by the DSA k-pool indexer bindings (bind_ops_dsa.cpp: one sequence per call;
// bind_ops_dsa_decode.cpp: the batched decode forms).
#pragma once

#include "common.h"
#include "memra/engine.h"

namespace memra::py {

// ContractError (40010) naming `op` unless pool >= 1.
// `from`: where the pool comes from when it is not an argument of its own.
void check_pool(int pool, const char* op, const char* from = nullptr);

// The pool-key position embedding ape [pool, d] of the append ops: pool >= 1, d >= 1.
const float* ape_arg(const Engine* engine, const AnyArray& ape, const char* op, int* pool, int* d);

// kpool_append_decode, kpool_score_decode, kpool_select_decode (bind_ops_dsa_decode.cpp);
// init_ops_dsa calls it.
void init_ops_dsa_decode(nb::module_& m);

}  // namespace memra::py
