// Layer objects: each holds its weights and runs one block of a model over the CPU reference
// ops, statelessly (forward) or against a Cache slot (prefill / decode). Model classes in Python
// chain them. Construction goes through create(), which checks
// every weight's presence and shape (kContractMissing / kContractShape naming the tensor).
#pragma once

#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memra/cache.h"
#include "memra/device.h"
#include "memra/ops.h"
#include "memra/status.h"
#include "memra/tensor.h"

namespace memra {

namespace gpu {
class Arena;
}

// The largest size a layer takes (hidden, heads, head dims, ranks, experts, kernel, pool and
// index widths, hc_mult): 2^20, far above any released model. Bounding every size keeps a sum of
// two sizes inside int and a product of three inside int64, so the geometry arithmetic of the
// layers cannot overflow (signed overflow is undefined behaviour). memra.config refuses a
// config.json size above it first, naming the key; this is the layers' own guard.
constexpr int kMaxLayerSize = 1 << 20;

// kContractValue "<layer>: <name> must be at most 1048576 (2^20), got <value>" for the first of
// `sizes` above kMaxLayerSize, "... must be >= 0" for one below 0 (the layer's own lower bounds
// past 0 are its create()'s).
Status check_sizes(const char* layer, std::initializer_list<std::pair<const char*, int>> sizes);

// Named weights handed to a layer, consumed by name with a shape check.
class WeightMap {
 public:
  WeightMap(std::map<std::string, Weight> weights, std::string owner)
      : weights_(std::move(weights)), owner_(std::move(owner)) {}
  bool has(const std::string& name) const { return weights_.count(name) > 0; }
  // The tensor `name` with exactly `shape` (kContractMissing / kContractShape otherwise;
  // kContractValue when an extent of `shape` is above 2^31 - 1, which the ops' int extents
  // cannot address).
  Status take(const std::string& name, const std::vector<int64_t>& shape, Weight* out);
  Status take_f32(const std::string& name, const std::vector<int64_t>& shape, std::vector<float>* out);
  // kContractMissing naming every tensor that was given but not consumed.
  Status finish() const;

 private:
  std::map<std::string, Weight> weights_;
  std::map<std::string, bool> used_;
  std::string owner_;
};

// ------------------------------------------------------------------------------------------ KDA
struct KdaConfig {
  int hidden = 0, heads = 0, head_dim = 0, conv_kernel = 4;
  cpu::KdaGateForm gate_form = cpu::KdaGateForm::kLowerBound;
  float lower_bound = -5.0f;
  float rms_eps = 1e-5f;  // o_norm epsilon (the l2norm epsilon is fixed at 1e-6)
};

// Kimi Delta Attention mixer. Reference: Glm5NextTextLinearAttention.forward (glm5_next) and
// KimiDeltaAttention (kimi_linear, softplus gate). Weight names as on disk below `self_attn.`:
// q_proj/k_proj/v_proj.weight [qkv, hidden]; q_conv1d/k_conv1d/v_conv1d.weight [qkv, 1, K];
// f_a_proj.weight [head_dim, hidden]; f_b_proj.weight [qkv, head_dim]; dt_bias [qkv];
// A_log [heads] (any shape with heads elements); b_proj.weight [heads, hidden];
// g_a_proj.weight [head_dim, hidden]; g_b_proj.weight [qkv, head_dim]; o_norm.weight [head_dim];
// o_proj.weight [hidden, qkv].
class KdaLayer {
 public:
  static Status create(const KdaConfig& cfg, WeightMap& w, std::unique_ptr<KdaLayer>* out);
  const KdaConfig& config() const { return cfg_; }
  LayerStateSpec state_spec() const;

  // x [T, hidden] -> y [T, hidden], from a zero state.
  Status forward(const float* x, int T, float* y) const;
  // Continue `slot` of `cache` (plane `layer`) by T tokens: reads plane cur(slot), writes the
  // other plane; the caller commits. x, y [T, hidden].
  Status prefill(Cache& cache, int layer, int slot, const float* x, int T, float* y) const;
  // One token for each of `slots` [B]: x, y [B, hidden]. `slots` is a host array.
  Status decode(Cache& cache, int layer, const int32_t* slots, int B, const float* x, float* y) const;
  // The same on a CUDA layer with the slots on the device: slots_d [B] device int32, distinct,
  // in [0, max_batch) or -1 for an idle row (nothing of its state read or written; its output
  // row is finite and meaningless). Unchecked on the device: callers validate the host copy
  // (memra::DecodeSlots) and the room of every slot. No host round trip, no host->device copy:
  // the call can be captured into a CUDA graph and replayed at any position.
  Status decode_device(Cache& cache, int layer, const int32_t* slots_d, int B, const float* x,
                       float* y) const;

