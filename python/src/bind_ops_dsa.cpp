// Functional bindings of the DSA k-pool indexer ops over DLPack arrays, one sequence per call:
// pool keys, the indexer's row bookkeeping (kpool_append), head-mixed scores, top-k pool
// selection. Each op runs through memra::op (op/dsa.h): the CPU reference (cpu/dsa.cpp, the
// oracle, and MlaLayer::indexer's bookkeeping) or, for a CUDA Engine, cuda/dsa.cu through the C
// ABI of cpp/include/memra/cuda_abi/dsa.h. Arguments are checked (ContractError naming the op and
// the values) before anything runs; outputs live on the engine's device; the CPU releases the
// GIL. The batched decode forms (CUDA only) are bind_ops_dsa_decode.cpp's.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bind_ops_dsa.h"
#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/op/dsa.h"
#include "op_call.h"

namespace memra::py {

namespace {

size_t z(int64_t n) { return static_cast<size_t>(n); }

// The absolute positions first_pos .. first_pos + t_q - 1 must fit int32 (index lists are int32).
// `pos_name` / `t_name`: the op's own names for the first position and the row count.
void check_positions(int64_t first_pos, int64_t t_q, const char* op, const char* pos_name = "first_pos",
                     const char* t_name = "t_q") {
  check_nonneg(first_pos, op, pos_name);
  if (first_pos + t_q > INT32_MAX) {
    raise_contract(kContractRange, std::string(op) + ": " + pos_name + "=" + std::to_string(first_pos) +
                                       " + " + t_name + "=" + std::to_string(t_q) + " overflows int32");
  }
}

// A copy of `src` (n floats, on the engine's device) into `dst` of the same device.
void copy_f32(const Engine* engine, float* dst, const float* src, int64_t n, const char* op) {
  if (n == 0) return;
  if (on_cuda(engine)) {
    const CudaContext& c = cuda_ctx(engine);
    check_cuda(engine, c.api().copy(c.ctx(), dst, src, z(n) * sizeof(float)), op);
  } else {
    std::memcpy(dst, src, z(n) * sizeof(float));
  }
}

const char* kEngineDoc =
    "engine: None or a CPU Engine runs the C++ reference on host arrays; a CUDA Engine runs "
    "cuda/dsa.cu on arrays of its device (ContractError CONTRACT_DEVICE otherwise) and returns "
    "CUDA arrays.";

}  // namespace

void check_pool(int pool, const char* op, const char* from) {
  if (pool < 1) {
    raise_contract(kContractPool, std::string(op) + ": pool must be >= 1, got pool=" + std::to_string(pool) +
                                      (from ? std::string(" (") + from + ")" : ""));
  }
}

// The pool-key position embedding ape [pool, d] of the append ops: pool >= 1, d >= 1.
const float* ape_arg(const Engine* engine, const AnyArray& ape, const char* op, int* pool,
                     int* d) {
  const float* ap = f32_in(engine, ape, op, "ape", {-1, -1});
  *pool = dim32(ape, 0, op, "ape");
  *d = dim32(ape, 1, op, "ape");
  check_pool(*pool, op, "the rows of ape");
  if (*d < 1) {
    raise_contract(kContractShape, std::string(op) + ": ape has shape " + shape_str(ape) +
                                       ", expected [pool, d >= 1]");
  }
  return ap;
}

void init_ops_dsa(nb::module_& m) {
  m.def(
      "kpool_pool_keys",
      [](const AnyArray& k, const AnyArray& gate, const AnyArray& ape, const Engine* engine) {
        const char* op = "kpool_pool_keys";
        const float* ap = f32_in(engine, ape, op, "ape", {-1, -1});
        const int pool = dim32(ape, 0, op, "ape"), d = dim32(ape, 1, op, "ape");
        check_pool(pool, op, "the rows of ape");
        const float* kp = f32_in(engine, k, op, "k", {-1, d});
        const int64_t n_rows = dim(k, 0);
        const float* gp = f32_in(engine, gate, op, "gate", {n_rows, d});
        if (n_rows > INT32_MAX) {
          raise_contract(kContractRange, std::string(op) + ": n_rows=" + std::to_string(n_rows) +
                                             " overflows int32");
        }
        const int64_t n_pools = n_rows / pool;
        Out keys = out_f32(engine, {z(n_pools), z(d)});
        if (n_pools > 0 && d > 0) {
          // One kpool_append from position 0 over every row: each pool key from its own rows
          // (the bytes the incremental path gives); the ring it also fills is thrown away.
          const size_t ring_floats = z(2 * int64_t(pool) * d);
          std::shared_ptr<DeviceBuffer> dev_ring;
          std::vector<float> host_ring;
          float* rk = nullptr;
          if (on_cuda(engine)) {
            dev_ring = device_scratch(engine, ring_floats * sizeof(float));
            rk = static_cast<float*>(dev_ring->data());
          } else {
            host_ring.resize(ring_floats);
            rk = host_ring.data();
          }
          MemraKpoolAppendParams p{};
          p.k = kp;
          p.gate = gp;
          p.n = int(n_rows);
          p.d = d;
          p.ape = ap;
          p.pool = pool;
          p.tail_rows = pool;
          p.tail_k = rk;
          p.tail_gate = rk + int64_t(pool) * d;
          p.pool_keys = keys.data<float>();
          run_op(engine, op::kpool_append, p);
        }
        return keys.obj;
      },
      nb::arg("k"), nb::arg("gate"), nb::arg("ape"), nb::kw_only(),
      nb::arg("engine").none() = nb::none(),
      (std::string("Pool keys of the complete pools of one sequence: pool p holds rows "
                   "[p*pool, (p+1)*pool); per channel, softmax over the pool's rows of gate + ape "
                   "weights the rows of k.\n\n"
                   "k: [n_rows, d] float32 (k_norm(wk(x))). gate: [n_rows, d] float32 "
                   "(x @ index_kpool_compress_gate^T). ape: [pool, d] float32 "
                   "(index_kpool_compress_ape). Returns keys [n_rows // pool, d] float32 (an "
                   "incomplete last pool is left out).\n") +
       kEngineDoc +
       " On CUDA each key is the same bytes kpool_append gives it (one device routine); it "
       "differs from the CPU only through exp (CUDA expf vs the C library's).\n"
       "Raises ContractError: CONTRACT_POOL when pool (ape rows) is 0; CONTRACT_RANGE when "
       "n_rows overflows int32; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / "
       "CONTRACT_DEVICE for bad arrays.\n"
       "Reference: Glm5NextTextIndexer.get_pooled_states (unpadded: first_key = 0).")
          .c_str());

  m.def(
      "kpool_append",
      [](const AnyArray& k, const AnyArray& gate, const AnyArray& ape, const AnyArray& tail_k,
         const AnyArray& tail_gate, const AnyArray& pool_keys, int pos, const Engine* engine) {
        const char* op = "kpool_append";
        int pool = 0, d = 0;
        const float* ap = ape_arg(engine, ape, op, &pool, &d);
        const float* kp = f32_in(engine, k, op, "k", {-1, d});
        const int64_t T = dim(k, 0);
        const float* gp = f32_in(engine, gate, op, "gate", {T, d});
        const float* tkp = f32_in(engine, tail_k, op, "tail_k", {-1, d});
        const int64_t ring = dim(tail_k, 0);
        const float* tgp = f32_in(engine, tail_gate, op, "tail_gate", {ring, d});
        const float* pkp = f32_in(engine, pool_keys, op, "pool_keys", {-1, d});
        const int64_t max_pools = dim(pool_keys, 0);
        if (ring < pool || ring % pool != 0) {
          raise_contract(kContractPool, std::string(op) + ": tail_k (the tail ring) has " +
                                            std::to_string(ring) +
                                            " rows, expected a positive multiple of pool=" +
                                            std::to_string(pool));
        }
        check_positions(pos, T, op, "pos", "T");
        if ((pos + T) / pool > max_pools) {
          raise_contract(kContractShape,
                         std::string(op) + ": pool_keys has " + std::to_string(max_pools) +
                             " rows, but rows [" + std::to_string(pos) + ", " +
                             std::to_string(pos + T) + ") complete pools up to " +
                             std::to_string((pos + T) / pool) + " (pool=" + std::to_string(pool) +
                             ")");
        }
        Out tk = out_f32(engine, {z(ring), z(d)});
        Out tg = out_f32(engine, {z(ring), z(d)});
        Out keys = out_f32(engine, {z(max_pools), z(d)});
        copy_f32(engine, tk.data<float>(), tkp, ring * d, op);
        copy_f32(engine, tg.data<float>(), tgp, ring * d, op);
        copy_f32(engine, keys.data<float>(), pkp, max_pools * d, op);
        MemraKpoolAppendParams p{};
        p.k = kp;
        p.gate = gp;
        p.n = int(T);
        p.d = d;
        p.ape = ap;
        p.pool = pool;
        p.tail_rows = int(ring);
        p.pos = pos;
        p.tail_k = tk.data<float>();
        p.tail_gate = tg.data<float>();
        p.pool_keys = keys.data<float>();
        run_op(engine, op::kpool_append, p);
        return nb::make_tuple(tk.obj, tg.obj, keys.obj);
      },
      nb::arg("k"), nb::arg("gate"), nb::arg("ape"), nb::arg("tail_k"), nb::arg("tail_gate"),
      nb::arg("pool_keys"), nb::kw_only(), nb::arg("pos"), nb::arg("engine").none() = nb::none(),
      (std::string("The DSA indexer's per-sequence bookkeeping for rows [pos, pos + T), as "
                   "MlaLayer::indexer keeps it in the Cache: the key of every pool whose last row "
                   "lands in [pos, pos + T) (rows before pos come from the tail ring; pools before "
                   "pos // pool are resident and untouched), then the newest min(T, tail_rows) "
                   "rows into the ring at row % tail_rows.\n\n"
                   "k, gate: [T, d] float32, the new rows (as kpool_pool_keys). ape: [pool, d] "
                   "float32. tail_k, tail_gate: [tail_rows, d] float32, the ring (tail_rows a "
                   "positive multiple of pool). pool_keys: [max_pools, d] float32, "
                   "max_pools >= (pos + T) // pool. pos: rows the sequence held before. Returns "
                   "new (tail_k, tail_gate, pool_keys) arrays; the inputs are not modified. "
                   "Feeding a sequence in chunks gives the same arrays as one call.\n") +
       kEngineDoc +
       " CUDA pool keys equal kpool_pool_keys(engine=that engine) bytes for bytes.\n"
       "Raises ContractError: CONTRACT_POOL for pool < 1 or a bad ring size; CONTRACT_SHAPE "
       "when pool_keys is too short or d == 0; CONTRACT_VALUE for pos < 0; CONTRACT_RANGE when "
       "pos + T overflows int32; CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad "
       "arrays.\nReference: MlaLayer::indexer (cpp/src/layers/mla_layer.cpp).")
          .c_str());

  m.def(
      "kpool_score",
      [](const AnyArray& q, const AnyArray& w, const AnyArray& pool_keys, int pool, int first_pos,
         float qk_scale, float head_scale, bool reference, bool tensor_cores,
         const Engine* engine) {
        const char* op = "kpool_score";
        const float* qp = f32_in(engine, q, op, "q", {-1, -1, -1});
        const int t_q = dim32(q, 0, op, "q"), Hi = dim32(q, 1, op, "q"),
                  d = dim32(q, 2, op, "q");
        const float* wp = f32_in(engine, w, op, "w", {t_q, Hi});
        const float* kp = f32_in(engine, pool_keys, op, "pool_keys", {-1, d});
        const int n_pools = dim32(pool_keys, 0, op, "pool_keys");
        check_pool(pool, op);
        check_positions(first_pos, t_q, op);
        check_finite(qk_scale, op, "qk_scale");
        check_finite(head_scale, op, "head_scale");
        Out score = out_f32(engine, {z(t_q), z(n_pools)});
        MemraKpoolScoreParams p{};
        p.q = qp;
        p.w = wp;
        p.Hi = Hi;
        p.d = d;
        p.pool = pool;
        p.qk_scale = qk_scale;
        p.head_scale = head_scale;
        p.score = score.data<float>();
        p.pool_keys = kp;
        p.t_q = t_q;
        p.n_pools = n_pools;
        p.first_pos = first_pos;
        p.reference = reference ? 1 : 0;
        p.tensor_cores = tensor_cores ? 1 : 0;
        run_op(engine, op::kpool_score, p);
        return score.obj;
      },
      nb::arg("q"), nb::arg("w"), nb::arg("pool_keys"), nb::kw_only(), nb::arg("pool"),
      nb::arg("first_pos"), nb::arg("qk_scale"), nb::arg("head_scale"),
      nb::arg("reference") = false, nb::arg("tensor_cores") = false,
      nb::arg("engine").none() = nb::none(),
      (std::string("Head-mixed pool scores: score[i, p] = sum_h w[i, h] * head_scale * "
                   "relu(qk_scale * q[i, h, :] . pool_keys[p, :]) (h ascending), and -inf where "
                   "pool p's last row p*pool + pool - 1 is after the query's position "
                   "first_pos + i.\n\n"
                   "q: [t_q, Hi, d] float32 (wq_b(q_resid)). w: [t_q, Hi] float32 "
                   "(weights_proj(x)). pool_keys: [n_pools, d] float32 (kpool_pool_keys). "
                   "qk_scale: index_head_dim**-0.5; head_scale: index_n_heads**-0.5. Returns "
                   "score [t_q, n_pools] float32.\n") +
       kEngineDoc +
       " CUDA reproduces the CPU's sequential sums without FMA (the same bytes as an x86 CPU "
       "build); reference=True runs the one-thread-per-score CUDA scorer instead of the tiled "
       "one (same bytes; ignored on the CPU). tensor_cores=True (the arm of bf16 models) runs "
       "the tensor-core scorer where d is 64 or 128 and Hi <= 128: q and pool_keys rounded to "
       "bf16, f32 sums (ignored on the CPU and with reference=True).\n"
       "Raises ContractError: CONTRACT_POOL for pool < 1; CONTRACT_VALUE for first_pos < 0 or a "
       "non-finite scale; CONTRACT_RANGE when first_pos + t_q overflows int32; CONTRACT_SHAPE / "
       "CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays.\n"
       "Reference: Glm5NextTextIndexer.forward (scores, weights, valid_candidates mask).")
          .c_str());

  m.def(
      "kpool_select",
      [](const AnyArray& score, int pool, int select_k, int width, int first_pos, bool reference,
         const Engine* engine) {
        const char* op = "kpool_select";
        const float* sp = f32_in(engine, score, op, "score", {-1, -1});
        const int t_q = dim32(score, 0, op, "score"),
                  n_pools = dim32(score, 1, op, "score");
        check_pool(pool, op);
        check_positions(first_pos, t_q, op);
        check_nonneg(select_k, op, "select_k");
        Out idx = out_i32(engine, {z(t_q), z(width > 0 ? width : 0)});
        if (on_cuda(engine)) {
          const int64_t need = int64_t(select_k) * pool + pool - 1;
          if (width < need) {  // the CPU's message (the kernel returns the same code)
            raise_contract(kContractIndexWidth,
                           std::string(op) + ": index width " + std::to_string(width) +
                               " is narrower than select_k*pool + pool - 1 = " +
                               std::to_string(need));
          }
          if (int64_t(n_pools) * pool > INT32_MAX) {
            raise_contract(kContractRange, std::string(op) + ": n_pools*pool = " +
                                               std::to_string(int64_t(n_pools) * pool) +
                                               " overflows int32");
          }
        }
        MemraKpoolSelectParams p{};
        p.score = sp;
        p.pool = pool;
        p.select_k = select_k;
        p.width = width;
        p.idx = idx.data<int32_t>();
        p.t_q = t_q;
        p.n_pools = n_pools;
        p.first_pos = first_pos;
        p.reference = reference ? 1 : 0;
        run_op(engine, op::kpool_select, p);
        return idx.obj;
      },
      nb::arg("score"), nb::kw_only(), nb::arg("pool"), nb::arg("select_k"), nb::arg("width"),
      nb::arg("first_pos"), nb::arg("reference") = false, nb::arg("engine").none() = nb::none(),
      (std::string("Index lists from pool scores: per query i (position first_pos + i), the top "
                   "select_k pools among the finite scores by (score desc, pool index asc), "
                   "expanded to their rows in ascending pool order, then the visible tail rows "
                   "[(pos+1) - (pos+1) % pool, pos], then -1 up to width. Fewer finite pools "
                   "than select_k leave more -1 padding.\n\n"
                   "score: [t_q, n_pools] float32 (kpool_score). select_k: "
                   "min(index_topk // pool, n_pools); width: index_topk + pool - 1. Returns idx "
                   "[t_q, width] int32 (a set of rows per query).\n") +
       kEngineDoc +
       " CUDA gives the CPU's lists exactly: a radix select over (score desc, pool asc) keys per "
       "query, or with reference=True a rank-counting select (same bytes; ignored on the "
       "CPU).\n"
       "Raises ContractError: CONTRACT_INDEX_WIDTH when width < select_k*pool + pool - 1; "
       "CONTRACT_POOL for pool < 1; CONTRACT_VALUE for select_k < 0 or first_pos < 0; "
       "CONTRACT_RANGE when positions overflow int32; CONTRACT_SHAPE / CONTRACT_DTYPE / "
       "CONTRACT_STRIDE / CONTRACT_DEVICE for a bad score.\n"
       "Reference: Glm5NextTextIndexer.forward topk + append_visible_tail "
       "(index_kpool_always_select_tail = True), compared as sets.")
          .c_str());

  init_ops_dsa_decode(m);  // kpool_append_decode, kpool_score_decode, kpool_select_decode
}

}  // namespace memra::py
