// KDA area of the CUDA library (cpp/include/memra/cuda_abi/kda.h): the GPU twins of
// cpu::kda_conv_prefill / kda_conv_decode / kda_gate / kda_scan (cpp/src/cpu/kda.cpp, the oracle).
//
// Rounding: every arithmetic operation is written with an explicit round-to-nearest intrinsic
// (__fmul_rn / __fadd_rn / __fdiv_rn), which nvcc never contracts into an FMA, so each element
// sees the operations of the CPU reference (x86-64 without FMA rounds every op). What still
// differs from the CPU: expf / logf (CUDA's are within 2 ulp, glibc's ~0.5 ulp) and, in the scan,
// the order of the dk-long sums (partial sums + a warp tree instead of one ascending chain).
//
// Bit-exactness between arms is by construction: the conv's prefill and decode kernels call one
// __device__ function per output; the scan's per-step arithmetic does not depend on where its
// state came from (registers or f32 memory hold the same bits), so T chained one-step launches
// equal one T-step launch, and a sequence in a batch equals it alone. The scan has two kernels:
// scan_kernel (any T; a warp per 8 columns, the latency-bound prefill) and scan_decode_kernel
// (T == 1; a warp per 16 columns, shaped for bandwidth). Both perform each element's operations
// in the same order, including every dk-long sum's fixed order (see the geometry comments), so
// they agree bit for bit at T = 1, which the tests assert.
//
// Decode bandwidth (scan_decode_kernel): the step moves 2 * 64 KB of state per (b, h) and little
// else, so it is judged against a device-to-device copy. What makes it copy-like:
// - every state access is a 16-byte load (ld.global.cs) or store (st.global.cs), a warp
//   instruction covering 8 rows x 64 contiguous bytes (whole 32-byte sectors; the other half of
//   each 128-byte line is read by the neighbouring warp of the same block at the same time);
// - all 16 state loads of a lane, and the step's vectors, are issued before anything waits on
//   memory (checked in the SASS: one wait per warp, not a chain of them): 8 KB per warp, and at
//   128 registers 4 blocks (16 warps) per SM fit, up to 128 KB of reads in flight per SM against
//   the ~25-35 KB Little's law asks at 4.3 TB/s (16 GB/s of reads per SM x ~1.5-2 us of loaded
//   latency); even with half of the warps in their arithmetic or store phase, ~64 KB remain;
// - no block barrier and no shared-memory traffic for the state: warps drift apart, so an SM
//   overlaps some warps' loads with others' arithmetic and fire-and-forget stores, as a copy
//   kernel's warps do; the per-warp vectors (1.8 KB) are written once behind a __syncwarp;
// - arithmetic: ~1000 instructions per warp per 16 KB of traffic, ~25 % of an SM's issue rate
//   at 4.3 TB/s, so the SM never becomes the limit;
// - grid: B * H * 2 blocks, ordered (b, h, column half), so consecutive blocks stream
//   consecutive 64 KB planes; at B = 64, H = 64 that is 8192 blocks over 528 resident slots
//   (~15 waves; the ramp and tail cost about one block lifetime, ~3 us of ~130 us).
// Left over against the copy: launch ramp, tail, and the extra q/k/g/v/o traffic (< 1 %), so
// >= 0.92 of the measured copy bandwidth is expected at B >= 64. At B = 1 (512 warps, ~4 per
// SM) the kernel is latency-bound: one load round trip + ~1000 dependent-ish instructions +
// the stores, a few microseconds.
// The form with the gated norm fused (kda_gate_scan_decode_slots with gate_o: KdaLayer's decode)
// runs a whole head per block of 8 warps (B * H blocks, 2 per SM at 128 registers, the same 16
// warps an SM) and has one block barrier, after the state's last store, for the norm's row.
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemv.cuh"
#include "gemv_rows.cuh"
#include "linear.cuh"
#include "row_group.cuh"

using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::rowsum::row_sum_squares;
namespace rowsum = memra::cuda::rowsum;

