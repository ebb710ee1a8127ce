// Runtime entry points of the CUDA library (cpp/include/memra/cuda_abi/runtime.h): the context
// (device, stream, cuBLAS/cuBLASLt), stream-ordered memory, copies and dtype conversion.
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <new>
#include <type_traits>

#include "common.cuh"
#include "memra/options.h"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::enter_keep;
using memra::cuda::launch_status;
using memra::cuda::status_of;

namespace {

constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's recommended size on Hopper
constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;  // fixed cuBLAS workspace (graph capture)
constexpr size_t kStagingBytes = size_t(4) << 20;       // pinned ring for small uploads
constexpr size_t kStagedMax = size_t(64) << 10;         // copies up to this size are staged
// Released blocks above kKeepMinBytes (at most kKeepBlocks) stay on the context for the next
// allocation of their exact size. H200, kda_scan at B = 256, H = 64: its 2 GiB state output
// cost 1058 us a call against a 621 us kernel, where the 1 GiB output of H = 32 cost its
// kernel's time: the pool did not hand the released 2 GiB back (outputs of 1 GiB and below it
// does). Reuse on the context's one stream is what the pool's own stream-ordered reuse would do.
constexpr size_t kKeepMinBytes = size_t(1) << 30;
constexpr size_t kKeepBlocks = 2;

template <typename S, typename D>
__global__ void convert_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = memra::cuda::to_f32(src[i]);
    if constexpr (std::is_same_v<D, float>) {
      dst[i] = v;
    } else {
      dst[i] = __float2bfloat16_rn(v);
    }
  }
}

template <typename S>
int launch_convert(MemraCudaCtx* ctx, const void* src, void* dst, int dst_dtype, int64_t n) {
  const unsigned blocks = std::min<unsigned>(ceil_div(n, 256), 65535u * 8);
  if (dst_dtype == 0) {
    memra::cuda::launch(ctx, true, convert_kernel<S, float>, dim3(blocks), dim3(256), 0,
        static_cast<const S*>(src), static_cast<float*>(dst), n);
  } else {
    memra::cuda::launch(ctx, true, convert_kernel<S, __nv_bfloat16>, dim3(blocks), dim3(256), 0,
        static_cast<const S*>(src), static_cast<__nv_bfloat16*>(dst), n);
  }
  return launch_status();
}

// A release outside a capture: a large block is kept (up to kKeepBlocks), anything else goes
// back to the pool on the stream.
int release_now(MemraCudaCtx* ctx, void* ptr) {
  auto& live = ctx->large_live;
  for (auto it = live.begin(); it != live.end(); ++it) {
    if (it->first != ptr) continue;
    const auto block = *it;
    live.erase(it);
    if (ctx->kept.size() < kKeepBlocks) {
      ctx->kept.push_back(block);
      return memra::kOk;
    }
    break;
  }
  return status_of(cudaFreeAsync(ptr, ctx->stream));
}

// The kept blocks back to the pool (before a retry of a failed allocation, at destroy).
void release_kept(MemraCudaCtx* ctx) {
  for (const auto& k : ctx->kept) cudaFreeAsync(k.first, ctx->stream);
  ctx->kept.clear();
}

}  // namespace

