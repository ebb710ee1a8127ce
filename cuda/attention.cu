// The full attention over a K/V cache (memra_cuda_attention, cpp/include/memra/cuda_abi/attention.h):
// grouped causal softmax attention with the sigmoid output gate, the GPU twin of
// memra::op::attention over cpu::attention.
//
// One kernel serves the prefill (direct form) and the decode (device form). A block owns one
// K/V head (or a group of at most kItems of its query heads) and up to kItems (query, head)
// items: a tile of queries times the head's query heads at prefill, one row's query heads at
// decode; item i is warp i % kWarps's slot i / kWarps. It walks the cache rows in tiles of
// kKeys: the tile's keys and values land in shared memory as f32 (once for every query head of
// the K/V head: the grouped heads share the loads), then each warp scores the tile (lane j the
// key j: its dot product with the item's query, sequential over the head dims), updates its
// items' online softmax (running max m, sum l, unnormalised output acc in registers) and
// accumulates the values (lane j the dims j, j + 32, ...). f32 on CUDA cores throughout.
//
// Device form: the rows of a sequence are split over blockIdx.z in memra_attention_split_rows
// chunks sized from the cache's capacity, never from a length: the grid is the same at every
// position (what a captured graph replays), a split past the row's position exits at once, and
// the live splits' (m, l, acc) are merged per head by attention_merge_kernel. With one split (a
// short cache, or KernelOptions::attn_decode_unsplit) the block writes the output itself; a row
// whose rows fit in the first split gets the same bytes either way (the merge of one split is
// acc * 1 / (l * 1), the same division).
//
// The direct form over a bf16 cache at T > 1 runs the tensor-core kernel of cuda/attention_tc.cu
// instead when KernelOptions::attn_prefill_tensor_cores is set (and the geometry fits: head
// widths a multiple of 8, 16-byte aligned planes); this kernel stays the exact path (f32 caches,
// the decode, the option off).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;
using memra::cuda::to_f32;
using memra::cuda::warp_max;
using memra::cuda::warp_sum;

namespace memra::cuda::attn {
// cuda/attention_tc.cu: the tensor-core prefill and the forms it takes.
bool prefill_tc_fits(const MemraCudaCtx* ctx, const MemraAttnParams& p);
int prefill_tc(MemraCudaCtx* ctx, const MemraAttnParams& p);
}  // namespace memra::cuda::attn

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kKeys = 32;                 // cache rows a tile: one key a lane when scoring
constexpr int kItems = 16;                // (query, head) items a block
constexpr int kMaxSlots = kItems / kWarps;  // items a warp
constexpr int kMaxHd = 256;               // memra_attn_check_heads refuses wider heads
constexpr int kVpl = kMaxHd / 32;         // head dims a lane accumulates

// Shared memory of a block: the items' queries [kItems, hd], the tile's keys [kKeys, hd + 1]
// (the pad makes lane j's row walk bank-conflict free) and values [kKeys, hd], f32.
size_t smem_bytes(int hd) {
  return sizeof(float) * (size_t(kItems) * hd + size_t(kKeys) * (hd + 1) + size_t(kKeys) * hd);
}

struct Launch {
  MemraAttnParams p;
  int Hb;          // query heads a block (min(Hq / Hkv, kItems))
  int hgroups;     // blocks a K/V head (ceil((Hq / Hkv) / Hb))
  int QT;          // queries a block: kItems / Hb (direct form), 1 (device form)
  int split_rows;  // device form: rows a split (>= max_len: one split)
  int n_splits;    // device form: gridDim.z
  float* part_acc; // device form with n_splits > 1: [T, Hq, n_splits, hd] unnormalised outputs
  float* part_ml;  // [T, Hq, n_splits, 2]: each split's running max and sum
  int vec;         // 16-byte loads of the cache rows (hd a multiple of the vector, aligned planes)
};

