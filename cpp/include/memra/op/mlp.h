// The dense SwiGLU MLP on either backend (memra::op, cpp/include/memra/op/backend.h): CPU reference
// in cpp/src/cpu/mlp.cpp, CUDA in cuda/mlp.cu, parameter struct in cuda_abi/mlp.h.
#pragma once

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// y = swiglu_mlp(x) (+ p.add) (MemraMlpParams). Both backends check the fields in the same order
// with the same codes; CUDA's fusions (gate|up as one GEMM or GEMV, the add as the down GEMV's
// bias) give the CPU's formula in another summation order. On the CPU the three weights are read
// as host_view(ptr, p.w_dtype, ...). Reference: Glm5NextTextMLP.forward.
Status swiglu_mlp(const Backend& b, const MemraMlpParams& p);

}  // namespace memra::op
