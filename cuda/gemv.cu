// The decode GEMV behind the linear entry (cuda/linear.cu) at T = 1 row (kGemvMaxT):
// y[1, N] = x[1, K] w[N, K]^T (+ bias[N]) with w bf16 (x f32 rounded to bf16 in registers, RNE,
// or x already bf16) or w f32 (x f32), f32 accumulation and f32 output -- cpu::linear's
// arithmetic on the same rounded inputs, summed in another order (as cuBLAS' is).
//
// Why not cuBLAS at T = 1: a decode step is a chain of weight-streaming GEMMs between small
// latency-bound kernels. cuBLAS picks split-K kernels plus a reduction launch for the tall-K
// shapes, needs a separate rounding launch for an f32 x, and cannot start before the previous
// kernel ends. This kernel reads each weight byte once with 16-byte streaming loads, rounds x
// itself, and when the weights are resident (uploaded layer weights,
// MemraCudaCtx::resident_weights) issues its first weight loads *before* waiting for the
// previous kernel (programmatic dependent launch): the weight stream overlaps the norm /
// activation / mHC kernel in front of it. benchmarks/bench_gemv.py measures it against cuBLAS
// (KernelOptions::gemv = false) in the same run; docs/decode_graphs.md has the figures.
//
// Layout (rows of more than 32 vectors; gemv_short_kernel below takes the shorter ones): a block
// of kGemvThreads threads owns R consecutive weight rows over the whole K, many blocks per SM
// and several waves, so the scheduler evens out SMs that start late. Thread i reads
// the 16-byte vectors i, i + 256, i + 512, ... of each row (a warp reads 512 contiguous bytes),
// one per row in flight per chunk (P = 1: 4 blocks an SM at <= 64 registers), and keeps R
// partial sums; a warp butterfly, then the 8 warps in order in shared memory, give each output.
// That order is fixed by K alone: the bytes do not depend on R, the run, or programmatic launch.
#include "gemv.cuh"
#include "gemv_rows.cuh"
#include "sinkhorn.cuh"

#include <cstdint>
#include <type_traits>

using memra::cuda::aligned16;
using memra::cuda::launch;
using memra::cuda::pdl_trigger;
using memra::cuda::pdl_wait;
using memra::cuda::run_sink_task;
using memra::cuda::settle_pending;
using memra::cuda::SinkTask;
using memra::cuda::take_pending;
using memra::cuda::warp_sum;
using namespace memra::cuda::gemv_rows_detail;

