// Batched MLA decode, dense form, on sm_90a (wgmma + the tensor memory accelerator): the
// GLM-5.3-Flash shape of memra_cuda_mla_attn's batched dense form (cuda_abi/mla.h): 64 heads, kv
// rank R = 512, bf16 latent caches (the cache row is both K and V), one query row per sequence,
// no index list. cuda/mla_decode.cu owns the split plan and every other shape; it calls
// mla_decode_sm90() below when KernelOptions::mla_decode_variant is 1 (the default).
//
// THE SOFTMAX-WARPGROUP ARM (session 17, measured and not kept: docs/kernels.md "Batched decode
// attention"). Block (split blockIdx.x, sequence blockIdx.y), 384 threads. Warpgroups 0 and 1
// (224 registers by setmaxnreg) hold O[:, 256 g ..) and issue the products; warpgroup 2 (56
// registers) runs the softmax, so its CUDA-core work runs while the tensor cores work on other
// tiles. Tiles of 48 rows (64-row tiles need ~256 registers in the product warpgroups: O 128, S
// 32 and Q's fragments 64 live at once, with the QK of one tile and the PV of another in
// flight); three 48-row stages (144 KiB), Q's columns [256 g + 128, ..) in shared memory (32 KiB)
// and [256 g, + 128) as A fragments (32 registers). Per tile t, in the product warpgroups: wait
// for P(t) and rescale O by alpha(t); issue QK(t + 2) (8 wgmma m64n48k16 from registers, 8 from
// shared memory) and PV(t) (3 wgmma m64n256k16, P from shared memory) back to back; once QK is
// done hand S over (warpgroup 0 writes its partial, warpgroup 1 adds its own and the row maxima);
// once PV is done free P's buffer and reload the stage with tile t + 3. The softmax warpgroup
// takes S(t), moves the lazy max, writes alpha(t) and P(t) (bf16, the wgmma A layout, 128-byte
// swizzle) into one of two buffers. S, P, alpha and the maxima are double-buffered by the tile's
// parity, as are the named barriers used once a tile.
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
constexpr int kTile = 48;                     // rows per tile
constexpr int kStages = 3;
constexpr int kThreads = 384;                 // product warpgroups 0, 1; softmax warpgroup 2
// setmaxnreg moves registers between the warpgroups inside the block's launch allocation: 384
// threads at the 168 registers ptxas gives a __launch_bounds__(384, 1) kernel, so the three
// warpgroups' counts may sum to 3 x 168 at most (an increase beyond the pool never returns).
constexpr int kLaunchRegs = 168;
constexpr int kProductRegs = 224;
constexpr int kSoftmaxRegs = 56;
static_assert(2 * kProductRegs + kSoftmaxRegs <= 3 * kLaunchRegs, "setmaxnreg pool");
constexpr int kSub = kTile * 128;             // one 64-column sub-tile of a stage (6 KiB)
constexpr int kStage = 8 * kSub;              // 48 rows x 1 KiB
constexpr int kQSub = kH * 128;               // 64 heads x 64 columns of Q, bf16 (8 KiB)
constexpr int kQOff = kStages * kStage;       // Q[:, 256 g + 128 ..) [g][2 sub-tiles], as kSub
constexpr int kLdS = kTile + 4;               // S's row stride (floats): conflict-free stores
constexpr int kSBuf = kH * kLdS * 4;
constexpr int kSOff = kQOff + 4 * kQSub;      // S f32 [2][64 heads][kLdS]
constexpr int kPOff = kSOff + 2 * kSBuf;      // P bf16 [2][64 heads][64 (48 used)], wgmma A
constexpr int kPBuf = kH * 128;
constexpr int kAOff = kPOff + 2 * kPBuf;      // alpha f32 [2][64]
constexpr int kMxOff = kAOff + 2 * kH * 4;    // the tile's row maxima f32 [2][64]
constexpr int kLOff = kMxOff + 2 * kH * 4;    // final L [64] and m [64]
constexpr int kMapOff = kLOff + 2 * kH * 4;   // this block's tensor map (128 bytes)
constexpr int kBarOff = kMapOff + 128;        // mbarriers [stage][warpgroup]
constexpr int kBytes = kBarOff + kStages * 2 * 8 + 1024;
constexpr int kCombineHeads = 4;  // heads per combine block (one warp each)
constexpr int kMaxSplits = 1024;  // combine weights in shared memory: 4 x 4 KiB at most
constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLazy = 8.0f;  // log2 units the running max may lag a tile's max by
// Named barriers (bar.sync / bar.arrive ids; 0 is __syncthreads).
// Those used once a tile come in pairs by the tile's parity: with S two tiles ahead of P, one
// side can reach the next tile's arrival before the other has passed this tile's wait.
enum : int {
  kS0Written0 = 1,  // 1 + (t & 1): warpgroup 0's partial scores written (0 arrives, 1 waits: 256)
  kSReady0 = 3,     // 3 + (t & 1): S(t) and its row maxima written (1 arrives, softmax waits: 256)
  kPReady0 = 5,     // 5 + (t & 1): P(t) and alpha written (softmax arrives, 0 and 1 wait: 384)
  kPFree0 = 7,      // 7 + (t & 1): the products of tile t done (0, 1 arrive, softmax waits: 384)
  kDone0 = 9,       // 9 + g: every warp of warpgroup g done with a stage (128)
  kFinal = 11,      // L and m written (softmax arrives, 0 and 1 wait: 384)
};
static_assert(kQOff % 1024 == 0 && kPOff % 1024 == 0 && kSub % 1024 == 0,
              "128-byte swizzle atoms are 1024-byte aligned");
