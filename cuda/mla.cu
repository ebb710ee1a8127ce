// MLA area of the CUDA library (cpp/include/memra/cuda_abi/mla.h): q absorption, v
// decompression, latent append, absorbed causal attention and gathered (index-list) attention
// over the latent cache. GPU twins of cpu::mla_absorb_q / mla_decompress_v / mla_attn_absorbed /
// mla_attn_gathered (cpp/src/cpu/mla.cpp, the numeric oracle).
//
// Absorb / decompress arms (all enqueue on ctx->stream, no host sync):
//   1 per-position kernel: one block per (head, tile of P positions), all R (absorb) or d_v
//     (decompress) outputs of the head in the block;
//   2 output-range split: the same kernel with the outputs split over more blocks (the
//     block-starved decode regime, T = 1). Each output is computed by the same __device__ dot
//     routine in the same order whatever the launch shape, so arm 2 equals arm 1 byte for byte;
//   3 cuBLASLt bf16 tensor-core GEMM, strided-batched over heads (bf16 weights; activations
//     rounded to bf16 into Scratch), f32 accumulate and output;
//   0 auto: Lt for bf16 weights at T >= 64 (falling back to arm 1 when cuBLASLt declines), else
//     the split arm when the per-position grid would not fill the GPU, else arm 1.
//
// The projections' arms 1 and 2 do the CPU's arithmetic operation for operation (sequential
// sums in the CPU's order, products and sums rounded separately, no FMA), so with f32 or bf16
// kv_b they equal cpu::mla_absorb_q / mla_decompress_v byte for byte where the CPU build does not
// contract into FMAs (x86-64 without -march).
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

#include "common.cuh"
#include "gather_compact.cuh"
#include "glibc_expf.cuh"

using memra::cuda::ceil_div;
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
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = from_f32<D>(src[i]);
  }
}

