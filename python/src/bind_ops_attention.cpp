// Functional bindings of the full-attention ops (memra::op, cpp/include/memra/op/attention.h)
// over DLPack arrays: rope_inv_freq, attn_prep, kv_append, attention. CPU backend (engine None
// or a CPU Engine): memra/cpu/attention.h, the oracle; CUDA (a CUDA Engine): cuda/attention*.cu,
// every array on the engine's device. Each function checks its arguments (ContractError naming
// the op, the argument and the values) before anything runs; on the CPU it also checks the
// device form's slots and lengths, which CUDA cannot read without a sync (there they are the
// caller's contract, as for memra._core.DecodeSlots).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <climits>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common.h"
#include "device_args.h"
#include "memra/cpu/attention.h"
#include "memra/engine.h"
#include "memra/msg.h"
#include "memra/op/attention.h"
#include "nogil.h"

namespace memra::py {

namespace {

size_t z(int64_t n) { return static_cast<size_t>(n); }

int device_type(const Engine* engine) {
  return on_cuda(engine) ? nb::device::cuda::value : nb::device::cpu::value;
}

// A K/V cache argument: float32 or bfloat16 (DLPack bfloat16, or uint16 raw bits) on the engine's
// device, [max_len, Hkv, hd] (direct form) or [max_batch, max_len, Hkv, hd] (device form).
struct KvCache {
  void* data = nullptr;
  int dtype = 0;
  int64_t max_batch = 1, max_len = 0, Hkv = 0, hd = 0;
};

KvCache kv_cache_arg(const Engine* engine, nb::handle obj, const char* op, const char* name,
                     bool device_form, bool write) {
  AnyArray a;
  if (!nb::try_cast(obj, a)) {
    raise_contract(kContractDType, std::string(op) + ": argument '" + name + "' must be an array, got " +
                                       std::string(nb::type_name(obj.type()).c_str()));
  }
  if (write) require_writable(obj, op, name);
  const bool f32 = has_dtype(a, nb::dlpack::dtype_code::Float, 32);
  const char* want = "float32 or bfloat16 (uint16 raw bits accepted)";
  if (device_form) {
    check_array(a, op, name, {-1, -1, -1, -1}, want, f32 || has_bf16(a), device_type(engine),
                on_cuda(engine) ? engine->device_index() : 0);
  } else {
    check_array(a, op, name, {-1, -1, -1}, want, f32 || has_bf16(a), device_type(engine),
                on_cuda(engine) ? engine->device_index() : 0);
  }
  KvCache c;
  c.data = const_cast<void*>(a.data());
  c.dtype = f32 ? 0 : 1;
  const size_t o = device_form ? 1 : 0;
  if (device_form) c.max_batch = dim(a, 0);
  c.max_len = dim(a, o);
  c.Hkv = dim(a, o + 1);
  c.hd = dim(a, o + 2);
  if (c.max_batch < 1 || c.max_len < 1 || c.max_len > INT_MAX) {
    raise_contract(kContractShape, std::string(op) + ": " + name + " has shape " + shape_str(a) +
                                       ", expected at least one slot and 1 <= max_len < 2^31 rows");
  }
  return c;
}

void same_cache(const KvCache& a, const KvCache& b, const char* op) {
  if (a.max_batch != b.max_batch || a.max_len != b.max_len || a.Hkv != b.Hkv || a.hd != b.hd) {
    raise_contract(kContractShape, std::string(op) + ": k_cache and v_cache must have one shape");
  }
  if (a.dtype != b.dtype) raise_contract(kContractDType, std::string(op) + ": k_cache and v_cache must have one dtype");
}

// Where the T rows sit: pos0 (direct form) or slots [T] + lengths [max_batch] (device form). On
// the CPU the values are checked: slots in [-1, max_batch), an active slot at most once, its
// length in [0, max_len) (max_len 0: any length >= 0).
struct Where {
  int pos0 = 0;
  const int32_t* slots = nullptr;
  const int32_t* lengths = nullptr;
};

Where where_arg(const Engine* engine, int pos0, const std::optional<AnyArray>& slots,
                const std::optional<AnyArray>& lengths, int64_t T, int64_t max_batch,
                int64_t max_len, const char* op) {
  Where w;
  if (!slots) {
    if (lengths) raise_contract(kContractValue, std::string(op) + ": lengths is given without slots");
    if (pos0 < 0) {
      raise_contract(kContractRange, std::string(op) + ": pos0=" + std::to_string(pos0) +
                                         " must be >= 0 (the first row's position)");
    }
    if ((max_len > 0 && int64_t(pos0) + T > max_len) || int64_t(pos0) + T > INT_MAX) {
      raise_contract(kContractRange, std::string(op) + ": rows [pos0=" + std::to_string(pos0) + ", " +
                                         std::to_string(int64_t(pos0) + T) + ") do not fit " +
                                         (max_len > 0 ? "max_len=" + std::to_string(max_len) : "int32"));
    }
    w.pos0 = pos0;
    return w;
  }
  if (pos0 != 0) raise_contract(kContractValue, std::string(op) + ": pos0 and slots exclude each other");
  if (!lengths) raise_contract(kContractMissing, std::string(op) + ": slots need their lengths");
  w.slots = i32_in(engine, *slots, op, "slots", {T});
  if (max_batch > 0) {
    w.lengths = i32_in(engine, *lengths, op, "lengths", {max_batch});
  } else {
    w.lengths = i32_in(engine, *lengths, op, "lengths", {-1});
    max_batch = dim(*lengths, 0);
  }
  if (on_cuda(engine)) return w;
  std::set<int32_t> seen;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = w.slots[t];
    if (s < -1 || s >= max_batch) {
      raise_contract(kContractRange, std::string(op) + ": slots[" + std::to_string(t) + "]=" +
                                         std::to_string(s) + " is outside [-1, " +
                                         std::to_string(max_batch) + ")");
    }
    if (s < 0) continue;
    if (!seen.insert(s).second) {
      raise_contract(kContractValue, std::string(op) + ": slots holds slot " + std::to_string(s) +
                                         " twice (one row per slot)");
    }
    const int32_t n = w.lengths[s];
    if (n < 0 || (max_len > 0 && n >= max_len)) {
      raise_contract(kContractRange, std::string(op) + ": lengths[" + std::to_string(s) + "]=" +
                                         std::to_string(n) + " is outside [0, " +
                                         (max_len > 0 ? std::to_string(max_len) : "2^31") + ")");
    }
  }
  return w;
}

// Run an op on the engine's backend: CPU with the GIL released.
template <typename P>
void run(const Engine* engine, Status (*fn)(const op::Backend&, const P&), const P& p) {
  Status st;
  if (on_cuda(engine)) {
    st = fn(backend(engine), p);
  } else {
    ReleasedGil nogil;
    st = fn(backend(engine), p);
  }
  check(st);
}

void check_heads(int64_t Hq, int64_t Hkv, int64_t hd, const char* op) {
  if (Hq < 1 || Hkv < 1 || Hq % Hkv) {
    raise_contract(kContractValue, std::string(op) + ": the query heads (" + std::to_string(Hq) +
                                       ") must be a positive multiple of the K/V heads (" +
                                       std::to_string(Hkv) + ")");
  }
  if (hd < 1) raise_contract(kContractShape, std::string(op) + ": head_dim must be >= 1");
  if (hd > 256) {
    raise_status(Status(kUnsupportedGeometry, std::string(op) + ": head_dim " + std::to_string(hd) +
                                                  " is above 256, the widest head built"));
  }
}

}  // namespace

