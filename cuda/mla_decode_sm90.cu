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
// Why this shape: docs/mla.md (the kernels before it and FlashMLA's, measured).
//
// Splits are chosen by cuda/mla_decode.cu, how they merge by cuda/mla_decode_sm90_launch.cu
// (Merge in mla_decode_sm90.cuh: in a cluster, at a grid barrier, or by a combine launch); the
// in-kernel merges are in cuda/mla_decode_merge.cuh.
//
// Precision: as the mma.sync kernel of cuda/mla_decode_tc.cu (q and p rounded to bf16, scores,
// softmax statistics and accumulation in f32, sums over the rounded p); the order of the f32
// accumulation inside the tensor cores and the lagging max differ.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstring>

#include "common.cuh"
#include "mla_decode_merge.cuh"
#include "mla_decode_sm90.cuh"
#include "mla_sm90.cuh"

using memra::cuda::smem_u32;
using namespace memra::cuda::mla_sm90;

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kMInit = -1e30f;  // the running max before any row (finite: 2^(-inf - m) = 0)
// Named barriers, one-way hand-overs between the warpgroups (one arrives, the other waits).
enum : int { kScale0 = 1, kScale1 = 2, kP0Ready = 3, kP1Ready = 4 };
static_assert(kTile == kTileRows, "one tile size");

// kMergeGrid: the nsb active blocks of a sequence meet here after writing their partials; t =
// the sequence's [arrivals, departures]. The block's stores, then thread 0's release fence and
// arrival (CUTLASS's semaphore pattern, as common.cuh's last_block); it spins on the arrivals
// with acquire loads (every block of the grid is resident: the launch is cooperative), the load
// that sees them all ordering the merge's reads after the other blocks' stores (for the other
// threads through the block barrier). Thread 0 then counts the block's departure, and returns
// its ticket without waiting for it: seq_depart, at the kernel's end, reads it there, so the
// atomic's round trip runs under the merge instead of before it.
__device__ __forceinline__ unsigned seq_arrive(unsigned* t, unsigned nsb) {
  __syncthreads();
  unsigned ticket = 0;
  if (threadIdx.x == 0) {
    memra::cuda::fence_acq_rel_gpu();
    atomicAdd(t, 1u);
    for (;;) {
      unsigned v;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(t) : "memory");
      if (v >= nsb) break;
    }
    // atom.inc wraps the departures back to 0 after the last; unlike an add, ptxas does not
    // aggregate it over the warp (a shuffle of the result right here, i.e. a wait for it).
    asm volatile("atom.relaxed.gpu.global.inc.u32 %0, [%1], %2;\n"
                 : "=r"(ticket)
                 : "l"(t + 1), "r"(nsb - 1)
                 : "memory");
  }
  __syncthreads();
  return ticket;
}
// The last block to depart (every block past its spin) sets the arrivals back to 0 for the next
// launch (its departure already wrapped that counter to 0).
__device__ __forceinline__ void seq_depart(unsigned* t, unsigned nsb, unsigned ticket) {
  if (threadIdx.x == 0 && ticket == nsb - 1) atomicExch(t, 0u);
}

}  // namespace

namespace memra::cuda::mla_sm90 {

// Block (split blockIdx.x, sequence blockIdx.y). See the file comment; MERGE: how a sequence's
// splits merge (Merge in mla_decode_sm90.cuh).
template <int MERGE>
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
  // A split past the sequence's rows: nothing to do, but in a cluster it still takes part in the
  // merge's barriers (with no rows: O = 0, l = 0).
  if (MERGE != kMergeCluster && begin >= n) return;
  const int end = max(begin, min(n, begin + a.chunk));
  const int nsb = (n + a.chunk - 1) / a.chunk;
  const int ntiles = (end - begin + kTile - 1) / kTile;
  const int npairs = (ntiles + 1) / 2;  // an odd count's last odd block is all masked
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(a.caches[b]);
  // The query's f32 loads first, all of them in flight at once (128 registers, free until the
  // accumulators start): one memory latency under the set-up below instead of a chain of them
  // after it, in which the first blocks' loads were all the SM had in flight.
  constexpr int kQSteps = kH * kR / 8 / kThreads;  // 8 columns (two float4) a step
  float4 qv[2 * kQSteps];
  {
    const float4* q4 = reinterpret_cast<const float4*>(a.q_lat + static_cast<int64_t>(b) * kH * kR);
#pragma unroll
    for (int i = 0; i < kQSteps; ++i) {
      const int qc = tid + kThreads * i;  // head qc / 64, columns 8 (qc % 64) ..
      qv[2 * i] = __ldg(q4 + 2 * qc);
      qv[2 * i + 1] = __ldg(q4 + 2 * qc + 1);
    }
  }

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
  if (npairs > 0) {
    load(0, 0, 4 * wg, 4 * wg + 4);
    load(1, 1, 4 * wg, 4 * wg + 4);
  }

