// memra._core.KernelOptions: memra::KernelOptions (memra/options.h) as an immutable Python value
// with keyword construction, one read-only property per field, __repr__, equality and hashing.
// Construction takes **kwargs and checks them itself, so that an unknown field or a value of the
// wrong type is a ContractError naming the field and the value (nanobind's own keyword handling
// raises TypeError); KernelOptions::validate() then checks every value's domain.
#include "bind_options.h"

#include <nanobind/stl/string.h>

#include <climits>
#include <cstring>
#include <string>

namespace memra::py {

namespace {

// One row per field: its name, its member (a switch or an integer) and its docstring.
struct Field {
  const char* name;
  bool KernelOptions::*flag;  // a switch, or null
  int KernelOptions::*value;  // an integer field, or null
  const char* doc;
};

const Field kFields[] = {
    {"pdl", &KernelOptions::pdl, nullptr,
     "Speed only. Programmatic dependent launch: each kernel may start while the one in front "
     "of it finishes (the decode GEMV streams its first weight chunk meanwhile); False launches "
     "them one after another (the profiling arm: each kernel's own time, no overlap). The bytes "
     "are the same either way."},
    {"gemv", &KernelOptions::gemv, nullptr,
     "Changes numerics. The decode GEMV for the one-row GEMMs it takes (bf16 / f32 weights, "
     "16-byte aligned rows); False sends them to cuBLAS, which sums in another order."},
    {"gemv_rows", nullptr, &KernelOptions::gemv_rows,
     "Speed only. Weight rows a decode-GEMV block owns: 0 chooses them from the output width; "
     "1, 2, 4 or 8 force that count (a row's sum order depends on K alone)."},
    {"gemv_tall_rows", nullptr, &KernelOptions::gemv_tall_rows,
     "Speed only. Rows a block of the decode GEMVs over tall rows (K > 4096 bf16 / 2048 f32: "
     "the o / down projections): 0 chooses them from the output width; 1, 2, 4 or 8 force that "
     "count (gemv_rows, when set, applies instead)."},
    {"mhc_defer", &KernelOptions::mhc_defer, nullptr,
     "Speed only. A one-row mHC site leaves its comb's Sinkhorn pending, run by the next decode "
     "GEMV in an extra block (or in a launch of its own before any other op); False runs it "
     "inside the site's kernel. The same function on the same rows: the same bytes."},
    {"mla_decode_variant", nullptr, &KernelOptions::mla_decode_variant,
     "Changes numerics. The MLA decode kernel over a dense bfloat16 cache at 64 heads and rank "
     "512: 1 the sm_90a wgmma kernel (FlashMLA's seesaw schedule, 64-row TMA blocks), 0 the "
     "mma.sync kernel that every other shape runs."},
    {"mla_merge", nullptr, &KernelOptions::mla_merge,
     "Changes numerics (last bits). How the wgmma MLA decode kernel merges a sequence's splits: "
     "0 chooses (a thread-block cluster where every sequence's cluster is resident at once, else "
     "a grid barrier where the whole grid is, else a second, combine launch); 1 the combine "
     "launch; 2 the cluster (up to 16 splits, more take the combine); 3 the grid barrier (where "
     "the whole grid is resident, else the combine)."},
    {"mla_tc_mt", nullptr, &KernelOptions::mla_tc_mt,
     "Changes numerics (last bits). Head tiles of 16 a block of the mma.sync MLA decode kernel: "
     "0 chooses from the batch (2 below 32 sequences, 4 from there); 2 or 4 force it (4 only "
     "where there are more than 32 heads)."},
    {"mla_split_tiles", nullptr, &KernelOptions::mla_split_tiles,
     "Changes numerics. 64-row tiles a split of the batched MLA decode kernels (every arm): 0 "
     "chooses the splits from the cost model; n > 0 gives ceil(tiles / n) splits (the wgmma arm "
     "at most 1024)."},
    {"moe_grouped_min_t", nullptr, &KernelOptions::moe_grouped_min_t,
     "Changes numerics (MoE layers with a shared expert). Tokens from which moe_forward runs the "
     "routed experts grouped by expert instead of one (token, slot) pair at a time (a large "
     "value keeps the per-pair kernels). moe_forward's own bytes do not change (the grouped "
     "kernels' every product and sum is the per-pair kernels'); but below this token count an "
     "MoE layer's shared expert rides in the per-pair kernels, and from it runs as an MLP of its "
     "own (cuBLAS above one row), which sums in another order."},
    {"attn_decode_unsplit", &KernelOptions::attn_decode_unsplit, nullptr,
     "Changes numerics. The full attention's decode (AttentionLayer, memra._core.attention with "
     "slots): False splits each sequence's cache rows over blocks sized from the cache's "
     "capacity and merges the splits per head in a second launch; True runs one block per "
     "sequence and K/V head over all of its rows (the A/B arm). Where a sequence's rows fit in "
     "one split both give the same bytes."},
    {"prefill_chunk", nullptr, &KernelOptions::prefill_chunk,
     "Changes numerics (CUDA only). Prompt tokens a prefill runs at a time (Model.prefill, "
     "logits, generate, stream, generate_batch, the server): a longer prompt is split into "
     "chunks of at most this many tokens, each run through every layer and committed before the "
     "next, so the prefill's scratch memory grows with the chunk, not with the prompt (a long "
     "prompt fits where its one-shot scratch would not). 0 never splits. Unlike the other fields "
     "it applies on the CPU too (the Python orchestration reads it), where the chunks give the "
     "one-shot bytes; on CUDA a GEMM over fewer rows may sum in another order (docs/prefill.md)."},
    {"moe_tensor_cores", &KernelOptions::moe_tensor_cores, nullptr,
     "Changes numerics. The routed experts over bfloat16 / float16 weights from "
     "moe_grouped_min_t tokens on: True runs them as grouped GEMMs on tensor cores (x and the "
     "SwiGLU output rounded to the weights' type, float32 accumulation, each expert's weights "
     "read once per call of up to 16384 token-slot pairs); False keeps the CUDA-core grouped "
     "kernels (float32 activations, the per-pair kernels' bytes), the A/B arm. float32 weights "
     "always take the CUDA-core kernels."},
    {"attn_prefill_tensor_cores", &KernelOptions::attn_prefill_tensor_cores, nullptr,
     "Changes numerics. The full attention's prefill over a bfloat16 K/V cache (more than one "
     "token, head widths a multiple of 8): True runs the FlashAttention-2-style tensor-core "
     "kernel (the queries and the softmax weights rounded to bfloat16, float32 scores, softmax "
     "and accumulation), the default; False the float32 CUDA-core kernel, which float32 caches "
     "always take."},
};

std::string repr_of(nb::handle v) {
  return std::string(nb::repr(v).c_str()) + " (" + nb::type_name(v.type()).c_str() + ")";
}

const Field* find_field(const std::string& name) {
  for (const Field& f : kFields) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

std::string field_names() {
  std::string s;
  for (const Field& f : kFields) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

// numpy's bool scalar (np.True_, np.False_): a switch takes it as memra.load's flags do, as the
// integer fields take numpy integers. Matched by type name so that numpy need not be imported.
bool is_numpy_bool(nb::handle v) {
  const char* n = Py_TYPE(v.ptr())->tp_name;
  return std::strcmp(n, "numpy.bool") == 0 || std::strcmp(n, "numpy.bool_") == 0;
}

// o.<field> = v, type-checked (switches take bool or numpy's bool; integers take int or any
// integer with __index__, not bool); the domain is checked by validate() afterwards.
void set_field(KernelOptions* o, const Field& f, nb::handle v) {
  const std::string where = std::string("KernelOptions: ") + f.name;
  if (f.flag) {
    const int truth = PyBool_Check(v.ptr()) || is_numpy_bool(v) ? PyObject_IsTrue(v.ptr()) : -1;
    if (truth < 0) {
      PyErr_Clear();
      raise_contract(kContractValue, where + " must be True or False, got " + repr_of(v));
    }
    o->*f.flag = truth == 1;
    return;
  }
  if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr())) {
    raise_contract(kContractValue, where + " must be an int, got " + repr_of(v));
  }
  nb::object i = nb::steal(PyNumber_Index(v.ptr()));
  if (!i.is_valid()) {
    PyErr_Clear();
    raise_contract(kContractValue, where + " must be an int, got " + repr_of(v));
  }
  int overflow = 0;
  const long long n = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0 || n < INT_MIN || n > INT_MAX) {
    raise_contract(kContractValue, where + " is out of the int32 range, got " + repr_of(v));
  }
  o->*f.value = static_cast<int>(n);
}

// `base` with the fields named in `fields` (keyword arguments, or a pickled state) replaced,
// validated.
KernelOptions with_fields(KernelOptions base, const nb::dict& fields) {
  for (auto [k, v] : fields) {
    const std::string name = nb::cast<std::string>(nb::str(k));
    const Field* f = find_field(name);
    if (!f) {
      raise_contract(kContractValue, "KernelOptions: unknown field '" + name + "' = " +
                                         repr_of(v) + " (fields: " + field_names() + ")");
    }
    set_field(&base, *f, v);
  }
  check(base.validate());
  return base;
}

nb::object value_of(const KernelOptions& o, const Field& f) {
  return f.flag ? nb::object(nb::bool_(o.*f.flag)) : nb::object(nb::int_(o.*f.value));
}

nb::dict fields_dict(const KernelOptions& o) {
  nb::dict d;
  for (const Field& f : kFields) d[f.name] = value_of(o, f);
  return d;
}

std::string repr(const KernelOptions& o) {
  std::string s = "KernelOptions(";
  for (const Field& f : kFields) {
    s += std::string(&f == kFields ? "" : ", ") + f.name + "=" +
         (f.flag ? (o.*f.flag ? "True" : "False") : std::to_string(o.*f.value));
  }
  return s + ")";
}

// The keyword signature with today's defaults, for the stub and help().
const std::string& init_signature() {
  static const std::string sig = [] {
    const KernelOptions d;
    std::string s = "def __init__(self, *";
    for (const Field& f : kFields) {
      s += std::string(", ") + f.name + (f.flag ? ": bool = " : ": int = ") +
           (f.flag ? (d.*f.flag ? "True" : "False") : std::to_string(d.*f.value));
    }
    return s + ") -> None";
  }();
  return sig;
}

}  // namespace

