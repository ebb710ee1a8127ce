// CUDA ABI, the KDA layer's decode pointer tables (cuda/graph_tables.cu). add is in basic.h,
// hc_expand in mhc.h, commit_decode and decode_tables in graph_tables.h.
#pragma once

#define MEMRA_CUDA_UTIL_OPS(X)                                                                    \
  /* Decode-graph bookkeeping (cuda/graph_tables.cu; docs/decode_graphs.md): per-sequence state     \
     reached from device slots and ping-pong flags, so a captured graph replays for any of them.   \
     KDA pointer tables of one layer: for row b < B with s = slots[b] >= 0 and c = cur[s] & 1,     \
       ring_in[b]  = conv_base<c>   + s*conv_floats + plane_offset,                               \
       ring_out[b] = conv_base<1-c> + s*conv_floats + plane_offset,                               \
       state_in[b] = state_base<c>  + s*state_floats, state_out[b] = state_base<1-c> + ...;       \
     (the pointers KdaLayer::run_cuda builds on the host from Cache::conv / Cache::state); an      \
     idle row (s < 0) gets ring_in = ring_out = sink_conv + plane_offset and state_in = state_out \
     = sink_state, or null entries when the sink is null (kda_conv_decode / kda_scan then read    \
     zeros and skip the write). slots [B] and cur [max_batch] are device int32 arrays; valid      \
     slots are < max_batch (unchecked: the host validates them before the upload). B == 0 is a    \
     no-op; one launch, shape from B only; no allocation, no host sync. */                        \
  X(kda_tables, (MemraCudaCtx * ctx, const int32_t* slots, const int32_t* cur, int B,              \
                 float* conv_base0, float* conv_base1, float* state_base0, float* state_base1,     \
                 int64_t conv_floats, int64_t state_floats, int64_t plane_offset,                  \
                 const float** ring_in, float** ring_out, const float** state_in,                  \
                 float** state_out, float* sink_conv, float* sink_state))
