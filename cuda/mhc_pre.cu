// mhc_pre on the GPU (the pre and pre + norm forms of the mhc entry, cuda_abi/mhc.h): the
// mapping of each token's streams to pre, post, the Sinkhorn comb and the collapsed input, the
// twin of cpu::mhc_pre. Oracle: transformers Glm5NextTextHyperConnection.
//
// At decode (T <= kSplitMaxT = 64 rows, f32 / bf16 fn, 16-byte aligned rows): two kernels, a
//   split-K pass computing every row's raw logits and sum of squares (f32 products: the streams
//   are not rounded to the fn dtype) and a finishing kernel that reduces them in a fixed order
//   and maps (details above mhc_partial_kernel); in the expand + pre + norm form the split-K pass
//   also computes the previous site's expansion (mhc_post) of the values it reads. One decode row of
//   GLM's geometry with the norm takes the single-launch site kernel instead (cuda/mhc_site.cu).
// Otherwise one GEMM (memra::cuda::linear) + one mapping kernel (a block per token):
//   f32 / bf16 fn: logits_raw = streams[T, hc*D] fn^T straight from the streams, and the
//     mapping kernel scales each token's logits by its unweighted-RMS factor
//     inv = 1 / sqrt(sum(x^2) / (hc*D) + norm_eps) (linearity: fn(x * inv) = inv * fn(x)), so the
//     normalised [T, hc*D] copy is never written. Against the CPU, which normalises first, this
//     differs by rounding only (~1e-7 relative per logit).
//   f16 fn: the rows are normalised first (memra_cuda_rms_norm, in chunks of <= 64 MiB of
//     scratch) so that the f16 rounding of the GEMM input cannot overflow on large residuals.
// The mapping mirrors the CPU element by element, in the CPU's order and without FMA
// contraction (__fmul_rn / __fadd_rn): given the same logits it gives the same pre, post, comb
// and collapsed up to expf's last-bit differences from the host's libm.
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "linear.cuh"
#include "mhc.cuh"
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
using memra::cuda::rowsum::store_rms_cols;
using memra::cuda::rowsum::with_group;
using memra::cuda::sinkhorn_warp_fixed;
using namespace memra::cuda::mhc;

