// The routed experts as grouped GEMMs on tensor cores (cuda_abi/moe.h `moe_forward` over bf16 /
// f16 weights, from KernelOptions::moe_grouped_min_t tokens on, KernelOptions::moe_tensor_cores).
// One design serves prefill (thousands of tokens, many pairs an expert) and batched decode inside
// a captured CUDA graph: the per-expert pair lists never leave the device, every grid is sized
// from host-known bounds and its surplus blocks return.
//
// Per chunk of up to kTcPairs (token, slot) pairs:
//   1. moe_group_kernel (cuda/moe_grouped.cu): the pairs listed per expert in ascending pair
//      index, and the experts that have any ("active", ascending id) with their ranges.
//   2. moe_tc_round_kernel: the chunk's x rows rounded to W once: xb [tn, D] (or into the
//      caller's xr [T, D], which the shared expert then reads: forward_tc).
//   3. moe_tc_kernel<GU = true>: block (M tile = up to BM consecutive entries of one active
//      expert's list, N tile = 64 intermediate rows): A = the entries' xb (or xr) rows
//      (gathered with cp.async), B = the expert's 64 gate and 64 up rows; mma.sync m16n8k16
//      (W x W -> f32); epilogue h = clamped_swiglu(g, u) rounded to W, at the entry's
//      position: hs [P, I].
//   4. moe_tc_kernel<GU = false>: (M tile, 128 rows of D): A = hs rows (contiguous), B = the
//      expert's down rows; writes the dot products o [pair index, D] f32.
//   5. moe_combine_kernel (cuda/moe_grouped.cu): y[t] = the ordered sum over the token's slots
//      (expert id, slot) of o * w, each product and sum rounded as the CPU's.
// Each expert's weights are read once per chunk, in tiles shared through L2 by the blocks of a
// raster group (kGroupM M tiles walk all N tiles together).
//
// Numerics. Products of two W values are exact in f32; every output's accumulation runs over k
// in ascending 16-wide steps (the MMA's own order inside a step) whatever the tile shape, the
// chunking or the other rows, so a token's bytes do not depend on the batch it rides in. Against
// cpu::moe_forward with x rounded to W only the rounding of h to W (the down GEMM's operand) and
// the summation order differ.
#include <cstdint>

#include "common.cuh"
#include "mma_bf16.cuh"
#include "moe_common.cuh"
#include "swiglu.cuh"

using memra::cuda::aligned16;
using memra::cuda::ceil_div;
using memra::cuda::clamped_swiglu;
using memra::cuda::cp_async_16;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::from_f32;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::smem_u32;
using memra::cuda::status_of;

