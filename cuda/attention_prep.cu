// The full attention's prologue and K/V row append (cpp/include/memra/cuda_abi/attention.h): the
// GPU twins of memra::op::attn_prep / kv_append over cpu/attention.cpp. One block per (row, head)
// for the prologue, one per (row, kPrepThreads values of it) for the append; a row's position is pos0 + t or read on the
// device from the slot's length (the graph-safe form), so the launch shapes depend on T and the
// head counts only.
#include <cstdint>

#include "common.cuh"

using memra::cuda::ceil_div;
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
// krow (the fused prologue + append): a key head's block also stores its outputs there as C,
// the bytes kv_append_kernel would convert from k_out (null: not stored).
template <typename C>
__device__ __forceinline__ void prep_block(const MemraAttnPrepParams& p, int t, int head,
                                           C* krow) {
  __shared__ float xs[kMaxHd];
  __shared__ float red[kPrepWarps];
  const int hd = p.hd;
  const bool is_q = head < p.Hq;
  const float* src = is_q ? p.qg + t * p.ld_qg + int64_t(head) * 2 * hd
                          : p.k + t * p.ld_k + int64_t(head - p.Hq) * hd;
  const float* w = is_q ? p.q_norm : p.k_norm;
  float* dst = is_q ? p.q + (int64_t(t) * p.Hq + head) * hd
                    : p.k_out + (int64_t(t) * p.Hkv + (head - p.Hq)) * hd;
  float* gate = is_q && p.gate ? p.gate + (int64_t(t) * p.Hq + head) * hd : nullptr;
  // Every global load of the block first, into registers (dims d = threadIdx.x + j *
  // kPrepThreads): the position (slot, then length), the head's values and gate, the norm
  // weight and the inverse frequencies, so their round trips overlap instead of following each
  // other between the barriers; the arithmetic below is the same in the same order.
  constexpr int kPer = kMaxHd / kPrepThreads;
  const int half = p.n_rot / 2;
  const float pos = static_cast<float>(row_position(p.slots, p.lengths, p.pos0, t));
  float xv[kPer], gv[kPer], wv[kPer], fv[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int d = threadIdx.x + j * kPrepThreads;
    const bool in = d < hd;
    xv[j] = in ? src[d] : 0.0f;
    gv[j] = in && gate ? src[hd + d] : 0.0f;
    wv[j] = in ? w[d] : 0.0f;
    fv[j] = in && d < p.n_rot ? p.inv_freq[d < half ? d : d - half] : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int d = threadIdx.x + j * kPrepThreads;
    if (d < hd) {
      const float x = xv[j];
      xs[d] = x;
      ss += x * x;
      if (gate) gate[d] = gv[j];
    }
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kPrepWarps; ++i) total += red[i];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(hd) + p.eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int d = threadIdx.x + j * kPrepThreads;
    if (d < hd) xs[d] = __fmul_rn(wv[j], __fmul_rn(xs[d], inv));
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int d = threadIdx.x + j * kPrepThreads;
    if (d >= hd) continue;
    float y = xs[d];
    if (d < p.n_rot) {
      const bool lo = d < half;
      const float angle = __fmul_rn(pos, fv[j]);
      const float c = cosf(angle), s = sinf(angle);
      y = lo ? __fadd_rn(__fmul_rn(y, c), __fmul_rn(-xs[d + half], s))
             : __fadd_rn(__fmul_rn(y, c), __fmul_rn(xs[d - half], s));
    }
    dst[d] = y;
    if (krow && !is_q) krow[d] = from_f32<C>(y);
  }
}

__global__ void __launch_bounds__(kPrepThreads) attn_prep_kernel(MemraAttnPrepParams p) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  prep_block<float>(p, blockIdx.x, blockIdx.y, nullptr);
}

// Element offset of row t's K/V row in the planes (kv_append's position: pos0 + t, or the
// slot's device length); false for an idle row or a position past the planes (nothing written).
__device__ __forceinline__ bool append_at(const MemraKvAppendParams& p, int t, int64_t* at) {
  const int64_t row = int64_t(p.Hkv) * p.hd;
  if (!p.slots) {
    *at = (int64_t(p.pos0) + t) * row;
    return true;
  }
  const int s = p.slots[t];
  if (s < 0) return false;
  const int pos = p.lengths[s];
  if (pos < 0 || pos >= p.max_len) return false;
  *at = s * p.slot_stride + pos * row;
  return true;
}

// Row t's key and value rows into the cache (converted to C, RNE for bf16), at pos0 + t or at
// its slot's device length; idle rows and positions past the planes write nothing. Block
// (t, c) writes values [c * kPrepThreads, (c + 1) * kPrepThreads) of the row, one a thread (a
// block per row looped over the row, each load waiting for the previous store: a memory round
// trip per kPrepThreads values of the decode's one row).
template <typename C>
__global__ void __launch_bounds__(kPrepThreads) kv_append_kernel(MemraKvAppendParams p) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int t = blockIdx.x;
  const int64_t row = int64_t(p.Hkv) * p.hd;
  const int64_t e = int64_t(blockIdx.y) * kPrepThreads + threadIdx.x;
  if (e >= row) return;
  int64_t at = 0;
  if (!append_at(p, t, &at)) return;
  C* kd = static_cast<C*>(p.k_cache) + at;
  C* vd = static_cast<C*>(p.v_cache) + at;
  const float* ks = p.k + t * p.ld_k;
  const float* vs = p.v + t * p.ld_v;
  kd[e] = from_f32<C>(ks[e]);
  vd[e] = from_f32<C>(vs[e]);
}

