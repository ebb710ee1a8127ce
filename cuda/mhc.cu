// mHC hyper-connections on the GPU (cpp/include/memra/cuda_abi/basic.h), the twins of
// cpu/mhc.cpp: the mapping (pre / post / Sinkhorn comb + the collapsed input), the post-block
// expansion and the final head mean. Oracle: transformers Glm5NextTextHyperConnection.
//
// mhc_pre at decode (T <= 32 rows, f32 / bf16 fn, 16-byte aligned rows): two kernels, a split-K
//   pass computing every row's raw logits and sum of squares (f32 products: the streams are
//   not rounded to the fn dtype) and a finishing kernel that reduces them in a fixed order and
//   maps (details above mhc_partial_kernel).
// mhc_pre otherwise = one GEMM (memra_cuda_linear) + one mapping kernel (a block per token):
//   f32 / bf16 fn: logits_raw = streams[T, hc*D] fn^T straight from the streams, and the
//     mapping kernel scales each token's logits by its unweighted-RMS factor
//     inv = 1 / sqrt(sum(x^2) / (hc*D) + norm_eps) (linearity: fn(x * inv) = inv * fn(x)), so the
//     normalised [T, hc*D] copy is never written. Against the CPU, which normalises first, this
//     differs by rounding only (~1e-7 relative per logit).
//   f16 fn: the rows are normalised first (memra_cuda_rms_norm, in chunks of <= 64 MiB of
//     scratch) so that the f16 rounding of the GEMM input cannot overflow on large residuals.
// The mapping kernel mirrors the CPU element by element, in the CPU's order and without FMA
// contraction (__fmul_rn / __fadd_rn): given the same logits it gives the same pre, post, comb
// and collapsed up to expf's last-bit differences from the host's libm.
// mhc_post and hc_head_mean use no transcendental and sum in the CPU's order without
// contraction: their outputs are bit-identical to cpu::mhc_post / cpu::hc_head_mean.
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "linear.cuh"
#include "row_group.cuh"
#include "sinkhorn.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::warp_sum;
using memra::cuda::rowsum::Group;
using memra::cuda::rowsum::group_for;
using memra::cuda::rowsum::group_sum;
using memra::cuda::rowsum::kGatedCols;
using memra::cuda::rowsum::load_row_cols;
using memra::cuda::rowsum::rms_norm_cols;
using memra::cuda::rowsum::row_blocks;
using memra::cuda::rowsum::store_rms_cols;
using memra::cuda::rowsum::with_group;

using memra::cuda::sinkhorn_warp_fixed;

namespace {

constexpr int kMaxHc = 64;            // comb [hc, hc] lives in shared memory
// 1024 threads: at decode (T = 1, one block) the sum of squares over hc * D values and the
// collapsed row are latency-bound loops; a wide block keeps most of them in flight at once.
constexpr int kMapThreads = 1024;
constexpr size_t kNormChunkBytes = size_t(64) << 20;

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// One row or column of the Sinkhorn matrix c: the hc entries c[first + k * step], k ascending,
// divided by their sum (in that order) + eps, as cpu/mhc.cpp does.
__device__ __forceinline__ void normalize_line(float* c, int hc, int first, int step,
                                               float hc_eps) {
  float s = 0.0f;
  for (int k = 0; k < hc; ++k) s += c[first + k * step];
  const float d = s + hc_eps;
  for (int k = 0; k < hc; ++k) c[first + k * step] = c[first + k * step] / d;
}

// The mapping of one token from its logits lt [mix] (pre-RMS when fold: each scaled by inv):
// threads tid < hc write pre[tid] (shared), post_t[tid] when post_t is given, and row tid of the
// softmaxed comb c [hc, hc] (shared) when c is given. The CPU's operations in its order.
__device__ __forceinline__ void map_rows(const float* lt, float inv, bool fold, int hc,
                                         const float* __restrict__ base,
                                         const float* __restrict__ scale, float hc_eps, float* pre,
                                         float* post_t, float* c, int tid) {
  if (tid >= hc) return;
  const float s0 = scale[0], s1 = scale[1], s2 = scale[2];
  const int s = tid;
  const float l_pre = fold ? __fmul_rn(lt[s], inv) : lt[s];
  pre[s] = __fadd_rn(sigmoidf(__fadd_rn(__fmul_rn(l_pre, s0), base[s])), hc_eps);
  if (post_t) {
    const float l_post = fold ? __fmul_rn(lt[hc + s], inv) : lt[hc + s];
    post_t[s] = 2.0f * sigmoidf(__fadd_rn(__fmul_rn(l_post, s1), base[hc + s]));
  }
  if (!c) return;
  // Row i = tid of comb: softmax over j, + eps.
  const int i = tid;
  float* row = c + i * hc;
  const float* lc = lt + 2 * hc + i * hc;
  const float* bc = base + 2 * hc + i * hc;
  for (int j = 0; j < hc; ++j) {
    const float l = fold ? __fmul_rn(lc[j], inv) : lc[j];
    row[j] = __fadd_rn(__fmul_rn(l, s2), bc[j]);
  }
  float m = row[0];
  for (int j = 1; j < hc; ++j) m = fmaxf(m, row[j]);
  float sum = 0.0f;
  for (int j = 0; j < hc; ++j) {
    row[j] = expf(row[j] - m);
    sum += row[j];
  }
  for (int j = 0; j < hc; ++j) row[j] = __fadd_rn(row[j] / sum, hc_eps);
}

// Sinkhorn for hc * hc <= 32 (GLM: 4), called by one whole warp: lane i * hc + j holds c[i, j]
// in a register; each row / column sum is gathered by shuffles and added in ascending order, so
// the bits are those of sinkhorn_block (which pays two block barriers per half-iteration).
__device__ __forceinline__ void sinkhorn_warp(float* c, int hc, int iters, float hc_eps, int lane) {
  const bool own = lane < hc * hc;
  const int i = own ? lane / hc : 0, j = own ? lane % hc : 0;
  // Idle lanes hold 1, not 0: a zero dividend sends v / d down the IEEE division's slow-path
  // subroutine, which the whole warp then waits for at every half-iteration (most of the
  // finishing kernel's time, by ncu). Their values are never read or stored.
  float v = own ? c[lane] : 1.0f;
  // Half-iteration h: h = 0 and every even h a column normalisation, odd h a row one.
  for (int h = 0; h < 2 * iters - 1; ++h) {
    const bool col = (h & 1) == 0;
    float s = 0.0f;
    for (int r = 0; r < hc; ++r) s += __shfl_sync(0xffffffffu, v, col ? r * hc + j : i * hc + r);
    v = v / (s + hc_eps);
  }
  if (own) c[lane] = v;
}

// Sinkhorn for any hc <= kMaxHc by the whole block: one column normalisation, then (iters - 1)
// rounds of rows then columns; thread k owns column (row) k and sums it in ascending order, as
// the CPU does. Every thread of the block must call it.
__device__ __forceinline__ void sinkhorn_block(float* c, int hc, int iters, float hc_eps, int tid) {
  if (tid < hc) normalize_line(c, hc, tid, hc, hc_eps);  // column tid
  __syncthreads();
  for (int it = 1; it < iters; ++it) {
    if (tid < hc) normalize_line(c, hc, tid * hc, 1, hc_eps);  // row tid
    __syncthreads();
    if (tid < hc) normalize_line(c, hc, tid, hc, hc_eps);
    __syncthreads();
  }
}

// collapsed[d] = sum over streams (ascending) of pre[s] * st[s, d] for d = d0 + k * step < d1.
__device__ __forceinline__ void collapse(const float* __restrict__ st, const float* pre, int hc,
                                         int D, int d0, int d1, int step, float* __restrict__ out) {
  for (int d = d0; d < d1; d += step) {
    float acc = 0.0f;
    for (int s = 0; s < hc; ++s) acc = __fadd_rn(acc, __fmul_rn(pre[s], st[int64_t(s) * D + d]));
    out[d] = acc;
  }
}

// One block (kMapThreads) per token. Shared: pre [hc], c [hc, hc] (dynamic).
__global__ void __launch_bounds__(kMapThreads)
    mhc_map_kernel(const float* __restrict__ streams, const float* __restrict__ logits, int hc,
                   int D, const float* __restrict__ base, const float* __restrict__ scale,
                   int sinkhorn_iters, float hc_eps, float norm_eps, bool fold,
                   float* __restrict__ post, float* __restrict__ comb,
                   float* __restrict__ collapsed) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float sm[];
  __shared__ float red[kMapThreads / 32];
  float* pre = sm;
  float* c = sm + hc;
  const int tid = threadIdx.x;
  const int64_t t = blockIdx.x;
  const int64_t flat = static_cast<int64_t>(hc) * D;
  const int mix = (2 + hc) * hc;
  const float* st = streams + t * flat;

