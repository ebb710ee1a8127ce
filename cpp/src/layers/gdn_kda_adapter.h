// ADAPTER (abi-kda; switch at the merge). GdnLayer runs KDA's causal conv (any channel count:
// GDN's q | k | v channels, group width G = C, no fused L2 norm) and KDA's decode pointer tables.
// Their op:: / parameter-struct forms (op::kda_conv with MemraKdaConvParams, kda_tables with
// MemraKdaTablesParams) were being written on the abi-kda branch while GDN was, so these wrappers
// make the same CPU / CUDA choice over the positional entries of main at GDN's branch point. At
// the merge each body becomes one call:
//   conv_direct -> op::kda_conv(b, {x, T, C, G = C, w, K, ring = DIRECT(ring_in, ring_out), y})
//   conv_tables -> op::kda_conv(b, {x, B, C, G = C, w, K, ring = TABLES(ring_in, ring_out), y})
//   tables      -> api.kda_tables(ctx, &MemraKdaTablesParams{..., plane_offset 0, no sinks})
// with the same values (those entries keep their kernels).
#pragma once

#include <cstdint>
#include <vector>

#include "memra/op/backend.h"
#include "memra/ops.h"

namespace memra::gdn_kda {

// Conv + SiLU over one sequence of T >= 1 tokens: x [T, C] -> y [T, C]; ring_in [C, K-1] (null:
// zeros) -> ring_out [C, K-1] (distinct). Reference: causal_conv1d_fn / causal_conv1d_update.
inline Status conv_direct(const op::Backend& b, const float* x, int T, int C, const float* w,
                          int K, const float* ring_in, float* ring_out, float* y) {
  if (b.on_cuda()) {
    return op::cuda_status(b, b.cuda->api().kda_conv_prefill(b.cuda->ctx(), x, T, C, C, w, K,
                                                              ring_in, ring_out, y),
                           "kda_conv");
  }
  std::vector<float> zeros;
  if (!ring_in) {
    zeros.assign(size_t(C) * (K - 1), 0.0f);
    ring_in = zeros.data();
  }
  if (T == 1) {
    cpu::kda_conv_decode(x, C, w, K, ring_in, ring_out, y);  // the decode arm: the same bits
  } else {
    cpu::kda_conv_prefill(x, T, C, w, K, ring_in, ring_out, y);
  }
  return Status::Ok();
}

// The decode step's conv: B sequences of one token, x [B, C] -> y [B, C]; ring_in / ring_out
// [B] device arrays of each row's [C, K-1] planes (kda_tables' output; a null entry reads zeros /
// is not written). CUDA only here (the CPU layer runs each row through conv_direct).
inline Status conv_tables(const op::Backend& b, const float* x, int B, int C, const float* w,
                          int K, const float* const* ring_in, float* const* ring_out, float* y) {
  if (!b.on_cuda()) {
    return Status(kUnsupportedGeometry, "kda_conv: the pointer-table form runs on CUDA here");
  }
  return op::cuda_status(
      b, b.cuda->api().kda_conv_decode(b.cuda->ctx(), x, B, C, C, w, K, ring_in, ring_out, y),
      "kda_conv");
}

// One recurrent layer's decode pointer tables from device slots and ping-pong flags (CUDA): row
// b with s = slots[b] >= 0 and c = cur[s] & 1 gets ring_in = conv<c> + s*conv_floats,
// ring_out = conv<1-c> + ..., state_in = state<c> + s*state_floats, state_out = state<1-c> + ...;
// an idle row (s < 0) gets null entries (read zeros, write nothing).
inline Status tables(const op::Backend& b, const int32_t* slots, const int32_t* cur, int B,
                     float* conv0, float* conv1, float* state0, float* state1, int64_t conv_floats,
                     int64_t state_floats, const float** ring_in, float** ring_out,
                     const float** state_in, float** state_out) {
  if (!b.on_cuda()) return Status(kUnsupportedGeometry, "kda_tables: CUDA only");
  return op::cuda_status(
      b, b.cuda->api().kda_tables(b.cuda->ctx(), slots, cur, B, conv0, conv1, state0, state1,
                                  conv_floats, state_floats, 0, ring_in, ring_out, state_in,
                                  state_out, nullptr, nullptr),
      "kda_tables");
}

}  // namespace memra::gdn_kda
