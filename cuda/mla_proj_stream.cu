// The streaming arm (arm 2) of absorb / decompress (cuda/mla_proj.cu has the entry and the other
// arms): the decode regime, small T, bound by reading kv_b, each weight once per call.
//
// A block owns one head and a tile of that head's outputs, with every weight of the tile:
//   absorb:     128 bytes of each of the d_nope rows of W_uk[h] (64 bf16 / 32 f32 columns r);
//   decompress: kDecompressRows (16) whole rows v of W_uv[h] (R columns each),
// and loops over the positions in tiles (the weights stay in shared memory). The whole weight
// tile is requested at once with 16-byte cp.async, in kStreamStages commit groups along the
// reduction index (absorb: rows n; decompress: columns r); the arithmetic of stage s starts as
// soon as group s has landed while the later groups are still in flight, so the sequential
// chains overlap the stream and only the last stage's arithmetic trails it. The first position
// tile's activations (f32, a few KiB from L2) travel in group 0; later tiles are staged after a
// barrier. At GLM-5.3-Flash's shapes (H = 64, d_nope = d_v = 128, R = 512, bf16 kv_b) absorb and
// decompress are each 512 blocks of 128 threads with 16 KiB of weights, all resident at once
// (docs/mla.md).
//
// Every output is still one sequential chain computed by one thread, the same operations in
// the same order as arm 1's absorb_dot / decompress_dot (from 0, reduction index ascending,
// __fmul_rn then __fadd_rn, bf16 / f16 widened exactly): arm 2 equals arm 1, and the CPU, byte
// for byte; a chain is never split across threads, and nothing is summed atomically.
// Lanes: absorb, one 32-bit word of the tile row per lane (E = 2 bf16 / 1 f32 columns) and P
// positions (P = 1 for T <= 4, 2 for T <= 8, else 4), a warp per group of P positions
// (kAbsorbGroups groups: position tile 4P); decompress, one row v per thread and P positions
// (P = 1 for T = 1, else 2), kDecompressGroups groups of 16 threads (position tile 8P). Shared
// memory reads are conflict-free (absorb: a warp reads 128 contiguous bytes of W and broadcasts
// q; decompress: padded row strides, o broadcast within a group). Without FMA the arithmetic is
// ~2.5 issued instructions a (weight, position) pair, so from T ~ 8 on the kernel is bound by
// the FP32 issue rate rather than by the stream; positions are split over blocks (grid z) only
// when heads x tiles would not give every SM two blocks.
#include <climits>
#include <cstdint>
#include <algorithm>
#include <type_traits>

#include "common.cuh"
#include "mla_common.cuh"
#include "mla_proj.cuh"

using memra::cuda::ceil_div;
using memra::cuda::cp_async_16;
using memra::cuda::cp_async_4;
using memra::cuda::cp_async_commit;
using memra::cuda::cp_async_wait;
using memra::cuda::launch_status;
using memra::cuda::to_f32;
using memra::cuda::mla::allow_smem;
using memra::cuda::mla::device_attr;
using memra::cuda::mla::Proj;

namespace {

constexpr int kStreamThreads = 128;
constexpr int kStreamStages = 4;
constexpr int kAbsorbTileBytes = 128;  // bytes of every W_uk row per block: a 32-bit word a lane
constexpr int kAbsorbGroups = kStreamThreads / 32;
constexpr int kDecompressRows = 16;  // rows v of W_uv per block
constexpr int kDecompressGroups = kStreamThreads / kDecompressRows;
constexpr size_t kStreamSmemCap = 112 * 1024;  // larger tiles: the per-position kernel's split
static_assert(kStreamStages == 4, "cp_async_wait_stage is written for 4 stages");

// This thread's commit groups 0..s have landed (kStreamStages groups were committed).
__device__ __forceinline__ void cp_async_wait_stage(int s) {
  switch (kStreamStages - 1 - s) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
  }
}

// Before the streaming kernels consume stage s: a block's first position tile waits for its
// own copies of stage s and then the barrier publishes everyone's; later tiles (the weights are
// all in place) only need the barrier once, at s == 0, for the re-staged activations.
__device__ __forceinline__ void stage_landed(int s, bool first) {
  if (first) {
    cp_async_wait_stage(s);
    __syncthreads();
  } else if (s == 0) {
    __syncthreads();
  }
}

