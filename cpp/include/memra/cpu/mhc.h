// The mHC ops of the CPU reference backend (cpu/mhc.cpp). memra/ops.h, the umbrella header,
// states the conventions (f32 activations, C-contiguous row-major, shapes beside arguments).
#pragma once

#include <cstdint>

#include "memra/status.h"
#include "memra/tensor.h"

namespace memra::cpu {

// Hyper-connection mapping. streams [T, hc, D]; fn [(2+hc)*hc, hc*D]; base [(2+hc)*hc];
// scale [3]; post [T, hc]; comb [T, hc, hc]; collapsed [T, D] = sum_s pre[s] * streams[s].
// norm_eps = rms_norm_eps (unweighted RMSNorm of the flattened streams), hc_eps for the
// sigmoid floor and the Sinkhorn denominators. Reference: Glm5NextTextHyperConnection.forward.
void mhc_pre(const float* streams, int T, int hc, int D, const WeightView& fn, const float* base,
             const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* post,
             float* comb, float* collapsed);

// out[t, j, :] = post[t, j] * y[t, :] + sum_i comb[t, i, j] * residual[t, i, :].
// y [T, D]; post [T, hc]; comb [T, hc, hc]; residual, out [T, hc, D] (out may not alias).
// Reference: Glm5NextTextDecoderLayer.forward.
void mhc_post(const float* y, const float* post, const float* comb, const float* residual, int T,
              int hc, int D, float* out);

// out[t, :] = mean over s of streams[t, s, :]. Reference: Glm5NextTextHyperHead.
void hc_head_mean(const float* streams, int T, int hc, int D, float* out);

// out[t, s, :] = x[t, :] for s < n: x [T, D] -> out [T, n, D], the residual streams of a
// hyper-connection model from the embedding. Reference: Glm5NextTextModel.forward
// (hidden_states.unsqueeze(2).expand(..., hc_mult, ...)).
void hc_expand(const float* x, int T, int D, int n, float* out);

}  // namespace memra::cpu