  // Move the weights to a CUDA device, converted once to `dtype` (kF32 or kBF16; norm weights,
  // biases, conv taps, gate vectors and routers stay f32). From then on the layer runs on that
  // device only: its array arguments are device pointers and its cache a device cache.
  // kUnsupportedGeometry names a geometry the CUDA kernels are not instantiated for.
  Status to_device(std::shared_ptr<CudaContext> cuda, DType dtype);
  const std::shared_ptr<CudaContext>& cuda() const { return cuda_; }

 private:
  struct Gpu;
  struct Planes;
  Status prefill_cuda(Cache& cache, int layer, int slot, const float* x, int T, float* y) const;
  Status run_cuda(Cache& cache, int layer, int B, int T, const Planes& planes, const float* x,
                  float* y) const;
  std::shared_ptr<CudaContext> cuda_;
  std::shared_ptr<Gpu> gpu_;
  // The whole mixer over T tokens with explicit state planes (ring_in/state_in may be nullptr).
  Status run(const float* x, int T, const float* ring_in, float* ring_out, const float* state_in,
             float* state_out, float* y) const;
  KdaConfig cfg_;
  Weight q_proj_, k_proj_, v_proj_, f_a_, f_b_, b_proj_, g_a_, g_b_, o_proj_;
  std::vector<float> conv_w_;  // fused [3*qkv, K]: q | k | v planes
  std::vector<float> dt_bias_, a_log_, o_norm_;
};

// ------------------------------------------------------------------------------------------ MLA
struct MlaConfig {
  // q_lora_rank 0: no query LoRA, q = q_proj(x) (Kimi-Linear); else q = q_b(q_a_layernorm(q_a(x))).
  int hidden = 0, heads = 0, q_lora_rank = 0, kv_rank = 0, d_nope = 0, d_rope = 0, d_v = 0;
  // Epsilon of the latent norms q_a_layernorm and kv_a_layernorm (one value in every family:
  // glm5_next rms_norm_eps; Kimi-Linear KimiLinearRMSNorm's default 1e-6, not rms_norm_eps).
  float rms_eps = 1e-5f;
  // DSA k-pool indexer (index_heads == 0: none). A "shared" layer has no indexer of its own and
  // takes the index list of the full layer before it.
  bool sparse = false;  // attention over an index list (DSA) instead of dense causal
  int index_heads = 0, index_head_dim = 0, kpool = 0, topk = 0;
  int tail_rows = 0;    // indexer tail ring rows (multiple of kpool)
  float rope_base = 10000.0f;
  bool rotate = false;  // decided by the model family, never inferred from d_rope > 0
};

// Multi-head latent attention with the optional DSA k-pool indexer. Reference:
// Glm5NextTextAttention + Glm5NextTextIndexer; KimiLinearAttention (no query LoRA, unrotated
// rope columns, no indexer). Names below `self_attn.`: q_a_proj.weight
// [q_lora, hidden]; q_a_layernorm.weight [q_lora]; q_b_proj.weight [H*(d_nope+d_rope), q_lora]
// (or, with q_lora_rank 0, q_proj.weight [H*(d_nope+d_rope), hidden]);
// kv_a_proj_with_mqa.weight [kv_rank+d_rope, hidden]; kv_a_layernorm.weight [kv_rank];
// kv_b_proj.weight [H*(d_nope+d_v), kv_rank]; o_proj.weight [hidden, H*d_v]; optional biases
// q_a_proj.bias, kv_a_proj_with_mqa.bias, o_proj.bias; indexer.wq_b.weight [Hi*di, q_lora];
// indexer.wk.weight [di, hidden]; indexer.k_norm.weight/bias [di];
// indexer.weights_proj.weight [Hi, hidden]; indexer.index_kpool_compress_ape [kpool, di];
// indexer.index_kpool_compress_gate [di, hidden].
class MlaLayer {
 public:
  static Status create(const MlaConfig& cfg, WeightMap& w, std::unique_ptr<MlaLayer>* out);
  const MlaConfig& config() const { return cfg_; }
  bool has_indexer() const { return cfg_.index_heads > 0; }
  // The index list's row width: topk + kpool - 1 on a DSA layer; 0 on a dense one (no list).
  int index_width() const { return cfg_.sparse ? cfg_.topk + cfg_.kpool - 1 : 0; }
  LayerStateSpec state_spec() const;

