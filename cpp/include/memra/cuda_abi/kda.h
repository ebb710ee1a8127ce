// CUDA ABI, KDA area (cuda/kda_conv.cu, kda_scan.cu, kda_decode_lines.cu, kda_tables.cu;
// memra::op in op/kda.h): the GPU twins of cpu::kda_conv_prefill / kda_conv_decode / kda_gate /
// kda_scan (cpu/kda.h). The conv is instantiated for kernel widths 2..8 and the scan for head_dim 128;
// anything else is 50002 (the CPU backend still runs it). The gate is elementwise: any dk.
// Every entry takes one parameter struct (null: 40024); a fusion is a field of it.
#pragma once

/* How a KDA op names each row's recurrent planes (a conv ring [C, K-1] or a scan state
   [H, dk, dv], f32). The decode forms (TABLES, SLOTS) read a row's input plane and write its
   output plane (distinct buffers: the cache's ping-pong planes). */
enum {
  MEMRA_KDA_PLANES_DIRECT = 0, /* one sequence, its two planes named (kda_conv only) */
  MEMRA_KDA_PLANES_TABLES = 1, /* [B] device arrays of plane pointers (kda_tables' output) */
  MEMRA_KDA_PLANES_SLOTS = 2,  /* resolved in the kernel from device slots (the decode graph) */
  MEMRA_KDA_PLANES_STRIDED = 3 /* B rows' planes at a fixed stride (kda_scan only) */
};

typedef struct MemraKdaPlanes {
  int form; /* MEMRA_KDA_PLANES_*; another value (or a form the op does not take) is 40025 */
  /* DIRECT (and STRIDED: row b's planes are in + b * floats and out + b * floats, so no table
     is uploaded; on CUDA the decode step only, T == 1 without chunked (else 50002), bases
     16-byte aligned and floats a multiple of 4 (40022), floats >= the plane (40025)) */
  const float* in; /* the sequence's input plane; null = zeros */
  float* out;      /* its output plane, distinct from in; required (40024) */
  /* TABLES (the entries are not checked: the CUDA scans move a state plane as float4 / float2,
     so each must be 16-byte aligned, as the cache's planes are) */
  const float* const* in_table; /* [B] device array of input plane pointers; null, or a null
                                   entry, reads zeros */
  float* const* out_table;      /* [B] device array of output plane pointers; required (40024);
                                   a null entry is not written */
  /* SLOTS: kda_tables' arithmetic inside the kernel, without its launch or its tables. Row b with
     s = slots[b] >= 0 and c = cur[s] & 1 reads base<c> + s*floats + offset and writes
     base<1-c> + s*floats + offset; an idle row (s < 0) reads zeros and writes nothing. The CPU
     backend refuses this form (50002): only a CUDA graph needs it. */
  const int32_t* slots; /* [B] device int32; valid slots < max_batch (unchecked) */
  const int32_t* cur;   /* [max_batch] device int32 ping-pong flags (Cache::cur_d) */
  float* base0;         /* plane 0 of slot 0 (Cache::conv(layer, 0, 0) / Cache::state(...)) */
  float* base1;         /* plane 1 of slot 0 */
  int64_t floats;       /* floats from one slot's planes to the next's, >= 0 (else 40025);
                           STRIDED: from one row's planes to the next's */
  int64_t offset;       /* floats from a slot's plane start to the op's plane, >= 0 (else 40025);
                           the plane [offset, offset + plane floats) must fit `floats` (40025) */
  /* TABLES and SLOTS: early != 0 lets the decode kernels (the conv's decode forms, the scan at
     T == 1) read the row tables, slots, cur, the input planes and their weights before they wait
     for the launch in front of them, so no kernel that may still be running (that launch: each
     kernel triggers its dependent after its own wait) may write them. KdaLayer's decode: the
     q|k|v projection in front of the conv, f_b | g_b (B = 1) or b_proj in front of the scan.
     A permission, not a request: the other kernels read after their wait. */
  int early;
} MemraKdaPlanes;

