// Which form of the KDA decode step (T = 1, 128 x 128 f32 state a head) streams closest to a copy?
// cuda/kda_decode_lines.cu's TABLES / STRIDED kernel (a block = one 32-column quarter of a head,
// 128 threads, 8 float4 of state a lane, ld/st.global.cs, each row quad stored as soon as final)
// measured 0.84 / 0.87 of copy at B = 64 / 256 (64 heads) where fla's fused_recurrent_kda, the
// same tiling in Triton, reached 0.92. This file times that kernel's arithmetic in several forms
// against two copies of the same bytes, so the difference can be pinned on one property:
//   parts     32-column quarters a block (1, 2 or 4: 128, 256 or 512 threads; the quarters of a
//             head then read whole 512-byte rows from one SM)
//   ld        0 ld.global.cs (main), 1 ld.global (default policy), 2 ld.global.L2::256B,
//             3 ld.global.nc.L1::no_allocate
//   st        0 st.global.cs (main), 1 st.global
//   defer     0 each row quad stored in the update loop (main), 1 all stores after o's partials
//   minb      the launch bound's blocks an SM (a register cap), 0 = none
// and two copies: "copy_shaped" (a block of 128 threads moves a quarter plane exactly as the
// kernel does, load all then store all, no arithmetic) and cudaMemcpyAsync of the whole state.
// Every form computes the same operations in the same order as main's, so its o and state must
// equal main's bit for bit (checked; "bits_equal" in each line).
// Standalone: nvcc -O3 -std=c++17 -arch=sm_90a benchmarks/kda_decode_forms.cu -o /tmp/kdf && /tmp/kdf [H]
// (H: heads, default 64; main's kernel is the form "parts=1 ld=2 st=1 defer=0 minb=8").
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "check.h"

constexpr int kDk = 128, kDv = 128, kCols = 32, kWarps = 4;

template <int LD>
__device__ __forceinline__ float4 ld_state(const float* p) {
  float4 x;
  if constexpr (LD == 0) {
    x = __ldcs(reinterpret_cast<const float4*>(p));
  } else if constexpr (LD == 1) {
    asm volatile("ld.global.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w) : "l"(p));
  } else if constexpr (LD == 2) {
    asm volatile("ld.global.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w) : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w) : "l"(p));
  }
  return x;
}

template <int ST>
__device__ __forceinline__ void st_state(float* p, float4 x) {
  if constexpr (ST == 0) {
    __stcs(reinterpret_cast<float4*>(p), x);
  } else {
    *reinterpret_cast<float4*>(p) = x;
  }
}

__device__ __forceinline__ float chain_combine(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 16));
}

template <int PARTS>
__device__ __forceinline__ void part_sync(int part) {
  if constexpr (PARTS == 1) {
    __syncthreads();
  } else {
    switch (part) {  // immediate ids: ptxas then reserves 5 barriers, not all 16
      case 0: asm volatile("bar.sync 1, 128;" ::: "memory"); break;
      case 1: asm volatile("bar.sync 2, 128;" ::: "memory"); break;
      case 2: asm volatile("bar.sync 3, 128;" ::: "memory"); break;
      default: asm volatile("bar.sync 4, 128;" ::: "memory"); break;
    }
  }
}

__device__ __forceinline__ float4 column_sums(const float (*red)[kCols], int cq) {
  const float4 w0 = *reinterpret_cast<const float4*>(&red[0][4 * cq]);
  const float4 w1 = *reinterpret_cast<const float4*>(&red[1][4 * cq]);
  const float4 w2 = *reinterpret_cast<const float4*>(&red[2][4 * cq]);
  const float4 w3 = *reinterpret_cast<const float4*>(&red[3][4 * cq]);
  return make_float4(__fadd_rn(__fadd_rn(w0.x, w1.x), __fadd_rn(w2.x, w3.x)),
                     __fadd_rn(__fadd_rn(w0.y, w1.y), __fadd_rn(w2.y, w3.y)),
                     __fadd_rn(__fadd_rn(w0.z, w1.z), __fadd_rn(w2.z, w3.z)),
                     __fadd_rn(__fadd_rn(w0.w, w1.w), __fadd_rn(w2.w, w3.w)));
}