  // The query as bf16 in shared memory, 8 boxes of [64 heads][64 columns] in the 128-byte
  // swizzle (the A operand of the QK products).
#pragma unroll
  for (int i = 0; i < kQSteps; ++i) {
    const int qc = tid + kThreads * i;
    const int r = qc >> 6, cc = qc & 63;
    const float4 v0 = qv[2 * i], v1 = qv[2 * i + 1];
    st_shared_v4(base + kQOff + (cc >> 3) * kSub + r * 128 + (((cc & 7) ^ (r & 7)) << 4),
                 pack_bf16x2(v0.x, v0.y), pack_bf16x2(v0.z, v0.w), pack_bf16x2(v1.x, v1.y),
                 pack_bf16x2(v1.z, v1.w));
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
  if (npairs > 0) {
    wgmma_fence();
    qk(I<0>{}, I<8>{}, B<true>{}, s, my_buf, 8 * wg, 0);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);
  }

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

  // The combine (a programmatic dependent) may be scheduled now; it waits for this whole grid
  // (which, being launched, is resident: kMergeGrid's barrier waits on no block of it).
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
  if constexpr (MERGE == kMergeCluster) {
    // This block's O (unnormalised; [64 heads][kOStride] f32 over the query's and the blocks'
    // space, all read for the last time), m (already in sm) and L (into ss0, free now).
    const uint32_t so = base + kQOff;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t row = so + 4 * ((head0 + 8 * r) * kOStride + col0);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        st_shared_v2(row + 32 * j, o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
      }
      if (wg == 0 && tq == 0) ss0[head0 + 8 * r] = L[r];
    }
    cluster_sync_all();
    const int h0 = split * kH / a.nsplit, h1 = (split + 1) * kH / a.nsplit;
    merge_heads(ClusterSrc{smem_u32(sm), smem_u32(ss0), so}, h0, h1, nsb,
                reinterpret_cast<float*>(smem + kP0Off),
                a.o_lat + static_cast<int64_t>(b) * kH * kR, tid);
    cluster_sync_all();  // the peers' O stays until every block of the cluster has read it
    return;
  }
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
    if constexpr (MERGE == kMergeGrid) {
      unsigned* t = a.seq_tickets + 2 * b;
      const unsigned ticket = seq_arrive(t, static_cast<unsigned>(nsb));
      const int h0 = split * kH / nsb, h1 = (split + 1) * kH / nsb;
      const GlobalSrc src{a.po, a.pm, a.pl, static_cast<int64_t>(b) * a.nsplit * kH};
      float* out = a.o_lat + static_cast<int64_t>(b) * kH * kR;
      switch (nsb) {  // uniform over the block
        case 2: merge_heads_one_trip<2>(src, h0, out, tid); break;
        case 4: merge_heads_one_trip<4>(src, h0, out, tid); break;
        case 8: merge_heads_one_trip<8>(src, h0, out, tid); break;
        case 16: merge_heads_one_trip<16>(src, h0, out, tid); break;
        case 32: merge_heads_one_trip<32>(src, h0, out, tid); break;
        default:
          merge_heads(src, h0, h1, nsb, reinterpret_cast<float*>(smem + kP0Off), out, tid);
      }
      seq_depart(t, static_cast<unsigned>(nsb), ticket);
    }
  }
}

KernelFn wgmma_kernel(int merge) {
  return merge == kMergeCluster ? mla_decode_wgmma_kernel<kMergeCluster>
         : merge == kMergeGrid  ? mla_decode_wgmma_kernel<kMergeGrid>
                                : mla_decode_wgmma_kernel<kMergeCombine>;
}

}  // namespace memra::cuda::mla_sm90
