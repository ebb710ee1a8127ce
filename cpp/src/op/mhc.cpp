// memra::op for mHC: the one CPU / CUDA choice (op/backend.h). The CPU branch checks
// MemraMhcParams as the CUDA entry does (cuda/mhc_site.cu: the form, then each form's values,
// dtype and arrays in the order of its entry) and chains the memra::cpu reference ops.
#include "memra/op/mhc.h"

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "memra/cpu/basic.h"
#include "memra/cpu/mhc.h"

namespace memra::op {

namespace {

Status refuse(int code, const char* what) { return Status(code, std::string("mhc: ") + what); }

bool bad_eps(float eps) { return !(eps >= 0.0f && eps <= FLT_MAX); }

// pre [+ norm] of streams on the CPU (fields checked by the caller's form).
Status pre_cpu(const MemraMhcParams& p, const float* streams, bool norm) {
  if (norm && bad_eps(p.rms_eps)) return refuse(kContractValue, "rms_eps must be finite and >= 0");
  if (p.T < 0 || p.D < 0 || p.hc < 1 || p.sinkhorn_iters < 1) {
    return refuse(kContractValue, "T, D must be >= 0, hc and sinkhorn_iters >= 1");
  }
  if (p.fn_dtype < 0 || p.fn_dtype > 2) return refuse(kContractDType, "fn_dtype must be 0, 1 or 2");
  const int64_t flat = int64_t(p.hc) * p.D;
  if (flat > INT_MAX) return refuse(kContractValue, "hc * D must be < 2^31");
  if (p.T == 0) return Status::Ok();
  if (p.D == 0) return refuse(kContractValue, "the stream width D must be >= 1 for T >= 1, got 0");
  if (!streams || !p.fn || !p.base || !p.scale || !p.post || !p.comb || !p.out) {
    return refuse(kContractMissing, "streams, fn, base, scale, post, comb and out are required");
  }
  const WeightView fn = host_view(p.fn, p.fn_dtype, (int64_t(p.hc) + 2) * p.hc, flat);
  cpu::mhc_pre(streams, p.T, p.hc, p.D, fn, p.base, p.scale, p.sinkhorn_iters, p.hc_eps,
               p.norm_eps, p.post, p.comb, p.out);
  if (norm) cpu::rms_norm(p.out, p.T, p.D, p.rms_w, p.rms_eps, p.out);
  return Status::Ok();
}

// expand alone on the CPU.
Status post_cpu(const MemraMhcParams& p) {
  if (p.T < 0 || p.hc < 0 || p.D < 0) return refuse(kContractValue, "T, hc and D must be >= 0");
  if (int64_t(p.T) * p.hc == 0 || p.D == 0) return Status::Ok();
  if (!p.y || !p.post_prev || !p.comb_prev || !p.residual || !p.streams_out) {
    return refuse(kContractMissing, "y, post_prev, comb_prev, residual, streams_out are required");
  }
  cpu::mhc_post(p.y, p.post_prev, p.comb_prev, p.residual, p.T, p.hc, p.D, p.streams_out);
  return Status::Ok();
}

// expand + pre + norm on the CPU.
Status post_pre_cpu(const MemraMhcParams& p) {
  if (p.T < 0 || p.D < 0 || p.hc < 1 || p.sinkhorn_iters < 1) {
    return refuse(kContractValue, "T, D must be >= 0, hc and sinkhorn_iters >= 1");
  }
  if (bad_eps(p.rms_eps)) return refuse(kContractValue, "rms_eps must be finite and >= 0");
  if (int64_t(p.hc) * p.D > INT_MAX) return refuse(kContractValue, "hc * D must be < 2^31");
  if (p.T == 0) return Status::Ok();
  if (!p.y || !p.post_prev || !p.comb_prev || !p.residual || !p.streams_out) {
    return refuse(kContractMissing, "y, post_prev, comb_prev, residual, streams_out are required");
  }
  const size_t bytes = sizeof(float) * static_cast<size_t>(p.T) * p.hc * p.D;
  const uintptr_t o0 = reinterpret_cast<uintptr_t>(p.streams_out);
  const uintptr_t r0 = reinterpret_cast<uintptr_t>(p.residual);
  if (bytes > 0 && o0 < r0 + bytes && r0 < o0 + bytes) {
    return refuse(kContractValue, "streams_out overlaps residual");
  }
  cpu::mhc_post(p.y, p.post_prev, p.comb_prev, p.residual, p.T, p.hc, p.D, p.streams_out);
  return pre_cpu(p, p.streams_out, true);
}

// expand + head + norm on the CPU.
Status head_cpu(const MemraMhcParams& p) {
  if (p.T < 0 || p.hc < 1 || p.D < 0) {
    return refuse(kContractValue, "T, D must be >= 0 and hc >= 1");
  }
  if (bad_eps(p.rms_eps)) return refuse(kContractValue, "rms_eps must be finite and >= 0");
  if (p.T == 0 || p.D == 0) return Status::Ok();
  if (!p.y || !p.post_prev || !p.comb_prev || !p.residual || !p.out) {
    return refuse(kContractMissing, "y, post_prev, comb_prev, residual and out are required");
  }
  std::vector<float> streams(static_cast<size_t>(p.T) * p.hc * p.D);
  std::vector<float> mean(static_cast<size_t>(p.T) * p.D);
  cpu::mhc_post(p.y, p.post_prev, p.comb_prev, p.residual, p.T, p.hc, p.D, streams.data());
  cpu::hc_head_mean(streams.data(), p.T, p.hc, p.D, mean.data());
  cpu::rms_norm(mean.data(), p.T, p.D, p.rms_w, p.rms_eps, p.out);
  return Status::Ok();
}

}  // namespace

Status mhc(const Backend& b, const MemraMhcParams& p) {
  // Checked here, not in the forms, so the bound holds on CUDA too (the entry checks >= 1 only).
  if (p.pre && p.sinkhorn_iters > kMaxSinkhornIters) {
    return Status(kContractValue, "mhc: sinkhorn_iters must be <= " + std::to_string(kMaxSinkhornIters) +
                                      ", got " + std::to_string(p.sinkhorn_iters));
  }
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().mhc(b.cuda->ctx(), &p), "mhc");
  const bool expand = p.expand != 0, pre = p.pre != 0, norm = p.norm != 0, head = p.head != 0;
  if (!expand && pre && !head) return pre_cpu(p, p.streams, norm);
  if (expand && !pre && !norm && !head) return post_cpu(p);
  if (expand && pre && norm && !head) return post_pre_cpu(p);
  if (expand && head && norm && !pre) return head_cpu(p);
  return refuse(kContractValue, "expand / pre / norm / head is not one of the forms");
}