static_assert(kBytes <= 227 * 1024, "shared memory");

// S's element (head h, column c). The row stride of 52 floats spreads a warp's accumulator-layout
// stores (8 rows x 32 bytes) over all banks.
__device__ __forceinline__ int sidx(int h, int c) { return h * kLdS + c; }

// 2^x (MUFU.EX2, subnormals flushed: p is rounded to bf16 next; 2^-inf = 0).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
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
  const float sl2 = a.scale * kLog2e;
  float* sbuf = reinterpret_cast<float*>(smem + kSOff);
  float* abuf = reinterpret_cast<float*>(smem + kAOff);
  float* mxbuf = reinterpret_cast<float*>(smem + kMxOff);
  float* lbuf = reinterpret_cast<float*>(smem + kLOff);  // L [64], then m [64]

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

  if (wg == 2) {
    // ---- the softmax warpgroup: thread (head h, half) owns row h's columns [24 half, +24).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kSoftmaxRegs));
    const int h = wt >> 1, half = wt & 1;
    float m_run = -INFINITY, l = 0.0f;  // the running max (log2 domain) and this half's sums
#pragma unroll 1
    for (int t = 0; t < ntiles; ++t) {
      bar_sync(kSReady0 + (t & 1), 256);
      const int nvalid = min(kTile, end - (begin + t * kTile));
      const float* st = sbuf + (t & 1) * (kH * kLdS);
      // The running max moves only when the tile's max exceeds it by more than kLazy.
      const float mx = mxbuf[(t & 1) * kH + h] * sl2;
      float alpha = 1.0f;
      if (mx > m_run + kLazy) {  // always at the first tile (m_run = -inf)
        alpha = ex2(m_run - mx);  // m_run = -inf: 0
        m_run = mx;
        l *= alpha;
      }
      if (t >= 2) bar_sync(kPFree0 + (t & 1), kThreads);  // the products of tile t - 2 are done
      if (half == 0) abuf[(t & 1) * kH + h] = alpha;
      unsigned char* prow = smem + kPOff + (t & 1) * kPBuf + h * 128;
#pragma unroll
      for (int i = 0; i < 3; ++i) {  // 8 columns = one 16-byte piece of P's row
        const int c0 = 24 * half + 8 * i;
        const float4 u = *reinterpret_cast<const float4*>(st + sidx(h, c0));
        const float4 v = *reinterpret_cast<const float4*>(st + sidx(h, c0 + 4));
        const float x[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int c = c0 + 2 * j;
          const float p0 = c < nvalid ? ex2(x[2 * j] * sl2 - m_run) : 0.0f;
          const float p1 = c + 1 < nvalid ? ex2(x[2 * j + 1] * sl2 - m_run) : 0.0f;
          w[j] = pack_bf16x2(p0, p1);
          l += bf16x2_sum(w[j]);  // the sums of what the PV product multiplies
        }
        *reinterpret_cast<uint4*>(prow + (((3 * half + i) ^ (h & 7)) << 4)) =
            make_uint4(w[0], w[1], w[2], w[3]);
      }
      fence_proxy_async_smem();  // P is read by wgmma (the async proxy)
      bar_arrive(kPReady0 + (t & 1), kThreads);
    }
    const float L = l + __shfl_xor_sync(kFull, l, 1);
    if (half == 0) {
      lbuf[h] = L;
      lbuf[kH + h] = m_run;
    }
    bar_arrive(kFinal, kThreads);
    return;
  }

  // ---- the product warpgroups: wg owns the latent columns [256 wg, 256 wg + 256).
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kProductRegs));
  const int head0 = ((wt >> 5) << 4) + (lane >> 2);
  if (wt == 0) map_acquire(gmap);
  // This warpgroup's half of tile t into stage t % 3: four 64 x 48 boxes on its barrier (thread
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
  load_half(2);

  // Q[:, 256 wg + 128 ..) as bf16 into shared memory (the A operand of k-steps 8..15: two 64 x 64
  // sub-tiles, rows of 128 bytes, 16-byte pieces XOR-swizzled by head & 7).
  const float* qb = a.q_lat + static_cast<int64_t>(b) * kH * kR + wg * 256;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int idx = wt + 128 * k, h = idx >> 4, cq = idx & 15;  // cq: 8 columns
    const float4 v0 = __ldg(reinterpret_cast<const float4*>(qb + h * kR + 128 + 8 * cq));
    const float4 v1 = __ldg(reinterpret_cast<const float4*>(qb + h * kR + 128 + 8 * cq + 4));
    *reinterpret_cast<uint4*>(smem + kQOff + (2 * wg + (cq >> 3)) * kQSub + h * 128 +
                              (((cq & 7) ^ (h & 7)) << 4)) =
        make_uint4(pack_bf16x2(v0.x, v0.y), pack_bf16x2(v0.z, v0.w), pack_bf16x2(v1.x, v1.y),
                   pack_bf16x2(v1.z, v1.w));
  }
  fence_proxy_async_smem();
  // Q[:, 256 wg .. + 128) as bf16 A fragments: k-step kk covers columns c = 256 wg + 16 kk + ..;
  // {row head0: c + 2tq, +1}, {row head0 + 8: same}, {row head0: c + 8 + 2tq, +1}, {row + 8}.
  uint32_t qf[8][4];
  {
    const float* q0 = qb + head0 * kR + 2 * tq;
    const float* q1 = q0 + 8 * kR;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
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
  bar_sync(kDone0 + wg, 128);  // this warpgroup's Q in shared memory

  // S_wg(t) = Q_wg C_t[:, columns of wg]^T: 8 wgmma m64n48k16 with Q from registers, 8 with Q
  // from shared memory (issued, not waited).
  float s[24];
  const uint32_t qs = base + kQOff + 2 * wg * kQSub;
  auto issue_qk = [&](int t) {
    mbar_wait(bar_s + 8 * ((t % kStages) * 2 + wg), static_cast<uint32_t>((t / kStages) & 1));
    uint64_t dc = smem_desc(base + static_cast<uint32_t>((t % kStages) * kStage + wg * 4 * kSub),
                            16, 1024);
    asm volatile("" : "+l"(dc));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      wgmma_rs_n48(s, qf[kk], dc + ((((kk >> 2) * kSub) + (kk & 3) * 32) >> 4), kk > 0 ? 1 : 0);
    }
#pragma unroll
    for (int kk = 8; kk < 16; ++kk) {
      wgmma_ss_n48(s, smem_desc(qs + ((kk - 8) >> 2) * kQSub + (kk & 3) * 32, 16, 1024),
                   dc + ((((kk >> 2) * kSub) + (kk & 3) * 32) >> 4));
    }
    wgmma_commit();
  };
  // S(t) = S_1 + S_0 into sbuf (the same bits as S_0 + S_1), and its row maxima into mxbuf:
  // warpgroup 0 writes its partial, warpgroup 1 adds its own, takes the maxima over the valid
  // columns and hands the tile to the softmax warpgroup.
  auto hand_over = [&](int t) {
    float* const st = sbuf + (t & 1) * (kH * kLdS);
    if (wg == 0) {
#pragma unroll
      for (int j = 0; j < 6; ++j) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          *reinterpret_cast<float2*>(st + sidx(head0 + 8 * r, 8 * j + 2 * tq)) =
              make_float2(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]);
        }
      }
      bar_arrive(kS0Written0 + (t & 1), 256);
      return;
    }
    const int nvalid = min(kTile, end - (begin + t * kTile));
    bar_sync(kS0Written0 + (t & 1), 256);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 6; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float2* p = reinterpret_cast<float2*>(st + sidx(head0 + 8 * r, 8 * j + 2 * tq));
        const float2 v = *p;
        const float x0 = s[4 * j + 2 * r] + v.x, x1 = s[4 * j + 2 * r + 1] + v.y;
        *p = make_float2(x0, x1);
        const int col = 8 * j + 2 * tq;
        if (col < nvalid) mx[r] = fmaxf(mx[r], x0);
        if (col + 1 < nvalid) mx[r] = fmaxf(mx[r], x1);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 2));
      if (tq == 0) mxbuf[(t & 1) * kH + head0 + 8 * r] = mx[r];
    }
    bar_arrive(kSReady0 + (t & 1), 256);
  };

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  // P(t) (computed while the products of tiles t - 1 and t - 2 ran) and the rescale of O.
  auto take_p = [&](int t) {
    bar_sync(kPReady0 + (t & 1), kThreads);
    const float al0 = abuf[(t & 1) * kH + head0], al1 = abuf[(t & 1) * kH + head0 + 8];
    if (al0 != 1.0f || al1 != 1.0f) {  // the running max moved (rare after the first tiles)
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= (i & 2) ? al1 : al0;
    }
  };
  // O_wg += P(t) C_t[:, columns of wg], P from shared memory (issued, not waited).
  auto issue_pv = [&](int t) {
    const uint32_t pb = base + kPOff + (t & 1) * kPBuf;
    const uint32_t vb = base + static_cast<uint32_t>((t % kStages) * kStage + wg * 4 * kSub);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      wgmma_ss_n256_tb(o, smem_desc(pb + kk * 32, 16, 1024), smem_desc(vb + kk * 2048, kSub, 1024));
    }
    wgmma_commit();
  };
  // Tile t's products are done: P's buffer and this warpgroup's half of stage t % 3 are free.
  auto release = [&](int t) {
    if (t + 2 < ntiles) bar_arrive(kPFree0 + (t & 1), kThreads);
    bar_sync(kDone0 + wg, 128);  // every warp of this warpgroup is past its wait
    load_half(t + 3);
  };

  // S runs two tiles ahead of P, so the softmax of tile t + 1 has the PV product of tile t and
  // the QK product of tile t + 2 to hide under: S(0), S(1) first; then for every tile t but the
  // last two, QK of tile t + 2 and PV of tile t back to back on the tensor cores, S(t + 2)
  // handed over while the PV product runs. (No branch around the wgmma issues and waits:
  // ptxas then keeps them asynchronous.)
  issue_qk(0);
  wgmma_wait<0>();
  reg_fence(s);
  hand_over(0);
  if (ntiles > 1) {
    issue_qk(1);
    wgmma_wait<0>();
    reg_fence(s);
    hand_over(1);
  }