namespace {

// ---------------------------------------------------------------- conv

// Element p of channel c's extended input (ring ++ x): positions [0, K-1) are the ring, oldest
// first (ring_c == nullptr reads zeros); position K-1+t is x[t, c]. x [T, C]; ring_c [K-1].
template <int K>
__device__ __forceinline__ float conv_extended_at(const float* x, int64_t C, const float* ring_c,
                                                  int64_t p, int64_t c) {
  if (p < K - 1) return ring_c ? ring_c[p] : 0.0f;
  return x[(p - (K - 1)) * C + c];
}

// Where channel c's output row 0 lands when the C channels are split into groups of G (C % G ==
// 0) and the output is the groups' [rows, G] tensors one after another: y[(c / G) * rows * G +
// r * G + c % G] for row r. G == C gives the plain [rows, C] layout (y[r * C + c]); KdaLayer
// passes G = qkv so that one launch over the fused q|k|v channels leaves q, k and v contiguous.
__device__ __forceinline__ int64_t y_group_at(int c, int rows, int G) {
  const int grp = c / G;
  return static_cast<int64_t>(grp) * rows * G + (c - grp * G);
}

// One conv output silu(sum_k w[k] * win[k]) over the K-wide window win (oldest first), the taps
// summed in ascending k from 0.0f as cpu::conv_silu_at does; silu as x / (1 + exp(-x)). Both conv
// arms call this, which makes decode == prefill(T = 1) bit for bit.
template <int K>
__device__ __forceinline__ float conv_silu_window(const float (&win)[K], const float (&w)[K]) {
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) acc = __fadd_rn(acc, __fmul_rn(w[k], win[k]));
  return __fdiv_rn(acc, __fadd_rn(1.0f, expf(-acc)));
}

// Prefill: thread (c, chunk) walks tokens [t0, t0 + chunk) of channel c with a sliding window in
// registers, so each input is read once (plus K-1 halo per chunk); loads and stores coalesced
// over c. The blocks of chunk 0 also write the new ring ring_out[c, j] = ext[T + j] (the last
// K-1 inputs of ring_in ++ x; for T < K-1 it still holds old ring values, shifted to the front).
// Output (t, c) lands at y_group_at(c, T, G) + t * G (the channel groups of width G split into
// consecutive [T, G] tensors; G == C is the plain [T, C] layout). Grid: x over channels, y
// (strided) over chunks.
template <int K>
__global__ void conv_prefill_kernel(const float* __restrict__ x, int T, int C, int G, int chunk,
                                    const float* __restrict__ w, const float* __restrict__ ring_in,
                                    float* __restrict__ ring_out, float* __restrict__ y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  constexpr int R = K - 1;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float* ring_c = ring_in ? ring_in + static_cast<int64_t>(c) * R : nullptr;
  float* y_c = y + y_group_at(c, T, G);
  float wr[K];
#pragma unroll
  for (int k = 0; k < K; ++k) wr[k] = w[static_cast<int64_t>(c) * K + k];
  const int n_chunks = (T + chunk - 1) / chunk;
  for (int ch = blockIdx.y; ch < n_chunks; ch += gridDim.y) {
    const int t0 = ch * chunk;
    const int t1 = min(T, t0 + chunk);
    float win[K];
#pragma unroll
    for (int k = 0; k < R; ++k) win[k] = conv_extended_at<K>(x, C, ring_c, int64_t(t0) + k, c);
    for (int t = t0; t < t1; ++t) {
      win[R] = x[static_cast<int64_t>(t) * C + c];
      y_c[static_cast<int64_t>(t) * G] = conv_silu_window<K>(win, wr);
#pragma unroll
      for (int k = 0; k < R; ++k) win[k] = win[k + 1];
    }
  }
  if (blockIdx.y == 0) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      ring_out[static_cast<int64_t>(c) * R + j] =
          conv_extended_at<K>(x, C, ring_c, int64_t(T) + j, c);
    }
  }
}

// The per-row planes a decode kernel reads and writes (a conv ring or a scan state): the [B]
// pointer tables kda_tables builds (in null or a null entry = zeros; a null out entry is not
// written), or, with slots set (the *_slots entry points), resolved in the kernel from the device
// slots with kda_tables' arithmetic, which needs neither its launch nor its tables: row b with
// s = slots[b] >= 0 and c = cur[s] & 1 reads base<c> + s * floats + offset and writes
// base<1 - c> + s * floats + offset; an idle row (s < 0) reads zeros and writes nothing.
// early: slots, cur, the input planes and the kernel's weights are read before its pdl_wait (the
// caller guarantees that no kernel that may still be running writes them: with every kernel
// triggering its dependent after its own wait, that is the launch in front), so their latency is
// spent under that launch instead of on the step's critical path.
struct RowPlanes {
  const float* const* in = nullptr;
  float* const* out = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* cur = nullptr;
  float* base0 = nullptr;
  float* base1 = nullptr;
  int64_t floats = 0;
  int64_t offset = 0;
  bool early = false;

  __device__ __forceinline__ void at(int64_t b, const float** pin, float** pout) const {
    // slots and cur through L2 (__ldcg), belt and braces: with early, what is read before the
    // wait (these, the input planes, the taps) was last written by kernels that completed before
    // the launch in front of this one began (each kernel triggers its dependent only after its
    // own wait), so no cache can hold an older copy.
    if (slots) {
      const int s = __ldcg(slots + b);
      if (s < 0) {
        *pin = nullptr;
        *pout = nullptr;
        return;
      }
      const bool one = (__ldcg(cur + s) & 1) != 0;
      const int64_t off = static_cast<int64_t>(s) * floats + offset;
      *pin = (one ? base1 : base0) + off;
      *pout = (one ? base0 : base1) + off;
      return;
    }
    *pin = in ? in[b] : nullptr;
    *pout = out[b];
  }
};

