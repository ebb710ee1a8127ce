// memra::op for the basic area: the one CPU / CUDA choice per op (op/backend.h). The CPU branch
// checks the scalars and arrays the CUDA entry checks, in its order and with its codes, then runs
// the memra::cpu reference.
#include "memra/op/basic.h"

#include <algorithm>
#include <string>
#include <vector>

#include "memra/cpu/basic.h"

namespace memra::op {

namespace {

Status refuse(int code, const char* op, const char* what) {
  return Status(code, std::string(op) + ": " + what);
}

const CudaApi& api(const Backend& b) { return b.cuda->api(); }

// cpu::rope_interleaved's refusal, which names the odd d_rope (the CUDA entry returns the bare
// code).
Status odd_rope(int d_rope) {
  return Status(kContractOddRope, "rope_interleaved: d_rope must be even (interleaved pairs "
                                  "(2j, 2j+1) are rotated), got d_rope=" + std::to_string(d_rope));
}

}  // namespace

Status embedding(const Backend& b, const MemraEmbeddingParams& p) {
  if (b.on_cuda()) return cuda_status(b, api(b).embedding(b.cuda->ctx(), &p), "embedding");
  if (p.T < 0 || p.D < 0 || p.vocab < 0 || p.hc < 1) {
    return Status(kContractValue, "embedding: T, D, vocab must be >= 0 and hc >= 1");
  }
  const WeightView table = host_view(p.table, p.table_dtype, p.vocab, p.D);
  const int64_t D = p.D;
  if (p.hc == 1) {
    cpu::embedding(table, p.ids, p.T, p.out);
    return Status::Ok();
  }
  std::vector<float> rows(static_cast<size_t>(p.T) * D);
  cpu::embedding(table, p.ids, p.T, rows.data());
  for (int64_t t = 0; t < p.T; ++t) {
    for (int j = 0; j < p.hc; ++j) {
      std::copy(rows.data() + t * D, rows.data() + (t + 1) * D, p.out + (t * p.hc + j) * D);
    }
  }
  return Status::Ok();
}

Status rms_norm(const Backend& b, const float* x, int T, int D, const float* w, float eps,
                float* y) {
  const char* op = "rms_norm";
  if (b.on_cuda()) return cuda_status(b, api(b).rms_norm(b.cuda->ctx(), x, T, D, w, eps, y), op);
  if (T < 0 || D < 0) return refuse(kContractValue, op, "T and D must be >= 0");
  if (T == 0 || D == 0) return Status::Ok();
  if (!x || !y) return refuse(kContractMissing, op, "x and y are required");
  cpu::rms_norm(x, T, D, w, eps, y);
  return Status::Ok();
}

Status rms_norm_gated_sigmoid(const Backend& b, const float* x, const float* gate, int T, int D,
                              const float* w, float eps, float* y) {
  const char* op = "rms_norm_gated_sigmoid";
  if (b.on_cuda()) {
    return cuda_status(b, api(b).rms_norm_gated_sigmoid(b.cuda->ctx(), x, gate, T, D, w, eps, y),
                       op);
  }
  if (T < 0 || D < 0) return refuse(kContractValue, op, "T and D must be >= 0");
  if (T == 0 || D == 0) return Status::Ok();
  if (!x || !gate || !w || !y) return refuse(kContractMissing, op, "x, gate, w and y are required");
  cpu::rms_norm_gated_sigmoid(x, gate, T, D, w, eps, y);
  return Status::Ok();
}

Status layer_norm(const Backend& b, const float* x, int T, int D, const float* w,
                  const float* bias, float eps, float* y) {
  const char* op = "layer_norm";
  if (b.on_cuda()) {
    return cuda_status(b, api(b).layer_norm(b.cuda->ctx(), x, T, D, w, bias, eps, y), op);
  }
  if (T < 0 || D < 0) return refuse(kContractValue, op, "T and D must be >= 0");
  if (T == 0 || D == 0) return Status::Ok();
  if (!x || !w || !bias || !y) return refuse(kContractMissing, op, "x, w, bias and y are required");
  cpu::layer_norm(x, T, D, w, bias, eps, y);
  return Status::Ok();
}

Status norm_rows(const Backend& b, const MemraNormRowsParams& p) {
  const char* op = "norm_rows";
  if (b.on_cuda()) return cuda_status(b, api(b).norm_rows(b.cuda->ctx(), &p), op);
  if (p.D0 < 0 || p.D1 < 0 || p.D2 < 0) {
    return refuse(kContractValue, op, "D0, D1, D2 must be >= 0");
  }
  const bool run0 = p.x0 && p.D0 > 0, run1 = p.x1 && p.D1 > 0, run2 = p.x2 && p.D2 > 0;
  if ((run0 && !p.y0) || (run1 && !p.y1) || (run2 && (!p.w2 || !p.b2 || !p.y2))) {
    return refuse(kContractMissing, op, "a row that runs needs its y (row 2 also w2 and b2)");
  }
  if (run0) cpu::rms_norm(p.x0, 1, p.D0, p.w0, p.eps0, p.y0);
  if (run1) cpu::rms_norm(p.x1, 1, p.D1, p.w1, p.eps1, p.y1);
  if (run2) cpu::layer_norm(p.x2, 1, p.D2, p.w2, p.b2, p.eps2, p.y2);
  return Status::Ok();
}

Status l2norm_heads(const Backend& b, float* x, int T, int H, int d, float eps) {
  const char* op = "l2norm_heads";
  if (b.on_cuda()) return cuda_status(b, api(b).l2norm_heads(b.cuda->ctx(), x, T, H, d, eps), op);
  if (T < 0 || H < 0 || d < 0) return refuse(kContractValue, op, "T, H and d must be >= 0");
  if (int64_t(T) * H == 0 || d == 0) return Status::Ok();
  if (!x) return refuse(kContractMissing, op, "x is required");
  cpu::l2norm_heads(x, T, H, d, eps);
  return Status::Ok();
}

Status rope_interleaved(const Backend& b, float* x, const int32_t* positions, int T, int n_vec,
                        int d_rope, float base) {
  const char* op = "rope_interleaved";
  if (b.on_cuda()) {
    const int rc = api(b).rope_interleaved(b.cuda->ctx(), x, positions, T, n_vec, d_rope, base);
    return rc == kContractOddRope ? odd_rope(d_rope) : cuda_status(b, rc, op);
  }
  if (d_rope % 2 != 0) return odd_rope(d_rope);
  if (T < 0 || n_vec < 0 || d_rope < 0) {
    return refuse(kContractValue, op, "T, n_vec and d_rope must be >= 0");
  }
  if (T == 0 || n_vec == 0 || d_rope == 0) return Status::Ok();
  if (!x || !positions) return refuse(kContractMissing, op, "x and positions are required");
  return cpu::rope_interleaved(x, positions, T, n_vec, d_rope, base);
}

Status sigmoid(const Backend& b, const float* x, int64_t n, float* y) {
  const char* op = "sigmoid";
  if (b.on_cuda()) return cuda_status(b, api(b).sigmoid(b.cuda->ctx(), x, n, y), op);
  if (n < 0) return refuse(kContractValue, op, "n must be >= 0");
  if (n == 0) return Status::Ok();
  if (!x || !y) return refuse(kContractMissing, op, "x and y are required");
  cpu::sigmoid(x, n, y);
  return Status::Ok();
}

Status add(const Backend& b, const float* x, const float* y, int64_t n, float* out) {
  if (b.on_cuda()) return cuda_status(b, api(b).add(b.cuda->ctx(), x, y, n, out), "add");
  if (n <= 0) return Status::Ok();
  if (!x || !y || !out) return refuse(kContractMissing, "add", "x, y and out are required");
  cpu::add(x, y, n, out);
  return Status::Ok();
}

Status add_rms_norm(const Backend& b, const float* x, const float* y, int T, int D,
                    const float* w, float eps, float* sum, float* h) {
  if (T < 0 || D < 0) return refuse(kContractValue, "add_rms_norm", "T and D must be >= 0");
  if (b.on_cuda()) {  // one launch (the bytes of the two below)
    const MemraAddRmsNormParams p{x, y, T, D, w, eps, sum, h};
    return cuda_status(b, api(b).add_rms_norm(b.cuda->ctx(), &p), "add_rms_norm");
  }
  MEMRA_TRY(add(b, x, y, int64_t(T) * D, sum));
  return rms_norm(b, sum, T, D, w, eps, h);
}

}  // namespace memra::op
