// Batched MLA decode over per-sequence latent caches (memra_cuda_mla_attn with batched 1,
// cpp/include/memra/cuda_abi/mla.h): one launch plan serves B sequences, one query each (the
// query of sequence b sits at row t_kv[b] - 1 and sees rows [0, t_kv[b])); t_kv, the cache
// pointers and the index lists live on the device, so a captured graph replays at any position.
//
// Plan (all on ctx->stream, no host sync):
//   [gathered only] compact: one block per sequence turns its index list into the CPU's row list
//     (entries in [0, t_kv) kept, duplicates once, ascending: a shared-memory bitmap of the
//     visible rows, then a block scan of the words' popcounts) plus a count (the LISTED form
//     reads kpool_select's compaction instead);
//   attend: grid (nsplit, B, head groups); block (split s, sequence b, heads [h0, h0 + HB)) walks
//     rows (or compacted entries) [s * chunk, min(n_b, (s + 1) * chunk)) in tiles of 64 and
//     keeps an online softmax; a sequence whose rows fit one split writes o_lat directly, else
//     the block writes its unnormalised partial (o, m, l); blocks past a sequence's rows exit at
//     once, a sequence with n_b == 0 (idle row, or an all -1 list) gets zeros from split 0 and
//     nothing of it is read;
//   combine: one block per (head, sequence) with >= 2 active splits merges the partials
//     (o = sum_s w_s o_s / sum_s w_s l_s, w_s = exp(m_s - max m)).
//
// Dense bf16 cache at H = 64, R = 512 (GLM-5.3-Flash): when KernelOptions::mla_decode_variant
//   selects it (1, the default), the sm_90a wgmma kernel of cuda/mla_decode_sm90.cu with
//   its own combine; same roundings, splits from the same cost model in its tile size. Everything
//   below serves every other case and stays the reference arm (variant 0).
//
// bf16 cache, R in {128, 256, 512}: the tensor-core kernel of cuda/mla_decode_tc.cu
//   (mma.sync.m16n8k16 bf16 -> f32; q_lat and p rounded to bf16, f32 softmax and accumulation).
//
// f32 cache (or bf16 with another R; R <= 1024): exact f32 CUDA-core kernel (below), 8 heads per
//   block, one warp per head from the scores to the output: cache rows widened to f32 in shared
//   memory (32-row sub-tiles, odd row stride), lane j scores row j with a sequential fmaf dot,
//   online softmax with expf, o[lane + 32 u] += p_j c_j (p_j shuffled from lane j), j ascending;
//   the same operations as the CPU op up to FMA contraction, expf's last ulp and the order of the
//   online rescaling / split merge.
//
// Rope columns (d_rope > 0, Kimi-Linear): rows are R + d_rope wide, the score adds q_pe . k_pe
//   (one chain over [q_lat | q_pe] . [latent | k_pe]), the output stays over the first R columns.
//   The f32 kernel and the tensor-core kernel at d_rope = 64 (2 m-tiles) have rope instantiations
//   of their own; the wgmma arm is latent-only and never runs them.
//
// Split count (host, from B, head groups, max rows, SM count only, so a graph stays valid at any
// position): minimise waves * (tiles per split + per-block overhead) + combine work, with
// waves = ceil(blocks / (SMs * blocks per SM)) (1 block per SM for the tensor kernel), the
// overhead of a block being its q read and, when split, its partial write (both HB x R f32, i.e.
// HB / 32 tiles of a bf16 cache) and the combine reading the partials back. The split counts and
// the bandwidth budget at the bench shapes: docs/mla.md.
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <algorithm>

#include "common.cuh"
#include "gather_compact.cuh"
#include "mla_common.cuh"
#include "mla_decode.cuh"

