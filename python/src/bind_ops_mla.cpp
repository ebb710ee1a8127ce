// Functional bindings of the MLA and DSA k-pool CPU ops (ops.h, cpu/mla.cpp, cpu/dsa.cpp) over
// DLPack arrays. Every function checks its arguments (ContractError naming the op and the
// values), allocates its output and releases the GIL while computing.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <climits>
#include <cmath>
#include <optional>
#include <string>

#include "common.h"
#include "memra/ops.h"

namespace memra::py {

namespace {

size_t z(int64_t n) { return static_cast<size_t>(n); }

// kv_b must be [H * (d_nope + d_v), R]: the per-head [k_nope | v] row blocks of kv_b_proj.
void check_kv_b(const Weight& kv_b, const char* op, int64_t H, int64_t d_nope, int64_t d_v) {
  if (kv_b.shape().size() != 2 || kv_b.rows() != H * (d_nope + d_v) || kv_b.cols() < 1) {
    raise_contract(kContractShape,
                   std::string(op) + ": kv_b has shape " + kv_b.shape_str() +
                       ", expected [H*(d_nope+d_v), R] = [" + std::to_string(H) + "*(" +
                       std::to_string(d_nope) + "+" + std::to_string(d_v) + "), R >= 1]");
  }
}

void check_nonneg(int64_t v, const char* op, const char* name, int code = kContractValue) {
  if (v < 0) {
    raise_contract(code, std::string(op) + ": " + name + " must be >= 0, got " + std::to_string(v));
  }
}

void check_scale(float v, const char* op, const char* name) {
  if (!std::isfinite(v)) {
    raise_contract(kContractValue,
                   std::string(op) + ": " + name + " must be finite, got " + std::to_string(v));
  }
}

void check_pool(int pool, const char* op) {
  if (pool < 1) {
    raise_contract(kContractPool, std::string(op) + ": pool must be >= 1, got pool=" +
                                      std::to_string(pool));
  }
}

// The absolute positions first_pos .. first_pos + t_q - 1 must fit int32 (index lists are int32).
void check_positions(int64_t first_pos, int64_t t_q, const char* op) {
  check_nonneg(first_pos, op, "first_pos");
  if (first_pos + t_q > INT32_MAX) {
    raise_contract(kContractRange, std::string(op) + ": first_pos=" + std::to_string(first_pos) +
                                       " + t_q=" + std::to_string(t_q) + " overflows int32");
  }
}

// Shared argument walk of the two attention ops: returns (H, R, d_rope) and the q_pe pointer.
struct AttnArgs {
  const float* q_lat;
  const float* q_pe;
  const float* cache;
  int t_q, H, R, d_rope, t_kv;
};

AttnArgs attn_args(const AnyArray& q_lat, const AnyArray& cache,
                   const std::optional<AnyArray>& q_pe, float scale, const char* op) {
  AttnArgs a;
  a.q_lat = f32_arg(q_lat, op, "q_lat", {-1, -1, -1});
  a.t_q = static_cast<int>(dim(q_lat, 0));
  a.H = static_cast<int>(dim(q_lat, 1));
  a.R = static_cast<int>(dim(q_lat, 2));
  a.cache = f32_arg(cache, op, "cache", {-1, -1});
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
    a.q_pe = f32_arg(*q_pe, op, "q_pe", {a.t_q, a.H, a.d_rope});
  } else if (a.d_rope > 0) {
    raise_contract(kContractMissing, std::string(op) + ": the cache carries d_rope=" +
                                         std::to_string(a.d_rope) +
                                         " rope columns, so q_pe [t_q, H, d_rope] is required");
  }
  check_scale(scale, op, "scale");
  return a;
}

}  // namespace

