// Does prefetching a weight into L2 during a chain of small latency-bound kernels shorten the
// weight-streaming kernel that follows? A model of the batch-1 decode step, where ~15 us windows
// of norm / mHC / scan kernels (DRAM idle) sit between GEMVs that stream 20-200 MB each.
//
// One "site" = [prefetch of the first P MB of W] + S spin kernels (1 block, ~2.5 us each: the
// latency-bound window) + a streaming read of all of W (a GEMV stand-in: each 256-thread block
// reads one contiguous 64 KB tile with 16-byte ld.global.nc.L1::no_allocate, tiles in address
// order). Sites cycle over 8 different W buffers (8 x |W| >> L2), so nothing survives in L2 from
// one site to the next except what the prefetch put there. The whole sequence is captured in a
// CUDA graph (as memra's decode step is) and timed by events; one JSON line per (|W|, S, P, arm).
//
// Arms: "kernel" = a separate 1-warp kernel issuing cp.async.bulk.prefetch.L2 in 1 MB pieces,
// launched normally; "pdl" = the same kernel launched as a programmatic dependent (it starts under
// the previous read's tail); "inline" = the first spin kernel issues the prefetch itself (no extra
// launch).
// Standalone: nvcc -O3 -std=c++17 -arch=sm_90a benchmarks/l2_prefetch.cu -o /tmp/l2p && /tmp/l2p
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

constexpr int kPiece = 1 << 20;  // bytes per bulk prefetch instruction
constexpr int kTile = 64 << 10;  // bytes per read block

__device__ __forceinline__ void prefetch_l2(const char* p, int64_t bytes) {
  const int lane = threadIdx.x & 31;
  for (int64_t o = int64_t(lane) * kPiece; o < bytes; o += 32 * int64_t(kPiece)) {
    const uint32_t n = static_cast<uint32_t>(bytes - o < kPiece ? bytes - o : kPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(n) : "memory");
  }
}

__global__ void prefetch_kernel(const char* p, int64_t bytes) {
  asm volatile("griddepcontrol.launch_dependents;");
  prefetch_l2(p, bytes);
}

// Bulk prefetch, then stay alive ns nanoseconds (does the prefetch need its CTA alive?).
__global__ void prefetch_stay_kernel(const char* p, int64_t bytes, int64_t ns) {
  prefetch_l2(p, bytes);
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < static_cast<uint64_t>(ns));
}

// Plain loads of the first `bytes` of p by a small grid (results discarded): pulls them into L2.
// evict_last != 0 tags the lines L2::evict_last.
__global__ void warm_kernel(const int4* p, int64_t n16, int evict_last, int* sink) {
  // 8 independent 16-byte loads per thread before any is consumed (memory-level parallelism:
  // 64 blocks x 256 threads x 128 B = 2 MB in flight).
  constexpr int U = 8;
  int acc = 0;
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i0 = blockIdx.x * int64_t(blockDim.x) * U + threadIdx.x; i0 < n16;
       i0 += stride * U) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = i0 + int64_t(u) * blockDim.x;
      v[u] = make_int4(0, 0, 0, 0);
      if (i < n16) {
        if (evict_last)
          asm volatile("ld.global.L2::cache_hint.v4.s32 {%0,%1,%2,%3}, [%4], %5;"
                       : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                       : "l"(p + i), "l"(pol));
        else
          asm volatile("ld.global.v4.s32 {%0,%1,%2,%3}, [%4];"
                       : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                       : "l"(p + i));
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x7fffffff) *sink = acc;
}

// ~ns nanoseconds of one block doing nothing useful (a norm / mHC / scan stand-in).
__global__ void spin_kernel(int64_t ns, const char* pf, int64_t pf_bytes, int* sink) {
  asm volatile("griddepcontrol.launch_dependents;");
  if (pf && threadIdx.x < 32) prefetch_l2(pf, pf_bytes);
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < static_cast<uint64_t>(ns));
  if (threadIdx.x == 0 && t == 0) *sink = 1;
}

__global__ void read_kernel(const int4* __restrict__ w, int* sink) {
  asm volatile("griddepcontrol.launch_dependents;");
  const int4* tile = w + int64_t(blockIdx.x) * (kTile / 16);
  int acc = 0;
#pragma unroll 4
  for (int i = threadIdx.x; i < kTile / 16; i += blockDim.x) {
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(tile + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) *sink = acc;
}

void launch_prefetch(cudaStream_t s, const char* p, int64_t bytes, bool pdl) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, prefetch_kernel, p, bytes));
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
};

