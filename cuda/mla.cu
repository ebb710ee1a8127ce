// MLA area of the CUDA library (cpp/include/memra/cuda_abi/mla.h): q absorption, v
// decompression, latent append, absorbed causal attention and gathered (index-list) attention
// over the latent cache. GPU twins of cpu::mla_absorb_q / mla_decompress_v / mla_attn_absorbed /
// mla_attn_gathered (cpp/src/cpu/mla.cpp, the numeric oracle).
//
// Absorb / decompress arms (all enqueue on ctx->stream, no host sync):
//   1 per-position kernel: one block per (head, tile of P positions), all R (absorb) or d_v
//     (decompress) outputs of the head in the block;
//   2 streaming kernel for the decode regime (small T, bound by reading kv_b): a block owns a
//     head and a small tile of its outputs, streams that tile's weights once into shared memory
//     (16-byte cp.async, all in flight at once, consumed in 4 stages as they land) and keeps
//     them there while it loops over the positions; ~4 such blocks on every SM (see "streaming
//     arm" below). When a tile does not fit shared memory it falls back to arm 1's kernel with
//     the outputs split over more blocks (32 outputs a block);
//   3 cuBLASLt bf16 tensor-core GEMM, strided-batched over heads (bf16 weights; activations
//     rounded to bf16 into Scratch), f32 accumulate and output;
//   0 auto: Lt for bf16 weights at T >= 64 (falling back to arm 1 when cuBLASLt declines); arm 2
//     below T = 64; otherwise (f32 / f16 weights at T >= 64) arm 2 when the per-position grid
//     would not fill the GPU, else arm 1.
//
// The projections' arms 1 and 2 do the CPU's arithmetic operation for operation (sequential
// sums in the CPU's order, products and sums rounded separately, no FMA), so with f32 or bf16
// kv_b they equal cpu::mla_absorb_q / mla_decompress_v byte for byte where the CPU build does not
// contract into FMAs (x86-64 without -march). Every output is one chain summed by one thread
// (reduction index ascending from 0) in every arm-1/2 launch shape, so arm 2 equals arm 1 byte
// for byte, and both are deterministic.
//
// Attention: a block owns (query, group of HB heads, KV split); cache rows stream through shared
// memory in tiles of 32; scores are one sequential dot per (head, row) in the CPU's order
// (latent then rope part); softmax is online in f32 (running max, rescale by exp(m_old - m_new),
// exp(s - m) with a port of glibc's expf); the split-KV partials (unnormalised o, m, l) are merged
// by a combine kernel. A query whose rows fit one tile, without a split, gets the CPU's bytes.
// Gathered lists are first compacted per query into the CPU's row list (entries -1, < 0 or after
// the query row dropped, duplicates counted once, ascending).
#include <cfloat>
#include <climits>
#include <cstdint>
#include <algorithm>
#include <type_traits>

#include "common.cuh"
#include "gather_compact.cuh"
#include "glibc_expf.cuh"

using memra::cuda::ceil_div;
using memra::cuda::cp_async_16;
using memra::cuda::cp_async_4;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::enter;
using memra::cuda::from_f32;
using memra::cuda::glibc_expf;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;
using memra::cuda::to_f32;
using memra::cuda::warp_max;

namespace {

// ---------------------------------------------------------------- device helpers

int device_attr(MemraCudaCtx* ctx, cudaDeviceAttr attr, int* out) {
  return status_of(cudaDeviceGetAttribute(out, attr, ctx->device));
}

// Allow `bytes` of dynamic shared memory for `kernel` (opt-in above 48 KiB); 50002 when the
// device cannot give that much to one block.
template <typename K>
int allow_smem(MemraCudaCtx* ctx, K* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return memra::kOk;
  int optin = 0;
  MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin));
  if (bytes > static_cast<size_t>(optin)) return memra::kUnsupportedGeometry;
  return status_of(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
}

// dst[i] = src[i] converted (bf16 with round-to-nearest-even).
template <typename D>
__global__ void convert_f32_kernel(const float* __restrict__ src, D* __restrict__ dst, int64_t n) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = from_f32<D>(src[i]);
  }
}

template <typename D>
int launch_convert(MemraCudaCtx* ctx, const float* src, D* dst, int64_t n) {
  if (n == 0) return memra::kOk;
  const unsigned blocks = std::min<unsigned>(ceil_div(n, 256), 65535u * 8);
  memra::cuda::launch(ctx, true, convert_f32_kernel<D>, dim3(blocks), dim3(256), 0, src, dst, n);
  return launch_status();
}

// ---------------------------------------------------------------- absorb / decompress kernels

// THE dot routine of absorb (arms 1 and 2): acc[p] = sum_n q[p, n] * W[n, r], n ascending from
// 0, each product and sum rounded separately (the CPU's `out[r] += a * row[r]` without FMA), one
// chain per position. qs [P, d_nope] in shared memory (rows past the last position zero-filled);
// w points at W_uk[h][0, r] with row stride R.
template <int P, typename Tw>
__device__ __forceinline__ void absorb_dot(const float* qs, int d_nope, const Tw* __restrict__ w,
                                           int64_t R, float (&acc)[P]) {
#pragma unroll
  for (int p = 0; p < P; ++p) acc[p] = 0.0f;
  // Sixteen weights loaded before any is used (the chain of sums stays in order): at decode the
  // loop is bound by load latency, not by the adds.
  constexpr int kAhead = 16;
  int n = 0;
  for (; n + kAhead <= d_nope; n += kAhead) {
    float wv[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) wv[j] = to_f32(__ldg(w + static_cast<int64_t>(n + j) * R));
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
#pragma unroll
      for (int p = 0; p < P; ++p) acc[p] = __fadd_rn(acc[p], __fmul_rn(qs[p * d_nope + n + j], wv[j]));
    }
  }
  for (; n < d_nope; ++n) {
    const float wv = to_f32(w[n * R]);
#pragma unroll
    for (int p = 0; p < P; ++p) acc[p] = __fadd_rn(acc[p], __fmul_rn(qs[p * d_nope + n], wv));
  }
}

// Arm 1's activation tile: dst [P, width] (shared memory) row p < np gets head h's row of
// position t0 + p of x [T, H, width], rows np..P-1 zeros; the whole block strides over it.
template <int P>
__device__ __forceinline__ void stage_positions(float* dst, const float* __restrict__ x, int t0,
                                                int np, int H, int h, int width) {
  for (int k = threadIdx.x; k < P * width; k += blockDim.x) {
    const int p = k / width, n = k - p * width;
    dst[k] = p < np ? x[(static_cast<int64_t>(t0 + p) * H + h) * width + n] : 0.0f;
  }
}

// q_lat[t, h, r] for r in this block's output range [blockIdx.x * r_chunk, +r_chunk) and the
// positions of tile blockIdx.z (grid-stride over tiles). Grid (ceil(R / r_chunk), H, tiles).
template <int P, typename Tw>
__global__ void absorb_kernel(const float* __restrict__ q_nope, const Tw* __restrict__ kv_b, int T,
                              int H, int d_nope, int d_v, int R, int r_chunk,
                              float* __restrict__ q_lat) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float qs[];  // [P, d_nope]
  const int h = blockIdx.y;
  const int r_begin = blockIdx.x * r_chunk;
  const int r_end = min(R, r_begin + r_chunk);
  const Tw* wh = kv_b + static_cast<int64_t>(h) * (d_nope + d_v) * R;
  const int tiles = (T + P - 1) / P;
  for (int tile = blockIdx.z; tile < tiles; tile += gridDim.z) {
    const int t0 = tile * P;
    const int np = min(P, T - t0);
    stage_positions<P>(qs, q_nope, t0, np, H, h, d_nope);
    __syncthreads();
    for (int r = r_begin + threadIdx.x; r < r_end; r += blockDim.x) {
      float acc[P];
      absorb_dot<P>(qs, d_nope, wh + r, R, acc);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (p < np) q_lat[(static_cast<int64_t>(t0 + p) * H + h) * R + r] = acc[p];
      }
    }
    __syncthreads();  // qs is rewritten by the next tile
  }
}

// THE dot routine of decompress (arms 1 and 2), one thread per output: acc[p] = sum_r W[v, r] *
// o[p, r], r ascending from 0, products and sums rounded separately (the CPU's
// `acc += row[r] * o[r]`). kVec: the row is read 16 bytes at a time (R * sizeof(Tw) a multiple
// of 16 and kv_b 16-byte aligned); the arithmetic is the same either way. os [P, R] in shared
// memory (every thread reads the same word: a broadcast).
template <int P, bool kVec, typename Tw>
__device__ __forceinline__ void decompress_dot(const float* os, int R, const Tw* __restrict__ wrow,
                                               float (&acc)[P]) {
#pragma unroll
  for (int p = 0; p < P; ++p) acc[p] = 0.0f;
  int r = 0;
  if constexpr (kVec) {
    constexpr int V = 16 / sizeof(Tw);
    constexpr int kAhead = 4;  // 16-byte loads in flight before the first is used
    for (; r + kAhead * V <= R; r += kAhead * V) {
      uint4 raw[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) raw[u] = __ldg(reinterpret_cast<const uint4*>(wrow + r + u * V));
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        Tw wv[V];
        memcpy(wv, &raw[u], sizeof(raw[u]));
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float w = to_f32(wv[e]);
#pragma unroll
          for (int p = 0; p < P; ++p) acc[p] = __fadd_rn(acc[p], __fmul_rn(w, os[p * R + r + u * V + e]));
        }
      }
    }
    for (; r + V <= R; r += V) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(wrow + r));
      Tw wv[V];
      memcpy(wv, &raw, sizeof(raw));
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float w = to_f32(wv[e]);
#pragma unroll
        for (int p = 0; p < P; ++p) acc[p] = __fadd_rn(acc[p], __fmul_rn(w, os[p * R + r + e]));
      }
    }
  }
  for (; r < R; ++r) {
    const float w = to_f32(wrow[r]);
#pragma unroll
    for (int p = 0; p < P; ++p) acc[p] = __fadd_rn(acc[p], __fmul_rn(w, os[p * R + r]));
  }
}

