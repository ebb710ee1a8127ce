// KDA area, the decode step of the delta-rule scan (T == 1; cpp/include/memra/cuda_abi/kda.h:
// kda_scan at T == 1, and its SLOTS form with the gates and the gated norm fused). Called from
// cuda/kda_scan.cu's entry after its checks (kda_common.cuh: rounding, RowPlanes, gate_value).
//
// The step moves each (b, h)'s state plane in and out and does little else, so it is judged
// against a device-to-device copy, and shaped like one (docs/kernels.md "KDA" has the budget):
// - every state access is a 16-byte load (ld.global.cs) or store (st.global.cs), a warp
//   instruction covering 8 rows x 64 contiguous bytes (whole 32-byte sectors; the other half of
//   each 128-byte line is read by the neighbouring warp of the same block at the same time);
// - all 16 state loads of a lane, and the step's vectors, are issued before anything waits on
//   memory (one wait per warp in the SASS, not a chain of them), so at 128 registers and 4
//   blocks an SM far more bytes are in flight than Little's law asks of the memory system;
// - no block barrier and no shared-memory traffic for the state: warps drift apart, so an SM
//   overlaps some warps' loads with others' arithmetic and fire-and-forget stores, as a copy
//   kernel's warps do; the per-warp vectors are written once behind a __syncwarp;
// - the arithmetic stays well under an SM's issue rate at full bandwidth;
// - grid: B * H * 2 blocks, ordered (b, h, column half), so consecutive blocks stream
//   consecutive planes.
// At B = 1 the kernel is latency-bound (one load round trip, the dependent arithmetic, the
// stores). The form with the gated norm fused (KdaLayer's decode) runs a whole head per block of
// 8 warps (B * H blocks, 2 per SM at 128 registers, the same 16 warps an SM) and has one block
// barrier, after the state's last store, for the norm's row.
#include <cstdint>

#include "common.cuh"
#include "kda_common.cuh"
#include "row_group.cuh"

using memra::cuda::launch_status;
namespace rowsum = memra::cuda::rowsum;

