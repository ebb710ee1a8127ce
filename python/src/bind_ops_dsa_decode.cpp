// Functional bindings of the DSA k-pool indexer's batched decode forms (kpool_append_decode,
// kpool_score_decode, kpool_select_decode): B sequences of one token, lists of per-sequence
// device arrays reached through a device pointer table, positions on the host or the device.
// CUDA only (cuda/dsa_decode.cu through memra::op, op/dsa.h); the one-sequence ops are
// bind_ops_dsa.cpp's. Arguments are checked (ContractError naming the op and the values) before
// anything runs.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
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
  std::vector<AnyArray> keep;  // the arrays themselves: their memory lives until the op returns
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
    if (b >= B) {  // checked as it goes: an endless sequence must not run forever
      raise_contract(kContractShape, std::string(op) + ": argument '" + name + "' has more than " +
                                         std::to_string(B) + " arrays for B=" + std::to_string(B) +
                                         " sequences");
    }
    const std::string item = std::string(name) + "[" + std::to_string(b) + "]";
    AnyArray a;
    if (!nb::try_cast(h, a)) {
      raise_contract(kContractDType, std::string(op) + ": " + item + " must be an array, got " +
                                         std::string(nb::type_name(h.type()).c_str()));
    }
    if (writable) require_writable(h, op, item.c_str());
    s.ptr.push_back(const_cast<float*>(f32_in(engine, a, op, item.c_str(), {rows, d})));
    s.rows.push_back(dim(a, 0));
    s.keep.push_back(std::move(a));
    ++b;
  }
  if (b != B) {
    raise_contract(kContractShape, std::string(op) + ": argument '" + name + "' has " +
                                       std::to_string(b) + " arrays, expected B=" +
                                       std::to_string(B) + " (one per sequence)");
  }
  return s;
}

// A decode form's engine must be a CUDA one (UnsupportedError naming the op otherwise).
void require_cuda(const Engine* engine, const char* op) {
  if (!on_cuda(engine)) {
    raise_status(Status(kUnsupported, std::string(op) +
                                          ": needs a CUDA engine (engine=memra.Engine('cuda')); "
                                          "on the CPU run the per-sequence op for each sequence"));
  }
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

}  // namespace

void init_ops_dsa_decode(nb::module_& m) {
  m.def(
      "kpool_append_decode",
      [](const AnyArray& k, const AnyArray& gate, const AnyArray& ape, nb::handle tail_k,
         nb::handle tail_gate, nb::handle pool_keys, nb::handle pos, const Engine* engine) {
        const char* op = "kpool_append_decode";
        require_cuda(engine, op);
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
        // The arrays written in place, each its own (one launch writes them all), and the new
        // rows apart from them; before pos, whose host list CUDA uploads.
        {
          std::vector<Span> out;
          const size_t row = sizeof(float) * z(d);
          for (int64_t b = 0; b < B; ++b) {
            const std::string i = "[" + std::to_string(b) + "]";
            out.push_back({"tail_k" + i, tk.ptr[z(b)], row * z(tk.rows[z(b)])});
            out.push_back({"tail_gate" + i, tg.ptr[z(b)], row * z(tg.rows[z(b)])});
            out.push_back({"pool_keys" + i, pk.ptr[z(b)], row * z(pk.rows[z(b)])});
          }
          for (const Span& w : out) {
            check_disjoint(op, "k", kp, k.nbytes(), w.name.c_str(), w.data, w.bytes);
            check_disjoint(op, "gate", gp, gate.nbytes(), w.name.c_str(), w.data, w.bytes);
          }
          check_all_disjoint(op, std::move(out));
        }
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
        MemraKpoolAppendParams ps{};
        ps.batched = 1;
        ps.k = kp;
        ps.gate = gp;
        ps.n = static_cast<int>(B);
        ps.d = d;
        ps.ape = ap;
        ps.pool = pool;
        ps.tail_rows = static_cast<int>(ring);
        ps.seq_pos = p.dev;
        ps.seq_tail_k = t;
        ps.seq_tail_gate = t + B;
        ps.seq_pool_keys = t + 2 * B;
        run_op(engine, op::kpool_append, ps);
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
       "read-only array, for written arrays sharing memory, or for k / gate sharing memory with "
       "one. Nothing is written when it raises.\n"
       "Reference: kpool_append per sequence with T = 1 (MlaLayer::indexer's bookkeeping).")
          .c_str());

  m.def(
      "kpool_score_decode",
      [](const AnyArray& q, const AnyArray& w, nb::handle pool_keys, nb::handle pos, int pool,
         float qk_scale, float head_scale, std::optional<int64_t> max_pools,
         const Engine* engine) {
        const char* op = "kpool_score_decode";
        require_cuda(engine, op);
        const float* qp = f32_in(engine, q, op, "q", {-1, -1, -1});
        const int64_t B = dim32(q, 0, op, "q"), Hi = dim32(q, 1, op, "q"), d = dim32(q, 2, op, "q");
        const float* wp = f32_in(engine, w, op, "w", {B, Hi});
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
        MemraKpoolScoreParams ps{};
        ps.batched = 1;
        ps.q = qp;
        ps.w = wp;
        ps.Hi = static_cast<int>(Hi);
        ps.d = static_cast<int>(d);
        ps.pool = pool;
        ps.qk_scale = qk_scale;
        ps.head_scale = head_scale;
        ps.score = score.data<float>();
        ps.seq_pool_keys = static_cast<const float* const*>(table->data());
        ps.seq_pos = p.dev;
        ps.B = static_cast<int>(B);
        ps.max_pools = static_cast<int>(bound);
        run_op(engine, op::kpool_score, ps);
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
        require_cuda(engine, op);
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
        MemraKpoolSelectParams ps{};
        ps.batched = 1;
        ps.score = sp;
        ps.pool = pool;
        ps.select_k = select_k;
        ps.width = width;
        ps.idx = idx.data<int32_t>();
        ps.seq_pos = p.dev;
        ps.B = static_cast<int>(B);
        ps.max_pools = static_cast<int>(max_pools);
        run_op(engine, op::kpool_select, ps);
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
