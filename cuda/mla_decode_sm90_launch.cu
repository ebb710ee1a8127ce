// The batched MLA decode's sm_90a wgmma arm, host side: which merge a plan's splits take
// (Merge in cuda/mla_decode_sm90.cuh), the tensor-map template, the attention launch in each
// merge form and the split combine (kernel and launch). cuda/mla_decode.cu calls
// mla_decode_sm90() with the split plan; the kernel is cuda/mla_decode_sm90.cu.
//
// The merge (KernelOptions::mla_merge 0): kMergeCluster where every sequence's cluster of
// nsplit blocks (2..16) is resident at once (cudaOccupancyMaxActiveClusters; a GPC hosts a
// cluster, and on the H200 clusters of 2 pack all 132 SMs while 8 clusters of 16 do not fit);
// else kMergeGrid where the whole grid is (at most one block an SM and B <= kMlaDecodeSeqs; a
// cooperative launch, which the driver refuses otherwise); else, or where the cooperative launch
// is refused, kMergeCombine. Why in-grid merges: the combine launch and its partials' round
// trip through memory cost 6-8 % of the call at the bench shapes (docs/mla.md).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <cstdint>

#include "common.cuh"
#include "mla_decode_sm90.cuh"

using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::status_of;
using namespace memra::cuda::mla_sm90;

namespace {

constexpr int kCombineHeads = 4;  // heads per combine block (one warp each)
constexpr unsigned kFull = 0xffffffffu;

// Block (head group blockIdx.x of 4 heads, sequence blockIdx.y), 128 threads: merges the active
// splits of a sequence with at least two. Warp w computes head h0 + w's weights
// w_s = exp2(m_s - max m) and 1 / sum_s w_s l_s; thread t then writes columns 4t .. 4t + 3 of
// the 4 heads. Shared: weights [4][nsplit] + inverse sums [4].
__global__ void __launch_bounds__(128) mla_combine_kernel(const Sm90Args a) {
  // Launched as a programmatic dependent: wait until the attention grid has completed and its
  // writes are visible (returns at once for an ordinary launch).
  memra::cuda::pdl_wait();
  memra::cuda::pdl_trigger();
  extern __shared__ float wsm[];
  const int b = blockIdx.y, h0 = blockIdx.x * kCombineHeads;
  const int n = min(max(a.t_kv[b], 0), a.max_t_kv);
  const int nsb = n > 0 ? (n + a.chunk - 1) / a.chunk : 0;
  if (nsb <= 1) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ns = a.nsplit;
  float* inv_l = wsm + kCombineHeads * ns;
  {
    const int h = h0 + warp;
    const int64_t k = static_cast<int64_t>(b) * ns * kH + h;  // split s at k + s * kH
    float M = -INFINITY;
    for (int s = lane; s < nsb; s += 32) M = fmaxf(M, a.pm[k + s * kH]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(kFull, M, off));
    float Ls = 0.0f;
    for (int s = lane; s < nsb; s += 32) {
      const float w = exp2f(a.pm[k + s * kH] - M);  // every active split saw a row: finite
      wsm[warp * ns + s] = w;
      Ls = fmaf(w, a.pl[k + s * kH], Ls);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) Ls += __shfl_xor_sync(kFull, Ls, off);
    if (lane == 0) inv_l[warp] = 1.0f / Ls;
  }
  __syncthreads();
  float4 acc[kCombineHeads];
#pragma unroll
  for (int u = 0; u < kCombineHeads; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
  const float4* po = reinterpret_cast<const float4*>(a.po);
#pragma unroll 2
  for (int s = 0; s < nsb; ++s) {
    const int64_t k = (static_cast<int64_t>(b) * ns + s) * kH + h0;
#pragma unroll
    for (int u = 0; u < kCombineHeads; ++u) {
      const float w = wsm[u * ns + s];
      const float4 v = __ldg(po + (k + u) * (kR / 4) + tid);
      acc[u].x = fmaf(w, v.x, acc[u].x);
      acc[u].y = fmaf(w, v.y, acc[u].y);
      acc[u].z = fmaf(w, v.z, acc[u].z);
      acc[u].w = fmaf(w, v.w, acc[u].w);
    }
  }
  float4* out = reinterpret_cast<float4*>(a.o_lat + (static_cast<int64_t>(b) * kH + h0) * kR);
#pragma unroll
  for (int u = 0; u < kCombineHeads; ++u) {
    const float inv = inv_l[u];
    out[u * (kR / 4) + tid] = make_float4(acc[u].x * inv, acc[u].y * inv, acc[u].z * inv,
                                          acc[u].w * inv);
  }
}

// Clusters of c blocks of the kernel resident at once on a device, by (device, c); 0: not
// asked yet (the occupancy query costs a driver call per launch otherwise).
constexpr int kCachedDevices = 16;
std::atomic<int> g_clusters[kCachedDevices][kMaxClusterSplits + 1];

// Whether the kernel can run as clusters of a.nsplit blocks (2..16, its attributes set for
// that) and, in *all_resident, whether every sequence's cluster is resident at once (one block
// an SM: a cluster needs that many free SMs in one GPC).
bool cluster_ready(MemraCudaCtx* ctx, const Sm90Args& a, int B, bool* all_resident) {
  *all_resident = false;
  if (a.nsplit < 2 || a.nsplit > kMaxClusterSplits) return false;
  const KernelFn kernel = wgmma_kernel(kMergeCluster);
  const bool cached = ctx->device >= 0 && ctx->device < kCachedDevices;
  int clusters = cached ? g_clusters[ctx->device][a.nsplit].load(std::memory_order_relaxed) - 1
                        : -1;
  if (clusters < 0) {
    // The attributes the query and the launch need; they stay set for the device, so a cached
    // count means they are.
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes) !=
            cudaSuccess ||
        (a.nsplit > 8 &&
         cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
             cudaSuccess)) {
      cudaGetLastError();
      return false;
    }
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(a.nsplit);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(a.nsplit), static_cast<unsigned>(B));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kBytes;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    if (cached) g_clusters[ctx->device][a.nsplit].store(clusters + 1, std::memory_order_relaxed);
  }
  *all_resident = clusters >= B;
  return clusters > 0;
}

