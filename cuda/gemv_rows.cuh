// The decode GEMV's row body (cuda/gemv.cu, which documents the layout and the order of the
// sums): gemv_rows computes R weight rows of one block over the whole K, and launch_gemv launches
// a GEMV kernel with a pending deferred Sinkhorn riding in it. Shared with the fused router of
// cuda/moe_route.cu (memra_cuda_moe_route at one token), so its logits are the GEMV's bits.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "sinkhorn.cuh"

namespace memra::cuda::gemv_rows_detail {

constexpr int kGemvThreads = 256;
// Rows of at most kShortMaxV 16-byte vectors take gemv_short_kernel (cuda/gemv.cu), not
// gemv_rows: another order of the sums.
constexpr int kShortMaxV = 32;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvP = 2;  // 16-byte weight vectors per row and thread per chunk
// Rows of at most kGemvThreads vectors (K <= 2048 bf16: MLA's q_b, K 1536) take P = 1: the
// second vector of every row was never loaded, but its registers halved the blocks an SM holds.
// The loads and sums are the same at P = 1 and 2 (one chunk, vector tid), so are the bytes.
__host__ __device__ constexpr int vectors_per_chunk_thread(int KV) {
  return KV <= kGemvThreads ? 1 : kGemvP;
}

// A 16-byte weight load that skips L1 (each weight byte is read once per call).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
// f32 -> bf16 (RNE) -> f32: the value cpu::linear multiplies after rounding x.
__device__ __forceinline__ float round_bf16(float v) { return memra::cuda::rounded<__nv_bfloat16>(v); }

// The E = 16 / sizeof(W) x values of row t at vector v, as f32 (rounded to bf16 for a bf16 w).
template <typename W, typename X>
__device__ __forceinline__ void load_x(const X* __restrict__ xr, int v, float* out);
template <>
__device__ __forceinline__ void load_x<__nv_bfloat16, float>(const float* __restrict__ xr, int v,
                                                             float* out) {
  const float4 a = reinterpret_cast<const float4*>(xr)[2 * v];
  const float4 b = reinterpret_cast<const float4*>(xr)[2 * v + 1];
  out[0] = round_bf16(a.x);
  out[1] = round_bf16(a.y);
  out[2] = round_bf16(a.z);
  out[3] = round_bf16(a.w);
  out[4] = round_bf16(b.x);
  out[5] = round_bf16(b.y);
  out[6] = round_bf16(b.z);
  out[7] = round_bf16(b.w);
}
template <>
__device__ __forceinline__ void load_x<__nv_bfloat16, __nv_bfloat16>(
    const __nv_bfloat16* __restrict__ xr, int v, float* out) {
  const uint4 u = reinterpret_cast<const uint4*>(xr)[v];
  out[0] = bf16_lo(u.x);
  out[1] = bf16_hi(u.x);
  out[2] = bf16_lo(u.y);
  out[3] = bf16_hi(u.y);
  out[4] = bf16_lo(u.z);
  out[5] = bf16_hi(u.z);
  out[6] = bf16_lo(u.w);
  out[7] = bf16_hi(u.w);
}
template <>
__device__ __forceinline__ void load_x<float, float>(const float* __restrict__ xr, int v,
                                                     float* out) {
  const float4 a = reinterpret_cast<const float4*>(xr)[v];
  out[0] = a.x;
  out[1] = a.y;
  out[2] = a.z;
  out[3] = a.w;
}

// acc += dot(weight vector wv, xs[0 .. E)).
template <typename W>
__device__ __forceinline__ float dot16(uint4 wv, const float* xs, float acc);
template <>
__device__ __forceinline__ float dot16<__nv_bfloat16>(uint4 wv, const float* xs, float acc) {
  acc = fmaf(bf16_lo(wv.x), xs[0], acc);
  acc = fmaf(bf16_hi(wv.x), xs[1], acc);
  acc = fmaf(bf16_lo(wv.y), xs[2], acc);
  acc = fmaf(bf16_hi(wv.y), xs[3], acc);
  acc = fmaf(bf16_lo(wv.z), xs[4], acc);
  acc = fmaf(bf16_hi(wv.z), xs[5], acc);
  acc = fmaf(bf16_lo(wv.w), xs[6], acc);
  acc = fmaf(bf16_hi(wv.w), xs[7], acc);
  return acc;
}
template <>
__device__ __forceinline__ float dot16<float>(uint4 wv, const float* xs, float acc) {
  acc = fmaf(__uint_as_float(wv.x), xs[0], acc);
  acc = fmaf(__uint_as_float(wv.y), xs[1], acc);
  acc = fmaf(__uint_as_float(wv.z), xs[2], acc);
  acc = fmaf(__uint_as_float(wv.w), xs[3], acc);
  return acc;
}

// Block `blk`: weight rows [blk * R, blk * R + R) of w [N, K] (row-major, K % E == 0, 16-byte
// aligned) over the whole K, in chunks of P * kGemvThreads vectors (P: vectors_per_chunk_thread);
// x [1, K] (ldx unused at one row), y [1, N]. prefetch: the first chunk's weights are loaded
// before pdl_wait (the caller guarantees no queued kernel writes w), so they stream while the
// previous kernel finishes.
// Out: the block's rows and what becomes of their sums: PlainRows (rows [blk * R, blk * R + R),
// y[n] = sum (+ bias[n])) or SwigluRows (below).
struct PlainRows {
  __device__ __forceinline__ int row(int blk, int r, int R) const { return blk * R + r; }
  __device__ __forceinline__ bool in(int blk, int r, int R, int N) const { return blk * R + r < N; }
};

template <typename W, typename X, int R, int P, typename Out = PlainRows>
__device__ __forceinline__ void gemv_rows(const X* __restrict__ x, const W* __restrict__ w, int K,
                                          int N, const float* __restrict__ bias,
                                          float* __restrict__ y, int prefetch, int blk,
                                          const Out& out = Out()) {
  constexpr int E = 16 / sizeof(W);
  constexpr int kChunk = P * kGemvThreads;  // vectors per row per chunk
  __shared__ float red[kGemvWarps][R];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int KV = K / E;
  const int n0 = blk * R;
  const uint4* rows[R];
  bool row_in[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    row_in[r] = out.in(blk, r, R, N);
    rows[r] = reinterpret_cast<const uint4*>(w + int64_t(row_in[r] ? out.row(blk, r, R)
                                                                   : out.row(blk, 0, R)) * K);
  }
  uint4 wv[R][P];
  auto load_chunk = [&](int base) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int v = base + p * kGemvThreads + tid;
        wv[r][p] = (row_in[r] && v < KV) ? ld_stream(rows[r] + v) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  if (prefetch) load_chunk(0);
  pdl_wait();  // x and y belong to the stream's earlier work
  pdl_trigger();
  if (!prefetch) load_chunk(0);

  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int base = 0; base < KV; base += kChunk) {
    if (base > 0) load_chunk(base);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int v = base + p * kGemvThreads + tid;
      if (v >= KV) break;
      float xs[E];
      load_x<W, X>(x, v, xs);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = dot16<W>(wv[r][p], xs, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = warp_sum(acc[r]);
    if (lane == 0) red[warp][r] = s;
  }
  __syncthreads();
  if constexpr (std::is_same_v<Out, PlainRows>) {
    if (tid < R && n0 + tid < N) {
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < kGemvWarps; ++k) s += red[k][tid];
      if (bias) s += bias[n0 + tid];
      y[n0 + tid] = s;
    }
  } else {
    out.store(red, tid, blk);
  }
}

