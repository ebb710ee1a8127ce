// Absorbed MLA attention over one sequence's latent cache (memra_cuda_mla_attn with batched 0,
// cpp/include/memra/cuda_abi/mla.h): causal (cpu::mla_attn_absorbed) and index-listed
// (cpu::mla_attn_gathered) rows, the CPU ops in cpp/src/cpu/mla.cpp being the numeric oracle. The
// batched decode forms are cuda/mla_decode.cu's (the entry here hands them over).
//
// A block owns (query, group of HB heads, KV split); cache rows stream through shared memory in
// tiles of 32; scores are one sequential dot per (head, row) in the CPU's order (latent then rope
// part); softmax is online in f32 (running max, rescale by exp(m_old - m_new), exp(s - m) with a
// port of glibc's expf); the split-KV partials (unnormalised o, m, l) are merged by a combine
// kernel. A query whose rows fit one tile, without a split, gets the CPU's bytes. Gathered lists
// are first compacted per query into the CPU's row list (entries -1, < 0 or after the query row
// dropped, duplicates counted once, ascending).
//
// tensor_cores = 1 (bf16 models) with a bf16 cache the tensor-core kernels serve (R in {128,
// 256, 512}, d_rope 0 or 64): cuda/mla_prefill_tc.cu instead of everything below.
#include <cfloat>
#include <climits>
#include <cstdint>
#include <algorithm>

#include "common.cuh"
#include "gather_compact.cuh"
#include "glibc_expf.cuh"
#include "mla_common.cuh"

namespace memra::cuda::mla {
// cuda/mla_decode.cu: the batched forms (p.batched == 1), entry checks included.
int attn_decode(MemraCudaCtx* ctx, const MemraMlaAttnParams& p);
// cuda/mla_prefill_tc.cu: the tensor-core arm of the one-sequence forms (tensor_cores == 1).
bool prefill_tc_fits(int cache_dtype, int R, int d_rope);
int attn_prefill_tc(MemraCudaCtx* ctx, const MemraMlaAttnParams& p);
}  // namespace memra::cuda::mla

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::glibc_expf;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;
using memra::cuda::to_f32;
using memra::cuda::warp_max;
using memra::cuda::mla::allow_smem;
using memra::cuda::mla::device_attr;

namespace {

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
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
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
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
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
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
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
  memra::cuda::launch(ctx, true, attn_kernel<KH, Tc>, dim3(grid), dim3(kAttnThreads), smem, q_lat,
      q_pe, static_cast<const Tc*>(cache), list, counts, width, g, o_lat, po, pm, pl);
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
  // + 4 floats: memcheck saw the unrolled split loop read 12 bytes past an 8-byte window (loads
  // the compiler merged; their values are never used).
  memra::cuda::launch(ctx, true, attn_combine_kernel, dim3(static_cast<unsigned>(n_qh)), dim3(128),
      sizeof(float) * (nsplit + 4), po, pm, pl, nsplit, n_qh, R, o_lat);
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

int memra_cuda_mla_attn(MemraCudaCtx* ctx, const MemraMlaAttnParams* p) {
  if (!p) return memra::kContractMissing;
  if (p->batched != 0 && p->batched != 1) return memra::kContractValue;
  if (p->rows < MEMRA_MLA_ROWS_CAUSAL || p->rows > MEMRA_MLA_ROWS_LISTED) {
    return memra::kContractValue;
  }
  if (p->batched) return memra::cuda::mla::attn_decode(ctx, *p);
  if (p->rows == MEMRA_MLA_ROWS_LISTED) return memra::kContractValue;  // batched only
  const float* q_lat = p->q_lat;
  const float* q_pe = p->q_pe;
  const void* cache = p->cache;
  const int cache_dtype = p->cache_dtype, H = p->H, R = p->R, d_rope = p->d_rope;
  const int t_q = p->t_q, t_kv = p->t_kv;
  const float scale = p->scale;
  float* o_lat = p->o_lat;
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  MEMRA_CUDA_RETURN_IF(
      check_attn_args(q_lat, q_pe, cache, cache_dtype, H, R, d_rope, t_q, t_kv, o_lat));
  if (p->tensor_cores != 0 && p->tensor_cores != 1) return memra::kContractValue;
  const bool tc = p->tensor_cores && memra::cuda::mla::prefill_tc_fits(cache_dtype, R, d_rope);
  if (p->rows == MEMRA_MLA_ROWS_CAUSAL) {
    if (t_q == 0 || H == 0) return memra::kOk;
    if (tc) return memra::cuda::mla::attn_prefill_tc(ctx, *p);
    return run_attn(ctx, q_lat, q_pe, cache, cache_dtype, nullptr, nullptr, 0, H, R, d_rope, t_q,
                    t_kv, t_kv, scale, o_lat);
  }
  // Index lists: compacted per query first.
  const int32_t* idx = p->idx;
  const int width = p->width;
  if (width < 0) return memra::kContractValue;
  if (t_q == 0 || H == 0) return memra::kOk;
  if (width == 0) {  // every list is empty: zeros
    return status_of(cudaMemsetAsync(o_lat, 0, sizeof(float) * static_cast<size_t>(t_q) * H * R,
                                     ctx->stream));
  }
  if (!idx) return memra::kContractMissing;
  if (tc) return memra::cuda::mla::attn_prefill_tc(ctx, *p);  // compacts the lists itself
  // Bitmap of the t_kv rows (the last query sees them all) plus the warp totals.
  const size_t bm_bytes = sizeof(unsigned) * (ceil_div(t_kv, 32) + kWarps);
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, gather_compact_kernel, bm_bytes));
  Scratch lists(ctx, sizeof(int32_t) * (static_cast<size_t>(t_q) * width + t_q));
  MEMRA_CUDA_RETURN_IF(lists.status());
  int32_t* list = lists.as<int32_t>();
  int* counts = list + static_cast<int64_t>(t_q) * width;
  memra::cuda::launch(ctx, true, gather_compact_kernel, dim3(t_q), dim3(kAttnThreads), bm_bytes,
      idx, t_q, t_kv, width, list, counts);
  MEMRA_CUDA_RETURN_IF(launch_status());
  return run_attn(ctx, q_lat, q_pe, cache, cache_dtype, list, counts, width, H, R, d_rope, t_q,
                  t_kv, std::min(width, t_kv), scale, o_lat);
}

}  // extern "C"