// 16 bytes of cache row as raw bits (loaded first, converted later: see load_tile), and their
// elements as f32.
template <typename C>
__device__ __forceinline__ uint4 raw16(const C* src) {
  return *reinterpret_cast<const uint4*>(src);
}
template <typename C>
__device__ __forceinline__ void unpack16(const uint4& v, float* out);
template <>
__device__ __forceinline__ void unpack16<float>(const uint4& v, float* out) {
  out[0] = __uint_as_float(v.x);
  out[1] = __uint_as_float(v.y);
  out[2] = __uint_as_float(v.z);
  out[3] = __uint_as_float(v.w);
}
template <>
__device__ __forceinline__ void unpack16<__nv_bfloat16>(const uint4& v, float* out) {
  const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = __bfloat162float(h[e]);
}

// Loads a thread keeps in flight at once (load_tile, the queries): the decode's tile is a few
// 16-byte loads a thread, each a DRAM round trip; issued one after another (load, store, next
// load) they cost a round trip each, which made a short-context decode block latency-bound.
constexpr int kInflight = 8;

// Rows [base, base + rows) of the K/V head at element offset `off` of each row (rows are
// `stride` elements apart) into ks [kKeys, hd + 1] / vs [kKeys, hd] as f32; tile rows past
// `rows` are zeros (never a stale cache row: its bytes may not be finite). The vector form
// issues kInflight iterations' loads before it converts and stores any of them (the same
// values in the same places).
template <typename C>
__device__ void load_tile(const C* kp, const C* vp, int base, int rows, int64_t stride, int64_t off,
                          int hd, bool vec, float* ks, float* vs) {
  if (vec) {
    constexpr int E = 16 / sizeof(C);
    const int nv = hd / E;
    const int n = kKeys * nv;
    for (int i0 = threadIdx.x; i0 < n; i0 += kInflight * kThreads) {
      uint4 kr[kInflight], vr[kInflight];
#pragma unroll
      for (int u = 0; u < kInflight; ++u) {
        const int i = i0 + u * kThreads;
        const int r = i / nv, c = (i % nv) * E;
        if (i < n && r < rows) {
          const int64_t at = int64_t(base + r) * stride + off + c;
          kr[u] = raw16<C>(kp + at);
          vr[u] = raw16<C>(vp + at);
        } else {
          kr[u] = vr[u] = make_uint4(0u, 0u, 0u, 0u);  // f32 / bf16 zeros
        }
      }
#pragma unroll
      for (int u = 0; u < kInflight; ++u) {
        const int i = i0 + u * kThreads;
        if (i < n) {
          const int r = i / nv, c = (i % nv) * E;
          float kx[E], vx[E];
          unpack16<C>(kr[u], kx);
          unpack16<C>(vr[u], vx);
#pragma unroll
          for (int e = 0; e < E; ++e) {
            ks[r * (hd + 1) + c + e] = kx[e];
            vs[r * hd + c + e] = vx[e];
          }
        }
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < kKeys * hd; i += kThreads) {
    const int r = i / hd, c = i % hd;
    const int64_t at = int64_t(base + r) * stride + off + c;
    ks[r * (hd + 1) + c] = r < rows ? to_f32(kp[at]) : 0.0f;
    vs[r * hd + c] = r < rows ? to_f32(vp[at]) : 0.0f;
  }
}

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// Device form: the rows slot s's query sees, its length + 1 (the step's own row appended there),
// within [0, max_len].
__device__ __forceinline__ int visible_rows(const MemraAttnParams& p, int s) {
  const int64_t n = int64_t(p.lengths[s]) + 1;
  return n < 0 ? 0 : n > p.max_len ? p.max_len : static_cast<int>(n);
}

// NS: item slots a warp runs (ceil(items / kWarps): 1, 2 or 4).
template <typename C, int NS>
__global__ void __launch_bounds__(kThreads) attention_kernel(Launch L) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ float smem[];
  const MemraAttnParams& p = L.p;
  const int hd = p.hd, Hq = p.Hq, G = Hq / p.Hkv;
  float* qs = smem;                   // [kItems, hd]
  float* ks = qs + kItems * hd;       // [kKeys, hd + 1]
  float* vs = ks + kKeys * (hd + 1);  // [kKeys, hd]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = blockIdx.y / L.hgroups;
  const int h0 = g * G + (blockIdx.y % L.hgroups) * L.Hb;  // the block's first query head
  const int hb = min(L.Hb, (g + 1) * G - h0);              // and its count

  // The block's queries [q0, q0 + nq), planes, and the rows [r0, r1) it walks.
  int q0 = 0, nq = 1, r0 = 0, r1 = 0, n_dev = 0;
  const C* kp = static_cast<const C*>(p.k_cache);
  const C* vp = static_cast<const C*>(p.v_cache);
  if (p.slots) {
    q0 = blockIdx.x;
    const int s = p.slots[q0];
    if (s >= 0) {
      n_dev = visible_rows(p, s);
      kp += s * p.slot_stride;
      vp += s * p.slot_stride;
    }
    r0 = blockIdx.z * L.split_rows;
    r1 = min(r0 + L.split_rows, n_dev);
    if (r0 >= r1) {  // idle row, or a split past the row's position
      if (!L.part_acc && blockIdx.z == 0) {  // one split: the block owns the output (zeros)
        for (int i = threadIdx.x; i < hb * hd; i += kThreads) {
          p.o[(int64_t(q0) * Hq + h0 + i / hd) * hd + i % hd] = 0.0f;
        }
      }
      return;  // (split form: the merge skips dead splits and zeroes idle rows)
    }
  } else {
    q0 = blockIdx.x * L.QT;
    nq = min(L.QT, p.T - q0);
    r1 = p.pos0 + q0 + nq;  // the block's last query sees rows < r1
  }
  const int items = nq * hb;

  // Item i: query q0 + i / hb, head h0 + i % hb; lim = rows it sees within [r0, r1).
  // (kInflight loads a thread in flight before their stores, as load_tile.)
  for (int i0 = threadIdx.x; i0 < kItems * hd; i0 += kInflight * kThreads) {
    float v[kInflight];
#pragma unroll
    for (int u = 0; u < kInflight; ++u) {
      const int i = i0 + u * kThreads;
      const int it = i / hd, d = i % hd;
      v[u] = 0.0f;
      if (i < kItems * hd && it < items) {
        v[u] = p.q[(int64_t(q0 + it / hb) * Hq + h0 + it % hb) * hd + d];
      }
    }
#pragma unroll
    for (int u = 0; u < kInflight; ++u) {
      const int i = i0 + u * kThreads;
      if (i < kItems * hd) qs[i] = v[u];
    }
  }
  int lim[NS];
  float m[NS], l[NS], acc[NS][kVpl];
#pragma unroll
  for (int j = 0; j < NS; ++j) {
    const int it = warp + kWarps * j;
    lim[j] = it >= items ? 0 : p.slots ? r1 : p.pos0 + q0 + it / hb + 1;
    m[j] = -INFINITY;
    l[j] = 0.0f;
#pragma unroll
    for (int v = 0; v < kVpl; ++v) acc[j][v] = 0.0f;
  }

  const int64_t stride = int64_t(p.Hkv) * hd, off = int64_t(g) * hd;
  for (int base = r0; base < r1; base += kKeys) {
    const int rows = min(kKeys, r1 - base);
    __syncthreads();  // the previous tile is consumed (and qs written, the first time)
    load_tile<C>(kp, vp, base, rows, stride, off, hd, L.vec != 0, ks, vs);
    __syncthreads();
    float s[NS];
#pragma unroll
    for (int j = 0; j < NS; ++j) s[j] = 0.0f;
    const float* kr = ks + lane * (hd + 1);
    for (int d = 0; d < hd; ++d) {
      const float kd = kr[d];
#pragma unroll
      for (int j = 0; j < NS; ++j) s[j] = fmaf(qs[(warp + kWarps * j) * hd + d], kd, s[j]);
    }
    float pr[NS];
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      pr[j] = 0.0f;
      if (base >= lim[j]) continue;  // warp-uniform: the item sees no row of this tile
      const bool valid = base + lane < lim[j];
      const float x = valid ? s[j] * p.scale : -INFINITY;
      const float m_new = fmaxf(m[j], warp_max(x));  // finite: lane 0's row is valid
      const float e = valid ? expf(x - m_new) : 0.0f;
      const float corr = expf(m[j] - m_new);  // 0 on the item's first tile (m = -inf)
      l[j] = l[j] * corr + warp_sum(e);
#pragma unroll
      for (int v = 0; v < kVpl; ++v) acc[j][v] *= corr;
      m[j] = m_new;
      pr[j] = e;
    }
    for (int r = 0; r < rows; ++r) {
      float pk[NS];
#pragma unroll
      for (int j = 0; j < NS; ++j) pk[j] = __shfl_sync(kFull, pr[j], r);
      const float* vr = vs + r * hd;
#pragma unroll
      for (int v = 0; v < kVpl; ++v) {
        const int d = lane + 32 * v;
        if (d < hd) {
          const float x = vr[d];
#pragma unroll
          for (int j = 0; j < NS; ++j) acc[j][v] = fmaf(pk[j], x, acc[j][v]);
        }
      }
    }
  }

#pragma unroll
  for (int j = 0; j < NS; ++j) {
    const int it = warp + kWarps * j;
    if (it >= items) continue;
    const int t = q0 + it / hb, h = h0 + it % hb;
    if (L.part_acc) {
      const int64_t at = (int64_t(t) * Hq + h) * L.n_splits + blockIdx.z;
#pragma unroll
      for (int v = 0; v < kVpl; ++v) {
        const int d = lane + 32 * v;
        if (d < hd) L.part_acc[at * hd + d] = acc[j][v];
      }
      if (lane == 0) {
        L.part_ml[at * 2] = m[j];
        L.part_ml[at * 2 + 1] = l[j];
      }
      continue;
    }
    const int64_t at = (int64_t(t) * Hq + h) * hd;
#pragma unroll
    for (int v = 0; v < kVpl; ++v) {
      const int d = lane + 32 * v;
      if (d >= hd) continue;
      float y = acc[j][v] / l[j];
      if (p.gate) y = y * sigmoid(p.gate[at + d]);
      p.o[at + d] = y;
    }
  }
}

