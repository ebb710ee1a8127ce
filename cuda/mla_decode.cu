// Batched MLA decode over per-sequence latent caches (cpp/include/memra/cuda_abi/mla.h:
// mla_attn_decode, mla_latent_append_decode). One launch plan serves B sequences, one query each
// (the query of sequence b sits at row t_kv[b] - 1 and sees rows [0, t_kv[b])); t_kv, the cache
// pointers and the index lists live on the device, so a captured graph replays at any position.
//
// Plan (all on ctx->stream, no host sync):
//   [gathered only] compact: one block per sequence turns its index list into the CPU's row list
//     (entries in [0, t_kv) kept, duplicates once, ascending: a shared-memory bitmap of the
//     visible rows, then a block scan of the words' popcounts) plus a count;
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
//   selects it (1 or 2, the default 1), the sm_90a wgmma kernel of cuda/mla_decode_sm90.cu with
//   its own combine; same roundings, splits from the same cost model in its tile size. Everything
//   below serves every other case and stays the reference arm (variant 0).
//
// bf16 cache, R in {128, 256, 512}: tensor-core kernel (mma.sync.m16n8k16 bf16 -> f32).
//   All HB = 16 * MT heads of a block (MT = 4 m-tiles for H > 32 at B >= 32, else 2) share each
//   cache row: the row is read from HBM once per (sequence, split) and feeds both products.
//   Tiles: 64 rows; 8 warps. QK: warp w computes S[16 heads (m-tile w % MT) x 8 * MT rows
//   (row group w / MT)] over the whole rank: per 16-wide k-step one ldmatrix.x4 of Q (A), MT / 2
//   ldmatrix.x4 of the cache rows (B, non-transposed), MT mma. Softmax: per-warp row maxima are
//   exchanged through shared memory (8 / MT row groups), p = exp2(s * scale * log2e - m) rounded
//   to bf16 and stored as P [HB, 64]; each thread keeps partial row sums of the *rounded* p for its
//   two heads (so o = sum p~ c / sum p~ is an exact convex combination up to f32 accumulation).
//   PV: warp w owns O[all HB heads, columns w * R / 8 ... + R / 8] in registers (MT * R / 16 f32
//   per thread: 128 at MT = 4, R = 512): per 16-row k-step MT ldmatrix.x4 of P (A) and R / 128
//   ldmatrix.x4.trans of the cache tile (B), MT * R / 64 mma. Every cache byte is read once from
//   HBM; from shared memory it is read MT times by QK (each B fragment serves the MT warps of
//   its row group), once by PV, and Q once per row group per tile: per 64-row tile (64 KiB at
//   R = 512, MT = 4) the block moves 64 KiB by cp.async, 384 KiB by QK ldmatrix (Q 128 KiB + cache
//   256 KiB) and 128 KiB by PV ldmatrix (P 64 KiB + cache 64 KiB), and issues 2048 mma.
//   Pipeline: 2 stages; tile t + 1 is fetched by 16-byte cp.async (rows past the range
//   zero-filled, never read from global) while tile t is computed; 64 KiB in flight per SM.
//   Shared memory (R = 512, MT = 4): Q bf16 [64][520] 65 KiB + 2 cache stages [64][520] 130 KiB
//   + P [64][72] 9 KiB + maxima / partial sums / running max / alpha 1.75 KiB = 205.75 KiB (rows
//   padded by 16 bytes: the 8 row addresses of every ldmatrix phase hit distinct 16-byte bank
//   groups); one block per SM (__launch_bounds__(256, 1); O is 128 registers per thread).
//   Precision: q_lat is rounded to bf16 (2^-9 relative per element) for the QK product; the cache
//   is bf16 already; p is rounded to bf16 for the PV product; scores, the softmax statistics
//   (running max, alpha, sums) and both accumulations are f32. Against the f32 CPU op on the
//   same bf16 cache a score moves by ~2^-9 of its terms (~2e-3 at scores of std 2), a weight
//   by as much relative, the output by that times |c - o|: 3e-3..6e-3 of max|o| on the tests'
//   inputs (a float64 emulation of these roundings; tests allow 1e-2); against the CPU on the
//   bf16-rounded q only the p rounding and the accumulation order remain (~1.3e-3; 5e-3).
//
// f32 cache (or bf16 with another R; R <= 1024): exact f32 CUDA-core kernel, 8 heads per block,
//   one warp per head from the scores to the output: cache rows widened to f32 in shared memory
//   (32-row sub-tiles, odd row stride), lane j scores row j with a sequential fmaf dot, online
//   softmax with expf, o[lane + 32 u] += p_j c_j (p_j shuffled from lane j), j ascending; ~1e-6
//   relative to the CPU op (the same operations up to FMA contraction, expf's last ulp and the
//   order of the online rescaling / split merge).
//
// Split count (host, from B, head groups, max rows, SM count only, so a graph stays valid at any
// position): minimise waves * (tiles per split + per-block overhead) + combine work, with
// waves = ceil(blocks / (SMs * blocks per SM)) (1 block per SM for the tensor kernel), the
// overhead of a block being its q read and, when split, its partial write (both HB x R f32, i.e.
// HB / 32 tiles of a bf16 cache) and the combine reading the partials back. B = 64, 4096 rows:
// 2 splits (128 blocks, one wave on 132 SMs); B = 8, 32768 rows: 16 splits (128 blocks, 32 tiles
// each).
//
// Bandwidth: per SM the target (0.8 x 4.29 TB/s over 132 SMs = 26 GB/s) is 64 KiB every ~2.5 us
// (~4900 cycles at 1.98 GHz). The block needs ~4500 cycles of shared-memory traffic (576 KiB at
// 128 B/clk) and 2048 mma per tile, which overlap across the 8 warps (ldmatrix of one warp while
// another's mma run) and with the next tile's cp.async; the 16 MiB of f32 partials at B = 64
// (~6 % of the cache bytes, written once, read back from L2 by the combine) and the q reads come
// on top. Expect the kernel to be shared-memory / mma-issue bound rather than HBM bound: ~2.5-3
// TB/s of cache bytes (90-110 us at B = 64, L = 4096); a wgmma (sm_90a) version reading Q and the
// cache straight from shared memory would remove most of the ldmatrix traffic.
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <algorithm>

