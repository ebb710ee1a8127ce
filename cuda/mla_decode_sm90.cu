// Batched MLA decode, dense form, on sm_90a (wgmma + the tensor memory accelerator): the
// GLM-5.3-Flash shape of memra_cuda_mla_attn's batched dense form (cuda_abi/mla.h): 64 heads, kv
// rank R = 512, bf16 latent caches (the cache row is both K and V), one query row per sequence,
// no index list. cuda/mla_decode.cu owns the split plan and every other shape; it calls
// mla_decode_sm90() below when KernelOptions::mla_decode_variant is 1 (the default).
//
// Block (split blockIdx.x, sequence blockIdx.y), 256 threads = two warpgroups, FlashMLA's
// "seesaw" schedule (its docs/20250422-new-kernel-deep-dive.md) at R = 512. The split's 64-row
// blocks go in pairs (an odd count's last odd block is all masked): warpgroup 0 scores the even
// block of a pair, warpgroup 1 the odd one, each over all 512 columns (QK: 32 wgmma m64n64k16,
// the bf16 query and the cache both from shared memory), so a block's softmax runs once, in one
// warpgroup, and no partial scores cross; each warpgroup holds one 256-column half of O (the
// left in 0, the right in 1; 128 f32 accumulators a thread) and adds both blocks' P V to it, its
// own block's P from registers, the other's from shared memory. Per pair:
//   - warpgroup 0: the even block's softmax against the shared running max m (scores * scale *
//     log2(e), rows past the split's end -inf; m moves only when the block's max exceeds it by
//     more than kLazy, so p <= 2^kLazy and the rescales are skipped after the first blocks;
//     p = 2^(s - m) rounded to bf16, l sums the rounded p), writing m and the block's factor
//     2^(m_old - m_new); O_L by that factor plus P_even V_L;
//   - warpgroup 1, once that is written: the odd block's softmax against the moved m; O_R by
//     both factors plus P_odd V_R; P_odd to shared memory;
//   - warpgroup 0: P_even times the odd block's factor to shared memory (for O_R); O_L by that
//     factor plus P_odd V_L; warpgroup 1: O_R plus P_even V_R;
//   - meanwhile each warpgroup requests the next pair's 64 x 64 boxes whose last reader it was
//     (warpgroup 0 the left halves, 1 the right halves of both blocks) and computes the next
//     pair's scores, box by box as they land (one mbarrier a box).
// The four hand-overs are named barriers on which one warpgroup arrives and the other waits
// (1: the even block's m and factor, 2: the odd block's, 3: P_even stored, 4: P_odd stored and
// read). The two products of a block see the same p except when the odd block moves the max:
// then O_R takes P_even rounded again after the factor.
// Loads: one tensor map per block (the template of launch_attention with the block's cache
// address and row count n put in by tensormap.replace, copied to a global slot with a release
// fence for the tensor-map proxy); 64 x 64 boxes in the 128-byte swizzle (the wgmma layout of
// cuda/mla_sm90.cuh's descriptors) under an L2 evict-first policy (each row is read once);
// rows past n arrive as zeros (rows past t_kv may hold anything, NaN in the tests; rows of the
// next split are finite and masked).
// Shared memory (1024-aligned base): the query bf16 [64 heads][512] (64 KiB, converted from
// q_lat's f32 by the block), the pair's two blocks (2 x 64 KiB), the two P [64 heads][64 rows]
// bf16 (2 x 8 KiB), m, the two factors and the epilogue's row sums, the block's tensor map and
// 16 mbarriers: 210.5 KiB with the alignment slack.
//
// Why this shape (docs/kernels.md "MLA"): session 5's alternate-block kernel had cp.async, two
// whole-block stages and a softmax per warpgroup (0.574 of copy); session 5-17's column split
// (Q in registers, three stages, the partial scores exchanged and the softmax in both
// warpgroups) reached 0.65; FlashMLA's kernel, measured beside it, 0.80 over its 576-column
// rows. This one: 0.725 / 0.732 of copy at B 64 L 4096 / B 8 L 32768 with the combine
// (results/2026-12-04-h200-s18-mla-decode-evict-first.jsonl).
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
constexpr int kThreads = 256;
constexpr int kSub = kTile * 128;          // one 64-column box of a block (8 KiB)
constexpr int kBlk = 8 * kSub;             // a block: 64 rows x 512 columns (64 KiB)
constexpr int kQOff = 0;                   // the query, bf16, 8 boxes of [64 heads][64]
constexpr int kK0Off = kBlk;               // the pair's even block
constexpr int kK1Off = 2 * kBlk;           // the pair's odd block
constexpr int kP0Off = 3 * kBlk;           // P of the even block (bf16 [64 heads][64 rows])
constexpr int kP1Off = kP0Off + kSub;      // P of the odd block
constexpr int kMOff = kP1Off + kSub;       // running max [64] (log2 units)
constexpr int kS0Off = kMOff + 4 * 64;     // the even block's rescale factors [64]
constexpr int kS1Off = kS0Off + 4 * 64;    // the odd block's [64]
constexpr int kLOff = kS1Off + 4 * 64;     // row sums [2 warpgroups][64] (the epilogue)
constexpr int kMapOff = kLOff + 4 * 128;   // this block's tensor map (128 bytes)
constexpr int kBarOff = kMapOff + 128;     // mbarriers [2 buffers][8 boxes]
constexpr int kBytes = kBarOff + 16 * 8 + 1024;
constexpr int kCombineHeads = 4;  // heads per combine block (one warp each)
constexpr int kMaxSplits = 1024;  // combine weights in shared memory: 4 x 4 KiB at most
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kMInit = -1e30f;  // the running max before any row (finite: 2^(-inf - m) = 0)
// Named barriers, one-way hand-overs between the warpgroups (one arrives, the other waits).
enum : int { kScale0 = 1, kScale1 = 2, kP0Ready = 3, kP1Ready = 4 };

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
  const int npairs = (ntiles + 1) / 2;  // an odd count's last odd block is all masked
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(a.caches[b]);

  const int wg = tid >> 7, wt = tid & 127;
  const int lane = tid & 31, tq = lane & 3;
  const int head0 = ((wt >> 5) << 4) + (lane >> 2);
  float* sm = reinterpret_cast<float*>(smem + kMOff);
  float* ss0 = reinterpret_cast<float*>(smem + kS0Off);
  float* ss1 = reinterpret_cast<float*>(smem + kS1Off);

  // The block's tensor map over its cache: rows [0, n), 512 columns, 64 x 64 boxes.
  void* gmap = maps + 128 * (static_cast<int64_t>(b) * a.nsplit + split);
  const uint32_t bar_s = base + kBarOff;  // [buffer][box]
  if (tid < 32) make_map(tmpl, smem + kMapOff, gmap, cache, n);
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < 16; ++i) mbar_init(bar_s + 8 * i, 1);
    // The inits made visible to the async proxy (the TMA unit completes transactions on them).
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (tid < kH) sm[tid] = kMInit;
  __syncthreads();  // the map in its slot, the barriers and the running max initialised
  if (wt == 0) map_acquire(gmap);
  // Boxes [c0, c1) of block t into buffer buf, each on its own barrier (thread wt == 0 of the
  // calling warpgroup issues them).
  const uint64_t policy = evict_first_policy();
  auto load = [&](int buf, int t, int c0, int c1) {
    if (wt != 0) return;
    for (int c = c0; c < c1; ++c) {
      const uint32_t bar = bar_s + 8 * (buf * 8 + c);
      mbar_expect_tx(bar, kSub);
      tma_load_2d(base + kK0Off + buf * kBlk + c * kSub, gmap, bar, c * 64, begin + t * kTile,
                  policy);
    }
  };
  // Pair 0: warpgroup g requests boxes [4 g, 4 g + 4) of both blocks, as in the loop below.
  load(0, 0, 4 * wg, 4 * wg + 4);
  load(1, 1, 4 * wg, 4 * wg + 4);

  // The query as bf16 in shared memory, 8 boxes of [64 heads][64 columns] in the 128-byte
  // swizzle (the A operand of the QK products): 8 columns (two float4) a step.
  {
    const float4* q4 = reinterpret_cast<const float4*>(a.q_lat + static_cast<int64_t>(b) * kH * kR);
#pragma unroll 4
    for (int i = 0; i < kH * kR / 8 / kThreads; ++i) {
      const int qc = tid + kThreads * i;  // head qc / 64, columns 8 (qc % 64) ..
      const int r = qc >> 6, cc = qc & 63;
      const float4 v0 = __ldg(q4 + 2 * qc), v1 = __ldg(q4 + 2 * qc + 1);
      st_shared_v4(base + kQOff + (cc >> 3) * kSub + r * 128 + (((cc & 7) ^ (r & 7)) << 4),
                   pack_bf16x2(v0.x, v0.y), pack_bf16x2(v0.z, v0.w), pack_bf16x2(v1.x, v1.y),
                   pack_bf16x2(v1.z, v1.w));
    }
  }
  fence_proxy_async_smem();  // the query's generic stores before the wgmma reads them
  __syncthreads();

  const float sl2 = a.scale * kLog2e;
  const uint32_t my_buf = base + kK0Off + wg * kBlk;  // the blocks this warpgroup scores
  const uint32_t my_p = base + (wg == 0 ? kP0Off : kP1Off);
  const uint32_t other_p = base + (wg == 0 ? kP1Off : kP0Off);
  // S = Q C^T over boxes [C0, C1) of buffer `buf` (waiting for each box on barriers bar0 + c),
  // accumulating into s unless FIRST. Unrolled: a loop around the products would make the
  // compiler serialise them.
  auto qk = [&](auto c0_, auto c1_, auto first_, float (&s)[32], uint32_t buf, int bar0,
                uint32_t parity) {
    constexpr int C0 = decltype(c0_)::value, C1 = decltype(c1_)::value;
    constexpr bool FIRST = decltype(first_)::value;
    // Descriptors of box 0 (start addresses in 16-byte units: adding a box's offset stays
    // inside the 14-bit field below 256 KiB), kept in registers rather than 64 precomputed.
    uint64_t dq = smem_desc(base + kQOff, 16, 1024), dk = smem_desc(buf, 16, 1024);
    asm volatile("" : "+l"(dq), "+l"(dk));
#pragma unroll
    for (int c = C0; c < C1; ++c) {
      mbar_wait(bar_s + 8 * (bar0 + c), parity);
      wgmma_fence();  // after the wait's branch, as the compiler would otherwise insert it
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t off = static_cast<uint64_t>((c * kSub + 32 * kk) >> 4);
        wgmma_ss_n64(s, dq + off, dk + off, FIRST && c == C0 && kk == 0 ? 0 : 1);
      }
    }
  };
  // O_g += P V over the 64 rows of buffer `buf` (the columns of warpgroup g), P from registers.
  auto pv_local = [&](float (&o)[128], const uint32_t (&pf)[8][2], uint32_t buf) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t af[4] = {pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0], pf[2 * kk + 1][1]};
      wgmma_rs_n256_tb(o, af, smem_desc(buf + wg * 4 * kSub + kk * 2048, kSub, 1024));
    }
  };
  // The same with the other warpgroup's P from shared memory.
  auto pv_remote = [&](float (&o)[128], uint32_t buf) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_ss_n256_tb(o, smem_desc(other_p + 32 * kk, 16, 1024),
                       smem_desc(buf + wg * 4 * kSub + kk * 2048, kSub, 1024), 1);
    }
  };
  // pf into this warpgroup's P buffer ([64 heads][64 rows] bf16, the 128-byte swizzle).
  auto store_p = [&](const uint32_t (&pf)[8][2]) {
    const uint32_t row0 = my_p + head0 * 128 + 4 * tq, row1 = row0 + 8 * 128;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t off = static_cast<uint32_t>((j ^ (head0 & 7)) << 4);
      st_shared_u32(row0 + off, pf[j][0]);
      st_shared_u32(row1 + off, pf[j][1]);
    }
    fence_proxy_async_smem();  // for the other warpgroup's wgmma
  };

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float l[2] = {0.0f, 0.0f};  // sums of the rounded p of this warpgroup's blocks (own columns)
  float s[32];
  uint32_t pf[8][2];

  // Pair 0's scores: warpgroup 0 the even block, warpgroup 1 the odd one.
  wgmma_fence();
  qk(I<0>{}, I<8>{}, B<true>{}, s, my_buf, 8 * wg, 0);
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence(s);