namespace {

using memra::cuda::ldsm_x4;

constexpr int kTcThreads = 256;  // 8 warps
constexpr int kBK = 64;          // k per stage: rows of 128 bytes, 8 chunks of 16 bytes
constexpr int kBNE = 128;        // B rows a block (GU: 64 gate + 64 up rows; down: 128 rows)
constexpr int kGroupM = 8;       // M tiles a raster group
// Pairs a chunk: bounds the scratch (hs: P x I, o: P x D f32) while a chunk still holds enough
// pairs an expert to keep the large tiles busy (a few hundred at 32 experts, top 8).
constexpr int kTcPairs = 16384;

// Tile shapes. BM rows (an expert's list entries) x kBNE B rows, WM x WN warps, STAGES cp.async
// stages. Small: few pairs an expert (batched decode) streams the weights with 16-row tiles;
// large: prefill, 128 x 128 tiles (the shape vLLM's fused_moe tunes to on H100 / H200 at large M).
template <int BM_, int WM_, int STAGES_>
struct TcCfg {
  static constexpr int BM = BM_, WM = WM_, WN = 8 / WM_, STAGES = STAGES_;
  static constexpr int MT = BM / WM / 16;   // m16 tiles a warp
  static constexpr int NT = kBNE / WN / 8;  // n8 tiles a warp (GU: the first half gate)
  static constexpr int JR = (BM + kBNE + 31) / 32;  // stage rows a thread copies (32 rows a pass)
  static constexpr size_t smem = static_cast<size_t>(STAGES) * (BM + kBNE) * kBK * 2;
  static_assert(MT >= 1 && NT % 2 == 0, "tile shape");
};
using TcSmall = TcCfg<16, 1, 4>;
using TcLarge = TcCfg<128, 4, 3>;

// ---------------------------------------------------------------- PTX helpers

// d += a * b, m16n8k16, W inputs, f32 accumulators. Fragments (g = lane / 4, q = lane % 4):
// a0 (row g, k 2q..2q+1), a1 (row g+8), a2 (row g, k 2q+8..), a3 (row g+8, k 2q+8..);
// b0 (k 2q..2q+1, col g), b1 (k 2q+8.., col g); d0 d1 (row g, cols 2q, 2q+1), d2 d3 (row g+8).
template <typename W>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two adjacent outputs rounded to W (RNE), one 4-byte store.
__device__ __forceinline__ void store2(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store2(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

// ---------------------------------------------------------------- kernels

// x [n] f32 -> out [n] W (RNE); vec4: n % 4 == 0 and x 16-byte aligned. grid-stride.
template <typename W>
__global__ void moe_tc_round_kernel(const float* __restrict__ x, int64_t n, bool vec4,
                                    W* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec4) {
    for (int64_t q = i0; q < n / 4; q += stride) {
      const float4 v = reinterpret_cast<const float4*>(x)[q];
      W* o = out + 4 * q;
      o[0] = from_f32<W>(v.x);
      o[1] = from_f32<W>(v.y);
      o[2] = from_f32<W>(v.z);
      o[3] = from_f32<W>(v.w);
    }
  } else {
    for (int64_t i = i0; i < n; i += stride) out[i] = from_f32<W>(x[i]);
  }
}

template <typename W>
struct TcArgs {
  const W* a;  // GU: xb or the caller's xr [tn, K], entry q's row pairs[q] / top_k; down: hs [P, K]
  int top_k;                // the pair index's divisor (GU)
  int K;                    // GU: D; down: I (% 8 == 0)
  const int* n_active;      // moe_group_kernel's lists (moe_grouped.cu): the active experts' count,
  const int* active_e;      //   [S] their ids,
  const int* active_off;    //   [S + 1] their ranges of entries,
  const int* pairs;         //   [P] each entry's pair index p = t * top_k + j
  const W* w0;              // GU: gate [E, N, K]; down: down [E, N, K] (16-byte aligned)
  const W* w1;              // GU: up [E, N, K]; down: unused
  int N;                    // GU: I; down: D (% 8 == 0)
  int n_tiles;              // ceil(N / output columns a block)
  int m_tiles;              // the grid's M tiles: >= the M tiles of any routing of P pairs
  float limit;              // GU: the experts' swiglu limit
  W* h;                     // GU: hs [P, N], row = entry
  float* o;                 // down: o [P, N] f32, row = pair index
};

// grid (m_tiles * n_tiles); block kTcThreads; dynamic shared memory C::smem: STAGES x (A: BM x kBK,
// B: kBNE x kBK) W, each 128-byte row's 16-byte chunks XOR-swizzled by (row & 7), so the 8 rows an
// ldmatrix phase reads fall in distinct bank groups.
//
// Launched as a programmatic dependent (common.cuh), but the first stages' weight rows are
// issued before pdl_wait(): no kernel of the chain writes the weights, so their stream starts
// while the launch in front drains. The tile lookup before the wait reads moe_group_kernel's
// lists, complete by then: this kernel started, so every block of the launch in front (the round
// kernel, or the gate/up GEMM) triggered or returned; the round kernel's blocks all trigger after
// their wait, and the gate/up GEMM's block 0 (always a real tile) too, and such a wait returns
// only once the launch before (group kernel, round kernel) completed. The lists are read through
// L2 (__ldcg): an SM's L1 may still hold an earlier chunk's or layer's lines. The A rows (xb or xr
// from the round kernel, hs from the gate/up GEMM) and every global write come after the wait, and
// pdl_trigger() stays after it: the next launch's pre-wait reads rely on that. Without PDL the
// wait is a no-op and the stream orders everything.
template <typename W, typename C, bool GU>
__global__ void __launch_bounds__(kTcThreads) moe_tc_kernel(const TcArgs<W> a) {
  constexpr int BM = C::BM, MT = C::MT, NT = C::NT, STAGES = C::STAGES;
  constexpr int BN = GU ? kBNE / 2 : kBNE;  // output columns a block
  constexpr int kStage = (BM + kBNE) * kBK;  // elements a stage
  extern __shared__ __align__(128) unsigned char tc_smem[];
  W* const sm = reinterpret_cast<W*>(tc_smem);
  __shared__ int arow[BM];  // A row of each tile row; -1 past the expert's entries
  __shared__ int orow[BM];  // output row of each tile row
  __shared__ int tile[2];   // the active slot (-1: no tile) and its first entry

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Raster groups of kGroupM M tiles walk the N tiles together (consecutive blocks share A rows
  // and an expert's weight tiles in L2); the M tiles past the real count come last and return.
  const int per_group = kGroupM * a.n_tiles;
  const int first_m = static_cast<int>(blockIdx.x) / per_group * kGroupM;
  const int gsize = min(a.m_tiles - first_m, kGroupM);
  const int in_group = static_cast<int>(blockIdx.x) % per_group;
  const int m = first_m + in_group % gsize;
  const int n0 = in_group / gsize * BN;

  // M tile m -> (active slot, first entry): tiles are numbered slot by slot, ceil(entries / BM)
  // each; warp 0 scans the slots 32 at a time.
  if (warp == 0) {
    const int na = __ldcg(a.n_active);
    int base = 0, slot = -1, first = 0;
    for (int s0 = 0; s0 < na; s0 += 32) {
      const int s = s0 + lane;
      const int c = s < na ? (__ldcg(a.active_off + s + 1) - __ldcg(a.active_off + s) + BM - 1) / BM
                           : 0;
      int inc = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += v;
      }
      const int excl = base + inc - c;
      const unsigned hit = __ballot_sync(0xffffffffu, m >= excl && m < excl + c);
      if (hit) {
        const int src = __ffs(hit) - 1;
        slot = __shfl_sync(0xffffffffu, s, src);
        first = __ldcg(a.active_off + slot) + (m - __shfl_sync(0xffffffffu, excl, src)) * BM;
        break;
      }
      base += __shfl_sync(0xffffffffu, inc, 31);
    }
    if (lane == 0) {
      tile[0] = slot;
      tile[1] = first;
    }
  }
  __syncthreads();
  const int slot = tile[0];
  if (slot < 0) {  // past the real tiles: nothing to do
    // Still wait: the grid must not complete before the launch in front (a later kernel's wait
    // relies on that), and with every pair's id out of range (the ABI drops them) no block of
    // the grid has a tile.
    memra::cuda::pdl_wait();
    return;
  }
  const int e = __ldcg(a.active_e + slot);
  const int q0 = tile[1];
  const int q1 = min(q0 + BM, __ldcg(a.active_off + slot + 1));
  for (int r = threadIdx.x; r < BM; r += kTcThreads) {
    const int q = q0 + r;
    const bool ok = q < q1;
    const int p = ok ? __ldcg(a.pairs + q) : 0;
    arow[r] = ok ? (GU ? p / a.top_k : q) : -1;
    orow[r] = ok ? (GU ? q : p) : -1;
  }
  __syncthreads();

  // The stage rows this thread copies: rows tid / 8 + 32 j, chunk tid % 8 (one row of 128 bytes
  // per 8 threads: conflict-free stores). Rows < BM are A rows, the rest B rows (GU: gate rows
  // n0.., then up rows n0..). src null: a zero-filled row (past the entries or past N).
  const int cc = threadIdx.x & 7;
  const W* src[C::JR];
  int dst[C::JR];
#pragma unroll
  for (int j = 0; j < C::JR; ++j) {
    const int r = (threadIdx.x >> 3) + 32 * j;
    src[j] = nullptr;
    dst[j] = r * kBK + ((cc ^ (r & 7)) << 3);
    if (r < BM) {
      if (arow[r] >= 0) src[j] = a.a + static_cast<int64_t>(arow[r]) * a.K + cc * 8;
    } else if (r < BM + kBNE) {
      const int rb = r - BM;
      const int n = n0 + (GU ? rb % BN : rb);
      const W* w = (GU && rb >= BN) ? a.w1 : a.w0;
      if (n < a.N) src[j] = w + (static_cast<int64_t>(e) * a.N + n) * a.K + cc * 8;
    }
  }
  // Stage kt's A rows (with_a) and / or B rows (with_b) into buffer buf.
  auto load_stage = [&](int buf, int kt, bool with_a, bool with_b) {
    W* const st = sm + buf * kStage;
    const int k = kt * kBK;
    const bool kin = k + cc * 8 < a.K;  // K % 8 == 0: a chunk is whole or past K
#pragma unroll
    for (int j = 0; j < C::JR; ++j) {
      const int r = (threadIdx.x >> 3) + 32 * j;
      if (r < BM + kBNE && (r < BM ? with_a : with_b)) {
        const bool ok = src[j] != nullptr && kin;
        cp_async_16(st + dst[j], ok ? src[j] + k : a.w0, ok ? 16 : 0);
      }
    }
  };

  const int wm = warp / C::WN, wn = warp % C::WN;
  // B row of the warp's n8 tile j (GU: tiles < NT / 2 gate, the rest the same columns of up).
  auto brow = [&](int j) {
    if constexpr (GU) {
      return j < NT / 2 ? BM + wn * (NT / 2) * 8 + j * 8
                        : BM + BN + wn * (NT / 2) * 8 + (j - NT / 2) * 8;
    } else {
      return BM + wn * NT * 8 + j * 8;
    }
  };
  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;
    }
  }

