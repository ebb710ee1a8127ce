// Functional bindings of the MLA ops over DLPack arrays, one sequence per call (the batched
// decode forms: bind_ops_mla_decode.cpp). Each op runs through memra::op (op/mla.h): the CPU
// reference (engine None or a CPU Engine; cpu/mla.cpp, the oracle) or, for a CUDA Engine, the
// CUDA library (cuda/mla_*.cu, cpp/include/memra/cuda_abi/mla.h); every array argument must then
// live on the engine's device, kv_b is a memra.DeviceWeight, outputs are allocated there and the
// work is enqueued on the engine's stream (read results with engine.to_host, which waits). Every
// function checks its arguments (ContractError naming the op and the values) before anything
// runs and, on the CPU, releases the GIL while computing.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
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

// kv_b as seen by either backend: a host Weight (CPU) or a DeviceWeight (CUDA).
struct KvB {
  const Weight* host = nullptr;
  const DeviceWeight* dev = nullptr;
  size_t ndim = 0;
  int64_t rows = 0, cols = 0;
  std::string shape_str() const { return host ? host->shape_str() : dev->shape_str(); }
  const void* data() const { return host ? host->data() : dev->data(); }
  int dtype_code() const { return host ? static_cast<int>(host->dtype()) : dev->dtype_code(); }
};

MemraMlaProjParams proj_params(int which, const float* x, const KvB& kv_b, int T, int H, int d_nope,
                               int d_v, int R, int arm, float* y) {
  MemraMlaProjParams p{};
  p.which = which;
  p.x = x;
  p.kv_b = kv_b.data();
  p.w_dtype = kv_b.dtype_code();
  p.T = T;
  p.H = H;
  p.d_nope = d_nope;
  p.d_v = d_v;
  p.R = R;
  p.arm = arm;
  p.y = y;
  return p;
}

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
  a.t_q = dim32(q_lat, 0, op, "q_lat");
  a.H = dim32(q_lat, 1, op, "q_lat");
  a.R = dim32(q_lat, 2, op, "q_lat");
  a.cache = cache_arg(engine, cache, op, &a.cache_dtype);
  a.t_kv = dim32(cache, 0, op, "cache");
  a.d_rope = dim32(cache, 1, op, "cache") - a.R;
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

#define TC_DOC                                                                                 \
  "tensor_cores=True (the arm of bf16 models; CUDA, bf16 cache, R in {128, 256, 512}, d_rope 0 " \
  "or 64; else ignored): the tensor-core kernels, q_lat / q_pe and the softmax weights rounded " \
  "to bf16, f32 softmax and accumulation (~1e-2 of max|o| from the CPU).\n"

// The one-sequence attention's fields (rows CAUSAL; the gathered form sets its index lists).
MemraMlaAttnParams attn_params(const AttnArgs& a, float scale, float* o_lat) {
  MemraMlaAttnParams p{};
  p.rows = MEMRA_MLA_ROWS_CAUSAL;
  p.q_lat = a.q_lat;
  p.q_pe = a.q_pe;
  p.H = a.H;
  p.R = a.R;
  p.d_rope = a.d_rope;
  p.scale = scale;
  p.cache_dtype = a.cache_dtype;
  p.o_lat = o_lat;
  p.cache = a.cache;
  p.t_q = a.t_q;
  p.t_kv = a.t_kv;
  return p;
}

void check_suffix(const AttnArgs& a, const char* op) {
  if (a.t_q > a.t_kv) {
    raise_contract(kContractQuerySuffix,
                   std::string(op) + ": the queries must be the last rows of the cache, got t_q=" +
                       std::to_string(a.t_q) + " > t_kv=" + std::to_string(a.t_kv));
  }
}

}  // namespace

const void* cache_arg(const Engine* engine, const AnyArray& a, const char* op, int* dtype,
                      const char* name, std::initializer_list<int64_t> shape) {
  const bool f32 = has_dtype(a, nb::dlpack::dtype_code::Float, 32);
  const bool bf16 = has_bf16(a);
  if (on_cuda(engine)) {
    check_array(a, op, name, shape, "float32 or bfloat16 (uint16 raw bits accepted)", f32 || bf16,
                nb::device::cuda::value, engine->device_index());
    *dtype = f32 ? 0 : 1;
    return a.data();
  }
  *dtype = 0;
  return f32_in(engine, a, op, name, shape);
}