#include "common.cuh"
#include "gather_compact.cuh"

namespace memra::cuda {
// cuda/mla_decode_sm90.cu: the wgmma arm for dense bf16 caches at H = 64, R = 512.
int mla_decode_sm90_tile_rows(int variant);  // rows per tile (a split's chunk is a multiple)
int mla_decode_sm90_max_splits();
// kOk, a launch / scratch status, or kUnsupportedGeometry (the device lacks the shared memory;
// the caller falls back to the mma.sync kernel).
int mla_decode_sm90(MemraCudaCtx* ctx, int variant, const float* q_lat, const void* const* caches,
                    const int32_t* t_kv, int B, int max_t_kv, int chunk, int nsplit, float scale,
                    float* o_lat);
}  // namespace memra::cuda

using memra::cuda::ceil_div;
using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait_all;
using memra::cuda::enter;
using memra::cuda::from_f32;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::smem_u32;
using memra::cuda::status_of;
using memra::cuda::to_f32;
using memra::cuda::warp_max;
using memra::cuda::warp_sum;

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;  // 8 warps, both attention kernels and the compaction
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 64;  // rows per tile; split chunks are multiples of it
constexpr int kStages = 2;
constexpr float kLog2e = 1.4426950408889634f;

int device_attr(MemraCudaCtx* ctx, cudaDeviceAttr attr, int* out) {
  return status_of(cudaDeviceGetAttribute(out, attr, ctx->device));
}

int smem_optin(MemraCudaCtx* ctx, int* out) {
  return device_attr(ctx, cudaDevAttrMaxSharedMemoryPerBlockOptin, out);
}

// Allow `bytes` of dynamic shared memory for `kernel`; 50002 when one block cannot have that much.
template <typename K>
int allow_smem(MemraCudaCtx* ctx, K* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return memra::kOk;
  int optin = 0;
  MEMRA_CUDA_RETURN_IF(smem_optin(ctx, &optin));
  if (bytes > static_cast<size_t>(optin)) return memra::kUnsupportedGeometry;
  return status_of(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
}

// ---------------------------------------------------------------- launch arguments

struct DecodeArgs {
  const float* q_lat;          // [B, H, R]
  const void* const* caches;   // [B] device pointers, rows of R elements
  const int32_t* t_kv;         // [B]
  const int32_t* list;         // compacted lists [B, width] (gathered) or null (dense)
  const int* counts;           // [B] entries of each compacted list (gathered) or null
  int width;
  int B, H, R;
  int max_t_kv;                // t_kv[b] is clamped to [0, max_t_kv]
  int chunk;                   // rows (entries) per split, a multiple of kTileRows
  int nsplit;                  // splits in the grid
  float scale;
  float* o_lat;                // [B, H, R]
  float* po;                   // partials [B, nsplit, H, R] (nsplit > 1)
  float* pm;                   // [B, nsplit, H]
  float* pl;                   // [B, nsplit, H]
  int combine_fast;            // 1: the combine's one-round-trip form where it applies
};

// Rows (dense) or list entries (gathered) sequence b attends over.
__device__ __forceinline__ int rows_of(const DecodeArgs& a, int b) {
  if (a.counts) return a.counts[b];
  return min(max(a.t_kv[b], 0), a.max_t_kv);
}

__device__ __forceinline__ int64_t partial_index(const DecodeArgs& a, int b, int s, int h) {
  return (static_cast<int64_t>(b) * a.nsplit + s) * a.H + h;
}

// Zeros for heads [h0, h0 + nh) of sequence b (an idle row or an empty list).
__device__ __forceinline__ void zero_heads(const DecodeArgs& a, int b, int h0, int nh) {
  float* o = a.o_lat + (static_cast<int64_t>(b) * a.H + h0) * a.R;
  const int64_t n = static_cast<int64_t>(nh) * a.R;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) o[k] = 0.0f;
}

