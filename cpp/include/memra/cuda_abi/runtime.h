// CUDA ABI, runtime area (cuda/context.cu): context (device, stream, cuBLAS/cuBLASLt handles,
// stream-ordered memory pool), memory, copies, dtype conversion.
#pragma once

// Pinned slots of the readbacks that do not wait (read_start / read_wait), and their size.
#define MEMRA_CUDA_READ_SLOTS 32
#define MEMRA_CUDA_READ_SLOT_BYTES ((size_t)64 << 10)

// The kernel options a context is made with: the C twin of memra::KernelOptions
// (memra/options.h, which documents each field and its domain). Switches are 0 / 1.
typedef struct MemraKernelOptions {
  int pdl;                 /* programmatic dependent launch */
  int gemv;                /* the decode GEMV for one-row GEMMs (0: cuBLAS) */
  int gemv_rows;           /* weight rows a GEMV block: 0 (from N), 1, 2, 4, 8 */
  int gemv_tall_rows;      /* the same for tall rows (K > 4096 bf16): 0, 1, 2, 4, 8 */
  int mhc_defer;           /* a one-row mHC site's Sinkhorn left to the next GEMV */
  int mla_decode_variant;  /* dense bf16 H 64 R 512 MLA decode: 0 mma.sync, 1 wgmma */
  int mla_tc_mt;           /* head tiles of 16 a block of the mma.sync MLA decode: 0, 2, 4 */
  int mla_split_tiles;     /* 64-row tiles a split of the MLA decode (0: cost model) */
  int moe_grouped_min_t;   /* tokens from which the routed experts run grouped, >= 1 */
  int attn_decode_unsplit; /* full-attention decode: one block per sequence and K/V head */
  int prefill_chunk;       /* prompt tokens a prefill runs at a time (0: all); read by no kernel */
  int moe_tensor_cores;    /* grouped routed experts over bf16 / f16 weights on tensor cores */
  int attn_prefill_tensor_cores; /* bf16-cache attention prefill on tensor cores (0: f32 kernel) */
  /* Appended (fields keep their offsets for a library built before it): */
  int mla_merge;           /* the wgmma MLA decode's split merge: 0 auto, 1 combine, 2 cluster,
                              3 grid barrier */
} MemraKernelOptions;

// What mem_stats reads: the device as a whole (cudaMemGetInfo: every process and context on it)
// and the device's default stream-ordered pool, from which memra takes all of its device memory
// (weights, caches, arrays, kernel scratch; engines on one device share it; torch's caching
// allocator does not use it). Peaks are since the context was made or the last reset.
typedef struct MemraMemStats {
  uint64_t device_free, device_total;
  uint64_t pool_used, pool_used_peak;          /* bytes of live allocations: now / at most (a
                                                  context's kept blocks, up to two released
                                                  blocks above 1 GiB held for reuse, count) */
  uint64_t pool_reserved, pool_reserved_peak;  /* bytes the pool holds from the driver */
} MemraMemStats;

