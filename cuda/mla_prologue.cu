// The MLA decode prologue of one row in one launch (memra_cuda_mla_norm_append_decode,
// cpp/include/memra/cuda_abi/mla.h): the projections' norms (norm_rows), the step's positions
// and plane tables (decode_tables), the latent append and the indexer's k-pool append.
//
// Why: at batch 1 those were four launches in a row on the step's critical path, each mostly a
// launch and a memory round trip (docs/mla.md). Here the latent and ring
// rows are stored from the registers that hold the normalised values, and the slot and length
// are read before the launch's wait, so the appends add stores, not round trips, to the norm
// launch.
//
// Grid: one block per norm row (2, or 3 with the indexer), as norm_rows_kernel (cuda/basic.cu).
//   block 0: row 0 (q's low-rank row), and thread 0 writes the tables (cuda/slot_tables.cuh);
//   block 1: row 1 (the latent row), its outputs mirrored into the latent cache at row pos;
//   block 2: row 2 (the indexer's k, a LayerNorm), mirrored into ring slot pos % tail_rows; then,
//     after a barrier (channel c's pool key reads row pos's k[c], which another thread stored),
//     dsa_common.cuh's append_decode_channel: the pool key when the token completes a pool, and
//     the gate's ring row.
// Bytes: each norm is rms_norm_row / layer_norm_row (cuda/row_group.cuh), the bodies of the
// standalone kernels; the cache rows get from_f32 of the same registers the outputs are stored
// from; the key is the same routine over the same rows. An idle row (slot < 0) gets the norms
// and the idle tables, and writes no cache row.
#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "dsa_common.cuh"
#include "row_group.cuh"
#include "slot_tables.cuh"

using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::SlotTables;
using memra::cuda::rowsum::Group;
using memra::cuda::rowsum::group_for;
using memra::cuda::rowsum::layer_norm_row;
using memra::cuda::rowsum::rms_norm_row;
using memra::cuda::rowsum::with_group;

