// Shared by the absorb / decompress sources (cuda/mla_proj.cu: entry, per-position and cuBLASLt
// arms; cuda/mla_proj_stream.cu: the streaming arm).
#pragma once

#include "common.cuh"

namespace memra::cuda::mla {

enum class Proj { kAbsorb, kDecompress };

// Arm 0: bf16 weights take Lt from kLtAutoMinT positions (below it, at T = 1, arm 2 keeps the CPU's
// bytes); f32 / f16 weights take arm 2 below kStreamAutoMaxT. Lt from T = 2 because arm 2's
// sequential non-FMA chains are FP32-issue-bound from T ~ 8 on: at H = 64, R = 512, d = 256 the
// H200 took 35.9 / 51.6 us (absorb / decompress) by arm 2 at T = 32 against 7.2 / 8.1 us by Lt,
// and 14.5 / 21.0 against 5.4 / 5.6 at T = 8 (results/2026-11-29-h200-session4-mla-proj.jsonl).
constexpr int kLtAutoMinT = 2;
constexpr int kStreamAutoMaxT = 64;

// Arm 2 (cuda/mla_proj_stream.cu) for p's projection (p.which). *declined (nothing enqueued)
// when the tile does not fit shared memory: the caller then takes the per-position kernel.
int launch_stream_any(MemraCudaCtx* ctx, const MemraMlaProjParams& p, bool* declined);

}  // namespace memra::cuda::mla