// Stage an activation tile: row p < valid of dst ([rows, stride] f32 in shared memory) gets
// x + p * ld (K floats) by cp.async (the caller commits), rows valid..rows-1 get zeros. vec:
// 16-byte copies (K % 4 == 0, x and ld 16-byte aligned), else 4-byte ones.
__device__ __forceinline__ void stage_act(float* dst, int stride, const float* x, int64_t ld,
                                          int valid, int rows, int K, bool vec) {
  if (vec) {
    const int k4 = K / 4;
#pragma unroll 1  // asynchronous copies: no unrolling needed to keep them in flight
    for (int i = threadIdx.x; i < rows * k4; i += kStreamThreads) {
      const int p = i / k4, c = 4 * (i - p * k4);
      float* d = dst + p * stride + c;
      if (p < valid) {
        cp_async_16(d, x + p * ld + c);
      } else {
        *reinterpret_cast<float4*>(d) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  } else {
#pragma unroll 1
    for (int i = threadIdx.x; i < rows * K; i += kStreamThreads) {
      const int p = i / K, c = i - p * K;
      float* d = dst + p * stride + c;
      if (p < valid) {
        cp_async_4(d, x + p * ld + c);
      } else {
        *d = 0.0f;
      }
    }
  }
}

// The raw bits of a weight element (copies without conversion; 0 is +0.0 in every format).
template <typename Tw>
using WeightBits = std::conditional_t<sizeof(Tw) == 2, uint16_t, uint32_t>;

// Stage s of a reduction of length n cut in units of `unit` (the last unit may be partial):
// [*b, *e), stage boundaries on unit boundaries. The issue and compute sides use the same cut.
__device__ __forceinline__ void stage_range(int s, int n, int unit, int* b, int* e) {
  const int units = (n + unit - 1) / unit;
  *b = s * units / kStreamStages * unit;
  *e = min(n, (s + 1) * units / kStreamStages * unit);
}

// The streaming kernels' prologue: the weight tile requested in kStreamStages commit groups
// (issue_weights(s)), the first position tile's activations with group 0 (stage_first()). With
// prefetch (resident weights: no queued kernel writes kv_b) the weights are requested before
// pdl_wait, streaming under the previous kernel, and everything has landed before the first
// tile's arithmetic; without, after it, stage by stage.
template <typename IssueWeights, typename StageFirst>
__device__ __forceinline__ void stream_prologue(int prefetch, IssueWeights&& issue_weights,
                                                StageFirst&& stage_first) {
  if (prefetch) {
#pragma unroll 1
    for (int s = 0; s < kStreamStages; ++s) issue_weights(s);
  }
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  if (prefetch) {
    stage_first();
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  } else {
#pragma unroll 1
    for (int s = 0; s < kStreamStages; ++s) {
      issue_weights(s);
      if (s == 0) stage_first();
      cp_async_commit();
    }
  }
}

// Absorb: the terms of rows n..n+3 for one lane (its 32-bit word of each row, E columns) and P
// positions, n ascending within every chain.
template <int P, typename Tw>
__device__ __forceinline__ void absorb_terms4(const uint32_t (&w)[4], const float4 (&q)[P],
                                              float (&acc)[P][4 / sizeof(Tw)]) {
  constexpr int E = 4 / static_cast<int>(sizeof(Tw));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    Tw wv[E];
    memcpy(wv, &w[j], sizeof(w[j]));
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const float a = j == 0 ? q[p].x : (j == 1 ? q[p].y : (j == 2 ? q[p].z : q[p].w));
#pragma unroll
      for (int e = 0; e < E; ++e) acc[p][e] = __fadd_rn(acc[p][e], __fmul_rn(a, to_f32(wv[e])));
    }
  }
}

