// FFN ops of the CUDA backend (cpp/include/memra/cuda_abi/ffn.h): the clamped SwiGLU MLP, the
// grouped sigmoid router and the routed experts; the GPU twins of cpu/ffn.cpp.
//   swiglu_mlp:  three cuBLAS GEMMs (memra_cuda_linear: f32 SGEMM with TF32 off, or x rounded to
//                bf16 for bf16 weights) around an elementwise clamped-SwiGLU kernel that writes
//                the CPU's formula element by element. When up_w directly follows gate_w in
//                memory (one [2I, D] matrix, as MlpLayer uploads them) gate and up are one GEMM
//                with N = 2I and the activation reads its [T, 2I] output.
//   moe_route:   router logits in f32 (SGEMM), then one warp per token: sigmoid scores, choice =
//                s + bias, group scores (the CPU's best/second loop), top groups and top_k experts
//                by repeated warp argmax over (value desc, id asc), weights from s, the CPU's
//                sequential renormalisation, times scaling. Same indices and order as the CPU.
//   moe_forward: the decode-shaped path over stacked weights [E, I, D] / [E, D, I]: kernel A puts
//                one warp on each (token slot, row of I) for gate and up at once and writes h;
//                kernel B puts one warp on each (token, output row d) and adds the token's terms
//                (down row . h) * w in ascending expert id, as the CPU does. Activations stay f32
//                (bf16 weights are widened, x is not rounded), so against cpu::moe_forward on the
//                same weights only the dot products' summation order differs. From T = 2 on, the
//                same dot products grouped by expert (each expert's weights streamed once per
//                pass of up to 16 of its pairs; see "moe_forward, grouped by expert" below), with
//                bit-identical results.
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemv.cuh"
#include "gemv_rows.cuh"
#include "linear.cuh"

using memra::cuda::aligned16;
using memra::cuda::ceil_div;
using memra::cuda::cp_async_16;
using memra::cuda::cp_async_4;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait_all;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;
namespace grow = memra::cuda::gemv_rows_detail;  // the decode GEMV's row body
using memra::cuda::to_f32;
using memra::cuda::warp_sum;

namespace {

constexpr int kWarps = 8;  // warps per block of the expert kernels (one row each)

// cpu clamped_swiglu for one element, with std::min / std::max spelled out (NaN handling as the
// CPU's: std::min(a, b) is (b < a) ? b : a).
__device__ __forceinline__ float clamped_swiglu(float g, float u, float limit) {
  const float gate = (limit < g) ? limit : g;
  const float up0 = (u < -limit) ? -limit : u;
  const float up = (limit < up0) ? limit : up0;
  return __fmul_rn(__fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate))), up);
}

// ------------------------------------------------------------------------------ swiglu_mlp

// g[i] = clamped_swiglu(g[i], u[i]) over n elements (in place over g).
__global__ void swiglu_act_kernel(float* __restrict__ g, const float* __restrict__ u, int64_t n,
                                  float limit) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    g[i] = clamped_swiglu(g[i], u[i], limit);
  }
}

// h[t, i] = clamped_swiglu(gu[t, i], gu[t, I + i]) over T * I elements: the activation of the
// fused gate|up GEMM's output [T, 2I], written as [T, I] for the down GEMM.
// H = float, or the down weight's 16-bit dtype: h is then written already rounded (RNE, the
// rounding memra_cuda_linear would apply to an f32 h), so the down GEMM reads it as it is.
__device__ __forceinline__ void store_h(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_h(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_h(__half* p, float v) { *p = __float2half_rn(v); }

template <typename H>
__global__ void swiglu_pair_kernel(const float* __restrict__ gu, int64_t T, int I, float limit,
                                   H* __restrict__ h) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t n = T * I;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += stride) {
    const int64_t t = k / I, i = k - t * I;
    const float* row = gu + t * 2 * I;
    store_h(h + k, clamped_swiglu(row[i], row[I + i], limit));
  }
}

// The gate|up GEMV with the SwiGLU in its epilogue (one row, T == 1): grow::SwigluRows makes
// block b sum gate rows b * R/2 .. and their up rows, each as
// the decode GEMV sums a row, and store h = swiglu_pair_kernel's value of that pair, so h (and
// the down GEMV after it) has the bytes of the GEMV, then swiglu_pair_kernel: one launch (and
// one memory round trip) fewer per dense MLP at batch 1. A deferred Sinkhorn rides in block 0,
// as on the GEMV.
template <typename H>
struct SwigluStore {
  float limit;
  __device__ __forceinline__ void operator()(H* p, float g, float u) const {
    store_h(p, clamped_swiglu(g, u, limit));
  }
};

template <typename W, typename X, typename H, int R, int P>
__global__ void __launch_bounds__(grow::kGemvThreads, P == 1 ? 4 : 0)
    gemv_swiglu_kernel(const X* __restrict__ x, const W* __restrict__ w, int K, int I,
                       float limit, H* __restrict__ h, int prefetch, memra::cuda::SinkTask task) {
  if (task.comb && blockIdx.x == 0) return memra::cuda::run_sink_task(task);
  const grow::SwigluRows<H, SwigluStore<H>> out{h, I, SwigluStore<H>{limit}};
  grow::gemv_rows<W, X, R, P>(x, w, K, 2 * I, nullptr, nullptr, prefetch,
                              blockIdx.x - (task.comb ? 1 : 0), out);
}

// h [I] (H: f32, or bf16 for bf16 weights) = swiglu over the fused gate|up GEMV of one row x [K]
// f32 against w [2I, K] (f32 or bf16): *handled = false (nothing enqueued) when the decode GEMV
// would not take the GEMV (gemv_takes, rows past the short-row form).
template <typename H>
int gemv_swiglu(MemraCudaCtx* ctx, const float* x, int K, const void* w, int w_dtype, int I,
                float limit, H* h, bool* handled) {
  *handled = false;
  const int E = w_dtype == 0 ? 4 : 8;
  if (I < 1 || !memra::cuda::gemv_takes(ctx, x, 0, K, w, w_dtype) ||
      K / E <= grow::kShortMaxV || (w_dtype == 0) != std::is_same_v<H, float>) {
    return memra::kOk;
  }
  // The GEMV's own check (memra_cuda_linear): a weight that overlaps a pending comb.
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, w, 16 * size_t(K / E) * 2 * size_t(I)));
  *handled = true;
  const int prefetch = ctx->resident_weights > 0 ? 1 : 0;
  const int N = 2 * I;  // the decode GEMV's rows a block for N (gemv.cu rows_for), even
  const int R = N >= 16384 ? 8 : N >= 2048 ? 4 : 2;
  // One 16-byte vector a thread per row and chunk (P = 1), as the decode GEMV.
  auto go = [&](auto wt, auto r) {
    using W = decltype(wt);
    constexpr int RR = decltype(r)::value;
    return grow::launch_gemv(ctx, gemv_swiglu_kernel<W, float, H, RR, 1>,
                             (I + RR / 2 - 1) / (RR / 2), x, static_cast<const W*>(w), K, I,
                             limit, h, prefetch);
  };
  auto with_r = [&](auto wt) {
    if (R == 8) return go(wt, std::integral_constant<int, 8>());
    if (R == 4) return go(wt, std::integral_constant<int, 4>());
    return go(wt, std::integral_constant<int, 2>());
  };
  if constexpr (std::is_same_v<H, float>) {
    return with_r(float{});
  } else {
    return with_r(__nv_bfloat16{});
  }
}

unsigned act_blocks(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 65535 * 16 ? b : 65535 * 16);
}

// ------------------------------------------------------------------------------- moe_route