// ---------------------------------------------------------------- PTX helpers

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// d += a * b, m16n8k16, bf16 inputs, f32 accumulators. Fragments (g = lane / 4, q = lane % 4):
// a0 (row g, k 2q..2q+1), a1 (row g+8, same k), a2 (row g, k 2q+8..), a3 (row g+8, k 2q+8..);
// b0 (k 2q..2q+1, col g), b1 (k 2q+8.., col g); d0 d1 (row g, cols 2q, 2q+1), d2 d3 (row g+8).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo at the lower address
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// ---------------------------------------------------------------- tensor-core kernel

template <int MT, int R>
struct Tc {
  static constexpr int HB = 16 * MT;          // heads per block
  static constexpr int QS = R + 8;            // Q / cache row stride in bf16 (+16 bytes)
  static constexpr int PS = kTileRows + 8;    // P row stride in bf16 (+16 bytes)
  static constexpr int NRG = kWarps / MT;     // QK row groups
  static constexpr int RW = kTileRows / NRG;  // rows per QK warp (8 * MT)
  static constexpr int NTS = RW / 8;          // S n-tiles per warp
  static constexpr int CW = R / kWarps;       // O columns per warp
  static constexpr int NTO = CW / 8;          // O n-tiles per warp
  static constexpr int CPR = R / 8;           // 16-byte chunks per cache row
  static constexpr size_t q_off = 0;
  static constexpr size_t c_off = q_off + sizeof(__nv_bfloat16) * HB * QS;
  static constexpr size_t p_off = c_off + sizeof(__nv_bfloat16) * kStages * kTileRows * QS;
  static constexpr size_t red_off = p_off + sizeof(__nv_bfloat16) * HB * PS;  // f32 [NRG][HB]
  static constexpr size_t lpart_off = red_off + sizeof(float) * NRG * HB;    // f32 [NRG][HB]
  static constexpr size_t mrun_off = lpart_off + sizeof(float) * NRG * HB;   // f32 [2][HB]
  static constexpr size_t alpha_off = mrun_off + sizeof(float) * 2 * HB;     // f32 [HB]
  static constexpr size_t bytes = alpha_off + sizeof(float) * HB;
  static_assert(NTS % 2 == 0 && NTO % 2 == 0, "fragments are loaded in pairs of n-tiles");
  static_assert(R % 128 == 0 && R <= 512, "R in {128, 256, 512}");
  static_assert(c_off % 16 == 0 && p_off % 16 == 0 && red_off % 16 == 0, "16-byte alignment");
};

