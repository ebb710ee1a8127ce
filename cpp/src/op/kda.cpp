// memra::op for the KDA area: the one CPU / CUDA choice per op (op/backend.h, op/kda.h). The CPU
// branches check the fields the CUDA entries check, in the same order and with the same codes,
// except what only the CUDA kernels limit (conv kernel widths, the scan's head size).
#include "memra/op/kda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "memra/ops.h"
#include "memra/tensor.h"

namespace memra::op {

namespace {

Status refuse(int code, const char* op, const std::string& what) {
  return Status(code, std::string(op) + ": " + what);
}

bool known_form(int form) {
  return form == MEMRA_KDA_PLANES_DIRECT || form == MEMRA_KDA_PLANES_TABLES ||
         form == MEMRA_KDA_PLANES_SLOTS;
}

// y in its channel groups of width G from the plain [rows, C] layout: (r, c) at
// y[(c / G) * rows * G + r * G + c % G] (MemraKdaConvParams::y).
void scatter_groups(const float* plain, int64_t rows, int64_t C, int64_t G, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < C; ++c) y[(c / G) * rows * G + r * G + c % G] = plain[r * C + c];
  }
}

}  // namespace

Status kda_conv(const Backend& b, const MemraKdaConvParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().kda_conv(b.cuda->ctx(), &p), "kda_conv");
  const char* op = "kda_conv";
  const MemraKdaPlanes& ring = p.ring;
  const int64_t n = p.n, C = p.C, G = p.G, K = p.K;
  if (!known_form(ring.form)) {
    return refuse(kContractValue, op, "unknown plane form " + std::to_string(ring.form));
  }
  if (n < 0 || C < 0 || (C > 0 && (G < 1 || C % G != 0))) {
    return refuse(kContractShape, op, "n, C must be >= 0 and C a multiple of G >= 1");
  }
  if (p.l2_groups > 0 && (p.dk < 1 || G % p.dk != 0 || p.l2_groups * G > C)) {
    return refuse(kContractShape, op, "l2_groups groups of G channels must be heads of dk");
  }
  if (K < 1) return refuse(kContractValue, op, "K must be >= 1");
  if (ring.form == MEMRA_KDA_PLANES_SLOTS || p.pair.run) {
    return refuse(kUnsupportedGeometry, op, "the SLOTS planes and the GEMV pair are CUDA-only");
  }
  const bool direct = ring.form == MEMRA_KDA_PLANES_DIRECT;
  const int64_t plane = C * (K - 1);
  const std::vector<float> zeros(static_cast<size_t>(plane), 0.0f);
  if (C == 0) return Status::Ok();
  if (n == 0) {  // DIRECT: the reference's ring pass-through (op/kda.h); the decode forms: nothing
    if (direct && ring.out) std::copy_n(ring.in ? ring.in : zeros.data(), plane, ring.out);
    return Status::Ok();
  }
  // At K = 1 the ring has no columns: nothing is written to it, so none need be given.
  if (!p.x || !p.w || !p.y || (direct ? plane > 0 && !ring.out : !ring.out_table)) {
    return refuse(kContractMissing, op, "x, w, y and the output ring are required");
  }
  std::vector<float> plain(G == C ? 0 : static_cast<size_t>(n * C));
  float* yp = G == C ? p.y : plain.data();
  if (direct) {
    cpu::kda_conv_prefill(p.x, p.n, p.C, p.w, p.K, ring.in ? ring.in : zeros.data(), ring.out, yp);
  } else {
    std::vector<float> sink(static_cast<size_t>(plane));
    for (int64_t r = 0; r < n; ++r) {
      const float* in = ring.in_table ? ring.in_table[r] : nullptr;
      float* out = ring.out_table[r];
      cpu::kda_conv_decode(p.x + r * C, p.C, p.w, p.K, in ? in : zeros.data(),
                           out ? out : sink.data(), yp + r * C);
    }
  }
  if (G != C) scatter_groups(plain.data(), n, C, G, p.y);
  if (p.l2_groups > 0) {
    cpu::l2norm_heads(p.y, static_cast<int>(p.l2_groups * n), static_cast<int>(G / p.dk), p.dk,
                      p.eps);
  }
  return Status::Ok();
}

Status kda_gate(const Backend& b, const MemraKdaGateParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().kda_gate(b.cuda->ctx(), &p), "kda_gate");
  const char* op = "kda_gate";
  if (p.form != 0 && p.form != 1) {
    return refuse(kContractValue, op, "form must be 0 or 1, got " + std::to_string(p.form));
  }
  if (p.T < 0 || p.H < 0 || p.dk < 0) return refuse(kContractShape, op, "T, H, dk must be >= 0");
  if (p.T > 0 && int64_t(p.H) * p.dk > 0) {
    if (!p.f || !p.dt_bias || !p.A_log || !p.g) {
      return refuse(kContractMissing, op, "f, dt_bias, A_log and g are required");
    }
  }
  if (p.nbeta < 0 || (p.nbeta > 0 && !p.beta)) {
    return refuse(kContractValue, op, "nbeta must be >= 0, with beta when > 0");
  }
  if (p.T > 0 && int64_t(p.H) * p.dk > 0) {
    cpu::kda_gate(p.f, p.dt_bias, p.A_log, p.T, p.H, p.dk, static_cast<cpu::KdaGateForm>(p.form),
                  p.lower_bound, p.g);
  }
  // beta's sigmoid, as memra_cuda_sigmoid and KdaLayer's reference write it.
  for (int64_t i = 0; i < p.nbeta; ++i) p.beta[i] = 1.0f / (1.0f + std::exp(-p.beta[i]));
  return Status::Ok();
}

