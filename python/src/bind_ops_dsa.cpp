// Functional bindings of the DSA k-pool indexer ops (ops.h, cpu/dsa.cpp) over DLPack arrays:
// pool keys, head-mixed scores, top-k pool selection. Arguments are checked (ContractError
// naming the op and the values); the GIL is released while computing.
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

void init_ops_dsa(nb::module_& m) {
  m.def(
      "kpool_pool_keys",
      [](const AnyArray& k, const AnyArray& gate, const AnyArray& ape) {
        const char* op = "kpool_pool_keys";
        const float* ap = f32_arg(ape, op, "ape", {-1, -1});
        const int pool = static_cast<int>(dim(ape, 0)), d = static_cast<int>(dim(ape, 1));
        check_pool(pool, op);
        const float* kp = f32_arg(k, op, "k", {-1, d});
        const int64_t n_rows = dim(k, 0);
        const float* gp = f32_arg(gate, op, "gate", {n_rows, d});
        const int64_t n_pools = n_rows / pool;
        NpF32 keys = new_f32({z(n_pools), z(d)});
        {
          nb::gil_scoped_release nogil;
          for (int64_t p = 0; p < n_pools; ++p) {
            const int64_t off = p * pool * d;
            cpu::kpool_pool_key(kp + off, gp + off, ap, pool, d, keys.data() + p * d);
          }
        }
        return keys;
      },
      nb::arg("k"), nb::arg("gate"), nb::arg("ape"),
      "Pool keys of the complete pools of one sequence: pool p holds rows [p*pool, (p+1)*pool); "
      "per channel, softmax over the pool's rows of gate + ape weights the rows of k.\n\n"
      "k: [n_rows, d] float32 (k_norm(wk(x))). gate: [n_rows, d] float32 "
      "(x @ index_kpool_compress_gate^T). ape: [pool, d] float32 (index_kpool_compress_ape). "
      "Returns keys [n_rows // pool, d] float32 (an incomplete last pool is left out).\n"
      "Raises ContractError: CONTRACT_POOL when pool (ape rows) is 0; CONTRACT_SHAPE / "
      "CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays.\n"
      "Reference: Glm5NextTextIndexer.get_pooled_states (unpadded: first_key = 0).");

  m.def(
      "kpool_score",
      [](const AnyArray& q, const AnyArray& w, const AnyArray& pool_keys, int pool, int first_pos,
         float qk_scale, float head_scale) {
        const char* op = "kpool_score";
        const float* qp = f32_arg(q, op, "q", {-1, -1, -1});
        const int t_q = static_cast<int>(dim(q, 0)), Hi = static_cast<int>(dim(q, 1)),
                  d = static_cast<int>(dim(q, 2));
        const float* wp = f32_arg(w, op, "w", {t_q, Hi});
        const float* kp = f32_arg(pool_keys, op, "pool_keys", {-1, d});
        const int n_pools = static_cast<int>(dim(pool_keys, 0));
        check_pool(pool, op);
        check_positions(first_pos, t_q, op);
        check_scale(qk_scale, op, "qk_scale");
        check_scale(head_scale, op, "head_scale");
        NpF32 score = new_f32({z(t_q), z(n_pools)});
        {
          nb::gil_scoped_release nogil;
          cpu::kpool_score(qp, wp, kp, t_q, Hi, d, n_pools, pool, first_pos, qk_scale, head_scale,
                           score.data());
        }
        return score;
      },
      nb::arg("q"), nb::arg("w"), nb::arg("pool_keys"), nb::kw_only(), nb::arg("pool"),
      nb::arg("first_pos"), nb::arg("qk_scale"), nb::arg("head_scale"),
      "Head-mixed pool scores: score[i, p] = sum_h w[i, h] * head_scale * relu(qk_scale * "
      "q[i, h, :] . pool_keys[p, :]) (h ascending), and -inf where pool p's last row "
      "p*pool + pool - 1 is after the query's position first_pos + i.\n\n"
      "q: [t_q, Hi, d] float32 (wq_b(q_resid)). w: [t_q, Hi] float32 (weights_proj(x)). "
      "pool_keys: [n_pools, d] float32 (kpool_pool_keys). qk_scale: index_head_dim**-0.5; "
      "head_scale: index_n_heads**-0.5. Returns score [t_q, n_pools] float32.\n"
      "Raises ContractError: CONTRACT_POOL for pool < 1; CONTRACT_VALUE for first_pos < 0 or a "
      "non-finite scale; CONTRACT_RANGE when first_pos + t_q overflows int32; CONTRACT_SHAPE / "
      "CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays.\n"
      "Reference: Glm5NextTextIndexer.forward (scores, weights, valid_candidates mask).");

  m.def(
      "kpool_select",
      [](const AnyArray& score, int pool, int select_k, int width, int first_pos) {
        const char* op = "kpool_select";
        const float* sp = f32_arg(score, op, "score", {-1, -1});
        const int t_q = static_cast<int>(dim(score, 0)),
                  n_pools = static_cast<int>(dim(score, 1));
        check_pool(pool, op);
        check_positions(first_pos, t_q, op);
        check_nonneg(select_k, op, "select_k");
        NpI32 idx = new_i32({z(t_q), z(width > 0 ? width : 0)});
        Status st;
        {
          nb::gil_scoped_release nogil;
          st = cpu::kpool_select(sp, t_q, n_pools, pool, select_k, width, first_pos, idx.data());
        }
        check(st);
        return idx;
      },
      nb::arg("score"), nb::kw_only(), nb::arg("pool"), nb::arg("select_k"), nb::arg("width"),
      nb::arg("first_pos"),
      "Index lists from pool scores: per query i (position first_pos + i), the top select_k "
      "pools among the finite scores by (score desc, pool index asc), expanded to their rows in "
      "ascending pool order, then the visible tail rows [(pos+1) - (pos+1) % pool, pos], then "
      "-1 up to width. Fewer finite pools than select_k leave more -1 padding.\n\n"
      "score: [t_q, n_pools] float32 (kpool_score). select_k: min(index_topk // pool, n_pools); "
      "width: index_topk + pool - 1. Returns idx [t_q, width] int32 (a set of rows per query).\n"
      "Raises ContractError: CONTRACT_INDEX_WIDTH when width < select_k*pool + pool - 1; "
      "CONTRACT_POOL for pool < 1; CONTRACT_VALUE for select_k < 0 or first_pos < 0; "
      "CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for a bad score.\n"
      "Reference: Glm5NextTextIndexer.forward topk + append_visible_tail "
      "(index_kpool_always_select_tail = True), compared as sets.");
}

}  // namespace memra::py
