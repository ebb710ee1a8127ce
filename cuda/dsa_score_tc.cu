// The DSA indexer's prefill scorer on tensor cores (memra_cuda_kpool_score, one sequence, with
// tensor_cores = 1: cpp/include/memra/cuda_abi/dsa.h), the bf16 models' arm; cuda/dsa.cu keeps
// the f32 CUDA-core scorers (the CPU's bytes) for float32 models and as the tests' reference.
//
// score[i, p] = sum_h (w[i, h] * head_scale) * relu(qk_scale * q[i, h, :] . key[p, :]), h
// ascending, -inf where pool p's last row is after the query's position (cpu::kpool_score). The
// dot products are a GEMM per head (q[:, h, :] [t_q, d] x keys^T [d, n_pools]) on
// mma.sync.m16n8k16 bf16 -> f32; the relu-weighted head sum is the epilogue, folded into f32
// accumulators in the same register layout as the dot fragments, so nothing but the final scores
// reaches memory.
//
// Precision: q and the pool keys are rounded to bf16 (round to nearest even; 2^-9 relative per
// element), the products are exact in f32 and summed in f32 in the tensor cores' order; the
// scaling, relu, weights and head sum are the f32 operations of the CPU scorer in its order.
// Against the CPU on the same bf16-rounded q and keys a score differs only by the dot products'
// summation order. The selection (cuda/dsa.cu's radix select) is exact over these scores.
//
// Block: 64 queries x 128 pools, 8 warps; warp w owns queries 32 * (w % 2) .. + 31 (two m-tiles)
// and pools 32 * (w / 2) .. + 31 (four n-tiles). The keys tile is converted to bf16 in shared
// memory once per block and each warp keeps its B fragments in registers for every head (the
// keys do not change with the head); per head the 64 x d bf16 query tile streams through a
// 3-stage cp.async ring from a bf16 copy of q made by one conversion pass (q is read as bf16 by
// every pool tile of its rows: half the L2 traffic of f32, and 16-byte cp.async). A tile whose
// pools are all after its queries writes -inf without arithmetic (causal: about half the tiles).
// Grid: x = pool tiles (fastest, so the blocks running together share their query tile in L2),
// y = query tiles (a grid-stride loop past 65535).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.cuh"
#include "mma_bf16.cuh"
#include "dsa_common.cuh"

using memra::cuda::ceil_div;
using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::smem_u32;
using memra::cuda::status_of;
using memra::cuda::dsa::relu_cpu;