// out[t, h, v] for v in [blockIdx.x * v_chunk, +v_chunk), threads striding over v. Grid
// (ceil(d_v / v_chunk), H, tiles).
template <int P, bool kVec, typename Tw>
__global__ void decompress_kernel(const float* __restrict__ o_lat, const Tw* __restrict__ kv_b,
                                  int T, int H, int d_nope, int d_v, int R, int v_chunk,
                                  float* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float os[];  // [P, R]
  const int h = blockIdx.y;
  const int v_begin = blockIdx.x * v_chunk;
  const int v_end = min(d_v, v_begin + v_chunk);
  const Tw* wv = kv_b + (static_cast<int64_t>(h) * (d_nope + d_v) + d_nope) * R;
  const int tiles = (T + P - 1) / P;
  for (int tile = blockIdx.z; tile < tiles; tile += gridDim.z) {
    const int t0 = tile * P;
    const int np = min(P, T - t0);
    stage_positions<P>(os, o_lat, t0, np, H, h, R);
    __syncthreads();
    for (int v = v_begin + threadIdx.x; v < v_end; v += blockDim.x) {
      float acc[P];
      decompress_dot<P, kVec>(os, R, wv + static_cast<int64_t>(v) * R, acc);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (p < np) out[(static_cast<int64_t>(t0 + p) * H + h) * d_v + v] = acc[p];
      }
    }
    __syncthreads();
  }
}

// Arm 2's fallback (a tile too large for the streaming kernel): arm 1's kernel, outputs split.
constexpr int kAbsorbSplitChunk = 32;     // outputs (of R) per block, one warp
constexpr int kDecompressSplitChunk = 32;  // outputs (of d_v) per block, one warp

enum class Proj { kAbsorb, kDecompress };

template <int P, typename Tw>
int launch_proj_p(MemraCudaCtx* ctx, Proj which, const float* x, const void* kv_b, int T, int H,
                  int d_nope, int d_v, int R, bool split, float* y) {
  const Tw* w = static_cast<const Tw*>(kv_b);
  const unsigned tiles = std::min<unsigned>(ceil_div(T, P), 65535u);
  // + kSmemPad floats: compute-sanitizer's memcheck saw absorb_dot's unrolled tail read 12 bytes
  // past a 20-byte qs (d_nope = 5, P = 1; loads the code never uses, merged by the compiler), so
  // the window ends at least 16 bytes after the last element.
  constexpr size_t kSmemPad = 4;
  if (which == Proj::kAbsorb) {
    const size_t smem = sizeof(float) * (P * static_cast<size_t>(d_nope) + kSmemPad);
    MEMRA_CUDA_RETURN_IF(allow_smem(ctx, absorb_kernel<P, Tw>, smem));
    const int chunk = split ? kAbsorbSplitChunk : R;
    const int threads = split ? 32 : 256;
    const dim3 grid(ceil_div(R, chunk), H, tiles);
    memra::cuda::launch(ctx, true, absorb_kernel<P, Tw>, dim3(grid), dim3(threads), smem, x, w, T,
        H, d_nope, d_v, R, chunk, y);
  } else {
    const size_t smem = sizeof(float) * (P * static_cast<size_t>(R) + kSmemPad);
    const int chunk = split ? kDecompressSplitChunk : d_v;
    const int threads = split ? 32 : 256;
    const dim3 grid(ceil_div(d_v, chunk), H, tiles);
    const bool vec = reinterpret_cast<uintptr_t>(kv_b) % 16 == 0 && (R * sizeof(Tw)) % 16 == 0;
    if (vec) {
      MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decompress_kernel<P, true, Tw>, smem));
      memra::cuda::launch(ctx, true, decompress_kernel<P, true, Tw>, dim3(grid), dim3(threads),
          smem, x, w, T, H, d_nope, d_v, R, chunk, y);
    } else {
      MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decompress_kernel<P, false, Tw>, smem));
      memra::cuda::launch(ctx, true, decompress_kernel<P, false, Tw>, dim3(grid), dim3(threads),
          smem, x, w, T, H, d_nope, d_v, R, chunk, y);
    }
  }
  return launch_status();
}

// Positions per block: P depends on T only (never on the arm), though the bytes of an output do
// not depend on P either (one independent chain per position).
template <typename Tw>
int launch_proj(MemraCudaCtx* ctx, Proj which, const float* x, const void* kv_b, int T, int H,
                int d_nope, int d_v, int R, bool split, float* y) {
  if (T == 1) return launch_proj_p<1, Tw>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, split, y);
  if (T <= 4) return launch_proj_p<4, Tw>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, split, y);
  return launch_proj_p<8, Tw>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, split, y);
}

int launch_proj_any(MemraCudaCtx* ctx, Proj which, const float* x, const void* kv_b, int w_dtype,
                    int T, int H, int d_nope, int d_v, int R, bool split, float* y) {
  switch (w_dtype) {
    case 0: return launch_proj<float>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, split, y);
    case 1: return launch_proj<__nv_bfloat16>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, split, y);
    case 2: return launch_proj<__half>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, split, y);
    default: return memra::kContractDType;
  }
}

// ---------------------------------------------------------------- streaming arm (arm 2)
//
// At decode (small T) the projections are bound by reading kv_b, each weight once per call.
// A block owns one head and a tile of that head's outputs, with every weight of the tile:
//   absorb:     128 bytes of each of the d_nope rows of W_uk[h] (64 bf16 / 32 f32 columns r);
//   decompress: kDecompressRows (16) whole rows v of W_uv[h] (R columns each),
// and loops over the positions in tiles (the weights stay in shared memory). The whole weight
// tile is requested at once with 16-byte cp.async, in kStreamStages commit groups along the
// reduction index (absorb: rows n; decompress: columns r); the arithmetic of stage s starts as
// soon as group s has landed while the later groups are still in flight, so the sequential
// chains overlap the stream and only the last stage's arithmetic trails it. The first position
// tile's activations (f32, a few KiB from L2) travel in group 0; later tiles are staged after a
// barrier. GLM-5.3-Flash (H = 64, d_nope = d_v = 128, R = 512, bf16 kv_b): absorb and
// decompress each 512 blocks of 128 threads with 16 KiB of weights, all resident at once
// (~4 blocks, ~64 KiB of loads in flight per SM of an H200's 132).
//
// Every output is still one sequential chain computed by one thread, the same operations in
// the same order as arm 1's absorb_dot / decompress_dot (from 0, reduction index ascending,
// __fmul_rn then __fadd_rn, bf16 / f16 widened exactly): arm 2 equals arm 1, and the CPU, byte
// for byte; a chain is never split across threads, and nothing is summed atomically.
// Lanes: absorb, one 32-bit word of the tile row per lane (E = 2 bf16 / 1 f32 columns) and P
// positions (P = 1 for T <= 4, 2 for T <= 8, else 4), a warp per group of P positions
// (kAbsorbGroups groups: position tile 4P); decompress, one row v per thread and P positions
// (P = 1 for T = 1, else 2), kDecompressGroups groups of 16 threads (position tile 8P). Shared
// memory reads are conflict-free (absorb: a warp reads 128 contiguous bytes of W and broadcasts
// q; decompress: padded row strides, o broadcast within a group). Without FMA the arithmetic is
// ~2.5 issued instructions a (weight, position) pair, so from T ~ 8 on the kernel is bound by
// the FP32 issue rate rather than by the stream (~0.35 us a position at GLM's shapes on an H200,
// estimated); positions are split over blocks (grid z) only when heads x tiles would not give
// every SM two blocks.

constexpr int kStreamThreads = 128;
constexpr int kStreamStages = 4;
constexpr int kAbsorbTileBytes = 128;  // bytes of every W_uk row per block: a 32-bit word a lane
constexpr int kAbsorbGroups = kStreamThreads / 32;
constexpr int kDecompressRows = 16;  // rows v of W_uv per block
constexpr int kDecompressGroups = kStreamThreads / kDecompressRows;
constexpr size_t kStreamSmemCap = 112 * 1024;  // larger tiles: the per-position kernel's split
constexpr int kStreamAutoMaxT = 64;  // arm 0 takes arm 2 below this T (and Lt from it, bf16)
static_assert(kStreamStages == 4, "cp_async_wait_stage is written for 4 stages");

// This thread's commit groups 0..s have landed (kStreamStages groups were committed).
__device__ __forceinline__ void cp_async_wait_stage(int s) {
  switch (kStreamStages - 1 - s) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
  }
}

// Before the streaming kernels consume stage s: a block's first position tile waits for its
// own copies of stage s and then the barrier publishes everyone's; later tiles (the weights are
// all in place) only need the barrier once, at s == 0, for the re-staged activations.
__device__ __forceinline__ void stage_landed(int s, bool first) {
  if (first) {
    cp_async_wait_stage(s);
    __syncthreads();
  } else if (s == 0) {
    __syncthreads();
  }
}