// q_lat[t, h, r] for r in [blockIdx.x * OC, +OC) (OC = 128 bytes of columns) and every position
// of tiles blockIdx.z, blockIdx.z + gridDim.z, ... (PT = kAbsorbGroups * P positions a tile).
// Grid (ceil(R / OC), H, tiles or fewer). Shared: W tile [d_nope][OC] of Tw, then q tile
// [qrows][qstride] f32 (qstride = d_nope rounded up to 4). kVec: kv_b 16-byte aligned and
// R * sizeof(Tw) % 16 == 0. xvec: see stage_act (q_nope 16-byte aligned, d_nope % 4 == 0).
// Stages cut the rows n in units of 4.
template <int P, bool kVec, typename Tw>
__global__ void __launch_bounds__(kStreamThreads)
    absorb_stream_kernel(const float* __restrict__ q_nope, const Tw* __restrict__ kv_b, int T,
                         int H, int d_nope, int d_v, int R, int qstride, int qrows, bool xvec,
                         float* __restrict__ q_lat, int prefetch) {
  constexpr int OC = kAbsorbTileBytes / static_cast<int>(sizeof(Tw));
  constexpr int E = 4 / static_cast<int>(sizeof(Tw));  // columns per lane (one 32-bit word)
  constexpr int V = 16 / static_cast<int>(sizeof(Tw));
  constexpr int PT = kAbsorbGroups * P;
  extern __shared__ __align__(16) unsigned char stream_smem[];
  Tw* ws = reinterpret_cast<Tw*>(stream_smem);
  float* qs =
      reinterpret_cast<float*>(stream_smem + static_cast<size_t>(d_nope) * kAbsorbTileBytes);
  const int tid = threadIdx.x, lane = tid & 31, grp = tid >> 5;
  const int h = blockIdx.y, r0 = blockIdx.x * OC;
  const int ncols = min(OC, R - r0);
  const Tw* wk = kv_b + static_cast<int64_t>(h) * (d_nope + d_v) * R + r0;
  const int64_t qld = static_cast<int64_t>(H) * d_nope;  // position stride of q_nope
  const int tiles = (T + PT - 1) / PT;

  // The weights of stage s (rows n of the tile), requested.
  auto issue_weights = [&](int s) {
    int nb, ne;
    stage_range(s, d_nope, 4, &nb, &ne);
    if constexpr (kVec) {
      const int cpr = ncols / V;  // 16-byte chunks a row
#pragma unroll 1
      for (int i = tid; i < (ne - nb) * cpr; i += kStreamThreads) {
        const int j = i / cpr, n = nb + j, c = (i - j * cpr) * V;
        cp_async_16(ws + n * OC + c, wk + static_cast<int64_t>(n) * R + c);
      }
    } else {
      using B = WeightBits<Tw>;
      const B* src = reinterpret_cast<const B*>(wk);
      B* dst = reinterpret_cast<B*>(ws);
      for (int i = tid; i < (ne - nb) * OC; i += kStreamThreads) {
        const int j = i / OC, n = nb + j, c = i - j * OC;
        dst[n * OC + c] = c < ncols ? src[static_cast<int64_t>(n) * R + c] : B(0);
      }
    }
  };
  auto stage_first_q = [&] {
    const int t0 = blockIdx.z * PT;
    stage_act(qs, qstride, q_nope + (static_cast<int64_t>(t0) * H + h) * d_nope, qld,
              min(PT, T - t0), qrows, d_nope, xvec);
  };
  // The whole weight tile in flight, one commit group a stage; the first tile's q in group 0.
  stream_prologue(prefetch, issue_weights, stage_first_q);

  const uint32_t* wcol = reinterpret_cast<const uint32_t*>(ws) + lane;  // row n: wcol[n * 32]
  const int pb = grp * P;  // this warp's first position in the tile
  for (int tile = blockIdx.z; tile < tiles; tile += gridDim.z) {
    const int t0 = tile * PT, np = min(PT, T - t0);
    const bool staged = tile == static_cast<int>(blockIdx.z);  // q staged above
    const bool first = staged && !prefetch;  // the weights still landing stage by stage
    if (!staged) {
      __syncthreads();  // every thread is done with the previous tile's qs
      stage_act(qs, qstride, q_nope + (static_cast<int64_t>(t0) * H + h) * d_nope, qld, np, qrows,
                d_nope, xvec);
      cp_async_commit();
      cp_async_wait<0>();
    }
    const bool on = pb < np && lane * E < ncols;
    const float* q = qs + pb * qstride;
    float acc[P][E];
#pragma unroll
    for (int p = 0; p < P; ++p) {
#pragma unroll
      for (int e = 0; e < E; ++e) acc[p][e] = 0.0f;
    }
#pragma unroll 1
    for (int s = 0; s < kStreamStages; ++s) {
      stage_landed(s, first);
      if (!on) continue;
      int nb, ne;
      stage_range(s, d_nope, 4, &nb, &ne);
      const int n4 = nb + (ne - nb) / 4 * 4;  // end of the whole groups of 4 rows
      int n = nb;
      if (n < n4) {
        // Software-pipelined: the next group's words and q are loaded before this group's
        // terms (the last group reloads itself).
        uint32_t w[4];
        float4 q4[P];
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = wcol[(n + j) * 32];
#pragma unroll
        for (int p = 0; p < P; ++p) q4[p] = *reinterpret_cast<const float4*>(q + p * qstride + n);
        for (; n < n4; n += 4) {
          const int nn = min(n + 4, n4 - 4);
          uint32_t wn[4];
          float4 qn[P];
#pragma unroll
          for (int j = 0; j < 4; ++j) wn[j] = wcol[(nn + j) * 32];
#pragma unroll
          for (int p = 0; p < P; ++p) {
            qn[p] = *reinterpret_cast<const float4*>(q + p * qstride + nn);
          }
          absorb_terms4<P, Tw>(w, q4, acc);
#pragma unroll
          for (int j = 0; j < 4; ++j) w[j] = wn[j];
#pragma unroll
          for (int p = 0; p < P; ++p) q4[p] = qn[p];
        }
      }
      for (; n < ne; ++n) {  // d_nope % 4 rows at the end of the last stage
        const uint32_t word = wcol[n * 32];
        Tw wv[E];
        memcpy(wv, &word, sizeof(word));
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float a = q[p * qstride + n];
#pragma unroll
          for (int e = 0; e < E; ++e) acc[p][e] = __fadd_rn(acc[p][e], __fmul_rn(a, to_f32(wv[e])));
        }
      }
    }
    if (on) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (pb + p < np) {
          float* dst = q_lat + (static_cast<int64_t>(t0 + pb + p) * H + h) * R + r0 + lane * E;
#pragma unroll
          for (int e = 0; e < E; ++e) {
            if (lane * E + e < ncols) dst[e] = acc[p][e];
          }
        }
      }
    }
  }
}