  float inv = 1.0f;
  if (fold && flat > 0) {
    float ss = 0.0f;
    int64_t k0 = 0;
    if ((reinterpret_cast<uintptr_t>(st) & 15u) == 0) {  // 16-byte loads, four in flight
      const int64_t n4 = flat / 4;
      const float4* s4 = reinterpret_cast<const float4*>(st);
#pragma unroll 4
      for (int64_t q = tid; q < n4; q += kMapThreads) {
        const float4 v = s4[q];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
      k0 = 4 * n4;
    }
    for (int64_t k = k0 + tid; k < flat; k += kMapThreads) {
      const float v = st[k];
      ss += v * v;
    }
    ss = warp_sum(ss);
    if ((tid & 31) == 0) red[tid >> 5] = ss;
    __syncthreads();
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kMapThreads / 32; ++w) s += red[w];
    inv = 1.0f / sqrtf(s / static_cast<float>(flat) + norm_eps);
  }

  map_rows(logits + t * mix, inv, fold, hc, base, scale, hc_eps, pre, post + t * hc, c, tid);
  __syncthreads();
  if (hc * hc <= 32) {
    if (tid < 32) sinkhorn_warp(c, hc, sinkhorn_iters, hc_eps, tid);
    __syncthreads();
  } else {
    sinkhorn_block(c, hc, sinkhorn_iters, hc_eps, tid);
  }
  float* ct = comb + t * hc * hc;
  for (int k = tid; k < hc * hc; k += kMapThreads) ct[k] = c[k];
  collapse(st, pre, hc, D, tid, D, kMapThreads, collapsed + t * D);
}

// ---- The split path for decode rows (T <= kSplitMaxT, fold, 16-byte aligned rows): the logits
// GEMM and the RMS sum are one split-K pass over many blocks (one block per kSplitK values of
// the flat row reads them once for all T rows), and a second kernel reduces the partials in a
// fixed order and maps; it spreads `collapsed` over blocks and overlaps the Sinkhorn with it.
// Three launches (cuBLAS GEMV + its reduction + the one-block-per-token map) become two, and no
// single block walks the whole 16384-value row. Deterministic: fixed-order sums, no atomics.
constexpr int kSplitMaxT = 32;
constexpr int kSplitK = 128;          // flat values per partial block: 32 lanes x 4
constexpr int kPartThreads = 1024;    // partial kernel: a warp per output (m < 32), two above
constexpr int kSplitMaxOut = 64;      // mix + 1 partial outputs (logits + the sum of squares)
constexpr int kPartOuts = kSplitMaxOut / (kPartThreads / 32);  // outputs per warp (2)
constexpr int kFinishThreads = 256;
constexpr int kFinishD = 256;         // collapsed columns per finishing block: one per thread
static_assert(kFinishD == kFinishThreads, "mhc_finish_kernel: one collapsed column per thread");
constexpr int kFinishUnroll = 4;      // partials in flight per lane and output
constexpr int kMaxCollapseHc = 7;     // mix + 1 <= 64 implies hc <= 7: a thread's stream values

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

// One partial output of a split: the warp's sum of v . x over its lanes' four values (a row of
// fn, or x itself for the sum of squares). Shared by both partial passes, so their bits agree.
__device__ __forceinline__ float partial_dot(float4 v, float4 x) {
  return warp_sum(v.x * x.x + v.y * x.y + v.z * x.z + v.w * x.w);
}

// Block s, lane l: the 4 flat values k = s * kSplitK + 4 l of every row t; warp w computes the
// partial outputs m = w and w + 32 (when <= mix): m < mix the dot with fn row m, m == mix the
// sum of squares. A warp's fn values are loaded once, before the rows, so every load of a block
// is in flight at once (the kernel is one memory round trip per row, not one per output).
// part [T, mix + 1, S] (S = gridDim.x; an output's partials contiguous for the reduction).
template <typename W>
__global__ void __launch_bounds__(kPartThreads)
    mhc_partial_kernel(const float* __restrict__ streams, int T, int flat,
                       const W* __restrict__ fn, int mix, float* __restrict__ part) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int s = blockIdx.x, S = gridDim.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int k = s * kSplitK + 4 * lane;
  const bool in = k < flat;  // flat % 4 == 0: a lane's four values are all in or all out
  float4 w[kPartOuts];
#pragma unroll
  for (int j = 0; j < kPartOuts; ++j) {
    const int m = warp + 32 * j;
    w[j] = (in && m < mix) ? load4(fn + int64_t(m) * flat + k) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int t = 0; t < T; ++t) {
    const float4 x = in ? load4(streams + int64_t(t) * flat + k) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int j = 0; j < kPartOuts; ++j) {
      const int m = warp + 32 * j;
      if (m > mix) break;
      const float d = partial_dot(m == mix ? x : w[j], x);
      if (lane == 0) part[(int64_t(t) * (mix + 1) + m) * S + s] = d;
    }
  }
}