// Decode: B sequences of one token. Thread (c, b) computes y[b, c] through the same
// conv_silu_window as the prefill arm, its window being ring_in[b][c, :] ++ x[b, c], and rolls
// channel c's ring: ring_out[b][c, j] = window[1 + j] (ring: RowPlanes). y (b, c) at
// y_group_at(c, B, G) + b * G, as the prefill arm's (t, c).
// Grid: x over channels, y (strided) over sequences.
// L2 (memra_cuda_kda_conv_decode_slots with l2_groups; C % kConvThreads == 0): a block's
// kConvThreads channels below l2_channels are one head of q or k (dk == kConvThreads),
// L2-normalised before the store
// with l2norm_kernel<32>'s arithmetic (warp 0: row_sum_squares<32> over the block's channels;
// sqrt(ss + eps); each value divided by it), so the bytes are those of
// the conv followed by l2norm_heads, and the prefill path (which runs the two) still agrees.
constexpr int kConvThreads = 128;

// The body of block (bx, by) of a grid with gy blocks in y (conv_decode_kernel, and the conv
// blocks of conv_pair_decode_kernel below). Every thread of the block calls it.
template <int K, bool L2>
__device__ __forceinline__ void conv_decode_block(const float* __restrict__ x, int B, int C, int G,
                                                  const float* __restrict__ w,
                                                  const RowPlanes& ring, float* __restrict__ y,
                                                  int l2_channels, float l2_eps, int bx, int by,
                                                  int gy) {
  constexpr int R = K - 1;
  __shared__ float ys[L2 ? kConvThreads : 1];
  __shared__ float norm;
  const int c = bx * blockDim.x + threadIdx.x;
  const bool active = L2 || c < C;  // L2: every thread is a channel (and takes the barriers)
  float wr[K];
  float win[K];
  const float* rin = nullptr;
  float* rout = nullptr;
  auto load_w = [&] {
#pragma unroll
    for (int k = 0; k < K; ++k) wr[k] = w[static_cast<int64_t>(c) * K + k];
  };
  auto load_ring = [&](int b) {  // the window's first R values, and the row's output plane
    ring.at(b, &rin, &rout);
    const float* ring_c = rin ? rin + static_cast<int64_t>(c) * R : nullptr;
#pragma unroll
    for (int k = 0; k < R; ++k) win[k] = ring_c ? ring_c[k] : 0.0f;
  };
  const int b0 = by;
  if (ring.early && active) {
    load_w();
    if (b0 < B) load_ring(b0);
  }
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  if (!active) return;
  if (!ring.early) load_w();
  const bool l2 = L2 && bx * kConvThreads < l2_channels;  // block-uniform
  float* y_c = y + y_group_at(c, B, G);
  for (int b = b0; b < B; b += gy) {
    if (!ring.early || b != b0) load_ring(b);
    const int64_t xi = static_cast<int64_t>(b) * C + c;
    win[R] = x[xi];
    float v = conv_silu_window<K>(win, wr);
    if (l2) {
      ys[threadIdx.x] = v;
      __syncthreads();
      if (threadIdx.x < 32) {  // one 32-lane group: no barrier inside (red unused)
        const float ss = row_sum_squares<32>(ys, true, threadIdx.x, kConvThreads, nullptr);
        if (threadIdx.x == 0) norm = sqrtf(ss + l2_eps);
      }
      __syncthreads();
      v = v / norm;
    }
    y_c[static_cast<int64_t>(b) * G] = v;
    if (rout) {
#pragma unroll
      for (int j = 0; j < R; ++j) rout[static_cast<int64_t>(c) * R + j] = win[1 + j];
    }
  }
}

template <int K, bool L2>
__global__ void conv_decode_kernel(const float* __restrict__ x, int B, int C, int G,
                                   const float* __restrict__ w, RowPlanes ring,
                                   float* __restrict__ y, int l2_channels, float l2_eps) {
  conv_decode_block<K, L2>(x, B, C, G, w, ring, y, l2_channels, l2_eps, blockIdx.x, blockIdx.y,
                           gridDim.y);
}

constexpr int kConvChunk = 16;   // tokens per thread in the prefill arm
constexpr int kMaxGridY = 65535;