// Decompress: the terms of columns r..r+V-1 (one 16-byte weight chunk) for one row and P
// positions, r ascending within every chain.
template <int P, typename Tw>
__device__ __forceinline__ void decompress_terms(const uint4& raw,
                                                 const float4 (&o)[P][4 / sizeof(Tw)],
                                                 float (&acc)[P]) {
  constexpr int V = 16 / static_cast<int>(sizeof(Tw));
  Tw wv[V];
  memcpy(wv, &raw, sizeof(raw));
#pragma unroll
  for (int k = 0; k < V / 4; ++k) {
    const float w0 = to_f32(wv[4 * k]), w1 = to_f32(wv[4 * k + 1]);
    const float w2 = to_f32(wv[4 * k + 2]), w3 = to_f32(wv[4 * k + 3]);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      acc[p] = __fadd_rn(acc[p], __fmul_rn(w0, o[p][k].x));
      acc[p] = __fadd_rn(acc[p], __fmul_rn(w1, o[p][k].y));
      acc[p] = __fadd_rn(acc[p], __fmul_rn(w2, o[p][k].z));
      acc[p] = __fadd_rn(acc[p], __fmul_rn(w3, o[p][k].w));
    }
  }
}

// out[t, h, v] for v in [blockIdx.x * 16, +16) and every position of tiles blockIdx.z,
// blockIdx.z + gridDim.z, ... (PT = kDecompressGroups * P positions a tile). Grid
// (ceil(d_v / 16), H, tiles or fewer). Shared: W tile [16][wstride] of Tw (wstride * sizeof(Tw)
// an odd multiple of 16 bytes: the 8 rows a quarter-warp reads at one column fall on distinct
// bank groups), then o tile [orows][ostride] f32 (ostride * 4 also an odd multiple of 16).
// kVec: kv_b 16-byte aligned and R * sizeof(Tw) % 16 == 0. xvec: o_lat 16-byte aligned, R % 4
// == 0. Stages cut the columns r in units of V = 16 / sizeof(Tw).
template <int P, bool kVec, typename Tw>
__global__ void __launch_bounds__(kStreamThreads)
    decompress_stream_kernel(const float* __restrict__ o_lat, const Tw* __restrict__ kv_b, int T,
                             int H, int d_nope, int d_v, int R, int wstride, int ostride,
                             int orows, bool xvec, float* __restrict__ out, int prefetch) {
  constexpr int OC = kDecompressRows;
  constexpr int V = 16 / static_cast<int>(sizeof(Tw));
  constexpr int V4 = V / 4;
  constexpr int PT = kDecompressGroups * P;
  extern __shared__ __align__(16) unsigned char stream_smem[];
  Tw* ws = reinterpret_cast<Tw*>(stream_smem);
  float* os =
      reinterpret_cast<float*>(stream_smem + sizeof(Tw) * static_cast<size_t>(OC) * wstride);
  const int tid = threadIdx.x;
  const int h = blockIdx.y, v0 = blockIdx.x * OC;
  const int nv = min(OC, d_v - v0);
  const Tw* wv = kv_b + (static_cast<int64_t>(h) * (d_nope + d_v) + d_nope + v0) * R;
  const int64_t old = static_cast<int64_t>(H) * R;  // position stride of o_lat
  const int tiles = (T + PT - 1) / PT;

  // The weights of stage s (columns r of the tile's rows), requested.
  auto issue_weights = [&](int s) {
    int rb, re;
    stage_range(s, R, V, &rb, &re);
    const int w = re - rb;
    if constexpr (kVec) {
      const int wc = w / V;  // 16-byte chunks a row in this stage
#pragma unroll 1
      for (int i = tid; i < nv * wc; i += kStreamThreads) {
        const int j = i / wc, c = rb + (i - j * wc) * V;
        cp_async_16(ws + j * wstride + c, wv + static_cast<int64_t>(j) * R + c);
      }
    } else {
      using B = WeightBits<Tw>;
      const B* src = reinterpret_cast<const B*>(wv);
      B* dst = reinterpret_cast<B*>(ws);
      for (int i = tid; i < nv * w; i += kStreamThreads) {
        const int j = i / w, r = rb + i - j * w;
        dst[j * wstride + r] = src[static_cast<int64_t>(j) * R + r];
      }
    }
  };
  auto stage_first_o = [&] {
    const int t0 = blockIdx.z * PT;
    stage_act(os, ostride, o_lat + (static_cast<int64_t>(t0) * H + h) * R, old, min(PT, T - t0),
              orows, R, xvec);
  };
  // The whole weight tile in flight, one commit group a stage; the first tile's o in group 0.
  stream_prologue(prefetch, issue_weights, stage_first_o);

  const int v = tid % OC, pb = (tid / OC) * P;
  const Tw* wrow = ws + v * wstride;
  for (int tile = blockIdx.z; tile < tiles; tile += gridDim.z) {
    const int t0 = tile * PT, np = min(PT, T - t0);
    const bool staged = tile == static_cast<int>(blockIdx.z);  // o staged above
    const bool first = staged && !prefetch;  // the weights still landing stage by stage
    if (!staged) {
      __syncthreads();  // every thread is done with the previous tile's os
      stage_act(os, ostride, o_lat + (static_cast<int64_t>(t0) * H + h) * R, old, np, orows, R,
                xvec);
      cp_async_commit();
      cp_async_wait<0>();
    }
    const bool on = pb < np && v < nv;
    const float* o = os + pb * ostride;
    float acc[P];
#pragma unroll
    for (int p = 0; p < P; ++p) acc[p] = 0.0f;
#pragma unroll 1
    for (int s = 0; s < kStreamStages; ++s) {
      stage_landed(s, first);
      if (!on) continue;
      int rb, re;
      stage_range(s, R, V, &rb, &re);
      const int rv = rb + (re - rb) / V * V;  // end of the whole chunks
      int r = rb;
      if (r < rv) {
        // Software-pipelined: the next chunk's weights and activations are loaded before this
        // chunk's terms (the last chunk reloads itself).
        uint4 wr = *reinterpret_cast<const uint4*>(wrow + r);
        float4 ov[P][V4];
#pragma unroll
        for (int p = 0; p < P; ++p) {
#pragma unroll
          for (int k = 0; k < V4; ++k) {
            ov[p][k] = *reinterpret_cast<const float4*>(o + p * ostride + r + 4 * k);
          }
        }
        for (; r < rv; r += V) {
          const int rn = min(r + V, rv - V);
          const uint4 wn = *reinterpret_cast<const uint4*>(wrow + rn);
          float4 on4[P][V4];
#pragma unroll
          for (int p = 0; p < P; ++p) {
#pragma unroll
            for (int k = 0; k < V4; ++k) {
              on4[p][k] = *reinterpret_cast<const float4*>(o + p * ostride + rn + 4 * k);
            }
          }
          decompress_terms<P, Tw>(wr, ov, acc);
          wr = wn;
#pragma unroll
          for (int p = 0; p < P; ++p) {
#pragma unroll
            for (int k = 0; k < V4; ++k) ov[p][k] = on4[p][k];
          }
        }
      }
      if constexpr (!kVec) {
        for (; r < re; ++r) {  // R % V columns at the end of the last stage
          const float w = to_f32(wrow[r]);
#pragma unroll
          for (int p = 0; p < P; ++p) acc[p] = __fadd_rn(acc[p], __fmul_rn(w, o[p * ostride + r]));
        }
      }
    }
    if (on) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (pb + p < np) out[(static_cast<int64_t>(t0 + pb + p) * H + h) * d_v + v0 + v] = acc[p];
      }
    }
  }
}

