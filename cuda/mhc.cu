// mHC hyper-connections on the GPU (cpp/include/memra/cuda_abi/basic.h), the twins of
// cpu/mhc.cpp: the mapping (pre / post / Sinkhorn comb + the collapsed input), the post-block
// expansion and the final head mean. Oracle: transformers Glm5NextTextHyperConnection.
//
// mhc_pre = one GEMM (memra_cuda_linear) + one mapping kernel (a block per token):
//   f32 / bf16 fn: logits_raw = streams[T, hc*D] fn^T straight from the streams, and the
//     mapping kernel scales each token's logits by its unweighted-RMS factor
//     inv = 1 / sqrt(sum(x^2) / (hc*D) + norm_eps) (linearity: fn(x * inv) = inv * fn(x)), so the
//     normalised [T, hc*D] copy is never written. Against the CPU, which normalises first, this
//     differs by rounding only (~1e-7 relative per logit).
//   f16 fn: the rows are normalised first (memra_cuda_rms_norm, in chunks of <= 64 MiB of
//     scratch) so that the f16 rounding of the GEMM input cannot overflow on large residuals.
// The mapping kernel mirrors the CPU element by element, in the CPU's order and without FMA
// contraction (__fmul_rn / __fadd_rn): given the same logits it gives the same pre, post, comb
// and collapsed up to expf's last-bit differences from the host's libm.
// mhc_post and hc_head_mean use no transcendental and sum in the CPU's order without
// contraction: their outputs are bit-identical to cpu::mhc_post / cpu::hc_head_mean.
#include <climits>
#include <cstdint>

#include "common.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::warp_sum;

