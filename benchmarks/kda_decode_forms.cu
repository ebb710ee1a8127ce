// Which form of the KDA decode step (T = 1, 128 x 128 f32 state a head) streams closest to a copy?
// cuda/kda_decode_lines.cu's TABLES / STRIDED kernel (a block = one 32-column quarter of a head,
// 128 threads, 8 float4 of state a lane, ld/st.global.cs, each row quad stored as soon as final)
// measured 0.84 / 0.87 of copy at B = 64 / 256 (64 heads) where fla's fused_recurrent_kda, the
// same tiling in Triton, reached 0.92. This file times that kernel's arithmetic in several forms
// against two copies of the same bytes, so the difference can be pinned on one property:
//   parts     32-column quarters a block (1, 2 or 4: 128, 256 or 512 threads; the quarters of a
//             head then read whole 512-byte rows from one SM)
//   ld        0 ld.global.cs (main), 1 ld.global (default policy), 2 ld.global.L2::256B,
//             3 ld.global.nc.L1::no_allocate
//   st        0 st.global.cs (main), 1 st.global
//   defer     0 each row quad stored in the update loop (main), 1 all stores after o's partials
//   minb      the launch bound's blocks an SM (a register cap), 0 = none
// and two copies: "copy_shaped" (a block of 128 threads moves a quarter plane exactly as the
// kernel does, load all then store all, no arithmetic) and cudaMemcpyAsync of the whole state.
// Session 33 added copies in three lane layouts with the kernel's policies (copy_shaped,
// copy_rows, copy_hrows ld=2 st=1) and two other layouts of the whole step: "rows" (a block of
// 512 threads a head, a warp instruction one 512-byte row) and "hrows" (a block of 256 threads
// a half head, 2 rows x 256 bytes an instruction).
// Every form computes the same operations in the same order as main's, so its o and state must
// equal main's bit for bit (checked; "bits_equal" in each line).
// Standalone: nvcc -O3 -std=c++17 -arch=sm_90a benchmarks/kda_decode_forms.cu -o /tmp/kdf && /tmp/kdf [H]
// (H: heads, default 64; main's kernel was the form "parts=1 ld=2 st=1 defer=0 minb=8" from
// session 7 to 33; since then its TABLES / STRIDED form is "hrows ld=1 st=1" and its SLOTS form
// keeps the quarters.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "check.h"

constexpr int kDk = 128, kDv = 128, kCols = 32, kWarps = 4;

template <int LD>
__device__ __forceinline__ float4 ld_state(const float* p) {
  float4 x;
  if constexpr (LD == 0) {
    x = __ldcs(reinterpret_cast<const float4*>(p));
  } else if constexpr (LD == 1) {
    asm volatile("ld.global.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w) : "l"(p));
  } else if constexpr (LD == 2) {
    asm volatile("ld.global.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w) : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w) : "l"(p));
  }
  return x;
}

template <int ST>
__device__ __forceinline__ void st_state(float* p, float4 x) {
  if constexpr (ST == 0) {
    __stcs(reinterpret_cast<float4*>(p), x);
  } else {
    *reinterpret_cast<float4*>(p) = x;
  }
}

__device__ __forceinline__ float chain_combine(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 16));
}

template <int PARTS>
__device__ __forceinline__ void part_sync(int part) {
  if constexpr (PARTS == 1) {
    __syncthreads();
  } else {
    switch (part) {  // immediate ids: ptxas then reserves 5 barriers, not all 16
      case 0: asm volatile("bar.sync 1, 128;" ::: "memory"); break;
      case 1: asm volatile("bar.sync 2, 128;" ::: "memory"); break;
      case 2: asm volatile("bar.sync 3, 128;" ::: "memory"); break;
      default: asm volatile("bar.sync 4, 128;" ::: "memory"); break;
    }
  }
}

