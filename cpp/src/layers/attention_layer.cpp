// AttentionLayer (memra/attention_layer.h): the gated full attention of Qwen3.5 / Qwen3-Next,
// its construction and the CPU chain over memra::op (the CUDA chain: attention_layer_cuda.cpp).
// Reference: transformers 5.17 Qwen3_5Attention.forward.
#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "attention_step.h"
#include "gpu_util.h"
#include "host_util.h"
#include "memra/attention_layer.h"
#include "memra/cpu/attention.h"
#include "memra/msg.h"
#include "memra/op/attention.h"
#include "memra/ops.h"

namespace memra {

Status AttentionLayer::create(const AttentionConfig& cfg, WeightMap& w,
                              std::unique_ptr<AttentionLayer>* out) {
  const std::string given = " (hidden=" + std::to_string(cfg.hidden) + ", heads=" +
                            std::to_string(cfg.heads) + ", kv_heads=" + std::to_string(cfg.kv_heads) +
                            ", head_dim=" + std::to_string(cfg.head_dim) + ", rotary_dim=" +
                            std::to_string(cfg.rotary_dim) + ")";
  if (cfg.hidden < 1 || cfg.heads < 1 || cfg.kv_heads < 1 || cfg.head_dim < 1) {
    return Status(kContractValue, "AttentionLayer: hidden, heads, kv_heads and head_dim must be >= 1" + given);
  }
  MEMRA_TRY(check_sizes("AttentionLayer", {{"hidden", cfg.hidden}, {"heads", cfg.heads},
                                           {"kv_heads", cfg.kv_heads}}));
  if (cfg.heads % cfg.kv_heads) {
    return Status(kContractValue, "AttentionLayer: heads must be a multiple of kv_heads" + given);
  }
  if (cfg.head_dim > 256) {
    return Status(kUnsupportedGeometry, "AttentionLayer: head_dim above 256 is not built" + given);
  }
  if (cfg.rotary_dim < 0 || cfg.rotary_dim > cfg.head_dim) {
    return Status(kContractValue, "AttentionLayer: rotary_dim must be in [0, head_dim]" + given);
  }
  if (cfg.rotary_dim % 2) {
    return Status(kContractOddRope, "AttentionLayer: rotary_dim must be even" + given);
  }
  if (!(cfg.rope_theta > 0.0) || !std::isfinite(cfg.rope_theta)) {
    return Status(kContractValue, "AttentionLayer: rope_theta must be finite and > 0, got " +
                                      std::to_string(cfg.rope_theta));
  }
  if (!(cfg.rms_eps >= 0.0f) || !std::isfinite(cfg.rms_eps)) {
    return Status(kContractValue, "AttentionLayer: rms_eps must be finite and >= 0, got " +
                                      std::to_string(cfg.rms_eps));
  }
  // The angle is position x inv_freq in f32 (as transformers): a theta far below 1 makes the
  // largest frequency inf, or so large that an int32 position overflows it, and every rotated
  // row NaN. The same rule as the Python config check (memra/models/qwen_common.py).
  std::vector<float> inv_freq(size_t(cfg.rotary_dim / 2));
  cpu::rope_inv_freq(cfg.rope_theta, cfg.rotary_dim, inv_freq.data());
  for (float f : inv_freq) {
    if (!(static_cast<double>(f) * 2147483648.0 <= static_cast<double>(FLT_MAX))) {
      return Status(kContractValue, (Msg() << "AttentionLayer: rope_theta=" << cfg.rope_theta
                                           << " is too small: its largest RoPE frequency (" << f
                                           << ") times a position overflows float32").str());
    }
  }
  std::unique_ptr<AttentionLayer> l(new AttentionLayer());
  l->cfg_ = cfg;
  const int64_t D = cfg.hidden, Hq = cfg.heads, Hkv = cfg.kv_heads, hd = cfg.head_dim;
  MEMRA_TRY(w.take("q_proj.weight", {Hq * 2 * hd, D}, &l->q_proj_));
  MEMRA_TRY(w.take("k_proj.weight", {Hkv * hd, D}, &l->k_proj_));
  MEMRA_TRY(w.take("v_proj.weight", {Hkv * hd, D}, &l->v_proj_));
  MEMRA_TRY(w.take("o_proj.weight", {D, Hq * hd}, &l->o_proj_));
  MEMRA_TRY(w.take_f32("q_norm.weight", {hd}, &l->q_norm_));
  MEMRA_TRY(w.take_f32("k_norm.weight", {hd}, &l->k_norm_));
  if (w.has("q_proj.bias")) MEMRA_TRY(w.take_f32("q_proj.bias", {Hq * 2 * hd}, &l->q_bias_));
  if (w.has("k_proj.bias")) MEMRA_TRY(w.take_f32("k_proj.bias", {Hkv * hd}, &l->k_bias_));
  if (w.has("v_proj.bias")) MEMRA_TRY(w.take_f32("v_proj.bias", {Hkv * hd}, &l->v_bias_));
  if (w.has("o_proj.bias")) MEMRA_TRY(w.take_f32("o_proj.bias", {D}, &l->o_bias_));
  MEMRA_TRY(w.finish());
  // Qwen3_5RMSNorm: output * (1.0 + self.weight.float()), the sum rounded to f32 once.
  for (float& v : l->q_norm_) v = 1.0f + v;
  for (float& v : l->k_norm_) v = 1.0f + v;
  l->inv_freq_ = std::move(inv_freq);
  l->scale_ = static_cast<float>(std::pow(static_cast<double>(cfg.head_dim), -0.5));
  *out = std::move(l);
  return Status::Ok();
}

LayerStateSpec AttentionLayer::state_spec() const {
  LayerStateSpec s;
  s.kind = LayerStateSpec::Kind::kAttention;
  s.heads = cfg_.kv_heads;
  s.head_dim = cfg_.head_dim;
  return s;
}

Status AttentionLayer::check_cache(const Cache& cache, int layer, const char* op) const {
  MEMRA_TRY(cache.check_layer(layer, state_spec(), op));
  return cache.check_device(cuda_, op);
}

namespace {

const float* or_null(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

}  // namespace

Status AttentionLayer::attend(const op::Backend& b, const Step& s, const float* q_norm,
                              const float* k_norm, const float* inv_freq) const {
  const int Hq = cfg_.heads, Hkv = cfg_.kv_heads, hd = cfg_.head_dim;
  MemraAttnPrepParams pp = {};
  pp.qg = s.qg;
  pp.ld_qg = s.ld_qg;
  pp.k = s.k;
  pp.ld_k = s.ld_k;
  pp.T = s.T;
  pp.Hq = Hq;
  pp.Hkv = Hkv;
  pp.hd = hd;
  pp.q_norm = q_norm;
  pp.k_norm = k_norm;
  pp.eps = cfg_.rms_eps;
  pp.n_rot = cfg_.rotary_dim;
  pp.inv_freq = cfg_.rotary_dim > 0 ? inv_freq : nullptr;
  pp.pos0 = s.pos0;
  pp.slots = s.slots;
  pp.lengths = s.lengths;
  pp.q = s.q;
  pp.gate = s.gate;
  pp.k_out = s.k_out;

  MemraKvAppendParams ap = {};
  ap.k = s.k_out;
  ap.ld_k = int64_t(Hkv) * hd;
  ap.v = s.v;
  ap.ld_v = s.ld_v;
  ap.T = s.T;
  ap.Hkv = Hkv;
  ap.hd = hd;
  ap.k_cache = s.k_cache;
  ap.v_cache = s.v_cache;
  ap.cache_dtype = s.cache_dtype;
  ap.max_len = s.max_len;
  ap.slot_stride = s.slot_stride;
  ap.pos0 = s.pos0;
  ap.slots = s.slots;
  ap.lengths = s.lengths;
  // The prologue, then the rows' keys (k_out) and values into the cache (one launch on CUDA).
  MEMRA_TRY(op::attn_prep_append(b, pp, ap));

  MemraAttnParams at = {};
  at.q = s.q;
  at.gate = s.gate;
  at.o = s.o;
  at.k_cache = s.k_cache;
  at.v_cache = s.v_cache;
  at.cache_dtype = s.cache_dtype;
  at.max_len = s.max_len;
  at.slot_stride = s.slot_stride;
  at.T = s.T;
  at.Hq = Hq;
  at.Hkv = Hkv;
  at.hd = hd;
  at.scale = scale_;
  at.pos0 = s.pos0;
  at.slots = s.slots;
  at.lengths = s.lengths;
  return op::attention(b, at);
}

// The rows' placement in the cache (Step's where fields and planes): one slot's planes with the
// rows at its length (a prefill), or slot 0's planes with each row at its slot's length.
namespace {

AttentionLayer::Step direct_rows(Cache& cache, int layer, int slot, int T) {
  AttentionLayer::Step s;
  s.T = T;
  s.pos0 = cache.length(slot);
  s.k_cache = cache.attn_k(layer, slot);
  s.v_cache = cache.attn_v(layer, slot);
  s.cache_dtype = static_cast<int>(cache.latent_dtype());
  s.max_len = cache.max_len();
  return s;
}

AttentionLayer::Step device_rows(Cache& cache, int layer, const int32_t* slots,
                                 const int32_t* lengths, int B, int64_t kv_row) {
  AttentionLayer::Step s;
  s.T = B;
  s.slots = slots;
  s.lengths = lengths;
  s.k_cache = cache.attn_k(layer, 0);
  s.v_cache = cache.attn_v(layer, 0);
  s.cache_dtype = static_cast<int>(cache.latent_dtype());
  s.max_len = cache.max_len();
  s.slot_stride = int64_t(cache.max_len()) * kv_row;
  return s;
}

}  // namespace

Status AttentionLayer::run_cpu(const float* x, Step s, float* y) const {
  const int N = s.T, Hq = cfg_.heads, Hkv = cfg_.kv_heads, hd = cfg_.head_dim;
  std::vector<float> qg(size_t(N) * Hq * 2 * hd), k(size_t(N) * Hkv * hd), v(size_t(N) * Hkv * hd),
      q(size_t(N) * Hq * hd), gate(size_t(N) * Hq * hd), o(size_t(N) * Hq * hd);
  MEMRA_TRY(host::linear(x, N, q_proj_, or_null(q_bias_), qg.data()));
  MEMRA_TRY(host::linear(x, N, k_proj_, or_null(k_bias_), k.data()));
  MEMRA_TRY(host::linear(x, N, v_proj_, or_null(v_bias_), v.data()));
  s.qg = qg.data();
  s.ld_qg = int64_t(Hq) * 2 * hd;
  s.k = k.data();
  s.ld_k = int64_t(Hkv) * hd;
  s.v = v.data();
  s.ld_v = int64_t(Hkv) * hd;
  s.q = q.data();
  s.gate = gate.data();
  s.k_out = k.data();
  s.o = o.data();
  MEMRA_TRY(attend(op::Backend{}, s, q_norm_.data(), k_norm_.data(), inv_freq_.data()));
  return host::linear(o.data(), N, o_proj_, or_null(o_bias_), y);
}

Status AttentionLayer::prefill(Cache& cache, int layer, int slot, const float* x, int T, float* y) const {
  const char* op = "AttentionLayer.prefill";
  MEMRA_TRY(check_cache(cache, layer, op));
  MEMRA_TRY(cache.check_room(slot, T, op));
  const Step s = direct_rows(cache, layer, slot, T);
  return gpu_ ? run_cuda(x, s, y) : run_cpu(x, s, y);
}

Status AttentionLayer::decode(Cache& cache, int layer, const int32_t* slots, int B, const float* x,
                              float* y) const {
  const char* op = "AttentionLayer.decode";
  MEMRA_TRY(check_cache(cache, layer, op));
  for (int b = 0; b < B; ++b) MEMRA_TRY(cache.check_room(slots[b], 1, op));
  const int64_t kv_row = int64_t(cfg_.kv_heads) * cfg_.head_dim;
  if (gpu_) {
    int32_t* slots_d = nullptr;
    gpu::Arena a(cuda_);
    MEMRA_TRY(a.upload(std::vector<int32_t>(slots, slots + B), &slots_d));
    return run_cuda(x, device_rows(cache, layer, slots_d, cache.lengths_d(), B, kv_row), y);
  }
  // The device-form ops with host slots and lengths.
  std::vector<int32_t> lengths(size_t(cache.max_batch()));
  for (int s = 0; s < cache.max_batch(); ++s) lengths[s] = cache.length(s);
  return run_cpu(x, device_rows(cache, layer, slots, lengths.data(), B, kv_row), y);
}

Status AttentionLayer::decode_device(Cache& cache, int layer, const int32_t* slots_d, int B,
                                     const float* x, float* y) const {
  const char* op = "AttentionLayer.decode";
  MEMRA_TRY(check_cache(cache, layer, op));
  if (!gpu_) return Status(kUnsupported, "AttentionLayer.decode: device slots need a CUDA layer");
  return run_cuda(x, device_rows(cache, layer, slots_d, cache.lengths_d(), B,
                                 int64_t(cfg_.kv_heads) * cfg_.head_dim), y);
}

}  // namespace memra
