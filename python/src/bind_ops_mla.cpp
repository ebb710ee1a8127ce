// Functional bindings of the MLA ops over DLPack arrays. CPU backend (engine None or a CPU
// Engine): ops.h / cpu/mla.cpp, the oracle. CUDA backend (keyword `engine` = a CUDA Engine):
// cuda/mla.cu through the C ABI of cpp/include/memra/cuda_abi/mla.h; every array argument must
// then live on the engine's device, kv_b is a memra.DeviceWeight, outputs are allocated there and
// the work is enqueued on the engine's stream (read results with engine.to_host, which waits).
// Every function checks its arguments (ContractError naming the op and the values) before
// anything runs and, on the CPU, releases the GIL while computing.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/ops.h"

namespace memra::py {

namespace {

size_t z(int64_t n) { return static_cast<size_t>(n); }

// kv_b as seen by either backend: a host Weight (CPU) or a DeviceWeight (CUDA).
struct KvB {
  const Weight* host = nullptr;
  const DeviceWeight* dev = nullptr;
  size_t ndim = 0;
  int64_t rows = 0, cols = 0;
  std::string shape_str() const { return host ? host->shape_str() : dev->shape_str(); }
};

KvB kv_b_arg(const Engine* engine, nb::handle w, const char* op) {
  KvB k;
  if (on_cuda(engine)) {
    k.dev = &device_weight(engine, w, op, "kv_b");
    k.ndim = k.dev->shape.size();
    k.rows = k.dev->rows;
    k.cols = k.dev->cols;
  } else {
    k.host = &host_weight(w, op, "kv_b");
    k.ndim = k.host->shape().size();
    k.rows = k.host->rows();
    k.cols = k.host->cols();
  }
  return k;
}

// kv_b must be [H * (d_nope + d_v), R]: the per-head [k_nope | v] row blocks of kv_b_proj.
void check_kv_b(const KvB& kv_b, const char* op, int64_t H, int64_t d_nope, int64_t d_v) {
  if (kv_b.ndim != 2 || kv_b.rows != H * (d_nope + d_v) || kv_b.cols < 1) {
    raise_contract(kContractShape,
                   std::string(op) + ": kv_b has shape " + kv_b.shape_str() +
                       ", expected [H*(d_nope+d_v), R] = [" + std::to_string(H) + "*(" +
                       std::to_string(d_nope) + "+" + std::to_string(d_v) + "), R >= 1]");
  }
}

void check_arm(int arm, const char* op) {
  if (arm < 0 || arm > 3) {
    raise_contract(kContractValue, std::string(op) + ": arm must be 0 (auto), 1 (per-position), "
                                                     "2 (output split) or 3 (cuBLASLt), got " +
                                       std::to_string(arm));
  }
}

// A latent cache argument: float32 on either backend; on CUDA also bfloat16 (a DLPack bfloat16
// array, or uint16 holding the raw bfloat16 bits). Returns the data pointer and the dtype code
// (0 f32, 1 bf16).
const void* cache_arg(const Engine* engine, const AnyArray& a, const char* op, int* dtype,
                      const char* name = "cache") {
  const bool f32 = has_dtype(a, nb::dlpack::dtype_code::Float, 32);
  const bool bf16 = has_bf16(a);
  if (on_cuda(engine)) {
    check_array(a, op, name, {-1, -1}, "float32 or bfloat16 (uint16 raw bits accepted)", f32 || bf16,
                nb::device::cuda::value, engine->device_index());
    *dtype = f32 ? 0 : 1;
    return a.data();
  }
  *dtype = 0;
  return f32_in(engine, a, op, name, {-1, -1});
}

// Shared argument walk of the two attention ops.
struct AttnArgs {
  const float* q_lat;
  const float* q_pe;
  const void* cache;
  int cache_dtype;
  int t_q, H, R, d_rope, t_kv;
};

AttnArgs attn_args(const Engine* engine, const AnyArray& q_lat, const AnyArray& cache,
                   const std::optional<AnyArray>& q_pe, float scale, const char* op) {
  AttnArgs a;
  a.q_lat = f32_in(engine, q_lat, op, "q_lat", {-1, -1, -1});
  a.t_q = static_cast<int>(dim(q_lat, 0));
  a.H = static_cast<int>(dim(q_lat, 1));
  a.R = static_cast<int>(dim(q_lat, 2));
  a.cache = cache_arg(engine, cache, op, &a.cache_dtype);
  a.t_kv = static_cast<int>(dim(cache, 0));
  a.d_rope = static_cast<int>(dim(cache, 1)) - a.R;
  if (a.d_rope < 0) {
    raise_contract(kContractShape, std::string(op) + ": cache has shape " + shape_str(cache) +
                                       ", expected [t_kv, R + d_rope] with R=" +
                                       std::to_string(a.R) + " (from q_lat " + shape_str(q_lat) +
                                       ")");
  }
  a.q_pe = nullptr;
  if (q_pe) {
    a.q_pe = f32_in(engine, *q_pe, op, "q_pe", {a.t_q, a.H, a.d_rope});
  } else if (a.d_rope > 0) {
    raise_contract(kContractMissing, std::string(op) + ": the cache carries d_rope=" +
                                         std::to_string(a.d_rope) +
                                         " rope columns, so q_pe [t_q, H, d_rope] is required");
  }
  check_finite(scale, op, "scale");
  return a;
}

void check_suffix(const AttnArgs& a, const char* op) {
  if (a.t_q > a.t_kv) {
    raise_contract(kContractQuerySuffix,
                   std::string(op) + ": the queries must be the last rows of the cache, got t_q=" +
                       std::to_string(a.t_q) + " > t_kv=" + std::to_string(a.t_kv));
  }
}


// ---------------------------------------------------------------- batched decode arguments

// The caches of a batched call: B arrays [L_b, W] of one dtype (float32; on CUDA also bfloat16
// or uint16 raw bits) on the engine's device. W == -1: any width, the same for all.
struct CacheList {
  std::vector<const void*> data;
  std::vector<int64_t> rows;
  int64_t W = -1;
  int dtype = 0;
};

// writable: the op writes into the caches (each must accept writes).
CacheList cache_list_arg(const Engine* engine, nb::handle caches, int64_t B, const char* op,
                         bool writable = false) {
  if (nb::hasattr(caches, "__dlpack__") || !nb::isinstance<nb::sequence>(caches) ||
      nb::isinstance<nb::str>(caches)) {
    raise_contract(kContractDType, std::string(op) +
                                       ": argument 'caches' must be a list of arrays (one per "
                                       "sequence), got " +
                                       std::string(nb::type_name(caches.type()).c_str()));
  }
  CacheList c;
  int64_t b = 0;
  for (nb::handle h : caches) {
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
    ++b;
  }
  if (b != B) {
    raise_contract(kContractShape, std::string(op) + ": " + std::to_string(b) +
                                       " caches for B=" + std::to_string(B) + " sequences");
  }
  return c;
}

}  // namespace

void init_ops_mla(nb::module_& m) {
  m.def(
      "mla_absorb_q",
      [](const AnyArray& q_nope, nb::handle kv_b, int d_v, int arm, const Engine* engine) {
        const char* op = "mla_absorb_q";
        const float* qp = f32_in(engine, q_nope, op, "q_nope", {-1, -1, -1});
        const int T = static_cast<int>(dim(q_nope, 0)), H = static_cast<int>(dim(q_nope, 1)),
                  d_nope = static_cast<int>(dim(q_nope, 2));
        check_nonneg(d_v, op, "d_v");
        check_arm(arm, op);
        const KvB w = kv_b_arg(engine, kv_b, op);
        check_kv_b(w, op, H, d_nope, d_v);
        const int64_t R = w.cols;
        Out q_lat = out_f32(engine, {z(T), z(H), z(R)});
        if (on_cuda(engine)) {
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine,
                     c.api().mla_absorb_q(c.ctx(), qp, w.dev->data(), w.dev->dtype_code(), T, H,
                                          d_nope, d_v, static_cast<int>(R), arm,
                                          q_lat.data<float>()),
                     op);
        } else {
          nb::gil_scoped_release nogil;
          cpu::mla_absorb_q(qp, *w.host, T, H, d_nope, d_v, q_lat.data<float>());
        }
        return q_lat.obj;
      },
      nb::arg("q_nope"), nb::arg("kv_b"), nb::kw_only(), nb::arg("d_v"), nb::arg("arm") = 0,
      nb::arg("engine").none() = nb::none(),
      "Absorb W_uk into the query: q_lat[t, h, :] = W_uk[h]^T q_nope[t, h, :].\n\n"
      "q_nope: [T, H, d_nope] float32, C-contiguous, on the engine's device (host for the CPU). "
      "kv_b: [H*(d_nope+d_v), R] (kv_b_proj.weight; head h's rows are d_nope k rows then d_v v "
      "rows): a memra.Weight for the CPU, a memra.DeviceWeight (float32 or bfloat16) for CUDA. "
      "Returns q_lat [T, H, R] float32 on the same device.\n"
      "arm (CUDA only; the CPU ignores it): 0 auto, 1 per-position kernel, 2 streaming kernel "
      "(weights of a head's output tile held in shared memory over all positions; bytes equal "
      "to arm 1), 3 cuBLASLt bf16 GEMM batched over heads (bf16 kv_b only; q_nope is rounded to "
      "bfloat16). Auto takes 3 for bf16 kv_b at T >= 64 (1 when cuBLASLt declines), else 2 or 1. "
      "Arms 1/2 do the CPU's operations in its order (n ascending, products and sums rounded "
      "separately): the CPU's bytes where the CPU build does not contract into FMAs.\n"
      "Raises ContractError: CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE "
      "for a bad q_nope, CONTRACT_SHAPE when kv_b's shape does not match, CONTRACT_DEVICE for a "
      "kv_b of the wrong kind, CONTRACT_VALUE for d_v < 0 or an arm outside 0..3; "
      "UnsupportedError for arm 3 with float32 kv_b; LibraryError when cuBLASLt declines arm 3.\n"
      "Reference: Glm5NextTextAttention.expand_kv (k_nope = W_uk c), folded into q.");