// Launch shape of the streaming arm; false when the tile does not fit kStreamSmemCap (or the
// device's opt-in limit): the caller then takes the per-position kernel's split.
struct StreamShape {
  int p = 1;        // positions a thread
  int rows = 0;     // activation rows in shared memory (min(tile, T rounded up to p))
  int wstride = 0;  // decompress: W_uv row stride in shared memory (elements)
  int xstride = 0;  // activation row stride in shared memory (floats)
  size_t smem = 0;
  dim3 grid;
};

// Bytes rounded up to 16-byte units, the count made odd.
int64_t odd_units(int64_t bytes) { return ((bytes + 15) / 16) | 1; }

bool stream_shape(Proj which, int wsize, int T, int H, int d_nope, int d_v, int R, int sms,
                  size_t cap, StreamShape* s) {
  int64_t pt = 0, gx = 0, w_bytes = 0;
  if (which == Proj::kAbsorb) {
    s->p = T <= 4 ? 1 : (T <= 8 ? 2 : 4);
    pt = static_cast<int64_t>(kAbsorbGroups) * s->p;
    s->xstride = (d_nope + 3) / 4 * 4;
    gx = ceil_div(R, kAbsorbTileBytes / wsize);
    w_bytes = static_cast<int64_t>(d_nope) * kAbsorbTileBytes;
  } else {
    s->p = T == 1 ? 1 : 2;
    pt = static_cast<int64_t>(kDecompressGroups) * s->p;
    const int64_t wunits = odd_units(static_cast<int64_t>(R) * wsize);
    const int64_t xunits = odd_units(static_cast<int64_t>(R) * 4);
    if (wunits * 16 / wsize > INT_MAX || xunits * 4 > INT_MAX) return false;
    s->wstride = static_cast<int>(wunits * 16 / wsize);
    s->xstride = static_cast<int>(xunits * 4);
    gx = ceil_div(d_v, kDecompressRows);
    w_bytes = static_cast<int64_t>(kDecompressRows) * s->wstride * wsize;
  }
  const int64_t rows = std::min<int64_t>(pt, (static_cast<int64_t>(T) + s->p - 1) / s->p * s->p);
  s->rows = static_cast<int>(rows);
  const int64_t bytes = w_bytes + 4 * rows * s->xstride;
  if (bytes > static_cast<int64_t>(cap)) return false;
  s->smem = static_cast<size_t>(bytes);
  // Positions split over blocks only when heads x tiles would not give every SM two blocks
  // (each z re-reads the weights, from L2).
  const int64_t tiles = (T + pt - 1) / pt;
  const int64_t xy = gx * H;
  const int64_t want = std::max<int64_t>(1, (2LL * sms + xy - 1) / xy);
  const int64_t gz = std::min<int64_t>({tiles, want, 65535});
  s->grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(H), static_cast<unsigned>(gz));
  return true;
}