// The fused gate|up GEMV of a SwiGLU MLP at one row (memra_cuda_swiglu_mlp at T = 1):
// w = [gate; up] [2I, D]; block blk takes gate rows i = blk * R/2 + r and the up rows I + i
// (r < R/2), each summed as a PlainRows row is (warps in order, no bias), and thread r < R/2
// stores h[i] = act(gate, up) (Act: the MLP's clamped SwiGLU, rounded to H as swiglu_pair_kernel
// stores it), so h's bytes are those of the GEMV then swiglu_pair_kernel.
template <typename H, typename Act>
struct SwigluRows {  // R (the block's rows): even, >= 2 (a gate row and its up row in one block)
  H* h;
  int I;
  Act act;
  __device__ __forceinline__ int row(int blk, int r, int R) const {
    const int i = blk * (R / 2) + (r < R / 2 ? r : r - R / 2);
    return r < R / 2 ? i : I + i;
  }
  __device__ __forceinline__ bool in(int blk, int r, int R, int) const {
    return blk * (R / 2) + (r < R / 2 ? r : r - R / 2) < I;
  }
  template <int R>
  __device__ __forceinline__ void store(const float (&red)[kGemvWarps][R], int tid,
                                        int blk) const {
    static_assert(R >= 2 && R % 2 == 0, "SwigluRows: gate and up rows in pairs");
    const int i = blk * (R / 2) + tid;
    if (tid < R / 2 && i < I) {
      float g = 0.0f, u = 0.0f;
#pragma unroll
      for (int k = 0; k < kGemvWarps; ++k) g += red[k][tid];
#pragma unroll
      for (int k = 0; k < kGemvWarps; ++k) u += red[k][tid + R / 2];
      act(h + i, g, u);
    }
  }
};