// attn_prep then kv_append of its output keys in one launch (memra_cuda_attn_prep_append): block
// (t, head) for head < Hq + Hkv is attn_prep_kernel's, a key head's also storing its row into
// the cache (what kv_append_kernel converts from k_out); blocks head - Hq - Hkv = j < Hkv copy
// value head j of row t into the cache. The bytes of the two launches.
template <typename C>
__global__ void __launch_bounds__(kPrepThreads)
    attn_prep_append_kernel(MemraAttnPrepParams p, MemraKvAppendParams a) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int t = blockIdx.x, head = blockIdx.y, hd = p.hd;
  int64_t at = 0;
  const bool write = append_at(a, t, &at);
  if (head < p.Hq + p.Hkv) {
    C* krow = write && head >= p.Hq
                  ? static_cast<C*>(a.k_cache) + at + int64_t(head - p.Hq) * hd
                  : nullptr;
    prep_block<C>(p, t, head, krow);
    return;
  }
  if (!write) return;
  const int j = head - p.Hq - p.Hkv;
  C* vd = static_cast<C*>(a.v_cache) + at + int64_t(j) * hd;
  const float* vs = a.v + t * a.ld_v + int64_t(j) * hd;
  for (int d = threadIdx.x; d < hd; d += kPrepThreads) vd[d] = from_f32<C>(vs[d]);
}

}  // namespace

extern "C" {

int memra_cuda_attn_prep(MemraCudaCtx* ctx, const MemraAttnPrepParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  MEMRA_CUDA_RETURN_IF(memra_attn_prep_check(p));
  if (p->T == 0) return memra::kOk;
  if (int64_t(p->Hq) + p->Hkv > 65535) return memra::kUnsupportedGeometry;  // grid.y: a head a block
  memra::cuda::launch(ctx, true, attn_prep_kernel, dim3(static_cast<unsigned>(p->T), p->Hq + p->Hkv),
                      dim3(kPrepThreads), 0, *p);
  return launch_status();
}

int memra_cuda_attn_prep_append(MemraCudaCtx* ctx, const MemraAttnPrepParams* prep,
                                const MemraKvAppendParams* app) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  MEMRA_CUDA_RETURN_IF(memra_attn_prep_check(prep));
  MEMRA_CUDA_RETURN_IF(memra_kv_append_check(app));
  // One launch when app appends prep's output keys at prep's rows; else the two.
  const bool fused = app->k == prep->k_out && app->ld_k == int64_t(prep->Hkv) * prep->hd &&
                     app->T == prep->T && app->Hkv == prep->Hkv && app->hd == prep->hd &&
                     app->slots == prep->slots && app->lengths == prep->lengths &&
                     (app->slots || app->pos0 == prep->pos0) &&
                     int64_t(prep->Hq) + 2 * int64_t(prep->Hkv) <= 65535;  // its grid.y
  if (!fused) {
    MEMRA_CUDA_RETURN_IF(memra_cuda_attn_prep(ctx, prep));
    return memra_cuda_kv_append(ctx, app);
  }
  if (prep->T == 0) return memra::kOk;
  const dim3 grid(static_cast<unsigned>(prep->T), prep->Hq + 2 * prep->Hkv);
  if (app->cache_dtype == 0) {
    memra::cuda::launch(ctx, true, attn_prep_append_kernel<float>, grid, dim3(kPrepThreads), 0,
                        *prep, *app);
  } else {
    memra::cuda::launch(ctx, true, attn_prep_append_kernel<__nv_bfloat16>, grid,
                        dim3(kPrepThreads), 0, *prep, *app);
  }
  return launch_status();
}

int memra_cuda_kv_append(MemraCudaCtx* ctx, const MemraKvAppendParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  MEMRA_CUDA_RETURN_IF(memra_kv_append_check(p));
  if (p->T == 0) return memra::kOk;
  const int64_t row = int64_t(p->Hkv) * p->hd;
  if (ceil_div(row, kPrepThreads) > 65535) return memra::kUnsupportedGeometry;  // grid.y
  const dim3 grid(static_cast<unsigned>(p->T), static_cast<unsigned>(ceil_div(row, kPrepThreads)));
  if (p->cache_dtype == 0) {
    memra::cuda::launch(ctx, true, kv_append_kernel<float>, grid, dim3(kPrepThreads), 0, *p);
  } else {
    memra::cuda::launch(ctx, true, kv_append_kernel<__nv_bfloat16>, grid, dim3(kPrepThreads), 0, *p);
  }
  return launch_status();
}

}  // extern "C"