// Index of the best unflagged entry of v[0, n) by (value desc, index asc); NaN counts as -inf.
// Every lane of the warp returns the same index (xor butterfly over a total order).
__device__ __forceinline__ int warp_argmax_unflagged(const float* v, const unsigned char* flag,
                                                     int n, int lane) {
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int i = lane; i < n; i += 32) {
    if (flag[i]) continue;
    float x = v[i];
    if (isnan(x)) x = -INFINITY;
    if (x > bv || (x == bv && i < bi)) {
      bv = x;
      bi = i;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
  return bi;
}

struct RouteLayout {
  int floats_bytes;  // scores[E], choice[E], group_score[G] (f32), rounded up to 16
  int warp_bytes;    // + taken[E], kept[G] (bytes), rounded up to 16
};

RouteLayout route_layout(int E, int G) {
  RouteLayout l;
  l.floats_bytes = ((4 * (2 * E + G)) + 15) / 16 * 16;
  l.warp_bytes = l.floats_bytes + ((E + G) + 15) / 16 * 16;
  return l;
}

// One token's routing by one whole warp (lane `lane`): lt [E] its logits, base its warp_bytes of
// shared memory; idx, w [top_k] its choices. Load: LOAD_CG reads lt through L2 (other blocks'
// stores of the same launch).
template <bool LOAD_CG>
__device__ __forceinline__ void route_token(const float* lt, const float* __restrict__ bias, int E,
                                            int top_k, int G, int topk_group, int norm,
                                            float scaling, const RouteLayout& layout,
                                            unsigned char* base, int32_t* __restrict__ idx,
                                            float* __restrict__ w, int lane) {
  float* scores = reinterpret_cast<float*>(base);
  float* choice = scores + E;
  float* group_score = choice + E;
  unsigned char* taken = base + layout.floats_bytes;
  unsigned char* kept = taken + E;
  const int per_group = E / G;
  const float neg_inf = -INFINITY;

  for (int e = lane; e < E; e += 32) {
    const float l = LOAD_CG ? __ldcg(lt + e) : lt[e];
    const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-l)));
    scores[e] = s;
    choice[e] = bias ? __fadd_rn(s, bias[e]) : s;
    taken[e] = 0;
  }
  for (int g = lane; g < G; g += 32) kept[g] = 0;
  __syncwarp();
  // Group-limited routing only when it can drop a group: with topk_group == G every group is
  // kept and the group scores choose nothing (GLM-5.3: G = 1), so their serial loop is skipped.
  if (topk_group < G) {
    // Group score: the sum of the two largest choice scores (the CPU's loop, verbatim).
    for (int g = lane; g < G; g += 32) {
      const float* c = choice + static_cast<int64_t>(g) * per_group;
      float best = neg_inf, second = neg_inf;
      for (int i = 0; i < per_group; ++i) {
        if (c[i] > best) {
          second = best;
          best = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group_score[g] = per_group >= 2 ? __fadd_rn(best, second) : best;
    }
    __syncwarp();
    for (int r = 0; r < topk_group; ++r) {
      const int g = warp_argmax_unflagged(group_score, kept, G, lane);
      if (lane == 0) kept[g] = 1;
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32) {
      if (!kept[e / per_group]) choice[e] = neg_inf;
    }
    __syncwarp();
  }
  // Lane j % 32 keeps the j-th choice for j < 32 (mine), so the weights are finished in
  // parallel from registers; lane 0 adds the chosen scores in order j ascending, as the CPU.
  float sum = 0.0f;
  int mine = 0;
  for (int j = 0; j < top_k; ++j) {
    const int e = warp_argmax_unflagged(choice, taken, E, lane);
    if (lane == j) mine = e;
    if (lane == 0) {
      taken[e] = 1;
      idx[j] = e;
      sum = __fadd_rn(sum, scores[e]);
    }
    __syncwarp();
  }
  const float denom = __shfl_sync(0xffffffffu, __fadd_rn(sum, 1e-20f), 0);
  for (int j = lane; j < top_k; j += 32) {
    // j >= 32 (top_k > 32): the choice read back from idx, which lane 0 wrote above.
    float v = scores[j < 32 ? mine : idx[j]];  // the unbiased score: the bias only chooses
    if (norm) v = __fdiv_rn(v, denom);
    w[j] = __fmul_rn(v, scaling);
  }
}

// One warp per token; each warp owns warp_bytes of dynamic shared memory. No __syncthreads, so a
// warp past the last token may return at once.
__global__ void moe_route_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                                 int T, int E, int top_k, int G, int topk_group, int norm,
                                 float scaling, RouteLayout layout, int32_t* __restrict__ topk_idx,
                                 float* __restrict__ topk_w) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (t >= T) return;
  route_token<false>(logits + t * E, bias, E, top_k, G, topk_group, norm, scaling, layout,
                     smem + static_cast<size_t>(warp) * layout.warp_bytes, topk_idx + t * top_k,
                     topk_w + t * top_k, lane);
}

// The router and the routing of one token in one launch (memra_cuda_moe_route at T == 1 where the
// decode GEMV takes the router: f32 gate_w [E, D] and x, 16-byte aligned, D % 4 == 0): block e
// computes logit e as the router's GEMV launch does
// (gemv_rows, one row a block: the same bits) into logits [E]; the block that finishes last runs
// moe_route_kernel's warp on them. A deferred Sinkhorn rides in block 0, as on the GEMV.
template <int P>
__global__ void __launch_bounds__(grow::kGemvThreads)
    route_decode_kernel(const float* __restrict__ x, const float* __restrict__ gate_w, int D,
                        const float* __restrict__ bias, int E, int top_k, int G, int topk_group,
                        int norm, float scaling, RouteLayout layout, float* __restrict__ logits,
                        unsigned* __restrict__ ticket, int32_t* __restrict__ topk_idx,
                        float* __restrict__ topk_w, int prefetch, memra::cuda::SinkTask task) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (task.comb && blockIdx.x == 0) return memra::cuda::run_sink_task(task);
  const int e = blockIdx.x - (task.comb ? 1 : 0);
  grow::gemv_rows<float, float, 1, P>(x, gate_w, D, E, nullptr, logits, prefetch, e);
  if (!memra::cuda::last_block(ticket, static_cast<unsigned>(E))) return;
  if (threadIdx.x < 32) {
    route_token<true>(logits, bias, E, top_k, G, topk_group, norm, scaling, layout, smem, topk_idx,
                      topk_w, threadIdx.x);
  }
}

// ----------------------------------------------------------------------------- moe_forward

// Eight consecutive weights as f32 (16-byte aligned for bf16/f16, 32 bytes of f32).
template <typename W>
__device__ __forceinline__ void load8(const W* p, float (&o)[8]);
template <>
__device__ __forceinline__ void load8<float>(const float* p, float (&o)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
  o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
}
template <>
__device__ __forceinline__ void load8<__nv_bfloat16>(const __nv_bfloat16* p, float (&o)[8]) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    o[2 * k] = f.x;
    o[2 * k + 1] = f.y;
  }
}
template <>
__device__ __forceinline__ void load8<__half>(const __half* p, float (&o)[8]) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __half22float2(h[k]);
    o[2 * k] = f.x;
    o[2 * k + 1] = f.y;
  }
}
// Eight consecutive activations (f32, 16-byte aligned).
__device__ __forceinline__ void load8x(const float* p, float (&o)[8]) { load8<float>(p, o); }

// The shared expert riding in the per-pair kernels as one more slot per token
// (memra_cuda_moe_forward_shared): gate, up [I, D]; down [D, I]; its own limit. down == null: none.
// Its inputs are rounded to W as swiglu_mlp's GEMMs round them (x, and h before the down GEMM).
template <typename W>
struct SharedExpert {
  const W* gate = nullptr;
  const W* up = nullptr;
  const W* down = nullptr;
  float limit = 0.0f;
};

