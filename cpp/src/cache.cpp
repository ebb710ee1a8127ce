#include "memra/cache.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include "memra/host_memory.h"
#include "memra/msg.h"
#include "memra/op/graph_tables.h"
#include <string>

namespace memra {

namespace {

std::string spec_error(int layer, const std::string& what) {
  return "Cache: layer " + std::to_string(layer) + ": " + what;
}

// A GDN spec's own dimensions for a geometry message (empty for the other kinds).
std::string gdn_dims(const LayerStateSpec& s) {
  if (s.kind != LayerStateSpec::Kind::kGdn) return "";
  return " key_heads=" + std::to_string(s.key_heads) + " value_dim=" + std::to_string(s.value_dim);
}

}  // namespace

namespace {

constexpr size_t kAlign = 256;  // every plane starts on a 256-byte boundary (coalesced loads)

// Lay out every plane in one arena, then (device == true) the int32 mirrors lengths_d and
// cur_d [max_batch] each at *mirror_off; returns its bytes, or -1 when the count overflows 2^62
// (absurd sizes must become OutOfMemoryError, never a wrapped, too-small arena).
template <typename Plane>
int64_t layout(int max_batch, int max_len, const std::vector<LayerStateSpec>& specs, DType latent,
               bool device, std::vector<Plane>* planes, size_t* mirror_off) {
  constexpr unsigned __int128 kLimit = (unsigned __int128)1 << 62;
  unsigned __int128 off = 0;
  bool overflow = false;
  auto take = [&](unsigned __int128 bytes) {
    const size_t at = static_cast<size_t>(off);
    off += (bytes + kAlign - 1) / kAlign * kAlign;
    if (off > kLimit) overflow = true;
    return overflow ? size_t(0) : at;
  };
  using U = unsigned __int128;
  planes->assign(specs.size(), Plane());
  for (size_t i = 0; i < specs.size() && !overflow; ++i) {
    const auto& s = specs[i];
    Plane& p = (*planes)[i];
    if (s.recurrent()) {
      for (int w = 0; w < 2; ++w) {
        p.conv[w] = take(U(max_batch) * U(s.conv_floats()) * 4);
        p.state[w] = take(U(max_batch) * U(s.state_floats()) * 4);
      }
    } else if (s.kind == LayerStateSpec::Kind::kMla) {
      p.latent = take(U(max_batch) * U(max_len) * U(s.row_width) * U(dtype_size(latent)));
      if (s.index_head_dim > 0) {
        p.pool_keys = take(U(max_batch) * U(max_len / s.kpool) * U(s.index_head_dim) * 4);
        p.tail_k = take(U(max_batch) * U(s.tail_rows) * U(s.index_head_dim) * 4);
        p.tail_gate = take(U(max_batch) * U(s.tail_rows) * U(s.index_head_dim) * 4);
      }
    } else if (s.kind == LayerStateSpec::Kind::kAttention) {
      p.attn_k = take(U(max_batch) * U(max_len) * U(s.kv_row()) * U(dtype_size(latent)));
      p.attn_v = take(U(max_batch) * U(max_len) * U(s.kv_row()) * U(dtype_size(latent)));
    }
  }
  *mirror_off = 0;
  if (device && !overflow) *mirror_off = take(U(2) * U(max_batch) * sizeof(int32_t));
  return overflow ? -1 : static_cast<int64_t>(off);
}

}  // namespace

int64_t Cache::bytes_needed(int max_batch, int max_len, const std::vector<LayerStateSpec>& specs,
                            DType latent_dtype, bool device) {
  std::vector<Plane> planes;
  size_t mirror_off = 0;
  const int64_t n = layout(max_batch, max_len, specs, latent_dtype, device, &planes, &mirror_off);
  return n < 0 ? INT64_MAX : n;  // saturates: such a cache never fits
}

Status Cache::create(int max_batch, int max_len, std::vector<LayerStateSpec> specs,
                     std::unique_ptr<Cache>* out) {
  return create(nullptr, DType::kF32, max_batch, max_len, std::move(specs), out);
}

Status Cache::create(std::shared_ptr<CudaContext> cuda, DType latent_dtype, int max_batch,
                     int max_len, std::vector<LayerStateSpec> specs, std::unique_ptr<Cache>* out) {
  if (max_batch < 1 || max_len < 1) {
    return Status(kContractValue, "Cache: max_batch and max_len must be >= 1, got max_batch=" +
                                      std::to_string(max_batch) +
                                      ", max_len=" + std::to_string(max_len));
  }
  if (latent_dtype != DType::kF32 && !(cuda && latent_dtype == DType::kBF16)) {
    return Status(kContractDType, std::string("Cache: latent_dtype ") + dtype_name(latent_dtype) +
                                      " is not supported here (float32; bfloat16 on CUDA)");
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    if (s.kind == LayerStateSpec::Kind::kKda &&
        (s.heads < 1 || s.head_dim < 1 || s.conv_kernel < 1)) {
      return Status(kContractValue, spec_error(int(i), "KDA heads, head_dim and conv_kernel must be >= 1"));
    }
    if (s.kind == LayerStateSpec::Kind::kGdn &&
        (s.key_heads < 1 || s.heads < 1 || s.heads % s.key_heads != 0 || s.head_dim < 1 ||
         s.value_dim < 1 || s.conv_kernel < 1)) {
      return Status(kContractValue,
                    spec_error(int(i), "GDN key_heads, value_heads, key_head_dim, value_head_dim and "
                                       "conv_kernel must be >= 1, value_heads a multiple of "
                                       "key_heads"));
    }
    if (s.kind == LayerStateSpec::Kind::kAttention && (s.heads < 1 || s.head_dim < 1)) {
      return Status(kContractValue, spec_error(int(i), "attention kv_heads and head_dim must be >= 1"));
    }
    if (s.kind == LayerStateSpec::Kind::kMla) {
      if (s.row_width < 1) return Status(kContractValue, spec_error(int(i), "row_width must be >= 1"));
      if (s.index_head_dim > 0 && (s.kpool < 1 || s.tail_rows < s.kpool || s.tail_rows % s.kpool)) {
        return Status(kContractPool,
                      spec_error(int(i), "indexer tail_rows (" + std::to_string(s.tail_rows) +
                                             ") must be a positive multiple of kpool (" +
                                             std::to_string(s.kpool) + ")"));
      }
    }
  }
  static std::atomic<uint64_t> serials{0};
  std::unique_ptr<Cache> c(new Cache());
  c->serial_ = ++serials;
  c->cuda_ = std::move(cuda);
  c->latent_dtype_ = latent_dtype;
  c->max_batch_ = max_batch;
  c->max_len_ = max_len;
  c->specs_ = std::move(specs);
  c->nbytes_ = layout(max_batch, max_len, c->specs_, latent_dtype, c->cuda_ != nullptr, &c->planes_,
                      &c->mirror_off_);
  if (c->nbytes_ < 0) {
    return Status(kOutOfMemory, "Cache: " + std::to_string(max_batch) + " slots x " +
                                    std::to_string(max_len) + " tokens need more than 2^62 bytes");
  }
  MEMRA_TRY(c->allocate());
  try {
    c->lengths_.assign(max_batch, 0);
    c->cur_.assign(max_batch, 0);
    c->owners_.assign(max_batch, 0);
    c->clock_.assign(max_batch, 0);
    c->rewrites_.assign(max_batch, {});
  } catch (const std::bad_alloc&) {
    return Status(kOutOfMemory, "Cache: per-slot bookkeeping for " + std::to_string(max_batch) +
                                    " slots does not fit in host memory");
  }
  *out = std::move(c);
  return Status::Ok();
}

Status Cache::allocate() {
  const int64_t need = nbytes_;
  if (cuda_) {
    size_t free_bytes = 0, total = 0;
    const int rc = cuda_->api().mem_info(cuda_->ctx(), &free_bytes, &total);
    if (rc != kOk) return cuda_->status(rc, "Cache");
    if (need > static_cast<int64_t>(free_bytes)) {
      Msg os;
      os << "Cache: " << max_batch_ << " slots x " << max_len_ << " tokens need " << need
         << " bytes of device memory, but only " << free_bytes << " are free";
      return Status(kOutOfMemory, os.str());
    }
    MEMRA_TRY(DeviceBuffer::create(cuda_, static_cast<size_t>(need), &device_arena_));
    arena_ptr_ = static_cast<uint8_t*>(device_arena_->data());
    return fill_zero(arena_ptr_, static_cast<size_t>(need));
  }
  const int64_t avail = available_host_bytes();
  if (avail >= 0 && need > avail) {
    Msg os;
    os << "Cache: " << max_batch_ << " slots x " << max_len_ << " tokens need " << need
       << " bytes of host memory, but only " << avail << " are available";
    return Status(kOutOfMemory, os.str());
  }
  try {
    host_arena_.assign(static_cast<size_t>(need) / sizeof(float) + 1, 0.0f);
  } catch (const std::bad_alloc&) {
    return Status(kOutOfMemory, "Cache: allocation of " + std::to_string(need) + " bytes failed");
  }
  arena_ptr_ = reinterpret_cast<uint8_t*>(host_arena_.data());
  return Status::Ok();
}

Status Cache::fill_zero(void* p, size_t bytes) {
  if (!cuda_) {
    std::memset(p, 0, bytes);
    return Status::Ok();
  }
  const int rc = cuda_->api().zero(cuda_->ctx(), p, bytes);
  return rc == kOk ? Status::Ok() : cuda_->status(rc, "Cache");
}

Status Cache::copy_bytes(void* dst, const void* src, size_t bytes) {
  if (!cuda_) {
    std::memmove(dst, src, bytes);
    return Status::Ok();
  }
  const int rc = cuda_->api().copy(cuda_->ctx(), dst, src, bytes);
  return rc == kOk ? Status::Ok() : cuda_->status(rc, "Cache");
}

Status Cache::sync_mirror(int slot, int length, int cur) {
  if (!cuda_) return Status::Ok();
  // Staged through the context's pinned ring (memra_cuda_copy): the values are taken now, the
  // copies run in stream order; no host wait.
  const int32_t len32 = length, cur32 = cur;
  int rc = cuda_->api().copy(cuda_->ctx(), lengths_d() + slot, &len32, sizeof len32);
  if (rc == kOk) rc = cuda_->api().copy(cuda_->ctx(), cur_d() + slot, &cur32, sizeof cur32);
  return rc == kOk ? Status::Ok() : cuda_->status(rc, "Cache (device lengths / ping-pong flags)");
}

Status Cache::read(void* host_dst, const void* plane_src, size_t bytes) const {
  if (!cuda_) {
    std::memcpy(host_dst, plane_src, bytes);
    return Status::Ok();
  }
  const int rc = cuda_->api().copy_to_host(cuda_->ctx(), host_dst, plane_src, bytes);
  return rc == kOk ? Status::Ok() : cuda_->status(rc, "Cache.read");
}

Status Cache::check_slot(int slot, const char* op) const {
  if (slot < 0 || slot >= max_batch_) {
    return Status(kContractRange, std::string(op) + ": slot " + std::to_string(slot) +
                                      " is outside the cache's slots [0, " +
                                      std::to_string(max_batch_) + ")");
  }
  return Status::Ok();
}

Status Cache::check_layer(int layer, LayerStateSpec::Kind kind, const char* op) const {
  if (layer < 0 || layer >= num_layers()) {
    return Status(kContractRange, std::string(op) + ": cache layer " + std::to_string(layer) +
                                      " is outside [0, " + std::to_string(num_layers()) + ")");
  }
  if (specs_[layer].kind != kind) {
    return Status(kContractValue, std::string(op) + ": cache layer " + std::to_string(layer) +
                                      " holds another kind of state than this layer needs");
  }
  return Status::Ok();
}

Status Cache::check_layer(int layer, const LayerStateSpec& want, const char* op) const {
  MEMRA_TRY(check_layer(layer, want.kind, op));
  const LayerStateSpec& h = specs_[layer];
  const bool same = h.heads == want.heads && h.head_dim == want.head_dim &&
                    h.conv_kernel == want.conv_kernel && h.key_heads == want.key_heads &&
                    h.value_dim == want.value_dim && h.row_width == want.row_width &&
                    h.index_head_dim == want.index_head_dim && h.kpool == want.kpool &&
                    h.tail_rows == want.tail_rows;
  if (!same) {
    return Status(kContractShape,
                  std::string(op) + ": cache layer " + std::to_string(layer) +
                      " was made for another geometry (cache: heads=" + std::to_string(h.heads) +
                      " head_dim=" + std::to_string(h.head_dim) + " conv_kernel=" +
                      std::to_string(h.conv_kernel) + gdn_dims(h) + " row_width=" +
                      std::to_string(h.row_width) +
                      " index_head_dim=" + std::to_string(h.index_head_dim) + " kpool=" +
                      std::to_string(h.kpool) + " tail_rows=" + std::to_string(h.tail_rows) +
                      "; layer: heads=" + std::to_string(want.heads) + " head_dim=" +
                      std::to_string(want.head_dim) + " conv_kernel=" + std::to_string(want.conv_kernel) +
                      gdn_dims(want) + " row_width=" + std::to_string(want.row_width) + " index_head_dim=" +
                      std::to_string(want.index_head_dim) + " kpool=" + std::to_string(want.kpool) +
                      " tail_rows=" + std::to_string(want.tail_rows) + ")");
  }
  return Status::Ok();
}

Status Cache::check_device(const std::shared_ptr<CudaContext>& cuda, const char* op) const {
  if (cuda.get() == cuda_.get()) return Status::Ok();
  auto where = [](const std::shared_ptr<CudaContext>& c) {
    return c ? "cuda:" + std::to_string(c->device()) + " (engine context)" : std::string("host memory");
  };
  return Status(kContractDevice, std::string(op) + ": the cache lives in " + where(cuda_) +
                                     " but the layer runs on " + where(cuda) +
                                     " (make the cache with the layer's engine)");
}

Status Cache::check_room(int slot, int n, const char* op) const {
  MEMRA_TRY(check_slot(slot, op));
  if (n < 1) {
    return Status(kContractValue, std::string(op) + ": need at least one token, got " + std::to_string(n));
  }
  if (int64_t(lengths_[slot]) + n > max_len_) {
    return Status(kCacheFull, std::string(op) + ": slot " + std::to_string(slot) + " holds " +
                                  std::to_string(lengths_[slot]) + " of " + std::to_string(max_len_) +
                                  " tokens; " + std::to_string(n) + " more do not fit");
  }
  return Status::Ok();
}

float* Cache::conv(int layer, int slot, int which) {
  return reinterpret_cast<float*>(base() + planes_[layer].conv[which]) + int64_t(slot) * specs_[layer].conv_floats();
}
float* Cache::state(int layer, int slot, int which) {
  return reinterpret_cast<float*>(base() + planes_[layer].state[which]) + int64_t(slot) * specs_[layer].state_floats();
}
void* Cache::latent_raw(int layer, int slot) {
  return base() + planes_[layer].latent +
         size_t(slot) * max_len_ * specs_[layer].row_width * dtype_size(latent_dtype_);
}
float* Cache::latent(int layer, int slot) { return static_cast<float*>(latent_raw(layer, slot)); }
float* Cache::pool_keys(int layer, int slot) {
  const auto& s = specs_[layer];
  return reinterpret_cast<float*>(base() + planes_[layer].pool_keys) + int64_t(slot) * (max_len_ / s.kpool) * s.index_head_dim;
}
float* Cache::tail_k(int layer, int slot) {
  const auto& s = specs_[layer];
  return reinterpret_cast<float*>(base() + planes_[layer].tail_k) + int64_t(slot) * s.tail_rows * s.index_head_dim;
}
float* Cache::tail_gate(int layer, int slot) {
  const auto& s = specs_[layer];
  return reinterpret_cast<float*>(base() + planes_[layer].tail_gate) + int64_t(slot) * s.tail_rows * s.index_head_dim;
}

void* Cache::attn_k(int layer, int slot) {
  return base() + planes_[layer].attn_k +
         size_t(slot) * max_len_ * specs_[layer].kv_row() * dtype_size(latent_dtype_);
}
void* Cache::attn_v(int layer, int slot) {
  return base() + planes_[layer].attn_v +
         size_t(slot) * max_len_ * specs_[layer].kv_row() * dtype_size(latent_dtype_);
}

Status Cache::commit_decode(const int32_t* slots_d, int B) {
  if (!cuda_) return Status(kUnsupported, "Cache.commit_decode: needs a CUDA cache");
  const Status st = op::commit_decode(op::Backend{cuda_.get()}, slots_d, B, lengths_d(), cur_d());
  return st.ok() ? st : cuda_->status(st.code, "Cache.commit_decode");
}

Status Cache::hold(int slot, uint64_t* token) {
  MEMRA_TRY(check_slot(slot, "Cache.hold"));
  MEMRA_TRY(check_owner(slot, 0, "Cache.hold"));
  // One counter for every cache: a token is never valid in a cache that did not hand it out.
  static std::atomic<uint64_t> next_token{1};
  owners_[slot] = next_token.fetch_add(1, std::memory_order_relaxed);
  *token = owners_[slot];
  return Status::Ok();
}

Status Cache::release(int slot, uint64_t token) {
  MEMRA_TRY(check_slot(slot, "Cache.release"));
  if (token == 0 || owners_[slot] != token) {
    // Both tokens are named: the holder's is no secret (check_owner names it too), and a caller
    // releasing with a stale or mixed-up token needs to see that it is theirs that is wrong.
    const std::string got = "release got token " + std::to_string(token);
    return Status(kContractSlotHeld,
                  "Cache.release: slot " + std::to_string(slot) +
                      (owners_[slot] ? " is held by another owner (token " +
                                           std::to_string(owners_[slot]) + "); " + got
                                     : " is not held (" + got + ")"));
  }
  owners_[slot] = 0;
  return Status::Ok();
}

Status Cache::check_owner(int slot, uint64_t token, const char* op) const {
  if (owners_[slot] == token) return Status::Ok();
  if (owners_[slot] == 0) {
    if (token == 0) return Status::Ok();
    // A token claims a hold: on a free slot it is stale (released) or another cache's, and the
    // slot may hold a user's tokens that the holder never meant to touch.
    return Status(kContractSlotHeld,
                  std::string(op) + ": slot " + std::to_string(slot) + " is not held by owner token " +
                      std::to_string(token) + " (released, or a token of another cache); nothing changed");
  }
  return Status(kContractSlotHeld,
                std::string(op) + ": slot " + std::to_string(slot) +
                    " is held by another owner (token " + std::to_string(owners_[slot]) +
                    ": a generation, stream or server request in flight, or a Cache.hold caller); "
                    "changing it would corrupt that sequence");
}

Status Cache::commit_host(int slot, int n, uint64_t owner) {
  MEMRA_TRY(check_room(slot, n, "Cache.commit_host"));
  MEMRA_TRY(check_owner(slot, owner, "Cache.commit_host"));
  lengths_[slot] += n;
  cur_[slot] ^= 1;
  return Status::Ok();
}

Status Cache::commit(int slot, int n, uint64_t owner) {
  MEMRA_TRY(check_room(slot, n, "Cache.commit"));
  MEMRA_TRY(check_owner(slot, owner, "Cache.commit"));
  MEMRA_TRY(sync_mirror(slot, lengths_[slot] + n, cur_[slot] ^ 1));
  lengths_[slot] += n;
  cur_[slot] ^= 1;
  return Status::Ok();
}

Status Cache::free(int slot, uint64_t owner) {
  MEMRA_TRY(check_slot(slot, "Cache.free"));
  MEMRA_TRY(check_owner(slot, owner, "Cache.free"));
  MEMRA_TRY(sync_mirror(slot, 0, 0));
  lengths_[slot] = 0;
  cur_[slot] = 0;
  rewrite(slot, -1);
  for (int l = 0; l < num_layers(); ++l) {
    if (!specs_[l].recurrent()) continue;
    for (int w = 0; w < 2; ++w) {
      MEMRA_TRY(fill_zero(conv(l, slot, w), size_t(specs_[l].conv_floats()) * 4));
      MEMRA_TRY(fill_zero(state(l, slot, w), size_t(specs_[l].state_floats()) * 4));
    }
  }
  return Status::Ok();
}

Status Cache::copy_slot(int src, int dst, uint64_t owner) {
  MEMRA_TRY(check_slot(src, "Cache.copy_slot"));
  MEMRA_TRY(check_slot(dst, "Cache.copy_slot"));
  MEMRA_TRY(check_owner(dst, owner, "Cache.copy_slot"));
  if (src == dst) return Status::Ok();
  rewrite(dst, -1);  // first: a copy failing midway has rewritten some of dst already
  for (int l = 0; l < num_layers(); ++l) {
    const auto& s = specs_[l];
    if (s.recurrent()) {
      for (int w = 0; w < 2; ++w) {
        MEMRA_TRY(copy_bytes(conv(l, dst, w), conv(l, src, w), size_t(s.conv_floats()) * 4));
        MEMRA_TRY(copy_bytes(state(l, dst, w), state(l, src, w), size_t(s.state_floats()) * 4));
      }
    } else if (s.kind == LayerStateSpec::Kind::kMla) {
      MEMRA_TRY(copy_bytes(latent_raw(l, dst), latent_raw(l, src),
                           size_t(max_len_) * s.row_width * dtype_size(latent_dtype_)));
      if (s.index_head_dim > 0) {
        MEMRA_TRY(copy_bytes(pool_keys(l, dst), pool_keys(l, src), size_t(max_len_ / s.kpool) * s.index_head_dim * 4));
        MEMRA_TRY(copy_bytes(tail_k(l, dst), tail_k(l, src), size_t(s.tail_rows) * s.index_head_dim * 4));
        MEMRA_TRY(copy_bytes(tail_gate(l, dst), tail_gate(l, src), size_t(s.tail_rows) * s.index_head_dim * 4));
      }
    } else if (s.kind == LayerStateSpec::Kind::kAttention) {
      const size_t bytes = size_t(max_len_) * s.kv_row() * dtype_size(latent_dtype_);
      MEMRA_TRY(copy_bytes(attn_k(l, dst), attn_k(l, src), bytes));
      MEMRA_TRY(copy_bytes(attn_v(l, dst), attn_v(l, src), bytes));
    }
  }
  MEMRA_TRY(sync_mirror(dst, lengths_[src], cur_[src]));
  lengths_[dst] = lengths_[src];
  cur_[dst] = cur_[src];
  return Status::Ok();
}

void Cache::rewrite(int slot, int kept) {
  auto& r = rewrites_[slot];
  while (!r.empty() && r.back().second >= kept) r.pop_back();
  r.emplace_back(++clock_[slot], kept);
}

std::vector<std::pair<uint8_t*, size_t>> Cache::undo_planes(int slot, int which) {
  std::vector<std::pair<uint8_t*, size_t>> out;
  for (int l = 0; l < num_layers(); ++l) {
    const auto& s = specs_[l];
    if (s.recurrent()) {
      out.emplace_back(reinterpret_cast<uint8_t*>(conv(l, slot, which)), size_t(s.conv_floats()) * 4);
      out.emplace_back(reinterpret_cast<uint8_t*>(state(l, slot, which)), size_t(s.state_floats()) * 4);
    } else if (s.kind == LayerStateSpec::Kind::kMla && s.index_head_dim > 0) {
      const size_t ring = size_t(s.tail_rows) * s.index_head_dim * 4;
      out.emplace_back(reinterpret_cast<uint8_t*>(tail_k(l, slot)), ring);
      out.emplace_back(reinterpret_cast<uint8_t*>(tail_gate(l, slot)), ring);
    }
  }
  return out;
}

Status Cache::snapshot(int slot, SlotSnapshot* out) {
  MEMRA_TRY(check_slot(slot, "Cache.snapshot"));
  SlotSnapshot s;
  s.cache_serial = serial_;
  s.slot = slot;
  s.length = lengths_[slot];
  s.cur = cur_[slot];
  s.clock = clock_[slot];
  const auto planes = undo_planes(slot, s.cur);
  for (const auto& p : planes) s.bytes += p.second;
  uint8_t* dst = nullptr;
  if (cuda_) {
    MEMRA_TRY(DeviceBuffer::create(cuda_, std::max<size_t>(s.bytes, 1), &s.device));
    dst = static_cast<uint8_t*>(s.device->data());
  } else {
    try {
      s.host.resize(std::max<size_t>(s.bytes, 1));
    } catch (const std::bad_alloc&) {
      return Status(kOutOfMemory, "Cache.snapshot: " + std::to_string(s.bytes) +
                                      " bytes of host memory could not be had");
    }
    dst = s.host.data();
  }
  for (const auto& p : planes) {
    MEMRA_TRY(copy_bytes(dst, p.first, p.second));
    dst += p.second;
  }
  *out = std::move(s);
  return Status::Ok();
}

Status Cache::restore(const SlotSnapshot& s, uint64_t owner) {
  const char* op = "Cache.restore";
  if (s.cache_serial != serial_) {
    return Status(kContractValue, std::string(op) + ": the snapshot was taken from another cache");
  }
  MEMRA_TRY(check_slot(s.slot, op));
  MEMRA_TRY(check_owner(s.slot, owner, op));
  if (lengths_[s.slot] < s.length) {
    return Status(kContractValue, std::string(op) + ": slot " + std::to_string(s.slot) + " holds " +
                                      std::to_string(lengths_[s.slot]) + " tokens, fewer than the " +
                                      std::to_string(s.length) +
                                      " of the snapshot: it was freed or overwritten since, and a "
                                      "snapshot only undoes steps appended after it");
  }
  for (const auto& [clock, kept] : rewrites_[s.slot]) {
    if (clock > s.clock && kept < s.length) {
      return Status(kContractValue, std::string(op) + ": slot " + std::to_string(s.slot) +
                                        " was freed, copied into or restored to an earlier point "
                                        "since the snapshot, so the rows it holds are no longer "
                                        "those the snapshot continues: a snapshot only undoes steps "
                                        "appended after it");
    }
  }
  const uint8_t* src = cuda_ ? static_cast<const uint8_t*>(s.device ? s.device->data() : nullptr)
                             : s.host.data();
  if (s.bytes > 0 && !src) return Status(kContractMissing, std::string(op) + ": empty snapshot");
  for (const auto& p : undo_planes(s.slot, s.cur)) {
    MEMRA_TRY(copy_bytes(p.first, src, p.second));
    src += p.second;
  }
  MEMRA_TRY(sync_mirror(s.slot, s.length, s.cur));
  lengths_[s.slot] = s.length;
  cur_[s.slot] = s.cur;
  rewrite(s.slot, s.length);
  return Status::Ok();
}

}  // namespace memra
