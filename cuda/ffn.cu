// FFN ops of the CUDA backend (cpp/include/memra/cuda_abi/ffn.h): the clamped SwiGLU MLP, the
// grouped sigmoid router and the routed experts; the GPU twins of cpu/ffn.cpp.
//   swiglu_mlp:  three cuBLAS GEMMs (memra_cuda_linear: f32 SGEMM with TF32 off, or x rounded to
//                bf16 for bf16 weights) around an elementwise clamped-SwiGLU kernel that writes
//                the CPU's formula element by element.
//   moe_route:   router logits in f32 (SGEMM), then one warp per token: sigmoid scores, choice =
//                s + bias, group scores (the CPU's best/second loop), top groups and top_k experts
//                by repeated warp argmax over (value desc, id asc), weights from s, the CPU's
//                sequential renormalisation, times scaling. Same indices and order as the CPU.
//   moe_forward: the decode-shaped path over stacked weights [E, I, D] / [E, D, I]: kernel A puts
//                one warp on each (token slot, row of I) for gate and up at once and writes h;
//                kernel B puts one warp on each (token, output row d) and adds the token's terms
//                (down row . h) * w in ascending expert id, as the CPU does. Activations stay f32
//                (bf16 weights are widened, x is not rounded), so against cpu::moe_forward on the
//                same weights only the dot products' summation order differs.
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;
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
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    g[i] = clamped_swiglu(g[i], u[i], limit);
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

// One warp per token; each warp owns warp_bytes of dynamic shared memory. No __syncthreads, so a
// warp past the last token may return at once.
__global__ void moe_route_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                                 int T, int E, int top_k, int G, int topk_group, int norm,
                                 float scaling, RouteLayout layout, int32_t* __restrict__ topk_idx,
                                 float* __restrict__ topk_w) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (t >= T) return;
  unsigned char* base = smem + static_cast<size_t>(warp) * layout.warp_bytes;
  float* scores = reinterpret_cast<float*>(base);
  float* choice = scores + E;
  float* group_score = choice + E;
  unsigned char* taken = base + layout.floats_bytes;
  unsigned char* kept = taken + E;
  const float* lt = logits + t * E;
  const int per_group = E / G;
  const float neg_inf = -INFINITY;

  for (int e = lane; e < E; e += 32) {
    const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-lt[e])));
    scores[e] = s;
    choice[e] = bias ? __fadd_rn(s, bias[e]) : s;
    taken[e] = 0;
  }
  for (int g = lane; g < G; g += 32) kept[g] = 0;
  __syncwarp();
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
  int32_t* idx = topk_idx + t * top_k;
  float* w = topk_w + t * top_k;
  float sum = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    const int e = warp_argmax_unflagged(choice, taken, E, lane);
    if (lane == 0) {
      taken[e] = 1;
      idx[j] = e;
      w[j] = scores[e];  // the unbiased score: the bias only chooses
      sum = __fadd_rn(sum, scores[e]);
    }
    __syncwarp();
  }
  if (lane == 0) {
    const float denom = __fadd_rn(sum, 1e-20f);
    for (int j = 0; j < top_k; ++j) {
      float v = w[j];
      if (norm) v = __fdiv_rn(v, denom);
      w[j] = __fmul_rn(v, scaling);
    }
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

// Kernel A. grid (P = T * top_k, ceil(I / kWarps)); warp w of block (p, by) computes row
// i = by * kWarps + w of slot p: h[p, i] = clamped_swiglu(gate_w[e, i] . x_t, up_w[e, i] . x_t)
// with e = topk_idx[p], t = p / top_k. Slots with an id outside [0, E) are skipped (h unused).
// VEC: D % 8 == 0 and 16-byte aligned bases: each lane reads 8 weights per row per step.
template <typename W, bool VEC>
__global__ void __launch_bounds__(kWarps * 32)
    moe_gate_up_kernel(const float* __restrict__ x, int D, const int32_t* __restrict__ topk_idx,
                       int top_k, const W* __restrict__ gate_w, const W* __restrict__ up_w,
                       int E, int I, float limit, float* __restrict__ h) {
  const int64_t p = blockIdx.x;
  const int e = topk_idx[p];
  if (e < 0 || e >= E) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.y * kWarps + warp;
  if (i >= I) return;
  const float* xt = x + (p / top_k) * D;
  const int64_t row = (static_cast<int64_t>(e) * I + i) * D;
  const W* g = gate_w + row;
  const W* u = up_w + row;
  float ag = 0.0f, au = 0.0f;
  if constexpr (VEC) {
    for (int c = lane * 8; c < D; c += 32 * 8) {
      float xv[8], gv[8], uv[8];
      load8x(xt + c, xv);
      load8<W>(g + c, gv);
      load8<W>(u + c, uv);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        ag = fmaf(gv[k], xv[k], ag);
        au = fmaf(uv[k], xv[k], au);
      }
    }
  } else {
    for (int c = lane; c < D; c += 32) {
      const float xv = xt[c];
      ag = fmaf(to_f32(g[c]), xv, ag);
      au = fmaf(to_f32(u[c]), xv, au);
    }
  }
  ag = warp_sum(ag);
  au = warp_sum(au);
  if (lane == 0) h[p * I + i] = clamped_swiglu(ag, au, limit);
}

