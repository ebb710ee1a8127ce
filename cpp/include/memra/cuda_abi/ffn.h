// CUDA ABI, FFN + sampling area (cuda/ffn.cu, cuda/sample.cu): the GPU twins of cpu::swiglu_mlp /
// moe_route / moe_forward / sample (ops.h).
#pragma once

#define MEMRA_CUDA_FFN_OPS(X)                                                                     \
  /* x [T, D]; gate_w, up_w [I, D]; down_w [D, I] (all w_dtype); y [T, D]. */                     \
  X(swiglu_mlp, (MemraCudaCtx * ctx, const float* x, int T, int D, const void* gate_w,            \
                 const void* up_w, const void* down_w, int w_dtype, int I, float limit, float* y)) \
  /* y = swiglu_mlp(x) + add, add [T, D] (not aliasing y) or null (swiglu_mlp itself). */        \
  X(swiglu_mlp_add, (MemraCudaCtx * ctx, const float* x, int T, int D, const void* gate_w,        \
                     const void* up_w, const void* down_w, int w_dtype, int I, float limit,       \
                     const float* add, float* y))                                                 \
  /* Router on f32 logits: gate_w [E, D] f32; corr_bias [E] or null; topk_idx, topk_w [T, top_k]. \
     Same order and values as cpu::moe_route. */                                                  \
  X(moe_route, (MemraCudaCtx * ctx, const float* x, int T, int D, const float* gate_w,            \
                const float* corr_bias, int E, int top_k, int n_group, int topk_group,            \
                int norm_topk_prob, float scaling, int32_t* topk_idx, float* topk_w))             \
  /* Routed experts, shared expert not included: gate_w, up_w [E, I, D]; down_w [E, D, I]        \
     (stacked, w_dtype); y [T, D] (overwritten). Ids outside [0, E) contribute nothing. */        \
  X(moe_forward, (MemraCudaCtx * ctx, const float* x, int T, int D, const int32_t* topk_idx,      \
                  const float* topk_w, int top_k, const void* gate_w, const void* up_w,           \
                  const void* down_w, int w_dtype, int E, int I, float limit, float* y))          \
  /* y = swiglu_mlp(x; shared_*) + moe_forward(x) (a MoE layer with its shared expert: gate,   \
     up [shared_I, D], down [D, shared_I], w_dtype, shared_limit). Where moe_forward takes its    \
     per-pair kernels (decode rows) and shared_I == I, the shared expert is one more slot of     \
     them per token, its x and h rounded to w_dtype as swiglu_mlp's GEMMs round them (the dot   \
     products summed in the expert kernels' order): one launch fewer for each of its three     \
     GEMMs and its activation. Otherwise moe_forward, then swiglu_mlp_add. */                    \
  X(moe_forward_shared, (MemraCudaCtx * ctx, const float* x, int T, int D,                        \
                         const int32_t* topk_idx, const float* topk_w, int top_k,                 \
                         const void* gate_w, const void* up_w, const void* down_w, int w_dtype,   \
                         int E, int I, float limit, const void* shared_gate_w,                    \
                         const void* shared_up_w, const void* shared_down_w, int shared_I,        \
                         float shared_limit, float* y))                                           \
  /* cpu::sample: logits [B, V]; counters [B] (device, uint64); out [B] int32. Row b draws with  \
     seeds[b] when seeds [B] (device, uint64) is given, else with `seed` (a batch of sequences   \
     with their own seeds samples in one launch). */                                             \
  X(sample, (MemraCudaCtx * ctx, const float* logits, int B, int V, float temperature, int top_k, \
             float top_p, uint64_t seed, const uint64_t* seeds, const uint64_t* counters,          \
             int32_t* out))
