// Shared by the MLA bindings (bind_ops_mla.cpp: one sequence per call; bind_ops_mla_decode.cpp:
// the batched decode forms).
#pragma once

#include "common.h"
#include "memra/engine.h"

namespace memra::py {

// A latent cache argument: float32 on either backend; on CUDA also bfloat16 (a DLPack bfloat16
// array, or uint16 holding the raw bfloat16 bits). Returns the data pointer and the dtype code
// (0 f32, 1 bf16). `shape` as check_array's (-1 = any extent): [L, W] for one sequence's
// rows, [B, L, W] for the batched decode forms' one-array caches.
const void* cache_arg(const Engine* engine, const AnyArray& a, const char* op, int* dtype,
                      const char* name = "cache", std::initializer_list<int64_t> shape = {-1, -1});

// mla_attn_decode and mla_latent_append_decode (bind_ops_mla_decode.cpp); init_ops_mla calls it.
void init_ops_mla_decode(nb::module_& m);

}  // namespace memra::py
