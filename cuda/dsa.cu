// DSA k-pool indexer on the GPU (cpp/include/memra/cuda_abi/dsa.h): the twins of
// cpu::kpool_pool_key / kpool_score / kpool_select (cpp/src/cpu/dsa.cpp) and of the row
// bookkeeping in MlaLayer::indexer (cpp/src/layers/mla_layer.cpp), one sequence per call; the
// entries hand their batched forms to cuda/dsa_decode.cu.
//
// Arithmetic: every float operation the CPU does in a fixed order is done here with the
// explicitly rounded intrinsics (__fmul_rn / __fadd_rn / __fsub_rn / __fdiv_rn), which nvcc never
// contracts into FMAs, in the CPU's order. Scores are therefore the CPU's bytes (an x86 build
// without FMA contraction); pool keys differ from the CPU only through expf (CUDA's <= 2 ulp vs
// glibc's), but are the same bytes however the rows arrive (one __device__ routine).
#include <algorithm>
#include <climits>
#include <cmath>

#include "common.cuh"
#include "dsa_common.cuh"

namespace memra::cuda::dsa {
// cuda/dsa_score_tc.cu: the tensor-core scorer (d 64 or 128, Hi <= 128).
bool score_tc_fits(int d, int Hi);
int score_tc(MemraCudaCtx* ctx, const float* q, const float* w, const float* keys, int t_q,
             int Hi, int d, int n_pools, int pool, int first_pos, float qk_scale,
             float head_scale, float* score);
}  // namespace memra::cuda::dsa

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::Scratch;

namespace {

using memra::cuda::dsa::kSelectThreads;
using memra::cuda::dsa::kSelectWarps;
using memra::cuda::dsa::pool_key_channel;
using memra::cuda::dsa::radix_select_row;
using memra::cuda::dsa::relu_cpu;
using memra::cuda::dsa::write_tail;

constexpr unsigned kMaxGrid = 65535u * 16u;  // grid-stride loops cover the rest

// -------------------------------------------------------------------------------- pool keys

// The rows of pool p as MlaLayer::indexer gathers them: row r < pos from the tail ring (slot
// r % tail_rows), row r >= pos from the new rows [T, d].
struct PoolRows {
  const float* k;          // [T, d] new rows (row pos + t at t)
  const float* gate;       // [T, d]
  const float* tail_k;     // [tail_rows, d]
  const float* tail_gate;  // [tail_rows, d]
  int d, pos, tail_rows;

  __device__ __forceinline__ int64_t offset(int64_t r) const {
    return r < pos ? (r % tail_rows) * d : (r - pos) * d;
  }
  __device__ __forceinline__ const float* k_row(int64_t r) const {
    return (r < pos ? tail_k : k) + offset(r);
  }
  __device__ __forceinline__ const float* gate_row(int64_t r) const {
    return (r < pos ? tail_gate : gate) + offset(r);
  }
};

// Keys of pools [first_pool, first_pool + n_new): one thread per (pool, channel), channels
// fastest so the row reads are coalesced.
__global__ void pool_keys_kernel(PoolRows rows, const float* __restrict__ ape, int pool,
                                 int first_pool, int n_new, float* __restrict__ pool_keys) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int d = rows.d;
  const int64_t total = int64_t(n_new) * d;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = first_pool + e / d;
    const int c = static_cast<int>(e % d);
    pool_keys[p * d + c] = pool_key_channel(rows, ape, p, pool, d, c);
  }
}

// Rows [r0, pos + T) (the newest min(T, tail_rows)) into the ring at r % tail_rows. Runs after
// pool_keys_kernel (stream order): that kernel may still read the ring slots these rows replace.
__global__ void ring_write_kernel(const float* __restrict__ k, const float* __restrict__ gate,
                                  int d, int pos, int r0, int n_rows, int tail_rows,
                                  float* __restrict__ tail_k, float* __restrict__ tail_gate) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t total = int64_t(n_rows) * d;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = r0 + e / d;
    const int64_t c = e % d;
    const int64_t src = (r - pos) * d + c, dst = (r % tail_rows) * d + c;
    tail_k[dst] = k[src];
    tail_gate[dst] = gate[src];
  }
}

// -------------------------------------------------------------------------------- scores

__device__ __forceinline__ bool pool_visible(int64_t p, int pool, int64_t pos) {
  return p * pool + pool - 1 <= pos;
}