namespace {

// P: 16-byte vectors a thread reads per row and chunk (gemv_rows.cuh; every GEMV launches 1);
// MB: the resident blocks an SM its registers are sized for (4: 64 registers at R = 8).
template <typename W, typename X, int R, int P, int MB>
__global__ void __launch_bounds__(kGemvThreads, MB)
    gemv_kernel(const X* __restrict__ x, const W* __restrict__ w, int K, int N,
                const float* __restrict__ bias, float* __restrict__ y, int prefetch,
                SinkTask task) {
  // A deferred Sinkhorn's block comes first (scheduled with the first wave, it overlaps the
  // weight stream instead of trailing the last one).
  if (task.comb && blockIdx.x == 0) return run_sink_task(task);
  gemv_rows<W, X, R, P>(x, w, K, N, bias, y, prefetch, blockIdx.x - (task.comb ? 1 : 0));
}

// A block of a two-problem launch: false for block 0 when a deferred Sinkhorn rides in the launch
// (the caller then runs it); else *bid is the block's index among the problems' blocks and
// *second whether it serves p1 (blocks [0, blocks0) take p0).
__device__ __forceinline__ bool problem_block(const SinkTask& task, int blocks0, int* bid,
                                              bool* second) {
  if (task.comb && blockIdx.x == 0) return false;
  *bid = static_cast<int>(blockIdx.x) - (task.comb ? 1 : 0);
  *second = *bid >= blocks0;
  return true;
}

// Blocks [0, blocks0) take problem p0 and the rest p1: two GEMVs of the same K and dtypes in one
// launch (linear_ex_pair; KDA's q|k|v and f_a|g_a|beta projections of one x), each row computed
// as gemv_kernel computes it (the order depends on K alone).
template <typename W, typename X, int R, int P>
__global__ void __launch_bounds__(kGemvThreads, P == 1 ? 4 : 0)
    gemv_pair_kernel(GemvRows<W, X> p0, GemvRows<W, X> p1, int blocks0, int K, int prefetch,
                     SinkTask task) {
  int bid;
  bool second;
  if (!problem_block(task, blocks0, &bid, &second)) return run_sink_task(task);
  // Field by field (a reference to either parameter struct would copy both to the stack).
  gemv_rows<W, X, R, P>(second ? p1.x : p0.x, second ? p1.w : p0.w, K, second ? p1.N : p0.N,
                     second ? p1.bias : p0.bias, second ? p1.y : p0.y, prefetch,
                     bid - (second ? blocks0 : 0));
}

// Short rows (K <= kShortMaxV vectors): gemv_kernel would leave all but KV of a block's 256
// threads idle and need N / R blocks of almost no work. Here gemv_short_rows (gemv_rows.cuh) at
// 256 threads and one pass: 256 / L rows a block, one load a thread. Chosen by K alone: a row's
// order still depends on K only (not on N or KernelOptions::gemv_rows).
// Blocks [0, blocks0) take problem p0 and the rest p1 (p1.N == 0 for a single GEMV): two GEMVs
// of the same K in one launch (linear_ex_pair) compute each row as a launch of their own would.
template <typename W, typename X, int L>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_short_kernel(GemvRows<W, X> p0, GemvRows<W, X> p1, int blocks0, int K, int prefetch,
                      SinkTask task) {
  int bid;
  bool second;
  if (!problem_block(task, blocks0, &bid, &second)) return run_sink_task(task);
  // Field by field (a reference to either parameter struct would copy both to the stack).
  gemv_short_rows<W, X, L, kGemvThreads, 1>(second ? p1.x : p0.x, second ? p1.w : p0.w,
                                            second ? p1.bias : p0.bias, second ? p1.y : p0.y,
                                            second ? p1.N : p0.N, K, prefetch,
                                            bid - (second ? blocks0 : 0));
}

// f(std::integral_constant<int, R>{}) for the rows a block R (1, 2, 4, 8; others as 8).
template <typename F>
int with_rows(int R, F&& f) {
  switch (R) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

template <typename W, typename X, int L>
int launch_short(MemraCudaCtx* ctx, GemvRows<W, X> p0, GemvRows<W, X> p1, int K, int prefetch) {
  constexpr int kRowsPerBlock = kGemvThreads / L;
  const int blocks0 = (p0.N + kRowsPerBlock - 1) / kRowsPerBlock;
  return launch_gemv(ctx, gemv_short_kernel<W, X, L>,
                     blocks0 + (p1.N + kRowsPerBlock - 1) / kRowsPerBlock, p0, p1, blocks0, K,
                     prefetch);
}

template <typename W, typename X>
int launch_short_any(MemraCudaCtx* ctx, GemvRows<W, X> p0, GemvRows<W, X> p1, int K,
                     int prefetch) {
  const int KV = K / (16 / static_cast<int>(sizeof(W)));
  return with_short_lanes(KV, [&](auto lanes) {
    return launch_short<W, X, decltype(lanes)::value>(ctx, p0, p1, K, prefetch);
  });
}

// Tall rows: more than this many 16-byte vectors (K > 4096 bf16: the o / down projections);
// KernelOptions::gemv_tall_rows sets their rows a block.
constexpr int kTallV = kGemvP * kGemvThreads;

// Weight rows per block (KernelOptions::gemv_rows / gemv_tall_rows override): enough blocks for
// several waves at every N, so that the scheduler evens out SMs that start late (busy with the
// previous kernel).
int rows_for(const MemraCudaCtx* ctx, int N, int KV) {
  const int r = ctx->options.gemv_rows;
  if (r == 1 || r == 2 || r == 4 || r == 8) return r;
  const int t = ctx->options.gemv_tall_rows;
  if (KV > kTallV && (t == 1 || t == 2 || t == 4 || t == 8)) return t;
  return N >= 16384 ? 8 : N >= 2048 ? 4 : N >= 512 ? 2 : 1;
}

// Both problems take the rows per block of their total N (the bytes do not depend on R).
template <typename W, typename X>
int launch_pair(MemraCudaCtx* ctx, GemvRows<W, X> p0, GemvRows<W, X> p1, int K, int prefetch) {
  const int KV = K / (16 / static_cast<int>(sizeof(W)));
  return with_rows(rows_for(ctx, p0.N + p1.N, KV), [&](auto r) {
    constexpr int R = decltype(r)::value;
    const int blocks0 = (p0.N + R - 1) / R;
    return launch_gemv(ctx, gemv_pair_kernel<W, X, R, 1>, blocks0 + (p1.N + R - 1) / R, p0, p1,
                       blocks0, K, prefetch);
  });
}

template <typename W, typename X>
int launch_t(MemraCudaCtx* ctx, const void* x, const void* w, int K, int N, const float* bias,
             float* y, int prefetch) {
  const X* xp = static_cast<const X*>(x);
  const W* wp = static_cast<const W*>(w);
  const int KV = K / (16 / static_cast<int>(sizeof(W)));
  if (KV <= kShortMaxV) {
    const GemvRows<W, X> p0{xp, wp, bias, y, N}, none{xp, wp, nullptr, y, 0};
    return launch_short_any<W, X>(ctx, p0, none, K, prefetch);
  }
  return with_rows(rows_for(ctx, N, KV), [&](auto r) {
    constexpr int R = decltype(r)::value;
    const unsigned blocks = (N + R - 1) / R;
    return launch_gemv(ctx, gemv_kernel<W, X, R, 1, 4>, blocks, xp, wp, K, N, bias, y, prefetch);
  });
}

// The GEMV takes one row of x against w when w is bf16 or f32 (f16: cuBLAS), x is f32 or in w's
// dtype (the callers refuse other pairs), K is a whole number of 16-byte vectors of w, and x and
// w are 16-byte aligned.
bool takes(const MemraCudaCtx* ctx, const void* x, int x_dtype, int K, const void* w, int w_dtype) {
  if (!ctx->options.gemv || K < 1) return false;
  if (w_dtype != 0 && w_dtype != 1) return false;
  if (x_dtype != w_dtype && x_dtype != 0) return false;
  const int E = w_dtype == 1 ? 8 : 4;  // weights per 16-byte vector
  return K % E == 0 && aligned16(w) && aligned16(x);
}

// f(W{}, X{}) with the weight and input element types of a pair takes() accepted.
template <typename F>
int with_types(int w_dtype, int x_dtype, F&& f) {
  if (w_dtype == 0) return f(float{}, float{});
  if (x_dtype == 1) return f(__nv_bfloat16{}, __nv_bfloat16{});
  return f(__nv_bfloat16{}, float{});
}

}  // namespace

namespace memra::cuda {

static_assert(kGemvMaxT == 1, "gemv_kernel computes one row of x (it ignores T and ldx)");

bool gemv_takes(const MemraCudaCtx* ctx, const void* x, int x_dtype, int K, const void* w,
                int w_dtype) {
  return takes(ctx, x, x_dtype, K, w, w_dtype);
}

int gemv(MemraCudaCtx* ctx, const void* x, int x_dtype, int T, int K, const void* w, int w_dtype,
         int N, const float* bias, float* y, bool* handled) {
  *handled = false;
  if (T < 1 || T > kGemvMaxT || N < 1 || !takes(ctx, x, x_dtype, K, w, w_dtype)) return kOk;
  *handled = true;
  const int prefetch = ctx->resident_weights > 0 ? 1 : 0;
  return with_types(w_dtype, x_dtype, [&](auto wt, auto xt) {
    return launch_t<decltype(wt), decltype(xt)>(ctx, x, w, K, N, bias, y, prefetch);
  });
}

int gemv_pair(MemraCudaCtx* ctx, const void* x0, const void* x1, int x_dtype, int K,
              const void* w0, const void* w1, int w_dtype, int N0, int N1, const float* bias0,
              const float* bias1, float* y0, float* y1, bool* handled) {
  *handled = false;
  if (N0 < 1 || N1 < 1 || !takes(ctx, x0, x_dtype, K, w0, w_dtype) ||
      !takes(ctx, x1, x_dtype, K, w1, w_dtype)) {
    return kOk;
  }
  *handled = true;
  const int prefetch = ctx->resident_weights > 0 ? 1 : 0;
  return with_types(w_dtype, x_dtype, [&](auto wt, auto xt) {
    using W = decltype(wt);
    using X = decltype(xt);
    const GemvRows<W, X> p0{static_cast<const X*>(x0), static_cast<const W*>(w0), bias0, y0, N0};
    const GemvRows<W, X> p1{static_cast<const X*>(x1), static_cast<const W*>(w1), bias1, y1, N1};
    if (K / (16 / static_cast<int>(sizeof(W))) <= kShortMaxV) {
      return launch_short_any<W, X>(ctx, p0, p1, K, prefetch);
    }
    return launch_pair<W, X>(ctx, p0, p1, K, prefetch);
  });
}

}  // namespace memra::cuda
