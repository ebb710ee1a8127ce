// The basic ops on either backend (memra::op, cpp/include/memra/op/backend.h): CPU reference in
// cpp/src/cpu/basic.cpp, CUDA in cuda/basic.cu, parameter structs in cuda_abi/basic.h.
#pragma once

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// Token embedding, each row written p.hc times (MemraEmbeddingParams). The ids must already be
// in [0, vocab): the CPU reference reads them unchecked, the CUDA kernel writes zero rows.
// Reference: nn.Embedding (+ Glm5NextTextModel's copy into hc_mult streams).
Status embedding(const Backend& b, const MemraEmbeddingParams& p);

}  // namespace memra::op