template <typename D>
int launch_convert(MemraCudaCtx* ctx, const float* src, D* dst, int64_t n) {
  if (n == 0) return memra::kOk;
  const unsigned blocks = std::min<unsigned>(ceil_div(n, 256), 65535u * 8);
  convert_f32_kernel<D><<<blocks, 256, 0, ctx->stream>>>(src, dst, n);
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

// q_lat[t, h, r] for r in this block's output range [blockIdx.x * r_chunk, +r_chunk) and the
// positions of tile blockIdx.z (grid-stride over tiles). Grid (ceil(R / r_chunk), H, tiles).
template <int P, typename Tw>
__global__ void absorb_kernel(const float* __restrict__ q_nope, const Tw* __restrict__ kv_b, int T,
                              int H, int d_nope, int d_v, int R, int r_chunk,
                              float* __restrict__ q_lat) {
  extern __shared__ float qs[];  // [P, d_nope]
  const int h = blockIdx.y;
  const int r_begin = blockIdx.x * r_chunk;
  const int r_end = min(R, r_begin + r_chunk);
  const Tw* wh = kv_b + static_cast<int64_t>(h) * (d_nope + d_v) * R;
  const int tiles = (T + P - 1) / P;
  for (int tile = blockIdx.z; tile < tiles; tile += gridDim.z) {
    const int t0 = tile * P;
    const int np = min(P, T - t0);
    for (int k = threadIdx.x; k < P * d_nope; k += blockDim.x) {
      const int p = k / d_nope, n = k - p * d_nope;
      qs[k] = p < np ? q_nope[(static_cast<int64_t>(t0 + p) * H + h) * d_nope + n] : 0.0f;
    }
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
  extern __shared__ float os[];  // [P, R]
  const int h = blockIdx.y;
  const int v_begin = blockIdx.x * v_chunk;
  const int v_end = min(d_v, v_begin + v_chunk);
  const Tw* wv = kv_b + (static_cast<int64_t>(h) * (d_nope + d_v) + d_nope) * R;
  const int tiles = (T + P - 1) / P;
  for (int tile = blockIdx.z; tile < tiles; tile += gridDim.z) {
    const int t0 = tile * P;
    const int np = min(P, T - t0);
    for (int k = threadIdx.x; k < P * R; k += blockDim.x) {
      const int p = k / R, r = k - p * R;
      os[k] = p < np ? o_lat[(static_cast<int64_t>(t0 + p) * H + h) * R + r] : 0.0f;
    }
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

constexpr int kAbsorbSplitChunk = 32;     // arm 2: outputs (of R) per block, one warp
constexpr int kDecompressSplitChunk = 32;  // arm 2: outputs (of d_v) per block, one warp

enum class Proj { kAbsorb, kDecompress };

template <int P, typename Tw>
int launch_proj_p(MemraCudaCtx* ctx, Proj which, const float* x, const void* kv_b, int T, int H,
                  int d_nope, int d_v, int R, bool split, float* y) {
  const Tw* w = static_cast<const Tw*>(kv_b);
  const unsigned tiles = std::min<unsigned>(ceil_div(T, P), 65535u);
  if (which == Proj::kAbsorb) {
    const size_t smem = sizeof(float) * P * static_cast<size_t>(d_nope);
    MEMRA_CUDA_RETURN_IF(allow_smem(ctx, absorb_kernel<P, Tw>, smem));
    const int chunk = split ? kAbsorbSplitChunk : R;
    const int threads = split ? 32 : 256;
    const dim3 grid(ceil_div(R, chunk), H, tiles);
    absorb_kernel<P, Tw><<<grid, threads, smem, ctx->stream>>>(x, w, T, H, d_nope, d_v, R, chunk, y);
  } else {
    const size_t smem = sizeof(float) * P * static_cast<size_t>(R);
    const int chunk = split ? kDecompressSplitChunk : d_v;
    const int threads = split ? 32 : 256;
    const dim3 grid(ceil_div(d_v, chunk), H, tiles);
    const bool vec = reinterpret_cast<uintptr_t>(kv_b) % 16 == 0 && (R * sizeof(Tw)) % 16 == 0;
    if (vec) {
      MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decompress_kernel<P, true, Tw>, smem));
      decompress_kernel<P, true, Tw><<<grid, threads, smem, ctx->stream>>>(x, w, T, H, d_nope, d_v,
                                                                          R, chunk, y);
    } else {
      MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decompress_kernel<P, false, Tw>, smem));
      decompress_kernel<P, false, Tw><<<grid, threads, smem, ctx->stream>>>(x, w, T, H, d_nope, d_v,
                                                                           R, chunk, y);
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
    } else {
      int sms = 0;
      MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMultiProcessorCount, &sms));
      const int p = T == 1 ? 1 : (T <= 4 ? 4 : 8);
      const long long blocks = static_cast<long long>(H) * ceil_div(T, p);
      arm = blocks < 2LL * sms ? 2 : 1;
    }
  }
  return launch_proj_any(ctx, which, x, kv_b, w_dtype, T, H, d_nope, d_v, R, arm == 2, y);
}

// ---------------------------------------------------------------- latent append

template <typename Tc>
__global__ void latent_append_kernel(const float* __restrict__ rows, int64_t n,
                                     Tc* __restrict__ dst) {
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
  attn_kernel<KH, Tc><<<grid, kAttnThreads, smem, ctx->stream>>>(
      q_lat, q_pe, static_cast<const Tc*>(cache), list, counts, width, g, o_lat, po, pm, pl);
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
  attn_combine_kernel<<<static_cast<unsigned>(n_qh), 128, sizeof(float) * nsplit, ctx->stream>>>(
      po, pm, pl, nsplit, n_qh, R, o_lat);
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
    latent_append_kernel<float><<<blocks, 256, 0, ctx->stream>>>(rows, n,
                                                                 static_cast<float*>(cache) + off);
  } else {
    latent_append_kernel<__nv_bfloat16><<<blocks, 256, 0, ctx->stream>>>(
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
  gather_compact_kernel<<<t_q, kAttnThreads, bm_bytes, ctx->stream>>>(idx, t_q, t_kv, width, list,
                                                                      counts);
  MEMRA_CUDA_RETURN_IF(launch_status());
  return run_attn(ctx, q_lat, q_pe, cache, cache_dtype, list, counts, width, H, R, d_rope, t_q,
                  t_kv, std::min(width, t_kv), scale, o_lat);
}

}  // extern "C"
