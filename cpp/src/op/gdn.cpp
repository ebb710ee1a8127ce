// memra::op for the Gated DeltaNet area: the one CPU / CUDA choice per op (op/backend.h). The CPU
// branches check what the CUDA entries check, with the same codes, then run memra::cpu.
#include "memra/op/gdn.h"

#include <string>
#include <vector>

#include "memra/cpu/gdn.h"

namespace memra::op {

namespace {

std::string num(int64_t v) { return std::to_string(v); }

}  // namespace

Status gdn_gate(const Backend& b, const MemraGdnGateParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().gdn_gate(b.cuda->ctx(), &p), "gdn_gate");
  if (p.T < 0 || p.H < 0 || p.lda < p.H || p.ldb < p.H) {
    return Status(kContractShape, "gdn_gate: T, H must be >= 0 and lda, ldb >= H, got T=" +
                                      num(p.T) + " H=" + num(p.H) + " lda=" + num(p.lda) +
                                      " ldb=" + num(p.ldb));
  }
  if (p.T == 0 || p.H == 0) return Status::Ok();
  if (!p.a || !p.b || !p.dt_bias || !p.A_log || !p.g || !p.beta) {
    return Status(kContractMissing, "gdn_gate: a, b, dt_bias, A_log, g and beta are required");
  }
  cpu::gdn_gate(p.a, p.lda, p.b, p.ldb, p.dt_bias, p.A_log, p.T, p.H, p.g, p.beta);
  return Status::Ok();
}

Status gdn_l2norm(const Backend& b, float* x, int rows, int heads, int d, int64_t ld, float eps) {
  if (b.on_cuda()) {
    return cuda_status(b, b.cuda->api().gdn_l2norm(b.cuda->ctx(), x, rows, heads, d, ld, eps),
                       "gdn_l2norm");
  }
  if (rows < 0 || heads < 0 || d < 1 || ld < int64_t(heads) * d) {
    return Status(kContractShape, "gdn_l2norm: rows, heads must be >= 0, d >= 1 and ld >= heads*d, "
                                  "got rows=" + num(rows) + " heads=" + num(heads) + " d=" +
                                      num(d) + " ld=" + num(ld));
  }
  if (rows == 0 || heads == 0) return Status::Ok();
  if (!x) return Status(kContractMissing, "gdn_l2norm: x is required");
  cpu::gdn_l2norm(x, rows, heads, d, ld, eps);
  return Status::Ok();
}

Status gdn_l2norm_gate(const Backend& b, float* x, int rows, int heads, int d, int64_t ld,
                       float eps, const MemraGdnGateParams& p) {
  if (b.on_cuda()) {
    return cuda_status(
        b, b.cuda->api().gdn_l2norm_gate(b.cuda->ctx(), x, rows, heads, d, ld, eps, &p),
        "gdn_l2norm_gate");
  }
  MEMRA_TRY(gdn_l2norm(b, x, rows, heads, d, ld, eps));
  return gdn_gate(b, p);
}

Status gdn_scan(const Backend& b, const MemraGdnScanParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().gdn_scan(b.cuda->ctx(), &p), "gdn_scan");
  if (p.B < 0 || p.T < 0 || p.Hk < 1 || p.Hv < 1 || p.Hv % p.Hk != 0 || p.dk < 1 || p.dv < 1 ||
      p.qk_ld < int64_t(p.Hk) * p.dk || p.v_ld < int64_t(p.Hv) * p.dv) {
    return Status(kContractShape,
                  "gdn_scan: needs B, T >= 0, Hk, Hv >= 1 with Hv a multiple of Hk, dk, dv >= 1, "
                  "qk_ld >= Hk*dk and v_ld >= Hv*dv, got B=" + num(p.B) + " T=" + num(p.T) +
                      " Hk=" + num(p.Hk) + " Hv=" + num(p.Hv) + " dk=" + num(p.dk) + " dv=" +
                      num(p.dv) + " qk_ld=" + num(p.qk_ld) + " v_ld=" + num(p.v_ld));
  }
  if (p.B == 0 || p.T == 0) return Status::Ok();
  if (!p.q || !p.k || !p.v || !p.g || !p.beta || !p.state_out || !p.o) {
    return Status(kContractMissing, "gdn_scan: q, k, v, g, beta, state_out and o are required");
  }
  const int64_t plane = int64_t(p.Hv) * p.dk * p.dv, rows = p.T;
  std::vector<float> sink;  // a null output entry: the sequence runs, its state is dropped
  for (int s = 0; s < p.B; ++s) {
    const int64_t n0 = s * rows;  // first row of sequence s
    float* out = p.state_out[s];
    if (!out) {
      sink.resize(size_t(plane));
      out = sink.data();
    }
    cpu::gdn_scan(p.q + n0 * p.qk_ld, p.k + n0 * p.qk_ld, p.qk_ld, p.v + n0 * p.v_ld, p.v_ld,
                  p.g + n0 * p.Hv, p.beta + n0 * p.Hv, p.T, p.Hk, p.Hv, p.dk, p.dv, p.scale,
                  p.state_in ? p.state_in[s] : nullptr, out, p.o + n0 * p.Hv * p.dv);
  }
  return Status::Ok();
}

Status rms_norm_gated_silu(const Backend& b, const float* x, const float* gate, int T, int D,
                           const float* w, float eps, float* y) {
  if (b.on_cuda()) {
    return cuda_status(b, b.cuda->api().rms_norm_gated_silu(b.cuda->ctx(), x, gate, T, D, w, eps, y),
                       "rms_norm_gated_silu");
  }
  if (T < 0 || D < 0) {
    return Status(kContractValue, "rms_norm_gated_silu: T and D must be >= 0, got T=" + num(T) +
                                      " D=" + num(D));
  }
  if (T == 0 || D == 0) return Status::Ok();
  if (!x || !gate || !w || !y) {
    return Status(kContractMissing, "rms_norm_gated_silu: x, gate, w and y are required");
  }
  cpu::rms_norm_gated_silu(x, gate, T, D, w, eps, y);
  return Status::Ok();
}

}  // namespace memra::op
