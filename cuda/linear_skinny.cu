// linear's weight-streaming arm for 2..64 rows on sm_90a (KernelOptions::linear_skinny, the
// GEMMs of a batched decode step): y[T, N] = x[T, K] w[N, K]^T (+ bias[N]) with bf16 x and w
// (linear rounds an f32 x first), f32 accumulation and output. At these T a
// GEMM is a stream of the weight: every weight byte is read once, x (at most 64 rows) comes from
// L2, and the tensor cores have little to do, so the kernel is built to keep each SM's share of
// the weight in flight:
//   - a block owns 128 weight rows (two m64 halves of wgmma's A) and a contiguous slice of the
//     K boxes (64 columns, 128 bytes of a row: the 128-byte swizzle's span); its producer warp
//     streams [128 x 64] weight boxes and [TP x 64] x boxes (TP = T rounded up to 8, 16, 32 or
//     64; rows past T arrive as zeros) through a ring of 4-5 stages by the tensor memory
//     accelerator, and one consumer warpgroup multiplies them from shared memory
//     (wgmma m64nTPk16, D[weight rows, tokens] in registers);
//   - the K slices of a row tile are the blocks of one thread-block cluster (1, 2, 4 or 8,
//     chosen so that every SM streams about the same number of boxes: 192 row tiles of a
//     24576-row weight on 132 SMs as 384 half-K blocks, 32 tiles of a 4096-row one as 128
//     quarter-K blocks); their partial sums meet in distributed shared memory, where block r of
//     the cluster adds the partials of its 128 / splits rows in rank order, then the bias, and
//     stores them: one launch, no workspace, the same bytes on every run;
//   - when the weights are resident (MemraCudaCtx::resident_weights, as the decode GEMV), the
//     first stages' weight boxes are requested before the programmatic wait: only x depends on
//     the launch in front.
// Summation: each block's tensor-core sums over its K slice in k order, then the slices in rank
// order; against cpu::linear on the same bf16 x only the order differs (products of two bf16
// values are exact in f32).
#include <cuda.h>

#include <cstdint>

#include "common.cuh"
#include "linear.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

using memra::cuda::launch_status;
using memra::cuda::smem_u32;
using memra::cuda::status_of;

