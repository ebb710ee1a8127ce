// KDA area, the decode step of the delta-rule scan (T == 1) (cpp/include/memra/cuda_abi/kda.h):
// the TABLES / STRIDED planes (kda_scan at T == 1, called from cuda/kda_scan.cu after its checks)
// and the SLOTS form with the gates and the gated norm fused (KdaLayer's decode; its checks are
// here, scan_decode_slots).
//
// A part of a block owns some columns of one head's plane, all 128 rows; two part shapes
// (docs/kda.md "The decode step of the scan against a copy" has the runs):
// - halves (TABLES / STRIDED from kHalfWaves full waves up): 8 warps, 64 columns, each warp
//   instruction 2 rows x 256 contiguous bytes, default-policy loads. A copy in this lane layout
//   streams closer to cudaMemcpy than one in the quarters' layout, and the step is faster at
//   B >= 64. A block is one part: B * H * 2 blocks of 256 threads, 4 an SM.
// - quarters: 4 warps, 32 columns (the tiling of fla's fused_recurrent kernel), each warp
//   instruction 4 rows x 128 contiguous bytes, loaded with ld.global.L2::256B (the L2 fetches
//   the aligned pair of lines, the neighbouring part's half). TABLES / STRIDED below kHalfWaves
//   waves of halves (B * H * 4 blocks of 128 threads, 8 an SM: twice the blocks, smaller, reach
//   more SMs below one wave and even out the last wave's tail up to about three) and SLOTS: a
//   block is a whole head, 4 parts (B * H blocks of 512 threads, 2 an SM), each part
//   synchronising on its own named barrier, and o goes through the gated norm over the head's
//   row at the end (KdaLayer's decode in halves generated slower at B = 1).
// Either way a lane holds 8 float4 of state (32 floats), 64 registers, so 32 warps fit an SM (128
// KB of state in flight an SM); every state load of a lane is issued before anything waits on
// memory (with state.early, before the wait for the launch in front); the dk-long column sums
// cross the part's warps through shared memory: two part barriers, one before the rank-1 update
// (d) and one before o is written.
//
// Bits: every element sees scan_kernel's operations at T = 1 in the fixed order of
// cuda/kda_scan.cu (chains e of rows 16 g + 4 m + e summed over m ascending, the group partial
// ((e0 + e1) + (e2 + e3)), then ((P0 + P1) + (P2 + P3)) + ((P4 + P5) + (P6 + P7)) over the
// groups), the gates through gate_value / beta_value and the norm through gated_norm_short_row,
// so a step's bytes equal scan_kernel's at T = 1 (tests/test_cuda_kda_decode.py).
#include <cstdint>

#include "common.cuh"
#include "kda_common.cuh"
#include "row_group.cuh"

using memra::cuda::launch_status;
namespace rowsum = memra::cuda::rowsum;

