// KDA area, decode-graph bookkeeping (cpp/include/memra/cuda_abi/kda.h: kda_tables; plan in
// docs/decode_graphs.md): one KDA layer's per-sequence pointer tables computed on the device from
// device slots and ping-pong flags, so a captured CUDA graph replays for any batch composition.
// One thread per batch row; the launch shape depends on B only; no allocation, no host
// synchronisation. (The decode step's conv and scan resolve their planes from the slots
// themselves, MEMRA_KDA_PLANES_SLOTS; these tables serve the TABLES form and its tests.)
#include "common.cuh"

using memra::cuda::ceil_div;
using memra::cuda::launch_status;

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

}  // namespace

extern "C" {

int memra_cuda_kda_tables(MemraCudaCtx* ctx, const MemraKdaTablesParams* p) {
  // A deferred mHC Sinkhorn waits for the layer's first GEMV (common.cuh) unless it reads here.
  MEMRA_CUDA_RETURN_IF(memra::cuda::enter_keep(ctx));
  if (!p) return memra::kContractMissing;
  const int B = p->B;
  MEMRA_CUDA_RETURN_IF(
      memra::cuda::flush_if_reads(ctx, p->slots, sizeof(int32_t) * size_t(B > 0 ? B : 0)));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, p->cur, sizeof(int32_t)));
  if (B < 0 || p->conv_floats < 0 || p->state_floats < 0 || p->plane_offset < 0) {
    return memra::kContractValue;
  }
  if (B == 0) return memra::kOk;
  if (!p->slots || !p->cur || !p->conv_base0 || !p->conv_base1 || !p->state_base0 ||
      !p->state_base1 || !p->ring_in || !p->ring_out || !p->state_in || !p->state_out) {
    return memra::kContractMissing;
  }
  memra::cuda::launch(ctx, true, kda_tables_kernel, dim3(ceil_div(B, kRowThreads)),
      dim3(kRowThreads), 0, p->slots, p->cur, B, p->conv_base0, p->conv_base1, p->state_base0,
      p->state_base1, p->conv_floats, p->state_floats, p->plane_offset, p->ring_in, p->ring_out,
      p->state_in, p->state_out, p->sink_conv, p->sink_state);
  return launch_status();
}

}  // extern "C"
