// memra::op for the MLA area: the one CPU / CUDA choice per op (op/backend.h, op/mla.h).
#include "memra/op/mla.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "memra/cpu/mla.h"

namespace memra::op {

namespace {

Status refuse(int code, const char* op, const std::string& what) {
  return Status(code, std::string(op) + ": " + what);
}

// The CPU reference reads f32 caches only.
Status host_cache_dtype(const char* op, int cache_dtype) {
  if (cache_dtype == 0) return Status::Ok();
  if (cache_dtype == 1) {
    return refuse(kUnsupportedGeometry, op, "bfloat16 latent caches run on CUDA only");
  }
  return refuse(kContractDType, op,
                "cache_dtype must be 0 (f32) or 1 (bf16), got " + std::to_string(cache_dtype));
}

// The name of p's form (the name the bindings give the op).
const char* attn_name(const MemraMlaAttnParams& p) {
  if (p.batched) return "mla_attn_decode";
  return p.rows == MEMRA_MLA_ROWS_INDEXED ? "mla_attn_gathered" : "mla_attn_absorbed";
}

// Batched attention on the CPU: each sequence's query at row n_b - 1 over its own rows, by the
// one-sequence reference ops (the device's bytes up to its documented roundings). Rows are
// R + d_rope wide; sequence b's q_pe is q_pe[b] [H, d_rope].
Status attn_batched_host(const MemraMlaAttnParams& p, const char* op) {
  if (p.B < 0 || p.H < 0 || p.R < 1 || p.max_t_kv < 0 || p.width < 0 || p.d_rope < 0) {
    return refuse(kContractValue, op,
                  "B, H, max_t_kv, width and d_rope must be >= 0 and R >= 1, got B=" +
                      std::to_string(p.B) + " H=" + std::to_string(p.H) +
                      " R=" + std::to_string(p.R) + " max_t_kv=" + std::to_string(p.max_t_kv) +
                      " width=" + std::to_string(p.width) + " d_rope=" + std::to_string(p.d_rope));
  }
  MEMRA_TRY(host_cache_dtype(op, p.cache_dtype));
  if (p.B == 0 || p.H == 0) return Status::Ok();
  const bool listed = p.rows == MEMRA_MLA_ROWS_LISTED;
  const bool indexed = p.rows == MEMRA_MLA_ROWS_INDEXED && p.idx;
  if (!p.q_lat || !p.caches || !p.seq_t_kv || !p.o_lat || (listed && (!p.list || !p.counts)) ||
      (p.d_rope > 0 && !p.q_pe)) {
    return refuse(kContractMissing, op,
                  "q_lat, caches, t_kv, o_lat (and list, counts; q_pe with d_rope > 0) are "
                  "required");
  }
  const int64_t H = p.H, R = p.R, width = p.width, dr = p.d_rope;
  std::vector<int32_t> row(static_cast<size_t>(width));
  for (int64_t b = 0; b < p.B; ++b) {
    const int n = std::min(std::max(p.seq_t_kv[b], 0), p.max_t_kv);
    float* ob = p.o_lat + b * H * R;
    std::fill(ob, ob + H * R, 0.0f);
    if (n <= 0) continue;
    const float* qb = p.q_lat + b * H * R;
    const float* pb = dr > 0 ? p.q_pe + b * H * dr : nullptr;
    const float* cb = static_cast<const float*>(p.caches[b]);
    if (indexed || listed) {
      const int64_t count = listed ? std::min<int64_t>(std::max(p.counts[b], 0), width) : width;
      for (int64_t e = 0; e < width; ++e) {
        const int32_t r = e < count ? (listed ? p.list : p.idx)[b * width + e] : -1;
        row[static_cast<size_t>(e)] = r >= 0 && r < n ? r : -1;
      }
      MEMRA_TRY(cpu::mla_attn_gathered(qb, pb, cb, row.data(), p.H, p.R, p.d_rope, 1, n,
                                       p.width, p.scale, ob));
    } else {
      MEMRA_TRY(cpu::mla_attn_absorbed(qb, pb, cb, p.H, p.R, p.d_rope, 1, n, p.scale, ob));
    }
  }
  return Status::Ok();
}

}  // namespace

Status mla_proj(const Backend& b, const MemraMlaProjParams& p) {
  const bool decompress = p.which == MEMRA_MLA_DECOMPRESS;
  const char* op = decompress ? "mla_decompress_v" : "mla_absorb_q";
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().mla_proj(b.cuda->ctx(), &p), op);
  if ((p.which != MEMRA_MLA_ABSORB && !decompress) || p.T < 0 || p.H < 0 || p.d_nope < 0 ||
      p.d_v < 0 || p.R < 1) {
    return refuse(kContractValue, op,
                  "which must be 0 or 1, T, H, d_nope, d_v >= 0 and R >= 1, got which=" +
                      std::to_string(p.which) + " T=" + std::to_string(p.T) +
                      " H=" + std::to_string(p.H) + " d_nope=" + std::to_string(p.d_nope) +
                      " d_v=" + std::to_string(p.d_v) + " R=" + std::to_string(p.R));
  }
  if (p.w_dtype < 0 || p.w_dtype > 2) {
    return refuse(kContractDType, op,
                  "w_dtype must be 0, 1 or 2, got " + std::to_string(p.w_dtype));
  }
  const int outs = decompress ? p.d_v : p.R;
  if (p.T == 0 || p.H == 0 || outs == 0) return Status::Ok();
  if (!p.x || !p.kv_b || !p.y) return refuse(kContractMissing, op, "x, kv_b and y are required");
  const WeightView kv_b =
      host_view(p.kv_b, p.w_dtype, static_cast<int64_t>(p.H) * (p.d_nope + p.d_v), p.R);
  if (decompress) {
    cpu::mla_decompress_v(p.x, kv_b, p.T, p.H, p.d_nope, p.d_v, p.y);
  } else {
    cpu::mla_absorb_q(p.x, kv_b, p.T, p.H, p.d_nope, p.d_v, p.y);
  }
  return Status::Ok();
}

