// Functional bindings of the FFN and sampling ops over DLPack arrays. CPU backend: ops.h,
// cpu/ffn.cpp, cpu/sample.cpp (the oracle). CUDA backend (keyword `engine` = a CUDA Engine):
// cuda/ffn.cu and cuda/sample.cu through the C ABI of cpp/include/memra/cuda_abi/ffn.h. Every
// function checks its arguments (ContractError naming the op and the values) before anything
// runs, allocates its outputs on the engine's device and, on the CPU, releases the GIL while
// computing.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/msg.h"
#include "memra/ops.h"

namespace memra::py {

namespace {

// The same for a DeviceWeight, with an exact shape (2-D [rows, cols] or stacked [n, rows, cols]).
void check_dweight(const DeviceWeight& w, const char* op, const char* name,
                   const std::vector<int64_t>& want) {
  if (w.shape != want) {
    Msg os;
    os << op << ": DeviceWeight '" << name << "' has shape " << w.shape_str() << ", expected [";
    for (size_t i = 0; i < want.size(); ++i) os << (i ? ", " : "") << want[i];
    os << "]";
    raise_contract(kContractShape, os.str());
  }
}

// Counters for sampling: int64 or uint64, 1-D [B], C-contiguous, host. int64 values must be
// non-negative (they are reinterpreted as uint64). common.h's checkers cover f32/i32 only.
std::vector<uint64_t> counter_arg(const AnyArray& a, const char* op, const char* name, int64_t B) {
  Msg os;
  if (a.device_type() != nb::device::cpu::value) {
    os << op << ": argument '" << name << "' must live in host memory for the CPU backend, got "
       << "a tensor on DLPack device type " << a.device_type();
    raise_contract(kContractDevice, os.str());
  }
  const auto code = static_cast<nb::dlpack::dtype_code>(a.dtype().code);
  const bool is_i64 = code == nb::dlpack::dtype_code::Int && a.dtype().bits == 64;
  const bool is_u64 = code == nb::dlpack::dtype_code::UInt && a.dtype().bits == 64;
  if (!(is_i64 || is_u64) || a.dtype().lanes != 1) {
    os << op << ": argument '" << name << "' must be int64 or uint64, got a "
       << static_cast<int>(a.dtype().bits) << "-bit array of DLPack type code "
       << static_cast<int>(a.dtype().code);
    raise_contract(kContractDType, os.str());
  }
  if (a.ndim() != 1 || static_cast<int64_t>(a.shape(0)) != B) {
    os << op << ": argument '" << name << "' has shape " << shape_str(a) << ", expected [" << B
       << "]";
    raise_contract(kContractShape, os.str());
  }
  if (B > 1 && a.stride(0) != 1) {
    os << op << ": argument '" << name << "' with shape " << shape_str(a)
       << " must be C-contiguous (call np.ascontiguousarray first)";
    raise_contract(kContractStride, os.str());
  }
  std::vector<uint64_t> out(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    if (is_i64) {
      const int64_t v = static_cast<const int64_t*>(a.data())[b];
      if (v < 0) {
        os << op << ": argument '" << name << "' holds the negative value " << v
           << " at row " << b;
        raise_contract(kContractRange, os.str());
      }
      out[b] = static_cast<uint64_t>(v);
    } else {
      out[b] = static_cast<const uint64_t*>(a.data())[b];
    }
  }
  return out;
}

// The CPU form of moe_forward's expert lists: a sequence of memra.Weight (one per expert).
std::vector<Weight> host_weight_list(nb::handle seq, const char* op, const char* name) {
  if (!nb::isinstance<nb::sequence>(seq) || nb::isinstance<nb::str>(seq)) {
    raise_contract(nb::isinstance<DeviceWeight>(seq) ? kContractDevice : kContractDType,
                   std::string(op) + ": argument '" + name +
                       "' must be a list of memra.Weight (one per expert) for the CPU backend, "
                       "got " + nb::type_name(seq.type()).c_str());
  }
  std::vector<Weight> out;
  size_t i = 0;
  for (nb::handle h : seq) {
    const std::string item = std::string(name) + "[" + std::to_string(i++) + "]";
    out.push_back(host_weight(h, op, item.c_str()));
  }
  return out;
}

size_t sz(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

void init_ops_ffn(nb::module_& m) {
  m.def(
      "swiglu_mlp",
      [](const AnyArray& x, nb::handle gate_w, nb::handle up_w, nb::handle down_w, float limit,
         const Engine* engine) {
        const char* op = "swiglu_mlp";
        const float* xp = f32_in(engine, x, op, "x", {-1, -1});
        const int64_t T = dim(x, 0), D = dim(x, 1);
        if (on_cuda(engine)) {
          const DeviceWeight& g = device_weight(engine, gate_w, op, "gate_w");
          const DeviceWeight& u = device_weight(engine, up_w, op, "up_w");
          const DeviceWeight& d = device_weight(engine, down_w, op, "down_w");
          const int64_t I = g.shape.empty() ? 0 : g.shape[0];
          check_dweight(g, op, "gate_w", {I, D});
          check_dweight(u, op, "up_w", {I, D});
          check_dweight(d, op, "down_w", {D, I});
          if (u.dtype != g.dtype || d.dtype != g.dtype) {
            raise_contract(kContractDType,
                           std::string(op) + ": gate_w, up_w and down_w must share one dtype, got " +
                               dtype_name(g.dtype) + ", " + dtype_name(u.dtype) + ", " +
                               dtype_name(d.dtype));
          }
          check_value(limit > 0.0f, op, "limit must be > 0, got " + std::to_string(limit));
          Out y = out_f32(engine, {sz(T), sz(D)});
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine,
                     c.api().swiglu_mlp(c.ctx(), xp, int(T), int(D), g.data(), u.data(), d.data(),
                                        g.dtype_code(), int(I), limit, y.data<float>()),
                     op);
          return y.obj;
        }
        const Weight& g = host_weight(gate_w, op, "gate_w");
        const Weight& u = host_weight(up_w, op, "up_w");
        const Weight& d = host_weight(down_w, op, "down_w");
        const int64_t I = g.rows();
        check_weight_2d(g, op, "gate_w", I, D);
        check_weight_2d(u, op, "up_w", I, D);
        check_weight_2d(d, op, "down_w", D, I);
        check_value(limit > 0.0f, op, "limit must be > 0, got " + std::to_string(limit));
        Out y = out_f32(engine, {sz(T), sz(D)});
        {
          nb::gil_scoped_release nogil;
          cpu::swiglu_mlp(xp, static_cast<int>(T), g, u, d, limit, y.data<float>());
        }
        return y.obj;
      },
      nb::arg("x"), nb::arg("gate_w"), nb::arg("up_w"), nb::arg("down_w"), nb::kw_only(),
      nb::arg("limit"), nb::arg("engine").none() = nb::none(),
      "SwiGLU MLP with the clamp: y = (silu(min(x gate_w^T, limit)) * clamp(x up_w^T, +-limit)) "
      "down_w^T.\n\nx [T, D] float32; gate_w, up_w [I, D]; down_w [D, I]; limit > 0 "
      "(swiglu_limit; inf for no clamp). Returns y [T, D] float32.\n"
      "engine: None or a CPU Engine: memra.Weight arguments, host arrays, the C++ reference "
      "(f32 accumulation over the weights widened to f32).\nA CUDA Engine: memra.DeviceWeight "
      "arguments of one dtype, arrays on its device; three cuBLAS GEMMs (float32 weights: SGEMM, "
      "TF32 off; bfloat16 weights: x and the hidden activation rounded to bfloat16 before each "
      "GEMM, f32 accumulation) around the CPU's elementwise clamp/SiLU formula.\n"
      "Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; "
      "CONTRACT_VALUE for limit <= 0), LibraryError for a cuBLAS failure.\n"
      "Reference: transformers Glm5NextTextMLP.forward.");

  m.def(
      "moe_route",
      [](const AnyArray& x, nb::handle gate_w, std::optional<AnyArray> corr_bias, int top_k,
         int n_group, int topk_group, bool norm_topk_prob, float scaling, const Engine* engine) {
        const char* op = "moe_route";
        const float* xp = f32_in(engine, x, op, "x", {-1, -1});
        const int64_t T = dim(x, 0), D = dim(x, 1);
        const Weight* hw = nullptr;
        const DeviceWeight* dw = nullptr;
        int64_t E = 0;
        if (on_cuda(engine)) {
          dw = &device_weight(engine, gate_w, op, "gate_w");
          E = dw->shape.empty() ? 0 : dw->shape[0];
          check_dweight(*dw, op, "gate_w", {E, D});
          if (dw->dtype != DType::kF32) {
            raise_contract(kContractDType,
                           std::string(op) + ": DeviceWeight 'gate_w' must be float32 (router "
                                             "logits are computed in f32), got " +
                               dtype_name(dw->dtype));
          }
        } else {
          hw = &host_weight(gate_w, op, "gate_w");
          E = hw->rows();
          check_weight_2d(*hw, op, "gate_w", E, D);
        }
        const float* bp = corr_bias ? f32_in(engine, *corr_bias, op, "corr_bias", {E}) : nullptr;
        check_value(n_group >= 1 && E % n_group == 0, op,
                    "n_group=" + std::to_string(n_group) + " must divide the " +
                        std::to_string(E) + " experts");
        check_value(topk_group >= 1 && topk_group <= n_group, op,
                    "topk_group=" + std::to_string(topk_group) + " must be in [1, n_group=" +
                        std::to_string(n_group) + "]");
        const int64_t kept = static_cast<int64_t>(topk_group) * (E / n_group);
        check_value(top_k >= 1 && top_k <= kept, op,
                    "top_k=" + std::to_string(top_k) + " must be in [1, " + std::to_string(kept) +
                        "] (topk_group * experts per group)");
        check_finite(scaling, op, "scaling");
        Out idx = out_i32(engine, {sz(T), sz(top_k)});
        Out w = out_f32(engine, {sz(T), sz(top_k)});
        if (on_cuda(engine)) {
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine,
                     c.api().moe_route(c.ctx(), xp, int(T), int(D),
                                       static_cast<const float*>(dw->data()), bp, int(E), top_k,
                                       n_group, topk_group, norm_topk_prob ? 1 : 0, scaling,
                                       idx.data<int32_t>(), w.data<float>()),
                     op);
        } else {
          nb::gil_scoped_release nogil;
          cpu::moe_route(xp, static_cast<int>(T), static_cast<int>(D), *hw, bp,
                         static_cast<int>(E), top_k, n_group, topk_group, norm_topk_prob, scaling,
                         idx.data<int32_t>(), w.data<float>());
        }
        return nb::make_tuple(idx.obj, w.obj);
      },
      nb::arg("x"), nb::arg("gate_w"), nb::arg("corr_bias") = nb::none(), nb::kw_only(),
      nb::arg("top_k"), nb::arg("n_group"), nb::arg("topk_group"), nb::arg("norm_topk_prob"),
      nb::arg("scaling"), nb::arg("engine").none() = nb::none(),
      "Sigmoid router with grouped selection.\n\nx [T, D] float32; gate_w [E, D]; "
      "corr_bias [E] float32 or None (e_score_correction_bias: used only to choose).\n"
      "Logits in f32 -> sigmoid scores s; choice c = s + bias; group score = sum of the top-2 c "
      "of each of the n_group groups; keep the best topk_group groups (ties: lower group); "
      "top_k experts by c among them (ties: lower id), sorted by c desc. Weights = s of the "
      "chosen experts, / (sum + 1e-20) when norm_topk_prob, times scaling.\nReturns (idx [T, "
      "top_k] int32, w [T, top_k] float32).\n"
      "engine: None or a CPU Engine: gate_w a memra.Weight, host arrays. A CUDA Engine: gate_w a "
      "float32 memra.DeviceWeight, arrays on its device; logits by SGEMM (TF32 off; at one token "
      "the decode GEMV, in the same launch as the routing), then one warp per token with the "
      "CPU's selection rules (sigmoid with CUDA's expf, within 2 ulp).\n"
      "Raises ContractError (CONTRACT_DTYPE, also for a bfloat16 DeviceWeight; CONTRACT_SHAPE, "
      "CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE when n_group does not divide E, "
      "topk_group is outside [1, n_group], top_k outside [1, topk_group * E / n_group] or "
      "scaling not finite).\n"
      "Reference: transformers Glm5NextTextTopkRouter.forward.");