void init_ops_mla(nb::module_& m) {
  m.def(
      "mla_absorb_q",
      [](const AnyArray& q_nope, nb::handle kv_b, int d_v, int arm, const Engine* engine) {
        const char* op = "mla_absorb_q";
        const float* qp = f32_in(engine, q_nope, op, "q_nope", {-1, -1, -1});
        const int T = dim32(q_nope, 0, op, "q_nope"), H = dim32(q_nope, 1, op, "q_nope"),
                  d_nope = dim32(q_nope, 2, op, "q_nope");
        check_nonneg(d_v, op, "d_v");
        check_arm(arm, op);
        const KvB w = kv_b_arg(engine, kv_b, op);
        check_kv_b(w, op, H, d_nope, d_v);
        const int64_t R = w.cols;
        Out q_lat = out_f32(engine, {z(T), z(H), z(R)});
        run_op(engine, op::mla_proj,
               proj_params(MEMRA_MLA_ABSORB, qp, w, T, H, d_nope, d_v, static_cast<int>(R), arm,
                           q_lat.data<float>()));
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
      "bfloat16). Auto takes 3 for bf16 kv_b at T >= 2 (1 when cuBLASLt declines), else 2 "
      "(T = 1, or f32 / f16 kv_b below T = 64) or 1. "
      "Arms 1/2 do the CPU's operations in its order (n ascending, products and sums rounded "
      "separately): the CPU's bytes where the CPU build does not contract into FMAs.\n"
      "Raises ContractError: CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE "
      "for a bad q_nope, CONTRACT_SHAPE when kv_b's shape does not match, CONTRACT_DEVICE for a "
      "kv_b of the wrong kind, CONTRACT_VALUE for d_v < 0 or an arm outside 0..3; "
      "UnsupportedError (CUDA) for arm 3 with float32 kv_b; LibraryError when cuBLASLt declines "
      "arm 3.\n"
      "Reference: Glm5NextTextAttention.expand_kv (k_nope = W_uk c), folded into q.");

  m.def(
      "mla_decompress_v",
      [](const AnyArray& o_lat, nb::handle kv_b, int d_nope, int arm, const Engine* engine) {
        const char* op = "mla_decompress_v";
        const float* op_ = f32_in(engine, o_lat, op, "o_lat", {-1, -1, -1});
        const int T = dim32(o_lat, 0, op, "o_lat"), H = dim32(o_lat, 1, op, "o_lat"),
                  R = dim32(o_lat, 2, op, "o_lat");
        check_nonneg(d_nope, op, "d_nope");
        check_arm(arm, op);
        const KvB w = kv_b_arg(engine, kv_b, op);
        if (R < 1) {
          raise_contract(kContractShape, std::string(op) + ": argument 'o_lat' has shape " +
                                             shape_str(o_lat) +
                                             ", expected [T, H, R] with the latent rank R >= 1");
        }
        if (H < 1 || w.ndim != 2 || w.rows % H != 0 || w.rows / H < d_nope || w.cols != R) {
          raise_contract(kContractShape,
                         std::string(op) + ": kv_b has shape " + w.shape_str() +
                             ", expected [H*(d_nope+d_v), R] with H=" + std::to_string(H) +
                             ", d_nope=" + std::to_string(d_nope) + ", R=" + std::to_string(R) +
                             " (from o_lat " + shape_str(o_lat) + ")");
        }
        const int d_v = static_cast<int>(w.rows / H) - d_nope;
        Out out = out_f32(engine, {z(T), z(H), z(d_v)});
        run_op(engine, op::mla_proj,
               proj_params(MEMRA_MLA_DECOMPRESS, op_, w, T, H, d_nope, d_v, R, arm,
                           out.data<float>()));
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
      "an arm outside 0..3; UnsupportedError (CUDA) for arm 3 with float32 kv_b; LibraryError when "
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
        const int T = dim32(rows, 0, op, "rows");
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
        check_disjoint(op, "rows", rp, rows.nbytes(), "cache", cp, cache.nbytes());
        MemraMlaAppendParams p{};
        p.rows = rp;
        p.n = T;
        p.W = static_cast<int>(W);
        p.cache_dtype = cdt;
        p.cache = cp;
        p.start = start;
        run_op(engine, op::mla_latent_append, p);
        return cache_obj;  // the same object, written in place
      },
      nb::arg("rows"), nb::arg("cache"), nb::kw_only(), nb::arg("start"),
      nb::arg("engine").none() = nb::none(),
      "Write latent rows into a cache in place: cache[start + t, :] = rows[t, :].\n\n"
      "rows: [T, W] float32; cache: [max_len, W], float32 (CPU: a writable host array), or on "
      "CUDA float32 or bfloat16 (a DLPack bfloat16 array or uint16 raw bits; the rows are "
      "rounded to nearest even). Both on the engine's device. Returns the cache (the same object, "
      "written in place; a DLPack capsule comes back consumed, as any reader of one leaves it: "
      "read the rows through the array it was made from).\n"
      "Raises ContractError: CONTRACT_RANGE when [start, start + T) does not fit max_len; "
      "CONTRACT_VALUE when rows share memory with the cache or the cache is read-only; "
      "CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays. "
      "Nothing is written on error.\nReference: MlaLayer (cpp/src/layers/mla_layer.cpp), the "
      "latent rows "
      "[normalised latent | k_pe] appended at rows [pos, pos + T).");

  m.def(
      "mla_attn_absorbed",
      [](const AnyArray& q_lat, const AnyArray& cache, std::optional<AnyArray> q_pe, float scale,
         bool tensor_cores, const Engine* engine) {
        const char* op = "mla_attn_absorbed";
        AttnArgs a = attn_args(engine, q_lat, cache, q_pe, scale, op);
        check_suffix(a, op);
        Out o = out_f32(engine, {z(a.t_q), z(a.H), z(a.R)});
        MemraMlaAttnParams p = attn_params(a, scale, o.data<float>());
        p.tensor_cores = tensor_cores ? 1 : 0;
        run_op(engine, op::mla_attn, p);
        return o.obj;
      },
      nb::arg("q_lat"), nb::arg("cache"), nb::arg("q_pe") = nb::none(), nb::kw_only(),
      nb::arg("scale"), nb::arg("tensor_cores") = false, nb::arg("engine").none() = nb::none(),
      "Causal absorbed MLA attention over a latent cache; the queries are the cache's last t_q "
      "rows (query i sits at row t_kv - t_q + i and sees rows <= it).\n\n"
      "q_lat: [t_q, H, R] float32 (from mla_absorb_q). cache: [t_kv, R + d_rope] (kv_a_layernorm'd "
      "latent, then the rope part): float32, or on CUDA also bfloat16 (DLPack bfloat16 or uint16 "
      "raw bits). q_pe: [t_q, H, d_rope] float32, required when d_rope > 0. All on the engine's "
      "device. scale: qk_head_dim**-0.5 (qk_head_dim = d_nope + d_rope). Returns o_lat "
      "[t_q, H, R] float32; score = (q_lat . c + q_pe . k_pe) * scale, softmax in f32 (CUDA: "
      "online over tiles of 32 rows, split over the rows when the queries alone do not fill the "
      "GPU; ~1e-5 relative to the CPU).\n" TC_DOC
      "Raises ContractError: CONTRACT_QUERY_SUFFIX when t_q > t_kv; CONTRACT_MISSING when q_pe "
      "is absent but d_rope > 0; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / "
      "CONTRACT_DEVICE for bad arrays; CONTRACT_VALUE for a non-finite scale. UnsupportedError "
      "(CUDA) for R > 8192 or rows too wide for shared memory.\n"
      "Reference: Glm5NextTextAttention.forward with a causal mask (eager_attention_forward).");

  m.def(
      "mla_attn_gathered",
      [](const AnyArray& q_lat, const AnyArray& cache, const AnyArray& idx,
         std::optional<AnyArray> q_pe, float scale, bool check_range, bool tensor_cores,
         const Engine* engine) {
        const char* op = "mla_attn_gathered";
        AttnArgs a = attn_args(engine, q_lat, cache, q_pe, scale, op);
        const int32_t* ip = i32_in(engine, idx, op, "idx", {a.t_q, -1});
        const int width = dim32(idx, 1, op, "idx");
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
        }
        Out o = out_f32(engine, {z(a.t_q), z(a.H), z(a.R)});
        MemraMlaAttnParams p = attn_params(a, scale, o.data<float>());
        p.rows = MEMRA_MLA_ROWS_INDEXED;
        p.idx = ip;
        p.width = width;
        p.tensor_cores = tensor_cores ? 1 : 0;
        run_op(engine, op::mla_attn, p);
        return o.obj;
      },
      nb::arg("q_lat"), nb::arg("cache"), nb::arg("idx"), nb::arg("q_pe") = nb::none(),
      nb::kw_only(), nb::arg("scale"), nb::arg("check_range") = true,
      nb::arg("tensor_cores") = false, nb::arg("engine").none() = nb::none(),
      "Absorbed MLA attention where query i attends over the cache rows listed in idx[i, :].\n\n"
      "q_lat: [t_q, H, R] float32. cache: [t_kv, R + d_rope] float32, or on CUDA also bfloat16 "
      "(DLPack bfloat16 or uint16 raw bits). idx: [t_q, width] int32 (entries -1 are padding; "
      "the list is a set: order does not matter and a duplicated row counts once). q_pe: "
      "[t_q, H, d_rope] float32, required when d_rope > 0. All on the engine's device. Returns "
      "o_lat [t_q, H, R] float32; a query whose list is all -1 gets zeros.\n"
      "check_range (CUDA only): copy idx to the host first and refuse an entry outside "
      "[-1, t_kv) or after its query's row (t_kv - t_q + i) (one wait on the engine's stream); "
      "with False such entries are skipped on the device. The CPU always refuses them. Both "
      "require t_q <= t_kv (queries are the cache's last rows).\n" TC_DOC
      "Raises ContractError: CONTRACT_RANGE for an entry >= t_kv or < -1 or after its query's "
      "row (nothing written); CONTRACT_QUERY_SUFFIX when t_q > t_kv; CONTRACT_MISSING when q_pe is "
      "absent but d_rope > 0; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / "
      "CONTRACT_DEVICE for bad arrays (int64 idx is refused, not narrowed); CONTRACT_VALUE for a "
      "non-finite scale.\n"
      "Reference: Glm5NextTextAttention.build_attention_mask_from_topk + "
      "eager_attention_forward.");

  init_ops_mla_decode(m);  // mla_attn_decode, mla_latent_append_decode
}

}  // namespace memra::py
