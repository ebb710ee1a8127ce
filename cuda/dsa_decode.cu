// Batched decode forms of the DSA k-pool indexer (cpp/include/memra/cuda_abi/dsa.h: kpool_append,
// kpool_score, kpool_select with batched 1; cuda/dsa.cu's entries hand them over): B sequences,
// one token each, in one launch per op. Per-sequence state is reached through device arrays of
// device pointers and the positions live on the device (pos[b] = tokens sequence b held before
// this one; pos[b] < 0 marks an idle row), so a captured CUDA graph replays at any position:
// every grid below depends on the host bounds B, d, max_pools only, never on a position.
//
// Bytes: each op gives, per sequence, exactly the bytes of the per-sequence op of cuda/dsa.cu with
// T = t_q = 1 (kpool_append at pos; kpool_score / kpool_select with first_pos = pos and
// n_pools = (pos + 1) / pool): the pool key's softmax, relu and the radix select come from
// cuda/dsa_common.cuh, shared with dsa.cu; each score is the sum over heads ascending of
// w * head_scale * relu(qk_scale * dot) with the dot over channels ascending, as there.
//
// Plans (all on ctx->stream, no host sync, no allocation):
//   append: grid (ceil(d / 128), B); thread (b, c): when the token completes a pool
//     ((pos + 1) % pool == 0) channel c of that pool's key (rows before pos from the ring, row pos
//     from k[b]), then channel c of row pos into ring slot pos % tail_rows. The slot written is
//     none of the ring slots the key reads (tail_rows is a multiple of pool >= pool), and one
//     thread owns channel c of a sequence, so one kernel does both without a barrier.
//   score: grid (ceil(max_pools / 64), B), 512 threads, d <= 128 and Hi <= 32: the block's 64
//     keys stay in shared memory ([64][d + 1]: conflict-free per-thread rows); 8 head groups per
//     pool, each thread running 4 heads' dot chains at once and writing their terms to shared
//     memory, then one thread per pool sums the terms in h order (the reference's bytes); q read
//     as block-uniform broadcast loads (float4 when q is 16-byte aligned and d % 4 == 0). A block
//     whose pools are all past the sequence's n_pools writes -inf and exits (reading no key).
//     Otherwise: one thread per (sequence, pool), keys from global.
//   select: one block (512 threads) per sequence: dsa.cu's radix select over the visible pools
//     [0, n_pools) (8-bit digits of a 64-bit key, most significant first), a block scan in pool
//     order, then the tail rows and -1 padding; an idle row writes width -1s.
//
// Scores do Hi * d multiply-adds per (sequence, visible pool) as separate FMUL + FADD (no FMA,
// for the CPU's bytes), so they are issue-bound rather than bound by the keys' bytes (the
// estimates at GLM-5.3-Flash's indexer shape: docs/kernels.md "DSA").
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "dsa_common.cuh"
#include "gather_compact.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;

namespace {

using memra::cuda::dsa::append_decode_channel;
using memra::cuda::dsa::DecodeRows;
using memra::cuda::dsa::kSelectThreads;
using memra::cuda::dsa::kSelectWarps;
using memra::cuda::dsa::pool_key_channel;
using memra::cuda::dsa::radix_select_row;
using memra::cuda::dsa::relu_cpu;

constexpr unsigned kMaxGridY = 65535u;  // sequences past it: grid-stride over blockIdx.y

// -------------------------------------------------------------------------------- append

constexpr int kAppendThreads = 128;

// (No __launch_bounds__: with it ptxas caps the kernel at 64 registers and spills 8 bytes.)
__global__ void append_decode_kernel(const float* __restrict__ k, const float* __restrict__ gate,
                                     int B, int d, const float* __restrict__ ape, int pool,
                                     const int32_t* __restrict__ pos, float* const* tail_k,
                                     float* const* tail_gate, int tail_rows,
                                     float* const* pool_keys) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int b = blockIdx.y; b < B; b += gridDim.y) {
    const int64_t p = pos[b];
    if (p < 0) continue;  // idle row: nothing read or written
    float* tk = tail_k[b];
    float* tg = tail_gate[b];
    const float* kb = k + int64_t(b) * d;
    const float* gb = gate + int64_t(b) * d;
    const DecodeRows rows{kb, gb, tk, tg, p, d, tail_rows};
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < d; c += gridDim.x * blockDim.x) {
      append_decode_channel(rows, ape, p, pool, d, tail_rows, pool_keys[b], tk, tg, c, kb[c],
                            gb[c]);
    }
  }
}