  m.def(
      "mla_decompress_v",
      [](const AnyArray& o_lat, nb::handle kv_b, int d_nope, int arm, const Engine* engine) {
        const char* op = "mla_decompress_v";
        const float* op_ = f32_in(engine, o_lat, op, "o_lat", {-1, -1, -1});
        const int T = static_cast<int>(dim(o_lat, 0)), H = static_cast<int>(dim(o_lat, 1)),
                  R = static_cast<int>(dim(o_lat, 2));
        check_nonneg(d_nope, op, "d_nope");
        check_arm(arm, op);
        const KvB w = kv_b_arg(engine, kv_b, op);
        if (H < 1 || w.ndim != 2 || w.rows % H != 0 || w.rows / H < d_nope || w.cols != R) {
          raise_contract(kContractShape,
                         std::string(op) + ": kv_b has shape " + w.shape_str() +
                             ", expected [H*(d_nope+d_v), R] with H=" + std::to_string(H) +
                             ", d_nope=" + std::to_string(d_nope) + ", R=" + std::to_string(R) +
                             " (from o_lat " + shape_str(o_lat) + ")");
        }
        const int d_v = static_cast<int>(w.rows / H) - d_nope;
        Out out = out_f32(engine, {z(T), z(H), z(d_v)});
        if (on_cuda(engine)) {
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine,
                     c.api().mla_decompress_v(c.ctx(), op_, w.dev->data(), w.dev->dtype_code(), T,
                                              H, d_nope, d_v, R, arm, out.data<float>()),
                     op);
        } else {
          nb::gil_scoped_release nogil;
          cpu::mla_decompress_v(op_, *w.host, T, H, d_nope, d_v, out.data<float>());
        }
        return out.obj;
      },
      nb::arg("o_lat"), nb::arg("kv_b"), nb::kw_only(), nb::arg("d_nope"), nb::arg("arm") = 0,
      nb::arg("engine").none() = nb::none(),
      "Decompress the latent attention output: out[t, h, :] = W_uv[h] o_lat[t, h, :].\n\n"
      "o_lat: [T, H, R] float32 on the engine's device (host for the CPU). kv_b: "
      "[H*(d_nope+d_v), R], memra.Weight (CPU) or memra.DeviceWeight (CUDA). Returns out "
      "[T, H, d_v] float32 (d_v = kv_b rows / H - d_nope) on the same device.\n"
      "arm (CUDA only; the CPU ignores it): as mla_absorb_q (3: o_lat rounded to bfloat16, "
      "cuBLASLt over heads). Arms 1/2: one thread per output summing r ascending, products and "
      "sums rounded separately (the CPU's bytes where the CPU build does not contract).\n"
      "Raises ContractError: CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE "
      "for a bad o_lat, CONTRACT_SHAPE when kv_b does not match, CONTRACT_VALUE for d_nope < 0 or "
      "an arm outside 0..3; UnsupportedError for arm 3 with float32 kv_b; LibraryError when "
      "cuBLASLt declines arm 3.\n"
      "Reference: Glm5NextTextAttention.expand_kv (value_states = W_uv c), folded into the "
      "output.");

  m.def(
      "mla_latent_append",
      [](const AnyArray& rows, nb::object cache_obj, int start, const Engine* engine) {
        const char* op = "mla_latent_append";
        AnyArray cache;
        if (!nb::try_cast(cache_obj, cache)) {
          raise_contract(kContractDType, std::string(op) + ": argument 'cache' must be an array, got " +
                                             std::string(nb::type_name(cache_obj.type()).c_str()));
        }
        require_writable(cache_obj, op, "cache");
        int cdt = 0;
        void* cp = const_cast<void*>(cache_arg(engine, cache, op, &cdt));
        const int64_t max_len = dim(cache, 0), W = dim(cache, 1);
        const float* rp = f32_in(engine, rows, op, "rows", {-1, W});
        const int T = static_cast<int>(dim(rows, 0));
        if (start < 0 || static_cast<int64_t>(start) + T > max_len) {
          raise_contract(kContractRange, std::string(op) + ": rows [" + std::to_string(start) +
                                             ", " + std::to_string(int64_t(start) + T) +
                                             ") do not fit a cache of max_len=" +
                                             std::to_string(max_len));
        }
        if (W < 1) {
          raise_contract(kContractShape, std::string(op) + ": cache has shape " +
                                             shape_str(cache) + ", expected [max_len, W >= 1]");
        }
        if (on_cuda(engine)) {
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine,
                     c.api().mla_latent_append(c.ctx(), rp, T, static_cast<int>(W), cp, cdt, start),
                     op);
        } else if (T > 0) {
          std::memcpy(static_cast<float*>(cp) + int64_t(start) * W, rp, sizeof(float) * z(T * W));
        }
        return cache_obj;  // the same array object, written in place
      },
      nb::arg("rows"), nb::arg("cache"), nb::kw_only(), nb::arg("start"),
      nb::arg("engine").none() = nb::none(),
      "Write latent rows into a cache in place: cache[start + t, :] = rows[t, :].\n\n"
      "rows: [T, W] float32; cache: [max_len, W], float32 (CPU: a writable host array), or on "
      "CUDA float32 or bfloat16 (a DLPack bfloat16 array or uint16 raw bits; the rows are "
      "rounded to nearest even). Both on the engine's device. Returns the cache (the same array "
      "object; for a single-use DLPack capsule, such as engine.to_device returns, a new capsule "
      "viewing the same buffer).\n"
      "Raises ContractError: CONTRACT_RANGE when [start, start + T) does not fit max_len; "
      "CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays. Nothing "
      "is written on error.\nReference: MlaLayer (cpp/src/layers/mla_layer.cpp), the latent rows "
      "[normalised latent | k_pe] appended at rows [pos, pos + T).");

  m.def(
      "mla_attn_absorbed",
      [](const AnyArray& q_lat, const AnyArray& cache, std::optional<AnyArray> q_pe, float scale,
         const Engine* engine) {
        const char* op = "mla_attn_absorbed";
        AttnArgs a = attn_args(engine, q_lat, cache, q_pe, scale, op);
        check_suffix(a, op);
        Out o = out_f32(engine, {z(a.t_q), z(a.H), z(a.R)});
        if (on_cuda(engine)) {
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine,
                     c.api().mla_attn_absorbed(c.ctx(), a.q_lat, a.q_pe, a.cache, a.cache_dtype,
                                               a.H, a.R, a.d_rope, a.t_q, a.t_kv, scale,
                                               o.data<float>()),
                     op);
          return o.obj;
        }
        Status st;
        {
          nb::gil_scoped_release nogil;
          st = cpu::mla_attn_absorbed(a.q_lat, a.q_pe, static_cast<const float*>(a.cache), a.H,
                                      a.R, a.d_rope, a.t_q, a.t_kv, scale, o.data<float>());
        }
        check(st);
        return o.obj;
      },
      nb::arg("q_lat"), nb::arg("cache"), nb::arg("q_pe") = nb::none(), nb::kw_only(),
      nb::arg("scale"), nb::arg("engine").none() = nb::none(),
      "Causal absorbed MLA attention over a latent cache; the queries are the cache's last t_q "
      "rows (query i sits at row t_kv - t_q + i and sees rows <= it).\n\n"
      "q_lat: [t_q, H, R] float32 (from mla_absorb_q). cache: [t_kv, R + d_rope] (kv_a_layernorm'd "
      "latent, then the rope part): float32, or on CUDA also bfloat16 (DLPack bfloat16 or uint16 "
      "raw bits). q_pe: [t_q, H, d_rope] float32, required when d_rope > 0. All on the engine's "
      "device. scale: qk_head_dim**-0.5 (qk_head_dim = d_nope + d_rope). Returns o_lat "
      "[t_q, H, R] float32; score = (q_lat . c + q_pe . k_pe) * scale, softmax in f32 (CUDA: "
      "online over tiles of 32 rows, split over the rows when the queries alone do not fill the "
      "GPU; ~1e-5 relative to the CPU).\n"
      "Raises ContractError: CONTRACT_QUERY_SUFFIX when t_q > t_kv; CONTRACT_MISSING when q_pe "
      "is absent but d_rope > 0; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / "
      "CONTRACT_DEVICE for bad arrays; CONTRACT_VALUE for a non-finite scale. UnsupportedError "
      "(CUDA) for R > 8192 or rows too wide for shared memory.\n"
      "Reference: Glm5NextTextAttention.forward with a causal mask (eager_attention_forward).");

  m.def(
      "mla_attn_gathered",
      [](const AnyArray& q_lat, const AnyArray& cache, const AnyArray& idx,
         std::optional<AnyArray> q_pe, float scale, bool check_range, const Engine* engine) {
        const char* op = "mla_attn_gathered";
        AttnArgs a = attn_args(engine, q_lat, cache, q_pe, scale, op);
        const int32_t* ip = i32_in(engine, idx, op, "idx", {a.t_q, -1});
        const int width = static_cast<int>(dim(idx, 1));
        if (on_cuda(engine)) {
          check_suffix(a, op);
          if (check_range && int64_t(a.t_q) * width > 0) {
            // The CPU's range check (-1 <= r < t_kv), plus no row after the query's own (the GPU
            // would skip it; the CPU op would attend to it): one wait on the engine's stream.
            std::vector<int32_t> host(z(int64_t(a.t_q) * width));
            const CudaContext& c = cuda_ctx(engine);
            check_cuda(engine,
                       c.api().copy_to_host(c.ctx(), host.data(), ip, sizeof(int32_t) * host.size()),
                       op);
            for (int64_t e = 0; e < static_cast<int64_t>(host.size()); ++e) {
              const int32_t r = host[z(e)];
              const int64_t i = e / width, qrow = int64_t(a.t_kv) - a.t_q + i;
              if (r < -1 || r >= a.t_kv || r > qrow) {
                raise_contract(kContractRange,
                               std::string(op) + ": index " + std::to_string(r) + " at query " +
                                   std::to_string(i) + ", entry " + std::to_string(e % width) +
                                   " is outside [0, query row " + std::to_string(qrow) +
                                   "] (t_kv=" + std::to_string(a.t_kv) +
                                   ") and is not the padding value -1");
              }
            }
          }
          Out o = out_f32(engine, {z(a.t_q), z(a.H), z(a.R)});
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine,
                     c.api().mla_attn_gathered(c.ctx(), a.q_lat, a.q_pe, a.cache, a.cache_dtype, ip,
                                               a.H, a.R, a.d_rope, a.t_q, a.t_kv, width, scale,
                                               o.data<float>()),
                     op);
          return o.obj;
        }
        Out o = out_f32(engine, {z(a.t_q), z(a.H), z(a.R)});
        Status st;
        {
          nb::gil_scoped_release nogil;
          st = cpu::mla_attn_gathered(a.q_lat, a.q_pe, static_cast<const float*>(a.cache), ip, a.H,
                                      a.R, a.d_rope, a.t_q, a.t_kv, width, scale, o.data<float>());
        }
        check(st);
        return o.obj;
      },
      nb::arg("q_lat"), nb::arg("cache"), nb::arg("idx"), nb::arg("q_pe") = nb::none(),
      nb::kw_only(), nb::arg("scale"), nb::arg("check_range") = true,
      nb::arg("engine").none() = nb::none(),
      "Absorbed MLA attention where query i attends over the cache rows listed in idx[i, :].\n\n"
      "q_lat: [t_q, H, R] float32. cache: [t_kv, R + d_rope] float32, or on CUDA also bfloat16 "
      "(DLPack bfloat16 or uint16 raw bits). idx: [t_q, width] int32 (entries -1 are padding; "
      "the list is a set: order does not matter and a duplicated row counts once). q_pe: "
      "[t_q, H, d_rope] float32, required when d_rope > 0. All on the engine's device. Returns "
      "o_lat [t_q, H, R] float32; a query whose list is all -1 gets zeros.\n"
      "check_range (CUDA only): copy idx to the host first and refuse an entry outside "
      "[-1, t_kv) or after its query's row (t_kv - t_q + i) (one wait on the engine's stream); "
      "with False such entries are skipped on the device. CUDA also requires t_q <= t_kv "
      "(queries are the cache's last rows).\n"
      "Raises ContractError: CONTRACT_RANGE for an entry >= t_kv or < -1 (CUDA: or after the "
      "query row); CONTRACT_QUERY_SUFFIX (CUDA) when t_q > t_kv; CONTRACT_MISSING when q_pe is "
      "absent but d_rope > 0; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / "
      "CONTRACT_DEVICE for bad arrays (int64 idx is refused, not narrowed); CONTRACT_VALUE for a "
      "non-finite scale.\n"
      "Reference: Glm5NextTextAttention.build_attention_mask_from_topk + "
      "eager_attention_forward.");

  m.def(
      "mla_attn_decode",
      [](const AnyArray& q_lat, nb::handle caches, nb::handle t_kv, std::optional<AnyArray> idx,
         float scale, std::optional<int64_t> max_t_kv, const Engine* engine) {
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
        const int d_rope = static_cast<int>(W - R);
        check_finite(scale, op, "scale");
        const int32_t* ip = nullptr;
        int width = 0;
        if (idx) {
          ip = i32_in(engine, *idx, op, "idx", {B, -1});
          width = static_cast<int>(dim(*idx, 1));
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
        if (d_rope != 0) {
          raise_status(Status(kUnsupportedGeometry,
                              std::string(op) + ": the caches carry d_rope=" +
                                  std::to_string(d_rope) +
                                  " rope columns; the batched decode takes latent-only rows "
                                  "(d_rope == 0): use mla_attn_absorbed per sequence"));
        }
        Out o = out_f32_uninit(engine, {z(B), z(H), z(R)});
        if (B == 0 || H == 0) return o.obj;
        if (on_cuda(engine)) {
          const CudaContext& cx = cuda_ctx(engine);
          auto table = device_upload(engine, c.data.data(), sizeof(void*) * c.data.size());
          check_cuda(engine,
                     cx.api().mla_attn_decode(cx.ctx(), qp,
                                              static_cast<const void* const*>(table->data()),
                                              c.dtype, t.dev, ip, width, static_cast<int>(B),
                                              static_cast<int>(H), static_cast<int>(R),
                                              static_cast<int>(bound), scale, o.data<float>()),
                     op);
          return o.obj;
        }
        // CPU: the per-sequence op, one query at row t_kv[b] - 1 (zeros for t_kv[b] == 0;
        // list entries outside [0, t_kv[b]) dropped, as the device does).
        Status st;
        {
          nb::gil_scoped_release nogil;
          std::vector<int32_t> row(z(width));
          float* op_ = o.data<float>();
          for (int64_t b = 0; b < B && st.ok(); ++b) {
            const int n = static_cast<int>(std::min<int64_t>(t.values[z(b)], bound));
            float* ob = op_ + b * H * R;
            std::fill(ob, ob + H * R, 0.0f);
            if (n <= 0) continue;
            const float* qb = qp + b * H * R;
            const float* cb = static_cast<const float*>(c.data[z(b)]);
            if (ip) {
              for (int e = 0; e < width; ++e) {
                const int32_t r = ip[b * width + e];
                row[z(e)] = r >= 0 && r < n ? r : -1;
              }
              st = cpu::mla_attn_gathered(qb, nullptr, cb, row.data(), static_cast<int>(H),
                                          static_cast<int>(R), 0, 1, n, width, scale, ob);
            } else {
              st = cpu::mla_attn_absorbed(qb, nullptr, cb, static_cast<int>(H),
                                          static_cast<int>(R), 0, 1, n, scale, ob);
            }
          }
        }
        check(st);
        return o.obj;
      },
      nb::arg("q_lat"), nb::arg("caches"), nb::arg("t_kv"), nb::kw_only(),
      nb::arg("idx").none() = nb::none(), nb::arg("scale"), nb::arg("max_t_kv").none() = nb::none(),
      nb::arg("engine").none() = nb::none(),
      "Batched absorbed MLA decode: B sequences, one query each, in one launch plan on CUDA.\n\n"
      "q_lat: [B, H, R] float32 (from mla_absorb_q). caches: a list of B arrays [L_b, R] (latent "
      "rows, d_rope == 0), all float32 or (CUDA) all bfloat16 (DLPack bfloat16 or uint16 raw "
      "bits; 16-byte aligned), on the engine's device. t_kv: rows visible to each sequence (its "
      "query sits at row t_kv[b] - 1): a host list / int array (checked: 0 <= t_kv[b] <= L_b), "
      "or on CUDA a device int32 [B] array (unchecked: t_kv[b] must be <= L_b; values above "
      "max_t_kv are clamped). t_kv[b] == 0 is an idle row: o_lat[b] = 0, nothing of it is read. "
      "idx: optional [B, width] int32 index lists (gathered attention: -1 and entries outside "
      "[0, t_kv[b]) skipped, a row listed twice counts once, an empty list gives zeros). "
      "scale: qk_head_dim**-0.5. max_t_kv: the host bound the launch is sized from (default "
      "max(t_kv) for host t_kv, max L_b for device t_kv); keep it fixed to replay a captured "
      "graph at any position. Returns o_lat [B, H, R] float32 on the same device.\n"
      "CUDA: a bfloat16 cache with R in {128, 256, 512} runs on tensor cores: q_lat and the "
      "softmax weights are rounded to bfloat16 for the two products, scores, softmax and "
      "accumulation are float32 (3e-3..6e-3 of max|o| against the float32 CPU op on the same "
      "cache); float32 caches (and other R <= 1024) run an exact float32 CUDA-core kernel "
      "(~1e-6 relative). The CPU backend runs mla_attn_absorbed / mla_attn_gathered per sequence.\n"
      "Raises ContractError: CONTRACT_SHAPE when len(caches) != B or a cache's width differs; "
      "CONTRACT_RANGE for a host t_kv outside [0, L_b]; CONTRACT_DTYPE / CONTRACT_SHAPE / "
      "CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays (CONTRACT_STRIDE also for a bfloat16 "
      "cache not 16-byte aligned); CONTRACT_VALUE for a non-finite scale or max_t_kv below "
      "max(t_kv). UnsupportedError (UNSUPPORTED_GEOMETRY) for caches with rope columns "
      "(width > R) or, on CUDA, R > 1024 outside the tensor-core shapes.\n"
      "Reference: Glm5NextTextAttention.forward at decode (one query per sequence), as "
      "mla_attn_absorbed / mla_attn_gathered with t_q = 1.");

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
        if (on_cuda(engine)) {
          const CudaContext& cx = cuda_ctx(engine);
          auto table = device_upload(engine, c.data.data(), sizeof(void*) * c.data.size());
          check_cuda(engine,
                     cx.api().mla_latent_append_decode(cx.ctx(), rp, static_cast<int>(B),
                                                       static_cast<int>(W),
                                                       static_cast<void* const*>(table->data()),
                                                       c.dtype, p.dev),
                     op);
          return;
        }
        for (int64_t b = 0; b < B; ++b) {
          const int32_t v = p.values[z(b)];
          if (v < 0) continue;
          float* dst = static_cast<float*>(const_cast<void*>(c.data[z(b)])) + int64_t(v) * W;
          std::memcpy(dst, rp + b * W, sizeof(float) * z(W));
        }
      },
      nb::arg("rows"), nb::arg("caches"), nb::arg("pos"), nb::kw_only(),
      nb::arg("engine").none() = nb::none(),
      "Write one latent row per sequence in place: caches[b][pos[b], :] = rows[b, :].\n\n"
      "rows: [B, W] float32. caches: a list of B arrays [L_b, W], all float32 (CPU: writable "
      "host arrays) or, on CUDA, all bfloat16 (DLPack bfloat16 or uint16 raw bits; rounded to "
      "nearest even). pos: a host list / int array (checked: pos[b] < L_b) or on CUDA a device "
      "int32 [B] array (unchecked); pos[b] < 0 is an idle row: nothing written. One launch on "
      "CUDA. Returns None.\n"
      "Raises ContractError: CONTRACT_RANGE for a host pos[b] >= L_b (nothing written); "
      "CONTRACT_SHAPE when len(caches) != B or widths differ; CONTRACT_DTYPE / CONTRACT_STRIDE / "
      "CONTRACT_DEVICE for bad arrays.\n"
      "Reference: mla_latent_append per sequence with T = 1.");
}

}  // namespace memra::py