__device__ __forceinline__ float4 column_sums(const float (*red)[kCols], int cq) {
  const float4 w0 = *reinterpret_cast<const float4*>(&red[0][4 * cq]);
  const float4 w1 = *reinterpret_cast<const float4*>(&red[1][4 * cq]);
  const float4 w2 = *reinterpret_cast<const float4*>(&red[2][4 * cq]);
  const float4 w3 = *reinterpret_cast<const float4*>(&red[3][4 * cq]);
  return make_float4(__fadd_rn(__fadd_rn(w0.x, w1.x), __fadd_rn(w2.x, w3.x)),
                     __fadd_rn(__fadd_rn(w0.y, w1.y), __fadd_rn(w2.y, w3.y)),
                     __fadd_rn(__fadd_rn(w0.z, w1.z), __fadd_rn(w2.z, w3.z)),
                     __fadd_rn(__fadd_rn(w0.w, w1.w), __fadd_rn(w2.w, w3.w)));
}

// q, k, g [B, H, dk]; v, o [B, H, dv]; beta [B, H]; sin, sout [B, H, dk, dv]. Grid B * H * 4 /
// PARTS blocks of 128 PARTS threads; block = (b, h, PARTS consecutive quarters).
template <int PARTS, int LD, int ST, bool DEFER, int MINB>
__global__ void __launch_bounds__(128 * PARTS, MINB) step_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float scale,
    const float* __restrict__ sin, float* __restrict__ sout, float* __restrict__ o) {
  constexpr int kBlockCols = PARTS * kCols;
  __shared__ __align__(16) float vec[3][kDk];
  __shared__ __align__(16) float vcol[kBlockCols];
  __shared__ __align__(16) float red[PARTS][2][kWarps][kCols];
  __shared__ float beta_s;
  const int t = threadIdx.x, tp = t & 127, lane = t & 31, warp = tp >> 5;
  const int cq = lane & 7, e = lane >> 3;
  const int blocks_a_head = 4 / PARTS;
  const int64_t bh = blockIdx.x / blocks_a_head;
  const int part_in_block = t >> 7;
  const int jb = static_cast<int>(blockIdx.x % blocks_a_head) * kBlockCols;
  const int j0 = jb + part_in_block * kCols + 4 * cq;
  const int64_t my_off = bh * kDk * kDv + static_cast<int64_t>(32 * warp + e) * kDv + j0;

  float S[2][4][4];
#pragma unroll
  for (int gl = 0; gl < 2; ++gl) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const float4 x = ld_state<LD>(sin + my_off + static_cast<int64_t>(16 * gl + 4 * m) * kDv);
      S[gl][m][0] = x.x;
      S[gl][m][1] = x.y;
      S[gl][m][2] = x.z;
      S[gl][m][3] = x.w;
    }
  }
  if (t < kDk) {
    vec[0][t] = __ldg(k + bh * kDk + t);
    vec[1][t] = __fmul_rn(__ldg(q + bh * kDk + t), scale);
    vec[2][t] = expf(__ldg(g + bh * kDk + t));
  }
  if (t < kBlockCols) vcol[t] = __ldg(v + bh * kDv + jb + t);
  if (t == 0) beta_s = __ldg(beta + bh);
  __syncthreads();

  float(*const rd)[kWarps][kCols] = red[part_in_block];
  const int r0 = 32 * warp + e;
  float P[4][2];
#pragma unroll
  for (int gl = 0; gl < 2; ++gl) {
    float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int r = r0 + 16 * gl + 4 * m;
      const float kk = vec[0][r], ee = vec[2][r];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        S[gl][m][c] = __fmul_rn(S[gl][m][c], ee);
        ch[c] = __fadd_rn(ch[c], __fmul_rn(S[gl][m][c], kk));
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) P[c][gl] = chain_combine(ch[c]);
  }
  if (e == 0) {
    *reinterpret_cast<float4*>(&rd[0][warp][4 * cq]) =
        make_float4(__fadd_rn(P[0][0], P[0][1]), __fadd_rn(P[1][0], P[1][1]),
                    __fadd_rn(P[2][0], P[2][1]), __fadd_rn(P[3][0], P[3][1]));
  }
  part_sync<PARTS>(part_in_block);
  float d[4];
  {
    const float4 kv = column_sums(rd[0], cq);
    const float4 vv = *reinterpret_cast<const float4*>(&vcol[j0 - jb]);
    const float bb = beta_s;
    d[0] = __fmul_rn(__fsub_rn(vv.x, kv.x), bb);
    d[1] = __fmul_rn(__fsub_rn(vv.y, kv.y), bb);
    d[2] = __fmul_rn(__fsub_rn(vv.z, kv.z), bb);
    d[3] = __fmul_rn(__fsub_rn(vv.w, kv.w), bb);
  }