// -------------------------------------------------------------------------------- scores

// Pools of sequence b that the token at pos sees: [0, (pos + 1) / pool), at most max_pools; none
// for an idle row.
__device__ __forceinline__ int visible_pools(int64_t pos, int pool, int max_pools) {
  if (pos < 0) return 0;
  const int64_t n = (pos + 1) / pool;
  return n < max_pools ? static_cast<int>(n) : max_pools;
}

// One score's contribution of head h: w * head_scale * relu(dot * qk_scale), the reference's
// operations.
__device__ __forceinline__ float head_term(float dot, float w, float qk_scale, float head_scale) {
  return __fmul_rn(__fmul_rn(w, head_scale), relu_cpu(__fmul_rn(dot, qk_scale)));
}

constexpr int kDecBP = 64;     // pools per block
constexpr int kDecGroups = 8;  // head groups per pool: kDecGroups * kDecBP threads per block
constexpr int kDecMaxD = 128;  // key tile [kDecBP][d + 1] + terms fit the static 48 KB
constexpr int kDecMaxHi = 32;  // terms [kDecBP][Hi + 1]
constexpr int kDecMH = 4;      // heads whose dot chains run at once per thread

// q[h][c .. c + 8) of one head into v (block-uniform addresses: broadcast loads).
template <bool kVec>
__device__ __forceinline__ void load_q8(const float* __restrict__ qh, int c, float (&v)[8]) {
  if constexpr (kVec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(qh + c));
    const float4 b = __ldg(reinterpret_cast<const float4*>(qh + c + 4));
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = __ldg(qh + c + u);
  }
}

// Dot products of NH heads' queries (qh[m], [d]) with one key row kt (shared memory), each over
// c ascending with the reference's multiply and add; the NH chains are independent.
template <int NH, bool kVec>
__device__ __forceinline__ void dots(const float* const (&qh)[NH], const float* kt, int d,
                                     float (&dot)[NH]) {
#pragma unroll
  for (int m = 0; m < NH; ++m) dot[m] = 0.0f;
  int c = 0;
  for (; c + 8 <= d; c += 8) {  // the operands of 8 steps loaded ahead of their adds
    float kv[8], qv[NH][8];
#pragma unroll
    for (int u = 0; u < 8; ++u) kv[u] = kt[c + u];
#pragma unroll
    for (int m = 0; m < NH; ++m) load_q8<kVec>(qh[m], c, qv[m]);
#pragma unroll
    for (int u = 0; u < 8; ++u)
#pragma unroll
      for (int m = 0; m < NH; ++m) dot[m] = __fadd_rn(dot[m], __fmul_rn(qv[m][u], kv[u]));
  }
  for (; c < d; ++c) {
    const float kv = kt[c];
#pragma unroll
    for (int m = 0; m < NH; ++m) dot[m] = __fadd_rn(dot[m], __fmul_rn(__ldg(qh[m] + c), kv));
  }
}