template <int K>
void launch_conv_prefill(MemraCudaCtx* ctx, const float* x, int T, int C, int G, const float* w,
                         const float* ring_in, float* ring_out, float* y) {
  const int n_chunks = (T + kConvChunk - 1) / kConvChunk;
  const dim3 grid(memra::cuda::ceil_div(C, kConvThreads),
                  n_chunks < kMaxGridY ? n_chunks : kMaxGridY);
  memra::cuda::launch(ctx, true, conv_prefill_kernel<K>, dim3(grid), dim3(kConvThreads), 0, x, T, C,
      G, kConvChunk, w, ring_in, ring_out, y);
}

template <int K>
void launch_conv_decode(MemraCudaCtx* ctx, const float* x, int B, int C, int G, const float* w,
                        const RowPlanes& ring, float* y, int l2_channels, float l2_eps) {
  const dim3 grid(memra::cuda::ceil_div(C, kConvThreads), B < kMaxGridY ? B : kMaxGridY);
  if (l2_channels > 0) {
    memra::cuda::launch(ctx, true, conv_decode_kernel<K, true>, grid, dim3(kConvThreads), 0, x, B,
                        C, G, w, ring, y, l2_channels, l2_eps);
  } else {
    memra::cuda::launch(ctx, true, conv_decode_kernel<K, false>, grid, dim3(kConvThreads), 0, x, B,
                        C, G, w, ring, y, 0, 0.0f);
  }
}

// Calls f(std::integral_constant<int, K>) for K in 2..8; false for any other K.
template <typename F>
bool dispatch_conv_k(int K, F&& f) {
  switch (K) {
    case 2: f(std::integral_constant<int, 2>()); return true;
    case 3: f(std::integral_constant<int, 3>()); return true;
    case 4: f(std::integral_constant<int, 4>()); return true;
    case 5: f(std::integral_constant<int, 5>()); return true;
    case 6: f(std::integral_constant<int, 6>()); return true;
    case 7: f(std::integral_constant<int, 7>()); return true;
    case 8: f(std::integral_constant<int, 8>()); return true;
    default: return false;
  }
}

// ---------------------------------------------------------------- gate

// g[t, h*dk + i] from f[t, h*dk + i] + dt_bias[h*dk + i] and A_log[h], cpu::kda_gate's
// arithmetic op for op. Thread = one column (its head's rate and its bias loaded once), rows
// strided over grid.y. g may alias f (each element is read, then written, by one thread).
// beta (memra_cuda_kda_gate_beta): block (0, 0) also turns the nbeta logits beta into
// 1 / (1 + exp(-beta)) in place, memra_cuda_sigmoid's arithmetic (one launch less per step).
// One gate value from f + dt_bias (cpu::kda_gate's arithmetic; decay_rate = exp(A_log[h])).
__device__ __forceinline__ float gate_value(float f, float bias, float decay_rate, int form,
                                           float lower_bound) {
  const float x = __fadd_rn(f, bias);
  if (form == 0) {
    // lb * sigmoid(exp(A_log) * x), written as lb * (1 / (1 + exp(-(rate * x)))).
    return __fmul_rn(lower_bound,
                     __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(decay_rate, x)))));
  }
  // transformers' softplus: log(1 + exp(x)) (not log1p), x itself above 20.
  const float sp = x > 20.0f ? x : logf(__fadd_rn(1.0f, expf(x)));
  return __fmul_rn(-decay_rate, sp);
}

// beta from its logit (memra_cuda_sigmoid's arithmetic).
__device__ __forceinline__ float beta_value(float logit) { return 1.0f / (1.0f + expf(-logit)); }

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

// ---------------------------------------------------------------- scan

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
constexpr int kScanDk = 128;
constexpr int kScanDv = 128;
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

// ---------------------------------------------------------------- scan: the decode step (T == 1)

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
// scan_kernel geometry), summed in registers in the same order; two xor-shuffles over e give
// the group partial ((e0 + e1) + (e2 + e3)), the lane combines its four groups as
// ((P0 + P1) + (P2 + P3)) (or P4..P7), and one xor-shuffle over hg finishes the tree. Every
// element sees scan_kernel's operations at T = 1 (the same expf, the same __f*_rn), so the
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

// The gates of memra_cuda_kda_gate_scan_decode_slots: g and beta arrive raw (f, beta's logits)
// and the scan applies gate_kernel's arithmetic to them as it loads them.
struct RawGates {
  const float* dt_bias;  // [H * dk], 16-byte aligned
  const float* A_log;    // [H]
  int form;
  float lower_bound;
};