// q, k, g [B, H, dk]; v, o [B, H, dv]; beta [B, H]; sin, sout [B, H, dk, dv]. Grid B * H * 4 /
// PARTS blocks of 128 PARTS threads; block = (b, h, PARTS consecutive quarters).
template <int PARTS, int LD, int ST, bool DEFER, int MINB>
__global__ void __launch_bounds__(128 * PARTS, MINB) step_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float scale,
    const float* __restrict__ sin, float* __restrict__ sout, float* __restrict__ o) {
  constexpr int kBlockCols = PARTS * kCols;
  __shared__ __align__(16) float vec[3][kDk];
  __shared__ __align__(16) float vcol[kBlockCols];
  __shared__ __align__(16) float red[PARTS][2][kWarps][kCols];
  __shared__ float beta_s;
  const int t = threadIdx.x, tp = t & 127, lane = t & 31, warp = tp >> 5;
  const int cq = lane & 7, e = lane >> 3;
  const int blocks_a_head = 4 / PARTS;
  const int64_t bh = blockIdx.x / blocks_a_head;
  const int part_in_block = t >> 7;
  const int jb = static_cast<int>(blockIdx.x % blocks_a_head) * kBlockCols;
  const int j0 = jb + part_in_block * kCols + 4 * cq;
  const int64_t my_off = bh * kDk * kDv + static_cast<int64_t>(32 * warp + e) * kDv + j0;

  float S[2][4][4];
#pragma unroll
  for (int gl = 0; gl < 2; ++gl) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const float4 x = ld_state<LD>(sin + my_off + static_cast<int64_t>(16 * gl + 4 * m) * kDv);
      S[gl][m][0] = x.x;
      S[gl][m][1] = x.y;
      S[gl][m][2] = x.z;
      S[gl][m][3] = x.w;
    }
  }
  if (t < kDk) {
    vec[0][t] = __ldg(k + bh * kDk + t);
    vec[1][t] = __fmul_rn(__ldg(q + bh * kDk + t), scale);
    vec[2][t] = expf(__ldg(g + bh * kDk + t));
  }
  if (t < kBlockCols) vcol[t] = __ldg(v + bh * kDv + jb + t);
  if (t == 0) beta_s = __ldg(beta + bh);
  __syncthreads();

  float(*const rd)[kWarps][kCols] = red[part_in_block];
  const int r0 = 32 * warp + e;
  float P[4][2];
#pragma unroll
  for (int gl = 0; gl < 2; ++gl) {
    float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int r = r0 + 16 * gl + 4 * m;
      const float kk = vec[0][r], ee = vec[2][r];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        S[gl][m][c] = __fmul_rn(S[gl][m][c], ee);
        ch[c] = __fadd_rn(ch[c], __fmul_rn(S[gl][m][c], kk));
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) P[c][gl] = chain_combine(ch[c]);
  }
  if (e == 0) {
    *reinterpret_cast<float4*>(&rd[0][warp][4 * cq]) =
        make_float4(__fadd_rn(P[0][0], P[0][1]), __fadd_rn(P[1][0], P[1][1]),
                    __fadd_rn(P[2][0], P[2][1]), __fadd_rn(P[3][0], P[3][1]));
  }
  part_sync<PARTS>(part_in_block);
  float d[4];
  {
    const float4 kv = column_sums(rd[0], cq);
    const float4 vv = *reinterpret_cast<const float4*>(&vcol[j0 - jb]);
    const float bb = beta_s;
    d[0] = __fmul_rn(__fsub_rn(vv.x, kv.x), bb);
    d[1] = __fmul_rn(__fsub_rn(vv.y, kv.y), bb);
    d[2] = __fmul_rn(__fsub_rn(vv.z, kv.z), bb);
    d[3] = __fmul_rn(__fsub_rn(vv.w, kv.w), bb);
  }
