// CUDA ABI, MoE area (cuda/moe_route.cu, cuda/moe_experts.cu, cuda/moe_grouped.cu): the GPU twins
// of cpu::moe_route and cpu::moe_forward (cpu/moe.h).
#pragma once

/* How the router scores its logits (MemraMoeRouteParams::scoring). */
enum {
  /* The grouped sigmoid router (glm5_next, Kimi-Linear): logits x gate_w^T in f32,
     s = sigmoid(logits), choice = s + bias; the topk_group groups with the best sums of their two
     largest choices, then the top_k experts by choice among them (ties: lower id), weights = s of
     those (/ (sum + 1e-20) when norm_topk_prob) * scaling. Same order and values as
     cpu::moe_route (sigmoid with CUDA's expf). */
  MEMRA_MOE_SCORE_SIGMOID = 0,
  /* The softmax router (Qwen3.5-MoE, Qwen3-Next): logits in f32, p = softmax(logits) (f32: max
     subtracted, exp, divided by the sum), the top_k experts by p (ties: lower id), weights = p of
     those (/ their sum when norm_topk_prob) * scaling. n_group and topk_group must be 1 and
     corr_bias null (else 40025). Same order as cpu::moe_route_softmax; the values within a few
     ulp (CUDA's expf and its warp's summation order). */
  MEMRA_MOE_SCORE_SOFTMAX = 1
};

/* The MoE router; `scoring` picks the form (above). */
typedef struct MemraMoeRouteParams {
  const float* x;          /* [T, D] f32 */
  int T;                   /* >= 0 (else 40025) */
  int D;                   /* >= 0 (else 40025) */
  const float* gate_w;     /* [E, D] f32 (the router's logits are f32 in the reference) */
  const float* corr_bias;  /* [E] f32 (e_score_correction_bias: it only chooses), or null */
  int E;                   /* experts, >= 1 (else 40025) */
  int top_k;               /* in [1, topk_group * E / n_group] (else 40025) */
  int n_group;             /* >= 1, divides E (else 40025) */
  int topk_group;          /* in [1, n_group] (else 40025) */
  int norm_topk_prob;      /* nonzero: renormalise the chosen weights */
  float scaling;           /* routed_scaling_factor */
  int32_t* topk_idx;       /* [T, top_k] int32: the chosen experts, by choice desc */
  float* topk_w;           /* [T, top_k] f32 */
  int scoring;             /* MEMRA_MOE_SCORE_SIGMOID (0, a zeroed struct) or _SOFTMAX (else 40025) */
} MemraMoeRouteParams;

/* The routed experts over stacked weights, plus (optionally) a MoE layer's shared expert:
   y[t] = shared(x[t]) + sum_j topk_w[t, j] * expert_{topk_idx[t, j]}(x[t]), each expert the
   clamped SwiGLU MLP, a token's terms added in ascending expert id (cpu::moe_forward). The
   activations stay f32 (bf16 weights are widened, x is not rounded), so against the CPU on the
   same weights only the dot products' summation order differs. From T = KernelOptions::
   moe_grouped_min_t on the pairs run grouped by expert, with the same bits as the per-pair
   kernels; over bf16 / f16 weights with D and I multiples of 8 (KernelOptions::moe_tensor_cores)
   as grouped GEMMs on tensor cores instead, with x and the SwiGLU output rounded to w_dtype and
   another summation order (a token's bytes still independent of the other tokens). */
typedef struct MemraMoeForwardParams {
  const float* x;            /* [T, D] f32 */
  int T;                     /* >= 0 (else 40025) */
  int D;                     /* >= 0 (else 40025) */
  const int32_t* topk_idx;   /* [T, top_k] int32; an id outside [0, E) contributes nothing (callers
                                range-check on the host: the device cannot refuse without a sync) */
  const float* topk_w;       /* [T, top_k] f32 */
  int top_k;                 /* >= 0 (else 40025; 0: no routed term) */
  const void* gate_w;        /* [E, I, D] stacked experts, dtype w_dtype */
  const void* up_w;          /* [E, I, D], dtype w_dtype */
  const void* down_w;        /* [E, D, I], dtype w_dtype */
  int w_dtype;               /* memra::DType code of every weight here: 0 f32, 1 bf16, 2 f16
                                (else 40020) */
  int E;                     /* >= 0 (else 40025) */
  int I;                     /* the experts' intermediate size, >= 0 (else 40025) */
  float limit;               /* the experts' swiglu_limit, > 0 (else 40025) */
  /* The shared expert: the three weights null: none (y is the routed sum alone). Otherwise all
     three are needed (else 40024), and y = swiglu_mlp(x; shared_*) + the routed sum: where the
     per-pair kernels run (T below moe_grouped_min_t) and shared_I == I it is one more slot of
     them per token, its x and h rounded to w_dtype as swiglu_mlp's GEMMs round them (one launch
     fewer for each of its GEMMs and its activation); otherwise the routed sum, then swiglu_mlp
     with the sum as its add. */
  const void* shared_gate_w; /* [shared_I, D], dtype w_dtype, or null */
  const void* shared_up_w;   /* [shared_I, D], dtype w_dtype, or null */
  const void* shared_down_w; /* [D, shared_I], dtype w_dtype, or null */
  int shared_I;              /* with a shared expert: >= 0 (else 40025) */
  float shared_limit;        /* with a shared expert: > 0 (else 40025) */
  float* y;                  /* [T, D] f32, overwritten */
} MemraMoeForwardParams;

/* The shared expert's sigmoid gate (Qwen3.5-MoE, Qwen3-Next: Qwen3_5MoeSparseMoeBlock):
   y[t] = routed[t] + sigmoid(x[t] . gate_w) * shared[t], the gate's dot product in f32 (one block
   a token, its own summation order), sigmoid 1 / (1 + expf(-g)), then one multiply and one add
   per element rounded as written (no fused multiply-add), as cpu::moe_shared_gate. */
typedef struct MemraMoeSharedGateParams {
  const float* x;       /* [T, D] f32: the MoE block's input */
  int T;                /* >= 0 (else 40025) */
  int D;                /* >= 0 (else 40025) */
  const float* gate_w;  /* [D] f32: shared_expert_gate.weight (its one row) */
  const float* shared;  /* [T, D] f32: the shared expert's output */
  const float* routed;  /* [T, D] f32: the routed experts' sum; may be y itself (in place) */
  float* y;             /* [T, D] f32 */
} MemraMoeSharedGateParams;

#define MEMRA_CUDA_MOE_OPS(X)                                                                     \
  /* cpu::moe_route (MemraMoeRouteParams). A null p is 40024. */                                  \
  X(moe_route, (MemraCudaCtx * ctx, const MemraMoeRouteParams* p))                                \
  /* cpu::moe_forward (+ the shared expert) (MemraMoeForwardParams). A null p is 40024. */        \
  X(moe_forward, (MemraCudaCtx * ctx, const MemraMoeForwardParams* p))                            \
  /* cpu::moe_shared_gate (MemraMoeSharedGateParams). A null p is 40024. */                      \
  X(moe_shared_gate, (MemraCudaCtx * ctx, const MemraMoeSharedGateParams* p))