extern "C" {

int memra_cuda_ctx_create(int device, const MemraKernelOptions* options, MemraCudaCtx** out) {
  *out = nullptr;
  const memra::KernelOptions opts =
      options ? memra::KernelOptions::from_abi(*options) : memra::KernelOptions{};
  if (!opts.validate().ok()) return memra::kContractValue;
  MEMRA_CUDA_RETURN_IF(status_of(cudaSetDevice(device)));
  MemraCudaCtx* c = new (std::nothrow) MemraCudaCtx();
  if (!c) return memra::kOutOfMemory;
  c->device = device;
  c->options = opts.to_abi();
  int rc = status_of(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  if (rc == 0) rc = status_of(cublasCreate(&c->blas));
  if (rc == 0) rc = status_of(cublasSetStream(c->blas, c->stream));
  // TF32 off: f32 GEMMs are requested with CUBLAS_COMPUTE_32F and the default math mode.
  if (rc == 0) rc = status_of(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
  // A fixed cuBLAS workspace (after cublasSetStream, which resets it): cuBLAS then never
  // allocates on its own, which a graph capture would refuse.
  if (rc == 0) rc = status_of(cudaMalloc(&c->blas_workspace, kBlasWorkspaceBytes));
  if (rc == 0) rc = status_of(cublasSetWorkspace(c->blas, c->blas_workspace, kBlasWorkspaceBytes));
  if (rc == 0) rc = status_of(cublasLtCreate(&c->lt));
  if (rc == 0) rc = status_of(cudaMalloc(&c->lt_workspace, kLtWorkspaceBytes));
  if (rc == 0) c->lt_workspace_bytes = kLtWorkspaceBytes;
  if (rc == 0) rc = status_of(cudaMallocHost(reinterpret_cast<void**>(&c->staging), kStagingBytes));
  if (rc == 0) c->staging_bytes = kStagingBytes;
  if (rc == 0) rc = status_of(cudaEventCreateWithFlags(&c->staging_done, cudaEventDisableTiming));
  if (rc == 0) {
    rc = status_of(cudaMallocHost(reinterpret_cast<void**>(&c->readback),
                                  MemraCudaCtx::kReadSlots * MemraCudaCtx::kReadSlotBytes));
  }
  for (int i = 0; rc == 0 && i < MemraCudaCtx::kReadSlots; ++i) {
    rc = status_of(cudaEventCreateWithFlags(&c->read_done[i], cudaEventDisableTiming));
  }
  if (rc == 0) rc = status_of(cudaMalloc(&c->tickets, sizeof(unsigned) * memra::cuda::kTicketCount));
  if (rc == 0) rc = status_of(cudaMemset(c->tickets, 0, sizeof(unsigned) * memra::cuda::kTicketCount));
  if (rc == 0) rc = status_of(cudaDeviceGetDefaultMemPool(&c->pool, device));
  if (rc == 0) {
    // Keep freed blocks in the pool (no return to the driver at every sync): stream-ordered
    // allocations on the hot path then cost no cudaMalloc after warm-up.
    uint64_t threshold = UINT64_MAX;
    rc = status_of(cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  if (rc != 0) {
    memra_cuda_ctx_destroy(c);
    return rc;
  }
  *out = c;
  return memra::kOk;
}

int memra_cuda_ctx_destroy(MemraCudaCtx* ctx) {
  if (!ctx) return memra::kOk;
  cudaSetDevice(ctx->device);
  int rc = memra::kOk;
  if (ctx->stream) release_kept(ctx);
  if (ctx->stream) rc = status_of(cudaStreamSynchronize(ctx->stream));
  if (ctx->capturing) memra_cuda_graph_abort(ctx);
  if (ctx->lt_workspace) cudaFree(ctx->lt_workspace);
  if (ctx->tickets) cudaFree(ctx->tickets);
  if (ctx->blas_workspace) cudaFree(ctx->blas_workspace);
  if (ctx->staging) cudaFreeHost(ctx->staging);
  if (ctx->staging_done) cudaEventDestroy(ctx->staging_done);
  if (ctx->readback) cudaFreeHost(ctx->readback);
  for (cudaEvent_t e : ctx->read_done) {
    if (e) cudaEventDestroy(e);
  }
  if (ctx->lt) cublasLtDestroy(ctx->lt);
  if (ctx->blas) cublasDestroy(ctx->blas);
  if (ctx->stream) cudaStreamDestroy(ctx->stream);
  delete ctx;
  return rc;
}

int memra_cuda_resident_weights(MemraCudaCtx* ctx, int delta) {
  if (!ctx || (delta != 1 && delta != -1)) return memra::kContractValue;
  if (delta < 0 && ctx->resident_weights == 0) return memra::kContractValue;
  ctx->resident_weights += delta;
  return memra::kOk;
}

int memra_cuda_alloc(MemraCudaCtx* ctx, size_t bytes, void** out) {
  *out = nullptr;
  MEMRA_CUDA_RETURN_IF(enter_keep(ctx));
  if (bytes == 0) bytes = 1;  // a valid, distinct pointer for empty tensors
  const bool large = !ctx->capturing && bytes > kKeepMinBytes;
  if (large) {
    for (auto it = ctx->kept.begin(); it != ctx->kept.end(); ++it) {
      if (it->second != bytes) continue;
      *out = it->first;
      ctx->large_live.push_back(*it);
      ctx->kept.erase(it);
      return memra::kOk;
    }
  }
  int rc = status_of(cudaMallocAsync(out, bytes, ctx->stream));
  if (rc == memra::kOutOfMemory && !ctx->capturing && !ctx->kept.empty()) {
    release_kept(ctx);  // the kept blocks may be what is missing
    rc = status_of(cudaMallocAsync(out, bytes, ctx->stream));
  }
  if (rc != memra::kOk) *out = nullptr;
  if (rc == memra::kOk && ctx->capturing) {
    ctx->capture_allocs.emplace_back(reinterpret_cast<uintptr_t>(*out), bytes);
  }
  if (rc == memra::kOk && large) ctx->large_live.emplace_back(*out, bytes);
  return rc;
}

int memra_cuda_release(MemraCudaCtx* ctx, void* ptr) {
  if (!ptr) return memra::kOk;
  MEMRA_CUDA_RETURN_IF(enter_keep(ctx));
  // A deferred Sinkhorn still to run over this buffer runs first.
  if (ptr == ctx->pending.comb) MEMRA_CUDA_RETURN_IF(memra::cuda::flush_pending(ctx));
  if (ctx->capturing) {
    // Memory from before the capture (an array Python let go of meanwhile) is not the graph's:
    // release it once the capture ends, outside the graph.
    const auto& mine = ctx->capture_allocs;
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    if (std::none_of(mine.begin(), mine.end(), [p](const auto& a) { return a.first == p; })) {
      ctx->deferred_releases.push_back(ptr);
      return memra::kOk;
    }
    return status_of(cudaFreeAsync(ptr, ctx->stream));
  }
  return release_now(ctx, ptr);
}

int memra_cuda_copy_2d(MemraCudaCtx* ctx, void* dst, size_t dst_pitch, const void* src,
                       size_t src_pitch, size_t width, size_t rows) {
  if (width == 0 || rows == 0) return memra::kOk;
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!dst || !src) return memra::kContractMissing;
  if (dst_pitch < width || src_pitch < width) return memra::kContractValue;
  return status_of(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                     cudaMemcpyDeviceToDevice, ctx->stream));
}

int memra_cuda_copy(MemraCudaCtx* ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return memra::kOk;
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  cudaPointerAttributes attr;
  if (ctx->capturing) {
    // Device -> device only: a captured host copy would replay whatever the host buffer holds
    // at replay time. Memory allocated during the capture is not mapped yet (the pointer
    // attributes do not know it): it counts as device memory by its recorded range.
    auto on_device = [&](const void* q) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(q);
      for (const auto& r : ctx->capture_allocs) {
        if (a >= r.first && a < r.first + r.second) return true;
      }
      const bool dev = cudaPointerGetAttributes(&attr, q) == cudaSuccess &&
                       (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged);
      cudaGetLastError();
      return dev;
    };
    if (!on_device(dst) || !on_device(src)) return memra::kUnsupportedInCapture;
    return status_of(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
  }
  const bool pageable = cudaPointerGetAttributes(&attr, src) == cudaSuccess &&
                        attr.type == cudaMemoryTypeUnregistered;
  cudaGetLastError();
  if (!pageable || bytes > kStagedMax || !ctx->staging) {
    return status_of(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx->stream));
  }
  // Stage through the pinned ring; before the ring wraps, wait for every earlier staged copy
  // (one host wait per kStagingBytes of small uploads, instead of one per upload).
  const size_t need = (bytes + 255) / 256 * 256;
  if (ctx->staging_off + need > ctx->staging_bytes) {
    MEMRA_CUDA_RETURN_IF(status_of(cudaEventSynchronize(ctx->staging_done)));
    ctx->staging_off = 0;
  }
  uint8_t* slot = ctx->staging + ctx->staging_off;
  ctx->staging_off += need;
  std::memcpy(slot, src, bytes);
  MEMRA_CUDA_RETURN_IF(status_of(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, ctx->stream)));
  return status_of(cudaEventRecord(ctx->staging_done, ctx->stream));
}

int memra_cuda_copy_to_host(MemraCudaCtx* ctx, void* host_dst, const void* src, size_t bytes) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (ctx->capturing) return memra::kUnsupportedInCapture;
  if (bytes > 0) {
    MEMRA_CUDA_RETURN_IF(
        status_of(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, ctx->stream)));
  }
  return status_of(cudaStreamSynchronize(ctx->stream));
}

