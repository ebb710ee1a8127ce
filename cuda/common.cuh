// Shared by the CUDA library's sources: the context, status bands for CUDA / cuBLAS errors,
// stream-ordered scratch, bf16 helpers, and the prototypes of every C-ABI entry point
// (cpp/include/memra/cuda_api.h), so a definition that drifts from its declaration fails to
// compile. Nothing here throws.
#pragma once

#ifndef MEMRA_TRACE
#define MEMRA_TRACE 0
#endif

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "memra/cuda_api.h"
#include "memra/status.h"

namespace memra::cuda {
// A deferred mHC Sinkhorn (cuda/mhc_site.cu; KernelOptions::mhc_defer = false turns deferral off):
// the one-row site kernel stores comb's softmaxed rows and leaves the Sinkhorn (20 dependent
// iterations of one warp, the tail of the site's critical path) to a later launch on the stream:
// the next decode GEMV runs it in one extra block (cuda/gemv.cu), which overlaps the GEMV's
// weight stream; any other
// entry point runs it first in a one-warp launch of its own (enter() below), so whatever reads
// comb later on the stream, or on the host, sees the finished matrix.
constexpr int kSinkHc = 4;  // the site kernel's hc
struct SinkTask {
  float* comb = nullptr;  // [kSinkHc, kSinkHc]: softmaxed rows in, Sinkhorn out (in place)
  int iters = 0;
  float eps = 0.0f;
};
}  // namespace memra::cuda

struct MemraCudaCtx {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;  // cuBLASLt workspace (fixed, allocated at create)
  size_t lt_workspace_bytes = 0;
  cudaMemPool_t pool = nullptr;  // the device's default pool, release threshold raised
  // Pinned staging ring for small host -> device copies (pointer tables, ids): a pageable
  // source would make cudaMemcpyAsync wait for the stream; a pinned one keeps it asynchronous.
  uint8_t* staging = nullptr;
  size_t staging_bytes = 0, staging_off = 0;
  cudaEvent_t staging_done = nullptr;  // recorded after every staged copy
  // Readbacks that do not wait (read_start / read_wait): kReadSlots pinned slots used round
  // robin, each with the event recorded after its copy, the ticket it holds and its size.
  static constexpr int kReadSlots = MEMRA_CUDA_READ_SLOTS;
  static constexpr size_t kReadSlotBytes = MEMRA_CUDA_READ_SLOT_BYTES;
  uint8_t* readback = nullptr;  // [kReadSlots][kReadSlotBytes] pinned
  cudaEvent_t read_done[kReadSlots] = {};
  uint64_t read_ticket[kReadSlots] = {};  // 0: never used
  size_t read_bytes[kReadSlots] = {};
  uint64_t read_next = 1;
  void* blas_workspace = nullptr;  // cuBLAS workspace (fixed: no allocation inside a capture)
  // Arrival counters of the "last block finishes" kernels (memra::cuda::last_block below), one
  // per kernel family (Ticket), zero between launches: the last block's atomicInc wraps its
  // counter back to 0. One stream per context, and every kernel on it waits (pdl_wait, as its
  // first dependent step) for the whole launch in front to complete, so a launch's counters are
  // back at 0 before the next launch of any kernel touches them.
  unsigned* tickets = nullptr;
  // The kernel options the context was made with (memra/options.h documents each field);
  // validated by ctx_create, read by the kernels' host code.
  MemraKernelOptions options = {};
  // A one-row mHC site's Sinkhorn left pending (options.mhc_defer), for a later launch to run.
  memra::cuda::SinkTask pending;
  // Graph capture (graph_begin .. graph_end): the allocations made during the capture (their
  // releases become graph nodes) and the releases of older memory, deferred to graph_end.
  bool capturing = false;
  std::vector<std::pair<uintptr_t, size_t>> capture_allocs;  // (address, bytes)
  std::vector<void*> deferred_releases;
  // Allocations above kKeepMinBytes made outside a capture (large_live) and, once released, up
  // to kKeepBlocks of them kept (kept) for the next allocation of exactly their size on this
  // stream instead of going back to the pool (cuda/context.cu says why). Both (address, bytes).
  std::vector<std::pair<void*, size_t>> large_live, kept;
  // > 0 while a layer runs GEMMs over its own uploaded weights (resident_weights): no queued
  // kernel writes them, so a GEMV may start reading them before its predecessor finishes.
  int resident_weights = 0;
};

#define MEMRA_CUDA_DECLARE(name, args) extern "C" int memra_cuda_##name args;
MEMRA_CUDA_ALL_OPS(MEMRA_CUDA_DECLARE)
#undef MEMRA_CUDA_DECLARE

namespace memra::cuda {

inline int status_of(cudaError_t e) {
  if (e == cudaSuccess) return kOk;
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return kOutOfMemory;
  }
  return kCudaBase + static_cast<int>(e);
}
inline int status_of(cublasStatus_t s) {
  if (s == CUBLAS_STATUS_SUCCESS) return kOk;
  if (s == CUBLAS_STATUS_ALLOC_FAILED) return kOutOfMemory;
  return kLibraryBase + static_cast<int>(s);
}
// The status of the last launch (configuration errors surface here; async faults later).
inline int launch_status() { return status_of(cudaGetLastError()); }