// One decode step of B sequences (T = 1), scan_kernel's arithmetic in its order (see above).
// q, k, g [B, 1, H, dk]; v, o [B, 1, H, dv]; beta [B, 1, H]; state planes [H, dk, dv]; every
// base 16-byte aligned (the entry point checks q, k, g, v, o; the planes' owners guarantee it).
// Grid: B * H * (kScanDv / (16 WARPS)) blocks, block = (b, h, a slice of the columns). RAW: g
// holds f and beta the logits (kda_gate_beta's inputs); each lane turns its four f into gates,
// and lane 0 its beta, with gate_kernel's functions, so the bits are those of kda_gate_beta
// followed by kda_scan. NORM (WARPS = 8, a whole head a block): o is written through
// rms_norm_gated_sigmoid over the head's row (gate_o [B, H, dv], w [dv], eps: the row body of
// rms_norm_gated_kernel<32>, gated_norm_short_row), the bytes of the scan then that launch.
struct GatedNorm {
  const float* gate;  // [B * H, dv]
  const float* w;     // [dv]
  float eps;
};

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

extern "C" {

int memra_cuda_kda_conv_prefill(MemraCudaCtx* ctx, const float* x, int T, int C, int G,
                                const float* w, int K, const float* ring_in, float* ring_out,
                                float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || C < 0) return memra::kContractShape;
  if (C > 0 && (G < 1 || C % G != 0)) return memra::kContractShape;
  if (K < 1) return memra::kContractValue;
  if (K < 2 || K > 8) return memra::kUnsupportedGeometry;
  if (T == 0 || C == 0) return memra::kOk;
  if (!x || !w || !ring_out || !y) return memra::kContractMissing;
  const bool ok = dispatch_conv_k(K, [&](auto kc) {
    launch_conv_prefill<decltype(kc)::value>(ctx, x, T, C, G, w, ring_in, ring_out, y);
  });
  if (!ok) return memra::kUnsupportedGeometry;
  return launch_status();
}

}  // extern "C"

namespace {

// memra_cuda_kda_conv_decode, then (l2_groups > 0) l2norm_heads over the first l2_groups channel
// groups of y, as rows of dk: in the conv kernel when a block's channels are exactly one head
// (dk == kConvThreads, G and C multiples of it), else memra_cuda_l2norm_heads after it.
// ring: the tables (ring.out checked non-null) or the device slots (ring.slots, cur and bases).
// conv_decode_impl's argument checks (after enter): kOk with *run false when there is nothing
// to do (B == 0 or C == 0).
int conv_decode_check(const float* x, int B, int C, int G, const float* w, int K,
                      const RowPlanes& ring, const float* y, int l2_groups, int dk, bool* run) {
  *run = false;
  if (B < 0 || C < 0) return memra::kContractShape;
  if (C > 0 && (G < 1 || C % G != 0)) return memra::kContractShape;
  if (l2_groups > 0 && (dk < 1 || G % dk != 0 || int64_t(l2_groups) * G > C)) {
    return memra::kContractShape;
  }
  if (K < 1) return memra::kContractValue;
  if (K < 2 || K > 8) return memra::kUnsupportedGeometry;
  if (ring.slots && (ring.floats < 0 || ring.offset < 0)) return memra::kContractValue;
  if (B == 0 || C == 0) return memra::kOk;
  if (!x || !w || !y) return memra::kContractMissing;
  if (ring.slots ? (!ring.cur || !ring.base0 || !ring.base1) : !ring.out) {
    return memra::kContractMissing;
  }
  // A slot's ring [C, K-1] must fit its stride, or one row's output would be another's input.
  if (ring.slots && ring.offset + static_cast<int64_t>(C) * (K - 1) > ring.floats) {
    return memra::kContractValue;
  }
  *run = true;
  return memra::kOk;
}

// The conv's L2 form (the q and k heads normalised in the conv kernel): a block's channels are
// exactly one head (dk == kConvThreads, G a multiple of it).
bool conv_l2_fused(int l2_groups, int G, int dk) {
  return l2_groups > 0 && dk == kConvThreads && G % kConvThreads == 0;
}

int conv_decode_impl(MemraCudaCtx* ctx, const float* x, int B, int C, int G, const float* w,
                     int K, const RowPlanes& ring, float* y, int l2_groups, int dk, float eps) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  bool run = false;
  MEMRA_CUDA_RETURN_IF(conv_decode_check(x, B, C, G, w, K, ring, y, l2_groups, dk, &run));
  if (!run) return memra::kOk;
  const bool fused = conv_l2_fused(l2_groups, G, dk);
  const int l2_channels = fused ? l2_groups * G : 0;
  const bool ok = dispatch_conv_k(K, [&](auto kc) {
    launch_conv_decode<decltype(kc)::value>(ctx, x, B, C, G, w, ring, y, l2_channels, eps);
  });
  if (!ok) return memra::kUnsupportedGeometry;
  MEMRA_CUDA_RETURN_IF(launch_status());
  if (l2_groups > 0 && !fused) {
    return memra_cuda_l2norm_heads(ctx, y, l2_groups * B, G / dk, dk, eps);
  }
  return memra::kOk;
}