// One GEMV problem of a launch: y[N] = w[N, K] x (+ bias), K shared by the launch.
template <typename W, typename X>
struct GemvRows {
  const X* x;
  const W* w;
  const float* bias;
  float* y;
  int N;
};

// f(std::integral_constant<int, L>) for the lanes a short row of KV vectors takes: KV rounded up
// to a power of two, at most 32 (gemv_short_rows' L).
template <typename F>
int with_short_lanes(int KV, F&& f) {
  if (KV <= 1) return f(std::integral_constant<int, 1>());
  if (KV <= 2) return f(std::integral_constant<int, 2>());
  if (KV <= 4) return f(std::integral_constant<int, 4>());
  if (KV <= 8) return f(std::integral_constant<int, 8>());
  if (KV <= 16) return f(std::integral_constant<int, 16>());
  return f(std::integral_constant<int, 32>());
}

// Short rows (K <= kShortMaxV vectors; the KDA f_b / g_b up-projections have K = 128 bf16 = 16):
// L = KV rounded up to a power of two lanes share a row, lane j holding vector j; a block of
// THREADS threads covers THREADS / L rows a pass and RPT passes, block `blk` rows
// (blk * RPT + r) * (THREADS / L) + tid / L (r < RPT), with one load a row and thread. A row's
// L partial dots (each from 0, E products in order) meet in the L-lane butterfly: the order
// depends on K alone, not on THREADS, RPT or N. The body of gemv_short_kernel (cuda/gemv.cu) and
// of the KDA decode conv's launch that carries f_b | g_b (cuda/kda.cu). Every thread of the block
// calls it (pdl_wait / trigger inside).
template <typename W, typename X, int L, int THREADS, int RPT>
__device__ __forceinline__ void gemv_short_rows(const X* __restrict__ x, const W* __restrict__ w,
                                                const float* __restrict__ bias,
                                                float* __restrict__ y, int N, int K, int prefetch,
                                                int blk) {
  static_assert(L >= 1 && L <= 32 && (L & (L - 1)) == 0, "L: a power of two <= 32");
  constexpr int E = 16 / sizeof(W);
  constexpr int kRows = THREADS / L;
  const int tid = threadIdx.x, lane = tid % L;
  const int KV = K / E;
  int n[RPT];
  uint4 wv[RPT];
  const uint4* row[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r) {
    n[r] = (blk * RPT + r) * kRows + tid / L;
    row[r] = reinterpret_cast<const uint4*>(w + int64_t(n[r] < N ? n[r] : 0) * K);
    wv[r] = make_uint4(0, 0, 0, 0);
    if (prefetch && n[r] < N && lane < KV) wv[r] = ld_stream(row[r] + lane);
  }
  pdl_wait();  // x and y belong to the stream's earlier work
  pdl_trigger();
#pragma unroll
  for (int r = 0; r < RPT; ++r) {
    if (!prefetch && n[r] < N && lane < KV) wv[r] = ld_stream(row[r] + lane);
  }
  float xs[E];
  if (lane < KV) load_x<W, X>(x, lane, xs);
#pragma unroll
  for (int r = 0; r < RPT; ++r) {
    float acc = n[r] < N && lane < KV ? dot16<W>(wv[r], xs, 0.0f) : 0.0f;
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0 && n[r] < N) {
      if (bias) acc += bias[n[r]];
      y[n[r]] = acc;
    }
  }
}

// Launches a GEMV kernel (its last parameter a SinkTask) over `blocks` blocks of kGemvThreads;
// a pending deferred Sinkhorn (common.cuh) rides in the launch as one extra block, block 0, and
// is pending again if the launch fails.
// smem: dynamic shared memory bytes a block.
template <typename... P, typename... A>
int launch_gemv_smem(MemraCudaCtx* ctx, void (*kernel)(P...), int blocks, size_t smem,
                     A... args) {
  const SinkTask task = take_pending(ctx);
  const unsigned grid = static_cast<unsigned>(blocks) + (task.comb ? 1u : 0u);
  return settle_pending(
      ctx, task, launch(ctx, true, kernel, dim3(grid), dim3(kGemvThreads), smem, args..., task));
}
template <typename... P, typename... A>
int launch_gemv(MemraCudaCtx* ctx, void (*kernel)(P...), int blocks, A... args) {
  return launch_gemv_smem(ctx, kernel, blocks, 0, args...);
}

}  // namespace memra::cuda::gemv_rows_detail