/* KDA's f_b and g_b GEMVs over the gates' low-rank rows, which may ride in the conv's launch. */
typedef struct MemraKdaGemvPair {
  int run;          /* 0: no pair (the other fields are not read); != 0: the pair runs */
  const float* x0;  /* [K] f32 (one row), f_b's input; not one of the conv's outputs */
  const float* x1;  /* [K] f32, g_b's input; not one of the conv's outputs */
  int K;            /* columns of w0 and w1 */
  const void* w0;   /* [N0, K], dtype w_dtype (memra::DType code: 0 f32, 1 bf16, 2 f16) */
  const void* w1;   /* [N1, K], dtype w_dtype */
  int w_dtype;
  int N0, N1;       /* rows of w0, w1 */
  float* y0;        /* [N0] f32 = w0 x0 */
  float* y1;        /* [N1] f32 = w1 x1 */
} MemraKdaGemvPair;

/* Causal depthwise conv + SiLU (cpu::kda_conv_prefill / kda_conv_decode), one entry for every
   form: the DIRECT planes run the prefill kernel over T tokens of one sequence; TABLES and SLOTS
   run the decode kernel over B sequences of one token each (assemble + conv + roll in one launch;
   the values of the prefill kernel at T = 1 bit for bit). */
typedef struct MemraKdaConvParams {
  const float* x;      /* [n, C] f32 pre-conv projections (KdaLayer: q | k | v per row) */
  int n;               /* rows of x, >= 0 (else 40000): DIRECT T tokens, else B sequences */
  int C;               /* channels, >= 0 (else 40000) */
  int G;               /* y's group width: G >= 1 and C % G == 0 when C > 0 (else 40000) */
  const float* w;      /* [C, K] f32 taps (tap 0 meets the oldest input) */
  int K;               /* kernel width, >= 1 (else 40025); CUDA kernels 2..8 (else 50002) */
  MemraKdaPlanes ring; /* each row's ring [C, K-1] f32: the previous K-1 inputs, oldest first.
                          ring_out = the last K-1 inputs of ring_in ++ x (for T < K-1 it still
                          holds old ring values). DIRECT at T == 0: nothing runs (the caller
                          copies the ring through if it wants it) */
  float* y;            /* [C / G groups of [n, G]] f32: output (r, c) at
                          y[(c / G) * n * G + r * G + c % G] (G == C: plain [n, C]; KdaLayer's
                          G = qkv leaves q, k and v contiguous) */
  /* Fused L2 norm: cpu::l2norm_heads(eps) over the first l2_groups channel groups of y as rows
     of dk (KDA's q and k), the bytes of the two ops. In the decode kernel when a block's
     channels are one head (TABLES / SLOTS, dk == 128, G a multiple of it), else the norm's own
     launch after the conv. */
  int l2_groups;       /* 0: no norm; > 0 needs dk >= 1, G % dk == 0, l2_groups * G <= C (40000) */
  int dk;
  float eps;           /* inside the sqrt (FLA's form) */
  /* Fused GEMV pair, after the conv: the bytes of linear_ex_pair(x0, x1, f32, ldx K, T 1, K,
     w0, w1, w_dtype, N0, N1, no bias, y0, y1) (errors as that call: a null field is 40024). In
     the conv's launch when the form is SLOTS, B == 1, the L2 norm is in the kernel and the pair
     takes the decode GEMV's short rows (w bf16 or f32, K at most 32 vectors of 16 bytes, 16-byte
     aligned); otherwise the two launches. The CPU backend refuses it (50002). */
  MemraKdaGemvPair pair;
} MemraKdaConvParams;

/* KDA's log forget gate (cpu::kda_gate), with beta's sigmoid fused. */
typedef struct MemraKdaGateParams {
  const float* f;       /* [T, H*dk] f32 = f_b(f_a(x)) */
  const float* dt_bias; /* [H*dk] f32, per channel */
  const float* A_log;   /* [H] f32, per head */
  int T, H, dk;         /* >= 0 and H*dk < 2^31 (else 40000) */
  int form;             /* 0 lower bound (glm5_next), 1 softplus (kimi_linear); else 40025 */
  float lower_bound;    /* form 0: g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias)) */
  float* g;             /* [T, H*dk] f32; may alias f */
  float* beta;          /* [nbeta] f32 logits, turned into 1 / (1 + exp(-beta)) in place in the
                           same launch (sigmoid's bytes); null with nbeta 0: no beta */
  int64_t nbeta;        /* >= 0; > 0 needs beta (else 40025) */
} MemraKdaGateParams;

