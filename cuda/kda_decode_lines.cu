// KDA area, the decode step of the delta-rule scan (T == 1) in whole 128-byte lines
// (cpp/include/memra/cuda_abi/kda.h): the TABLES / STRIDED planes (kda_scan at T == 1, called
// from cuda/kda_scan.cu after its checks) and the SLOTS form with the gates and the gated norm
// fused (KdaLayer's decode; its checks are here, scan_decode_slots).
//
// Why this shape: the half-line kernel before it (scan_decode_kernel, deleted once the H200
// settled the A/B: docs/options.md) had each warp instruction cover 8 rows x 64 bytes, so the L2
// saw two requests per line, and ncu had L2 throughput (85 %) well above DRAM's (72 %), with 128
// registers a thread (16 warps an SM) and all of a warp's 8 KB of state landing, then computed
// on, then stored, in lock step with its block mates. Here:
// - a part of 4 warps owns a 32-column quarter of one head's plane, all 128 rows (the tiling of
//   fla's fused_recurrent kernel): each warp instruction covers 4 rows x 128 contiguous bytes,
//   one request per whole line, loaded with ld.global.L2::256B and stored with the default policy;
// - a lane holds 8 float4 of state (32 floats), 63 registers, so 32 warps fit an SM: the same
//   128 KB of state in flight as before, in twice as many, half as long, independent pieces;
// - every state load of a lane is issued before anything waits on memory (with state.early,
//   before the wait for the launch in front);
// - the dk-long column sums cross the part's warps through shared memory: two part barriers, one
//   before the rank-1 update (d) and one before o is written.
// TABLES / STRIDED: a block is one part (B * H * 4 blocks of 128 threads, 8 an SM). NORM (SLOTS):
// a block is a whole head, 4 parts (B * H blocks of 512 threads, 2 an SM), each part synchronising
// on its own named barrier, and o goes through the gated norm over the head's row at the end.
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

// Geometry of a part. lane = e * 8 + cq: cq < 8 the column quad (columns j0 .. j0 + 3 with
// j0 = 32 part + 4 cq), e < 4 the chain (rows = e mod 4). Warp w of the part owns the row groups
// g = 2 w + gl (gl < 2) of 16 rows: the lane's rows are 16 g + 4 m + e (m < 4).
constexpr int kLineCols = 32;                    // columns a part: one 128-byte line a row
constexpr int kLineWarps = 4;                    // warps a part
constexpr int kLinePartThreads = 32 * kLineWarps;  // 128: one dk element a thread
constexpr int kLineParts = kScanDv / kLineCols;  // parts a head
constexpr int kLineGroups = 2;                   // 16-row groups a warp
constexpr int kLineChain = 4;                    // rows of a chain in a group
static_assert(kLineCols == 8 * 4, "8 column quads of a warp instruction = one 128-byte line");
static_assert(kLineWarps * kLineGroups * 16 == kScanDk, "the warps' groups cover dk");
static_assert(kLinePartThreads == kScanDk, "a vector element a thread of a part");
static_assert(kLineParts * kLineCols == kScanDv, "the parts of a head cover dv");
static_assert(kLineParts * kLinePartThreads == 4 * kScanDv, "NORM: gate and w one a thread");

template <bool NORM>
constexpr int line_threads() { return NORM ? kLineParts * kLinePartThreads : kLinePartThreads; }
// At most 64 registers: 32 warps an SM either way.
template <bool NORM>
constexpr int line_min_blocks() { return NORM ? 2 : 8; }

// A lane's float4 of state. The L2::256B prefetch size has the L2 fetch the aligned 256-byte
// pair of lines, whose other half the neighbouring part reads at about the same time; the
// streaming policy (ld.global.cs) it replaced left the kernel well short of a copy of the same
// bytes (benchmarks/kda_decode_forms.cu times the policies; docs/kda.md has the figures).
// In place (sin == sout) each element is loaded and stored by the same lane, the store's value
// computed from the load's, so the asm needs no memory clobber.
__device__ __forceinline__ float4 ld_state_line(const float* p) {
  float4 x;
  asm volatile("ld.global.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
               : "l"(p));
  return x;
}