// reference = 1: one thread per score, cpu::kpool_score's loops verbatim.
__global__ void score_reference_kernel(const float* __restrict__ q, const float* __restrict__ w,
                                       const float* __restrict__ keys, int t_q, int Hi, int d,
                                       int n_pools, int pool, int first_pos, float qk_scale,
                                       float head_scale, float* __restrict__ score) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t total = int64_t(t_q) * n_pools;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / n_pools, p = e % n_pools;
    if (!pool_visible(p, pool, first_pos + i)) {
      score[e] = -INFINITY;
      continue;
    }
    const float* key = keys + p * d;
    float acc = 0.0f;
    for (int h = 0; h < Hi; ++h) {
      const float* qh = q + (i * Hi + h) * d;
      float dot = 0.0f;
      for (int c = 0; c < d; ++c) dot = __fadd_rn(dot, __fmul_rn(qh[c], key[c]));
      acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(w[i * Hi + h], head_scale),
                                     relu_cpu(__fmul_rn(dot, qk_scale))));
    }
    score[e] = acc;
  }
}

// reference = 0: a BQ x BP tile of (query, pool) scores per block; per head, q[tile, h, :] and
// the tile's keys pass through shared memory in DC-channel slices, each thread owning MQ x MP
// scores (queries ty + TY*m, pools tx + TX*n: conflict-free shared reads). Every score still
// sums its heads in ascending h and each head's dot over c ascending with the reference's
// operations, so the bytes equal score_reference_kernel's; the tile only shares the loads and
// gives each thread MQ*MP independent chains. A tile whose pools are all after its queries is
// written as -inf without any arithmetic (causal prefill skips about half the work).
template <int BQ, int BP, int MQ, int MP, int DC>
__global__ void __launch_bounds__((BQ / MQ) * (BP / MP), 1)
    score_tiled_kernel(const float* __restrict__ q, const float* __restrict__ w,
                       const float* __restrict__ keys, int t_q, int Hi, int d, int n_pools,
                       int pool, int first_pos, float qk_scale, float head_scale,
                       float* __restrict__ score) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  constexpr int TX = BP / MP, TY = BQ / MQ, NT = TX * TY;
  __shared__ float qs[DC][BQ + 1];  // [channel][query] (+1: conflict-free transposed stores)
  __shared__ float ks[DC][BP + 1];  // [channel][pool]
  const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
  const int64_t p0 = int64_t(blockIdx.x) * BP;
  const int n_qt = static_cast<int>((int64_t(t_q) + BQ - 1) / BQ);

  for (int qt = blockIdx.y; qt < n_qt; qt += gridDim.y) {
    const int64_t i0 = int64_t(qt) * BQ;
    const int64_t i_last = (i0 + BQ < t_q ? i0 + BQ : t_q) - 1;
    const bool all_masked = !pool_visible(p0, pool, first_pos + i_last);
    // Rows this thread owns that hold a query (warp-uniform when TX >= 32).
    const bool live = i0 + ty < t_q;

    float acc[MQ][MP];
#pragma unroll
    for (int m = 0; m < MQ; ++m)
#pragma unroll
      for (int n = 0; n < MP; ++n) acc[m][n] = 0.0f;

    if (!all_masked) {
      for (int h = 0; h < Hi; ++h) {
        float dot[MQ][MP];
#pragma unroll
        for (int m = 0; m < MQ; ++m)
#pragma unroll
          for (int n = 0; n < MP; ++n) dot[m][n] = 0.0f;

        for (int c0 = 0; c0 < d; c0 += DC) {
          const int cn = d - c0 < DC ? d - c0 : DC;
          __syncthreads();  // every thread is done reading the previous slice
          for (int e = tid; e < BQ * DC; e += NT) {
            const int row = e / DC, col = e % DC;
            const int64_t i = i0 + row;
            qs[col][row] = (i < t_q && col < cn) ? q[(i * Hi + h) * d + c0 + col] : 0.0f;
          }
          for (int e = tid; e < BP * DC; e += NT) {
            const int row = e / DC, col = e % DC;
            const int64_t p = p0 + row;
            ks[col][row] = (p < n_pools && col < cn) ? keys[p * d + c0 + col] : 0.0f;
          }
          __syncthreads();
          if (live) {
            for (int c = 0; c < cn; ++c) {
              float a[MQ], b[MP];
#pragma unroll
              for (int m = 0; m < MQ; ++m) a[m] = qs[c][ty + TY * m];
#pragma unroll
              for (int n = 0; n < MP; ++n) b[n] = ks[c][tx + TX * n];
#pragma unroll
              for (int m = 0; m < MQ; ++m)
#pragma unroll
                for (int n = 0; n < MP; ++n) dot[m][n] = __fadd_rn(dot[m][n], __fmul_rn(a[m], b[n]));
            }
          }
        }
        if (live) {
#pragma unroll
          for (int m = 0; m < MQ; ++m) {
            const int64_t i = i0 + ty + TY * m;
            const float wh = i < t_q ? __fmul_rn(w[i * Hi + h], head_scale) : 0.0f;
#pragma unroll
            for (int n = 0; n < MP; ++n)
              acc[m][n] = __fadd_rn(acc[m][n], __fmul_rn(wh, relu_cpu(__fmul_rn(dot[m][n], qk_scale))));
          }
        }
      }
    }

#pragma unroll
    for (int m = 0; m < MQ; ++m) {
      const int64_t i = i0 + ty + TY * m;
      if (i >= t_q) continue;
#pragma unroll
      for (int n = 0; n < MP; ++n) {
        const int64_t p = p0 + tx + TX * n;
        if (p >= n_pools) continue;
        score[i * n_pools + p] = pool_visible(p, pool, first_pos + i) ? acc[m][n] : -INFINITY;
      }
    }
  }
}