/* The delta-rule scan (cpu::kda_scan), B sequences of T steps each in one launch. Per step and
   head: S = S * exp(g)[:, None]; S += k (beta (v - k^T S)); o = (scale q)^T S.
   Forms: TABLES (any T; prefill B = 1, or the binding's batches; T one-step launches chained
   through the planes equal one T-step launch bit for bit; T == 0 or B == 0 is a no-op and writes
   no state), STRIDED (the binding's contiguous states: on CUDA the decode step, T == 1, with
   TABLES' kernel and bytes; the CPU any T) and SLOTS (a decode step, T == 1, with both fusions below: the only instantiated
   kernel of that form; anything else there is 50002). DIRECT is 40025. */
typedef struct MemraKdaScanParams {
  const void* q;       /* [B, T, H, dk] in_dtype, L2-normalised; 16-byte aligned on CUDA (40022) */
  const void* k;       /* [B, T, H, dk] in_dtype, L2-normalised; 16-byte aligned (40022) */
  const void* v;       /* [B, T, H, dv] in_dtype; 16-byte aligned (40022) */
  const void* g;       /* [B, T, H, dk] in_dtype log forget gate (fuse_gates: f, kda_gate's
                          input); 16-byte aligned (40022) */
  const float* beta;   /* [B, T, H] f32 (fuse_gates: the logits, only read, rows beta_ld apart) */
  int B, T, H;         /* >= 0 (else 40000) */
  int dk, dv;          /* >= 1 (else 40000); CUDA kernels 128 and 128 (else 50002) */
  float scale;         /* q's scale, dk**-0.5 in transformers */
  MemraKdaPlanes state; /* each row's state [H, dk, dv] f32. SLOTS: bases 16-byte aligned and
                           floats a multiple of 4 (else 40022), the plane fitting floats (40025) */
  void* o;             /* [B, T, H, dv] o_dtype; 16-byte aligned (40022); with fuse_norm it
                          must not alias q, k, v, g, gate_o */
  /* Fused gates (SLOTS): g and beta arrive raw, and the scan applies kda_gate(form, lower_bound,
     dt_bias, A_log) and beta's sigmoid as it loads them: the bytes of kda_gate with beta, then
     the scan (f and the logits are only read). */
  int fuse_gates;
  const float* dt_bias; /* [H*dk] f32, 16-byte aligned (40022); required (40024) */
  const float* A_log;   /* [H] f32; required (40024) */
  int gate_form;        /* as MemraKdaGateParams::form (40025) */
  float lower_bound;
  /* Fused norm (SLOTS): o written through rms_norm_gated_sigmoid(o, gate_o, o_norm, norm_eps)
     per head, in the scan's launch (a block per head), with the bytes of that call. */
  int fuse_norm;
  const float* gate_o; /* [B, T, H, dv] f32; required (40024) */
  const float* o_norm; /* [dv] f32; required (40024) */
  float norm_eps;
  /* The chunked (WY / UT) form on tensor cores (TABLES, any T >= 1; cuda/kda_chunk.cu): 0 the
     sequential scan (the f32 models' path, the oracle's twin; the T == 1 decode kernel), != 0
     the chunked kernels, which a bf16 model's prefill asks for: TF32 operands, f32 accumulation
     and an f32 state, within bf16-input error of the scan, not its bits. The same o and state
     layout, so decode continues from its state. The CPU backend runs its sequential reference
     either way. */
  int chunked;
  /* Fused gates (SLOTS): floats from one row's beta logits to the next's (beta [B, beta_ld],
     the row's H logits first: a column block of a wider GEMM output); 0 means H; below H 40025;
     the other forms read beta contiguous: anything but 0 or H there is 40025. */
  int64_t beta_ld;
  /* q, k, v and g's element type (memra::DType code): 0 f32; 1 bf16, the activations fla's
     chunk_kda takes, read at half the bytes and widened exactly to f32 on load. bf16 needs the
     chunked form on CUDA (the sequential kernels read f32: 50002); the CPU widens and runs its
     reference. Another value is 40025. beta and the state stay f32. */
  int in_dtype;
  /* o's element type (memra::DType code): 0 f32; 1 bf16, the f32 result rounded to nearest
     even as it is stored (fla chunk_kda's output dtype), with the chunked form or the SLOTS
     decode step (the gated norm's output, for the output projection to read) on CUDA (else
     50002); the CPU rounds its reference's o. A NaN stays a NaN, its payload unspecified (the
     CPU keeps it, CUDA's conversion does not). Another value is 40025. */
  int o_dtype;
} MemraKdaScanParams;

