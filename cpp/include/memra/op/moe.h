// The MoE router and routed experts on either backend (memra::op, cpp/include/memra/op/backend.h):
// CPU reference in cpp/src/cpu/moe.cpp, CUDA in cuda/moe_*.cu, parameter structs in
// cuda_abi/moe.h.
#pragma once

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// The router (MemraMoeRouteParams): the grouped sigmoid form or, by p.scoring, the softmax form.
// Both backends check the fields in the same order with the same codes (CUDA alone refuses E
// beyond its shared memory, 50002). The CPU reads gate_w as f32 [E, D]. References:
// Glm5NextTextTopkRouter.forward (sigmoid), Qwen3_5MoeTopKRouter / Qwen3NextTopKRouter (softmax).
Status moe_route(const Backend& b, const MemraMoeRouteParams& p);

// The shared expert's sigmoid gate (MemraMoeSharedGateParams): y = routed + sigmoid(x . gate_w) *
// shared per token. Both backends check the fields in the same order with the same codes.
// Reference: Qwen3_5MoeSparseMoeBlock.forward.
Status moe_shared_gate(const Backend& b, const MemraMoeSharedGateParams& p);

// A CPU call's experts when they are not one stacked allocation (a MoeLayer's or the binding's
// per-expert memra.Weight): E views each, in their own dtypes, replacing p.gate_w / up_w / down_w
// (p.w_dtype then only names the shared expert's dtype). The CUDA kernels read stacked weights
// only: given on CUDA, 50002.
struct HostExperts {
  const WeightView* gate = nullptr;  // [E] views [I, D]
  const WeightView* up = nullptr;    // [E] views [I, D]
  const WeightView* down = nullptr;  // [E] views [D, I]
};

// The routed experts, plus the shared expert when p names one (MemraMoeForwardParams). Both
// backends check the fields in the same order with the same codes. An id outside [0, E)
// contributes nothing on either. On the CPU the stacked weights are read expert by expert
// (WeightView::row_view), or from `experts`; the shared expert is swiglu_mlp over p.shared_*
// plus the routed sum (CUDA's fused slot rounds its x and h to w_dtype: see cuda_abi/moe.h).
// Reference: Glm5NextTextExperts.forward (+ Glm5NextTextMoE's shared_experts).
Status moe_forward(const Backend& b, const MemraMoeForwardParams& p,
                   const HostExperts* experts = nullptr);

}  // namespace memra::op
