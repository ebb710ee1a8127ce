// Batched MLA decode, dense form, on sm_90a (wgmma + the tensor memory accelerator): the
// GLM-5.3-Flash shape of memra_cuda_mla_attn's batched dense form (cuda_abi/mla.h): 64 heads, kv
// rank R = 512, bf16 latent caches (the cache row is both K and V), one query row per sequence,
// no index list. cuda/mla_decode.cu owns the split plan and every other shape; it calls
// mla_decode_sm90() below when KernelOptions::mla_decode_variant is 1 (the default).
//
// Block (split blockIdx.x, sequence blockIdx.y), 256 threads = two warpgroups that split the 512
// latent columns: warpgroup g reads only columns [256 g, 256 g + 256) of every cache tile, so the
// query lives in registers and the shared memory holds three 64-row cache stages (two tiles in
// flight while the third is computed on). Per tile of 64 rows [split * chunk + 64 t, ..):
//   - QK: S_g = Q_g C_t[:, cols of g]^T, 16 wgmma m64n64k16 with Q_g's bf16 A fragments in
//     registers (64 a thread) and the cache from shared memory (K-major B);
//   - the two partial scores are exchanged through shared memory and each warpgroup forms
//     S = S_g + S_other (the same bits in both: f32 addition commutes), then the same online
//     softmax in both (identical m, p and l): scores * scale * log2(e), rows past the range
//     -inf, p = exp2(s - m) rounded to bf16 straight into the A-fragment layout of the next
//     product (the accumulator and A layouts share rows and column pairs), l = sums of the
//     rounded p. The running max m moves only when a tile's max exceeds it by more than kLazy
//     (log2 units), so p <= 2^kLazy and O, l and the partial's m stay at the old max (consistent,
//     so the result changes by roundings only) and the rescale of O is skipped after the first
//     tiles;
//   - PV: O_g = O_g * alpha + P C_t[:, cols of g], 4 wgmma m64n256k16 with P from registers and
//     the cache N-major from shared memory (128 f32 accumulators a thread).
// Loads: one tensor map per block (the template of launch_attention with the block's cache
// address and row count n put in by tensormap.replace, copied to a global slot with a release
// fence for the tensor-map proxy); thread 0 of warpgroup g issues the four 64 x 64 boxes of its
// half of tile t + 2 (128-byte swizzle: the wgmma layout of cuda/mla_sm90.cuh's descriptors) on
// the mbarrier [stage][g] as tile t starts; rows past n arrive as zeros (rows past t_kv may
// hold anything, NaN in the tests; rows of the next split are finite and masked).
// Shared memory (1024-aligned base): 3 stages x 64 rows x 512 bf16 (8 sub-tiles of 64 columns,
// 8 KiB each, rows at a 128-byte stride), the score exchange f32 [2 warpgroups][8 float4][128
// threads] (32 KiB), the block's tensor map and six mbarriers: 224 KiB + 1 KiB of slack.
// Named barriers: 1 / 2 warpgroup 0 / 1 done with the previous tile (128 threads), 3 partial
// scores written, 4 partial scores read (256 threads).
//
// Why this shape (docs/kernels.md "MLA"): the kernels that kept Q in shared memory (64 KiB) had
// room for two cache stages and ran at 0.54-0.59 of copy on the H200, whether both warpgroups
// shared each tile or took alternate tiles (FlashMLA's schedule).
//
// Splits are chosen by cuda/mla_decode.cu. Sequences with several active splits write partials
// [B, nsplit, 64, 512] f32 (+ m, l) that mla_combine_kernel merges, launched as a programmatic
// dependent of the attention grid so its launch overlaps that grid's tail.
//
// Precision: as the mma.sync kernel of cuda/mla_decode_tc.cu (q and p rounded to bf16, scores,
// softmax statistics and accumulation in f32, sums over the rounded p); the order of the f32
// accumulation inside the tensor cores and the lagging max differ.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstring>

#include "common.cuh"
#include "mla_sm90.cuh"

using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::smem_u32;
using memra::cuda::status_of;

