// memra._core.AttentionLayer (memra/attention_layer.h): the gated full attention of Qwen3.5 /
// Qwen3-Next, bound like MlaLayer (bind_layers.cpp): construction from named Weights,
// prefill(cache, layer, slot, x), decode(cache, layer, slots, x) with host slots or a
// memra._core.DecodeSlots, state_spec().
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <string>

#include "common.h"
#include "device_args.h"
#include "layer_args.h"
#include "memra/attention_layer.h"
#include "memra/decode_step.h"
#include "memra/engine.h"

namespace memra::py {

namespace {

using Weights = std::map<std::string, Weight>;

}  // namespace

void init_layers_attention(nb::module_& m) {
  nb::class_<AttentionLayer>(
      m, "AttentionLayer",
      "The gated full attention of Qwen3.5 / Qwen3.5-MoE / Qwen3-Next over a K/V cache "
      "(reference: transformers 5.17 Qwen3_5Attention / Qwen3NextAttention). Weights named as "
      "on disk below 'self_attn.': q_proj.weight [heads * 2 * head_dim, hidden] (per head the "
      "query rows, then the gate rows), k_proj.weight and v_proj.weight [kv_heads * head_dim, "
      "hidden], o_proj.weight [hidden, heads * head_dim], q_norm.weight and k_norm.weight "
      "[head_dim] (zero-centred: the layer multiplies by 1 + w), optional *.bias "
      "(attention_bias). Its cache layer is LayerStateSpec.attention(kv_heads=, head_dim=). "
      "hidden, heads and kv_heads at most 2^20 (ContractError naming it).")
      .def(
          "__init__",
          [](AttentionLayer* self, const Engine& engine, Weights weights, int hidden, int heads,
             int kv_heads, int head_dim, int rotary_dim, double rope_theta, float rms_eps,
             const std::string& dtype) {
            const char* what = "AttentionLayer";
            check_eps(rms_eps, what, "rms_eps");
            check_value(std::isfinite(rope_theta) && rope_theta > 0.0, what,
                        "rope_theta must be finite and > 0, got " + std::to_string(rope_theta));
            DType d = DType::kF32;
            if (dtype == "bfloat16") {
              d = DType::kBF16;
            } else if (dtype != "float32") {
              raise_contract(kContractValue, std::string(what) +
                                                 ": dtype must be 'float32' or 'bfloat16', got '" +
                                                 dtype + "'");
            }
            AttentionConfig c;
            c.hidden = hidden;
            c.heads = heads;
            c.kv_heads = kv_heads;
            c.head_dim = head_dim;
            c.rotary_dim = rotary_dim;
            c.rope_theta = rope_theta;
            c.rms_eps = rms_eps;
            WeightMap wm(std::move(weights), what);
            std::unique_ptr<AttentionLayer> l;
            const Status st = AttentionLayer::create(c, wm, &l);
            if (st.code == kContractMissing || st.code == kContractShape) {  // a tensor: name the counts too
              raise_status(Status(st.code, st.message + " (given hidden=" + std::to_string(hidden) +
                                               ", heads=" + std::to_string(heads) + ", kv_heads=" +
                                               std::to_string(kv_heads) + ", head_dim=" +
                                               std::to_string(head_dim) + ")"));
            }
            check(st);
            if (engine.is_cuda()) check(l->to_device(engine.cuda(), d));
            new (self) AttentionLayer(std::move(*l));
          },
          nb::arg("engine"), nb::arg("weights"), nb::kw_only(), nb::arg("hidden"), nb::arg("heads"),
          nb::arg("kv_heads"), nb::arg("head_dim"), nb::arg("rotary_dim"),
          nb::arg("rope_theta") = 10000.0, nb::arg("rms_eps") = 1e-6f,
          nb::arg("dtype") = "bfloat16",
          "engine: where the layer runs; weights: {name: memra.Weight}; hidden, heads, kv_heads "
          "(heads % kv_heads == 0), head_dim (1..256); rotary_dim: "
          "int(head_dim * partial_rotary_factor) as transformers computes it (even); rope_theta: "
          "rope_parameters['rope_theta'], finite, > 0 and not so small that its largest frequency "
          "times an int32 position overflows float32; rms_eps: rms_norm_eps (q_norm / k_norm); dtype: the "
          "CUDA weights' compute dtype ('float32' or 'bfloat16'; the CPU keeps the file's).\n"
          "Raises ContractError (a missing or mis-shaped tensor named; bad counts; "
          "CONTRACT_ODD_ROPE for an odd rotary_dim), UnsupportedError for head_dim > 256.")
      .def("state_spec", &AttentionLayer::state_spec,
           "LayerStateSpec.attention(kv_heads=, head_dim=): the cache layer this layer needs.")
      .def_prop_ro("scale", &AttentionLayer::scale, "head_dim ** -0.5 (float32), the scores' factor.")
      .def_prop_ro(
          "inv_freq",
          [](const AttentionLayer& l) -> nb::object {
            NpF32 out = new_f32({l.inv_freq().size()});
            std::copy(l.inv_freq().begin(), l.inv_freq().end(), out.data());
            return nb::cast(out);
          },
          "The inverse RoPE frequencies [rotary_dim // 2] float32 (rope_inv_freq), host numpy.")
      .def(
          "prefill",
          [](const AttentionLayer& l, Cache& cache, Index layer, Index slot, const AnyArray& x) {
            return layer_rows(l, x, -1, "AttentionLayer.prefill",
                              [&](const float* xp, int T, float* y) {
                                return l.prefill(cache, layer, slot, xp, T, y);
                              });
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slot"), nb::arg("x"),
          "Continue `slot` by x [T, hidden] float32 -> y [T, hidden] float32 (positions "
          "cache.length(slot) + t); the K/V rows land past the slot's length and become visible "
          "at cache.commit(slot, T). CacheFullError when the slot has no room; ContractError for "
          "a cache layer of another kind or geometry.")
      .def(
          "decode",
          [](const AttentionLayer& l, Cache& cache, Index layer, const AnyArray& slots, const AnyArray& x) {
            return layer_decode(l, cache, layer, slots, x, "AttentionLayer.decode");
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slots"), nb::arg("x"),
          "One token for each slot: slots [B] int32 (host, distinct), x [B, hidden] -> [B, "
          "hidden], each row at its slot's length.")
      .def(
          "decode",
          [](const AttentionLayer& l, Cache& cache, Index layer, const DecodeSlots& slots, const AnyArray& x) {
            return layer_decode_device(l, cache, layer, slots, x, "AttentionLayer.decode");
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slots"), nb::arg("x"),
          "The same with the rows' slots on the device (memra._core.DecodeSlots of `cache`, CUDA): "
          "each row's position is the cache's device length of its slot; an idle row appends "
          "nothing and its attention output is zero. Capturable into a CUDA graph.");
}

}  // namespace memra::py