namespace {

constexpr int kBM = 128;           // weight rows a block
constexpr int kBK = 64;            // columns a box
constexpr int kThreads = 160;      // one consumer warpgroup + the producer warp
constexpr int kProducerWarp = 4;
constexpr int kMaxSplits = 8;      // blocks a cluster (the portable limit)
constexpr int kWBox = kBM * kBK * 2;  // 16 KiB

template <int TP>
struct Cfg {
  static constexpr int kXBox = TP * kBK * 2;
  static constexpr int kStage = kWBox + kXBox;         // a multiple of 1 KiB (swizzle atoms)
  static constexpr int kStages = TP <= 32 ? 5 : 4;     // <= 113 KiB: two blocks an SM
  static constexpr int kPStride = kBM + 4;             // partial rows: conflict-free stores
  static constexpr int kBarOff = kStages * kStage;
  static constexpr int kBytes = kBarOff + 2 * kStages * 8 + 1024;  // + the 1 KiB alignment
  static_assert(TP * kPStride * 4 <= kBarOff, "the partials fit in the stages");
};

struct SkinnyArgs {
  const float* bias;  // [N] or null
  float* y;           // [T, N] f32
  int T, N;
  int kboxes;         // ceil(K / 64)
  int splits;         // blocks a cluster = K slices a row tile (gridDim.x)
  int prefetch;       // weights resident: the first weight boxes before the programmatic wait
};

__device__ __forceinline__ void cluster_sync_all() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

// A float of block `rank`'s shared memory at this block's shared address `addr`.
__device__ __forceinline__ float ld_cluster(uint32_t addr, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// Block (K slice blockIdx.x = rank in the cluster, row tile blockIdx.y). See the file comment.
template <int TP>
__global__ void __launch_bounds__(kThreads) skinny_gemm_kernel(
    const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
    const SkinnyArgs a) {
  using C = Cfg<TP>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  float* part = reinterpret_cast<float*>(smem_raw + (base - raw));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rank = blockIdx.x, n0 = blockIdx.y * kBM;
  const int b0 = static_cast<int>(static_cast<int64_t>(rank) * a.kboxes / a.splits);
  const int nb = static_cast<int>(static_cast<int64_t>(rank + 1) * a.kboxes / a.splits) - b0;
  const uint32_t full = base + C::kBarOff, empty = full + 8 * C::kStages;
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < C::kStages; ++i) {
      mbar_init(full + 8 * i, 1);
      mbar_init(empty + 8 * i, 4);  // one arrival a consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp == kProducerWarp) {
    if (lane == 0) {
      const int pre = nb < C::kStages ? nb : C::kStages;
      if (!a.prefetch) memra::cuda::pdl_wait();
      for (int i = 0; i < pre; ++i) {
        mbar_expect_tx(full + 8 * i, C::kStage);
        tma_load_2d(base + i * C::kStage, &wmap, full + 8 * i, (b0 + i) * kBK, n0);
      }
      if (a.prefetch) memra::cuda::pdl_wait();  // x is the launch in front's output
      for (int i = 0; i < pre; ++i) {
        tma_load_2d(base + i * C::kStage + kWBox, &xmap, full + 8 * i, (b0 + i) * kBK, 0);
      }
      for (int i = pre; i < nb; ++i) {
        const int s = i % C::kStages;
        mbar_wait(empty + 8 * s, static_cast<uint32_t>((i / C::kStages - 1) & 1));
        const uint32_t st = base + s * C::kStage;
        mbar_expect_tx(full + 8 * s, C::kStage);
        tma_load_2d(st, &wmap, full + 8 * s, (b0 + i) * kBK, n0);
        tma_load_2d(st + kWBox, &xmap, full + 8 * s, (b0 + i) * kBK, 0);
      }
    }
    memra::cuda::pdl_wait();  // the stores below come after the launch in front
  } else {
    memra::cuda::pdl_wait();
    float acc[2][TP / 2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < TP / 2; ++j) acc[h][j] = 0.0f;
    }
    for (int i = 0; i < nb; ++i) {
      const int s = i % C::kStages;
      mbar_wait(full + 8 * s, static_cast<uint32_t>((i / C::kStages) & 1));
      const uint32_t st = base + s * C::kStage;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const uint64_t dx = smem_desc(st + kWBox + 32 * kk, 16, 1024);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wgmma_ss<TP>(acc[h], smem_desc(st + h * (kWBox / 2) + 32 * kk, 16, 1024), dx);
        }
      }
      wgmma_commit();
      wgmma_wait<1>();  // box i - 1's products are done: its stage may be refilled
      if (i > 0 && lane == 0) mbar_arrive(empty + 8 * ((i - 1) % C::kStages));
    }
    wgmma_wait<0>();
    reg_fence(acc[0]);
    reg_fence(acc[1]);
    // Every warp's products are done before the stages become the partials.
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
    // part[t][n] (kPStride apart): accumulator i of half h is weight row
    // 64 h + 16 warp + lane / 4 + 8 ((i / 2) % 2), token 8 (i / 4) + 2 (lane % 4) + i % 2.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = 64 * h + 16 * warp + (lane >> 2);
#pragma unroll
      for (int i = 0; i < TP / 2; ++i) {
        const int t = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
        part[t * C::kPStride + n + 8 * ((i >> 1) & 1)] = acc[h][i];
      }
    }
  }

  // Block r of the cluster sums rows [r * 128 / splits, ..) of the tile over the cluster's
  // partials in rank order, adds the bias and stores them.
  const int splits = a.splits;
  if (splits > 1) {
    cluster_sync_all();
  } else {
    __syncthreads();
  }
  const int rows = kBM / splits;
  const int items = a.T * rows;
  const uint32_t pbase = smem_u32(part);
  for (int idx = tid; idx < items; idx += kThreads) {
    const int t = idx / rows, n = rank * rows + idx % rows;
    if (n0 + n >= a.N) continue;
    const int off = t * C::kPStride + n;
    float v;
    if (splits > 1) {
      v = ld_cluster(pbase + 4 * off, 0);
      for (int q = 1; q < splits; ++q) v += ld_cluster(pbase + 4 * off, q);
    } else {
      v = part[off];
    }
    if (a.bias) v = v + a.bias[n0 + n];
    a.y[static_cast<int64_t>(t) * a.N + n0 + n] = v;
  }
  memra::cuda::pdl_trigger();
  if (splits > 1) cluster_sync_all();  // the peers' partials stay until every block has read them
}

