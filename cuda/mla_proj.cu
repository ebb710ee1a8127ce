// Absorb / decompress, the per-head kv_b projections of the absorbed MLA (memra_cuda_mla_proj,
// cpp/include/memra/cuda_abi/mla.h): GPU twins of cpu::mla_absorb_q / mla_decompress_v
// (cpp/src/cpu/mla.cpp, the numeric oracle).
//
// Arms (all enqueue on ctx->stream, no host sync):
//   1 per-position kernel: one block per (head, tile of P positions), all R (absorb) or d_v
//     (decompress) outputs of the head in the block;
//   2 streaming kernel for the decode regime (cuda/mla_proj_stream.cu): a block owns a head and a
//     small tile of its outputs, streams that tile's weights once into shared memory and keeps
//     them there while it loops over the positions. When a tile does not fit shared memory it
//     falls back to arm 1's kernel with the outputs split over more blocks (32 outputs a block);
//   3 cuBLASLt bf16 tensor-core GEMM, strided-batched over heads (bf16 weights; activations
//     rounded to bf16 into Scratch), f32 accumulate and output;
//   0 auto: Lt for bf16 weights at T >= 2 (falling back to arm 1 when cuBLASLt declines), arm 2
//     at T = 1 (batch-1 decode keeps the CPU's bytes); f32 / f16 weights: arm 2 below T = 64,
//     from it arm 2 when the per-position grid would not fill the GPU, else arm 1.
//
// The projections' arms 1 and 2 do the CPU's arithmetic operation for operation (sequential
// sums in the CPU's order, products and sums rounded separately, no FMA), so with f32 or bf16
// kv_b they equal cpu::mla_absorb_q / mla_decompress_v byte for byte where the CPU build does not
// contract into FMAs (x86-64 without -march). Every output is one chain summed by one thread
// (reduction index ascending from 0) in every arm-1/2 launch shape, so arm 2 equals arm 1 byte
// for byte, and both are deterministic.
#include <cstdint>
#include <algorithm>

#include "common.cuh"
#include "mla_common.cuh"
#include "mla_proj.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::from_f32;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;
using memra::cuda::to_f32;
using memra::cuda::mla::allow_smem;
using memra::cuda::mla::device_attr;
using memra::cuda::mla::Proj;

namespace {

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

}  // namespace

extern "C" {

int memra_cuda_mla_proj(MemraCudaCtx* ctx, const MemraMlaProjParams* p) {
  if (!p) return memra::kContractMissing;
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  const bool known = p->which == MEMRA_MLA_ABSORB || p->which == MEMRA_MLA_DECOMPRESS;
  const Proj which = p->which == MEMRA_MLA_DECOMPRESS ? Proj::kDecompress : Proj::kAbsorb;
  const float* x = p->x;
  const void* kv_b = p->kv_b;
  const int w_dtype = p->w_dtype, T = p->T, H = p->H, d_nope = p->d_nope, d_v = p->d_v, R = p->R;
  int arm = p->arm;
  float* y = p->y;
  if (!known || T < 0 || H < 0 || d_nope < 0 || d_v < 0 || R < 1 || arm < 0 || arm > 3) {
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
    if (w_dtype == 1 && T >= memra::cuda::mla::kLtAutoMinT && k > 0) {
      bool declined = false;
      const int rc = lt_proj(ctx, which, x, kv_b, T, H, d_nope, d_v, R, y, &declined);
      if (!declined) return rc;
      arm = 1;  // cuBLASLt found no algorithm: the per-position kernel
    } else if (T < memra::cuda::mla::kStreamAutoMaxT) {
      arm = 2;
    } else {
      int sms = 0;
      MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMultiProcessorCount, &sms));
      const int pt = T == 1 ? 1 : (T <= 4 ? 4 : 8);
      const long long blocks = static_cast<long long>(H) * ceil_div(T, pt);
      arm = blocks < 2LL * sms ? 2 : 1;
    }
  }
  if (arm == 2) {
    bool declined = false;
    const int rc = memra::cuda::mla::launch_stream_any(ctx, *p, &declined);
    if (!declined) return rc;
    // The tile does not fit shared memory: the per-position kernel, outputs split over blocks.
  }
  return launch_proj_any(ctx, which, x, kv_b, w_dtype, T, H, d_nope, d_v, R, arm == 2, y);
}

}  // extern "C"
