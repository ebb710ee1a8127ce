// The merge of an MLA decode's splits inside mla_decode_wgmma_kernel (cuda/mla_decode_sm90.cu,
// the only includer): a split's O, m and L read from the cluster's shared memory or from the
// partials in L2, and the two merges over them (merge_heads, any split count;
// merge_heads_one_trip, 2..32 splits in one L2 round trip). Merge's formula and its order are
// in mla_decode_sm90.cuh.
#pragma once

#include <cstdint>

#include "mla_decode_sm90.cuh"
#include "mla_sm90.cuh"

namespace memra::cuda::mla_sm90 {
namespace {

// A split's O, m and L for merge_heads: in the cluster's shared memory (kMergeCluster; the
// addresses are this block's, mapped to block q's) ...
struct ClusterSrc {
  uint32_t m_addr, l_addr, o_addr;  // [64] m, [64] L, [64][kOStride] O
  __device__ float m(int q, int h) const { return ld_cluster_f32(m_addr + 4 * h, q); }
  __device__ float l(int q, int h) const { return ld_cluster_f32(l_addr + 4 * h, q); }
  __device__ float4 v4(int q, int h, int c4) const {
    return ld_cluster_v4(o_addr + 4 * (h * kOStride + 4 * c4), q);
  }
};
// ... or in the partials (kMergeGrid), read through L2: other SMs wrote them in this launch.
struct GlobalSrc {
  const float *po, *pm, *pl;
  int64_t k0;  // (b * nsplit) * 64: split q's head h at k0 + q * 64 + h
  __device__ float m(int q, int h) const { return __ldcg(pm + k0 + q * kH + h); }
  __device__ float l(int q, int h) const { return __ldcg(pl + k0 + q * kH + h); }
  __device__ float4 v4(int q, int h, int c4) const {
    return __ldcg(reinterpret_cast<const float4*>(po + (k0 + q * kH + h) * kR) + c4);
  }
  // The 128-byte line of float4 c4 (c4 % 8 == 0) of split q's head h, once merged: dropped from
  // L2 unwritten (each partial line is read by one merging thread's warp, once; po is a pool
  // allocation, 256-byte aligned, and a head's row 2 KiB, so the line is whole and aligned).
  __device__ void discard(int q, int h, int c4) const {
    memra::cuda::discard_l2_line(po + (k0 + q * kH + h) * kR + 4 * c4);
  }
};

// merge_heads' sums: out[h0 + hl][c] = (sum_q w[hl][q] O_q[h0 + hl][c]) / L[hl] over the nh
// heads, q ascending; wt: [nh][nsb + 1] (the weights, then 1 / L). kU float4 a thread at a time
// (columns i0 + u * kThreads), their loads for kQ splits issued before their sums.
template <int kU, int kQ, class Src>
__device__ __forceinline__ void merge_sums(const Src& src, int h0, int nh, int nsb,
                                           const float* wt, float* out, int tid) {
  const int stride = nsb + 1;
  float4* out4 = reinterpret_cast<float4*>(out);
  const int total = nh * (kR / 4);
  for (int i0 = tid; i0 < total; i0 += kThreads * kU) {
    float4 acc[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q0 = 0; q0 < nsb; q0 += kQ) {
      float4 v[kQ][kU];
#pragma unroll
      for (int j = 0; j < kQ; ++j) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int i = i0 + u * kThreads;
          v[j][u] = i < total && q0 + j < nsb ? src.v4(q0 + j, h0 + i / (kR / 4), i % (kR / 4))
                                              : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
#pragma unroll
      for (int j = 0; j < kQ; ++j) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int i = min(i0 + u * kThreads, total - 1);
          const float w = q0 + j < nsb ? wt[(i / (kR / 4)) * stride + q0 + j] : 0.0f;
          acc[u].x = fmaf(w, v[j][u].x, acc[u].x);
          acc[u].y = fmaf(w, v[j][u].y, acc[u].y);
          acc[u].z = fmaf(w, v[j][u].z, acc[u].z);
          acc[u].w = fmaf(w, v[j][u].w, acc[u].w);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + u * kThreads;
      if (i < total) {
        const int hl = i / (kR / 4);
        const float inv = wt[hl * stride + nsb];
        out4[(h0 + hl) * (kR / 4) + i % (kR / 4)] =
            make_float4(acc[u].x * inv, acc[u].y * inv, acc[u].z * inv, acc[u].w * inv);
      }
    }
  }
}

// Heads [h0, h1) of a sequence merged over its active splits q < nsb (Merge's formula, q
// ascending) into out [64][512]; wt: shared scratch of (h1 - h0) x (3 nsb + 1) floats. Every
// thread of the block calls it.
template <class Src>
__device__ __forceinline__ void merge_heads(const Src& src, int h0, int h1, int nsb, float* wt,
                                            float* out, int tid) {
  // Every (head, split) m and L loaded at once (one thread each), then thread hl < h1 - h0
  // forms head h0 + hl's weights from shared memory. wt: [nh][nsb + 1] weights and 1 / L, then
  // the loaded m [nh * nsb] and L [nh * nsb].
  const int nh = h1 - h0, stride = nsb + 1;
  float* ms = wt + nh * stride;
  float* ls = ms + nh * nsb;
  for (int i = tid; i < nh * nsb; i += kThreads) {
    const int hl = i / nsb, q = i % nsb;
    ms[i] = src.m(q, h0 + hl);
    ls[i] = src.l(q, h0 + hl);
  }
  __syncthreads();
  if (tid < nh) {
    float M = -INFINITY;
    for (int q = 0; q < nsb; ++q) M = fmaxf(M, ms[tid * nsb + q]);
    float Ls = 0.0f;
    for (int q = 0; q < nsb; ++q) {
      const float w = exp2f(ms[tid * nsb + q] - M);  // every active split saw a row: finite
      wt[tid * stride + q] = w;
      Ls = fmaf(w, ls[tid * nsb + q], Ls);
    }
    wt[tid * stride + nsb] = 1.0f / Ls;
  }
  __syncthreads();
  // The sums: per (head, column) over q ascending. Latency-bound (L2 or another SM's shared
  // memory a load), so a thread issues kQ x kU loads before their sums: kU columns of kQ splits
  // (many columns a thread and few splits in a cluster, few and many in the grid merge).
  if (nsb >= 8) {
    merge_sums<2, 8>(src, h0, nh, nsb, wt, out, tid);
  } else {
    merge_sums<8, 2>(src, h0, nh, nsb, wt, out, tid);
  }
}

// kMergeGrid when a sequence has NSB active splits, a power of two from 2 to 32: block r merges
// the kH / NSB heads from h0 and each thread's share is 32 float4 of O (kU columns of NSB
// splits), so every load of the merge -- the O rows, m and L -- is issued at once: one L2 round
// trip, where merge_heads takes four (m and L; the weights through shared memory; two batches of
// O) and two block barriers. A warp's columns lie in one head (kR / 4 float4 a head), so lane q
// holds split q's m and L of it and the weights move by shuffles. merge_heads' operations in its
// order (M = max m_q, w_q = 2^(m_q - M), L = sum_q w_q l_q and O = sum_q w_q O_q over q
// ascending, O / L as O times 1 / L), hence its bits.
template <int NSB>
__device__ __forceinline__ void merge_heads_one_trip(const GlobalSrc& src, int h0, float* out,
                                                     int tid) {
  constexpr int kNh = kH / NSB;
  constexpr int kU = kNh * (kR / 4) / kThreads;
  static_assert(kU >= 1 && kU * NSB == 32, "32 float4 of O a thread");
  const int lane = tid & 31;
  float4 v[kU][NSB];
  float mq[kU], lq[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int i = tid + u * kThreads, h = h0 + i / (kR / 4), c4 = i % (kR / 4);
    mq[u] = lane < NSB ? src.m(lane, h) : -INFINITY;
    lq[u] = lane < NSB ? src.l(lane, h) : 0.0f;
#pragma unroll
    for (int q = 0; q < NSB; ++q) v[u][q] = src.v4(q, h, c4);
  }
  float4* out4 = reinterpret_cast<float4*>(out);
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    float M = mq[u];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(kFull, M, off));
    const float w = lane < NSB ? exp2f(mq[u] - M) : 0.0f;  // every active split saw a row
    float Ls = 0.0f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int q = 0; q < NSB; ++q) {
      const float wq = __shfl_sync(kFull, w, q);
      Ls = fmaf(wq, __shfl_sync(kFull, lq[u], q), Ls);
      acc.x = fmaf(wq, v[u][q].x, acc.x);
      acc.y = fmaf(wq, v[u][q].y, acc.y);
      acc.z = fmaf(wq, v[u][q].z, acc.z);
      acc.w = fmaf(wq, v[u][q].w, acc.w);
    }
    const float inv = 1.0f / Ls;
    const int i = tid + u * kThreads;
    out4[(h0 + i / (kR / 4)) * (kR / 4) + i % (kR / 4)] =
        make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    // discard is a write: the warp barrier orders the other seven lanes' reads of a line
    // before it (the sums above consume them, but the memory model asks for the ordering).
    __syncwarp();
    if (i % 8 == 0) {  // the first thread of each 128-byte line its warp read
#pragma unroll
      for (int q = 0; q < NSB; ++q) src.discard(q, h0 + i / (kR / 4), i % (kR / 4));
    }
  }
}

}  // namespace
}  // namespace memra::cuda::mla_sm90