#pragma unroll
  for (int gl = 0; gl < 2; ++gl) {
    float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int r = r0 + 16 * gl + 4 * m;
      const float kk = vec[0][r], qq = vec[1][r];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        S[gl][m][c] = __fadd_rn(S[gl][m][c], __fmul_rn(kk, d[c]));
        ch[c] = __fadd_rn(ch[c], __fmul_rn(S[gl][m][c], qq));
      }
      if constexpr (!DEFER) {
        st_state<ST>(sout + my_off + static_cast<int64_t>(16 * gl + 4 * m) * kDv,
                     make_float4(S[gl][m][0], S[gl][m][1], S[gl][m][2], S[gl][m][3]));
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) P[c][gl] = chain_combine(ch[c]);
  }
  if (e == 0) {
    *reinterpret_cast<float4*>(&rd[1][warp][4 * cq]) =
        make_float4(__fadd_rn(P[0][0], P[0][1]), __fadd_rn(P[1][0], P[1][1]),
                    __fadd_rn(P[2][0], P[2][1]), __fadd_rn(P[3][0], P[3][1]));
  }
  if constexpr (DEFER) {
#pragma unroll
    for (int gl = 0; gl < 2; ++gl) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        st_state<ST>(sout + my_off + static_cast<int64_t>(16 * gl + 4 * m) * kDv,
                     make_float4(S[gl][m][0], S[gl][m][1], S[gl][m][2], S[gl][m][3]));
      }
    }
  }
  part_sync<PARTS>(part_in_block);
  if (tp < kCols / 4) *reinterpret_cast<float4*>(o + bh * kDv + j0) = column_sums(rd[1], cq);
}

// The kernel's bytes without its arithmetic: a block of 128 threads moves one quarter plane in
// the kernel's lane layout, every load issued before the first store.
__global__ void __launch_bounds__(128, 8) copy_shaped_kernel(const float* __restrict__ sin,
                                                             float* __restrict__ sout) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, cq = lane & 7, e = lane >> 3;
  const int64_t bh = blockIdx.x / 4;
  const int j0 = static_cast<int>(blockIdx.x % 4) * kCols + 4 * cq;
  const int64_t off = bh * kDk * kDv + static_cast<int64_t>(32 * warp + e) * kDv + j0;
  float4 x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = __ldcs(reinterpret_cast<const float4*>(sin + off + (16 * (i >> 2) + 4 * (i & 3)) * kDv));
#pragma unroll
  for (int i = 0; i < 8; ++i) __stcs(reinterpret_cast<float4*>(sout + off + (16 * (i >> 2) + 4 * (i & 3)) * kDv), x[i]);
}

// A copy of the state in other lane layouts, with main's load / store policies (L2::256B, default):
// ROWS 0, the kernel's (a block of 128 threads a quarter plane, a warp instruction 4 rows x 128
// bytes); ROWS 1, the rows form's below (a block of 512 threads a head, a warp instruction one
// whole 512-byte row, a warp the rows 16 g + 4 m + e of two chains e).
template <int ROWS>
constexpr int copy_threads() { return ROWS == 1 ? 512 : ROWS == 2 ? 256 : 128; }
template <int ROWS>
__global__ void __launch_bounds__(copy_threads<ROWS>(), 65536 / 64 / copy_threads<ROWS>()) copy_policy_kernel(
    const float* __restrict__ sin, float* __restrict__ sout) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  int64_t off;
  int stride_m, stride_i;  // rows between a lane's loads: m (4 of them) and the second index (2)
  if constexpr (ROWS == 2) {
    off = int64_t(blockIdx.x / 2) * kDk * kDv + int64_t(16 * warp + (lane >> 4)) * kDv +
          64 * int(blockIdx.x % 2) + 4 * (lane & 15);
    stride_m = 4;
    stride_i = 2;
  } else if constexpr (ROWS == 1) {
    off = int64_t(blockIdx.x) * kDk * kDv + int64_t(16 * (warp >> 1) + 2 * (warp & 1)) * kDv + 4 * lane;
    stride_m = 4;
    stride_i = 1;
  } else {
    const int cq = lane & 7, e = lane >> 3;
    off = int64_t(blockIdx.x / 4) * kDk * kDv + int64_t(32 * warp + e) * kDv +
          int(blockIdx.x % 4) * kCols + 4 * cq;
    stride_m = 4;
    stride_i = 16;
  }
  float4 x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = ld_state<2>(sin + off + int64_t((i >> 2) * stride_i + (i & 3) * stride_m) * kDv);