// lt[m] (m <= mix): the sum of one token's partials pt [mix + 1, S] in a fixed order. Lane l adds
// splits l, l + 32, l + 64, ... in turn, then the warp's butterfly; warp w reduces outputs w,
// w + kWarps, ... The order of an output's sum does not depend on kWarps, so every finishing
// kernel gets the same logits from the same partials. Loads go through L2 (ld.global.cg): in
// mhc_site_kernel the partials are other blocks' stores of the same launch.
template <int kWarps>
__device__ __forceinline__ void reduce_partials(const float* __restrict__ pt, int S, int mix,
                                                float* lt, int warp, int lane) {
  constexpr int kOuts = (kSplitMaxOut + kWarps - 1) / kWarps;
  float acc[kOuts];
#pragma unroll
  for (int j = 0; j < kOuts; ++j) acc[j] = 0.0f;
  for (int s0 = lane; s0 < S; s0 += 32 * kFinishUnroll) {
    float v[kOuts][kFinishUnroll];
#pragma unroll
    for (int j = 0; j < kOuts; ++j) {
      const int m = warp + kWarps * j;
#pragma unroll
      for (int u = 0; u < kFinishUnroll; ++u) {
        const int sp = s0 + 32 * u;
        v[j][u] = (m <= mix && sp < S) ? __ldcg(pt + int64_t(m) * S + sp) : 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < kOuts; ++j) {
#pragma unroll
      for (int u = 0; u < kFinishUnroll; ++u) acc[j] += v[j][u];
    }
  }
#pragma unroll
  for (int j = 0; j < kOuts; ++j) {
    const int m = warp + kWarps * j;
    const float a = warp_sum(acc[j]);
    if (lane == 0 && m <= mix) lt[m] = a;
  }
}

// Token t's Sinkhorn comb from the softmaxed rows in c [hc, hc] (shared), stored to ct; every
// thread of the block calls it (sinkhorn_block has barriers when hc * hc > 32).
__device__ __forceinline__ void finish_comb(float* c, float* __restrict__ ct, int hc,
                                            int sinkhorn_iters, float hc_eps, int tid,
                                            int threads) {
  const int warp = tid >> 5, lane = tid & 31;
  if (hc * hc <= 32) {
    if (warp == 0) {
      if (hc == 4) {
        sinkhorn_warp_fixed<4>(c, sinkhorn_iters, hc_eps, lane);
      } else {
        sinkhorn_warp(c, hc, sinkhorn_iters, hc_eps, lane);
      }
      __syncwarp();
      if (lane < hc * hc) ct[lane] = c[lane];
    }
  } else {
    sinkhorn_block(c, hc, sinkhorn_iters, hc_eps, tid);
    for (int k = tid; k < hc * hc; k += threads) ct[k] = c[k];
  }
}

// Block (x, t), x >= 1: columns [(x - 1) * kFinishD, x * kFinishD) of token t's collapsed row;
// x == 0: token t's post and Sinkhorn comb. Every load a block needs is issued at its start, all
// independent (the partials, base and scale, and a collapsing thread's hc stream values), so the
// block waits for one memory round trip instead of a chain of them (cold in L2 between layers,
// each would cost a DRAM latency). Then: reduce the partials (every block the same fixed order:
// lanes stride the splits, then the warp's butterfly), pre (and post / comb rows in block 0),
// then the Sinkhorn (block 0) or the collapse.
__global__ void __launch_bounds__(kFinishThreads)
    mhc_finish_kernel(const float* __restrict__ streams, const float* __restrict__ part, int S,
                      int hc, int D, const float* __restrict__ base,
                      const float* __restrict__ scale, int sinkhorn_iters, float hc_eps,
                      float norm_eps, float* __restrict__ post, float* __restrict__ comb,
                      float* __restrict__ collapsed) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float sm[];  // pre [hc], c [hc, hc]
  __shared__ float lt[kSplitMaxOut];
  __shared__ float sbase[kSplitMaxOut + 3];  // base [mix], then scale [3]
  float* pre = sm;
  float* c = sm + hc;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int t = blockIdx.y;
  const int mix = (2 + hc) * hc;
  const int64_t flat = static_cast<int64_t>(hc) * D;
  const bool head = blockIdx.x == 0;
  const float* pt = part + int64_t(t) * (mix + 1) * S;

  // Issue every load first.
  if (tid < mix) sbase[tid] = base[tid];
  if (tid < 3) sbase[mix + tid] = scale[tid];
  const int d = head ? D : (blockIdx.x - 1) * kFinishD + tid;  // this thread's column
  const float* st = streams + int64_t(t) * flat;
  float xs[kMaxCollapseHc];
  if (d < D) {
#pragma unroll
    for (int q = 0; q < kMaxCollapseHc; ++q) xs[q] = q < hc ? st[int64_t(q) * D + d] : 0.0f;
  }
  reduce_partials<kFinishThreads / 32>(pt, S, mix, lt, warp, lane);
  __syncthreads();
  const float inv = 1.0f / sqrtf(lt[mix] / static_cast<float>(flat) + norm_eps);
  map_rows(lt, inv, true, hc, sbase, sbase + mix, hc_eps, pre,
           head ? post + int64_t(t) * hc : nullptr, head ? c : nullptr, tid);
  __syncthreads();
  if (head) {
    finish_comb(c, comb + int64_t(t) * hc * hc, hc, sinkhorn_iters, hc_eps, tid, kFinishThreads);
    return;
  }
  if (d < D) {
    // collapse()'s arithmetic on the prefetched values: pre[s] * x[s], summed s ascending.
    float a = 0.0f;
#pragma unroll
    for (int q = 0; q < kMaxCollapseHc; ++q) {
      if (q < hc) a = __fadd_rn(a, __fmul_rn(pre[q], xs[q]));
    }
    collapsed[int64_t(t) * D + d] = a;
  }
}

// mhc_pre at decode with the layer's input RMSNorm fused (memra_cuda_mhc_pre_norm): grid (2, T),
// blocks of Group<G>::kBlock threads, G = group_for(D), D <= kNormCols * G.
// Block (0, t): token t's post and Sinkhorn comb, as mhc_finish_kernel's block 0.
// Block (1, t): token t's collapsed row, RMS-normalised in registers. Thread g < G owns columns
// g + G k (k < kNormCols): rms_norm_kernel<G>'s columns, sum of squares and group reduction over
// the collapsed values, so `out` equals rms_norm(collapsed) byte for byte. The two blocks run side
// by side: the Sinkhorn (2 iters - 1 dependent steps) no longer precedes the collapse, and the
// norm's launch and its round trip through memory are gone.
constexpr int kNormCols = 4;

