// The full attention's prefill on tensor cores (memra_cuda_attention's direct form over a bf16
// cache, KernelOptions::attn_prefill_tensor_cores; the entry and the f32 CUDA-core kernel, which
// f32 caches and every other form keep, are in cuda/attention.cu). FlashAttention-2's forward:
// mma.sync m16n8k16 bf16 -> f32, online softmax in registers, causal.
//
// Items: the G = Hq / Hkv query heads of a K/V head are packed into the M dimension (FlashInfer's
// GQA packing): item i of K/V head g is query t = i / G, head g * G + i % G, so the T * G items of
// one K/V head share every K/V tile a block stages (a short prefill fills the tile with heads, not
// padding). A block owns 64 consecutive items of one K/V head (grid: item tiles x Hkv, the tiles
// with the most cache rows launched first) and walks the cache rows [0, kv_end) in tiles of 64,
// kv_end being the causal limit of its last query; item rows see the rows < pos0 + t + 1 (rows
// past the block's last item are padding: they see what the last query sees, nothing is written
// for them). Tiles below the first item's limit need no mask; the rest mask per element.
//
// Warps: 4, each owning 16 item rows over the whole head width (FlashAttention-2's sm90 hdim-256
// forward, 64 x 64 tiles with 4 warps: about 100 KB of shared memory at hd 256, two blocks an
// SM). Per warp and tile: S[16 x 64] = Q K^T (per 16-wide k-step one ldmatrix.x4 of Q, 4 of K,
// 8 mma), the scores scaled by scale * log2(e) in f32, the running max and sum updated (exp2f),
// P rounded to bf16 and kept in registers as the A fragments of O += P V (the accumulator layout
// of S is the A layout of P: no shared-memory round trip), V through ldmatrix.trans. Splitting
// the head width over warps instead would halve O's registers but needs P and the row maxima
// exchanged through shared memory with two more barriers a tile; one warp per 16 rows keeps the
// warps independent between the tile loads. Registers at hd 256: O 16 x 256 f32 is 128 a
// thread, S 32, P 16 (the __launch_bounds__ cap of 255 at two 128-thread blocks an SM).
// Pipeline (FlashAttention-2's, one K and one V buffer): K of tile j + 1 is fetched by cp.async
// while the softmax and P V of tile j run, V of tile j + 1 while Q K^T of tile j + 1 runs; two full
// K/V stages would need 169 KB at hd 256, one block an SM.
// Shared memory: Q, K and V tiles of 64 rows, bf16, rows padded by 16 bytes (the 8 row addresses
// of an ldmatrix phase fall in distinct bank groups): 384 * (HD + 8) bytes (101,376 at HD 256).
// Head widths: hd a multiple of 8 (whole 16-byte chunks), run by the HD = 64 / 128 / 256
// instantiation at or above it; the columns past hd are zero in Q, K and V (zero-filled copies),
// so they add nothing, and are not written.
// Precision: q rounded to bf16 (the cache is bf16 already) for Q K^T; p rounded to bf16 for P V,
// the row sums taken over the rounded p (o = sum p~ v / sum p~, a convex combination up to f32
// accumulation); scores, the softmax statistics and both accumulations f32. Then o / l times
// sigmoid(gate) as the f32 kernel does.
#include <cstdint>
#include <cstring>

#include "common.cuh"
#include "mma_bf16.cuh"

using memra::cuda::ceil_div;
using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::launch_status;
using memra::cuda::smem_u32;

