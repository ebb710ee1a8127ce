// Sampling of the CUDA backend (cpp/include/memra/cuda_abi/sample.h `sample`): the GPU twin of
// cpu::sample (cpu/sample.h), drawing the same token as the CPU for the same seed and counter.
// cpu/sample.h spells the arithmetic out; this file reproduces it operation for operation:
//   - z_i = logits_i / temperature and p_i = e_i / s are IEEE divisions (__fdiv_rn; div_rn
//     returns a zero dividend itself, the same quotient without the division's slow path);
//   - e_i = exp(z_i - m) uses a port of glibc's expf (the CPU's std::exp on Linux: the table-
//     driven double-precision algorithm of glibc >= 2.28, in its FMA form), checked on the host to
//     be bit-identical to glibc 2.36's expf on every float in (-110, 90);
//   - every sum the spec orders (s over ascending id; Mk and the running q-mass c over the sorted
//     order) is in cpu/sample.h's blocked order: blocks of L = kSampleBlock terms, each summed
//     left to right from 0 by one thread (__fadd_rn, no contraction), the L-blocks of a row
//     summed in parallel (kSpan terms per thread block, staged in shared memory); the block sums
//     are then added left to right by one thread (V / L terms), giving the prefixes P_b. A
//     threshold search (the top-p cut, the draw) finds its block as the first b whose P_{b+1}
//     reaches the threshold (c never decreases), then the first index inside it whose P_b + W_i
//     does, both as parallel first-index searches over the stored P_b and in-block running sums
//     W_i;
//   - the order (p desc, id asc) comes from one CUB radix sort of all rows at once on 64-bit keys
//     (row | ~bits(p) | id): p >= 0, so its bit pattern orders like its value, and the keys are
//     unique, so no stability is needed.
// Kernels: greedy rows (temperature <= 0) take the CPU's argmax (cuda/sample_greedy.cu).
// Otherwise, per row split over kSpan-term spans (grid [B, spans]): max (partial maxima of z),
// esum (m; e and its L-block sums), keys (s from the block sums; the sort keys of p, or the
// argmax for a row without a distribution); the sort; psum (the L-block sums of the sorted p over
// the first k), qsum (Mk; q = p / Mk, its in-block running sums W and block sums); then select
// (one block per row: the prefixes P, the top-p cut, the draw). Every sequential chain is at most
// max(L, V / L) additions long.
// The non-finite flag (cuda_abi/sample.h `nonfinite`, non-null): the max kernel, which loads
// every logit, ORs `!isfinite` per span (one flag per span block), and the esum kernel's warp 0,
// which already combines the span maxima, ORs the span flags into nonfinite[b] (span 0 stores
// it); greedy rows flag in their argmax kernels (cuda/sample_greedy.cu). The token is whatever
// the row draws without the flag.
#include <cub/device/device_radix_sort.cuh>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "glibc_expf.cuh"
#include "memra/cpu/sample.h"
#include "sample_argmax.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::glibc_expf;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;
using memra::cuda::warp_max;

namespace {

constexpr int kThreads = 512;                       // threads per row block (select, argmax)
constexpr int kL = memra::cpu::kSampleBlock;        // cpu/sample.h's block of the sums
constexpr int kBlocksPerSpan = 8;                   // L-blocks per thread block of the span kernels
constexpr int kSpan = kBlocksPerSpan * kL;          // terms per span
constexpr int kSpanThreads = 256;                   // threads of the span kernels
constexpr int kRowStride = kL + 4;                  // shared floats per staged L-block
constexpr int kStage = kSpan;                       // floats per step of a block-sum prefix walk
static_assert(kL % 16 == 0 && kStage % 8 == 0, "the chains read float4 groups");
static_assert(kBlocksPerSpan <= 32, "one chain per lane of warp 0");
// kRowStride % 32 == 4: lanes reading float4 at the same offset of consecutive L-blocks hit
// distinct banks.

// cpu/sample.h uniform_from_counter (splitmix64), verbatim.
__device__ __forceinline__ float uniform_from_counter(uint64_t seed, uint64_t counter) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  uint64_t z = seed ^ (kGolden * (counter + 1));
  z += kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return __fmul_rn(static_cast<float>(z >> 40), 1.0f / 16777216.0f);
}