// collapse()'s arithmetic over a thread's columns d = tid + G * k < D of its row group (none
// when !live): h[k] = the sum over streams q < hc, ascending, of pre[q] * xs[k][q] (h[k] = 0
// elsewhere); returns the sum of the h[k]^2 in column order, row_sum_squares' order. Shared by
// the two finishing forms (mhc_finish_norm_kernel, mhc_site_kernel), so their bytes agree.
template <int G, int Q>
__device__ __forceinline__ float collapse_cols(const float* pre, const float (&xs)[kNormCols][Q],
                                               int hc, bool live, int tid, int D,
                                               float (&h)[kNormCols]) {
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormCols; ++k) {
    h[k] = 0.0f;
    if (live && tid + G * k < D) {
      float a = 0.0f;
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        if (q < hc) a = __fadd_rn(a, __fmul_rn(pre[q], xs[k][q]));
      }
      h[k] = a;
      ss += a * a;
    }
  }
  return ss;
}

template <int G>
__global__ void __launch_bounds__(Group<G>::kBlock)
    mhc_finish_norm_kernel(const float* __restrict__ streams, const float* __restrict__ part,
                           int S, int hc, int D, const float* __restrict__ base,
                           const float* __restrict__ scale, int sinkhorn_iters, float hc_eps,
                           float norm_eps, const float* __restrict__ rms_w, float rms_eps,
                           float* __restrict__ post, float* __restrict__ comb,
                           float* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  constexpr int kThreads = Group<G>::kBlock;
  extern __shared__ float sm[];  // pre [hc], c [hc, hc]
  __shared__ float lt[kSplitMaxOut];
  __shared__ float sbase[kSplitMaxOut + 3];  // base [mix], then scale [3]
  __shared__ float red[Group<G>::kWarps];
  float* pre = sm;
  float* c = sm + hc;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int t = blockIdx.y;
  const int mix = (2 + hc) * hc;
  const int64_t flat = static_cast<int64_t>(hc) * D;
  const bool head = blockIdx.x == 0;
  const bool live = !head && tid < G;  // a thread of block 1's row group

  // Issue every load first (see mhc_finish_kernel).
  if (tid < mix) sbase[tid] = base[tid];
  if (tid < 3) sbase[mix + tid] = scale[tid];
  const float* st = streams + int64_t(t) * flat;
  float xs[kNormCols][kMaxCollapseHc];
  float wv[kNormCols];
#pragma unroll
  for (int k = 0; k < kNormCols; ++k) {
    const int d = tid + G * k;
    const bool in = live && d < D;
#pragma unroll
    for (int q = 0; q < kMaxCollapseHc; ++q) xs[k][q] = in && q < hc ? st[int64_t(q) * D + d] : 0.0f;
    wv[k] = in && rms_w ? rms_w[d] : 0.0f;
  }
  reduce_partials<Group<G>::kWarps>(part + int64_t(t) * (mix + 1) * S, S, mix, lt, warp, lane);
  __syncthreads();
  const float inv = 1.0f / sqrtf(lt[mix] / static_cast<float>(flat) + norm_eps);
  map_rows(lt, inv, true, hc, sbase, sbase + mix, hc_eps, pre,
           head ? post + int64_t(t) * hc : nullptr, head ? c : nullptr, tid);
  __syncthreads();
  if (head) {
    finish_comb(c, comb + int64_t(t) * hc * hc, hc, sinkhorn_iters, hc_eps, tid, kThreads);
    return;
  }
  // collapse()'s arithmetic, then row_sum_squares' (columns ascending) and rms_norm_kernel's.
  float h[kNormCols];
  float ss = collapse_cols<G>(pre, xs, hc, live, tid, D, h);
  ss = group_sum<G>(ss, red);  // every thread of the block: it has barriers
  if (!live) return;
  const float r = 1.0f / sqrtf(ss / static_cast<float>(D) + rms_eps);
  store_rms_cols<G>(h, r, wv, rms_w != nullptr, tid, D, out + int64_t(t) * D);
}

// ---- One launch per mHC site at a single decode row (T == 1, hc == kSiteHc, D % 4 == 0,
// D <= kNormCols * 1024, the norm fused): mhc_site_kernel<W, POST, G>, grid S = flat / kSplitK
// blocks of kPartThreads. Each block does mhc_partial_kernel's work on its split (with POST
// first computing its 128 stream values as mhc_post_kernel does, from the previous site's y,
// post and comb, and storing them as the new streams); the block that arrives last
// (memra::cuda::last_block) then does mhc_finish_norm_kernel's two blocks' work at once: the
// collapse and the RMSNorm in warps 0..G/32-1, the Sinkhorn in warp 0 beside the norm's tail.
// Same operations in the same order as [mhc_post +] mhc_partial + mhc_finish_norm, so the same
// bytes, in one launch instead of three (at batch 1 a site is mostly launch and round-trip
// latency).
constexpr int kSiteHc = 4;  // GLM-5.3; other hc take the multi-kernel path

struct SiteArgs {
  const float* y;          // [D] the sublayer's output (POST)
  const float* post_prev;  // [hc] the previous site's post (POST)
  const float* comb_prev;  // [hc, hc] the previous site's comb (POST)
  const float* residual;   // [hc, D] the streams before the sublayer (POST)
  const float* streams;    // [hc, D] this site's input streams (!POST)
  float* streams_out;      // [hc, D] POST: mhc_post's output, this site's input streams
  const void* fn;          // [mix, hc * D] f32 / bf16
  const float* base;       // [mix]
  const float* scale;      // [3]
  const float* rms_w;      // [D] or null
  float* part;             // [mix + 1, S] split partials (scratch)
  float* post;             // [hc]
  float* comb;             // [hc, hc]
  float* out;              // [D] rms_norm(collapsed)
  unsigned* ticket;        // MemraCudaCtx::tickets[kTicketMhcSite]
  int D;
  int sinkhorn_iters;
  float hc_eps, norm_eps, rms_eps;
  int defer_comb;  // store comb's softmaxed rows and leave the Sinkhorn pending (common.cuh)
};

template <typename W, bool POST, int G>
__global__ void __launch_bounds__(kPartThreads) mhc_site_kernel(SiteArgs a) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  constexpr int HC = kSiteHc;
  constexpr int mix = (2 + HC) * HC;
  const int s = blockIdx.x, S = gridDim.x;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int D = a.D, flat = HC * D;

  // -- Every block: its split of the flat row (mhc_partial_kernel at T = 1).
  const int k = s * kSplitK + 4 * lane;
  const bool in = k < flat;
  const W* fn = static_cast<const W*>(a.fn);
  float4 w[kPartOuts];