RowPlanes table_planes(const float* const* in, float* const* out) {
  RowPlanes p;
  p.in = in;
  p.out = out;
  return p;
}

RowPlanes slot_planes(const int32_t* slots, const int32_t* cur, float* base0, float* base1,
                      int64_t floats, int64_t offset, int early) {
  RowPlanes p;
  p.slots = slots;
  p.cur = cur;
  p.base0 = base0;
  p.base1 = base1;
  p.floats = floats;
  p.offset = offset;
  p.early = early != 0;
  return p;
}

// ---- The decode conv with the gates' up-projections in its launch (one row, B == 1;
// memra_cuda_kda_conv_decode_slots_pair): blocks [0, conv_blocks) are conv_decode_kernel's
// blocks (the L2 form), the rest gemv_short_kernel's rows of the pair (f_b | g_b) at
// kConvThreads threads a block and kPairPasses rows a thread, with the bytes of either (the
// short rows' order depends on K alone). Both read only the q|k|v projection's outputs, so the
// step's chain loses a launch a KDA layer at batch 1.
using memra::cuda::gemv_rows_detail::GemvRows;
using memra::cuda::gemv_rows_detail::gemv_short_rows;
using memra::cuda::gemv_rows_detail::kShortMaxV;
using memra::cuda::gemv_rows_detail::with_short_lanes;
constexpr int kPairPasses = 2;

template <int K, typename W, int L>
__global__ void __launch_bounds__(kConvThreads)
    conv_pair_decode_kernel(const float* __restrict__ x, int C, int G, const float* __restrict__ w,
                            RowPlanes ring, float* __restrict__ y, int l2_channels, float l2_eps,
                            int conv_blocks, GemvRows<W, float> p0, GemvRows<W, float> p1,
                            int blocks0, int Kg, int prefetch) {
  const int bx = blockIdx.x;
  if (bx < conv_blocks) {
    conv_decode_block<K, true>(x, 1, C, G, w, ring, y, l2_channels, l2_eps, bx, 0, 1);
    return;
  }
  const int bid = bx - conv_blocks;
  const bool second = bid >= blocks0;
  // Field by field (a reference to either parameter struct would copy both to the stack).
  gemv_short_rows<W, float, L, kConvThreads, kPairPasses>(
      second ? p1.x : p0.x, second ? p1.w : p0.w, second ? p1.bias : p0.bias,
      second ? p1.y : p0.y, second ? p1.N : p0.N, Kg, prefetch, bid - (second ? blocks0 : 0));
}

template <int K, typename W, int L>
int launch_conv_pair(MemraCudaCtx* ctx, const float* x, int C, int G, const float* w,
                     const RowPlanes& ring, float* y, int l2_channels, float eps,
                     GemvRows<W, float> p0, GemvRows<W, float> p1, int Kg) {
  constexpr int kRows = kConvThreads / L * kPairPasses;  // GEMV rows a block
  const int conv_blocks = C / kConvThreads;
  const int blocks0 = (p0.N + kRows - 1) / kRows;
  const int blocks = conv_blocks + blocks0 + (p1.N + kRows - 1) / kRows;
  const int prefetch = ctx->resident_weights > 0 ? 1 : 0;
  memra::cuda::launch(ctx, true, conv_pair_decode_kernel<K, W, L>, dim3(blocks),
                      dim3(kConvThreads), 0, x, C, G, w, ring, y, l2_channels, eps, conv_blocks, p0,
                      p1, blocks0, Kg, prefetch);
  return launch_status();
}

}  // namespace

