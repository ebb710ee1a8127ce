// KDA area, the forget gate and the delta-rule scan (cpp/include/memra/cuda_abi/kda.h: kda_gate,
// kda_scan): the GPU twins of cpu::kda_gate / kda_scan (cpp/src/cpu/kda.cpp, the oracle;
// cuda/kda_common.cuh: rounding). The scan has two kernels: scan_kernel here (any T; a warp per 8
// columns, the latency-bound prefill) and scan_decode_lines_kernel (cuda/kda_decode_lines.cu;
// T == 1, a block per 32 or 64 columns, shaped for bandwidth). Both perform each element's
// operations in the same order, including every dk-long sum's fixed order (the geometry comment
// below), so they agree bit for bit at T = 1, which the tests assert. The per-step arithmetic
// does not depend on where the state came from (registers or f32 memory hold the same bits), so
// T chained one-step launches equal one T-step launch, and a sequence in a batch equals it alone.
#include <cstdint>

#include "common.cuh"
#include "kda_common.cuh"

using memra::cuda::enter;
using memra::cuda::launch_status;

namespace {

// g[t, h*dk + i] from f[t, h*dk + i] + dt_bias[h*dk + i] and A_log[h], cpu::kda_gate's
// arithmetic op for op (gate_value). Thread = one column (its head's rate and its bias loaded
// once), rows strided over grid.y. g may alias f (each element is read, then written, by one
// thread). beta: block (0, 0) also turns the nbeta logits beta into 1 / (1 + exp(-beta)) in
// place, memra_cuda_sigmoid's arithmetic (one launch less per step).
__global__ void gate_kernel(const float* f, const float* __restrict__ dt_bias,
                            const float* __restrict__ A_log, int T, int D, int dk, int form,
                            float lower_bound, float* g, float* beta, int64_t nbeta) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  if (beta && blockIdx.x == 0 && blockIdx.y == 0) {
    for (int64_t i = threadIdx.x; i < nbeta; i += blockDim.x) beta[i] = beta_value(beta[i]);
  }
  const int col = blockIdx.x * blockDim.x + threadIdx.x;  // h*dk + i
  if (col >= D) return;
  const float decay_rate = expf(A_log[col / dk]);
  const float bias = dt_bias[col];
  for (int t = blockIdx.y; t < T; t += gridDim.y) {
    const int64_t idx = static_cast<int64_t>(t) * D + col;
    g[idx] = gate_value(f[idx], bias, decay_rate, form, lower_bound);
  }
}

constexpr int kGateThreads = 256;
constexpr int kGateRowsPerBlock = 8;

// Geometry of the scan kernel. A warp owns an 8-column tile of one head's [128, 128] state:
// lane = rg * 8 + c holds column j0 + c, rows i = rg * 32 + r (r < 32), 32 f32 registers. A block
// is 4 independent warps (32 columns, no block-wide sync); the grid is B * H * (dv / 32) blocks.
//
// The order of every dk-long sum (k^T S and q^T S of one column) is fixed, independent of the
// tiling: the 128 rows form 8 groups of 16; a group's partial is 4 ascending chains (rows 4m + e,
// m < 4, one chain per e) combined as ((e0 + e1) + (e2 + e3)); the 8 partials meet in a pairwise
// tree ((P0 + P1) + (P2 + P3)) + ((P4 + P5) + (P6 + P7)). Here a lane holds groups 2rg and 2rg+1
// (first tree level in registers) and two shuffles finish the tree; a 4-column tile (16 rows per
// lane, three shuffles) would give the same bits, so a later retiling keeps the chaining contract.
constexpr int kTileV = 8;                             // columns per warp
constexpr int kRowGroups = 32 / kTileV;               // 4
constexpr int kRowsPerLane = kScanDk / kRowGroups;    // 32
constexpr int kQuadsPerLane = kRowsPerLane / 4;       // 8 float4 per lane per vector
constexpr int kQuadsPerGroup = 4;                     // a 16-row group = 4 float4
constexpr int kWarpsPerBlock = 4;
constexpr int kScanThreads = 32 * kWarpsPerBlock;
constexpr int kBlocksPerHead = kScanDv / (kTileV * kWarpsPerBlock);  // 4
static_assert(kScanDk == 4 * 32, "one float4 of k / q / g per lane per step");
static_assert(kQuadsPerLane == 2 * kQuadsPerGroup, "a lane holds two 16-row groups");