// ------------------------------------------------------------------------ block helpers

// a / b rounded to nearest, as __fdiv_rn, but a zero dividend over a positive finite b returns a
// (its exact quotient, sign included) without entering the division's slow-path subroutine,
// which a zero dividend takes (~hundreds of cycles; underflowed e_i and cut p are zeros).
__device__ __forceinline__ float div_rn(float a, float b) {
  return (a == 0.0f && b > 0.0f && b <= FLT_MAX) ? a : __fdiv_rn(a, b);
}



// ------------------------------------------------------------------------ blocked sums

// The sum of one L-block v[0, kL) (shared memory, 16-byte aligned, zero past the block's last
// term: + 0 leaves a sum of terms >= 0, or NaN, unchanged), left to right from 0, by the calling
// thread. With kRunning, v[j] is replaced by the running sum W_j.
template <bool kRunning>
__device__ __forceinline__ float chain_block(float* v) {
  float4* v4 = reinterpret_cast<float4*>(v);
  float acc = 0.0f;
#pragma unroll 2
  for (int j = 0; j < kL / 4; j += 4) {
    float4 q[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) q[h] = v4[j + h];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      q[h].x = acc = __fadd_rn(acc, q[h].x);
      q[h].y = acc = __fadd_rn(acc, q[h].y);
      q[h].z = acc = __fadd_rn(acc, q[h].z);
      q[h].w = acc = __fadd_rn(acc, q[h].w);
    }
    if (kRunning) {
#pragma unroll
      for (int h = 0; h < 4; ++h) v4[j + h] = q[h];
    }
  }
  return acc;
}

// Continues the left-to-right sum acc over x[0, n8) (shared memory, 16-byte aligned, n8 a
// multiple of 8, zero past the real terms) by the calling thread; with kRunning, x[j] is replaced
// by the running sum there. The next eight values are loaded before the current eight are added.
template <bool kRunning>
__device__ float chain_prefix(float* x, int n8, float acc) {
  float4* x4 = reinterpret_cast<float4*>(x);
  if (n8 == 0) return acc;
  float4 a = x4[0], b = x4[1];
  for (int j = 0; j < n8 / 4; j += 2) {
    float4 na = a, nb = b;
    if (j + 2 < n8 / 4) {
      na = x4[j + 2];
      nb = x4[j + 3];
    }
    a.x = acc = __fadd_rn(acc, a.x);
    a.y = acc = __fadd_rn(acc, a.y);
    a.z = acc = __fadd_rn(acc, a.z);
    a.w = acc = __fadd_rn(acc, a.w);
    b.x = acc = __fadd_rn(acc, b.x);
    b.y = acc = __fadd_rn(acc, b.y);
    b.z = acc = __fadd_rn(acc, b.z);
    b.w = acc = __fadd_rn(acc, b.w);
    if (kRunning) {
      x4[j] = a;
      x4[j + 1] = b;
    }
    a = na;
    b = nb;
  }
  return acc;
}

// The left-to-right f32 sum of x[0, n) (global) from 0: thread 0 adds, the block stages kStage
// values at a time in `stage` (kStage floats, 16-byte aligned). With `prefix` non-null it also
// writes prefix[0] = 0 and prefix[i + 1] = the running sum at i (the P_b of cpu/sample.h when x
// holds block sums). Call with the whole block; the result is valid in every thread.
__device__ float block_seq_sum(const float* __restrict__ x, int n, float* prefix, float* stage,
                               float* result) {
  const int tid = threadIdx.x;
  float acc = 0.0f;  // thread 0's
  for (int base = 0; base < n; base += kStage) {
    const int len = n - base < kStage ? n - base : kStage;
    const int len8 = (len + 7) & ~7;
    for (int j = tid; j < len8; j += blockDim.x) stage[j] = j < len ? x[base + j] : 0.0f;
    __syncthreads();
    if (tid == 0) {
      acc = prefix ? chain_prefix<true>(stage, len8, acc) : chain_prefix<false>(stage, len8, acc);
    }
    __syncthreads();
    if (prefix) {
      for (int j = tid; j < len; j += blockDim.x) prefix[base + j + 1] = stage[j];
    }
    __syncthreads();  // stage is rewritten by the next step
  }
  if (tid == 0) {
    *result = acc;
    if (prefix) prefix[0] = 0.0f;
  }
  __syncthreads();
  const float r = *result;
  __syncthreads();  // *result may be reused at once
  return r;
}