// Block (split blockIdx.x, sequence blockIdx.y, head group blockIdx.z). See the file comment.
template <int MT, int R, bool kGather>
__global__ void __launch_bounds__(kThreads, 1) decode_tc_kernel(DecodeArgs a) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  using S = Tc<MT, R>;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem + S::q_off);
  __nv_bfloat16* cs = reinterpret_cast<__nv_bfloat16*>(smem + S::c_off);
  __nv_bfloat16* ps = reinterpret_cast<__nv_bfloat16*>(smem + S::p_off);
  float* red_max = reinterpret_cast<float*>(smem + S::red_off);
  float* l_part = reinterpret_cast<float*>(smem + S::lpart_off);
  float* m_run = reinterpret_cast<float*>(smem + S::mrun_off);
  float* alpha_s = reinterpret_cast<float*>(smem + S::alpha_off);

  const int split = blockIdx.x, b = blockIdx.y, h0 = blockIdx.z * S::HB;
  const int nh = min(S::HB, a.H - h0);
  const int n = rows_of(a, b);
  if (n <= 0) {  // idle row / empty list: zeros, nothing read (uniform over the block)
    if (split == 0) zero_heads(a, b, h0, nh);
    return;
  }
  const int begin = split * a.chunk;
  if (begin >= n) return;
  const int end = min(n, begin + a.chunk);
  const int nsb = (n + a.chunk - 1) / a.chunk;  // active splits of this sequence
  const int ntiles = (end - begin + kTileRows - 1) / kTileRows;
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(a.caches[b]);
  const int32_t* list = kGather ? a.list + static_cast<int64_t>(b) * a.width : nullptr;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // Tile t of this split into stage st: 64 rows x R, 16 bytes per cp.async; rows past `end`
  // zero-filled (their scores are masked; zeros keep 0 * c finite in PV).
  auto load_tile = [&](int t, int st) {
    const int t0 = begin + t * kTileRows;
    __nv_bfloat16* dst = cs + static_cast<size_t>(st) * kTileRows * S::QS;
#pragma unroll 4
    for (int c = tid; c < kTileRows * S::CPR; c += kThreads) {
      const int j = c / S::CPR, k = c - j * S::CPR;
      const int e = t0 + j;
      const bool valid = e < end;
      int64_t row = 0;
      if (valid) row = kGather ? list[e] : e;
      cp_async_16(dst + j * S::QS + k * 8, cache + row * R + k * 8, valid ? 16 : 0);
    }
    cp_async_commit();
  };
  load_tile(0, 0);

  // Q rounded to bf16 (heads past nh zero), running max init. Scalar loads (no alignment
  // needed), kQBatch pairs per thread issued before any is stored: one pass per batch instead of
  // one L2 round trip per pair (64 of them at HB = 64, R = 512, in a row).
  {
    const float* qb = a.q_lat + (static_cast<int64_t>(b) * a.H + h0) * R;
    constexpr int kQPer = S::HB * (R / 2) / kThreads;  // pairs per thread
    static_assert(S::HB * (R / 2) % kThreads == 0, "whole batches of Q pairs");
    constexpr int kQBatch = kQPer < 16 ? kQPer : 16;
    static_assert(kQPer % kQBatch == 0, "whole batches of Q pairs");
    for (int k0 = 0; k0 < kQPer; k0 += kQBatch) {
      float v0[kQBatch], v1[kQBatch];
#pragma unroll
      for (int u = 0; u < kQBatch; ++u) {
        const int k = tid + (k0 + u) * kThreads;
        const int h = k / (R / 2), c2 = k - h * (R / 2);
        v0[u] = h < nh ? __ldg(qb + static_cast<int64_t>(h) * R + 2 * c2) : 0.0f;
        v1[u] = h < nh ? __ldg(qb + static_cast<int64_t>(h) * R + 2 * c2 + 1) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kQBatch; ++u) {
        const int k = tid + (k0 + u) * kThreads;
        const int h = k / (R / 2), c2 = k - h * (R / 2);
        *reinterpret_cast<uint32_t*>(qs + h * S::QS + 2 * c2) = pack_bf16x2(v0[u], v1[u]);
      }
    }
    if (tid < S::HB) m_run[tid] = -INFINITY;  // m_run[0][h]
  }

  // Fragment addressing (see mma_bf16): A / transposed-B lanes: row (lane & 7) + 8 * bit 3,
  // column 8 * bit 4; non-transposed B lanes: row (lane & 7) + 8 * bit 4, column 8 * bit 3.
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
  const int b_row = (lane & 7) + ((lane >> 4) & 1) * 8, b_col = ((lane >> 3) & 1) * 8;
  const int g = lane >> 2, tq = lane & 3;
  const int qk_mt = warp % MT, qk_rg = warp / MT;
  const float sl2 = a.scale * kLog2e;

  float o[MT][S::NTO][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < S::NTO; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.0f;
  float l_thr[2] = {0.0f, 0.0f};  // partial sums of heads qk_mt*16 + g (+8) over this thread's cols

  for (int t = 0; t < ntiles; ++t) {
    cp_async_wait_all();
    __syncthreads();  // S1: tile t visible; PV of t-1 done (its stage and P are free)
    if (t + 1 < ntiles) load_tile(t + 1, (t + 1) & 1);
    const __nv_bfloat16* ct = cs + static_cast<size_t>(t & 1) * kTileRows * S::QS;
    const int nvalid = min(kTileRows, end - (begin + t * kTileRows));

    // ---- S = Q C^T for 16 heads x RW rows
    float sacc[S::NTS][4];
#pragma unroll
    for (int nt = 0; nt < S::NTS; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[nt][e] = 0.0f;
    {
      const __nv_bfloat16* qa = qs + (qk_mt * 16 + a_row) * S::QS + a_col;
      const __nv_bfloat16* cb = ct + (qk_rg * S::RW + b_row) * S::QS + b_col;
#pragma unroll 4
      for (int ks = 0; ks < R / 16; ++ks) {
        uint32_t af[4];
        ldsm_x4(af, qa + ks * 16);
#pragma unroll
        for (int np = 0; np < S::NTS / 2; ++np) {
          uint32_t bf[4];
          ldsm_x4(bf, cb + np * 16 * S::QS + ks * 16);
          mma_bf16(sacc[2 * np], af, bf[0], bf[1]);
          mma_bf16(sacc[2 * np + 1], af, bf[2], bf[3]);
        }
      }
    }

    // ---- scores in the log2 domain, masked; per-warp maxima of the two heads
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < S::NTS; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = qk_rg * S::RW + nt * 8 + 2 * tq + (e & 1);
        const float v = col < nvalid ? sacc[nt][e] * sl2 : -INFINITY;
        sacc[nt][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFull, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFull, mx[i], 2));
    }
    if (tq == 0) {
      red_max[qk_rg * S::HB + qk_mt * 16 + g] = mx[0];
      red_max[qk_rg * S::HB + qk_mt * 16 + g + 8] = mx[1];
    }
    __syncthreads();  // S2: maxima of all row groups

    // ---- online softmax: new max, alpha, p~ = bf16(exp2(s - m)) into P, partial sums of p~
    {
      const float* m_old_row = m_run + (t & 1) * S::HB;
      float* m_new_row = m_run + ((t + 1) & 1) * S::HB;
      float m_new[2], alpha[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int hh = qk_mt * 16 + g + 8 * i;
        const float m_old = m_old_row[hh];
        float m = m_old;
#pragma unroll
        for (int rg = 0; rg < S::NRG; ++rg) m = fmaxf(m, red_max[rg * S::HB + hh]);
        // m is finite: row 0 of the tile is valid (nvalid >= 1). m_old = -inf gives alpha 0.
        m_new[i] = m;
        alpha[i] = exp2f(m_old - m);
        l_thr[i] *= alpha[i];
        if (qk_rg == 0 && tq == 0) {
          m_new_row[hh] = m;
          alpha_s[hh] = alpha[i];
        }
      }
#pragma unroll
      for (int nt = 0; nt < S::NTS; ++nt) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float p0 = exp2f(sacc[nt][2 * i] - m_new[i]);  // masked: exp2(-inf) = 0
          const float p1 = exp2f(sacc[nt][2 * i + 1] - m_new[i]);
          const uint32_t u = pack_bf16x2(p0, p1);
          __nv_bfloat162 r;
          memcpy(&r, &u, sizeof(r));
          l_thr[i] += __low2float(r) + __high2float(r);
          const int hh = qk_mt * 16 + g + 8 * i;
          const int col = qk_rg * S::RW + nt * 8 + 2 * tq;
          *reinterpret_cast<uint32_t*>(ps + hh * S::PS + col) = u;
        }
      }
    }
    __syncthreads();  // S3: P and alpha of every head

    // ---- O = O * alpha + P C for all heads x this warp's columns
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float a0 = alpha_s[mt * 16 + g], a1 = alpha_s[mt * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < S::NTO; ++nt) {
        o[mt][nt][0] *= a0;
        o[mt][nt][1] *= a0;
        o[mt][nt][2] *= a1;
        o[mt][nt][3] *= a1;
      }
    }
    {
      const __nv_bfloat16* pa = ps + a_row * S::PS + a_col;
      const __nv_bfloat16* cv = ct + a_row * S::QS + warp * S::CW + a_col;
#pragma unroll
      for (int ks = 0; ks < kTileRows / 16; ++ks) {
        uint32_t pf[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4(pf[mt], pa + mt * 16 * S::PS + ks * 16);
#pragma unroll
        for (int np = 0; np < S::NTO / 2; ++np) {
          uint32_t bf[4];
          ldsm_x4_trans(bf, cv + ks * 16 * S::QS + np * 16);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(o[mt][2 * np], pf[mt], bf[0], bf[1]);
            mma_bf16(o[mt][2 * np + 1], pf[mt], bf[2], bf[3]);
          }
        }
      }
    }
  }

  // ---- epilogue: l per head = sum over the quad, then over the row groups
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = l_thr[i];
    l += __shfl_xor_sync(kFull, l, 1);
    l += __shfl_xor_sync(kFull, l, 2);
    if (tq == 0) l_part[qk_rg * S::HB + qk_mt * 16 + g + 8 * i] = l;
  }
  __syncthreads();  // S4: l_part complete (m_run of the last tile was written before S3)

  const float* m_fin = m_run + (ntiles & 1) * S::HB;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int hh = mt * 16 + g + 8 * i;
      if (hh >= nh) continue;
      float L = 0.0f;
