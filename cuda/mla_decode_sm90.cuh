// The batched MLA decode's sm_90a wgmma arm, shared between its two files: the attention kernel
// (cuda/mla_decode_sm90.cu) and its plan, launches and split combine
// (cuda/mla_decode_sm90_launch.cu). The kernel's arguments, its shared-memory layout (the
// launcher sizes the launch from kBytes) and how a sequence's splits merge.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace memra::cuda::mla_sm90 {

struct Sm90Args {
  const float* q_lat;         // [B, 64, 512] f32, 16-byte aligned
  const void* const* caches;  // [B] device pointers to bf16 rows of 512, 16-byte aligned
  const int32_t* t_kv;        // [B] rows visible to each sequence, clamped to [0, max_t_kv]
  int max_t_kv;
  int chunk;                  // rows per split, a multiple of the tile
  int nsplit;                 // splits in the grid
  float scale;
  float* o_lat;               // [B, 64, 512] f32, 16-byte aligned
  float* po;                  // partials [B, nsplit, 64, 512] (kMergeCombine / kMergeGrid)
  float* pm;                  // [B, nsplit, 64] running max, log2 domain
  float* pl;                  // [B, nsplit, 64] sum of the rounded p
  unsigned* seq_tickets;      // kMergeGrid: [B][2] arrivals, departures (zero between launches)
};

// How the active splits of a sequence (several, when its rows span more than one chunk) merge:
// - kMergeCombine: each writes its partial (po, pm, pl) and mla_combine_kernel, a second launch,
//   merges them (any grid);
// - kMergeCluster: the sequence's splits are one thread-block cluster (cluster dims (nsplit, 1,
//   1)); each block leaves its O, m and L in its shared memory and block r merges heads
//   [64 r / nsplit, 64 (r + 1) / nsplit) through distributed shared memory (every cluster of
//   the grid resident at once);
// - kMergeGrid: each writes its partial, the sequence's active blocks meet at a barrier of
//   atomic counters (seq_tickets) and block r of the nsb active ones merges heads
//   [64 r / nsb, 64 (r + 1) / nsb) from the partials (the whole grid resident at once: a
//   cooperative launch of at most one block an SM).
// Each merged head: w_q = 2^(m_q - max m), O = sum_q w_q O_q / sum_q w_q L_q over the active
// splits q in ascending order.
enum Merge : int { kMergeCombine = 0, kMergeCluster = 1, kMergeGrid = 2 };

constexpr int kTileRows = 64;  // cache rows a block (mla_sm90.cuh's kTile)
constexpr int kH = 64;
constexpr int kR = 512;
constexpr int kThreads = 256;
constexpr int kSub = kTileRows * 128;      // one 64-column box of a block (8 KiB)
constexpr int kBlk = 8 * kSub;             // a block: 64 rows x 512 columns (64 KiB)
constexpr int kQOff = 0;                   // the query, bf16, 8 boxes of [64 heads][64]
constexpr int kK0Off = kBlk;               // the pair's even block
constexpr int kK1Off = 2 * kBlk;           // the pair's odd block
constexpr int kP0Off = 3 * kBlk;           // P of the even block (bf16 [64 heads][64 rows])
constexpr int kP1Off = kP0Off + kSub;      // P of the odd block
constexpr int kMOff = kP1Off + kSub;       // running max [64] (log2 units)
constexpr int kS0Off = kMOff + 4 * 64;     // the even block's rescale factors [64]
constexpr int kS1Off = kS0Off + 4 * 64;    // the odd block's [64]
constexpr int kLOff = kS1Off + 4 * 64;     // row sums [2 warpgroups][64] (the epilogue)
constexpr int kMapOff = kLOff + 4 * 128;   // this block's tensor map (128 bytes)
constexpr int kBarOff = kMapOff + 128;     // mbarriers [2 buffers][8 boxes]
constexpr int kBytes = kBarOff + 16 * 8 + 1024;
constexpr int kOStride = kR + 8;  // a head's row of O in the cluster merge (floats)
static_assert(kH * kOStride * 4 <= kP0Off, "the cluster merge's O fits below the P buffers");
constexpr int kMaxClusterSplits = 16;  // the largest (non-portable) cluster
constexpr int kMaxSplits = 1024;       // combine weights in shared memory: 4 x 4 KiB at most
// merge_heads' scratch in the P buffers: ceil(64 / parts) x (3 nsb + 1) floats when `parts`
// blocks merge nsb <= parts active splits (parts = nsplit in a cluster, nsb in the grid merge).
constexpr int merge_scratch_floats() {
  int most = 0;
  for (int p = 2; p <= kMaxSplits; ++p) {
    const int f = (kH + p - 1) / p * (3 * p + 1);
    most = f > most ? f : most;
  }
  return most;
}
static_assert(4 * merge_scratch_floats() <= 2 * kSub, "merge_heads' scratch fits the P buffers");

// The attention kernel in form `merge` (a Merge), defined in cuda/mla_decode_sm90.cu (a
// __global__ template's instantiations must live in the file that defines it).
using KernelFn = void (*)(const Sm90Args, const CUtensorMap, unsigned char*);
KernelFn wgmma_kernel(int merge);

}  // namespace memra::cuda::mla_sm90
