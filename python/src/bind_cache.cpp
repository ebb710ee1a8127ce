// memra._core.Cache and LayerStateSpec (cache.h), and the decode-graph bookkeeping ops on a
// cache's state (kda_tables: cuda/kda_tables.cu; commit_decode: cuda/graph_tables.cu; CUDA only).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cstring>
#include <optional>
#include <tuple>

#include "common.h"
#include "device_args.h"
#include "memra/cache.h"
#include "memra/decode_step.h"
#include "memra/engine.h"
#include "memra/op/graph_tables.h"
#include "memra/op/kda.h"

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

// A host int32 copy of a device mirror [max_batch] (None on a CPU cache; waits for the device).
std::optional<NpI32> mirror_copy(const Cache& c, const int32_t* mirror) {
  if (!mirror) return std::nullopt;
  NpI32 out = new_i32({size_t(c.max_batch())});
  check(c.read(out.data(), mirror, size_t(c.max_batch()) * sizeof(int32_t)));
  return out;
}

// The committed rows [length, kv_heads, head_dim] of an attention plane as host float32 (bf16
// rows widened exactly).
NpF32 kv_rows(const Cache& c, const void* plane, int layer, int slot) {
  const LayerStateSpec& s = c.spec(layer);
  const std::vector<size_t> shape = {size_t(c.length(slot)), size_t(s.heads), size_t(s.head_dim)};
  const size_t n = shape[0] * shape[1] * shape[2];
  if (c.latent_dtype() == DType::kF32) return copy_out(c, static_cast<const float*>(plane), shape);
  std::vector<uint16_t> bits(n);
  check(c.read(bits.data(), plane, n * 2));
  NpF32 out = new_f32(shape);
  for (size_t i = 0; i < n; ++i) out.data()[i] = bf16_to_f32(bits[i]);
  return out;
}

// UnsupportedError naming `op` unless `on_cuda`.
void require_cuda(bool on_cuda, const char* op, const char* what) {
  if (!on_cuda) {
    raise_status(Status(kUnsupported, std::string(op) + ": needs " + what +
                                          " (the CPU backend keeps this bookkeeping on the host)"));
  }
}