  m.def(
      "moe_forward",
      [](const AnyArray& x, const AnyArray& idx, const AnyArray& w, nb::handle gate_ws,
         nb::handle up_ws, nb::handle down_ws, float limit, const Engine* engine) {
        const char* op = "moe_forward";
        const float* xp = f32_in(engine, x, op, "x", {-1, -1});
        const int64_t T = dim(x, 0), D = dim(x, 1);
        const int32_t* ip = i32_in(engine, idx, op, "idx", {T, -1});
        const int64_t K = dim(idx, 1);
        const float* wp = f32_in(engine, w, op, "w", {T, K});
        if (on_cuda(engine)) {
          const DeviceWeight& g = device_weight(engine, gate_ws, op, "gate_ws");
          const DeviceWeight& u = device_weight(engine, up_ws, op, "up_ws");
          const DeviceWeight& d = device_weight(engine, down_ws, op, "down_ws");
          if (g.shape.size() != 3 || g.shape[0] < 1) {
            raise_contract(kContractShape,
                           std::string(op) + ": DeviceWeight 'gate_ws' must be the stacked "
                                             "experts [E, I, D] with E >= 1, got shape " +
                               g.shape_str());
          }
          const int64_t E = g.shape[0], I = g.shape[1];
          check_dweight(g, op, "gate_ws", {E, I, D});
          check_dweight(u, op, "up_ws", {E, I, D});
          check_dweight(d, op, "down_ws", {E, D, I});
          if (u.dtype != g.dtype || d.dtype != g.dtype) {
            raise_contract(kContractDType,
                           std::string(op) + ": gate_ws, up_ws and down_ws must share one dtype, "
                                             "got " + dtype_name(g.dtype) + ", " +
                               dtype_name(u.dtype) + ", " + dtype_name(d.dtype));
          }
          check_value(limit > 0.0f, op, "limit must be > 0, got " + std::to_string(limit));
          const CudaContext& c = cuda_ctx(engine);
          // The CPU's range check on the ids, here on a host copy (one synchronisation; the
          // entry point itself would skip an id outside [0, E)).
          std::vector<int32_t> host_ids(sz(T * K));
          if (!host_ids.empty()) {
            check_cuda(engine,
                       c.api().copy_to_host(c.ctx(), host_ids.data(), ip,
                                            host_ids.size() * sizeof(int32_t)),
                       op);
          }
          for (int64_t r = 0; r < T * K; ++r) {
            if (host_ids[sz(r)] < 0 || host_ids[sz(r)] >= E) {
              raise_contract(kContractRange, std::string(op) + ": expert id " +
                                                 std::to_string(host_ids[sz(r)]) + " at idx[" +
                                                 std::to_string(r / K) + ", " +
                                                 std::to_string(r % K) + "] is outside [0, " +
                                                 std::to_string(E) + ")");
            }
          }
          Out y = out_f32(engine, {sz(T), sz(D)});
          check_cuda(engine,
                     c.api().moe_forward(c.ctx(), xp, int(T), int(D), ip, wp, int(K), g.data(),
                                         u.data(), d.data(), g.dtype_code(), int(E), int(I),
                                         limit, y.data<float>()),
                     op);
          return y.obj;
        }
        const std::vector<Weight> gw = host_weight_list(gate_ws, op, "gate_ws");
        const std::vector<Weight> uw = host_weight_list(up_ws, op, "up_ws");
        const std::vector<Weight> dw = host_weight_list(down_ws, op, "down_ws");
        const int64_t E = static_cast<int64_t>(gw.size());
        if (E == 0 || static_cast<int64_t>(uw.size()) != E ||
            static_cast<int64_t>(dw.size()) != E) {
          raise_contract(kContractShape,
                         std::string(op) + ": gate_ws, up_ws, down_ws must be non-empty lists " +
                             "of one weight per expert, got " + std::to_string(gw.size()) +
                             ", " + std::to_string(uw.size()) + ", " + std::to_string(dw.size()));
        }
        const int64_t I = gw[0].rows();
        for (int64_t e = 0; e < E; ++e) {
          const std::string g = "gate_ws[" + std::to_string(e) + "]",
                            u = "up_ws[" + std::to_string(e) + "]",
                            d = "down_ws[" + std::to_string(e) + "]";
          check_weight_2d(gw[sz(e)], op, g.c_str(), I, D);
          check_weight_2d(uw[sz(e)], op, u.c_str(), I, D);
          check_weight_2d(dw[sz(e)], op, d.c_str(), D, I);
        }
        for (int64_t r = 0; r < T * K; ++r) {
          if (ip[r] < 0 || ip[r] >= E) {
            raise_contract(kContractRange, std::string(op) + ": expert id " +
                                               std::to_string(ip[r]) + " at idx[" +
                                               std::to_string(r / K) + ", " +
                                               std::to_string(r % K) + "] is outside [0, " +
                                               std::to_string(E) + ")");
          }
        }
        check_value(limit > 0.0f, op, "limit must be > 0, got " + std::to_string(limit));
        Out y = out_f32(engine, {sz(T), sz(D)});
        {
          nb::gil_scoped_release nogil;
          cpu::moe_forward(xp, static_cast<int>(T), static_cast<int>(D), ip, wp,
                           static_cast<int>(K), views_of(gw).data(), views_of(uw).data(),
                           views_of(dw).data(),                           static_cast<int>(E), limit, y.data<float>());
        }
        return y.obj;
      },
      nb::arg("x"), nb::arg("idx"), nb::arg("w"), nb::arg("gate_ws"), nb::arg("up_ws"),
      nb::arg("down_ws"), nb::kw_only(), nb::arg("limit"), nb::arg("engine").none() = nb::none(),
      "Routed experts: y[t] = sum_j w[t, j] * expert_{idx[t, j]}(x[t]), each expert the clamped "
      "SwiGLU MLP; per token the terms are added in ascending expert id. The shared expert is "
      "NOT included (add swiglu_mlp of it).\n\nx [T, D] float32; idx [T, k] int32 in [0, E); "
      "w [T, k] float32. Returns y [T, D] float32.\n"
      "engine: None or a CPU Engine: gate_ws, up_ws: lists of E memra.Weight [I, D]; down_ws: E "
      "memra.Weight [D, I]; host arrays.\nA CUDA Engine: gate_ws, up_ws: one stacked "
      "memra.DeviceWeight [E, I, D] each, down_ws one [E, D, I], all of one dtype (float32 or "
      "bfloat16); arrays on its device. The ids are copied to the host for the range check (one "
      "synchronisation). Kernels read the stacked weights directly: T == 1 one warp per expert "
      "row and token slot; T >= 2 grouped by expert (each selected expert's weights are read "
      "once per call, its tokens staged in shared memory), bit-identical to running the rows one "
      "at a time. Activations stay float32 (bfloat16 weights are widened, x is not rounded), so "
      "only the dot products' summation order differs from the CPU.\n"
      "Raises ContractError (CONTRACT_RANGE for an expert id outside [0, E); CONTRACT_SHAPE for "
      "a mismatched list or weight; CONTRACT_DTYPE, CONTRACT_STRIDE, CONTRACT_DEVICE; "
      "CONTRACT_VALUE for limit <= 0).\nReference: transformers Glm5NextTextExperts.forward.");

