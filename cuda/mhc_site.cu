// One mHC site at a single decode row in one launch, and the mhc entry (cuda_abi/mhc.h) that
// dispatches its forms: mhc_site_kernel (the pre + norm form, and the expand + pre + norm form
// that first expands the previous site's streams), the deferred Sinkhorn it may leave pending
// (KernelOptions::mhc_defer) and the launch that runs it when no GEMV takes it.
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "mhc.cuh"
#include "row_group.cuh"
#include "sinkhorn.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::warp_sum;
using memra::cuda::rowsum::group_for;
using memra::cuda::rowsum::with_group;
using memra::cuda::sinkhorn_warp_fixed;
using namespace memra::cuda::mhc;

namespace {

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

namespace memra::cuda::mhc {

// The single-launch site (mhc_site_kernel) takes one decode row of GLM's geometry: f32 / bf16 fn
// (fold), hc == kSiteHc, D % 4 == 0 (a lane's four values in one stream), the norm's row group
// in one block (D <= kNormCols * 1024), 16-byte aligned rows.
bool site_fits(int T, int hc, int D, int fn_dtype, const void* fn, const float* streams) {
  const uintptr_t fn_align = fn_dtype == 0 ? 15u : 7u;
  return T == 1 && hc == kSiteHc && fn_dtype != 2 && D > 0 && D % 4 == 0 &&
         D <= kNormCols * 1024 && (reinterpret_cast<uintptr_t>(fn) & fn_align) == 0 &&
         memra::cuda::aligned16(streams);
}

int site_pre_norm(MemraCudaCtx* ctx, const float* streams, int D, const void* fn, int fn_dtype,
                  const float* base, const float* scale, int sinkhorn_iters, float hc_eps,
                  float norm_eps, const float* rms_w, float rms_eps, float* post, float* comb,
                  float* out) {
  SiteArgs a = site_args(D, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, rms_w, rms_eps,
                         post, comb, out);
  a.streams = streams;
  return launch_site<false>(ctx, a, fn_dtype);
}

}  // namespace memra::cuda::mhc

namespace {

// The expand + pre + norm form: streams = mhc_post(...), then pre_impl(streams) with the norm;
// at one decode row of the site's geometry the site kernel's single launch, at other decode rows
// the expansion inside pre_impl's split-K pass (or mhc_post's launch in front of it).
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
  const PostIn expand{y, post_prev, comb_prev, residual, streams};
  return pre_impl(ctx, streams, T, hc, D, fn, fn_dtype, base, scale, sinkhorn_iters, hc_eps,
                  norm_eps, true, rms_w, rms_eps, post, comb, out, &expand);
}

}  // namespace

extern "C" {

// The forms of MemraMhcParams, each the body of the entry point it was before the forms became
// one entry (their checks, error codes and launches).
int memra_cuda_mhc(MemraCudaCtx* ctx, const MemraMhcParams* p) {
  if (!p) {
    MEMRA_CUDA_RETURN_IF(enter(ctx));
    return memra::kContractMissing;
  }
  const MemraMhcParams& a = *p;
  const bool expand = a.expand != 0, pre = a.pre != 0, norm = a.norm != 0, head = a.head != 0;
  if (!expand && pre && !head) {
    return pre_impl(ctx, a.streams, a.T, a.hc, a.D, a.fn, a.fn_dtype, a.base, a.scale,
                    a.sinkhorn_iters, a.hc_eps, a.norm_eps, norm, norm ? a.rms_w : nullptr,
                    norm ? a.rms_eps : 0.0f, a.post, a.comb, a.out);
  }
  if (expand && !pre && !norm && !head) {
    return post_impl(ctx, a.y, a.post_prev, a.comb_prev, a.residual, a.T, a.hc, a.D, a.streams_out);
  }
  if (expand && pre && norm && !head) {
    return mhc_post_pre_norm(ctx, a.y, a.post_prev, a.comb_prev, a.residual, a.T, a.hc, a.D, a.fn,
                             a.fn_dtype, a.base, a.scale, a.sinkhorn_iters, a.hc_eps, a.norm_eps,
                             a.rms_w, a.rms_eps, a.streams_out, a.post, a.comb, a.out);
  }
  if (expand && head && norm && !pre) {
    return post_head_norm_impl(ctx, a.y, a.post_prev, a.comb_prev, a.residual, a.T, a.hc, a.D,
                               a.rms_w, a.rms_eps, a.out);
  }
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  return memra::kContractValue;  // a combination of steps that is not a form
}

}  // extern "C"
