// AttentionLayer: the gated full attention of Qwen3.5 / Qwen3.5-MoE / Qwen3-Next over a K/V
// cache (layers.h's conventions: create() checks every weight, prefill / decode against a Cache
// slot, to_device moves the weights once). Reference: transformers 5.17
// models/qwen3_5/modeling_qwen3_5.py Qwen3_5Attention (Qwen3NextAttention is the same).
#pragma once

#include <memory>
#include <vector>

#include "memra/cache.h"
#include "memra/device.h"
#include "memra/layers.h"
#include "memra/op/backend.h"
#include "memra/status.h"
#include "memra/tensor.h"

namespace memra {

struct AttentionConfig {
  int hidden = 0;       // hidden_size
  int heads = 0;        // num_attention_heads (query heads)
  int kv_heads = 0;     // num_key_value_heads; heads % kv_heads == 0
  int head_dim = 0;     // 1..256 (the CUDA kernels' widest; the Qwen models use 256)
  // Rotated dims of each q / k head: int(head_dim * partial_rotary_factor) as transformers
  // computes it (compute_default_rope_parameters), even, 0..head_dim.
  int rotary_dim = 0;
  double rope_theta = 10000.0;  // rope_parameters["rope_theta"]
  float rms_eps = 1e-6f;        // rms_norm_eps: the q_norm / k_norm epsilon
};

// Names below `self_attn.` (as on disk): q_proj.weight [heads * 2 * head_dim, hidden] (per head
// the query rows then the gate rows); k_proj.weight, v_proj.weight [kv_heads * head_dim, hidden];
// o_proj.weight [hidden, heads * head_dim]; q_norm.weight, k_norm.weight [head_dim] (the
// zero-centred Qwen3_5RMSNorm: the layer multiplies by 1 + w, computed in f32 at create);
// optional biases q_proj.bias, k_proj.bias, v_proj.bias, o_proj.bias (attention_bias).
//
// The step: qg = q_proj(x), k = k_proj(x), v = v_proj(x); op::attn_prep (split, q/k norms,
// partial rotary at the rows' positions); op::kv_append (the rows into the cache at the slot's
// length); op::attention (causal over the slot's rows, grouped heads, scale head_dim ** -0.5,
// times sigmoid(gate)); y = o_proj. The cache rows are the cache's latent dtype (f32, or bf16 on
// a CUDA cache made so).
class AttentionLayer {
 public:
  // kContractValue for a bad count or epsilon, kContractOddRope for an odd rotary_dim,
  // kUnsupportedGeometry for head_dim > 256, kContractMissing / kContractShape for the weights.
  static Status create(const AttentionConfig& cfg, WeightMap& w, std::unique_ptr<AttentionLayer>* out);
  const AttentionConfig& config() const { return cfg_; }
  // LayerStateSpec::Kind::kAttention with heads = kv_heads and head_dim.
  LayerStateSpec state_spec() const;
  // head_dim ** -0.5 as a float (Qwen3_5Attention.scaling, the factor eager attention takes).
  float scale() const { return scale_; }
  // The host-computed inverse frequencies [rotary_dim / 2] (cpu::rope_inv_freq).
  const std::vector<float>& inv_freq() const { return inv_freq_; }

  // Continue `slot` by T tokens at positions length(slot) + t: their K/V rows land past the
  // slot's length (visible after cache.commit(slot, T)). x, y [T, hidden].
  Status prefill(Cache& cache, int layer, int slot, const float* x, int T, float* y) const;
  // One token for each of `slots` [B] (host, distinct): x, y [B, hidden].
  Status decode(Cache& cache, int layer, const int32_t* slots, int B, const float* x, float* y) const;
  // The same on a CUDA layer with the slots on the device (see KdaLayer::decode_device): each
  // row's position is the cache's device length of its slot; an idle row (-1) appends nothing
  // and its attention output is zero (y = o_proj's bias, or 0). No host round trip: capturable
  // into a CUDA graph and replayable at every position.
  Status decode_device(Cache& cache, int layer, const int32_t* slots_d, int B, const float* x,
                       float* y) const;

  // Move the weights to a CUDA device, converted once to `dtype` (kF32 or kBF16; the norm
  // weights, biases and frequencies stay f32). q_proj | k_proj | v_proj become one weight (one
  // GEMM for the three projections).
  Status to_device(std::shared_ptr<CudaContext> cuda, DType dtype);
  const std::shared_ptr<CudaContext>& cuda() const { return cuda_; }

  // Internal: one step's buffers and rows (cpp/src/layers/attention_step.h).
  struct Step;

 private:
  struct Gpu;
  Status check_cache(const Cache& cache, int layer, const char* op) const;
  // The step of s.T rows whose position fields and planes `s` holds: the projections, then
  // attend, then o_proj (run_cpu: attention_layer.cpp; run_cuda: attention_layer_cuda.cpp).
  Status run_cpu(const float* x, Step s, float* y) const;
  Status run_cuda(const float* x, Step s, float* y) const;
  // The step after the projections, on either backend: attn_prep, kv_append, attention.
  Status attend(const op::Backend& b, const Step& s, const float* q_norm, const float* k_norm,
                const float* inv_freq) const;
  std::shared_ptr<CudaContext> cuda_;
  std::shared_ptr<Gpu> gpu_;
  AttentionConfig cfg_;
  float scale_ = 1.0f;
  Weight q_proj_, k_proj_, v_proj_, o_proj_;
  std::vector<float> q_bias_, k_bias_, v_bias_, o_bias_;  // empty: no bias
  std::vector<float> q_norm_, k_norm_;                    // 1 + w
  std::vector<float> inv_freq_;
};

}  // namespace memra