// d <= kDecMaxD, Hi <= kDecMaxHi: grid (ceil(max_pools / kDecBP), B'), kDecGroups * kDecBP
// threads. Thread (g = tid / kDecBP, i = tid % kDecBP) owns pool p0 + i of each sequence b =
// blockIdx.y, + gridDim.y, ... and the heads of chunks g, g + kDecGroups, ... (chunks of kDecMH
// heads): it writes each head's term w * head_scale * relu(qk_scale * dot) into shared memory;
// then thread (0, i) sums the pool's Hi terms in ascending h, the reference's order. A warp holds
// 32 pools of one head group: q loads are block-uniform broadcasts, key rows conflict-free.
template <bool kVec>
__global__ void __launch_bounds__(kDecGroups * kDecBP)
    score_decode_kernel(const float* __restrict__ q, const float* __restrict__ w,
                        const float* const* __restrict__ pool_keys,
                        const int32_t* __restrict__ pos, int B, int Hi, int d, int pool,
                        int max_pools, float qk_scale, float head_scale,
                        float* __restrict__ score) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float ks[kDecBP][kDecMaxD + 1];      // [pool][channel]: (i + c) % 32 banks
  __shared__ float terms[kDecBP][kDecMaxHi + 1];  // [pool][head]
  const int tid = threadIdx.x;
  const int g = tid / kDecBP, i = tid % kDecBP;
  const int64_t p0 = int64_t(blockIdx.x) * kDecBP, p = p0 + i;
  for (int b = blockIdx.y; b < B; b += gridDim.y) {
    const int n = visible_pools(pos[b], pool, max_pools);  // block-uniform
    float* srow = score + int64_t(b) * max_pools;
    if (p0 >= n) {  // no pool of this block is visible: -inf, no key read
      if (g == 0 && p < max_pools) srow[p] = -INFINITY;
      continue;
    }
    const float* keys = pool_keys[b];
    __syncthreads();  // the previous sequence's tiles are no longer read
    {
      // Every key value of the block's tile loaded before any is stored (kFill per thread):
      // one memory round trip instead of one per value.
      constexpr int kFill = kDecBP * kDecMaxD / (kDecGroups * kDecBP);
      float kv[kFill];
#pragma unroll
      for (int u = 0; u < kFill; ++u) {
        const int e = tid + u * kDecGroups * kDecBP;
        const int row = e / d, col = e - row * d;
        kv[u] = e < kDecBP * d && p0 + row < n ? keys[(p0 + row) * d + col] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kFill; ++u) {
        const int e = tid + u * kDecGroups * kDecBP;
        const int row = e / d, col = e - row * d;
        if (e < kDecBP * d) ks[row][col] = kv[u];
      }
    }
    __syncthreads();
    const float* kt = ks[i];
    const float* qb = q + int64_t(b) * Hi * d;
    const float* wb = w + int64_t(b) * Hi;
    for (int h0 = g * kDecMH; h0 < Hi; h0 += kDecGroups * kDecMH) {
      if (h0 + kDecMH <= Hi) {
        const float* qh[kDecMH];
#pragma unroll
        for (int m = 0; m < kDecMH; ++m) qh[m] = qb + int64_t(h0 + m) * d;
        float dot[kDecMH];
        dots<kDecMH, kVec>(qh, kt, d, dot);
#pragma unroll
        for (int m = 0; m < kDecMH; ++m) {
          terms[i][h0 + m] = head_term(dot[m], __ldg(wb + h0 + m), qk_scale, head_scale);
        }
      } else {
        for (int h = h0; h < Hi; ++h) {
          const float* qh[1] = {qb + int64_t(h) * d};
          float dot[1];
          dots<1, kVec>(qh, kt, d, dot);
          terms[i][h] = head_term(dot[0], __ldg(wb + h), qk_scale, head_scale);
        }
      }
    }
    __syncthreads();
    if (g == 0 && p < max_pools) {
      float acc = 0.0f;
      for (int h = 0; h < Hi; ++h) acc = __fadd_rn(acc, terms[i][h]);  // heads ascending
      srow[p] = p < n ? acc : -INFINITY;
    }
  }
}

// Any d: one thread per (sequence, pool), dsa.cu's score_reference_kernel for one query.
constexpr int kSimpleThreads = 128;

__global__ void __launch_bounds__(kSimpleThreads)
    score_decode_simple_kernel(const float* __restrict__ q, const float* __restrict__ w,
                               const float* const* __restrict__ pool_keys,
                               const int32_t* __restrict__ pos, int B, int Hi, int d, int pool,
                               int max_pools, float qk_scale, float head_scale,
                               float* __restrict__ score) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t p = int64_t(blockIdx.x) * kSimpleThreads + threadIdx.x;
  if (p >= max_pools) return;
  for (int b = blockIdx.y; b < B; b += gridDim.y) {
    const int n = visible_pools(pos[b], pool, max_pools);
    float* srow = score + int64_t(b) * max_pools;
    if (p >= n) {
      srow[p] = -INFINITY;
      continue;
    }
    const float* key = pool_keys[b] + p * d;
    const float* qb = q + int64_t(b) * Hi * d;
    float acc = 0.0f;
    for (int h = 0; h < Hi; ++h) {
      const float* qh = qb + int64_t(h) * d;
      float dot = 0.0f;
      for (int c = 0; c < d; ++c) dot = __fadd_rn(dot, __fmul_rn(qh[c], key[c]));
      acc = __fadd_rn(acc, head_term(dot, w[int64_t(b) * Hi + h], qk_scale, head_scale));
    }
    srow[p] = acc;
  }
}

