// memra::op for the MoE area: the one CPU / CUDA choice per op (op/backend.h).
#include "memra/op/moe.h"

#include <algorithm>
#include <string>
#include <vector>

#include "memra/op/mlp.h"
#include "memra/ops.h"

namespace memra::op {

namespace {

Status value_error(const char* op, const std::string& what) {
  return Status(kContractValue, std::string(op) + ": " + what);
}

// The routed sum over the CPU's experts (fields checked by the caller; top_k, I, E >= 1).
void routed_cpu(const MemraMoeForwardParams& p, const HostExperts* experts, float* y) {
  if (experts) {
    cpu::moe_forward(p.x, p.T, p.D, p.topk_idx, p.topk_w, p.top_k, experts->gate, experts->up,
                     experts->down, p.E, p.limit, y);
    return;
  }
  const int64_t E = p.E, I = p.I, D = p.D;
  const WeightView gate = host_view(p.gate_w, p.w_dtype, E * I, D);
  const WeightView up = host_view(p.up_w, p.w_dtype, E * I, D);
  const WeightView down = host_view(p.down_w, p.w_dtype, E * D, I);
  std::vector<WeightView> g, u, d;
  for (int64_t e = 0; e < E; ++e) {
    g.push_back(gate.row_view(e * I, I));
    u.push_back(up.row_view(e * I, I));
    d.push_back(down.row_view(e * D, D));
  }
  cpu::moe_forward(p.x, p.T, p.D, p.topk_idx, p.topk_w, p.top_k, g.data(), u.data(), d.data(),
                   p.E, p.limit, y);
}

}  // namespace

Status moe_route(const Backend& b, const MemraMoeRouteParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().moe_route(b.cuda->ctx(), &p), "moe_route");
  // The CUDA entry's checks, in its order.
  const char* op = "moe_route";
  if (p.T < 0 || p.D < 0 || p.E <= 0) {
    return value_error(op, "need T, D >= 0 and E >= 1, got T=" + std::to_string(p.T) +
                               ", D=" + std::to_string(p.D) + ", E=" + std::to_string(p.E));
  }
  if (p.n_group < 1 || p.E % p.n_group != 0) {
    return value_error(op, "n_group=" + std::to_string(p.n_group) + " must divide the " +
                               std::to_string(p.E) + " experts");
  }
  if (p.topk_group < 1 || p.topk_group > p.n_group) {
    return value_error(op, "topk_group=" + std::to_string(p.topk_group) +
                               " must be in [1, n_group=" + std::to_string(p.n_group) + "]");
  }
  const int64_t kept = static_cast<int64_t>(p.topk_group) * (p.E / p.n_group);
  if (p.top_k < 1 || p.top_k > kept) {
    return value_error(op, "top_k=" + std::to_string(p.top_k) + " must be in [1, " +
                               std::to_string(kept) + "]");
  }
  if (p.scoring != MEMRA_MOE_SCORE_SIGMOID && p.scoring != MEMRA_MOE_SCORE_SOFTMAX) {
    return value_error(op, "scoring=" + std::to_string(p.scoring) + " is not a router form");
  }
  const bool softmax = p.scoring == MEMRA_MOE_SCORE_SOFTMAX;
  if (softmax && (p.n_group != 1 || p.corr_bias)) {
    return value_error(op, "the softmax router takes no groups (n_group=" +
                               std::to_string(p.n_group) + ") and no correction bias");
  }
  if (p.T == 0) return Status::Ok();
  if (!p.x || !p.gate_w || !p.topk_idx || !p.topk_w) {
    return Status(kContractMissing, "moe_route: x, gate_w, topk_idx and topk_w must not be null");
  }
  if (softmax) {
    cpu::moe_route_softmax(p.x, p.T, p.D, host_view(p.gate_w, static_cast<int>(DType::kF32), p.E, p.D),
                           p.E, p.top_k, p.norm_topk_prob != 0, p.scaling, p.topk_idx, p.topk_w);
    return Status::Ok();
  }
  cpu::moe_route(p.x, p.T, p.D, host_view(p.gate_w, static_cast<int>(DType::kF32), p.E, p.D),
                 p.corr_bias, p.E, p.top_k, p.n_group, p.topk_group, p.norm_topk_prob != 0,
                 p.scaling, p.topk_idx, p.topk_w);
  return Status::Ok();
}

