// memra::op for the full-attention area: the one CPU / CUDA choice per op (op/backend.h). The
// CPU branches run the memra::cpu reference ops over the structs' fields, with the device form's
// slots and lengths as host arrays.
#include "memra/op/attention.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "memra/cpu/attention.h"
#include "memra/ops.h"

namespace memra::op {

namespace {

// The Status of a refused struct (a memra_*_check code), naming the op.
Status refused(int rc, const char* op) {
  if (rc == kOk) return Status::Ok();
  const char* what = "its parameters are out of their domain";
  switch (rc) {
    case kContractMissing: what = "a required array is null"; break;
    case kContractOddRope: what = "n_rot must be even"; break;
    case kContractStride: what = "a row stride is below the row's width"; break;
    case kContractDType: what = "the cache dtype must be float32 or bfloat16"; break;
    case kContractRange: what = "the rows fall outside the cache (pos0 < 0 or pos0 + T > max_len)"; break;
    case kUnsupportedGeometry: what = "head_dim above 256 is not built"; break;
    default: break;
  }
  return Status(rc, std::string(op) + ": " + what);
}

// Row t's position: pos0 + t (direct form) or lengths[slots[t]] (device form; idle: 0).
int32_t position(const int32_t* slots, const int32_t* lengths, int pos0, int t) {
  if (!slots) return pos0 + t;
  return slots[t] >= 0 ? lengths[slots[t]] : 0;
}

// Rows [0, n) of a cache plane [max_len, row] as f32 (bf16 rows widened exactly), or the plane
// itself when it is f32.
const float* plane_f32(const void* plane, int dtype, int64_t n, int64_t row, std::vector<float>* buf) {
  if (dtype == 0) return static_cast<const float*>(plane);
  const uint16_t* src = static_cast<const uint16_t*>(plane);
  buf->resize(static_cast<size_t>(n * row));
  for (int64_t i = 0; i < n * row; ++i) (*buf)[i] = bf16_to_f32(src[i]);
  return buf->data();
}

}  // namespace

Status attn_prep(const Backend& b, const MemraAttnPrepParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().attn_prep(b.cuda->ctx(), &p), "attn_prep");
  MEMRA_TRY(refused(memra_attn_prep_check(&p), "attn_prep"));
  if (p.T == 0) return Status::Ok();
  const int T = p.T, Hq = p.Hq, Hkv = p.Hkv, hd = p.hd;
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) pos[t] = position(p.slots, p.lengths, p.pos0, t);
  std::vector<float> own_gate;
  float* gate = p.gate;
  if (!gate) {
    own_gate.resize(size_t(T) * Hq * hd);
    gate = own_gate.data();
  }
  cpu::attn_split_gate(p.qg, p.ld_qg, T, Hq, hd, p.q, gate);
  cpu::rms_norm(p.q, T * Hq, hd, p.q_norm, p.eps, p.q);
  cpu::rope_neox(p.q, pos.data(), T, Hq, hd, p.n_rot, p.inv_freq);
  const int64_t row = int64_t(Hkv) * hd;
  for (int t = 0; t < T; ++t) {  // k_out may be k itself (then each row stays where it is)
    const float* src = p.k + t * p.ld_k;
    float* dst = p.k_out + t * row;
    if (src != dst) std::memmove(dst, src, sizeof(float) * size_t(row));
  }
  cpu::rms_norm(p.k_out, T * Hkv, hd, p.k_norm, p.eps, p.k_out);
  cpu::rope_neox(p.k_out, pos.data(), T, Hkv, hd, p.n_rot, p.inv_freq);
  return Status::Ok();
}

Status attn_prep_append(const Backend& b, const MemraAttnPrepParams& prep,
                        const MemraKvAppendParams& app) {
  if (b.on_cuda()) {
    return cuda_status(b, b.cuda->api().attn_prep_append(b.cuda->ctx(), &prep, &app),
                       "attn_prep_append");
  }
  MEMRA_TRY(attn_prep(b, prep));
  return kv_append(b, app);
}

Status kv_append(const Backend& b, const MemraKvAppendParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().kv_append(b.cuda->ctx(), &p), "kv_append");
  MEMRA_TRY(refused(memra_kv_append_check(&p), "kv_append"));
  const int64_t row = int64_t(p.Hkv) * p.hd;
  const size_t esize = p.cache_dtype == 0 ? 4 : 2;
  for (int t = 0; t < p.T; ++t) {
    int64_t at = 0;  // element offset of the row in the planes
    if (p.slots) {
      const int s = p.slots[t];
      if (s < 0) continue;
      const int pos = p.lengths[s];
      if (pos < 0 || pos >= p.max_len) continue;
      at = s * p.slot_stride + pos * row;
    } else {
      at = (int64_t(p.pos0) + t) * row;
    }
    const float* src[2] = {p.k + t * p.ld_k, p.v + t * p.ld_v};
    void* plane[2] = {p.k_cache, p.v_cache};
    for (int i = 0; i < 2; ++i) {
      char* dst = static_cast<char*>(plane[i]) + size_t(at) * esize;
      if (p.cache_dtype == 0) {
        std::memcpy(dst, src[i], sizeof(float) * size_t(row));
      } else {
        uint16_t* d = reinterpret_cast<uint16_t*>(dst);
        for (int64_t e = 0; e < row; ++e) d[e] = f32_to_bf16(src[i][e]);
      }
    }
  }
  return Status::Ok();
}

Status attention(const Backend& b, const MemraAttnParams& p) {
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().attention(b.cuda->ctx(), &p), "attention");
  MEMRA_TRY(refused(memra_attention_check(&p), "attention"));
  if (p.T == 0) return Status::Ok();
  const int Hq = p.Hq, Hkv = p.Hkv, hd = p.hd;
  const int64_t row = int64_t(Hkv) * hd, qrow = int64_t(Hq) * hd;
  const size_t esize = p.cache_dtype == 0 ? 4 : 2;
  std::vector<float> kbuf, vbuf;
  if (!p.slots) {
    std::vector<int32_t> n(static_cast<size_t>(p.T));
    for (int t = 0; t < p.T; ++t) n[t] = p.pos0 + t + 1;
    const int64_t rows = int64_t(p.pos0) + p.T;
    const float* k = plane_f32(p.k_cache, p.cache_dtype, rows, row, &kbuf);
    const float* v = plane_f32(p.v_cache, p.cache_dtype, rows, row, &vbuf);
    cpu::attention(p.q, k, v, n.data(), p.T, Hq, Hkv, hd, p.scale, p.gate, p.o);
    return Status::Ok();
  }
  for (int t = 0; t < p.T; ++t) {
    float* o = p.o + t * qrow;
    const int s = p.slots[t];
    if (s < 0) {  // an idle row: zeros
      std::fill(o, o + qrow, 0.0f);
      continue;
    }
    const int32_t n = std::min<int64_t>(std::max<int64_t>(int64_t(p.lengths[s]) + 1, 0), p.max_len);
    const size_t at = size_t(s * p.slot_stride) * esize;
    const float* k = plane_f32(static_cast<const char*>(p.k_cache) + at, p.cache_dtype, n, row, &kbuf);
    const float* v = plane_f32(static_cast<const char*>(p.v_cache) + at, p.cache_dtype, n, row, &vbuf);
    cpu::attention(p.q + t * qrow, k, v, &n, 1, Hq, Hkv, hd, p.scale, p.gate ? p.gate + t * qrow : nullptr,
                   o);
  }
  return Status::Ok();
}

}  // namespace memra::op
