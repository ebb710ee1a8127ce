// Shared by the batched MLA decode sources (cuda/mla_decode.cu: plan, f32 kernel, combine;
// cuda/mla_decode_tc.cu: the tensor-core kernel): the kernels' launch arguments and constants.
#pragma once

#include <cstdint>

#include "common.cuh"

namespace memra::cuda::mla {

// cuda/mla_decode_tc.cu: the tensor-core kernel's shared bytes and its launch over `groups` head
// groups of 16 * mt heads (mt 2 or 4; R in {128, 256, 512}; d_rope 0, or kTcRope at mt 2 only:
// 4 m-tiles of 576-wide rows exceed an SM's shared memory). args, bytes: the caller's DecodeArgs
// (below) and its size, copied into the launcher's own: each source has its own DecodeArgs, a
// type of its anonymous namespace as the kernels taking it are (the type's name is part of their
// symbols).
size_t decode_tc_smem_bytes(int mt, int R, int d_rope);
// The rope width the tensor-core kernel is instantiated for besides 0 (Kimi-Linear's
// qk_rope_head_dim: rows of 512 + 64 = 576, FlashMLA's shape).
constexpr int kTcRope = 64;
int launch_decode_tc(MemraCudaCtx* ctx, int mt, const void* args, size_t bytes, int groups);

}  // namespace memra::cuda::mla

namespace {

// The launch arguments of the batched decode kernels, filled by the plan (cuda/mla_decode.cu).
struct DecodeArgs {
  const float* q_lat;          // [B, H, R]
  const void* const* caches;   // [B] device pointers, rows of R + d_rope elements
  const int32_t* t_kv;         // [B]
  const int32_t* list;         // compacted lists [B, width] (gathered) or null (dense)
  const int* counts;           // [B] entries of each compacted list (gathered) or null
  int width;
  int B, H, R;
  int max_t_kv;                // t_kv[b] is clamped to [0, max_t_kv]
  int chunk;                   // rows (entries) per split, a multiple of kTileRows
  int nsplit;                  // splits in the grid
  float scale;
  float* o_lat;                // [B, H, R]
  float* po;                   // partials [B, nsplit, H, R] (nsplit > 1)
  float* pm;                   // [B, nsplit, H]
  float* pl;                   // [B, nsplit, H]
  int combine_fast;            // 1: the combine's one-round-trip form where it applies
  // Rope columns (Kimi-Linear): rows are R + d_rope wide (the latent, then k_pe); scores add
  // q_pe . k_pe; the output is over the latent (first R) columns only. Read only by the rope
  // instantiations (d_rope == 0: the latent-only kernels, which never touch these fields).
  const float* q_pe;           // [B, H, d_rope] (d_rope > 0)
  int d_rope;
};

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;  // 8 warps, both attention kernels and the compaction
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 64;  // rows per tile; split chunks are multiples of it

// Rows (dense) or list entries (gathered) sequence b attends over.
__device__ __forceinline__ int rows_of(const DecodeArgs& a, int b) {
  if (a.counts) return a.counts[b];
  return min(max(a.t_kv[b], 0), a.max_t_kv);
}

__device__ __forceinline__ int64_t partial_index(const DecodeArgs& a, int b, int s, int h) {
  return (static_cast<int64_t>(b) * a.nsplit + s) * a.H + h;
}

// Zeros for heads [h0, h0 + nh) of sequence b (an idle row or an empty list).
__device__ __forceinline__ void zero_heads(const DecodeArgs& a, int b, int h0, int nh) {
  float* o = a.o_lat + (static_cast<int64_t>(b) * a.H + h0) * a.R;
  const int64_t n = static_cast<int64_t>(nh) * a.R;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) o[k] = 0.0f;
}

}  // namespace
