// Gated DeltaNet area of the CUDA library (cpp/include/memra/cuda_abi/gdn.h): the GPU twins of
// cpu::gdn_gate / gdn_l2norm / gdn_scan / rms_norm_gated_silu (cpp/src/cpu/gdn.cpp, the oracle).
//
// Rounding: elementwise arithmetic is written with round-to-nearest intrinsics (__fadd_rn /
// __fmul_rn / __fdiv_rn / __fsqrt_rn, never contracted into an FMA), so each element sees the
// CPU reference's operations; what differs is expf / log1pf (CUDA's within 2 ulp) and the order of
// the row sums (a warp / group tree instead of one ascending chain).
//
// The scan reuses KDA's kernels: GDN's step is KDA's with the head's decay broadcast over dk and
// the key heads repeated over their value heads (repeat_interleave). The chunked form (bf16
// prefill) reads key head h / group and the scalar decay in place (cuda/kda_chunk.cu's
// ChunkProblem); the sequential scan (and the chunked form on rows it cannot load as float4)
// runs on gdn_expand_kernel's copies in scratch through memra_cuda_kda_scan (its T == 1 form is
// KDA's bandwidth-shaped decode kernel).
#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "kda_common.cuh"
#include "row_group.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::rowsum::Group;
using memra::cuda::rowsum::group_for;
using memra::cuda::rowsum::group_sum;
using memra::cuda::rowsum::kGatedCols;
using memra::cuda::rowsum::load_row_cols;
using memra::cuda::rowsum::row_blocks;
using memra::cuda::rowsum::row_sum_squares;
using memra::cuda::rowsum::with_group;

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride loops beyond this

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// ---------------------------------------------------------------- gates

// cpu::gdn_gate element (t, h) = i: g = -exp(A_log) * softplus(a + dt_bias) (F.softplus: x above
// 20, else log1p(exp(x))), beta = 1 / (1 + exp(-b)).
// Elements first, first + stride, ... (the body of gdn_gate_kernel and of the fused
// gdn_l2norm_gate_kernel: each element's operations do not depend on the thread that runs it).
__device__ __forceinline__ void gate_elements(const MemraGdnGateParams& p, int64_t first,
                                              int64_t stride) {
  const int64_t n = int64_t(p.T) * p.H;
  for (int64_t i = first; i < n; i += stride) {
    const int64_t t = i / p.H;
    const int h = static_cast<int>(i - t * p.H);
    const float x = __fadd_rn(p.a[t * p.lda + h], p.dt_bias[h]);
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    p.g[i] = __fmul_rn(-expf(p.A_log[h]), sp);
    p.beta[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-p.b[t * p.ldb + h])));
  }
}

__global__ void gdn_gate_kernel(MemraGdnGateParams p) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  gate_elements(p, int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                int64_t(gridDim.x) * blockDim.x);
}

// ---------------------------------------------------------------- q / k L2 norm

// cpu::gdn_l2norm: vector vi = r * heads + h (at x + r*ld + h*d) per group of G threads:
// the sum of squares (row_sum_squares' order), then x * (1 / sqrt(ss + eps)). Each element is
// read and written by the same thread, after the reduction.
// The body of block `block` (every thread of it: barriers), shared by gdn_l2norm_kernel and the
// fused gdn_l2norm_gate_kernel.
template <int G>
__device__ __forceinline__ void l2norm_block(float* x, int64_t vecs, int heads, int d, int64_t ld,
                                             float eps, int64_t block, float* red) {
  const int64_t vi = Group<G>::row(block);
  const int lane = Group<G>::lane();
  const bool live = vi < vecs;
  const int64_t r = live ? vi / heads : 0;
  const int h = live ? static_cast<int>(vi - r * heads) : 0;
  float* xv = x + r * ld + int64_t(h) * d;
  const float ss = row_sum_squares<G>(xv, live, lane, d, red);  // every thread: barriers
  if (!live) return;
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ss, eps)));
  for (int i = lane; i < d; i += G) xv[i] = __fmul_rn(xv[i], inv);
}

template <int G>
__global__ void __launch_bounds__(Group<G>::kBlock)
    gdn_l2norm_kernel(float* x, int64_t vecs, int heads, int d, int64_t ld, float eps) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[Group<G>::kWarps];
  l2norm_block<G>(x, vecs, heads, d, ld, eps, blockIdx.x, red);
}