namespace {

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

constexpr int kH = 64;
constexpr int kR = 512;
constexpr int kTile = 64;                     // rows per tile
constexpr int kStages = 3;
constexpr int kThreads = 256;
constexpr int kSub = kTile * 128;             // one 64-column sub-tile of a stage (8 KiB)
constexpr int kStage = 8 * kSub;              // 64 rows x 1 KiB
constexpr int kXOff = kStages * kStage;       // score exchange
constexpr int kMapOff = kXOff + 2 * 8 * 128 * 16;  // this block's tensor map (128 bytes)
constexpr int kBarOff = kMapOff + 128;             // mbarriers [stage][warpgroup]
constexpr int kBytes = kBarOff + kStages * 2 * 8 + 1024;
constexpr int kCombineHeads = 4;  // heads per combine block (one warp each)
constexpr int kMaxSplits = 1024;  // combine weights in shared memory: 4 x 4 KiB at most
constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLazy = 8.0f;  // log2 units the running max may lag a tile's max by
enum : int { kLanded0 = 1, kXWritten = 3, kXRead = 4 };

// 2^x (MUFU.EX2, subnormals flushed: p is rounded to bf16 next; 2^-inf = 0).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// The block's own tensor map: the template's 128 bytes into shared memory, its global address
// and row count replaced, then copied to its global slot with a release fence for the tensor-map
// proxy (one warp; cp_fenceproxy is warp-collective).
__device__ __forceinline__ void make_map(const CUtensorMap& tmpl, unsigned char* smap,
                                         void* gmap, const void* addr, int rows) {
  const int lane = threadIdx.x & 31;
  if (lane < 8) {
    reinterpret_cast<uint4*>(smap)[lane] = reinterpret_cast<const uint4*>(&tmpl)[lane];
  }
  __syncwarp();
  const uint64_t sm = smem_u32(smap);
  if (lane == 0) {
    asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;\n"
                 ::"l"(sm), "l"(addr)
                 : "memory");
    asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;\n"
                 ::"l"(sm), "r"(rows)
                 : "memory");
  }
  __syncwarp();
  asm volatile(
      "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned "
      "[%0], [%1], 128;\n" ::"l"(gmap),
      "r"(static_cast<uint32_t>(sm))
      : "memory");
}

__device__ __forceinline__ void map_acquire(const void* gmap) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(gmap) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Box (64 columns from col, 64 rows from row) of the map into shared memory, 128-byte swizzled;
// rows past the map's row count arrive as zeros.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* gmap, uint32_t bar, int col,
                                            int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(gmap), "r"(bar), "r"(col), "r"(row)
      : "memory");
}