#pragma unroll 1
  for (int j = 0; j < npairs; ++j) {
    const bool more = j + 1 < npairs;
    const uint32_t next = static_cast<uint32_t>((j + 1) & 1);
    const int t0 = 2 * j, t1 = 2 * j + 1;
    float psum[2], sc[2];
    if (wg == 0) {
      // The even block's softmax; then O_L at its max plus its P V_L.
      block_softmax(s, end - (begin + t0 * kTile), sl2, tq, head0, sm, ss0, pf, psum, sc);
      bar_arrive(kScale0, kThreads);
      rescale_o(o, sc);
#pragma unroll
      for (int r = 0; r < 2; ++r) l[r] = l[r] * sc[r] + psum[r];
      wgmma_fence();
      pv_local(o, pf, base + kK0Off);
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(o);
      // The odd block's softmax (warpgroup 1) has moved the max: P_even to it, for O_R.
      bar_sync(kScale1, kThreads);
      if (more) load(0, t0 + 2, 0, 4);  // V_L and the first half of the even block read
      float sc1[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) sc1[r] = ss1[head0 + 8 * r];
      if (sc1[0] != 1.0f || sc1[1] != 1.0f) {
#pragma unroll
        for (int c = 0; c < 8; ++c) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            __nv_bfloat162 v;
            memcpy(&v, &pf[c][r], sizeof(v));
            pf[c][r] = pack_bf16x2(__low2float(v) * sc1[r], __high2float(v) * sc1[r]);
          }
        }
      }
      store_p(pf);
      bar_arrive(kP0Ready, kThreads);
      // O_L at the odd block's max plus its P (from warpgroup 1) V_L.
      bar_sync(kP1Ready, kThreads);
      rescale_o(o, sc1);