namespace {

// A part's shape. lane = x * kQuads + cq: cq the column quad (columns j0 .. j0 + 3 with j0 =
// kCols part + 4 cq). The lane's rows are kWarpRows warp + x + kStepI i + 4 m (i < 2, m < 4):
// halves: warp w owns group w, x = r2 < 2, the lane's chains e = 2 i + r2 of that group;
// quarters: warp w owns groups 2 w + i, x = e < 4, the lane's chain e of both groups.
template <bool HALF>
struct PartShape {
  static constexpr int kCols = HALF ? 64 : 32;       // columns a part
  static constexpr int kWarps = HALF ? 8 : 4;        // warps a part
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kQuads = kCols / 4;           // lanes across the part's row segment
  static constexpr int kHeadParts = kScanDv / kCols;
  static constexpr int kWarpRows = HALF ? 16 : 32;   // rows a warp
  static constexpr int kStepI = HALF ? 2 : 16;       // rows from a lane's i = 0 to i = 1
  static_assert(kWarps * kWarpRows == kScanDk, "the warps' rows cover dk");
  static_assert(kHeadParts * kCols == kScanDv, "the parts of a head cover dv");
};
constexpr int kChainLen = 4;  // rows of a chain in a group (m)
static_assert(PartShape<true>::kThreads >= kScanDk && PartShape<false>::kThreads == kScanDk,
              "a vector element a thread of the first part");
static_assert(PartShape<false>::kHeadParts * PartShape<false>::kThreads == 4 * kScanDv,
              "NORM: the gate and w rows, a thread each of the last two parts");

// A block: one part, or (NORM, quarters only) a whole head.
template <bool NORM, bool HALF>
constexpr int line_threads() {
  return PartShape<HALF>::kThreads * (NORM ? PartShape<HALF>::kHeadParts : 1);
}
// At most 64 registers: 32 warps an SM in any shape.
template <bool NORM, bool HALF>
constexpr int line_min_blocks() { return 1024 / line_threads<NORM, HALF>(); }

// Full waves of halves (line_min_blocks an SM on every SM) from which the op's T = 1 step takes
// the halves: below about three the quarters' tail evens out over the SMs and wins.
constexpr int kHalfWaves = 3;

// A lane's float4 of state. Halves: the default policy (a half warp reads a 256-byte row
// segment whole). Quarters: the L2::256B prefetch size, whose other line the neighbouring part
// reads at about the same time; the streaming policy (ld.global.cs) it replaced left the kernel
// well short of a copy (benchmarks/kda_decode_forms.cu times the policies and layouts). In place
// (sin == sout) each element is loaded and stored by the same lane, the store's value computed
// from the load's, so the asm needs no memory clobber.
template <bool HALF>
__device__ __forceinline__ float4 ld_state(const float* p) {
  float4 x;
  if constexpr (HALF) {
    asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
                 : "l"(p));
  }
  return x;
}

// The threads of a part: the whole block, or (NORM) named barrier 1 + part (immediate ids, so
// ptxas reserves 5 barriers, not all 16).
template <bool NORM>
__device__ __forceinline__ void part_sync(int part) {
  if constexpr (NORM) {
    static_assert(PartShape<false>::kHeadParts == 4 && PartShape<false>::kThreads == 128,
                  "the barrier immediates below");
    switch (part) {
      case 0: asm volatile("bar.sync 1, 128;\n" ::: "memory"); break;
      case 1: asm volatile("bar.sync 2, 128;\n" ::: "memory"); break;
      case 2: asm volatile("bar.sync 3, 128;\n" ::: "memory"); break;
      default: asm volatile("bar.sync 4, 128;\n" ::: "memory"); break;
    }
  } else {
    __syncthreads();
  }
}

// A group's chain partial of one column from the lane's chain sum x: halves, the pair
// (e 2i + e 2i+1) by a shuffle across the half warps; quarters, the group partial ((e0 + e1) +
// (e2 + e3)) by two shuffles (lane bits 3..4 are e). fadd_rn commutes, so every lane of a sum
// holds the same bits.
template <bool HALF>
__device__ __forceinline__ float chain_partial(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, HALF ? 16 : 8));
  if constexpr (!HALF) x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 16));
  return x;
}

// The warp's partial W = P[i = 0] + P[i = 1] of the lane's 4 columns into red[warp] (lanes x ==
// 0): halves, the group partial (e0 + e1) + (e2 + e3); quarters, the warp's two groups (P_2w +
// P_2w+1).
template <bool HALF>
__device__ __forceinline__ void warp_partial(const float (&P)[4][2],
                                             float (*red)[PartShape<HALF>::kCols], int warp,
                                             int x, int cq) {
  if (x == 0) {
    *reinterpret_cast<float4*>(&red[warp][4 * cq]) =
        make_float4(__fadd_rn(P[0][0], P[0][1]), __fadd_rn(P[1][0], P[1][1]),
                    __fadd_rn(P[2][0], P[2][1]), __fadd_rn(P[3][0], P[3][1]));
  }
}