int memra_cuda_read_start(MemraCudaCtx* ctx, const void* src, size_t bytes, uint64_t* ticket) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!ticket) return memra::kContractMissing;
  *ticket = 0;
  if (ctx->capturing) return memra::kUnsupportedInCapture;
  if (bytes > MemraCudaCtx::kReadSlotBytes) return memra::kContractShape;
  if (bytes > 0 && !src) return memra::kContractMissing;
  const uint64_t t = ctx->read_next;
  const int slot = static_cast<int>(t % MemraCudaCtx::kReadSlots);
  uint8_t* dst = ctx->readback + slot * MemraCudaCtx::kReadSlotBytes;
  // The slot's older read is gone from here on, whatever happens below (a failed record must not
  // leave it readable over the bytes being copied in). Its copy is ordered before this one on
  // the stream, so reusing the slot needs no wait.
  ctx->read_ticket[slot] = 0;
  if (bytes > 0) {
    MEMRA_CUDA_RETURN_IF(
        status_of(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream)));
  }
  MEMRA_CUDA_RETURN_IF(status_of(cudaEventRecord(ctx->read_done[slot], ctx->stream)));
  ctx->read_ticket[slot] = t;
  ctx->read_bytes[slot] = bytes;
  ctx->read_next = t + 1;
  *ticket = t;
  return memra::kOk;
}

