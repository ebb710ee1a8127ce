// Sampling of the CUDA backend (cpp/include/memra/cuda_abi/ffn.h `sample`): the GPU twin of
// cpu::sample (ops.h "sampling"), drawing the same token as the CPU for the same seed and counter.
// ops.h spells the arithmetic out; this file reproduces it operation for operation:
//   - z_i = logits_i / temperature and p_i = e_i / s are IEEE divisions (__fdiv_rn);
//   - e_i = exp(z_i - m) uses a port of glibc's expf (the CPU's std::exp on Linux: the table-
//     driven double-precision algorithm of glibc >= 2.28, in its FMA form), checked on the host to
//     be bit-identical to glibc 2.36's expf on every float in (-110, 90);
//   - every running sum the spec orders (s over ascending id; Mk, the top-p mass and the draw's
//     running c over the sorted order) is summed sequentially by one thread, in that order, from
//     chunks the rest of the block stages in shared memory (double-buffered; see
//     block_running_sum): exact, but latency-bound (~4 cycles per term, four walks over up to V
//     terms when top_k = 0 and top_p = 1);
//   - the order (p desc, id asc) comes from one CUB radix sort of all rows at once on 64-bit keys
//     (row | ~bits(p) | id): p >= 0, so its bit pattern orders like its value, and the keys are
//     unique, so no stability is needed.
// Kernels: greedy rows (temperature <= 0) take a block-wide argmax (the CPU's: ties to the lower
// id, NaN never wins unless it sits at id 0). Otherwise prep (one block per row: max, sequential
// s, keys; rows without a distribution take the argmax there), the sort, and select (one block per
// row: Mk, the top-p cut, the draw).
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "glibc_expf.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::glibc_expf;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;

namespace {

constexpr int kThreads = 512;  // threads per row block (prep, select, argmax)
constexpr int kChunk = 4096;   // floats staged in shared memory per sequential step

// ops.h uniform_from_counter (splitmix64), verbatim.
__device__ __forceinline__ float uniform_from_counter(uint64_t seed, uint64_t counter) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  uint64_t z = seed ^ (kGolden * (counter + 1));
  z += kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return __fmul_rn(static_cast<float>(z >> 40), 1.0f / 16777216.0f);
}

// ------------------------------------------------------------------------ block helpers

struct ArgBest {
  float v;
  int i;  // INT_MAX: none
};

