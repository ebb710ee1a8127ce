// Batched MLA decode, dense form, on sm_90a warpgroup MMA (wgmma): the GLM-5.3-Flash shape of
// memra_cuda_mla_attn's batched dense form (cuda_abi/mla.h): 64 heads, kv rank R = 512, bf16
// latent caches (the cache row is both K and V), one query row per sequence, no index list.
// cuda/mla_decode.cu owns the split plan and every other shape; it calls
// mla_decode_sm90() below when KernelOptions::mla_decode_variant selects this arm (1 or 2).
//
// Block (split blockIdx.x, sequence blockIdx.y) = 2 warpgroups (256 threads), rows
// [split * chunk, min(n_b, (split + 1) * chunk)) in tiles of TR rows (TR = 64, 2 stages: variant
// 1; TR = 48, 3 stages: variant 2), an online softmax over them, then o_lat directly (one split)
// or an unnormalised partial (o, m, l) merged by mla_combine_kernel.
//
// Shared memory (offsets from a 1024-byte aligned base; the 128-byte swizzle pattern repeats every
// 1024 bytes): Q bf16 [64 heads][512] (64 KiB) and NST cache stages of TR rows x 512 (TR KiB
// each), both in the wgmma 128-byte-swizzle layout: the 512 columns are 8 sub-tiles of 64
// columns; sub-tile cb holds rows at a 128-byte stride, and the 16-byte chunk j (columns
// 64 cb + 8 j .. + 7) of row r sits at chunk position j ^ (r % 8). That one layout serves as
//   - K-major A (Q: M = heads, K = columns) and K-major B (cache: N = rows, K = columns) of
//     S = Q C^T: descriptor start = sub-tile (ks / 4) + 32 bytes * (ks % 4) for k-step ks,
//     stride byte offset 1024 (8 rows), leading byte offset unused (16);
//   - N-major B (cache: K = rows, N = columns, imm-trans-b = 1) of O = P C: start = sub-tile +
//     2048 bytes per 16-row k-step, leading byte offset = the sub-tile stride (the next 64
//     columns), stride byte offset 1024 (the next 8 rows).
// Tiles are fetched by 16-byte cp.async (each row is 1 KiB of contiguous global memory; per
// sequence pointers rule out one tensor map), rows past the range zero-filled (never read from
// global memory: rows past t_kv may hold anything, NaN in the tests), NST - 1 tiles ahead.
//
// Per tile (both warpgroups; g = warpgroup):
//   QK: warpgroup g computes S_g [64 heads x TR/2 rows] = Q C[rows g*TR/2 ..]^T: 32 wgmma
//       m64n(TR/2)k16, both operands from shared memory, f32 accumulators in registers;
//   softmax: scores * scale * log2(e), rows past the range -inf; row maxima of the two halves
//       exchanged through shared memory (the thread of the other warpgroup with the same index
//       holds the same heads), m_new = max(m, both), alpha = exp2(m - m_new), p = exp2(s - m_new)
//       rounded to bf16 straight into the A-fragment layout of the next product (the
//       accumulator and A layouts share rows and column pairs), partial sums l of the rounded p;
//       each warpgroup hands its p fragments to the other through shared memory (8 bytes per
//       thread per 8 rows, conflict-free);
//   PV: warpgroup g owns O[64 heads x columns 256 g .. 256 g + 255] (128 f32 registers per
//       thread): O = O * alpha + P C[:, its columns], TR / 16 wgmma m64n256k16 with P from
//       registers.
// Three block barriers per tile (tile landed / maxima / p fragments). Every cache byte is read
// once from HBM; from shared memory the QK products read Q (2 KiB) and the cache (TR/2 x 32
// bytes) per k-step and warpgroup, the PV products the cache once.
//
// Splits are chosen by cuda/mla_decode.cu. Sequences with several active splits write partials
// [B, nsplit, 64, 512] f32 (+ m, l) that mla_combine_kernel merges, launched as a programmatic
// dependent of the attention grid so its launch overlaps that grid's tail. One tile (variant 1)
// or two (variant 2) are in flight while a tile is computed (the per-tile cycle budget:
// docs/kernels.md "MLA").
//
// Precision: as the mma.sync kernel of cuda/mla_decode_tc.cu (q and p rounded to bf16, scores,
// softmax statistics and accumulation in f32, sums over the rounded p); only the order of the
// f32 accumulation inside the tensor cores differs.
//
// Registers: O 128 + S 16 + p fragments 16 per thread, __launch_bounds__(256, 1).
// Shared memory: 64 KiB + NST x TR KiB + exchange buffers (2 x (TR/16) x 1 KiB + 2 KiB) + 1 KiB of
// alignment slack: 203 KiB (variant 1), 217 KiB (variant 2).
#include <cstdint>
#include <cstring>