// memra_cuda_gdn_l2norm_gate: gdn_l2norm_kernel's blocks [0, l2_blocks) and gdn_gate_kernel's
// elements over the blocks after them, in one launch (the two ops read and write disjoint
// arrays; at a decode row each is a few blocks, so the launch, not the work, was their cost).
// Each part runs its standalone kernel's body: the same bytes.
template <int G>
__global__ void __launch_bounds__(Group<G>::kBlock)
    gdn_l2norm_gate_kernel(float* x, int64_t vecs, int heads, int d, int64_t ld, float eps,
                           unsigned l2_blocks, MemraGdnGateParams gp) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[Group<G>::kWarps];
  if (blockIdx.x < l2_blocks) {  // block-uniform: the norm's barriers see the whole block
    l2norm_block<G>(x, vecs, heads, d, ld, eps, blockIdx.x, red);
    return;
  }
  gate_elements(gp, int64_t(blockIdx.x - l2_blocks) * blockDim.x + threadIdx.x,
                int64_t(gridDim.x - l2_blocks) * blockDim.x);
}

// ---------------------------------------------------------------- scan inputs

// The inputs of kda_scan from GDN's: for row n (= b*T + t) and value head h,
//   qe[n, h, :] = q[n*qk_ld + (h / group)*dk + :], ke likewise, ge[n, h, :] = g[n, h] (dk copies),
//   ve[n, h, :] = v[n*v_ld + h*dv + :]
// (qe, ke, ge [N, Hv, dk]; ve [N, Hv, dv]: contiguous and 16-byte aligned, as kda_scan loads them).
struct Expand {
  const float* q;
  const float* k;
  const float* v;
  const float* g;
  int64_t qk_ld, v_ld, N;
  int Hv, group, dk, dv;
  float* qe;
  float* ke;
  float* ve;
  float* ge;
};

__global__ void gdn_expand_kernel(Expand p) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nk = p.N * p.Hv * p.dk;
  for (int64_t i = first; i < nk; i += stride) {
    const int64_t nh = i / p.dk;  // n * Hv + h
    const int c = static_cast<int>(i - nh * p.dk);
    const int64_t n = nh / p.Hv;
    const int h = static_cast<int>(nh - n * p.Hv);
    const int64_t src = n * p.qk_ld + int64_t(h / p.group) * p.dk + c;
    p.qe[i] = p.q[src];
    p.ke[i] = p.k[src];
    p.ge[i] = p.g[nh];
  }
  const int64_t nv = p.N * p.Hv * p.dv;
  for (int64_t i = first; i < nv; i += stride) {
    const int64_t nh = i / p.dv;
    const int c = static_cast<int>(i - nh * p.dv);
    const int64_t n = nh / p.Hv;
    const int h = static_cast<int>(nh - n * p.Hv);
    p.ve[i] = p.v[n * p.v_ld + int64_t(h) * p.dv + c];
  }
}

// ---------------------------------------------------------------- SiLU-gated RMSNorm

// silu as ATen computes it: z / (1 + exp(-z)).
__device__ __forceinline__ float silu(float z) {
  return __fdiv_rn(z, __fadd_rn(1.0f, expf(-z)));
}

// cpu::rms_norm_gated_silu: y = (w * (x * inv)) * silu(gate), inv = 1 / sqrt(sum(x^2) / D + eps),
// a row per group of G threads (rms_norm_gated_kernel's shape, cuda/basic.cu, with the SiLU
// gate). Rows of at most kGatedCols * G values are loaded into registers before anything is
// stored (y may alias x); longer rows read and write each element in the same thread after the
// reduction.
template <int G>
__global__ void __launch_bounds__(Group<G>::kBlock)
    gated_norm_silu_kernel(const float* x, const float* gate, int64_t rows, int D,
                           const float* w, float eps, float* y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[Group<G>::kWarps];
  const int64_t row = Group<G>::row(blockIdx.x);
  const int lane = Group<G>::lane();
  const bool live = row < rows;
  const float* xr = x + (live ? row : 0) * D;
  const float* zr = gate + (live ? row : 0) * D;
  float* yr = y + (live ? row : 0) * D;
  if (D <= kGatedCols * G) {
    float xv[kGatedCols], zv[kGatedCols], wv[kGatedCols];
    load_row_cols<G>(xr, live, lane, D, xv);
    load_row_cols<G>(zr, live, lane, D, zv);
    load_row_cols<G>(w, live, lane, D, wv);
    float ss = 0.0f;  // row_sum_squares' order: columns lane, lane + G, ...
#pragma unroll
    for (int c = 0; c < kGatedCols; ++c) {
      if (live && lane + G * c < D) ss += xv[c] * xv[c];
    }
    ss = group_sum<G>(ss, red);  // every thread: barriers
    if (!live) return;
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(D)), eps)));
#pragma unroll
    for (int c = 0; c < kGatedCols; ++c) {
      const int i = lane + G * c;
      if (i < D) yr[i] = __fmul_rn(__fmul_rn(wv[c], __fmul_rn(xv[c], inv)), silu(zv[c]));
    }
    return;
  }
  const float ss = row_sum_squares<G>(xr, live, lane, D, red);
  if (!live) return;
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(D)), eps)));
  for (int i = lane; i < D; i += G) {
    yr[i] = __fmul_rn(__fmul_rn(w[i], __fmul_rn(xr[i], inv)), silu(zr[i]));
  }
}

}  // namespace