namespace {

using memra::cuda::ldsm_x4;
using memra::cuda::mma_bf16;
using memra::cuda::pack_bf16x2;

constexpr int kThreads = 256;
constexpr int kBQ = 64;      // queries a block
constexpr int kBP = 128;     // pools a block
constexpr int kStages = 3;   // query-tile ring
constexpr int kMaxHi = 128;  // the weight tile [kBQ][Hi] f32 in shared memory

template <int D>
struct Geo {
  static constexpr int S = D + 8;   // bf16 row stride (+16 bytes: conflict-free ldmatrix)
  static constexpr int KS = D / 16;  // k-steps
  static constexpr int CPR = D / 8;  // 16-byte chunks a row
  static constexpr size_t q_bytes = sizeof(__nv_bfloat16) * kStages * kBQ * S;
  static constexpr size_t k_bytes = sizeof(__nv_bfloat16) * kBP * S;
  static size_t bytes(int Hi) { return q_bytes + k_bytes + sizeof(float) * kBQ * Hi; }
  static_assert(D % 16 == 0, "whole k-steps");
};

__device__ __forceinline__ bool pool_visible(int64_t p, int pool, int64_t pos) {
  return p * pool + pool - 1 <= pos;
}

// q f32 -> bf16 (pairs; n even).
__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t n_pairs,
                               uint32_t* __restrict__ y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n_pairs;
       k += int64_t(gridDim.x) * blockDim.x) {
    y[k] = pack_bf16x2(x[2 * k], x[2 * k + 1]);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    score_tc_kernel(const __nv_bfloat16* __restrict__ qb, const float* __restrict__ w,
                    const float* __restrict__ keys, int t_q, int Hi, int n_pools, int pool,
                    int first_pos, float qk_scale, float head_scale, float* __restrict__ score) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  using G = Geo<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(smem + G::q_bytes);
  float* ws = reinterpret_cast<float*>(smem + G::q_bytes + G::k_bytes);  // [kBQ][Hi]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wq = warp & 1, wp = warp >> 1;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t p0 = int64_t(blockIdx.x) * kBP;
  const int n_qt = static_cast<int>((int64_t(t_q) + kBQ - 1) / kBQ);

  // Keys tile -> bf16 (pools past n_pools zero), then this warp's B fragments for all k-steps.
  for (int c = tid; c < kBP * (D / 2); c += kThreads) {
    const int r = c / (D / 2), k2 = c - r * (D / 2);
    const int64_t p = p0 + r;
    float v0 = 0.0f, v1 = 0.0f;
    if (p < n_pools) {
      v0 = keys[p * D + 2 * k2];
      v1 = keys[p * D + 2 * k2 + 1];
    }
    *reinterpret_cast<uint32_t*>(ks + r * G::S + 2 * k2) = pack_bf16x2(v0, v1);
  }
  __syncthreads();
  // ldmatrix lanes: A rows (lane & 7) + 8 * bit 3, cols 8 * bit 4; B (non-transposed) rows
  // (lane & 7) + 8 * bit 4, cols 8 * bit 3 (fragments in pairs of n-tiles).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
  const int b_row = (lane & 7) + ((lane >> 4) & 1) * 8, b_col = ((lane >> 3) & 1) * 8;
  uint32_t bfr[2][G::KS][4];
  {
    const __nv_bfloat16* kb = ks + (wp * 32 + b_row) * G::S + b_col;
#pragma unroll
    for (int np = 0; np < 2; ++np)
#pragma unroll
      for (int k = 0; k < G::KS; ++k) ldsm_x4(bfr[np][k], kb + np * 16 * G::S + k * 16);
  }

  for (int qt = blockIdx.y; qt < n_qt; qt += gridDim.y) {
    const int64_t i0 = int64_t(qt) * kBQ;
    const int64_t i_last = (i0 + kBQ < t_q ? i0 + kBQ : t_q) - 1;
    if (!pool_visible(p0, pool, first_pos + i_last)) {  // no query of the tile sees any pool
      for (int e = tid; e < kBQ * kBP; e += kThreads) {
        const int64_t i = i0 + e / kBP, p = p0 + e % kBP;
        if (i < t_q && p < n_pools) score[i * n_pools + p] = -INFINITY;
      }
      continue;
    }
    __syncthreads();  // the previous tile's readers of qs / ws are done
    for (int e = tid; e < kBQ * Hi; e += kThreads) {
      const int r = e / Hi, h = e - r * Hi;
      const int64_t i = i0 + r;
      ws[e] = i < t_q ? __fmul_rn(w[i * Hi + h], head_scale) : 0.0f;
    }
    // Head h's query tile into stage st: 64 rows x D bf16 by 16-byte cp.async (rows past t_q
    // zero-filled, not read).
    auto load_head = [&](int h, int st) {
      __nv_bfloat16* dst = qs + static_cast<size_t>(st) * kBQ * G::S;
      for (int c = tid; c < kBQ * G::CPR; c += kThreads) {
        const int r = c / G::CPR, k = c - r * G::CPR;
        const int64_t i = i0 + r;
        const bool valid = i < t_q;
        cp_async_16(dst + r * G::S + k * 8, qb + ((valid ? i : 0) * Hi + h) * D + k * 8,
                    valid ? 16 : 0);
      }
      cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < Hi) load_head(s, s);
      else cp_async_commit();  // empty group: the wait count stays uniform
    }

    float acc[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

    for (int h = 0; h < Hi; ++h) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // head h landed for every thread; head h - 1's stage is free
      if (h + kStages - 1 < Hi) load_head(h + kStages - 1, (h + kStages - 1) % kStages);
      else cp_async_commit();
      const __nv_bfloat16* qa =
          qs + static_cast<size_t>(h % kStages) * kBQ * G::S + (wq * 32 + a_row) * G::S + a_col;
      float dot[2][4][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) dot[mt][nt][e] = 0.0f;
#pragma unroll
      for (int k = 0; k < G::KS; ++k) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          uint32_t af[4];
          ldsm_x4(af, qa + mt * 16 * G::S + k * 16);
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            mma_bf16(dot[mt][2 * np], af, bfr[np][k][0], bfr[np][k][1]);
            mma_bf16(dot[mt][2 * np + 1], af, bfr[np][k][2], bfr[np][k][3]);
          }
        }
      }
      // acc += (w * head_scale) * relu(dot * qk_scale), the CPU's operations in its order.
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float wv = ws[(wq * 32 + mt * 16 + g + 8 * half) * Hi + h];
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& a = acc[mt][nt][2 * half + e];
              a = __fadd_rn(a, __fmul_rn(wv, relu_cpu(__fmul_rn(dot[mt][nt][2 * half + e],
                                                                 qk_scale))));
            }
          }
        }
      }
    }
    cp_async_wait<0>();  // only empty groups remain; none may outlive the tile

