// Functional bindings of the DSA k-pool indexer ops over DLPack arrays: pool keys, the indexer's
// row bookkeeping (kpool_append), head-mixed scores, top-k pool selection. CPU backend: ops.h /
// cpu/dsa.cpp (the oracle) and MlaLayer::indexer's bookkeeping (cpp/src/layers/mla_layer.cpp).
// CUDA backend (keyword `engine` = a CUDA Engine): cuda/dsa.cu through the C ABI of
// cpp/include/memra/cuda_abi/dsa.h. Arguments are checked (ContractError naming the op and the
// values) before anything runs; outputs live on the engine's device; the CPU releases the GIL.
// The batched decode forms (kpool_append_decode / kpool_score_decode / kpool_select_decode: B
// sequences of one token, lists of per-sequence device arrays, positions on the host or the
// device) are CUDA only: cuda/dsa_decode.cu.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/ops.h"

namespace memra::py {

namespace {

size_t z(int64_t n) { return static_cast<size_t>(n); }

// `from`: where the pool comes from when it is not an argument of its own.
void check_pool(int pool, const char* op, const char* from = nullptr) {
  if (pool < 1) {
    raise_contract(kContractPool, std::string(op) + ": pool must be >= 1, got pool=" + std::to_string(pool) +
                                      (from ? std::string(" (") + from + ")" : ""));
  }
}

// The pool-key position embedding ape [pool, d] of the append ops: pool >= 1, d >= 1.
const float* ape_arg(const Engine* engine, const AnyArray& ape, const char* op, int* pool,
                     int* d) {
  const float* ap = f32_in(engine, ape, op, "ape", {-1, -1});
  *pool = static_cast<int>(dim(ape, 0));
  *d = static_cast<int>(dim(ape, 1));
  check_pool(*pool, op, "the rows of ape");
  if (*d < 1) {
    raise_contract(kContractShape, std::string(op) + ": ape has shape " + shape_str(ape) +
                                       ", expected [pool, d >= 1]");
  }
  return ap;
}

// The absolute positions first_pos .. first_pos + t_q - 1 must fit int32 (index lists are int32).
void check_positions(int64_t first_pos, int64_t t_q, const char* op) {
  check_nonneg(first_pos, op, "first_pos");
  if (first_pos + t_q > INT32_MAX) {
    raise_contract(kContractRange, std::string(op) + ": first_pos=" + std::to_string(first_pos) +
                                       " + t_q=" + std::to_string(t_q) + " overflows int32");
  }
}

// MlaLayer::indexer's bookkeeping for rows [pos, pos + T) (mla_layer.cpp, verbatim): the key of
// every pool whose last row lands in [pos, pos + T), its rows from the ring (r < pos) or the new
// rows (r >= pos); then the newest min(T, tail_rows) rows into the ring at r % tail_rows.
void kpool_append_cpu(const float* k, const float* gate, int T, int d, const float* ape, int P,
                      int pos, float* tk, float* tg, int ring, float* keys) {
  const int end = pos + T;
  std::vector<float> pk(z(int64_t(P) * d)), pg(z(int64_t(P) * d));
  for (int p = pos / P; p < end / P; ++p) {
    for (int i = 0; i < P; ++i) {
      const int r = p * P + i;
      const float* ks = r < pos ? tk + z(r % ring) * d : k + z(r - pos) * d;
      const float* gs = r < pos ? tg + z(r % ring) * d : gate + z(r - pos) * d;
      std::copy_n(ks, d, pk.data() + z(i) * d);
      std::copy_n(gs, d, pg.data() + z(i) * d);
    }
    cpu::kpool_pool_key(pk.data(), pg.data(), ape, P, d, keys + z(p) * d);
  }
  for (int r = std::max(pos, end - ring); r < end; ++r) {
    std::copy_n(k + z(r - pos) * d, d, tk + z(r % ring) * d);
    std::copy_n(gate + z(r - pos) * d, d, tg + z(r % ring) * d);
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

// ---------------------------------------------------------------- batched decode arguments

// pos of a batched decode call (per_seq_arg), with pos + 1 fitting int32 for the host values
// (device values are unknown to the host and unchecked).
PerSeq decode_pos_arg(const Engine* engine, nb::handle h, int64_t B, const char* op) {
  PerSeq p = per_seq_arg(engine, h, B, op, "pos");
  for (size_t b = 0; p.host && b < p.values.size(); ++b) {
    if (p.values[b] == INT32_MAX) {
      raise_contract(kContractRange, std::string(op) + ": pos[" + std::to_string(b) + "]=" +
                                         std::to_string(INT32_MAX) + ": pos + 1 overflows int32");
    }
  }
  return p;
}

// A list of B per-sequence float32 arrays [rows_b, d] on the engine's device (rows_b == rows
// unless rows == -1); writable: the op writes into them.
struct StateList {
  std::vector<float*> ptr;
  std::vector<int64_t> rows;
};

StateList state_list_arg(const Engine* engine, nb::handle list, int64_t B, int64_t rows,
                         int64_t d, const char* op, const char* name, bool writable) {
  if (nb::hasattr(list, "__dlpack__") || !nb::isinstance<nb::sequence>(list) ||
      nb::isinstance<nb::str>(list)) {
    raise_contract(kContractDType, std::string(op) + ": argument '" + name +
                                       "' must be a list of arrays (one per sequence), got " +
                                       std::string(nb::type_name(list.type()).c_str()));
  }
  StateList s;
  int64_t b = 0;
  for (nb::handle h : list) {
    const std::string item = std::string(name) + "[" + std::to_string(b) + "]";
    AnyArray a;
    if (!nb::try_cast(h, a)) {
      raise_contract(kContractDType, std::string(op) + ": " + item + " must be an array, got " +
                                         std::string(nb::type_name(h.type()).c_str()));
    }
    if (writable) require_writable(h, op, item.c_str());
    s.ptr.push_back(const_cast<float*>(f32_in(engine, a, op, item.c_str(), {rows, d})));
    s.rows.push_back(dim(a, 0));
    ++b;
  }
  if (b != B) {
    raise_contract(kContractShape, std::string(op) + ": argument '" + name + "' has " +
                                       std::to_string(b) + " arrays, expected B=" +
                                       std::to_string(B) + " (one per sequence)");
  }
  return s;
}

// The CUDA context of a decode form's engine (UnsupportedError naming the op otherwise).
const CudaContext& decode_ctx(const Engine* engine, const char* op) {
  if (!on_cuda(engine)) {
    raise_status(Status(kUnsupported, std::string(op) +
                                          ": needs a CUDA engine (engine=memra.Engine('cuda')); "
                                          "on the CPU run the per-sequence op for each sequence"));
  }
  return cuda_ctx(engine);
}

// One device table of the concatenated pointer lists (freed stream-ordered on return).
std::shared_ptr<DeviceBuffer> pointer_table(const Engine* engine,
                                            std::initializer_list<const StateList*> lists) {
  std::vector<const float*> host;
  for (const StateList* l : lists) host.insert(host.end(), l->ptr.begin(), l->ptr.end());
  return device_upload(engine, host.data(), host.size() * sizeof(const float*));
}

const char* kDecodeDoc =
    "CUDA only (engine: a CUDA Engine; UnsupportedError otherwise): cuda/dsa_decode.cu, one "
    "launch for the B sequences, per-sequence arrays reached through a device pointer table. pos: "
    "a host list / int array [B] (checked, then uploaded) or a device int32 [B] array (unchecked: "
    "the caller keeps each sequence's arrays large enough), pos[b] = tokens sequence b held "
    "before this one; pos[b] < 0 is an idle row. Launch shapes depend on B, d, Hi and max_pools "
    "only, so a captured CUDA graph replays at any position.";

const char* kEngineDoc =
    "engine: None or a CPU Engine runs the C++ reference on host arrays; a CUDA Engine runs "
    "cuda/dsa.cu on arrays of its device (ContractError CONTRACT_DEVICE otherwise) and returns "
    "CUDA arrays.";

}  // namespace

void init_ops_dsa(nb::module_& m) {
  m.def(
      "kpool_pool_keys",
      [](const AnyArray& k, const AnyArray& gate, const AnyArray& ape, const Engine* engine) {
        const char* op = "kpool_pool_keys";
        const float* ap = f32_in(engine, ape, op, "ape", {-1, -1});
        const int pool = static_cast<int>(dim(ape, 0)), d = static_cast<int>(dim(ape, 1));
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
        if (on_cuda(engine)) {
          if (n_pools > 0 && d > 0) {
            // One kpool_append from position 0 over every row: each pool key from its own rows
            // (the bytes the incremental path gives); the ring it also fills is thrown away.
            const CudaContext& c = cuda_ctx(engine);
            auto ring = device_scratch(engine, z(2 * int64_t(pool) * d) * sizeof(float));
            float* rk = static_cast<float*>(ring->data());
            check_cuda(engine,
                       c.api().kpool_append(c.ctx(), kp, gp, int(n_rows), d, ap, pool, 0, rk,
                                            rk + int64_t(pool) * d, pool, keys.data<float>()),
                       op);
          }
        } else {
          nb::gil_scoped_release nogil;
          for (int64_t p = 0; p < n_pools; ++p) {
            const int64_t off = p * pool * d;
            cpu::kpool_pool_key(kp + off, gp + off, ap, pool, d, keys.data<float>() + p * d);
          }
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
        check_positions(pos, T, op);
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
        if (on_cuda(engine)) {
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine,
                     c.api().kpool_append(c.ctx(), kp, gp, int(T), d, ap, pool, pos,
                                          tk.data<float>(), tg.data<float>(), int(ring),
                                          keys.data<float>()),
                     op);
        } else {
          nb::gil_scoped_release nogil;
          kpool_append_cpu(kp, gp, int(T), d, ap, pool, pos, tk.data<float>(), tg.data<float>(),
                           int(ring), keys.data<float>());
        }
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
         float qk_scale, float head_scale, bool reference, const Engine* engine) {
        const char* op = "kpool_score";
        const float* qp = f32_in(engine, q, op, "q", {-1, -1, -1});
        const int t_q = static_cast<int>(dim(q, 0)), Hi = static_cast<int>(dim(q, 1)),
                  d = static_cast<int>(dim(q, 2));
        const float* wp = f32_in(engine, w, op, "w", {t_q, Hi});
        const float* kp = f32_in(engine, pool_keys, op, "pool_keys", {-1, d});
        const int n_pools = static_cast<int>(dim(pool_keys, 0));
        check_pool(pool, op);
        check_positions(first_pos, t_q, op);
        check_finite(qk_scale, op, "qk_scale");
        check_finite(head_scale, op, "head_scale");
        Out score = out_f32(engine, {z(t_q), z(n_pools)});
        if (on_cuda(engine)) {
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine,
                     c.api().kpool_score(c.ctx(), qp, wp, kp, t_q, Hi, d, n_pools, pool,
                                         first_pos, qk_scale, head_scale, reference ? 1 : 0,
                                         score.data<float>()),
                     op);
        } else {
          nb::gil_scoped_release nogil;
          cpu::kpool_score(qp, wp, kp, t_q, Hi, d, n_pools, pool, first_pos, qk_scale, head_scale,
                           score.data<float>());
        }
        return score.obj;
      },
      nb::arg("q"), nb::arg("w"), nb::arg("pool_keys"), nb::kw_only(), nb::arg("pool"),
      nb::arg("first_pos"), nb::arg("qk_scale"), nb::arg("head_scale"),
      nb::arg("reference") = false, nb::arg("engine").none() = nb::none(),
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
       "one (same bytes; ignored on the CPU).\n"
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
        const int t_q = static_cast<int>(dim(score, 0)),
                  n_pools = static_cast<int>(dim(score, 1));
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
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine,
                     c.api().kpool_select(c.ctx(), sp, t_q, n_pools, pool, select_k, width,
                                          first_pos, reference ? 1 : 0, idx.data<int32_t>()),
                     op);
        } else {
          Status st;
          {
            nb::gil_scoped_release nogil;
            st = cpu::kpool_select(sp, t_q, n_pools, pool, select_k, width, first_pos,
                                   idx.data<int32_t>());
          }
          check(st);
        }
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

