// What the routed experts' two paths share: the per-pair kernels (cuda/moe_experts.cu, which holds
// memra_cuda_moe_forward) and the grouped-by-expert kernels (cuda/moe_grouped.cu).
#pragma once

#include <cstdint>

#include "common.cuh"

namespace memra::cuda::moe {

// One token's valid slots (ids in [0, E)) ordered by (expert id, slot), as the CPU visits
// them (experts ascending; a repeated id's slots ascending): order [top_k] gets the slots and
// order[top_k] their count. Insertion sort by one thread (slots arrive ascending, top_k small).
__device__ __forceinline__ void order_slots(const int32_t* it, int top_k, int E, int* order) {
  int n = 0;
  for (int j = 0; j < top_k; ++j) {
    const int e = it[j];
    if (e < 0 || e >= E) continue;
    int pos = n++;
    while (pos > 0 && it[order[pos - 1]] > e) {
      order[pos] = order[pos - 1];
      --pos;
    }
    order[pos] = j;
  }
  order[top_k] = n;
}

// The grouped path (cuda/moe_grouped.cu). grouped_fits: whether it can run this geometry (else
// the per-pair kernels do). forward_grouped: y [T, D] = the routed sum over stacked weights
// (memra_cuda_moe_forward's fields, checked by it), bit-identical to the per-pair kernels.
bool grouped_fits(int T, int top_k, int E);
int forward_grouped(MemraCudaCtx* ctx, const float* x, int T, int D, const int32_t* topk_idx,
                    const float* topk_w, int top_k, const void* gate_w, const void* up_w,
                    const void* down_w, int w_dtype, int E, int I, float limit, float* y);

}  // namespace memra::cuda::moe