#include "common.cuh"
#include "mla_sm90.cuh"

using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::smem_u32;
using memra::cuda::status_of;

namespace {

constexpr int kH = 64;     // heads (M of both products)
constexpr int kR = 512;    // kv rank
constexpr int kThreads = 256;  // 2 warpgroups
constexpr int kCombineHeads = 4;  // heads per combine block (one warp each)
constexpr int kMaxSplits = 1024;  // combine weights in shared memory: 4 x 4 KiB at most
constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;

struct Sm90Args {
  const float* q_lat;         // [B, 64, 512] f32, 16-byte aligned
  const void* const* caches;  // [B] device pointers to bf16 rows of 512, 16-byte aligned
  const int32_t* t_kv;        // [B] rows visible to each sequence, clamped to [0, max_t_kv]
  int max_t_kv;
  int chunk;                  // rows per split, a multiple of the tile
  int nsplit;                 // splits in the grid
  float scale;
  float* o_lat;               // [B, 64, 512] f32, 16-byte aligned
  float* po;                  // partials [B, nsplit, 64, 512] (nsplit > 1)
  float* pm;                  // [B, nsplit, 64] running max, log2 domain
  float* pl;                  // [B, nsplit, 64] sum of the rounded p
};

template <int TR, int NST>
struct Cfg {
  static_assert(TR % 16 == 0 && TR >= 16 && TR <= 64, "tiles of 16-row k-steps");
  static constexpr int kHalf = TR / 2;       // rows per warpgroup in S (N of the QK wgmma)
  static constexpr int kNch = kHalf / 8;     // 8-row column chunks of S per warpgroup
  static constexpr int kNs = kHalf / 2;      // S accumulators per thread
  static constexpr int kKs = TR / 16;        // k-steps of the PV product
  static constexpr int kSub = TR * 128;      // bytes of one 64-column sub-tile of a stage
  static constexpr int kStage = 8 * kSub;    // TR rows x 1 KiB
  static constexpr int kLoads = TR * 64 / kThreads;  // 16-byte copies per thread per tile
  static constexpr int q_off = 0;
  static constexpr int c_off = q_off + kH * kR * 2;
  static constexpr int pex_off = c_off + NST * kStage;             // uint2 [2][kNch][128]
  static constexpr int xch_off = pex_off + 2 * kNch * 128 * 8;     // float2 [2][128]
  static constexpr int bytes = xch_off + 2 * 128 * 8 + 1024;       // + alignment slack
  static_assert(kSub % 1024 == 0 && (kHalf * 128) % 1024 == 0, "swizzle atoms stay aligned");
  static_assert(kLoads * kThreads == TR * 64, "whole tiles per pass");
};

// ---------------------------------------------------------------- attention kernel

// Block (split blockIdx.x, sequence blockIdx.y). See the file comment.
template <int TR, int NST>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_wgmma_kernel(const Sm90Args a) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh); triggers below
  using C = Cfg<TR, NST>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t q_s = base + C::q_off, c_s = base + C::c_off;
  uint2* pex = reinterpret_cast<uint2*>(smem + C::pex_off);
  float2* xch = reinterpret_cast<float2*>(smem + C::xch_off);

  const int split = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int n = min(max(a.t_kv[b], 0), a.max_t_kv);
  if (n <= 0) {  // idle row: zeros from split 0, nothing read (uniform over the block)
    if (split == 0) {
      float4* o = reinterpret_cast<float4*>(a.o_lat + static_cast<int64_t>(b) * kH * kR);
      for (int k = tid; k < kH * kR / 4; k += kThreads) o[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    return;
  }
  const int begin = split * a.chunk;
  if (begin >= n) return;
  const int end = min(n, begin + a.chunk);
  const int nsb = (n + a.chunk - 1) / a.chunk;  // active splits of this sequence
  const int ntiles = (end - begin + TR - 1) / TR;
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(a.caches[b]);

  const int wg = tid >> 7, wt = tid & 127;  // warpgroup, thread in it
  const int lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int head0 = ((wt >> 5) << 4) + g;  // this thread's accumulator rows: head0, head0 + 8

  // Tile t into stage t % NST: 16-byte chunk c = tid + 256 i is row c / 64, chunk c % 64 (a warp
  // reads 512 contiguous bytes); rows past `end` zero-filled without a global read.
  auto load_tile = [&](int t) {
    const int t0 = begin + t * TR;
    const uint32_t dst = c_s + static_cast<uint32_t>((t % NST) * C::kStage);
#pragma unroll
    for (int i = 0; i < C::kLoads; ++i) {
      const int c = tid + kThreads * i;
      const int j = c >> 6, k = c & 63;
      const bool valid = t0 + j < end;
      const __nv_bfloat16* src = cache + (valid ? static_cast<int64_t>(t0 + j) * kR + k * 8 : 0);
      cp_async_16(dst + swz(j, k, C::kSub), src, valid ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < NST - 1; ++s) {
    if (s < ntiles) load_tile(s);
    cp_async_commit();  // one group per tile slot, empty or not: the wait counts stay uniform
  }

  // Q rounded to bf16 into the swizzled layout (sub-tiles of 64 heads x 128 bytes).
  {
    const float* qb = a.q_lat + static_cast<int64_t>(b) * kH * kR;
#pragma unroll 4
    for (int i = 0; i < kH * 64 / kThreads; ++i) {
      const int c = tid + kThreads * i;
      const int h = c >> 6, k = c & 63;
      const float4* src = reinterpret_cast<const float4*>(qb + h * kR + k * 8);
      const float4 v0 = __ldg(src), v1 = __ldg(src + 1);
      const uint4 u = make_uint4(pack_bf16x2(v0.x, v0.y), pack_bf16x2(v0.z, v0.w),
                                 pack_bf16x2(v1.x, v1.y), pack_bf16x2(v1.z, v1.w));
      *reinterpret_cast<uint4*>(smem + C::q_off + swz(h, k, kH * 128)) = u;
    }
  }

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // heads head0, head0 + 8 (log2 domain)
  float l_thr[2] = {0.0f, 0.0f};            // sums of the rounded p over this thread's columns
  const float sl2 = a.scale * kLog2e;
  const int col_base = wg * C::kHalf + 2 * tq;  // tile column of s[0]

#pragma unroll 1
  for (int t = 0; t < ntiles; ++t) {
    cp_async_wait<NST - 2>();  // this thread's copies of tile t (and Q's stores) are done
    fence_proxy_async();
    __syncthreads();  // B1: tile t visible to both warpgroups; PV of tile t - 1 finished
    {
      const int tn = t + NST - 1;  // into the stage tile t - 1 used
      if (tn < ntiles) load_tile(tn);
      cp_async_commit();
    }
    const uint32_t st = c_s + static_cast<uint32_t>((t % NST) * C::kStage);
    const int nvalid = min(TR, end - (begin + t * TR));

    // ---- S_wg = Q C[rows wg * kHalf ..]^T over the 512 columns
    float s[C::kNs];
#pragma unroll
    for (int i = 0; i < C::kNs; ++i) s[i] = 0.0f;
    wgmma_fence();
    {
      const uint32_t kb = st + static_cast<uint32_t>(wg * C::kHalf * 128);
#pragma unroll
      for (int ks = 0; ks < kR / 16; ++ks) {
        const uint32_t koff = static_cast<uint32_t>((ks & 3) * 32);
        const uint64_t da = smem_desc(q_s + (ks >> 2) * (kH * 128) + koff, 16, 1024);
        const uint64_t db = smem_desc(kb + (ks >> 2) * C::kSub + koff, 16, 1024);
        if constexpr (C::kHalf == 32) {
          wgmma_ss_n32(s, da, db, 1);
        } else {
          wgmma_ss_n24(s, da, db, 1);
        }
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);

    // ---- scores (log2 domain), masked; maxima of both halves
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < C::kNs; ++i) {
      const int col = col_base + 8 * (i >> 2) + (i & 1);
      const float v = col < nvalid ? s[i] * sl2 : -INFINITY;
      s[i] = v;
      mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], v);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 2));
    }
    xch[wg * 128 + wt] = make_float2(mx[0], mx[1]);
    __syncthreads();  // B2: maxima of both halves
    const float2 other = xch[(wg ^ 1) * 128 + wt];
    float m_new[2], alpha[2];
    m_new[0] = fmaxf(m_run[0], fmaxf(mx[0], other.x));  // finite: row 0 of the tile is valid
    m_new[1] = fmaxf(m_run[1], fmaxf(mx[1], other.y));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      alpha[r] = exp2f(m_run[r] - m_new[r]);  // m_run = -inf: 0
      m_run[r] = m_new[r];
      l_thr[r] *= alpha[r];
    }

    // ---- p~ = bf16(exp2(s - m_new)) as A fragments: chunk c (tile rows 8c ..) of this half is
    // (row head0: cols 2tq, 2tq+1; row head0 + 8: same cols) = .x, .y
    uint2 own[C::kNch];