// The launch in form `merge`: grid (nsplit, B), the cluster dimension for kMergeCluster, the
// cooperative attribute for kMergeGrid, as a programmatic dependent where KernelOptions::pdl
// allows (retried without where that is refused). Returns the launch's CUDA error.
cudaError_t launch_form(MemraCudaCtx* ctx, int merge, const Sm90Args& a, int B,
                        const CUtensorMap& tmpl, unsigned char* maps) {
  const KernelFn kernel = wgmma_kernel(merge);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attr[2];
  int na = 0;
  if (merge == kMergeCluster) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = static_cast<unsigned>(a.nsplit);
    attr[na].val.clusterDim.y = 1;
    attr[na].val.clusterDim.z = 1;
    ++na;
  } else if (merge == kMergeGrid) {
    attr[na].id = cudaLaunchAttributeCooperative;
    attr[na].val.cooperative = 1;
    ++na;
  }
  attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[na].val.programmaticStreamSerializationAllowed = ctx->options.pdl ? 1 : 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(a.nsplit), static_cast<unsigned>(B));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kBytes;
  cfg.stream = ctx->stream;
  cfg.attrs = attr;
  cfg.numAttrs = static_cast<unsigned>(na + 1);
  e = cudaLaunchKernelEx(&cfg, kernel, a, tmpl, maps);
  if (e != cudaSuccess && ctx->options.pdl) {
    cudaGetLastError();  // refused as a programmatic dependent: an ordinary launch instead
    cfg.numAttrs = static_cast<unsigned>(na);
    e = cudaLaunchKernelEx(&cfg, kernel, a, tmpl, maps);
  }
  return e;
}

// The tensor-map template over a.max_t_kv rows (see mla_decode_sm90.cu's file comment).
int map_template(MemraCudaCtx* ctx, const Sm90Args& a, CUtensorMap* tmpl_out) {
  int optin = 0;
  MEMRA_CUDA_RETURN_IF(status_of(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device)));
  if (kBytes > optin) return memra::kUnsupportedGeometry;
  // cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link).
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (!encode) return memra::kUnsupportedGeometry;
  // The template: bf16 [max_t_kv][512] rows of 1 KiB, 64 x 64 boxes, 128-byte swizzle; each block
  // replaces the address (its sequence's cache; o_lat stands in here) and the row count.
  CUtensorMap tmpl{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kR), static_cast<cuuint64_t>(a.max_t_kv)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kR) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(kTileRows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult rc = encode(&tmpl, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.o_lat, dims, strides,
                             box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS) {
    return memra::kUnsupportedGeometry;
  }
  *tmpl_out = tmpl;
  return memra::kOk;
}

}  // namespace