int memra_cuda_read_wait(MemraCudaCtx* ctx, uint64_t ticket, void* host_dst, size_t bytes) {
  MEMRA_CUDA_RETURN_IF(enter_keep(ctx));  // a wait launches nothing
  const int slot = static_cast<int>(ticket % MemraCudaCtx::kReadSlots);
  if (ticket == 0 || ctx->read_ticket[slot] != ticket || bytes > ctx->read_bytes[slot]) {
    return memra::kContractValue;
  }
  if (bytes > 0 && !host_dst) return memra::kContractMissing;
  MEMRA_CUDA_RETURN_IF(status_of(cudaEventSynchronize(ctx->read_done[slot])));
  if (bytes > 0) std::memcpy(host_dst, ctx->readback + slot * MemraCudaCtx::kReadSlotBytes, bytes);
  return memra::kOk;
}

int memra_cuda_zero(MemraCudaCtx* ctx, void* ptr, size_t bytes) {
  if (bytes == 0) return memra::kOk;
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  return status_of(cudaMemsetAsync(ptr, 0, bytes, ctx->stream));
}

int memra_cuda_synchronize(MemraCudaCtx* ctx) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (ctx->capturing) return memra::kUnsupportedInCapture;
  return status_of(cudaStreamSynchronize(ctx->stream));
}

int memra_cuda_convert(MemraCudaCtx* ctx, const void* src, int src_dtype, void* dst,
                       int dst_dtype, int64_t n) {
  if (n == 0) return memra::kOk;
  if (dst_dtype != 0 && dst_dtype != 1) return memra::kContractDType;
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  switch (src_dtype) {
    case 0: return launch_convert<float>(ctx, src, dst, dst_dtype, n);
    case 1: return launch_convert<__nv_bfloat16>(ctx, src, dst, dst_dtype, n);
    case 2: return launch_convert<__half>(ctx, src, dst, dst_dtype, n);
    default: return memra::kContractDType;
  }
}

int memra_cuda_stream(MemraCudaCtx* ctx, void** out) {
  *out = ctx ? static_cast<void*>(ctx->stream) : nullptr;
  // A consumer about to use the stream sees a deferred Sinkhorn finished.
  return enter(ctx);
}

int memra_cuda_mem_info(MemraCudaCtx* ctx, size_t* free_bytes, size_t* total_bytes) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  return status_of(cudaMemGetInfo(free_bytes, total_bytes));
}

