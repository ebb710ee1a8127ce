// mHC's device code shared by its kernels (cuda/mhc_pre.cu, mhc_site.cu, mhc_post.cu,
// mhc_head.cu): the mapping of one token's logits, the Sinkhorn, the split-K partial sums and
// their fixed-order reduction, the collapse of a row group's columns; and the host bodies that
// one file's form of the mhc entry (cuda_abi/mhc.h) runs from another's. Every helper is the one
// piece of code each kernel inlines, so the kernels that share it round alike.
#pragma once

#include <cstdint>

#include "common.cuh"

namespace memra::cuda::mhc {

constexpr int kMaxHc = 64;            // comb [hc, hc] lives in shared memory

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
  // subroutine, which the whole warp then waits for at every half-iteration. Their values are
  // never read or stored.
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

constexpr int kSplitMaxT = 64;
constexpr int kSplitK = 128;          // flat values per partial block: 32 lanes x 4
constexpr int kPartThreads = 1024;    // partial kernel: a warp per row (rows w, w + 32); the
                                      // site kernel: a warp per output (m < 32), two above
constexpr int kSplitMaxOut = 64;      // mix + 1 partial outputs (logits + the sum of squares)
constexpr int kPartOuts = kSplitMaxOut / (kPartThreads / 32);  // outputs per warp (2)
constexpr int kPartRows = kSplitMaxT / (kPartThreads / 32);  // rows per warp (2)
static_assert(kPartRows * (kPartThreads / 32) == kSplitMaxT, "mhc_partial_kernel: rows per warp");
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

// Four values of expanded stream j (mhc_post): post_j * y + sum_i comb[i, j] * r_i, the products
// and sums rounded in this order; c[i] = comb[i, j], r[i] stream i's residual values. Shared by
// mhc_post_quad_kernel and the split-K pass's fused expansion, so both give the same bytes.
template <int HC>
__device__ __forceinline__ float4 expand_quad(const float4 (&r)[HC], const float (&c)[HC],
                                              float post_j, float4 y) {
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < HC; ++i) {
    acc.x = __fadd_rn(acc.x, __fmul_rn(c[i], r[i].x));
    acc.y = __fadd_rn(acc.y, __fmul_rn(c[i], r[i].y));
    acc.z = __fadd_rn(acc.z, __fmul_rn(c[i], r[i].z));
    acc.w = __fadd_rn(acc.w, __fmul_rn(c[i], r[i].w));
  }
  return make_float4(__fadd_rn(__fmul_rn(post_j, y.x), acc.x),
                     __fadd_rn(__fmul_rn(post_j, y.y), acc.y),
                     __fadd_rn(__fmul_rn(post_j, y.z), acc.z),
                     __fadd_rn(__fmul_rn(post_j, y.w), acc.w));
}

// A lane's term of a partial output: v . x over its four values.
__device__ __forceinline__ float lane_dot(float4 v, float4 x) {
  return v.x * x.x + v.y * x.y + v.z * x.z + v.w * x.w;
}

// One partial output of a split: the warp's sum of v . x over its lanes' four values (a row of
// fn, or x itself for the sum of squares). Shared by both partial passes, so their bits agree.
__device__ __forceinline__ float partial_dot(float4 v, float4 x) { return warp_sum(lane_dot(v, x)); }

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

// ---- Host bodies of the mhc entry's forms (cuda/mhc_site.cu dispatches them).

// The previous site's expansion in front of a pre (the expand + pre + norm form): streams_out
// [T, hc, D] = mhc_post(y [T, D], post_prev [T, hc], comb_prev [T, hc, hc], residual [T, hc, D]),
// then the pre reads streams_out.
struct PostIn {
  const float* y;
  const float* post_prev;
  const float* comb_prev;
  const float* residual;
  float* streams_out;
};

// pre: post, comb and collapsed of streams (mhc_pre); with rms, collapsed replaced by
// rms_norm(collapsed, rms_w, rms_eps) (cuda/mhc_pre.cu). With expand (streams ==
// expand->streams_out), the expansion first: in the split-K pass when it takes the rows (each
// lane expands the four values it reads), else mhc_post's launch.
int pre_impl(MemraCudaCtx* ctx, const float* streams, int T, int hc, int D, const void* fn,
             int fn_dtype, const float* base, const float* scale, int sinkhorn_iters,
             float hc_eps, float norm_eps, bool rms, const float* rms_w, float rms_eps,
             float* post, float* comb, float* collapsed, const PostIn* expand = nullptr);

// expand: out [T, hc, D] = mhc_post(y, post, comb, residual) (cuda/mhc_post.cu).
int post_impl(MemraCudaCtx* ctx, const float* y, const float* post, const float* comb,
              const float* residual, int T, int hc, int D, float* out);

// expand, head, norm: out [T, D] = rms_norm(hc_head_mean(mhc_post(...)), rms_w, eps)
// (cuda/mhc_head.cu).
int post_head_norm_impl(MemraCudaCtx* ctx, const float* y, const float* post, const float* comb,
                        const float* residual, int T, int hc, int D, const float* rms_w, float eps,
                        float* out);

// Whether one decode row takes the single-launch site kernel (cuda/mhc_site.cu).
bool site_fits(int T, int hc, int D, int fn_dtype, const void* fn, const float* streams);

// pre with the norm at one decode row in the site kernel's single launch (site_fits).
int site_pre_norm(MemraCudaCtx* ctx, const float* streams, int D, const void* fn, int fn_dtype,
                  const float* base, const float* scale, int sinkhorn_iters, float hc_eps,
                  float norm_eps, const float* rms_w, float rms_eps, float* post, float* comb,
                  float* out);

}  // namespace memra::cuda::mhc
