// Sampling on either backend (memra::op, cpp/include/memra/op/backend.h): CPU reference in
// cpp/src/cpu/sample.cpp, CUDA in cuda/sample.cu and cuda/sample_greedy.cu, parameter struct in
// cuda_abi/sample.h.
#pragma once

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// One token per row (MemraSampleParams): the same token on both backends for the same logits,
// seed and counter. Both check the fields in the same order with the same codes (CUDA alone
// refuses B * V past its sort keys or its grid, 50002). On the CPU, seeds and counters are host
// arrays and per-row seeds run cpu::sample one row at a time. p.nonfinite (non-null): the per-row
// flag, 1 where the row holds a NaN or +-inf, written by both (cpu::sample's; on CUDA by the same
// launches, inside a captured graph). Reference: transformers' temperature / TopK / TopP warpers
// + multinomial, with the counter-based draw of cpu/sample.h.
Status sample(const Backend& b, const MemraSampleParams& p);

}  // namespace memra::op