#pragma unroll
  for (int j = 0; j < kPartOuts; ++j) {
    const int m = warp + 32 * j;
    w[j] = (in && m < mix) ? load4(fn + int64_t(m) * flat + k) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
  if (in) {
    if constexpr (POST) {
      // mhc_post_kernel's arithmetic for stream j, columns d .. d + 3 (D % 4 == 0: one stream).
      const int j = k / D, d = k - j * D;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int i = 0; i < HC; ++i) {
        const float c = a.comb_prev[i * HC + j];
        const float4 r = load4(a.residual + int64_t(i) * D + d);
        acc.x = __fadd_rn(acc.x, __fmul_rn(c, r.x));
        acc.y = __fadd_rn(acc.y, __fmul_rn(c, r.y));
        acc.z = __fadd_rn(acc.z, __fmul_rn(c, r.z));
        acc.w = __fadd_rn(acc.w, __fmul_rn(c, r.w));
      }
      const float p = a.post_prev[j];
      const float4 yv = load4(a.y + d);
      x.x = __fadd_rn(__fmul_rn(p, yv.x), acc.x);
      x.y = __fadd_rn(__fmul_rn(p, yv.y), acc.y);
      x.z = __fadd_rn(__fmul_rn(p, yv.z), acc.z);
      x.w = __fadd_rn(__fmul_rn(p, yv.w), acc.w);
      if (warp == 0) *reinterpret_cast<float4*>(a.streams_out + k) = x;
    } else {
      x = load4(a.streams + k);
    }
  }
#pragma unroll
  for (int j = 0; j < kPartOuts; ++j) {
    const int m = warp + 32 * j;
    if (m > mix) break;
    const float d = partial_dot(m == mix ? x : w[j], x);
    if (lane == 0) a.part[int64_t(m) * S + s] = d;
  }

  // -- The last block: mhc_finish_norm_kernel's blocks 0 and 1 side by side.
  if (!memra::cuda::last_block(a.ticket)) return;
  __shared__ float lt[kSplitMaxOut];
  __shared__ float sbase[kSplitMaxOut + 3];  // base [mix], then scale [3]
  __shared__ float pre[HC], c[HC * HC];
  __shared__ float red[32];
  if (tid < mix) sbase[tid] = a.base[tid];
  if (tid < 3) sbase[mix + tid] = a.scale[tid];
  // The norm's row group of G threads: rms_norm_kernel<G>'s thread g = 32 v + lane is lane
  // `lane` of warp v (v < G / 32). Warp 0 collapses its columns and hands them (and its sum of
  // squares) over in shared memory before it runs the Sinkhorn; warp 1 scales and stores them.
  constexpr int kV = G / 32;
  __shared__ float h0[kNormCols][32];
  const bool norm_warp = warp < kV;
  const float* st = POST ? a.streams_out : a.streams;
  float xs[kNormCols][HC];
  float wv[kNormCols], wv0[kNormCols];  // wv0: warp 0's columns' weights, for warp 1
#pragma unroll
  for (int kk = 0; kk < kNormCols; ++kk) {
    const int d = tid + G * kk;
    const bool ok = norm_warp && d < D;
#pragma unroll
    for (int q = 0; q < HC; ++q) xs[kk][q] = ok ? __ldcg(st + int64_t(q) * D + d) : 0.0f;
    wv[kk] = ok && a.rms_w ? a.rms_w[d] : 0.0f;
    const int d0 = lane + G * kk;
    wv0[kk] = warp == 1 && d0 < D && a.rms_w ? a.rms_w[d0] : 0.0f;
  }
  reduce_partials<kPartThreads / 32>(a.part, S, mix, lt, warp, lane);
  __syncthreads();
  const float inv = 1.0f / sqrtf(lt[mix] / static_cast<float>(flat) + a.norm_eps);
  map_rows(lt, inv, true, HC, sbase, sbase + mix, a.hc_eps, pre, a.post, c, tid);
  __syncthreads();
  // collapse()'s arithmetic, then row_sum_squares' column order and group_sum<G>'s warp order.
  float h[kNormCols];
  float ss = collapse_cols<G>(pre, xs, HC, norm_warp, tid, D, h);
  if (norm_warp) {  // uniform per warp
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
  }
  if (warp == 0) {
#pragma unroll
    for (int kk = 0; kk < kNormCols; ++kk) h0[kk][lane] = h[kk];
    asm volatile("bar.arrive 1, %0;\n" ::"r"(kPartThreads) : "memory");
    // finish_comb's warp path (deferred: a later launch runs it over the stored rows).
    if (!a.defer_comb) sinkhorn_warp_fixed<HC>(c, a.sinkhorn_iters, a.hc_eps, lane);
    __syncwarp();
    if (lane < HC * HC) a.comb[lane] = c[lane];
    return;
  }
  asm volatile("bar.sync 1, %0;\n" ::"r"(kPartThreads) : "memory");  // red and h0 are complete
  float total;
  if constexpr (kV == 1) {
    total = red[0];  // group_sum<32> is the warp's butterfly alone
  } else {
    total = 0.0f;
#pragma unroll
    for (int i = 0; i < kV; ++i) total += red[i];
  }
  const float r = 1.0f / sqrtf(total / static_cast<float>(D) + a.rms_eps);
#pragma unroll
  for (int kk = 0; kk < kNormCols; ++kk) {
    const int d = tid + G * kk;
    if (norm_warp && d < D) {
      const float n = __fmul_rn(h[kk], r);
      a.out[d] = a.rms_w ? __fmul_rn(wv[kk], n) : n;
    }
    const int d0 = lane + G * kk;
    if (warp == 1 && d0 < D) {
      const float n = __fmul_rn(h0[kk][lane], r);
      a.out[d0] = a.rms_w ? __fmul_rn(wv0[kk], n) : n;
    }
  }
}

// out[t, j, d] = post[t, j] * y[t, d] + sum_i comb[t, i, j] * residual[t, i, d]. Block x walks
// d, block y walks the rows r = t * hc + j.
__global__ void mhc_post_kernel(const float* __restrict__ y, const float* __restrict__ post,
                                const float* __restrict__ comb, const float* __restrict__ residual,
                                int64_t rows, int hc, int D, float* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int d = blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t t = r / hc;
    const int j = static_cast<int>(r % hc);
    const float* ct = comb + t * hc * hc;
    const float* rt = residual + t * hc * D;
    float acc = 0.0f;
    for (int i = 0; i < hc; ++i) acc = __fadd_rn(acc, __fmul_rn(ct[i * hc + j], rt[int64_t(i) * D + d]));
    out[r * D + d] = __fadd_rn(__fmul_rn(post[r], y[t * D + d]), acc);
  }
}

// out[t, d] = (sum_s streams[t, s, d]) / hc.
__global__ void hc_head_mean_kernel(const float* __restrict__ streams, int64_t T, int hc, int D,
                                    float* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int d = blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const float* st = streams + t * hc * D;
    float acc = 0.0f;
    for (int s = 0; s < hc; ++s) acc += st[int64_t(s) * D + d];
    out[t * D + d] = acc / static_cast<float>(hc);
  }
}