// reference = 0 for a few queries (decode, short suffixes) with d <= kResMaxD: the block's key
// tile stays in shared memory for every head and channel (one load, one barrier), each thread
// owns one pool and MQ queries at a time (MQ independent chains), and reads q / w as
// block-uniform broadcast loads. The same per-score operations in the same order as the other
// scorers. Few queries leave little parallelism (n_pools chains of Hi*d dependent adds), so the
// channel loop loads the operands of 8 steps ahead of their adds.
constexpr int kResBP = 64;     // pools per block = threads per block
constexpr int kResMaxD = 128;  // key tile [kResBP][d + 1] fits the static 48 KB

template <int kResMQ>
__global__ void __launch_bounds__(kResBP)
    score_resident_kernel(const float* __restrict__ q, const float* __restrict__ w,
                          const float* __restrict__ keys, int t_q, int Hi, int d, int n_pools,
                          int pool, int first_pos, float qk_scale, float head_scale,
                          float* __restrict__ score) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float ks[kResBP][kResMaxD + 1];  // [pool][channel]: (tid + c) % 32 banks
  const int tid = threadIdx.x;
  const int64_t p0 = int64_t(blockIdx.x) * kResBP, p = p0 + tid;
  if (!pool_visible(p0, pool, int64_t(first_pos) + t_q - 1)) {  // no query sees any pool here
    if (p < n_pools) {
      for (int64_t i = 0; i < t_q; ++i) score[i * n_pools + p] = -INFINITY;
    }
    return;
  }
  for (int e = tid; e < kResBP * d; e += kResBP) {
    const int row = e / d, col = e % d;
    ks[row][col] = p0 + row < n_pools ? keys[(p0 + row) * d + col] : 0.0f;
  }
  __syncthreads();
  const float* kt = ks[tid];
  for (int i0 = 0; i0 < t_q; i0 += kResMQ) {
    // Rows past t_q repeat the last query (in-bounds loads); their results are not written.
    int64_t qi[kResMQ];
#pragma unroll
    for (int m = 0; m < kResMQ; ++m) qi[m] = i0 + m < t_q ? i0 + m : t_q - 1;
    float acc[kResMQ];
#pragma unroll
    for (int m = 0; m < kResMQ; ++m) acc[m] = 0.0f;
    for (int h = 0; h < Hi; ++h) {
      const float* qh[kResMQ];
#pragma unroll
      for (int m = 0; m < kResMQ; ++m) qh[m] = q + (qi[m] * Hi + h) * d;
      float dot[kResMQ];
#pragma unroll
      for (int m = 0; m < kResMQ; ++m) dot[m] = 0.0f;
      int c = 0;
      for (; c + 8 <= d; c += 8) {  // operands of 8 steps loaded ahead of their adds
        float kv[8], qv[kResMQ][8];
#pragma unroll
        for (int u = 0; u < 8; ++u) kv[u] = kt[c + u];
#pragma unroll
        for (int m = 0; m < kResMQ; ++m)
#pragma unroll
          for (int u = 0; u < 8; ++u) qv[m][u] = __ldg(qh[m] + c + u);
#pragma unroll
        for (int u = 0; u < 8; ++u)
#pragma unroll
          for (int m = 0; m < kResMQ; ++m) dot[m] = __fadd_rn(dot[m], __fmul_rn(qv[m][u], kv[u]));
      }
      for (; c < d; ++c) {
        const float kv = kt[c];
#pragma unroll
        for (int m = 0; m < kResMQ; ++m) dot[m] = __fadd_rn(dot[m], __fmul_rn(qh[m][c], kv));
      }
#pragma unroll
      for (int m = 0; m < kResMQ; ++m) {
        const float wh = __fmul_rn(w[qi[m] * Hi + h], head_scale);
        acc[m] = __fadd_rn(acc[m], __fmul_rn(wh, relu_cpu(__fmul_rn(dot[m], qk_scale))));
      }
    }
    if (p < n_pools) {
#pragma unroll
      for (int m = 0; m < kResMQ; ++m) {
        const int64_t i = i0 + m;
        if (i < t_q) {
          score[i * n_pools + p] = pool_visible(p, pool, first_pos + i) ? acc[m] : -INFINITY;
        }
      }
    }
  }
}

