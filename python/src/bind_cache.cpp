// memra._core.Cache and LayerStateSpec (cache.h).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "common.h"
#include "memra/cache.h"
#include "memra/engine.h"

namespace memra::py {

namespace {

// A host float32 copy of a plane (waits for the device on a CUDA cache).
NpF32 copy_out(const Cache& c, const float* src, std::vector<size_t> shape) {
  NpF32 out = new_f32(shape);
  size_t n = 1;
  for (size_t s : shape) n *= s;
  check(c.read(out.data(), src, n * sizeof(float)));
  return out;
}

void check_plane(Cache& c, int layer, int slot, LayerStateSpec::Kind kind, const char* op) {
  check(c.check_layer(layer, kind, op));
  check(c.check_slot(slot, op));
}

}  // namespace

void init_cache(nb::module_& m) {
  nb::class_<LayerStateSpec>(m, "LayerStateSpec",
                             "What one layer keeps per slot in a Cache (see cache.h).")
      .def_static(
          "none", [] { return LayerStateSpec(); }, "A layer with no per-slot state.")
      .def_static(
          "kda",
          [](int heads, int head_dim, int conv_kernel) {
            LayerStateSpec s;
            s.kind = LayerStateSpec::Kind::kKda;
            s.heads = heads;
            s.head_dim = head_dim;
            s.conv_kernel = conv_kernel;
            return s;
          },
          nb::kw_only(), nb::arg("heads"), nb::arg("head_dim"), nb::arg("conv_kernel"),
          "Conv ring [3*heads*head_dim, conv_kernel-1] and state [heads, head_dim, head_dim], "
          "both f32 ping-pong pairs.")
      .def_static(
          "mla",
          [](int row_width, int index_head_dim, int kpool, int tail_rows) {
            LayerStateSpec s;
            s.kind = LayerStateSpec::Kind::kMla;
            s.row_width = row_width;
            s.index_head_dim = index_head_dim;
            s.kpool = kpool;
            s.tail_rows = tail_rows;
            return s;
          },
          nb::kw_only(), nb::arg("row_width"), nb::arg("index_head_dim") = 0, nb::arg("kpool") = 0,
          nb::arg("tail_rows") = 0,
          "Latent rows [max_len, row_width]; with index_head_dim > 0 also the DSA pool keys "
          "[max_len // kpool, index_head_dim] and a tail ring of tail_rows raw indexer rows.")
      .def_prop_ro("kind", [](const LayerStateSpec& s) {
        return s.kind == LayerStateSpec::Kind::kKda ? "kda" : s.kind == LayerStateSpec::Kind::kMla ? "mla" : "none";
      });

  nb::class_<Cache>(m, "Cache",
                    "Per-sequence state of a model: max_batch slots, each with its own length, "
                    "and one plane per layer. OutOfMemoryError before anything is allocated when "
                    "it does not fit; ContractError for a bad spec.")
      .def(
          "__init__",
          [](Cache* self, const Engine& engine, const std::vector<LayerStateSpec>& specs,
             int max_batch, int max_len, const std::string& latent_dtype) {
            DType ld = DType::kF32;
            if (latent_dtype == "bfloat16") {
              ld = DType::kBF16;
            } else if (latent_dtype != "float32") {
              raise_contract(kContractValue, "Cache: latent_dtype must be 'float32' or 'bfloat16', got '" +
                                                 latent_dtype + "'");
            }
            std::unique_ptr<Cache> c;
            check(Cache::create(engine.cuda(), ld, max_batch, max_len, specs, &c));
            new (self) Cache(std::move(*c));
          },
          nb::arg("engine"), nb::arg("specs"), nb::kw_only(), nb::arg("max_batch"),
          nb::arg("max_len"), nb::arg("latent_dtype") = "float32",
          "engine: the Engine whose device holds the planes; specs: one LayerStateSpec per layer; "
          "latent_dtype: 'float32' or 'bfloat16' (CUDA engines only) for the MLA latent rows.")
      .def_static(
          "bytes_needed",
          [](int max_batch, int max_len, const std::vector<LayerStateSpec>& specs) {
            return Cache::bytes_needed(max_batch, max_len, specs);
          },
          nb::arg("max_batch"), nb::arg("max_len"), nb::arg("specs"),
          "Bytes the planes of such a cache take (float32 latent rows).")
      .def_prop_ro("max_batch", &Cache::max_batch)
      .def_prop_ro("max_len", &Cache::max_len)
      .def_prop_ro("nbytes", &Cache::nbytes)
      .def_prop_ro("on_device", &Cache::on_device)
      .def_prop_ro("num_layers", &Cache::num_layers)
      .def(
          "length",
          [](const Cache& c, int slot) {
            check(c.check_slot(slot, "Cache.length"));
            return c.length(slot);
          },
          nb::arg("slot"), "Tokens held by `slot`.")
      .def(
          "commit", [](Cache& c, int slot, int n) { check(c.commit(slot, n)); }, nb::arg("slot"),
          nb::arg("n"),
          "Advance `slot` by n tokens after every layer ran the step (flips its ping-pong planes).")
      .def(
          "free", [](Cache& c, int slot) { check(c.free(slot)); }, nb::arg("slot"),
          "Forget `slot` (length 0, recurrent state zeroed) without touching other slots.")
      .def(
          "copy_slot", [](Cache& c, int src, int dst) { check(c.copy_slot(src, dst)); },
          nb::arg("src"), nb::arg("dst"), "Copy the whole state of `src` into `dst` (prefix reuse).")
      .def(
          "kda_state",
          [](Cache& c, int layer, int slot) {
            check_plane(c, layer, slot, LayerStateSpec::Kind::kKda, "Cache.kda_state");
            const auto& s = c.spec(layer);
            return copy_out(c, c.state(layer, slot, c.cur(slot)),
                            {size_t(s.heads), size_t(s.head_dim), size_t(s.head_dim)});
          },
          nb::arg("layer"), nb::arg("slot"), "Copy of the committed recurrent state [H, dk, dv].")
      .def(
          "kda_conv",
          [](Cache& c, int layer, int slot) {
            check_plane(c, layer, slot, LayerStateSpec::Kind::kKda, "Cache.kda_conv");
            const auto& s = c.spec(layer);
            return copy_out(c, c.conv(layer, slot, c.cur(slot)),
                            {size_t(3 * s.heads * s.head_dim), size_t(s.conv_kernel - 1)});
          },
          nb::arg("layer"), nb::arg("slot"), "Copy of the committed conv ring [3*qkv, K-1].")
      .def(
          "latent_rows",
          [](Cache& c, int layer, int slot) {
            check_plane(c, layer, slot, LayerStateSpec::Kind::kMla, "Cache.latent_rows");
            const size_t rows = size_t(c.length(slot)), W = size_t(c.spec(layer).row_width);
            if (c.latent_dtype() == DType::kF32) return copy_out(c, c.latent(layer, slot), {rows, W});
            std::vector<uint16_t> bits(rows * W);
            check(c.read(bits.data(), c.latent_raw(layer, slot), bits.size() * 2));
            NpF32 out = new_f32({rows, W});
            for (size_t i = 0; i < bits.size(); ++i) out.data()[i] = bf16_to_f32(bits[i]);
            return out;
          },
          nb::arg("layer"), nb::arg("slot"), "Copy of the committed latent rows [length, row_width].")
      .def(
          "pool_keys",
          [](Cache& c, int layer, int slot) {
            check_plane(c, layer, slot, LayerStateSpec::Kind::kMla, "Cache.pool_keys");
            const auto& s = c.spec(layer);
            if (s.index_head_dim == 0) raise_contract(kContractValue, "Cache.pool_keys: layer has no indexer state");
            return copy_out(c, c.pool_keys(layer, slot),
                            {size_t(c.length(slot) / s.kpool), size_t(s.index_head_dim)});
          },
          nb::arg("layer"), nb::arg("slot"), "Copy of the resident pool keys [length // kpool, d].")
      .def("__repr__", [](const Cache& c) {
        return "Cache(max_batch=" + std::to_string(c.max_batch()) + ", max_len=" +
               std::to_string(c.max_len()) + ", layers=" + std::to_string(c.num_layers()) +
               ", nbytes=" + std::to_string(c.nbytes()) + ")";
      });
}

}  // namespace memra::py