template <int P, typename Tw>
int launch_absorb_stream(MemraCudaCtx* ctx, const float* x, const Tw* w, int T, int H, int d_nope,
                         int d_v, int R, const StreamShape& s, bool wvec, bool xvec, float* y) {
  auto* k = wvec ? absorb_stream_kernel<P, true, Tw> : absorb_stream_kernel<P, false, Tw>;
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, k, s.smem));
  const int prefetch = ctx->resident_weights > 0 ? 1 : 0;  // kv_b is the layer's own upload
  memra::cuda::launch(ctx, true, k, dim3(s.grid), dim3(kStreamThreads), s.smem, x, w, T, H, d_nope,
      d_v, R, s.xstride, s.rows, xvec, y, prefetch);
  return launch_status();
}

template <int P, typename Tw>
int launch_decompress_stream(MemraCudaCtx* ctx, const float* x, const Tw* w, int T, int H,
                             int d_nope, int d_v, int R, const StreamShape& s, bool wvec, bool xvec,
                             float* y) {
  auto* k = wvec ? decompress_stream_kernel<P, true, Tw> : decompress_stream_kernel<P, false, Tw>;
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, k, s.smem));
  const int prefetch = ctx->resident_weights > 0 ? 1 : 0;  // kv_b is the layer's own upload
  memra::cuda::launch(ctx, true, k, dim3(s.grid), dim3(kStreamThreads), s.smem, x, w, T, H, d_nope,
      d_v, R, s.wstride, s.xstride, s.rows, xvec, y, prefetch);
  return launch_status();
}