// The column sums of quad cq from the part's warp partials W: halves ((W0 + W1) + (W2 + W3)) +
// ((W4 + W5) + (W6 + W7)) over the 8 groups, quarters (W0 + W1) + (W2 + W3) over the warps'
// group pairs; either is the fixed order's tree over the 8 groups.
template <bool HALF>
__device__ __forceinline__ float4 column_sums(const float (*red)[PartShape<HALF>::kCols], int cq) {
  constexpr int kW = PartShape<HALF>::kWarps;
  float4 W[kW];
#pragma unroll
  for (int w = 0; w < kW; ++w) W[w] = *reinterpret_cast<const float4*>(&red[w][4 * cq]);
  auto tree = [&](auto get) {
    float a = __fadd_rn(__fadd_rn(get(W[0]), get(W[1])), __fadd_rn(get(W[2]), get(W[3])));
    if constexpr (kW == 8) {
      a = __fadd_rn(a, __fadd_rn(__fadd_rn(get(W[4]), get(W[5])), __fadd_rn(get(W[6]), get(W[7]))));
    }
    return a;
  };
  return make_float4(tree([](float4 f) { return f.x; }), tree([](float4 f) { return f.y; }),
                     tree([](float4 f) { return f.z; }), tree([](float4 f) { return f.w; }));
}