// The first i in [lo, hi) with pred(i), or -1. Call with the whole block (each thread tries its
// indices in ascending order; the block keeps the lowest hit); the result is valid in every
// thread.
template <class Pred>
__device__ int block_first(int lo, int hi, Pred pred, int* slot) {
  if (threadIdx.x == 0) *slot = INT_MAX;
  __syncthreads();
  for (int i = lo + static_cast<int>(threadIdx.x); i < hi; i += blockDim.x) {
    if (pred(i)) {
      atomicMin(slot, i);
      break;
    }
  }
  __syncthreads();
  const int r = *slot;
  __syncthreads();  // slot may be reused at once
  return r == INT_MAX ? -1 : r;
}

// -------------------------------------------------------------------------------- kernels

struct KeyBits {
  int id_bits;   // bits of the id field (the lowest)
  int row_bits;  // bits of the row field (above the 32 bits of ~p)
};

// The sampling kernels split each row into spans of kSpan terms: grid (B, spans), span c holding
// the terms [c kSpan, c kSpan + kSpan) of its order, that is the L-blocks
// [c kBlocksPerSpan, c kBlocksPerSpan + kBlocksPerSpan). nb = ceil(V / L) block sums per row.

// Partial maxima of z = logits / temperature per span (NaN z are skipped, as std::max(m, z)
// does; a NaN row ends in the argmax anyway). With flags (non-null): flags [B, spans] = 1 where
// the span's logits hold a NaN or +-inf.
__global__ void __launch_bounds__(kSpanThreads)
    sample_max_kernel(const float* __restrict__ logits, int V, float temperature,
                      float* __restrict__ part, int* __restrict__ flags) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[kSpanThreads / 32];
  const int c = blockIdx.y;
  const int64_t b = blockIdx.x;
  const float* lb = logits + b * V;
  const int lo = c * kSpan;
  const int hi = V - lo < kSpan ? V : lo + kSpan;
  float m = -INFINITY;
  int bad = 0;  // this thread saw a NaN or +-inf logit
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float x = lb[i];
    bad |= !isfinite(x);
    m = fmaxf(m, __fdiv_rn(x, temperature));
  }
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  const int any_bad = __syncthreads_or(bad);  // the barrier that publishes red, OR-reducing bad
  if (threadIdx.x == 0) {
    for (int w = 1; w < kSpanThreads / 32; ++w) m = fmaxf(m, red[w]);
    part[b * gridDim.y + c] = fmaxf(m, red[0]);
    if (flags) flags[b * gridDim.y + c] = any_bad ? 1 : 0;
  }
}