// The model's head at the last block (memra_cuda_mhc_post_head_norm): out[t] =
// rms_norm(hc_head_mean(mhc_post(y, post, comb, residual))[t], w, eps), one block per row of
// Group<G> threads (G = group_for(D), D <= kGatedCols * G): thread g's columns g + G c hold the
// hc stream values (mhc_post_kernel's arithmetic), their mean (hc_head_mean_kernel's) and then
// rms_norm_row's short form over them, so out has the bytes of the three launches in one, and
// the expanded streams never go to memory (two launches fewer on the decode step's critical path
// before the LM head).
constexpr int kHeadMaxHc = 8;

template <int G>
__global__ void __launch_bounds__(Group<G>::kBlock)
    mhc_head_norm_kernel(const float* __restrict__ y, const float* __restrict__ post,
                         const float* __restrict__ comb, const float* __restrict__ residual,
                         int64_t T, int hc, int D, const float* __restrict__ w, float eps,
                         float* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[Group<G>::kWarps];
  const int64_t t = int64_t(blockIdx.x) * Group<G>::kRows + threadIdx.x / G;
  const int lane = threadIdx.x % G;
  const bool live = t < T;
  const int64_t tt = live ? t : 0;
  const float* ct = comb + tt * hc * hc;
  const float* pt = post + tt * hc;
  const float* rt = residual + tt * hc * D;
  float mean[kGatedCols], wv[kGatedCols];
  load_row_cols<G>(w, live, lane, D, wv);
#pragma unroll
  for (int c = 0; c < kGatedCols; ++c) {
    const int d = lane + G * c;
    mean[c] = 0.0f;
    if (!live || d >= D) continue;
    float r[kHeadMaxHc];
#pragma unroll
    for (int i = 0; i < kHeadMaxHc; ++i) r[i] = i < hc ? rt[int64_t(i) * D + d] : 0.0f;
    const float yv = y[tt * D + d];
    float acc_mean = 0.0f;
    for (int j = 0; j < hc; ++j) {
      float acc = 0.0f;  // mhc_post_kernel: sum over i ascending, then post * y + it
#pragma unroll
      for (int i = 0; i < kHeadMaxHc; ++i) {
        if (i < hc) acc = __fadd_rn(acc, __fmul_rn(ct[i * hc + j], r[i]));
      }
      acc_mean += __fadd_rn(__fmul_rn(pt[j], yv), acc);  // hc_head_mean_kernel: s ascending
    }
    mean[c] = acc_mean / static_cast<float>(hc);
  }
  rms_norm_cols<G>(mean, wv, w != nullptr, live, lane, D, eps, red, out + tt * D);
}

dim3 rows_grid(int D, int64_t rows, int threads) {
  return dim3(ceil_div(D, threads), static_cast<unsigned>(rows < 65535 ? rows : 65535));
}

int threads_for(int D) { return D >= 256 ? 256 : (D >= 128 ? 128 : (D >= 64 ? 64 : 32)); }

// The single-launch site (mhc_site_kernel) takes one decode row of GLM's geometry: f32 / bf16 fn
// (fold), hc == kSiteHc, D % 4 == 0 (a lane's four values in one stream), the norm's row group
// in one block (D <= kNormCols * 1024), 16-byte aligned rows.
bool site_fits(int T, int hc, int D, int fn_dtype, const void* fn, const float* streams) {
  const uintptr_t fn_align = fn_dtype == 0 ? 15u : 7u;
  return T == 1 && hc == kSiteHc && fn_dtype != 2 && D > 0 && D % 4 == 0 &&
         D <= kNormCols * 1024 && (reinterpret_cast<uintptr_t>(fn) & fn_align) == 0 &&
         memra::cuda::aligned16(streams);
}

template <bool POST>
int launch_site(MemraCudaCtx* ctx, SiteArgs a, int fn_dtype) {
  constexpr int mix = (2 + kSiteHc) * kSiteHc;
  const int S = static_cast<int>(ceil_div(int64_t(kSiteHc) * a.D, kSplitK));
  Scratch part(ctx, static_cast<size_t>(S) * (mix + 1) * sizeof(float));
  MEMRA_CUDA_RETURN_IF(part.status());
  a.part = part.as<float>();
  a.ticket = ctx->tickets + memra::cuda::kTicketMhcSite;
  a.defer_comb = ctx->options.mhc_defer ? 1 : 0;
  static_assert(kSiteHc == memra::cuda::kSinkHc, "the deferred Sinkhorn is the site's");
  with_group(group_for(a.D), [&](auto g) {
    constexpr int G = decltype(g)::value;
    if (fn_dtype == 0) {
      memra::cuda::launch(ctx, true, mhc_site_kernel<float, POST, G>, dim3(S), dim3(kPartThreads), 0, a);
    } else {
      memra::cuda::launch(ctx, true, mhc_site_kernel<__nv_bfloat16, POST, G>, dim3(S),
                          dim3(kPartThreads), 0, a);
    }
  });
  MEMRA_CUDA_RETURN_IF(launch_status());
  if (a.defer_comb) ctx->pending = memra::cuda::SinkTask{a.comb, a.sinkhorn_iters, a.hc_eps};
  return memra::kOk;
}

SiteArgs site_args(int D, const void* fn, const float* base, const float* scale,
                   int sinkhorn_iters, float hc_eps, float norm_eps, const float* rms_w,
                   float rms_eps, float* post, float* comb, float* out) {
  SiteArgs a = {};
  a.D = D;
  a.fn = fn;
  a.base = base;
  a.scale = scale;
  a.sinkhorn_iters = sinkhorn_iters;
  a.hc_eps = hc_eps;
  a.norm_eps = norm_eps;
  a.rms_w = rms_w;
  a.rms_eps = rms_eps;
  a.post = post;
  a.comb = comb;
  a.out = out;
  return a;
}