#pragma unroll
      for (int rg = 0; rg < S::NRG; ++rg) L += l_part[rg * S::HB + hh];  // >= 1 (the max row)
      const int h = h0 + hh;
      if (nsb == 1) {
        const float inv = 1.0f / L;
        float* out = a.o_lat + (static_cast<int64_t>(b) * a.H + h) * R + warp * S::CW + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < S::NTO; ++nt) {
          *reinterpret_cast<float2*>(out + nt * 8) =
              make_float2(o[mt][nt][2 * i] * inv, o[mt][nt][2 * i + 1] * inv);
        }
      } else {
        const int64_t k = partial_index(a, b, split, h);
        float* out = a.po + k * R + warp * S::CW + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < S::NTO; ++nt) {
          *reinterpret_cast<float2*>(out + nt * 8) =
              make_float2(o[mt][nt][2 * i], o[mt][nt][2 * i + 1]);
        }
        if (warp == 0 && tq == 0) {
          a.pm[k] = m_fin[hh];
          a.pl[k] = L;
        }
      }
    }
  }
}

// ---------------------------------------------------------------- exact f32 CUDA-core kernel

constexpr int kFHeads = kWarps;  // heads per block: one warp per head
constexpr int kFTile = 32;       // rows per shared-memory sub-tile (lane = row in the scores)
constexpr int kFAcc = 32;        // outputs per lane: R <= 32 * kFAcc