// Kernel B. grid (T, ceil(D / kWarps)); dynamic shared memory: top_k + 1 ints. Thread 0 orders
// the token's valid slots by (expert id, slot) (the CPU visits experts in ascending id and, for a
// repeated id, the slots in ascending order); warp w then computes output row
// d = by * kWarps + w: y[t, d] = 0 + sum over the ordered slots of (down_w[e, d] . h[p]) * w[p],
// each product and sum rounded separately as on the CPU.
template <typename W, bool VEC>
__global__ void __launch_bounds__(kWarps * 32)
    moe_down_kernel(const float* __restrict__ h, const int32_t* __restrict__ topk_idx,
                    const float* __restrict__ topk_w, int top_k, const W* __restrict__ down_w,
                    int E, int I, int D, float* __restrict__ y) {
  extern __shared__ int order[];  // [top_k] ordered slots, then the count
  const int64_t t = blockIdx.x;
  const int32_t* it = topk_idx + t * top_k;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int j = 0; j < top_k; ++j) {
      const int e = it[j];
      if (e < 0 || e >= E) continue;
      int pos = n++;  // insertion sort by (id, slot); slots arrive ascending
      while (pos > 0 && it[order[pos - 1]] > e) {
        order[pos] = order[pos - 1];
        --pos;
      }
      order[pos] = j;
    }
    order[top_k] = n;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int d = blockIdx.y * kWarps + warp;
  if (d >= D) return;
  const int n = order[top_k];
  float acc = 0.0f;
  for (int s = 0; s < n; ++s) {
    const int j = order[s];
    const int64_t p = t * top_k + j;
    const float* hp = h + p * I;
    const W* wr = down_w + (static_cast<int64_t>(it[j]) * D + d) * I;
    float a = 0.0f;
    if constexpr (VEC) {
      for (int c = lane * 8; c < I; c += 32 * 8) {
        float hv[8], wv[8];
        load8x(hp + c, hv);
        load8<W>(wr + c, wv);
#pragma unroll
        for (int k = 0; k < 8; ++k) a = fmaf(wv[k], hv[k], a);
      }
    } else {
      for (int c = lane; c < I; c += 32) a = fmaf(to_f32(wr[c]), hp[c], a);
    }
    a = warp_sum(a);
    acc = __fadd_rn(acc, __fmul_rn(a, topk_w[p]));
  }
  if (lane == 0) y[t * D + d] = acc;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename W>
