// The per-sequence state of a model: max_batch slots, each with its own length, and one plane per
// layer (DESIGN.md "Runtime objects").
//
//   KDA layer   conv ring [3*qkv, K-1] and recurrent state [H, dk, dv] f32, each a ping-pong pair:
//               a step reads plane cur(slot) and writes plane 1-cur(slot); commit() flips cur.
//               Until commit the slot's visible state is untouched, which gives exact rollback
//               of an uncommitted step and keeps "error => cache unchanged" cheap.
//   MLA layer   latent rows [max_len, kv_rank + d_rope] (normalised latent | k_pe); rows past
//               length(slot) are scratch until commit advances the length.
//   DSA indexer resident pool keys [max_len / kpool, d] (final once their last row lands) and a
//               tail ring of raw indexer rows (k and gate, [tail_rows, d] each) holding the rows
//               of the incomplete pool; tail_rows is a multiple of kpool so a pool's rows stay
//               contiguous across the wrap.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memra/status.h"

namespace memra {

struct LayerStateSpec {
  enum class Kind : int { kNone = 0, kKda = 1, kMla = 2 };
  Kind kind = Kind::kNone;
  // KDA
  int heads = 0, head_dim = 0, conv_kernel = 0;
  // MLA
  int row_width = 0;       // kv_rank + d_rope
  int index_head_dim = 0;  // 0: no indexer state (a "shared" DSA layer or plain MLA)
  int kpool = 0;
  int tail_rows = 0;       // ring rows, a multiple of kpool (0 when no indexer)

  int64_t conv_floats() const { return int64_t(3) * heads * head_dim * (conv_kernel - 1); }
  int64_t state_floats() const { return int64_t(heads) * head_dim * head_dim; }
};

class Cache {
 public:
  // Validates the specs, checks the bytes against available memory (kOutOfMemory before
  // allocating anything) and allocates zeroed planes.
  static Status create(int max_batch, int max_len, std::vector<LayerStateSpec> specs,
                       std::unique_ptr<Cache>* out);
  // Bytes the planes of such a cache take.
  static int64_t bytes_needed(int max_batch, int max_len, const std::vector<LayerStateSpec>& specs);

  int max_batch() const { return max_batch_; }
  int max_len() const { return max_len_; }
  int num_layers() const { return static_cast<int>(specs_.size()); }
  const LayerStateSpec& spec(int layer) const { return specs_[layer]; }
  int64_t nbytes() const { return nbytes_; }

  int length(int slot) const { return lengths_[slot]; }
  int cur(int slot) const { return cur_[slot]; }

  // Contract checks shared by every entry point (op names the caller).
  Status check_slot(int slot, const char* op) const;
  Status check_layer(int layer, LayerStateSpec::Kind kind, const char* op) const;
  // check_layer plus: the plane was made for exactly this geometry (heads, head_dim, kernel,
  // row width, indexer width, kpool, ring rows). A cache of another geometry is refused before
  // anything is read or written through it.
  Status check_layer(int layer, const LayerStateSpec& want, const char* op) const;
  // kCacheFull when slot cannot take n more tokens.
  Status check_room(int slot, int n, const char* op) const;

  // Planes of (layer, slot). which = 0/1 selects the ping-pong plane (cur or 1 - cur).
  float* conv(int layer, int slot, int which);
  float* state(int layer, int slot, int which);
  float* latent(int layer, int slot);       // [max_len, row_width]
  float* pool_keys(int layer, int slot);    // [max_len / kpool, index_head_dim]
  float* tail_k(int layer, int slot);       // [tail_rows, index_head_dim]
  float* tail_gate(int layer, int slot);    // [tail_rows, index_head_dim]

  // Advance slot by n tokens and flip its ping-pong planes (after every layer ran the step).
  Status commit(int slot, int n);
  // Forget a slot: length 0, recurrent planes zeroed.
  Status free(int slot);
  // Copy the whole state of src into dst (prefix reuse).
  Status copy_slot(int src, int dst);

 private:
  Cache() = default;
  struct Plane {
    std::vector<float> conv[2], state[2];  // [max_batch, ...] each
    std::vector<float> latent, pool_keys, tail_k, tail_gate;
  };
  int max_batch_ = 0, max_len_ = 0;
  int64_t nbytes_ = 0;
  std::vector<LayerStateSpec> specs_;
  std::vector<Plane> planes_;
  std::vector<int> lengths_;
  std::vector<int> cur_;
};

}  // namespace memra