  // Prologue: one group of stages 0..STAGES-2's B rows, issued before the wait, then one group
  // per stage of its A rows (empty past KT, so the counts hold for any KT). Counting groups from
  // 0, the B rows are group 0 and stage t's A rows (t < STAGES - 1) or whole stage (the loop's
  // loads) group t + 1; at step kt, STAGES + kt groups are committed and cp_async_wait<STAGES - 2>
  // leaves groups 0..kt + 1 landed: stage kt whole, no later stage waited for.
  const int KT = (a.K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s, false, true);
  }
  cp_async_commit();
  memra::cuda::pdl_wait();
  memra::cuda::pdl_trigger();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s, true, false);
    cp_async_commit();
  }
  const int sw = lane & 7;  // every ldmatrix row's (row & 7): row bases are multiples of 8
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1's buffer is free
    if (kt + STAGES - 1 < KT) {
      load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1, true, true);
    }
    cp_async_commit();
    const W* const st = sm + (kt % STAGES) * kStage;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[MT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int r = wm * (BM / C::WM) + i * 16 + (lane & 15);
        ldsm_x4(af[i], st + r * kBK + (((kk * 2 + (lane >> 4)) ^ sw) << 3));
      }
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        uint32_t bf[4];  // b0 b1 of tile j, then of tile j + 1
        const int q = lane >> 3;
        const int r = brow(j + (q >> 1)) + (lane & 7);
        ldsm_x4(bf, st + r * kBK + (((kk * 2 + (q & 1)) ^ sw) << 3));
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          mma16816<W>(acc[i][j], af[i], bf[0], bf[1]);
          mma16816<W>(acc[i][j + 1], af[i], bf[2], bf[3]);
        }
      }
    }
  }

  const int g = lane >> 2, qd = lane & 3;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int orw = orow[wm * (BM / C::WM) + i * 16 + g + hf * 8];
      if (orw < 0) continue;
      if constexpr (GU) {
#pragma unroll
        for (int j = 0; j < NT / 2; ++j) {
          const int n = n0 + wn * (NT / 2) * 8 + j * 8 + qd * 2;  // N % 8 == 0: n + 1 < N too
          if (n < a.N) {
            const float* gv = acc[i][j];
            const float* uv = acc[i][j + NT / 2];
            store2(a.h + static_cast<int64_t>(orw) * a.N + n,
                   clamped_swiglu(gv[2 * hf], uv[2 * hf], a.limit),
                   clamped_swiglu(gv[2 * hf + 1], uv[2 * hf + 1], a.limit));
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const int n = n0 + wn * NT * 8 + j * 8 + qd * 2;
          if (n < a.N) {
            *reinterpret_cast<float2*>(a.o + static_cast<int64_t>(orw) * a.N + n) =
                make_float2(acc[i][j][2 * hf], acc[i][j][2 * hf + 1]);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- host side

template <typename K>
int allow_smem(MemraCudaCtx* ctx, K* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return memra::kOk;
  int optin = 0;
  MEMRA_CUDA_RETURN_IF(status_of(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device)));
  if (bytes > static_cast<size_t>(optin)) return memra::kUnsupportedGeometry;
  return status_of(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
}

// The grid's M tiles for P entries over at most S active experts: sum ceil(n_s / BM) <=
// (P + S (BM - 1)) / BM.
int64_t m_tiles_bound(int64_t P, int64_t S, int BM) { return (P + S * (BM - 1)) / BM; }

template <typename W, typename C, bool GU>
int launch_tc(MemraCudaCtx* ctx, TcArgs<W> a, int64_t P, int64_t S) {
  constexpr int BN = GU ? kBNE / 2 : kBNE;
  a.n_tiles = static_cast<int>(ceil_div(a.N, BN));
  a.m_tiles = static_cast<int>(m_tiles_bound(P, S, C::BM));
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, moe_tc_kernel<W, C, GU>, C::smem));
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(a.m_tiles) * a.n_tiles));
  memra::cuda::launch(ctx, true, moe_tc_kernel<W, C, GU>, grid, dim3(kTcThreads), C::smem, a);
  return launch_status();
}

