// memra::op for the DSA k-pool indexer: the one CPU / CUDA choice per op (op/backend.h,
// op/dsa.h).
#include "memra/op/dsa.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "memra/cpu/dsa.h"

namespace memra::op {

namespace {

Status refuse(int code, const char* op, const std::string& what) {
  return Status(code, std::string(op) + ": " + what);
}

// The batched forms on the CPU (or a bad `batched`): refused.
Status host_form(int batched, const char* op) {
  if (batched == 0) return Status::Ok();
  if (batched == 1) {
    return refuse(kUnsupportedGeometry, op,
                  "the batched form (device pointer tables) runs on CUDA only; on the CPU run the "
                  "per-sequence form for each sequence");
  }
  return refuse(kContractValue, op, "batched must be 0 or 1, got " + std::to_string(batched));
}

// MlaLayer::indexer's bookkeeping for rows [pos, pos + T): the key of every pool whose last row
// lands in [pos, pos + T), its rows from the ring (r < pos) or the new rows (r >= pos); then the
// newest min(T, ring) rows into the ring at r % ring.
void append_host(const float* k, const float* gate, int T, int d, const float* ape, int P, int pos,
                 float* tk, float* tg, int ring, float* keys) {
  const int end = pos + T;
  const size_t D = static_cast<size_t>(d);
  std::vector<float> pk(static_cast<size_t>(P) * D), pg(static_cast<size_t>(P) * D);
  for (int p = pos / P; p < end / P; ++p) {
    for (int i = 0; i < P; ++i) {
      const int r = p * P + i;
      const float* ks = r < pos ? tk + size_t(r % ring) * D : k + size_t(r - pos) * D;
      const float* gs = r < pos ? tg + size_t(r % ring) * D : gate + size_t(r - pos) * D;
      std::copy_n(ks, d, pk.data() + size_t(i) * D);
      std::copy_n(gs, d, pg.data() + size_t(i) * D);
    }
    cpu::kpool_pool_key(pk.data(), pg.data(), ape, P, d, keys + size_t(p) * D);
  }
  for (int r = std::max(pos, end - ring); r < end; ++r) {
    std::copy_n(k + size_t(r - pos) * D, d, tk + size_t(r % ring) * D);
    std::copy_n(gate + size_t(r - pos) * D, d, tg + size_t(r % ring) * D);
  }
}

}  // namespace

Status kpool_append(const Backend& b, const MemraKpoolAppendParams& p) {
  const char* op = p.batched ? "kpool_append_decode" : "kpool_append";
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().kpool_append(b.cuda->ctx(), &p), op);
  MEMRA_TRY(host_form(p.batched, op));
  // The CUDA entry's checks, in its order.
  if (p.pool < 1 || p.tail_rows < p.pool || p.tail_rows % p.pool != 0) {
    return refuse(kContractPool, op,
                  "pool must be >= 1 and tail_rows a positive multiple of it, got pool=" +
                      std::to_string(p.pool) + " tail_rows=" + std::to_string(p.tail_rows));
  }
  if (p.n < 0 || p.d < 1 || p.pos < 0) {
    return refuse(kContractValue, op,
                  "n >= 0, d >= 1 and pos >= 0 required, got n=" + std::to_string(p.n) +
                      " d=" + std::to_string(p.d) + " pos=" + std::to_string(p.pos));
  }
  if (int64_t(p.pos) + p.n > INT_MAX) {
    return refuse(kContractRange, op, "pos + n overflows int32");
  }
  if (p.n == 0) return Status::Ok();
  append_host(p.k, p.gate, p.n, p.d, p.ape, p.pool, p.pos, p.tail_k, p.tail_gate, p.tail_rows,
              p.pool_keys);
  return Status::Ok();
}

Status kpool_score(const Backend& b, const MemraKpoolScoreParams& p) {
  const char* op = p.batched ? "kpool_score_decode" : "kpool_score";
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().kpool_score(b.cuda->ctx(), &p), op);
  MEMRA_TRY(host_form(p.batched, op));
  if (p.pool < 1) {
    return refuse(kContractPool, op, "pool must be >= 1, got " + std::to_string(p.pool));
  }
  if (p.t_q < 0 || p.Hi < 0 || p.d < 0 || p.n_pools < 0 || p.first_pos < 0 ||
      !std::isfinite(p.qk_scale) || !std::isfinite(p.head_scale)) {
    return refuse(kContractValue, op,
                  "t_q, Hi, d, n_pools, first_pos must be >= 0 and the scales finite, got t_q=" +
                      std::to_string(p.t_q) + " Hi=" + std::to_string(p.Hi) +
                      " d=" + std::to_string(p.d) + " n_pools=" + std::to_string(p.n_pools) +
                      " first_pos=" + std::to_string(p.first_pos));
  }
  if (int64_t(p.first_pos) + p.t_q > INT_MAX) {
    return refuse(kContractRange, op, "first_pos + t_q overflows int32");
  }
  if (p.t_q == 0 || p.n_pools == 0) return Status::Ok();
  cpu::kpool_score(p.q, p.w, p.pool_keys, p.t_q, p.Hi, p.d, p.n_pools, p.pool, p.first_pos,
                   p.qk_scale, p.head_scale, p.score);
  return Status::Ok();
}

Status kpool_select(const Backend& b, const MemraKpoolSelectParams& p) {
  const char* op = p.batched ? "kpool_select_decode" : "kpool_select";
  if (b.on_cuda()) return cuda_status(b, b.cuda->api().kpool_select(b.cuda->ctx(), &p), op);
  MEMRA_TRY(host_form(p.batched, op));
  // cpu::kpool_select checks its arguments itself (its messages name them).
  return cpu::kpool_select(p.score, p.t_q, p.n_pools, p.pool, p.select_k, p.width, p.first_pos,
                           p.idx);
}

}  // namespace memra::op
