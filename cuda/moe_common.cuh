// What the routed experts' paths share: the per-pair kernels (cuda/moe_experts.cu, which holds
// memra_cuda_moe_forward), the grouped-by-expert kernels (cuda/moe_grouped.cu) and their
// tensor-core arm (cuda/moe_tc.cu).
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

// The grouping and the combine of the grouped paths (cuda/moe_grouped.cu), shared with the
// tensor-core arm. pair_group_warps: moe_group_kernel's warps for P pairs over E experts (0: it
// cannot run). group_pairs: the pairs with a valid id listed per expert (ascending pair index),
// the active experts (ascending id) and their ranges: n_active [1], active_e [min(E, P)],
// active_off [min(E, P) + 1], pairs [P]. combine: y [T, D] = each token's ordered sum over its
// slots (expert id, slot) of o [T * top_k, D] * topk_w, each product and sum rounded separately.
int pair_group_warps(int64_t P, int E);
int group_pairs(MemraCudaCtx* ctx, const int32_t* topk_idx, int P, int E, int warps,
                int* n_active, int* active_e, int* active_off, int* pairs);
int combine(MemraCudaCtx* ctx, const float* o, const int32_t* topk_idx, const float* topk_w,
            int T, int top_k, int E, int D, float* y);

// The tensor-core arm (cuda/moe_tc.cu). tc_fits: whether it runs this call (the context's
// moe_tensor_cores, bf16 / f16 weights, D and I multiples of 8, 16-byte aligned weights, launch
// limits). forward_tc: y [T, D] = the routed sum (memra_cuda_moe_forward's fields, checked by it)
// as grouped GEMMs with x and h rounded to the weights' type and f32 accumulation. xr: null, or
// [T, D] of the weights' type that receives x rounded (RNE: the bytes linear's GEMMs round it
// to), for a caller that reads it after the call.
bool tc_fits(const MemraCudaCtx* ctx, int T, int D, int top_k, int w_dtype, const void* gate_w,
             const void* up_w, const void* down_w, int E, int I);
int forward_tc(MemraCudaCtx* ctx, const float* x, void* xr, int T, int D,
               const int32_t* topk_idx, const float* topk_w, int top_k, const void* gate_w,
               const void* up_w, const void* down_w, int w_dtype, int E, int I, float limit,
               float* y);

// The grouped path (cuda/moe_grouped.cu). grouped_fits: whether it can run this geometry (else
// the per-pair kernels do). forward_grouped: y [T, D] = the routed sum over stacked weights
// (memra_cuda_moe_forward's fields, checked by it), bit-identical to the per-pair kernels.
bool grouped_fits(int T, int top_k, int E);
int forward_grouped(MemraCudaCtx* ctx, const float* x, int T, int D, const int32_t* topk_idx,
                    const float* topk_w, int top_k, const void* gate_w, const void* up_w,
                    const void* down_w, int w_dtype, int E, int I, float limit, float* y);

}  // namespace memra::cuda::moe

namespace memra::cuda {

// memra_cuda_swiglu_mlp (cuda/mlp.cu) over x and its copy xr rounded to the 16-bit w_dtype (by
// moe::forward_tc; T > MEMRA_GEMV_MAX_ROWS, else 40025): the gate / up GEMMs read xr instead of
// rounding x again, the same bytes. A MoE layer's shared expert beside the tensor-core arm.
int swiglu_mlp_rounded(MemraCudaCtx* ctx, const float* x, const void* xr, int T, int D,
                       const void* gate_w, const void* up_w, const void* down_w, int w_dtype,
                       int I, float limit, const float* add, float* y);

}  // namespace memra::cuda