// Stream-ordered scratch: allocated on the context's stream, released on it when the object
// dies, so the memory is reused only by work enqueued after this op. Check ok() / status().
class Scratch {
 public:
  Scratch(MemraCudaCtx* ctx, size_t bytes) : ctx_(ctx) {
    if (bytes == 0) return;
    status_ = status_of(cudaMallocAsync(&ptr_, bytes, ctx->stream));
    if (status_ != kOk) ptr_ = nullptr;
  }
  ~Scratch() {
    if (ptr_) cudaFreeAsync(ptr_, ctx_->stream);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  int status() const { return status_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  MemraCudaCtx* ctx_;
  void* ptr_ = nullptr;
  int status_ = kOk;
};

// Make the context's device current for this thread (engines on several devices coexist).
// Runs a pending deferred Sinkhorn in a launch of its own (cuda/mhc_site.cu); kOk when none is.
int flush_pending(MemraCudaCtx* ctx);

// The pending deferred Sinkhorn, handed to a kernel that runs it (and no longer pending).
inline SinkTask take_pending(MemraCudaCtx* ctx) {
  const SinkTask t = ctx->pending;
  ctx->pending = SinkTask{};
  return t;
}
// After the launch that took `t` (status rc): a failed launch hands the task back, pending.
inline int settle_pending(MemraCudaCtx* ctx, const SinkTask& t, int rc) {
  if (rc != kOk && t.comb) ctx->pending = t;
  return rc;
}

// Every entry point starts here: the context's device, and any deferred Sinkhorn run first (the
// entry may read its comb). enter_keep: for the entries that cannot read a comb before their
// decode GEMV takes the task (linear*, alloc, the KDA tables, the router, the MLP).
inline int enter_keep(MemraCudaCtx* ctx) {
  if (!ctx) return kContractValue;
  return status_of(cudaSetDevice(ctx->device));
}
inline int enter(MemraCudaCtx* ctx) {
  const int rc = enter_keep(ctx);
  if (rc != kOk || !ctx->pending.comb) return rc;
  return flush_pending(ctx);
}
// After enter_keep: runs the pending Sinkhorn now when [p, p + bytes) overlaps its comb (an
// argument of the entry that a kernel reads).
inline int flush_if_reads(MemraCudaCtx* ctx, const void* p, size_t bytes) {
  if (!ctx->pending.comb || !p) return kOk;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t c = reinterpret_cast<uintptr_t>(ctx->pending.comb);
  if (a < c + sizeof(float) * kSinkHc * kSinkHc && c < a + bytes) return flush_pending(ctx);
  return kOk;
}

// Element loads for templated kernels (weights in f32 / bf16 / f16, converted to f32).
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

// f32 -> the storage type (bf16 / f16 with round-to-nearest-even).
template <typename D>
__device__ __forceinline__ D from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
// v rounded to D and widened back to f32 (identity for f32): what a GEMM over D operands
// multiplies an f32 input as.
template <typename D>
__device__ __forceinline__ float rounded(float v) {
  return to_f32(from_f32<D>(v));
}

// Butterfly reductions over a full warp (every lane gets the result; the xor order fixes the
// bits, the same in every kernel that uses them).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// 32 warp sums at once: lane l holds its terms p[0..31] of 32 sums and gets back sum l. Each
// level o = 16, 8, .., 1 adds a lane's value to its xor-o partner's, as warp_sum does, but a lane
// keeps only the half of the sums whose index has its own bit o and sends the other half: the
// same pairs in the same order (own + partner), so sum l equals warp_sum of its terms bit for
// bit, in 31 shuffles instead of 32 x 5.
template <int O>
__device__ __forceinline__ void transposed_level(float (&p)[32], int lane) {
  const bool upper = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float keep = upper ? p[O + i] : p[i];
    const float send = upper ? p[i] : p[O + i];
    p[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}
__device__ __forceinline__ float warp_sum32_transposed(float (&p)[32], int lane) {
  transposed_level<16>(p, lane);
  transposed_level<8>(p, lane);
  transposed_level<4>(p, lane);
  transposed_level<2>(p, lane);
  transposed_level<1>(p, lane);
  return p[0];
}

// Programmatic dependent launch (sm_90, docs/decode_graphs.md). A kernel launched with
// launch(..., pdl = true, ...) may start while the kernel before it on the stream is still
// running: it must call pdl_wait() before it reads anything that kernel (or any earlier work)
// writes, and before it writes anything at all; pdl_wait() returns once the predecessor has
// completed and its memory is visible. pdl_trigger() lets the *next* kernel launch early (it has
// no effect on memory ordering). Both are no-ops in a kernel launched without the attribute.
#if MEMRA_TRACE
// The trace build (CMake MEMRA_TRACE=ON, cuda/trace.cu, benchmarks/trace_model_step.py): thread 0
// of block (0, 0, 0) of every kernel records when its pdl_wait returned, i.e. when the kernel in
// front of it completed, with its grid and block sizes. Consecutive records of a chain give each
// kernel's cost on the critical path inside a programmatic chain (ncu times kernels alone).
struct TraceRec {
  unsigned long long t_ns;
  unsigned blocks, threads;
};
extern __device__ TraceRec* g_trace;
extern __device__ unsigned g_trace_cap;
extern __device__ unsigned g_trace_n;
__device__ __forceinline__ void trace_wait_return() {
  if (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) return;
  TraceRec* t = g_trace;
  if (!t) return;
  const unsigned i = atomicAdd(&g_trace_n, 1u);
  if (i >= g_trace_cap) return;
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  t[i] = TraceRec{now, gridDim.x * gridDim.y * gridDim.z, blockDim.x * blockDim.y * blockDim.z};
}
#endif
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
#if MEMRA_TRACE
  trace_wait_return();
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// "The last block finishes": a grid whose blocks each write partial results, and whose final
// step (a fixed-order reduction of those partials) runs in the block that arrives last, in the
// same launch, instead of in a second kernel. Each kernel family owns one counter of
// MemraCudaCtx::tickets (zero between launches). The batched MLA decode's grid merge
// (cuda/mla_decode_sm90.cuh, kMergeGrid) owns a pair of counters for each of up to
// kMlaDecodeSeqs sequences; the MoE router at 2..64 tokens (cuda/moe_route.cu, route_rows_kernel)
// one for each of up to kRouteRowsTiles tiles of tokens.
constexpr int kMlaDecodeSeqs = 256;
constexpr int kRouteRowsTiles = 16;
enum Ticket : int {
  kTicketMhcSite = 0,
  kTicketMoeRoute,
  kTicketMoeRouteRows,
  kTicketMlaDecode = kTicketMoeRouteRows + kRouteRowsTiles,
  kTicketCount = kTicketMlaDecode + 2 * kMlaDecodeSeqs
};

// Every thread of every block calls it once, after the global stores the finishing block will
// read. Returns true in exactly one block: the last to arrive, which then sees every block's
// stores. CUTLASS's semaphore pattern: the block's barrier orders its threads' stores before
// thread 0's fence.acq_rel.gpu (cumulative) and the counter's atomic; the last block's thread 0
// fences again before the barrier that releases its threads, which must read those stores
// through L2 (ld.global.cg: an SM's L1 is not coherent with the others). atomicInc wraps the
// counter back to 0 in that block, so the next launch (or graph replay) starts from 0.
__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
}
// Drops the 128-byte line at p (128-byte aligned) from L2 without writing it back: for scratch
// (split partials) read for the last time. Left dirty, such lines are written back to DRAM
// while a later kernel streams its own bytes through L2 (docs/mla.md, session 41).
__device__ __forceinline__ void discard_l2_line(const void* p) {
  asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(p) : "memory");
}
// last_block(ticket, blocks): the same among `blocks` blocks that share the ticket (a subset of
// the grid, e.g. one column of it).
__device__ __forceinline__ bool last_block(unsigned* ticket, unsigned blocks) {
  __shared__ unsigned arrived_last;
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    fence_acq_rel_gpu();
    const bool last = atomicInc(ticket, blocks - 1) == blocks - 1;
    if (last) fence_acq_rel_gpu();
    arrived_last = last ? 1u : 0u;
  }
  __syncthreads();
  return arrived_last != 0;
}
__device__ __forceinline__ bool last_block(unsigned* ticket) {
  return last_block(ticket, gridDim.x * gridDim.y * gridDim.z);
}