// Stage an activation tile: row p < valid of dst ([rows, stride] f32 in shared memory) gets
// x + p * ld (K floats) by cp.async (the caller commits), rows valid..rows-1 get zeros. vec:
// 16-byte copies (K % 4 == 0, x and ld 16-byte aligned), else 4-byte ones.
__device__ __forceinline__ void stage_act(float* dst, int stride, const float* x, int64_t ld,
                                          int valid, int rows, int K, bool vec) {
  if (vec) {
    const int k4 = K / 4;
#pragma unroll 1  // asynchronous copies: no unrolling needed to keep them in flight
    for (int i = threadIdx.x; i < rows * k4; i += kStreamThreads) {
      const int p = i / k4, c = 4 * (i - p * k4);
      float* d = dst + p * stride + c;
      if (p < valid) {
        cp_async_16(d, x + p * ld + c);
      } else {
        *reinterpret_cast<float4*>(d) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  } else {
#pragma unroll 1
    for (int i = threadIdx.x; i < rows * K; i += kStreamThreads) {
      const int p = i / K, c = i - p * K;
      float* d = dst + p * stride + c;
      if (p < valid) {
        cp_async_4(d, x + p * ld + c);
      } else {
        *d = 0.0f;
      }
    }
  }
}

// The raw bits of a weight element (copies without conversion; 0 is +0.0 in every format).
template <typename Tw>
using WeightBits = std::conditional_t<sizeof(Tw) == 2, uint16_t, uint32_t>;

// Stage s of a reduction of length n cut in units of `unit` (the last unit may be partial):
// [*b, *e), stage boundaries on unit boundaries. The issue and compute sides use the same cut.
__device__ __forceinline__ void stage_range(int s, int n, int unit, int* b, int* e) {
  const int units = (n + unit - 1) / unit;
  *b = s * units / kStreamStages * unit;
  *e = min(n, (s + 1) * units / kStreamStages * unit);
}

// The streaming kernels' prologue: the weight tile requested in kStreamStages commit groups
// (issue_weights(s)), the first position tile's activations with group 0 (stage_first()). With
// prefetch (resident weights: no queued kernel writes kv_b) the weights are requested before
// pdl_wait, streaming under the previous kernel, and everything has landed before the first
// tile's arithmetic; without, after it, stage by stage.
template <typename IssueWeights, typename StageFirst>
__device__ __forceinline__ void stream_prologue(int prefetch, IssueWeights&& issue_weights,
                                                StageFirst&& stage_first) {
  if (prefetch) {
#pragma unroll 1
    for (int s = 0; s < kStreamStages; ++s) issue_weights(s);
  }
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  if (prefetch) {
    stage_first();
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  } else {
#pragma unroll 1
    for (int s = 0; s < kStreamStages; ++s) {
      issue_weights(s);
      if (s == 0) stage_first();
      cp_async_commit();
    }
  }
}

// Absorb: the terms of rows n..n+3 for one lane (its 32-bit word of each row, E columns) and P
// positions, n ascending within every chain.
template <int P, typename Tw>
__device__ __forceinline__ void absorb_terms4(const uint32_t (&w)[4], const float4 (&q)[P],
                                              float (&acc)[P][4 / sizeof(Tw)]) {
  constexpr int E = 4 / static_cast<int>(sizeof(Tw));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    Tw wv[E];
    memcpy(wv, &w[j], sizeof(w[j]));
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const float a = j == 0 ? q[p].x : (j == 1 ? q[p].y : (j == 2 ? q[p].z : q[p].w));
#pragma unroll
      for (int e = 0; e < E; ++e) acc[p][e] = __fadd_rn(acc[p][e], __fmul_rn(a, to_f32(wv[e])));
    }
  }
}

// q_lat[t, h, r] for r in [blockIdx.x * OC, +OC) (OC = 128 bytes of columns) and every position
// of tiles blockIdx.z, blockIdx.z + gridDim.z, ... (PT = kAbsorbGroups * P positions a tile).
// Grid (ceil(R / OC), H, tiles or fewer). Shared: W tile [d_nope][OC] of Tw, then q tile
// [qrows][qstride] f32 (qstride = d_nope rounded up to 4). kVec: kv_b 16-byte aligned and
// R * sizeof(Tw) % 16 == 0. xvec: see stage_act (q_nope 16-byte aligned, d_nope % 4 == 0).
// Stages cut the rows n in units of 4.
template <int P, bool kVec, typename Tw>
__global__ void __launch_bounds__(kStreamThreads)
    absorb_stream_kernel(const float* __restrict__ q_nope, const Tw* __restrict__ kv_b, int T,
                         int H, int d_nope, int d_v, int R, int qstride, int qrows, bool xvec,
                         float* __restrict__ q_lat, int prefetch) {
  constexpr int OC = kAbsorbTileBytes / static_cast<int>(sizeof(Tw));
  constexpr int E = 4 / static_cast<int>(sizeof(Tw));  // columns per lane (one 32-bit word)
  constexpr int V = 16 / static_cast<int>(sizeof(Tw));
  constexpr int PT = kAbsorbGroups * P;
  extern __shared__ __align__(16) unsigned char stream_smem[];
  Tw* ws = reinterpret_cast<Tw*>(stream_smem);
  float* qs =
      reinterpret_cast<float*>(stream_smem + static_cast<size_t>(d_nope) * kAbsorbTileBytes);
  const int tid = threadIdx.x, lane = tid & 31, grp = tid >> 5;
  const int h = blockIdx.y, r0 = blockIdx.x * OC;
  const int ncols = min(OC, R - r0);
  const Tw* wk = kv_b + static_cast<int64_t>(h) * (d_nope + d_v) * R + r0;
  const int64_t qld = static_cast<int64_t>(H) * d_nope;  // position stride of q_nope
  const int tiles = (T + PT - 1) / PT;

  // The weights of stage s (rows n of the tile), requested.
  auto issue_weights = [&](int s) {
    int nb, ne;
    stage_range(s, d_nope, 4, &nb, &ne);
    if constexpr (kVec) {
      const int cpr = ncols / V;  // 16-byte chunks a row
#pragma unroll 1
      for (int i = tid; i < (ne - nb) * cpr; i += kStreamThreads) {
        const int j = i / cpr, n = nb + j, c = (i - j * cpr) * V;
        cp_async_16(ws + n * OC + c, wk + static_cast<int64_t>(n) * R + c);
      }
    } else {
      using B = WeightBits<Tw>;
      const B* src = reinterpret_cast<const B*>(wk);
      B* dst = reinterpret_cast<B*>(ws);
      for (int i = tid; i < (ne - nb) * OC; i += kStreamThreads) {
        const int j = i / OC, n = nb + j, c = i - j * OC;
        dst[n * OC + c] = c < ncols ? src[static_cast<int64_t>(n) * R + c] : B(0);
      }
    }
  };
  auto stage_first_q = [&] {
    const int t0 = blockIdx.z * PT;
    stage_act(qs, qstride, q_nope + (static_cast<int64_t>(t0) * H + h) * d_nope, qld,
              min(PT, T - t0), qrows, d_nope, xvec);
  };
  // The whole weight tile in flight, one commit group a stage; the first tile's q in group 0.
  stream_prologue(prefetch, issue_weights, stage_first_q);

  const uint32_t* wcol = reinterpret_cast<const uint32_t*>(ws) + lane;  // row n: wcol[n * 32]
  const int pb = grp * P;  // this warp's first position in the tile
  for (int tile = blockIdx.z; tile < tiles; tile += gridDim.z) {
    const int t0 = tile * PT, np = min(PT, T - t0);
    const bool staged = tile == static_cast<int>(blockIdx.z);  // q staged above
    const bool first = staged && !prefetch;  // the weights still landing stage by stage
    if (!staged) {
      __syncthreads();  // every thread is done with the previous tile's qs
      stage_act(qs, qstride, q_nope + (static_cast<int64_t>(t0) * H + h) * d_nope, qld, np, qrows,
                d_nope, xvec);
      cp_async_commit();
      cp_async_wait<0>();
    }
    const bool on = pb < np && lane * E < ncols;
    const float* q = qs + pb * qstride;
    float acc[P][E];
#pragma unroll
    for (int p = 0; p < P; ++p) {
#pragma unroll
      for (int e = 0; e < E; ++e) acc[p][e] = 0.0f;
    }
#pragma unroll 1
    for (int s = 0; s < kStreamStages; ++s) {
      stage_landed(s, first);
      if (!on) continue;
      int nb, ne;
      stage_range(s, d_nope, 4, &nb, &ne);
      const int n4 = nb + (ne - nb) / 4 * 4;  // end of the whole groups of 4 rows
      int n = nb;
      if (n < n4) {
        // Software-pipelined: the next group's words and q are loaded before this group's
        // terms (the last group reloads itself).
        uint32_t w[4];
        float4 q4[P];
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = wcol[(n + j) * 32];
#pragma unroll
        for (int p = 0; p < P; ++p) q4[p] = *reinterpret_cast<const float4*>(q + p * qstride + n);
        for (; n < n4; n += 4) {
          const int nn = min(n + 4, n4 - 4);
          uint32_t wn[4];
          float4 qn[P];
#pragma unroll
          for (int j = 0; j < 4; ++j) wn[j] = wcol[(nn + j) * 32];
#pragma unroll
          for (int p = 0; p < P; ++p) {
            qn[p] = *reinterpret_cast<const float4*>(q + p * qstride + nn);
          }
          absorb_terms4<P, Tw>(w, q4, acc);
#pragma unroll
          for (int j = 0; j < 4; ++j) w[j] = wn[j];
#pragma unroll
          for (int p = 0; p < P; ++p) q4[p] = qn[p];
        }
      }
      for (; n < ne; ++n) {  // d_nope % 4 rows at the end of the last stage
        const uint32_t word = wcol[n * 32];
        Tw wv[E];
        memcpy(wv, &word, sizeof(word));
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float a = q[p * qstride + n];
#pragma unroll
          for (int e = 0; e < E; ++e) acc[p][e] = __fadd_rn(acc[p][e], __fmul_rn(a, to_f32(wv[e])));
        }
      }
    }
    if (on) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (pb + p < np) {
          float* dst = q_lat + (static_cast<int64_t>(t0 + pb + p) * H + h) * R + r0 + lane * E;
#pragma unroll
          for (int e = 0; e < E; ++e) {
            if (lane * E + e < ncols) dst[e] = acc[p][e];
          }
        }
      }
    }
  }
}