// m from the partial maxima; e_i = exp(z_i - m) for the span (kept in e for the keys kernel) and
// the span's L-block sums of e over ascending id (cpu/sample.h S_b of s) into se [B, nb]. With
// nonfinite (non-null; flags then too): span 0 writes nonfinite[b] = the OR of the row's span
// flags.
__global__ void __launch_bounds__(kSpanThreads)
    sample_esum_kernel(const float* __restrict__ logits, int V, float temperature,
                       const float* __restrict__ part, const int* __restrict__ flags, int nb,
                       float* __restrict__ e, float* __restrict__ se,
                       int32_t* __restrict__ nonfinite) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ __align__(16) float buf[kBlocksPerSpan * kRowStride];
  __shared__ float m_shared;
  const int c = blockIdx.y;
  const int S = gridDim.y;
  const int64_t b = blockIdx.x;
  const float* lb = logits + b * V;
  if (threadIdx.x < 32) {
    float m = -INFINITY;
    for (int s = threadIdx.x; s < S; s += 32) m = fmaxf(m, part[b * S + s]);
    m = warp_max(m);
    if (threadIdx.x == 0) m_shared = m;
    if (nonfinite && c == 0) {  // block-uniform: all 32 lanes of warp 0
      int bad = 0;
      for (int s = threadIdx.x; s < S; s += 32) bad |= flags[b * S + s];
      bad = __any_sync(0xffffffffu, bad);
      if (threadIdx.x == 0) nonfinite[b] = bad ? 1 : 0;
    }
  }
  __syncthreads();
  const float m = m_shared;
  const int lo = c * kSpan;
  for (int i = threadIdx.x; i < kSpan; i += blockDim.x) {
    const int id = lo + i;
    float v = 0.0f;  // zero past V: + 0 leaves the last block's sum as it is
    if (id < V) {
      v = glibc_expf(__fsub_rn(__fdiv_rn(lb[id], temperature), m));
      e[b * V + id] = v;
    }
    buf[(i / kL) * kRowStride + i % kL] = v;
  }
  __syncthreads();
  const int blk = c * kBlocksPerSpan + static_cast<int>(threadIdx.x);
  if (threadIdx.x < kBlocksPerSpan && blk < nb) {
    se[b * nb + blk] = chain_block<false>(buf + threadIdx.x * kRowStride);
  }
}

// s = the block sums of e left to right, then either the argmax (no distribution: s not finite
// or not > 0; span 0 writes it and done[b] = 1) or the sort keys of the span's p = e / s. Every
// row writes all its keys (a done row gets p = 0), so rows never mix in the sort.
__global__ void __launch_bounds__(kSpanThreads)
    sample_keys_kernel(const float* __restrict__ logits, int V, const float* __restrict__ e,
                       const float* __restrict__ se, int nb, KeyBits kb,
                       uint64_t* __restrict__ keys, int* __restrict__ done,
                       int32_t* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ __align__(16) float stage[kStage];
  __shared__ ArgBest red[kSpanThreads / 32];
  __shared__ float result;
  const int c = blockIdx.y;
  const int64_t b = blockIdx.x;
  const float s = block_seq_sum(se + b * nb, nb, nullptr, stage, &result);

  const uint64_t row = static_cast<uint64_t>(b) << (32 + kb.id_bits);
  uint64_t* kr = keys + b * V;
  const int lo = c * kSpan;
  const int hi = V - lo < kSpan ? V : lo + kSpan;
  if (!(s > 0.0f) || !isfinite(s)) {  // all -inf, or NaN / inf: no distribution to draw from
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      kr[i] = row | (static_cast<uint64_t>(0xffffffffu) << kb.id_bits) | static_cast<uint64_t>(i);
    }
    if (c == 0) {
      int unused;  // the flag comes from the max kernel
      const int best = block_argmax(logits + b * V, V, red, &unused);
      if (threadIdx.x == 0) {
        out[b] = best;
        done[b] = 1;
      }
    }
    return;
  }
  const float* eb = e + b * V;
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float p = div_rn(eb[i], s);
    const uint32_t inv = ~__float_as_uint(p);  // p >= +0: descending p = ascending ~bits
    kr[i] = row | (static_cast<uint64_t>(inv) << kb.id_bits) | static_cast<uint64_t>(i);
  }
  if (c == 0 && threadIdx.x == 0) done[b] = 0;
}

__device__ __forceinline__ float p_of_key(uint64_t key, KeyBits kb) {
  return __uint_as_float(~static_cast<uint32_t>(key >> kb.id_bits));
}

// The span's L-block sums of p over the sorted order, first k only (cpu/sample.h S_b of Mk), into
// sp [B, nb].
__global__ void __launch_bounds__(kSpanThreads)
    sample_psum_kernel(const uint64_t* __restrict__ keys, int V, int k, KeyBits kb, int nb,
                       const int* __restrict__ done, float* __restrict__ sp) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ __align__(16) float buf[kBlocksPerSpan * kRowStride];
  const int c = blockIdx.y;
  const int64_t b = blockIdx.x;
  const int lo = c * kSpan;
  if (done[b] || lo >= k) return;  // block-uniform
  const uint64_t* kr = keys + b * V;
  for (int i = threadIdx.x; i < kSpan; i += blockDim.x) {
    buf[(i / kL) * kRowStride + i % kL] = lo + i < k ? p_of_key(kr[lo + i], kb) : 0.0f;
  }
  __syncthreads();
  const int blk = c * kBlocksPerSpan + static_cast<int>(threadIdx.x);
  if (threadIdx.x < kBlocksPerSpan && blk * kL < k) {
    sp[b * nb + blk] = chain_block<false>(buf + threadIdx.x * kRowStride);
  }
}

