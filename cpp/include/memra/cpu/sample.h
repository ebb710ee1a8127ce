// Sampling of the CPU reference backend (cpu/sample.cpp); the CUDA twin (cuda/sample.cu,
// cuda/sample_greedy.cu) reproduces the arithmetic spelled out here.
// Conventions: those of memra/ops.h, the umbrella header of the CPU reference backend.
#pragma once

#include <cstdint>

#include "memra/status.h"
#include "memra/tensor.h"

namespace memra::cpu {

// Counter-based uniform in [0, 1): a pure function of (seed, counter), identical on every
// backend. All arithmetic is uint64 modulo 2^64:
//   z  = seed ^ (0x9E3779B97F4A7C15 * (counter + 1))
//   z += 0x9E3779B97F4A7C15
//   z  = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//   z  = (z ^ (z >> 27)) * 0x94D049BB133111EB
//   z ^= z >> 31                                   (the splitmix64 step)
//   u  = float(z >> 40) * 2^-24                     (top 24 bits; exact in f32, u < 1)
float uniform_from_counter(uint64_t seed, uint64_t counter);

// One token per row. logits [B, V]. temperature <= 0 means greedy: argmax, ties to the lower id;
// a NaN never wins except at id 0, which then keeps the row (the comparisons v[i] > v[best] of a
// left-to-right scan starting at id 0).
// Otherwise p = softmax(logits / temperature); keep the top_k most likely (top_k <= 0: all), then
// the smallest prefix of those (sorted by p desc, ties to the lower id) whose mass reaches top_p
// (top_p >= 1: all); renormalise; draw with u = uniform_from_counter(seed, counters[b]).
// out [B]. Exact f32 arithmetic (the CUDA twin must match it): z_i = logits_i / temperature;
// m = max z; e_i = exp(z_i - m); s = sum of e_i in ascending id; p_i = e_i / s. Order by
// (p desc, id asc) and keep the first k (k = top_k, or V when top_k <= 0 or top_k > V);
// Mk = sum of their p in that order; q_i = p_i / Mk (so top_p is measured within the top-k, as
// transformers' TopK-then-TopP warpers and vLLM do). Exactly k, by the order above: where
// tokens tie at the k-th p those warpers keep every tied one (the one place the kept sets
// differ). Walk the kept entries in that order with
// the running sum c of q: top_p < 1 keeps entries up to and including the first where
// c >= top_p. With M = c at the last kept entry, the token is the first kept entry whose
// c > u * M (u * M rounded once; when rounding leaves none, the last kept entry with q > 0).
// A row whose logits are all -inf (or hold a NaN or +inf: s not finite or not > 0) gets argmax.
//
// The blocked order. Every sum and running sum above (s; Mk; the top-p mass and the draw's c,
// which are one running sum) is an f32 sum over terms t_0 .. t_{n-1} in the order named
// (ascending id for s, the sorted order for the others), cut into blocks of L = kSampleBlock
// terms (block b holds the indices [bL, min(bL + L, n))). Every + below is one f32 addition
// rounded to nearest (no fused or wider accumulation), taken left to right:
//   W_i = ((0 + t_{bL}) + t_{bL+1}) + ... + t_i   for i in block b          (within the block)
//   S_b = W at the last index of block b                                    (the block sum)
//   P_0 = 0,  P_{b+1} = P_b + S_b                                           (over the blocks)
//   c_i = P_b + W_i, b = i / L                    (the running sum at index i, one rounding)
//   sum = P_nb, nb = ceil(n / L)                  (= c_{n-1})
// c never decreases (the terms are >= 0) and c at the last index of block b is P_{b+1}, so the
// first index whose c reaches a threshold lies in the first block whose P_{b+1} does. M is c at
// the cut (the sum over all k when nothing is cut); the draw reads the same c_i, i < n. L is part
// of the spec (both backends use this constant): the blocks are what the CUDA twin sums in
// parallel, so every sequential chain is at most max(L, n / L) additions long.
inline constexpr int kSampleBlock = 512;

//
// nonfinite [B] (optional; null: not written): 1 where row b's logits hold a NaN or +-inf, else
// 0. The row's token is drawn as above either way (the caller discards it: memra.NonFiniteError).
void sample(const float* logits, int B, int V, float temperature, int top_k, float top_p,
            uint64_t seed, const uint64_t* counters, int32_t* out, int32_t* nonfinite = nullptr);

}  // namespace memra::cpu