extern "C" {

int memra_cuda_gdn_gate(MemraCudaCtx* ctx, const MemraGdnGateParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!p) return memra::kContractMissing;
  if (p->T < 0 || p->H < 0 || p->lda < p->H || p->ldb < p->H) return memra::kContractShape;
  if (p->T == 0 || p->H == 0) return memra::kOk;
  if (!p->a || !p->b || !p->dt_bias || !p->A_log || !p->g || !p->beta) {
    return memra::kContractMissing;
  }
  memra::cuda::launch(ctx, true, gdn_gate_kernel, dim3(grid_for(int64_t(p->T) * p->H)),
                      dim3(kThreads), 0, *p);
  return launch_status();
}

int memra_cuda_gdn_l2norm(MemraCudaCtx* ctx, float* x, int rows, int heads, int d, int64_t ld,
                          float eps) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (rows < 0 || heads < 0 || d < 1 || ld < int64_t(heads) * d) return memra::kContractShape;
  if (rows == 0 || heads == 0) return memra::kOk;
  if (!x) return memra::kContractMissing;
  const int64_t vecs = int64_t(rows) * heads;
  with_group(group_for(d), [&](auto g) {
    constexpr int G = decltype(g)::value;
    memra::cuda::launch(ctx, true, gdn_l2norm_kernel<G>, dim3(row_blocks<G>(vecs)),
                        dim3(Group<G>::kBlock), 0, x, vecs, heads, d, ld, eps);
  });
  return launch_status();
}

int memra_cuda_gdn_l2norm_gate(MemraCudaCtx* ctx, float* x, int rows, int heads, int d,
                               int64_t ld, float eps, const MemraGdnGateParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  // Each part's own checks, in the order of the two calls it replaces.
  if (rows < 0 || heads < 0 || d < 1 || ld < int64_t(heads) * d) return memra::kContractShape;
  if (rows > 0 && heads > 0 && !x) return memra::kContractMissing;
  if (!p) return memra::kContractMissing;
  if (p->T < 0 || p->H < 0 || p->lda < p->H || p->ldb < p->H) return memra::kContractShape;
  const bool gates = p->T > 0 && p->H > 0;
  if (gates && (!p->a || !p->b || !p->dt_bias || !p->A_log || !p->g || !p->beta)) {
    return memra::kContractMissing;
  }
  if (rows == 0 || heads == 0) return gates ? memra_cuda_gdn_gate(ctx, p) : memra::kOk;
  if (!gates) return memra_cuda_gdn_l2norm(ctx, x, rows, heads, d, ld, eps);
  const int64_t vecs = int64_t(rows) * heads;
  with_group(group_for(d), [&](auto g) {
    constexpr int G = decltype(g)::value;
    const unsigned l2_blocks = row_blocks<G>(vecs);
    const int64_t n = int64_t(p->T) * p->H;
    const int64_t gate_blocks =
        std::min<int64_t>((n + Group<G>::kBlock - 1) / Group<G>::kBlock, kMaxBlocks);
    memra::cuda::launch(ctx, true, gdn_l2norm_gate_kernel<G>,
                        dim3(l2_blocks + static_cast<unsigned>(gate_blocks)),
                        dim3(Group<G>::kBlock), 0, x, vecs, heads, d, ld, eps, l2_blocks, *p);
  });
  return launch_status();
}