// q, k, g [B, 1, H, dk]; v, o [B, 1, H, dv]; beta [B, 1, H]; state planes [H, dk, dv] through
// RowPlanes. TABLES / STRIDED (!RAW, !NORM): grid B * H * (2 or 4), block = (b, h, column half
// or quarter). SLOTS (RAW and NORM, quarters): grid B * H, block = (b, h), part = warp / 4; g
// holds f and beta the logits (gate_value / beta_value as loaded); o through the gated norm
// (gate_o [B, H, dv], w [dv], eps).
template <bool RAW, bool NORM, bool HALF>
__global__ void __launch_bounds__(line_threads<NORM, HALF>(), line_min_blocks<NORM, HALF>())
    scan_decode_lines_kernel(const float* __restrict__ q, const float* __restrict__ k,
                             const float* __restrict__ v, const float* __restrict__ g,
                             const float* __restrict__ beta, int H, float scale, RowPlanes state,
                             void* __restrict__ o_out, RawGates raw, GatedNorm norm) {
  static_assert(!(NORM && HALF), "SLOTS in quarters: the named barriers of part_sync");
  using P = PartShape<HALF>;
  float* __restrict__ const o = static_cast<float*>(o_out);  // f32 unless NORM with norm.o_bf16
  constexpr int kParts = NORM ? P::kHeadParts : 1;    // parts a block
  constexpr int kCols = kParts * P::kCols;            // the block's columns
  // vec[0] = k, vec[1] = scale * q, vec[2] = exp(g), each [dk]; red[part][phase][warp][column]:
  // the warp's partial of each of its part's columns.
  __shared__ __align__(16) float vec[3][kScanDk];
  __shared__ __align__(16) float vcol[kCols];
  __shared__ __align__(16) float red[kParts][2][P::kWarps][P::kCols];
  __shared__ __align__(16) float orow[NORM ? kScanDv : 4];
  __shared__ float nrow[NORM ? 2 * kScanDv : 1];  // NORM: gate [dv] | w [dv]
  __shared__ float beta_s;

  const int t = threadIdx.x;
  const int tp = NORM ? t % P::kThreads : t;  // thread in the part
  const int lane = t & 31;
  const int warp = tp >> 5;  // warp in the part
  const int cq = lane % P::kQuads;
  const int x = lane / P::kQuads;
  const int part = NORM ? t / P::kThreads : static_cast<int>(blockIdx.x % P::kHeadParts);
  const int64_t bh = NORM ? static_cast<int64_t>(blockIdx.x) : blockIdx.x / P::kHeadParts;
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int jb = NORM ? 0 : part * P::kCols;  // the block's first column
  const int j0 = part * P::kCols + 4 * cq;    // the lane's first column
  const int r0 = P::kWarpRows * warp + x;     // the lane's row of (i, m) = r0 + kStepI i + 4 m
  const int64_t my_off = static_cast<int64_t>(h) * kScanDk * kScanDv +
                         static_cast<int64_t>(r0) * kScanDv + j0;

  // S[i][m][c] = state[h, r0 + kStepI i + 4 m, j0 + c]
  float S[2][kChainLen][4];
  float* sout = nullptr;
  auto load_state = [&] {
    const float* sin = nullptr;
    state.at(b, &sin, &sout);
    if (sin) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int m = 0; m < kChainLen; ++m) {
          const float4 f = ld_state<HALF>(
              sin + my_off + static_cast<int64_t>(P::kStepI * i + 4 * m) * kScanDv);
          S[i][m][0] = f.x;
          S[i][m][1] = f.y;
          S[i][m][2] = f.z;
          S[i][m][3] = f.w;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int m = 0; m < kChainLen; ++m) {
#pragma unroll
          for (int c = 0; c < 4; ++c) S[i][m][c] = 0.0f;
        }
      }
    }
  };
  if (state.early) load_state();
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  if (!state.early) load_state();

  // The step's vectors, one element a thread of the first 128 (gate_kernel's and scan_kernel's
  // per-element operations: the gates with gate_value, scale * q with __fmul_rn, expf(g)); v of
  // the block's columns; NORM: the head's gate row and the norm weight, one value a thread of
  // threads 256 .. 511.
  float kt = 0.0f, qt = 0.0f, gt = 0.0f, dtb = 0.0f, a_log = 0.0f, vt = 0.0f, bt = 0.0f;
  constexpr bool kVecAll = line_threads<NORM, HALF>() == kScanDk;  // every thread has an element
  if (kVecAll || t < kScanDk) {
    kt = __ldg(k + bh * kScanDk + t);
    qt = __ldg(q + bh * kScanDk + t);
    gt = __ldg(g + bh * kScanDk + t);
    if constexpr (RAW) {
      dtb = __ldg(raw.dt_bias + static_cast<int64_t>(h) * kScanDk + t);
      a_log = __ldg(raw.A_log + h);
    }
  }
  if (t < kCols) vt = __ldg(v + bh * kScanDv + jb + t);
  if (t == 0) bt = __ldg(beta + (RAW ? b * raw.beta_ld + h : bh));
  if constexpr (NORM) {
    const int n = t - 2 * kScanDk;  // gate [dv] then w [dv]
    if (n >= 0) nrow[n] = n < kScanDv ? __ldg(norm.gate + bh * kScanDv + n) : __ldg(norm.w + n - kScanDv);
  }
  if (kVecAll || t < kScanDk) {
    if constexpr (RAW) gt = gate_value(gt, dtb, expf(a_log), raw.form, raw.lower_bound);
    vec[0][t] = kt;
    vec[1][t] = __fmul_rn(qt, scale);
    vec[2][t] = expf(gt);
  }
  if (t < kCols) vcol[t] = vt;
  if (t == 0) beta_s = RAW ? beta_value(bt) : bt;
  __syncthreads();

  float(*const rd)[P::kWarps][P::kCols] = red[NORM ? part : 0];
  // Decay, and the warp's share of kv = k^T S over the decayed rows.
  float Pc[4][2];  // Pc[c][i]: the lane's chain partial of column j0 + c from its rows of i
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < kChainLen; ++m) {
      const int r = r0 + P::kStepI * i + 4 * m;
      const float kk = vec[0][r];
      const float ee = vec[2][r];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        S[i][m][c] = __fmul_rn(S[i][m][c], ee);
        ch[c] = __fadd_rn(ch[c], __fmul_rn(S[i][m][c], kk));
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) Pc[c][i] = chain_partial<HALF>(ch[c]);
  }
  warp_partial<HALF>(Pc, rd[0], warp, x, cq);
  part_sync<NORM>(part);
  // d = beta (v - k^T S) of the lane's columns.
  float d[4];
  {
    const float4 kv = column_sums<HALF>(rd[0], cq);
    const float4 vv = *reinterpret_cast<const float4*>(&vcol[j0 - jb]);
    const float bb = beta_s;
    d[0] = __fmul_rn(__fsub_rn(vv.x, kv.x), bb);
    d[1] = __fmul_rn(__fsub_rn(vv.y, kv.y), bb);
    d[2] = __fmul_rn(__fsub_rn(vv.z, kv.z), bb);
    d[3] = __fmul_rn(__fsub_rn(vv.w, kv.w), bb);
  }

  // Rank-1 update (each row stored as soon as it is final), and o = (scale q)^T S.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < kChainLen; ++m) {
      const int r = r0 + P::kStepI * i + 4 * m;
      const float kk = vec[0][r];
      const float qq = vec[1][r];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        S[i][m][c] = __fadd_rn(S[i][m][c], __fmul_rn(kk, d[c]));
        ch[c] = __fadd_rn(ch[c], __fmul_rn(S[i][m][c], qq));
      }
      if (sout) {  // the default store policy: st.global.cs streamed slower (kda_decode_forms.cu)
        const int64_t row = P::kStepI * i + 4 * m;
        *reinterpret_cast<float4*>(sout + my_off + row * kScanDv) =
            make_float4(S[i][m][0], S[i][m][1], S[i][m][2], S[i][m][3]);
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) Pc[c][i] = chain_partial<HALF>(ch[c]);
  }
  warp_partial<HALF>(Pc, rd[1], warp, x, cq);
  part_sync<NORM>(part);
  if (tp < P::kQuads) {  // the part's warp 0, x == 0: lane cq has columns j0 .. j0 + 3
    const float4 out = column_sums<HALF>(rd[1], cq);
    if constexpr (NORM) {
      *reinterpret_cast<float4*>(&orow[j0]) = out;
    } else {
      *reinterpret_cast<float4*>(o + bh * kScanDv + j0) = out;
    }
  }
  if constexpr (NORM) {
    // The head's row meets in shared memory; warp 0 normalises it (rms_norm_gated_kernel<32>'s
    // row: lane reads columns lane + 32 c) and writes o.
    __syncthreads();
    if (t < 32) {
      float xv[rowsum::kGatedCols], sig[rowsum::kGatedCols], wv[rowsum::kGatedCols];
#pragma unroll
      for (int c = 0; c < rowsum::kGatedCols; ++c) {
        xv[c] = orow[lane + 32 * c];
        sig[c] = nrow[lane + 32 * c];
        wv[c] = nrow[kScanDv + lane + 32 * c];
      }
      if (norm.o_bf16) {  // the GEMM after the scan reads bf16 (its own rounding, done here)
        rowsum::gated_norm_short_row<32>(xv, sig, wv, true, lane, kScanDv, norm.eps, nullptr,
                                         static_cast<__nv_bfloat16*>(o_out) + bh * kScanDv);
      } else {
        rowsum::gated_norm_short_row<32>(xv, sig, wv, true, lane, kScanDv, norm.eps, nullptr,
                                         o + bh * kScanDv);
      }
    }
  }
}

}  // namespace