namespace memra::cuda {

// cuda/mla_decode_sm90.cu: the wgmma arm for dense bf16 caches at H = 64, R = 512.
int mla_decode_sm90_tile_rows();  // rows per tile (a split's chunk is a multiple)
int mla_decode_sm90_max_splits();
// kOk, a launch / scratch status, or kUnsupportedGeometry (the device lacks the shared memory;
// the caller falls back to the mma.sync kernel).
int mla_decode_sm90(MemraCudaCtx* ctx, const float* q_lat, const void* const* caches,
                    const int32_t* t_kv, int B, int max_t_kv, int chunk, int nsplit, float scale,
                    float* o_lat);
}  // namespace memra::cuda

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;
using memra::cuda::to_f32;
using memra::cuda::warp_max;
using memra::cuda::warp_sum;
using memra::cuda::mla::allow_smem;
using memra::cuda::mla::device_attr;
using memra::cuda::mla::smem_optin;

namespace {

// ---------------------------------------------------------------- exact f32 CUDA-core kernel

constexpr int kFHeads = kWarps;  // heads per block: one warp per head
constexpr int kFTile = 32;       // rows per shared-memory sub-tile (lane = row in the scores)
constexpr int kFAcc = 32;        // outputs per lane: R <= 32 * kFAcc

// D: the columns a row is scored over (R latent, then d_rope rope columns).
size_t f32_smem_bytes(int D) {
  return sizeof(float) * (static_cast<size_t>(kFHeads) * D + static_cast<size_t>(kFTile) * (D | 1));
}

// Block (split, sequence, group of 8 heads); warp w owns head h0 + w from the scores to the
// output. Scores: lane j = row j of the sub-tile, s = (sum_w q[w] c[w]) * scale as one fmaf chain,
// w ascending (with kRope over [q_lat | q_pe] . [latent | k_pe], the CPU's order); online softmax
// in f32 with expf (m in the natural-log domain); o[r] (r = lane + 32 u < R) = o[r] * alpha +
// sum_j p_j c_j[r], j ascending, p_j broadcast from lane j by shuffle. kRope == false is the
// latent-only kernel (rows of R, no q_pe).
template <typename Tcache, bool kGather, bool kRope>
__device__ __forceinline__ void decode_f32_body(const DecodeArgs& a) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float fsm[];
  const int R = a.R, D = kRope ? a.R + a.d_rope : a.R, Rp = D | 1;
  float* qs = fsm;               // [8][D]
  float* cs = qs + kFHeads * D;  // [32][Rp]: lane j reads row j at bank (j * Rp + w) % 32

  const int split = blockIdx.x, b = blockIdx.y, h0 = blockIdx.z * kFHeads;
  const int nh = min(kFHeads, a.H - h0);
  const int n = rows_of(a, b);
  if (n <= 0) {
    if (split == 0) zero_heads(a, b, h0, nh);
    return;
  }
  const int begin = split * a.chunk;
  if (begin >= n) return;
  const int end = min(n, begin + a.chunk);
  const int nsb = (n + a.chunk - 1) / a.chunk;
  const Tcache* cache = static_cast<const Tcache*>(a.caches[b]);
  const int32_t* list = kGather ? a.list + static_cast<int64_t>(b) * a.width : nullptr;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  for (int k = tid; k < kFHeads * D; k += kThreads) {
    const int h = k / D, w = k - h * D;
    if constexpr (kRope) {
      float v = 0.0f;
      if (h < nh) {
        const int64_t bh = static_cast<int64_t>(b) * a.H + h0 + h;
        v = w < R ? a.q_lat[bh * R + w] : a.q_pe[bh * a.d_rope + (w - R)];
      }
      qs[k] = v;
    } else {
      qs[k] = h < nh ? a.q_lat[(static_cast<int64_t>(b) * a.H + h0 + h) * R + w] : 0.0f;
    }
  }
  float m = -INFINITY, l = 0.0f;  // head `warp`, the same in every lane
  float acc[kFAcc];
#pragma unroll
  for (int u = 0; u < kFAcc; ++u) acc[u] = 0.0f;
  __syncthreads();