  // ---------------------------------------------------------------- batched decode forms

  m.def(
      "kpool_append_decode",
      [](const AnyArray& k, const AnyArray& gate, const AnyArray& ape, nb::handle tail_k,
         nb::handle tail_gate, nb::handle pool_keys, nb::handle pos, const Engine* engine) {
        const char* op = "kpool_append_decode";
        const CudaContext& c = decode_ctx(engine, op);
        int pool = 0, d = 0;
        const float* ap = ape_arg(engine, ape, op, &pool, &d);
        const float* kp = f32_in(engine, k, op, "k", {-1, d});
        const int64_t B = dim(k, 0);
        const float* gp = f32_in(engine, gate, op, "gate", {B, d});
        if (B > INT32_MAX) raise_contract(kContractRange, std::string(op) + ": B overflows int32");
        StateList tk = state_list_arg(engine, tail_k, B, -1, d, op, "tail_k", true);
        const int64_t ring = B > 0 ? tk.rows[0] : pool;
        StateList tg = state_list_arg(engine, tail_gate, B, ring, d, op, "tail_gate", true);
        for (int64_t b = 1; b < B; ++b) {
          if (tk.rows[z(b)] != ring) {
            raise_contract(kContractShape, std::string(op) + ": tail_k[" + std::to_string(b) +
                                               "] has " + std::to_string(tk.rows[z(b)]) +
                                               " rows, expected " + std::to_string(ring) +
                                               " (those of tail_k[0]; one ring size)");
          }
        }
        if (ring < pool || ring % pool != 0 || ring > INT32_MAX) {
          raise_contract(kContractPool, std::string(op) + ": tail_k (the tail ring) has " +
                                            std::to_string(ring) +
                                            " rows, expected a positive multiple of pool=" +
                                            std::to_string(pool));
        }
        StateList pk = state_list_arg(engine, pool_keys, B, -1, d, op, "pool_keys", true);
        PerSeq p = decode_pos_arg(engine, pos, B, op);
        if (p.host) {
          for (int64_t b = 0; b < B; ++b) {
            const int64_t v = p.values[z(b)];
            if (v >= 0 && (v + 1) / pool > pk.rows[z(b)]) {
              raise_contract(kContractShape,
                             std::string(op) + ": pool_keys[" + std::to_string(b) + "] has " +
                                 std::to_string(pk.rows[z(b)]) + " rows, but row pos[" +
                                 std::to_string(b) + "]=" + std::to_string(v) +
                                 " completes pools up to " + std::to_string((v + 1) / pool) +
                                 " (pool=" + std::to_string(pool) + ")");
            }
          }
        }
        if (B == 0) return;
        auto table = pointer_table(engine, {&tk, &tg, &pk});
        float* const* t = static_cast<float* const*>(table->data());
        check_cuda(engine,
                   c.api().kpool_append_decode(c.ctx(), kp, gp, static_cast<int>(B), d, ap, pool,
                                               p.dev, t, t + B, static_cast<int>(ring), t + 2 * B),
                   op);
      },
      nb::arg("k"), nb::arg("gate"), nb::arg("ape"), nb::arg("tail_k"), nb::arg("tail_gate"),
      nb::arg("pool_keys"), nb::arg("pos"), nb::kw_only(), nb::arg("engine").none() = nb::none(),
      (std::string("kpool_append for B sequences of one new row each, in place: for each active "
                   "row b the key of the pool that row pos[b] completes ((pos[b] + 1) % pool == "
                   "0; its earlier rows from the ring), then row pos[b] into ring slot pos[b] % "
                   "tail_rows. The bytes kpool_append(k[b:b+1], gate[b:b+1], ape, ..., "
                   "pos=pos[b]) gives that sequence.\n\n"
                   "k, gate: [B, d] float32 (the new rows). ape: [pool, d] float32. tail_k, "
                   "tail_gate: lists of B distinct writable [tail_rows, d] float32 rings (one "
                   "tail_rows, a positive multiple of pool). pool_keys: a list of B writable "
                   "[max_pools_b, d] float32 arrays, max_pools_b >= (pos[b] + 1) // pool. An idle "
                   "row's arrays are neither read nor written. Returns None.\n") +
       kDecodeDoc +
       "\nRaises ContractError: CONTRACT_POOL for pool < 1 or a bad ring size; CONTRACT_SHAPE "
       "when a list's length is not B, ring sizes differ, d == 0, or (host pos) a pool_keys "
       "array is too short; CONTRACT_RANGE for a host pos of 2^31 - 1 or outside int32; "
       "CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays; CONTRACT_VALUE for a "
       "read-only array. Nothing is written when it raises.\n"
       "Reference: kpool_append per sequence with T = 1 (MlaLayer::indexer's bookkeeping).")
          .c_str());