Status kda_scan(const Backend& b, const MemraKdaScanParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().kda_scan(b.cuda->ctx(), &p), "kda_scan");
  const char* op = "kda_scan";
  const MemraKdaPlanes& st = p.state;
  if (p.in_dtype != 0 && p.in_dtype != 1) {
    return refuse(kContractValue, op, "in_dtype (q, k, v, g) must be 0 (f32) or 1 (bf16), got " +
                                          std::to_string(p.in_dtype));
  }
  if (p.o_dtype != 0 && p.o_dtype != 1) {
    return refuse(kContractValue, op, "o_dtype must be 0 (f32) or 1 (bf16), got " +
                                          std::to_string(p.o_dtype));
  }
  if (st.form != MEMRA_KDA_PLANES_TABLES && st.form != MEMRA_KDA_PLANES_SLOTS &&
      st.form != MEMRA_KDA_PLANES_STRIDED) {
    return refuse(kContractValue, op, "the state planes must be TABLES, STRIDED or SLOTS, got "
                                      "form " + std::to_string(st.form));
  }
  if (st.form == MEMRA_KDA_PLANES_SLOTS || p.fuse_gates || p.fuse_norm) {
    return refuse(kUnsupportedGeometry, op, "the SLOTS planes and the fused gates / norm are "
                                            "CUDA-only");
  }
  if (p.B < 0 || p.T < 0 || p.H < 0 || p.dk < 1 || p.dv < 1) {
    return refuse(kContractShape, op, "B, T, H must be >= 0 and dk, dv >= 1");
  }
  if (p.beta_ld != 0 && p.beta_ld != p.H) {
    return refuse(kContractValue, op, "beta_ld (a row stride of beta) is for the fused gates "
                                      "only; contiguous beta is 0 or H");
  }
  if (p.B == 0 || p.H == 0) return Status::Ok();
  const bool strided = st.form == MEMRA_KDA_PLANES_STRIDED;
  // T == 0 reads none of the step inputs: the reference writes state_out alone (op/kda.h).
  if (!(strided ? st.out != nullptr : st.out_table != nullptr) ||
      (p.T > 0 && (!p.q || !p.k || !p.v || !p.g || !p.beta || !p.o))) {
    return refuse(kContractMissing, op, "q, k, v, g, beta, o and the output state are required");
  }
  const int64_t T = p.T, H = p.H, dk = p.dk, dv = p.dv;
  if (strided && st.floats < H * dk * dv) {
    return refuse(kContractValue, op, "the STRIDED planes' stride is shorter than a plane");
  }
  const int64_t seq_qk = T * H * dk, seq_o = T * H * dv, seq_b = T * H;
  std::vector<float> sink;
  // Sequence s's part of an input as f32: in place, or bf16 widened (exactly) into `w`.
  std::vector<float> wq, wk, wv, wg;
  auto in = [&](const void* base, int64_t s, int64_t n, std::vector<float>& w) -> const float* {
    if (p.in_dtype == 0) return static_cast<const float*>(base) + s * n;
    const uint16_t* src = static_cast<const uint16_t*>(base) + s * n;
    w.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) w[size_t(i)] = bf16_to_f32(src[i]);
    return w.data();
  };
  // bf16 o: the reference's f32 o, rounded to nearest even once the sequence is done.
  std::vector<float> wo(p.o_dtype == 1 ? static_cast<size_t>(seq_o) : 0);
  auto narrow = [&](int64_t s) {
    if (p.o_dtype == 0) return;
    uint16_t* dst = static_cast<uint16_t*>(p.o) + s * seq_o;
    for (int64_t i = 0; i < seq_o; ++i) dst[i] = f32_to_bf16(wo[size_t(i)]);
  };
  for (int64_t s = 0; s < p.B; ++s) {
    float* o = p.o_dtype == 0 ? static_cast<float*>(p.o) + s * seq_o : wo.data();
    const float* q = p.T > 0 ? in(p.q, s, seq_qk, wq) : nullptr;
    const float* k = p.T > 0 ? in(p.k, s, seq_qk, wk) : nullptr;
    const float* v = p.T > 0 ? in(p.v, s, seq_o, wv) : nullptr;
    const float* g = p.T > 0 ? in(p.g, s, seq_qk, wg) : nullptr;
    if (strided) {
      cpu::kda_scan(q, k, v, g, p.beta + s * seq_b, p.T, p.H, p.dk, p.dv, p.scale,
                    st.in ? st.in + s * st.floats : nullptr, st.out + s * st.floats, o);
      narrow(s);
      continue;
    }
    float* out = st.out_table[s];
    if (!out) {
      sink.resize(static_cast<size_t>(H * dk * dv));
      out = sink.data();
    }
    cpu::kda_scan(q, k, v, g, p.beta + s * seq_b, p.T, p.H, p.dk, p.dv, p.scale,
                  st.in_table ? st.in_table[s] : nullptr, out, o);
    narrow(s);
  }
  return Status::Ok();
}

Status kda_tables(const Backend& b, const MemraKdaTablesParams& p) {
  if (!b.on_cuda()) {
    return Status(kUnsupported, "kda_tables: a CUDA engine's decode tables (the CPU backend names "
                                "its planes on the host)");
  }
  return cuda_status(b, b.cuda->api().kda_tables(b.cuda->ctx(), &p), "kda_tables");
}

}  // namespace memra::op