// Median per-site time of a graph of kSites sites built by site(i, stream, side_stream).
template <typename F>
double graph_site_us(cudaStream_t s, cudaStream_t side, F&& site) {
  constexpr int kSites = 32;
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kSites; ++i) site(i, s, side);
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int r = 0; r < 3; ++r) CK(cudaGraphLaunch(ge, s));
  Timer tm;
  std::vector<float> t;
  for (int r = 0; r < 10; ++r) {
    CK(cudaEventRecord(tm.a, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(tm.b, s));
    CK(cudaEventSynchronize(tm.b));
    float ms;
    CK(cudaEventElapsedTime(&ms, tm.a, tm.b));
    t.push_back(ms * 1000.0f / kSites);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"device\": \"%s\", \"l2_bytes\": %d, \"persisting_l2_max\": %d, \"sms\": %d}\n",
              prop.name, prop.l2CacheSize, prop.persistingL2CacheMaxSize,
              prop.multiProcessorCount);
  cudaStream_t s, side;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  int* sink;
  CK(cudaMalloc(&sink, 4));
  constexpr int kBufs = 8;
  const int64_t mb = 201, bytes = mb << 20;
  std::vector<char*> w(kBufs);
  for (auto& p : w) {
    CK(cudaMalloc(&p, bytes));
    CK(cudaMemset(p, 1, bytes));
  }
  std::vector<cudaEvent_t> fork(64), join(64);
  for (int i = 0; i < 64; ++i) {
    CK(cudaEventCreateWithFlags(&fork[i], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join[i], cudaEventDisableTiming));
  }
  const int blocks = static_cast<int>(bytes / kTile);
  auto read = [&](cudaStream_t st, const char* p) {
    read_kernel<<<blocks, 256, 0, st>>>(reinterpret_cast<const int4*>(p), sink);
  };
  // (1) Does data pulled into L2 speed the read? read alone, timed by events, after a warm of
  // the first P MB (plain / evict_last loads by 264 blocks) and after a bulk prefetch whose CTA
  // stays alive 20 us.
  Timer tm;
  for (int64_t pmb : {0, 8, 16, 24, 32, 40}) {
    for (int how = 0; how < 3; ++how) {
      if (pmb == 0 && how > 0) continue;
      std::vector<float> t;
      for (int r = 0; r < 12; ++r) {
        const char* p = w[r % kBufs];
        const int64_t pb = pmb << 20;
        if (pb && how < 2)
          warm_kernel<<<64, 256, 0, s>>>(reinterpret_cast<const int4*>(p), pb / 16, how, sink);
        if (pb && how == 2) prefetch_stay_kernel<<<1, 32, 0, s>>>(p, pb, 20000);
        // A kernel in front of the read in every arm, so the read's launch overlaps it alike.
        if (!pb) spin_kernel<<<1, 128, 0, s>>>(20000, nullptr, 0, sink);
        CK(cudaEventRecord(tm.a, s));
        read(s, p);
        CK(cudaEventRecord(tm.b, s));
        CK(cudaEventSynchronize(tm.b));
        float ms;
        CK(cudaEventElapsedTime(&ms, tm.a, tm.b));
        if (r >= 2) t.push_back(ms * 1000.0f);
      }
      std::sort(t.begin(), t.end());
      const char* hows[] = {"warm", "warm_evict_last", "bulk_prefetch_stay20us"};
      std::printf("{\"bench\": \"l2_hit\", \"weight_mb\": %lld, \"in_l2_mb\": %lld, \"how\": \"%s\", "
                  "\"read_us\": %.2f}\n",
                  (long long)mb, (long long)pmb, pmb ? hows[how] : "none", t[t.size() / 2]);
      std::fflush(stdout);
    }
  }
  // (2) In a graph: S spins then the read; the side arm forks a warm of the first P MB onto a
  // second stream at the site's start and joins it before the read.
  const int64_t spin_ns = 2500;
  for (int S : {4, 8}) {
    for (int64_t pmb : {0, 8, 16, 24, 32}) {
      for (int blocks_w : {16, 32, 64}) {
        if (pmb == 0 && blocks_w > 16) continue;
        const int64_t pb = pmb << 20;
        const double us = graph_site_us(s, side, [&](int i, cudaStream_t st, cudaStream_t sd) {
          const char* p = w[i % kBufs];
          if (pb) {
            CK(cudaEventRecord(fork[i], st));
            CK(cudaStreamWaitEvent(sd, fork[i], 0));
            warm_kernel<<<blocks_w, 256, 0, sd>>>(reinterpret_cast<const int4*>(p), pb / 16, 0, sink);
            CK(cudaEventRecord(join[i], sd));
          }
          for (int j = 0; j < S; ++j) spin_kernel<<<1, 128, 0, st>>>(spin_ns, nullptr, 0, sink);
          if (pb) CK(cudaStreamWaitEvent(st, join[i], 0));
          read(st, p);
        });
        std::printf("{\"bench\": \"l2_side_warm\", \"weight_mb\": %lld, \"spins\": %d, \"spin_us\": 2.5, "
                    "\"warm_mb\": %lld, \"warm_blocks\": %d, \"site_us\": %.2f}\n",
                    (long long)mb, S, (long long)pmb, blocks_w, us);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