// Decompress: the terms of columns r..r+V-1 (one 16-byte weight chunk) for one row and P
// positions, r ascending within every chain.
template <int P, typename Tw>
__device__ __forceinline__ void decompress_terms(const uint4& raw,
                                                 const float4 (&o)[P][4 / sizeof(Tw)],
                                                 float (&acc)[P]) {
  constexpr int V = 16 / static_cast<int>(sizeof(Tw));
  Tw wv[V];
  memcpy(wv, &raw, sizeof(raw));
#pragma unroll
  for (int k = 0; k < V / 4; ++k) {
    const float w0 = to_f32(wv[4 * k]), w1 = to_f32(wv[4 * k + 1]);
    const float w2 = to_f32(wv[4 * k + 2]), w3 = to_f32(wv[4 * k + 3]);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      acc[p] = __fadd_rn(acc[p], __fmul_rn(w0, o[p][k].x));
      acc[p] = __fadd_rn(acc[p], __fmul_rn(w1, o[p][k].y));
      acc[p] = __fadd_rn(acc[p], __fmul_rn(w2, o[p][k].z));
      acc[p] = __fadd_rn(acc[p], __fmul_rn(w3, o[p][k].w));
    }
  }
}

// out[t, h, v] for v in [blockIdx.x * 16, +16) and every position of tiles blockIdx.z,
// blockIdx.z + gridDim.z, ... (PT = kDecompressGroups * P positions a tile). Grid
// (ceil(d_v / 16), H, tiles or fewer). Shared: W tile [16][wstride] of Tw (wstride * sizeof(Tw)
// an odd multiple of 16 bytes: the 8 rows a quarter-warp reads at one column fall on distinct
// bank groups), then o tile [orows][ostride] f32 (ostride * 4 also an odd multiple of 16).
// kVec: kv_b 16-byte aligned and R * sizeof(Tw) % 16 == 0. xvec: o_lat 16-byte aligned, R % 4
// == 0. Stages cut the columns r in units of V = 16 / sizeof(Tw).
template <int P, bool kVec, typename Tw>
__global__ void __launch_bounds__(kStreamThreads)
    decompress_stream_kernel(const float* __restrict__ o_lat, const Tw* __restrict__ kv_b, int T,
                             int H, int d_nope, int d_v, int R, int wstride, int ostride,
                             int orows, bool xvec, float* __restrict__ out, int prefetch) {
  constexpr int OC = kDecompressRows;
  constexpr int V = 16 / static_cast<int>(sizeof(Tw));
  constexpr int V4 = V / 4;
  constexpr int PT = kDecompressGroups * P;
  extern __shared__ __align__(16) unsigned char stream_smem[];
  Tw* ws = reinterpret_cast<Tw*>(stream_smem);
  float* os =
      reinterpret_cast<float*>(stream_smem + sizeof(Tw) * static_cast<size_t>(OC) * wstride);
  const int tid = threadIdx.x;
  const int h = blockIdx.y, v0 = blockIdx.x * OC;
  const int nv = min(OC, d_v - v0);
  const Tw* wv = kv_b + (static_cast<int64_t>(h) * (d_nope + d_v) + d_nope + v0) * R;
  const int64_t old = static_cast<int64_t>(H) * R;  // position stride of o_lat
  const int tiles = (T + PT - 1) / PT;

  // The weights of stage s (columns r of the tile's rows), requested.
  auto issue_weights = [&](int s) {
    int rb, re;
    stage_range(s, R, V, &rb, &re);
    const int w = re - rb;
    if constexpr (kVec) {
      const int wc = w / V;  // 16-byte chunks a row in this stage
#pragma unroll 1
      for (int i = tid; i < nv * wc; i += kStreamThreads) {
        const int j = i / wc, c = rb + (i - j * wc) * V;
        cp_async_16(ws + j * wstride + c, wv + static_cast<int64_t>(j) * R + c);
      }
    } else {
      using B = WeightBits<Tw>;
      const B* src = reinterpret_cast<const B*>(wv);
      B* dst = reinterpret_cast<B*>(ws);
      for (int i = tid; i < nv * w; i += kStreamThreads) {
        const int j = i / w, r = rb + i - j * w;
        dst[j * wstride + r] = src[static_cast<int64_t>(j) * R + r];
      }
    }
  };
  auto stage_first_o = [&] {
    const int t0 = blockIdx.z * PT;
    stage_act(os, ostride, o_lat + (static_cast<int64_t>(t0) * H + h) * R, old, min(PT, T - t0),
              orows, R, xvec);
  };
  // The whole weight tile in flight, one commit group a stage; the first tile's o in group 0.
  stream_prologue(prefetch, issue_weights, stage_first_o);

  const int v = tid % OC, pb = (tid / OC) * P;
  const Tw* wrow = ws + v * wstride;
  for (int tile = blockIdx.z; tile < tiles; tile += gridDim.z) {
    const int t0 = tile * PT, np = min(PT, T - t0);
    const bool staged = tile == static_cast<int>(blockIdx.z);  // o staged above
    const bool first = staged && !prefetch;  // the weights still landing stage by stage
    if (!staged) {
      __syncthreads();  // every thread is done with the previous tile's os
      stage_act(os, ostride, o_lat + (static_cast<int64_t>(t0) * H + h) * R, old, np, orows, R,
                xvec);
      cp_async_commit();
      cp_async_wait<0>();
    }
    const bool on = pb < np && v < nv;
    const float* o = os + pb * ostride;
    float acc[P];
#pragma unroll
    for (int p = 0; p < P; ++p) acc[p] = 0.0f;
#pragma unroll 1
    for (int s = 0; s < kStreamStages; ++s) {
      stage_landed(s, first);
      if (!on) continue;
      int rb, re;
      stage_range(s, R, V, &rb, &re);
      const int rv = rb + (re - rb) / V * V;  // end of the whole chunks
      int r = rb;
      if (r < rv) {
        // Software-pipelined: the next chunk's weights and activations are loaded before this
        // chunk's terms (the last chunk reloads itself).
        uint4 wr = *reinterpret_cast<const uint4*>(wrow + r);
        float4 ov[P][V4];
#pragma unroll
        for (int p = 0; p < P; ++p) {
#pragma unroll
          for (int k = 0; k < V4; ++k) {
            ov[p][k] = *reinterpret_cast<const float4*>(o + p * ostride + r + 4 * k);
          }
        }
        for (; r < rv; r += V) {
          const int rn = min(r + V, rv - V);
          const uint4 wn = *reinterpret_cast<const uint4*>(wrow + rn);
          float4 on4[P][V4];
#pragma unroll
          for (int p = 0; p < P; ++p) {
#pragma unroll
            for (int k = 0; k < V4; ++k) {
              on4[p][k] = *reinterpret_cast<const float4*>(o + p * ostride + rn + 4 * k);
            }
          }
          decompress_terms<P, Tw>(wr, ov, acc);
          wr = wn;
#pragma unroll
          for (int p = 0; p < P; ++p) {
#pragma unroll
            for (int k = 0; k < V4; ++k) ov[p][k] = on4[p][k];
          }
        }
      }
      if constexpr (!kVec) {
        for (; r < re; ++r) {  // R % V columns at the end of the last stage
          const float w = to_f32(wrow[r]);
#pragma unroll
          for (int p = 0; p < P; ++p) acc[p] = __fadd_rn(acc[p], __fmul_rn(w, o[p * ostride + r]));
        }
      }
    }
    if (on) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (pb + p < np) out[(static_cast<int64_t>(t0 + pb + p) * H + h) * d_v + v0 + v] = acc[p];
      }
    }
  }
}

// Launch shape of the streaming arm; false when the tile does not fit kStreamSmemCap (or the
// device's opt-in limit): the caller then takes the per-position kernel's split.
struct StreamShape {
  int p = 1;        // positions a thread
  int rows = 0;     // activation rows in shared memory (min(tile, T rounded up to p))
  int wstride = 0;  // decompress: W_uv row stride in shared memory (elements)
  int xstride = 0;  // activation row stride in shared memory (floats)
  size_t smem = 0;
  dim3 grid;
};

// Bytes rounded up to 16-byte units, the count made odd.
int64_t odd_units(int64_t bytes) { return ((bytes + 15) / 16) | 1; }

