// The full (softmax) attention's ops on either backend (memra::op, memra/op/backend.h): CPU
// reference in cpp/src/cpu/attention.cpp (memra/cpu/attention.h), CUDA in cuda/attention_prep.cu
// and cuda/attention.cu, parameter structs in cuda_abi/attention.h (which documents each field and
// the direct / device forms). Both backends refuse a struct with the same codes (the shared
// memra_*_check functions of the ABI header).
#pragma once

#include "memra/cuda_api.h"
#include "memra/op/backend.h"

namespace memra::op {

// The gated attention's prologue: joint [q | gate] split, zero-centred q/k RMSNorm (the caller
// passes 1 + w), partial NeoX RoPE (MemraAttnPrepParams). On the CPU the device form's slots and
// lengths are host arrays (an idle row, slot < 0, takes position 0, as on CUDA).
// Reference: Qwen3_5Attention.forward up to apply_rotary_pos_emb.
Status attn_prep(const Backend& b, const MemraAttnPrepParams& p);

// The K/V row append (MemraKvAppendParams): f32 or bf16 (RNE) cache rows on both backends.
// Reference: the cache update of past_key_values.update.
Status kv_append(const Backend& b, const MemraKvAppendParams& p);

// attn_prep(prep) then kv_append(app): the bytes and refusals of the two calls; on CUDA one
// launch when app appends prep's output keys at prep's rows (the layer's step).
Status attn_prep_append(const Backend& b, const MemraAttnPrepParams& prep,
                        const MemraKvAppendParams& app);

// Causal grouped attention with the sigmoid output gate (MemraAttnParams). The CPU runs
// memra::cpu::attention over the rows (bf16 cache rows widened exactly); on CUDA the device form
// splits over the sequence unless KernelOptions::attn_decode_unsplit.
// Reference: eager_attention_forward (repeat_kv), then attn_output * sigmoid(gate).
Status attention(const Backend& b, const MemraAttnParams& p);

}  // namespace memra::op