#pragma unroll
  for (int gl = 0; gl < 2; ++gl) {
    float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int r = r0 + 16 * gl + 4 * m;
      const float kk = vec[0][r], qq = vec[1][r];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        S[gl][m][c] = __fadd_rn(S[gl][m][c], __fmul_rn(kk, d[c]));
        ch[c] = __fadd_rn(ch[c], __fmul_rn(S[gl][m][c], qq));
      }
      if constexpr (!DEFER) {
        st_state<ST>(sout + my_off + static_cast<int64_t>(16 * gl + 4 * m) * kDv,
                     make_float4(S[gl][m][0], S[gl][m][1], S[gl][m][2], S[gl][m][3]));
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) P[c][gl] = chain_combine(ch[c]);
  }
  if (e == 0) {
    *reinterpret_cast<float4*>(&rd[1][warp][4 * cq]) =
        make_float4(__fadd_rn(P[0][0], P[0][1]), __fadd_rn(P[1][0], P[1][1]),
                    __fadd_rn(P[2][0], P[2][1]), __fadd_rn(P[3][0], P[3][1]));
  }
  if constexpr (DEFER) {
#pragma unroll
    for (int gl = 0; gl < 2; ++gl) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        st_state<ST>(sout + my_off + static_cast<int64_t>(16 * gl + 4 * m) * kDv,
                     make_float4(S[gl][m][0], S[gl][m][1], S[gl][m][2], S[gl][m][3]));
      }
    }
  }
  part_sync<PARTS>(part_in_block);
  if (tp < kCols / 4) *reinterpret_cast<float4*>(o + bh * kDv + j0) = column_sums(rd[1], cq);
}

// The kernel's bytes without its arithmetic: a block of 128 threads moves one quarter plane in
// the kernel's lane layout, every load issued before the first store.
__global__ void __launch_bounds__(128, 8) copy_shaped_kernel(const float* __restrict__ sin,
                                                             float* __restrict__ sout) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, cq = lane & 7, e = lane >> 3;
  const int64_t bh = blockIdx.x / 4;
  const int j0 = static_cast<int>(blockIdx.x % 4) * kCols + 4 * cq;
  const int64_t off = bh * kDk * kDv + static_cast<int64_t>(32 * warp + e) * kDv + j0;
  float4 x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = __ldcs(reinterpret_cast<const float4*>(sin + off + (16 * (i >> 2) + 4 * (i & 3)) * kDv));
#pragma unroll
  for (int i = 0; i < 8; ++i) __stcs(reinterpret_cast<float4*>(sout + off + (16 * (i >> 2) + 4 * (i & 3)) * kDv), x[i]);
}

struct Bufs {
  float *q, *k, *v, *g, *beta, *sin, *sout, *o;
  int B, H;
};

template <typename F>
float time_us(F launch, int reps = 20, int rounds = 7) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> ts;
  for (int r = 0; r < rounds; ++r) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1000.0f / reps);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ts[ts.size() / 2];
}

std::vector<float> ref_o, ref_s;