// Mk = the p block sums left to right (span 0 keeps it in mk[b]); q = p / Mk over the span's
// first-k entries, their in-block running sums W (into w [B, V], by sorted position) and block
// sums (cpu/sample.h S_b of c, into sq [B, nb]).
__global__ void __launch_bounds__(kSpanThreads)
    sample_qsum_kernel(const uint64_t* __restrict__ keys, int V, int k, KeyBits kb, int nb,
                       const int* __restrict__ done, const float* __restrict__ sp,
                       float* __restrict__ mk, float* __restrict__ w, float* __restrict__ sq) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ __align__(16) float buf[kBlocksPerSpan * kRowStride];
  __shared__ float result;
  static_assert(kBlocksPerSpan * kRowStride >= kStage, "buf doubles as the prefix stage");
  const int c = blockIdx.y;
  const int64_t b = blockIdx.x;
  const int lo = c * kSpan;
  if (done[b] || lo >= k) return;  // block-uniform
  const int nbk = (k + kL - 1) / kL;
  const float mkb = block_seq_sum(sp + b * nb, nbk, nullptr, buf, &result);
  if (c == 0 && threadIdx.x == 0) mk[b] = mkb;
  const uint64_t* kr = keys + b * V;
  for (int i = threadIdx.x; i < kSpan; i += blockDim.x) {
    buf[(i / kL) * kRowStride + i % kL] =
        lo + i < k ? div_rn(p_of_key(kr[lo + i], kb), mkb) : 0.0f;
  }
  __syncthreads();
  const int blk = c * kBlocksPerSpan + static_cast<int>(threadIdx.x);
  if (threadIdx.x < kBlocksPerSpan && blk * kL < k) {
    sq[b * nb + blk] = chain_block<true>(buf + threadIdx.x * kRowStride);
  }
  __syncthreads();
  const int hi = k - lo < kSpan ? k : lo + kSpan;
  for (int i = threadIdx.x; i < hi - lo; i += blockDim.x) {
    w[b * V + lo + i] = buf[(i / kL) * kRowStride + i % kL];
  }
}

