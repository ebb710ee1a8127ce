// Decode-graph bookkeeping entry points (cuda_abi/graph_tables.h, and util.h's kda_tables; plan
// in docs/decode_graphs.md): the per-sequence pointer tables of a KDA layer, the MLA layer's
// positions and plane tables, and the decode step's commit, computed on the device from device
// slots, ping-pong flags and lengths, so a captured CUDA graph replays for any batch composition
// and position. One thread per batch row; launch shapes depend on B only; no allocation, no host
// synchronisation.
#include "common.cuh"
#include "slot_tables.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::SlotTables;

namespace {

constexpr int kRowThreads = 128;

// Row b: the planes of slot s = slots[b] (input plane cur[s], output plane 1 - cur[s]), or the
// sink for an idle row (s < 0; a null sink gives null entries).
__global__ void kda_tables_kernel(const int32_t* __restrict__ slots, const int32_t* __restrict__ cur,
                                  int B, float* conv_base0, float* conv_base1, float* state_base0,
                                  float* state_base1, int64_t conv_floats, int64_t state_floats,
                                  int64_t plane_offset, const float** __restrict__ ring_in,
                                  float** __restrict__ ring_out, const float** __restrict__ state_in,
                                  float** __restrict__ state_out, float* sink_conv,
                                  float* sink_state) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int s = slots[b];
  if (s < 0) {
    float* sc = sink_conv ? sink_conv + plane_offset : nullptr;
    ring_in[b] = sc;
    ring_out[b] = sc;
    state_in[b] = sink_state;
    state_out[b] = sink_state;
    return;
  }
  const bool one = (cur[s] & 1) != 0;
  const int64_t conv_off = static_cast<int64_t>(s) * conv_floats + plane_offset;
  const int64_t state_off = static_cast<int64_t>(s) * state_floats;
  ring_in[b] = (one ? conv_base1 : conv_base0) + conv_off;
  ring_out[b] = (one ? conv_base0 : conv_base1) + conv_off;
  state_in[b] = (one ? state_base1 : state_base0) + state_off;
  state_out[b] = (one ? state_base0 : state_base1) + state_off;
}

// Row b with s = slots[b] >= 0: lengths[s] += 1, cur[s] ^= 1 (atomic, so a repeated slot is
// counted once per occurrence instead of racing).
__global__ void commit_decode_kernel(const int32_t* __restrict__ slots, int B, int32_t* lengths,
                                     int32_t* cur) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int s = slots[b];
  if (s < 0) return;
  atomicAdd(lengths + s, 1);
  atomicXor(cur + s, 1);
}

// A decode step's positions and up to kMaxTables plane tables (memra_cuda_decode_tables):
// cuda/slot_tables.cuh's row entries, one thread a row.
__global__ void decode_tables_kernel(const int32_t* __restrict__ slots, int B,
                                     const int32_t* __restrict__ lengths, int32_t* __restrict__ pos,
                                     int32_t* __restrict__ t_kv, SlotTables t) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int s = slots[b];
  memra::cuda::decode_table_row(b, s, pos && s >= 0 ? lengths[s] : -1, pos, t_kv, t);
}

}  // namespace

extern "C" {

int memra_cuda_kda_tables(MemraCudaCtx* ctx, const int32_t* slots, const int32_t* cur, int B,
                          float* conv_base0, float* conv_base1, float* state_base0,
                          float* state_base1, int64_t conv_floats, int64_t state_floats,
                          int64_t plane_offset, const float** ring_in, float** ring_out,
                          const float** state_in, float** state_out, float* sink_conv,
                          float* sink_state) {
  // A deferred mHC Sinkhorn waits for the layer's first GEMV (common.cuh) unless it reads here.
  MEMRA_CUDA_RETURN_IF(memra::cuda::enter_keep(ctx));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, slots, sizeof(int32_t) * size_t(B > 0 ? B : 0)));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, cur, sizeof(int32_t)));
  if (B < 0 || conv_floats < 0 || state_floats < 0 || plane_offset < 0) {
    return memra::kContractValue;
  }
  if (B == 0) return memra::kOk;
  if (!slots || !cur || !conv_base0 || !conv_base1 || !state_base0 || !state_base1 || !ring_in ||
      !ring_out || !state_in || !state_out) {
    return memra::kContractMissing;
  }
  memra::cuda::launch(ctx, true, kda_tables_kernel, dim3(ceil_div(B, kRowThreads)),
      dim3(kRowThreads), 0, slots, cur, B, conv_base0, conv_base1, state_base0, state_base1,
      conv_floats, state_floats, plane_offset, ring_in, ring_out, state_in, state_out, sink_conv,
      sink_state);
  return launch_status();
}

int memra_cuda_commit_decode(MemraCudaCtx* ctx, const int32_t* slots, int B, int32_t* lengths,
                             int32_t* cur) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (B < 0) return memra::kContractValue;
  if (B == 0) return memra::kOk;
  if (!slots || !lengths || !cur) return memra::kContractMissing;
  memra::cuda::launch(ctx, true, commit_decode_kernel, dim3(ceil_div(B, kRowThreads)),
      dim3(kRowThreads), 0, slots, B, lengths, cur);
  return launch_status();
}

int memra_cuda_decode_tables(MemraCudaCtx* ctx, const MemraDecodeTablesParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!p) return memra::kContractMissing;
  const int32_t* slots = p->slots;
  const int32_t* lengths = p->lengths;
  int32_t *pos = p->pos, *t_kv = p->t_kv;
  const int B = p->B, n = p->n;
  if (B < 0 || n < 0 || n > memra::cuda::kMaxTables) return memra::kContractValue;
  if ((pos == nullptr) != (t_kv == nullptr)) return memra::kContractMissing;
  SlotTables t;
  MEMRA_CUDA_RETURN_IF(memra::cuda::make_slot_tables(n, p->bases, p->strides, p->outs, &t));
  if (B == 0 || (n == 0 && !pos)) return memra::kOk;
  if (!slots || (pos && !lengths)) return memra::kContractMissing;
  memra::cuda::launch(ctx, true, decode_tables_kernel, dim3(ceil_div(B, kRowThreads)),
                      dim3(kRowThreads), 0, slots, B, lengths, pos, t_kv, t);
  return launch_status();
}

}  // extern "C"