// K slices a row tile (a cluster size) such that every SM streams about the same number of
// boxes: the fewest that minimise (blocks an SM) x (boxes a block).
int choose_splits(int tiles, int kboxes, int sms) {
  int best = 1;
  int64_t best_cost = -1;
  for (int s = 1; s <= kMaxSplits && s <= kboxes; s *= 2) {
    const int64_t blocks = static_cast<int64_t>(tiles) * s;
    const int64_t cost = ((blocks + sms - 1) / sms) * ((kboxes + s - 1) / s);
    if (best_cost < 0 || cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

template <int TP>
int launch_skinny(MemraCudaCtx* ctx, const CUtensorMap& wmap, const CUtensorMap& xmap,
                  const SkinnyArgs& a, int tiles) {
  auto kernel = skinny_gemm_kernel<TP>;
  MEMRA_CUDA_RETURN_IF(status_of(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg<TP>::kBytes)));
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(a.splits);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = ctx->options.pdl ? 1 : 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(a.splits), static_cast<unsigned>(tiles));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = Cfg<TP>::kBytes;
  cfg.stream = ctx->stream;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, wmap, xmap, a);
  if (e != cudaSuccess && ctx->options.pdl) {
    cudaGetLastError();  // refused as a programmatic dependent: an ordinary launch instead
    cfg.numAttrs = 1;
    e = cudaLaunchKernelEx(&cfg, kernel, wmap, xmap, a);
  }
  return status_of(e);
}

// A 16-bit [rows, cols] matrix with rows ld elements apart, in boxes of box_rows x 64 columns
// (128-byte swizzle, the wgmma descriptors' layout); elements past rows / cols read as zero.
bool encode_map(CUtensorMap* map, const void* ptr, int64_t rows, int64_t cols, int64_t ld,
                int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides,
                box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

namespace memra::cuda {

bool skinny_gemm_fits(const MemraCudaCtx* ctx, const void* x, int64_t ldx, const void* w,
                      int dtype, int T, int K, int N) {
  return ctx->options.linear_skinny && dtype == 1 && T >= 2 &&
         T <= kSkinnyMaxRows && K >= 1 && N >= 1 && K % 8 == 0 && ldx % 8 == 0 &&
         aligned16(x) && aligned16(w);
}

int skinny_gemm(MemraCudaCtx* ctx, const void* x, int64_t ldx, const void* w, int T, int K,
                int N, const float* bias, float* y) {
  const int tp = T <= 8 ? 8 : T <= 16 ? 16 : T <= 32 ? 32 : 64;
  CUtensorMap wmap{}, xmap{};
  if (!encode_map(&wmap, w, N, K, K, kBM) || !encode_map(&xmap, x, T, K, ldx, tp)) {
    return kUnsupportedGeometry;
  }
  int sms = 0;
  MEMRA_CUDA_RETURN_IF(
      status_of(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device)));
  SkinnyArgs a{};
  a.bias = bias;
  a.y = y;
  a.T = T;
  a.N = N;
  a.kboxes = (K + kBK - 1) / kBK;
  const int tiles = (N + kBM - 1) / kBM;
  a.splits = choose_splits(tiles, a.kboxes, sms > 0 ? sms : 1);
  a.prefetch = ctx->resident_weights > 0 ? 1 : 0;
  int rc;
  switch (tp) {
    case 8: rc = launch_skinny<8>(ctx, wmap, xmap, a, tiles); break;
    case 16: rc = launch_skinny<16>(ctx, wmap, xmap, a, tiles); break;
    case 32: rc = launch_skinny<32>(ctx, wmap, xmap, a, tiles); break;
    default: rc = launch_skinny<64>(ctx, wmap, xmap, a, tiles); break;
  }
  if (rc != kOk) return rc;
  return launch_status();
}

}  // namespace memra::cuda
