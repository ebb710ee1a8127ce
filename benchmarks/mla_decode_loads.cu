// What bounds the batched MLA decode kernel (cuda/mla_decode_sm90.cu, 0.63-0.65 of copy at the
// bench shapes)? This times its load pipeline alone: the same grid (split, sequence), one block
// an SM with two warpgroups, three 64-row stages of a bf16 [rows][512] cache in shared memory, each
// warpgroup loading its 256 columns of a tile as four 64 x 64 boxes (tensor memory accelerator,
// 128-byte swizzle, 256-byte L2 promotion) two tiles ahead, waiting on the stage's mbarrier and
// meeting at a 128-thread barrier before it reuses a stage, exactly as the kernel does, but with
// no products: after the wait each thread reads one word of the tile and spins for N SM clocks
// (a stand-in for the products and the softmax; N swept from 0 to 5000). Time against the same
// run's copy.
//   N = 0:        the load pattern's own bound
//   N > 0:        how much work a tile can carry before the loads stop being the bound
// Standalone: nvcc -O3 -std=c++17 -arch=sm_90a benchmarks/mla_decode_loads.cu -o /tmp/mdl && /tmp/mdl
// Prints one JSON line per (B, L, splits, delay).
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdio>

#include "check.h"

constexpr int kR = 512, kTile = 64, kStages = 3, kThreads = 256;
constexpr int kSub = kTile * 128;  // one 64-column box of a tile
constexpr int kStage = 8 * kSub;
constexpr int kBarOff = kStages * kStage;
constexpr int kBytes = kBarOff + kStages * 2 * 8 + 1024;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

__global__ void __launch_bounds__(kThreads, 1)
    loads_kernel(const __grid_constant__ CUtensorMap map, int L, int chunk, int delay,
                 unsigned* sink) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const unsigned char* smem = smem_raw + (base - raw);
  const int split = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int wg = tid >> 7, wt = tid & 127;
  const int ntiles = chunk / kTile;
  const int row0 = b * L + split * chunk;
  const uint32_t bar_s = base + kBarOff;
  if (tid == 0) {
    for (int i = 0; i < kStages * 2; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar_s + 8 * i) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto load_half = [&](int t) {
    if (wt != 0 || t >= ntiles) return;
    const uint32_t bar = bar_s + 8 * ((t % kStages) * 2 + wg);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(4 * kSub)
                 : "memory");
    const uint32_t st = base + static_cast<uint32_t>((t % kStages) * kStage + wg * 4 * kSub);
    for (int c = 0; c < 4; ++c) {
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
          "[%0], [%1, {%3, %4}], [%2];\n" ::"r"(st + c * kSub),
          "l"(&map), "r"(bar), "r"((4 * wg + c) * 64), "r"(row0 + t * kTile)
          : "memory");
    }
  };
  load_half(0);
  load_half(1);
  unsigned acc = 0;
  for (int t = 0; t < ntiles; ++t) {
    mbar_wait(bar_s + 8 * ((t % kStages) * 2 + wg), static_cast<uint32_t>((t / kStages) & 1));
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
    load_half(t + 2);
    acc += reinterpret_cast<const unsigned*>(smem + (t % kStages) * kStage + wg * 4 * kSub)[wt];
    if (delay > 0) {
      const long long t0 = clock64();
      while (clock64() - t0 < delay) {
      }
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the reads
}

int main() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                      &q));
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const size_t rows = 64 * 4096;  // both shapes hold 2^18 rows of 1 KiB
  const size_t bytes = rows * kR * 2;
  void* cache = nullptr;
  unsigned* sink = nullptr;
  CK(cudaMalloc(&cache, bytes));
  CK(cudaMemset(cache, 0, bytes));
  CK(cudaMalloc(&sink, 4));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto time_us = [&](auto&& f, int reps) {
    for (int i = 0; i < 3; ++i) f();
    CK(cudaEventRecord(e0));
    for (int i = 0; i < reps; ++i) f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return 1e3 * ms / reps;
  };
  // The copy yardstick (as benchmarks/common.py: 2 GiB, bytes read + written).
  const size_t cn = size_t(2) << 30;
  void *src = nullptr, *dst = nullptr;
  CK(cudaMalloc(&src, cn));
  CK(cudaMalloc(&dst, cn));
  CK(cudaMemset(src, 1, cn));
  const double copy_us = time_us([&] { CK(cudaMemcpyAsync(dst, src, cn, cudaMemcpyDeviceToDevice)); }, 20);
  const double copy_TBps = 2.0 * cn / copy_us / 1e6;
  CK(cudaFree(src));
  CK(cudaFree(dst));
  // A copy of the same 256 MiB (read + write), for the size's own ramp.
  void* d2 = nullptr;
  CK(cudaMalloc(&d2, bytes));
  const double same_us = time_us([&] { CK(cudaMemcpyAsync(d2, cache, bytes, cudaMemcpyDeviceToDevice)); }, 20);
  std::printf("{\"device\": \"%s\", \"copy_TBps\": %.4f, \"copy_256MiB_TBps\": %.4f}\n", prop.name,
              copy_TBps, 2.0 * bytes / same_us / 1e6);

  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kR), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kR) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(kTile)};
  const cuuint32_t elem[2] = {1, 1};
  CK(encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, cache, dims, strides, box, elem,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  CK(cudaFuncSetAttribute(loads_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  const int shapes[2][3] = {{64, 4096, 2}, {8, 32768, 16}};  // B, L, splits (the op's plan)
  for (const auto& s : shapes) {
    const int B = s[0], L = s[1], ns = s[2], chunk = L / ns;
    for (int delay : {0, 1000, 2000, 3000, 4000, 5000}) {
      const double us = time_us([&] {
        loads_kernel<<<dim3(ns, B), kThreads, kBytes>>>(map, L, chunk, delay, sink);
        CK(cudaGetLastError());
      }, 20);
      const double tbps = static_cast<double>(B) * L * kR * 2 / us / 1e6;
      std::printf("{\"B\": %d, \"L\": %d, \"splits\": %d, \"delay_clk\": %d, \"us\": %.2f, "
                  "\"TBps\": %.4f, \"frac_of_copy\": %.4f}\n",
                  B, L, ns, delay, us, tbps, tbps / copy_TBps);
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
