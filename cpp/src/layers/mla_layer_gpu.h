// MlaLayer's device weights (after to_device), shared by its CUDA chains: mla_layer_cuda.cpp
// (projections, attention) and mla_indexer_cuda.cpp (the DSA indexer).
#pragma once

#include "memra/device.h"
#include "memra/layers.h"

namespace memra {

struct MlaLayer::Gpu {
  // Compute dtype. x's projections are one weight in_proj = q_a | kv_a [| wk | kpool_gate |
  // weights_proj] and q_resid's one weight qb_proj = q_b [| wq_b]; without query LoRA in_proj =
  // q_proj | kv_a and no qb_proj. With rope columns the query weight (q_b or q_proj) is
  // regrouped into q_nope rows then q_pe rows (split_heads). The named weights are row views of
  // them (see project_cuda): q_b is the query's d_nope rows [H * d_nope], q_pe its d_rope rows.
  DeviceWeight in_proj, qb_proj;
  DeviceWeight q_a, q_b, q_pe, kv_a, kv_b, o_proj;
  DeviceWeight q_a_bias, kv_a_bias, o_bias, q_a_norm, kv_a_norm;  // f32 (biases may be empty)
  DeviceWeight wq_b, wk, weights_proj, kpool_gate;  // compute dtype
  DeviceWeight k_norm_w, k_norm_b, kpool_ape;       // f32
};

}  // namespace memra