size_t f32_smem_bytes(int R) {
  return sizeof(float) * (static_cast<size_t>(kFHeads) * R + static_cast<size_t>(kFTile) * (R | 1));
}

// Block (split, sequence, group of 8 heads); warp w owns head h0 + w from the scores to the
// output. Scores: lane j = row j of the sub-tile, s = (sum_w q[w] c[w]) * scale as one fmaf chain,
// w ascending; online softmax in f32 with expf (m in the natural-log domain); o[r] (r = lane +
// 32 u) = o[r] * alpha + sum_j p_j c_j[r], j ascending, p_j broadcast from lane j by shuffle.
template <typename Tcache, bool kGather>
__global__ void __launch_bounds__(kThreads, 2) decode_f32_kernel(DecodeArgs a) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float fsm[];
  const int R = a.R, Rp = a.R | 1;
  float* qs = fsm;               // [8][R]
  float* cs = qs + kFHeads * R;  // [32][Rp]: lane j reads row j at bank (j * Rp + w) % 32

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

  for (int k = tid; k < kFHeads * R; k += kThreads) {
    const int h = k / R, w = k - h * R;
    qs[k] = h < nh ? a.q_lat[(static_cast<int64_t>(b) * a.H + h0 + h) * R + w] : 0.0f;
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
      const Tcache* src = cache + row * R;
      float* dst = cs + j * Rp;
      for (int w = lane; w < R; w += 32) dst[w] = to_f32(src[w]);
    }
    __syncthreads();  // the sub-tile is loaded

    float s = -INFINITY;
    if (lane < nvalid) {
      const float* c = cs + lane * Rp;
      const float* q = qs + warp * R;
      float d = 0.0f;
#pragma unroll 4
      for (int w = 0; w < R; ++w) d = fmaf(q[w], c[w], d);
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

// ---------------------------------------------------------------- latent append (batched)

// Block b: caches[b][pos[b], :] = rows[b, :] (pos < 0: nothing).
template <typename Tcache>
__global__ void append_decode_kernel(const float* __restrict__ rows, int W,
                                     void* const* __restrict__ caches,
                                     const int32_t* __restrict__ pos) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int b = blockIdx.x;
  const int p = pos[b];
  if (p < 0) return;
  Tcache* dst = static_cast<Tcache*>(caches[b]) + static_cast<int64_t>(p) * W;
  const float* src = rows + static_cast<int64_t>(b) * W;
  for (int w = threadIdx.x; w < W; w += blockDim.x) dst[w] = from_f32<Tcache>(src[w]);
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

template <int MT, int R>
int launch_tc(MemraCudaCtx* ctx, const DecodeArgs& a, int groups) {
  using S = Tc<MT, R>;
  const dim3 grid(static_cast<unsigned>(a.nsplit), static_cast<unsigned>(a.B),
                  static_cast<unsigned>(groups));
  if (a.list) {
    MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decode_tc_kernel<MT, R, true>, S::bytes));
    memra::cuda::launch(ctx, true, decode_tc_kernel<MT, R, true>, dim3(grid), dim3(kThreads),
        S::bytes, a);
  } else {
    MEMRA_CUDA_RETURN_IF(allow_smem(ctx, decode_tc_kernel<MT, R, false>, S::bytes));
    memra::cuda::launch(ctx, true, decode_tc_kernel<MT, R, false>, dim3(grid), dim3(kThreads),
        S::bytes, a);
  }
  return launch_status();
}