namespace {

using memra::cuda::ldsm_x4;
using memra::cuda::ldsm_x4_trans;
using memra::cuda::mma_bf16;
using memra::cuda::pack_bf16x2;
using memra::cuda::bf16x2_sum;

using bf16 = __nv_bfloat16;

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 128;  // 4 warps of 16 item rows
constexpr int kM = 64;         // item rows a block
constexpr int kN = 64;         // cache rows a tile
constexpr float kLog2e = 1.4426950408889634f;

template <int HD>
struct Tile {
  static constexpr int S = HD + 8;      // row stride in bf16 (+16 bytes)
  static constexpr int CPR = HD / 8;    // 16-byte chunks a row
  static constexpr int NTO = HD / 8;    // O n-tiles a warp
  static constexpr size_t q_off = 0;
  static constexpr size_t k_off = q_off + sizeof(bf16) * kM * S;
  static constexpr size_t v_off = k_off + sizeof(bf16) * kN * S;
  static constexpr size_t bytes = v_off + sizeof(bf16) * kN * S;
  static_assert(HD % 16 == 0 && HD <= 256, "whole k-steps of 16");
  static_assert(k_off % 16 == 0 && v_off % 16 == 0, "16-byte aligned tiles");
};

struct TcArgs {
  MemraAttnParams p;
  int G;        // query heads a K/V head
  int n_items;  // T * G items a K/V head
};

// ---------------------------------------------------------------- PTX helpers

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// ---------------------------------------------------------------- kernel

// Block (item tile, K/V head g). See the file comment.
template <int HD>
__global__ void __launch_bounds__(kThreads, 2) attention_tc_kernel(TcArgs a) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  using L = Tile<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem + L::q_off);
  bf16* ks = reinterpret_cast<bf16*>(smem + L::k_off);
  bf16* vs = reinterpret_cast<bf16*>(smem + L::v_off);
  const MemraAttnParams& p = a.p;
  const int hd = p.hd, G = a.G, g = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // Items [m0, m0 + kM) (the last tile first: it walks the most rows), queries [t_first, t_last].
  const int m0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * kM;
  const int t_first = m0 / G, t_last = (min(m0 + kM, a.n_items) - 1) / G;
  const int kv_end = p.pos0 + t_last + 1;     // the block reads the cache rows [0, kv_end)
  const int mask_from = p.pos0 + t_first + 1;  // every item sees the rows below this
  const int n_tiles = (kv_end + kN - 1) / kN;
  const int64_t stride = int64_t(p.Hkv) * hd;  // elements between cache rows
  const bf16* kc = static_cast<const bf16*>(p.k_cache) + int64_t(g) * hd;
  const bf16* vc = static_cast<const bf16*>(p.v_cache) + int64_t(g) * hd;

  // Rows [base, base + kN) of a plane into a tile, 16 bytes a cp.async; rows at or past kv_end
  // and columns past hd zero-filled, never read (a row past the prefill may hold any bytes).
  auto load_rows = [&](const bf16* src, bf16* dst, int base) {
#pragma unroll 4
    for (int c = tid; c < kN * L::CPR; c += kThreads) {
      const int r = c / L::CPR, k = c - r * L::CPR;
      const bool valid = base + r < kv_end && k * 8 < hd;
      const bf16* from = valid ? src + int64_t(base + r) * stride + k * 8 : src;
      cp_async_16(dst + r * L::S + k * 8, from, valid ? 16 : 0);
    }
    cp_async_commit();
  };
  load_rows(kc, ks, 0);
  load_rows(vc, vs, 0);

  // Q rounded to bf16: item rows past n_items and columns past hd are zeros.
#pragma unroll 4
  for (int c = tid; c < kM * (HD / 2); c += kThreads) {
    const int r = c / (HD / 2), d = 2 * (c - r * (HD / 2));
    const int i = m0 + r;
    float x0 = 0.0f, x1 = 0.0f;
    if (i < a.n_items && d < hd) {  // hd even: the pair is whole
      const float* src = p.q + (int64_t(i / G) * p.Hq + g * G + i % G) * hd + d;
      x0 = __ldg(src);
      x1 = __ldg(src + 1);
    }
    *reinterpret_cast<uint32_t*>(qs + r * L::S + d) = pack_bf16x2(x0, x1);
  }

  // Fragment addressing (see mma_bf16): A / transposed-B lanes: row (lane & 7) + 8 * bit 3,
  // column 8 * bit 4; non-transposed B lanes: row (lane & 7) + 8 * bit 4, column 8 * bit 3.
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
  const int b_row = (lane & 7) + ((lane >> 4) & 1) * 8, b_col = ((lane >> 3) & 1) * 8;
  const int gr = lane >> 2, tq = lane & 3;
  // This thread's item rows warp * 16 + gr (+ 8): the rows they see, [0, lim).
  int lim[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int item = m0 + warp * 16 + gr + 8 * i;
    lim[i] = p.pos0 + min(item / G, t_last) + 1;
  }
  const float sl2 = p.scale * kLog2e;

  float o[L::NTO][4];
#pragma unroll
  for (int nt = 0; nt < L::NTO; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};  // this thread's columns' share of the rows' sums

  const bf16* qa = qs + (warp * 16 + a_row) * L::S + a_col;
  const bf16* kb = ks + b_row * L::S + b_col;
  const bf16* vb = vs + a_row * L::S + a_col;
  for (int j = 0; j < n_tiles; ++j) {
    const int base = j * kN;
    cp_async_wait<1>();  // K of tile j has landed (V of tile j may be in flight)
    __syncthreads();     // ... for every thread; Q too, the first time

    // ---- S = Q K^T: 16 item rows x 64 cache rows a warp
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t af[4];
      ldsm_x4(af, qa + kk * 16);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bf[4];
        ldsm_x4(bf, kb + np * 16 * L::S + kk * 16);
        mma_bf16(s[2 * np], af, bf[0], bf[1]);
        mma_bf16(s[2 * np + 1], af, bf[2], bf[3]);
      }
    }
    __syncthreads();  // every warp has read K of tile j: its buffer takes tile j + 1
    if (j + 1 < n_tiles) load_rows(kc, ks, base + kN);

    // ---- online softmax in the log2 domain. The row maxima are finite from tile 0 on: its
    // row 0 is seen by every item row.
    const bool masked = base + kN > mask_from;
    float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[nt][e] * sl2;
        if (masked && base + nt * 8 + 2 * tq + (e & 1) >= lim[e >> 1]) v = -INFINITY;
        s[nt][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFull, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFull, mx[i], 2));
      alpha[i] = exp2f(m_run[i] - mx[i]);  // 0 on tile 0 (m_run = -inf)
      m_run[i] = mx[i];
      l_run[i] *= alpha[i];
    }