// Tokens a chunk.
int chunk_tokens(int T, int top_k) {
  const int t = kTcPairs / top_k;
  return t < 1 ? 1 : (T < t ? T : t);
}

// x [n] f32 -> out [n] W, one launch of the round kernel.
template <typename W>
int round_launch(MemraCudaCtx* ctx, const float* x, int64_t n, W* out) {
  const unsigned blocks = ceil_div(n / 4 > 0 ? n / 4 : 1, 256);
  memra::cuda::launch(ctx, true, moe_tc_round_kernel<W>,
      dim3(blocks < 65535u * 4 ? blocks : 65535u * 4), dim3(256), 0, x, n,
      aligned16(x) && n % 4 == 0, out);
  return launch_status();
}

template <typename W>
int launch_moe_tc(MemraCudaCtx* ctx, const float* x, W* xr, int T, int D,
                  const int32_t* topk_idx, const float* topk_w, int top_k, const void* gate_w,
                  const void* up_w, const void* down_w, int E, int I, float limit, float* y) {
  const int Tc = chunk_tokens(T, top_k);
  const int64_t Pc = static_cast<int64_t>(Tc) * top_k;
  const int64_t Sc = E < Pc ? E : Pc;
  const int warps = memra::cuda::moe::pair_group_warps(Pc, E);
  // meta: n_active, active_e[Sc], active_off[Sc + 1], pairs[Pc]; xb [Tc, D]; hs [Pc, I];
  // o [Pc, D] f32.
  Scratch meta(ctx, sizeof(int) * static_cast<size_t>(2 + 2 * Sc + Pc));
  MEMRA_CUDA_RETURN_IF(meta.status());
  Scratch xb(ctx, xr ? 0 : sizeof(W) * static_cast<size_t>(Tc) * D);  // xr given: none
  MEMRA_CUDA_RETURN_IF(xb.status());
  Scratch hs(ctx, sizeof(W) * static_cast<size_t>(Pc) * I);
  MEMRA_CUDA_RETURN_IF(hs.status());
  Scratch o(ctx, sizeof(float) * static_cast<size_t>(Pc) * D);
  MEMRA_CUDA_RETURN_IF(o.status());
  int* m = meta.as<int>();
  int* n_active = m;
  int* active_e = m + 1;
  int* active_off = m + 1 + Sc;
  int* pairs = m + 2 + 2 * Sc;
  for (int t0 = 0; t0 < T; t0 += Tc) {
    const int tn = T - t0 < Tc ? T - t0 : Tc;
    const int P = tn * top_k;
    const int64_t S = E < P ? E : P;
    const int32_t* idx = topk_idx + static_cast<int64_t>(t0) * top_k;
    MEMRA_CUDA_RETURN_IF(memra::cuda::moe::group_pairs(ctx, idx, P, E, warps, n_active, active_e,
                                                       active_off, pairs));
    // The chunk's x rows rounded: into the caller's xr when given (its rows t0.., kept for the
    // caller), else into scratch. Right after the group kernel, as the gate/up kernel's reads
    // before its wait require (the lists are complete once this launch's blocks have waited).
    W* const xc = xr ? xr + static_cast<int64_t>(t0) * D : xb.as<W>();
    MEMRA_CUDA_RETURN_IF(round_launch<W>(ctx, x + static_cast<int64_t>(t0) * D,
                                         static_cast<int64_t>(tn) * D, xc));
    TcArgs<W> gu{};
    gu.a = xc;
    gu.top_k = top_k;
    gu.K = D;
    gu.n_active = n_active;
    gu.active_e = active_e;
    gu.active_off = active_off;
    gu.pairs = pairs;
    gu.w0 = static_cast<const W*>(gate_w);
    gu.w1 = static_cast<const W*>(up_w);
    gu.N = I;
    gu.limit = limit;
    gu.h = hs.as<W>();
    TcArgs<W> dn = gu;
    dn.a = hs.as<W>();
    dn.K = I;
    dn.w0 = static_cast<const W*>(down_w);
    dn.w1 = nullptr;
    dn.N = D;
    dn.h = nullptr;
    dn.o = o.as<float>();
    // Speed only (every tile shape gives the same bytes): 128-row tiles once the experts average
    // 64 pairs, else 16-row tiles that stream the weights.
    if (P >= 64 * S) {
      MEMRA_CUDA_RETURN_IF((launch_tc<W, TcLarge, true>(ctx, gu, P, S)));
      MEMRA_CUDA_RETURN_IF((launch_tc<W, TcLarge, false>(ctx, dn, P, S)));
    } else {
      MEMRA_CUDA_RETURN_IF((launch_tc<W, TcSmall, true>(ctx, gu, P, S)));
      MEMRA_CUDA_RETURN_IF((launch_tc<W, TcSmall, false>(ctx, dn, P, S)));
    }
    MEMRA_CUDA_RETURN_IF(memra::cuda::moe::combine(ctx, o.as<float>(), idx,
                                                   topk_w + static_cast<int64_t>(t0) * top_k, tn,
                                                   top_k, E, D, y + static_cast<int64_t>(t0) * D));
  }
  return memra::kOk;
}

}  // namespace