int launch_tc_any(MemraCudaCtx* ctx, int mt, const DecodeArgs& a, int groups) {
  if (mt == 4) {
    switch (a.R) {
      case 128: return launch_tc<4, 128>(ctx, a, groups);
      case 256: return launch_tc<4, 256>(ctx, a, groups);
      default: return launch_tc<4, 512>(ctx, a, groups);
    }
  }
  switch (a.R) {
    case 128: return launch_tc<2, 128>(ctx, a, groups);
    case 256: return launch_tc<2, 256>(ctx, a, groups);
    default: return launch_tc<2, 512>(ctx, a, groups);
  }
}

size_t tc_smem_bytes(int mt, int R) {
  if (mt == 4) {
    return R == 128 ? Tc<4, 128>::bytes : (R == 256 ? Tc<4, 256>::bytes : Tc<4, 512>::bytes);
  }
  return R == 128 ? Tc<2, 128>::bytes : (R == 256 ? Tc<2, 256>::bytes : Tc<2, 512>::bytes);
}

template <typename Tcache>
int launch_f32(MemraCudaCtx* ctx, const DecodeArgs& a, int groups, size_t smem) {
  const dim3 grid(static_cast<unsigned>(a.nsplit), static_cast<unsigned>(a.B),
                  static_cast<unsigned>(groups));
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

}  // namespace

extern "C" {

}  // extern "C"

namespace {

// mla_attn_decode over idx (compacted here) or over lists compacted already (list, counts).
int attn_decode_impl(MemraCudaCtx* ctx, const float* q_lat, const void* const* caches,
                     int cache_dtype, const int32_t* t_kv, const int32_t* idx,
                     const int32_t* listed, const int* listed_counts, int width, int B, int H,
                     int R, int max_t_kv, float scale, float* o_lat) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (B < 0 || H < 0 || R < 1 || max_t_kv < 0 || width < 0) return memra::kContractValue;
  if (cache_dtype != 0 && cache_dtype != 1) return memra::kContractDType;
  if (B == 0 || H == 0) return memra::kOk;
  if (!q_lat || !caches || !t_kv || !o_lat) return memra::kContractMissing;
  if (listed && !listed_counts) return memra::kContractMissing;
  if (B > 65535 || H > 65535) return memra::kUnsupportedGeometry;
  const bool gather = idx != nullptr || listed != nullptr;
  const int max_rows = gather ? std::min(width, max_t_kv) : max_t_kv;
  if (max_rows == 0) {  // every row idle or every list empty: zeros, nothing read
    return status_of(cudaMemsetAsync(o_lat, 0, sizeof(float) * static_cast<size_t>(B) * H * R,
                                     ctx->stream));
  }

