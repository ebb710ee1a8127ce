// The routed experts grouped by expert (cuda_abi/moe.h `moe_forward`; cuda/moe_experts.cu holds
// the entry point and the per-pair kernels that run below KernelOptions::moe_grouped_min_t;
// cuda/moe_tc.cu the tensor-core arm for bf16 / f16 weights, which shares the grouping and the
// combine kernels below).
//
// From T = 2 (the default of KernelOptions::moe_grouped_min_t) the experts run grouped (f32
// weights, or KernelOptions::moe_tensor_cores off, or a geometry moe_tc.cu does not take), so
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
using memra::cuda::cp_async_16;
using memra::cuda::cp_async_4;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait_all;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::to_f32;
using memra::cuda::warp_sum;
using memra::cuda::moe::order_slots;

namespace {

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
  for (int t0 = 0; t0 < T; t0 += Tc) {
    const int tn = T - t0 < Tc ? T - t0 : Tc;
    const int P = tn * top_k;
    const int S = E < P ? E : P;
    const int32_t* idx = topk_idx + static_cast<int64_t>(t0) * top_k;
    MEMRA_CUDA_RETURN_IF(memra::cuda::moe::group_pairs(ctx, idx, P, E, warps, n_active, active_e,
                                                       active_off, pairs));
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
    MEMRA_CUDA_RETURN_IF(memra::cuda::moe::combine(ctx, o.as<float>(), idx,
                                                   topk_w + static_cast<int64_t>(t0) * top_k, tn,
                                                   top_k, E, D, y + static_cast<int64_t>(t0) * D));
  }
  return memra::kOk;
}

}  // namespace

namespace memra::cuda::moe {

int pair_group_warps(int64_t P, int E) { return group_warps(P, E); }

int group_pairs(MemraCudaCtx* ctx, const int32_t* topk_idx, int P, int E, int warps,
                int* n_active, int* active_e, int* active_off, int* pairs) {
  memra::cuda::launch(ctx, true, moe_group_kernel, dim3(1), dim3(warps * 32),
      sizeof(int) * static_cast<size_t>(warps + 1) * E, topk_idx, P, E, n_active, active_e,
      active_off, pairs);
  return launch_status();
}

int combine(MemraCudaCtx* ctx, const float* o, const int32_t* topk_idx, const float* topk_w,
            int T, int top_k, int E, int D, float* y) {
  const dim3 grid(static_cast<unsigned>(T), ceil_div(D, 256));
  memra::cuda::launch(ctx, true, moe_combine_kernel, grid, dim3(256),
      sizeof(int) * (static_cast<size_t>(top_k) + 1), o, topk_idx, topk_w, top_k, E, D, y);
  return launch_status();
}

bool grouped_fits(int T, int top_k, int E) {
  const int64_t Pc = static_cast<int64_t>(T < kGChunkT ? T : kGChunkT) * top_k;
  const int64_t S = E < Pc ? E : Pc;
  return S <= 65535 && group_warps(Pc, E) > 0;
}

int forward_grouped(MemraCudaCtx* ctx, const float* x, int T, int D, const int32_t* topk_idx,
                    const float* topk_w, int top_k, const void* gate_w, const void* up_w,
                    const void* down_w, int w_dtype, int E, int I, float limit, float* y) {
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

}  // namespace memra::cuda::moe