/* Decode-graph bookkeeping (docs/decode_graphs.md): one KDA layer's per-sequence pointer tables
   from device slots and ping-pong flags, so a captured graph replays for any batch. For row
   b < B with s = slots[b] >= 0 and c = cur[s] & 1:
     ring_in[b]  = conv_base<c>   + s*conv_floats + plane_offset,
     ring_out[b] = conv_base<1-c> + s*conv_floats + plane_offset,
     state_in[b] = state_base<c>  + s*state_floats, state_out[b] = state_base<1-c> + ...
   (the pointers KdaLayer would build on the host from Cache::conv / Cache::state); an idle row
   (s < 0) gets ring_in = ring_out = sink_conv + plane_offset and state_in = state_out =
   sink_state, or null entries when the sink is null (kda_conv / kda_scan's TABLES form then
   read zeros and skip the write). B == 0 is a no-op; one launch, shape from B only; no
   allocation, no host sync. CUDA only (no CPU twin). */
typedef struct MemraKdaTablesParams {
  const int32_t* slots;  /* [B] device int32; valid slots < max_batch (unchecked: the host
                            validates them before the upload) */
  const int32_t* cur;    /* [max_batch] device int32 ping-pong flags */
  int B;                 /* rows, >= 0 (else 40025) */
  float* conv_base0;     /* ring plane 0 / 1 of slot 0 (Cache::conv(layer, 0, c)) */
  float* conv_base1;
  float* state_base0;    /* state plane 0 / 1 of slot 0 (Cache::state(layer, 0, c)) */
  float* state_base1;
  int64_t conv_floats;   /* floats from one slot's ring planes to the next's, >= 0 (40025) */
  int64_t state_floats;  /* the same for the state planes, >= 0 (40025) */
  int64_t plane_offset;  /* floats from a slot's ring to the channel group's, >= 0 (40025) */
  const float** ring_in; /* [B] device pointer tables, written */
  float** ring_out;
  const float** state_in;
  float** state_out;
  float* sink_conv;      /* idle rows' ring plane (+ plane_offset), or null */
  float* sink_state;     /* idle rows' state plane, or null */
} MemraKdaTablesParams;

#define MEMRA_CUDA_KDA_OPS(X)                                                                     \
  /* Conv + SiLU in every plane form, with the fused L2 norm and GEMV pair (MemraKdaConvParams). \
     Checks in order: the form, the shapes (n, C, G, l2_groups), K, the SLOTS scalars; then      \
     nothing to do (n == 0 or C == 0: kOk); then missing pointers and the SLOTS plane fit. */    \
  X(kda_conv, (MemraCudaCtx * ctx, const MemraKdaConvParams* p))                                  \
  /* The forget gate, and beta's sigmoid in the same launch (MemraKdaGateParams). */             \
  X(kda_gate, (MemraCudaCtx * ctx, const MemraKdaGateParams* p))                                  \
  /* The delta-rule scan (MemraKdaScanParams): scan_kernel for T >= 2, the bandwidth-shaped      \
     decode kernel for T == 1 (the same bits); SLOTS with the gates and the norm fused. */       \
  X(kda_scan, (MemraCudaCtx * ctx, const MemraKdaScanParams* p))                                  \
  /* One KDA layer's decode pointer tables (MemraKdaTablesParams). */                            \
  X(kda_tables, (MemraCudaCtx * ctx, const MemraKdaTablesParams* p))
