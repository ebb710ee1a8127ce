// Functional bindings of the batched MLA decode forms (mla_attn_decode, mla_latent_append_decode:
// B sequences of one query / row each) over DLPack arrays; the one-sequence ops are in
// bind_ops_mla.cpp. Each op runs through memra::op (op/mla.h): on CUDA one launch plan over a
// device table of the per-sequence caches, on the CPU the reference ops per sequence. Arguments
// are checked (ContractError naming the op and the values) before anything runs.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bind_ops_mla.h"
#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/op/mla.h"
#include "op_call.h"

namespace memra::py {

namespace {

size_t z(int64_t n) { return static_cast<size_t>(n); }

// The caches of a batched call: B arrays [L_b, W] of one dtype (float32; on CUDA also bfloat16
// or uint16 raw bits) on the engine's device, or one C-contiguous array [B, L, W] whose slice b
// is sequence b's cache (one DLPack import where a list costs one per sequence). W == -1: any
// width, the same for all.
struct CacheList {
  std::vector<AnyArray> keep;  // the arrays themselves: their memory lives until the op returns
  std::vector<const void*> data;
  std::vector<int64_t> rows;
  int64_t W = -1;
  int dtype = 0;
};

// writable: the op writes into the caches (each must accept writes).
CacheList cache_list_arg(const Engine* engine, nb::handle caches, int64_t B, const char* op,
                         bool writable = false) {
  CacheList c;
  if (nb::hasattr(caches, "__dlpack__") || PyObject_CheckBuffer(caches.ptr())) {  // one array
    AnyArray a;
    if (!nb::try_cast(caches, a) || !a.refusal().empty()) {
      raise_contract(kContractDType, std::string(op) + ": argument 'caches' must be an array "
                                         "[B, L, W] or a list of B arrays [L_b, W], got " +
                                         (a.refusal().empty()
                                              ? std::string(nb::type_name(caches.type()).c_str())
                                              : a.refusal()));
    }
    if (a.ndim() != 3) {
      raise_contract(kContractShape, std::string(op) + ": caches has shape " + shape_str(a) +
                                         ", expected [B=" + std::to_string(B) +
                                         ", L, W] (or a list of B arrays [L_b, W])");
    }
    if (writable) require_writable(caches, op, "caches");
    const char* base = static_cast<const char*>(cache_arg(engine, a, op, &c.dtype, "caches",
                                                          {B, -1, -1}));
    const int64_t L = dim(a, 1);
    c.W = dim(a, 2);
    const int64_t step = L * c.W * (c.dtype == 0 ? 4 : 2);
    if (on_cuda(engine) && c.dtype == 1 && L > 0 &&
        (reinterpret_cast<uintptr_t>(base) % 16 != 0 || step % 16 != 0)) {
      raise_contract(kContractStride, std::string(op) + ": caches " + shape_str(a) +
                                          " (bfloat16) must start on a 16-byte boundary and hold "
                                          "L * W a multiple of 8 (every sequence's rows aligned)");
    }
    for (int64_t b = 0; b < B; ++b) {
      c.data.push_back(base + b * step);
      c.rows.push_back(L);
    }
    c.keep.push_back(std::move(a));
    return c;
  }
  if (!nb::isinstance<nb::sequence>(caches) || nb::isinstance<nb::str>(caches)) {
    raise_contract(kContractDType, std::string(op) +
                                       ": argument 'caches' must be an array [B, L, W] or a list "
                                       "of arrays (one per sequence), got " +
                                       std::string(nb::type_name(caches.type()).c_str()));
  }
  int64_t b = 0;
  for (nb::handle h : caches) {
    if (b >= B) {  // checked as it goes: an endless sequence must not run forever
      raise_contract(kContractShape, std::string(op) + ": more than " + std::to_string(B) +
                                         " caches for B=" + std::to_string(B) + " sequences");
    }
    const std::string name = "caches[" + std::to_string(b) + "]";
    AnyArray a;
    if (!nb::try_cast(h, a)) {
      raise_contract(kContractDType, std::string(op) + ": " + name + " must be an array, got " +
                                         std::string(nb::type_name(h.type()).c_str()));
    }
    if (writable) require_writable(h, op, name.c_str());
    int dt = 0;
    const void* ptr = cache_arg(engine, a, op, &dt, name.c_str());
    if (b > 0 && dt != c.dtype) {
      raise_contract(kContractDType, std::string(op) + ": " + name +
                                         " has another dtype than caches[0] (one dtype for all)");
    }
    if (b > 0 && dim(a, 1) != c.W) {
      raise_contract(kContractShape, std::string(op) + ": " + name + " has shape " + shape_str(a) +
                                         ", expected [L, " + std::to_string(c.W) +
                                         "] (the width of caches[0])");
    }
    if (on_cuda(engine) && dt == 1 && dim(a, 0) > 0 && reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
      raise_contract(kContractStride, std::string(op) + ": " + name +
                                          " (bfloat16) must start on a 16-byte boundary");
    }
    c.dtype = dt;
    c.W = dim(a, 1);
    c.data.push_back(ptr);
    c.rows.push_back(dim(a, 0));
    c.keep.push_back(std::move(a));
    ++b;
  }
  if (b != B) {
    raise_contract(kContractShape, std::string(op) + ": " + std::to_string(b) +
                                       " caches for B=" + std::to_string(B) + " sequences");
  }
  return c;
}

}  // namespace

void init_ops_mla_decode(nb::module_& m) {
  m.def(
      "mla_attn_decode",
      [](const AnyArray& q_lat, nb::handle caches, nb::handle t_kv, std::optional<AnyArray> idx,
         std::optional<AnyArray> q_pe, float scale, std::optional<int64_t> max_t_kv,
         const Engine* engine) {
        const char* op = "mla_attn_decode";
        const float* qp = f32_in(engine, q_lat, op, "q_lat", {-1, -1, -1});
        const int64_t B = dim(q_lat, 0), H = dim(q_lat, 1), R = dim(q_lat, 2);
        if (R < 1) {
          raise_contract(kContractShape, std::string(op) + ": q_lat has shape " +
                                             shape_str(q_lat) + ", expected [B, H, R >= 1]");
        }
        CacheList c = cache_list_arg(engine, caches, B, op);
        const int64_t W = B > 0 ? c.W : R;
        if (W < R) {
          raise_contract(kContractShape,
                         std::string(op) + ": the caches are " + std::to_string(W) +
                             " wide, expected R + d_rope >= R=" + std::to_string(R) +
                             " (from q_lat " + shape_str(q_lat) + ")");
        }
        if (W - R > INT_MAX) {
          raise_contract(kContractShape, std::string(op) + ": caches " + std::to_string(W) +
                                             " wide are too wide");
        }
        const int d_rope = static_cast<int>(W - R);
        const float* pp = nullptr;
        if (q_pe) {
          pp = f32_in(engine, *q_pe, op, "q_pe", {B, H, d_rope});
        } else if (d_rope > 0) {
          raise_contract(kContractMissing, std::string(op) + ": the caches carry d_rope=" +
                                               std::to_string(d_rope) +
                                               " rope columns, so q_pe [B, H, d_rope] is required");
        }
        check_finite(scale, op, "scale");
        const int32_t* ip = nullptr;
        int width = 0;
        if (idx) {
          ip = i32_in(engine, *idx, op, "idx", {B, -1});
          width = dim32(*idx, 1, op, "idx");
        }
        PerSeq t = per_seq_arg(engine, t_kv, B, op, "t_kv");
        int64_t bound = 0;  // max_t_kv: the host bound the launch is sized from
        if (t.host) {
          for (int64_t b = 0; b < B; ++b) {
            const int32_t v = t.values[z(b)];
            if (v < 0 || v > c.rows[z(b)]) {
              raise_contract(kContractRange,
                             std::string(op) + ": t_kv[" + std::to_string(b) + "]=" +
                                 std::to_string(v) + " is outside [0, " +
                                 std::to_string(c.rows[z(b)]) + "] (the rows of caches[" +
                                 std::to_string(b) + "])");
            }
            bound = std::max<int64_t>(bound, v);
          }
        } else {
          for (int64_t r : c.rows) bound = std::max(bound, r);
        }
        if (max_t_kv) {
          if (*max_t_kv < bound && t.host) {
            raise_contract(kContractValue, std::string(op) + ": max_t_kv=" +
                                               std::to_string(*max_t_kv) + " is below max(t_kv)=" +
                                               std::to_string(bound));
          }
          if (*max_t_kv < 0 || *max_t_kv > INT_MAX) {
            raise_contract(kContractValue, std::string(op) + ": max_t_kv=" +
                                               std::to_string(*max_t_kv) + " is outside [0, 2^31)");
          }
          bound = *max_t_kv;
        }
        if (bound > INT_MAX) {
          raise_contract(kContractValue, std::string(op) + ": caches longer than 2^31 - 1 rows");
        }
        Out o = out_f32_uninit(engine, {z(B), z(H), z(R)});
        if (B == 0 || H == 0) return o.obj;
        // The per-sequence caches: a device table of their pointers on CUDA, host pointers here.
        std::shared_ptr<DeviceBuffer> table;
        const void* const* caches_p = c.data.data();
        if (on_cuda(engine)) {
          table = device_upload(engine, c.data.data(), sizeof(void*) * c.data.size());
          caches_p = static_cast<const void* const*>(table->data());
        }
        MemraMlaAttnParams p{};
        p.batched = 1;
        p.rows = ip ? MEMRA_MLA_ROWS_INDEXED : MEMRA_MLA_ROWS_CAUSAL;
        p.q_lat = qp;
        p.q_pe = d_rope > 0 ? pp : nullptr;
        p.H = static_cast<int>(H);
        p.R = static_cast<int>(R);
        p.d_rope = d_rope;
        p.scale = scale;
        p.cache_dtype = c.dtype;
        p.o_lat = o.data<float>();
        p.caches = caches_p;
        p.seq_t_kv = on_cuda(engine) ? t.dev : t.values.data();
        p.B = static_cast<int>(B);
        p.max_t_kv = static_cast<int>(bound);
        p.idx = ip;
        p.width = width;
        run_op(engine, op::mla_attn, p);
        return o.obj;
      },
      nb::arg("q_lat"), nb::arg("caches"), nb::arg("t_kv"), nb::kw_only(),
      nb::arg("idx").none() = nb::none(), nb::arg("q_pe").none() = nb::none(), nb::arg("scale"),
      nb::arg("max_t_kv").none() = nb::none(), nb::arg("engine").none() = nb::none(),
      "Batched absorbed MLA decode: B sequences, one query each, in one launch plan on CUDA.\n\n"
      "q_lat: [B, H, R] float32 (from mla_absorb_q). caches: a list of B arrays [L_b, R + d_rope] "
      "(the latent rows, then d_rope rope columns k_pe), all float32 or (CUDA) all bfloat16 "
      "(DLPack bfloat16 or uint16 raw bits; 16-byte aligned), on the engine's device; or one "
      "C-contiguous array [B, L, R + d_rope] whose slice b is sequence b's cache (L_b = L; one "
      "DLPack import instead of B, the cheaper call at large B). t_kv: rows "
      "visible to each sequence (its query sits at row t_kv[b] - 1): a host list / int array "
      "(checked: 0 <= t_kv[b] <= L_b), or on CUDA a device int32 [B] array (unchecked: t_kv[b] "
      "must be <= L_b; values above max_t_kv are clamped). t_kv[b] == 0 is an idle row: "
      "o_lat[b] = 0, nothing of it is read. idx: optional [B, width] int32 index lists "
      "(gathered attention: -1 and entries outside [0, t_kv[b]) skipped, a row listed twice "
      "counts once, an empty list gives zeros). q_pe: [B, H, d_rope] float32, required when "
      "d_rope > 0 (the score adds q_pe . k_pe). scale: qk_head_dim**-0.5 (qk_head_dim = d_nope "
      "+ d_rope). max_t_kv: the host bound the launch is sized from (default max(t_kv) for host "
      "t_kv, max L_b for device t_kv); keep it fixed to replay a captured graph at any "
      "position. Returns o_lat [B, H, R] float32 on the same device.\n"
      "CUDA: a bfloat16 cache with R in {128, 256, 512} and d_rope 0 or 64 runs on tensor "
      "cores: q_lat, q_pe and the softmax weights are rounded to bfloat16 for the two products, "
      "scores, softmax and accumulation are float32 (3e-3..6e-3 of max|o| against the float32 "
      "CPU op on the same cache); float32 caches (and other shapes with R <= 1024) run an exact "
      "float32 CUDA-core kernel (~1e-6 relative). The CPU backend runs mla_attn_absorbed / "
      "mla_attn_gathered per sequence.\n"
      "Raises ContractError: CONTRACT_SHAPE when len(caches) != B or a cache's width differs (one "
      "array: not [B, L, W]); "
      "CONTRACT_RANGE for a host t_kv outside [0, L_b]; CONTRACT_MISSING when q_pe is absent "
      "but d_rope > 0; CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE for "
      "bad arrays (CONTRACT_STRIDE also for a bfloat16 cache not 16-byte aligned); "
      "CONTRACT_VALUE for a non-finite scale or max_t_kv below max(t_kv). UnsupportedError "
      "(UNSUPPORTED_GEOMETRY) on CUDA for R > 1024 outside the tensor-core shapes, or rows too "
      "wide for the float32 kernel's shared memory.\n"
      "Reference: Glm5NextTextAttention.forward / KimiLinearAttention.forward at decode (one "
      "query per sequence), as mla_attn_absorbed / mla_attn_gathered with t_q = 1.");

  m.def(
      "mla_latent_append_decode",
      [](const AnyArray& rows, nb::handle caches, nb::handle pos, const Engine* engine) {
        const char* op = "mla_latent_append_decode";
        const float* rp = f32_in(engine, rows, op, "rows", {-1, -1});
        const int64_t B = dim(rows, 0), W = dim(rows, 1);
        if (W < 1) {
          raise_contract(kContractShape, std::string(op) + ": rows has shape " + shape_str(rows) +
                                             ", expected [B, W >= 1]");
        }
        CacheList c = cache_list_arg(engine, caches, B, op, /*writable=*/true);
        if (B > 0 && c.W != W) {
          raise_contract(kContractShape, std::string(op) + ": the caches are " +
                                             std::to_string(c.W) + " wide, rows " +
                                             shape_str(rows) + " are " + std::to_string(W));
        }
        // Before pos (which a host list uploads on CUDA): nothing allocated on a refusal. The
        // caches written are each its own (two sharing memory would have one launch's writes
        // race, and the CPU's last write win), and apart from the rows read.
        {
          std::vector<Span> out;
          for (int64_t b = 0; b < B; ++b) {
            out.push_back({"caches[" + std::to_string(b) + "]", c.data[z(b)],
                           (c.dtype == 0 ? 4 : 2) * z(c.rows[z(b)]) * z(W)});
          }
          for (const Span& w : out) {
            check_disjoint(op, "rows", rp, rows.nbytes(), w.name.c_str(), w.data, w.bytes);
          }
          check_all_disjoint(op, std::move(out));
        }
        PerSeq p = per_seq_arg(engine, pos, B, op, "pos");
        if (p.host) {
          for (int64_t b = 0; b < B; ++b) {
            const int32_t v = p.values[z(b)];
            if (v >= c.rows[z(b)]) {
              raise_contract(kContractRange, std::string(op) + ": pos[" + std::to_string(b) +
                                                 "]=" + std::to_string(v) +
                                                 " does not fit caches[" + std::to_string(b) +
                                                 "] of " + std::to_string(c.rows[z(b)]) + " rows");
            }
          }
        }
        if (B == 0) return;
        std::shared_ptr<DeviceBuffer> table;
        void* const* caches_p = const_cast<void* const*>(c.data.data());
        if (on_cuda(engine)) {
          table = device_upload(engine, c.data.data(), sizeof(void*) * c.data.size());
          caches_p = static_cast<void* const*>(table->data());
        }
        MemraMlaAppendParams ap{};
        ap.batched = 1;
        ap.rows = rp;
        ap.n = static_cast<int>(B);
        ap.W = static_cast<int>(W);
        ap.cache_dtype = c.dtype;
        ap.caches = caches_p;
        ap.pos = on_cuda(engine) ? p.dev : p.values.data();
        run_op(engine, op::mla_latent_append, ap);
      },
      nb::arg("rows"), nb::arg("caches"), nb::arg("pos"), nb::kw_only(),
      nb::arg("engine").none() = nb::none(),
      "Write one latent row per sequence in place: caches[b][pos[b], :] = rows[b, :].\n\n"
      "rows: [B, W] float32. caches: a list of B arrays [L_b, W], all float32 (CPU: writable "
      "host arrays) or, on CUDA, all bfloat16 (DLPack bfloat16 or uint16 raw bits; rounded to "
      "nearest even); or one writable C-contiguous array [B, L, W] (slice b: sequence b's "
      "cache). pos: a host list / int array (checked: pos[b] < L_b) or on CUDA a device "
      "int32 [B] array (unchecked); pos[b] < 0 is an idle row: nothing written. One launch on "
      "CUDA. Returns None.\n"
      "Raises ContractError: CONTRACT_RANGE for a host pos[b] >= L_b (nothing written); "
      "CONTRACT_VALUE when rows share memory with a cache or two caches share memory; "
      "CONTRACT_SHAPE when len(caches) != B or widths differ; CONTRACT_DTYPE / CONTRACT_STRIDE / "
      "CONTRACT_DEVICE for bad arrays.\n"
      "Reference: mla_latent_append per sequence with T = 1.");
}

}  // namespace memra::py