// Block (split blockIdx.x, sequence blockIdx.y). See the file comment.
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_wgmma_kernel(const Sm90Args a, const __grid_constant__ CUtensorMap tmpl,
                            unsigned char* maps) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);

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
  const int nsb = (n + a.chunk - 1) / a.chunk;
  const int ntiles = (end - begin + kTile - 1) / kTile;
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(a.caches[b]);

  const int wg = tid >> 7, wt = tid & 127;
  const int lane = tid & 31, tq = lane & 3;
  const int head0 = ((wt >> 5) << 4) + (lane >> 2);

  // The block's tensor map over its cache: rows [0, n), 512 columns, 64 x 64 boxes.
  void* gmap = maps + 128 * (static_cast<int64_t>(b) * a.nsplit + split);
  const uint32_t bar_s = base + kBarOff;
  if (tid < 32) make_map(tmpl, smem + kMapOff, gmap, cache, n);
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < kStages * 2; ++i) mbar_init(bar_s + 8 * i, 1);
    // The inits made visible to the async proxy (the TMA unit completes transactions on them).
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();  // the map in its slot, the barriers initialised
  if (wt == 0) map_acquire(gmap);
  // This warpgroup's half of tile t into stage t % 3: four 64 x 64 boxes on its barrier (thread
  // wt == 0 of the warpgroup issues them).
  auto load_half = [&](int t) {
    if (wt != 0 || t >= ntiles) return;
    const uint32_t bar = bar_s + 8 * ((t % kStages) * 2 + wg);
    mbar_expect_tx(bar, 4 * kSub);
    const uint32_t st = base + static_cast<uint32_t>((t % kStages) * kStage + wg * 4 * kSub);
#pragma unroll
    for (int c = 0; c < 4; ++c) tma_load_2d(st + c * kSub, gmap, bar, (4 * wg + c) * 64,
                                            begin + t * kTile);
  };
  load_half(0);
  load_half(1);

  // Q[:, 256 wg ..] as bf16 A fragments: k-step kk covers columns c = 256 wg + 16 kk + ..;
  // {row head0: c + 2tq, +1}, {row head0 + 8: same}, {row head0: c + 8 + 2tq, +1}, {row + 8}.
  uint32_t qf[16][4];
  {
    const float* q0 = a.q_lat + (static_cast<int64_t>(b) * kH + head0) * kR + wg * 256 + 2 * tq;
    const float* q1 = q0 + 8 * kR;
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      const float2 v0 = __ldg(reinterpret_cast<const float2*>(q0 + 16 * kk));
      const float2 v1 = __ldg(reinterpret_cast<const float2*>(q1 + 16 * kk));
      const float2 v2 = __ldg(reinterpret_cast<const float2*>(q0 + 16 * kk + 8));
      const float2 v3 = __ldg(reinterpret_cast<const float2*>(q1 + 16 * kk + 8));
      qf[kk][0] = pack_bf16x2(v0.x, v0.y);
      qf[kk][1] = pack_bf16x2(v1.x, v1.y);
      qf[kk][2] = pack_bf16x2(v2.x, v2.y);
      qf[kk][3] = pack_bf16x2(v3.x, v3.y);
    }
  }

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // heads head0, head0 + 8 (log2 domain)
  float l[2] = {0.0f, 0.0f};                // sums of the rounded p (this thread's columns)
  const float sl2 = a.scale * kLog2e;
  float4* xs_own = reinterpret_cast<float4*>(smem + kXOff) + wg * 8 * 128 + wt;
  const float4* xs_other = reinterpret_cast<const float4*>(smem + kXOff) + (wg ^ 1) * 8 * 128 + wt;

