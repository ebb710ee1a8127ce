// The per-sequence state of a model: max_batch slots, each with its own length, and one plane per
// layer.
//
//   KDA layer   conv ring [3*qkv, K-1] and recurrent state [H, dk, dv] f32, each a ping-pong pair:
//               a step reads plane cur(slot) and writes plane 1-cur(slot); commit() flips cur.
//               Until commit the slot's visible state is untouched, which gives exact rollback
//               of an uncommitted step and keeps "error => cache unchanged" cheap.
//   GDN layer   conv ring [2*Hk*dk + Hv*dv, K-1] and recurrent state [Hv, dk, dv] f32, a
//               ping-pong pair each, as KDA's (Gated DeltaNet: Hk key heads of dk, Hv value heads
//               of dv; the ring holds the conv's last K-1 inputs of the q | k | v channels).
//   MLA layer   latent rows [max_len, kv_rank + d_rope] (normalised latent | k_pe); rows past
//               length(slot) are scratch until commit advances the length.
//   DSA indexer resident pool keys [max_len / kpool, d] (final once their last row lands) and a
//               tail ring of raw indexer rows (k and gate, [tail_rows, d] each) holding the rows
//               of the incomplete pool; tail_rows is a multiple of kpool so a pool's rows stay
//               contiguous across the wrap.
//   Attention   key rows and value rows [max_len, kv_heads, head_dim] each (full softmax
//               attention: the Qwen3.5 / Qwen3-Next gated attention, AttentionLayer); like the
//               MLA latent rows, rows past length(slot) are scratch until commit advances it.
//
// Storage: one arena holding every plane, in host memory for the CPU backend or one device
// allocation for a CUDA engine (plane accessors then return device pointers). The MLA latent rows
// and the attention K / V rows are f32, or bf16 on a CUDA cache made with latent_dtype = bf16;
// every other plane is f32.
//
// Device mirrors (CUDA caches only; docs/decode_graphs.md): the arena also holds int32
// lengths_d [max_batch] and cur_d [max_batch], equal to length(s) / cur(s). Every host-side
// mutation (commit, free, copy_slot) updates the host vectors and enqueues small async copies of
// the changed entries on the context's stream (no host sync), so work enqueued after it (a
// captured decode graph reading slots' lengths and ping-pong flags) sees the host's values.
// A device-side commit (memra_cuda_commit_decode) followed by the same Cache::commit leaves both
// equal (the copies write absolute values).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memra/device.h"
#include "memra/status.h"
#include "memra/tensor.h"

namespace memra {

struct LayerStateSpec {
  enum class Kind : int { kNone = 0, kKda = 1, kMla = 2, kGdn = 3, kAttention = 4 };
  Kind kind = Kind::kNone;
  // KDA (heads of head_dim, dk == dv); GDN: heads = value heads (the state's), head_dim = dk,
  // key_heads = Hk, value_dim = dv (both 0 for KDA); attention: heads = the K / V heads,
  // head_dim their width
  int heads = 0, head_dim = 0, conv_kernel = 0;
  int key_heads = 0, value_dim = 0;
  // MLA
  int row_width = 0;       // kv_rank + d_rope
  int index_head_dim = 0;  // 0: no indexer state (a "shared" DSA layer or plain MLA)
  int kpool = 0;
  int tail_rows = 0;       // ring rows, a multiple of kpool (0 when no indexer)

  // A recurrent layer's planes (KDA or GDN): the conv ring's floats [channels, K-1] and the
  // state's [heads, head_dim, dv] of one slot.
  bool recurrent() const { return kind == Kind::kKda || kind == Kind::kGdn; }
  int64_t conv_channels() const {
    return kind == Kind::kGdn ? int64_t(2) * key_heads * head_dim + int64_t(heads) * value_dim
                              : int64_t(3) * heads * head_dim;
  }
  int64_t conv_floats() const { return conv_channels() * (conv_kernel - 1); }
  int64_t state_floats() const {
    return int64_t(heads) * head_dim * (kind == Kind::kGdn ? value_dim : head_dim);
  }
  // Attention: elements of one key (or value) row, [kv_heads, head_dim].
  int64_t kv_row() const { return int64_t(heads) * head_dim; }
};

class Cache;

// An undo point of one slot: what a step appended to the slot may overwrite of the state it
// continues. That is the committed ping-pong planes of its recurrent layers (a step writes the
// other plane, but the step after the next commit writes over these) and the DSA indexer's tail
// ring (new rows land at position % tail_rows, over the incomplete pool's rows); latent, key and
// value rows and pool keys below the slot's length are never written by an appended step.
// Made by Cache::snapshot, put back by Cache::restore (a chunked prefill that fails after some
// of its chunks were committed). Host bytes for a CPU cache, a device buffer for a CUDA one.
struct SlotSnapshot {
  uint64_t cache_serial = 0;  // the Cache it was taken from (restore refuses another's)
  int slot = 0, length = 0, cur = 0;
  uint64_t clock = 0;  // the slot's clock when taken (restore checks what was rewritten since)
  size_t bytes = 0;
  std::vector<uint8_t> host;             // CPU cache
  std::shared_ptr<DeviceBuffer> device;  // CUDA cache
};

class Cache {
 public:
  // Validates the specs, checks the bytes against available memory (host MemAvailable, or the
  // device's free memory for a CUDA cache; kOutOfMemory before allocating anything) and allocates
  // zeroed planes. cuda == nullptr: host arena. latent_dtype: kF32, or kBF16 (CUDA only).
  static Status create(int max_batch, int max_len, std::vector<LayerStateSpec> specs,
                       std::unique_ptr<Cache>* out);
  static Status create(std::shared_ptr<CudaContext> cuda, DType latent_dtype, int max_batch,
                       int max_len, std::vector<LayerStateSpec> specs, std::unique_ptr<Cache>* out);
  // Bytes the planes of such a cache take.
  // device: include the device mirrors (a CUDA cache; a few hundred bytes more).
  static int64_t bytes_needed(int max_batch, int max_len, const std::vector<LayerStateSpec>& specs,
                              DType latent_dtype = DType::kF32, bool device = false);