// One block per row: the prefixes P_b of the q block sums (into pg [B, nb + 1]), the top-p cut,
// and the draw (cpu/sample.h, step by step), each threshold found as its block (the first b whose
// P_{b+1} reaches it) and then its index inside (the first i there whose P_b + W_i does).
__global__ void __launch_bounds__(kThreads)
    sample_select_kernel(const uint64_t* __restrict__ keys, int V, int k, float top_p,
                         uint64_t seed, const uint64_t* __restrict__ seeds,
                         const uint64_t* __restrict__ counters, KeyBits kb, int nb,
                         const int* __restrict__ done, const float* __restrict__ sq,
                         const float* __restrict__ mk, const float* __restrict__ w, float* pg,
                         int32_t* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ __align__(16) float stage[kStage];
  __shared__ float result;
  __shared__ int slot;
  __shared__ int last_positive;
  const int64_t b = blockIdx.x;
  if (done[b]) return;  // block-uniform
  const uint64_t* kr = keys + b * V;
  const uint64_t id_mask = (uint64_t(1) << kb.id_bits) - 1;
  auto id_of = [&](int i) { return static_cast<int32_t>(kr[i] & id_mask); };
  const int nbk = (k + kL - 1) / kL;
  float* P = pg + b * (nb + 1);  // written here: plain loads below, after block_seq_sum's syncs
  const float* wb = w + b * V;
  const float total = block_seq_sum(sq + b * nb, nbk, P, stage, &result);
  auto c_at = [&](int i) { return __fadd_rn(P[i / kL], wb[i]); };  // cpu/sample.h c_i

  // top_p < 1 keeps up to and including the first entry where the mass reaches it. c at the
  // last index of block b is P_{b + 1} (the same addition), so the block holds the entry.
  int n = k;
  float mass = total;
  if (top_p < 1.0f) {
    const int blk = block_first(0, nbk, [&](int i) { return P[i + 1] >= top_p; }, &slot);
    if (blk >= 0) {
      const int hi = k - blk * kL < kL ? k : blk * kL + kL;
      const int j = block_first(blk * kL, hi, [&](int i) { return c_at(i) >= top_p; }, &slot);
      if (j >= 0) {
        n = j + 1;
        mass = c_at(j);
      }
    }
  }

  // The token: the first kept entry whose running c exceeds r = u * M.
  const float r = __fmul_rn(uniform_from_counter(seeds ? seeds[b] : seed, counters[b]), mass);
  const int bn = (n - 1) / kL;  // the block of the last kept entry
  const int blk = block_first(0, bn, [&](int i) { return P[i + 1] > r; }, &slot);
  const int lo = blk >= 0 ? blk * kL : bn * kL;
  const int hi = blk >= 0 ? lo + kL : n;
  const int pick = block_first(lo, hi, [&](int i) { return c_at(i) > r; }, &slot);
  if (pick >= 0) {
    if (threadIdx.x == 0) out[b] = id_of(pick);
    return;
  }
  // Rounding left u * M at the very end: the last kept entry with q > 0 (else the first).
  const float mkb = mk[b];
  if (threadIdx.x == 0) last_positive = -1;
  __syncthreads();
  int mine = -1;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (div_rn(p_of_key(kr[i], kb), mkb) > 0.0f) mine = i;
  }
  if (mine >= 0) atomicMax(&last_positive, mine);
  __syncthreads();
  if (threadIdx.x == 0) out[b] = id_of(last_positive >= 0 ? last_positive : 0);
}

int bits_for(int64_t n) {  // bits to hold 0 .. n - 1
  int bits = 0;
  while (bits < 63 && (int64_t(1) << bits) < n) ++bits;
  return bits;
}

size_t align_up(size_t v) { return (v + 255) / 256 * 256; }