int memra_cuda_gdn_scan(MemraCudaCtx* ctx, const MemraGdnScanParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!p) return memra::kContractMissing;
  if (p->B < 0 || p->T < 0 || p->Hk < 1 || p->Hv < 1 || p->Hv % p->Hk != 0 || p->dk < 1 ||
      p->dv < 1 || p->qk_ld < int64_t(p->Hk) * p->dk || p->v_ld < int64_t(p->Hv) * p->dv) {
    return memra::kContractShape;
  }
  // kda_scan's instantiation (checked here too, before any scratch is taken).
  if (p->dk != 128 || p->dv != 128) return memra::kUnsupportedGeometry;
  if (p->B == 0 || p->T == 0) return memra::kOk;
  if (!p->q || !p->k || !p->v || !p->g || !p->beta || !p->state_out || !p->o) {
    return memra::kContractMissing;
  }
  if (!memra::cuda::aligned16(p->o)) return memra::kContractStride;
  // The chunked form reads the key heads and the per-head decay where they are (float4 rows of
  // q, k and v); rows it cannot load that way go through the expansion below.
  if (p->chunked && memra::cuda::aligned16(p->q) && memra::cuda::aligned16(p->k) &&
      memra::cuda::aligned16(p->v) && p->qk_ld % 4 == 0 && p->v_ld % 4 == 0) {
    memra::cuda::kda::ChunkProblem c{};
    c.q = p->q;
    c.k = p->k;
    c.v = p->v;
    c.g = p->g;
    c.beta = p->beta;
    c.ld_qk = p->qk_ld;
    c.ld_v = p->v_ld;
    c.B = p->B;
    c.T = p->T;
    c.H = p->Hv;
    c.group = p->Hv / p->Hk;
    c.scalar_g = 1;
    c.scale = p->scale;
    c.state_in = p->state_in;
    c.state_out = p->state_out;
    c.o = p->o;
    return memra::cuda::kda::scan_chunked(ctx, c);
  }
  const int64_t N = int64_t(p->B) * p->T;
  const int64_t nk = N * p->Hv * p->dk, nv = N * p->Hv * p->dv;
  // qe | ke | ge (nk each) | ve (nv): one allocation, every part 16-byte aligned (nk is a
  // multiple of dk = 128 floats).
  memra::cuda::Scratch scratch(ctx, size_t(3 * nk + nv) * sizeof(float));
  MEMRA_CUDA_RETURN_IF(scratch.status());
  float* qe = scratch.as<float>();
  Expand e{p->q, p->k, p->v, p->g, p->qk_ld, p->v_ld, N, p->Hv, p->Hv / p->Hk, p->dk, p->dv,
           qe, qe + nk, qe + 3 * nk, qe + 2 * nk};
  memra::cuda::launch(ctx, true, gdn_expand_kernel, dim3(grid_for(nk > nv ? nk : nv)),
                      dim3(kThreads), 0, e);
  MEMRA_CUDA_RETURN_IF(launch_status());
  // KDA's scan over the expanded heads: the TABLES form (no fused gates or norm).
  MemraKdaScanParams scan{};
  scan.q = e.qe;
  scan.k = e.ke;
  scan.v = e.ve;
  scan.g = e.ge;
  scan.beta = p->beta;
  scan.B = p->B;
  scan.T = p->T;
  scan.H = p->Hv;
  scan.dk = p->dk;
  scan.dv = p->dv;
  scan.scale = p->scale;
  scan.state.form = MEMRA_KDA_PLANES_TABLES;
  scan.state.in_table = p->state_in;
  scan.state.out_table = p->state_out;
  scan.o = p->o;
  scan.chunked = p->chunked;
  return memra_cuda_kda_scan(ctx, &scan);
}

int memra_cuda_rms_norm_gated_silu(MemraCudaCtx* ctx, const float* x, const float* gate, int T,
                                   int D, const float* w, float eps, float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || D < 0) return memra::kContractValue;
  if (T == 0 || D == 0) return memra::kOk;
  if (!x || !gate || !w || !y) return memra::kContractMissing;
  with_group(group_for(D), [&](auto g) {
    constexpr int G = decltype(g)::value;
    memra::cuda::launch(ctx, true, gated_norm_silu_kernel<G>, dim3(row_blocks<G>(T)),
                        dim3(Group<G>::kBlock), 0, x, gate, int64_t(T), D, w, eps, y);
  });
  return launch_status();
}

}  // extern "C"
