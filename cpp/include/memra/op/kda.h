// The KDA ops on either backend (memra::op, cpp/include/memra/op/backend.h): CPU reference in
// cpp/src/cpu/kda.cpp (memra/cpu/kda.h), CUDA in cuda/kda_*.cu, parameter structs in
// cuda_abi/kda.h. On the CPU every pointer of a struct is a host pointer, and a pointer table
// (MEMRA_KDA_PLANES_TABLES) a host array of host pointers.
#pragma once

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// Causal depthwise conv + SiLU over x's channels, continuing each row's ring
// (MemraKdaConvParams). CPU: the DIRECT planes run cpu::kda_conv_prefill over the T tokens, the
// TABLES planes cpu::kda_conv_decode for each row (a null in table or entry reads zeros, a null
// out entry is not written); y's channel groups (G) and the fused L2 norm (cpu::l2norm_heads)
// as on CUDA, with the same values. The SLOTS planes and the GEMV pair are CUDA-only: refused
// with kUnsupportedGeometry. At T == 0 the CPU reference passes the ring through (ring.out =
// ring.in) while the CUDA entry runs nothing (the kda_conv binding copies it there). At K == 1
// the ring has no columns: the CPU takes a null DIRECT ring.out (CUDA runs K 2..8 only).
// Reference: modeling_glm5_next.causal_conv1d_fn / causal_conv1d_update (activation 'silu'),
// then l2norm of q and k.
Status kda_conv(const Backend& b, const MemraKdaConvParams& p);

// KDA's log forget gate, with beta's sigmoid in the same call (MemraKdaGateParams).
// Reference: Glm5NextTextForgetGate.forward (both forms); beta = sigmoid(b_proj(x)).
Status kda_gate(const Backend& b, const MemraKdaGateParams& p);

// The delta-rule scan of B sequences (MemraKdaScanParams). CPU: the TABLES planes run
// cpu::kda_scan for each sequence (a null in table or entry starts from zeros, a null out entry
// is not written), the STRIDED planes the same over in / out + b * floats (any T); the SLOTS planes and the fused gates / norm are CUDA-only (the decode graph's
// form): refused with kUnsupportedGeometry. At T == 0 the CPU reference writes state_out (the
// input state or zeros) while the CUDA entry runs nothing (the kda_scan binding copies it there).
// Reference: modeling_glm5_next.recurrent_kimi_delta_attention.
Status kda_scan(const Backend& b, const MemraKdaScanParams& p);

// One recurrent layer's decode pointer tables from device slots and ping-pong flags
// (MemraKdaTablesParams; KdaLayer and GdnLayer planes alike). CUDA only: the CPU backend names
// its planes on the host, so on the CPU this returns kUnsupported.
Status kda_tables(const Backend& b, const MemraKdaTablesParams& p);

}  // namespace memra::op
