// The MoE router and routed experts of the CPU reference backend (cpu/moe.cpp); the CUDA twins are
// cuda/moe_route.cu, cuda/moe_experts.cu and cuda/moe_grouped.cu.
// Conventions: those of memra/ops.h, the umbrella header of the CPU reference backend.
#pragma once

#include <cstdint>

#include "memra/status.h"
#include "memra/tensor.h"

namespace memra::cpu {

// Sigmoid router with grouped selection and correction bias. x [T, D]; gate_w [E, D];
// corr_bias [E] or nullptr; topk_idx [T, top_k] (ascending expert id order is NOT implied:
// sorted by choice score desc, ties to the lower id); topk_w [T, top_k] =
// renormalised sigmoid scores (when norm) * scaling. Group score = sum of the two largest choice
// scores (s + bias) of the group; the topk_group best groups are kept (ties: lower group).
// Requires E % n_group == 0, 1 <= topk_group <= n_group, 1 <= top_k <= topk_group * E / n_group
// (the binding checks). Reference: Glm5NextTextTopkRouter.forward.
void moe_route(const float* x, int T, int D, const WeightView& gate_w, const float* corr_bias, int E,
               int top_k, int n_group, int topk_group, bool norm_topk_prob, float scaling,
               int32_t* topk_idx, float* topk_w);

// Softmax router (Qwen3.5-MoE, Qwen3-Next). x [T, D]; gate_w [E, D]; logits in f32, then per token
// p = softmax(logits) (max subtracted, exp, each divided by the sequential sum); topk_idx
// [T, top_k] the top_k experts by p desc, ties to the lower id; topk_w [T, top_k] = p of those,
// divided by their sum (added in j order) when norm_topk_prob, times scaling. Requires
// 1 <= top_k <= E (the callers check). Reference: Qwen3_5MoeTopKRouter.forward (always
// renormalised), Qwen3NextTopKRouter.forward (renormalised when norm_topk_prob).
void moe_route_softmax(const float* x, int T, int D, const WeightView& gate_w, int E, int top_k,
                       bool norm_topk_prob, float scaling, int32_t* topk_idx, float* topk_w);

// The shared expert's sigmoid gate: y[t] = routed[t] + sigmoid(x[t] . gate_w) * shared[t], the dot
// product summed in order, sigmoid 1 / (1 + exp(-g)). x, shared, routed, y [T, D] (routed may be
// y); gate_w [D]. Reference: Qwen3_5MoeSparseMoeBlock.forward (F.sigmoid(shared_expert_gate(x)) *
// shared_expert(x), added to the routed sum).
void moe_shared_gate(const float* x, int T, int D, const float* gate_w, const float* shared,
                     const float* routed, float* y);

// Routed experts (shared expert NOT included: the caller adds shared(x)). For each token t:
//   y[t] = sum over j of topk_w[t, j] * expert_{topk_idx[t, j]}(x[t]),
// expert_e(x) = down_w[e] (silu(min(gate_w[e] x, limit)) * clamp(up_w[e] x, +-limit)).
// Each term is computed as (down row . h) * w and the terms of a token are added to a zero row in
// ascending expert id (Glm5NextTextExperts.forward loops over the hit experts in ascending id and
// index_adds). x, y [T, D]; topk_idx, topk_w [T, top_k] (an id outside [0, E) contributes
// nothing, as on CUDA; the bindings refuse one); gate_w, up_w: E weights [I, D]; down_w: E weights
// [D, I]. Reference: Glm5NextTextExperts.
void moe_forward(const float* x, int T, int D, const int32_t* topk_idx, const float* topk_w,
                 int top_k, const WeightView* gate_w, const WeightView* up_w,
                 const WeightView* down_w, int E, float limit, float* y);

}  // namespace memra::cpu