  // Continue `slot` by T tokens. topk_in [T, index_width] is required for a shared DSA layer
  // (sparse, without its own indexer) and refused (kContractMissing) for any other: a full DSA
  // layer computes its own list, a dense one attends to every row. On the CPU its entries must
  // be -1 or a row the query sees (kContractRange). topk_out [T, index_width] receives the list
  // used (may be nullptr). x, y [T, hidden].
  Status prefill(Cache& cache, int layer, int slot, const float* x, int T, const int32_t* topk_in,
                 float* y, int32_t* topk_out) const;
  // One token for each of `slots` [B]; topk_in/topk_out [B, index_width], topk_in as prefill's
  // (every row's list is checked before any row runs).
  Status decode(Cache& cache, int layer, const int32_t* slots, int B, const float* x,
                const int32_t* topk_in, float* y, int32_t* topk_out) const;
  // The same on a CUDA layer with the slots on the device (see KdaLayer::decode_device): each
  // row's position comes from the cache's device lengths; an idle row (-1) appends nothing,
  // attends to nothing (zero attention output) and gets an all -1 index list.
  Status decode_device(Cache& cache, int layer, const int32_t* slots_d, int B, const float* x,
                       const int32_t* topk_in, float* y, int32_t* topk_out) const;

  // Move the weights to a CUDA device, converted once to `dtype` (kF32 or kBF16; norm weights,
  // biases, conv taps, gate vectors and routers stay f32). From then on the layer runs on that
  // device only: its array arguments are device pointers and its cache a device cache.
  // kUnsupportedGeometry names a geometry the CUDA kernels are not instantiated for.
  Status to_device(std::shared_ptr<CudaContext> cuda, DType dtype);
  const std::shared_ptr<CudaContext>& cuda() const { return cuda_; }

 private:
  struct Gpu;
  struct IndexerRows {
    float *q = nullptr, *k = nullptr, *gate = nullptr, *w = nullptr;
  };
  Status prefill_cuda(Cache& cache, int layer, int slot, const float* x, int T,
                      const int32_t* topk_in, float* y, int32_t* topk_out) const;
  Status decode_cuda(Cache& cache, int layer, const int32_t* slots_d, int B, const float* x,
                     const int32_t* topk_in, float* y, int32_t* topk_out) const;
  struct Projected {  // project_cuda's outputs for N rows
    // q_resid [N, ql] (null without query LoRA), q: q_nope [N, H, d_nope], q_pe [N, H, d_rope]
    // (null without rope columns), ckv [N, R + d_rope] (the cache rows)
    float *q_resid = nullptr, *q = nullptr, *q_pe = nullptr, *ckv = nullptr;
    IndexerRows rows;  // with an own indexer
  };
  // A decode row's tables and cache appends, done by the projections' norm launch
  // (mla_norm_append_decode) when project_cuda gets one (N == 1).
  struct NormAppend {
    const int32_t* slots = nullptr;
    const int32_t* lengths = nullptr;
    int32_t* pos = nullptr;
    int32_t* t_kv = nullptr;
    int n = 0;  // tables: latent (and tail_k, tail_gate, pool_keys)
    void* const* bases = nullptr;
    const int64_t* strides = nullptr;
    void** const* outs = nullptr;
    int cache_dtype = 0;
  };
  Status project_cuda(gpu::Arena& a, const float* x, int N, Projected* out,
                      const NormAppend* append = nullptr) const;
  Status indexer_cuda(gpu::Arena& a, Cache& cache, int layer, int slot, int pos,
                      const IndexerRows& rows, int row0, int T, int32_t* idx) const;
  // The indexer's per-row plane tables at decode (built with the layer's other tables).
  struct IndexerTables {
    void **tail_k = nullptr, **tail_gate = nullptr, **pool_keys = nullptr;
  };
  // The selection's lists compacted for the attention (kpool_select_compact_decode).
  struct Listed {
    int32_t* list = nullptr;  // [B, index_width]
    int* counts = nullptr;    // [B]
    const int32_t* t_kv = nullptr;
    int max_t_kv = 0;
  };
  Status indexer_decode_cuda(gpu::Arena& a, const Cache& cache, const int32_t* pos_d,
                             const IndexerRows& rows, const IndexerTables& tabs, int B,
                             bool appended, int32_t* idx, const Listed* listed) const;
  std::shared_ptr<CudaContext> cuda_;
  std::shared_ptr<Gpu> gpu_;
  Status indexer(Cache& cache, int layer, int slot, int pos, const float* x, const float* q_resid,
                 int T, int32_t* idx) const;
  // kContractMissing naming `op` and topk when topk_in is absent on a shared DSA layer or given
  // to any other.
  Status check_topk_given(const int32_t* topk_in, const char* op) const;
  // The CPU step of prefill once the call is checked (decode runs it row by row).
  Status prefill_host(Cache& cache, int layer, int slot, const float* x, int T,
                      const int32_t* topk_in, float* y, int32_t* topk_out) const;
  MlaConfig cfg_;
  Weight q_a_, q_b_, q_proj_, kv_a_, kv_b_, o_proj_;  // q_proj_: q_lora_rank 0 only
  std::vector<float> q_a_bias_, kv_a_bias_, o_bias_, q_a_norm_, kv_a_norm_;
  Weight wq_b_, wk_, weights_proj_, kpool_gate_;
  std::vector<float> k_norm_w_, k_norm_b_, kpool_ape_;
};

// ------------------------------------------------------------------------------------------ FFN
// Dense SwiGLU MLP with the clamp. Names: gate_proj.weight [I, hidden], up_proj.weight,
// down_proj.weight [hidden, I]. Reference: Glm5NextTextMLP.
class MlpLayer {
 public:
  static Status create(int hidden, int intermediate, float swiglu_limit, WeightMap& w,
                       std::unique_ptr<MlpLayer>* out);
  // x, y [T, hidden] (device pointers after to_device; the CUDA path returns its status).
  Status forward(const float* x, int T, float* y) const;
  // y = forward(x) + add, add [T, hidden] not aliasing y (MoeLayer: the shared expert plus the
  // routed sum; on CUDA at T = 1 the add is the down GEMV's bias, no extra launch).
  Status forward_add(const float* x, int T, const float* add, float* y) const;
  int hidden() const { return hidden_; }