bool stream_shape(Proj which, int wsize, int T, int H, int d_nope, int d_v, int R, int sms,
                  size_t cap, StreamShape* s) {
  int64_t pt = 0, gx = 0, w_bytes = 0;
  if (which == Proj::kAbsorb) {
    s->p = T <= 4 ? 1 : (T <= 8 ? 2 : 4);
    pt = static_cast<int64_t>(kAbsorbGroups) * s->p;
    s->xstride = (d_nope + 3) / 4 * 4;
    gx = ceil_div(R, kAbsorbTileBytes / wsize);
    w_bytes = static_cast<int64_t>(d_nope) * kAbsorbTileBytes;
  } else {
    s->p = T == 1 ? 1 : 2;
    pt = static_cast<int64_t>(kDecompressGroups) * s->p;
    const int64_t wunits = odd_units(static_cast<int64_t>(R) * wsize);
    const int64_t xunits = odd_units(static_cast<int64_t>(R) * 4);
    if (wunits * 16 / wsize > INT_MAX || xunits * 4 > INT_MAX) return false;
    s->wstride = static_cast<int>(wunits * 16 / wsize);
    s->xstride = static_cast<int>(xunits * 4);
    gx = ceil_div(d_v, kDecompressRows);
    w_bytes = static_cast<int64_t>(kDecompressRows) * s->wstride * wsize;
  }
  const int64_t rows = std::min<int64_t>(pt, (static_cast<int64_t>(T) + s->p - 1) / s->p * s->p);
  s->rows = static_cast<int>(rows);
  const int64_t bytes = w_bytes + 4 * rows * s->xstride;
  if (bytes > static_cast<int64_t>(cap)) return false;
  s->smem = static_cast<size_t>(bytes);
  // Positions split over blocks only when heads x tiles would not give every SM two blocks
  // (each z re-reads the weights, from L2).
  const int64_t tiles = (T + pt - 1) / pt;
  const int64_t xy = gx * H;
  const int64_t want = std::max<int64_t>(1, (2LL * sms + xy - 1) / xy);
  const int64_t gz = std::min<int64_t>({tiles, want, 65535});
  s->grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(H), static_cast<unsigned>(gz));
  return true;
}

template <int P, typename Tw>
int launch_absorb_stream(MemraCudaCtx* ctx, const float* x, const Tw* w, int T, int H, int d_nope,
                         int d_v, int R, const StreamShape& s, bool wvec, bool xvec, float* y) {
  auto* k = wvec ? absorb_stream_kernel<P, true, Tw> : absorb_stream_kernel<P, false, Tw>;
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, k, s.smem));
  const int prefetch = ctx->resident_weights > 0 ? 1 : 0;  // kv_b is the layer's own upload
  memra::cuda::launch(ctx, true, k, dim3(s.grid), dim3(kStreamThreads), s.smem, x, w, T, H, d_nope,
      d_v, R, s.xstride, s.rows, xvec, y, prefetch);
  return launch_status();
}

template <int P, typename Tw>
int launch_decompress_stream(MemraCudaCtx* ctx, const float* x, const Tw* w, int T, int H,
                             int d_nope, int d_v, int R, const StreamShape& s, bool wvec, bool xvec,
                             float* y) {
  auto* k = wvec ? decompress_stream_kernel<P, true, Tw> : decompress_stream_kernel<P, false, Tw>;
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, k, s.smem));
  const int prefetch = ctx->resident_weights > 0 ? 1 : 0;  // kv_b is the layer's own upload
  memra::cuda::launch(ctx, true, k, dim3(s.grid), dim3(kStreamThreads), s.smem, x, w, T, H, d_nope,
      d_v, R, s.wstride, s.xstride, s.rows, xvec, y, prefetch);
  return launch_status();
}

// Arm 2. *declined (nothing enqueued) when the tile does not fit shared memory.
template <typename Tw>
int launch_stream(MemraCudaCtx* ctx, Proj which, const float* x, const void* kv_b, int T, int H,
                  int d_nope, int d_v, int R, float* y, bool* declined) {
  *declined = false;
  int sms = 0, optin = 0;
  MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMultiProcessorCount, &sms));
  MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin));
  StreamShape s;
  const size_t cap = std::min(kStreamSmemCap, static_cast<size_t>(optin));
  if (!stream_shape(which, sizeof(Tw), T, H, d_nope, d_v, R, sms, cap, &s)) {
    *declined = true;
    return memra::kOk;
  }
  const Tw* w = static_cast<const Tw*>(kv_b);
  const bool wvec = reinterpret_cast<uintptr_t>(kv_b) % 16 == 0 && (R * sizeof(Tw)) % 16 == 0;
  const int K = which == Proj::kAbsorb ? d_nope : R;
  const bool xvec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && K % 4 == 0;
  if (which == Proj::kAbsorb) {
    switch (s.p) {
      case 1:
        return launch_absorb_stream<1, Tw>(ctx, x, w, T, H, d_nope, d_v, R, s, wvec, xvec, y);
      case 2:
        return launch_absorb_stream<2, Tw>(ctx, x, w, T, H, d_nope, d_v, R, s, wvec, xvec, y);
      default:
        return launch_absorb_stream<4, Tw>(ctx, x, w, T, H, d_nope, d_v, R, s, wvec, xvec, y);
    }
  }
  if (s.p == 1) {
    return launch_decompress_stream<1, Tw>(ctx, x, w, T, H, d_nope, d_v, R, s, wvec, xvec, y);
  }
  return launch_decompress_stream<2, Tw>(ctx, x, w, T, H, d_nope, d_v, R, s, wvec, xvec, y);
}

int launch_stream_any(MemraCudaCtx* ctx, Proj which, const float* x, const void* kv_b, int w_dtype,
                      int T, int H, int d_nope, int d_v, int R, float* y, bool* declined) {
  switch (w_dtype) {
    case 0: return launch_stream<float>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, y, declined);
    case 1:
      return launch_stream<__nv_bfloat16>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, y, declined);
    case 2: return launch_stream<__half>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, y, declined);
    default: return memra::kContractDType;
  }
}

// ---------------------------------------------------------------- cuBLASLt arm

struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t heur{};
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Largest power of two (<= 256) dividing the base address, the leading dimension and the batch
// stride (all in bytes): the alignment every batch's matrix is guaranteed to have.
uint32_t alignment(uintptr_t addr, int64_t ld_bytes, int64_t stride_bytes) {
  const uint64_t v = static_cast<uint64_t>(addr) | static_cast<uint64_t>(ld_bytes) |
                     static_cast<uint64_t>(stride_bytes) | 256u;
  return static_cast<uint32_t>(v & (~v + 1));
}

int layout(cublasLtMatrixLayout_t* out, cudaDataType_t type, uint64_t rows, uint64_t cols,
           int64_t ld, int32_t batch, int64_t stride) {
  MEMRA_CUDA_RETURN_IF(status_of(cublasLtMatrixLayoutCreate(out, type, rows, cols, ld)));
  MEMRA_CUDA_RETURN_IF(status_of(cublasLtMatrixLayoutSetAttribute(
      *out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch))));
  return status_of(cublasLtMatrixLayoutSetAttribute(
      *out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

// Column-major D[m, n] (f32) = op(A)[m, k] (bf16) * B[k, n] (bf16), batched `batch` times with
// strides in elements. Plans only (no launch): *declined is set when cuBLASLt finds no algorithm.
int lt_plan(MemraCudaCtx* ctx, LtPlan& p, bool transa, int64_t m, int64_t n, int64_t k,
            int64_t lda, int64_t sa, uint32_t al_a, int64_t ldb, int64_t sb, uint32_t al_b,
            int64_t ldd, int64_t sd, uint32_t al_d, int batch, bool* declined) {
  *declined = false;
  MEMRA_CUDA_RETURN_IF(status_of(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F)));
  const cublasOperation_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = CUBLAS_OP_N;
  MEMRA_CUDA_RETURN_IF(status_of(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta))));
  MEMRA_CUDA_RETURN_IF(status_of(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb))));
  MEMRA_CUDA_RETURN_IF(layout(&p.a, CUDA_R_16BF, transa ? k : m, transa ? m : k, lda, batch, sa));
  MEMRA_CUDA_RETURN_IF(layout(&p.b, CUDA_R_16BF, k, n, ldb, batch, sb));
  MEMRA_CUDA_RETURN_IF(layout(&p.d, CUDA_R_32F, m, n, ldd, batch, sd));
  MEMRA_CUDA_RETURN_IF(status_of(cublasLtMatmulPreferenceCreate(&p.pref)));
  const uint64_t ws = ctx->lt_workspace_bytes;
  MEMRA_CUDA_RETURN_IF(status_of(cublasLtMatmulPreferenceSetAttribute(
      p.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws))));
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const uint32_t align[4] = {al_a, al_b, al_d, al_d};
  for (int i = 0; i < 4; ++i) {
    MEMRA_CUDA_RETURN_IF(status_of(
        cublasLtMatmulPreferenceSetAttribute(p.pref, which[i], &align[i], sizeof(align[i]))));
  }
  int returned = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx->lt, p.op, p.a, p.b, p.d, p.d,
                                                           p.pref, 1, &p.heur, &returned);
  if (st != CUBLAS_STATUS_SUCCESS || returned == 0) {
    *declined = st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_SUPPORTED;
    return st != CUBLAS_STATUS_SUCCESS ? status_of(st) : status_of(CUBLAS_STATUS_NOT_SUPPORTED);
  }
  return memra::kOk;
}