// Kernel A. grid (P = T * top_k, ceil(I / kWarps)); warp w of block (p, by) computes row
// i = by * kWarps + w of slot p: h[p, i] = clamped_swiglu(gate_w[e, i] . x_t, up_w[e, i] . x_t)
// with e = topk_idx[p], t = p / top_k. Slots with an id outside [0, E) are skipped (h unused).
// VEC: D % 8 == 0 and 16-byte aligned bases: each lane reads 8 weights per row per step.
// Slots p >= P (= T * top_k) are the shared expert of token p - P (sh.down set; x and h rounded
// to W).
template <typename W, bool VEC>
__global__ void __launch_bounds__(kWarps * 32)
    moe_gate_up_kernel(const float* __restrict__ x, int D, const int32_t* __restrict__ topk_idx,
                       int top_k, const W* __restrict__ gate_w, const W* __restrict__ up_w,
                       int E, int I, float limit, float* __restrict__ h, int64_t P,
                       SharedExpert<W> sh) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t p = blockIdx.x;
  const bool shared = p >= P;
  const int e = shared ? 0 : topk_idx[p];
  if (e < 0 || e >= E) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.y * kWarps + warp;
  if (i >= I) return;
  const float* xt = x + (shared ? p - P : p / top_k) * D;
  const int64_t row = (static_cast<int64_t>(e) * I + i) * D;
  const W* g = shared ? sh.gate + static_cast<int64_t>(i) * D : gate_w + row;
  const W* u = shared ? sh.up + static_cast<int64_t>(i) * D : up_w + row;
  float ag = 0.0f, au = 0.0f;
  if constexpr (VEC) {
    for (int c = lane * 8; c < D; c += 32 * 8) {
      float xv[8], gv[8], uv[8];
      load8x(xt + c, xv);
      load8<W>(g + c, gv);
      load8<W>(u + c, uv);
      if (shared) {
#pragma unroll
        for (int k = 0; k < 8; ++k) xv[k] = memra::cuda::rounded<W>(xv[k]);
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        ag = fmaf(gv[k], xv[k], ag);
        au = fmaf(uv[k], xv[k], au);
      }
    }
  } else {
    for (int c = lane; c < D; c += 32) {
      const float xv = shared ? memra::cuda::rounded<W>(xt[c]) : xt[c];
      ag = fmaf(to_f32(g[c]), xv, ag);
      au = fmaf(to_f32(u[c]), xv, au);
    }
  }
  ag = warp_sum(ag);
  au = warp_sum(au);
  if (lane == 0) {
    h[p * I + i] = shared ? memra::cuda::rounded<W>(clamped_swiglu(ag, au, sh.limit))
                          : clamped_swiglu(ag, au, limit);
  }
}

// One token's valid slots (ids in [0, E)) ordered by (expert id, slot), as the CPU visits
// them (experts ascending; a repeated id's slots ascending): order [top_k] gets the slots and
// order[top_k] their count. Insertion sort by one thread (slots arrive ascending, top_k small).
__device__ __forceinline__ void order_slots(const int32_t* it, int top_k, int E, int* order) {
  int n = 0;
  for (int j = 0; j < top_k; ++j) {
    const int e = it[j];
    if (e < 0 || e >= E) continue;
    int pos = n++;
    while (pos > 0 && it[order[pos - 1]] > e) {
      order[pos] = order[pos - 1];
      --pos;
    }
    order[pos] = j;
  }
  order[top_k] = n;
}

// One slot's down products for a warp's RPW rows: a[r] = lane's partial of wr[r] . hp (h [I] f32,
// wr[r] a row of I weights), lane l taking columns l * 8 + 256 s (VEC) or l + 32 s, in ascending
// order with fmaf; the caller's warp_sum finishes each.
template <typename W, bool VEC, int RPW>
__device__ __forceinline__ void down_dots(const float* __restrict__ hp, const W* const (&wr)[RPW],
                                          int I, int lane, float (&a)[RPW]) {
#pragma unroll
  for (int r = 0; r < RPW; ++r) a[r] = 0.0f;
  if constexpr (VEC) {
    for (int c = lane * 8; c < I; c += 32 * 8) {
      float hv[8], wv[RPW][8];
      load8x(hp + c, hv);
#pragma unroll
      for (int r = 0; r < RPW; ++r) load8<W>(wr[r] + c, wv[r]);
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
#pragma unroll
        for (int k = 0; k < 8; ++k) a[r] = fmaf(wv[r][k], hv[k], a[r]);
      }
    }
  } else {
    for (int c = lane; c < I; c += 32) {
      const float hc = hp[c];
#pragma unroll
      for (int r = 0; r < RPW; ++r) a[r] = fmaf(to_f32(wr[r][c]), hc, a[r]);
    }
  }
}

// Kernel B. grid (T, ceil(D / (kWarps * RPW))); dynamic shared memory: top_k + 1 ints. Thread 0
// orders the token's valid slots by (expert id, slot) (the CPU visits experts in ascending id
// and, for a repeated id, the slots in ascending order); warp w then computes the RPW output rows
// d = (by * kWarps + w) * RPW + r: y[t, d] = 0 + sum over the ordered slots of
// (down_w[e, d] . h[p]) * w[p], each product and sum rounded separately as on the CPU. A warp's
// rows share each load of h[p] (h is f32 and re-read by every warp: with one row a warp, its
// reads doubled the weight's bytes through L1); every row's chain is the same at any RPW.
// With a shared expert (sh.down), y[t, d] = (sh.down[d] . h[P + t]) + that routed sum, the
// shared expert's output plus the routed one (swiglu_mlp_add's s + bias).
template <typename W, bool VEC, int RPW>
__global__ void __launch_bounds__(kWarps * 32)
    moe_down_kernel(const float* __restrict__ h, const int32_t* __restrict__ topk_idx,
                    const float* __restrict__ topk_w, int top_k, const W* __restrict__ down_w,
                    int E, int I, int D, float* __restrict__ y, int64_t P, SharedExpert<W> sh) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ int order[];  // [top_k] ordered slots, then the count
  const int64_t t = blockIdx.x;
  const int32_t* it = topk_idx + t * top_k;
  if (threadIdx.x == 0) order_slots(it, top_k, E, order);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int d0 = (blockIdx.y * kWarps + warp) * RPW;
  if (d0 >= D) return;
  const int n = order[top_k];
  float acc[RPW];
#pragma unroll
  for (int r = 0; r < RPW; ++r) acc[r] = 0.0f;
  // Slot s < n: routed slot order[s] (weight topk_w); s == n: the shared expert (weight-free).
  const int slots = n + (sh.down ? 1 : 0);
  for (int s = 0; s < slots; ++s) {
    const bool shared = s == n;
    const int j = shared ? 0 : order[s];
    const int64_t p = shared ? P + t : t * top_k + j;
    const float* hp = h + p * I;
    const W* wr[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      // Rows past D (a ragged last warp) re-read row d0 and are never stored.
      const int64_t d = d0 + r < D ? d0 + r : d0;
      wr[r] = shared ? sh.down + d * I : down_w + (static_cast<int64_t>(it[j]) * D + d) * I;
    }
    float a[RPW];
    down_dots<W, VEC, RPW>(hp, wr, I, lane, a);
    if (shared) {
#pragma unroll
      for (int r = 0; r < RPW; ++r) acc[r] = __fadd_rn(warp_sum(a[r]), acc[r]);
    } else {
      const float wp = topk_w[p];
#pragma unroll
      for (int r = 0; r < RPW; ++r) acc[r] = __fadd_rn(acc[r], __fmul_rn(warp_sum(a[r]), wp));
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      if (d0 + r < D) y[t * D + d0 + r] = acc[r];
    }
  }
}

// Kernel B at kDownRowsPerWarp rows a warp: each load of the token's h serves both rows (at one
// row a warp every warp re-read h, twice the weight's bytes through L1; docs/options.md has the
// A/B of 1, 2 and 4 rows).
constexpr int kDownRowsPerWarp = 2;

template <typename W, bool VEC>
int launch_moe_down(MemraCudaCtx* ctx, int T, int top_k, const float* h, const int32_t* topk_idx,
                    const float* topk_w, const W* dw, int E, int I, int D, float* y,
                    const SharedExpert<W>& sh) {
  const size_t smem = sizeof(int) * (static_cast<size_t>(top_k) + 1);
  constexpr int RPW = kDownRowsPerWarp;
  const dim3 grid(static_cast<unsigned>(T), ceil_div(D, kWarps * RPW));
  return memra::cuda::launch(ctx, true, moe_down_kernel<W, VEC, RPW>, grid, dim3(kWarps * 32),
                             smem, h, topk_idx, topk_w, top_k, dw, E, I, D, y,
                             static_cast<int64_t>(T) * top_k, sh);
}