template <int BQ, int BP, int MQ, int MP, int DC>
void launch_score_tiled(MemraCudaCtx* ctx, const float* q, const float* w, const float* keys,
                        int t_q, int Hi, int d, int n_pools, int pool, int first_pos,
                        float qk_scale, float head_scale, float* score) {
  constexpr int NT = (BQ / MQ) * (BP / MP);
  const dim3 grid(ceil_div(n_pools, BP), std::min(ceil_div(t_q, BQ), 65535u));
  memra::cuda::launch(ctx, true, score_tiled_kernel<BQ, BP, MQ, MP, DC>, dim3(grid), dim3(NT), 0, q,
      w, keys, t_q, Hi, d, n_pools, pool, first_pos, qk_scale, head_scale, score);
}

// -------------------------------------------------------------------------------- selection

// cpu::kpool_select's candidate test: a finite score of a pool whose last row is visible.
__device__ __forceinline__ bool is_candidate(float s, int64_t p, int pool, int64_t pos) {
  return isfinite(s) && pool_visible(p, pool, pos);
}

// reference = 0: one block per query. A radix select (8-bit digits, most significant first) over
// the candidates' order_key finds the shortest key prefix whose bucket holds exactly the keys
// still needed: the selected set is then every candidate whose key prefix is >= it (keys are
// unique, so exactly min(select_k, candidates) pools). A block-wide scan in ascending pool order
// compacts them into the list, then the tail and the -1 padding follow.
__global__ void __launch_bounds__(kSelectThreads)
    select_radix_kernel(const float* __restrict__ score, int t_q, int n_pools, int pool,
                        int select_k, int width, int first_pos, int32_t* __restrict__ idx) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ unsigned hist[256];
  __shared__ int warp_count[kSelectWarps];
  __shared__ uint64_t s_prefix;
  __shared__ int s_shift, s_mode, s_need;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int64_t i = blockIdx.x; i < t_q; i += gridDim.x) {
    const int64_t pos = first_pos + i;
    radix_select_row(score + i * n_pools, n_pools, pool, select_k, width, pos, idx + i * width,
                     [&](float v, int64_t p) { return is_candidate(v, p, pool, pos); }, tid, lane, warp, hist, warp_count, s_prefix,
                     s_shift, s_mode, s_need);
  }
}

// reference = 1: one block per query; each candidate's rank under the CPU's comparator
// (s[a] > s[b] || (s[a] == s[b] && a < b)) by counting, selected when rank < select_k; one
// thread then writes the list in ascending pool order. O(n_pools^2) per query: a check, not a
// production path. flags: this block's [n_pools] bytes of scratch.
__global__ void __launch_bounds__(kSelectThreads)
    select_reference_kernel(const float* __restrict__ score, int t_q, int n_pools, int pool,
                            int select_k, int width, int first_pos, uint8_t* __restrict__ flags,
                            int32_t* __restrict__ idx) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int tid = threadIdx.x;
  uint8_t* f = flags + int64_t(blockIdx.x) * n_pools;
  for (int64_t i = blockIdx.x; i < t_q; i += gridDim.x) {
    const int64_t pos = first_pos + i;
    const float* s = score + i * n_pools;
    int32_t* out = idx + i * width;
    for (int64_t p = tid; p < n_pools; p += kSelectThreads) {
      uint8_t sel = 0;
      const float v = s[p];
      if (is_candidate(v, p, pool, pos)) {
        int64_t rank = 0;
        for (int64_t o = 0; o < n_pools; ++o) {
          const float u = s[o];
          if (is_candidate(u, o, pool, pos) && (u > v || (u == v && o < p))) ++rank;
        }
        sel = rank < select_k ? 1 : 0;
      }
      f[p] = sel;
    }
    __syncthreads();
    if (tid == 0) {
      int64_t e = 0;
      for (int64_t p = 0; p < n_pools; ++p) {
        if (!f[p]) continue;
        for (int r = 0; r < pool; ++r) out[e++] = static_cast<int32_t>(p * pool + r);
      }
      write_tail(out, e, width, pos, pool, 0, 1);
    }
    __syncthreads();  // flags are rewritten for the next query
  }
}

