// memra._core.GdnLayer (memra/gdn_layer.h) over DLPack arrays: construction from named Weights,
// stateless forward, cache-backed prefill / decode (host slots or memra._core.DecodeSlots).
// The slot arguments are layer_args.h's, shared with the other layer bindings.
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include <map>
#include <string>

#include "common.h"
#include "device_args.h"
#include "layer_args.h"
#include "memra/decode_step.h"
#include "memra/engine.h"
#include "memra/gdn_layer.h"

namespace memra::py {

namespace {

DType layer_dtype(const std::string& dtype) {
  if (dtype == "float32") return DType::kF32;
  if (dtype == "bfloat16") return DType::kBF16;
  raise_contract(kContractValue, "GdnLayer: dtype must be 'float32' or 'bfloat16', got '" + dtype + "'");
}

}  // namespace

void init_layers_gdn(nb::module_& m) {
  nb::class_<GdnLayer>(
      m, "GdnLayer",
      "Gated DeltaNet mixer of Qwen3.5 / Qwen3.5-MoE / Qwen3-Next (reference: transformers "
      "Qwen3_5GatedDeltaNet.forward, Qwen3NextGatedDeltaNet.forward). Weights named as on disk "
      "below 'linear_attn.' (gdn_layer.h): Qwen3.5's in_proj_qkv / in_proj_z / in_proj_b / "
      "in_proj_a, or Qwen3-Next's interleaved in_proj_qkvz / in_proj_ba (de-interleaved at load), "
      "plus conv1d.weight, A_log, dt_bias, norm.weight, out_proj.weight. Every size argument is "
      "at most 2^20 (ContractError naming it).")
      .def(
          "__init__",
          [](GdnLayer* self, const Engine& engine, std::map<std::string, Weight> weights,
             int hidden, int key_heads, int value_heads, int key_head_dim, int value_head_dim,
             int conv_kernel, float rms_eps, const std::string& dtype) {
            check_eps(rms_eps, "GdnLayer", "rms_eps");
            const DType d = layer_dtype(dtype);
            GdnConfig c;
            c.hidden = hidden;
            c.key_heads = key_heads;
            c.value_heads = value_heads;
            c.key_head_dim = key_head_dim;
            c.value_head_dim = value_head_dim;
            c.conv_kernel = conv_kernel;
            c.rms_eps = rms_eps;
            WeightMap wm(std::move(weights), "GdnLayer");
            std::unique_ptr<GdnLayer> l;
            const Status st = GdnLayer::create(c, wm, &l);
            if (!st.ok()) {
              raise_status(Status(st.code, st.message + " (given hidden=" + std::to_string(hidden) +
                                               ", key_heads=" + std::to_string(key_heads) +
                                               ", value_heads=" + std::to_string(value_heads) +
                                               ", key_head_dim=" + std::to_string(key_head_dim) +
                                               ", value_head_dim=" + std::to_string(value_head_dim) +
                                               ", conv_kernel=" + std::to_string(conv_kernel) + ")"));
            }
            if (engine.is_cuda()) check(l->to_device(engine.cuda(), d));
            new (self) GdnLayer(std::move(*l));
          },
          nb::arg("engine"), nb::arg("weights"), nb::kw_only(), nb::arg("hidden"),
          nb::arg("key_heads"), nb::arg("value_heads"), nb::arg("key_head_dim"),
          nb::arg("value_head_dim"), nb::arg("conv_kernel") = 4, nb::arg("rms_eps") = 1e-6f,
          nb::arg("dtype") = "bfloat16",
          "engine: where the layer runs; weights: {name below 'linear_attn.': Weight}; hidden, "
          "key_heads (linear_num_key_heads), value_heads (linear_num_value_heads, a multiple of "
          "key_heads), key_head_dim, value_head_dim, conv_kernel (linear_conv_kernel_dim), "
          "rms_eps (rms_norm_eps: the output norm's epsilon); dtype: the projections' compute "
          "dtype on CUDA ('float32' or 'bfloat16'). ContractError names a missing or mis-shaped "
          "tensor or a bad size; on CUDA UnsupportedError unless key_head_dim = value_head_dim = "
          "128 and conv_kernel is 2..8.")
      .def("state_spec", &GdnLayer::state_spec,
           "The LayerStateSpec.gdn(...) a cache layer needs for this layer.")
      .def_prop_ro("interleaved", &GdnLayer::interleaved,
                   "True when loaded from Qwen3-Next's interleaved in_proj_qkvz / in_proj_ba.")
      .def(
          "forward",
          [](const GdnLayer& l, const AnyArray& x) {
            return layer_rows(l, x, -1, "GdnLayer.forward",
                              [&](const float* xp, int T, float* y) { return l.forward(xp, T, y); });
          },
          nb::arg("x"), "x [T, hidden] float32 -> y [T, hidden] from a zero state (CPU layers).")
      .def(
          "prefill",
          [](const GdnLayer& l, Cache& cache, Index layer, Index slot, const AnyArray& x) {
            return layer_rows(l, x, -1, "GdnLayer.prefill", [&](const float* xp, int T, float* y) {
              return l.prefill(cache, layer, slot, xp, T, y);
            });
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slot"), nb::arg("x"),
          "Continue `slot` by x [T, hidden] -> y [T, hidden]; writes the pending conv ring and "
          "state planes, visible after cache.commit(slot, T). CacheFullError when the slot has "
          "no room; ContractError for a cache layer of another kind or geometry.")
      .def(
          "decode",
          [](const GdnLayer& l, Cache& cache, Index layer, const AnyArray& slots, const AnyArray& x) {
            return layer_decode(l, cache, layer, slots, x, "GdnLayer.decode");
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slots"), nb::arg("x"),
          "One token for each slot: slots [B] int32 (host, distinct), x [B, hidden] -> "
          "[B, hidden]; each row equals a prefill of that one token.")
      .def(
          "decode",
          [](const GdnLayer& l, Cache& cache, Index layer, const DecodeSlots& slots, const AnyArray& x) {
            return layer_decode_device(l, cache, layer, slots, x, "GdnLayer.decode");
          },
          nb::arg("cache"), nb::arg("layer"), nb::arg("slots"), nb::arg("x"),
          "The same with the rows' slots on the device (memra._core.DecodeSlots of `cache`, CUDA): x "
          "[slots.size, hidden]; idle rows touch no state and give meaningless finite rows. "
          "Capturable into a CUDA graph (no host round trip).");
}

}  // namespace memra::py