// Launch `kernel` on the context's stream; with pdl (and the context's options.pdl) as a
// programmatic dependent of the stream's previous kernel (the kernel must pdl_wait(), above),
// falling back to an ordinary launch where that attribute is refused.
template <typename... P, typename... A>
inline int launch(MemraCudaCtx* ctx, bool pdl, void (*kernel)(P...), dim3 grid, dim3 block,
                  size_t smem, A... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = (pdl && ctx->options.pdl) ? 1 : 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ctx->stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
  if (e != cudaSuccess && attr[0].val.programmaticStreamSerializationAllowed) {
    cudaGetLastError();  // refused as a programmatic dependent: an ordinary launch instead
    cfg.numAttrs = 0;
    e = cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
  }
  return status_of(e);
}

// A pointer fit for 16-byte vector loads (host-side dispatch checks).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline unsigned ceil_div(long long a, long long b) { return static_cast<unsigned>((a + b - 1) / b); }

// Asynchronous global -> shared copies (sm_80+ cp.async). The forms with src_bytes zero-fill the
// bytes past src_bytes without reading them (src_bytes == 0: a zero-filled chunk, no global read).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  cp_async_16(smem_u32(dst), src, src_bytes);
}
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// This thread's commit groups except the newest N have landed.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

}  // namespace memra::cuda

#define MEMRA_CUDA_RETURN_IF(expr)   \
  do {                               \
    const int _rc = (expr);          \
    if (_rc != ::memra::kOk) return _rc; \
  } while (0)