#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t i = i0 + wq * 32 + mt * 16 + g + 8 * half;
        if (i >= t_q) continue;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t p = p0 + wp * 32 + nt * 8 + 2 * tq + e;
            if (p >= n_pools) continue;
            score[i * n_pools + p] =
                pool_visible(p, pool, first_pos + i) ? acc[mt][nt][2 * half + e] : -INFINITY;
          }
        }
      }
    }
  }
}

template <int D>
int launch_score_tc(MemraCudaCtx* ctx, const float* q, const float* w, const float* keys,
                    int t_q, int Hi, int n_pools, int pool, int first_pos, float qk_scale,
                    float head_scale, float* score) {
  using G = Geo<D>;
  const int64_t n = int64_t(t_q) * Hi * D;
  Scratch qb(ctx, sizeof(__nv_bfloat16) * static_cast<size_t>(n));
  MEMRA_CUDA_RETURN_IF(qb.status());
  const unsigned cblocks = static_cast<unsigned>(
      std::min<int64_t>((n / 2 + 255) / 256, int64_t(65535) * 16));
  memra::cuda::launch(ctx, true, to_bf16_kernel, dim3(cblocks), dim3(256), 0, q, n / 2,
      qb.as<uint32_t>());
  MEMRA_CUDA_RETURN_IF(launch_status());
  const size_t bytes = G::bytes(Hi);
  if (bytes > 48 * 1024) {
    int optin = 0;
    MEMRA_CUDA_RETURN_IF(
        status_of(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                         ctx->device)));
    if (bytes > static_cast<size_t>(optin)) return memra::kUnsupportedGeometry;
    MEMRA_CUDA_RETURN_IF(status_of(cudaFuncSetAttribute(
        score_tc_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes))));
  }
  const dim3 grid(ceil_div(n_pools, kBP), std::min(ceil_div(t_q, kBQ), 65535u));
  memra::cuda::launch(ctx, true, score_tc_kernel<D>, dim3(grid), dim3(kThreads), bytes,
      qb.as<__nv_bfloat16>(), w, keys, t_q, Hi, n_pools, pool, first_pos, qk_scale, head_scale,
      score);
  return launch_status();
}

}  // namespace

namespace memra::cuda::dsa {

bool score_tc_fits(int d, int Hi) { return (d == 64 || d == 128) && Hi >= 1 && Hi <= kMaxHi; }

// The arguments are checked by the caller (cuda/dsa.cu's score_rows); t_q, n_pools >= 1.
int score_tc(MemraCudaCtx* ctx, const float* q, const float* w, const float* keys, int t_q,
             int Hi, int d, int n_pools, int pool, int first_pos, float qk_scale,
             float head_scale, float* score) {
  if (!score_tc_fits(d, Hi)) return memra::kUnsupportedGeometry;
  if (d == 64) {
    return launch_score_tc<64>(ctx, q, w, keys, t_q, Hi, n_pools, pool, first_pos, qk_scale,
                               head_scale, score);
  }
  return launch_score_tc<128>(ctx, q, w, keys, t_q, Hi, n_pools, pool, first_pos, qk_scale,
                              head_scale, score);
}

}  // namespace memra::cuda::dsa