namespace memra::cuda::kda {

int scan_decode_tables(MemraCudaCtx* ctx, const MemraKdaScanParams& p) {
  // Halves from kHalfWaves full waves of them up, where their layout's faster streaming outweighs
  // the quarters' finer tail (docs/kda.md has the A/B either side).
  int sms = 0;
  MEMRA_CUDA_RETURN_IF(memra::cuda::status_of(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device)));
  const int64_t heads = static_cast<int64_t>(p.B) * p.H;
  const bool half = heads * PartShape<true>::kHeadParts >=
                    static_cast<int64_t>(kHalfWaves) * sms * line_min_blocks<false, true>();
  auto go = [&](auto kernel, int parts, int threads) {
    const int64_t blocks = heads * parts;
    if (blocks > 0x7fffffffLL) return memra::kContractShape;
    memra::cuda::launch(ctx, true, kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads), 0,
                        static_cast<const float*>(p.q), static_cast<const float*>(p.k),
                        static_cast<const float*>(p.v), static_cast<const float*>(p.g), p.beta,
                        p.H, p.scale, row_planes(p.state), p.o, RawGates{}, GatedNorm{});
    return launch_status();
  };
  return half ? go(scan_decode_lines_kernel<false, false, true>, PartShape<true>::kHeadParts,
                   line_threads<false, true>())
              : go(scan_decode_lines_kernel<false, false, false>, PartShape<false>::kHeadParts,
                   line_threads<false, false>());
}