// One step's inputs as a lane loads them: rows 4*lane .. 4*lane+3 of k, q, g (coalesced float4)
// and this lane's column of v, and beta.
struct ScanStepIn {
  float4 k, q, g;
  float v, beta;
};

__device__ __forceinline__ ScanStepIn scan_load(const float* __restrict__ q,
                                                const float* __restrict__ k,
                                                const float* __restrict__ v,
                                                const float* __restrict__ g,
                                                const float* __restrict__ beta, int64_t th,
                                                int lane, int j) {
  ScanStepIn s;
  s.k = __ldg(reinterpret_cast<const float4*>(k + th * kScanDk) + lane);
  s.q = __ldg(reinterpret_cast<const float4*>(q + th * kScanDk) + lane);
  s.g = __ldg(reinterpret_cast<const float4*>(g + th * kScanDk) + lane);
  s.v = __ldg(v + th * kScanDv + j);
  s.beta = __ldg(beta + th);
  return s;
}

// Sum of the 4 row groups' partials (lanes rg*8 + c, fixed c). Float addition is commutative,
// so every lane of a column ends with the same bits: ((p0 + p1) + (p2 + p3)).
__device__ __forceinline__ float rowgroup_sum(float p) {
  p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, 8));
  p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, 16));
  return p;
}

// The full column sum from a lane's two 16-row group partials (chains e = x, y, z, w), in the
// fixed order described at the geometry constants.
__device__ __forceinline__ float lane_sum(const float4 (&p)[2]) {
  const float lo = __fadd_rn(__fadd_rn(p[0].x, p[0].y), __fadd_rn(p[0].z, p[0].w));
  const float hi = __fadd_rn(__fadd_rn(p[1].x, p[1].y), __fadd_rn(p[1].z, p[1].w));
  return rowgroup_sum(__fadd_rn(lo, hi));
}