int launch_moe(MemraCudaCtx* ctx, const float* x, int T, int D, const int32_t* topk_idx,
               const float* topk_w, int top_k, const void* gate_w, const void* up_w,
               const void* down_w, int E, int I, float limit, float* h, float* y) {
  const W* g = static_cast<const W*>(gate_w);
  const W* u = static_cast<const W*>(up_w);
  const W* dw = static_cast<const W*>(down_w);
  const int64_t P = static_cast<int64_t>(T) * top_k;
  const dim3 block(kWarps * 32);
  const dim3 grid_a(static_cast<unsigned>(P), ceil_div(I, kWarps));
  const bool vec_a = D % 8 == 0 && aligned16(x) && aligned16(g) && aligned16(u);
  if (vec_a) {
    moe_gate_up_kernel<W, true><<<grid_a, block, 0, ctx->stream>>>(x, D, topk_idx, top_k, g, u, E,
                                                                     I, limit, h);
  } else {
    moe_gate_up_kernel<W, false><<<grid_a, block, 0, ctx->stream>>>(x, D, topk_idx, top_k, g, u,
                                                                      E, I, limit, h);
  }
  MEMRA_CUDA_RETURN_IF(launch_status());
  const dim3 grid_b(static_cast<unsigned>(T), ceil_div(D, kWarps));
  const size_t smem = sizeof(int) * (static_cast<size_t>(top_k) + 1);
  const bool vec_b = I % 8 == 0 && aligned16(h) && aligned16(dw);
  if (vec_b) {
    moe_down_kernel<W, true><<<grid_b, block, smem, ctx->stream>>>(h, topk_idx, topk_w, top_k, dw,
                                                                   E, I, D, y);
  } else {
    moe_down_kernel<W, false><<<grid_b, block, smem, ctx->stream>>>(h, topk_idx, topk_w, top_k,
                                                                    dw, E, I, D, y);
  }
  return launch_status();
}

}  // namespace

extern "C" {

int memra_cuda_swiglu_mlp(MemraCudaCtx* ctx, const float* x, int T, int D, const void* gate_w,
                          const void* up_w, const void* down_w, int w_dtype, int I, float limit,
                          float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || D < 0 || I < 0) return memra::kContractValue;
  if (w_dtype < 0 || w_dtype > 2) return memra::kContractDType;
  if (!(limit > 0.0f)) return memra::kContractValue;  // as the binding: swiglu_limit > 0 (inf ok)
  if (T == 0 || D == 0) return memra::kOk;
  if (!x || !y || (I > 0 && (!gate_w || !up_w || !down_w))) return memra::kContractMissing;
  const int64_t n = static_cast<int64_t>(T) * I;
  Scratch gu(ctx, sizeof(float) * 2 * static_cast<size_t>(n));
  MEMRA_CUDA_RETURN_IF(gu.status());
  float* g = gu.as<float>();
  float* u = g + n;
  MEMRA_CUDA_RETURN_IF(memra_cuda_linear(ctx, x, T, D, gate_w, w_dtype, I, nullptr, g));
  MEMRA_CUDA_RETURN_IF(memra_cuda_linear(ctx, x, T, D, up_w, w_dtype, I, nullptr, u));
  if (n > 0) {
    swiglu_act_kernel<<<act_blocks(n), 256, 0, ctx->stream>>>(g, u, n, limit);
    MEMRA_CUDA_RETURN_IF(launch_status());
  }
  // I == 0: linear writes y = 0 (an empty sum), as cpu::linear does.
  return memra_cuda_linear(ctx, g, T, I, down_w, w_dtype, D, nullptr, y);
}

int memra_cuda_moe_route(MemraCudaCtx* ctx, const float* x, int T, int D, const float* gate_w,
                         const float* corr_bias, int E, int top_k, int n_group, int topk_group,
                         int norm_topk_prob, float scaling, int32_t* topk_idx, float* topk_w) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
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
  // Router logits in f32 (transformers computes them in f32): an SGEMM with TF32 off.
  MEMRA_CUDA_RETURN_IF(memra_cuda_linear(ctx, x, T, D, gate_w, 0, E, nullptr, logits.as<float>()));
  const unsigned blocks = ceil_div(T, warps);
  moe_route_kernel<<<blocks, warps * 32, static_cast<size_t>(warps) * layout.warp_bytes,
                     ctx->stream>>>(logits.as<float>(), corr_bias, T, E, top_k, n_group,
                                    topk_group, norm_topk_prob ? 1 : 0, scaling, layout, topk_idx,
                                    topk_w);
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
  if (static_cast<int64_t>(T) * top_k > 0x7fffffffLL) return memra::kUnsupportedGeometry;
  if (ceil_div(I, kWarps) > 65535u || ceil_div(D, kWarps) > 65535u)
    return memra::kUnsupportedGeometry;
  if (sizeof(int) * (static_cast<size_t>(top_k) + 1) > 48 * 1024)
    return memra::kUnsupportedGeometry;
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

}  // extern "C"
