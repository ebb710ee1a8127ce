// The basic ops on either backend (memra::op, cpp/include/memra/op/backend.h): CPU reference in
// cpp/src/cpu/basic.cpp, CUDA in cuda/basic.cu, parameter structs in cuda_abi/basic.h. Arrays
// are f32 on the backend's device (host memory on the CPU); the shapes are the ABI's.
//
// Both backends refuse the same bad scalars with the same codes (a negative extent 40025, a null
// array an op would touch 40024); the CPU also runs the shapes the CUDA kernels are not
// instantiated for.
#pragma once

#include <cstdint>

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// Token embedding, each row written p.hc times (MemraEmbeddingParams). The ids must already be
// in [0, vocab): the CPU reference reads them unchecked, the CUDA kernel writes zero rows.
// Reference: nn.Embedding (+ Glm5NextTextModel's copy into hc_mult streams).
Status embedding(const Backend& b, const MemraEmbeddingParams& p);

// RMSNorm over the last dim: y [T, D] = x * rsqrt(mean(x^2) + eps) (* w [D] when w is given);
// x and y may alias. Reference: Glm5NextTextRMSNorm / Glm5NextTextUnweightedRMSNorm.
Status rms_norm(const Backend& b, const float* x, int T, int D, const float* w, float eps,
                float* y);

// y [T, D] = w * rms_norm(x) * sigmoid(gate); x, gate [T, D], w [D]; y may alias x.
// Reference: Glm5NextTextRMSNormGated.
Status rms_norm_gated_sigmoid(const Backend& b, const float* x, const float* gate, int T, int D,
                              const float* w, float eps, float* y);

// LayerNorm with weight and bias [D] over x, y [T, D] (may alias). Reference: nn.LayerNorm.
Status layer_norm(const Backend& b, const float* x, int T, int D, const float* w,
                  const float* bias, float eps, float* y);

// Up to three one-row norms (MemraNormRowsParams): rows 0 and 1 RMSNorm, row 2 LayerNorm, each
// the bytes of its own call; a null x or D == 0 skips the row. One launch on CUDA.
Status norm_rows(const Backend& b, const MemraNormRowsParams& p);

// x [T, H, d] /= sqrt(sum(x^2, -1) + eps), in place. Reference: modeling_glm5_next.l2norm.
Status l2norm_heads(const Backend& b, float* x, int T, int H, int d, float eps);

// Interleaved RoPE in place: x [T, n_vec, d_rope], positions [T] int32. kContractOddRope for an
// odd d_rope (the message names it); d_rope == 0 is a no-op. Reference: DeepSeek-V3
// apply_rotary_pos_emb_interleave.
Status rope_interleaved(const Backend& b, float* x, const int32_t* positions, int T, int n_vec,
                        int d_rope, float base);

// y[i] = 1 / (1 + exp(-x[i])) over n elements (may alias). Reference: torch.sigmoid.
Status sigmoid(const Backend& b, const float* x, int64_t n, float* y);

// out[i] = x[i] + y[i] over n elements (out may alias x or y).
Status add(const Backend& b, const float* x, const float* y, int64_t n, float* out);

// The plain pre-norm residual step: sum [T, D] = x + y, then h [T, D] = rms_norm(sum, w, eps),
// the bytes of add followed by rms_norm (one launch on CUDA). Reference: the decoder layers of
// Kimi-Linear / Qwen3.5.
Status add_rms_norm(const Backend& b, const float* x, const float* y, int T, int D,
                    const float* w, float eps, float* sum, float* h);

}  // namespace memra::op
