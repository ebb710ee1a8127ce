// The mHC ops on either backend (memra::op, op/backend.h): CPU reference cpu/mhc.cpp, CUDA
// cuda/mhc_*.cu, parameter struct MemraMhcParams (cuda_abi/mhc.h). Oracle: transformers
// Glm5NextTextHyperConnection, Glm5NextTextDecoderLayer, Glm5NextTextHyperHead.
#pragma once

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// The most Sinkhorn rounds an mHC mapping runs (MemraMhcParams::sinkhorn_iters). The released
// checkpoints use 20; each round is two passes over [hc, hc] per row, run to the end with no
// way to interrupt it, so an unbounded count from a config would stall a forward pass for
// hours. mhc() refuses more with kContractValue before either backend runs; the glm5_next config
// parse and HyperConnection::create refuse the same bound (hc_sinkhorn_iters).
constexpr int kMaxSinkhornIters = 1000;

// One mHC site or the model's head (the forms of MemraMhcParams: pre [+ norm], expand,
// expand + pre + norm, expand + head + norm). The CPU chains the reference ops of each form
// (cpu::mhc_post, cpu::mhc_pre, cpu::rms_norm, cpu::hc_head_mean) after the CUDA entry's checks,
// except hc > 64, which it runs; the fused CUDA launches have the bytes of those chains on the
// device.
// sinkhorn_iters above kMaxSinkhornIters (with pre): kContractValue on either backend.
Status mhc(const Backend& b, const MemraMhcParams& p);

// out [T, D] = the mean over s of streams [T, hc, D]. Reference: Glm5NextTextHyperHead.
Status hc_head_mean(const Backend& b, const float* streams, int T, int hc, int D, float* out);

// out [T, n, D]: every stream starts as x [T, D]. Reference: Glm5NextTextModel.forward.
Status hc_expand(const Backend& b, const float* x, int T, int D, int n, float* out);

}  // namespace memra::op