namespace {

constexpr int kMaxHc = 64;            // comb [hc, hc] lives in shared memory
// 1024 threads: at decode (T = 1, one block) the sum of squares over hc * D values and the
// collapsed row are latency-bound loops; a wide block keeps most of them in flight at once.
constexpr int kMapThreads = 1024;
constexpr size_t kNormChunkBytes = size_t(64) << 20;

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// One row or column of the Sinkhorn matrix c: the hc entries c[first + k * step], k ascending,
// divided by their sum (in that order) + eps, as cpu/mhc.cpp does.
__device__ __forceinline__ void normalize_line(float* c, int hc, int first, int step,
                                               float hc_eps) {
  float s = 0.0f;
  for (int k = 0; k < hc; ++k) s += c[first + k * step];
  const float d = s + hc_eps;
  for (int k = 0; k < hc; ++k) c[first + k * step] = c[first + k * step] / d;
}

// One block (kMapThreads) per token. Shared: pre [hc], c [hc, hc] (dynamic).
__global__ void __launch_bounds__(kMapThreads)
    mhc_map_kernel(const float* __restrict__ streams, const float* __restrict__ logits, int hc,
                   int D, const float* __restrict__ base, const float* __restrict__ scale,
                   int sinkhorn_iters, float hc_eps, float norm_eps, bool fold,
                   float* __restrict__ post, float* __restrict__ comb,
                   float* __restrict__ collapsed) {
  extern __shared__ float sm[];
  __shared__ float red[kMapThreads / 32];
  float* pre = sm;
  float* c = sm + hc;
  const int tid = threadIdx.x;
  const int64_t t = blockIdx.x;
  const int64_t flat = static_cast<int64_t>(hc) * D;
  const int mix = (2 + hc) * hc;
  const float* st = streams + t * flat;

  float inv = 1.0f;
  if (fold && flat > 0) {
    float ss = 0.0f;
    int64_t k0 = 0;
    if ((reinterpret_cast<uintptr_t>(st) & 15u) == 0) {  // 16-byte loads, four in flight
      const int64_t n4 = flat / 4;
      const float4* s4 = reinterpret_cast<const float4*>(st);
#pragma unroll 4
      for (int64_t q = tid; q < n4; q += kMapThreads) {
        const float4 v = s4[q];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
      k0 = 4 * n4;
    }
    for (int64_t k = k0 + tid; k < flat; k += kMapThreads) {
      const float v = st[k];
      ss += v * v;
    }
    ss = warp_sum(ss);
    if ((tid & 31) == 0) red[tid >> 5] = ss;
    __syncthreads();
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kMapThreads / 32; ++w) s += red[w];
    inv = 1.0f / sqrtf(s / static_cast<float>(flat) + norm_eps);
  }

  const float* lt = logits + t * mix;
  const float s0 = scale[0], s1 = scale[1], s2 = scale[2];
  if (tid < hc) {
    const int s = tid;
    const float l_pre = fold ? __fmul_rn(lt[s], inv) : lt[s];
    const float l_post = fold ? __fmul_rn(lt[hc + s], inv) : lt[hc + s];
    pre[s] = __fadd_rn(sigmoidf(__fadd_rn(__fmul_rn(l_pre, s0), base[s])), hc_eps);
    post[t * hc + s] = 2.0f * sigmoidf(__fadd_rn(__fmul_rn(l_post, s1), base[hc + s]));
    // Row i = tid of comb: softmax over j, + eps.
    const int i = tid;
    float* row = c + i * hc;
    const float* lc = lt + 2 * hc + i * hc;
    const float* bc = base + 2 * hc + i * hc;
    for (int j = 0; j < hc; ++j) {
      const float l = fold ? __fmul_rn(lc[j], inv) : lc[j];
      row[j] = __fadd_rn(__fmul_rn(l, s2), bc[j]);
    }
    float m = row[0];
    for (int j = 1; j < hc; ++j) m = fmaxf(m, row[j]);
    float sum = 0.0f;
    for (int j = 0; j < hc; ++j) {
      row[j] = expf(row[j] - m);
      sum += row[j];
    }
    for (int j = 0; j < hc; ++j) row[j] = __fadd_rn(row[j] / sum, hc_eps);
  }
  __syncthreads();
  if (hc * hc <= 32) {
    // Small hc (GLM: 4): the whole Sinkhorn in warp 0's registers, lane i * hc + j holding
    // c[i, j]; each row / column sum is gathered by shuffles and added in ascending order, so
    // the bits are those of the shared-memory loops below (which pay two block barriers per
    // half-iteration: ~20 us per call at T = 1).
    if (tid < 32) {
      const bool own = tid < hc * hc;
      const int i = own ? tid / hc : 0, j = own ? tid % hc : 0;
      float v = own ? c[tid] : 0.0f;
      auto col_norm = [&]() {
        float s = 0.0f;
        for (int r = 0; r < hc; ++r) s += __shfl_sync(0xffffffffu, v, r * hc + j);
        const float d = s + hc_eps;
        v = v / d;
      };
      auto row_norm = [&]() {
        float s = 0.0f;
        for (int q = 0; q < hc; ++q) s += __shfl_sync(0xffffffffu, v, i * hc + q);
        const float d = s + hc_eps;
        v = v / d;
      };
      col_norm();
      for (int it = 1; it < sinkhorn_iters; ++it) {
        row_norm();
        col_norm();
      }
      if (own) c[tid] = v;
    }
    __syncthreads();
  } else {
    // One column normalisation, then (iters - 1) rounds of rows then columns; thread k owns
    // column (row) k and sums it in ascending order, as the CPU does.
    if (tid < hc) normalize_line(c, hc, tid, hc, hc_eps);  // column tid
    __syncthreads();
    for (int it = 1; it < sinkhorn_iters; ++it) {
      if (tid < hc) normalize_line(c, hc, tid * hc, 1, hc_eps);  // row tid
      __syncthreads();
      if (tid < hc) normalize_line(c, hc, tid, hc, hc_eps);
      __syncthreads();
    }
  }
  float* ct = comb + t * hc * hc;
  for (int k = tid; k < hc * hc; k += kMapThreads) ct[k] = c[k];
  // collapsed = sum over streams (ascending) of pre[s] * streams[s].
  float* out = collapsed + t * D;
  for (int d = tid; d < D; d += kMapThreads) {
    float acc = 0.0f;
    for (int s = 0; s < hc; ++s) acc = __fadd_rn(acc, __fmul_rn(pre[s], st[int64_t(s) * D + d]));
    out[d] = acc;
  }
}

// out[t, j, d] = post[t, j] * y[t, d] + sum_i comb[t, i, j] * residual[t, i, d]. Block x walks
// d, block y walks the rows r = t * hc + j.
__global__ void mhc_post_kernel(const float* __restrict__ y, const float* __restrict__ post,
                                const float* __restrict__ comb, const float* __restrict__ residual,
                                int64_t rows, int hc, int D, float* __restrict__ out) {
  const int d = blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t t = r / hc;
    const int j = static_cast<int>(r % hc);
    const float* ct = comb + t * hc * hc;
    const float* rt = residual + t * hc * D;
    float acc = 0.0f;
    for (int i = 0; i < hc; ++i) acc = __fadd_rn(acc, __fmul_rn(ct[i * hc + j], rt[int64_t(i) * D + d]));
    out[r * D + d] = __fadd_rn(__fmul_rn(post[r], y[t * D + d]), acc);
  }
}