  for (int t0 = begin; t0 < end; t0 += kFTile) {
    const int nvalid = min(kFTile, end - t0);
    for (int j = warp; j < nvalid; j += kWarps) {
      const int64_t row = kGather ? list[t0 + j] : t0 + j;
      const Tcache* src = cache + row * D;
      float* dst = cs + j * Rp;
      for (int w = lane; w < D; w += 32) dst[w] = to_f32(src[w]);
    }
    __syncthreads();  // the sub-tile is loaded

    float s = -INFINITY;
    if (lane < nvalid) {
      const float* c = cs + lane * Rp;
      const float* q = qs + warp * D;
      float d = 0.0f;
#pragma unroll 4
      for (int w = 0; w < D; ++w) d = fmaf(q[w], c[w], d);
      s = d * a.scale;
    }
    const float m_new = fmaxf(m, warp_max(s));  // finite: lane 0 holds a row
    const float p = lane < nvalid ? expf(s - m_new) : 0.0f;
    const float alpha = expf(m - m_new);         // m = -inf: 0
    l = l * alpha + warp_sum(p);
    m = m_new;
#pragma unroll
    for (int u = 0; u < kFAcc; ++u) acc[u] *= alpha;
    for (int j = 0; j < nvalid; ++j) {
      const float pj = __shfl_sync(kFull, p, j);
      const float* c = cs + j * Rp + lane;
#pragma unroll
      for (int u = 0; u < kFAcc; ++u) {
        if (lane + 32 * u < R) acc[u] = fmaf(pj, c[32 * u], acc[u]);
      }
    }
    __syncthreads();  // cs is rewritten by the next sub-tile
  }

  if (warp < nh) {
    const int h = h0 + warp;
    if (nsb == 1) {
      const float inv = 1.0f / l;  // l >= 1 (the max row contributes 1)
      float* out = a.o_lat + (static_cast<int64_t>(b) * a.H + h) * R;
#pragma unroll
      for (int u = 0; u < kFAcc; ++u) {
        if (lane + 32 * u < R) out[lane + 32 * u] = acc[u] * inv;
      }
    } else {
      const int64_t k = partial_index(a, b, split, h);
      float* out = a.po + k * R;
#pragma unroll
      for (int u = 0; u < kFAcc; ++u) {
        if (lane + 32 * u < R) out[lane + 32 * u] = acc[u];
      }
      if (lane == 0) {
        a.pm[k] = m;
        a.pl[k] = l;
      }
    }
  }
}

// The latent-only kernel (rows of R) and the rope kernel (rows of R + d_rope, q_pe): separate
// kernels so the former keeps its code.
template <typename Tcache, bool kGather>
__global__ void __launch_bounds__(kThreads, 2) decode_f32_kernel(DecodeArgs a) {
  decode_f32_body<Tcache, kGather, false>(a);
}
template <typename Tcache, bool kGather>
__global__ void __launch_bounds__(kThreads, 2) decode_f32_rope_kernel(DecodeArgs a) {
  decode_f32_body<Tcache, kGather, true>(a);
}

// ---------------------------------------------------------------- combine

// Block (head blockIdx.x, sequence blockIdx.y): merge the active splits of a sequence that has
// at least two (others were written by the attention kernel). kLog2: m in the log2 domain.
// Up to kCombineFast splits and R <= kCombineR * blockDim.x (the batch-1 decode step): every
// partial the thread needs is loaded at once, one memory round trip instead of three in a row
// (m, then l, then o); each thread forms the split weights itself. The same operations in the
// same order as the general loop below, so the same bits.
constexpr int kCombineFast = 8;
constexpr int kCombineR = 4;

