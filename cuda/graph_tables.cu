// Decode-graph bookkeeping entry points (cuda_abi/graph_tables.h; plan in docs/decode_graphs.md):
// the MLA layer's positions and plane tables, and the decode step's commit, computed on the
// device from device slots, ping-pong flags and lengths, so a captured CUDA graph replays for any
// batch composition and position (a KDA layer's pointer tables: cuda/kda_tables.cu). One thread
// per batch row; launch shapes depend on B only; no allocation, no host synchronisation.
#include "common.cuh"
#include "slot_tables.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::SlotTables;

namespace {

constexpr int kRowThreads = 128;

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
