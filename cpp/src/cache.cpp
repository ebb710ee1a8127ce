#include "memra/cache.h"

#include <algorithm>
#include <cstdio>
#include <new>
#include "memra/msg.h"
#include <string>

namespace memra {

namespace {

// Host memory the kernel reports as available (MemAvailable), or -1 when unknown.
int64_t available_host_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long long kb = -1;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    kb = -1;
  }
  std::fclose(f);
  return kb < 0 ? -1 : static_cast<int64_t>(kb) * 1024;
}

std::string spec_error(int layer, const std::string& what) {
  return "Cache: layer " + std::to_string(layer) + ": " + what;
}

}  // namespace

int64_t Cache::bytes_needed(int max_batch, int max_len, const std::vector<LayerStateSpec>& specs) {
  int64_t floats = 0;
  for (const auto& s : specs) {
    if (s.kind == LayerStateSpec::Kind::kKda) {
      floats += 2 * int64_t(max_batch) * (s.conv_floats() + s.state_floats());
    } else if (s.kind == LayerStateSpec::Kind::kMla) {
      floats += int64_t(max_batch) * max_len * s.row_width;
      if (s.index_head_dim > 0) {
        floats += int64_t(max_batch) * (max_len / s.kpool) * s.index_head_dim;
        floats += int64_t(max_batch) * 2 * s.tail_rows * s.index_head_dim;
      }
    }
  }
  return floats * int64_t(sizeof(float));
}