  m.def(
      "sample",
      [](const AnyArray& logits, const AnyArray& counters, float temperature, int top_k,
         float top_p, uint64_t seed, std::optional<AnyArray> seeds, const Engine* engine) {
        const char* op = "sample";
        const float* lp = f32_in(engine, logits, op, "logits", {-1, -1});
        const int64_t B = dim(logits, 0), V = dim(logits, 1);
        if (B > INT_MAX || V > INT_MAX) {  // the kernels and the CPU op index rows and ids in int
          raise_contract(kContractShape, "sample: logits of shape " + shape_str(logits) +
                                             " exceed 2^31 - 1 rows or columns");
        }
        check_value(V >= 1, op, "logits must have at least one column");
        check_value(std::isfinite(temperature), op,
                    "temperature must be finite (<= 0: greedy), got " + std::to_string(temperature));
        check_nonneg(top_k, op, "top_k");
        check_value(top_p > 0.0f, op, "top_p must be > 0, got " + std::to_string(top_p));
        if (on_cuda(engine)) {
          const uint64_t* cp = u64_in(engine, counters, op, "counters", {B});
          const uint64_t* sp = seeds ? u64_in(engine, *seeds, op, "seeds", {B}) : nullptr;
          Out out = out_i32(engine, {sz(B)});
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine,
                     c.api().sample(c.ctx(), lp, int(B), int(V), temperature, top_k, top_p, seed,
                                    sp, cp, out.data<int32_t>()),
                     op);
          return out.obj;
        }
        std::vector<uint64_t> ctr = counter_arg(counters, op, "counters", B);
        std::vector<uint64_t> row_seeds;
        if (seeds) row_seeds = counter_arg(*seeds, op, "seeds", B);
        Out out = out_i32(engine, {sz(B)});
        {
          nb::gil_scoped_release nogil;
          if (row_seeds.empty()) {
            cpu::sample(lp, static_cast<int>(B), static_cast<int>(V), temperature, top_k, top_p,
                        seed, ctr.data(), out.data<int32_t>());
          } else {
            // One row at a time with its own seed (cpu::sample takes one seed per call).
            for (int64_t b = 0; b < B; ++b) {
              cpu::sample(lp + b * V, 1, static_cast<int>(V), temperature, top_k, top_p,
                          row_seeds[size_t(b)], ctr.data() + b, out.data<int32_t>() + b);
            }
          }
        }
        return out.obj;
      },
      nb::arg("logits"), nb::arg("counters"), nb::kw_only(), nb::arg("temperature"),
      nb::arg("top_k") = 0, nb::arg("top_p") = 1.0f, nb::arg("seed") = 0,
      nb::arg("seeds").none() = nb::none(), nb::arg("engine").none() = nb::none(),
      "One token per row.\n\nlogits [B, V] float32; counters [B], the per-row draw index; seeds "
      "[B] (same dtype rules as counters), when given, the per-row seed replacing `seed`. "
      "temperature <= 0: argmax (ties to the lower id; a NaN never wins unless it sits at id 0, "
      "which then keeps the row: the CPU scan's v[i] > v[best]). Otherwise "
      "softmax(logits / temperature) in f32; keep the top_k most likely (0: all), then the "
      "shortest prefix in (p desc, id asc) order whose top-k-renormalised mass reaches top_p "
      "(>= 1: all); draw by inverse CDF with u = uniform_from_counter(seed, counter) (splitmix64; "
      "the exact formula is in ops.h). Every sum (the softmax denominator, the top-k mass, the "
      "running top-p mass and CDF) is an f32 sum in ops.h's blocked order: blocks of 512 terms "
      "each summed left to right, then the block sums left to right; the running sum at i is "
      "the sum of the blocks before i's plus i's block up to i. Returns int32 [B].\n"
      "engine: None or a CPU Engine: host arrays, counters uint64 or int64 (>= 0). A CUDA "
      "Engine: arrays on its device, counters uint64; the same f32 arithmetic as the CPU "
      "(glibc's expf reproduced bit for bit, the same blocked sums, the blocks summed in "
      "parallel), so the same seed and counter give the same token.\n"
      "Raises ContractError (CONTRACT_DTYPE for counters not int64/uint64 (uint64 on CUDA) or "
      "logits not float32, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE, CONTRACT_RANGE for "
      "a negative int64 counter, CONTRACT_VALUE for top_p <= 0 or NaN, top_k < 0 or a "
      "temperature that is not finite).\n"
      "Reference: transformers' temperature / TopK / TopP logits warpers followed by "
      "multinomial, with a counter-based draw.");

  m.def(
      "uniform_from_counter",
      [](uint64_t seed, uint64_t counter) { return cpu::uniform_from_counter(seed, counter); },
      nb::arg("seed"), nb::arg("counter"),
      "The counter-based uniform in [0, 1) that sample draws with (exact formula in ops.h).");
}

}  // namespace memra::py