// The group partial ((e0 + e1) + (e2 + e3)) from this lane's chain e (lane bits 3..4) of one
// column; the four chains' lanes end with the same bits (fadd_rn is commutative).
__device__ __forceinline__ float line_chain_combine(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 16));
}

// The 128 threads of a part: the whole block, or (NORM) named barrier 1 + part (immediate ids,
// so ptxas reserves 5 barriers, not all 16).
template <bool NORM>
__device__ __forceinline__ void part_sync(int part) {
  static_assert(kLineParts == 4 && kLinePartThreads == 128, "the barrier immediates below");
  if constexpr (NORM) {
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

// ((w0 + w1) + (w2 + w3)) per column: the fixed order's ((P0 + P1) + (P2 + P3)) +
// ((P4 + P5) + (P6 + P7)) from the part's four warp partials W_w = P_2w + P_2w+1.
__device__ __forceinline__ float4 column_sums(const float (*red)[kLineCols], int cq) {
  const float4 w0 = *reinterpret_cast<const float4*>(&red[0][4 * cq]);
  const float4 w1 = *reinterpret_cast<const float4*>(&red[1][4 * cq]);
  const float4 w2 = *reinterpret_cast<const float4*>(&red[2][4 * cq]);
  const float4 w3 = *reinterpret_cast<const float4*>(&red[3][4 * cq]);
  return make_float4(__fadd_rn(__fadd_rn(w0.x, w1.x), __fadd_rn(w2.x, w3.x)),
                     __fadd_rn(__fadd_rn(w0.y, w1.y), __fadd_rn(w2.y, w3.y)),
                     __fadd_rn(__fadd_rn(w0.z, w1.z), __fadd_rn(w2.z, w3.z)),
                     __fadd_rn(__fadd_rn(w0.w, w1.w), __fadd_rn(w2.w, w3.w)));
}

// q, k, g [B, 1, H, dk]; v, o [B, 1, H, dv]; beta [B, 1, H]; state planes [H, dk, dv] through
// RowPlanes. TABLES / STRIDED (!RAW, !NORM): grid B * H * kLineParts, block = (b, h, column
// quarter). SLOTS (RAW and NORM): grid B * H, block = (b, h), part = warp / 4; g holds f and beta
// the logits (gate_value / beta_value as loaded); o through the gated norm (gate_o [B, H, dv],
// w [dv], eps).
template <bool RAW, bool NORM>
__global__ void __launch_bounds__(line_threads<NORM>(), line_min_blocks<NORM>())
    scan_decode_lines_kernel(const float* __restrict__ q, const float* __restrict__ k,
                             const float* __restrict__ v, const float* __restrict__ g,
                             const float* __restrict__ beta, int H, float scale, RowPlanes state,
                             void* __restrict__ o_out, RawGates raw, GatedNorm norm) {
  float* __restrict__ const o = static_cast<float*>(o_out);  // f32 unless NORM with norm.o_bf16
  constexpr int kParts = NORM ? kLineParts : 1;       // parts a block
  constexpr int kCols = kParts * kLineCols;           // the block's columns
  // vec[0] = k, vec[1] = scale * q, vec[2] = exp(g), each [dk]; red[part][phase][warp][column]:
  // a warp's pair of group partials, (P_2w + P_2w+1), of each of its part's columns.
  __shared__ __align__(16) float vec[3][kScanDk];
  __shared__ __align__(16) float vcol[kCols];
  __shared__ __align__(16) float red[kParts][2][kLineWarps][kLineCols];
  __shared__ __align__(16) float orow[NORM ? kScanDv : 4];
  __shared__ float nrow[NORM ? 2 * kScanDv : 1];  // NORM: gate [dv] | w [dv]
  __shared__ float beta_s;

  const int t = threadIdx.x;
  const int tp = NORM ? t % kLinePartThreads : t;  // thread in the part
  const int lane = t & 31;
  const int warp = tp >> 5;             // warp in the part
  const int cq = lane & 7;
  const int e = lane >> 3;
  const int part = NORM ? t / kLinePartThreads : static_cast<int>(blockIdx.x % kLineParts);
  const int64_t bh = NORM ? static_cast<int64_t>(blockIdx.x) : blockIdx.x / kLineParts;
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int jb = NORM ? 0 : part * kLineCols;  // the block's first column
  const int j0 = part * kLineCols + 4 * cq;    // the lane's first column
  // (row 32 warp + e, column j0); row 16 (2 warp + gl) + 4 m + e is (16 gl + 4 m) rows on.
  const int64_t my_off = static_cast<int64_t>(h) * kScanDk * kScanDv +
                         static_cast<int64_t>(32 * warp + e) * kScanDv + j0;

  // S[gl][m][c] = state[h, 16 (2 warp + gl) + 4 m + e, j0 + c]
  float S[kLineGroups][kLineChain][4];
  float* sout = nullptr;
  auto load_state = [&] {
    const float* sin = nullptr;
    state.at(b, &sin, &sout);
    if (sin) {
#pragma unroll
      for (int gl = 0; gl < kLineGroups; ++gl) {
#pragma unroll
        for (int m = 0; m < kLineChain; ++m) {
          const float4 x =
              ld_state_line(sin + my_off + static_cast<int64_t>(16 * gl + 4 * m) * kScanDv);
          S[gl][m][0] = x.x;
          S[gl][m][1] = x.y;
          S[gl][m][2] = x.z;
          S[gl][m][3] = x.w;
        }
      }
    } else {
#pragma unroll
      for (int gl = 0; gl < kLineGroups; ++gl) {
#pragma unroll
        for (int m = 0; m < kLineChain; ++m) {
#pragma unroll
          for (int c = 0; c < 4; ++c) S[gl][m][c] = 0.0f;
        }
      }
    }
  };
  if (state.early) load_state();
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  if (!state.early) load_state();

  // The step's vectors, one element a thread of the first part (gate_kernel's and scan_kernel's
  // per-element operations: the gates with gate_value, scale * q with __fmul_rn, expf(g)); v of
  // the block's columns; NORM: the head's gate row and the norm weight, one value a thread of
  // parts 2 and 3.
  float kt = 0.0f, qt = 0.0f, gt = 0.0f, dtb = 0.0f, a_log = 0.0f, vt = 0.0f, bt = 0.0f;
  if (!NORM || t < kScanDk) {
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
    const int n = t - 2 * kLinePartThreads;  // parts 2 and 3: gate [dv] then w [dv]
    if (n >= 0) nrow[n] = n < kScanDv ? __ldg(norm.gate + bh * kScanDv + n) : __ldg(norm.w + n - kScanDv);
  }
  if (!NORM || t < kScanDk) {
    if constexpr (RAW) gt = gate_value(gt, dtb, expf(a_log), raw.form, raw.lower_bound);
    vec[0][t] = kt;
    vec[1][t] = __fmul_rn(qt, scale);
    vec[2][t] = expf(gt);
  }
  if (t < kCols) vcol[t] = vt;
  if (t == 0) beta_s = RAW ? beta_value(bt) : bt;
  __syncthreads();

  float(*const rd)[kLineWarps][kLineCols] = red[NORM ? part : 0];
  const int r0 = 32 * warp + e;  // the lane's row of (gl, m) = r0 + 16 gl + 4 m
  // Decay, and the warp's share of kv = k^T S over the decayed rows.
  float P[4][kLineGroups];  // P[c][gl]: group (2 warp + gl)'s partial of column j0 + c
#pragma unroll
  for (int gl = 0; gl < kLineGroups; ++gl) {
    float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < kLineChain; ++m) {
      const int r = r0 + 16 * gl + 4 * m;
      const float kk = vec[0][r];
      const float ee = vec[2][r];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        S[gl][m][c] = __fmul_rn(S[gl][m][c], ee);
        ch[c] = __fadd_rn(ch[c], __fmul_rn(S[gl][m][c], kk));
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) P[c][gl] = line_chain_combine(ch[c]);
  }
  if (e == 0) {
    *reinterpret_cast<float4*>(&rd[0][warp][4 * cq]) =
        make_float4(__fadd_rn(P[0][0], P[0][1]), __fadd_rn(P[1][0], P[1][1]),
                    __fadd_rn(P[2][0], P[2][1]), __fadd_rn(P[3][0], P[3][1]));
  }
  part_sync<NORM>(part);
  // d = beta (v - k^T S) of the lane's columns.
  float d[4];
  {
    const float4 kv = column_sums(rd[0], cq);
    const float4 vv = *reinterpret_cast<const float4*>(&vcol[j0 - jb]);
    const float bb = beta_s;
    d[0] = __fmul_rn(__fsub_rn(vv.x, kv.x), bb);
    d[1] = __fmul_rn(__fsub_rn(vv.y, kv.y), bb);
    d[2] = __fmul_rn(__fsub_rn(vv.z, kv.z), bb);
    d[3] = __fmul_rn(__fsub_rn(vv.w, kv.w), bb);
  }

  // Rank-1 update (each row quad stored as soon as it is final), and o = (scale q)^T S.
#pragma unroll
  for (int gl = 0; gl < kLineGroups; ++gl) {
    float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < kLineChain; ++m) {
      const int r = r0 + 16 * gl + 4 * m;
      const float kk = vec[0][r];
      const float qq = vec[1][r];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        S[gl][m][c] = __fadd_rn(S[gl][m][c], __fmul_rn(kk, d[c]));
        ch[c] = __fadd_rn(ch[c], __fmul_rn(S[gl][m][c], qq));
      }
      if (sout) {  // the default store policy: st.global.cs streamed slower (kda_decode_forms.cu)
        *reinterpret_cast<float4*>(sout + my_off + static_cast<int64_t>(16 * gl + 4 * m) * kScanDv) =
            make_float4(S[gl][m][0], S[gl][m][1], S[gl][m][2], S[gl][m][3]);
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) P[c][gl] = line_chain_combine(ch[c]);
  }
  if (e == 0) {
    *reinterpret_cast<float4*>(&rd[1][warp][4 * cq]) =
        make_float4(__fadd_rn(P[0][0], P[0][1]), __fadd_rn(P[1][0], P[1][1]),
                    __fadd_rn(P[2][0], P[2][1]), __fadd_rn(P[3][0], P[3][1]));
  }
  part_sync<NORM>(part);
  if (tp < kLineCols / 4) {  // the part's warp 0, e == 0: lane cq has columns j0 .. j0 + 3
    const float4 out = column_sums(rd[1], cq);
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
  const int64_t blocks = static_cast<int64_t>(p.B) * p.H * kLineParts;
  if (blocks > 0x7fffffffLL) return memra::kContractShape;
  memra::cuda::launch(ctx, true, scan_decode_lines_kernel<false, false>,
                      dim3(static_cast<unsigned>(blocks)), dim3(line_threads<false>()), 0,
                      static_cast<const float*>(p.q), static_cast<const float*>(p.k),
                      static_cast<const float*>(p.v), static_cast<const float*>(p.g), p.beta,
                      p.H, p.scale, row_planes(p.state), p.o, RawGates{}, GatedNorm{});
  return launch_status();
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
  memra::cuda::launch(ctx, true, scan_decode_lines_kernel<true, true>,
                      dim3(static_cast<unsigned>(blocks)), dim3(line_threads<true>()), 0,
                      static_cast<const float*>(p.q), static_cast<const float*>(p.k),
                      static_cast<const float*>(p.v), static_cast<const float*>(p.g), p.beta,
                      p.H, p.scale, row_planes(p.state), p.o, gates, norm);
  return launch_status();
}

}  // namespace memra::cuda::kda