#pragma unroll
  for (int i = 0; i < 8; ++i) st_state<1>(sout + off + int64_t((i >> 2) * stride_i + (i & 3) * stride_m) * kDv, x[i]);
}

// The rows form (session 33): main's operations in main's order with a block of 512 threads a
// head and a warp instruction one whole 512-byte row. Warp w holds group g = w / 2 and the chains
// e = 2 (w % 2) + i (i < 2), lane l the columns 4 l .. 4 l + 3: a lane's chain sums over m are
// main's, the warp's pair (e0 + e1) or (e2 + e3) goes to shared memory, and 128 threads add
// the group partials and the groups in main's tree ((G0 + G1) + (G2 + G3)) + ((G4 + G5) +
// (G6 + G7)). One block barrier more than main's form (d crosses back to the lanes).
template <int LD, int ST>
__global__ void __launch_bounds__(512, 2) rows_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float scale,
    const float* __restrict__ sin, float* __restrict__ sout, float* __restrict__ o) {
  __shared__ __align__(16) float vec[3][kDk];
  __shared__ __align__(16) float red[16][kDv];
  __shared__ __align__(16) float dcol[kDv];
  __shared__ float beta_s;
  const int t = threadIdx.x, lane = t & 31, w = t >> 5;
  const int grp = w >> 1, e0 = 2 * (w & 1);
  const int64_t bh = blockIdx.x;
  const int64_t base = bh * kDk * kDv + int64_t(16 * grp + e0) * kDv + 4 * lane;
  float S[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const float4 x = ld_state<LD>(sin + base + int64_t(4 * m + i) * kDv);
      S[i][m][0] = x.x;
      S[i][m][1] = x.y;
      S[i][m][2] = x.z;
      S[i][m][3] = x.w;
    }
  }
  if (t < kDk) {
    vec[0][t] = __ldg(k + bh * kDk + t);
    vec[1][t] = __fmul_rn(__ldg(q + bh * kDk + t), scale);
    vec[2][t] = expf(__ldg(g + bh * kDk + t));
  }
  if (t == 0) beta_s = __ldg(beta + bh);
  __syncthreads();
  auto tree = [&](int j) {  // main's column order over the 16 warp pairs
    float G[8];
#pragma unroll
    for (int gg = 0; gg < 8; ++gg) G[gg] = __fadd_rn(red[2 * gg][j], red[2 * gg + 1][j]);
    return __fadd_rn(__fadd_rn(__fadd_rn(G[0], G[1]), __fadd_rn(G[2], G[3])),
                     __fadd_rn(__fadd_rn(G[4], G[5]), __fadd_rn(G[6], G[7])));
  };
  {
    float ch[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int r = 16 * grp + 4 * m + e0 + i;
        const float kk = vec[0][r], ee = vec[2][r];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          S[i][m][c] = __fmul_rn(S[i][m][c], ee);
          ch[i][c] = __fadd_rn(ch[i][c], __fmul_rn(S[i][m][c], kk));
        }
      }
    }
    *reinterpret_cast<float4*>(&red[w][4 * lane]) =
        make_float4(__fadd_rn(ch[0][0], ch[1][0]), __fadd_rn(ch[0][1], ch[1][1]),
                    __fadd_rn(ch[0][2], ch[1][2]), __fadd_rn(ch[0][3], ch[1][3]));
  }
  __syncthreads();
  if (t < kDv) dcol[t] = __fmul_rn(__fsub_rn(__ldg(v + bh * kDv + t), tree(t)), beta_s);
  __syncthreads();
  const float4 d4 = *reinterpret_cast<const float4*>(&dcol[4 * lane]);
  const float d[4] = {d4.x, d4.y, d4.z, d4.w};
  {
    float ch[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int r = 16 * grp + 4 * m + e0 + i;
        const float kk = vec[0][r], qq = vec[1][r];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          S[i][m][c] = __fadd_rn(S[i][m][c], __fmul_rn(kk, d[c]));
          ch[i][c] = __fadd_rn(ch[i][c], __fmul_rn(S[i][m][c], qq));
        }
        st_state<ST>(sout + base + int64_t(4 * m + i) * kDv,
                     make_float4(S[i][m][0], S[i][m][1], S[i][m][2], S[i][m][3]));
      }
    }
    *reinterpret_cast<float4*>(&red[w][4 * lane]) =
        make_float4(__fadd_rn(ch[0][0], ch[1][0]), __fadd_rn(ch[0][1], ch[1][1]),
                    __fadd_rn(ch[0][2], ch[1][2]), __fadd_rn(ch[0][3], ch[1][3]));
  }
  __syncthreads();
  if (t < kDv) o[bh * kDv + t] = tree(t);
}