// The per-head merge of the device form's splits: block (t, h), thread d. The live splits of row
// t (those below its position) are combined with weights exp(m_s - max m); an idle row is zero.
__global__ void __launch_bounds__(kMaxHd) attention_merge_kernel(Launch L) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const MemraAttnParams& p = L.p;
  const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  if (d >= p.hd) return;
  const int64_t row = int64_t(t) * p.Hq + h;
  float* o = p.o + row * p.hd + d;
  // The gate's load first: its round trip overlaps the slot's and length's.
  const float gate = p.gate ? p.gate[row * p.hd + d] : 0.0f;
  const int s = p.slots[t];
  const int n = s < 0 ? 0 : visible_rows(p, s);
  const int live = (n + L.split_rows - 1) / L.split_rows;
  if (live == 0) {
    *o = 0.0f;
    return;
  }
  const float* ml = L.part_ml + row * L.n_splits * 2;
  const float* acc = L.part_acc + row * L.n_splits * p.hd + d;
  float mx = ml[0];
  for (int k = 1; k < live; ++k) mx = fmaxf(mx, ml[2 * k]);
  // The first split's terms start the sums (not 0 + them): one live split gives acc / l exactly.
  float w = expf(ml[0] - mx);
  float num = w * acc[0], den = w * ml[1];
  for (int k = 1; k < live; ++k) {
    w = expf(ml[2 * k] - mx);
    num += w * acc[int64_t(k) * p.hd];
    den += w * ml[2 * k + 1];
  }
  float y = num / den;
  if (p.gate) y = y * sigmoid(gate);
  *o = y;
}

