// Row reductions and row bodies shared by the per-row norms (cuda/basic.cu), the fused mHC +
// RMSNorm finishing kernels (cuda/mhc_pre.cu, mhc_site.cu, mhc_head.cu), the KDA decode scan's
// gated norm (cuda/kda.cu) and the MLA decode prologue (cuda/mla_prologue.cu): one reduction
// order, so a norm fused into another kernel gives the bytes of the standalone norm kernel.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.cuh"

namespace memra::cuda::rowsum {

// ---------------------------------------------------------------------------------------------
// Row reductions. A "group" of G threads (G a power of two, 32..1024) owns one row; a block of
// kBlock(G) = max(G, 256) threads holds kBlock / G rows. Threads stride the row by G, so loads
// are coalesced; partial sums meet through warp shuffles and (G > 32) one slot per warp in
// shared memory. Rows past the end still take part in every __syncthreads.

template <int G>
struct Group {
  static_assert(G >= 32 && G <= 1024 && (G & (G - 1)) == 0, "G: power of two in [32, 1024]");
  static constexpr int kBlock = G >= 256 ? G : 256;
  static constexpr int kRows = kBlock / G;
  static constexpr int kWarps = kBlock / 32;
  // The row that the calling thread's group owns in block `block` (kRows rows a block, one group
  // of G threads each), and the thread's lane in that group.
  __device__ static __forceinline__ int64_t row(int64_t block) {
    return block * kRows + threadIdx.x / G;
  }
  __device__ static __forceinline__ int lane() { return threadIdx.x % G; }
};

// Sum of `v` over the calling thread's group; every thread of the group gets the total. `red`
// holds Group<G>::kWarps floats. Contains two __syncthreads when G > 32 (all threads of the
// block must call it), so `red` can be reused by the next call at once.
template <int G>
__device__ __forceinline__ float group_sum(float v, float* red) {
  v = warp_sum(v);
  if constexpr (G == 32) {
    return v;
  } else {
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    const int first = (threadIdx.x / G) * (G / 32);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < G / 32; ++i) s += red[first + i];
    __syncthreads();
    return s;
  }
}

// Threads per row for width D: about 4 elements per thread, 32..1024.
inline int group_for(int D) {
  int g = 32;
  while (g < 1024 && g * 4 < D) g *= 2;
  return g;
}

// Calls f(std::integral_constant<int, G>) for the runtime group size g, in host code (a launch
// per group size) or device code (g uniform across the block: one instantiation of f each).
#pragma nv_exec_check_disable
template <typename F>
__host__ __device__ __forceinline__ void with_group(int g, F&& f) {
  switch (g) {
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    case 256: f(std::integral_constant<int, 256>{}); break;
    case 512: f(std::integral_constant<int, 512>{}); break;
    default: f(std::integral_constant<int, 1024>{}); break;
  }
}

template <int G>
unsigned row_blocks(int64_t rows) {
  return ceil_div(rows, Group<G>::kRows);
}

// The sum of x[i]^2 over the row (group-strided, then group_sum; 0 for a dead row), shared by the
// RMS norms. Every thread of the block calls it (group_sum has barriers).
template <int G>
__device__ __forceinline__ float row_sum_squares(const float* xr, bool live, int lane, int D,
                                                 float* red) {
  float ss = 0.0f;
  if (live) {
    for (int i = lane; i < D; i += G) {
      const float v = xr[i];
      ss += v * v;
    }
  }
  return group_sum<G>(ss, red);
}

// yr[lane + G c] = (wv[c] *) (v[c] * inv) for the row's columns below D (weighted: with wv): the
// RMS norm's output step over a row held in registers (rms_norm_row, the mHC finish + norm).
// mirror (optional): the same values also stored there as M (from_f32: the MLA decode's latent
// cache row, written by the norm that produces it; cuda/mla_prologue.cu).
template <int G, int N, typename M = float>
__device__ __forceinline__ void store_rms_cols(const float (&v)[N], float inv,
                                               const float (&wv)[N], bool weighted, int lane,
                                               int D, float* yr, M* mirror = nullptr) {
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const int i = lane + G * c;
    if (i < D) {
      const float n = __fmul_rn(v[c], inv);
      const float o = weighted ? __fmul_rn(wv[c], n) : n;
      yr[i] = o;
      if (mirror) mirror[i] = from_f32<M>(o);
    }
  }
}