  bool on_device() const { return cuda_ != nullptr; }
  const std::shared_ptr<CudaContext>& cuda() const { return cuda_; }
  DType latent_dtype() const { return latent_dtype_; }
  int max_batch() const { return max_batch_; }
  int max_len() const { return max_len_; }
  int num_layers() const { return static_cast<int>(specs_.size()); }
  const LayerStateSpec& spec(int layer) const { return specs_[layer]; }
  int64_t nbytes() const { return nbytes_; }

  int length(int slot) const { return lengths_[slot]; }
  int cur(int slot) const { return cur_[slot]; }
  // Device mirrors of the lengths and ping-pong flags, int32 [max_batch] each (nullptr on a CPU
  // cache). Written by the host-side mutations below; a device commit may write them too.
  int32_t* lengths_d() const { return mirror(0); }
  int32_t* cur_d() const { return mirror(1); }

  // Contract checks shared by every entry point (op names the caller).
  Status check_slot(int slot, const char* op) const;
  Status check_layer(int layer, LayerStateSpec::Kind kind, const char* op) const;
  // check_layer plus: the plane was made for exactly this geometry (heads, head_dim, kernel,
  // row width, indexer width, kpool, ring rows). A cache of another geometry is refused before
  // anything is read or written through it.
  Status check_layer(int layer, const LayerStateSpec& want, const char* op) const;
  // kContractDevice unless the planes live where a layer on `cuda` runs (the same CUDA context,
  // hence the same device and stream; nullptr = host).
  Status check_device(const std::shared_ptr<CudaContext>& cuda, const char* op) const;
  // kCacheFull when slot cannot take n more tokens.
  Status check_room(int slot, int n, const char* op) const;

  // Planes of (layer, slot). which = 0/1 selects the ping-pong plane (cur or 1 - cur).
  float* conv(int layer, int slot, int which);
  float* state(int layer, int slot, int which);
  float* latent(int layer, int slot);       // [max_len, row_width] (f32 caches)
  void* latent_raw(int layer, int slot);    // [max_len, row_width] in latent_dtype()
  float* pool_keys(int layer, int slot);    // [max_len / kpool, index_head_dim]
  float* tail_k(int layer, int slot);       // [tail_rows, index_head_dim]
  float* tail_gate(int layer, int slot);    // [tail_rows, index_head_dim]
  // Attention: key / value rows [max_len, kv_heads, head_dim] in latent_dtype(); slot s's plane
  // is slot 0's plus s * max_len * kv_row() elements.
  void* attn_k(int layer, int slot);
  void* attn_v(int layer, int slot);

  // Slot ownership. A slot is free (owner 0) or held by one owner: the nonzero token hold()
  // handed out (memra's generations and server requests hold the slots they run in). The
  // mutations below take the caller's token (`owner`, 0 = none) and refuse a slot held by
  // another token, or a nonzero token that holds no slot there, with kContractSlotHeld before
  // changing anything; reads (length, planes, the source of copy_slot) stay open to everyone.
  uint64_t owner(int slot) const { return owners_[slot]; }
  // Hold a free slot (its contents are left as they are): *token receives a fresh nonzero token,
  // unique in the process (so a token of one cache never holds a slot of another).
  // kContractSlotHeld when another owner holds it.
  Status hold(int slot, uint64_t* token);
  // Give a held slot back (contents untouched). kContractSlotHeld unless `token` holds it.
  Status release(int slot, uint64_t token);
  // kContractSlotHeld when `slot` is held by an owner other than `token`, or when a nonzero
  // `token` does not hold it (a released hold, or a token of another cache).
  Status check_owner(int slot, uint64_t token, const char* op) const;