int lt_run(MemraCudaCtx* ctx, const LtPlan& p, const void* A, const void* B, float* D) {
  const float alpha = 1.0f, beta = 0.0f;
  return status_of(cublasLtMatmul(ctx->lt, p.op, &alpha, A, p.a, B, p.b, &beta, D, p.d, D, p.d,
                                  &p.heur.algo, ctx->lt_workspace, ctx->lt_workspace_bytes,
                                  ctx->stream));
}

// Arm 3 for bf16 kv_b: per head h (the batch), row-major
//   absorb:     q_lat_h [T, R]  = q_nope_h [T, d_nope] * W_uk[h] [d_nope, R]
//   decompress: out_h   [T, d_v] = o_lat_h [T, R] * W_uv[h]^T
// written column-major (D^T = ...): absorb D[R, T] = W_uk[h] (col-major R x d_nope, ld R) *
// Q^T (d_nope x T, ld H*d_nope); decompress D[d_v, T] = (W_uv[h] col-major R x d_v, ld R)^T *
// O^T (R x T, ld H*R). x is rounded to bf16 into Scratch after the plan succeeded.
int lt_proj(MemraCudaCtx* ctx, Proj which, const float* x, const void* kv_b, int T, int H,
            int d_nope, int d_v, int R, float* y, bool* declined) {
  const int64_t blk = static_cast<int64_t>(d_nope + d_v) * R;  // a head's kv_b block (elements)
  const bool absorb = which == Proj::kAbsorb;
  const int64_t k = absorb ? d_nope : R;    // reduction length
  const int64_t m = absorb ? R : d_v;       // outputs per (t, h)
  const int64_t xw = absorb ? d_nope : R;   // activation row per (t, h)
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(kv_b);
  const __nv_bfloat16* a = absorb ? w : w + static_cast<int64_t>(d_nope) * R;
  const int64_t n = static_cast<int64_t>(T) * H * xw;
  Scratch xb(ctx, sizeof(__nv_bfloat16) * static_cast<size_t>(n));
  MEMRA_CUDA_RETURN_IF(xb.status());
  const uint32_t al_a = alignment(reinterpret_cast<uintptr_t>(a), 2 * int64_t(R), 2 * blk);
  const uint32_t al_b = alignment(reinterpret_cast<uintptr_t>(xb.as<void>()), 2 * H * xw, 2 * xw);
  const uint32_t al_d = alignment(reinterpret_cast<uintptr_t>(y), 4 * H * m, 4 * m);
  LtPlan plan;
  MEMRA_CUDA_RETURN_IF(lt_plan(ctx, plan, /*transa=*/!absorb, m, T, k, R, blk, al_a, H * xw, xw,
                               al_b, H * m, m, al_d, H, declined));
  // Planned: only now round the activations (a decline leaves nothing enqueued but the free).
  MEMRA_CUDA_RETURN_IF(launch_convert(ctx, x, xb.as<__nv_bfloat16>(), n));
  return lt_run(ctx, plan, a, xb.as<__nv_bfloat16>(), y);
}

int proj_entry(MemraCudaCtx* ctx, Proj which, const float* x, const void* kv_b, int w_dtype, int T,
               int H, int d_nope, int d_v, int R, int arm, float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || H < 0 || d_nope < 0 || d_v < 0 || R < 1 || arm < 0 || arm > 3) {
    return memra::kContractValue;
  }
  if (w_dtype < 0 || w_dtype > 2) return memra::kContractDType;
  if (H > 65535) return memra::kUnsupportedGeometry;
  const int outs = which == Proj::kAbsorb ? R : d_v;
  if (T == 0 || H == 0 || outs == 0) return memra::kOk;
  if (!x || !kv_b || !y) return memra::kContractMissing;
  if (arm == 3) {
    if (w_dtype != 1) return memra::kUnsupported;  // the Lt arm is for bf16 weights
    bool declined = false;
    return lt_proj(ctx, which, x, kv_b, T, H, d_nope, d_v, R, y, &declined);
  }
  const int k = which == Proj::kAbsorb ? d_nope : R;
  if (arm == 0) {
    if (w_dtype == 1 && T >= 64 && k > 0) {
      bool declined = false;
      const int rc = lt_proj(ctx, which, x, kv_b, T, H, d_nope, d_v, R, y, &declined);
      if (!declined) return rc;
      arm = 1;  // cuBLASLt found no algorithm: the per-position kernel
    } else if (T < kStreamAutoMaxT) {
      arm = 2;
    } else {
      int sms = 0;
      MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMultiProcessorCount, &sms));
      const int p = T == 1 ? 1 : (T <= 4 ? 4 : 8);
      const long long blocks = static_cast<long long>(H) * ceil_div(T, p);
      arm = blocks < 2LL * sms ? 2 : 1;
    }
  }
  if (arm == 2) {
    bool declined = false;
    const int rc =
        launch_stream_any(ctx, which, x, kv_b, w_dtype, T, H, d_nope, d_v, R, y, &declined);
    if (!declined) return rc;
    // The tile does not fit shared memory: the per-position kernel, outputs split over blocks.
  }
  return launch_proj_any(ctx, which, x, kv_b, w_dtype, T, H, d_nope, d_v, R, arm == 2, y);
}

// ---------------------------------------------------------------- latent append

template <typename Tc>
__global__ void latent_append_kernel(const float* __restrict__ rows, int64_t n,
                                     Tc* __restrict__ dst) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = from_f32<Tc>(rows[i]);
  }
}

// ---------------------------------------------------------------- attention

constexpr int kAttnThreads = 256;  // 8 warps
constexpr int kWarps = kAttnThreads / 32;
constexpr int kTile = 32;          // cache rows per shared-memory tile (= warp size)
constexpr int kMaxAcc = 32;        // accumulators per thread: HB * R <= 256 * 32
constexpr int kMaxHeadsPerBlock = 32;

struct AttnGeom {
  int H, R, d_rope, t_q, t_kv;
  int hb;      // heads per block
  int groups;  // ceil(H / hb)
  int chunk;   // rows (or list entries) per split, a multiple of kTile
  int nsplit;
  float scale;
};

// Odd row stride: lane j reads word j * Wp + w, on bank (j * Wp + w) % 32, distinct per lane.
__host__ __device__ __forceinline__ int padded(int W) { return W | 1; }

size_t attn_smem_bytes(int hb, int kh, int W) {
  const size_t Wp = static_cast<size_t>(padded(W));
  return sizeof(float) * ((static_cast<size_t>(kWarps * kh) + kTile) * Wp +
                          static_cast<size_t>(hb) * kTile + 3 * static_cast<size_t>(hb));
}

// One block: query i, heads [h0, h0 + nh), rows (or compacted list entries) [begin, end) of that
// query. list == nullptr: causal absorbed (entry j = row j); otherwise entry j = list[i * width
// + j] (ascending, unique). Writes o_lat (nsplit == 1) or the unnormalised partials (po, pm, pl).
//
// The arithmetic is the CPU's attend_rows, operation for operation, with the softmax made online
// over tiles of 32 rows: s = (sum_w q[w] * c[w]) * scale as one sequential chain of separately
// rounded products and sums over [latent | rope]; m = running max; p = expf(s - m) (glibc's);
// l = l * alpha + p_j and o = o * alpha + p_j c_j (j ascending), alpha = expf(m_old - m_new);
// o *= 1 / l at the end. Rows of one tile, no split: the CPU's bytes.
//
// Shared memory: qs [8*KH, Wp] (rows >= nh zero), cs [kTile, Wp], ps [hb, kTile], ms / ls /
// alphas [hb]. KH = heads per thread in the score stage (heads warp + 8k).
template <int KH, typename Tc>
__global__ void __launch_bounds__(kAttnThreads, 2)
    attn_kernel(const float* __restrict__ q_lat, const float* __restrict__ q_pe,
                const Tc* __restrict__ cache, const int32_t* __restrict__ list,
                const int* __restrict__ counts, int width, AttnGeom g, float* __restrict__ o_lat,
                float* __restrict__ po, float* __restrict__ pm, float* __restrict__ pl) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float smem[];
  const int R = g.R, W = g.R + g.d_rope, Wp = padded(W), hb = g.hb;
  float* qs = smem;
  float* cs = qs + static_cast<size_t>(kWarps * KH) * Wp;
  float* ps = cs + static_cast<size_t>(kTile) * Wp;
  float* ms = ps + hb * kTile;
  float* ls = ms + hb;
  float* alphas = ls + hb;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int i = blockIdx.x / g.groups;
  const int h0 = (blockIdx.x - i * g.groups) * hb;
  const int nh = min(hb, g.H - h0);
  const int split = blockIdx.y;
  const int n_rows = list ? counts[i] : g.t_kv - g.t_q + i + 1;
  const int begin = split * g.chunk;
  const int end = min(n_rows, begin + g.chunk);

  // Queries [q_lat | q_pe] per head; rows past nh zero (read by idle score slots only).
  for (int k = tid; k < kWarps * KH * W; k += kAttnThreads) {
    const int h = k / W, w = k - h * W;
    float v = 0.0f;
    if (h < nh) {
      const int64_t qh = static_cast<int64_t>(i) * g.H + h0 + h;
      v = w < R ? q_lat[qh * R + w] : q_pe[qh * g.d_rope + (w - R)];
    }
    qs[h * Wp + w] = v;
  }
  if (tid < hb) {
    ms[tid] = -INFINITY;
    ls[tid] = 0.0f;
    alphas[tid] = 1.0f;
  }

  float acc[kMaxAcc];