// h [T * top_k (+ T with a shared expert), I] f32 scratch.
template <typename W>
int launch_moe(MemraCudaCtx* ctx, const float* x, int T, int D, const int32_t* topk_idx,
               const float* topk_w, int top_k, const void* gate_w, const void* up_w,
               const void* down_w, int E, int I, float limit, float* h, float* y,
               const SharedExpert<W>& sh = {}) {
  const W* g = static_cast<const W*>(gate_w);
  const W* u = static_cast<const W*>(up_w);
  const W* dw = static_cast<const W*>(down_w);
  const int64_t P = static_cast<int64_t>(T) * top_k;
  const dim3 block(kWarps * 32);
  const dim3 grid_a(static_cast<unsigned>(P + (sh.down ? T : 0)), ceil_div(I, kWarps));
  const bool vec_a = D % 8 == 0 && aligned16(x) && aligned16(g) && aligned16(u) &&
                     (!sh.down || (aligned16(sh.gate) && aligned16(sh.up)));
  if (vec_a) {
    memra::cuda::launch(ctx, true, moe_gate_up_kernel<W, true>, dim3(grid_a), dim3(block), 0, x, D,
        topk_idx, top_k, g, u, E, I, limit, h, P, sh);
  } else {
    memra::cuda::launch(ctx, true, moe_gate_up_kernel<W, false>, dim3(grid_a), dim3(block), 0, x, D,
        topk_idx, top_k, g, u, E, I, limit, h, P, sh);
  }
  MEMRA_CUDA_RETURN_IF(launch_status());
  const bool vec_b = I % 8 == 0 && aligned16(h) && aligned16(dw) && (!sh.down || aligned16(sh.down));
  const int rc = vec_b ? launch_moe_down<W, true>(ctx, T, top_k, h, topk_idx, topk_w, dw, E, I, D, y, sh)
                      : launch_moe_down<W, false>(ctx, T, top_k, h, topk_idx, topk_w, dw, E, I, D, y, sh);
  MEMRA_CUDA_RETURN_IF(rc);
  return launch_status();
}

// --------------------------------------------------------------- moe_forward, grouped by expert
//
// For T >= 2 (KernelOptions::moe_grouped_min_t) the routed experts run grouped by expert, so
// each expert's weights are streamed once per pass of up to 16 (bf16 / f16; f32: 8) of its
// (token, slot) pairs instead of once per pair, in chunks of up to kGChunkT tokens:
//   1. moe_group_kernel (one block): the pairs p = t * top_k + j with a valid id, listed per
//      expert in ascending p (token, then slot), and the experts that have any ("active",
//      ascending id) with their ranges in that list. Device-side only (no host reads).
//   2. moe_grouped_kernel<GU = true>: grid (row blocks of I, active-expert slots); each block
//      stages its expert's x rows (f32, as the per-pair kernel multiplies them) in shared memory
//      256 columns at a time (cp.async, double-buffered) and each warp streams kGRows weight rows
//      (gate and up rows of two intermediate rows), 16-byte loads one 256-column step ahead, and
//      dots them with every staged row; the epilogue writes h[p, i] = clamped_swiglu(g, u).
//   3. moe_grouped_kernel<GU = false>: the same over (row blocks of D, slots) with the pairs' h
//      rows staged, writing the dot products o[p, d] (the per-pair kernel's `a`).
//   4. moe_combine_kernel: y[t, d] = the per-pair kernel B's sum over the token's slots ordered by
//      (expert id, slot) of o[p, d] * w[p], each product and sum rounded separately.
// Every dot product is the per-pair kernels' own: lane l accumulates (fmaf, f32) the columns
// 256 s + l * 8 + k (VEC) or 256 s + l + 32 q (scalar) in ascending order, then warp_sum; so the
// grouped results equal the per-pair kernels' bit for bit (and those do not depend on T).

constexpr int kGWarps = 16;      // warps per block of the grouped kernels
constexpr int kGThreads = kGWarps * 32;
constexpr int kGRows = 4;     // weight rows per warp (gate_up: gate + up of 2 rows of I; down: 4)
constexpr int kGSub = 256;    // columns per step (32 lanes x 8), staged per step
constexpr int kGGroup = 4;    // staged rows taken together in the inner loop
// Pairs per pass (an expert with more pairs takes several passes): 16 for bf16 / f16 weights
// (4 x 16 f32 accumulators per lane), 8 for f32 weights and the scalar path, whose fragments take
// twice the registers.
template <typename W, bool VEC>
constexpr int g_tok() { return VEC && sizeof(W) == 2 ? 16 : 8; }
constexpr size_t g_smem_bytes(int nt) {
  return 2 * static_cast<size_t>(nt) * kGSub * sizeof(float);
}
constexpr int kGChunkT = 256;  // tokens per launch sequence (bounds h and o: P x (I + D) f32)

// One lane's eight weights of one row for one 256-column step, as loaded (VEC: 16 or 32 bytes
// at column s * 256 + lane * 8) or, scalar, already widened (columns s * 256 + lane + 32 q).
// widen(hf, o): the weights k = 4 hf .. 4 hf + 3 of the eight as f32.
template <typename W, bool VEC>
struct WFrag;
template <typename W>
struct WFrag<W, true> {
  static constexpr int kVecs = sizeof(W) * 8 / 16;
  uint4 v[kVecs];
  __device__ __forceinline__ void load(const W* row, int c0, int lane, int K, bool ok) {
    const int c = c0 + lane * 8;
    if (ok && c < K) {
#pragma unroll
      for (int j = 0; j < kVecs; ++j) v[j] = __ldg(reinterpret_cast<const uint4*>(row + c) + j);
    } else {
#pragma unroll
      for (int j = 0; j < kVecs; ++j) v[j] = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  __device__ __forceinline__ void widen(int hf, float (&o)[4]) const;
};
template <>
__device__ __forceinline__ void WFrag<float, true>::widen(int hf, float (&o)[4]) const {
  const uint4 u = v[hf];
  o[0] = __uint_as_float(u.x);
  o[1] = __uint_as_float(u.y);
  o[2] = __uint_as_float(u.z);
  o[3] = __uint_as_float(u.w);
}
template <>
__device__ __forceinline__ void WFrag<__nv_bfloat16, true>::widen(int hf, float (&o)[4]) const {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v[0]) + 2 * hf;
  const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
  o[0] = a.x;
  o[1] = a.y;
  o[2] = b.x;
  o[3] = b.y;
}
template <>
__device__ __forceinline__ void WFrag<__half, true>::widen(int hf, float (&o)[4]) const {
  const __half2* h = reinterpret_cast<const __half2*>(&v[0]) + 2 * hf;
  const float2 a = __half22float2(h[0]), b = __half22float2(h[1]);
  o[0] = a.x;
  o[1] = a.y;
  o[2] = b.x;
  o[3] = b.y;
}
template <typename W>
struct WFrag<W, false> {
  float f[8];
  __device__ __forceinline__ void load(const W* row, int c0, int lane, int K, bool ok) {
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int c = c0 + lane + 32 * q;
      f[q] = (ok && c < K) ? to_f32(row[c]) : 0.0f;
    }
  }
  __device__ __forceinline__ void widen(int hf, float (&o)[4]) const {
#pragma unroll
    for (int q = 0; q < 4; ++q) o[q] = f[4 * hf + q];
  }
};

// Per-expert pair lists. meta: [0] = the number of active experts; then active_e[S] (their ids,
// ascending), active_off[S + 1] (their ranges in pairs), with S = min(E, P).
struct PairGroups {
  const int* n_active;
  const int* active_e;
  const int* active_off;
  const int* pairs;  // [P] pair indices p = t * top_k + j
};