#pragma unroll
    for (int nt = 0; nt < L::NTO; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }
    // P rounded to bf16, packed straight into the A fragments of P V: k-step kk (cache rows
    // 16 kk ..) takes S's n-tiles 2 kk (a0 row gr, a1 row gr + 8) and 2 kk + 1 (a2, a3).
    uint32_t pf[4][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t u = pack_bf16x2(exp2f(s[nt][2 * i] - mx[i]),  // masked: exp2(-inf) = 0
                                       exp2f(s[nt][2 * i + 1] - mx[i]));
        l_run[i] += bf16x2_sum(u);
        pf[nt >> 1][(nt & 1) * 2 + i] = u;
      }
    }

    // ---- O += P V over this tile's 64 rows
    if (j + 1 < n_tiles) {
      cp_async_wait<1>();  // V of tile j has landed (K of tile j + 1 may be in flight)
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < L::NTO / 2; ++np) {
        uint32_t bf[4];
        ldsm_x4_trans(bf, vb + kk * 16 * L::S + np * 16);
        mma_bf16(o[2 * np], pf[kk], bf[0], bf[1]);
        mma_bf16(o[2 * np + 1], pf[kk], bf[2], bf[3]);
      }
    }
    __syncthreads();  // every warp has read V of tile j: its buffer takes tile j + 1
    if (j + 1 < n_tiles) load_rows(vc, vs, base + kN);
  }

  // ---- epilogue: the rows' sums over the quad; o / l times sigmoid(gate) for the real items
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = l_run[i];
    l += __shfl_xor_sync(kFull, l, 1);
    l += __shfl_xor_sync(kFull, l, 2);  // >= 1: the row's maximum contributes exp2(0)
    const int item = m0 + warp * 16 + gr + 8 * i;
    if (item >= a.n_items) continue;
    const int64_t row = (int64_t(item / G) * p.Hq + g * G + item % G) * hd;
    const float inv = 1.0f / l;
#pragma unroll
    for (int nt = 0; nt < L::NTO; ++nt) {
      const int d = nt * 8 + 2 * tq;
      if (d >= hd) continue;  // hd a multiple of 8: the pair is whole
      float y0 = o[nt][2 * i] * inv, y1 = o[nt][2 * i + 1] * inv;
      if (p.gate) {
        y0 *= sigmoid(p.gate[row + d]);
        y1 *= sigmoid(p.gate[row + d + 1]);
      }
      p.o[row + d] = y0;
      p.o[row + d + 1] = y1;
    }
  }
}

template <int HD>
int launch_tc(MemraCudaCtx* ctx, const TcArgs& a) {
  const size_t bytes = Tile<HD>::bytes;
  if (bytes > 48 * 1024) {
    int optin = 0;
    MEMRA_CUDA_RETURN_IF(memra::cuda::status_of(
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device)));
    if (bytes > static_cast<size_t>(optin)) return memra::kUnsupportedGeometry;
    MEMRA_CUDA_RETURN_IF(memra::cuda::status_of(cudaFuncSetAttribute(
        attention_tc_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(bytes))));
  }
  const dim3 grid(ceil_div(a.n_items, kM), static_cast<unsigned>(a.p.Hkv));
  memra::cuda::launch(ctx, true, attention_tc_kernel<HD>, grid, dim3(kThreads), bytes, a);
  return launch_status();
}

}  // namespace

namespace memra::cuda::attn {

// Whether memra_cuda_attention runs `p` (checked, T > 0) here: the option, the direct form of
// a prefill (T > 1) over a bf16 cache, whole 16-byte chunks of 16-byte aligned planes, and a
// grid in range.
bool prefill_tc_fits(const MemraCudaCtx* ctx, const MemraAttnParams& p) {
  return ctx->options.attn_prefill_tensor_cores && !p.slots && p.cache_dtype == 1 && p.T > 1 &&
         p.hd % 8 == 0 && aligned16(p.k_cache) && aligned16(p.v_cache) && p.Hkv <= 65535 &&
         int64_t(p.T) * (p.Hq / p.Hkv) <= (int64_t(1) << 30);
}

int prefill_tc(MemraCudaCtx* ctx, const MemraAttnParams& p) {
  TcArgs a = {};
  a.p = p;
  a.G = p.Hq / p.Hkv;
  a.n_items = p.T * a.G;
  if (p.hd <= 64) return launch_tc<64>(ctx, a);
  if (p.hd <= 128) return launch_tc<128>(ctx, a);
  return launch_tc<256>(ctx, a);
}

}  // namespace memra::cuda::attn