KernelOptions options_arg(nb::handle h, const char* op, const char* name) {
  if (!h.is_valid() || h.is_none()) return KernelOptions{};
  if (!nb::isinstance<KernelOptions>(h)) {
    raise_contract(kContractValue, std::string(op) + ": " + name +
                                       " must be a memra.KernelOptions or None, got " + repr_of(h));
  }
  return nb::cast<KernelOptions>(h);
}

void init_options(nb::module_& m) {
  auto cls = nb::class_<KernelOptions>(
      m, "KernelOptions",
      "The CUDA kernels' arms an Engine runs with, chosen once when it is made "
      "(Engine(..., options=), memra.load(..., kernel_options=)); immutable. Keyword "
      "construction; every field defaults to the arm the A/B runs kept (docs/options.md; "
      "prefill_chunk, a memory bound, to 8192 tokens: docs/prefill.md), so KernelOptions() "
      "changes nothing. Fields that change numerics (the logits' bytes): gemv, "
      "mla_decode_variant, mla_merge, mla_tc_mt, mla_split_tiles, moe_grouped_min_t, attn_decode_unsplit, "
      "prefill_chunk (on CUDA), moe_tensor_cores, attn_prefill_tensor_cores; pdl, gemv_rows, "
      "gemv_tall_rows and mhc_defer change only speed. An unknown field, a value of the "
      "wrong type (switches take bool or numpy's bool, the rest int) or out of its domain is a "
      "ContractError (40025) naming the field and the value. A CPU engine keeps the options and "
      "ignores them, except prefill_chunk.");
  cls.def(
         "__init__",
         [](KernelOptions* self, nb::args args, nb::kwargs kwargs) {
           if (args.size() != 0) {
             raise_contract(kContractValue, "KernelOptions takes keyword arguments only (" +
                                                field_names() + "), got " +
                                                std::to_string(args.size()) + " positional");
           }
           new (self) KernelOptions(with_fields(KernelOptions{}, kwargs));
         },
         nb::sig(init_signature().c_str()))
      .def(
          "replace",
          [](const KernelOptions& o, nb::kwargs kwargs) { return with_fields(o, kwargs); },
          nb::sig("def replace(self, **fields: bool | int) -> KernelOptions"),
          "A copy with the named fields replaced (validated as the constructor does).")
      .def(
          "to_dict", &fields_dict,
          nb::sig("def to_dict(self) -> dict[str, bool | int]"),
          "The fields as a dict, in declaration order (KernelOptions(**d) makes the same value).")
      .def("__repr__", &repr)
      // Pickling and copy / deepcopy (copyreg's __reduce_ex__): the state is to_dict(), and
      // nanobind runs __setstate__ only on a new, uninitialized instance, so the value stays
      // immutable.
      .def("__getstate__", &fields_dict, nb::sig("def __getstate__(self) -> dict[str, bool | int]"))
      .def(
          "__setstate__",
          [](KernelOptions* self, const nb::dict& state) {
            new (self) KernelOptions(with_fields(KernelOptions{}, state));
          },
          nb::sig("def __setstate__(self, state: dict[str, bool | int], /) -> None"))
      .def(
          "__eq__",
          [](const KernelOptions& a, nb::handle b) -> nb::object {
            if (!nb::isinstance<KernelOptions>(b)) return nb::borrow(Py_NotImplemented);
            return nb::bool_(a == nb::cast<const KernelOptions&>(b));
          },
          nb::sig("def __eq__(self, other: object, /) -> bool"))
      .def(
          "__ne__",
          [](const KernelOptions& a, nb::handle b) -> nb::object {
            if (!nb::isinstance<KernelOptions>(b)) return nb::borrow(Py_NotImplemented);
            return nb::bool_(a != nb::cast<const KernelOptions&>(b));
          },
          nb::sig("def __ne__(self, other: object, /) -> bool"))
      .def("__hash__", [](const KernelOptions& o) {
        nb::list values;
        for (const Field& f : kFields) values.append(value_of(o, f));
        return nb::hash(nb::tuple(values));
      });
  for (const Field& f : kFields) {
    if (f.flag) {
      cls.def_prop_ro(f.name, [p = f.flag](const KernelOptions& o) { return o.*p; }, f.doc);
    } else {
      cls.def_prop_ro(f.name, [p = f.value](const KernelOptions& o) { return o.*p; }, f.doc);
    }
  }
}

}  // namespace memra::py