  // Advance slot by n tokens and flip its ping-pong planes (after every layer ran the step).
  Status commit(int slot, int n, uint64_t owner = 0);
  // A decode step's commit on the device (CUDA caches): lengths_d[s] += 1 and cur_d[s] ^= 1 for
  // every row of slots_d [B] (device int32, -1 = idle row skipped); enqueued on the stream, no
  // host round trip (it can be captured into a graph). The host copies are NOT touched: follow
  // with commit_host(s, 1) for each active slot once the step is enqueued.
  Status commit_decode(const int32_t* slots_d, int B);
  // The host half of commit_decode: advance the host's length and flag of `slot` by n tokens
  // without writing the device mirrors (a device commit already did). kCacheFull as commit.
  Status commit_host(int slot, int n, uint64_t owner = 0);
  // Forget a slot: length 0, recurrent planes zeroed.
  Status free(int slot, uint64_t owner = 0);
  // Copy the whole state of src into dst (prefix reuse); dst's owner is checked, src is only read.
  Status copy_slot(int src, int dst, uint64_t owner = 0);
  // An undo point of `slot` (SlotSnapshot; the copies are enqueued on the stream for a CUDA
  // cache, no host wait). kOutOfMemory when its buffer cannot be had (nothing changed).
  Status snapshot(int slot, SlotSnapshot* out);
  // Put `s` back into its slot: length, ping-pong flag and the saved planes, undoing every step
  // appended to the slot after the snapshot. Only appends: a slot freed, copied into, restored
  // to an earlier point since, or shorter than at the snapshot is refused (kContractValue), as
  // is another cache's snapshot;
  // kContractSlotHeld as commit.
  Status restore(const SlotSnapshot& s, uint64_t owner = 0);
  // Copy `bytes` from a plane pointer into host memory (waits for the device for a CUDA cache).
  Status read(void* host_dst, const void* plane_src, size_t bytes) const;

 private:
  Cache() = default;
  // Byte offsets of each plane in the arena.
  struct Plane {
    size_t conv[2] = {0, 0}, state[2] = {0, 0};  // [max_batch, ...] each
    size_t latent = 0, pool_keys = 0, tail_k = 0, tail_gate = 0;
    size_t attn_k = 0, attn_v = 0;  // [max_batch, max_len, kv_heads, head_dim] each
  };
  Status allocate();
  Status fill_zero(void* p, size_t bytes);
  Status copy_bytes(void* dst, const void* src, size_t bytes);
  // Enqueue the host's length and flag of `slot` into the device mirrors (no-op on the host).
  Status sync_mirror(int slot, int length, int cur);
  int32_t* mirror(int which) const {
    return cuda_ ? reinterpret_cast<int32_t*>(arena_ptr_ + mirror_off_) + size_t(which) * max_batch_
                 : nullptr;
  }
  uint8_t* base() const { return arena_ptr_; }
  std::shared_ptr<CudaContext> cuda_;
  DType latent_dtype_ = DType::kF32;
  std::vector<float> host_arena_;
  std::shared_ptr<DeviceBuffer> device_arena_;
  uint8_t* arena_ptr_ = nullptr;
  int max_batch_ = 0, max_len_ = 0;
  int64_t nbytes_ = 0;
  std::vector<LayerStateSpec> specs_;
  std::vector<Plane> planes_;
  size_t mirror_off_ = 0;  // byte offset of lengths_d (cur_d follows); CUDA caches only
  std::vector<int> lengths_;
  std::vector<int> cur_;
  std::vector<uint64_t> owners_;  // [max_batch]: 0 = free, else the holder's token
  uint64_t serial_ = 0;  // unique per cache made in this process (snapshots name it)
  // Per slot, what a snapshot needs to know of the rewrites after it: clock_ counts the events
  // that rewrite a slot's rows below its length (free, copy_slot into it, restore), and
  // rewrites_ holds (clock after the event, rows kept: -1 for free / copy_slot, the snapshot's
  // length for restore), floors strictly increasing (an event keeping fewer rows drops the
  // earlier entries keeping as many or more). A snapshot is valid while no entry after its clock
  // keeps fewer rows than its length.
  std::vector<uint64_t> clock_;
  std::vector<std::vector<std::pair<uint64_t, int>>> rewrites_;
  void rewrite(int slot, int kept);
  // The planes a snapshot holds, in its order: (plane pointer, bytes) for `slot` with the
  // recurrent layers' plane `which`.
  std::vector<std::pair<uint8_t*, size_t>> undo_planes(int slot, int which);
};

}  // namespace memra