// out[t, d] = (sum_s streams[t, s, d]) / hc.
__global__ void hc_head_mean_kernel(const float* __restrict__ streams, int64_t T, int hc, int D,
                                    float* __restrict__ out) {
  const int d = blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const float* st = streams + t * hc * D;
    float acc = 0.0f;
    for (int s = 0; s < hc; ++s) acc += st[int64_t(s) * D + d];
    out[t * D + d] = acc / static_cast<float>(hc);
  }
}

dim3 rows_grid(int D, int64_t rows, int threads) {
  return dim3(ceil_div(D, threads), static_cast<unsigned>(rows < 65535 ? rows : 65535));
}

int threads_for(int D) { return D >= 256 ? 256 : (D >= 128 ? 128 : (D >= 64 ? 64 : 32)); }

}  // namespace

extern "C" {

int memra_cuda_mhc_pre(MemraCudaCtx* ctx, const float* streams, int T, int hc, int D,
                       const void* fn, int fn_dtype, const float* base, const float* scale,
                       int sinkhorn_iters, float hc_eps, float norm_eps, float* post, float* comb,
                       float* collapsed) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || D < 0 || hc < 1 || sinkhorn_iters < 1) return memra::kContractValue;
  if (fn_dtype < 0 || fn_dtype > 2) return memra::kContractDType;
  const int64_t flat = static_cast<int64_t>(hc) * D;
  if (flat > INT_MAX) return memra::kContractValue;
  if (hc > kMaxHc) return memra::kUnsupportedGeometry;
  if (T == 0) return memra::kOk;
  if (!streams || !fn || !base || !scale || !post || !comb || !collapsed) {
    return memra::kContractMissing;
  }
  const int mix = (2 + hc) * hc;
  Scratch logits(ctx, static_cast<size_t>(T) * mix * sizeof(float));
  MEMRA_CUDA_RETURN_IF(logits.status());
  const bool fold = fn_dtype != 2 || flat == 0;
  if (fold) {
    MEMRA_CUDA_RETURN_IF(memra_cuda_linear(ctx, streams, T, static_cast<int>(flat), fn, fn_dtype,
                                           mix, nullptr, logits.as<float>()));
  } else {
    const int64_t chunk64 = static_cast<int64_t>(kNormChunkBytes / (sizeof(float) * flat));
    const int chunk = static_cast<int>(chunk64 < 1 ? 1 : (chunk64 < T ? chunk64 : T));
    Scratch normed(ctx, static_cast<size_t>(chunk) * flat * sizeof(float));
    MEMRA_CUDA_RETURN_IF(normed.status());
    for (int t0 = 0; t0 < T; t0 += chunk) {
      const int n = T - t0 < chunk ? T - t0 : chunk;
      MEMRA_CUDA_RETURN_IF(memra_cuda_rms_norm(ctx, streams + t0 * flat, n,
                                               static_cast<int>(flat), nullptr, norm_eps,
                                               normed.as<float>()));
      MEMRA_CUDA_RETURN_IF(memra_cuda_linear(ctx, normed.as<float>(), n, static_cast<int>(flat),
                                             fn, fn_dtype, mix, nullptr,
                                             logits.as<float>() + static_cast<int64_t>(t0) * mix));
    }
  }
  const size_t smem = sizeof(float) * (static_cast<size_t>(hc) + static_cast<size_t>(hc) * hc);
  mhc_map_kernel<<<static_cast<unsigned>(T), kMapThreads, smem, ctx->stream>>>(
      streams, logits.as<float>(), hc, D, base, scale, sinkhorn_iters, hc_eps, norm_eps, fold,
      post, comb, collapsed);
  return launch_status();
}

int memra_cuda_mhc_post(MemraCudaCtx* ctx, const float* y, const float* post, const float* comb,
                        const float* residual, int T, int hc, int D, float* out) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || hc < 0 || D < 0) return memra::kContractValue;
  const int64_t rows = static_cast<int64_t>(T) * hc;
  if (rows == 0 || D == 0) return memra::kOk;
  if (!y || !post || !comb || !residual || !out) return memra::kContractMissing;
  const int threads = threads_for(D);
  mhc_post_kernel<<<rows_grid(D, rows, threads), threads, 0, ctx->stream>>>(
      y, post, comb, residual, rows, hc, D, out);
  return launch_status();
}

int memra_cuda_hc_head_mean(MemraCudaCtx* ctx, const float* streams, int T, int hc, int D,
                            float* out) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || hc < 1 || D < 0) return memra::kContractValue;
  if (T == 0 || D == 0) return memra::kOk;
  if (!streams || !out) return memra::kContractMissing;
  const int threads = threads_for(D);
  hc_head_mean_kernel<<<rows_grid(D, T, threads), threads, 0, ctx->stream>>>(streams, T, hc, D,
                                                                            out);
  return launch_status();
}

}  // extern "C"