void init_ops_mla(nb::module_& m) {
  m.def(
      "mla_absorb_q",
      [](const AnyArray& q_nope, const Weight& kv_b, int d_v) {
        const char* op = "mla_absorb_q";
        const float* qp = f32_arg(q_nope, op, "q_nope", {-1, -1, -1});
        const int T = static_cast<int>(dim(q_nope, 0)), H = static_cast<int>(dim(q_nope, 1)),
                  d_nope = static_cast<int>(dim(q_nope, 2));
        check_nonneg(d_v, op, "d_v");
        check_kv_b(kv_b, op, H, d_nope, d_v);
        const int64_t R = kv_b.cols();
        NpF32 q_lat = new_f32({z(T), z(H), z(R)});
        {
          nb::gil_scoped_release nogil;
          cpu::mla_absorb_q(qp, kv_b, T, H, d_nope, d_v, q_lat.data());
        }
        return q_lat;
      },
      nb::arg("q_nope"), nb::arg("kv_b"), nb::kw_only(), nb::arg("d_v"),
      "Absorb W_uk into the query: q_lat[t, h, :] = W_uk[h]^T q_nope[t, h, :].\n\n"
      "q_nope: [T, H, d_nope] float32, C-contiguous. kv_b: Weight [H*(d_nope+d_v), R] "
      "(kv_b_proj.weight; head h's rows are d_nope k rows then d_v v rows). Returns q_lat "
      "[T, H, R] float32.\n"
      "Raises ContractError: CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE "
      "for a bad q_nope, CONTRACT_SHAPE when kv_b's shape does not match, CONTRACT_VALUE for "
      "d_v < 0.\nReference: Glm5NextTextAttention.expand_kv (k_nope = W_uk c), folded into q.");

  m.def(
      "mla_decompress_v",
      [](const AnyArray& o_lat, const Weight& kv_b, int d_nope) {
        const char* op = "mla_decompress_v";
        const float* op_ = f32_arg(o_lat, op, "o_lat", {-1, -1, -1});
        const int T = static_cast<int>(dim(o_lat, 0)), H = static_cast<int>(dim(o_lat, 1)),
                  R = static_cast<int>(dim(o_lat, 2));
        check_nonneg(d_nope, op, "d_nope");
        if (H < 1 || kv_b.shape().size() != 2 || kv_b.rows() % H != 0 ||
            kv_b.rows() / H < d_nope || kv_b.cols() != R) {
          raise_contract(kContractShape,
                         std::string(op) + ": kv_b has shape " + kv_b.shape_str() +
                             ", expected [H*(d_nope+d_v), R] with H=" + std::to_string(H) +
                             ", d_nope=" + std::to_string(d_nope) + ", R=" + std::to_string(R) +
                             " (from o_lat " + shape_str(o_lat) + ")");
        }
        const int d_v = static_cast<int>(kv_b.rows() / H) - d_nope;
        NpF32 out = new_f32({z(T), z(H), z(d_v)});
        {
          nb::gil_scoped_release nogil;
          cpu::mla_decompress_v(op_, kv_b, T, H, d_nope, d_v, out.data());
        }
        return out;
      },
      nb::arg("o_lat"), nb::arg("kv_b"), nb::kw_only(), nb::arg("d_nope"),
      "Decompress the latent attention output: out[t, h, :] = W_uv[h] o_lat[t, h, :].\n\n"
      "o_lat: [T, H, R] float32. kv_b: Weight [H*(d_nope+d_v), R]. Returns out [T, H, d_v] "
      "float32 (d_v = kv_b rows / H - d_nope).\n"
      "Raises ContractError: CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE "
      "for a bad o_lat, CONTRACT_SHAPE when kv_b does not match, CONTRACT_VALUE for d_nope < 0.\n"
      "Reference: Glm5NextTextAttention.expand_kv (value_states = W_uv c), folded into the "
      "output.");

  m.def(
      "mla_attn_absorbed",
      [](const AnyArray& q_lat, const AnyArray& cache, std::optional<AnyArray> q_pe, float scale) {
        AttnArgs a = attn_args(q_lat, cache, q_pe, scale, "mla_attn_absorbed");
        NpF32 o = new_f32({z(a.t_q), z(a.H), z(a.R)});
        Status st;
        {
          nb::gil_scoped_release nogil;
          st = cpu::mla_attn_absorbed(a.q_lat, a.q_pe, a.cache, a.H, a.R, a.d_rope, a.t_q, a.t_kv,
                                      scale, o.data());
        }
        check(st);
        return o;
      },
      nb::arg("q_lat"), nb::arg("cache"), nb::arg("q_pe") = nb::none(), nb::kw_only(),
      nb::arg("scale"),
      "Causal absorbed MLA attention over a latent cache; the queries are the cache's last t_q "
      "rows (query i sits at row t_kv - t_q + i and sees rows <= it).\n\n"
      "q_lat: [t_q, H, R] float32 (from mla_absorb_q). cache: [t_kv, R + d_rope] float32 "
      "(kv_a_layernorm'd latent, then the rope part). q_pe: [t_q, H, d_rope] float32, required "
      "when d_rope > 0. scale: qk_head_dim**-0.5 (qk_head_dim = d_nope + d_rope). Returns o_lat "
      "[t_q, H, R] float32; score = (q_lat . c + q_pe . k_pe) * scale, softmax in f32.\n"
      "Raises ContractError: CONTRACT_QUERY_SUFFIX when t_q > t_kv; CONTRACT_MISSING when q_pe "
      "is absent but d_rope > 0; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / "
      "CONTRACT_DEVICE for bad arrays; CONTRACT_VALUE for a non-finite scale.\n"
      "Reference: Glm5NextTextAttention.forward with a causal mask (eager_attention_forward).");

  m.def(
      "mla_attn_gathered",
      [](const AnyArray& q_lat, const AnyArray& cache, const AnyArray& idx,
         std::optional<AnyArray> q_pe, float scale) {
        const char* op = "mla_attn_gathered";
        AttnArgs a = attn_args(q_lat, cache, q_pe, scale, op);
        const int32_t* ip = i32_arg(idx, op, "idx", {a.t_q, -1});
        const int width = static_cast<int>(dim(idx, 1));
        NpF32 o = new_f32({z(a.t_q), z(a.H), z(a.R)});
        Status st;
        {
          nb::gil_scoped_release nogil;
          st = cpu::mla_attn_gathered(a.q_lat, a.q_pe, a.cache, ip, a.H, a.R, a.d_rope, a.t_q,
                                      a.t_kv, width, scale, o.data());
        }
        check(st);
        return o;
      },
      nb::arg("q_lat"), nb::arg("cache"), nb::arg("idx"), nb::arg("q_pe") = nb::none(),
      nb::kw_only(), nb::arg("scale"),
      "Absorbed MLA attention where query i attends over the cache rows listed in idx[i, :].\n\n"
      "q_lat: [t_q, H, R] float32. cache: [t_kv, R + d_rope] float32. idx: [t_q, width] int32 "
      "(entries -1 are padding; the list is a set: order does not matter and a duplicated row "
      "counts once). q_pe: [t_q, H, d_rope] float32, required when d_rope > 0. Returns o_lat "
      "[t_q, H, R] float32; a query whose list is all -1 gets zeros.\n"
      "Raises ContractError: CONTRACT_RANGE for an entry >= t_kv or < -1; CONTRACT_MISSING when "
      "q_pe is absent but d_rope > 0; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / "
      "CONTRACT_DEVICE for bad arrays (int64 idx is refused, not narrowed); CONTRACT_VALUE for a "
      "non-finite scale.\n"
      "Reference: Glm5NextTextAttention.build_attention_mask_from_topk + "
      "eager_attention_forward.");

}

}  // namespace memra::py
