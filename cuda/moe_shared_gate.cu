// The shared expert's sigmoid gate of the Qwen MoE (cpp/include/memra/cuda_abi/moe.h
// `moe_shared_gate`): the GPU twin of cpu::moe_shared_gate (cpu/moe.cpp). One block a token: the
// gate's dot product x[t] . gate_w in f32 (per-thread strided partial sums, warp butterflies, the
// warps' sums added in warp order by every thread: one value for the block), s = 1 / (1 +
// expf(-g)), then y = routed + s * shared with the product and the sum each rounded (no FMA, as the
// CPU writes them). routed may be y (each element is read, then written, by one thread).
#include <cstdint>

#include "common.cuh"

using memra::cuda::launch_status;

namespace {

constexpr int kGateThreads = 256;

__global__ void __launch_bounds__(kGateThreads)
    moe_shared_gate_kernel(const float* __restrict__ x, int D, const float* __restrict__ gate_w,
                           const float* __restrict__ shared, const float* routed, float* y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float warp_part[kGateThreads / 32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * D;
  float acc = 0.0f;
  for (int d = threadIdx.x; d < D; d += kGateThreads) {
    acc = __fadd_rn(acc, __fmul_rn(x[row + d], gate_w[d]));
  }
  acc = memra::cuda::warp_sum(acc);
  if ((threadIdx.x & 31) == 0) warp_part[threadIdx.x >> 5] = acc;
  __syncthreads();
  float g = 0.0f;
#pragma unroll
  for (int i = 0; i < kGateThreads / 32; ++i) g = __fadd_rn(g, warp_part[i]);
  const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
  for (int d = threadIdx.x; d < D; d += kGateThreads) {
    y[row + d] = __fadd_rn(routed[row + d], __fmul_rn(s, shared[row + d]));
  }
}

}  // namespace

extern "C" int memra_cuda_moe_shared_gate(MemraCudaCtx* ctx, const MemraMoeSharedGateParams* p) {
  MEMRA_CUDA_RETURN_IF(memra::cuda::enter(ctx));
  if (!p) return memra::kContractMissing;
  if (p->T < 0 || p->D < 0) return memra::kContractValue;
  if (p->T == 0 || p->D == 0) return memra::kOk;
  if (!p->x || !p->gate_w || !p->shared || !p->routed || !p->y) return memra::kContractMissing;
  memra::cuda::launch(ctx, true, moe_shared_gate_kernel, dim3(p->T), dim3(kGateThreads), 0, p->x,
                      p->D, p->gate_w, p->shared, p->routed, p->y);
  return launch_status();
}
