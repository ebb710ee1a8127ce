// The linear family on either backend (memra::op, op/backend.h): CPU reference cpu::linear
// (cpu/linear.cpp), CUDA cuda/linear.cu + cuda/gemv.cu, parameter struct MemraLinearParams
// (cuda_abi/linear.h).
#pragma once

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// y = x w^T (+ bias), and with p.pair the second GEMM of x1, w1 (MemraLinearParams). Both
// backends refuse the same bad fields with the same codes. The CPU reads every form with the
// reference's arithmetic: x widened to f32 (a bf16 / f16 x exactly; an f32 x against a bf16 w is
// NOT rounded to bf16 as the CUDA GEMM rounds it), f32 accumulation in index order, the pair as
// two calls. Reference: nn.Linear.
Status linear(const Backend& b, const MemraLinearParams& p);

}  // namespace memra::op
