// KDA area, the short causal conv (cpp/include/memra/cuda_abi/kda.h: kda_conv): the GPU twin of
// cpu::kda_conv_prefill / kda_conv_decode (cpp/src/cpu/kda.cpp, the oracle), with the fused L2
// norm of q and k and the gates' GEMV pair f_b | g_b (cuda/kda_common.cuh: rounding, RowPlanes).
//
// Bit-exactness between arms is by construction: the prefill and decode kernels call one
// __device__ function per output, so the decode kernel equals the prefill kernel at T = 1 bit for
// bit, and a row in a batch equals it alone.
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemv.cuh"
#include "gemv_rows.cuh"
#include "kda_common.cuh"
#include "linear.cuh"
#include "row_group.cuh"

using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::rowsum::row_sum_squares;

namespace {

// Element p of channel c's extended input (ring ++ x): positions [0, K-1) are the ring, oldest
// first (ring_c == nullptr reads zeros); position K-1+t is x[t, c]. x [T, C]; ring_c [K-1].
template <int K>
__device__ __forceinline__ float conv_extended_at(const float* x, int64_t C, const float* ring_c,
                                                  int64_t p, int64_t c) {
  if (p < K - 1) return ring_c ? ring_c[p] : 0.0f;
  return x[(p - (K - 1)) * C + c];
}

// Where channel c's output row 0 lands when the C channels are split into groups of G (C % G ==
// 0) and the output is the groups' [rows, G] tensors one after another: y[(c / G) * rows * G +
// r * G + c % G] for row r. G == C gives the plain [rows, C] layout (y[r * C + c]); KdaLayer
// passes G = qkv so that one launch over the fused q|k|v channels leaves q, k and v contiguous.
__device__ __forceinline__ int64_t y_group_at(int c, int rows, int G) {
  const int grp = c / G;
  return static_cast<int64_t>(grp) * rows * G + (c - grp * G);
}

// One conv output silu(sum_k w[k] * win[k]) over the K-wide window win (oldest first), the taps
// summed in ascending k from 0.0f as cpu::conv_silu_at does; silu as x / (1 + exp(-x)). Both conv
// arms call this, which makes decode == prefill(T = 1) bit for bit.
template <int K>
__device__ __forceinline__ float conv_silu_window(const float (&win)[K], const float (&w)[K]) {
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) acc = __fadd_rn(acc, __fmul_rn(w[k], win[k]));
  return __fdiv_rn(acc, __fadd_rn(1.0f, expf(-acc)));
}

// Prefill: thread (c, chunk) walks tokens [t0, t0 + chunk) of channel c with a sliding window in
// registers, so each input is read once (plus K-1 halo per chunk); loads and stores coalesced
// over c. The blocks of chunk 0 also write the new ring ring_out[c, j] = ext[T + j] (the last
// K-1 inputs of ring_in ++ x; for T < K-1 it still holds old ring values, shifted to the front).
// Output (t, c) lands at y_group_at(c, T, G) + t * G (the channel groups of width G split into
// consecutive [T, G] tensors; G == C is the plain [T, C] layout). Grid: x over channels, y
// (strided) over chunks.
template <int K>
__global__ void conv_prefill_kernel(const float* __restrict__ x, int T, int C, int G, int chunk,
                                    const float* __restrict__ w, const float* __restrict__ ring_in,
                                    float* __restrict__ ring_out, float* __restrict__ y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  constexpr int R = K - 1;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float* ring_c = ring_in ? ring_in + static_cast<int64_t>(c) * R : nullptr;
  float* y_c = y + y_group_at(c, T, G);
  float wr[K];
#pragma unroll
  for (int k = 0; k < K; ++k) wr[k] = w[static_cast<int64_t>(c) * K + k];
  const int n_chunks = (T + chunk - 1) / chunk;
  for (int ch = blockIdx.y; ch < n_chunks; ch += gridDim.y) {
    const int t0 = ch * chunk;
    const int t1 = min(T, t0 + chunk);
    float win[K];
#pragma unroll
    for (int k = 0; k < R; ++k) win[k] = conv_extended_at<K>(x, C, ring_c, int64_t(t0) + k, c);
    for (int t = t0; t < t1; ++t) {
      win[R] = x[static_cast<int64_t>(t) * C + c];
      y_c[static_cast<int64_t>(t) * G] = conv_silu_window<K>(win, wr);
#pragma unroll
      for (int k = 0; k < R; ++k) win[k] = win[k + 1];
    }
  }
  if (blockIdx.y == 0) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      ring_out[static_cast<int64_t>(c) * R + j] =
          conv_extended_at<K>(x, C, ring_c, int64_t(T) + j, c);
    }
  }
}