Status mla_latent_append(const Backend& b, const MemraMlaAppendParams& p) {
  const char* op = p.batched ? "mla_latent_append_decode" : "mla_latent_append";
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().mla_latent_append(b.cuda->ctx(), &p), op);
  if ((p.batched != 0 && p.batched != 1) || p.n < 0 || p.W < 1 || (!p.batched && p.start < 0)) {
    return refuse(kContractValue, op,
                  "n >= 0, W >= 1 and start >= 0 required, got batched=" +
                      std::to_string(p.batched) + " n=" + std::to_string(p.n) +
                      " W=" + std::to_string(p.W) + " start=" + std::to_string(p.start));
  }
  MEMRA_TRY(host_cache_dtype(op, p.cache_dtype));
  if (p.n == 0) return Status::Ok();
  if (!p.rows || (p.batched ? !p.caches || !p.pos : !p.cache)) {
    return refuse(kContractMissing, op, "rows and the caches are required");
  }
  const int64_t W = p.W;
  if (!p.batched) {
    std::memcpy(static_cast<float*>(p.cache) + int64_t(p.start) * W, p.rows,
                sizeof(float) * static_cast<size_t>(p.n * W));
    return Status::Ok();
  }
  for (int64_t r = 0; r < p.n; ++r) {
    const int32_t pos = p.pos[r];
    if (pos < 0) continue;  // an idle row
    std::memcpy(static_cast<float*>(p.caches[r]) + int64_t(pos) * W, p.rows + r * W,
                sizeof(float) * static_cast<size_t>(W));
  }
  return Status::Ok();
}

Status mla_attn(const Backend& b, const MemraMlaAttnParams& p) {
  const char* op = attn_name(p);
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().mla_attn(b.cuda->ctx(), &p), op);
  if ((p.batched != 0 && p.batched != 1) || p.rows < MEMRA_MLA_ROWS_CAUSAL ||
      p.rows > MEMRA_MLA_ROWS_LISTED || (!p.batched && p.rows == MEMRA_MLA_ROWS_LISTED)) {
    return refuse(kContractValue, op,
                  "batched must be 0 or 1 and rows 0..2 (2 batched only), got batched=" +
                      std::to_string(p.batched) + " rows=" + std::to_string(p.rows));
  }
  if (p.batched) return attn_batched_host(p, op);
  MEMRA_TRY(host_cache_dtype(op, p.cache_dtype));
  const float* cache = static_cast<const float*>(p.cache);
  if (p.rows == MEMRA_MLA_ROWS_CAUSAL) {
    return cpu::mla_attn_absorbed(p.q_lat, p.q_pe, cache, p.H, p.R, p.d_rope, p.t_q, p.t_kv,
                                  p.scale, p.o_lat);
  }
  return cpu::mla_attn_gathered(p.q_lat, p.q_pe, cache, p.idx, p.H, p.R, p.d_rope, p.t_q, p.t_kv,
                                p.width, p.scale, p.o_lat);
}

Status mla_norm_append_decode(const Backend& b, const MemraMlaNormAppendParams& p) {
  const char* op = "mla_norm_append_decode";
  if (b.on_cuda()) {
    return cuda_status(b, b.cuda->api().mla_norm_append_decode(b.cuda->ctx(), &p), op);
  }
  return refuse(kUnsupportedGeometry, op,
                "runs on CUDA only (device slots and plane tables); the CPU layer runs its ops");
}

}  // namespace memra::op