int scan_decode_slots(MemraCudaCtx* ctx, const MemraKdaScanParams& p) {
  const int form = p.gate_form, B = p.B, H = p.H, dk = p.dk, dv = p.dv;
  const MemraKdaPlanes& s = p.state;
  if (form != 0 && form != 1) return memra::kContractValue;
  if (B < 0 || H < 0 || dk < 1 || dv < 1) return memra::kContractShape;
  if (dk != kScanDk || dv != kScanDv) return memra::kUnsupportedGeometry;
  if (s.slots && (s.floats < 0 || s.offset < 0)) return memra::kContractValue;
  const int64_t beta_ld = p.beta_ld == 0 ? H : p.beta_ld;
  if (beta_ld < H) return memra::kContractValue;
  if (B == 0 || H == 0) return memra::kOk;
  if (!p.q || !p.k || !p.v || !p.g || !p.dt_bias || !p.A_log || !p.beta || !p.o) {
    return memra::kContractMissing;
  }
  if (!s.slots || !s.cur || !s.base0 || !s.base1) return memra::kContractMissing;
  if (!p.gate_o || !p.o_norm) return memra::kContractMissing;
  // A slot's [H, dk, dv] state must fit its stride, and every plane be 16-byte aligned (the
  // state moves in float4; a misaligned access would end the context, not just the call).
  if (s.offset + static_cast<int64_t>(H) * dk * dv > s.floats) return memra::kContractValue;
  if (((reinterpret_cast<uintptr_t>(s.base0) | reinterpret_cast<uintptr_t>(s.base1)) & 15u) ||
      s.floats % 4 != 0 || s.offset % 4 != 0) {
    return memra::kContractStride;
  }
  for (const void* a : {static_cast<const void*>(p.q), static_cast<const void*>(p.k),
                        static_cast<const void*>(p.v), static_cast<const void*>(p.g),
                        static_cast<const void*>(p.dt_bias), static_cast<const void*>(p.o)}) {
    if (reinterpret_cast<uintptr_t>(a) & 15u) return memra::kContractStride;
  }
  // A whole head a block: the scan, then o through the gated norm.
  const int64_t blocks = static_cast<int64_t>(B) * H;
  if (blocks > 0x7fffffffLL) return memra::kContractShape;
  const RawGates gates{p.dt_bias, p.A_log, form, p.lower_bound, beta_ld};
  const GatedNorm norm{p.gate_o, p.o_norm, p.norm_eps, p.o_dtype == 1};
  memra::cuda::launch(ctx, true, scan_decode_lines_kernel<true, true, false>,
                      dim3(static_cast<unsigned>(blocks)), dim3(line_threads<true, false>()), 0,
                      static_cast<const float*>(p.q), static_cast<const float*>(p.k),
                      static_cast<const float*>(p.v), static_cast<const float*>(p.g), p.beta,
                      p.H, p.scale, row_planes(p.state), p.o, gates, norm);
  return launch_status();
}

}  // namespace memra::cuda::kda
