// The full attention's prologue and K/V row append (cpp/include/memra/cuda_abi/attention.h): the
// GPU twins of memra::op::attn_prep / kv_append over cpu/attention.cpp. One block per (row, head)
// for the prologue, one per row for the append; a row's position is pos0 + t or read on the
// device from the slot's length (the graph-safe form), so the launch shapes depend on T and the
// head counts only.
#include <cstdint>

#include "common.cuh"

using memra::cuda::enter;
using memra::cuda::from_f32;
using memra::cuda::launch_status;
using memra::cuda::warp_sum;

namespace {

constexpr int kPrepThreads = 128;
constexpr int kPrepWarps = kPrepThreads / 32;
constexpr int kMaxHd = 256;  // memra_attn_check_heads refuses wider heads (50002)

// Row t's position: pos0 + t (direct form) or the device length of its slot (an idle row: 0).
__device__ __forceinline__ int row_position(const int32_t* slots, const int32_t* lengths, int pos0,
                                            int t) {
  if (!slots) return pos0 + t;
  const int s = slots[t];
  return s >= 0 ? lengths[s] : 0;
}

// Block (t, head): head < Hq is query head `head` of row t, read from the joint [q | gate] row
// (its gate half copied out); the others are key head head - Hq. The head's values are loaded
// into shared memory before anything is stored (k_out may be k itself), normed as cpu::rms_norm
// (y = w * (x * inv), inv = 1 / sqrt(mean(x^2) + eps)), then rotated as cpu::rope_neox: each
// product and sum rounded on its own (no fused multiply-add), so an element differs from the
// CPU's only through the norm's sum order and the device's cosf / sinf.
__global__ void __launch_bounds__(kPrepThreads) attn_prep_kernel(MemraAttnPrepParams p) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float xs[kMaxHd];
  __shared__ float red[kPrepWarps];
  const int t = blockIdx.x, head = blockIdx.y, hd = p.hd;
  const bool is_q = head < p.Hq;
  const float* src = is_q ? p.qg + t * p.ld_qg + int64_t(head) * 2 * hd
                          : p.k + t * p.ld_k + int64_t(head - p.Hq) * hd;
  const float* w = is_q ? p.q_norm : p.k_norm;
  float* dst = is_q ? p.q + (int64_t(t) * p.Hq + head) * hd
                    : p.k_out + (int64_t(t) * p.Hkv + (head - p.Hq)) * hd;
  float* gate = is_q && p.gate ? p.gate + (int64_t(t) * p.Hq + head) * hd : nullptr;
  float ss = 0.0f;
  for (int d = threadIdx.x; d < hd; d += kPrepThreads) {
    const float x = src[d];
    xs[d] = x;
    ss += x * x;
    if (gate) gate[d] = src[hd + d];
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kPrepWarps; ++i) total += red[i];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(hd) + p.eps);
  for (int d = threadIdx.x; d < hd; d += kPrepThreads) xs[d] = __fmul_rn(w[d], __fmul_rn(xs[d], inv));
  __syncthreads();
  const int half = p.n_rot / 2;
  const float pos = static_cast<float>(row_position(p.slots, p.lengths, p.pos0, t));
  for (int d = threadIdx.x; d < hd; d += kPrepThreads) {
    float y = xs[d];
    if (d < p.n_rot) {
      const bool lo = d < half;
      const float angle = __fmul_rn(pos, p.inv_freq[lo ? d : d - half]);
      const float c = cosf(angle), s = sinf(angle);
      y = lo ? __fadd_rn(__fmul_rn(y, c), __fmul_rn(-xs[d + half], s))
             : __fadd_rn(__fmul_rn(y, c), __fmul_rn(xs[d - half], s));
    }
    dst[d] = y;
  }
}

// Row t's key and value rows into the cache (converted to C, RNE for bf16), at pos0 + t or at
// its slot's device length; idle rows and positions past the planes write nothing.
template <typename C>
__global__ void __launch_bounds__(kPrepThreads) kv_append_kernel(MemraKvAppendParams p) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int t = blockIdx.x;
  const int64_t row = int64_t(p.Hkv) * p.hd;
  int64_t at = 0;
  if (p.slots) {
    const int s = p.slots[t];
    if (s < 0) return;
    const int pos = p.lengths[s];
    if (pos < 0 || pos >= p.max_len) return;
    at = s * p.slot_stride + pos * row;
  } else {
    at = (int64_t(p.pos0) + t) * row;
  }
  C* kd = static_cast<C*>(p.k_cache) + at;
  C* vd = static_cast<C*>(p.v_cache) + at;
  const float* ks = p.k + t * p.ld_k;
  const float* vs = p.v + t * p.ld_v;
  for (int64_t e = threadIdx.x; e < row; e += kPrepThreads) {
    kd[e] = from_f32<C>(ks[e]);
    vd[e] = from_f32<C>(vs[e]);
  }
}

}  // namespace

extern "C" {

int memra_cuda_attn_prep(MemraCudaCtx* ctx, const MemraAttnPrepParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  MEMRA_CUDA_RETURN_IF(memra_attn_prep_check(p));
  if (p->T == 0) return memra::kOk;
  memra::cuda::launch(ctx, true, attn_prep_kernel, dim3(static_cast<unsigned>(p->T), p->Hq + p->Hkv),
                      dim3(kPrepThreads), 0, *p);
  return launch_status();
}

int memra_cuda_kv_append(MemraCudaCtx* ctx, const MemraKvAppendParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  MEMRA_CUDA_RETURN_IF(memra_kv_append_check(p));
  if (p->T == 0) return memra::kOk;
  const dim3 grid(static_cast<unsigned>(p->T));
  if (p->cache_dtype == 0) {
    memra::cuda::launch(ctx, true, kv_append_kernel<float>, grid, dim3(kPrepThreads), 0, *p);
  } else {
    memra::cuda::launch(ctx, true, kv_append_kernel<__nv_bfloat16>, grid, dim3(kPrepThreads), 0, *p);
  }
  return launch_status();
}

}  // extern "C"
