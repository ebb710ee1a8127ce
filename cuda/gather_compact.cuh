// The index-list compaction shared by the gathered MLA attention (cuda/mla_attn.cu, one query per
// block) and the batched decode attention (cuda/mla_decode.cu, one sequence per block): the
// CPU's row list from a DSA index list -- the rows r in [0, n) the list names, each once,
// ascending (entries -1, out of range or repeated dropped).
#pragma once

#include <cstdint>

namespace memra::cuda {

// By the whole block of kThreads threads (tid, lane, warp of the caller): a bitmap of the rows
// in shared memory bm [ceil(n / 32)] (atomicOr marks; duplicates collapse), then a block-wide
// exclusive scan of the words' popcounts (warp_tot [kThreads / 32], shared) writes each word's
// rows in order to out. Returns the row count (every thread gets it); ends with a barrier.
// CG: the list is read through L2 (__ldcg): the caller's block wrote it just before (the DSA
// select that compacts its own lists, cuda/dsa_decode.cu).
template <int kThreads, bool CG = false>
__device__ __forceinline__ int compact_rows(const int32_t* __restrict__ row, int width, int n,
                                            unsigned* bm, unsigned* warp_tot,
                                            int32_t* __restrict__ out, int tid, int lane,
                                            int warp) {
  constexpr int kWarps = kThreads / 32;
  const int nwords = (n + 31) / 32;
  for (int k = tid; k < nwords; k += kThreads) bm[k] = 0u;
  __syncthreads();
  for (int e = tid; e < width; e += kThreads) {
    const int r = CG ? __ldcg(row + e) : row[e];
    if (r >= 0 && r < n) atomicOr(&bm[r >> 5], 1u << (r & 31));
  }
  __syncthreads();

  int running = 0;
  for (int base = 0; base < nwords; base += kThreads) {
    const int k = base + tid;
    unsigned bits = k < nwords ? bm[k] : 0u;
    const int c = __popc(bits);
    int incl = c;  // inclusive scan over the warp
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    if (lane == 31) warp_tot[warp] = static_cast<unsigned>(incl);
    __syncthreads();
    int pos = running + incl - c, tot = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int t = static_cast<int>(warp_tot[w]);
      if (w < warp) pos += t;
      tot += t;
    }
    while (bits) {
      const int b = __ffs(bits) - 1;
      bits &= bits - 1u;
      out[pos++] = k * 32 + b;
    }
    running += tot;
    __syncthreads();  // warp_tot is rewritten by the next round
  }
  return running;
}

}  // namespace memra::cuda