// cpu::rms_norm_gated_sigmoid of one row of at most kGatedCols * G values already in registers
// (column lane + G c of x, gate and w; zeros past D): yr[i] = w * (x * inv) * sigmoid(gate).
// The short-row path of rms_norm_gated_kernel (cuda/basic.cu), shared with the KDA decode scan
// that fuses the norm (cuda/kda.cu), so both give the standalone kernel's bytes. Every thread of
// the block calls it (group_sum has barriers when G > 32); a dead row (live false) writes nothing.
constexpr int kGatedCols = 4;

// v[c] = p[lane + G c] for the columns of a row of D values (0 past D or for a dead row; a null p
// gives zeros): the register form of a row of at most kGatedCols * G values.
template <int G>
__device__ __forceinline__ void load_row_cols(const float* p, bool live, int lane, int D,
                                              float (&v)[kGatedCols]) {
#pragma unroll
  for (int c = 0; c < kGatedCols; ++c) {
    const int i = lane + G * c;
    v[c] = live && p && i < D ? p[i] : 0.0f;
  }
}

// Y: the output's type (float, or __nv_bfloat16: each f32 result rounded RNE as it is stored).
template <int G, typename Y = float>
__device__ __forceinline__ void gated_norm_short_row(const float (&xv)[kGatedCols],
                                                     float (&sig)[kGatedCols],
                                                     const float (&wv)[kGatedCols], bool live,
                                                     int lane, int D, float eps, float* red,
                                                     Y* yr) {
  float ss = 0.0f;  // row_sum_squares' order: columns lane, lane + G, ...
#pragma unroll
  for (int c = 0; c < kGatedCols; ++c) {
    if (live && lane + G * c < D) ss += xv[c] * xv[c];
    sig[c] = 1.0f / (1.0f + expf(-sig[c]));
  }
  ss = group_sum<G>(ss, red);
  if (!live) return;
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
#pragma unroll
  for (int c = 0; c < kGatedCols; ++c) {
    const int i = lane + G * c;
    if (i < D) yr[i] = from_f32<Y>(__fmul_rn(__fmul_rn(wv[c], __fmul_rn(xv[c], inv)), sig[c]));
  }
}

// ---------------------------------------------------------------------------------------------
// One-row norm bodies (the group of G threads of row `row`, lane `lane`), shared by the per-row
// norm kernels and norm_rows (cuda/basic.cu) and the MLA decode prologue (cuda/mla_prologue.cu),
// so each fused form gives the bytes of the standalone kernel. mirror (optional, not aliasing
// y): the row's outputs also stored there (as M), from the same registers.

// rms_norm_row's short form over a row already in registers (xv[c], wv[c]: column lane + G c;
// zeros past D): the sum of squares in row_sum_squares' column order, group_sum, then
// store_rms_cols into yr (and mirror). Every thread of the block calls it (group_sum has
// barriers); a dead row (live false) writes nothing. Shared with the model head's fused kernel
// (cuda/mhc_head.cu mhc_head_norm_kernel), so its bytes are the standalone norm's.
template <int G, typename M = float>
__device__ __forceinline__ void rms_norm_cols(const float (&xv)[kGatedCols],
                                              const float (&wv)[kGatedCols], bool weighted,
                                              bool live, int lane, int D, float eps, float* red,
                                              float* yr, M* mirror = nullptr) {
  float ss = 0.0f;  // row_sum_squares' order: columns lane, lane + G, ...
#pragma unroll
  for (int c = 0; c < kGatedCols; ++c) {
    if (live && lane + G * c < D) ss += xv[c] * xv[c];
  }
  ss = group_sum<G>(ss, red);
  if (!live) return;
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  store_rms_cols<G>(xv, inv, wv, weighted, lane, D, yr, mirror);
}