template <bool kLog2>
__global__ void decode_combine_kernel(DecodeArgs a) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float wsm[];  // [nsplit]
  const int h = blockIdx.x, b = blockIdx.y;
  const int n = rows_of(a, b);
  const int nsb = n > 0 ? (n + a.chunk - 1) / a.chunk : 0;
  if (nsb <= 1) return;
  if (a.combine_fast && nsb <= kCombineFast && a.R <= kCombineR * static_cast<int>(blockDim.x)) {
    float pmv[kCombineFast], plv[kCombineFast], pov[kCombineFast][kCombineR];
#pragma unroll
    for (int s = 0; s < kCombineFast; ++s) {
      if (s < nsb) {
        const int64_t k = partial_index(a, b, s, h);
        pmv[s] = a.pm[k];
        plv[s] = a.pl[k];
#pragma unroll
        for (int u = 0; u < kCombineR; ++u) {
          const int r = threadIdx.x + u * blockDim.x;
          pov[s][u] = r < a.R ? a.po[k * a.R + r] : 0.0f;
        }
      }
    }
    float M = -INFINITY;
#pragma unroll
    for (int s = 0; s < kCombineFast; ++s) {
      if (s < nsb) M = fmaxf(M, pmv[s]);
    }
    float wv[kCombineFast];
    float L = 0.0f;
#pragma unroll
    for (int s = 0; s < kCombineFast; ++s) {
      if (s < nsb) {
        const float d = pmv[s] - M;
        wv[s] = kLog2 ? exp2f(d) : expf(d);
        L = fmaf(wv[s], plv[s], L);
      }
    }
    const float inv = 1.0f / L;
    float* out = a.o_lat + (static_cast<int64_t>(b) * a.H + h) * a.R;
#pragma unroll
    for (int u = 0; u < kCombineR; ++u) {
      const int r = threadIdx.x + u * blockDim.x;
      if (r < a.R) {
        float v = 0.0f;
#pragma unroll
        for (int s = 0; s < kCombineFast; ++s) {
          if (s < nsb) v = fmaf(wv[s], pov[s][u], v);
        }
        out[r] = v * inv;
      }
    }
    return;
  }
  float M = -INFINITY;
  for (int s = 0; s < nsb; ++s) M = fmaxf(M, a.pm[partial_index(a, b, s, h)]);
  for (int s = threadIdx.x; s < nsb; s += blockDim.x) {
    const float d = a.pm[partial_index(a, b, s, h)] - M;  // every active split saw a row: finite
    wsm[s] = kLog2 ? exp2f(d) : expf(d);
  }
  __syncthreads();
  float L = 0.0f;
  for (int s = 0; s < nsb; ++s) L = fmaf(wsm[s], a.pl[partial_index(a, b, s, h)], L);
  const float inv = 1.0f / L;
  const int R = a.R;
  float* out = a.o_lat + (static_cast<int64_t>(b) * a.H + h) * R;
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < nsb; ++s) v = fmaf(wsm[s], a.po[partial_index(a, b, s, h) * R + r], v);
    out[r] = v * inv;
  }
}

// ---------------------------------------------------------------- gathered: list compaction

// Block b: list[b, :counts[b]] = the rows r in [0, n_b) named by idx[b, :], each once, ascending
// (n_b = t_kv[b] clamped to [0, max_t_kv]). Shared: bitmap [ceil(max_t_kv / 32)] + warp totals.
__global__ void __launch_bounds__(kThreads)
    decode_compact_kernel(const int32_t* __restrict__ idx, const int32_t* __restrict__ t_kv,
                          int width, int max_t_kv, int32_t* __restrict__ list,
                          int* __restrict__ counts) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ unsigned bm[];
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n = min(max(t_kv[b], 0), max_t_kv);
  const int running = memra::cuda::compact_rows<kThreads>(
      idx + static_cast<int64_t>(b) * width, width, n, bm, bm + (max_t_kv + 31) / 32,
      list + static_cast<int64_t>(b) * width, tid, lane, warp);
  if (tid == 0) counts[b] = running;
}

// ---------------------------------------------------------------- host side

// Splits of the row range (see the file comment). base_blocks: blocks per split (B x groups);
// tiles: 64-row tiles of the longest range; per_sm: resident blocks per SM; ovh_q / ovh_part:
// a block's q read and partial write in tile units.
int choose_nsplit(int64_t base_blocks, int64_t tiles, int sms, int per_sm, double ovh_q,
                  double ovh_part) {
  const int64_t slots = static_cast<int64_t>(std::max(sms, 1)) * std::max(per_sm, 1);
  const int64_t most = std::min<int64_t>({tiles, 4 * slots / std::max<int64_t>(base_blocks, 1) + 1,
                                          65535});
  int best_ns = 1;
  double best = 0.0;
  for (int64_t ns = 1; ns <= std::max<int64_t>(most, 1); ++ns) {
    const int64_t per = (tiles + ns - 1) / ns;
    if (ns > 1 && (tiles + per - 1) / per != ns) continue;  // same chunk as a smaller count
    const int64_t waves = (base_blocks * ns + slots - 1) / slots;
    double cost = static_cast<double>(waves) * (static_cast<double>(per) + ovh_q);
    if (ns > 1) {
      cost += static_cast<double>(waves) * ovh_part +
              static_cast<double>(base_blocks * ns) * ovh_part / static_cast<double>(slots);
    }
    if (ns == 1 || cost < best - 1e-9) {
      best = cost;
      best_ns = static_cast<int>(ns);
    }
  }
  return best_ns;
}

