// Shared by the absorb / decompress sources (cuda/mla_proj.cu: entry, per-position and cuBLASLt
// arms; cuda/mla_proj_stream.cu: the streaming arm).
#pragma once

#include "common.cuh"

namespace memra::cuda::mla {

enum class Proj { kAbsorb, kDecompress };

constexpr int kStreamAutoMaxT = 64;  // arm 0 takes arm 2 below this T (and Lt from it, bf16)

// Arm 2 (cuda/mla_proj_stream.cu) for p's projection (p.which). *declined (nothing enqueued)
// when the tile does not fit shared memory: the caller then takes the per-position kernel.
int launch_stream_any(MemraCudaCtx* ctx, const MemraMlaProjParams& p, bool* declined);

}  // namespace memra::cuda::mla