// The half-rows form (session 33): a block of 256 threads a half head (64 columns), a warp
// instruction 2 rows x 256 bytes. Warp w holds group g = w, lane l the rows 16 w + 4 m + e with
// e = 2 i + l / 16 (i < 2) and the columns 4 (l % 16) .. + 3 of the half: the chain pairs
// (e0 + e1), (e2 + e3) by one shuffle, the group partial in the lane, the groups through shared
// memory in main's tree, each lane summing its own columns (main's barrier count).
template <int LD, int ST>
__global__ void __launch_bounds__(256, 4) hrows_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float scale,
    const float* __restrict__ sin, float* __restrict__ sout, float* __restrict__ o) {
  __shared__ __align__(16) float vec[3][kDk];
  __shared__ __align__(16) float vcol[64];
  __shared__ __align__(16) float red[2][8][64];
  __shared__ float beta_s;
  const int t = threadIdx.x, lane = t & 31, w = t >> 5, r2 = lane >> 4, c16 = lane & 15;
  const int64_t bh = blockIdx.x / 2;
  const int jb = 64 * int(blockIdx.x % 2);
  const int64_t base = bh * kDk * kDv + int64_t(16 * w + r2) * kDv + jb + 4 * c16;
  float S[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const float4 x = ld_state<LD>(sin + base + int64_t(4 * m + 2 * i) * kDv);
      S[i][m][0] = x.x;
      S[i][m][1] = x.y;
      S[i][m][2] = x.z;
      S[i][m][3] = x.w;
    }
  }
  if (t < kDk) {
    vec[0][t] = __ldg(k + bh * kDk + t);
    vec[1][t] = __fmul_rn(__ldg(q + bh * kDk + t), scale);
    vec[2][t] = expf(__ldg(g + bh * kDk + t));
  }
  if (t < 64) vcol[t] = __ldg(v + bh * kDv + jb + t);
  if (t == 0) beta_s = __ldg(beta + bh);
  __syncthreads();
  auto group_partial = [&](float (*rd)[64], const float (&ch)[2][4]) {
    float G[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float p01 = __fadd_rn(ch[0][c], __shfl_xor_sync(0xffffffffu, ch[0][c], 16));
      const float p23 = __fadd_rn(ch[1][c], __shfl_xor_sync(0xffffffffu, ch[1][c], 16));
      G[c] = __fadd_rn(p01, p23);
    }
    if (r2 == 0) *reinterpret_cast<float4*>(&rd[w][4 * c16]) = make_float4(G[0], G[1], G[2], G[3]);
  };
  auto tree = [&](const float (*rd)[64]) {
    float4 G[8];
#pragma unroll
    for (int gg = 0; gg < 8; ++gg) G[gg] = *reinterpret_cast<const float4*>(&rd[gg][4 * c16]);
    auto t8 = [](float a0, float a1, float a2, float a3, float a4, float a5, float a6, float a7) {
      return __fadd_rn(__fadd_rn(__fadd_rn(a0, a1), __fadd_rn(a2, a3)),
                       __fadd_rn(__fadd_rn(a4, a5), __fadd_rn(a6, a7)));
    };
    return make_float4(t8(G[0].x, G[1].x, G[2].x, G[3].x, G[4].x, G[5].x, G[6].x, G[7].x),
                       t8(G[0].y, G[1].y, G[2].y, G[3].y, G[4].y, G[5].y, G[6].y, G[7].y),
                       t8(G[0].z, G[1].z, G[2].z, G[3].z, G[4].z, G[5].z, G[6].z, G[7].z),
                       t8(G[0].w, G[1].w, G[2].w, G[3].w, G[4].w, G[5].w, G[6].w, G[7].w));
  };
  {
    float ch[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int r = 16 * w + 4 * m + 2 * i + r2;
        const float kk = vec[0][r], ee = vec[2][r];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          S[i][m][c] = __fmul_rn(S[i][m][c], ee);
          ch[i][c] = __fadd_rn(ch[i][c], __fmul_rn(S[i][m][c], kk));
        }
      }
    }
    group_partial(red[0], ch);
  }
  __syncthreads();
  float d[4];
  {
    const float4 kv = tree(red[0]);
    const float4 vv = *reinterpret_cast<const float4*>(&vcol[4 * c16]);
    const float bb = beta_s;
    d[0] = __fmul_rn(__fsub_rn(vv.x, kv.x), bb);
    d[1] = __fmul_rn(__fsub_rn(vv.y, kv.y), bb);
    d[2] = __fmul_rn(__fsub_rn(vv.z, kv.z), bb);
    d[3] = __fmul_rn(__fsub_rn(vv.w, kv.w), bb);
  }
  {
    float ch[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int r = 16 * w + 4 * m + 2 * i + r2;
        const float kk = vec[0][r], qq = vec[1][r];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          S[i][m][c] = __fadd_rn(S[i][m][c], __fmul_rn(kk, d[c]));
          ch[i][c] = __fadd_rn(ch[i][c], __fmul_rn(S[i][m][c], qq));
        }
        st_state<ST>(sout + base + int64_t(4 * m + 2 * i) * kDv,
                     make_float4(S[i][m][0], S[i][m][1], S[i][m][2], S[i][m][3]));
      }
    }
    group_partial(red[1], ch);
  }
  __syncthreads();
  if (t < 16) *reinterpret_cast<float4*>(o + bh * kDv + jb + 4 * c16) = tree(red[1]);
}