#pragma unroll
  for (int u = 0; u < kMaxAcc; ++u) acc[u] = 0.0f;
  // Element u of this thread: e = tid + 256 u = (head eh, column er), walked incrementally.
  const int step_h = kAttnThreads / R, step_r = kAttnThreads - step_h * R;
  const int64_t list_base = list ? static_cast<int64_t>(i) * width : 0;
  __syncthreads();

  for (int t0 = begin; t0 < end; t0 += kTile) {
    const int nvalid = min(kTile, end - t0);
    // Load the tile: warp w copies rows w, w + 8, ...; lanes stride over the columns.
    for (int j = warp; j < nvalid; j += kWarps) {
      const int64_t row = list ? list[list_base + t0 + j] : t0 + j;
      const Tc* src = cache + row * W;
      float* dst = cs + j * Wp;
#pragma unroll 2
      for (int w = lane; w < W; w += 32) dst[w] = to_f32(src[w]);
    }
    __syncthreads();

    // Scores: lane = row j, heads warp + 8k.
    if (lane < nvalid && warp < nh) {
      float s[KH];
#pragma unroll
      for (int k = 0; k < KH; ++k) s[k] = 0.0f;
      const float* c = cs + lane * Wp;
      const float* q = qs + warp * Wp;
#pragma unroll 4
      for (int w = 0; w < W; ++w) {
        const float cv = c[w];
#pragma unroll
        for (int k = 0; k < KH; ++k) s[k] = __fadd_rn(s[k], __fmul_rn(q[k * kWarps * Wp + w], cv));
      }
#pragma unroll
      for (int k = 0; k < KH; ++k) {
        const int h = warp + kWarps * k;
        if (h < nh) ps[h * kTile + lane] = __fmul_rn(s[k], g.scale);
      }
    }
    __syncthreads();

    // Online softmax, one warp per head: lanes compute p_j = expf(s_j - m_new); lane 0 then
    // carries l = l * alpha + p_0 + p_1 + ... sequentially.
    for (int h = warp; h < nh; h += kWarps) {
      const float s = lane < nvalid ? ps[h * kTile + lane] : -INFINITY;
      const float m_old = ms[h];
      const float m_new = fmaxf(m_old, warp_max(s));
      const float p = lane < nvalid ? glibc_expf(__fsub_rn(s, m_new)) : 0.0f;
      ps[h * kTile + lane] = p;
      __syncwarp();
      if (lane == 0) {
        // m_new is finite (nvalid >= 1 finite scores); m_old = -inf gives alpha = 0.
        const float alpha = glibc_expf(__fsub_rn(m_old, m_new));
        float l = __fmul_rn(ls[h], alpha);
        for (int j = 0; j < nvalid; ++j) l = __fadd_rn(l, ps[h * kTile + j]);
        ls[h] = l;
        ms[h] = m_new;
        alphas[h] = alpha;
      }
      __syncwarp();
    }
    __syncthreads();

    // o[h, r] = o[h, r] * alpha[h] + p[h, 0] c[0, r] + p[h, 1] c[1, r] + ...
    {
      int eh = tid / R, er = tid - (tid / R) * R;
#pragma unroll
      for (int u = 0; u < kMaxAcc; ++u) {
        if (eh < nh) {
          float a = __fmul_rn(acc[u], alphas[eh]);
          const float* pr = ps + eh * kTile;
#pragma unroll 4
          for (int j = 0; j < nvalid; ++j) a = __fadd_rn(a, __fmul_rn(pr[j], cs[j * Wp + er]));
          acc[u] = a;
        }
        er += step_r;
        eh += step_h;
        if (er >= R) {
          er -= R;
          ++eh;
        }
      }
    }
    __syncthreads();  // cs / ps / alphas are rewritten by the next tile
  }

  // Epilogue. ls / ms were last written before a __syncthreads (or at init).
  int eh = tid / R, er = tid - (tid / R) * R;
#pragma unroll
  for (int u = 0; u < kMaxAcc; ++u) {
    if (eh < nh) {
      const int64_t qh = static_cast<int64_t>(i) * g.H + h0 + eh;
      if (po) {
        po[(static_cast<int64_t>(split) * g.t_q * g.H + qh) * R + er] = acc[u];
      } else {
        const float l = ls[eh];  // >= 1 once any row was seen (the max row contributes 1)
        const float inv = l > 0.0f ? __fdiv_rn(1.0f, l) : 0.0f;
        o_lat[qh * R + er] = __fmul_rn(acc[u], inv);
      }
    }
    er += step_r;
    eh += step_h;
    if (er >= R) {
      er -= R;
      ++eh;
    }
  }
  if (po && tid < nh) {
    const int64_t k =
        static_cast<int64_t>(split) * g.t_q * g.H + static_cast<int64_t>(i) * g.H + h0 + tid;
    pm[k] = ms[tid];
    pl[k] = ls[tid];
  }
}

// Merge the split partials of one (query, head): o = sum_s w_s o_s / sum_s w_s l_s with
// w_s = expf(m_s - max m), s ascending; zeros when no split saw a row. Grid t_q * H; shared
// w [nsplit].
__global__ void attn_combine_kernel(const float* __restrict__ po, const float* __restrict__ pm,
                                    const float* __restrict__ pl, int nsplit, int64_t n_qh, int R,
                                    float* __restrict__ o_lat) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float wsm[];
  const int64_t qh = blockIdx.x;
  float M = -INFINITY;
  for (int s = 0; s < nsplit; ++s) M = fmaxf(M, pm[s * n_qh + qh]);
  float* out = o_lat + qh * R;
  if (M == -INFINITY) {  // uniform over the block
    for (int r = threadIdx.x; r < R; r += blockDim.x) out[r] = 0.0f;
    return;
  }
  for (int s = threadIdx.x; s < nsplit; s += blockDim.x) {
    wsm[s] = glibc_expf(__fsub_rn(pm[s * n_qh + qh], M));  // m_s = -inf: 0
  }
  __syncthreads();
  float L = 0.0f;
  for (int s = 0; s < nsplit; ++s) L = __fadd_rn(L, __fmul_rn(wsm[s], pl[s * n_qh + qh]));
  const float inv = __fdiv_rn(1.0f, L);
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < nsplit; ++s) o = __fadd_rn(o, __fmul_rn(wsm[s], po[(s * n_qh + qh) * R + r]));
    out[r] = __fmul_rn(o, inv);
  }
}

// Compact query i's index list into the CPU's row list: the rows r with 0 <= r <= the query's
// row (t_kv - t_q + i) that the list names, each once, ascending. A bitmap of the visible rows in
// shared memory (atomicOr marks; duplicates collapse), then a block-wide exclusive scan of the
// words' popcounts writes each word's rows in order. Grid t_q; kAttnThreads threads; shared
// [ceil(t_kv / 32)] words + kWarps totals.
__global__ void __launch_bounds__(kAttnThreads)
    gather_compact_kernel(const int32_t* __restrict__ idx, int t_q, int t_kv, int width,
                          int32_t* __restrict__ list, int* __restrict__ counts) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ unsigned bm[];
  const int i = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int qrow = t_kv - t_q + i;  // >= 0 (t_q <= t_kv)
  const int running = memra::cuda::compact_rows<kAttnThreads>(
      idx + static_cast<int64_t>(i) * width, width, qrow + 1, bm, bm + (t_kv + 31) / 32,
      list + static_cast<int64_t>(i) * width, tid, lane, warp);
  if (tid == 0) counts[i] = running;
}

// Heads per block, score-stage heads per thread (1, 2 or 4) and shared bytes; 50002 when the
// geometry does not fit.
int attn_shape(MemraCudaCtx* ctx, int H, int R, int W, int* hb_out, int* kh_out, size_t* smem) {
  if (R > kAttnThreads * kMaxAcc) return memra::kUnsupportedGeometry;
  int optin = 0;
  MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin));
  int hb = std::min({H, kMaxHeadsPerBlock, kAttnThreads * kMaxAcc / R});
  while (true) {
    const int kh = hb <= kWarps ? 1 : (hb <= 2 * kWarps ? 2 : 4);
    const size_t bytes = attn_smem_bytes(hb, kh, W);
    if (bytes <= static_cast<size_t>(optin)) {
      *hb_out = hb;
      *kh_out = kh;
      *smem = bytes;
      return memra::kOk;
    }
    if (hb == 1) return memra::kUnsupportedGeometry;
    hb = (hb + 1) / 2;
  }
}

template <int KH, typename Tc>
int launch_attn_kh(MemraCudaCtx* ctx, const float* q_lat, const float* q_pe, const void* cache,
                   const int32_t* list, const int* counts, int width, const AttnGeom& g,
                   size_t smem, float* o_lat, float* po, float* pm, float* pl) {
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, attn_kernel<KH, Tc>, smem));
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(g.t_q) * g.groups), g.nsplit);
  memra::cuda::launch(ctx, true, attn_kernel<KH, Tc>, dim3(grid), dim3(kAttnThreads), smem, q_lat,
      q_pe, static_cast<const Tc*>(cache), list, counts, width, g, o_lat, po, pm, pl);
  return launch_status();
}