extern "C" {

int memra_cuda_kda_conv_decode(MemraCudaCtx* ctx, const float* x, int B, int C, int G,
                               const float* w, int K, const float* const* ring_in,
                               float* const* ring_out, float* y) {
  return conv_decode_impl(ctx, x, B, C, G, w, K, table_planes(ring_in, ring_out), y, 0, 0, 0.0f);
}

int memra_cuda_kda_conv_decode_slots(MemraCudaCtx* ctx, const float* x, int B, int C, int G,
                                     const float* w, int K, const int32_t* slots,
                                     const int32_t* cur, float* ring_base0, float* ring_base1,
                                     int64_t ring_floats, int64_t ring_offset, int early, float* y,
                                     int l2_groups, int dk, float eps) {
  // Null slots leave ring as a table form without tables: kContractMissing (B > 0).
  return conv_decode_impl(ctx, x, B, C, G, w, K,
                          slot_planes(slots, cur, ring_base0, ring_base1, ring_floats, ring_offset,
                                      early),
                          y, l2_groups, dk, eps);
}

int memra_cuda_kda_conv_decode_slots_pair(
    MemraCudaCtx* ctx, const float* x, int B, int C, int G, const float* w, int K,
    const int32_t* slots, const int32_t* cur, float* ring_base0, float* ring_base1,
    int64_t ring_floats, int64_t ring_offset, int early, float* y, int l2_groups, int dk, float eps,
    const float* gx0, const float* gx1, int gK, const void* gw0, const void* gw1, int w_dtype,
    int N0, int N1, float* gy0, float* gy1) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  const RowPlanes ring =
      slot_planes(slots, cur, ring_base0, ring_base1, ring_floats, ring_offset, early);
  const int E = w_dtype == 1 ? 8 : 4;  // weights a 16-byte vector (gemv_takes: bf16 or f32)
  const bool one = B == 1 && C > 0 && conv_l2_fused(l2_groups, G, dk) && N0 > 0 && N1 > 0 &&
                   gK > 0 && gK / E <= kShortMaxV && gy0 && gy1 && gx0 && gx1 && gw0 && gw1 &&
                   memra::cuda::gemv_takes(ctx, gx0, 0, gK, gw0, w_dtype) &&
                   memra::cuda::gemv_takes(ctx, gx1, 0, gK, gw1, w_dtype);
  if (!one) {
    MEMRA_CUDA_RETURN_IF(memra_cuda_kda_conv_decode_slots(
        ctx, x, B, C, G, w, K, slots, cur, ring_base0, ring_base1, ring_floats, ring_offset, early,
        y, l2_groups, dk, eps));
    return memra::cuda::linear_ex_pair(ctx, gx0, gx1, 0, gK, 1, gK, gw0, gw1, w_dtype, N0, N1,
                                       nullptr, nullptr, gy0, gy1);
  }
  bool run = false;
  MEMRA_CUDA_RETURN_IF(conv_decode_check(x, B, C, G, w, K, ring, y, l2_groups, dk, &run));
  const int l2_channels = l2_groups * G;
  int rc = memra::kUnsupportedGeometry;
  dispatch_conv_k(K, [&](auto kc) {
    constexpr int KC = decltype(kc)::value;
    rc = with_short_lanes(gK / E, [&](auto lanes) {
      constexpr int L = decltype(lanes)::value;
      if (w_dtype == 1) {
        using W = __nv_bfloat16;
        const GemvRows<W, float> p0{gx0, static_cast<const W*>(gw0), nullptr, gy0, N0};
        const GemvRows<W, float> p1{gx1, static_cast<const W*>(gw1), nullptr, gy1, N1};
        return launch_conv_pair<KC, W, L>(ctx, x, C, G, w, ring, y, l2_channels, eps, p0, p1, gK);
      }
      const GemvRows<float, float> p0{gx0, static_cast<const float*>(gw0), nullptr, gy0, N0};
      const GemvRows<float, float> p1{gx1, static_cast<const float*>(gw1), nullptr, gy1, N1};
      return launch_conv_pair<KC, float, L>(ctx, x, C, G, w, ring, y, l2_channels, eps, p0, p1,
                                            gK);
    });
  });
  return rc;
}

int memra_cuda_kda_gate_beta(MemraCudaCtx* ctx, const float* f, const float* dt_bias,
                             const float* A_log, int T, int H, int dk, int form,
                             float lower_bound, float* g, float* beta, int64_t nbeta) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (form != 0 && form != 1) return memra::kContractValue;
  if (T < 0 || H < 0 || dk < 0) return memra::kContractShape;
  const int64_t D = static_cast<int64_t>(H) * dk;
  if (D > 0x7fffffffLL) return memra::kContractShape;
  if (T == 0 || D == 0) return memra::kOk;
  if (!f || !dt_bias || !A_log || !g) return memra::kContractMissing;
  if (nbeta < 0 || (nbeta > 0 && !beta)) return memra::kContractValue;
  const int row_blocks = static_cast<int>(memra::cuda::ceil_div(T, kGateRowsPerBlock));
  const dim3 grid(memra::cuda::ceil_div(D, kGateThreads),
                  row_blocks < kMaxGridY ? row_blocks : kMaxGridY);
  memra::cuda::launch(ctx, true, gate_kernel, dim3(grid), dim3(kGateThreads), 0, f, dt_bias, A_log,
                      T, static_cast<int>(D), dk, form, lower_bound, g, beta, nbeta);
  return launch_status();
}

int memra_cuda_kda_gate(MemraCudaCtx* ctx, const float* f, const float* dt_bias,
                        const float* A_log, int T, int H, int dk, int form, float lower_bound,
                        float* g) {
  return memra_cuda_kda_gate_beta(ctx, f, dt_bias, A_log, T, H, dk, form, lower_bound, g, nullptr,
                                  0);
}