  // Move the weights to a CUDA device, converted once to `dtype` (kF32 or kBF16; norm weights,
  // biases, conv taps, gate vectors and routers stay f32). From then on the layer runs on that
  // device only: its array arguments are device pointers and its cache a device cache.
  // kUnsupportedGeometry names a geometry the CUDA kernels are not instantiated for.
  Status to_device(std::shared_ptr<CudaContext> cuda, DType dtype);
  const std::shared_ptr<CudaContext>& cuda() const { return cuda_; }

  // The uploaded weights (after to_device), for kernels that run this MLP inside a larger op
  // (MoeLayer: the shared expert as one more expert slot of moe_forward).
  struct DeviceView {
    const void *gate = nullptr, *up = nullptr, *down = nullptr;  // [I, hidden] x2, [hidden, I]
    int dtype = 0, intermediate = 0;
    float limit = 0.0f;
  };
  DeviceView device_view() const;

 private:
  Status forward_cuda(const float* x, int T, const float* add, float* y) const;
  std::shared_ptr<CudaContext> cuda_;
  DeviceWeight d_gate_up_, d_down_;  // gate | up: [2 * intermediate, hidden]
  int hidden_ = 0, intermediate_ = 0;
  float limit_ = 0.0f;
  Weight gate_, up_, down_;
};

struct MoeConfig {
  int hidden = 0, n_experts = 0, top_k = 0, n_group = 1, topk_group = 1, intermediate = 0;
  int shared_intermediate = 0;  // 0: no shared expert
  bool norm_topk_prob = true;
  float routed_scaling = 1.0f, swiglu_limit = 0.0f;
  // The router's form (MemraMoeRouteParams::scoring): MEMRA_MOE_SCORE_SIGMOID (glm5_next, Kimi) or
  // MEMRA_MOE_SCORE_SOFTMAX (Qwen: n_group = topk_group = 1, no correction bias).
  int scoring = 0;
  // The shared expert's sigmoid gate (Qwen): y = routed + sigmoid(x . shared_expert_gate) *
  // shared(x), from the tensor shared_expert_gate.weight [1, hidden]; without a shared expert
  // (shared_intermediate 0) the gate scales nothing and its tensor, if given, is dropped.
  bool shared_gate = false;
};

// Routed experts + shared expert. Names: gate.weight [E, hidden]; gate.e_score_correction_bias
// [E] (optional; the sigmoid router only); experts.N.{gate,up}_proj.weight [I, hidden],
// experts.N.down_proj.weight [hidden, I]; shared_experts.{gate,up,down}_proj.weight; with
// MoeConfig::shared_gate shared_expert_gate.weight [1, hidden]. References: Glm5NextTextMoE,
// Qwen3_5MoeSparseMoeBlock, Qwen3NextSparseMoeBlock.
class MoeLayer {
 public:
  static Status create(const MoeConfig& cfg, WeightMap& w, std::unique_ptr<MoeLayer>* out);
  // y [T, hidden]; topk_idx [T, top_k] receives the chosen experts when not nullptr.
  Status forward(const float* x, int T, float* y, int32_t* topk_idx) const;
  const MoeConfig& config() const { return cfg_; }