Status hc_head_mean(const Backend& b, const float* streams, int T, int hc, int D, float* out) {
  if (b.on_cuda()) {
    return cuda_status(b, b.cuda->api().hc_head_mean(b.cuda->ctx(), streams, T, hc, D, out),
                       "hc_head_mean");
  }
  if (T < 0 || hc < 1 || D < 0) {
    return Status(kContractValue, "hc_head_mean: T, D must be >= 0 and hc >= 1");
  }
  if (T == 0 || D == 0) return Status::Ok();
  if (!streams || !out) {
    return Status(kContractMissing, "hc_head_mean: streams and out are required");
  }
  cpu::hc_head_mean(streams, T, hc, D, out);
  return Status::Ok();
}

Status hc_expand(const Backend& b, const float* x, int T, int D, int n, float* out) {
  if (b.on_cuda()) {
    return cuda_status(b, b.cuda->api().hc_expand(b.cuda->ctx(), x, T, D, n, out), "hc_expand");
  }
  if (T < 0 || D < 0 || n < 0) return Status(kContractValue, "hc_expand: T, D and n must be >= 0");
  if (T == 0 || D == 0 || n == 0) return Status::Ok();
  if (!x || !out) return Status(kContractMissing, "hc_expand: x and out are required");
  cpu::hc_expand(x, T, D, n, out);
  return Status::Ok();
}

}  // namespace memra::op