template <typename Tcache>
int launch_f32(MemraCudaCtx* ctx, const DecodeArgs& a, int groups, size_t smem) {
  const dim3 grid(static_cast<unsigned>(a.nsplit), static_cast<unsigned>(a.B),
                  static_cast<unsigned>(groups));
  if (a.d_rope > 0) {
    auto* kernel =
        a.list ? decode_f32_rope_kernel<Tcache, true> : decode_f32_rope_kernel<Tcache, false>;
    MEMRA_CUDA_RETURN_IF(allow_smem(ctx, kernel, smem));
    memra::cuda::launch(ctx, true, kernel, dim3(grid), dim3(kThreads), smem, a);
    return launch_status();
  }
  if (a.list) {
    MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decode_f32_kernel<Tcache, true>, smem));
    memra::cuda::launch(ctx, true, decode_f32_kernel<Tcache, true>, dim3(grid), dim3(kThreads),
        smem, a);
  } else {
    MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decode_f32_kernel<Tcache, false>, smem));
    memra::cuda::launch(ctx, true, decode_f32_kernel<Tcache, false>, dim3(grid), dim3(kThreads),
        smem, a);
  }
  return launch_status();
}

// The batched attention over idx (compacted here) or over lists compacted already (list, counts).
// d_rope > 0: rows of R + d_rope, q_pe [B, H, d_rope] (the rope kernels).
int attn_decode_impl(MemraCudaCtx* ctx, const float* q_lat, const float* q_pe,
                     const void* const* caches, int cache_dtype, const int32_t* t_kv,
                     const int32_t* idx, const int32_t* listed, const int* listed_counts,
                     int width, int B, int H, int R, int d_rope, int max_t_kv, float scale,
                     float* o_lat) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (B < 0 || H < 0 || R < 1 || max_t_kv < 0 || width < 0 || d_rope < 0) {
    return memra::kContractValue;
  }
  if (cache_dtype != 0 && cache_dtype != 1) return memra::kContractDType;
  if (B == 0 || H == 0) return memra::kOk;
  if (!q_lat || !caches || !t_kv || !o_lat) return memra::kContractMissing;
  if (listed && !listed_counts) return memra::kContractMissing;
  if (d_rope > 0 && !q_pe) return memra::kContractMissing;
  if (B > 65535 || H > 65535) return memra::kUnsupportedGeometry;
  const bool gather = idx != nullptr || listed != nullptr;
  const int max_rows = gather ? std::min(width, max_t_kv) : max_t_kv;
  if (max_rows == 0) {  // every row idle or every list empty: zeros, nothing read
    return status_of(cudaMemsetAsync(o_lat, 0, sizeof(float) * static_cast<size_t>(B) * H * R,
                                     ctx->stream));
  }

  // Rope columns on tensor cores at d_rope == kTcRope only (other widths: the f32 kernel).
  const bool tc = cache_dtype == 1 && (R == 128 || R == 256 || R == 512) &&
                  (d_rope == 0 || d_rope == memra::cuda::mla::kTcRope);
  if (!tc && R > 32 * kFAcc) return memra::kUnsupportedGeometry;  // R > 1024
  int sms = 0;
  MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMultiProcessorCount, &sms));

  // Dense bf16 at H = 64, R = 512 with 16-byte aligned q_lat / o_lat and no rope columns: the
  // wgmma arm when the context's options select it (docs/options.md: the arms at the two bench
  // shapes). Splits
  // from the same cost model in units of its tiles (the q read, 64 x 512 f32 = 128 KiB, is
  // 128 / tile_rows tiles); B = 64, L = 4096: 2 splits; B = 8, L = 32768: 16.
  const int variant = ctx->options.mla_decode_variant;
  const bool aligned = reinterpret_cast<uintptr_t>(q_lat) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(o_lat) % 16 == 0;
  if (variant != 0 && !gather && cache_dtype == 1 && H == 64 && R == 512 && d_rope == 0 &&
      aligned) {
    const int tr = memra::cuda::mla_decode_sm90_tile_rows();
    const int64_t wtiles = (static_cast<int64_t>(max_t_kv) + tr - 1) / tr;
    const double ovh = 128.0 / tr;
    int ns = choose_nsplit(B, wtiles, sms, 1, ovh, ovh);
    if (const int st = ctx->options.mla_split_tiles; st > 0) {
      const int64_t rows = static_cast<int64_t>(st) * 64;  // the option's unit: 64-row tiles
      ns = static_cast<int>(std::min<int64_t>((max_t_kv + rows - 1) / rows, INT_MAX));
    }
    ns = std::min(ns, memra::cuda::mla_decode_sm90_max_splits());
    const int64_t chunk = (wtiles + ns - 1) / ns * tr;
    if (chunk <= INT_MAX) {
      ns = static_cast<int>((max_t_kv + chunk - 1) / chunk);
      const int rc = memra::cuda::mla_decode_sm90(ctx, q_lat, caches, t_kv, B, max_t_kv,
                                                  static_cast<int>(chunk), ns, scale, o_lat);
      if (rc != memra::kUnsupportedGeometry) return rc;
    }
  }

  DecodeArgs a{};
  a.q_lat = q_lat;
  a.q_pe = d_rope > 0 ? q_pe : nullptr;
  a.d_rope = d_rope;
  a.caches = caches;
  a.t_kv = t_kv;
  a.width = width;
  a.B = B;
  a.H = H;
  a.R = R;
  a.max_t_kv = max_t_kv;
  a.scale = scale;
  a.o_lat = o_lat;
  a.combine_fast = 1;  // the one-round-trip combine up to kCombineFast splits

  // Gathered: the compacted lists first (the attention kernels read list / counts).
  Scratch lists(ctx, gather && !listed ? sizeof(int32_t) * (static_cast<size_t>(B) * width + B) : 0);
  MEMRA_CUDA_RETURN_IF(lists.status());
  if (listed) {
    a.list = listed;
    a.counts = listed_counts;
  } else if (gather) {
    const size_t bm_bytes = sizeof(unsigned) * (ceil_div(max_t_kv, 32) + kWarps);
    MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decode_compact_kernel, bm_bytes));
    a.list = lists.as<int32_t>();
    a.counts = lists.as<int32_t>() + static_cast<int64_t>(B) * width;
    memra::cuda::launch(ctx, true, decode_compact_kernel, dim3(B), dim3(kThreads), bm_bytes, idx,
        t_kv, width, max_t_kv, const_cast<int32_t*>(a.list), const_cast<int*>(a.counts));
    MEMRA_CUDA_RETURN_IF(launch_status());
  }

  const int64_t tiles = ceil_div(max_rows, kTileRows);
  int groups = 0, mt = 0;
  size_t f32_smem = 0;
  if (tc) {
    // 32 heads per block below 32 sequences, 64 above (KernelOptions::mla_tc_mt forces either;
    // at short decode contexts two 32-head blocks beat one 64-head block, docs/options.md).
    // The softmax sums are split over 8 / MT row groups, so the two differ in the last bits
    // (both within the tests' CPU tolerance).
    mt = H > 32 && B >= 32 ? 4 : 2;
    if (const int want = ctx->options.mla_tc_mt; want == 2 || want == 4) mt = H > 32 ? want : 2;
    if (d_rope > 0) mt = 2;  // the rope kernel's only form (4 m-tiles do not fit shared memory)
    groups = static_cast<int>(ceil_div(H, 16 * mt));
    const double ovh = 16.0 * mt / 32.0;  // HB x R f32 = HB / 32 tiles of 64 bf16 rows
    a.nsplit = choose_nsplit(static_cast<int64_t>(B) * groups, tiles, sms, 1, ovh, ovh);
    int optin = 0;
    MEMRA_CUDA_RETURN_IF(smem_optin(ctx, &optin));
    if (memra::cuda::mla::decode_tc_smem_bytes(mt, R, d_rope) > static_cast<size_t>(optin)) {
      return memra::kUnsupportedGeometry;
    }
  } else {
    groups = static_cast<int>(ceil_div(H, kFHeads));
    f32_smem = f32_smem_bytes(R + d_rope);
    const double ovh = static_cast<double>(kFHeads) / kTileRows;  // 8 x R f32 / (64 x R f32)
    a.nsplit = choose_nsplit(static_cast<int64_t>(B) * groups, tiles, sms, 2, ovh, ovh);
  }
  if (const int st = ctx->options.mla_split_tiles; st > 0) {
    a.nsplit = static_cast<int>(ceil_div(tiles, st));
  }
  a.chunk = static_cast<int>(ceil_div(tiles, a.nsplit)) * kTileRows;
  a.nsplit = static_cast<int>(ceil_div(max_rows, a.chunk));

  const size_t n_part = static_cast<size_t>(B) * a.nsplit * H;
  Scratch part(ctx, a.nsplit > 1 ? sizeof(float) * n_part * (static_cast<size_t>(R) + 2) : 0);
  MEMRA_CUDA_RETURN_IF(part.status());
  if (a.nsplit > 1) {
    a.po = part.as<float>();
    a.pm = a.po + n_part * R;
    a.pl = a.pm + n_part;
  }

  if (tc) {
    MEMRA_CUDA_RETURN_IF(memra::cuda::mla::launch_decode_tc(ctx, mt, &a, sizeof(a), groups));
  } else if (cache_dtype == 0) {
    MEMRA_CUDA_RETURN_IF(launch_f32<float>(ctx, a, groups, f32_smem));
  } else {
    MEMRA_CUDA_RETURN_IF(launch_f32<__nv_bfloat16>(ctx, a, groups, f32_smem));
  }
  if (a.nsplit > 1) {
    const dim3 grid(static_cast<unsigned>(H), static_cast<unsigned>(B));
    const size_t wbytes = sizeof(float) * (a.nsplit + 4);  // + 4: as mla_attn.cu's attn_combine
    if (tc) {
      MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decode_combine_kernel<true>, wbytes));
      memra::cuda::launch(ctx, true, decode_combine_kernel<true>, dim3(grid), dim3(128), wbytes, a);
    } else {
      MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decode_combine_kernel<false>, wbytes));
      memra::cuda::launch(ctx, true, decode_combine_kernel<false>, dim3(grid), dim3(128), wbytes,
          a);
    }
    MEMRA_CUDA_RETURN_IF(launch_status());
  }
  return memra::kOk;
}

}  // namespace

namespace memra::cuda::mla {

int attn_decode(MemraCudaCtx* ctx, const MemraMlaAttnParams& p) {
  if (p.rows == MEMRA_MLA_ROWS_LISTED) {
    if (!p.list) return memra::kContractMissing;
    return attn_decode_impl(ctx, p.q_lat, p.q_pe, p.caches, p.cache_dtype, p.seq_t_kv, nullptr,
                            p.list, p.counts, p.width, p.B, p.H, p.R, p.d_rope, p.max_t_kv,
                            p.scale, p.o_lat);
  }
  const int32_t* idx = p.rows == MEMRA_MLA_ROWS_INDEXED ? p.idx : nullptr;
  return attn_decode_impl(ctx, p.q_lat, p.q_pe, p.caches, p.cache_dtype, p.seq_t_kv, idx,
                          nullptr, nullptr, p.width, p.B, p.H, p.R, p.d_rope, p.max_t_kv,
                          p.scale, p.o_lat);
}

}  // namespace memra::cuda::mla