  const bool tc = cache_dtype == 1 && (R == 128 || R == 256 || R == 512);
  if (!tc && R > 32 * kFAcc) return memra::kUnsupportedGeometry;  // R > 1024
  int sms = 0;
  MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMultiProcessorCount, &sms));

  // Dense bf16 at H = 64, R = 512 with 16-byte aligned q_lat / o_lat: the wgmma arm when the
  // context's options select it (docs/options.md: the arms at the two bench shapes). Splits
  // from the same cost model in units of its tiles (the q read, 64 x 512 f32 = 128 KiB, is
  // 128 / tile_rows tiles); B = 64, L = 4096: 2 splits; B = 8, L = 32768: 16.
  const int variant = ctx->options.mla_decode_variant;
  const bool aligned = reinterpret_cast<uintptr_t>(q_lat) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(o_lat) % 16 == 0;
  if (variant != 0 && !gather && cache_dtype == 1 && H == 64 && R == 512 && aligned) {
    const int tr = memra::cuda::mla_decode_sm90_tile_rows(variant);
    const int64_t wtiles = (static_cast<int64_t>(max_t_kv) + tr - 1) / tr;
    const double ovh = 128.0 / tr;
    int ns = choose_nsplit(B, wtiles, sms, 1, ovh, ovh);
    ns = std::min(ns, memra::cuda::mla_decode_sm90_max_splits());
    const int64_t chunk = (wtiles + ns - 1) / ns * tr;
    if (chunk <= INT_MAX) {
      ns = static_cast<int>((max_t_kv + chunk - 1) / chunk);
      const int rc = memra::cuda::mla_decode_sm90(ctx, variant, q_lat, caches, t_kv, B, max_t_kv,
                                                  static_cast<int>(chunk), ns, scale, o_lat);
      if (rc != memra::kUnsupportedGeometry) return rc;
    }
  }

  DecodeArgs a{};
  a.q_lat = q_lat;
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
    // The softmax sums are split over 8 / MT
    // row groups, so the two differ in the last bits (both within the tests' CPU tolerance).
    mt = H > 32 && B >= 32 ? 4 : 2;
    if (const int want = ctx->options.mla_tc_mt; want == 2 || want == 4) mt = H > 32 ? want : 2;
    groups = static_cast<int>(ceil_div(H, 16 * mt));
    const double ovh = 16.0 * mt / 32.0;  // HB x R f32 = HB / 32 tiles of 64 bf16 rows
    a.nsplit = choose_nsplit(static_cast<int64_t>(B) * groups, tiles, sms, 1, ovh, ovh);
    int optin = 0;
    MEMRA_CUDA_RETURN_IF(smem_optin(ctx, &optin));
    if (tc_smem_bytes(mt, R) > static_cast<size_t>(optin)) return memra::kUnsupportedGeometry;
  } else {
    groups = static_cast<int>(ceil_div(H, kFHeads));
    f32_smem = f32_smem_bytes(R);
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
    MEMRA_CUDA_RETURN_IF(launch_tc_any(ctx, mt, a, groups));
  } else if (cache_dtype == 0) {
    MEMRA_CUDA_RETURN_IF(launch_f32<float>(ctx, a, groups, f32_smem));
  } else {
    MEMRA_CUDA_RETURN_IF(launch_f32<__nv_bfloat16>(ctx, a, groups, f32_smem));
  }
  if (a.nsplit > 1) {
    const dim3 grid(static_cast<unsigned>(H), static_cast<unsigned>(B));
    const size_t wbytes = sizeof(float) * (a.nsplit + 4);  // + 4: as mla.cu's attn_combine
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

extern "C" {

int memra_cuda_mla_attn_decode(MemraCudaCtx* ctx, const float* q_lat, const void* const* caches,
                               int cache_dtype, const int32_t* t_kv, const int32_t* idx,
                               int width, int B, int H, int R, int max_t_kv, float scale,
                               float* o_lat) {
  return attn_decode_impl(ctx, q_lat, caches, cache_dtype, t_kv, idx, nullptr, nullptr, width, B,
                          H, R, max_t_kv, scale, o_lat);
}

int memra_cuda_mla_attn_decode_listed(MemraCudaCtx* ctx, const float* q_lat,
                                      const void* const* caches, int cache_dtype,
                                      const int32_t* t_kv, const int32_t* list, const int* counts,
                                      int width, int B, int H, int R, int max_t_kv, float scale,
                                      float* o_lat) {
  if (!list) return memra::kContractMissing;
  return attn_decode_impl(ctx, q_lat, caches, cache_dtype, t_kv, nullptr, list, counts, width, B,
                          H, R, max_t_kv, scale, o_lat);
}

int memra_cuda_mla_latent_append_decode(MemraCudaCtx* ctx, const float* rows, int B, int W,
                                        void* const* caches, int cache_dtype, const int32_t* pos) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (B < 0 || W < 1) return memra::kContractValue;
  if (cache_dtype != 0 && cache_dtype != 1) return memra::kContractDType;
  if (B == 0) return memra::kOk;
  if (!rows || !caches || !pos) return memra::kContractMissing;
  // A thread a value up to 1024 (the latent row, 576, in one pass: with 256 threads each pass
  // waited for the previous one's store, three round trips in a row).
  const int threads = std::min(1024, ((W + 31) / 32) * 32);
  if (cache_dtype == 0) {
    memra::cuda::launch(ctx, true, append_decode_kernel<float>, dim3(B), dim3(threads), 0, rows, W,
        caches, pos);
  } else {
    memra::cuda::launch(ctx, true, append_decode_kernel<__nv_bfloat16>, dim3(B), dim3(threads), 0,
        rows, W, caches, pos);
  }
  return launch_status();
}

}  // extern "C"