// One block of `warps` warps; dynamic shared memory (warps + 1) * E ints. Warp w owns the
// contiguous segment [w * seg, (w + 1) * seg) of the pairs: it counts its ids per expert, the
// counts become per-(warp, expert) start offsets (experts ascending, then warps ascending), and
// the warp writes its pairs in order (ranks from __match_any_sync), so the lists are in
// ascending p whatever the timing. Ids outside [0, E) are left out.
__global__ void moe_group_kernel(const int32_t* __restrict__ topk_idx, int P, int E,
                                 int* __restrict__ n_active, int* __restrict__ active_e,
                                 int* __restrict__ active_off, int* __restrict__ pairs) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ int gsm[];
  const int warps = blockDim.x >> 5;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int* wc = gsm;                 // [warps][E]: counts, then start offsets
  int* base = gsm + warps * E;   // [E]: totals, then each expert's offset in pairs
  const int seg = (P + warps - 1) / warps;
  const int lo = warp * seg, hi = min(P, lo + seg);
  for (int i = threadIdx.x; i < warps * E; i += blockDim.x) wc[i] = 0;
  __syncthreads();
  for (int p = lo + lane; p < hi; p += 32) {
    const int e = topk_idx[p];
    if (e >= 0 && e < E) atomicAdd(&wc[warp * E + e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int n = 0;
    for (int w = 0; w < warps; ++w) n += wc[w * E + e];
    base[e] = n;
  }
  __syncthreads();
  if (warp == 0) {  // exclusive scan of the totals; compact the experts that have pairs
    int run = 0, na = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      const int c = e < E ? base[e] : 0;
      int inc = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += v;
      }
      const unsigned has = __ballot_sync(0xffffffffu, c > 0);
      if (c > 0) {
        const int slot = na + __popc(has & ((1u << lane) - 1u));
        active_e[slot] = e;
        active_off[slot] = run + inc - c;
      }
      if (e < E) base[e] = run + inc - c;
      run += __shfl_sync(0xffffffffu, inc, 31);
      na += __popc(has);
    }
    if (lane == 0) {
      active_off[na] = run;
      *n_active = na;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = base[e];
    for (int w = 0; w < warps; ++w) {
      const int n = wc[w * E + e];
      wc[w * E + e] = run;
      run += n;
    }
  }
  __syncthreads();
  for (int p0 = lo; p0 < hi; p0 += 32) {  // warp-uniform bounds
    const int p = p0 + lane;
    int e = p < hi ? topk_idx[p] : -1;
    if (e < 0 || e >= E) e = -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(same & ((1u << lane) - 1u));
    if (e >= 0) pairs[wc[warp * E + e] + rank] = p;
    __syncwarp();
    if (e >= 0 && rank == 0) wc[warp * E + e] += __popc(same);
    __syncwarp();
  }
}

// The grouped expert kernel (see above). grid (ceil(rows / rows per block), S); block kGThreads;
// dynamic shared memory g_smem_bytes(NT): xs[2][NT][256] f32, the staged rows of the current and
// the next step. VEC layout of a staged step: for lane l, columns l*8 .. l*8+3 at [l*4] and
// l*8+4 .. l*8+7 at [128 + l*4], so each lane's two 16-byte reads are conflict-free.
//   GU:  src = x [T, K = D] (row of pair p: p / top_k); w0 = gate_w, w1 = up_w [E, rows = I, K];
//        warp w of block bx owns intermediate rows i0, i0 + 1 (i0 = (bx * kGWarps + w) * 2), its
//        weight rows gate i0, up i0, gate i0+1, up i0+1; out = h [P, I].
//   !GU: src = h [P, K = I] (row p); w0 = down_w [E, rows = D, K]; warp w owns rows d0 .. d0+3
//        (d0 = (bx * kGWarps + w) * 4); out = o [P, D].
// Per step a lane widens its 8 weights of each row in two halves of 4 (fewer live registers) and
// runs each half over the staged rows: every accumulator still takes its columns in ascending
// order, the order of the per-pair kernels.
template <typename W, bool VEC, bool GU, int NT>
__global__ void __launch_bounds__(kGThreads, 1)
    moe_grouped_kernel(const float* __restrict__ src, int src_div, int K, PairGroups g,
                       const W* __restrict__ w0, const W* __restrict__ w1, int rows, float limit,
                       float* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ __align__(16) float xs[];
  __shared__ int ps[NT];
  const int slot = blockIdx.y;
  if (slot >= *g.n_active) return;  // an expert slot nobody was routed to: nothing to do
  const int e = g.active_e[slot];
  const int lo = g.active_off[slot], hi = g.active_off[slot + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = (blockIdx.x * kGWarps + warp) * (GU ? kGRows / 2 : kGRows);
  // Weight row r of the warp: GU: (r & 1 ? up : gate) row r0 + r / 2; else down row r0 + r.
  // Rows past `rows` are never read (their loads give zeros, their results are not written).
  const int64_t first = (static_cast<int64_t>(e) * rows + r0) * K;
  const W* b0 = w0 + first;
  const W* b1 = GU ? w1 + first : w0 + first;
  auto row_ptr = [&](int r) -> const W* {
    return GU ? ((r & 1) ? b1 : b0) + static_cast<int64_t>(r >> 1) * K
              : b0 + static_cast<int64_t>(r) * K;
  };
  auto row_ok = [&](int r) { return (GU ? r0 + (r >> 1) : r0 + r) < rows; };
  const int steps = (K + kGSub - 1) / kGSub;

  for (int pb = lo; pb < hi; pb += NT) {
    const int nt = min(NT, hi - pb);
    const int ntp = (nt + kGGroup - 1) / kGGroup * kGGroup;
    __syncthreads();  // the previous pass is done with ps and xs
    if (threadIdx.x < nt) ps[threadIdx.x] = g.pairs[pb + threadIdx.x];
    __syncthreads();
    // Stage step s of the rows into buffer s & 1 (one commit group per step); the rows from nt
    // up to the end of the last group of kGGroup are zero-filled.
    auto stage = [&](int s) {
      float* buf = xs + (s & 1) * (NT * kGSub);
      const int c0 = s * kGSub;
      if constexpr (VEC) {
#pragma unroll 1
        for (int q = threadIdx.x; q < ntp * (kGSub / 4); q += kGThreads) {
          const int tt = q / (kGSub / 4), m = q % (kGSub / 4);
          const int half = m >> 5, l = m & 31;
          const int c = c0 + l * 8 + half * 4;
          const bool ok = tt < nt && c < K;
          const float* row = src + static_cast<int64_t>(ps[tt < nt ? tt : 0] / src_div) * K;
          cp_async_16(buf + tt * kGSub + half * 128 + l * 4, ok ? row + c : row, ok ? 16 : 0);
        }
      } else {
#pragma unroll 1
        for (int q = threadIdx.x; q < ntp * kGSub; q += kGThreads) {
          const int tt = q / kGSub, m = q % kGSub;
          const int c = c0 + m;
          const bool ok = tt < nt && c < K;
          const float* row = src + static_cast<int64_t>(ps[tt < nt ? tt : 0] / src_div) * K;
          cp_async_4(buf + tt * kGSub + m, ok ? row + c : row, ok ? 4 : 0);
        }
      }
      cp_async_commit();
    };

    float acc[kGRows][NT];
#pragma unroll
    for (int r = 0; r < kGRows; ++r) {
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
    }
    WFrag<W, VEC> cur[kGRows], nxt[kGRows];
    stage(0);
#pragma unroll
    for (int r = 0; r < kGRows; ++r) cur[r].load(row_ptr(r), 0, lane, K, row_ok(r));
    for (int s = 0; s < steps; ++s) {
      const bool more = s + 1 < steps;
      if (more) {  // the next step's weights are in flight during this step (and its barrier)
#pragma unroll
        for (int r = 0; r < kGRows; ++r) {
          nxt[r].load(row_ptr(r), (s + 1) * kGSub, lane, K, row_ok(r));
        }
      }
      cp_async_wait_all();
      __syncthreads();  // step s staged by every thread; step s - 1's buffer free
      if (more) stage(s + 1);
      const float* buf = xs + (s & 1) * (NT * kGSub);
      const int c0 = s * kGSub;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float wf[kGRows][4];
#pragma unroll
        for (int r = 0; r < kGRows; ++r) cur[r].widen(hf, wf[r]);
        // Rows in groups of kGGroup (padding rows of the last group are zeros, their results
        // unused): one branch per group, its shared-memory reads issued together.
#pragma unroll
        for (int t0 = 0; t0 < NT; t0 += kGGroup) {
          if (t0 < nt) {
            if constexpr (VEC) {
              if (c0 + lane * 8 < K) {
                float4 xv[kGGroup];
#pragma unroll
                for (int j = 0; j < kGGroup; ++j) {
                  xv[j] = *reinterpret_cast<const float4*>(buf + (t0 + j) * kGSub + hf * 128 +
                                                           lane * 4);
                }
#pragma unroll
                for (int j = 0; j < kGGroup; ++j) {
                  const float x4[4] = {xv[j].x, xv[j].y, xv[j].z, xv[j].w};
#pragma unroll
                  for (int k = 0; k < 4; ++k) {
#pragma unroll
                    for (int r = 0; r < kGRows; ++r) {
                      acc[r][t0 + j] = fmaf(wf[r][k], x4[k], acc[r][t0 + j]);
                    }
                  }
                }
              }
            } else {
#pragma unroll
              for (int k = 0; k < 4; ++k) {
                const int q = 4 * hf + k;
                if (c0 + lane + 32 * q < K) {
                  float xv[kGGroup];
#pragma unroll
                  for (int j = 0; j < kGGroup; ++j) xv[j] = buf[(t0 + j) * kGSub + lane + 32 * q];
#pragma unroll
                  for (int j = 0; j < kGGroup; ++j) {
#pragma unroll
                    for (int r = 0; r < kGRows; ++r) {
                      acc[r][t0 + j] = fmaf(wf[r][k], xv[j], acc[r][t0 + j]);
                    }
                  }
                }
              }
            }
          }
        }
      }
      if (more) {
#pragma unroll
        for (int r = 0; r < kGRows; ++r) cur[r] = nxt[r];
      }
    }

#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) {
        float* op = out + static_cast<int64_t>(ps[t]) * rows + r0 + lane;
        float v[kGRows];
#pragma unroll
        for (int r = 0; r < kGRows; ++r) v[r] = warp_sum(acc[r][t]);
        if constexpr (GU) {
          float hv = 0.0f;
#pragma unroll
          for (int r2 = 0; r2 < kGRows / 2; ++r2) {
            if (lane == r2) hv = clamped_swiglu(v[2 * r2], v[2 * r2 + 1], limit);
          }
          if (lane < kGRows / 2 && r0 + lane < rows) *op = hv;
        } else {
          float ov = 0.0f;
#pragma unroll
          for (int r = 0; r < kGRows; ++r) {
            if (lane == r) ov = v[r];
          }
          if (lane < kGRows && r0 + lane < rows) *op = ov;
        }
      }
    }
  }
}

