// AttentionLayer's step after its projections (attention_layer.cpp, attention_layer_cuda.cpp):
// the buffers and rows both backends fill, so the CPU and CUDA chains run the same three ops
// with the same fields.
#pragma once

#include <cstdint>

#include "memra/attention_layer.h"

namespace memra {

struct AttentionLayer::Step {
  int T = 0;
  // Inputs: the joint [q | gate] projection and k, v, rows ld_* elements apart.
  const float* qg = nullptr;
  int64_t ld_qg = 0;
  const float* k = nullptr;
  int64_t ld_k = 0;
  const float* v = nullptr;
  int64_t ld_v = 0;
  // Outputs [T, heads * head_dim] (q, gate, o) and [T, kv_heads * head_dim] (k_out).
  float *q = nullptr, *gate = nullptr, *k_out = nullptr, *o = nullptr;
  // Where the rows sit: pos0 (direct form) or slots / lengths (device form; see
  // cuda_abi/attention.h); the planes of the slot (direct) or of slot 0 (device).
  int pos0 = 0;
  const int32_t* slots = nullptr;
  const int32_t* lengths = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int cache_dtype = 0;
  int max_len = 0;
  int64_t slot_stride = 0;
};

}  // namespace memra
