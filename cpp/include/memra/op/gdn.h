// The Gated DeltaNet ops on either backend (memra::op, cpp/include/memra/op/backend.h): CPU
// reference in cpp/src/cpu/gdn.cpp (memra/cpu/gdn.h), CUDA in cuda/gdn.cu, parameter structs in
// cuda_abi/gdn.h. On the CPU every pointer is a host pointer and a pointer table a host array of
// host pointers. Both backends refuse the same scalar arguments with the same codes.
#pragma once

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// The per-value-head decay and beta (MemraGdnGateParams). Reference: Qwen3_5GatedDeltaNet.forward
// (g = -A_log.exp() * F.softplus(a + dt_bias), beta = b.sigmoid()).
Status gdn_gate(const Backend& b, const MemraGdnGateParams& p);

// In-place L2 norm of `heads` vectors of d per row (vector (r, h) at x + r*ld + h*d), Qwen's
// form x * rsqrt(sum(x^2) + eps). kContractShape for rows or heads < 0, d < 1, ld < heads*d.
// Reference: modeling_qwen3_5.l2norm (use_qk_l2norm_in_kernel, eps 1e-6).
Status gdn_l2norm(const Backend& b, float* x, int rows, int heads, int d, int64_t ld, float eps);

// gdn_l2norm(x, ...) then gdn_gate(p): the bytes and the refusals of the two calls, one launch on
// CUDA (x must not overlap p's arrays). A GDN layer's step between its conv and its scan.
Status gdn_l2norm_gate(const Backend& b, float* x, int rows, int heads, int d, int64_t ld,
                       float eps, const MemraGdnGateParams& p);

// The grouped-head gated delta rule of B sequences (MemraGdnScanParams). CPU: cpu::gdn_scan per
// sequence (a null input table or entry starts from zeros, a null output entry is not written).
// Reference: torch_recurrent_gated_delta_rule (equal in exact arithmetic to
// torch_chunk_gated_delta_rule, which transformers runs for multi-token prefill).
Status gdn_scan(const Backend& b, const MemraGdnScanParams& p);

// The GDN output norm y = w * rmsnorm(x) * silu(gate): x, gate, y [T, D] (y may alias x), w [D].
// kContractValue for T or D < 0. Reference: Qwen3_5RMSNormGated.forward.
Status rms_norm_gated_silu(const Backend& b, const float* x, const float* gate, int T, int D,
                           const float* w, float eps, float* y);

}  // namespace memra::op