template <int PARTS, int LD, int ST, bool DEFER, int MINB>
void run_form(const Bufs& x, double copy_us, bool first) {
  const size_t ns = size_t(x.B) * x.H * kDk * kDv, no = size_t(x.B) * x.H * kDv;
  const unsigned grid = static_cast<unsigned>(int64_t(x.B) * x.H * 4 / PARTS);
  auto launch = [&] {
    step_kernel<PARTS, LD, ST, DEFER, MINB><<<grid, 128 * PARTS>>>(
        x.q, x.k, x.v, x.g, x.beta, 0.08838834764831845f, x.sin, x.sout, x.o);
  };
  CK(cudaMemset(x.sout, 0, ns * 4));
  launch();
  CK(cudaDeviceSynchronize());
  std::vector<float> o(no), s(ns);
  CK(cudaMemcpy(o.data(), x.o, no * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(s.data(), x.sout, ns * 4, cudaMemcpyDeviceToHost));
  if (first) {
    ref_o = o;
    ref_s = s;
  }
  const bool eq = !std::memcmp(o.data(), ref_o.data(), no * 4) &&
                  !std::memcmp(s.data(), ref_s.data(), ns * 4);
  cudaFuncAttributes fa{};
  CK(cudaFuncGetAttributes(&fa, step_kernel<PARTS, LD, ST, DEFER, MINB>));
  const float us = time_us(launch);
  const double bytes = 2.0 * ns * 4;
  std::printf("{\"bench\": \"kda_decode_forms\", \"B\": %d, \"H\": %d, \"form\": \"parts=%d ld=%d st=%d "
              "defer=%d minb=%d\", \"regs\": %d, \"us\": %.2f, \"TBps\": %.4f, \"frac_of_copy\": %.4f, "
              "\"bits_equal\": %s}\n",
              x.B, x.H, PARTS, LD, ST, DEFER ? 1 : 0, MINB, fa.numRegs, us, bytes / us / 1e6,
              copy_us / us, eq ? "true" : "false");
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  const int H = argc > 1 ? std::atoi(argv[1]) : 64;
  if (H < 1) return 2;
  for (int B : {64, 256}) {
    Bufs x{};
    x.B = B;
    x.H = H;
    const size_t nv = size_t(B) * H * kDk, ns = nv * kDv;
    std::vector<float> h(ns);
    uint32_t seed = 12345u;
    auto rnd = [&] {  // uniform in [-1, 1)
      seed = seed * 1664525u + 1013904223u;
      return (seed >> 8) * (2.0f / 16777216.0f) - 1.0f;
    };
    auto up = [&](float** d, size_t n, float lo, float scale_) {
      for (size_t i = 0; i < n; ++i) h[i] = lo + scale_ * rnd();
      CK(cudaMalloc(d, n * 4));
      CK(cudaMemcpy(*d, h.data(), n * 4, cudaMemcpyHostToDevice));
    };
    up(&x.q, nv, 0.0f, 0.09f);
    up(&x.k, nv, 0.0f, 0.09f);
    up(&x.v, nv, 0.0f, 1.0f);
    up(&x.g, nv, -0.5f, 0.45f);  // log decays in (-0.95, -0.05)
    up(&x.beta, size_t(B) * H, 0.5f, 0.4f);
    up(&x.sin, ns, 0.0f, 0.1f);
    CK(cudaMalloc(&x.sout, ns * 4));
    CK(cudaMalloc(&x.o, size_t(B) * H * kDv * 4));
    const double bytes = 2.0 * ns * 4;
    const float memcpy_us = time_us([&] { CK(cudaMemcpyAsync(x.sout, x.sin, ns * 4, cudaMemcpyDeviceToDevice)); });
    const float shaped_us = time_us([&] { copy_shaped_kernel<<<unsigned(int64_t(B) * H * 4), 128>>>(x.sin, x.sout); });
    std::printf("{\"bench\": \"kda_decode_forms\", \"B\": %d, \"H\": %d, \"form\": \"memcpy\", \"us\": %.2f, \"TBps\": %.4f}\n",
                B, H, memcpy_us, bytes / memcpy_us / 1e6);
    std::printf("{\"bench\": \"kda_decode_forms\", \"B\": %d, \"H\": %d, \"form\": \"copy_shaped\", \"us\": %.2f, \"TBps\": %.4f, \"frac_of_copy\": %.4f}\n",
                B, H, shaped_us, bytes / shaped_us / 1e6, memcpy_us / shaped_us);
    run_form<1, 0, 0, false, 8>(x, memcpy_us, true);  // main's form until session 6: the bits reference
    run_form<1, 1, 0, false, 8>(x, memcpy_us, false);
    run_form<1, 2, 0, false, 8>(x, memcpy_us, false);
    run_form<1, 3, 0, false, 8>(x, memcpy_us, false);
    run_form<1, 0, 1, false, 8>(x, memcpy_us, false);
    run_form<1, 1, 1, false, 8>(x, memcpy_us, false);
    run_form<1, 0, 0, true, 8>(x, memcpy_us, false);
    run_form<1, 0, 0, false, 0>(x, memcpy_us, false);
    run_form<1, 0, 0, false, 6>(x, memcpy_us, false);
    run_form<2, 0, 0, false, 4>(x, memcpy_us, false);
    run_form<4, 0, 0, false, 2>(x, memcpy_us, false);
    run_form<4, 2, 0, false, 2>(x, memcpy_us, false);
    run_form<1, 1, 1, true, 8>(x, memcpy_us, false);  // fla's policies: default, stores last
    run_form<4, 1, 1, false, 2>(x, memcpy_us, false);
    run_form<4, 1, 1, true, 2>(x, memcpy_us, false);
    run_form<1, 2, 1, false, 8>(x, memcpy_us, false);
    run_form<1, 2, 1, true, 8>(x, memcpy_us, false);
    run_form<1, 2, 0, false, 0>(x, memcpy_us, false);
    run_form<1, 2, 0, false, 8>(x, memcpy_us, false);  // main's form until session 7, again: drift within the run
    for (float* p : {x.q, x.k, x.v, x.g, x.beta, x.sin, x.sout, x.o}) CK(cudaFree(p));
  }
  return 0;
}