#pragma unroll
    for (int c = 0; c < C::kNch; ++c) {
      const uint32_t u0 = pack_bf16x2(exp2f(s[4 * c] - m_new[0]), exp2f(s[4 * c + 1] - m_new[0]));
      const uint32_t u1 =
          pack_bf16x2(exp2f(s[4 * c + 2] - m_new[1]), exp2f(s[4 * c + 3] - m_new[1]));
      l_thr[0] += bf16x2_sum(u0);
      l_thr[1] += bf16x2_sum(u1);
      own[c] = make_uint2(u0, u1);
      pex[(wg * C::kNch + c) * 128 + wt] = own[c];
    }
    if (__any_sync(kFull, alpha[0] != 1.0f || alpha[1] != 1.0f)) {  // the max moved (exact skip)
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
    __syncthreads();  // B3: p fragments of both halves
    uint2 ch[2 * C::kNch];  // chunks 0 .. 2 kNch - 1 of the whole tile
#pragma unroll
    for (int c = 0; c < C::kNch; ++c) {
      const uint2 part = pex[((wg ^ 1) * C::kNch + c) * 128 + wt];
      ch[c] = wg == 0 ? own[c] : part;
      ch[C::kNch + c] = wg == 0 ? part : own[c];
    }

    // ---- O[:, 256 wg ..] += P C[:, 256 wg ..]
    wgmma_fence();
    {
      const uint32_t vb = st + static_cast<uint32_t>(wg * 4 * C::kSub);
#pragma unroll
      for (int kk = 0; kk < C::kKs; ++kk) {
        const uint32_t af[4] = {ch[2 * kk].x, ch[2 * kk].y, ch[2 * kk + 1].x, ch[2 * kk + 1].y};
        wgmma_rs_n256_tb(o, af, smem_desc(vb + kk * 2048, C::kSub, 1024));
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(o);
  }

  // The combine (launched as a programmatic dependent) may be scheduled now; it still waits for
  // this whole grid to finish and flush (griddepcontrol.wait) before reading a partial.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // ---- epilogue: l per head = quad sum, then both halves (xch is free: its last readers
  // passed B3 of the last tile)
  float L[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    L[r] = l_thr[r];
    L[r] += __shfl_xor_sync(kFull, L[r], 1);
    L[r] += __shfl_xor_sync(kFull, L[r], 2);
  }
  xch[wg * 128 + wt] = make_float2(L[0], L[1]);
  __syncthreads();
  {
    const float2 other = xch[(wg ^ 1) * 128 + wt];
    L[0] += other.x;  // >= 1: the max row contributes p = 1
    L[1] += other.y;
  }
  const int col0 = wg * 256 + 2 * tq;
  if (nsb == 1) {
    float* out = a.o_lat + static_cast<int64_t>(b) * kH * kR;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float inv = 1.0f / L[r];
      float* row = out + (head0 + 8 * r) * kR + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(row + 8 * j) =
            make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      }
    }
  } else {
    const int64_t k0 = (static_cast<int64_t>(b) * a.nsplit + split) * kH;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float* row = a.po + (k0 + head0 + 8 * r) * kR + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(row + 8 * j) =
            make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
      }
      if (wg == 0 && tq == 0) {
        a.pm[k0 + head0 + 8 * r] = m_run[r];
        a.pl[k0 + head0 + 8 * r] = L[r];
      }
    }
  }
}