namespace {

struct PrologueRow {
  const float* x;  // [D]
  const float* w;  // [D] or null
  const float* b;  // [D]: a LayerNorm (row 2); null: an RMSNorm
  float* y;        // [D] (may alias x)
  int D;
  int G;
  float eps;
};

// Block 2's rows held by one pass of its threads (a block is at least 256 threads): the indexer's
// k row (128 on GLM-5.3) at most this wide.
constexpr int kMaxStagedD = 256;
constexpr int kMaxStageBytes = 32 * 1024;  // the staged pool rows (dynamic shared memory)

struct PrologueArgs {
  PrologueRow row[3];
  const int32_t* slots;    // [1]
  const int32_t* lengths;  // [slots]
  int32_t* pos;            // [1]
  int32_t* t_kv;           // [1]
  SlotTables tables;       // 0 latent; with the indexer 1 tail_k, 2 tail_gate, 3 pool_keys
  int cache_dtype;         // 0 f32, 1 bf16
  const float* gate;       // [D2] the indexer's gate row
  const float* ape;        // [pool, D2]
  int pool, tail_rows;
  int staged;              // block 2 stages a completing pool's rows in shared memory
};

template <typename Tc>
__device__ __forceinline__ Tc* latent_row(const PrologueArgs& a, int s, int p) {
  return reinterpret_cast<Tc*>(a.tables.base[0] + static_cast<int64_t>(s) * a.tables.stride[0]) +
         static_cast<int64_t>(p) * a.row[1].D;
}

__device__ __forceinline__ float* plane_row(const PrologueArgs& a, int j, int s) {
  return reinterpret_cast<float*>(a.tables.base[j] + static_cast<int64_t>(s) * a.tables.stride[j]);
}

// Row pos's pool key inputs staged in shared memory (block 2, a step that completes a pool):
// the ring rows r0 .. pos - 1 of k and gate and the pool's ape rows, read before the wait (the
// ring was written by earlier steps, ape is a weight), then row pos (k from the norm's registers,
// gate after the wait) at index pool - 1. Read from global in the key's loops instead, each of
// its 3 passes would wait for a load per row.
struct StagedRows {
  const float* ks;  // [pool, d]
  const float* gs;  // [pool, d]
  int64_t r0;
  int d;
  __device__ __forceinline__ const float* k_row(int64_t r) const { return ks + (r - r0) * d; }
  __device__ __forceinline__ const float* gate_row(int64_t r) const { return gs + (r - r0) * d; }
};

__global__ void __launch_bounds__(1024) mla_norm_append_kernel(PrologueArgs a) {
  extern __shared__ float stage[];  // block 2 with a.staged: ks, gs, ape [pool, d] each
  // Early (before the wait): the slot and its length were written by the host or by an earlier
  // step's commit, by nothing that may still be running (each kernel triggers its dependent only
  // after its own wait).
  const int blk = blockIdx.x;
  const PrologueRow& r = a.row[blk];
  const int s = __ldcg(a.slots);
  const int p = s < 0 ? -1 : __ldcg(a.lengths + s);
  const bool ring = blk == 2 && p >= 0;                          // block-uniform
  const bool completes = ring && (p + 1) % a.pool == 0;
  const int d = r.D;
  float* ks = stage;
  float* gs = stage + a.pool * d;
  float* ape_s = stage + 2 * a.pool * d;
  const int64_t r0 = static_cast<int64_t>(p) + 1 - a.pool;  // the pool's first row (completes)
  if (completes && a.staged) {
    const float* tk = plane_row(a, 1, s);
    const float* tg = plane_row(a, 2, s);
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      for (int j = 0; j < a.pool; ++j) {
        const int64_t slot = ((r0 + j) % a.tail_rows) * d;
        if (j + 1 < a.pool) {  // rows before pos, from the ring
          ks[j * d + c] = __ldcg(tk + slot + c);
          gs[j * d + c] = __ldcg(tg + slot + c);
        }
        ape_s[j * d + c] = a.ape[static_cast<int64_t>(j) * d + c];
      }
    }
  }
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[32];
  __shared__ float k_pos[kMaxStagedD];  // block 2: row pos's normalised k (the norm's mirror)
  if (blk == 0 && threadIdx.x == 0) memra::cuda::decode_table_row(0, s, p, a.pos, a.t_kv, a.tables);
  // Row pos's gate, loaded now so that its latency hides under the norm's.
  const int c0 = threadIdx.x;
  const float g_pos = ring && c0 < d ? a.gate[c0] : 0.0f;
  with_group(r.G, [&](auto g) {
    constexpr int G = decltype(g)::value;
    const int64_t row = threadIdx.x / G;
    const int lane = Group<G>::lane();
    if (blk == 2) {
      layer_norm_row<G>(r.x, 1, r.D, r.w, r.b, r.eps, r.y, row, lane, red, ring ? k_pos : nullptr);
    } else if (blk == 1 && p >= 0) {
      if (a.cache_dtype == 1) {
        rms_norm_row<G>(r.x, 1, r.D, r.w, r.eps, r.y, row, lane, red,
                        latent_row<__nv_bfloat16>(a, s, p));
      } else {
        rms_norm_row<G>(r.x, 1, r.D, r.w, r.eps, r.y, row, lane, red, latent_row<float>(a, s, p));
      }
    } else {
      rms_norm_row<G>(r.x, 1, r.D, r.w, r.eps, r.y, row, lane, red);
    }
  });
  if (!ring) return;
  __syncthreads();  // k_pos is stored by the norm's row group
  float* tk = plane_row(a, 1, s);
  float* tg = plane_row(a, 2, s);
  float* keys = plane_row(a, 3, s);
  // dsa_common.cuh's append_decode_channel: the key when the token completes a pool (over the
  // staged rows, row pos put in place first), then row pos into ring slot pos % tail_rows.
  if (c0 < d) {
    const int c = c0;
    if (a.staged) {
      if (completes) {
        ks[(a.pool - 1) * d + c] = k_pos[c];
        gs[(a.pool - 1) * d + c] = g_pos;
      }
      memra::cuda::dsa::append_decode_channel(StagedRows{ks, gs, r0, d}, ape_s, p, a.pool, d,
                                              a.tail_rows, keys, tk, tg, c, k_pos[c], g_pos);
    } else {
      const memra::cuda::dsa::DecodeRows rows{r.y, a.gate, tk, tg, p, d, a.tail_rows};
      memra::cuda::dsa::append_decode_channel(rows, a.ape, p, a.pool, d, a.tail_rows, keys, tk, tg,
                                              c, k_pos[c], g_pos);
    }
  }
}

}  // namespace