// -------------------------------------------------------------------------------- entries

int append_rows(MemraCudaCtx* ctx, const float* k, const float* gate, int T, int d,
                const float* ape, int pool, int pos, float* tail_k, float* tail_gate,
                int tail_rows, float* pool_keys) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (pool < 1 || tail_rows < pool || tail_rows % pool != 0) return memra::kContractPool;
  if (T < 0 || d < 1 || pos < 0) return memra::kContractValue;
  if (int64_t(pos) + T > INT_MAX) return memra::kContractRange;
  if (T == 0) return memra::kOk;
  const int end = pos + T;
  // Pools whose last row lands in [pos, end): [pos / pool, end / pool).
  const int first_pool = pos / pool, n_new = end / pool - first_pool;
  if (n_new > 0) {
    const PoolRows rows{k, gate, tail_k, tail_gate, d, pos, tail_rows};
    const unsigned blocks = std::min(ceil_div(int64_t(n_new) * d, 256), kMaxGrid);
    memra::cuda::launch(ctx, true, pool_keys_kernel, dim3(blocks), dim3(256), 0, rows, ape, pool,
        first_pool, n_new, pool_keys);
    MEMRA_CUDA_RETURN_IF(launch_status());
  }
  const int r0 = std::max(pos, end - tail_rows);
  const unsigned blocks = std::min(ceil_div(int64_t(end - r0) * d, 256), kMaxGrid);
  memra::cuda::launch(ctx, true, ring_write_kernel, dim3(blocks), dim3(256), 0, k, gate, d, pos, r0,
      end - r0, tail_rows, tail_k, tail_gate);
  return launch_status();
}

int score_rows(MemraCudaCtx* ctx, const float* q, const float* w, const float* pool_keys, int t_q,
               int Hi, int d, int n_pools, int pool, int first_pos, float qk_scale,
               float head_scale, int reference, int tensor_cores, float* score) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (pool < 1) return memra::kContractPool;
  if (t_q < 0 || Hi < 0 || d < 0 || n_pools < 0 || first_pos < 0) return memra::kContractValue;
  if (reference != 0 && reference != 1) return memra::kContractValue;
  if (!std::isfinite(qk_scale) || !std::isfinite(head_scale)) return memra::kContractValue;
  if (int64_t(first_pos) + t_q > INT_MAX) return memra::kContractRange;
  if (tensor_cores != 0 && tensor_cores != 1) return memra::kContractValue;
  if (t_q == 0 || n_pools == 0) return memra::kOk;
  if (tensor_cores && !reference && memra::cuda::dsa::score_tc_fits(d, Hi)) {
    // bf16 models: cuda/dsa_score_tc.cu (q and keys rounded to bf16, f32 accumulation).
    return memra::cuda::dsa::score_tc(ctx, q, w, pool_keys, t_q, Hi, d, n_pools, pool, first_pos,
                                      qk_scale, head_scale, score);
  }
  if (reference) {
    const unsigned blocks = std::min(ceil_div(int64_t(t_q) * n_pools, 256), kMaxGrid);
    memra::cuda::launch(ctx, true, score_reference_kernel, dim3(blocks), dim3(256), 0, q, w,
        pool_keys, t_q, Hi, d, n_pools, pool, first_pos, qk_scale, head_scale, score);
  } else if (t_q < 16 && d <= kResMaxD) {
    // Decode / short suffix: resident key tiles, one pool per thread.
    if (t_q == 1) {
      memra::cuda::launch(ctx, true, score_resident_kernel<1>, dim3(ceil_div(n_pools, kResBP)),
          dim3(kResBP), 0, q, w, pool_keys, t_q, Hi, d, n_pools, pool, first_pos, qk_scale,
          head_scale, score);
    } else {
      memra::cuda::launch(ctx, true, score_resident_kernel<4>, dim3(ceil_div(n_pools, kResBP)),
          dim3(kResBP), 0, q, w, pool_keys, t_q, Hi, d, n_pools, pool, first_pos, qk_scale,
          head_scale, score);
    }
  } else if (t_q < 16) {
    // Few queries with d > kResMaxD: 4 queries x 128 pools, one score per thread.
    launch_score_tiled<4, 128, 1, 1, 32>(ctx, q, w, pool_keys, t_q, Hi, d, n_pools, pool,
                                         first_pos, qk_scale, head_scale, score);
  } else {
    // Prefill: 64 x 64 tiles, 4 x 4 scores per thread.
    launch_score_tiled<64, 64, 4, 4, 32>(ctx, q, w, pool_keys, t_q, Hi, d, n_pools, pool,
                                         first_pos, qk_scale, head_scale, score);
  }
  return launch_status();
}