#pragma unroll 1
  for (int t = 0; t < ntiles - 2; ++t) {
    take_p(t);
    issue_qk(t + 2);
    issue_pv(t);
    wgmma_wait<1>();  // S(t + 2)
    reg_fence(s);
    hand_over(t + 2);
    wgmma_wait<0>();
    reg_fence(o);
    release(t);
  }
#pragma unroll 1
  for (int t = max(ntiles - 2, 0); t < ntiles; ++t) {
    take_p(t);
    issue_pv(t);
    wgmma_wait<0>();
    reg_fence(o);
    release(t);
  }

  // The combine (a programmatic dependent) may be scheduled now; it waits for this whole grid.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  bar_sync(kFinal, kThreads);  // L and m from the softmax warpgroup
  const int col0 = wg * 256 + 2 * tq;
  if (nsb == 1) {
    float* out = a.o_lat + static_cast<int64_t>(b) * kH * kR;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float inv = 1.0f / lbuf[head0 + 8 * r];  // >= 1: the max row contributes p = 1
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
        a.pm[k0 + head0 + 8 * r] = lbuf[kH + head0 + 8 * r];
        a.pl[k0 + head0 + 8 * r] = lbuf[head0 + 8 * r];
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
  // The warpgroups' setmaxnreg counts need the launch allocation they were sized for (see
  // kLaunchRegs): another one would leave the product warpgroups waiting for registers.
  cudaFuncAttributes fa{};
  MEMRA_CUDA_RETURN_IF(status_of(cudaFuncGetAttributes(&fa, mla_decode_wgmma_kernel)));
  if (fa.numRegs < kLaunchRegs) return memra::kUnsupportedGeometry;
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