// grid (T, ceil(D / 256)); block 256; dynamic shared memory top_k + 1 ints. y[t, d] = kernel B's
// sum with the dot products read from o [T * top_k, D].
__global__ void moe_combine_kernel(const float* __restrict__ o,
                                   const int32_t* __restrict__ topk_idx,
                                   const float* __restrict__ topk_w, int top_k, int E, int D,
                                   float* __restrict__ y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ int order[];  // [top_k] ordered slots, then the count
  const int64_t t = blockIdx.x;
  const int32_t* it = topk_idx + t * top_k;
  if (threadIdx.x == 0) order_slots(it, top_k, E, order);
  __syncthreads();
  const int d = blockIdx.y * blockDim.x + threadIdx.x;
  if (d >= D) return;
  const int n = order[top_k];
  float acc = 0.0f;
  for (int s = 0; s < n; ++s) {
    const int64_t p = t * top_k + order[s];
    acc = __fadd_rn(acc, __fmul_rn(o[p * D + d], topk_w[p]));
  }
  y[t * D + d] = acc;
}

// The per-pair kernels' launch limits for T tokens of `slots` expert slots each (top_k, or
// top_k + 1 with a shared expert): the slot count fits a grid's x, the row blocks of I and D its
// y, the ordered slots one block's static shared memory.
bool per_pair_fits(int T, int slots, int top_k, int I, int D) {
  return static_cast<int64_t>(T) * slots <= 0x7fffffffLL && ceil_div(I, kWarps) <= 65535u &&
         ceil_div(D, kWarps) <= 65535u && sizeof(int) * (static_cast<size_t>(top_k) + 1) <= 48 * 1024;
}

// The token count from which the grouped path takes over (the context's options; a large
// value keeps the per-pair kernels at every T, for comparisons).
int grouped_min_t(const MemraCudaCtx* ctx) { return ctx->options.moe_grouped_min_t; }

// Warps of moe_group_kernel for P pairs over E experts: segments of >= 64 pairs, at most 32 warps,
// (warps + 1) * E ints of shared memory within 48 KiB; 0 when even one warp does not fit.
int group_warps(int64_t P, int E) {
  const int64_t cap = (48 * 1024 / static_cast<int64_t>(sizeof(int))) / E - 1;
  if (cap < 1) return 0;
  int64_t w = (P + 63) / 64;
  if (w > 32) w = 32;
  if (w > cap) w = cap;
  return static_cast<int>(w < 1 ? 1 : w);
}

template <typename W, bool VEC, bool GU>
int launch_grouped(MemraCudaCtx* ctx, const float* src, int src_div, int K, const PairGroups& pg,
                   int S, const W* w0, const W* w1, int rows, float limit, float* out) {
  constexpr int NT = g_tok<W, VEC>();
  constexpr int rows_per_block = kGWarps * (GU ? kGRows / 2 : kGRows);
  const dim3 grid(ceil_div(rows, rows_per_block), static_cast<unsigned>(S));
  memra::cuda::launch(ctx, true, moe_grouped_kernel<W, VEC, GU, NT>, dim3(grid), dim3(kGThreads),
      g_smem_bytes(NT), src, src_div, K, pg, w0, w1, rows, limit, out);
  return launch_status();
}

// Whether the grouped path can run this geometry (else the per-pair kernels do).
bool grouped_fits(int T, int top_k, int E) {
  const int64_t Pc = static_cast<int64_t>(T < kGChunkT ? T : kGChunkT) * top_k;
  const int64_t S = E < Pc ? E : Pc;
  return S <= 65535 && group_warps(Pc, E) > 0;
}

template <typename W>
int launch_moe_grouped(MemraCudaCtx* ctx, const float* x, int T, int D, const int32_t* topk_idx,
                       const float* topk_w, int top_k, const void* gate_w, const void* up_w,
                       const void* down_w, int E, int I, float limit, float* y) {
  const W* g = static_cast<const W*>(gate_w);
  const W* u = static_cast<const W*>(up_w);
  const W* dw = static_cast<const W*>(down_w);
  const int Tc = T < kGChunkT ? T : kGChunkT;
  const int64_t Pc = static_cast<int64_t>(Tc) * top_k;
  const int64_t Sc = E < Pc ? E : Pc;
  const int warps = group_warps(Pc, E);
  // meta: n_active, active_e[Sc], active_off[Sc + 1], pairs[Pc]; h [Pc, I]; o [Pc, D].
  Scratch meta(ctx, sizeof(int) * static_cast<size_t>(2 + 2 * Sc + Pc));
  MEMRA_CUDA_RETURN_IF(meta.status());
  Scratch h(ctx, sizeof(float) * static_cast<size_t>(Pc) * I);
  MEMRA_CUDA_RETURN_IF(h.status());
  Scratch o(ctx, sizeof(float) * static_cast<size_t>(Pc) * D);
  MEMRA_CUDA_RETURN_IF(o.status());
  int* m = meta.as<int>();
  PairGroups pg{m, m + 1, m + 1 + Sc, m + 2 + 2 * Sc};
  int* n_active = m;
  int* active_e = m + 1;
  int* active_off = m + 1 + Sc;
  int* pairs = m + 2 + 2 * Sc;
  // The per-pair kernels' VEC conditions (the lane partition of every dot follows them).
  const bool vec_a = D % 8 == 0 && aligned16(x) && aligned16(g) && aligned16(u);
  const bool vec_b = I % 8 == 0 && aligned16(h.as<float>()) && aligned16(dw);
  const size_t combine_smem = sizeof(int) * (static_cast<size_t>(top_k) + 1);
  for (int t0 = 0; t0 < T; t0 += Tc) {
    const int tn = T - t0 < Tc ? T - t0 : Tc;
    const int P = tn * top_k;
    const int S = E < P ? E : P;
    const int32_t* idx = topk_idx + static_cast<int64_t>(t0) * top_k;
    memra::cuda::launch(ctx, true, moe_group_kernel, dim3(1), dim3(warps * 32),
        sizeof(int) * static_cast<size_t>(warps + 1) * E, idx, P, E, n_active, active_e, active_off,
        pairs);
    MEMRA_CUDA_RETURN_IF(launch_status());
    const float* xc = x + static_cast<int64_t>(t0) * D;
    if (vec_a) {
      MEMRA_CUDA_RETURN_IF((launch_grouped<W, true, true>(ctx, xc, top_k, D, pg, S, g, u, I,
                                                          limit, h.as<float>())));
    } else {
      MEMRA_CUDA_RETURN_IF((launch_grouped<W, false, true>(ctx, xc, top_k, D, pg, S, g, u, I,
                                                           limit, h.as<float>())));
    }
    if (vec_b) {
      MEMRA_CUDA_RETURN_IF((launch_grouped<W, true, false>(ctx, h.as<float>(), 1, I, pg, S, dw,
                                                           nullptr, D, 0.0f, o.as<float>())));
    } else {
      MEMRA_CUDA_RETURN_IF((launch_grouped<W, false, false>(ctx, h.as<float>(), 1, I, pg, S, dw,
                                                            nullptr, D, 0.0f, o.as<float>())));
    }
    const dim3 grid_c(static_cast<unsigned>(tn), ceil_div(D, 256));
    memra::cuda::launch(ctx, true, moe_combine_kernel, dim3(grid_c), dim3(256), combine_smem,
        o.as<float>(), idx, topk_w + static_cast<int64_t>(t0) * top_k, top_k, E, D,
        y + static_cast<int64_t>(t0) * D);
    MEMRA_CUDA_RETURN_IF(launch_status());
  }
  return memra::kOk;
}