// Arm 2. *declined (nothing enqueued) when the tile does not fit shared memory.
template <typename Tw>
int launch_stream(MemraCudaCtx* ctx, Proj which, const float* x, const void* kv_b, int T, int H,
                  int d_nope, int d_v, int R, float* y, bool* declined) {
  *declined = false;
  int sms = 0, optin = 0;
  MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMultiProcessorCount, &sms));
  MEMRA_CUDA_RETURN_IF(device_attr(ctx, cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin));
  StreamShape s;
  const size_t cap = std::min(kStreamSmemCap, static_cast<size_t>(optin));
  if (!stream_shape(which, sizeof(Tw), T, H, d_nope, d_v, R, sms, cap, &s)) {
    *declined = true;
    return memra::kOk;
  }
  const Tw* w = static_cast<const Tw*>(kv_b);
  const bool wvec = reinterpret_cast<uintptr_t>(kv_b) % 16 == 0 && (R * sizeof(Tw)) % 16 == 0;
  const int K = which == Proj::kAbsorb ? d_nope : R;
  const bool xvec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && K % 4 == 0;
  if (which == Proj::kAbsorb) {
    switch (s.p) {
      case 1:
        return launch_absorb_stream<1, Tw>(ctx, x, w, T, H, d_nope, d_v, R, s, wvec, xvec, y);
      case 2:
        return launch_absorb_stream<2, Tw>(ctx, x, w, T, H, d_nope, d_v, R, s, wvec, xvec, y);
      default:
        return launch_absorb_stream<4, Tw>(ctx, x, w, T, H, d_nope, d_v, R, s, wvec, xvec, y);
    }
  }
  if (s.p == 1) {
    return launch_decompress_stream<1, Tw>(ctx, x, w, T, H, d_nope, d_v, R, s, wvec, xvec, y);
  }
  return launch_decompress_stream<2, Tw>(ctx, x, w, T, H, d_nope, d_v, R, s, wvec, xvec, y);
}

}  // namespace

namespace memra::cuda::mla {

int launch_stream_any(MemraCudaCtx* ctx, const MemraMlaProjParams& p, bool* declined) {
  const Proj which = p.which == MEMRA_MLA_DECOMPRESS ? Proj::kDecompress : Proj::kAbsorb;
  const float* x = p.x;
  const void* kv_b = p.kv_b;
  const int T = p.T, H = p.H, d_nope = p.d_nope, d_v = p.d_v, R = p.R;
  float* y = p.y;
  switch (p.w_dtype) {
    case 0: return launch_stream<float>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, y, declined);
    case 1:
      return launch_stream<__nv_bfloat16>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, y, declined);
    case 2: return launch_stream<__half>(ctx, which, x, kv_b, T, H, d_nope, d_v, R, y, declined);
    default: return memra::kContractDType;
  }
}

}  // namespace memra::cuda::mla