void init_ops_attention(nb::module_& m) {
  m.def(
      "rope_inv_freq",
      [](double theta, int dim) {
        const char* op = "rope_inv_freq";
        check_value(std::isfinite(theta) && theta > 0.0, op,
                    (Msg() << "theta must be finite and > 0, got " << theta).str());
        check_nonneg(dim, op, "dim");
        if (dim % 2) {
          raise_contract(kContractOddRope, std::string(op) + ": dim must be even, got " + std::to_string(dim));
        }
        NpF32 out = new_f32({z(dim / 2)});
        cpu::rope_inv_freq(theta, dim, out.data());
        // A theta far below 1 (or rounding to 0 as a float32) gives an infinite frequency.
        for (int64_t j = 0; j < dim / 2; ++j) {
          check_value(std::isfinite(out.data()[j]), op,
                      (Msg() << "theta=" << theta << " is too small: inv_freq[" << j << "] = 1 / theta ** ("
                             << 2 * j << " / dim) is not a finite float32").str());
        }
        return out;
      },
      nb::arg("theta"), nb::arg("dim"),
      "The inverse RoPE frequencies [dim // 2] float32 (host numpy) as transformers computes them "
      "(Qwen3_5TextRotaryEmbedding.compute_default_rope_parameters: 1 / base ** (arange(0, dim, "
      "2, float32) / dim) in float32, the power rounded once). dim: the rotated dims, "
      "int(head_dim * partial_rotary_factor), even (ContractError CONTRACT_ODD_ROPE otherwise) "
      "and >= 0; theta: rope_theta, finite and > 0, and large enough that every frequency is a "
      "finite float32 (ContractError CONTRACT_VALUE for a theta or dim outside those).");

  m.def(
      "attn_prep",
      [](const AnyArray& qg, const AnyArray& k, const AnyArray& q_norm, const AnyArray& k_norm,
         float eps, int rotary_dim, std::optional<AnyArray> inv_freq, int pos0,
         std::optional<AnyArray> slots, std::optional<AnyArray> lengths, const Engine* engine) {
        const char* op = "attn_prep";
        const float* kp = f32_in(engine, k, op, "k", {-1, -1, -1});
        const int64_t T = dim(k, 0), Hkv = dim(k, 1), hd = dim(k, 2);
        check_rows(op, "k", T, {{"qg", &qg, 3}});
        const float* qp = f32_in(engine, qg, op, "qg", {T, -1, 2 * hd});
        const int64_t Hq = dim(qg, 1);
        check_heads(Hq, Hkv, hd, op);
        const float* qn = f32_in(engine, q_norm, op, "q_norm", {hd});
        const float* kn = f32_in(engine, k_norm, op, "k_norm", {hd});
        check_eps(eps, op);
        if (rotary_dim < 0 || rotary_dim > hd) {
          raise_contract(kContractValue, std::string(op) + ": rotary_dim must be in [0, head_dim=" +
                                             std::to_string(hd) + "], got " + std::to_string(rotary_dim));
        }
        if (rotary_dim % 2) {
          raise_contract(kContractOddRope, std::string(op) + ": rotary_dim must be even, got " +
                                               std::to_string(rotary_dim));
        }
        const float* fp = nullptr;
        if (inv_freq) {
          fp = f32_in(engine, *inv_freq, op, "inv_freq", {rotary_dim / 2});
        } else if (rotary_dim > 0) {
          raise_contract(kContractMissing, std::string(op) + ": inv_freq [rotary_dim / 2] is needed to rotate");
        }
        const Where w = where_arg(engine, pos0, slots, lengths, T, 0, 0, op);
        Out q = out_f32_uninit(engine, {z(T), z(Hq), z(hd)});
        Out gate = out_f32_uninit(engine, {z(T), z(Hq), z(hd)});
        Out ko = out_f32_uninit(engine, {z(T), z(Hkv), z(hd)});
        MemraAttnPrepParams p = {};
        p.qg = qp;
        p.ld_qg = Hq * 2 * hd;
        p.k = kp;
        p.ld_k = Hkv * hd;
        p.T = int(T);
        p.Hq = int(Hq);
        p.Hkv = int(Hkv);
        p.hd = int(hd);
        p.q_norm = qn;
        p.k_norm = kn;
        p.eps = eps;
        p.n_rot = rotary_dim;
        p.inv_freq = rotary_dim > 0 ? fp : nullptr;
        p.pos0 = w.pos0;
        p.slots = w.slots;
        p.lengths = w.lengths;
        p.q = q.data<float>();
        p.gate = gate.data<float>();
        p.k_out = ko.data<float>();
        run(engine, &op::attn_prep, p);
        return nb::make_tuple(q.obj, gate.obj, ko.obj);
      },
      nb::arg("qg"), nb::arg("k"), nb::arg("q_norm"), nb::arg("k_norm"), nb::kw_only(),
      nb::arg("eps"), nb::arg("rotary_dim"), nb::arg("inv_freq").none() = nb::none(),
      nb::arg("pos0") = 0, nb::arg("slots").none() = nb::none(),
      nb::arg("lengths").none() = nb::none(), nb::arg("engine").none() = nb::none(),
      "The gated attention's prologue: qg [T, Hq, 2 * hd] float32 (q_proj's output viewed per "
      "head: the query, then the gate), k [T, Hkv, hd] float32 (k_proj's output) -> (q [T, Hq, "
      "hd], gate [T, Hq, hd], k [T, Hkv, hd]) float32. q and k are RMS-normed per head and "
      "multiplied by q_norm / k_norm [hd] (pass 1 + w for Qwen's zero-centred norm), then their "
      "first rotary_dim dims rotated in halves (NeoX) by inv_freq [rotary_dim // 2] "
      "(rope_inv_freq; None when rotary_dim is 0) at each row's position: pos0 + t, or with "
      "slots [T] int32 (-1 idle: position 0) and lengths [n] int32 the position lengths[slots[t]] "
      "(read on the device on CUDA: graph-safe). eps: the norms' epsilon.\n"
      "Raises ContractError (shapes, dtypes, devices; CONTRACT_ODD_ROPE for an odd rotary_dim; "
      "CONTRACT_MISSING for inv_freq None with rotary_dim > 0; CONTRACT_RANGE for a slot outside "
      "lengths or a negative pos0, on the CPU), "
      "UnsupportedError for hd > 256.\nReference: Qwen3_5Attention.forward (torch.chunk of the "
      "joint projection, Qwen3_5RMSNorm, apply_rotary_pos_emb).");

  m.def(
      "kv_append",
      [](const AnyArray& k, const AnyArray& v, nb::object k_cache, nb::object v_cache, int pos0,
         std::optional<AnyArray> slots, std::optional<AnyArray> lengths, const Engine* engine) {
        const char* op = "kv_append";
        const bool dev = slots.has_value();
        const KvCache kc = kv_cache_arg(engine, k_cache, op, "k_cache", dev, true);
        const KvCache vc = kv_cache_arg(engine, v_cache, op, "v_cache", dev, true);
        same_cache(kc, vc, op);
        const float* kp = f32_in(engine, k, op, "k", {-1, kc.Hkv, kc.hd});
        const int64_t T = dim(k, 0);
        const float* vp = f32_in(engine, v, op, "v", {T, kc.Hkv, kc.hd});
        check_heads(kc.Hkv, kc.Hkv, kc.hd, op);
        const Where w = where_arg(engine, pos0, slots, lengths, T, dev ? kc.max_batch : 0, kc.max_len, op);
        const size_t in_bytes = k.nbytes();  // v: the same shape
        const size_t cache_bytes = (kc.dtype == 0 ? 4 : 2) * z(kc.max_batch) * z(kc.max_len) *
                                   z(kc.Hkv) * z(kc.hd);
        check_all_disjoint(op, {{"k_cache", kc.data, cache_bytes}, {"v_cache", vc.data, cache_bytes}});
        check_disjoint(op, "k", kp, in_bytes, "k_cache", kc.data, cache_bytes);
        check_disjoint(op, "k", kp, in_bytes, "v_cache", vc.data, cache_bytes);
        check_disjoint(op, "v", vp, in_bytes, "k_cache", kc.data, cache_bytes);
        check_disjoint(op, "v", vp, in_bytes, "v_cache", vc.data, cache_bytes);
        MemraKvAppendParams p = {};
        p.k = kp;
        p.ld_k = kc.Hkv * kc.hd;
        p.v = vp;
        p.ld_v = kc.Hkv * kc.hd;
        p.T = int(T);
        p.Hkv = int(kc.Hkv);
        p.hd = int(kc.hd);
        p.k_cache = kc.data;
        p.v_cache = vc.data;
        p.cache_dtype = kc.dtype;
        p.max_len = int(kc.max_len);
        p.slot_stride = kc.max_len * kc.Hkv * kc.hd;
        p.pos0 = w.pos0;
        p.slots = w.slots;
        p.lengths = w.lengths;
        run(engine, &op::kv_append, p);
      },
      nb::arg("k"), nb::arg("v"), nb::arg("k_cache"), nb::arg("v_cache"), nb::kw_only(),
      nb::arg("pos0") = 0, nb::arg("slots").none() = nb::none(),
      nb::arg("lengths").none() = nb::none(), nb::arg("engine").none() = nb::none(),
      "Write K/V rows into caches in place: k, v [T, Hkv, hd] float32; k_cache, v_cache float32 "
      "or bfloat16 (rounded to nearest even; uint16 raw bits accepted), writable, on the engine's "
      "device. Direct form: caches [max_len, Hkv, hd], row t at pos0 + t. With slots [T] int32 "
      "(-1 idle: nothing written) and lengths [max_batch] int32: caches [max_batch, max_len, Hkv, "
      "hd], row t at [slots[t], lengths[slots[t]]] (read on the device on CUDA: graph-safe; a "
      "position past max_len writes nothing there).\nRaises ContractError (shapes, dtypes, "
      "devices, a read-only cache; CONTRACT_RANGE for rows past max_len, and on the CPU a slot "
      "or length out of range; CONTRACT_VALUE for a repeated slot on the CPU, or for k / v "
      "sharing memory with a cache or the two caches sharing memory). Nothing is written on "
      "error.\nReference: the cache update of past_key_values.update.");

  m.def(
      "attention",
      [](const AnyArray& q, nb::object k_cache, nb::object v_cache, float scale,
         std::optional<AnyArray> gate, int pos0, std::optional<AnyArray> slots,
         std::optional<AnyArray> lengths, const Engine* engine) {
        const char* op = "attention";
        const bool dev = slots.has_value();
        const KvCache kc = kv_cache_arg(engine, k_cache, op, "k_cache", dev, false);
        const KvCache vc = kv_cache_arg(engine, v_cache, op, "v_cache", dev, false);
        same_cache(kc, vc, op);
        const float* qp = f32_in(engine, q, op, "q", {-1, -1, kc.hd});
        const int64_t T = dim(q, 0), Hq = dim(q, 1);
        check_heads(Hq, kc.Hkv, kc.hd, op);
        const float* gp = gate ? f32_in(engine, *gate, op, "gate", {T, Hq, kc.hd}) : nullptr;
        check_finite(scale, op, "scale");
        const Where w = where_arg(engine, pos0, slots, lengths, T, dev ? kc.max_batch : 0, kc.max_len, op);
        Out o = out_f32_uninit(engine, {z(T), z(Hq), z(kc.hd)});
        MemraAttnParams p = {};
        p.q = qp;
        p.gate = gp;
        p.o = o.data<float>();
        p.k_cache = kc.data;
        p.v_cache = vc.data;
        p.cache_dtype = kc.dtype;
        p.max_len = int(kc.max_len);
        p.slot_stride = kc.max_len * kc.Hkv * kc.hd;
        p.T = int(T);
        p.Hq = int(Hq);
        p.Hkv = int(kc.Hkv);
        p.hd = int(kc.hd);
        p.scale = scale;
        p.pos0 = w.pos0;
        p.slots = w.slots;
        p.lengths = w.lengths;
        run(engine, &op::attention, p);
        return o.obj;
      },
      nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::kw_only(), nb::arg("scale"),
      nb::arg("gate").none() = nb::none(), nb::arg("pos0") = 0,
      nb::arg("slots").none() = nb::none(), nb::arg("lengths").none() = nb::none(),
      nb::arg("engine").none() = nb::none(),
      "Causal grouped attention with the sigmoid output gate: q [T, Hq, hd] float32 -> o [T, Hq, "
      "hd] float32, query head h reading K/V head h // (Hq // Hkv): o = softmax(scale * q k^T) v "
      "over the rows a query sees, times sigmoid(gate [T, Hq, hd]) when gate is given. Caches as "
      "kv_append's (float32 or bfloat16). Direct form: query t at position pos0 + t sees rows "
      "[0, pos0 + t]. With slots [T] / lengths [max_batch]: row t sees its slot's rows [0, "
      "lengths[slots[t]]] (the row appended at its length included), an idle row (-1) gets "
      "zeros; on CUDA split over the sequence (memra.KernelOptions.attn_decode_unsplit: one "
      "block a row and K/V head). scale: transformers' head_dim ** -0.5, finite.\n"
      "Raises ContractError as kv_append, UnsupportedError for hd > 256.\nReference: "
      "eager_attention_forward with repeat_kv, then attn_output * sigmoid(gate) "
      "(Qwen3_5Attention.forward).");
}

}  // namespace memra::py