// A new uint64 [n] device array on the cache's device, left uninitialised (the op writes it all).
Out out_u64(const std::shared_ptr<CudaContext>& cuda, size_t n) {
  std::shared_ptr<DeviceBuffer> buf;
  check(DeviceBuffer::create(cuda, n * sizeof(uint64_t), &buf));
  Out o;
  o.ptr = buf->data();
  o.obj = device_array(std::move(buf), {n}, nb::dtype<uint64_t>(), cuda->device());
  return o;
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
            const char* op = "LayerStateSpec.kda";
            check_min(heads, 1, op, "heads");
            check_min(head_dim, 1, op, "head_dim");
            check_min(conv_kernel, 1, op, "conv_kernel");
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
          "gdn",
          [](int key_heads, int value_heads, int key_head_dim, int value_head_dim,
             int conv_kernel) {
            const char* op = "LayerStateSpec.gdn";
            check_min(key_heads, 1, op, "key_heads");
            check_min(value_heads, 1, op, "value_heads");
            check_min(key_head_dim, 1, op, "key_head_dim");
            check_min(value_head_dim, 1, op, "value_head_dim");
            check_min(conv_kernel, 1, op, "conv_kernel");
            check_value(value_heads % key_heads == 0, op,
                        "value_heads (" + std::to_string(value_heads) +
                            ") must be a multiple of key_heads (" + std::to_string(key_heads) + ")");
            LayerStateSpec s;
            s.kind = LayerStateSpec::Kind::kGdn;
            s.heads = value_heads;
            s.head_dim = key_head_dim;
            s.key_heads = key_heads;
            s.value_dim = value_head_dim;
            s.conv_kernel = conv_kernel;
            return s;
          },
          nb::kw_only(), nb::arg("key_heads"), nb::arg("value_heads"), nb::arg("key_head_dim"),
          nb::arg("value_head_dim"), nb::arg("conv_kernel"),
          "Gated DeltaNet: conv ring [2*key_heads*key_head_dim + value_heads*value_head_dim, "
          "conv_kernel-1] and state [value_heads, key_head_dim, value_head_dim], both f32 "
          "ping-pong pairs (GdnLayer.state_spec()).")
      .def_static(
          "mla",
          [](int row_width, int index_head_dim, int kpool, int tail_rows) {
            const char* op = "LayerStateSpec.mla";
            check_min(row_width, 1, op, "row_width");
            check_nonneg(index_head_dim, op, "index_head_dim");
            check_nonneg(kpool, op, "kpool");
            check_nonneg(tail_rows, op, "tail_rows");
            if (index_head_dim > 0 && (kpool < 1 || tail_rows < kpool || tail_rows % kpool)) {
              raise_contract(kContractPool, std::string(op) + ": with index_head_dim > 0, tail_rows (" +
                                                std::to_string(tail_rows) +
                                                ") must be a positive multiple of kpool (" +
                                                std::to_string(kpool) + ")");
            }
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
      .def_static(
          "attention",
          [](int kv_heads, int head_dim) {
            const char* op = "LayerStateSpec.attention";
            check_min(kv_heads, 1, op, "kv_heads");
            check_min(head_dim, 1, op, "head_dim");
            LayerStateSpec s;
            s.kind = LayerStateSpec::Kind::kAttention;
            s.heads = kv_heads;
            s.head_dim = head_dim;
            return s;
          },
          nb::kw_only(), nb::arg("kv_heads"), nb::arg("head_dim"),
          "Full attention (AttentionLayer): key rows and value rows [max_len, kv_heads, "
          "head_dim] each, in the cache's latent dtype (float32, or bfloat16 on a CUDA cache "
          "made with latent_dtype='bfloat16').")
      .def_prop_ro("kind", [](const LayerStateSpec& s) {
        switch (s.kind) {
          case LayerStateSpec::Kind::kKda: return "kda";
          case LayerStateSpec::Kind::kMla: return "mla";
          case LayerStateSpec::Kind::kAttention: return "attention";
          case LayerStateSpec::Kind::kGdn: return "gdn";
          default: return "none";
        }
      });

  nb::class_<SlotSnapshot>(m, "SlotSnapshot",
                           "An undo point of one slot of a Cache (Cache.snapshot; Cache.restore "
                           "puts it back).")
      .def_prop_ro("slot", [](const SlotSnapshot& s) { return s.slot; }, "The slot it was taken of.")
      .def_prop_ro("length", [](const SlotSnapshot& s) { return s.length; },
                   "Tokens the slot held when it was taken.")
      .def_prop_ro("nbytes", [](const SlotSnapshot& s) { return s.bytes; },
                   "Bytes of state it holds (on the cache's device).")
      .def("__repr__", [](const SlotSnapshot& s) {
        return "SlotSnapshot(slot=" + std::to_string(s.slot) + ", length=" + std::to_string(s.length) +
               ", nbytes=" + std::to_string(s.bytes) + ")";
      });

  nb::class_<Cache>(m, "Cache",
                    "Per-sequence state of a model: max_batch slots, each with its own length, "
                    "and one plane per layer. OutOfMemoryError before anything is allocated when "
                    "it does not fit; ContractError for a bad spec, max_batch or max_len below 1 "
                    "(40025), a latent_dtype but 'float32' / 'bfloat16' (40025) or 'bfloat16' on a "
                    "CPU engine (40020). The per-slot methods raise ContractError 40023 for a slot "
                    "outside [0, max_batch) or a layer outside the specs, 40025 for a layer of "
                    "another kind than the method reads.")
      .def(
          "__init__",
          [](Cache* self, const Engine& engine, const std::vector<LayerStateSpec>& specs,
             Index max_batch, Index max_len, const std::string& latent_dtype) {
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
          "latent_dtype: 'float32' or 'bfloat16' (CUDA engines only) for the MLA latent rows and "
          "the attention K/V rows.")
      .def_static(
          "bytes_needed",
          [](Index max_batch, Index max_len, const std::vector<LayerStateSpec>& specs) {
            check_min(max_batch, 1, "Cache.bytes_needed", "max_batch");
            check_min(max_len, 1, "Cache.bytes_needed", "max_len");
            return Cache::bytes_needed(max_batch, max_len, specs);
          },
          nb::arg("max_batch"), nb::arg("max_len"), nb::arg("specs"),
          "Bytes the planes of such a cache take (float32 latent rows); 2**63 - 1 when they pass 2**62 "
          "(such a cache never fits: Cache() refuses it with OutOfMemoryError).")
      .def_prop_ro("max_batch", &Cache::max_batch)
      .def_prop_ro("max_len", &Cache::max_len)
      .def_prop_ro("nbytes", &Cache::nbytes)
      .def_prop_ro("on_device", &Cache::on_device)
      .def_prop_ro("num_layers", &Cache::num_layers)
      .def(
          "length",
          [](const Cache& c, Index slot) {
            check(c.check_slot(slot, "Cache.length"));
            return c.length(slot);
          },
          nb::arg("slot"), "Tokens held by `slot`.")
      .def(
          "cur",
          [](const Cache& c, Index slot) {
            check(c.check_slot(slot, "Cache.cur"));
            return c.cur(slot);
          },
          nb::arg("slot"),
          "Which KDA ping-pong plane (0 or 1) holds `slot`'s committed state; every commit flips it.")
      .def(
          "device_lengths", [](const Cache& c) { return mirror_copy(c, c.lengths_d()); },
          "A host int32 [max_batch] copy of the cache's device mirror of the slot lengths (waits "
          "for the device; the decode graph reads the mirror); None on a CPU cache.")
      .def(
          "device_cur", [](const Cache& c) { return mirror_copy(c, c.cur_d()); },
          "A host int32 [max_batch] copy of the device mirror of the ping-pong flags (see cur); "
          "None on a CPU cache.")
      .def(
          "kda_plane_addresses",
          [](Cache& c, Index layer, Index slot) {
            check_plane(c, layer, slot, LayerStateSpec::Kind::kKda, "Cache.kda_plane_addresses");
            auto addr = [](const float* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); };
            return std::make_tuple(addr(c.conv(layer, slot, 0)), addr(c.conv(layer, slot, 1)),
                                   addr(c.state(layer, slot, 0)), addr(c.state(layer, slot, 1)));
          },
          nb::arg("layer"), nb::arg("slot"),
          "(conv plane 0, conv plane 1, state plane 0, state plane 1) addresses of `slot` in a KDA "
          "layer (device addresses on a CUDA cache), for tests of kda_tables.")
      .def(
          "owner",
          [](const Cache& c, Index slot) {
            check(c.check_slot(slot, "Cache.owner"));
            return c.owner(slot);
          },
          nb::arg("slot"),
          "The token of the owner holding `slot` (0: free). memra's generations, streams and "
          "server requests hold the slots they run in; see hold().")
      .def(
          "hold",
          [](Cache& c, Index slot) {
            uint64_t token = 0;
            check(c.hold(slot, &token));
            return token;
          },
          nb::arg("slot"),
          "Hold `slot` (its contents are left as they are) and return the owner token, a nonzero "
          "int unique in the process. While held, commit / commit_host / free / copy_slot into "
          "it refuse with ContractError (CONTRACT_SLOT_HELD) unless given owner=token; reading it "
          "stays open; an owner=token that holds no slot there (released, or another cache's) "
          "is refused the same way. memra's generations never take a held slot. "
          "CONTRACT_SLOT_HELD when "
          "another owner holds it already. The layer objects' prefill / decode (the low-level "
          "API, which takes no owner) do not check holds: they write a slot's pending planes, "
          "which only a commit makes current, so a holder's commit takes what the last layer "
          "calls on that slot wrote.")
      .def(
          "release", [](Cache& c, Index slot, Token token) { check(c.release(slot, token)); },
          nb::arg("slot"), nb::arg("token"),
          "Give back a slot taken with hold() (contents untouched). ContractError "
          "(CONTRACT_SLOT_HELD) unless `token` holds it, naming the holder's token and `token`.")
      .def(
          "commit",
          [](Cache& c, Index slot, Index n, Token owner) { check(c.commit(slot, n, owner)); },
          nb::arg("slot"), nb::arg("n"), nb::kw_only(), nb::arg("owner") = 0,
          "Advance `slot` by n tokens after every layer ran the step (flips its ping-pong planes). "
          "ContractError for a slot outside [0, max_batch) (CONTRACT_RANGE), n < 1 "
          "(CONTRACT_VALUE) or a slot held by an owner other than `owner` (CONTRACT_SLOT_HELD); "
          "CacheFullError when the slot cannot take n more tokens. Nothing changes on an error.")
      .def(
          "commit_decode",
          [](Cache& c, const DecodeSlots& slots) {
            check_value(slots.cache() == &c, "Cache.commit_decode", "the DecodeSlots belong to another cache");
            check(c.commit_decode(slots.data(), slots.size()));
          },
          nb::arg("slots"),
          "A decode step's commit on the device (CUDA caches): the device lengths of the active "
          "rows of `slots` (memra._core.DecodeSlots) advance by one and their ping-pong flags flip, with "
          "no host round trip (capturable). The host's view is NOT advanced: call "
          "commit_host(slot, 1) for each active slot after enqueuing the step. UnsupportedError on "
          "a CPU cache.")
      .def(
          "commit_host",
          [](Cache& c, Index slot, Index n, Token owner) { check(c.commit_host(slot, n, owner)); },
          nb::arg("slot"), nb::arg("n"), nb::kw_only(), nb::arg("owner") = 0,
          "The host half of commit_decode: advance the host's length of `slot` by n and flip its "
          "flag without writing the device (which a device commit already advanced). "
          "CacheFullError and CONTRACT_SLOT_HELD as commit.")
      .def(
          "free", [](Cache& c, Index slot, Token owner) { check(c.free(slot, owner)); },
          nb::arg("slot"), nb::kw_only(), nb::arg("owner") = 0,
          "Forget `slot` (length 0, recurrent state zeroed) without touching other slots. "
          "ContractError (CONTRACT_SLOT_HELD) for a slot held by an owner other than `owner`; "
          "the slot stays held by its owner.")
      .def(
          "copy_slot",
          [](Cache& c, Index src, Index dst, Token owner) { check(c.copy_slot(src, dst, owner)); },
          nb::arg("src"), nb::arg("dst"), nb::kw_only(), nb::arg("owner") = 0,
          "Copy the whole state of `src` into `dst` (prefix reuse). ContractError "
          "(CONTRACT_SLOT_HELD) when `dst` is held by an owner other than `owner` (`src` is only "
          "read and may be held).")
      .def(
          "snapshot",
          [](Cache& c, Index slot) {
            SlotSnapshot s;
            check(c.snapshot(slot, &s));
            return s;
          },
          nb::arg("slot"),
          "An undo point of `slot` (memra._core.SlotSnapshot): the parts of its state that steps "
          "appended to it later may overwrite (the committed recurrent planes, the DSA indexer's "
          "tail ring), copied into a buffer of their own on the cache's device, and its length. "
          "restore() puts them back. OutOfMemoryError when the buffer cannot be had.")
      .def(
          "restore",
          [](Cache& c, const SlotSnapshot& s, Token owner) { check(c.restore(s, owner)); },
          nb::arg("snapshot"), nb::kw_only(), nb::arg("owner") = 0,
          "Put a snapshot() of this cache back into its slot: the slot's length and state are "
          "those of the snapshot again, as if the prefills and decodes appended to it since never "
          "ran (Model.prefill's undo of a chunked prefill that failed midway). Only appends are "
          "undone: ContractError (40025) when the slot was freed, copied into or restored to an "
          "earlier point since the snapshot (or holds fewer tokens than then), or the snapshot is "
          "another cache's; CONTRACT_SLOT_HELD as commit.")
      .def(
          "kda_state",
          [](Cache& c, Index layer, Index slot) {
            check_plane(c, layer, slot, LayerStateSpec::Kind::kKda, "Cache.kda_state");
            const auto& s = c.spec(layer);
            return copy_out(c, c.state(layer, slot, c.cur(slot)),
                            {size_t(s.heads), size_t(s.head_dim), size_t(s.head_dim)});
          },
          nb::arg("layer"), nb::arg("slot"), "Copy of the committed recurrent state [H, dk, dv].")
      .def(
          "kda_conv",
          [](Cache& c, Index layer, Index slot) {
            check_plane(c, layer, slot, LayerStateSpec::Kind::kKda, "Cache.kda_conv");
            const auto& s = c.spec(layer);
            return copy_out(c, c.conv(layer, slot, c.cur(slot)),
                            {size_t(3 * s.heads * s.head_dim), size_t(s.conv_kernel - 1)});
          },
          nb::arg("layer"), nb::arg("slot"), "Copy of the committed conv ring [3*qkv, K-1].")
      .def(
          "gdn_state",
          [](Cache& c, Index layer, Index slot) {
            check_plane(c, layer, slot, LayerStateSpec::Kind::kGdn, "Cache.gdn_state");
            const auto& s = c.spec(layer);
            return copy_out(c, c.state(layer, slot, c.cur(slot)),
                            {size_t(s.heads), size_t(s.head_dim), size_t(s.value_dim)});
          },
          nb::arg("layer"), nb::arg("slot"),
          "Copy of a GDN layer's committed recurrent state [value_heads, key_head_dim, "
          "value_head_dim].")
      .def(
          "gdn_conv",
          [](Cache& c, Index layer, Index slot) {
            check_plane(c, layer, slot, LayerStateSpec::Kind::kGdn, "Cache.gdn_conv");
            const auto& s = c.spec(layer);
            return copy_out(c, c.conv(layer, slot, c.cur(slot)),
                            {size_t(s.conv_channels()), size_t(s.conv_kernel - 1)});
          },
          nb::arg("layer"), nb::arg("slot"),
          "Copy of a GDN layer's committed conv ring [2*Hk*dk + Hv*dv, K-1]: the last K-1 conv "
          "inputs of the q | k | v channels, oldest first (transformers' conv_states keep the "
          "last K; the oldest of those is never read again).")
      .def(
          "latent_rows",
          [](Cache& c, Index layer, Index slot) {
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
          "attn_keys",
          [](Cache& c, Index layer, Index slot) {
            check_plane(c, layer, slot, LayerStateSpec::Kind::kAttention, "Cache.attn_keys");
            return kv_rows(c, c.attn_k(layer, slot), layer, slot);
          },
          nb::arg("layer"), nb::arg("slot"),
          "Copy of the committed key rows [length, kv_heads, head_dim] float32 of an attention layer.")
      .def(
          "attn_values",
          [](Cache& c, Index layer, Index slot) {
            check_plane(c, layer, slot, LayerStateSpec::Kind::kAttention, "Cache.attn_values");
            return kv_rows(c, c.attn_v(layer, slot), layer, slot);
          },
          nb::arg("layer"), nb::arg("slot"),
          "Copy of the committed value rows [length, kv_heads, head_dim] float32 of an attention layer.")
      .def(
          "pool_keys",
          [](Cache& c, Index layer, Index slot) {
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

  // ---------------------------------------------------------------- decode-graph bookkeeping

  m.def(
      "kda_tables",
      [](Cache& cache, Index layer, const AnyArray& slots, std::optional<AnyArray> cur, Index group,
         std::optional<Index> sink_slot) {
        const char* op = "kda_tables";
        require_cuda(cache.on_device(), op, "a cache of a CUDA engine");
        check(cache.check_layer(layer, LayerStateSpec::Kind::kKda, op));
        const auto& cuda = cache.cuda();
        const int32_t* sp = i32_in(cuda, slots, op, "slots", {-1});
        const int64_t B = dim(slots, 0);
        if (B > INT32_MAX) raise_contract(kContractRange, std::string(op) + ": B overflows int32");
        const int32_t* cp = cache.cur_d();
        if (cur) cp = i32_in(cuda, *cur, op, "cur", {cache.max_batch()});
        const LayerStateSpec& s = cache.spec(layer);
        check_value(group >= 0 && group < 3, op,
                    "group must be 0, 1 or 2 (q, k, v channel group), got " + std::to_string(group));
        float *sink_conv = nullptr, *sink_state = nullptr;
        if (sink_slot) {
          check(cache.check_slot(*sink_slot, op));
          sink_conv = cache.conv(layer, *sink_slot, 0);
          sink_state = cache.state(layer, *sink_slot, 0);
        }
        const int64_t plane_offset = int64_t(group) * s.heads * s.head_dim * (s.conv_kernel - 1);
        Out ri = out_u64(cuda, size_t(B)), ro = out_u64(cuda, size_t(B)), si = out_u64(cuda, size_t(B)),
            so = out_u64(cuda, size_t(B));
        const MemraKdaTablesParams p{
            sp, cp, int(B), cache.conv(layer, 0, 0), cache.conv(layer, 0, 1),
            cache.state(layer, 0, 0), cache.state(layer, 0, 1), s.conv_floats(), s.state_floats(),
            plane_offset, ri.data<const float*>(), ro.data<float*>(), si.data<const float*>(),
            so.data<float*>(), sink_conv, sink_state};
        check(op::kda_tables(op::Backend{cuda.get()}, p));
        return std::make_tuple(ri.obj, ro.obj, si.obj, so.obj);
      },
      nb::arg("cache"), nb::arg("layer"), nb::arg("slots"), nb::arg("cur").none() = nb::none(),
      nb::kw_only(), nb::arg("group") = 0, nb::arg("sink_slot").none() = nb::none(),
      "CUDA caches only (UnsupportedError for a CPU cache): the per-sequence pointer tables of KDA "
      "layer `layer` computed on the device (cuda/kda_tables.cu), as KdaLayer builds them on the "
      "host: returns (ring_in, ring_out, state_in, state_out), uint64 device arrays [B] of "
      "addresses. slots: device int32 [B], slots[b] < 0 an idle row (valid slots unchecked: keep "
      "them in [0, max_batch)); cur: device int32 [max_batch] ping-pong flags (None: the cache's "
      "own device mirror, Cache.device_cur); group: the channel group (q 0, k 1, v 2) whose conv "
      "ring offset is added; sink_slot: idle rows point at plane 0 of that slot (None: null "
      "entries). Row b with s = slots[b] >= 0 reads plane cur[s] and writes plane 1 - cur[s].");

  m.def(
      "commit_decode",
      [](const AnyArray& slots, nb::handle lengths, nb::handle cur, const Engine* engine) {
        const char* op = "commit_decode";
        require_cuda(on_cuda(engine), op, "a CUDA engine (engine=memra.Engine('cuda'))");
        const int32_t* sp = i32_in(engine, slots, op, "slots", {-1});
        const int64_t B = dim(slots, 0);
        if (B > INT32_MAX) raise_contract(kContractRange, std::string(op) + ": B overflows int32");
        AnyArray la, ca;
        if (!nb::try_cast(lengths, la) || !nb::try_cast(cur, ca)) {
          raise_contract(kContractDType, std::string(op) + ": lengths and cur must be int32 device arrays");
        }
        require_writable(lengths, op, "lengths");
        require_writable(cur, op, "cur");
        int32_t* lp = const_cast<int32_t*>(i32_in(engine, la, op, "lengths", {-1}));
        int32_t* cp = const_cast<int32_t*>(i32_in(engine, ca, op, "cur", {dim(la, 0)}));
        const size_t n = sizeof(int32_t) * static_cast<size_t>(dim(la, 0));
        check_all_disjoint(op, {{"lengths", lp, n}, {"cur", cp, n}});
        check_disjoint(op, "slots", sp, sizeof(int32_t) * static_cast<size_t>(B), "lengths", lp, n);
        check_disjoint(op, "slots", sp, sizeof(int32_t) * static_cast<size_t>(B), "cur", cp, n);
        check(op::commit_decode(backend(engine), sp, int(B), lp, cp));
      },
      nb::arg("slots"), nb::arg("lengths"), nb::arg("cur"), nb::kw_only(),
      nb::arg("engine").none() = nb::none(),
      "CUDA only (UnsupportedError otherwise): the decode step's commit on the device "
      "(cuda/graph_tables.cu), in place: lengths[s] += 1 and cur[s] ^= 1 for each s = slots[b] >= "
      "0 (slots < 0 are idle rows; a repeated slot counts once per occurrence). slots: device "
      "int32 [B]; lengths, cur: device int32 [max_batch] (valid slots unchecked: keep them below "
      "max_batch; no capacity check). Cache.commit(s, 1) for the same slots gives the same values "
      "on the host.");
}

}  // namespace memra::py