int memra_cuda_kda_scan(MemraCudaCtx* ctx, const float* q, const float* k, const float* v,
                        const float* g, const float* beta, int B, int T, int H, int dk, int dv,
                        float scale, const float* const* state_in, float* const* state_out,
                        float* o) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (B < 0 || T < 0 || H < 0 || dk < 1 || dv < 1) return memra::kContractShape;
  if (dk != kScanDk || dv != kScanDv) return memra::kUnsupportedGeometry;
  if (B == 0 || T == 0 || H == 0) return memra::kOk;
  if (!q || !k || !v || !g || !beta || !state_out || !o) return memra::kContractMissing;
  // float4 loads of q, k, g (both kernels) and of v / stores of o (decode kernel).
  for (const void* p : {static_cast<const void*>(q), static_cast<const void*>(k),
                        static_cast<const void*>(v), static_cast<const void*>(g),
                        static_cast<const void*>(o)}) {
    if (reinterpret_cast<uintptr_t>(p) & 15u) return memra::kContractStride;
  }
  if (T == 1) {  // the decode step: same bits as scan_kernel at T = 1, at stream bandwidth
    const int64_t blocks = static_cast<int64_t>(B) * H * dec_blocks_per_head<kDecWarps>();
    if (blocks > 0x7fffffffLL) return memra::kContractShape;
    memra::cuda::launch(ctx, true, scan_decode_kernel<false, kDecWarps, false>,
                        dim3(static_cast<unsigned>(blocks)), dim3(32 * kDecWarps), 0, q, k, v, g,
                        beta, H, scale, table_planes(state_in, state_out), o, RawGates{},
                        GatedNorm{});
    return launch_status();
  }
  const int64_t blocks = static_cast<int64_t>(B) * H * kBlocksPerHead;
  if (blocks > 0x7fffffffLL) return memra::kContractShape;
  memra::cuda::launch(ctx, true, scan_kernel, dim3(static_cast<unsigned>(blocks)),
      dim3(kScanThreads), 0, q, k, v, g, beta, T, H, scale, state_in, state_out, o);
  return launch_status();
}

int memra_cuda_kda_gate_scan_decode_slots(MemraCudaCtx* ctx, const float* q, const float* k,
                                          const float* v, const float* f, const float* dt_bias,
                                          const float* A_log, int form, float lower_bound,
                                          const float* beta_logits, int B, int H, int dk, int dv,
                                          float scale, const int32_t* slots, const int32_t* cur,
                                          float* state_base0, float* state_base1,
                                          int64_t state_floats, int early, const float* gate_o,
                                          const float* o_norm, float norm_eps, float* o) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (form != 0 && form != 1) return memra::kContractValue;
  if (B < 0 || H < 0 || dk < 1 || dv < 1) return memra::kContractShape;
  if (dk != kScanDk || dv != kScanDv) return memra::kUnsupportedGeometry;
  if (slots && state_floats < 0) return memra::kContractValue;
  if (B == 0 || H == 0) return memra::kOk;
  if (!q || !k || !v || !f || !dt_bias || !A_log || !beta_logits || !o) {
    return memra::kContractMissing;
  }
  if (!slots || !cur || !state_base0 || !state_base1) return memra::kContractMissing;
  if (!gate_o || !o_norm) return memra::kContractMissing;
  // A slot's [H, dk, dv] state must fit its stride, and every plane be 16-byte aligned (the
  // state moves in float4; a misaligned access would end the context, not just the call).
  if (state_floats < static_cast<int64_t>(H) * dk * dv) return memra::kContractValue;
  if (((reinterpret_cast<uintptr_t>(state_base0) | reinterpret_cast<uintptr_t>(state_base1)) &
       15u) || state_floats % 4 != 0) {
    return memra::kContractStride;
  }
  for (const void* p : {static_cast<const void*>(q), static_cast<const void*>(k),
                        static_cast<const void*>(v), static_cast<const void*>(f),
                        static_cast<const void*>(dt_bias), static_cast<const void*>(o)}) {
    if (reinterpret_cast<uintptr_t>(p) & 15u) return memra::kContractStride;
  }
  const RowPlanes state =
      slot_planes(slots, cur, state_base0, state_base1, state_floats, 0, early);
  const RawGates gates{dt_bias, A_log, form, lower_bound};
  const GatedNorm norm{gate_o, o_norm, norm_eps};
  // A whole head a block: the scan, then o through the gated norm.
  const int64_t blocks = static_cast<int64_t>(B) * H;
  if (blocks > 0x7fffffffLL) return memra::kContractShape;
  memra::cuda::launch(ctx, true, scan_decode_kernel<true, kDecNormWarps, true>,
                      dim3(static_cast<unsigned>(blocks)), dim3(32 * kDecNormWarps), 0, q, k, v,
                      f, beta_logits, H, scale, state, o, gates, norm);
  return launch_status();
}

}  // extern "C"