namespace {

// A decode step reads and writes each state plane once (64 KB each way per head) with ~7 flops
// per element: a stream, so the kernel is shaped like a copy. A warp owns a 16-column slice of
// one head, all 128 rows; lane = hg * 16 + e * 4 + cq holds columns j0 .. j0 + 3
// (j0 = 16 * warp-slice + 4 cq) of rows 16 g + 4 m + e for the groups g = 4 hg + gl (gl < 4,
// m < 4): 16 float4 registers, one 16-byte load and one 16-byte store per (gl, m). A warp
// instruction covers 8 rows x 64 contiguous bytes (the neighbouring slice, in the same block,
// takes the other half of each 128-byte line at the same time), so every state access is
// 16-byte vectorised and whole-sector coalesced. The state never touches shared memory and no
// warp waits on another (no block barrier): warps drift apart, and an SM interleaves the load
// phase of some with the arithmetic and the fire-and-forget stores of others, as in a copy.
//
// The lane's rows of group g, m ascending, are exactly chain e of the fixed order (see the
// scan_kernel geometry, cuda/kda_scan.cu), summed in registers in the same order; two
// xor-shuffles over e give the group partial ((e0 + e1) + (e2 + e3)), the lane combines its four
// groups as ((P0 + P1) + (P2 + P3)) (or P4..P7), and one xor-shuffle over hg finishes the tree.
// Every element sees scan_kernel's operations at T = 1 (the same expf, the same __f*_rn), so the
// bits are identical (the tests assert it against the T-step kernel).
//
// k, scale * q and exp(g) reach the lanes through a per-warp transposed copy in shared memory,
// vec[e][n] = x[4 n + e]: the lane's four rows of group g are one float4 at vec[e][4 g]. A warp
// reads 8 distinct float4 (e, hg) per access; the padded e-row stride (36 words) lays them on
// all 32 banks once (conflict-free). The copy is written once per launch, while the state loads
// (issued first) are in flight, and is guarded by __syncwarp only.
constexpr int kDecCols = 16;                         // columns per warp: 4 quads
// Warps per block: 4 (two blocks per head), or 8 (a whole head: the fused gated norm).
constexpr int kDecWarps = 4;
constexpr int kDecNormWarps = kScanDv / kDecCols;    // 8
template <int WARPS>
constexpr int dec_blocks_per_head() { return kScanDv / (kDecCols * WARPS); }
constexpr int kDecGroups = kScanDk / 16;             // 8 groups of 16 rows
constexpr int kDecLaneGroups = kDecGroups / 2;       // 4 per lane (half hg)
constexpr int kDecChain = 4;                         // rows per chain in a group
constexpr int kVecStride = 36;                       // words per e-row of a transposed vector
static_assert(kDecCols == 4 * 4, "4 column quads x 4 chains (e) x 2 group halves = 32 lanes");
static_assert(kVecStride % 4 == 0 && kVecStride >= kScanDk / 4, "float4-aligned padded rows");

// One warp's step inputs in shared memory. v, beta and the output plane pass through here too,
// although every lane could load them itself: ptxas issues a load just ahead of its first use,
// which for these would be after the vectors' round trip, adding a second memory latency to
// the warp's life (less state in flight per SM); stored here, they are loaded with k, q, g.
struct DecodeStage {
  float k[4][kVecStride];  // k[e][n] = k[4 n + e]
  float q[4][kVecStride];  // scale * q, same layout
  float e[4][kVecStride];  // exp(g), same layout
  float4 v[4];             // v of the warp's 16 columns
  float* sout;             // the sequence's state_out plane (null: not written)
  float beta;
};

// The group partial ((e0 + e1) + (e2 + e3)) from this lane's chain e of one column; the lanes
// of the four chains end with the same bits (fadd_rn is commutative).
__device__ __forceinline__ float chain_combine(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 4));
  return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 8));
}

// The column sum from the lane's four group partials: ((P0 + P1) + (P2 + P3)) in registers,
// then + the other half's (lane ^ 16): the tree of the fixed order.
__device__ __forceinline__ float column_sum(const float (&P)[kDecLaneGroups]) {
  const float half = __fadd_rn(__fadd_rn(P[0], P[1]), __fadd_rn(P[2], P[3]));
  return __fadd_rn(half, __shfl_xor_sync(0xffffffffu, half, 16));
}

// One decode step of B sequences (T = 1), scan_kernel's arithmetic (cuda/kda_scan.cu) in its
// order (see above).
// q, k, g [B, 1, H, dk]; v, o [B, 1, H, dv]; beta [B, 1, H]; state planes [H, dk, dv]; every
// base 16-byte aligned (the entry point checks q, k, g, v, o; the planes' owners guarantee it).
// Grid: B * H * (kScanDv / (16 WARPS)) blocks, block = (b, h, a slice of the columns). RAW: g
// holds f and beta the logits (kda_gate's inputs with beta); each lane turns its four f into
// gates, and lane 0 its beta, with gate_kernel's functions, so the bits are those of kda_gate
// with beta followed by kda_scan. NORM (WARPS = 8, a whole head a block): o is written through
// rms_norm_gated_sigmoid over the head's row (gate_o [B, H, dv], w [dv], eps: the row body of
// rms_norm_gated_kernel<32>, gated_norm_short_row), the bytes of the scan then that launch.
// (RawGates and GatedNorm: kda_common.cuh.)