// Allow `bytes` of dynamic shared memory for `kernel` (50002 beyond the device's opt-in limit).
template <typename K>
int allow_smem(MemraCudaCtx* ctx, K* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return memra::kOk;
  int optin = 0;
  MEMRA_CUDA_RETURN_IF(status_of(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device)));
  if (bytes > static_cast<size_t>(optin)) return memra::kUnsupportedGeometry;
  return status_of(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
}

template <typename C, int NS>
int launch_attention(MemraCudaCtx* ctx, const Launch& L, dim3 grid) {
  const size_t smem = smem_bytes(L.p.hd);
  MEMRA_CUDA_RETURN_IF(allow_smem(ctx, attention_kernel<C, NS>, smem));
  memra::cuda::launch(ctx, true, attention_kernel<C, NS>, grid, dim3(kThreads), smem, L);
  return launch_status();
}

template <typename C>
int launch_slots(MemraCudaCtx* ctx, const Launch& L, dim3 grid) {
  const int items = L.Hb * L.QT;
  if (items <= kWarps) return launch_attention<C, 1>(ctx, L, grid);
  if (items <= 2 * kWarps) return launch_attention<C, 2>(ctx, L, grid);
  return launch_attention<C, kMaxSlots>(ctx, L, grid);
}

int launch_any(MemraCudaCtx* ctx, const Launch& L, dim3 grid) {
  return L.p.cache_dtype == 0 ? launch_slots<float>(ctx, L, grid)
                              : launch_slots<__nv_bfloat16>(ctx, L, grid);
}

}  // namespace