Status moe_shared_gate(const Backend& b, const MemraMoeSharedGateParams& p) {
  if (b.on_cuda()) {
    return cuda_status(b, b.cuda->api().moe_shared_gate(b.cuda->ctx(), &p), "moe_shared_gate");
  }
  // The CUDA entry's checks, in its order.
  if (p.T < 0 || p.D < 0) {
    return value_error("moe_shared_gate", "need T, D >= 0, got T=" + std::to_string(p.T) +
                                              ", D=" + std::to_string(p.D));
  }
  if (p.T == 0 || p.D == 0) return Status::Ok();
  if (!p.x || !p.gate_w || !p.shared || !p.routed || !p.y) {
    return Status(kContractMissing,
                  "moe_shared_gate: x, gate_w, shared, routed and y must not be null");
  }
  cpu::moe_shared_gate(p.x, p.T, p.D, p.gate_w, p.shared, p.routed, p.y);
  return Status::Ok();
}

Status moe_forward(const Backend& b, const MemraMoeForwardParams& p,
                   const HostExperts* experts) {
  if (b.on_cuda()) {
    if (experts) {
      return Status(kUnsupportedGeometry,
                    "moe_forward: the CUDA kernels read stacked experts, not per-expert views");
    }
    return cuda_status(b, b.cuda->api().moe_forward(b.cuda->ctx(), &p), "moe_forward");
  }
  // The CUDA entry's checks, in its order (with a shared expert, then without).
  const char* op = "moe_forward";
  const bool shared = p.shared_gate_w || p.shared_up_w || p.shared_down_w;
  if (p.T < 0 || p.D < 0 || p.I < 0 || p.E < 0 || p.top_k < 0 || (shared && p.shared_I < 0)) {
    return value_error(op, "T, D, I, E, top_k (and shared_I) must be >= 0");
  }
  if (p.w_dtype < 0 || p.w_dtype > 2) {
    return Status(kContractDType, "moe_forward: unknown weight dtype code " +
                                      std::to_string(p.w_dtype));
  }
  if (!(p.limit > 0.0f) || (shared && !(p.shared_limit > 0.0f))) {
    return value_error(op, "limit (and shared_limit) must be > 0");
  }
  if (p.T == 0 || p.D == 0) return Status::Ok();
  if (!p.x || !p.y || (shared && (!p.shared_gate_w || !p.shared_up_w || !p.shared_down_w))) {
    return Status(kContractMissing, "moe_forward: x, y (and all three shared weights) must not "
                                    "be null");
  }
  const size_t n = static_cast<size_t>(p.T) * p.D;
  std::vector<float> routed(shared ? n : 0);
  float* ry = shared ? routed.data() : p.y;
  if (p.top_k == 0 || p.I == 0 || p.E == 0) {  // no term (or only empty sums): 0
    std::fill(ry, ry + n, 0.0f);
  } else {
    if (!p.topk_idx || !p.topk_w || (!experts && (!p.gate_w || !p.up_w || !p.down_w))) {
      return Status(kContractMissing, "moe_forward: topk_idx, topk_w and the weights must not "
                                      "be null");
    }
    routed_cpu(p, experts, ry);
  }
  if (!shared) return Status::Ok();
  MemraMlpParams mlp{};
  mlp.x = p.x;
  mlp.T = p.T;
  mlp.D = p.D;
  mlp.gate_w = p.shared_gate_w;
  mlp.up_w = p.shared_up_w;
  mlp.down_w = p.shared_down_w;
  mlp.w_dtype = p.w_dtype;
  mlp.I = p.shared_I;
  mlp.limit = p.shared_limit;
  mlp.add = routed.data();
  mlp.y = p.y;
  return swiglu_mlp(b, mlp);
}

}  // namespace memra::op