template <bool RAW, int WARPS, bool NORM>
__global__ void __launch_bounds__(32 * WARPS, 16 / WARPS)
    scan_decode_kernel(const float* __restrict__ q, const float* __restrict__ k,
                       const float* __restrict__ v, const float* __restrict__ g,
                       const float* __restrict__ beta, int H, float scale, RowPlanes state,
                       float* __restrict__ o, RawGates raw, GatedNorm norm) {
  static_assert(!NORM || WARPS == kDecNormWarps, "the fused norm needs the whole head a block");
  constexpr int kBlocksPerHead = dec_blocks_per_head<WARPS>();
  __shared__ __align__(16) DecodeStage stage[WARPS];
  __shared__ __align__(16) float orow[NORM ? kScanDv : 4];
  __shared__ float nrow[NORM ? 2 * kScanDv : 1];  // NORM: gate [dv] | w [dv]
  static_assert(!NORM || 32 * WARPS == 2 * kScanDv, "one gate or weight value a thread");

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int cq = lane & 3;         // column quad within the warp's slice
  const int e = (lane >> 2) & 3;   // chain: rows = e (mod 4)
  const int hg = lane >> 4;        // groups 4 hg .. 4 hg + 3
  const int part = static_cast<int>(blockIdx.x % kBlocksPerHead);
  const int64_t bh = blockIdx.x / kBlocksPerHead;  // b * H + h = the row of [B, 1, H, *]
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int j0 = (part * WARPS + warp) * kDecCols + 4 * cq;
  // (row 64 hg + e, column j0) of the plane; row 16 (4 hg + gl) + 4 m + e is (16 gl + 4 m) rows on.
  const int64_t my_off = static_cast<int64_t>(h) * kScanDk * kScanDv +
                         static_cast<int64_t>(64 * hg + e) * kScanDv + j0;

  // The state first, so its 8 KB per warp is in flight while the vectors are prepared (with
  // state.early, already under the launch in front of this one).
  // S[gl][m][c] = state[h, 16 (4 hg + gl) + 4 m + e, j0 + c]
  float S[kDecLaneGroups][kDecChain][4];
  float* so_row = nullptr;
  auto load_state = [&] {
    const float* sin = nullptr;
    state.at(b, &sin, &so_row);
    if (sin) {
#pragma unroll
      for (int gl = 0; gl < kDecLaneGroups; ++gl) {
#pragma unroll
        for (int m = 0; m < kDecChain; ++m) {
          const float4 t = __ldcs(reinterpret_cast<const float4*>(
              sin + my_off + static_cast<int64_t>(16 * gl + 4 * m) * kScanDv));
          S[gl][m][0] = t.x;
          S[gl][m][1] = t.y;
          S[gl][m][2] = t.z;
          S[gl][m][3] = t.w;
        }
      }
    } else {
#pragma unroll
      for (int gl = 0; gl < kDecLaneGroups; ++gl) {
#pragma unroll
        for (int m = 0; m < kDecChain; ++m) {
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

  // Every load is issued before anything waits on memory: the __syncwarp()s keep ptxas from
  // moving the stage stores below (each waits for its data) between the loads.
  __syncwarp();
  const float4 kl = __ldg(reinterpret_cast<const float4*>(k + bh * kScanDk) + lane);
  const float4 ql = __ldg(reinterpret_cast<const float4*>(q + bh * kScanDk) + lane);
  float4 gv = __ldg(reinterpret_cast<const float4*>(g + bh * kScanDk) + lane);
  float4 dtb = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float a_log = 0.0f;
  if constexpr (RAW) {
    dtb = __ldg(reinterpret_cast<const float4*>(raw.dt_bias + h * kScanDk) + lane);
    a_log = __ldg(raw.A_log + h);
  }
  float4 vl = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (lane < 4) vl = __ldg(reinterpret_cast<const float4*>(v + bh * kScanDv + j0));
  float* so = nullptr;
  float bt = 0.0f;
  if (lane == 0) {
    so = so_row;
    bt = __ldg(beta + bh);
  }
  // NORM: the head's gate row and the norm weight, one value a thread (256 = 2 dv), staged in
  // shared memory for the norm at the end (held in registers they would spill the state).
  if constexpr (NORM) {
    const int t = threadIdx.x;
    nrow[t] = t < kScanDv ? __ldg(norm.gate + bh * kScanDv + t) : __ldg(norm.w + t - kScanDv);
  }
  __syncwarp();
  if constexpr (RAW) {
    const float rate = expf(a_log);
    gv.x = gate_value(gv.x, dtb.x, rate, raw.form, raw.lower_bound);
    gv.y = gate_value(gv.y, dtb.y, rate, raw.form, raw.lower_bound);
    gv.z = gate_value(gv.z, dtb.z, rate, raw.form, raw.lower_bound);
    gv.w = gate_value(gv.w, dtb.w, rate, raw.form, raw.lower_bound);
    if (lane == 0) bt = beta_value(bt);
  }
  DecodeStage& st = stage[warp];
  if (lane < 4) st.v[lane] = vl;
  if (lane == 0) {
    st.sout = so;
    st.beta = bt;
  }
  float(*vk)[kVecStride] = st.k;
  float(*vq)[kVecStride] = st.q;
  float(*ve)[kVecStride] = st.e;
  vk[0][lane] = kl.x;
  vk[1][lane] = kl.y;
  vk[2][lane] = kl.z;
  vk[3][lane] = kl.w;
  vq[0][lane] = __fmul_rn(ql.x, scale);
  vq[1][lane] = __fmul_rn(ql.y, scale);
  vq[2][lane] = __fmul_rn(ql.z, scale);
  vq[3][lane] = __fmul_rn(ql.w, scale);
  ve[0][lane] = expf(gv.x);
  ve[1][lane] = expf(gv.y);
  ve[2][lane] = expf(gv.z);
  ve[3][lane] = expf(gv.w);
  __syncwarp();
  const int n0 = 16 * hg;  // vec column of the lane's first group

  // Decay, and kv = k^T S over the decayed rows.
  float P[4][kDecLaneGroups];  // P[c][gl]: group (4 hg + gl)'s partial of column j0 + c
#pragma unroll
  for (int gl = 0; gl < kDecLaneGroups; ++gl) {
    const float4 kk4 = *reinterpret_cast<const float4*>(&vk[e][n0 + 4 * gl]);
    const float4 ee4 = *reinterpret_cast<const float4*>(&ve[e][n0 + 4 * gl]);
    const float kk[kDecChain] = {kk4.x, kk4.y, kk4.z, kk4.w};
    const float ee[kDecChain] = {ee4.x, ee4.y, ee4.z, ee4.w};
    float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < kDecChain; ++m) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        S[gl][m][c] = __fmul_rn(S[gl][m][c], ee[m]);
        ch[c] = __fadd_rn(ch[c], __fmul_rn(S[gl][m][c], kk[m]));
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) P[c][gl] = chain_combine(ch[c]);
  }
  const float4 vs = st.v[cq];
  const float vv[4] = {vs.x, vs.y, vs.z, vs.w};
  const float beta_t = st.beta;
  float d[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) d[c] = __fmul_rn(__fsub_rn(vv[c], column_sum(P[c])), beta_t);
  float* const sout = st.sout;

  // Rank-1 update (each row quad stored as soon as it is final), and o = (scale q)^T S.
#pragma unroll
  for (int gl = 0; gl < kDecLaneGroups; ++gl) {
    const float4 kk4 = *reinterpret_cast<const float4*>(&vk[e][n0 + 4 * gl]);
    const float4 qq4 = *reinterpret_cast<const float4*>(&vq[e][n0 + 4 * gl]);
    const float kk[kDecChain] = {kk4.x, kk4.y, kk4.z, kk4.w};
    const float qq[kDecChain] = {qq4.x, qq4.y, qq4.z, qq4.w};
    float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < kDecChain; ++m) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        S[gl][m][c] = __fadd_rn(S[gl][m][c], __fmul_rn(kk[m], d[c]));
        ch[c] = __fadd_rn(ch[c], __fmul_rn(S[gl][m][c], qq[m]));
      }
      if (sout) {
        __stcs(reinterpret_cast<float4*>(sout + my_off +
                                         static_cast<int64_t>(16 * gl + 4 * m) * kScanDv),
               make_float4(S[gl][m][0], S[gl][m][1], S[gl][m][2], S[gl][m][3]));
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) P[c][gl] = chain_combine(ch[c]);
  }
  const float4 out = make_float4(column_sum(P[0]), column_sum(P[1]), column_sum(P[2]),
                                 column_sum(P[3]));
  if constexpr (NORM) {
    // The head's row meets in shared memory; warp 0 normalises it (rms_norm_gated_kernel<32>'s
    // row: lane reads columns lane + 32 c) and writes o.
    if (lane < 4) *reinterpret_cast<float4*>(&orow[j0]) = out;  // e == 0, hg == 0
    __syncthreads();
    if (warp == 0) {
      float xv[rowsum::kGatedCols], sig[rowsum::kGatedCols], wv[rowsum::kGatedCols];
#pragma unroll
      for (int c = 0; c < rowsum::kGatedCols; ++c) {
        xv[c] = orow[lane + 32 * c];
        sig[c] = nrow[lane + 32 * c];
        wv[c] = nrow[kScanDv + lane + 32 * c];
      }
      rowsum::gated_norm_short_row<32>(xv, sig, wv, true, lane, kScanDv, norm.eps, nullptr,
                                       o + bh * kScanDv);
    }
  } else {
    if (lane < 4) *reinterpret_cast<float4*>(o + bh * kScanDv + j0) = out;  // e == 0, hg == 0
  }
}

}  // namespace