// Per step and head, as cpu::kda_scan:
//   S[i, :] = S[i, :] * exp(g[i]);  kv = sum_i S[i, :] * k[i]
//   d = (v - kv) * beta
//   S[i, :] = S[i, :] + k[i] * d;   o = sum_i S[i, :] * (q[i] * scale)
// The sums run in the fixed order of the geometry comment. q, k, g [B, T, H, dk];
// v, o [B, T, H, dv]; beta [B, T, H]; state planes [H, dk, dv].
__global__ void __launch_bounds__(kScanThreads)
    scan_kernel(const float* __restrict__ q, const float* __restrict__ k,
                const float* __restrict__ v, const float* __restrict__ g,
                const float* __restrict__ beta, int T, int H, float scale,
                const float* const* state_in, float* const* state_out, float* __restrict__ o) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  // Per warp: k, scale * q, exp(g) of the current step, as float4 quads of rows.
  __shared__ float4 sk[kWarpsPerBlock][kScanDk / 4];
  __shared__ float4 sq[kWarpsPerBlock][kScanDk / 4];
  __shared__ float4 se[kWarpsPerBlock][kScanDk / 4];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int rg = lane / kTileV;
  const int c = lane % kTileV;
  const int part = static_cast<int>(blockIdx.x % kBlocksPerHead);
  const int64_t bh = blockIdx.x / kBlocksPerHead;  // b * H + h
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int j = (part * kWarpsPerBlock + warp) * kTileV + c;  // this lane's column
  const int64_t plane_off = static_cast<int64_t>(h) * kScanDk * kScanDv;
  const int64_t my_off = plane_off + static_cast<int64_t>(rg * kRowsPerLane) * kScanDv + j;

  float S[kRowsPerLane];  // S[r] = state[h, rg*32 + r, j]
  const float* sin = state_in ? state_in[b] : nullptr;
  if (sin) {
#pragma unroll
    for (int r = 0; r < kRowsPerLane; ++r) S[r] = sin[my_off + static_cast<int64_t>(r) * kScanDv];
  } else {
#pragma unroll
    for (int r = 0; r < kRowsPerLane; ++r) S[r] = 0.0f;
  }

  const int64_t th0 = b * T * H + h;  // row (b, t = 0, h) of [B, T, H, *]
  ScanStepIn next;
  if (T > 0) next = scan_load(q, k, v, g, beta, th0, lane, j);
  for (int t = 0; t < T; ++t) {
    const int64_t th = th0 + static_cast<int64_t>(t) * H;
    const ScanStepIn cur = next;
    if (t + 1 < T) next = scan_load(q, k, v, g, beta, th + H, lane, j);  // prefetch step t+1

    const float4 e = make_float4(expf(cur.g.x), expf(cur.g.y), expf(cur.g.z), expf(cur.g.w));
    const float4 qs = make_float4(__fmul_rn(cur.q.x, scale), __fmul_rn(cur.q.y, scale),
                                  __fmul_rn(cur.q.z, scale), __fmul_rn(cur.q.w, scale));
    __syncwarp();  // every lane is done reading the previous step's vectors
    sk[warp][lane] = cur.k;
    sq[warp][lane] = qs;
    se[warp][lane] = e;
    __syncwarp();

    // Decay, and kv = k^T S over the decayed rows.
    float4 p[2] = {make_float4(0.0f, 0.0f, 0.0f, 0.0f), make_float4(0.0f, 0.0f, 0.0f, 0.0f)};
#pragma unroll
    for (int m = 0; m < kQuadsPerLane; ++m) {
      float4& pm = p[m / kQuadsPerGroup];
      const float4 kk = sk[warp][rg * kQuadsPerLane + m];
      const float4 ee = se[warp][rg * kQuadsPerLane + m];
      float* s4 = S + 4 * m;
      s4[0] = __fmul_rn(s4[0], ee.x);
      s4[1] = __fmul_rn(s4[1], ee.y);
      s4[2] = __fmul_rn(s4[2], ee.z);
      s4[3] = __fmul_rn(s4[3], ee.w);
      pm.x = __fadd_rn(pm.x, __fmul_rn(s4[0], kk.x));
      pm.y = __fadd_rn(pm.y, __fmul_rn(s4[1], kk.y));
      pm.z = __fadd_rn(pm.z, __fmul_rn(s4[2], kk.z));
      pm.w = __fadd_rn(pm.w, __fmul_rn(s4[3], kk.w));
    }
    const float kv = lane_sum(p);
    const float d = __fmul_rn(__fsub_rn(cur.v, kv), cur.beta);

    // Rank-1 update, and o = (scale q)^T S over the updated rows.
    float4 a[2] = {make_float4(0.0f, 0.0f, 0.0f, 0.0f), make_float4(0.0f, 0.0f, 0.0f, 0.0f)};
#pragma unroll
    for (int m = 0; m < kQuadsPerLane; ++m) {
      float4& am = a[m / kQuadsPerGroup];
      const float4 kk = sk[warp][rg * kQuadsPerLane + m];
      const float4 qq = sq[warp][rg * kQuadsPerLane + m];
      float* s4 = S + 4 * m;
      s4[0] = __fadd_rn(s4[0], __fmul_rn(kk.x, d));
      s4[1] = __fadd_rn(s4[1], __fmul_rn(kk.y, d));
      s4[2] = __fadd_rn(s4[2], __fmul_rn(kk.z, d));
      s4[3] = __fadd_rn(s4[3], __fmul_rn(kk.w, d));
      am.x = __fadd_rn(am.x, __fmul_rn(s4[0], qq.x));
      am.y = __fadd_rn(am.y, __fmul_rn(s4[1], qq.y));
      am.z = __fadd_rn(am.z, __fmul_rn(s4[2], qq.z));
      am.w = __fadd_rn(am.w, __fmul_rn(s4[3], qq.w));
    }
    const float out = lane_sum(a);
    if (rg == 0) o[th * kScanDv + j] = out;
  }

  float* sout = state_out[b];
  if (sout) {
#pragma unroll
    for (int r = 0; r < kRowsPerLane; ++r) sout[my_off + static_cast<int64_t>(r) * kScanDv] = S[r];
  }
}

