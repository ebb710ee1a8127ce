// The functional bindings of the MoE router and routed experts over DLPack arrays:
// memra::op::moe_route / moe_forward (op/moe.h) on the CPU reference (cpu/moe.cpp) or, with
// keyword `engine` = a CUDA Engine, the CUDA library (cuda/moe_*.cu, cuda_abi/moe.h). Every
// function checks its arguments (ContractError naming the op and the values) before anything
// runs, allocates its outputs on the engine's device and, on the CPU, releases the GIL while
// computing.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/msg.h"
#include "memra/op/moe.h"
#include "nogil.h"

namespace memra::py {

namespace {

// A DeviceWeight's exact shape (2-D [rows, cols] or stacked [n, rows, cols]).
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

// An expert id outside [0, E) is a ContractError naming its place (ids [T, K], host memory).
void check_ids(const int32_t* ids, int64_t T, int64_t K, int64_t E, const char* op) {
  for (int64_t r = 0; r < T * K; ++r) {
    if (ids[r] < 0 || ids[r] >= E) {
      raise_contract(kContractRange, std::string(op) + ": expert id " + std::to_string(ids[r]) +
                                         " at idx[" + std::to_string(r / K) + ", " +
                                         std::to_string(r % K) + "] is outside [0, " +
                                         std::to_string(E) + ")");
    }
  }
}

size_t sz(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

void init_ops_moe(nb::module_& m) {
  m.def(
      "moe_route",
      [](const AnyArray& x, nb::handle gate_w, std::optional<AnyArray> corr_bias, int top_k,
         int n_group, int topk_group, bool norm_topk_prob, float scaling,
         const std::string& scoring, const Engine* engine) {
        const char* op = "moe_route";
        int score = MEMRA_MOE_SCORE_SIGMOID;
        if (scoring == "softmax") {
          score = MEMRA_MOE_SCORE_SOFTMAX;
        } else if (scoring != "sigmoid") {
          raise_contract(kContractValue, std::string(op) + ": scoring must be 'sigmoid' or "
                                                           "'softmax', got '" + scoring + "'");
        }
        const float* xp = f32_in(engine, x, op, "x", {-1, -1});
        const int64_t T = dim(x, 0), D = dim(x, 1);
        if (D < 1) {
          raise_contract(kContractShape, std::string(op) + ": argument 'x' has shape " +
                                             shape_str(x) + ", the router needs a hidden width "
                                             "D >= 1");
        }
        const float* gp = nullptr;
        Weight router;  // CPU: the router as f32 (MemraMoeRouteParams::gate_w)
        int64_t E = 0;
        if (on_cuda(engine)) {
          const DeviceWeight* dw = &device_weight(engine, gate_w, op, "gate_w");
          E = dw->shape.empty() ? 0 : dw->shape[0];
          check_dweight(*dw, op, "gate_w", {E, D});
          if (dw->dtype != DType::kF32) {
            raise_contract(kContractDType,
                           std::string(op) + ": DeviceWeight 'gate_w' must be float32 (router "
                                             "logits are computed in f32), got " +
                               dtype_name(dw->dtype));
          }
          gp = static_cast<const float*>(dw->data());
        } else {
          router = host_weight(gate_w, op, "gate_w");
          E = router.rows();
          check_weight_2d(router, op, "gate_w", E, D);
          // Read as f32, as the reference reads every dtype (exact).
          if (router.dtype() != DType::kF32) {
            router = Weight(DType::kF32, router.shape(), router.to_f32().data());
          }
          gp = static_cast<const float*>(router.data());
        }
        check_value(E >= 1, op, "gate_w has 0 rows: the router needs at least one expert");
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
        check_value(score != MEMRA_MOE_SCORE_SOFTMAX || (n_group == 1 && !corr_bias), op,
                    "scoring='softmax' takes n_group=1 and no corr_bias, got n_group=" +
                        std::to_string(n_group) + (corr_bias ? " and a corr_bias" : ""));
        Out idx = out_i32(engine, {sz(T), sz(top_k)});
        Out w = out_f32(engine, {sz(T), sz(top_k)});
        MemraMoeRouteParams p{};
        p.x = xp;
        p.T = int(T);
        p.D = int(D);
        p.gate_w = gp;
        p.corr_bias = bp;
        p.E = int(E);
        p.top_k = top_k;
        p.n_group = n_group;
        p.topk_group = topk_group;
        p.norm_topk_prob = norm_topk_prob ? 1 : 0;
        p.scaling = scaling;
        p.topk_idx = idx.data<int32_t>();
        p.topk_w = w.data<float>();
        p.scoring = score;
        {
          std::optional<ReleasedGil> nogil;
          if (!on_cuda(engine)) nogil.emplace();
          check(op::moe_route(backend(engine), p));
        }
        return nb::make_tuple(idx.obj, w.obj);
      },
      nb::arg("x"), nb::arg("gate_w"), nb::arg("corr_bias") = nb::none(), nb::kw_only(),
      nb::arg("top_k"), nb::arg("n_group"), nb::arg("topk_group"), nb::arg("norm_topk_prob"),
      nb::arg("scaling"), nb::arg("scoring") = "sigmoid", nb::arg("engine").none() = nb::none(),
      "The MoE router: the sigmoid router with grouped selection (scoring='sigmoid'), or the "
      "softmax router (scoring='softmax': p = softmax of the f32 logits, the top_k experts by p "
      "(ties: lower id), weights = p of those, / their sum when norm_topk_prob, times scaling; "
      "n_group must be 1 and corr_bias None; reference: Qwen3_5MoeTopKRouter / "
      "Qwen3NextTopKRouter).\n\nSigmoid form: x [T, D] float32; gate_w [E, D]; "
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
      "scaling not finite, a scoring other than the two, or scoring='softmax' with groups or a "
      "corr_bias).\n"
      "Reference: transformers Glm5NextTextTopkRouter.forward.");

  m.def(
      "moe_shared_gate",
      [](const AnyArray& x, const AnyArray& gate_w, const AnyArray& shared, const AnyArray& routed,
         const Engine* engine) {
        const char* op = "moe_shared_gate";
        const float* xp = f32_in(engine, x, op, "x", {-1, -1});
        const int64_t T = dim(x, 0), D = dim(x, 1);
        const float* gp = f32_in(engine, gate_w, op, "gate_w", {D});
        const float* sp = f32_in(engine, shared, op, "shared", {T, D});
        const float* rp = f32_in(engine, routed, op, "routed", {T, D});
        Out y = out_f32(engine, {sz(T), sz(D)});
        MemraMoeSharedGateParams p{};
        p.x = xp;
        p.T = int(T);
        p.D = int(D);
        p.gate_w = gp;
        p.shared = sp;
        p.routed = rp;
        p.y = y.data<float>();
        {
          std::optional<ReleasedGil> nogil;
          if (!on_cuda(engine)) nogil.emplace();
          check(op::moe_shared_gate(backend(engine), p));
        }
        return y.obj;
      },
      nb::arg("x"), nb::arg("gate_w"), nb::arg("shared"), nb::arg("routed"), nb::kw_only(),
      nb::arg("engine").none() = nb::none(),
      "The Qwen MoE's shared-expert gate: y[t] = routed[t] + sigmoid(x[t] . gate_w) * "
      "shared[t].\n\nx [T, D] float32 (the MoE block's input); gate_w [D] float32 "
      "(shared_expert_gate.weight's row); shared [T, D] float32 (the shared expert's output); "
      "routed [T, D] float32 (the routed experts' sum). Returns y [T, D] float32. The dot product "
      "in f32 (CUDA: its own summation order), sigmoid 1 / (1 + exp(-g)), then one rounded "
      "product and one rounded sum per element.\nengine: None or a CPU Engine (host arrays) or "
      "a CUDA Engine (arrays on its device).\nRaises ContractError (CONTRACT_DTYPE, "
      "CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE).\nReference: transformers "
      "Qwen3_5MoeSparseMoeBlock.forward (F.sigmoid(shared_expert_gate(x)) * shared_expert(x) "
      "+ the experts' output).");


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
        MemraMoeForwardParams p{};
        std::vector<Weight> gw, uw, dw;        // CPU: the experts as given, one weight each
        std::vector<WeightView> gv, uv, dv;
        op::HostExperts experts;
        int64_t E = 0, I = 0;
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
          E = g.shape[0];
          I = g.shape[1];
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
          check_ids(host_ids.data(), T, K, E, op);
          p.gate_w = g.data();
          p.up_w = u.data();
          p.down_w = d.data();
          p.w_dtype = g.dtype_code();
        } else {
          gw = host_weight_list(gate_ws, op, "gate_ws");
          uw = host_weight_list(up_ws, op, "up_ws");
          dw = host_weight_list(down_ws, op, "down_ws");
          E = static_cast<int64_t>(gw.size());
          if (E == 0 || static_cast<int64_t>(uw.size()) != E ||
              static_cast<int64_t>(dw.size()) != E) {
            raise_contract(kContractShape,
                           std::string(op) + ": gate_ws, up_ws, down_ws must be non-empty lists " +
                               "of one weight per expert, got " + std::to_string(gw.size()) +
                               ", " + std::to_string(uw.size()) + ", " + std::to_string(dw.size()));
          }
          I = gw[0].rows();
          for (int64_t e = 0; e < E; ++e) {
            const std::string g = "gate_ws[" + std::to_string(e) + "]",
                              u = "up_ws[" + std::to_string(e) + "]",
                              d = "down_ws[" + std::to_string(e) + "]";
            check_weight_2d(gw[sz(e)], op, g.c_str(), I, D);
            check_weight_2d(uw[sz(e)], op, u.c_str(), I, D);
            check_weight_2d(dw[sz(e)], op, d.c_str(), D, I);
          }
          check_ids(ip, T, K, E, op);
          check_value(limit > 0.0f, op, "limit must be > 0, got " + std::to_string(limit));
          gv = views_of(gw);
          uv = views_of(uw);
          dv = views_of(dw);
          experts = op::HostExperts{gv.data(), uv.data(), dv.data()};
          p.w_dtype = static_cast<int>(gw[0].dtype());
        }
        Out y = out_f32(engine, {sz(T), sz(D)});
        p.x = xp;
        p.T = int(T);
        p.D = int(D);
        p.topk_idx = ip;
        p.topk_w = wp;
        p.top_k = int(K);
        p.E = int(E);
        p.I = int(I);
        p.limit = limit;
        p.y = y.data<float>();
        {
          std::optional<ReleasedGil> nogil;
          if (!on_cuda(engine)) nogil.emplace();
          check(op::moe_forward(backend(engine), p, on_cuda(engine) ? nullptr : &experts));
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
}

}  // namespace memra::py