#define MEMRA_CUDA_RUNTIME_OPS(X)                                                                 \
  /* A context on `device`: its own non-blocking stream, cuBLAS + cuBLASLt handles (TF32 off), \
     and the kernel options its ops run with (null: memra::KernelOptions' defaults; a field out \
     of its domain is 40025). */                                                                \
  X(ctx_create, (int device, const MemraKernelOptions* options, MemraCudaCtx** out))             \
  /* Synchronises the stream, then frees everything the context owns. */                          \
  X(ctx_destroy, (MemraCudaCtx * ctx))                                                            \
  /* delta +1 / -1: enter / leave a scope in which the weights handed to linear / linear_ex are \
     resident (uploaded before the scope; no queued kernel writes them), so the decode GEMV may \
     read them before the previous kernel on the stream has finished (cuda/gemv.cu). Scopes     \
     nest; -1 outside any scope, or another delta, is 40025. */                                 \
  X(resident_weights, (MemraCudaCtx * ctx, int delta))                                            \
  /* Stream-ordered allocation from the device pool (30001 when it cannot be had). */             \
  X(alloc, (MemraCudaCtx * ctx, size_t bytes, void** out))                                        \
  X(release, (MemraCudaCtx * ctx, void* ptr))                                                     \
  /* Async copy on the stream, any direction (cudaMemcpyDefault). A pageable host source may be  \
     reused once this returns. */                                                                 \
  X(copy, (MemraCudaCtx * ctx, void* dst, const void* src, size_t bytes))                         \
  /* Async strided copy on the stream, device -> device only (so it may be captured): `rows`      \
     rows of `width` bytes, dst_pitch / src_pitch bytes apart (cudaMemcpy2DAsync), e.g. a         \
     column block of row-major rows. 40025 for a pitch below width; 40024 for a null pointer      \
     (rows and width > 0). */                                                                     \
  X(copy_2d, (MemraCudaCtx * ctx, void* dst, size_t dst_pitch, const void* src,                   \
              size_t src_pitch, size_t width, size_t rows))                                       \
  /* Copy device -> host and wait for it (the stream's earlier work included). */                 \
  X(copy_to_host, (MemraCudaCtx * ctx, void* host_dst, const void* src, size_t bytes))            \
  /* Device -> host readback that does not wait: read_start copies `bytes` (<= 64 KiB) of src  \
     into one of the context's MEMRA_CUDA_READ_SLOTS pinned slots behind the stream's earlier   \
     work and records an event; *ticket names the read. read_wait waits for that copy only (not \
     for work enqueued after it) and copies its first `bytes` into host_dst. A slot is reused   \
     by the READ_SLOTS-th later read: waiting on a reused (or unknown) ticket, or for more bytes \
     than were read, is 40025; bytes over 64 KiB 40000; read_start while capturing 50003. */    \
  X(read_start, (MemraCudaCtx * ctx, const void* src, size_t bytes, uint64_t* ticket))            \
  X(read_wait, (MemraCudaCtx * ctx, uint64_t ticket, void* host_dst, size_t bytes))               \
  X(zero, (MemraCudaCtx * ctx, void* ptr, size_t bytes))                                          \
  X(synchronize, (MemraCudaCtx * ctx))                                                            \
  /* n elements src (dtype src_dtype) -> dst (dst_dtype); f32/bf16/f16 -> f32/bf16, RNE. */       \
  X(convert, (MemraCudaCtx * ctx, const void* src, int src_dtype, void* dst, int dst_dtype,       \
              int64_t n))                                                                         \
  /* The context's cudaStream_t (for DLPack consumers and graph capture). */                      \
  X(stream, (MemraCudaCtx * ctx, void** out))                                                     \
  X(mem_info, (MemraCudaCtx * ctx, size_t * free_bytes, size_t * total_bytes))                  \
  /* *out = the memory figures above (a peak is never reported below its current value);      \
     reset_peak 1 then restarts both peaks (0 leaves them). Enqueues nothing, waits for nothing. */ \
  X(mem_stats, (MemraCudaCtx * ctx, MemraMemStats * out, int reset_peak))                        \
  /* CUDA graphs of the context's stream (docs/decode_graphs.md). graph_begin starts capturing   \
     the stream (thread-local mode): until graph_end / graph_abort every op enqueues into the     \
     graph instead of running. While capturing, host <-> device copies and synchronisation are   \
     refused with 50003 (a captured host copy would replay stale bytes); stream-ordered scratch   \
     allocated and released inside becomes graph memory; memory allocated before the capture and \
     released during it is released after graph_end. graph_end instantiates the capture into     \
     *exec (an opaque cudaGraphExec_t); graph_abort discards it (the stream is usable again).    \
     graph_launch replays exec on the stream; graph_destroy frees it. 40025 for graph_begin while \
     capturing or graph_end / graph_abort when not. */                                             \
  X(graph_begin, (MemraCudaCtx * ctx))                                                            \
  X(graph_end, (MemraCudaCtx * ctx, void** exec))                                                 \
  X(graph_abort, (MemraCudaCtx * ctx))                                                            \
  X(graph_launch, (MemraCudaCtx * ctx, void* exec))                                               \
  X(graph_destroy, (MemraCudaCtx * ctx, void* exec))                                              \
  /* *out = 1 while the context's stream is being captured, else 0. */                            \
  X(capturing, (MemraCudaCtx * ctx, int* out))

#ifdef __cplusplus
extern "C" {
#endif
// Not context-bound (the probe): device count / error names / device names.
int memra_cuda_device_count(int* count);
const char* memra_cuda_error_string(int cuda_error);
int memra_cuda_device_name(int index, char* buf, int len);
#ifdef __cplusplus
}
#endif
