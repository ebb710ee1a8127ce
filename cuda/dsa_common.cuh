// Device routines shared by the DSA k-pool indexer's per-sequence kernels (cuda/dsa.cu) and its
// batched decode forms (cuda/dsa_decode.cu): one definition of each piece of arithmetic whose
// bytes both must reproduce (cpu::kpool_pool_key's softmax, relu as std::max evaluates it, the
// select's (score desc, pool asc) order and its radix select), so the two can never drift.
#pragma once

#include <cmath>
#include <cstdint>

namespace memra::cuda::dsa {

// relu as std::max(v, 0.0f) evaluates it: (v < 0) ? 0 : v (keeps -0 and NaN as the CPU does).
__device__ __forceinline__ float relu_cpu(float v) { return (v < 0.0f) ? 0.0f : v; }

// Channel c of pool p's key: cpu::kpool_pool_key's softmax over the pool's rows of gate + ape,
// weighting k, in its order (max, then the sum of exps, then the weighted sum; no FMA). Rows:
// any type with k_row(r) / gate_row(r) (the pool's rows wherever they live). The one routine
// every pool key goes through, so a key is the same bytes however its rows arrived.
template <class Rows>
__device__ __forceinline__ float pool_key_channel(const Rows& rows, const float* __restrict__ ape,
                                                  int64_t p, int pool, int d, int c) {
  const int64_t r0 = p * pool;
  float m = -INFINITY;
  for (int r = 0; r < pool; ++r) {
    const float v = __fadd_rn(rows.gate_row(r0 + r)[c], ape[int64_t(r) * d + c]);
    m = (m < v) ? v : m;  // std::max(m, v)
  }
  float l = 0.0f;
  for (int r = 0; r < pool; ++r) {
    const float v = __fadd_rn(rows.gate_row(r0 + r)[c], ape[int64_t(r) * d + c]);
    l = __fadd_rn(l, expf(__fsub_rn(v, m)));
  }
  float acc = 0.0f;
  for (int r = 0; r < pool; ++r) {
    const float v = __fadd_rn(rows.gate_row(r0 + r)[c], ape[int64_t(r) * d + c]);
    const float pr = __fdiv_rn(expf(__fsub_rn(v, m)), l);
    acc = __fadd_rn(acc, __fmul_rn(pr, rows.k_row(r0 + r)[c]));
  }
  return acc;
}

// dsa.cu's PoolRows for T = 1: row r < pos from the ring (slot r % tail_rows), row pos from k.
struct DecodeRows {
  const float* k;          // [d], the new row (row pos)
  const float* gate;       // [d]
  const float* tail_k;     // [tail_rows, d]
  const float* tail_gate;  // [tail_rows, d]
  int64_t pos;
  int d, tail_rows;