// -------------------------------------------------------------------------------- selection

// One block per sequence (grid-stride over b). Pools [0, n) are exactly the ones the
// per-sequence select's is_candidate admits by position (p * pool + pool - 1 <= pos); among
// them the finite scores are the candidates; the rest is dsa.cu's select (radix_select_row).
// With c.list (kpool_select with compact 1), each block then compacts its row's list
// as the MLA decode attention's compaction does (gather_compact.cuh, n = t_kv[b] clamped to
// [0, max_t_kv]) into c.list / c.counts, which mla_attn's LISTED form reads: one launch fewer.
struct CompactOut {
  const int32_t* t_kv;  // [B]
  int max_t_kv;
  int32_t* list;        // [B, width] or null (no compaction)
  int* counts;          // [B]
};

__global__ void __launch_bounds__(kSelectThreads)
    select_decode_kernel(const float* __restrict__ score, const int32_t* __restrict__ pos, int B,
                         int max_pools, int pool, int select_k, int width,
                         int32_t* __restrict__ idx, CompactOut c) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ unsigned bm[];  // with c.list: the compaction's bitmap and warp totals
  __shared__ unsigned hist[256];
  __shared__ int warp_count[kSelectWarps];
  __shared__ uint64_t s_prefix;
  __shared__ int s_shift, s_mode, s_need;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int b = blockIdx.x; b < B; b += gridDim.x) {
    const int64_t ps = pos[b];  // block-uniform
    int32_t* out = idx + int64_t(b) * width;
    if (ps < 0) {  // idle row
      for (int j = tid; j < width; j += kSelectThreads) out[j] = -1;
    } else {
      const int n = visible_pools(ps, pool, max_pools);
      radix_select_row(score + int64_t(b) * max_pools, n, pool, select_k, width, ps, out,
                       [](float v, int64_t) { return static_cast<bool>(isfinite(v)); }, tid, lane, warp, hist, warp_count, s_prefix,
                       s_shift, s_mode, s_need);
    }
    if (c.list) {
      __syncthreads();  // the row's list is written (read back through L2)
      const int n_kv = min(max(c.t_kv[b], 0), c.max_t_kv);
      const int running = memra::cuda::compact_rows<kSelectThreads, true>(
          out, width, n_kv, bm, bm + (c.max_t_kv + 31) / 32, c.list + int64_t(b) * width, tid,
          lane, warp);
      if (tid == 0) c.counts[b] = running;
    }
  }
}

// -------------------------------------------------------------------------------- entries

int append_decode_rows(MemraCudaCtx* ctx, const float* k, const float* gate, int B, int d,
                       const float* ape, int pool, const int32_t* pos, float* const* tail_k,
                       float* const* tail_gate, int tail_rows, float* const* pool_keys) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (pool < 1 || tail_rows < pool || tail_rows % pool != 0) return memra::kContractPool;
  if (B < 0 || d < 1) return memra::kContractValue;
  if (B == 0) return memra::kOk;
  const dim3 grid(ceil_div(d, kAppendThreads), std::min(static_cast<unsigned>(B), kMaxGridY));
  memra::cuda::launch(ctx, true, append_decode_kernel, dim3(grid), dim3(kAppendThreads), 0, k, gate,
      B, d, ape, pool, pos, tail_k, tail_gate, tail_rows, pool_keys);
  return launch_status();
}