#pragma unroll
      for (int r = 0; r < 2; ++r) l[r] *= sc1[r];
      wgmma_fence();
      pv_remote(o, base + kK1Off);
      wgmma_commit();
      if (more) {
        // The next even block's scores: the boxes this warpgroup requested first.
        wgmma_fence();
        qk(I<0>{}, I<4>{}, B<true>{}, s, my_buf, 0, next);
        wgmma_commit();
        wgmma_wait<1>();  // the odd block's V_L read
        load(1, t1 + 2, 0, 4);
        wgmma_fence();
        qk(I<4>{}, I<8>{}, B<false>{}, s, my_buf, 0, next);
        wgmma_commit();
        wgmma_wait<0>();  // inside the branch: s leaves it complete (else the products serialise)
        reg_fence(s);
      } else {
        wgmma_wait<0>();
      }
      reg_fence(o);
    } else {
      // The odd block's softmax after the even block's has moved the max.
      bar_sync(kScale0, kThreads);
      block_softmax(s, end - (begin + t1 * kTile), sl2, tq, head0, sm, ss1, pf, psum, sc);
      float f[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) f[r] = ss0[head0 + 8 * r] * sc[r];
      bar_arrive(kScale1, kThreads);
      rescale_o(o, f);
#pragma unroll
      for (int r = 0; r < 2; ++r) l[r] = l[r] * f[r] + psum[r];
      store_p(pf);  // P_odd for O_L (warpgroup 0)
      wgmma_fence();
      pv_local(o, pf, base + kK1Off);
      wgmma_commit();
      // O_R plus the even block's P (at the odd block's max) V_R.
      bar_sync(kP0Ready, kThreads);
      wgmma_fence();
      pv_remote(o, base + kK0Off);
      wgmma_commit();
      bar_arrive(kP1Ready, kThreads);
      wgmma_wait<1>();  // the odd block's V_R read
      if (more) load(1, t1 + 2, 4, 8);
      wgmma_wait<0>();  // the even block's V_R read
      reg_fence(o);
      if (more) {
        load(0, t0 + 2, 4, 8);
        // The next odd block's scores.
        wgmma_fence();
        qk(I<4>{}, I<8>{}, B<true>{}, s, my_buf, 8, next);
        qk(I<0>{}, I<4>{}, B<false>{}, s, my_buf, 8, next);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);
      }
    }
  }

  // The combine (a programmatic dependent) may be scheduled now; it waits for this whole grid.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // The row sums: each warpgroup's over its quads, then both through shared memory.
  float* sl = reinterpret_cast<float*>(smem + kLOff);
  float L[2], m[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    L[r] = l[r];
    L[r] += __shfl_xor_sync(kFull, L[r], 1);
    L[r] += __shfl_xor_sync(kFull, L[r], 2);
    if (tq == 0) sl[wg * kH + head0 + 8 * r] = L[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    L[r] = sl[head0 + 8 * r] + sl[kH + head0 + 8 * r];
    m[r] = sm[head0 + 8 * r];
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
        a.pm[k0 + head0 + 8 * r] = m[r];
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
