// GdnLayer: the Gated DeltaNet mixer of Qwen3.5 / Qwen3.5-MoE / Qwen3-Next, on the CPU reference
// ops (cpp/src/layers/gdn_layer.cpp) or on a CUDA device (gdn_layer_cuda.cpp), against a Cache
// slot whose layer holds a GDN state (LayerStateSpec kind kGdn). Reference: transformers 5.17
// Qwen3_5GatedDeltaNet.forward (models/qwen3_5) and Qwen3NextGatedDeltaNet.forward
// (models/qwen3_next: the same arithmetic behind interleaved projections).
#pragma once

#include <memory>
#include <vector>

#include "memra/cache.h"
#include "memra/device.h"
#include "memra/layers.h"
#include "memra/status.h"
#include "memra/tensor.h"

namespace memra {

struct GdnConfig {
  int hidden = 0;
  int key_heads = 0, value_heads = 0;         // Hk, Hv (Hv a multiple of Hk)
  int key_head_dim = 0, value_head_dim = 0;   // dk, dv
  int conv_kernel = 4;
  float rms_eps = 1e-6f;  // the output norm's epsilon (rms_norm_eps); the q/k L2 norm's is 1e-6
};

// Gated DeltaNet mixer. Weight names as on disk below `linear_attn.` (C = 2*Hk*dk + Hv*dv):
//   Qwen3.5:    in_proj_qkv.weight [C, hidden], in_proj_z.weight [Hv*dv, hidden],
//               in_proj_b.weight [Hv, hidden], in_proj_a.weight [Hv, hidden];
//   Qwen3-Next: in_proj_qkvz.weight [C + Hv*dv, hidden] and in_proj_ba.weight [2*Hv, hidden],
//               interleaved per key head (q_i | k_i | v_i | z_i and b_i | a_i, fix_query_key_
//               value_ordering), de-interleaved at load into the Qwen3.5 layout (the layout is
//               read from the names: either in_proj_qkvz or in_proj_qkv);
//   both:       conv1d.weight [C, 1, K], A_log [Hv], dt_bias [Hv], norm.weight [dv],
//               out_proj.weight [hidden, Hv*dv].
// The projections keep their file dtype on the CPU; conv taps, A_log, dt_bias and the norm
// weight are f32.
class GdnLayer {
 public:
  static Status create(const GdnConfig& cfg, WeightMap& w, std::unique_ptr<GdnLayer>* out);
  const GdnConfig& config() const { return cfg_; }
  // kGdn: conv ring [C, K-1] and state [Hv, dk, dv], f32 ping-pong pairs.
  LayerStateSpec state_spec() const;
  bool interleaved() const { return interleaved_; }  // loaded from the Qwen3-Next layout

  // x [T, hidden] -> y [T, hidden], from a zero state (CPU layers).
  Status forward(const float* x, int T, float* y) const;
  // Continue `slot` of `cache` (plane `layer`) by T tokens: reads plane cur(slot), writes the
  // other plane; the caller commits. x, y [T, hidden].
  Status prefill(Cache& cache, int layer, int slot, const float* x, int T, float* y) const;
  // One token for each of `slots` [B] (a host array): x, y [B, hidden].
  Status decode(Cache& cache, int layer, const int32_t* slots, int B, const float* x,
                float* y) const;
  // The same on a CUDA layer with the slots on the device (slots_d [B] device int32, distinct, in
  // [0, max_batch) or -1 for an idle row that reads zeros and writes no state). Each row's planes
  // are found on the device from the cache's ping-pong flags: no host round trip, capturable
  // into a CUDA graph and replayable at any position. Unchecked on the device: callers validate
  // the host copy (memra::DecodeSlots) and the room of every slot.
  Status decode_device(Cache& cache, int layer, const int32_t* slots_d, int B, const float* x,
                       float* y) const;

  // Move the weights to a CUDA device, the projections converted once to `dtype` (kF32 or
  // kBF16; conv taps, gates and the norm weight stay f32). kUnsupportedGeometry unless dk == dv
  // == 128 and 2 <= conv_kernel <= 8 (the CUDA kernels' instantiation; the CPU runs any).
  Status to_device(std::shared_ptr<CudaContext> cuda, DType dtype);
  const std::shared_ptr<CudaContext>& cuda() const { return cuda_; }

 private:
  struct Gpu;
  // The recurrent planes of a CUDA call: a prefill's (B == 1) named directly; a decode step's
  // (T == 1) found on the device from slots_d and the cache's ping-pong flags.
  struct Planes {
    const float* ring_in = nullptr;
    float* ring_out = nullptr;
    const float* state_in = nullptr;
    float* state_out = nullptr;
    const int32_t* slots_d = nullptr;
  };
  int64_t conv_channels() const;
  // The whole mixer over T tokens of one sequence on the CPU (ring_in / state_in may be null).
  Status run(const float* x, int T, const float* ring_in, float* ring_out, const float* state_in,
             float* state_out, float* y) const;
  Status run_cuda(Cache& cache, int layer, int B, int T, const Planes& planes, const float* x,
                  float* y) const;
  GdnConfig cfg_;
  bool interleaved_ = false;
  Weight qkv_, z_, b_, a_, out_proj_;  // the Qwen3.5 layout (de-interleaved at load)
  std::vector<float> conv_w_, dt_bias_, a_log_, norm_w_;
  std::shared_ptr<CudaContext> cuda_;
  std::shared_ptr<Gpu> gpu_;
};

}  // namespace memra