// memra_cuda_sample after its context check.
int sample_impl(MemraCudaCtx* ctx, const float* logits, int B, int V, float temperature, int top_k,
                float top_p, uint64_t seed, const uint64_t* seeds, const uint64_t* counters,
                int32_t* out, int32_t* nonfinite) {
  if (B < 0 || V < 0) return memra::kContractValue;
  if (B == 0) return memra::kOk;
  if (V < 1) return memra::kContractValue;  // as the binding: at least one column
  if (std::isnan(temperature) || !(top_p > 0.0f)) return memra::kContractValue;
  if (!logits || !out) return memra::kContractMissing;
  if (temperature <= 0.0f) return memra::cuda::sample_greedy(ctx, logits, B, V, out, nonfinite);
  if (!counters) return memra::kContractMissing;

  const KeyBits kb{bits_for(V), bits_for(B)};
  const int end_bit = 32 + kb.id_bits + kb.row_bits;
  if (end_bit > 64) return memra::kUnsupportedGeometry;
  const int k = (top_k <= 0 || top_k > V) ? V : top_k;
  const int64_t total = static_cast<int64_t>(B) * V;
  const int nb = static_cast<int>(ceil_div(V, kL));       // L-blocks per row
  const int64_t spans64 = (static_cast<int64_t>(V) + kSpan - 1) / kSpan;
  if (spans64 > 65535) return memra::kUnsupportedGeometry;  // grid.y
  const int spans = static_cast<int>(spans64);  // span blocks per row

  size_t temp_bytes = 0;
  cub::DoubleBuffer<uint64_t> probe(nullptr, nullptr);
  MEMRA_CUDA_RETURN_IF(status_of(cub::DeviceRadixSort::SortKeys(
      nullptr, temp_bytes, probe, total, 0, end_bit, ctx->stream)));
  const size_t rows = static_cast<size_t>(B);
  const size_t keys_bytes = align_up(sizeof(uint64_t) * static_cast<size_t>(total));
  const size_t done_bytes = align_up(sizeof(int) * rows);
  const size_t vals_bytes = align_up(sizeof(float) * static_cast<size_t>(total));
  const size_t part_bytes = align_up(sizeof(float) * rows * spans);
  const size_t sums_bytes = align_up(sizeof(float) * rows * nb);
  const size_t pref_bytes = align_up(sizeof(float) * rows * (nb + 1));
  const size_t mk_bytes = align_up(sizeof(float) * rows);
  const size_t flags_bytes = nonfinite ? align_up(sizeof(int) * rows * spans) : 0;
  Scratch scratch(ctx, 2 * keys_bytes + done_bytes + vals_bytes + part_bytes + 3 * sums_bytes +
                           pref_bytes + mk_bytes + flags_bytes + align_up(temp_bytes));
  MEMRA_CUDA_RETURN_IF(scratch.status());
  char* at = scratch.as<char>();
  auto take = [&at](size_t bytes) {
    char* p = at;
    at += bytes;
    return p;
  };
  uint64_t* keys0 = reinterpret_cast<uint64_t*>(take(keys_bytes));
  uint64_t* keys1 = reinterpret_cast<uint64_t*>(take(keys_bytes));
  int* done = reinterpret_cast<int*>(take(done_bytes));
  float* vals = reinterpret_cast<float*>(take(vals_bytes));  // e by id, then W by sorted position
  float* part = reinterpret_cast<float*>(take(part_bytes));
  float* se = reinterpret_cast<float*>(take(sums_bytes));
  float* sp = reinterpret_cast<float*>(take(sums_bytes));
  float* sq = reinterpret_cast<float*>(take(sums_bytes));
  float* pg = reinterpret_cast<float*>(take(pref_bytes));
  float* mk = reinterpret_cast<float*>(take(mk_bytes));
  int* flags = nonfinite ? reinterpret_cast<int*>(take(flags_bytes)) : nullptr;  // [B, spans]
  void* temp = take(align_up(temp_bytes));

  const dim3 grid(B, spans);
  memra::cuda::launch(ctx, true, sample_max_kernel, dim3(grid), dim3(kSpanThreads), 0, logits, V,
      temperature, part, flags);
  MEMRA_CUDA_RETURN_IF(launch_status());
  memra::cuda::launch(ctx, true, sample_esum_kernel, dim3(grid), dim3(kSpanThreads), 0, logits, V,
      temperature, part, flags, nb, vals, se, nonfinite);
  MEMRA_CUDA_RETURN_IF(launch_status());
  memra::cuda::launch(ctx, true, sample_keys_kernel, dim3(grid), dim3(kSpanThreads), 0, logits, V,
      vals, se, nb, kb, keys0, done, out);
  MEMRA_CUDA_RETURN_IF(launch_status());
  cub::DoubleBuffer<uint64_t> sorted(keys0, keys1);
  MEMRA_CUDA_RETURN_IF(status_of(cub::DeviceRadixSort::SortKeys(
      temp, temp_bytes, sorted, total, 0, end_bit, ctx->stream)));
  memra::cuda::launch(ctx, true, sample_psum_kernel, dim3(grid), dim3(kSpanThreads), 0,
      sorted.Current(), V, k, kb, nb, done, sp);
  MEMRA_CUDA_RETURN_IF(launch_status());
  memra::cuda::launch(ctx, true, sample_qsum_kernel, dim3(grid), dim3(kSpanThreads), 0,
      sorted.Current(), V, k, kb, nb, done, sp, mk, vals, sq);
  MEMRA_CUDA_RETURN_IF(launch_status());
  memra::cuda::launch(ctx, true, sample_select_kernel, dim3(B), dim3(kThreads), 0, sorted.Current(),
      V, k, top_p, seed, seeds, counters, kb, nb, done, sq, mk, vals, pg, out);
  return launch_status();
}

}  // namespace

extern "C" int memra_cuda_sample(MemraCudaCtx* ctx, const MemraSampleParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!p) return memra::kContractMissing;
  return sample_impl(ctx, p->logits, p->B, p->V, p->temperature, p->top_k, p->top_p, p->seed,
                     p->seeds, p->counters, p->out, p->nonfinite);
}