int score_decode_rows(MemraCudaCtx* ctx, const float* q, const float* w,
                      const float* const* pool_keys, const int32_t* pos, int B, int Hi, int d,
                      int pool, int max_pools, float qk_scale, float head_scale, float* score) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (pool < 1) return memra::kContractPool;
  if (B < 0 || Hi < 0 || d < 0 || max_pools < 0) return memra::kContractValue;
  if (!std::isfinite(qk_scale) || !std::isfinite(head_scale)) return memra::kContractValue;
  if (B == 0 || max_pools == 0) return memra::kOk;
  const unsigned gy = std::min(static_cast<unsigned>(B), kMaxGridY);
  if (d <= kDecMaxD && Hi <= kDecMaxHi) {
    const dim3 grid(ceil_div(max_pools, kDecBP), gy);
    const bool vec = d % 4 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0;
    constexpr int threads = kDecGroups * kDecBP;
    if (vec) {
      memra::cuda::launch(ctx, true, score_decode_kernel<true>, dim3(grid), dim3(threads), 0, q, w,
          pool_keys, pos, B, Hi, d, pool, max_pools, qk_scale, head_scale, score);
    } else {
      memra::cuda::launch(ctx, true, score_decode_kernel<false>, dim3(grid), dim3(threads), 0, q, w,
          pool_keys, pos, B, Hi, d, pool, max_pools, qk_scale, head_scale, score);
    }
  } else {
    const dim3 grid(ceil_div(max_pools, kSimpleThreads), gy);
    memra::cuda::launch(ctx, true, score_decode_simple_kernel, dim3(grid), dim3(kSimpleThreads), 0,
        q, w, pool_keys, pos, B, Hi, d, pool, max_pools, qk_scale, head_scale, score);
  }
  return launch_status();
}

int select_decode_impl(MemraCudaCtx* ctx, const float* score, const int32_t* pos, int B,
                       int max_pools, int pool, int select_k, int width, int32_t* idx,
                       const CompactOut& c) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  // Checks in kpool_select's order.
  if (pool < 1) return memra::kContractPool;
  if (select_k < 0 || B < 0 || max_pools < 0) return memra::kContractValue;
  if (int64_t(width) < int64_t(select_k) * pool + pool - 1) return memra::kContractIndexWidth;
  if (int64_t(max_pools) * pool > INT_MAX) return memra::kContractRange;
  if (c.list && c.max_t_kv < 0) return memra::kContractValue;
  if (B == 0 || width == 0) return memra::kOk;
  if (c.list && (!c.counts || !c.t_kv)) return memra::kContractMissing;
  // The compaction's bitmap [ceil(max_t_kv / 32)] and warp totals (mla_decode.cu's layout).
  if (c.list && c.max_t_kv > MEMRA_SELECT_COMPACT_MAX_ROWS) return memra::kUnsupportedGeometry;
  const size_t smem = c.list ? sizeof(unsigned) * (ceil_div(c.max_t_kv, 32) + kSelectWarps) : 0;
  static_assert(4 * (MEMRA_SELECT_COMPACT_MAX_ROWS / 32 + kSelectWarps) <= 40 * 1024,
                "the compaction's bitmap and warp totals within 40 KB");
  const unsigned blocks = std::min(static_cast<unsigned>(B), 65535u * 16u);
  memra::cuda::launch(ctx, true, select_decode_kernel, dim3(blocks), dim3(kSelectThreads), smem,
                      score, pos, B, max_pools, pool, select_k, width, idx, c);
  return launch_status();
}

}  // namespace

namespace memra::cuda::dsa {

int append_decode(MemraCudaCtx* ctx, const MemraKpoolAppendParams& p) {
  return append_decode_rows(ctx, p.k, p.gate, p.n, p.d, p.ape, p.pool, p.seq_pos, p.seq_tail_k,
                            p.seq_tail_gate, p.tail_rows, p.seq_pool_keys);
}

int score_decode(MemraCudaCtx* ctx, const MemraKpoolScoreParams& p) {
  return score_decode_rows(ctx, p.q, p.w, p.seq_pool_keys, p.seq_pos, p.B, p.Hi, p.d, p.pool,
                           p.max_pools, p.qk_scale, p.head_scale, p.score);
}

int select_decode(MemraCudaCtx* ctx, const MemraKpoolSelectParams& p) {
  if (!p.compact) {
    return select_decode_impl(ctx, p.score, p.seq_pos, p.B, p.max_pools, p.pool, p.select_k,
                              p.width, p.idx, CompactOut{});
  }
  if (!p.list) return memra::kContractMissing;
  return select_decode_impl(ctx, p.score, p.seq_pos, p.B, p.max_pools, p.pool, p.select_k, p.width,
                            p.idx, CompactOut{p.seq_t_kv, p.max_t_kv, p.list, p.counts});
}

}  // namespace memra::cuda::dsa