namespace {

// 1024 threads: at decode (T = 1, one block) the sum of squares over hc * D values and the
// collapsed row are latency-bound loops; a wide block keeps most of them in flight at once.
constexpr int kMapThreads = 1024;
constexpr size_t kNormChunkBytes = size_t(64) << 20;

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
// Block s, warp w, lane l: the 4 flat values k = s * kSplitK + 4 l of rows t = w + 32 r < T
// (r < kPartRows). The block stages its split of fn (as f32) in shared memory while each warp
// loads its rows' values, so the block waits for one memory round trip, not one per row; then
// warp w forms, row after row, its lanes' terms of row t's partial outputs m <= mix (m < mix the
// dot with fn row m, m == mix the sum of squares; lane_dot) 32 at a time and sums them across the warp with warp_sum32_transposed, which
// gives lane l output l with partial_dot's bits (the site kernel's partials) in 31 shuffles.
// part [T, mix + 1, S] (S = gridDim.x; an output's partials contiguous for the reduction).
//
// POST (the expand + pre + norm form, D % 4 == 0): a lane first expands its four values of row t
// as mhc_post does (expand_quad, mhc_post_quad_kernel's arithmetic: the same bytes) and stores
// them to pin.streams_out, which the finishing kernel then reads: one launch fewer a site.
template <int HC>
__device__ __forceinline__ float4 expand4(const PostIn& pin, int64_t t, int j, int d, int D) {
  float4 r[HC];
  float c[HC];
#pragma unroll
  for (int i = 0; i < HC; ++i) {
    r[i] = load4(pin.residual + (t * HC + i) * D + d);
    c[i] = pin.comb_prev[t * HC * HC + i * HC + j];
  }
  const float4 yv = load4(pin.y + t * D + d);
  return expand_quad<HC>(r, c, pin.post_prev[t * HC + j], yv);
}

template <typename W, int POST_HC>  // POST_HC: 0 reads the streams, else expands at hc = POST_HC
__global__ void __launch_bounds__(kPartThreads)
    mhc_partial_kernel(const float* __restrict__ streams, int T, int flat,
                       const W* __restrict__ fn, int mix, float* __restrict__ part, PostIn pin,
                       int D) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  constexpr int kWarps = kPartThreads / 32;
  __shared__ float4 wf[kSplitMaxOut - 1][32];  // fn rows m < mix of this split, lane quads
  const int s = blockIdx.x, S = gridDim.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  const int k = s * kSplitK + 4 * lane;
  const bool in = k < flat;  // flat % 4 == 0: a lane's four values are all in or all out
  // Rows t = warp + kWarps * r. Every load (both rows', then the fn slice's) is issued before the
  // fused form stores a row's expansion: PostIn's pointers may alias as far as the compiler
  // knows, so a store in between would hold the loads after it behind its own wait.
  float4 x[kPartRows];
#pragma unroll
  for (int r = 0; r < kPartRows; ++r) {
    const int t = warp + kWarps * r;
    x[r] = zero;
    if (t < T && in) {
      if constexpr (POST_HC > 0) {
        const int j = k / D;
        x[r] = expand4<POST_HC>(pin, t, j, k - j * D, D);
      } else {
        x[r] = load4(streams + int64_t(t) * flat + k);
      }
    }
  }
#pragma unroll 2
  for (int i = threadIdx.x; i < mix * 32; i += kPartThreads) {
    const int m = i >> 5, kk = s * kSplitK + 4 * (i & 31);
    wf[m][i & 31] = kk < flat ? load4(fn + int64_t(m) * flat + kk) : zero;
  }
  if constexpr (POST_HC > 0) {
#pragma unroll
    for (int r = 0; r < kPartRows; ++r) {
      const int t = warp + kWarps * r;
      if (t < T && in) *reinterpret_cast<float4*>(pin.streams_out + int64_t(t) * flat + k) = x[r];
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kPartRows; ++r) {
    const int t = warp + kWarps * r;
    if (t >= T) return;
    float* const pt = part + int64_t(t) * (mix + 1) * S + s;
    for (int m0 = 0; m0 <= mix; m0 += 32) {
      float p[32];
#pragma unroll
      for (int u = 0; u < 32; ++u) {
        const int m = m0 + u;
        float4 v = m == mix ? x[r] : zero;  // past mix: a zero term, never stored
        if (m < mix) v = wf[m][lane];
        p[u] = lane_dot(v, x[r]);
      }
      const float d = memra::cuda::warp_sum32_transposed(p, lane);
      if (m0 + lane <= mix) pt[int64_t(m0 + lane) * S] = d;
    }
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

// mhc_pre at decode with the layer's input RMSNorm fused (the pre + norm form): grid (2, T),
// blocks of Group<G>::kBlock threads, G = group_for(D), D <= kNormCols * G.
// Block (0, t): token t's post and Sinkhorn comb, as mhc_finish_kernel's block 0.
// Block (1, t): token t's collapsed row, RMS-normalised in registers. Thread g < G owns columns
// g + G k (k < kNormCols): rms_norm_kernel<G>'s columns, sum of squares and group reduction over
// the collapsed values, so `out` equals rms_norm(collapsed) byte for byte. The two blocks run side
// by side: the Sinkhorn (2 iters - 1 dependent steps) no longer precedes the collapse, and the
// norm's launch and its round trip through memory are gone.
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

}  // namespace

namespace memra::cuda::mhc {

// The pre form, and with rms (pre + norm) `collapsed` replaced by rms_norm(collapsed, rms_w,
// rms_eps): at one decode row of the site's geometry the site kernel; else fused into the
// finishing kernel on the decode path when D <= kNormCols * 1024, otherwise memra_cuda_rms_norm
// in place after the mapping.
int pre_impl(MemraCudaCtx* ctx, const float* streams, int T, int hc, int D, const void* fn,
             int fn_dtype, const float* base, const float* scale, int sinkhorn_iters,
             float hc_eps, float norm_eps, bool rms, const float* rms_w, float rms_eps,
             float* post, float* comb, float* collapsed, const PostIn* expand) {
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
  const int mix = (2 + hc) * hc;
  const bool fold = fn_dtype != 2 || flat == 0;
  const uintptr_t fn_align = fn_dtype == 0 ? 15u : 7u;  // four weights per load
  const bool split = fold && flat > 0 && T <= kSplitMaxT && mix + 1 <= kSplitMaxOut &&
                     flat % 4 == 0 && memra::cuda::aligned16(streams) &&
                     (reinterpret_cast<uintptr_t>(fn) & fn_align) == 0;
  // The expansion inside the split pass: a lane's four values in one stream, 16-byte rows.
  const bool fused_post = expand && split && D % 4 == 0 && (hc == 1 || hc == 2 || hc == 4) &&
                          memra::cuda::aligned16(expand->y) &&
                          memra::cuda::aligned16(expand->residual);
  if (expand && !fused_post) {
    MEMRA_CUDA_RETURN_IF(post_impl(ctx, expand->y, expand->post_prev, expand->comb_prev,
                                   expand->residual, T, hc, D, expand->streams_out));
  }
  if (rms && !fused_post && site_fits(T, hc, D, fn_dtype, fn, streams)) {
    return site_pre_norm(ctx, streams, D, fn, fn_dtype, base, scale, sinkhorn_iters, hc_eps,
                         norm_eps, rms_w, rms_eps, post, comb, collapsed);
  }
  if (split) {
    const int S = static_cast<int>(ceil_div(flat, kSplitK));
    Scratch part(ctx, static_cast<size_t>(T) * S * (mix + 1) * sizeof(float));
    MEMRA_CUDA_RETURN_IF(part.status());
    const PostIn pin = fused_post ? *expand : PostIn{};
    auto launch_partial = [&](auto wtag, auto hct) {
      using W = decltype(wtag);
      memra::cuda::launch(ctx, true, mhc_partial_kernel<W, decltype(hct)::value>, dim3(S),
                          dim3(kPartThreads), 0, streams, T, static_cast<int>(flat),
                          static_cast<const W*>(fn), mix, part.as<float>(), pin, D);
    };
    auto with_w = [&](auto hct) {
      if (fn_dtype == 0) {
        launch_partial(float{}, hct);
      } else {
        launch_partial(__nv_bfloat16{}, hct);
      }
    };
    if (!fused_post) {
      with_w(std::integral_constant<int, 0>());
    } else if (hc == 4) {
      with_w(std::integral_constant<int, 4>());
    } else if (hc == 2) {
      with_w(std::integral_constant<int, 2>());
    } else {
      with_w(std::integral_constant<int, 1>());
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

}  // namespace memra::cuda::mhc