// cpu::rms_norm: y = (w *) (x * (1 / sqrt(sum(x^2) / D + eps))). x and y may alias: each element
// is read and then written by the same thread, after the row's reduction. The body of row
// `row` (lane `lane` of its group of G threads) is shared with norm_rows_kernel; every thread of
// the block calls it (group_sum has barriers), `red` holds a float per warp of the block.
// Rows of at most kGatedCols * G values keep x (and w) in registers from one load: the output
// pass re-read them after the reduction, one more memory round trip (y may alias x, so those
// loads waited for each store); the same sums in the same order, the same products.
template <int G, typename M = float>
__device__ __forceinline__ void rms_norm_row(const float* x, int64_t rows, int D, const float* w,
                                             float eps, float* y, int64_t row, int lane,
                                             float* red, M* mirror = nullptr) {
  const bool live = row < rows;
  const float* xr = x + (live ? row : 0) * D;
  if (D <= kGatedCols * G) {
    float xv[kGatedCols], wv[kGatedCols];
    load_row_cols<G>(xr, live, lane, D, xv);
    load_row_cols<G>(w, live, lane, D, wv);
    rms_norm_cols<G>(xv, wv, w != nullptr, live, lane, D, eps, red, y + (live ? row : 0) * D,
                     mirror);
    return;
  }
  const float ss = row_sum_squares<G>(xr, live, lane, D, red);
  if (!live) return;
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  float* yr = y + row * D;
  for (int i = lane; i < D; i += G) {
    const float n = __fmul_rn(xr[i], inv);
    const float o = w ? __fmul_rn(w[i], n) : n;
    yr[i] = o;
    if (mirror) mirror[i] = from_f32<M>(o);
  }
}

// cpu::layer_norm: two passes as the reference (mean, then the mean of squared deviations). The
// row body is shared with norm_rows_kernel, as rms_norm_row.
template <int G>
__device__ __forceinline__ void layer_norm_row(const float* x, int64_t rows, int D, const float* w,
                                               const float* b, float eps, float* y, int64_t row,
                                               int lane, float* red, float* mirror = nullptr) {
  const bool live = row < rows;
  const float* xr = x + (live ? row : 0) * D;
  if (D <= kGatedCols * G) {  // x, w and b in registers from one load (as rms_norm_row)
    float xv[kGatedCols], wv[kGatedCols], bv[kGatedCols];
    load_row_cols<G>(xr, live, lane, D, xv);
    load_row_cols<G>(w, live, lane, D, wv);
    load_row_cols<G>(b, live, lane, D, bv);
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < kGatedCols; ++c) {
      if (live && lane + G * c < D) s += xv[c];
    }
    const float mean = group_sum<G>(s, red) / static_cast<float>(D);
    float v = 0.0f;
#pragma unroll
    for (int c = 0; c < kGatedCols; ++c) {
      if (live && lane + G * c < D) {
        const float d = xv[c] - mean;
        v += d * d;
      }
    }
    const float var = group_sum<G>(v, red) / static_cast<float>(D);
    if (!live) return;
    const float inv = 1.0f / sqrtf(var + eps);
    float* yr = y + row * D;
#pragma unroll
    for (int c = 0; c < kGatedCols; ++c) {
      const int i = lane + G * c;
      if (i < D) {
        const float o = __fadd_rn(__fmul_rn(__fmul_rn(xv[c] - mean, inv), wv[c]), bv[c]);
        yr[i] = o;
        if (mirror) mirror[i] = o;
      }
    }
    return;
  }
  float s = 0.0f;
  if (live) {
    for (int i = lane; i < D; i += G) s += xr[i];
  }
  const float mean = group_sum<G>(s, red) / static_cast<float>(D);
  float v = 0.0f;
  if (live) {
    for (int i = lane; i < D; i += G) {
      const float d = xr[i] - mean;
      v += d * d;
    }
  }
  const float var = group_sum<G>(v, red) / static_cast<float>(D);
  if (!live) return;
  const float inv = 1.0f / sqrtf(var + eps);
  float* yr = y + row * D;
  for (int i = lane; i < D; i += G) {
    const float o = __fadd_rn(__fmul_rn(__fmul_rn(xr[i] - mean, inv), w[i]), b[i]);
    yr[i] = o;
    if (mirror) mirror[i] = o;
  }
}

}  // namespace memra::cuda::rowsum