extern "C" {

int memra_cuda_mla_norm_append_decode(MemraCudaCtx* ctx, const MemraMlaNormAppendParams* p) {
  if (!p) return memra::kContractMissing;
  const MemraMlaNormRow &r0 = p->q, &r1 = p->latent, &r2 = p->index_k;
  const int n = p->n, cache_dtype = p->cache_dtype, pool = p->pool, tail_rows = p->tail_rows;
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  const bool indexer = r2.x != nullptr;
  if (r0.D < 1 || r1.D < 1 || (indexer && r2.D < 1)) return memra::kContractValue;
  if (n != (indexer ? 4 : 1)) return memra::kContractValue;
  if (cache_dtype != 0 && cache_dtype != 1) return memra::kContractDType;
  if (indexer && (pool < 1 || tail_rows < pool || tail_rows % pool != 0)) {
    return memra::kContractPool;
  }
  if (!r0.x || !r0.y || !r1.x || !r1.y || !p->slots || !p->lengths || !p->pos || !p->t_kv) {
    return memra::kContractMissing;
  }
  if (indexer && (!r2.w || !r2.b || !r2.y || !p->gate || !p->ape)) return memra::kContractMissing;
  SlotTables t;
  MEMRA_CUDA_RETURN_IF(memra::cuda::make_slot_tables(n, p->bases, p->strides, p->outs, &t));
  // An indexer row wider than the fused form keeps in one pass of a block: the four launches.
  if (indexer && r2.D > kMaxStagedD) {
    const MemraNormRowsParams norms{r0.x, r0.D, r0.w, r0.eps, r0.y, r1.x, r1.D, r1.w, r1.eps, r1.y,
                                    r2.x, indexer ? r2.D : 0, r2.w, r2.b, r2.eps, r2.y};
    MEMRA_CUDA_RETURN_IF(memra_cuda_norm_rows(ctx, &norms));
    const MemraDecodeTablesParams tables{p->slots, 1, p->lengths, p->pos, p->t_kv, n,
                                         p->bases, p->strides, p->outs};
    MEMRA_CUDA_RETURN_IF(memra_cuda_decode_tables(ctx, &tables));
    MemraMlaAppendParams latent{};
    latent.batched = 1;
    latent.rows = r1.y;
    latent.n = 1;
    latent.W = r1.D;
    latent.cache_dtype = cache_dtype;
    latent.caches = p->outs[0];
    latent.pos = p->pos;
    MEMRA_CUDA_RETURN_IF(memra_cuda_mla_latent_append(ctx, &latent));
    if (!indexer) return memra::kOk;
    MemraKpoolAppendParams kpool{};
    kpool.batched = 1;
    kpool.k = r2.y;
    kpool.gate = p->gate;
    kpool.n = 1;
    kpool.d = r2.D;
    kpool.ape = p->ape;
    kpool.pool = pool;
    kpool.tail_rows = tail_rows;
    kpool.seq_pos = p->pos;
    kpool.seq_tail_k = reinterpret_cast<float* const*>(p->outs[1]);
    kpool.seq_tail_gate = reinterpret_cast<float* const*>(p->outs[2]);
    kpool.seq_pool_keys = reinterpret_cast<float* const*>(p->outs[3]);
    return memra_cuda_kpool_append(ctx, &kpool);
  }
  PrologueArgs a{};
  int block = 0;
  auto add = [&](int i, const MemraMlaNormRow& row, const float* b) {
    const int g = group_for(row.D);
    a.row[i] = PrologueRow{row.x, row.w, b, row.y, row.D, g, row.eps};
    block = std::max(block, std::max(g, 256));
  };
  add(0, r0, nullptr);
  add(1, r1, nullptr);
  if (indexer) add(2, r2, r2.b);
  a.slots = p->slots;
  a.lengths = p->lengths;
  a.pos = p->pos;
  a.t_kv = p->t_kv;
  a.tables = t;
  a.cache_dtype = cache_dtype;
  a.gate = p->gate;
  a.ape = p->ape;
  a.pool = pool;
  a.tail_rows = tail_rows;
  const size_t stage = indexer ? sizeof(float) * 3 * static_cast<size_t>(pool) * r2.D : 0;
  a.staged = stage <= kMaxStageBytes ? 1 : 0;
  memra::cuda::launch(ctx, true, mla_norm_append_kernel, dim3(indexer ? 3 : 2), dim3(block),
                      a.staged ? stage : 0, a);
  return launch_status();
}

}  // extern "C"