int memra_cuda_mem_stats(MemraCudaCtx* ctx, MemraMemStats* out, int reset_peak) {
  if (!out) return memra::kContractMissing;
  if (reset_peak != 0 && reset_peak != 1) return memra::kContractValue;
  MEMRA_CUDA_RETURN_IF(enter_keep(ctx));  // reads figures only: a pending Sinkhorn may stay
  *out = MemraMemStats{};
  size_t free_bytes = 0, total_bytes = 0;
  MEMRA_CUDA_RETURN_IF(status_of(cudaMemGetInfo(&free_bytes, &total_bytes)));
  out->device_free = free_bytes;
  out->device_total = total_bytes;
  const struct {
    cudaMemPoolAttr attr;
    uint64_t* dst;
  } reads[] = {{cudaMemPoolAttrUsedMemCurrent, &out->pool_used},
               {cudaMemPoolAttrUsedMemHigh, &out->pool_used_peak},
               {cudaMemPoolAttrReservedMemCurrent, &out->pool_reserved},
               {cudaMemPoolAttrReservedMemHigh, &out->pool_reserved_peak}};
  for (const auto& r : reads) {
    MEMRA_CUDA_RETURN_IF(status_of(cudaMemPoolGetAttribute(ctx->pool, r.attr, r.dst)));
  }
  // Whether a reset mark reads 0 or the value at the reset until the next allocation, the peak
  // reported is never below the current value.
  out->pool_used_peak = std::max(out->pool_used_peak, out->pool_used);
  out->pool_reserved_peak = std::max(out->pool_reserved_peak, out->pool_reserved);
  if (reset_peak) {
    // The high-water marks accept only 0, which restarts them from the current values.
    uint64_t zero = 0;
    MEMRA_CUDA_RETURN_IF(status_of(cudaMemPoolSetAttribute(ctx->pool, cudaMemPoolAttrUsedMemHigh, &zero)));
    zero = 0;
    MEMRA_CUDA_RETURN_IF(
        status_of(cudaMemPoolSetAttribute(ctx->pool, cudaMemPoolAttrReservedMemHigh, &zero)));
  }
  return memra::kOk;
}

// ---------------------------------------------------------------------------------- graphs

int memra_cuda_graph_begin(MemraCudaCtx* ctx) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (ctx->capturing) return memra::kContractValue;
  // Thread-local mode: only this thread's unsafe calls (a cudaMalloc, a synchronisation) break
  // the capture; other threads' CUDA work goes on.
  MEMRA_CUDA_RETURN_IF(status_of(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal)));
  ctx->capturing = true;
  ctx->capture_allocs.clear();
  ctx->deferred_releases.clear();
  return memra::kOk;
}

namespace {
// Leave capture mode: the releases deferred during it run now, outside the graph.
int finish_capture(MemraCudaCtx* ctx, cudaGraph_t* graph) {
  const cudaError_t e = cudaStreamEndCapture(ctx->stream, graph);
  ctx->capturing = false;
  ctx->capture_allocs.clear();
  for (void* p : ctx->deferred_releases) release_now(ctx, p);
  ctx->deferred_releases.clear();
  return status_of(e);
}
}  // namespace

int memra_cuda_graph_end(MemraCudaCtx* ctx, void** exec) {
  *exec = nullptr;
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!ctx->capturing) return memra::kContractValue;
  cudaGraph_t graph = nullptr;
  int rc = finish_capture(ctx, &graph);
  if (rc == memra::kOk) {
    cudaGraphExec_t ge = nullptr;
    rc = status_of(cudaGraphInstantiate(&ge, graph, 0));
    if (rc == memra::kOk) *exec = ge;
  }
  if (graph) cudaGraphDestroy(graph);
  return rc;
}

int memra_cuda_graph_abort(MemraCudaCtx* ctx) {
  MEMRA_CUDA_RETURN_IF(enter_keep(ctx));
  // A task pending in a capture was the capture's own (an eager one was run at graph_begin).
  if (ctx->capturing) ctx->pending = memra::cuda::SinkTask{};
  if (!ctx->capturing) return memra::kContractValue;
  cudaGraph_t graph = nullptr;
  finish_capture(ctx, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // an invalidated capture leaves a sticky-free error behind
  return memra::kOk;
}

int memra_cuda_graph_launch(MemraCudaCtx* ctx, void* exec) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!exec) return memra::kContractMissing;
  if (ctx->capturing) return memra::kUnsupportedInCapture;
  return status_of(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), ctx->stream));
}

int memra_cuda_graph_destroy(MemraCudaCtx* ctx, void* exec) {
  if (!exec) return memra::kOk;
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  return status_of(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)));
}

int memra_cuda_capturing(MemraCudaCtx* ctx, int* out) {
  *out = ctx && ctx->capturing ? 1 : 0;
  return ctx ? memra::kOk : memra::kContractValue;
}

}  // extern "C"