__device__ __forceinline__ bool better(const ArgBest& a, const ArgBest& b) {
  if (a.i == INT_MAX) return false;
  if (b.i == INT_MAX) return true;
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

// The best entry of v[lo, hi) (the largest non-NaN value, the lowest id among equal ones;
// {-inf, INT_MAX} when every entry is NaN or the range is empty). Call with the whole block; the
// result is valid in every thread. `red` holds blockDim.x / 32 ArgBest.
__device__ ArgBest block_best(const float* __restrict__ v, int lo, int hi, ArgBest* red) {
  ArgBest b{-INFINITY, INT_MAX};
  // Each thread visits its ids in ascending order, so a strict > keeps the lowest of equal values.
  int rest = lo;
  if ((lo & 3) == 0 && (reinterpret_cast<uintptr_t>(v) & 15) == 0) {
    const float4* v4 = reinterpret_cast<const float4*>(v);
    const int end4 = hi >> 2;
    for (int j = (lo >> 2) + threadIdx.x; j < end4; j += blockDim.x) {
      const float4 q = v4[j];
      const float x[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (!isnan(x[k]) && (b.i == INT_MAX || x[k] > b.v)) b = ArgBest{x[k], 4 * j + k};
      }
    }
    rest = end4 > (lo >> 2) ? 4 * end4 : lo;
  }
  for (int i = rest + threadIdx.x; i < hi; i += blockDim.x) {
    const float x = v[i];
    if (!isnan(x) && (b.i == INT_MAX || x > b.v)) b = ArgBest{x, i};
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const ArgBest c{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
    if (better(c, b)) b = c;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = b;
  __syncthreads();
  ArgBest r = red[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
    if (better(red[w], r)) r = red[w];
  }
  __syncthreads();  // red may be reused at once
  return r;
}

// cpu argmax over v[0, V) (best = 0; v[i] > v[best] takes i): index 0 when v[0] is NaN, otherwise
// the lowest index of the largest non-NaN value. Call with the whole block; the result is valid
// in every thread. `red` holds kThreads / 32 ArgBest.
__device__ int block_argmax(const float* __restrict__ v, int V, ArgBest* red) {
  const ArgBest r = block_best(v, 0, V, red);
  if (isnan(v[0]) || r.i == INT_MAX) return 0;
  return r.i;
}

// A sequential f32 running sum over val(0), val(1), ... val(n-1), in that order, by thread 0, with
// the rest of the block staging the values in shared memory, double-buffered: warps 1.. fill chunk
// c + 1 while thread 0 adds chunk c, one __syncthreads per chunk. The walk stops at the first
// index whose running sum satisfies `done` (evaluated by thread 0 only; it must be monotone in the
// sum, which holds for running sums of non-negative terms: sum >= x, sum > x, or never), so thread
// 0 adds eight values back to back and only then looks at the eighth sum. Returns that index (-1
// when none) in every thread; *total gets the running sum there (or the whole sum). Needs
// blockDim.x >= 64; call with the whole block. `stage` holds 2 * kChunk floats, `stop` 2 ints.
struct Walk {
  int found;    // the index where the walk stopped, or -1
  float total;  // the running sum there (or over all n values)
};

template <class Val, class Done>
__device__ Walk block_running_sum(int64_t n, Val val, Done done, float* stage, int* stop,
                                  float* total) {
  const int tid = threadIdx.x;
  const int stagers = static_cast<int>(blockDim.x) - 32;
  auto fill = [&](int64_t base, float* buf) {
    const int len = static_cast<int>(n - base < kChunk ? n - base : kChunk);
    for (int j = tid - 32; j < len; j += stagers) buf[j] = val(base + j);
  };
  if (tid == 0) stop[0] = stop[1] = -1;
  if (tid >= 32 && n > 0) fill(0, stage);
  __syncthreads();
  float acc = 0.0f;  // thread 0's
  int found = -1;
  int c = 0;
  for (int64_t base = 0; base < n; base += kChunk, ++c) {
    if (tid >= 32) {
      if (base + kChunk < n) fill(base + kChunk, stage + ((c + 1) & 1) * kChunk);
    } else if (tid == 0) {
      const float* v = stage + (c & 1) * kChunk;
      const int len = static_cast<int>(n - base < kChunk ? n - base : kChunk);
      int hit = -1;
      int i = 0;
      for (; i + 8 <= len && hit < 0; i += 8) {
        const float4 a = *reinterpret_cast<const float4*>(v + i);
        const float4 b = *reinterpret_cast<const float4*>(v + i + 4);
        const float in[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float run[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          acc = __fadd_rn(acc, in[k]);
          run[k] = acc;
        }
        if (done(acc)) {  // monotone: the first of the eight that is done
#pragma unroll
          for (int k = 7; k >= 0; --k) {
            if (done(run[k])) {
              hit = i + k;
              acc = run[k];
            }
          }
        }
      }
      for (; i < len && hit < 0; ++i) {
        acc = __fadd_rn(acc, v[i]);
        if (done(acc)) hit = i;
      }
      // A slot per parity: the slot read after this sync is not rewritten before the next one.
      stop[c & 1] = hit >= 0 ? static_cast<int>(base + hit) : -1;
    }
    __syncthreads();
    if (stop[c & 1] >= 0) {
      found = stop[c & 1];
      break;
    }
  }
  if (tid == 0) *total = acc;
  __syncthreads();
  const Walk w{found, *total};
  __syncthreads();  // every thread has read stop / total / stage before the next walk reuses them
  return w;
}

// -------------------------------------------------------------------------------- kernels

__global__ void __launch_bounds__(kThreads)
    greedy_kernel(const float* __restrict__ logits, int V, int32_t* __restrict__ out) {
  __shared__ ArgBest red[kThreads / 32];
  const int64_t b = blockIdx.x;
  const int best = block_argmax(logits + b * V, V, red);
  if (threadIdx.x == 0) out[b] = best;
}

// Greedy over a large vocabulary at a few rows: one block per row streams V floats with one
// block's worth of loads in flight (21 us at V = 154880); split, block (s, b) finds the best of
// its kGreedyChunk ids of row b and one warp per row combines the partials (better() is
// associative and commutative, so the split gives the same id as the single block).
constexpr int kGreedyChunk = 2048;
constexpr int kGreedyThreads = 256;

__global__ void __launch_bounds__(kGreedyThreads)
    greedy_partial_kernel(const float* __restrict__ logits, int V, ArgBest* __restrict__ part) {
  __shared__ ArgBest red[kGreedyThreads / 32];
  const int s = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int lo = s * kGreedyChunk;
  const int hi = V - lo < kGreedyChunk ? V : lo + kGreedyChunk;
  const ArgBest r = block_best(logits + b * V, lo, hi, red);
  if (threadIdx.x == 0) part[b * gridDim.x + s] = r;
}

__global__ void greedy_final_kernel(const float* __restrict__ logits, int V,
                                    const ArgBest* __restrict__ part, int S,
                                    int32_t* __restrict__ out) {
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x;
  ArgBest r{-INFINITY, INT_MAX};
  for (int s = lane; s < S; s += 32) {
    if (better(part[b * S + s], r)) r = part[b * S + s];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const ArgBest c{__shfl_xor_sync(0xffffffffu, r.v, o), __shfl_xor_sync(0xffffffffu, r.i, o)};
    if (better(c, r)) r = c;
  }
  if (lane == 0) out[b] = (isnan(logits[b * V]) || r.i == INT_MAX) ? 0 : r.i;
}

struct KeyBits {
  int id_bits;   // bits of the id field (the lowest)
  int row_bits;  // bits of the row field (above the 32 bits of ~p)
};

// One block per row: m = max z, s = sequential sum of exp(z - m) in ascending id, then either the
// argmax (no distribution: s not finite or not > 0; done[b] = 1) or the sort keys of the row's
// p = e / s. Every row writes all its keys (a done row gets p = 0), so rows never mix in the sort.
__global__ void __launch_bounds__(kThreads)
    sample_prep_kernel(const float* __restrict__ logits, int V, float temperature, KeyBits kb,
                       uint64_t* __restrict__ keys, int* __restrict__ done,
                       int32_t* __restrict__ out) {
  __shared__ __align__(16) float stage[2 * kChunk];
  __shared__ ArgBest red[kThreads / 32];
  __shared__ float red_max[kThreads / 32];
  __shared__ int stop[2];
  __shared__ float total;
  const int64_t b = blockIdx.x;
  const float* lb = logits + b * V;

  // m = max of z (NaN z are skipped, as std::max(m, z) does; a NaN row ends in the argmax anyway).
  float m = -INFINITY;
  if ((V & 3) == 0 && (reinterpret_cast<uintptr_t>(lb) & 15) == 0) {
    const float4* l4 = reinterpret_cast<const float4*>(lb);
    for (int i = threadIdx.x; i < (V >> 2); i += blockDim.x) {
      const float4 q = l4[i];
      m = fmaxf(fmaxf(fmaxf(m, __fdiv_rn(q.x, temperature)), __fdiv_rn(q.y, temperature)),
                fmaxf(__fdiv_rn(q.z, temperature), __fdiv_rn(q.w, temperature)));
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, __fdiv_rn(lb[i], temperature));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) red_max[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red_max[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) m = fmaxf(m, red_max[w]);

  // s = e_0 + e_1 + ... in ascending id, one rounding per addition (the CPU's loop).
  auto e_of = [&](int64_t i) { return glibc_expf(__fsub_rn(__fdiv_rn(lb[i], temperature), m)); };
  const float s = block_running_sum(V, e_of, [](float) { return false; }, stage, stop, &total).total;

  const uint64_t row = static_cast<uint64_t>(b) << (32 + kb.id_bits);
  uint64_t* kr = keys + b * V;
  if (!(s > 0.0f) || !isfinite(s)) {  // all -inf, or NaN / inf: no distribution to draw from
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      kr[i] = row | (static_cast<uint64_t>(0xffffffffu) << kb.id_bits) | static_cast<uint64_t>(i);
    }
    const int best = block_argmax(lb, V, red);
    if (threadIdx.x == 0) {
      out[b] = best;
      done[b] = 1;
    }
    return;
  }
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float p = __fdiv_rn(e_of(i), s);
    const uint32_t inv = ~__float_as_uint(p);  // p >= +0: descending p = ascending ~bits
    kr[i] = row | (static_cast<uint64_t>(inv) << kb.id_bits) | static_cast<uint64_t>(i);
  }
  if (threadIdx.x == 0) done[b] = 0;
}

// One block per row over the sorted keys: Mk, the top-p cut, and the draw (ops.h, step by step).
__global__ void __launch_bounds__(kThreads)
    sample_select_kernel(const uint64_t* __restrict__ keys, int V, int k, float top_p,
                         uint64_t seed, const uint64_t* __restrict__ seeds,
                         const uint64_t* __restrict__ counters, KeyBits kb,
                         const int* __restrict__ done, int32_t* __restrict__ out) {
  __shared__ __align__(16) float stage[2 * kChunk];
  __shared__ int stop[2];
  __shared__ float total;
  __shared__ int last_positive;
  const int64_t b = blockIdx.x;
  if (done[b]) return;  // block-uniform
  const uint64_t* kr = keys + b * V;
  const uint64_t id_mask = (uint64_t(1) << kb.id_bits) - 1;
  auto p_of = [&](int64_t i) {
    return __uint_as_float(~static_cast<uint32_t>(kr[i] >> kb.id_bits));
  };
  auto id_of = [&](int64_t i) { return static_cast<int32_t>(kr[i] & id_mask); };
  auto never = [](float) { return false; };

  // Mk = running sum of p over the first k in sorted order.
  const float mk = block_running_sum(k, p_of, never, stage, stop, &total).total;
  auto q_of = [&](int64_t i) { return __fdiv_rn(p_of(i), mk); };

  // q = p / Mk; top_p < 1 keeps up to and including the first entry where the mass reaches it.
  const Walk cut = block_running_sum(
      k, q_of, [top_p](float mass) { return top_p < 1.0f && mass >= top_p; }, stage, stop,
      &total);
  const int n = cut.found >= 0 ? cut.found + 1 : k;
  const float mass = cut.total;

  // The token: the first kept entry whose running c exceeds r = u * M.
  const float r = __fmul_rn(uniform_from_counter(seeds ? seeds[b] : seed, counters[b]), mass);
  const int pick =
      block_running_sum(n, q_of, [r](float c) { return c > r; }, stage, stop, &total).found;
  if (pick >= 0) {
    if (threadIdx.x == 0) out[b] = id_of(pick);
    return;
  }
  // Rounding left u * M at the very end: the last kept entry with q > 0 (else the first).
  if (threadIdx.x == 0) last_positive = -1;
  __syncthreads();
  int mine = -1;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (q_of(i) > 0.0f) mine = i;
  }
  if (mine >= 0) atomicMax(&last_positive, mine);
  __syncthreads();
  if (threadIdx.x == 0) out[b] = id_of(last_positive >= 0 ? last_positive : 0);
}

int bits_for(int64_t n) {  // bits to hold 0 .. n - 1
  int bits = 0;
  while (bits < 63 && (int64_t(1) << bits) < n) ++bits;
  return bits;
}

size_t align_up(size_t v) { return (v + 255) / 256 * 256; }

}  // namespace

extern "C" int memra_cuda_sample(MemraCudaCtx* ctx, const float* logits, int B, int V,
                                 float temperature, int top_k, float top_p, uint64_t seed,
                                 const uint64_t* seeds, const uint64_t* counters, int32_t* out) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (B < 0 || V < 0) return memra::kContractValue;
  if (B == 0) return memra::kOk;
  if (V < 1) return memra::kContractValue;  // as the binding: at least one column
  if (std::isnan(temperature) || !(top_p > 0.0f)) return memra::kContractValue;
  if (!logits || !out) return memra::kContractMissing;
  if (temperature <= 0.0f) {
    if (V <= 4 * kGreedyChunk) {
      greedy_kernel<<<B, kThreads, 0, ctx->stream>>>(logits, V, out);
      return launch_status();
    }
    const int S = static_cast<int>(ceil_div(V, kGreedyChunk));
    Scratch part(ctx, sizeof(ArgBest) * static_cast<size_t>(S) * B);
    MEMRA_CUDA_RETURN_IF(part.status());
    greedy_partial_kernel<<<dim3(S, B), kGreedyThreads, 0, ctx->stream>>>(logits, V,
                                                                        part.as<ArgBest>());
    MEMRA_CUDA_RETURN_IF(launch_status());
    greedy_final_kernel<<<B, 32, 0, ctx->stream>>>(logits, V, part.as<ArgBest>(), S, out);
    return launch_status();
  }
  if (!counters) return memra::kContractMissing;

  const KeyBits kb{bits_for(V), bits_for(B)};
  const int end_bit = 32 + kb.id_bits + kb.row_bits;
  if (end_bit > 64) return memra::kUnsupportedGeometry;
  const int k = (top_k <= 0 || top_k > V) ? V : top_k;
  const int64_t total = static_cast<int64_t>(B) * V;

  size_t temp_bytes = 0;
  cub::DoubleBuffer<uint64_t> probe(nullptr, nullptr);
  MEMRA_CUDA_RETURN_IF(status_of(cub::DeviceRadixSort::SortKeys(
      nullptr, temp_bytes, probe, total, 0, end_bit, ctx->stream)));
  const size_t keys_bytes = align_up(sizeof(uint64_t) * static_cast<size_t>(total));
  const size_t done_bytes = align_up(sizeof(int) * static_cast<size_t>(B));
  Scratch scratch(ctx, 2 * keys_bytes + done_bytes + align_up(temp_bytes));
  MEMRA_CUDA_RETURN_IF(scratch.status());
  char* base = scratch.as<char>();
  uint64_t* keys0 = reinterpret_cast<uint64_t*>(base);
  uint64_t* keys1 = reinterpret_cast<uint64_t*>(base + keys_bytes);
  int* done = reinterpret_cast<int*>(base + 2 * keys_bytes);
  void* temp = base + 2 * keys_bytes + done_bytes;

  sample_prep_kernel<<<B, kThreads, 0, ctx->stream>>>(logits, V, temperature, kb, keys0, done,
                                                      out);
  MEMRA_CUDA_RETURN_IF(launch_status());
  cub::DoubleBuffer<uint64_t> sorted(keys0, keys1);
  MEMRA_CUDA_RETURN_IF(status_of(cub::DeviceRadixSort::SortKeys(
      temp, temp_bytes, sorted, total, 0, end_bit, ctx->stream)));
  sample_select_kernel<<<B, kThreads, 0, ctx->stream>>>(sorted.Current(), V, k, top_p, seed,
                                                        seeds, counters, kb, done, out);
  return launch_status();
}