// memra_cuda_mhc_pre, and with rms (memra_cuda_mhc_pre_norm) `collapsed` replaced by
// rms_norm(collapsed, rms_w, rms_eps): fused into the finishing kernel on the decode path when
// D <= kNormCols * 1024, otherwise memra_cuda_rms_norm in place after the mapping.
int mhc_pre_impl(MemraCudaCtx* ctx, const float* streams, int T, int hc, int D, const void* fn,
                 int fn_dtype, const float* base, const float* scale, int sinkhorn_iters,
                 float hc_eps, float norm_eps, bool rms, const float* rms_w, float rms_eps,
                 float* post, float* comb, float* collapsed) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (rms && !(rms_eps >= 0.0f && rms_eps <= FLT_MAX)) return memra::kContractValue;
  if (T < 0 || D < 0 || hc < 1 || sinkhorn_iters < 1) return memra::kContractValue;
  if (fn_dtype < 0 || fn_dtype > 2) return memra::kContractDType;
  const int64_t flat = static_cast<int64_t>(hc) * D;
  if (flat > INT_MAX) return memra::kContractValue;
  if (hc > kMaxHc) return memra::kUnsupportedGeometry;
  if (T == 0) return memra::kOk;
  if (!streams || !fn || !base || !scale || !post || !comb || !collapsed) {
    return memra::kContractMissing;
  }
  if (rms && site_fits(T, hc, D, fn_dtype, fn, streams)) {
    SiteArgs a = site_args(D, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, rms_w, rms_eps,
                           post, comb, collapsed);
    a.streams = streams;
    return launch_site<false>(ctx, a, fn_dtype);
  }
  const int mix = (2 + hc) * hc;
  const bool fold = fn_dtype != 2 || flat == 0;
  const uintptr_t fn_align = fn_dtype == 0 ? 15u : 7u;  // four weights per load
  if (fold && flat > 0 && T <= kSplitMaxT && mix + 1 <= kSplitMaxOut && flat % 4 == 0 &&
      memra::cuda::aligned16(streams) &&
      (reinterpret_cast<uintptr_t>(fn) & fn_align) == 0) {
    const int S = static_cast<int>(ceil_div(flat, kSplitK));
    Scratch part(ctx, static_cast<size_t>(T) * S * (mix + 1) * sizeof(float));
    MEMRA_CUDA_RETURN_IF(part.status());
    if (fn_dtype == 0) {
      memra::cuda::launch(ctx, true, mhc_partial_kernel<float>, dim3(S), dim3(kPartThreads), 0,
          streams, T, static_cast<int>(flat), static_cast<const float*>(fn), mix, part.as<float>());
    } else {
      memra::cuda::launch(ctx, true, mhc_partial_kernel<__nv_bfloat16>, dim3(S), dim3(kPartThreads),
          0, streams, T, static_cast<int>(flat), static_cast<const __nv_bfloat16*>(fn), mix,
          part.as<float>());
    }
    MEMRA_CUDA_RETURN_IF(launch_status());
    const size_t smem = sizeof(float) * (static_cast<size_t>(hc) + static_cast<size_t>(hc) * hc);
    if (rms && D <= kNormCols * 1024) {
      with_group(group_for(D), [&](auto g) {
        constexpr int G = decltype(g)::value;
        memra::cuda::launch(ctx, true, mhc_finish_norm_kernel<G>, dim3(2, static_cast<unsigned>(T)),
                            dim3(Group<G>::kBlock), smem, streams, part.as<float>(), S, hc, D, base,
                            scale, sinkhorn_iters, hc_eps, norm_eps, rms_w, rms_eps, post, comb,
                            collapsed);
      });
      return launch_status();
    }
    // Block 0 of a token: post and comb; blocks 1..: kFinishD columns of collapsed each.
    const dim3 grid(1 + static_cast<unsigned>(ceil_div(D, kFinishD)), static_cast<unsigned>(T));
    memra::cuda::launch(ctx, true, mhc_finish_kernel, dim3(grid), dim3(kFinishThreads), smem,
        streams, part.as<float>(), S, hc, D, base, scale, sinkhorn_iters, hc_eps, norm_eps, post,
        comb, collapsed);
    MEMRA_CUDA_RETURN_IF(launch_status());
    return rms ? memra_cuda_rms_norm(ctx, collapsed, T, D, rms_w, rms_eps, collapsed) : memra::kOk;
  }
  Scratch logits(ctx, static_cast<size_t>(T) * mix * sizeof(float));
  MEMRA_CUDA_RETURN_IF(logits.status());
  if (fold) {
    MEMRA_CUDA_RETURN_IF(memra::cuda::linear(ctx, streams, T, static_cast<int>(flat), fn, fn_dtype,
                                             mix, nullptr, logits.as<float>()));
  } else {
    const int64_t chunk64 = static_cast<int64_t>(kNormChunkBytes / (sizeof(float) * flat));
    const int chunk = static_cast<int>(chunk64 < 1 ? 1 : (chunk64 < T ? chunk64 : T));
    Scratch normed(ctx, static_cast<size_t>(chunk) * flat * sizeof(float));
    MEMRA_CUDA_RETURN_IF(normed.status());
    for (int t0 = 0; t0 < T; t0 += chunk) {
      const int n = T - t0 < chunk ? T - t0 : chunk;
      MEMRA_CUDA_RETURN_IF(memra_cuda_rms_norm(ctx, streams + t0 * flat, n,
                                               static_cast<int>(flat), nullptr, norm_eps,
                                               normed.as<float>()));
      MEMRA_CUDA_RETURN_IF(memra::cuda::linear(ctx, normed.as<float>(), n, static_cast<int>(flat),
                                               fn, fn_dtype, mix, nullptr,
                                               logits.as<float>() + static_cast<int64_t>(t0) * mix));
    }
  }
  const size_t smem = sizeof(float) * (static_cast<size_t>(hc) + static_cast<size_t>(hc) * hc);
  memra::cuda::launch(ctx, true, mhc_map_kernel, dim3(static_cast<unsigned>(T)), dim3(kMapThreads),
      smem, streams, logits.as<float>(), hc, D, base, scale, sinkhorn_iters, hc_eps, norm_eps, fold,
      post, comb, collapsed);
  MEMRA_CUDA_RETURN_IF(launch_status());
  return rms ? memra_cuda_rms_norm(ctx, collapsed, T, D, rms_w, rms_eps, collapsed) : memra::kOk;
}

// A deferred Sinkhorn in a launch of its own (memra::cuda::flush_pending).
__global__ void __launch_bounds__(32) sink_task_kernel(memra::cuda::SinkTask task) {
  memra::cuda::run_sink_task(task);
}

}  // namespace

namespace memra::cuda {

int flush_pending(MemraCudaCtx* ctx) {
  if (!ctx->pending.comb) return kOk;
  const SinkTask task = take_pending(ctx);
  const int rc = launch(ctx, true, sink_task_kernel, dim3(1), dim3(32), 0, task);
  return settle_pending(ctx, task, rc != kOk ? rc : launch_status());
}

}  // namespace memra::cuda

namespace {

// The bodies of the MemraMhcParams forms (memra_cuda_mhc below), each the entry point it was
// before the forms became one entry: their checks, error codes and launches.

// expand: out = mhc_post(y, post, comb, residual).
int mhc_post(MemraCudaCtx* ctx, const float* y, const float* post, const float* comb,
             const float* residual, int T, int hc, int D, float* out) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || hc < 0 || D < 0) return memra::kContractValue;
  const int64_t rows = static_cast<int64_t>(T) * hc;
  if (rows == 0 || D == 0) return memra::kOk;
  if (!y || !post || !comb || !residual || !out) return memra::kContractMissing;
  const int threads = threads_for(D);
  memra::cuda::launch(ctx, true, mhc_post_kernel, dim3(rows_grid(D, rows, threads)), dim3(threads),
      0, y, post, comb, residual, rows, hc, D, out);
  return launch_status();
}