// Decode: B sequences of one token. Thread (c, b) computes y[b, c] through the same
// conv_silu_window as the prefill arm, its window being ring_in[b][c, :] ++ x[b, c], and rolls
// channel c's ring: ring_out[b][c, j] = window[1 + j] (ring: RowPlanes). y (b, c) at
// y_group_at(c, B, G) + b * G, as the prefill arm's (t, c).
// Grid: x over channels, y (strided) over sequences.
// L2 (kda_conv's decode forms with l2_groups; C % kConvThreads == 0): a block's kConvThreads
// channels below l2_channels are one head of q or k (dk == kConvThreads), L2-normalised before
// the store with l2norm_kernel<32>'s arithmetic (warp 0: row_sum_squares<32> over the block's
// channels; sqrt(ss + eps); each value divided by it), so the bytes are those of the conv
// followed by l2norm_heads, and the prefill path (which runs the two) still agrees.
constexpr int kConvThreads = 128;

// The body of block (bx, by) of a grid with gy blocks in y (conv_decode_kernel, and the conv
// blocks of conv_pair_decode_kernel below). Every thread of the block calls it.
template <int K, bool L2>
__device__ __forceinline__ void conv_decode_block(const float* __restrict__ x, int B, int C, int G,
                                                  const float* __restrict__ w,
                                                  const RowPlanes& ring, float* __restrict__ y,
                                                  int l2_channels, float l2_eps, int bx, int by,
                                                  int gy) {
  constexpr int R = K - 1;
  __shared__ float ys[L2 ? kConvThreads : 1];
  __shared__ float norm;
  const int c = bx * blockDim.x + threadIdx.x;
  const bool active = L2 || c < C;  // L2: every thread is a channel (and takes the barriers)
  float wr[K];
  float win[K];
  const float* rin = nullptr;
  float* rout = nullptr;
  auto load_w = [&] {
#pragma unroll
    for (int k = 0; k < K; ++k) wr[k] = w[static_cast<int64_t>(c) * K + k];
  };
  auto load_ring = [&](int b) {  // the window's first R values, and the row's output plane
    ring.at(b, &rin, &rout);
    const float* ring_c = rin ? rin + static_cast<int64_t>(c) * R : nullptr;
#pragma unroll
    for (int k = 0; k < R; ++k) win[k] = ring_c ? ring_c[k] : 0.0f;
  };
  const int b0 = by;
  if (ring.early && active) {
    load_w();
    if (b0 < B) load_ring(b0);
  }
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  if (!active) return;
  if (!ring.early) load_w();
  const bool l2 = L2 && bx * kConvThreads < l2_channels;  // block-uniform
  float* y_c = y + y_group_at(c, B, G);
  for (int b = b0; b < B; b += gy) {
    if (!ring.early || b != b0) load_ring(b);
    const int64_t xi = static_cast<int64_t>(b) * C + c;
    win[R] = x[xi];
    float v = conv_silu_window<K>(win, wr);
    if (l2) {
      ys[threadIdx.x] = v;
      __syncthreads();
      if (threadIdx.x < 32) {  // one 32-lane group: no barrier inside (red unused)
        const float ss = row_sum_squares<32>(ys, true, threadIdx.x, kConvThreads, nullptr);
        if (threadIdx.x == 0) norm = sqrtf(ss + l2_eps);
      }
      __syncthreads();
      v = v / norm;
    }
    y_c[static_cast<int64_t>(b) * G] = v;
    if (rout) {
#pragma unroll
      for (int j = 0; j < R; ++j) rout[static_cast<int64_t>(c) * R + j] = win[1 + j];
    }
  }
}

template <int K, bool L2>
__global__ void conv_decode_kernel(const float* __restrict__ x, int B, int C, int G,
                                   const float* __restrict__ w, RowPlanes ring,
                                   float* __restrict__ y, int l2_channels, float l2_eps) {
  conv_decode_block<K, L2>(x, B, C, G, w, ring, y, l2_channels, l2_eps, blockIdx.x, blockIdx.y,
                           gridDim.y);
}

constexpr int kConvChunk = 16;   // tokens per thread in the prefill arm

template <int K>
void launch_conv_prefill(MemraCudaCtx* ctx, const float* x, int T, int C, int G, const float* w,
                         const float* ring_in, float* ring_out, float* y) {
  const int n_chunks = (T + kConvChunk - 1) / kConvChunk;
  const dim3 grid(memra::cuda::ceil_div(C, kConvThreads),
                  n_chunks < kMaxGridY ? n_chunks : kMaxGridY);
  memra::cuda::launch(ctx, true, conv_prefill_kernel<K>, dim3(grid), dim3(kConvThreads), 0, x, T, C,
      G, kConvChunk, w, ring_in, ring_out, y);
}