extern "C" {

int memra_cuda_attention(MemraCudaCtx* ctx, const MemraAttnParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  MEMRA_CUDA_RETURN_IF(memra_attention_check(p));
  if (p->T == 0) return memra::kOk;
  if (memra::cuda::attn::prefill_tc_fits(ctx, *p)) return memra::cuda::attn::prefill_tc(ctx, *p);
  Launch L = {};
  L.p = *p;
  const int G = p->Hq / p->Hkv;
  L.Hb = std::min(G, kItems);
  L.hgroups = (G + L.Hb - 1) / L.Hb;
  const bool device = p->slots != nullptr;
  L.QT = device ? 1 : kItems / L.Hb;
  const int E = p->cache_dtype == 0 ? 4 : 8;  // elements of a 16-byte load
  L.vec = p->hd % E == 0 && memra::cuda::aligned16(p->k_cache) && memra::cuda::aligned16(p->v_cache) &&
          (!device || p->slot_stride % E == 0);
  // grid.y: one block per K/V head and head group (65535 at most, as a launch allows).
  if (int64_t(p->Hkv) * L.hgroups > 65535) return memra::kUnsupportedGeometry;
  const unsigned heads = static_cast<unsigned>(p->Hkv * L.hgroups);
  if (!device) {
    return launch_any(ctx, L, dim3(ceil_div(p->T, L.QT), heads, 1));
  }
  L.split_rows = ctx->options.attn_decode_unsplit
                     ? p->max_len
                     : memra_attention_split_rows(p->max_len, p->Hkv * L.hgroups);
  L.n_splits = (p->max_len + L.split_rows - 1) / L.split_rows;
  const size_t rows = size_t(p->T) * p->Hq * L.n_splits;
  Scratch part(ctx, L.n_splits > 1 ? sizeof(float) * rows * (size_t(p->hd) + 2) : 0);
  MEMRA_CUDA_RETURN_IF(part.status());
  if (L.n_splits > 1) {
    L.part_acc = part.as<float>();
    L.part_ml = L.part_acc + rows * p->hd;
  }
  MEMRA_CUDA_RETURN_IF(launch_any(ctx, L, dim3(static_cast<unsigned>(p->T), heads, L.n_splits)));
  if (L.n_splits == 1) return memra::kOk;
  const unsigned threads = static_cast<unsigned>((p->hd + 31) / 32 * 32);
  memra::cuda::launch(ctx, true, attention_merge_kernel, dim3(static_cast<unsigned>(p->T), p->Hq),
                      dim3(threads), 0, L);
  return launch_status();
}

}  // extern "C"