// expand, pre, norm: streams = mhc_post(...), then mhc_pre_impl(streams) with the norm.
int mhc_post_pre_norm(MemraCudaCtx* ctx, const float* y, const float* post_prev,
                      const float* comb_prev, const float* residual, int T, int hc, int D,
                      const void* fn, int fn_dtype, const float* base, const float* scale,
                      int sinkhorn_iters, float hc_eps, float norm_eps, const float* rms_w,
                      float rms_eps, float* streams, float* post, float* comb, float* out) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || D < 0 || hc < 1 || sinkhorn_iters < 1) return memra::kContractValue;
  if (!(rms_eps >= 0.0f && rms_eps <= FLT_MAX)) return memra::kContractValue;
  if (static_cast<int64_t>(hc) * D > INT_MAX) return memra::kContractValue;
  if (T == 0) return memra::kOk;
  if (!y || !post_prev || !comb_prev || !residual || !streams) return memra::kContractMissing;
  // The new streams are written while other blocks still read the old ones: no overlap.
  const size_t bytes = sizeof(float) * static_cast<size_t>(T) * hc * D;
  const uintptr_t o0 = reinterpret_cast<uintptr_t>(streams), r0 = reinterpret_cast<uintptr_t>(residual);
  if (bytes > 0 && o0 < r0 + bytes && r0 < o0 + bytes) return memra::kContractValue;
  if (site_fits(T, hc, D, fn_dtype, fn, streams) && memra::cuda::aligned16(y) &&
      memra::cuda::aligned16(residual) && fn && base && scale && post && comb && out) {
    SiteArgs a = site_args(D, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, rms_w, rms_eps,
                           post, comb, out);
    a.y = y;
    a.post_prev = post_prev;
    a.comb_prev = comb_prev;
    a.residual = residual;
    a.streams_out = streams;
    return launch_site<true>(ctx, a, fn_dtype);
  }
  MEMRA_CUDA_RETURN_IF(mhc_post(ctx, y, post_prev, comb_prev, residual, T, hc, D, streams));
  return mhc_pre_impl(ctx, streams, T, hc, D, fn, fn_dtype, base, scale, sinkhorn_iters, hc_eps,
                      norm_eps, true, rms_w, rms_eps, post, comb, out);
}

// expand, head, norm: out = rms_norm(hc_head_mean(mhc_post(y, post, comb, residual)), rms_w, eps).
int mhc_post_head_norm(MemraCudaCtx* ctx, const float* y, const float* post, const float* comb,
                       const float* residual, int T, int hc, int D, const float* rms_w, float eps,
                       float* out) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || hc < 1 || D < 0) return memra::kContractValue;
  if (!(eps >= 0.0f) || !std::isfinite(eps)) return memra::kContractValue;
  if (T == 0 || D == 0) return memra::kOk;
  if (!y || !post || !comb || !residual || !out) return memra::kContractMissing;
  const int g = group_for(D);
  if (hc > kHeadMaxHc || D > kGatedCols * g) {  // the three launches
    Scratch buf(ctx, sizeof(float) * (static_cast<size_t>(T) * hc * D + static_cast<size_t>(T) * D));
    MEMRA_CUDA_RETURN_IF(buf.status());
    float* streams = buf.as<float>();
    float* mean = streams + static_cast<size_t>(T) * hc * D;
    MEMRA_CUDA_RETURN_IF(mhc_post(ctx, y, post, comb, residual, T, hc, D, streams));
    MEMRA_CUDA_RETURN_IF(memra_cuda_hc_head_mean(ctx, streams, T, hc, D, mean));
    return memra_cuda_rms_norm(ctx, mean, T, D, rms_w, eps, out);
  }
  with_group(g, [&](auto gc) {
    constexpr int G = decltype(gc)::value;
    memra::cuda::launch(ctx, true, mhc_head_norm_kernel<G>, dim3(row_blocks<G>(T)),
                        dim3(Group<G>::kBlock), 0, y, post, comb, residual,
                        static_cast<int64_t>(T), hc, D, rms_w, eps, out);
  });
  return launch_status();
}

}  // namespace

extern "C" {

int memra_cuda_mhc(MemraCudaCtx* ctx, const MemraMhcParams* p) {
  if (!p) {
    MEMRA_CUDA_RETURN_IF(enter(ctx));
    return memra::kContractMissing;
  }
  const MemraMhcParams& a = *p;
  const bool expand = a.expand != 0, pre = a.pre != 0, norm = a.norm != 0, head = a.head != 0;
  if (!expand && pre && !head) {
    return mhc_pre_impl(ctx, a.streams, a.T, a.hc, a.D, a.fn, a.fn_dtype, a.base, a.scale,
                        a.sinkhorn_iters, a.hc_eps, a.norm_eps, norm, norm ? a.rms_w : nullptr,
                        norm ? a.rms_eps : 0.0f, a.post, a.comb, a.out);
  }
  if (expand && !pre && !norm && !head) {
    return mhc_post(ctx, a.y, a.post_prev, a.comb_prev, a.residual, a.T, a.hc, a.D, a.streams_out);
  }
  if (expand && pre && norm && !head) {
    return mhc_post_pre_norm(ctx, a.y, a.post_prev, a.comb_prev, a.residual, a.T, a.hc, a.D, a.fn,
                             a.fn_dtype, a.base, a.scale, a.sinkhorn_iters, a.hc_eps, a.norm_eps,
                             a.rms_w, a.rms_eps, a.streams_out, a.post, a.comb, a.out);
  }
  if (expand && head && norm && !pre) {
    return mhc_post_head_norm(ctx, a.y, a.post_prev, a.comb_prev, a.residual, a.T, a.hc, a.D,
                              a.rms_w, a.rms_eps, a.out);
  }
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  return memra::kContractValue;  // a combination of steps that is not a form
}

int memra_cuda_hc_head_mean(MemraCudaCtx* ctx, const float* streams, int T, int hc, int D,
                            float* out) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || hc < 1 || D < 0) return memra::kContractValue;
  if (T == 0 || D == 0) return memra::kOk;
  if (!streams || !out) return memra::kContractMissing;
  const int threads = threads_for(D);
  memra::cuda::launch(ctx, true, hc_head_mean_kernel, dim3(rows_grid(D, T, threads)), dim3(threads),
      0, streams, T, hc, D, out);
  return launch_status();
}

}  // extern "C"
