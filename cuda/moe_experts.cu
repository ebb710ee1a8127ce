// The routed experts of the CUDA backend (cpp/include/memra/cuda_abi/moe.h `moe_forward`): the GPU
// twin of cpu::moe_forward (cpu/moe.cpp), with a MoE layer's shared expert.
//   Per-pair kernels (decode rows, below KernelOptions::moe_grouped_min_t), over stacked weights
//   [E, I, D] / [E, D, I]: kernel A puts one warp on each (token slot, row of I) for gate and up at
//   once and writes h; kernel B puts one warp on each (token, output row d) and adds the token's
//   terms (down row . h) * w in ascending expert id, as the CPU does. Activations stay f32 (bf16
//   weights are widened, x is not rounded), so against cpu::moe_forward on the same weights only
//   the dot products' summation order differs.
//   From moe_grouped_min_t tokens on, the same dot products grouped by expert
//   (cuda/moe_grouped.cu), with bit-identical results; over bf16 / f16 weights (with
//   KernelOptions::moe_tensor_cores) grouped GEMMs on tensor cores instead (cuda/moe_tc.cu: x and
//   h rounded to the weights' type, another summation order).
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "moe_common.cuh"
#include "swiglu.cuh"

using memra::cuda::aligned16;
using memra::cuda::ceil_div;
using memra::cuda::clamped_swiglu;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;
using memra::cuda::to_f32;
using memra::cuda::warp_sum;
using memra::cuda::moe::order_slots;