int select_rows(MemraCudaCtx* ctx, const float* score, int t_q, int n_pools, int pool, int select_k,
                int width, int first_pos, int reference, int32_t* idx) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  // Checks in cpu::kpool_select's order.
  if (pool < 1) return memra::kContractPool;
  if (select_k < 0 || t_q < 0 || n_pools < 0 || first_pos < 0) return memra::kContractValue;
  if (int64_t(width) < int64_t(select_k) * pool + pool - 1) return memra::kContractIndexWidth;
  if (reference != 0 && reference != 1) return memra::kContractValue;
  if (int64_t(first_pos) + t_q > INT_MAX || int64_t(n_pools) * pool > INT_MAX) {
    return memra::kContractRange;
  }
  if (t_q == 0) return memra::kOk;
  if (reference) {
    const unsigned blocks = std::min<unsigned>(static_cast<unsigned>(t_q), 1024u);
    Scratch flags(ctx, size_t(blocks) * size_t(n_pools));
    MEMRA_CUDA_RETURN_IF(flags.status());
    memra::cuda::launch(ctx, true, select_reference_kernel, dim3(blocks), dim3(kSelectThreads), 0,
        score, t_q, n_pools, pool, select_k, width, first_pos, flags.as<uint8_t>(), idx);
  } else {
    const unsigned blocks = std::min<unsigned>(static_cast<unsigned>(t_q), kMaxGrid);
    memra::cuda::launch(ctx, true, select_radix_kernel, dim3(blocks), dim3(kSelectThreads), 0,
        score, t_q, n_pools, pool, select_k, width, first_pos, idx);
  }
  return launch_status();
}

}  // namespace

namespace memra::cuda::dsa {
// cuda/dsa_decode.cu: the batched forms (p.batched == 1), entry checks included.
int append_decode(MemraCudaCtx* ctx, const MemraKpoolAppendParams& p);
int score_decode(MemraCudaCtx* ctx, const MemraKpoolScoreParams& p);
int select_decode(MemraCudaCtx* ctx, const MemraKpoolSelectParams& p);
}  // namespace memra::cuda::dsa

extern "C" {

int memra_cuda_kpool_append(MemraCudaCtx* ctx, const MemraKpoolAppendParams* p) {
  if (!p) return memra::kContractMissing;
  if (p->batched == 1) return memra::cuda::dsa::append_decode(ctx, *p);
  if (p->batched != 0) return memra::kContractValue;
  return append_rows(ctx, p->k, p->gate, p->n, p->d, p->ape, p->pool, p->pos, p->tail_k,
                     p->tail_gate, p->tail_rows, p->pool_keys);
}

int memra_cuda_kpool_score(MemraCudaCtx* ctx, const MemraKpoolScoreParams* p) {
  if (!p) return memra::kContractMissing;
  if (p->batched == 1) return memra::cuda::dsa::score_decode(ctx, *p);
  if (p->batched != 0) return memra::kContractValue;
  return score_rows(ctx, p->q, p->w, p->pool_keys, p->t_q, p->Hi, p->d, p->n_pools, p->pool,
                    p->first_pos, p->qk_scale, p->head_scale, p->reference, p->tensor_cores,
                    p->score);
}

int memra_cuda_kpool_select(MemraCudaCtx* ctx, const MemraKpoolSelectParams* p) {
  if (!p) return memra::kContractMissing;
  if (p->batched == 1) return memra::cuda::dsa::select_decode(ctx, *p);
  if (p->batched != 0) return memra::kContractValue;
  return select_rows(ctx, p->score, p->t_q, p->n_pools, p->pool, p->select_k, p->width,
                     p->first_pos, p->reference, p->idx);
}

}  // extern "C"