// memra_cuda_swiglu_mlp, plus add [T, D] (or null) summed into y: at T = 1 as the down GEMV's bias
// (its s += bias[n] after the row's sum: mlp + add, the same bits as the add kernel's a + b in
// either order), otherwise memra_cuda_add after the down GEMM.
int swiglu_mlp_impl(MemraCudaCtx* ctx, const float* x, int T, int D, const void* gate_w,
                    const void* up_w, const void* down_w, int w_dtype, int I, float limit,
                    const float* add, float* y) {
  // A deferred mHC Sinkhorn rides on the gate|up GEMV (common.cuh) unless it reads the comb.
  MEMRA_CUDA_RETURN_IF(memra::cuda::enter_keep(ctx));
  const size_t rows = sizeof(float) * size_t(T > 0 ? T : 0) * size_t(D > 0 ? D : 0);
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, x, rows));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, add, rows));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, y, rows));
  if (T < 0 || D < 0 || I < 0) return memra::kContractValue;
  if (w_dtype < 0 || w_dtype > 2) return memra::kContractDType;
  if (!(limit > 0.0f)) return memra::kContractValue;  // as the binding: swiglu_limit > 0 (inf ok)
  if (T == 0 || D == 0) return memra::kOk;
  if (!x || !y || (I > 0 && (!gate_w || !up_w || !down_w))) return memra::kContractMissing;
  const int64_t n = static_cast<int64_t>(T) * I;
  // gate and up stored as one [2I, D] matrix (up right after gate): one GEMM with N = 2I.
  const size_t wbytes = w_dtype == 0 ? sizeof(float) : sizeof(uint16_t);
  if (I > 0 && 2LL * I <= INT_MAX &&
      static_cast<const char*>(up_w) ==
          static_cast<const char*>(gate_w) + static_cast<size_t>(I) * D * wbytes) {
    Scratch buf(ctx, sizeof(float) * 3 * static_cast<size_t>(n));  // gu [T, 2I], h [T, I]
    MEMRA_CUDA_RETURN_IF(buf.status());
    float* gu = buf.as<float>();
    float* h = gu + 2 * n;  // f32, or the 16-bit down dtype in its first half
    bool fused = false;
    if (T == 1 && w_dtype == 0) {
      MEMRA_CUDA_RETURN_IF(gemv_swiglu(ctx, x, D, gate_w, w_dtype, I, limit, h, &fused));
    } else if (T == 1 && w_dtype == 1) {
      MEMRA_CUDA_RETURN_IF(gemv_swiglu(ctx, x, D, gate_w, w_dtype, I, limit,
                                       reinterpret_cast<__nv_bfloat16*>(h), &fused));
    }
    if (!fused) {  // the GEMM, then the activation's own launch
      MEMRA_CUDA_RETURN_IF(memra::cuda::linear(ctx, x, T, D, gate_w, w_dtype, 2 * I, nullptr, gu));
      if (w_dtype == 0) {
        memra::cuda::launch(ctx, true, swiglu_pair_kernel<float>, dim3(act_blocks(n)), dim3(256),
                            0, gu, T, I, limit, h);
      } else if (w_dtype == 1) {
        memra::cuda::launch(ctx, true, swiglu_pair_kernel<__nv_bfloat16>, dim3(act_blocks(n)),
                            dim3(256), 0, gu, T, I, limit, reinterpret_cast<__nv_bfloat16*>(h));
      } else {
        memra::cuda::launch(ctx, true, swiglu_pair_kernel<__half>, dim3(act_blocks(n)),
                            dim3(256), 0, gu, T, I, limit, reinterpret_cast<__half*>(h));
      }
    }
    MEMRA_CUDA_RETURN_IF(launch_status());
    // h already in the down weight's dtype: no rounding launch before the GEMM.
    const bool bias = add && T == 1;
    MEMRA_CUDA_RETURN_IF(
        memra::cuda::linear_ex(ctx, h, w_dtype, I, T, I, down_w, w_dtype, D, bias ? add : nullptr, y));
    return add && !bias ? memra_cuda_add(ctx, y, add, static_cast<int64_t>(T) * D, y) : memra::kOk;
  }
  Scratch gu(ctx, sizeof(float) * 2 * static_cast<size_t>(n));
  MEMRA_CUDA_RETURN_IF(gu.status());
  float* g = gu.as<float>();
  float* u = g + n;
  MEMRA_CUDA_RETURN_IF(memra::cuda::linear(ctx, x, T, D, gate_w, w_dtype, I, nullptr, g));
  MEMRA_CUDA_RETURN_IF(memra::cuda::linear(ctx, x, T, D, up_w, w_dtype, I, nullptr, u));
  if (n > 0) {
    memra::cuda::launch(ctx, true, swiglu_act_kernel, dim3(act_blocks(n)), dim3(256), 0, g, u, n,
        limit);
    MEMRA_CUDA_RETURN_IF(launch_status());
  }
  // I == 0: linear writes y = 0 (an empty sum), as cpu::linear does.
  MEMRA_CUDA_RETURN_IF(memra::cuda::linear(ctx, g, T, I, down_w, w_dtype, D, nullptr, y));
  return add ? memra_cuda_add(ctx, y, add, static_cast<int64_t>(T) * D, y) : memra::kOk;
}

}  // namespace