template <int K>
void launch_conv_decode(MemraCudaCtx* ctx, const float* x, int B, int C, int G, const float* w,
                        const RowPlanes& ring, float* y, int l2_channels, float l2_eps) {
  const dim3 grid(memra::cuda::ceil_div(C, kConvThreads), B < kMaxGridY ? B : kMaxGridY);
  if (l2_channels > 0) {
    memra::cuda::launch(ctx, true, conv_decode_kernel<K, true>, grid, dim3(kConvThreads), 0, x, B,
                        C, G, w, ring, y, l2_channels, l2_eps);
  } else {
    memra::cuda::launch(ctx, true, conv_decode_kernel<K, false>, grid, dim3(kConvThreads), 0, x, B,
                        C, G, w, ring, y, 0, 0.0f);
  }
}

// Calls f(std::integral_constant<int, K>) for K in 2..8; false for any other K.
template <typename F>
bool dispatch_conv_k(int K, F&& f) {
  switch (K) {
    case 2: f(std::integral_constant<int, 2>()); return true;
    case 3: f(std::integral_constant<int, 3>()); return true;
    case 4: f(std::integral_constant<int, 4>()); return true;
    case 5: f(std::integral_constant<int, 5>()); return true;
    case 6: f(std::integral_constant<int, 6>()); return true;
    case 7: f(std::integral_constant<int, 7>()); return true;
    case 8: f(std::integral_constant<int, 8>()); return true;
    default: return false;
  }
}

// The decode forms (TABLES, SLOTS): the decode kernel over B rows, then (l2_groups > 0)
// l2norm_heads over the first l2_groups channel groups of y, as rows of dk: in the conv kernel
// when a block's channels are exactly one head (dk == kConvThreads, G and C multiples of it), else
// memra_cuda_l2norm_heads after it.
// ring: the tables (ring.out checked non-null) or the device slots (ring.slots, cur and bases).
// conv_decode_impl's argument checks: kOk with *run false when there is nothing to do (B == 0 or
// C == 0).
int conv_decode_check(const float* x, int B, int C, int G, const float* w, int K,
                      const RowPlanes& ring, const float* y, int l2_groups, int dk, bool* run) {
  *run = false;
  if (B < 0 || C < 0) return memra::kContractShape;
  if (C > 0 && (G < 1 || C % G != 0)) return memra::kContractShape;
  if (l2_groups > 0 && (dk < 1 || G % dk != 0 || int64_t(l2_groups) * G > C)) {
    return memra::kContractShape;
  }
  if (K < 1) return memra::kContractValue;
  if (K < 2 || K > 8) return memra::kUnsupportedGeometry;
  if (ring.slots && (ring.floats < 0 || ring.offset < 0)) return memra::kContractValue;
  if (B == 0 || C == 0) return memra::kOk;
  if (!x || !w || !y) return memra::kContractMissing;
  if (ring.slots ? (!ring.cur || !ring.base0 || !ring.base1) : !ring.out) {
    return memra::kContractMissing;
  }
  // A slot's ring [C, K-1] must fit its stride, or one row's output would be another's input.
  if (ring.slots && ring.offset + static_cast<int64_t>(C) * (K - 1) > ring.floats) {
    return memra::kContractValue;
  }
  *run = true;
  return memra::kOk;
}

// The conv's L2 form (the q and k heads normalised in the conv kernel): a block's channels are
// exactly one head (dk == kConvThreads, G a multiple of it).
bool conv_l2_fused(int l2_groups, int G, int dk) {
  return l2_groups > 0 && dk == kConvThreads && G % kConvThreads == 0;
}

int conv_decode_impl(MemraCudaCtx* ctx, const float* x, int B, int C, int G, const float* w,
                     int K, const RowPlanes& ring, float* y, int l2_groups, int dk, float eps) {
  bool run = false;
  MEMRA_CUDA_RETURN_IF(conv_decode_check(x, B, C, G, w, K, ring, y, l2_groups, dk, &run));
  if (!run) return memra::kOk;
  const bool fused = conv_l2_fused(l2_groups, G, dk);
  const int l2_channels = fused ? l2_groups * G : 0;
  const bool ok = dispatch_conv_k(K, [&](auto kc) {
    launch_conv_decode<decltype(kc)::value>(ctx, x, B, C, G, w, ring, y, l2_channels, eps);
  });
  if (!ok) return memra::kUnsupportedGeometry;
  MEMRA_CUDA_RETURN_IF(launch_status());
  if (l2_groups > 0 && !fused) {
    return memra_cuda_l2norm_heads(ctx, y, l2_groups * B, G / dk, dk, eps);
  }
  return memra::kOk;
}