#pragma unroll 1
  for (int t = 0; t < ntiles; ++t) {
    mbar_wait(bar_s + 8 * ((t % kStages) * 2 + wg), static_cast<uint32_t>((t / kStages) & 1));
    bar_sync(kLanded0 + wg, 128);  // every warp of this warpgroup is done with tile t - 1
    load_half(t + 2);              // into the stage tile t - 1 used
    uint64_t dc = smem_desc(base + static_cast<uint32_t>((t % kStages) * kStage + wg * 4 * kSub),
                            16, 1024);
    asm volatile("" : "+l"(dc));

    // ---- S_g = Q_g C_t[:, columns of g]^T
    float s[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      wgmma_rs_n64(s, qf[kk], dc + ((((kk >> 2) * kSub) + (kk & 3) * 32) >> 4), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);

    // ---- S = S_g + S_other (the exchange's previous readers have passed kXRead)
    if (t > 0) bar_sync(kXRead, kThreads);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      xs_own[i * 128] = make_float4(s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]);
    }
    bar_sync(kXWritten, kThreads);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 v = xs_other[i * 128];
      s[4 * i] += v.x;
      s[4 * i + 1] += v.y;
      s[4 * i + 2] += v.z;
      s[4 * i + 3] += v.w;
    }

    // ---- online softmax (the same in both warpgroups). The running max moves only when a
    // tile's max exceeds it by more than kLazy (log2 units): p <= 2^kLazy, and O and l stay at
    // the old max (they and the partial's m are consistent, so the result is the same up to the
    // roundings), which skips nearly every rescale of O after the first tiles.
    const int nvalid = min(kTile, end - (begin + t * kTile));
    float mx[2] = {-INFINITY, -INFINITY};
    if (nvalid == kTile) {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        s[i] *= sl2;
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int col = 8 * (i >> 2) + 2 * tq + (i & 1);
        s[i] = col < nvalid ? s[i] * sl2 : -INFINITY;
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 2));
      alpha[r] = 1.0f;
      if (mx[r] > m_run[r] + kLazy) {    // always at the first tile (m_run = -inf)
        alpha[r] = ex2(m_run[r] - mx[r]);  // m_run = -inf: 0
        m_run[r] = mx[r];
        l[r] *= alpha[r];
      }
    }
    uint32_t pf[8][2];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const float p0 = ex2(s[4 * c] - m_run[0]), p1 = ex2(s[4 * c + 1] - m_run[0]);
      const float p2 = ex2(s[4 * c + 2] - m_run[1]), p3 = ex2(s[4 * c + 3] - m_run[1]);
      pf[c][0] = pack_bf16x2(p0, p1);
      pf[c][1] = pack_bf16x2(p2, p3);
      l[0] += bf16x2_sum(pf[c][0]);  // the sums of what the PV product multiplies
      l[1] += bf16x2_sum(pf[c][1]);
    }
    if (__any_sync(kFull, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    }

    // ---- O_g += P C_t[:, columns of g]
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t af[4] = {pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0], pf[2 * kk + 1][1]};
      wgmma_rs_n256_tb(o, af, smem_desc(base + static_cast<uint32_t>((t % kStages) * kStage +
                                                                     wg * 4 * kSub + kk * 2048),
                                        kSub, 1024));
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(o);
  }

  // The combine (a programmatic dependent) may be scheduled now; it waits for this whole grid.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  float L[2];  // the same in both warpgroups
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    L[r] = l[r];
    L[r] += __shfl_xor_sync(kFull, L[r], 1);
    L[r] += __shfl_xor_sync(kFull, L[r], 2);
  }
  const int col0 = wg * 256 + 2 * tq;
  if (nsb == 1) {
    float* out = a.o_lat + static_cast<int64_t>(b) * kH * kR;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float inv = 1.0f / L[r];  // >= 1: the max row contributes p = 1
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

int launch_attention(MemraCudaCtx* ctx, const Sm90Args& a, int B) {
  int optin = 0;
  MEMRA_CUDA_RETURN_IF(status_of(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device)));
  if (kBytes > optin) return memra::kUnsupportedGeometry;
  // cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link).
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (!encode) return memra::kUnsupportedGeometry;
  // The template: bf16 [max_t_kv][512] rows of 1 KiB, 64 x 64 boxes, 128-byte swizzle; each block
  // replaces the address (its sequence's cache; o_lat stands in here) and the row count.
  CUtensorMap tmpl{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kR), static_cast<cuuint64_t>(a.max_t_kv)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kR) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(kTile)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult rc = encode(&tmpl, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.o_lat, dims, strides,
                             box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS) {
    return memra::kUnsupportedGeometry;
  }
  Scratch maps(ctx, static_cast<size_t>(128) * a.nsplit * B);
  MEMRA_CUDA_RETURN_IF(maps.status());
  MEMRA_CUDA_RETURN_IF(status_of(cudaFuncSetAttribute(
      mla_decode_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes)));
  const dim3 grid(static_cast<unsigned>(a.nsplit), static_cast<unsigned>(B));
  memra::cuda::launch(ctx, true, mla_decode_wgmma_kernel, grid, dim3(kThreads), kBytes, a,
                      tmpl, maps.as<unsigned char>());
  return launch_status();
}

}  // namespace

namespace memra::cuda {

int mla_decode_sm90_tile_rows() { return kTile; }

int mla_decode_sm90_max_splits() { return kMaxSplits; }

int mla_decode_sm90(MemraCudaCtx* ctx, const float* q_lat, const void* const* caches,
                    const int32_t* t_kv, int B, int max_t_kv, int chunk, int nsplit, float scale,
                    float* o_lat) {
  // The plan's invariants (cuda/mla_decode.cu): whole tiles a split, the splits cover max_t_kv,
  // one grid row a sequence.
  if (B < 1 || B > 65535 || max_t_kv < 1 || nsplit < 1 || nsplit > kMaxSplits || chunk < kTile ||
      chunk % kTile != 0 || static_cast<int64_t>(nsplit) * chunk < max_t_kv) {
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
  const int rc = launch_attention(ctx, a, B);
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
