// Layer objects (layers.h) over DLPack arrays: construction from named Weights, stateless
// forward and cache-backed prefill / decode.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "common.h"
#include "device_args.h"
#include "layer_args.h"
#include "memra/decode_step.h"
#include "memra/engine.h"
#include "memra/layers.h"
#include "nogil.h"

namespace memra::py {

namespace {

using Weights = std::map<std::string, Weight>;

// The compute dtype of a CUDA layer's weights ('float32' or 'bfloat16').
DType compute_dtype(const std::string& dtype, const char* what) {
  if (dtype == "float32") return DType::kF32;
  if (dtype == "bfloat16") return DType::kBF16;
  raise_contract(kContractValue, std::string(what) + ": dtype must be 'float32' or 'bfloat16', got '" + dtype + "'");
}

// Place a freshly made layer on the engine's device (no-op for the CPU).
template <typename L>
void place(L& l, const Engine& engine, const std::string& dtype, const char* what) {
  const DType d = compute_dtype(dtype, what);
  if (engine.is_cuda()) check(l.to_device(engine.cuda(), d));
}

size_t sz(int64_t v) { return static_cast<size_t>(v); }

// MoeLayer.forward's work: y [T, hidden] and the chosen experts [T, top_k] (both bindings run the
// same call with the same outputs, so forward and forward_with_experts give the same bytes).
std::pair<Out, Out> moe_forward(const MoeLayer& l, const AnyArray& x, const char* op) {
  const int D = l.config().hidden;
  const float* xp = f32_in(l.cuda(), x, op, "x", {-1, D});
  const int T = int(dim(x, 0));
  Out y = out_f32(l.cuda(), {sz(T), sz(D)}, false);
  Out idx = out_i32(l.cuda(), {sz(T), sz(l.config().top_k)}, false);
  Status st;
  {
    ReleasedGil nogil;
    st = l.forward(xp, T, y.data<float>(), idx.data<int32_t>());
  }
  check(st);
  return {std::move(y), std::move(idx)};
}

// Raise a layer's create() failure with the arguments it was given appended, so that an error
// found from the weights ("tensor 'fn' has shape [24, 256], expected [15, 192]") also names the
// argument behind it (hc_mult=3).
void check_made(const Status& st, const std::string& args) {
  if (!st.ok()) raise_status(Status(st.code, st.message + " (given " + args + ")"));
}

// "name=value, ..." of a layer's int arguments, for check_made.
std::string given(std::initializer_list<std::pair<const char*, int64_t>> args) {
  std::string s;
  for (const auto& [name, v] : args) s += (s.empty() ? "" : ", ") + std::string(name) + "=" + std::to_string(v);
  return s;
}

// A router's scoring by name ('sigmoid' or 'softmax'), as MemraMoeRouteParams::scoring.
int router_scoring(const std::string& scoring, const char* what) {
  if (scoring == "sigmoid") return MEMRA_MOE_SCORE_SIGMOID;
  if (scoring == "softmax") return MEMRA_MOE_SCORE_SOFTMAX;
  raise_contract(kContractValue, std::string(what) + ": scoring must be 'sigmoid' or 'softmax', got '" +
                                     scoring + "'");
}

// The SwiGLU clamp: > 0 (inf: no clamp), as swiglu_mlp takes it.
void check_limit(float limit, const char* what) {
  check_value(limit > 0.0f, what,
              "swiglu_limit must be > 0 (inf: no clamp), got " + std::to_string(limit));
}

}  // namespace

void init_layers(nb::module_& m) {
  // -------------------------------------------------------------------------------- KdaLayer
  nb::class_<KdaLayer>(m, "KdaLayer",
                       "Kimi Delta Attention mixer (reference: transformers "
                       "Glm5NextTextLinearAttention.forward; KimiDeltaAttention with the softplus "
                       "gate). Weights named as on disk below 'self_attn.' (layers.h). Every size "
                       "argument is at most 2^20 (ContractError naming it).")
      .def(
          "__init__",
          [](KdaLayer* self, const Engine& engine, Weights weights, int hidden, int heads,
             int head_dim, int conv_kernel, const std::string& gate, float lower_bound,
             float rms_eps, const std::string& dtype) {
            if (gate == "lower_bound") {
              check_lower_bound(lower_bound, "KdaLayer", "lower_bound");
            } else {
              check_finite(lower_bound, "KdaLayer", "lower_bound");
            }
            check_eps(rms_eps, "KdaLayer", "rms_eps");
            KdaConfig c;
            c.hidden = hidden;
            c.heads = heads;
            c.head_dim = head_dim;
            c.conv_kernel = conv_kernel;
            if (gate == "lower_bound") {
              c.gate_form = cpu::KdaGateForm::kLowerBound;
            } else if (gate == "softplus") {
              c.gate_form = cpu::KdaGateForm::kSoftplus;
            } else {
              raise_contract(kContractValue, "KdaLayer: gate must be 'lower_bound' or 'softplus', got '" + gate + "'");
            }
            c.lower_bound = lower_bound;
            c.rms_eps = rms_eps;
            WeightMap wm(std::move(weights), "KdaLayer");
            std::unique_ptr<KdaLayer> l;
            check_made(KdaLayer::create(c, wm, &l),
                       given({{"hidden", hidden}, {"heads", heads}, {"head_dim", head_dim},
                              {"conv_kernel", conv_kernel}}));
            place(*l, engine, dtype, "KdaLayer");
            new (self) KdaLayer(std::move(*l));
          },
          nb::arg("engine"), nb::arg("weights"), nb::kw_only(), nb::arg("hidden"), nb::arg("heads"),
          nb::arg("head_dim"), nb::arg("conv_kernel"), nb::arg("gate") = "lower_bound",
          nb::arg("lower_bound") = -5.0f, nb::arg("rms_eps") = 1e-5f, nb::arg("dtype") = "bfloat16",
          "engine: where the layer runs; weights: {name below 'self_attn.': Weight}; hidden, "
          "heads (linear_num_heads), head_dim (linear_head_dim; dk = dv), conv_kernel "
          "(linear_conv_kernel_dim); gate: 'lower_bound' (glm5_next: g = lower_bound * "
          "sigmoid(exp(A_log) * (f + dt_bias)), lower_bound <= 0 and finite) or 'softplus' "
          "(Kimi-Linear: g = -exp(A_log) * softplus(f + dt_bias), lower_bound unused); rms_eps "
          "(rms_norm_eps: the gated output norm's epsilon, finite and >= 0); dtype: the "
          "projections' compute dtype on CUDA ('float32' or 'bfloat16'). ContractError names a "
          "missing or mis-shaped tensor, a bad size, gate, lower_bound, rms_eps or dtype; on "
          "CUDA UnsupportedError unless head_dim = 128 and conv_kernel is 2..8.")
      .def("state_spec", &KdaLayer::state_spec,
           "The cache plane this layer needs (memra._core.LayerStateSpec: kind 'kda', the conv "
           "ring and the recurrent state's sizes), for Cache(...)'s specs.")
      .def(
          "forward",
          [](const KdaLayer& l, const AnyArray& x) {
            return layer_rows(l, x, -1, "KdaLayer.forward",
                              [&](const float* xp, int T, float* y) { return l.forward(xp, T, y); });
          },
          nb::arg("x"), "x [T, hidden] f32 -> y [T, hidden] from a zero state (CPU layers; "
          "UnsupportedError on a CUDA layer, which runs against a cache).")
      .def(
          "prefill",
          [](const KdaLayer& l, Cache& cache, Index layer, Index slot, const AnyArray& x) {
            return layer_rows(l, x, -1, "KdaLayer.prefill", [&](const float* xp, int T, float* y) {
              return l.prefill(cache, layer, slot, xp, T, y);
            });
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slot"), nb::arg("x"),
          "Continue `slot` by x [T, hidden]; writes the pending state plane, visible after "
          "cache.commit(slot, T). CacheFullError when the slot has no room.")
      .def(
          "decode",
          [](const KdaLayer& l, Cache& cache, Index layer, const AnyArray& slots, const AnyArray& x) {
            return layer_decode(l, cache, layer, slots, x, "KdaLayer.decode");
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slots"), nb::arg("x"),
          "One token for each slot: slots [B] int32, x [B, hidden] -> [B, hidden].")
      .def(
          "decode",
          [](const KdaLayer& l, Cache& cache, Index layer, const DecodeSlots& slots, const AnyArray& x) {
            return layer_decode_device(l, cache, layer, slots, x, "KdaLayer.decode");
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slots"), nb::arg("x"),
          "The same with the rows' slots on the device (memra._core.DecodeSlots of `cache`, CUDA): x "
          "[slots.size, hidden]; idle rows touch no state and give meaningless finite rows. "
          "Capturable into a CUDA graph (no host round trip).");

  // -------------------------------------------------------------------------------- MlaLayer
  nb::class_<MlaLayer>(m, "MlaLayer",
                       "Multi-head latent attention (absorbed) with the optional DSA k-pool "
                       "indexer (reference: transformers Glm5NextTextAttention + "
                       "Glm5NextTextIndexer; KimiLinearAttention). Weights named as on disk below "
                       "'self_attn.'. q_lora_rank 0: no query LoRA, q = q_proj(x). rms_eps: the "
                       "epsilon of q_a_layernorm and kv_a_layernorm. rotate: whether the d_rope "
                       "columns are rotated (the family decides, never d_rope > 0). CUDA: "
                       "UnsupportedError for rotated rope columns (rotate with d_rope > 0; the "
                       "CPU runs them). Every size argument but tail_rows is at most 2^20 "
                       "(ContractError naming it).")
      .def(
          "__init__",
          [](MlaLayer* self, const Engine& engine, Weights weights, int hidden, int heads,
             int q_lora_rank, int kv_rank, int d_nope, int d_rope, int d_v, float rms_eps,
             bool sparse, int index_heads, int index_head_dim, int kpool, int topk, int tail_rows,
             bool rotate, float rope_base, const std::string& dtype) {
            check_eps(rms_eps, "MlaLayer", "rms_eps");
            check_nonneg(tail_rows, "MlaLayer", "tail_rows");
            check_value(std::isfinite(rope_base) && rope_base > 0.0f, "MlaLayer",
                        "rope_base must be finite and > 0, got " + std::to_string(rope_base));
            MlaConfig c;
            c.hidden = hidden;
            c.heads = heads;
            c.q_lora_rank = q_lora_rank;
            c.kv_rank = kv_rank;
            c.d_nope = d_nope;
            c.d_rope = d_rope;
            c.d_v = d_v;
            c.rms_eps = rms_eps;
            c.sparse = sparse;
            c.index_heads = index_heads;
            c.index_head_dim = index_head_dim;
            c.kpool = kpool;
            c.topk = topk;
            // 2 * kpool in int64, saturated: a kpool past MlaLayer's size bound is refused by
            // create (naming kpool), never wrapped into a negative ring.
            c.tail_rows = tail_rows > 0 ? tail_rows : int(std::min<int64_t>(2 * int64_t(kpool), INT_MAX));
            c.rotate = rotate;
            c.rope_base = rope_base;
            WeightMap wm(std::move(weights), "MlaLayer");
            std::unique_ptr<MlaLayer> l;
            check_made(MlaLayer::create(c, wm, &l),
                       given({{"hidden", hidden}, {"heads", heads}, {"q_lora_rank", q_lora_rank},
                              {"kv_rank", kv_rank}, {"d_nope", d_nope}, {"d_rope", d_rope}, {"d_v", d_v},
                              {"index_heads", index_heads}, {"index_head_dim", index_head_dim},
                              {"kpool", kpool}, {"topk", topk}, {"tail_rows", c.tail_rows}}));
            place(*l, engine, dtype, "MlaLayer");
            new (self) MlaLayer(std::move(*l));
          },
          nb::arg("engine"), nb::arg("weights"), nb::kw_only(), nb::arg("hidden"), nb::arg("heads"),
          nb::arg("q_lora_rank"), nb::arg("kv_rank"), nb::arg("d_nope"), nb::arg("d_rope"),
          nb::arg("d_v"), nb::arg("rms_eps") = 1e-5f, nb::arg("sparse") = false,
          nb::arg("index_heads") = 0, nb::arg("index_head_dim") = 0, nb::arg("kpool") = 0,
          nb::arg("topk") = 0, nb::arg("tail_rows") = 0, nb::arg("rotate") = false,
          nb::arg("rope_base") = 10000.0f, nb::arg("dtype") = "bfloat16",
          "engine: where the layer runs; weights: {name below 'self_attn.': Weight}; hidden, "
          "heads (num_attention_heads), q_lora_rank (0: q_proj), kv_rank (kv_lora_rank), d_nope "
          "(qk_nope_head_dim), d_rope (qk_rope_head_dim), d_v (v_head_dim), rms_eps; sparse: "
          "whether the layer runs its own DSA indexer (a full DSA layer: weights below "
          "'indexer.'), with index_heads (index_n_heads), index_head_dim, kpool (index_kpool) and "
          "topk (index_topk, a multiple of kpool); tail_rows: the incomplete tail rows the "
          "indexer's list keeps (its kpool ring); a dense layer (sparse=False) takes none of "
          "these sizes (each 0; ContractError otherwise); rotate and rope_base "
          "(rope_theta) for rotated rope columns; dtype: the projections' compute dtype on CUDA "
          "('float32' or 'bfloat16'). ContractError names a missing or mis-shaped tensor (40024 "
          "/ 40000), a bad size, rms_eps, rope_base or dtype (40025).")
      .def("state_spec", &MlaLayer::state_spec,
           "The cache plane this layer needs (memra._core.LayerStateSpec: kind 'mla', the latent "
           "row width and, with the indexer, the pool keys' and tail ring's), for Cache(...)'s "
           "specs.")
      .def_prop_ro("index_width", &MlaLayer::index_width,
                   "The index list's row width: index_topk + index_kpool - 1 on a DSA layer, 0 on a "
                   "dense one.")
      .def_prop_ro("has_indexer", &MlaLayer::has_indexer,
                   "Whether the layer runs its own DSA indexer (sparse=True).")
      .def(
          "prefill",
          [](const MlaLayer& l, Cache& cache, Index layer, Index slot, const AnyArray& x,
             std::optional<AnyArray> topk) {
            const int D = l.config().hidden, W = l.index_width();
            const float* xp = f32_in(l.cuda(), x, "MlaLayer.prefill", "x", {-1, D});
            const int T = int(dim(x, 0));
            const int32_t* tp = topk ? i32_in(l.cuda(), *topk, "MlaLayer.prefill", "topk", {T, W}) : nullptr;
            Out y = out_f32(l.cuda(), {sz(T), sz(D)}, false);
            Out idx = out_i32(l.cuda(), {sz(T), sz(l.config().sparse ? W : 0)}, false);
            Status st;
            {
              ReleasedGil nogil;
              st = l.prefill(cache, layer, slot, xp, T, tp, y.data<float>(),
                             l.config().sparse ? idx.data<int32_t>() : nullptr);
            }
            check(st);
            return nb::make_tuple(y.obj, idx.obj);
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slot"), nb::arg("x"),
          nb::arg("topk") = nb::none(),
          "Continue `slot` by x [T, hidden] -> (y [T, hidden], index list [T, index_width] int32 "
          "used by a DSA layer, [T, 0] otherwise). `topk` [T, index_width] int32: required by a "
          "shared DSA layer (sparse, no indexer of its own: the index list of the full DSA layer "
          "before it; each entry -1 or a row the query sees, checked on the CPU) and refused by "
          "any other (ContractError naming topk: a full DSA layer computes its own list, a dense "
          "layer attends to every row). Latent rows land past the slot's length and become "
          "visible at cache.commit.")
      .def(
          "decode",
          [](const MlaLayer& l, Cache& cache, Index layer, const AnyArray& slots, const AnyArray& x,
             std::optional<AnyArray> topk) {
            const int D = l.config().hidden, W = l.index_width();
            const int32_t* sp = slots_arg(slots, cache, "MlaLayer.decode");
            const int B = int(dim(slots, 0));
            const float* xp = f32_in(l.cuda(), x, "MlaLayer.decode", "x", {B, D});
            const int32_t* tp = topk ? i32_in(l.cuda(), *topk, "MlaLayer.decode", "topk", {B, W}) : nullptr;
            Out y = out_f32(l.cuda(), {sz(B), sz(D)}, false);
            Out idx = out_i32(l.cuda(), {sz(B), sz(l.config().sparse ? W : 0)}, false);
            Status st;
            {
              ReleasedGil nogil;
              st = l.decode(cache, layer, sp, B, xp, tp, y.data<float>(),
                            l.config().sparse ? idx.data<int32_t>() : nullptr);
            }
            check(st);
            return nb::make_tuple(y.obj, idx.obj);
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slots"), nb::arg("x"),
          nb::arg("topk") = nb::none(),
          "One token for each of slots [B]: as prefill with T = 1, `topk` [B, index_width] under "
          "the same rule (every row's list is checked before any row runs).")
      .def(
          "decode",
          [](const MlaLayer& l, Cache& cache, Index layer, const DecodeSlots& slots, const AnyArray& x,
             std::optional<AnyArray> topk) {
            const char* op = "MlaLayer.decode";
            const int D = l.config().hidden, W = l.index_width(), B = slots.size();
            check_decode_slots(slots, cache, op);
            const float* xp = f32_in(l.cuda(), x, op, "x", {B, D});
            const int32_t* tp = topk ? i32_in(l.cuda(), *topk, op, "topk", {B, W}) : nullptr;
            Out y = out_f32(l.cuda(), {sz(B), sz(D)}, false);
            Out idx = out_i32(l.cuda(), {sz(B), sz(l.config().sparse ? W : 0)}, false);
            check(l.decode_device(cache, layer, slots.data(), B, xp, tp, y.data<float>(),
                                  l.config().sparse ? idx.data<int32_t>() : nullptr));
            return nb::make_tuple(y.obj, idx.obj);
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slots"), nb::arg("x"),
          nb::arg("topk") = nb::none(),
          "The same with the rows' slots on the device (memra._core.DecodeSlots of `cache`, CUDA): each "
          "row's position comes from the cache's device length; an idle row appends nothing, "
          "gets a zero attention output and an all -1 index list. `topk` as above (its entries are "
          "not read back: the kernel skips those outside [0, the row's position]). Capturable "
          "into a CUDA graph.");

  // -------------------------------------------------------------------------------- FFN
  nb::class_<MlpLayer>(m, "MlpLayer",
                       "Dense SwiGLU MLP with the asymmetric clamp (reference: Glm5NextTextMLP). "
                       "Weights: gate_proj.weight, up_proj.weight, down_proj.weight. hidden and "
                       "intermediate at most 2^20 (ContractError naming it).")
      .def(
          "__init__",
          [](MlpLayer* self, const Engine& engine, Weights weights, int hidden, int intermediate,
             float swiglu_limit, const std::string& dtype) {
            check_limit(swiglu_limit, "MlpLayer");
            WeightMap wm(std::move(weights), "MlpLayer");
            std::unique_ptr<MlpLayer> l;
            const std::string args = given({{"hidden", hidden}, {"intermediate", intermediate}});
            check_made(MlpLayer::create(hidden, intermediate, swiglu_limit, wm, &l), args);
            check_made(wm.finish(), args);
            place(*l, engine, dtype, "MlpLayer");
            new (self) MlpLayer(std::move(*l));
          },
          nb::arg("engine"), nb::arg("weights"), nb::kw_only(), nb::arg("hidden"),
          nb::arg("intermediate"), nb::arg("swiglu_limit"), nb::arg("dtype") = "bfloat16",
          "engine: where the layer runs; weights: {name below 'mlp.': Weight}; hidden, "
          "intermediate (intermediate_size); swiglu_limit (> 0; inf: no clamp); dtype: the "
          "compute dtype on CUDA ('float32' or 'bfloat16'). ContractError for a missing (40024) "
          "or mis-shaped (40000) tensor, a bad size, a swiglu_limit <= 0 or another dtype "
          "(40025).")
      .def(
          "forward",
          [](const MlpLayer& l, const AnyArray& x) {
            const float* xp = f32_in(l.cuda(), x, "MlpLayer.forward", "x", {-1, l.hidden()});
            const int T = int(dim(x, 0));
            Out y = out_f32(l.cuda(), {sz(T), sz(l.hidden())}, false);
            Status st;
            {
              ReleasedGil nogil;
              st = l.forward(xp, T, y.data<float>());
            }
            check(st);
            return y.obj;
          },
          nb::arg("x"), "x [T, hidden] float32 on the layer's device -> [T, hidden] float32. "
          "ContractError (CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE) "
          "for a bad x.");

  nb::class_<MoeLayer>(m, "MoeLayer",
                       "Routed experts + shared expert (references: Glm5NextTextMoE; with "
                       "scoring='softmax' and shared_gate, Qwen3_5MoeSparseMoeBlock / "
                       "Qwen3NextSparseMoeBlock). Weights: gate.weight, "
                       "gate.e_score_correction_bias (the sigmoid router: required; the softmax one has "
                       "none), "
                       "experts.N.{gate,up,down}_proj.weight, shared_experts.{gate,up,down}_proj."
                       "weight, shared_expert_gate.weight [1, hidden] (shared_gate). hidden, "
                       "n_experts, intermediate and shared_intermediate at most 2^20 "
                       "(ContractError naming it).")
      .def(
          "__init__",
          [](MoeLayer* self, const Engine& engine, Weights weights, int hidden, int n_experts,
             int top_k, int n_group, int topk_group, int intermediate, int shared_intermediate,
             bool norm_topk_prob, float routed_scaling, float swiglu_limit, const std::string& scoring,
             bool shared_gate, const std::string& dtype) {
            check_limit(swiglu_limit, "MoeLayer");
            check_finite(routed_scaling, "MoeLayer", "routed_scaling");
            const int score = router_scoring(scoring, "MoeLayer");
            MoeConfig c;
            c.scoring = score;
            c.shared_gate = shared_gate;
            c.hidden = hidden;
            c.n_experts = n_experts;
            c.top_k = top_k;
            c.n_group = n_group;
            c.topk_group = topk_group;
            c.intermediate = intermediate;
            c.shared_intermediate = shared_intermediate;
            c.norm_topk_prob = norm_topk_prob;
            c.routed_scaling = routed_scaling;
            c.swiglu_limit = swiglu_limit;
            WeightMap wm(std::move(weights), "MoeLayer");
            std::unique_ptr<MoeLayer> l;
            check_made(MoeLayer::create(c, wm, &l),
                       given({{"hidden", hidden}, {"n_experts", n_experts}, {"top_k", top_k},
                              {"n_group", n_group}, {"topk_group", topk_group}, {"intermediate", intermediate},
                              {"shared_intermediate", shared_intermediate}}));
            place(*l, engine, dtype, "MoeLayer");
            new (self) MoeLayer(std::move(*l));
          },
          nb::arg("engine"), nb::arg("weights"), nb::kw_only(), nb::arg("hidden"),
          nb::arg("n_experts"), nb::arg("top_k"), nb::arg("n_group"), nb::arg("topk_group"),
          nb::arg("intermediate"), nb::arg("shared_intermediate"), nb::arg("norm_topk_prob"),
          nb::arg("routed_scaling"), nb::arg("swiglu_limit"), nb::arg("scoring") = "sigmoid",
          nb::arg("shared_gate") = false, nb::arg("dtype") = "bfloat16",
          "scoring: the router's form, 'sigmoid' (grouped, glm5_next / Kimi-Linear) or 'softmax' "
          "(Qwen: softmax over the f32 logits, top_k, renormalised when norm_topk_prob; n_group "
          "and topk_group 1). shared_gate: y = routed + sigmoid(x . shared_expert_gate) * "
          "shared(x) (Qwen). shared_intermediate 0: no shared expert, as transformers' "
          "zero-width one adds nothing (the empty shared_experts tensors [0, hidden] / [hidden, 0] "
          "its save_pretrained writes, and shared_expert_gate.weight, are taken and dropped). "
          "Raises ContractError naming a "
          "missing, extra or mis-shaped tensor or a bad count or scoring.")
      .def(
          "forward",
          [](const MoeLayer& l, const AnyArray& x) {
            return moe_forward(l, x, "MoeLayer.forward").first.obj;
          },
          nb::arg("x"),
          "x [T, hidden] float32 -> y [T, hidden] float32, on the layer's device: the same kind "
          "of result as MlpLayer.forward, so a decoder loop calls every FFN alike "
          "(forward_with_experts also returns the chosen experts).")
      .def(
          "forward_with_experts",
          [](const MoeLayer& l, const AnyArray& x) {
            auto [y, idx] = moe_forward(l, x, "MoeLayer.forward_with_experts");
            return nb::make_tuple(y.obj, idx.obj);
          },
          nb::arg("x"),
          "x [T, hidden] -> (y [T, hidden] float32, chosen experts [T, top_k] int32): forward's "
          "y byte for byte, and the router's choice.");

  nb::class_<HyperConnection>(m, "HyperConnection",
                              "mHC site (reference: Glm5NextTextHyperConnection). Weights: fn, "
                              "base, scale (hc_attn_* / hc_ffn_* on disk). sinkhorn_iters in "
                              "[1, 1000] (a bound on the uninterruptible Sinkhorn loop; the "
                              "checkpoints use 20); hidden and hc_mult at most 2^20.")
      .def(
          "__init__",
          [](HyperConnection* self, const Engine& engine, Weights weights, int hidden, int hc_mult,
             int sinkhorn_iters, float hc_eps, float norm_eps, const std::string& dtype) {
            check_eps(hc_eps, "HyperConnection", "hc_eps");
            check_eps(norm_eps, "HyperConnection", "norm_eps");
            WeightMap wm(std::move(weights), "HyperConnection");
            std::unique_ptr<HyperConnection> l;
            check_made(HyperConnection::create(hidden, hc_mult, sinkhorn_iters, hc_eps, norm_eps, wm, &l),
                       given({{"hidden", hidden}, {"hc_mult", hc_mult}, {"sinkhorn_iters", sinkhorn_iters}}));
            place(*l, engine, dtype, "HyperConnection");
            new (self) HyperConnection(std::move(*l));
          },
          nb::arg("engine"), nb::arg("weights"), nb::kw_only(), nb::arg("hidden"),
          nb::arg("hc_mult"), nb::arg("sinkhorn_iters"), nb::arg("hc_eps"), nb::arg("norm_eps"),
          nb::arg("dtype") = "bfloat16",
          "engine: where the site runs; weights: {fn, base, scale}; hidden; hc_mult (the "
          "residual streams); sinkhorn_iters (hc_sinkhorn_iters); hc_eps (the floor added to pre, "
          "comb and each Sinkhorn denominator); norm_eps (rms_norm_eps of the unweighted input "
          "norm); dtype: fn's compute dtype on CUDA ('float32' or 'bfloat16'). ContractError for "
          "a missing or mis-shaped weight, a bad size, an eps negative or not finite, or another "
          "dtype.")
      .def(
          "pre",
          [](const HyperConnection& l, const AnyArray& streams, std::optional<AnyArray> norm,
             std::optional<float> eps) {
            const char* op = "HyperConnection.pre";
            const int hc = l.hc(), D = l.hidden();
            const float* sp = f32_in(l.cuda(), streams, op, "streams", {-1, hc, D});
            const float* np = norm ? f32_in(l.cuda(), *norm, op, "norm", {D}) : nullptr;
            check_value(eps || !norm, op, "a norm weight needs its eps");
            if (eps) check_eps(*eps, op);
            const int T = int(dim(streams, 0));
            Out post = out_f32(l.cuda(), {sz(T), sz(hc)}, false);
            Out comb = out_f32(l.cuda(), {sz(T), sz(hc), sz(hc)}, false);
            Out collapsed = out_f32(l.cuda(), {sz(T), sz(D)}, false);
            Status st;
            {
              ReleasedGil nogil;
              st = eps ? l.pre_norm(sp, T, np, *eps, post.data<float>(), comb.data<float>(),
                                    collapsed.data<float>())
                       : l.pre(sp, T, post.data<float>(), comb.data<float>(),
                               collapsed.data<float>());
            }
            check(st);
            return nb::make_tuple(post.obj, comb.obj, collapsed.obj);
          },
          nb::arg("streams"), nb::kw_only(), nb::arg("norm").none() = nb::none(),
          nb::arg("eps").none() = nb::none(),
          "streams [T, hc, hidden] float32 -> (post [T, hc], comb [T, hc, hc], collapsed [T, "
          "hidden]) float32, on the layer's device.\nWith eps (and optionally norm [hidden] "
          "float32), the third output is the block's input RMSNorm of collapsed, "
          "(norm *) collapsed / sqrt(mean(collapsed^2) + eps): on CUDA at decode rows fused into "
          "the mapping's last kernel, byte for byte rms_norm(collapsed, norm, eps=eps).\nRaises "
          "ContractError (CONTRACT_SHAPE / DTYPE / DEVICE of streams or norm; CONTRACT_VALUE for "
          "a norm without eps or an eps that is negative or not finite).\nReference: "
          "Glm5NextTextHyperConnection.forward, then Glm5NextTextRMSNorm.")
      .def(
          "post_pre",
          [](const HyperConnection& l, const AnyArray& y, const AnyArray& post_prev,
             const AnyArray& comb_prev, const AnyArray& streams, std::optional<AnyArray> norm,
             float eps) {
            const char* op = "HyperConnection.post_pre";
            const int hc = l.hc(), D = l.hidden();
            const float* rp = f32_in(l.cuda(), streams, op, "streams", {-1, hc, D});
            const int64_t T = dim(streams, 0);
            check_rows(op, "streams", T,
                       {{"y", &y, 2}, {"post", &post_prev, 2}, {"comb", &comb_prev, 3}});
            const float* yp = f32_in(l.cuda(), y, op, "y", {T, D});
            const float* pp = f32_in(l.cuda(), post_prev, op, "post", {T, hc});
            const float* cp = f32_in(l.cuda(), comb_prev, op, "comb", {T, hc, hc});
            const float* np = norm ? f32_in(l.cuda(), *norm, op, "norm", {D}) : nullptr;
            check_eps(eps, op);
            Out st_out = out_f32(l.cuda(), {sz(T), sz(hc), sz(D)}, false);
            Out post = out_f32(l.cuda(), {sz(T), sz(hc)}, false);
            Out comb = out_f32(l.cuda(), {sz(T), sz(hc), sz(hc)}, false);
            Out h = out_f32(l.cuda(), {sz(T), sz(D)}, false);
            Status st;
            {
              ReleasedGil nogil;
              st = l.post_pre_norm(yp, pp, cp, rp, int(T), np, eps, st_out.data<float>(),
                                   post.data<float>(), comb.data<float>(), h.data<float>());
            }
            check(st);
            return nb::make_tuple(st_out.obj, post.obj, comb.obj, h.obj);
          },
          nb::arg("y"), nb::arg("post"), nb::arg("comb"), nb::arg("streams"), nb::kw_only(),
          nb::arg("norm").none() = nb::none(), nb::arg("eps"),
          "The previous site's expansion, then this site's pre with the block's input norm: "
          "new = mhc_post(y, post, comb, streams), then pre(new, norm=norm, eps=eps).\n"
          "y [T, hidden]; post [T, hc] and comb [T, hc, hc] (the previous site's pre outputs); "
          "streams [T, hc, hidden] (the residual streams before the sublayer); norm [hidden] or "
          "None; all float32 on the layer's device. Returns (new streams [T, hc, hidden], "
          "post [T, hc], comb [T, hc, hc], normed [T, hidden]) float32, byte for byte "
          "mhc_post followed by pre(norm=, eps=); on CUDA at one decode row (hc 4) one launch.\n"
          "Raises ContractError (CONTRACT_SHAPE / DTYPE / DEVICE / STRIDE of any array; "
          "CONTRACT_VALUE for an eps that is negative or not finite).\nReference: "
          "Glm5NextTextDecoderLayer.forward (post * h + comb^T @ residual), then "
          "Glm5NextTextHyperConnection.forward and Glm5NextTextRMSNorm.");
}

}  // namespace memra::py