// The TABLES form: any T, no fusion (the decode kernel at T == 1, scan_kernel otherwise).
int scan_tables(MemraCudaCtx* ctx, const MemraKdaScanParams& p) {
  const int B = p.B, T = p.T, H = p.H, dk = p.dk, dv = p.dv;
  if (B < 0 || T < 0 || H < 0 || dk < 1 || dv < 1) return memra::kContractShape;
  if (p.beta_ld != 0 && p.beta_ld != H) return memra::kContractValue;  // contiguous beta
  if (dk != kScanDk || dv != kScanDv) return memra::kUnsupportedGeometry;
  if (B == 0 || T == 0 || H == 0) return memra::kOk;
  if (!p.q || !p.k || !p.v || !p.g || !p.beta || !p.state.out_table || !p.o) {
    return memra::kContractMissing;
  }
  // float4 loads of q, k, g (both kernels) and of v / stores of o (decode kernel).
  for (const void* a : {static_cast<const void*>(p.q), static_cast<const void*>(p.k),
                        static_cast<const void*>(p.v), static_cast<const void*>(p.g),
                        static_cast<const void*>(p.o)}) {
    if (reinterpret_cast<uintptr_t>(a) & 15u) return memra::kContractStride;
  }
  // A bf16 model's prefill: the chunked form on tensor cores (cuda/kda_chunk.cu), any T, the
  // only form that reads bf16 inputs.
  if (p.chunked) return memra::cuda::kda::scan_chunked_tables(ctx, p);
  if (p.in_dtype != 0 || p.o_dtype != 0) return memra::kUnsupportedGeometry;
  // The decode step: same bits as scan_kernel at T = 1, at stream bandwidth.
  if (T == 1) return memra::cuda::kda::scan_decode_tables(ctx, p);
  const int64_t blocks = static_cast<int64_t>(B) * H * kBlocksPerHead;
  if (blocks > 0x7fffffffLL) return memra::kContractShape;
  memra::cuda::launch(ctx, true, scan_kernel, dim3(static_cast<unsigned>(blocks)),
      dim3(kScanThreads), 0, static_cast<const float*>(p.q), static_cast<const float*>(p.k),
      static_cast<const float*>(p.v), static_cast<const float*>(p.g), p.beta, T, H, p.scale,
      p.state.in_table, p.state.out_table, static_cast<float*>(p.o));
  return launch_status();
}