struct Bufs {
  float *q, *k, *v, *g, *beta, *sin, *sout, *o;
  int B, H;
};

template <typename F>
float time_us(F launch, int reps = 20, int rounds = 7) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> ts;
  for (int r = 0; r < rounds; ++r) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1000.0f / reps);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ts[ts.size() / 2];
}

std::vector<float> ref_o, ref_s;

template <int PARTS, int LD, int ST, bool DEFER, int MINB>
void run_form(const Bufs& x, double copy_us, bool first) {
  const size_t ns = size_t(x.B) * x.H * kDk * kDv, no = size_t(x.B) * x.H * kDv;
  const unsigned grid = static_cast<unsigned>(int64_t(x.B) * x.H * 4 / PARTS);
  auto launch = [&] {
    step_kernel<PARTS, LD, ST, DEFER, MINB><<<grid, 128 * PARTS>>>(
        x.q, x.k, x.v, x.g, x.beta, 0.08838834764831845f, x.sin, x.sout, x.o);
  };
  CK(cudaMemset(x.sout, 0, ns * 4));
  launch();
  CK(cudaDeviceSynchronize());
  std::vector<float> o(no), s(ns);
  CK(cudaMemcpy(o.data(), x.o, no * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(s.data(), x.sout, ns * 4, cudaMemcpyDeviceToHost));
  if (first) {
    ref_o = o;
    ref_s = s;
  }
  const bool eq = !std::memcmp(o.data(), ref_o.data(), no * 4) &&
                  !std::memcmp(s.data(), ref_s.data(), ns * 4);
  cudaFuncAttributes fa{};
  CK(cudaFuncGetAttributes(&fa, step_kernel<PARTS, LD, ST, DEFER, MINB>));
  const float us = time_us(launch);
  const double bytes = 2.0 * ns * 4;
  std::printf("{\"bench\": \"kda_decode_forms\", \"B\": %d, \"H\": %d, \"form\": \"parts=%d ld=%d st=%d "
              "defer=%d minb=%d\", \"regs\": %d, \"us\": %.2f, \"TBps\": %.4f, \"frac_of_copy\": %.4f, "
              "\"bits_equal\": %s}\n",
              x.B, x.H, PARTS, LD, ST, DEFER ? 1 : 0, MINB, fa.numRegs, us, bytes / us / 1e6,
              copy_us / us, eq ? "true" : "false");
  std::fflush(stdout);
}

// HALF 0: rows_kernel (a block a head), 1: hrows_kernel (a block a half head).
template <int LD, int ST, int HALF = 0>
void run_rows(const Bufs& x, double copy_us) {
  const size_t ns = size_t(x.B) * x.H * kDk * kDv, no = size_t(x.B) * x.H * kDv;
  auto kern = HALF ? hrows_kernel<LD, ST> : rows_kernel<LD, ST>;
  auto launch = [&] {
    kern<<<unsigned(int64_t(x.B) * x.H * (HALF ? 2 : 1)), HALF ? 256 : 512>>>(
        x.q, x.k, x.v, x.g, x.beta, 0.08838834764831845f, x.sin, x.sout, x.o);
  };
  CK(cudaMemset(x.sout, 0, ns * 4));
  launch();
  CK(cudaDeviceSynchronize());
  std::vector<float> o(no), s(ns);
  CK(cudaMemcpy(o.data(), x.o, no * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(s.data(), x.sout, ns * 4, cudaMemcpyDeviceToHost));
  const bool eq = !std::memcmp(o.data(), ref_o.data(), no * 4) &&
                  !std::memcmp(s.data(), ref_s.data(), ns * 4);
  cudaFuncAttributes fa{};
  CK(cudaFuncGetAttributes(&fa, kern));
  const float us = time_us(launch);
  std::printf("{\"bench\": \"kda_decode_forms\", \"B\": %d, \"H\": %d, \"form\": \"%s ld=%d st=%d\", "
              "\"regs\": %d, \"us\": %.2f, \"TBps\": %.4f, \"frac_of_copy\": %.4f, \"bits_equal\": %s}\n",
              x.B, x.H, HALF ? "hrows" : "rows", LD, ST, fa.numRegs, us, 2.0 * ns * 4 / us / 1e6, copy_us / us, eq ? "true" : "false");
  std::fflush(stdout);
}

template <int ROWS>
void run_copy_policy(const Bufs& x, double copy_us) {
  const size_t ns = size_t(x.B) * x.H * kDk * kDv;
  const unsigned grid = unsigned(int64_t(x.B) * x.H * 512 / copy_threads<ROWS>());
  const float us = time_us([&] { copy_policy_kernel<ROWS><<<grid, copy_threads<ROWS>()>>>(x.sin, x.sout); });
  std::printf("{\"bench\": \"kda_decode_forms\", \"B\": %d, \"H\": %d, \"form\": \"copy_%s ld=2 st=1\", "
              "\"us\": %.2f, \"TBps\": %.4f, \"frac_of_copy\": %.4f}\n",
              x.B, x.H, ROWS == 1 ? "rows" : ROWS == 2 ? "hrows" : "shaped", us, 2.0 * ns * 4 / us / 1e6, copy_us / us);
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  const int H = argc > 1 ? std::atoi(argv[1]) : 64;
  if (H < 1) return 2;
  for (int B : {64, 256}) {
    Bufs x{};
    x.B = B;
    x.H = H;
    const size_t nv = size_t(B) * H * kDk, ns = nv * kDv;
    std::vector<float> h(ns);
    uint32_t seed = 12345u;
    auto rnd = [&] {  // uniform in [-1, 1)
      seed = seed * 1664525u + 1013904223u;
      return (seed >> 8) * (2.0f / 16777216.0f) - 1.0f;
    };
    auto up = [&](float** d, size_t n, float lo, float scale_) {
      for (size_t i = 0; i < n; ++i) h[i] = lo + scale_ * rnd();
      CK(cudaMalloc(d, n * 4));
      CK(cudaMemcpy(*d, h.data(), n * 4, cudaMemcpyHostToDevice));
    };
    up(&x.q, nv, 0.0f, 0.09f);
    up(&x.k, nv, 0.0f, 0.09f);
    up(&x.v, nv, 0.0f, 1.0f);
    up(&x.g, nv, -0.5f, 0.45f);  // log decays in (-0.95, -0.05)
    up(&x.beta, size_t(B) * H, 0.5f, 0.4f);
    up(&x.sin, ns, 0.0f, 0.1f);
    CK(cudaMalloc(&x.sout, ns * 4));
    CK(cudaMalloc(&x.o, size_t(B) * H * kDv * 4));
    const double bytes = 2.0 * ns * 4;
    const float memcpy_us = time_us([&] { CK(cudaMemcpyAsync(x.sout, x.sin, ns * 4, cudaMemcpyDeviceToDevice)); });
    const float shaped_us = time_us([&] { copy_shaped_kernel<<<unsigned(int64_t(B) * H * 4), 128>>>(x.sin, x.sout); });
    std::printf("{\"bench\": \"kda_decode_forms\", \"B\": %d, \"H\": %d, \"form\": \"memcpy\", \"us\": %.2f, \"TBps\": %.4f}\n",
                B, H, memcpy_us, bytes / memcpy_us / 1e6);
    std::printf("{\"bench\": \"kda_decode_forms\", \"B\": %d, \"H\": %d, \"form\": \"copy_shaped\", \"us\": %.2f, \"TBps\": %.4f, \"frac_of_copy\": %.4f}\n",
                B, H, shaped_us, bytes / shaped_us / 1e6, memcpy_us / shaped_us);
    run_form<1, 0, 0, false, 8>(x, memcpy_us, true);  // main's form until session 6: the bits reference
    run_form<1, 1, 0, false, 8>(x, memcpy_us, false);
    run_form<1, 2, 0, false, 8>(x, memcpy_us, false);
    run_form<1, 3, 0, false, 8>(x, memcpy_us, false);
    run_form<1, 0, 1, false, 8>(x, memcpy_us, false);
    run_form<1, 1, 1, false, 8>(x, memcpy_us, false);
    run_form<1, 0, 0, true, 8>(x, memcpy_us, false);
    run_form<1, 0, 0, false, 0>(x, memcpy_us, false);
    run_form<1, 0, 0, false, 6>(x, memcpy_us, false);
    run_form<2, 0, 0, false, 4>(x, memcpy_us, false);
    run_form<4, 0, 0, false, 2>(x, memcpy_us, false);
    run_form<4, 2, 0, false, 2>(x, memcpy_us, false);
    run_form<1, 1, 1, true, 8>(x, memcpy_us, false);  // fla's policies: default, stores last
    run_form<4, 1, 1, false, 2>(x, memcpy_us, false);
    run_form<4, 1, 1, true, 2>(x, memcpy_us, false);
    run_form<1, 2, 1, false, 8>(x, memcpy_us, false);
    run_form<1, 2, 1, true, 8>(x, memcpy_us, false);
    run_form<1, 2, 0, false, 0>(x, memcpy_us, false);
    run_form<1, 2, 0, false, 8>(x, memcpy_us, false);  // main's form until session 7, again: drift within the run
    run_form<1, 2, 1, false, 9>(x, memcpy_us, false);  // session 33: register caps for 9 / 10 blocks an SM
    run_form<1, 2, 1, false, 10>(x, memcpy_us, false);
    run_copy_policy<0>(x, memcpy_us);  // session 33: the lane layouts' copies, then the rows forms
    run_copy_policy<1>(x, memcpy_us);
    run_copy_policy<2>(x, memcpy_us);
    run_rows<2, 1>(x, memcpy_us);
    run_rows<1, 1>(x, memcpy_us);
    run_rows<2, 1, 1>(x, memcpy_us);
    run_rows<1, 1, 1>(x, memcpy_us);
    run_form<1, 2, 1, false, 8>(x, memcpy_us, false);  // main's form since session 7, again
    run_rows<2, 1, 1>(x, memcpy_us);
    run_form<1, 2, 1, false, 8>(x, memcpy_us, false);
    run_rows<2, 1, 1>(x, memcpy_us);
    for (float* p : {x.q, x.k, x.v, x.g, x.beta, x.sin, x.sout, x.o}) CK(cudaFree(p));
  }
  return 0;
}