namespace memra::cuda::moe {

bool tc_fits(const MemraCudaCtx* ctx, int T, int D, int top_k, int w_dtype, const void* gate_w,
             const void* up_w, const void* down_w, int E, int I) {
  if (!ctx->options.moe_tensor_cores || (w_dtype != 1 && w_dtype != 2)) return false;
  if (D % 8 != 0 || I % 8 != 0 || !aligned16(gate_w) || !aligned16(up_w) || !aligned16(down_w)) {
    return false;
  }
  const int64_t Pc = static_cast<int64_t>(chunk_tokens(T, top_k)) * top_k;
  const int64_t S = E < Pc ? E : Pc;
  const int64_t n_tiles = ceil_div(D > I ? D : I, kBNE / 2);
  return pair_group_warps(Pc, E) > 0 &&
         m_tiles_bound(Pc, S, TcSmall::BM) * n_tiles <= 0x7fffffffLL;
}

int forward_tc(MemraCudaCtx* ctx, const float* x, void* xr, int T, int D,
               const int32_t* topk_idx, const float* topk_w, int top_k, const void* gate_w,
               const void* up_w, const void* down_w, int w_dtype, int E, int I, float limit,
               float* y) {
  if (w_dtype == 1) {
    return launch_moe_tc<__nv_bfloat16>(ctx, x, static_cast<__nv_bfloat16*>(xr), T, D, topk_idx,
                                        topk_w, top_k, gate_w, up_w, down_w, E, I, limit, y);
  }
  return launch_moe_tc<__half>(ctx, x, static_cast<__half*>(xr), T, D, topk_idx, topk_w, top_k,
                               gate_w, up_w, down_w, E, I, limit, y);
}

}  // namespace memra::cuda::moe