// ---- The decode conv with the gates' up-projections in its launch (one row, B == 1; kda_conv's
// SLOTS form with the pair): blocks [0, conv_blocks) are conv_decode_kernel's blocks (the L2
// form), the rest gemv_short_kernel's rows of the pair (f_b | g_b) at kConvThreads threads a
// block and kPairPasses rows a thread, with the bytes of either (the short rows' order depends on
// K alone). Both read only the q|k|v projection's outputs, so the
// step's chain loses a launch a KDA layer at batch 1.
using memra::cuda::gemv_rows_detail::GemvRows;
using memra::cuda::gemv_rows_detail::gemv_short_rows;
using memra::cuda::gemv_rows_detail::kShortMaxV;
using memra::cuda::gemv_rows_detail::with_short_lanes;
constexpr int kPairPasses = 2;

template <int K, typename W, int L>
__global__ void __launch_bounds__(kConvThreads)
    conv_pair_decode_kernel(const float* __restrict__ x, int C, int G, const float* __restrict__ w,
                            RowPlanes ring, float* __restrict__ y, int l2_channels, float l2_eps,
                            int conv_blocks, GemvRows<W, float> p0, GemvRows<W, float> p1,
                            int blocks0, int Kg, int prefetch) {
  const int bx = blockIdx.x;
  if (bx < conv_blocks) {
    conv_decode_block<K, true>(x, 1, C, G, w, ring, y, l2_channels, l2_eps, bx, 0, 1);
    return;
  }
  const int bid = bx - conv_blocks;
  const bool second = bid >= blocks0;
  // Field by field (a reference to either parameter struct would copy both to the stack).
  gemv_short_rows<W, float, L, kConvThreads, kPairPasses>(
      second ? p1.x : p0.x, second ? p1.w : p0.w, second ? p1.bias : p0.bias,
      second ? p1.y : p0.y, second ? p1.N : p0.N, Kg, prefetch, bid - (second ? blocks0 : 0));
}

template <int K, typename W, int L>
int launch_conv_pair(MemraCudaCtx* ctx, const float* x, int C, int G, const float* w,
                     const RowPlanes& ring, float* y, int l2_channels, float eps,
                     GemvRows<W, float> p0, GemvRows<W, float> p1, int Kg) {
  constexpr int kRows = kConvThreads / L * kPairPasses;  // GEMV rows a block
  const int conv_blocks = C / kConvThreads;
  const int blocks0 = (p0.N + kRows - 1) / kRows;
  const int blocks = conv_blocks + blocks0 + (p1.N + kRows - 1) / kRows;
  const int prefetch = ctx->resident_weights > 0 ? 1 : 0;
  memra::cuda::launch(ctx, true, conv_pair_decode_kernel<K, W, L>, dim3(blocks),
                      dim3(kConvThreads), 0, x, C, G, w, ring, y, l2_channels, eps, conv_blocks, p0,
                      p1, blocks0, Kg, prefetch);
  return launch_status();
}

// The DIRECT form: the prefill kernel over T tokens of one sequence, then (l2_groups > 0) the
// L2 norm's own launch (the fused norm's shape check as the decode forms'). A null ring.in
// reads zeros; at T == 0 nothing runs.
int conv_prefill(MemraCudaCtx* ctx, const MemraKdaConvParams& p) {
  const int T = p.n, C = p.C, G = p.G, K = p.K;
  if (T < 0 || C < 0) return memra::kContractShape;
  if (C > 0 && (G < 1 || C % G != 0)) return memra::kContractShape;
  if (p.l2_groups > 0 && (p.dk < 1 || G % p.dk != 0 || int64_t(p.l2_groups) * G > C)) {
    return memra::kContractShape;
  }
  if (K < 1) return memra::kContractValue;
  if (K < 2 || K > 8) return memra::kUnsupportedGeometry;
  if (T == 0 || C == 0) return memra::kOk;
  if (!p.x || !p.w || !p.ring.out || !p.y) return memra::kContractMissing;
  const bool ok = dispatch_conv_k(K, [&](auto kc) {
    launch_conv_prefill<decltype(kc)::value>(ctx, p.x, T, C, G, p.w, p.ring.in, p.ring.out, p.y);
  });
  if (!ok) return memra::kUnsupportedGeometry;
  MEMRA_CUDA_RETURN_IF(launch_status());
  if (p.l2_groups > 0) {
    return memra_cuda_l2norm_heads(ctx, p.y, p.l2_groups * T, G / p.dk, p.dk, p.eps);
  }
  return memra::kOk;
}