namespace memra::cuda {

int mla_decode_sm90_tile_rows() { return kTileRows; }

int mla_decode_sm90_max_splits() { return kMaxSplits; }

int mla_decode_sm90(MemraCudaCtx* ctx, const float* q_lat, const void* const* caches,
                    const int32_t* t_kv, int B, int max_t_kv, int chunk, int nsplit, float scale,
                    float* o_lat) {
  // The plan's invariants (cuda/mla_decode.cu): whole tiles a split, the splits cover max_t_kv,
  // one grid row a sequence.
  if (B < 1 || B > 65535 || max_t_kv < 1 || nsplit < 1 || nsplit > kMaxSplits ||
      chunk < kTileRows || chunk % kTileRows != 0 ||
      static_cast<int64_t>(nsplit) * chunk < max_t_kv) {
    return kContractValue;
  }
  Sm90Args a{};
  a.q_lat = q_lat;
  a.caches = caches;
  a.t_kv = t_kv;
  a.max_t_kv = max_t_kv;
  a.chunk = chunk;
  a.nsplit = nsplit;
  a.scale = scale;
  a.o_lat = o_lat;
  CUtensorMap tmpl{};
  MEMRA_CUDA_RETURN_IF(map_template(ctx, a, &tmpl));
  int sms = 0;
  MEMRA_CUDA_RETURN_IF(
      status_of(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device)));
  // The merge (file comment); KernelOptions::mla_merge forces a form where it can run.
  int merge = kMergeCombine;
  if (nsplit > 1) {
    const int want = ctx->options.mla_merge;
    bool resident = false;
    const bool cluster = (want == 0 || want == 2) && cluster_ready(ctx, a, B, &resident);
    const bool grid = (want == 0 || want == 3) && static_cast<int64_t>(B) * nsplit <= sms &&
                      B <= kMlaDecodeSeqs;
    if (cluster && (resident || want == 2)) {
      merge = kMergeCluster;
    } else if (grid) {
      merge = kMergeGrid;
      a.seq_tickets = ctx->tickets + kTicketMlaDecode;
    }
  }
  const size_t n_part = static_cast<size_t>(B) * nsplit * kH;
  // Partials for every split plan, the in-grid merges' too: their fallback should the driver
  // refuse a cluster or cooperative launch (one pool allocation, no traffic when unused).
  const bool partials = nsplit > 1;
  Scratch part(ctx, partials ? sizeof(float) * n_part * (kR + 2) : 0);
  MEMRA_CUDA_RETURN_IF(part.status());
  if (partials) {
    a.po = part.as<float>();
    a.pm = a.po + n_part * kR;
    a.pl = a.pm + n_part;
  }
  Scratch maps(ctx, static_cast<size_t>(128) * nsplit * B);
  MEMRA_CUDA_RETURN_IF(maps.status());
  cudaError_t e = launch_form(ctx, merge, a, B, tmpl, maps.as<unsigned char>());
  if (e != cudaSuccess && merge != kMergeCombine) {
    cudaGetLastError();  // a cluster or cooperative launch refused: the combine form instead
    merge = kMergeCombine;
    e = launch_form(ctx, merge, a, B, tmpl, maps.as<unsigned char>());
  }
  if (e != cudaSuccess) {
    cudaGetLastError();  // this call's error, not the next launch's
    return status_of(e);
  }
  MEMRA_CUDA_RETURN_IF(launch_status());
  if (partials && merge == kMergeCombine) {
    // A programmatic dependent launch: the combine's launch overlaps the attention grid's tail
    // (its blocks wait in griddepcontrol.wait); an ordinary launch where that is refused or
    // KernelOptions::pdl is off.
    const dim3 grid(kH / kCombineHeads, static_cast<unsigned>(B));
    const size_t smem = sizeof(float) * kCombineHeads * (static_cast<size_t>(nsplit) + 1);
    memra::cuda::launch(ctx, true, mla_combine_kernel, grid, dim3(128), smem, a);
    MEMRA_CUDA_RETURN_IF(launch_status());
  }
  return kOk;
}

}  // namespace memra::cuda