  // Move the weights to a CUDA device, converted once to `dtype` (kF32 or kBF16; norm weights,
  // biases, conv taps, gate vectors and routers stay f32). From then on the layer runs on that
  // device only: its array arguments are device pointers and its cache a device cache.
  // kUnsupportedGeometry names a geometry the CUDA kernels are not instantiated for.
  Status to_device(std::shared_ptr<CudaContext> cuda, DType dtype);
  const std::shared_ptr<CudaContext>& cuda() const { return cuda_; }

 private:
  Status forward_cuda(const float* x, int T, float* y, int32_t* topk_idx) const;
  std::shared_ptr<CudaContext> cuda_;
  Status shared_gated_cuda(const float* x, int T, float* y) const;
  DeviceWeight d_router_, d_corr_, d_gate_, d_up_, d_down_, d_shared_gate_;
  MoeConfig cfg_;
  Weight router_;
  std::vector<float> corr_bias_, shared_gate_;  // shared_gate_: [hidden] f32 (MoeConfig::shared_gate)
  std::vector<Weight> gate_, up_, down_;
  std::unique_ptr<MlpLayer> shared_;
};

// mHC hyper-connection site (attention or FFN; cpp/src/layers/mhc_layer.cpp, one op::mhc call a
// method on either backend). Names: fn [(2+hc)*hc, hc*hidden], base, scale [3].
// Reference: Glm5NextTextHyperConnection.
class HyperConnection {
 public:
  static Status create(int hidden, int hc, int sinkhorn_iters, float hc_eps, float norm_eps,
                       WeightMap& w, std::unique_ptr<HyperConnection>* out);
  // streams [T, hc, hidden] -> post [T, hc], comb [T, hc, hc], collapsed [T, hidden].
  Status pre(const float* streams, int T, float* post, float* comb, float* collapsed) const;
  // pre, then the block's input RMSNorm: out [T, hidden] = cpu::rms_norm(collapsed, rms_w, rms_eps)
  // with rms_w [hidden] (on the layer's device) or null. On CUDA at decode rows the norm runs
  // inside the mapping's finishing kernel, with the bytes of pre followed by rms_norm.
  Status pre_norm(const float* streams, int T, const float* rms_w, float rms_eps, float* post,
                  float* comb, float* out) const;
  // The previous site's expansion, then this site's pre_norm: streams [T, hc, hidden] =
  // cpu::mhc_post(y [T, hidden], post_prev [T, hc], comb_prev [T, hc, hc], residual [T, hc,
  // hidden]), then pre_norm(streams) into post, comb, out. streams must not overlap residual.
  // On CUDA at one decode row the two are one launch (MemraMhcParams' expand + pre + norm), with
  // the bytes of the two calls.
  Status post_pre_norm(const float* y, const float* post_prev, const float* comb_prev,
                       const float* residual, int T, const float* rms_w, float rms_eps,
                       float* streams, float* post, float* comb, float* out) const;
  int hc() const { return hc_; }
  int hidden() const { return hidden_; }

  // Move the weights to a CUDA device, converted once to `dtype` (kF32 or kBF16; norm weights,
  // biases, conv taps, gate vectors and routers stay f32). From then on the layer runs on that
  // device only: its array arguments are device pointers and its cache a device cache.
  // kUnsupportedGeometry names a geometry the CUDA kernels are not instantiated for.
  Status to_device(std::shared_ptr<CudaContext> cuda, DType dtype);
  const std::shared_ptr<CudaContext>& cuda() const { return cuda_; }

 private:
  // The site's mapping fields (weights on the layer's device) for T rows; the caller sets the
  // steps and arrays.
  MemraMhcParams site(int T) const;
  // op::mhc(p) on the layer's backend (on CUDA over its resident uploaded weights); a failure
  // names `method` and the op.
  Status run(const MemraMhcParams& p, const char* method) const;
  std::shared_ptr<CudaContext> cuda_;
  DeviceWeight d_fn_, d_base_, d_scale_;
  int hidden_ = 0, hc_ = 0, iters_ = 0;
  float hc_eps_ = 0.0f, norm_eps_ = 0.0f;
  Weight fn_;
  std::vector<float> base_, scale_;
};

}  // namespace memra
