// MLA prefill attention on tensor cores (memra_cuda_mla_attn, one sequence, tensor_cores = 1:
// cpp/include/memra/cuda_abi/mla.h), the bf16 models' arm; cuda/mla_attn.cu keeps the f32
// CUDA-core kernel (the CPU's operations) for float32 models, other geometries and the tests.
//
// Form: absorbed. Each query token attends the shared latent cache rows ([latent | rope], R +
// d_rope wide) with its H heads as the rows of the M tile (an MQA of head dim R + d_rope for QK
// and R for PV: FlashMLA's and FlashInfer's MLA layout), so every cache row staged in shared
// memory serves all the heads of the block. Why absorbed and not decompressed (per-head K and V
// of d_nope + d_rope / d_v, then an MHA):
//   - the gathered DSA form (GLM-5.3-Flash's every MLA layer): each query attends its own top-k
//     rows; absorbed, a gathered latent row (1 KiB bf16 at R = 512) feeds all 64 heads, while
//     decompressed each query would gather H per-head K and V rows (64x the bytes) or decompress
//     its own rows;
//   - a slot that already holds tokens (p0 > 0) attends its cached latent rows as they are; the
//     decompressed form re-expands the whole prefix through kv_b every call, and holds T x H x
//     (d_nope + d_rope + d_v) bf16 of K / V (2 GiB at T = 32K, GLM-5.3-Flash widths) against the
//     latent cache's T x (R + d_rope);
//   - it is the memra cache layout and ABI (q_lat, the latent cache, o_lat), shared with decode.
//   The cost: per (query, row, head) R + d_rope + R multiply-adds against d_nope + d_rope + d_v
//   decompressed (1024 vs 512 at GLM-5.3-Flash, 1088 vs 320 at Kimi-Linear), so a long dense
//   causal prefill (Kimi-Linear has no DSA) does 2-3.4x the tensor-core work of the decompressed
//   form: the place where a decompressed arm would pay (not built; docs/mla.md).
//
// Kernel: a prefill query i (row p0 + i, p0 = t_kv - t_q) is a decode row whose sequence holds
// rows [0, p0 + i] (or its index list): the batched decode's tensor-core kernels
// (cuda/mla_decode_tc.cu, mma.sync m16n8k16 bf16 -> f32, 64-row tiles staged by cp.async, online
// softmax in f32; dense GLM-5.3-Flash heads: the sm_90a wgmma kernel of cuda/mla_decode_sm90.cu)
// run over the t_q queries as t_q sequences that all point at the one cache, with per-query
// lengths p0 + i + 1 written by one small kernel. Index lists go through the decode's
// compaction (entries outside [0, p0 + i] skipped, duplicates once), the one-sequence INDEXED
// contract. The launch's split over the rows is the decode's cost model (splits only when the
// queries' blocks would not fill the GPU). Precision as the decode arm: q_lat / q_pe and p
// rounded to bf16, scores, softmax statistics and both accumulations f32.
#include <algorithm>
#include <cstdint>

#include "common.cuh"

namespace memra::cuda::mla {
// cuda/mla_decode.cu: the batched forms (p.batched == 1), entry checks included.
int attn_decode(MemraCudaCtx* ctx, const MemraMlaAttnParams& p);
}  // namespace memra::cuda::mla

using memra::cuda::ceil_div;
using memra::cuda::launch_status;
using memra::cuda::Scratch;

namespace {

// The decode grid's sequence dimension is gridDim.y (<= 65535): queries go in chunks.
constexpr int kChunk = 32768;

// caches[i] = cache, t_kv[i] = row0 + i + 1 for i < n.
__global__ void prefill_rows_kernel(const void* cache, int n, int row0, const void** caches,
                                    int32_t* t_kv) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    caches[i] = cache;
    t_kv[i] = row0 + i + 1;
  }
}

}  // namespace

namespace memra::cuda::mla {

// The geometries the decode's tensor-core kernels are built for.
bool prefill_tc_fits(int cache_dtype, int R, int d_rope) {
  return cache_dtype == 1 && (R == 128 || R == 256 || R == 512) && (d_rope == 0 || d_rope == 64);
}

// p: one sequence, CAUSAL or INDEXED, checked by the entry (cuda/mla_attn.cu); t_q, H >= 1 and
// (INDEXED) width >= 1.
int attn_prefill_tc(MemraCudaCtx* ctx, const MemraMlaAttnParams& p) {
  const int t_q = p.t_q, row0 = p.t_kv - p.t_q;
  Scratch tables(ctx, (sizeof(void*) + sizeof(int32_t)) * static_cast<size_t>(t_q));
  MEMRA_CUDA_RETURN_IF(tables.status());
  const void** caches = tables.as<const void*>();
  int32_t* t_kv = reinterpret_cast<int32_t*>(caches + t_q);
  const unsigned blocks = std::min(ceil_div(t_q, 256), 4096u);
  memra::cuda::launch(ctx, true, prefill_rows_kernel, dim3(blocks), dim3(256), 0, p.cache, t_q,
      row0, caches, t_kv);
  MEMRA_CUDA_RETURN_IF(launch_status());
  const bool indexed = p.rows == MEMRA_MLA_ROWS_INDEXED;
  for (int c0 = 0; c0 < t_q; c0 += kChunk) {
    const int n = std::min(kChunk, t_q - c0);
    const int64_t qh = static_cast<int64_t>(c0) * p.H;
    MemraMlaAttnParams d{};
    d.batched = 1;
    d.rows = indexed ? MEMRA_MLA_ROWS_INDEXED : MEMRA_MLA_ROWS_CAUSAL;
    d.q_lat = p.q_lat + qh * p.R;
    d.q_pe = p.d_rope > 0 ? p.q_pe + qh * p.d_rope : nullptr;
    d.H = p.H;
    d.R = p.R;
    d.d_rope = p.d_rope;
    d.scale = p.scale;
    d.cache_dtype = p.cache_dtype;
    d.o_lat = p.o_lat + qh * p.R;
    d.caches = caches + c0;
    d.seq_t_kv = t_kv + c0;
    d.B = n;
    d.max_t_kv = row0 + c0 + n;  // the chunk's last query sees every row up to its own
    if (indexed) {
      d.idx = p.idx + static_cast<int64_t>(c0) * p.width;
      d.width = p.width;
    }
    MEMRA_CUDA_RETURN_IF(attn_decode(ctx, d));
  }
  return memra::kOk;
}

}  // namespace memra::cuda::mla