// ---------------------------------------------------------------- combine

// Block (head group blockIdx.x of 4 heads, sequence blockIdx.y), 128 threads: merges the active
// splits of a sequence with at least two. Warp w computes head h0 + w's weights
// w_s = exp2(m_s - max m) and 1 / sum_s w_s l_s; thread t then writes columns 4t .. 4t + 3 of
// the 4 heads. Shared: weights [4][nsplit] + inverse sums [4].
__global__ void __launch_bounds__(128) mla_combine_kernel(const Sm90Args a) {
  // Launched as a programmatic dependent: wait until the attention grid has completed and its
  // writes are visible (returns at once for an ordinary launch).
  memra::cuda::pdl_wait();
  memra::cuda::pdl_trigger();
  extern __shared__ float wsm[];
  const int b = blockIdx.y, h0 = blockIdx.x * kCombineHeads;
  const int n = min(max(a.t_kv[b], 0), a.max_t_kv);
  const int nsb = n > 0 ? (n + a.chunk - 1) / a.chunk : 0;
  if (nsb <= 1) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ns = a.nsplit;
  float* inv_l = wsm + kCombineHeads * ns;
  {
    const int h = h0 + warp;
    const int64_t k = static_cast<int64_t>(b) * ns * kH + h;  // split s at k + s * kH
    float M = -INFINITY;
    for (int s = lane; s < nsb; s += 32) M = fmaxf(M, a.pm[k + s * kH]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(kFull, M, off));
    float Ls = 0.0f;
    for (int s = lane; s < nsb; s += 32) {
      const float w = exp2f(a.pm[k + s * kH] - M);  // every active split saw a row: finite
      wsm[warp * ns + s] = w;
      Ls = fmaf(w, a.pl[k + s * kH], Ls);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) Ls += __shfl_xor_sync(kFull, Ls, off);
    if (lane == 0) inv_l[warp] = 1.0f / Ls;
  }
  __syncthreads();
  float4 acc[kCombineHeads];
#pragma unroll
  for (int u = 0; u < kCombineHeads; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
  const float4* po = reinterpret_cast<const float4*>(a.po);
#pragma unroll 2
  for (int s = 0; s < nsb; ++s) {
    const int64_t k = (static_cast<int64_t>(b) * ns + s) * kH + h0;
#pragma unroll
    for (int u = 0; u < kCombineHeads; ++u) {
      const float w = wsm[u * ns + s];
      const float4 v = __ldg(po + (k + u) * (kR / 4) + tid);
      acc[u].x = fmaf(w, v.x, acc[u].x);
      acc[u].y = fmaf(w, v.y, acc[u].y);
      acc[u].z = fmaf(w, v.z, acc[u].z);
      acc[u].w = fmaf(w, v.w, acc[u].w);
    }
  }
  float4* out = reinterpret_cast<float4*>(a.o_lat + (static_cast<int64_t>(b) * kH + h0) * kR);
#pragma unroll
  for (int u = 0; u < kCombineHeads; ++u) {
    const float inv = inv_l[u];
    out[u * (kR / 4) + tid] = make_float4(acc[u].x * inv, acc[u].y * inv, acc[u].z * inv,
                                          acc[u].w * inv);
  }
}

template <int TR, int NST>
int launch(MemraCudaCtx* ctx, const Sm90Args& a, int B) {
  using C = Cfg<TR, NST>;
  int optin = 0;
  MEMRA_CUDA_RETURN_IF(status_of(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device)));
  if (C::bytes > optin) return memra::kUnsupportedGeometry;
  MEMRA_CUDA_RETURN_IF(status_of(cudaFuncSetAttribute(
      mla_decode_wgmma_kernel<TR, NST>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::bytes)));
  const dim3 grid(static_cast<unsigned>(a.nsplit), static_cast<unsigned>(B));
  memra::cuda::launch(ctx, true, mla_decode_wgmma_kernel<TR, NST>, grid, dim3(kThreads), C::bytes,
                      a);
  return launch_status();
}

}  // namespace