  m.def(
      "kpool_score_decode",
      [](const AnyArray& q, const AnyArray& w, nb::handle pool_keys, nb::handle pos, int pool,
         float qk_scale, float head_scale, std::optional<int64_t> max_pools,
         const Engine* engine) {
        const char* op = "kpool_score_decode";
        const CudaContext& c = decode_ctx(engine, op);
        const float* qp = f32_in(engine, q, op, "q", {-1, -1, -1});
        const int64_t B = dim(q, 0), Hi = dim(q, 1), d = dim(q, 2);
        const float* wp = f32_in(engine, w, op, "w", {B, Hi});
        if (B > INT32_MAX || Hi > INT32_MAX || d > INT32_MAX) {
          raise_contract(kContractRange, std::string(op) + ": q " + shape_str(q) +
                                             " has an extent past int32");
        }
        StateList pk = state_list_arg(engine, pool_keys, B, -1, d, op, "pool_keys", false);
        check_pool(pool, op);
        check_finite(qk_scale, op, "qk_scale");
        check_finite(head_scale, op, "head_scale");
        PerSeq p = decode_pos_arg(engine, pos, B, op);
        int64_t bound = 0;  // the score width: max_pools, else the longest pool_keys array
        for (int64_t r : pk.rows) bound = std::max(bound, r);
        if (max_pools) {
          if (*max_pools < 0 || *max_pools > INT32_MAX) {
            raise_contract(kContractValue, std::string(op) + ": max_pools=" +
                                               std::to_string(*max_pools) +
                                               " is outside [0, 2^31)");
          }
          bound = *max_pools;
        }
        if (bound > INT32_MAX) {
          raise_contract(kContractRange, std::string(op) + ": pool_keys arrays of " +
                                             std::to_string(bound) +
                                             " rows overflow int32 (pass max_pools)");
        }
        if (p.host) {
          for (int64_t b = 0; b < B; ++b) {
            const int64_t v = p.values[z(b)];
            const int64_t n = v < 0 ? 0 : (v + 1) / pool;
            if (n > pk.rows[z(b)]) {
              raise_contract(kContractRange,
                             std::string(op) + ": pos[" + std::to_string(b) + "]=" +
                                 std::to_string(v) + " sees " + std::to_string(n) +
                                 " pools, but pool_keys[" + std::to_string(b) + "] has " +
                                 std::to_string(pk.rows[z(b)]) + " rows");
            }
            if (n > bound) {
              raise_contract(kContractValue,
                             std::string(op) + ": max_pools=" + std::to_string(bound) +
                                 " is below the " + std::to_string(n) + " pools pos[" +
                                 std::to_string(b) + "]=" + std::to_string(v) + " sees");
            }
          }
        }
        Out score = out_f32_uninit(engine, {z(B), z(bound)});
        if (B == 0 || bound == 0) return score.obj;
        auto table = pointer_table(engine, {&pk});
        check_cuda(engine,
                   c.api().kpool_score_decode(c.ctx(), qp, wp,
                                              static_cast<const float* const*>(table->data()),
                                              p.dev, static_cast<int>(B), static_cast<int>(Hi),
                                              static_cast<int>(d), pool, static_cast<int>(bound),
                                              qk_scale, head_scale, score.data<float>()),
                   op);
        return score.obj;
      },
      nb::arg("q"), nb::arg("w"), nb::arg("pool_keys"), nb::arg("pos"), nb::kw_only(),
      nb::arg("pool"), nb::arg("qk_scale"), nb::arg("head_scale"),
      nb::arg("max_pools").none() = nb::none(), nb::arg("engine").none() = nb::none(),
      (std::string("kpool_score for B sequences of one query each: row b scores the pools the "
                   "token at pos[b] sees, p < n_b = (pos[b] + 1) // pool (the bytes of "
                   "kpool_score(q[b:b+1], w[b:b+1], pool_keys[b][:n_b], first_pos=pos[b]), the "
                   "same summation order), and is -inf for p >= n_b (an idle row: all -inf).\n\n"
                   "q: [B, Hi, d] float32. w: [B, Hi] float32. pool_keys: a list of B [rows_b, d] "
                   "float32 arrays (rows_b >= n_b). qk_scale: index_head_dim**-0.5; head_scale: "
                   "index_n_heads**-0.5. max_pools: the score width and the host bound the launch "
                   "is sized from (default: the longest pool_keys array); device positions that "
                   "see more pools are clamped to it. Returns score [B, max_pools] float32.\n") +
       kDecodeDoc +
       "\nRaises ContractError: CONTRACT_POOL for pool < 1; CONTRACT_VALUE for a non-finite "
       "scale, max_pools outside [0, 2^31) or (host pos) below a row's n_b; CONTRACT_RANGE when "
       "(host pos) a pool_keys array is shorter than n_b or pos is 2^31 - 1; CONTRACT_SHAPE / "
       "CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays or a list whose "
       "length is not B.\n"
       "Reference: kpool_score per sequence with t_q = 1 (Glm5NextTextIndexer.forward at "
       "decode).")
          .c_str());