// The GEMV pair in launches of its own: one f32 row each, no bias.
int gemv_pair(MemraCudaCtx* ctx, const MemraKdaGemvPair& g) {
  return memra::cuda::linear_ex_pair(ctx, g.x0, g.x1, 0, g.K, 1, g.K, g.w0, g.w1, g.w_dtype,
                                     g.N0, g.N1, nullptr, nullptr, g.y0, g.y1);
}

// The SLOTS form with the pair: one launch at B == 1 when the conv takes its L2 form and the pair
// the short rows of the decode GEMV, else the conv, then the pair's own launch.
int conv_pair_slots(MemraCudaCtx* ctx, const MemraKdaConvParams& p) {
  const RowPlanes ring = row_planes(p.ring);
  const MemraKdaGemvPair& g = p.pair;
  const int B = p.n, C = p.C, G = p.G, K = p.K, l2_groups = p.l2_groups, dk = p.dk;
  const float* x = p.x;
  const float* w = p.w;
  float* y = p.y;
  const float eps = p.eps;
  const int E = g.w_dtype == 1 ? 8 : 4;  // weights a 16-byte vector (gemv_takes: bf16 or f32)
  const bool one = B == 1 && C > 0 && conv_l2_fused(l2_groups, G, dk) && g.N0 > 0 && g.N1 > 0 &&
                   g.K > 0 && g.K / E <= kShortMaxV && g.y0 && g.y1 && g.x0 && g.x1 && g.w0 &&
                   g.w1 && memra::cuda::gemv_takes(ctx, g.x0, 0, g.K, g.w0, g.w_dtype) &&
                   memra::cuda::gemv_takes(ctx, g.x1, 0, g.K, g.w1, g.w_dtype);
  if (!one) {
    MEMRA_CUDA_RETURN_IF(conv_decode_impl(ctx, x, B, C, G, w, K, ring, y, l2_groups, dk, eps));
    return gemv_pair(ctx, g);
  }
  bool run = false;
  MEMRA_CUDA_RETURN_IF(conv_decode_check(x, B, C, G, w, K, ring, y, l2_groups, dk, &run));
  const int l2_channels = l2_groups * G;
  const int gK = g.K, N0 = g.N0, N1 = g.N1;
  int rc = memra::kUnsupportedGeometry;
  dispatch_conv_k(K, [&](auto kc) {
    constexpr int KC = decltype(kc)::value;
    rc = with_short_lanes(gK / E, [&](auto lanes) {
      constexpr int L = decltype(lanes)::value;
      if (g.w_dtype == 1) {
        using W = __nv_bfloat16;
        const GemvRows<W, float> p0{g.x0, static_cast<const W*>(g.w0), nullptr, g.y0, N0};
        const GemvRows<W, float> p1{g.x1, static_cast<const W*>(g.w1), nullptr, g.y1, N1};
        return launch_conv_pair<KC, W, L>(ctx, x, C, G, w, ring, y, l2_channels, eps, p0, p1, gK);
      }
      const GemvRows<float, float> p0{g.x0, static_cast<const float*>(g.w0), nullptr, g.y0, N0};
      const GemvRows<float, float> p1{g.x1, static_cast<const float*>(g.w1), nullptr, g.y1, N1};
      return launch_conv_pair<KC, float, L>(ctx, x, C, G, w, ring, y, l2_channels, eps, p0, p1,
                                            gK);
    });
  });
  return rc;
}

}  // namespace

extern "C" {

int memra_cuda_kda_conv(MemraCudaCtx* ctx, const MemraKdaConvParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!p) return memra::kContractMissing;
  switch (p->ring.form) {
    case MEMRA_KDA_PLANES_DIRECT:
      MEMRA_CUDA_RETURN_IF(conv_prefill(ctx, *p));
      break;
    case MEMRA_KDA_PLANES_SLOTS:
      if (p->pair.run) return conv_pair_slots(ctx, *p);
      [[fallthrough]];
    case MEMRA_KDA_PLANES_TABLES:
      MEMRA_CUDA_RETURN_IF(conv_decode_impl(ctx, p->x, p->n, p->C, p->G, p->w, p->K,
                                            row_planes(p->ring), p->y, p->l2_groups, p->dk,
                                            p->eps));
      break;
    default:
      return memra::kContractValue;
  }
  return p->pair.run ? gemv_pair(ctx, p->pair) : memra::kOk;
}

}  // extern "C"