  __device__ __forceinline__ const float* k_row(int64_t r) const {
    return r < pos ? tail_k + (r % tail_rows) * d : k + (r - pos) * d;
  }
  __device__ __forceinline__ const float* gate_row(int64_t r) const {
    return r < pos ? tail_gate + (r % tail_rows) * d : gate + (r - pos) * d;
  }
};

// Channel c of the decode append of one sequence at position p (cuda/dsa_decode.cu's
// append_decode_kernel; the MLA decode prologue of cuda/mla_prologue.cu, over rows staged in
// shared memory): when the token completes a pool ((p + 1) % pool == 0), channel c of that pool's
// key into pool_keys (Rows: the pool's rows, before p from the ring, row p the new one); then
// channel c of row p (k_c, g_c) into ring slot p % tail_rows of tail_k, tail_gate. The slot
// written is none of the ring slots the key reads (tail_rows is a multiple of pool >= pool).
template <class Rows>
__device__ __forceinline__ void append_decode_channel(const Rows& rows,
                                                      const float* __restrict__ ape, int64_t p,
                                                      int pool, int d, int tail_rows,
                                                      float* pool_keys, float* tail_k,
                                                      float* tail_gate, int c, float k_c,
                                                      float g_c) {
  if ((p + 1) % pool == 0) {
    const int64_t pool_idx = p / pool;
    pool_keys[pool_idx * d + c] = pool_key_channel(rows, ape, pool_idx, pool, d, c);
  }
  // After this thread's key reads (the slot is none of the ones the key read anyway).
  const int64_t slot = (p % tail_rows) * d;
  tail_k[slot + c] = k_c;
  tail_gate[slot + c] = g_c;
}

constexpr int kSelectThreads = 512;
constexpr int kSelectWarps = kSelectThreads / 32;

// A 64-bit key whose unsigned order is the CPU's order (score desc, pool index asc), larger =
// earlier: the float bits made monotonic (sign-flipped), -0 folded onto +0 (they compare equal
// on the CPU, so the index must break that tie), then the complemented pool index.
__device__ __forceinline__ uint64_t order_key(float s, int64_t p) {
  uint32_t u = __float_as_uint(s == 0.0f ? 0.0f : s);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (uint64_t(u) << 32) | uint64_t(0xFFFFFFFFu - static_cast<uint32_t>(p));
}

// Rows of the visible tail [(pos+1) - (pos+1) % pool, pos] from slot `start` of `out`, then -1
// up to width (block-strided). pos >= 0.
__device__ __forceinline__ void write_tail(int32_t* out, int64_t start, int width, int64_t pos,
                                           int pool, int tid, int nt) {
  const int64_t tail0 = (pos + 1) - (pos + 1) % pool, n_tail = pos + 1 - tail0;
  for (int64_t j = start + tid; j < width; j += nt) {
    const int64_t t = j - start;
    out[j] = t < n_tail ? static_cast<int32_t>(tail0 + t) : -1;
  }
}

// One query's index list out [width] by the whole block (kSelectThreads threads; tid, lane and
// warp of the caller): a radix select (8-bit digits, most significant first) over the order_key
// of the candidates among pools [0, n) (is_candidate(v, p)) finds the shortest key prefix whose
// bucket holds exactly the keys still needed: the selected set is then every candidate whose key
// prefix is >= it (keys are unique, so exactly min(select_k, candidates) pools). A block-wide scan
// in ascending pool order compacts them into the list, then the tail rows of pos and the -1
// padding follow. hist .. s_need: the caller's __shared__ state (s_mode: 0 none, 1 all
// candidates, 2 key prefix, -1 undecided). Ends with a barrier (the state is reused next query).
template <class IsCandidate>
__device__ __forceinline__ void radix_select_row(
    const float* __restrict__ s, int n, int pool, int select_k, int width, int64_t pos,
    int32_t* __restrict__ out, IsCandidate is_candidate, int tid, int lane, int warp,
    unsigned (&hist)[256], int (&warp_count)[kSelectWarps], uint64_t& s_prefix, int& s_shift,
    int& s_mode, int& s_need) {
  if (tid == 0) {
    s_prefix = 0;
    s_shift = 64;
    s_need = select_k;
    s_mode = select_k == 0 ? 0 : -1;  // -1: undecided
  }
  __syncthreads();
  for (int pass = 0; pass < 8 && s_mode < 0; ++pass) {
    const int shift = 56 - 8 * pass;
    const uint64_t prefix = s_prefix;
    for (int x = tid; x < 256; x += kSelectThreads) hist[x] = 0;
    __syncthreads();
    for (int64_t p = tid; p < n; p += kSelectThreads) {
      const float v = s[p];
      if (!is_candidate(v, p)) continue;
      const uint64_t key = order_key(v, p);
      if (pass == 0 || (key >> (shift + 8)) == prefix) {
        atomicAdd(&hist[(key >> shift) & 0xFF], 1u);
      }
    }
    __syncthreads();
    if (tid == 0) {
      int need = s_need;
      bool decided = false;
      if (pass == 0) {
        long long n_cand = 0;
        for (int x = 0; x < 256; ++x) n_cand += hist[x];
        if (n_cand <= need) {
          s_mode = 1;
          decided = true;
        }
      }
      if (!decided) {
        // The bucket (digits from high to low) that holds the need-th largest key.
        int x = 255;
        for (; x > 0 && static_cast<unsigned>(need) > hist[x]; --x) need -= static_cast<int>(hist[x]);
        s_prefix = (prefix << 8) | uint64_t(x);
        s_shift = shift;
        s_need = need;
        if (static_cast<unsigned>(need) == hist[x]) s_mode = 2;
      }
    }
    __syncthreads();
  }
  const int mode = s_mode;
  const int shift = s_shift;
  const uint64_t prefix = s_prefix;

  // Compaction in ascending pool order: the rows of the j-th selected pool go to
  // [j * pool, (j + 1) * pool).
  int64_t base = 0;
  for (int64_t p0 = 0; p0 < n; p0 += kSelectThreads) {
    const int64_t p = p0 + tid;
    bool sel = false;
    if (mode != 0 && p < n) {
      const float v = s[p];
      if (is_candidate(v, p)) sel = mode == 1 || (order_key(v, p) >> shift) >= prefix;
    }
    const unsigned ballot = __ballot_sync(0xFFFFFFFFu, sel);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int x = 0; x < kSelectWarps; ++x) {
      const int c = warp_count[x];
      before += x < warp ? c : 0;
      total += c;
    }
    if (sel) {
      const int64_t j = base + before + __popc(ballot & ((1u << lane) - 1u));
      for (int r = 0; r < pool; ++r) out[j * pool + r] = static_cast<int32_t>(p * pool + r);
    }
    base += total;
    __syncthreads();  // warp_count is rewritten by the next chunk
  }
  write_tail(out, base * pool, width, pos, pool, tid, kSelectThreads);
  __syncthreads();  // the shared state is reset for the next query
}

}  // namespace memra::cuda::dsa