namespace {

constexpr int kWarps = 8;  // warps per block of the expert kernels (one row each)

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

// One slot's down products for a warp's RPW rows: a[r] = lane's partial of wr[r] . hp (h [I] f32,
// wr[r] a row of I weights), lane l taking columns l * 8 + 256 s (VEC) or l + 32 s, in ascending
// order with fmaf; the caller's warp_sum finishes each.
template <typename W, bool VEC, int RPW>
__device__ __forceinline__ void down_dots(const float* __restrict__ hp, const W* const (&wr)[RPW],
                                          int I, int lane, float (&a)[RPW]) {
#pragma unroll
  for (int r = 0; r < RPW; ++r) a[r] = 0.0f;
  if constexpr (VEC) {
#pragma unroll 4
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

// Kernel B's geometry: a block computes kDownRows output rows of one token, its warps taking the
// (slot, row group of RPW rows) tasks round robin. Spreading a token's slots over warps keeps
// many weight rows in flight at T = 1, where one warp per row group walking the slots in turn
// left too few loads outstanding to reach the copy bandwidth. RPW = 2: each load of h serves
// two rows (docs/options.md has the A/B of 1, 2 and 4 rows).
constexpr int kDownRowsPerWarp = 2;
constexpr int kDownRows = 8;

// Kernel B. grid (T, ceil(D / kDownRows)); dynamic shared memory: top_k + 1 ints, then
// (top_k + 1) * kDownRows floats. Thread 0 orders the token's valid slots by (expert id, slot)
// (the CPU visits experts in ascending id and, for a repeated id, the slots in ascending order).
// Each task's warp writes its RPW dot products down_w[e, d] . h[p] (lane-partial sums in
// down_dots' order, then warp_sum) to shared memory; thread r then forms
// y[t, d] = 0 + sum over the ordered slots of (dot) * w[p], each product and sum rounded
// separately as on the CPU, in slot order: the same operations whichever warp made each dot.
// With a shared expert (sh.down) it is one more slot, weight-free, added last:
// y[t, d] = (sh.down[d] . h[P + t]) + that routed sum (swiglu_mlp_add's s + bias).
template <typename W, bool VEC, int RPW>
__global__ void __launch_bounds__(kWarps * 32)
    moe_down_kernel(const float* __restrict__ h, const int32_t* __restrict__ topk_idx,
                    const float* __restrict__ topk_w, int top_k, const W* __restrict__ down_w,
                    int E, int I, int D, float* __restrict__ y, int64_t P, SharedExpert<W> sh) {
  static_assert(kDownRows % RPW == 0, "a block's rows are whole row groups");
  constexpr int kGroups = kDownRows / RPW;
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ int order[];  // [top_k] ordered slots, the count, then the dots
  float* dots = reinterpret_cast<float*>(order + top_k + 1);  // [top_k + 1][kDownRows]
  const int64_t t = blockIdx.x;
  const int32_t* it = topk_idx + t * top_k;
  if (threadIdx.x == 0) order_slots(it, top_k, E, order);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int dblk = blockIdx.y * kDownRows;
  const int n = order[top_k];
  // Slot s < n: routed slot order[s] (weight topk_w); s == n: the shared expert.
  const int slots = n + (sh.down ? 1 : 0);
  for (int task = warp; task < slots * kGroups; task += kWarps) {
    const int s = task / kGroups, g = task - s * kGroups;
    const int d0 = dblk + g * RPW;
    if (d0 >= D) continue;  // rows past D: neither written nor read below
    const bool shared = s == n;
    const int j = shared ? 0 : order[s];
    const int64_t p = shared ? P + t : t * top_k + j;
    const W* wr[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      // Rows past D (a ragged last group) re-read row d0 and are never stored.
      const int64_t d = d0 + r < D ? d0 + r : d0;
      wr[r] = shared ? sh.down + d * I : down_w + (static_cast<int64_t>(it[j]) * D + d) * I;
    }
    float a[RPW];
    down_dots<W, VEC, RPW>(h + p * I, wr, I, lane, a);
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const float v = warp_sum(a[r]);
      if (lane == 0) dots[s * kDownRows + g * RPW + r] = v;
    }
  }
  __syncthreads();
  const int r = threadIdx.x;
  if (r < kDownRows && dblk + r < D) {
    float acc = 0.0f;
    for (int s = 0; s < n; ++s) {
      acc = __fadd_rn(acc, __fmul_rn(dots[s * kDownRows + r], topk_w[t * top_k + order[s]]));
    }
    if (sh.down) acc = __fadd_rn(dots[n * kDownRows + r], acc);
    y[t * D + dblk + r] = acc;
  }
}

// Kernel B's dynamic shared memory for top_k slots (+ the shared expert's).
size_t down_smem(int top_k) {
  return (sizeof(int) + sizeof(float) * kDownRows) * (static_cast<size_t>(top_k) + 1);
}

template <typename W, bool VEC>
int launch_moe_down(MemraCudaCtx* ctx, int T, int top_k, const float* h, const int32_t* topk_idx,
                    const float* topk_w, const W* dw, int E, int I, int D, float* y,
                    const SharedExpert<W>& sh) {
  constexpr int RPW = kDownRowsPerWarp;
  const dim3 grid(static_cast<unsigned>(T), ceil_div(D, kDownRows));
  return memra::cuda::launch(ctx, true, moe_down_kernel<W, VEC, RPW>, grid, dim3(kWarps * 32),
                             down_smem(top_k), h, topk_idx, topk_w, top_k, dw, E, I, D, y,
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

// The per-pair kernels' launch limits for T tokens of `slots` expert slots each (top_k, or
// top_k + 1 with a shared expert): the slot count fits a grid's x, the row blocks of I and D its
// y, the ordered slots one block's static shared memory.
bool per_pair_fits(int T, int slots, int top_k, int I, int D) {
  return static_cast<int64_t>(T) * slots <= 0x7fffffffLL && ceil_div(I, kWarps) <= 65535u &&
         ceil_div(D, kDownRows) <= 65535u && down_smem(top_k) <= 48 * 1024;
}

// The token count from which the grouped path takes over (the context's options; a large
// value keeps the per-pair kernels at every T, for comparisons).
int grouped_min_t(const MemraCudaCtx* ctx) { return ctx->options.moe_grouped_min_t; }

// Which path a call of moe_forward's routed experts takes: the per-pair kernels, the CUDA-core
// grouped kernels, or their tensor-core arm (bf16 / f16 weights, moe_tensor_cores).
enum class Arm { kPerPair, kGrouped, kTensorCores };
Arm routed_arm(const MemraCudaCtx* ctx, int T, int D, int top_k, int w_dtype, const void* gate_w,
               const void* up_w, const void* down_w, int E, int I) {
  if (T < grouped_min_t(ctx)) return Arm::kPerPair;
  if (memra::cuda::moe::tc_fits(ctx, T, D, top_k, w_dtype, gate_w, up_w, down_w, E, I)) {
    return Arm::kTensorCores;
  }
  return memra::cuda::moe::grouped_fits(T, top_k, E) ? Arm::kGrouped : Arm::kPerPair;
}

// memra_cuda_moe_forward without a shared expert. xr: null, or [T, D] of the weights' type that
// receives x rounded, where the tensor-core arm runs (it rounds x anyway; the caller reads it).
int moe_forward_impl(MemraCudaCtx* ctx, const float* x, int T, int D, const int32_t* topk_idx,
                     const float* topk_w, int top_k, const void* gate_w, const void* up_w,
                     const void* down_w, int w_dtype, int E, int I, float limit, float* y,
                     void* xr = nullptr) {
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
  switch (routed_arm(ctx, T, D, top_k, w_dtype, gate_w, up_w, down_w, E, I)) {
    case Arm::kTensorCores:
      return memra::cuda::moe::forward_tc(ctx, x, xr, T, D, topk_idx, topk_w, top_k, gate_w,
                                          up_w, down_w, w_dtype, E, I, limit, y);
    case Arm::kGrouped:
      return memra::cuda::moe::forward_grouped(ctx, x, T, D, topk_idx, topk_w, top_k, gate_w,
                                               up_w, down_w, w_dtype, E, I, limit, y);
    case Arm::kPerPair:
      break;
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

// memra_cuda_moe_forward with a shared expert (any of its weights given).
int moe_forward_shared_impl(MemraCudaCtx* ctx, const float* x, int T, int D,
                            const int32_t* topk_idx, const float* topk_w, int top_k,
                            const void* gate_w, const void* up_w, const void* down_w, int w_dtype,
                            int E, int I, float limit, const void* shared_gate_w,
                            const void* shared_up_w, const void* shared_down_w, int shared_I,
                            float shared_limit, float* y) {
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
                     routed_arm(ctx, T, D, top_k, w_dtype, gate_w, up_w, down_w, E, I) ==
                         Arm::kPerPair &&
                     per_pair_fits(T, top_k + 1, top_k, I, D);
  if (!fused) {
    Scratch routed(ctx, sizeof(float) * static_cast<size_t>(T) * D);
    MEMRA_CUDA_RETURN_IF(routed.status());
    // Where the routed experts run on tensor cores and the shared expert's GEMMs would round x
    // too (more than MEMRA_GEMV_MAX_ROWS rows, 16-bit weights), the routed path leaves its
    // rounded x in xr and the shared expert reads it: the bytes each would round it to, one
    // launch fewer.
    const bool round_once =
        T > MEMRA_GEMV_MAX_ROWS && w_dtype != 0 && topk_idx && topk_w && gate_w && up_w &&
        down_w && top_k > 0 && I > 0 && E > 0 &&
        routed_arm(ctx, T, D, top_k, w_dtype, gate_w, up_w, down_w, E, I) == Arm::kTensorCores;
    Scratch xr(ctx, round_once ? sizeof(uint16_t) * static_cast<size_t>(T) * D : 0);
    MEMRA_CUDA_RETURN_IF(xr.status());
    MEMRA_CUDA_RETURN_IF(moe_forward_impl(ctx, x, T, D, topk_idx, topk_w, top_k, gate_w, up_w,
                                          down_w, w_dtype, E, I, limit, routed.as<float>(),
                                          round_once ? xr.as<void>() : nullptr));
    if (round_once) {
      return memra::cuda::swiglu_mlp_rounded(ctx, x, xr.as<void>(), T, D, shared_gate_w,
                                             shared_up_w, shared_down_w, w_dtype, shared_I,
                                             shared_limit, routed.as<float>(), y);
    }
    MemraMlpParams mlp{};
    mlp.x = x;
    mlp.T = T;
    mlp.D = D;
    mlp.gate_w = shared_gate_w;
    mlp.up_w = shared_up_w;
    mlp.down_w = shared_down_w;
    mlp.w_dtype = w_dtype;
    mlp.I = shared_I;
    mlp.limit = shared_limit;
    mlp.add = routed.as<float>();
    mlp.y = y;
    return memra_cuda_swiglu_mlp(ctx, &mlp);
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

}  // namespace

extern "C" int memra_cuda_moe_forward(MemraCudaCtx* ctx, const MemraMoeForwardParams* p) {
  if (!p) {  // the context's own check first, as every entry makes it
    const int rc = memra::cuda::enter_keep(ctx);
    return rc != memra::kOk ? rc : memra::kContractMissing;
  }
  if (p->shared_gate_w || p->shared_up_w || p->shared_down_w) {
    return moe_forward_shared_impl(ctx, p->x, p->T, p->D, p->topk_idx, p->topk_w, p->top_k,
                                   p->gate_w, p->up_w, p->down_w, p->w_dtype, p->E, p->I,
                                   p->limit, p->shared_gate_w, p->shared_up_w, p->shared_down_w,
                                   p->shared_I, p->shared_limit, p->y);
  }
  return moe_forward_impl(ctx, p->x, p->T, p->D, p->topk_idx, p->topk_w, p->top_k, p->gate_w,
                          p->up_w, p->down_w, p->w_dtype, p->E, p->I, p->limit, p->y);
}