extern "C" {

int memra_cuda_swiglu_mlp(MemraCudaCtx* ctx, const float* x, int T, int D, const void* gate_w,
                          const void* up_w, const void* down_w, int w_dtype, int I, float limit,
                          float* y) {
  return swiglu_mlp_impl(ctx, x, T, D, gate_w, up_w, down_w, w_dtype, I, limit, nullptr, y);
}

int memra_cuda_swiglu_mlp_add(MemraCudaCtx* ctx, const float* x, int T, int D, const void* gate_w,
                              const void* up_w, const void* down_w, int w_dtype, int I,
                              float limit, const float* add, float* y) {
  return swiglu_mlp_impl(ctx, x, T, D, gate_w, up_w, down_w, w_dtype, I, limit, add, y);
}

int memra_cuda_moe_route(MemraCudaCtx* ctx, const float* x, int T, int D, const float* gate_w,
                         const float* corr_bias, int E, int top_k, int n_group, int topk_group,
                         int norm_topk_prob, float scaling, int32_t* topk_idx, float* topk_w) {
  // A deferred mHC Sinkhorn rides on the router's GEMV (common.cuh) unless it reads the comb.
  MEMRA_CUDA_RETURN_IF(memra::cuda::enter_keep(ctx));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, x, sizeof(float) * size_t(T > 0 ? T : 0) * size_t(D > 0 ? D : 0)));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, corr_bias, sizeof(float) * size_t(E > 0 ? E : 0)));
  const size_t picks = size_t(T > 0 ? T : 0) * size_t(top_k > 0 ? top_k : 0);
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, topk_idx, sizeof(int32_t) * picks));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, topk_w, sizeof(float) * picks));
  if (T < 0 || D < 0 || E <= 0) return memra::kContractValue;
  if (n_group < 1 || E % n_group != 0) return memra::kContractValue;
  if (topk_group < 1 || topk_group > n_group) return memra::kContractValue;
  if (top_k < 1 || static_cast<int64_t>(top_k) > static_cast<int64_t>(topk_group) * (E / n_group))
    return memra::kContractValue;
  if (T == 0) return memra::kOk;
  if (!x || !gate_w || !topk_idx || !topk_w) return memra::kContractMissing;
  const RouteLayout layout = route_layout(E, n_group);
  constexpr int kSmemLimit = 48 * 1024;
  if (layout.warp_bytes > kSmemLimit) return memra::kUnsupportedGeometry;  // E beyond ~5000
  int warps = 4;
  while (warps > 1 && warps * layout.warp_bytes > kSmemLimit) warps /= 2;

  Scratch logits(ctx, sizeof(float) * static_cast<size_t>(T) * E);
  MEMRA_CUDA_RETURN_IF(logits.status());
  // One token whose router the GEMV's row body takes (not its short-row kernel, whose sums go
  // in another order): router and routing in one launch.
  // (Its static shared memory, the GEMV's partial sums and the ticket flag, comes on top of the
  // routing's warp_bytes.)
  constexpr int kFusedStaticSmem = 256;
  if (T == 1 && memra::cuda::gemv_takes(ctx, x, 0, D, gate_w, 0) &&
      D / 4 > grow::kShortMaxV && layout.warp_bytes + kFusedStaticSmem <= kSmemLimit) {
    // The router GEMV's own check (memra_cuda_linear): a weight that overlaps a pending comb.
    MEMRA_CUDA_RETURN_IF(
        memra::cuda::flush_if_reads(ctx, gate_w, sizeof(float) * size_t(E) * size_t(D)));
    const int KV = D / 4;
    const int prefetch = ctx->resident_weights > 0 ? 1 : 0;
    auto go = [&](auto p) {
      constexpr int P = decltype(p)::value;
      return grow::launch_gemv_smem(
          ctx, route_decode_kernel<P>, E, static_cast<size_t>(layout.warp_bytes), x, gate_w, D,
          corr_bias, E, top_k, n_group, topk_group, norm_topk_prob ? 1 : 0, scaling, layout,
          logits.as<float>(), ctx->tickets + memra::cuda::kTicketMoeRoute, topk_idx, topk_w,
          prefetch);
    };
    if (grow::vectors_per_chunk_thread(KV) == 1) return go(std::integral_constant<int, 1>());
    return go(std::integral_constant<int, grow::kGemvP>());
  }
  // Router logits in f32 (transformers computes them in f32): an SGEMM with TF32 off.
  MEMRA_CUDA_RETURN_IF(memra::cuda::linear(ctx, x, T, D, gate_w, 0, E, nullptr, logits.as<float>()));
  const unsigned blocks = ceil_div(T, warps);
  memra::cuda::launch(ctx, true, moe_route_kernel, dim3(blocks), dim3(warps * 32),
      static_cast<size_t>(warps) * layout.warp_bytes, logits.as<float>(), corr_bias, T, E, top_k,
      n_group, topk_group, norm_topk_prob ? 1 : 0, scaling, layout, topk_idx, topk_w);
  return launch_status();
}

int memra_cuda_moe_forward(MemraCudaCtx* ctx, const float* x, int T, int D,
                           const int32_t* topk_idx, const float* topk_w, int top_k,
                           const void* gate_w, const void* up_w, const void* down_w, int w_dtype,
                           int E, int I, float limit, float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || D < 0 || I < 0 || E < 0 || top_k < 0) return memra::kContractValue;
  if (w_dtype < 0 || w_dtype > 2) return memra::kContractDType;
  if (!(limit > 0.0f)) return memra::kContractValue;
  if (T == 0 || D == 0) return memra::kOk;
  if (!x || !y) return memra::kContractMissing;
  if (top_k == 0 || I == 0 || E == 0) {  // no term (or only empty sums): y = 0
    return status_of(cudaMemsetAsync(y, 0, sizeof(float) * static_cast<size_t>(T) * D,
                                     ctx->stream));
  }
  if (!topk_idx || !topk_w || !gate_w || !up_w || !down_w) return memra::kContractMissing;
  if (!per_pair_fits(T, top_k, top_k, I, D)) return memra::kUnsupportedGeometry;
  if (T >= grouped_min_t(ctx) && grouped_fits(T, top_k, E)) {
    switch (w_dtype) {
      case 0:
        return launch_moe_grouped<float>(ctx, x, T, D, topk_idx, topk_w, top_k, gate_w, up_w,
                                         down_w, E, I, limit, y);
      case 1:
        return launch_moe_grouped<__nv_bfloat16>(ctx, x, T, D, topk_idx, topk_w, top_k, gate_w,
                                                 up_w, down_w, E, I, limit, y);
      default:
        return launch_moe_grouped<__half>(ctx, x, T, D, topk_idx, topk_w, top_k, gate_w, up_w,
                                          down_w, E, I, limit, y);
    }
  }
  Scratch h(ctx, sizeof(float) * static_cast<size_t>(T) * top_k * I);
  MEMRA_CUDA_RETURN_IF(h.status());
  switch (w_dtype) {
    case 0:
      return launch_moe<float>(ctx, x, T, D, topk_idx, topk_w, top_k, gate_w, up_w, down_w, E, I,
                               limit, h.as<float>(), y);
    case 1:
      return launch_moe<__nv_bfloat16>(ctx, x, T, D, topk_idx, topk_w, top_k, gate_w, up_w,
                                       down_w, E, I, limit, h.as<float>(), y);
    default:
      return launch_moe<__half>(ctx, x, T, D, topk_idx, topk_w, top_k, gate_w, up_w, down_w, E,
                                I, limit, h.as<float>(), y);
  }
}

int memra_cuda_moe_forward_shared(MemraCudaCtx* ctx, const float* x, int T, int D,
                                  const int32_t* topk_idx, const float* topk_w, int top_k,
                                  const void* gate_w, const void* up_w, const void* down_w,
                                  int w_dtype, int E, int I, float limit,
                                  const void* shared_gate_w, const void* shared_up_w,
                                  const void* shared_down_w, int shared_I, float shared_limit,
                                  float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || D < 0 || I < 0 || E < 0 || top_k < 0 || shared_I < 0) return memra::kContractValue;
  if (w_dtype < 0 || w_dtype > 2) return memra::kContractDType;
  if (!(limit > 0.0f) || !(shared_limit > 0.0f)) return memra::kContractValue;
  if (T == 0 || D == 0) return memra::kOk;
  if (!x || !y || !shared_gate_w || !shared_up_w || !shared_down_w) return memra::kContractMissing;
  // One more slot per token in the per-pair kernels: the path moe_forward takes at this T, the
  // shared expert as wide as a routed one, and something routed to add it to.
  const bool fused = top_k > 0 && I > 0 && E > 0 && shared_I == I && topk_idx && topk_w &&
                     gate_w && up_w && down_w &&
                     !(T >= grouped_min_t(ctx) && grouped_fits(T, top_k, E)) &&
                     per_pair_fits(T, top_k + 1, top_k, I, D);
  if (!fused) {
    Scratch routed(ctx, sizeof(float) * static_cast<size_t>(T) * D);
    MEMRA_CUDA_RETURN_IF(routed.status());
    MEMRA_CUDA_RETURN_IF(memra_cuda_moe_forward(ctx, x, T, D, topk_idx, topk_w, top_k, gate_w,
                                                up_w, down_w, w_dtype, E, I, limit,
                                                routed.as<float>()));
    return memra_cuda_swiglu_mlp_add(ctx, x, T, D, shared_gate_w, shared_up_w, shared_down_w,
                                     w_dtype, shared_I, shared_limit, routed.as<float>(), y);
  }
  Scratch h(ctx, sizeof(float) * static_cast<size_t>(T) * (top_k + 1) * I);
  MEMRA_CUDA_RETURN_IF(h.status());
  auto run = [&](auto wt) {
    using W = decltype(wt);
    SharedExpert<W> sh;
    sh.gate = static_cast<const W*>(shared_gate_w);
    sh.up = static_cast<const W*>(shared_up_w);
    sh.down = static_cast<const W*>(shared_down_w);
    sh.limit = shared_limit;
    return launch_moe<W>(ctx, x, T, D, topk_idx, topk_w, top_k, gate_w, up_w, down_w, E, I, limit,
                         h.as<float>(), y, sh);
  };
  switch (w_dtype) {
    case 0: return run(float{});
    case 1: return run(__nv_bfloat16{});
    default: return run(__half{});
  }
}

}  // extern "C"
