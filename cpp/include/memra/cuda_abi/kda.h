// CUDA ABI, KDA area (cuda/kda.cu): the GPU twins of cpu::kda_conv_prefill / kda_conv_decode /
// kda_gate / kda_scan (ops.h). Kernels are instantiated for head_dim 128 and conv kernel 2..8;
// anything else is 50002 (the CPU backend still runs it). The gate is elementwise: any dk.
#pragma once

#define MEMRA_CUDA_KDA_OPS(X)                                                                     \
  /* One sequence: x [T, C]; w [C, K] f32; ring_in [C, K-1] (null = zeros); ring_out [C, K-1]     \
     (distinct from ring_in); y = silu(conv(ring_in ++ x)) split into C / G channel groups of     \
     width G: output (t, c) at y[(c / G) * T * G + t * G + c % G], i.e. the groups' [T, G]         \
     tensors one after another (G == C: y [T, C]; KdaLayer's G = qkv: q | k | v). C % G != 0 or  \
     G < 1 (C > 0) is 40000. */                                                                   \
  X(kda_conv_prefill, (MemraCudaCtx * ctx, const float* x, int T, int C, int G, const float* w,   \
                       int K, const float* ring_in, float* ring_out, float* y))                   \
  /* B sequences, one token each, one launch (assemble + conv + roll): x [B, C]; ring_in [B] and   \
     ring_out [B] are DEVICE arrays of pointers to each sequence's [C, K-1] planes (ring_in null   \
     or a null entry = zeros; a null ring_out entry is not written); y grouped as the prefill    \
     arm's with B rows: (b, c) at y[(c / G) * B * G + b * G + c % G] (G == C: y [B, C]).           \
     Values equal kda_conv_prefill at T = 1 bit for bit. */                                       \
  X(kda_conv_decode, (MemraCudaCtx * ctx, const float* x, int B, int C, int G, const float* w,    \
                      int K, const float* const* ring_in, float* const* ring_out, float* y))      \
  /* kda_conv_decode, then cpu::l2norm_heads(eps) of the first l2_groups channel groups of y as   \
     rows of dk (KDA's q and k; fused into the conv at dk = 128: the bytes of the two ops; 0: no  \
     norm), with each row's ring planes resolved in the kernel from the device slots instead of  \
     pointer tables (kda_tables' arithmetic, without its launch): row b with s = slots[b] >= 0   \
     and c = cur[s] & 1 reads ring_base<c> + s*ring_floats + ring_offset and writes             \
     ring_base<1-c> + the same; an idle row (s < 0) reads zeros and writes nothing. slots [B],    \
     cur [max_batch] device int32 (slots < max_batch, unchecked); ring_offset + C*(K-1) >         \
     ring_floats is 40025. early != 0: slots, cur, the input rings and w are read before the     \
     kernel waits for the launch in front of it, so no kernel that may still be running (that    \
     launch: each kernel triggers its dependent after its own wait) may write them; KdaLayer's   \
     decode: the q|k|v projection. Same bytes as kda_tables + kda_conv_decode + l2norm_heads. */ \
  X(kda_conv_decode_slots, (MemraCudaCtx * ctx, const float* x, int B, int C, int G,               \
                            const float* w, int K, const int32_t* slots, const int32_t* cur,      \
                            float* ring_base0, float* ring_base1, int64_t ring_floats,            \
                            int64_t ring_offset, int early, float* y, int l2_groups, int dk,      \
                            float eps))                                                           \
  /* kda_conv_decode_slots(x .. eps), then linear_ex_pair(gx0, gx1, 0, gK, 1, gK, gw0, gw1,       \
     w_dtype, N0, N1, null, null, gy0, gy1) (x f32 [gK]: KDA's f_b and g_b over the gates'        \
     low-rank rows), the bytes of those two calls: one launch at B == 1 when the conv takes its   \
     L2 form (dk == 128, G a multiple of it) and the pair the decode GEMV's short rows (w bf16 or  \
     f32, gK at most 32 vectors of 16 bytes, 16-byte aligned), else the two calls. The GEMV's     \
     inputs must not be the conv's outputs (y, the rings). Errors: as those calls. */              \
  X(kda_conv_decode_slots_pair, (MemraCudaCtx * ctx, const float* x, int B, int C, int G,          \
                                 const float* w, int K, const int32_t* slots, const int32_t* cur, \
                                 float* ring_base0, float* ring_base1, int64_t ring_floats,       \
                                 int64_t ring_offset, int early, float* y, int l2_groups, int dk, \
                                 float eps, const float* gx0, const float* gx1, int gK,           \
                                 const void* gw0, const void* gw1, int w_dtype, int N0, int N1,   \
                                 float* gy0, float* gy1))                                         \
  /* f [T, H*dk] -> g [T, H*dk] (may alias); dt_bias [H*dk]; A_log [H]; form 0 = lower bound      \
     (glm5_next), 1 = softplus (kimi). */                                                         \
  X(kda_gate, (MemraCudaCtx * ctx, const float* f, const float* dt_bias, const float* A_log,      \
               int T, int H, int dk, int form, float lower_bound, float* g))                      \
  /* kda_gate, and beta [nbeta] = 1 / (1 + exp(-beta)) in place (sigmoid's bytes). */           \
  X(kda_gate_beta, (MemraCudaCtx * ctx, const float* f, const float* dt_bias, const float* A_log, \
                    int T, int H, int dk, int form, float lower_bound, float* g, float* beta,     \
                    int64_t nbeta))                                                               \
  /* B sequences of T steps each, one kernel for prefill (B = 1) and decode (T = 1): q, k, g       \
     [B, T, H, dk]; v, o [B, T, H, dv]; beta [B, T, H]; state_in / state_out DEVICE arrays [B] of \
     pointers to [H, dk, dv] f32 planes (state_in null or a null entry = zeros; a null state_out  \
     entry is not written; state_out distinct). T one-step launches chained through the planes    \
     equal one T-step launch bit for bit. T == 0 or B == 0 is a no-op (state_out not written). */ \
  X(kda_scan, (MemraCudaCtx * ctx, const float* q, const float* k, const float* v,                \
               const float* g, const float* beta, int B, int T, int H, int dk, int dv,            \
               float scale, const float* const* state_in, float* const* state_out, float* o))     \
  /* One decode step (T = 1) of kda_gate_beta over f [B, H*dk] (dt_bias [H*dk], A_log [H], form, \
     lower_bound) and beta_logits [B, H], then kda_scan, then rms_norm_gated_sigmoid(o, gate_o    \
     [B, H*dv], o_norm [dv], norm_eps), in one launch (a block per head) with the bytes of those  \
     three calls; f and beta_logits are only read. Each row's state planes are resolved from the \
     device slots as kda_conv_decode_slots' rings (state_base<c> + s*state_floats; idle rows read \
     zeros, write nothing); the bases 16-byte aligned and state_floats a multiple of 4 (else      \
     40022), at least H*dk*dv (else 40025). early != 0: slots, cur and the input states are read \
     before the kernel waits for the launch in front of it, as kda_conv_decode_slots' rings       \
     (KdaLayer's decode: f_b | g_b at B = 1, b_proj at B > 1). q, k, v, f, dt_bias, o 16-byte     \
     aligned (40022); gate_o and o_norm required (40024). o must not alias q, k, v, f, gate_o. */ \
  X(kda_gate_scan_decode_slots, (MemraCudaCtx * ctx, const float* q, const float* k,              \
                                 const float* v, const float* f, const float* dt_bias,            \
                                 const float* A_log, int form, float lower_bound,                 \
                                 const float* beta_logits, int B, int H, int dk, int dv,          \
                                 float scale, const int32_t* slots, const int32_t* cur,           \
                                 float* state_base0, float* state_base1, int64_t state_floats,    \
                                 int early, const float* gate_o, const float* o_norm,             \
                                 float norm_eps, float* o))