Status Cache::create(int max_batch, int max_len, std::vector<LayerStateSpec> specs,
                     std::unique_ptr<Cache>* out) {
  if (max_batch < 1 || max_len < 1) {
    return Status(kContractValue, "Cache: max_batch and max_len must be >= 1, got max_batch=" +
                                      std::to_string(max_batch) +
                                      ", max_len=" + std::to_string(max_len));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    if (s.kind == LayerStateSpec::Kind::kKda &&
        (s.heads < 1 || s.head_dim < 1 || s.conv_kernel < 1)) {
      return Status(kContractValue, spec_error(int(i), "KDA heads, head_dim and conv_kernel must be >= 1"));
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
  const int64_t need = bytes_needed(max_batch, max_len, specs);
  const int64_t avail = available_host_bytes();
  if (avail >= 0 && need > avail) {
    Msg os;
    os << "Cache: " << max_batch << " slots x " << max_len << " tokens need " << need
       << " bytes of host memory, but only " << avail << " are available";
    return Status(kOutOfMemory, os.str());
  }
  std::unique_ptr<Cache> c(new Cache());
  c->max_batch_ = max_batch;
  c->max_len_ = max_len;
  c->nbytes_ = need;
  c->specs_ = std::move(specs);
  c->lengths_.assign(max_batch, 0);
  c->cur_.assign(max_batch, 0);
  try {
    c->planes_.resize(c->specs_.size());
    for (size_t i = 0; i < c->specs_.size(); ++i) {
      const auto& s = c->specs_[i];
      Plane& p = c->planes_[i];
      if (s.kind == LayerStateSpec::Kind::kKda) {
        for (int w = 0; w < 2; ++w) {
          p.conv[w].assign(size_t(max_batch) * s.conv_floats(), 0.0f);
          p.state[w].assign(size_t(max_batch) * s.state_floats(), 0.0f);
        }
      } else if (s.kind == LayerStateSpec::Kind::kMla) {
        p.latent.assign(size_t(max_batch) * max_len * s.row_width, 0.0f);
        if (s.index_head_dim > 0) {
          p.pool_keys.assign(size_t(max_batch) * (max_len / s.kpool) * s.index_head_dim, 0.0f);
          p.tail_k.assign(size_t(max_batch) * s.tail_rows * s.index_head_dim, 0.0f);
          p.tail_gate.assign(size_t(max_batch) * s.tail_rows * s.index_head_dim, 0.0f);
        }
      }
    }
  } catch (const std::bad_alloc&) {
    return Status(kOutOfMemory, "Cache: allocation of " + std::to_string(need) + " bytes failed");
  }
  *out = std::move(c);
  return Status::Ok();
}

Status Cache::check_slot(int slot, const char* op) const {
  if (slot < 0 || slot >= max_batch_) {
    return Status(kContractRange, std::string(op) + ": slot " + std::to_string(slot) +
                                      " is outside [0, " + std::to_string(max_batch_) + ")");
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
                    h.conv_kernel == want.conv_kernel && h.row_width == want.row_width &&
                    h.index_head_dim == want.index_head_dim && h.kpool == want.kpool &&
                    h.tail_rows == want.tail_rows;
  if (!same) {
    return Status(kContractShape,
                  std::string(op) + ": cache layer " + std::to_string(layer) +
                      " was made for another geometry (cache: heads=" + std::to_string(h.heads) +
                      " head_dim=" + std::to_string(h.head_dim) + " conv_kernel=" +
                      std::to_string(h.conv_kernel) + " row_width=" + std::to_string(h.row_width) +
                      " index_head_dim=" + std::to_string(h.index_head_dim) + " kpool=" +
                      std::to_string(h.kpool) + " tail_rows=" + std::to_string(h.tail_rows) +
                      "; layer: heads=" + std::to_string(want.heads) + " head_dim=" +
                      std::to_string(want.head_dim) + " conv_kernel=" + std::to_string(want.conv_kernel) +
                      " row_width=" + std::to_string(want.row_width) + " index_head_dim=" +
                      std::to_string(want.index_head_dim) + " kpool=" + std::to_string(want.kpool) +
                      " tail_rows=" + std::to_string(want.tail_rows) + ")");
  }
  return Status::Ok();
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
  const auto& s = specs_[layer];
  return planes_[layer].conv[which].data() + int64_t(slot) * s.conv_floats();
}
float* Cache::state(int layer, int slot, int which) {
  const auto& s = specs_[layer];
  return planes_[layer].state[which].data() + int64_t(slot) * s.state_floats();
}
float* Cache::latent(int layer, int slot) {
  return planes_[layer].latent.data() + int64_t(slot) * max_len_ * specs_[layer].row_width;
}
float* Cache::pool_keys(int layer, int slot) {
  const auto& s = specs_[layer];
  return planes_[layer].pool_keys.data() + int64_t(slot) * (max_len_ / s.kpool) * s.index_head_dim;
}
float* Cache::tail_k(int layer, int slot) {
  const auto& s = specs_[layer];
  return planes_[layer].tail_k.data() + int64_t(slot) * s.tail_rows * s.index_head_dim;
}
float* Cache::tail_gate(int layer, int slot) {
  const auto& s = specs_[layer];
  return planes_[layer].tail_gate.data() + int64_t(slot) * s.tail_rows * s.index_head_dim;
}

Status Cache::commit(int slot, int n) {
  MEMRA_TRY(check_room(slot, n, "Cache.commit"));
  lengths_[slot] += n;
  cur_[slot] ^= 1;
  return Status::Ok();
}

Status Cache::free(int slot) {
  MEMRA_TRY(check_slot(slot, "Cache.free"));
  lengths_[slot] = 0;
  cur_[slot] = 0;
  for (int l = 0; l < num_layers(); ++l) {
    if (specs_[l].kind != LayerStateSpec::Kind::kKda) continue;
    for (int w = 0; w < 2; ++w) {
      std::fill_n(conv(l, slot, w), specs_[l].conv_floats(), 0.0f);
      std::fill_n(state(l, slot, w), specs_[l].state_floats(), 0.0f);
    }
  }
  return Status::Ok();
}

Status Cache::copy_slot(int src, int dst) {
  MEMRA_TRY(check_slot(src, "Cache.copy_slot"));
  MEMRA_TRY(check_slot(dst, "Cache.copy_slot"));
  if (src == dst) return Status::Ok();
  for (int l = 0; l < num_layers(); ++l) {
    const auto& s = specs_[l];
    if (s.kind == LayerStateSpec::Kind::kKda) {
      for (int w = 0; w < 2; ++w) {
        std::copy_n(conv(l, src, w), s.conv_floats(), conv(l, dst, w));
        std::copy_n(state(l, src, w), s.state_floats(), state(l, dst, w));
      }
    } else if (s.kind == LayerStateSpec::Kind::kMla) {
      std::copy_n(latent(l, src), int64_t(max_len_) * s.row_width, latent(l, dst));
      if (s.index_head_dim > 0) {
        std::copy_n(pool_keys(l, src), int64_t(max_len_ / s.kpool) * s.index_head_dim, pool_keys(l, dst));
        std::copy_n(tail_k(l, src), int64_t(s.tail_rows) * s.index_head_dim, tail_k(l, dst));
        std::copy_n(tail_gate(l, src), int64_t(s.tail_rows) * s.index_head_dim, tail_gate(l, dst));
      }
    }
  }
  lengths_[dst] = lengths_[src];
  cur_[dst] = cur_[src];
  return Status::Ok();
}

}  // namespace memra