template <typename Tc>
int launch_attn_tc(MemraCudaCtx* ctx, int kh, const float* q_lat, const float* q_pe,
                   const void* cache, const int32_t* list, const int* counts, int width,
                   const AttnGeom& g, size_t smem, float* o_lat, float* po, float* pm, float* pl) {
  switch (kh) {
    case 1:
      return launch_attn_kh<1, Tc>(ctx, q_lat, q_pe, cache, list, counts, width, g, smem, o_lat, po,
                                   pm, pl);
    case 2:
      return launch_attn_kh<2, Tc>(ctx, q_lat, q_pe, cache, list, counts, width, g, smem, o_lat, po,
                                   pm, pl);
    default:
      return launch_attn_kh<4, Tc>(ctx, q_lat, q_pe, cache, list, counts, width, g, smem, o_lat, po,
                                   pm, pl);
  }
}

// Shared by both attention entries once the arguments are validated. max_rows: the most rows
// (absorbed) or compacted entries (gathered) any query can have.
int run_attn(MemraCudaCtx* ctx, const float* q_lat, const float* q_pe, const void* cache,
             int cache_dtype, const int32_t* list, const int* counts, int width, int H, int R,
             int d_rope, int t_q, int t_kv, int max_rows, float scale, float* o_lat) {
  const int W = R + d_rope;
  int hb = 0, kh = 0;
  size_t smem = 0;
  MEMRA_CUDA_RETURN_IF(attn_shape(ctx, H, R, W, &hb, &kh, &smem));
  AttnGeom g{};
  g.H = H;
  g.R = R;
  g.d_rope = d_rope;
  g.t_q = t_q;
  g.t_kv = t_kv;
  g.hb = hb;
  g.groups = static_cast<int>(ceil_div(H, hb));
  g.scale = scale;
  const int64_t base_blocks = static_cast<int64_t>(t_q) * g.groups;
  if (base_blocks > INT_MAX) return memra::kUnsupportedGeometry;

  // Split the rows when (query, head group) blocks alone would not fill the GPU.
  int sms = 0;
  MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMultiProcessorCount, &sms));
  int nsplit = 1;
  if (base_blocks < sms && max_rows > 2 * kTile) {
    const int64_t want = (2LL * sms + base_blocks - 1) / base_blocks;
    const int64_t most = (max_rows + 2 * kTile - 1) / (2 * kTile);  // >= 2 tiles per split
    nsplit = static_cast<int>(std::min<int64_t>({want, most, 1024}));
  }
  int chunk = static_cast<int>(ceil_div(std::max(max_rows, 1), nsplit));
  chunk = static_cast<int>(ceil_div(chunk, kTile)) * kTile;
  nsplit = std::max(1, static_cast<int>(ceil_div(std::max(max_rows, 1), chunk)));
  g.chunk = chunk;
  g.nsplit = nsplit;

  if (nsplit == 1) {
    if (cache_dtype == 0) {
      return launch_attn_tc<float>(ctx, kh, q_lat, q_pe, cache, list, counts, width, g, smem, o_lat,
                                   nullptr, nullptr, nullptr);
    }
    return launch_attn_tc<__nv_bfloat16>(ctx, kh, q_lat, q_pe, cache, list, counts, width, g, smem,
                                         o_lat, nullptr, nullptr, nullptr);
  }
  const int64_t n_qh = static_cast<int64_t>(t_q) * H;
  Scratch part(ctx, sizeof(float) * static_cast<size_t>(nsplit) * n_qh * (R + 2));
  MEMRA_CUDA_RETURN_IF(part.status());
  float* po = part.as<float>();
  float* pm = po + static_cast<int64_t>(nsplit) * n_qh * R;
  float* pl = pm + static_cast<int64_t>(nsplit) * n_qh;
  if (cache_dtype == 0) {
    MEMRA_CUDA_RETURN_IF(launch_attn_tc<float>(ctx, kh, q_lat, q_pe, cache, list, counts, width, g,
                                               smem, o_lat, po, pm, pl));
  } else {
    MEMRA_CUDA_RETURN_IF(launch_attn_tc<__nv_bfloat16>(ctx, kh, q_lat, q_pe, cache, list, counts,
                                                       width, g, smem, o_lat, po, pm, pl));
  }
  // + 4 floats: memcheck saw the unrolled split loop read 12 bytes past an 8-byte window (loads
  // the compiler merged; their values are never used).
  memra::cuda::launch(ctx, true, attn_combine_kernel, dim3(static_cast<unsigned>(n_qh)), dim3(128),
      sizeof(float) * (nsplit + 4), po, pm, pl, nsplit, n_qh, R, o_lat);
  return launch_status();
}

int check_attn_args(const float* q_lat, const float* q_pe, const void* cache, int cache_dtype,
                    int H, int R, int d_rope, int t_q, int t_kv, float* o_lat) {
  if (H < 0 || R < 1 || d_rope < 0 || t_q < 0 || t_kv < 0) return memra::kContractValue;
  if (cache_dtype != 0 && cache_dtype != 1) return memra::kContractDType;
  if (t_q > t_kv) return memra::kContractQuerySuffix;
  if (d_rope > 0 && !q_pe) return memra::kContractMissing;
  if (t_q > 0 && H > 0 && (!q_lat || !cache || !o_lat)) return memra::kContractMissing;
  return memra::kOk;
}

}  // namespace

extern "C" {

int memra_cuda_mla_absorb_q(MemraCudaCtx* ctx, const float* q_nope, const void* kv_b, int w_dtype,
                            int T, int H, int d_nope, int d_v, int R, int arm, float* q_lat) {
  return proj_entry(ctx, Proj::kAbsorb, q_nope, kv_b, w_dtype, T, H, d_nope, d_v, R, arm, q_lat);
}

int memra_cuda_mla_decompress_v(MemraCudaCtx* ctx, const float* o_lat, const void* kv_b,
                                int w_dtype, int T, int H, int d_nope, int d_v, int R, int arm,
                                float* out) {
  return proj_entry(ctx, Proj::kDecompress, o_lat, kv_b, w_dtype, T, H, d_nope, d_v, R, arm, out);
}

int memra_cuda_mla_latent_append(MemraCudaCtx* ctx, const float* rows, int T, int W, void* cache,
                                 int cache_dtype, int start) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || W < 1 || start < 0) return memra::kContractValue;
  if (cache_dtype != 0 && cache_dtype != 1) return memra::kContractDType;
  if (T == 0) return memra::kOk;
  if (!rows || !cache) return memra::kContractMissing;
  const int64_t n = static_cast<int64_t>(T) * W;
  const int64_t off = static_cast<int64_t>(start) * W;
  const unsigned blocks = std::min<unsigned>(ceil_div(n, 256), 65535u * 8);
  if (cache_dtype == 0) {
    memra::cuda::launch(ctx, true, latent_append_kernel<float>, dim3(blocks), dim3(256), 0, rows, n,
        static_cast<float*>(cache) + off);
  } else {
    memra::cuda::launch(ctx, true, latent_append_kernel<__nv_bfloat16>, dim3(blocks), dim3(256), 0,
        rows, n, static_cast<__nv_bfloat16*>(cache) + off);
  }
  return launch_status();
}

int memra_cuda_mla_attn_absorbed(MemraCudaCtx* ctx, const float* q_lat, const float* q_pe,
                                 const void* cache, int cache_dtype, int H, int R, int d_rope,
                                 int t_q, int t_kv, float scale, float* o_lat) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  MEMRA_CUDA_RETURN_IF(
      check_attn_args(q_lat, q_pe, cache, cache_dtype, H, R, d_rope, t_q, t_kv, o_lat));
  if (t_q == 0 || H == 0) return memra::kOk;
  return run_attn(ctx, q_lat, q_pe, cache, cache_dtype, nullptr, nullptr, 0, H, R, d_rope, t_q,
                  t_kv, t_kv, scale, o_lat);
}

int memra_cuda_mla_attn_gathered(MemraCudaCtx* ctx, const float* q_lat, const float* q_pe,
                                 const void* cache, int cache_dtype, const int32_t* idx, int H,
                                 int R, int d_rope, int t_q, int t_kv, int width, float scale,
                                 float* o_lat) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  MEMRA_CUDA_RETURN_IF(
      check_attn_args(q_lat, q_pe, cache, cache_dtype, H, R, d_rope, t_q, t_kv, o_lat));
  if (width < 0) return memra::kContractValue;
  if (t_q == 0 || H == 0) return memra::kOk;
  if (width == 0) {  // every list is empty: zeros
    return status_of(cudaMemsetAsync(o_lat, 0, sizeof(float) * static_cast<size_t>(t_q) * H * R,
                                     ctx->stream));
  }
  if (!idx) return memra::kContractMissing;
  // Bitmap of the t_kv rows (the last query sees them all) plus the warp totals.
  const size_t bm_bytes = sizeof(unsigned) * (ceil_div(t_kv, 32) + kWarps);
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, gather_compact_kernel, bm_bytes));
  Scratch lists(ctx, sizeof(int32_t) * (static_cast<size_t>(t_q) * width + t_q));
  MEMRA_CUDA_RETURN_IF(lists.status());
  int32_t* list = lists.as<int32_t>();
  int* counts = list + static_cast<int64_t>(t_q) * width;
  memra::cuda::launch(ctx, true, gather_compact_kernel, dim3(t_q), dim3(kAttnThreads), bm_bytes,
      idx, t_q, t_kv, width, list, counts);
  MEMRA_CUDA_RETURN_IF(launch_status());
  return run_attn(ctx, q_lat, q_pe, cache, cache_dtype, list, counts, width, H, R, d_rope, t_q,
                  t_kv, std::min(width, t_kv), scale, o_lat);
}

}  // extern "C"