namespace memra::cuda::kda {

int scan_decode_tables(MemraCudaCtx* ctx, const MemraKdaScanParams& p) {
  // The default: whole-line blocks (cuda/kda_decode_lines.cu); this kernel is the A/B arm.
  if (ctx->options.kda_decode_lines) return scan_decode_lines_tables(ctx, p);
  const int64_t blocks = static_cast<int64_t>(p.B) * p.H * dec_blocks_per_head<kDecWarps>();
  if (blocks > 0x7fffffffLL) return memra::kContractShape;
  memra::cuda::launch(ctx, true, scan_decode_kernel<false, kDecWarps, false>,
                      dim3(static_cast<unsigned>(blocks)), dim3(32 * kDecWarps), 0, p.q, p.k, p.v,
                      p.g, p.beta, p.H, p.scale, row_planes(p.state), p.o, RawGates{},
                      GatedNorm{});
  return launch_status();
}

int scan_decode_slots(MemraCudaCtx* ctx, const MemraKdaScanParams& p) {
  const int form = p.gate_form, B = p.B, H = p.H, dk = p.dk, dv = p.dv;
  const MemraKdaPlanes& s = p.state;
  if (form != 0 && form != 1) return memra::kContractValue;
  if (B < 0 || H < 0 || dk < 1 || dv < 1) return memra::kContractShape;
  if (dk != kScanDk || dv != kScanDv) return memra::kUnsupportedGeometry;
  if (s.slots && (s.floats < 0 || s.offset < 0)) return memra::kContractValue;
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
  // The default: the whole-line kernel's fused form (cuda/kda_decode_lines.cu); below, the A/B arm.
  if (ctx->options.kda_decode_lines) return scan_decode_lines_slots(ctx, p);
  const RawGates gates{p.dt_bias, p.A_log, form, p.lower_bound};
  const GatedNorm norm{p.gate_o, p.o_norm, p.norm_eps};
  // A whole head a block: the scan, then o through the gated norm.
  const int64_t blocks = static_cast<int64_t>(B) * H;
  if (blocks > 0x7fffffffLL) return memra::kContractShape;
  memra::cuda::launch(ctx, true, scan_decode_kernel<true, kDecNormWarps, true>,
                      dim3(static_cast<unsigned>(blocks)), dim3(32 * kDecNormWarps), 0, p.q, p.k,
                      p.v, p.g, p.beta, H, p.scale, row_planes(s), p.o, gates, norm);
  return launch_status();
}

}  // namespace memra::cuda::kda