  m.def(
      "kpool_select_decode",
      [](const AnyArray& score, nb::handle pos, int pool, int select_k, int width,
         const Engine* engine) {
        const char* op = "kpool_select_decode";
        const CudaContext& c = decode_ctx(engine, op);
        const float* sp = f32_in(engine, score, op, "score", {-1, -1});
        const int64_t B = dim(score, 0), max_pools = dim(score, 1);
        check_pool(pool, op);
        check_nonneg(select_k, op, "select_k");
        const int64_t need = int64_t(select_k) * pool + pool - 1;
        if (width < need) {
          raise_contract(kContractIndexWidth,
                         std::string(op) + ": index width " + std::to_string(width) +
                             " is narrower than select_k*pool + pool - 1 = " +
                             std::to_string(need));
        }
        if (B > INT32_MAX || max_pools * pool > INT32_MAX) {
          raise_contract(kContractRange, std::string(op) + ": score " + shape_str(score) +
                                             " with pool=" + std::to_string(pool) +
                                             " overflows int32");
        }
        PerSeq p = decode_pos_arg(engine, pos, B, op);
        if (p.host) {
          for (int64_t b = 0; b < B; ++b) {
            const int64_t v = p.values[z(b)];
            const int64_t n = v < 0 ? 0 : (v + 1) / pool;
            if (n > max_pools) {
              raise_contract(kContractRange,
                             std::string(op) + ": pos[" + std::to_string(b) + "]=" +
                                 std::to_string(v) + " sees " + std::to_string(n) +
                                 " pools, but score has " + std::to_string(max_pools) +
                                 " columns");
            }
          }
        }
        Out idx = out_i32(engine, {z(B), z(width)});
        if (B == 0 || width == 0) return idx.obj;
        check_cuda(engine,
                   c.api().kpool_select_decode(c.ctx(), sp, p.dev, static_cast<int>(B),
                                               static_cast<int>(max_pools), pool, select_k, width,
                                               idx.data<int32_t>()),
                   op);
        return idx.obj;
      },
      nb::arg("score"), nb::arg("pos"), nb::kw_only(), nb::arg("pool"), nb::arg("select_k"),
      nb::arg("width"), nb::arg("engine").none() = nb::none(),
      (std::string("kpool_select for B sequences of one query each: row b is kpool_select("
                   "score[b:b+1, :n_b], first_pos=pos[b]) with n_b = (pos[b] + 1) // pool, bytes "
                   "for bytes: the top select_k pools by (score desc, pool asc) among the finite "
                   "scores, expanded to rows in ascending pool order, the visible tail rows, then "
                   "-1 up to width. An idle row is all -1.\n\n"
                   "score: [B, max_pools] float32 (kpool_score_decode). select_k: "
                   "index_topk // pool; width: index_topk + pool - 1. Returns idx [B, width] "
                   "int32.\n") +
       kDecodeDoc +
       "\nRaises ContractError: CONTRACT_INDEX_WIDTH when width < select_k*pool + pool - 1; "
       "CONTRACT_POOL for pool < 1; CONTRACT_VALUE for select_k < 0; CONTRACT_RANGE when "
       "max_pools*pool overflows int32 or (host pos) a row sees more pools than score has "
       "columns or pos is 2^31 - 1; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / "
       "CONTRACT_DEVICE for bad arrays.\n"
       "Reference: kpool_select per sequence with t_q = 1.")
          .c_str());
}

}  // namespace memra::py