namespace memra::cuda {

int mla_decode_sm90_tile_rows(int variant) { return variant == 2 ? 48 : 64; }

int mla_decode_sm90_max_splits() { return kMaxSplits; }

int mla_decode_sm90(MemraCudaCtx* ctx, int variant, const float* q_lat, const void* const* caches,
                    const int32_t* t_kv, int B, int max_t_kv, int chunk, int nsplit, float scale,
                    float* o_lat) {
  if (B < 1 || max_t_kv < 1 || nsplit < 1 || nsplit > kMaxSplits ||
      chunk % mla_decode_sm90_tile_rows(variant) != 0) {
    return kContractValue;
  }
  Sm90Args a{};
  a.q_lat = q_lat;
  a.caches = caches;
  a.t_kv = t_kv;
  a.max_t_kv = max_t_kv;
  a.chunk = chunk;
  a.nsplit = nsplit;
  a.scale = scale;
  a.o_lat = o_lat;
  const size_t n_part = static_cast<size_t>(B) * nsplit * kH;
  Scratch part(ctx, nsplit > 1 ? sizeof(float) * n_part * (kR + 2) : 0);
  MEMRA_CUDA_RETURN_IF(part.status());
  if (nsplit > 1) {
    a.po = part.as<float>();
    a.pm = a.po + n_part * kR;
    a.pl = a.pm + n_part;
  }
  const int rc = variant == 2 ? launch<48, 3>(ctx, a, B) : launch<64, 2>(ctx, a, B);
  if (rc != kOk) return rc;
  if (nsplit > 1) {
    // A programmatic dependent launch: the combine's launch overlaps the attention grid's tail
    // (its blocks wait in griddepcontrol.wait); an ordinary launch where that is refused or
    // KernelOptions::pdl is off.
    const dim3 grid(kH / kCombineHeads, static_cast<unsigned>(B));
    const size_t smem = sizeof(float) * kCombineHeads * (static_cast<size_t>(nsplit) + 1);
    memra::cuda::launch(ctx, true, mla_combine_kernel, grid, dim3(128), smem, a);
    MEMRA_CUDA_RETURN_IF(launch_status());
  }
  return kOk;
}

}  // namespace memra::cuda