// The STRIDED form: the decode step (T == 1, not chunked) over contiguous rows' planes, the
// TABLES form's checks and kernels without the table (RowPlanes resolves row b's planes).
int scan_strided(MemraCudaCtx* ctx, const MemraKdaScanParams& p) {
  const int B = p.B, T = p.T, H = p.H, dk = p.dk, dv = p.dv;
  const MemraKdaPlanes& s = p.state;
  if (B < 0 || T < 0 || H < 0 || dk < 1 || dv < 1) return memra::kContractShape;
  if (p.beta_ld != 0 && p.beta_ld != H) return memra::kContractValue;  // contiguous beta
  if (dk != kScanDk || dv != kScanDv) return memra::kUnsupportedGeometry;
  if (B == 0 || T == 0 || H == 0) return memra::kOk;
  if (T != 1 || p.chunked || p.in_dtype != 0 || p.o_dtype != 0) {
    return memra::kUnsupportedGeometry;
  }
  if (!p.q || !p.k || !p.v || !p.g || !p.beta || !s.out || !p.o) return memra::kContractMissing;
  if (s.floats < static_cast<int64_t>(H) * dk * dv) return memra::kContractValue;
  // float4 loads of q, k, g, v and the planes, float4 stores of o and the planes.
  if (s.floats % 4 != 0) return memra::kContractStride;
  for (const void* a : {static_cast<const void*>(p.q), static_cast<const void*>(p.k),
                        static_cast<const void*>(p.v), static_cast<const void*>(p.g),
                        static_cast<const void*>(p.o), static_cast<const void*>(s.in),
                        static_cast<const void*>(s.out)}) {
    if (reinterpret_cast<uintptr_t>(a) & 15u) return memra::kContractStride;
  }
  return memra::cuda::kda::scan_decode_tables(ctx, p);
}

}  // namespace

extern "C" {

int memra_cuda_kda_gate(MemraCudaCtx* ctx, const MemraKdaGateParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!p) return memra::kContractMissing;
  const int T = p->T, H = p->H, dk = p->dk, form = p->form;
  const int64_t nbeta = p->nbeta;
  if (form != 0 && form != 1) return memra::kContractValue;
  if (T < 0 || H < 0 || dk < 0) return memra::kContractShape;
  const int64_t D = static_cast<int64_t>(H) * dk;
  if (D > 0x7fffffffLL) return memra::kContractShape;
  if (T == 0 || D == 0) return memra::kOk;
  if (!p->f || !p->dt_bias || !p->A_log || !p->g) return memra::kContractMissing;
  if (nbeta < 0 || (nbeta > 0 && !p->beta)) return memra::kContractValue;
  const int row_blocks = static_cast<int>(memra::cuda::ceil_div(T, kGateRowsPerBlock));
  const dim3 grid(memra::cuda::ceil_div(D, kGateThreads),
                  row_blocks < kMaxGridY ? row_blocks : kMaxGridY);
  memra::cuda::launch(ctx, true, gate_kernel, dim3(grid), dim3(kGateThreads), 0, p->f, p->dt_bias,
                      p->A_log, T, static_cast<int>(D), dk, form, p->lower_bound, p->g, p->beta,
                      nbeta);
  return launch_status();
}

int memra_cuda_kda_scan(MemraCudaCtx* ctx, const MemraKdaScanParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!p) return memra::kContractMissing;
  if ((p->in_dtype != 0 && p->in_dtype != 1) || (p->o_dtype != 0 && p->o_dtype != 1)) {
    return memra::kContractValue;
  }
  switch (p->state.form) {
    case MEMRA_KDA_PLANES_TABLES:
      if (p->fuse_gates || p->fuse_norm) return memra::kUnsupportedGeometry;
      return scan_tables(ctx, *p);
    case MEMRA_KDA_PLANES_STRIDED:
      if (p->fuse_gates || p->fuse_norm) return memra::kUnsupportedGeometry;
      return scan_strided(ctx, *p);
    case MEMRA_KDA_PLANES_SLOTS:
      // The one kernel of this form: a decode step with the gates and the norm fused.
      // o in bf16 (o_dtype 1): the gated norm's values rounded as they are stored.
      if (!p->fuse_gates || !p->fuse_norm || p->T != 1 || p->in_dtype != 0) {
        return memra::kUnsupportedGeometry;
      }
      return memra::cuda::kda::scan_decode_slots(ctx, *p);
    default:
      return memra::kContractValue;
  }
}

}  // extern "C"
