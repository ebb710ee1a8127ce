// Basic ops of the CUDA backend (cpp/include/memra/cuda_abi/basic.h): embedding, the per-row
// norms (RMSNorm, sigmoid-gated RMSNorm, LayerNorm, per-head L2 norm), interleaved RoPE and the
// elementwise sigmoid and add. The GPU twins of cpu/basic.cpp: same formulas and the same operation
// order inside each element; only the row reductions are summed in tree order (f32, relative
// differences ~1e-6 against the sequential CPU sums).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common.cuh"
#include "row_group.cuh"

using memra::cuda::ceil_div;
using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::to_f32;
using memra::cuda::warp_sum;
using memra::cuda::rowsum::Group;
using memra::cuda::rowsum::group_for;
using memra::cuda::rowsum::gated_norm_short_row;
using memra::cuda::rowsum::group_sum;
using memra::cuda::rowsum::layer_norm_row;
using memra::cuda::rowsum::kGatedCols;
using memra::cuda::rowsum::load_row_cols;
using memra::cuda::rowsum::row_blocks;
using memra::cuda::rowsum::rms_norm_cols;
using memra::cuda::rowsum::rms_norm_row;
using memra::cuda::rowsum::row_sum_squares;
using memra::cuda::rowsum::store_rms_cols;
using memra::cuda::rowsum::with_group;

namespace {

template <int G>
__global__ void __launch_bounds__(Group<G>::kBlock)
    rms_norm_kernel(const float* x, int64_t rows, int D, const float* w, float eps, float* y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[Group<G>::kWarps];
  rms_norm_row<G>(x, rows, D, w, eps, y, Group<G>::row(blockIdx.x), Group<G>::lane(), red);
}

// op::add_rms_norm in one launch (the pre-norm residual step between sublayers): sum = x + y,
// then h = rms_norm(sum, w, eps), for rows of at most kGatedCols * G values
// (memra_cuda_add_rms_norm runs the two kernels on longer ones). Each thread adds its columns
// (lane + G c: add_kernel's one f32 sum per element), stores them to sum and norms the row from
// those registers with rms_norm_row's short-form body (rms_norm_cols): the bytes of add_kernel
// followed by rms_norm_kernel over the stored sum, in one launch and one memory round trip
// instead of two launches. Element i is read (x, y), then written (sum, then h) by the same
// thread, so sum may alias x or y and h may alias sum, x or y.
template <int G>
__global__ void __launch_bounds__(Group<G>::kBlock)
    add_rms_norm_kernel(const float* x, const float* y, int64_t rows, int D, const float* w,
                        float eps, float* sum, float* h) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[Group<G>::kWarps];
  const int64_t row = Group<G>::row(blockIdx.x);
  const int lane = Group<G>::lane();
  const bool live = row < rows;
  const int64_t at = (live ? row : 0) * D;
  float xv[kGatedCols], yv[kGatedCols], wv[kGatedCols];
  load_row_cols<G>(x + at, live, lane, D, xv);
  load_row_cols<G>(y + at, live, lane, D, yv);
  load_row_cols<G>(w, live, lane, D, wv);
#pragma unroll
  for (int c = 0; c < kGatedCols; ++c) {
    const int i = lane + G * c;
    xv[c] = __fadd_rn(xv[c], yv[c]);  // zeros past D or on a dead row (load_row_cols)
    if (live && i < D) sum[at + i] = xv[c];
  }
  rms_norm_cols<G>(xv, wv, w != nullptr, live, lane, D, eps, red, h + at);
}

// cpu::rms_norm_gated_sigmoid: y = w * (x * inv) * sigmoid(gate). y may alias x (or gate).
// Rows of at most kGatedCols * G values (every G below 1024, and D <= 4096 at 1024; the KDA
// output norm: 64 heads of 128) load x, gate and w into registers before anything else, so the
// row costs one memory round trip: loaded in the loop, each element's loads waited for the
// previous element's store (y may alias them): a round trip per element.
// Element i is still read before it is written, and the sums and products are the same
// (the row body, gated_norm_short_row, is cuda/row_group.cuh's: the KDA decode scan fuses it).

template <int G>
__global__ void __launch_bounds__(Group<G>::kBlock)
    rms_norm_gated_kernel(const float* x, const float* gate, int64_t rows, int D, const float* w,
                          float eps, float* y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[Group<G>::kWarps];
  const int64_t row = Group<G>::row(blockIdx.x);
  const int lane = Group<G>::lane();
  const bool live = row < rows;
  const float* xr = x + (live ? row : 0) * D;
  const float* gr = gate + (live ? row : 0) * D;
  if (D <= kGatedCols * G) {
    float xv[kGatedCols], sig[kGatedCols], wv[kGatedCols];
    load_row_cols<G>(xr, live, lane, D, xv);
    load_row_cols<G>(gr, live, lane, D, sig);
    load_row_cols<G>(w, live, lane, D, wv);
    gated_norm_short_row<G>(xv, sig, wv, live, lane, D, eps, red, y + (live ? row : 0) * D);
    return;
  }
  const float ss = row_sum_squares<G>(xr, live, lane, D, red);
  if (!live) return;
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  float* yr = y + row * D;
  for (int i = lane; i < D; i += G) {
    const float sig = 1.0f / (1.0f + expf(-gr[i]));
    yr[i] = __fmul_rn(__fmul_rn(w[i], __fmul_rn(xr[i], inv)), sig);
  }
}

template <int G>
__global__ void __launch_bounds__(Group<G>::kBlock)
    layer_norm_kernel(const float* x, int64_t rows, int D, const float* w, const float* b,
                      float eps, float* y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[Group<G>::kWarps];
  layer_norm_row<G>(x, rows, D, w, b, eps, y,
                    Group<G>::row(blockIdx.x), Group<G>::lane(), red);
}

// Up to kNormRows one-row norms in one launch (memra_cuda_norm_rows; the MLA projections' at a
// decode row): block i runs task i's row with that task's group G (group_for(D)), so each row
// gets the bytes of its own rms_norm / layer_norm launch; the block is as wide as the widest
// task's, the other tasks' extra groups are dead rows (they join the barriers only).
constexpr int kNormRows = 3;
struct NormRow {
  const float* x;  // [D]
  const float* w;  // [D] (null: an unweighted RMSNorm)
  const float* b;  // [D]: a LayerNorm; null: an RMSNorm
  float* y;        // [D] (may alias x)
  int D;
  int G;
  float eps;
};
struct NormRows {
  NormRow row[kNormRows];
};

__global__ void __launch_bounds__(1024) norm_rows_kernel(NormRows t) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[32];
  const NormRow& r = t.row[blockIdx.x];
  with_group(r.G, [&](auto g) {
    constexpr int G = decltype(g)::value;
    const int64_t row = threadIdx.x / G;
    const int lane = Group<G>::lane();
    if (r.b) {
      layer_norm_row<G>(r.x, 1, r.D, r.w, r.b, r.eps, r.y, row, lane, red);
    } else {
      rms_norm_row<G>(r.x, 1, r.D, r.w, r.eps, r.y, row, lane, red);
    }
  });
}

// cpu::l2norm_heads in place: v / sqrt(sum(v^2) + eps) per row of d.
template <int G>
__global__ void __launch_bounds__(Group<G>::kBlock)
    l2norm_kernel(float* x, int64_t rows, int d, float eps) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[Group<G>::kWarps];
  const int64_t row = Group<G>::row(blockIdx.x);
  const int lane = Group<G>::lane();
  const bool live = row < rows;
  float* xr = x + (live ? row : 0) * d;
  float ss = 0.0f;
  if (live) {
    for (int i = lane; i < d; i += G) {
      const float v = xr[i];
      ss += v * v;
    }
  }
  ss = group_sum<G>(ss, red);
  if (!live) return;
  const float n = sqrtf(ss + eps);
  for (int i = lane; i < d; i += G) xr[i] = xr[i] / n;
}

// ---------------------------------------------------------------------------------------------
// Embedding: grid (token, column chunk of blockDim.x values); an id outside [0, vocab) gives a
// zero row. A block per chunk, not per token, so that a decode row (one token, D = 4096) costs
// one memory round trip, not D / blockDim.x of them in a row. hc > 1: the row written to hc
// consecutive rows of out, as hc_expand(embedding(...), hc) (the residual streams of a
// hyper-connection model), in the same launch.
template <typename W>
__global__ void embedding_kernel(const W* __restrict__ table, int64_t vocab, int D,
                                 const int32_t* __restrict__ ids, float* __restrict__ out,
                                 int hc) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + t * hc * D;
  const bool valid = id >= 0 && id < vocab;
  const W* r = valid ? table + static_cast<int64_t>(id) * D : table;
  for (int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < D;
       i += int64_t(gridDim.y) * blockDim.x) {
    const float v = valid ? to_f32(r[i]) : 0.0f;
    for (int j = 0; j < hc; ++j) o[int64_t(j) * D + i] = v;
  }
}

// ---------------------------------------------------------------------------------------------
// Interleaved RoPE. The inverse frequencies are computed on the host in double exactly as
// cpu::rope_interleaved does (std::pow(base, -2j / d_rope)) and passed by value (captured with
// the launch in a CUDA graph); pairs past kRopeHostFreqs fall back to the device's pow. The
// angle pos * inv_freq, its cos and sin are taken in double and rounded once to f32, as on the
// CPU. Block (32, 8): x walks the pairs j of one token, y the vectors; grid (T, pairs / 32).

constexpr int kRopeHostFreqs = 256;
struct RopeFreqs {
  double inv_freq[kRopeHostFreqs];
};

__global__ void __launch_bounds__(256)
    rope_kernel(float* x, const int32_t* __restrict__ positions, int n_vec, int d_rope,
                double base, const RopeFreqs freqs) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  const int half = d_rope / 2;
  const int j = blockIdx.y * 32 + threadIdx.x;
  if (j >= half) return;
  const int64_t t = blockIdx.x;
  const double pos = positions[t];
  const double inv_freq =
      j < kRopeHostFreqs ? freqs.inv_freq[j] : pow(base, -2.0 * j / d_rope);
  double sd, cd;
  sincos(pos * inv_freq, &sd, &cd);
  const float c = static_cast<float>(cd), s = static_cast<float>(sd);
  for (int v = threadIdx.y; v < n_vec; v += blockDim.y) {
    float* p = x + (t * n_vec + v) * d_rope + 2 * j;
    const float a = p[0], b = p[1];
    p[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    p[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  }
}

// ---------------------------------------------------------------------------------------------

__global__ void sigmoid_kernel(const float* x, int64_t n, float* y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = 1.0f / (1.0f + expf(-x[i]));
  }
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* y) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = a[i] + b[i];
  }
}

unsigned grid_stride_blocks(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 * 16 ? b : 65535 * 16);
}

}  // namespace

extern "C" {

int memra_cuda_embedding(MemraCudaCtx* ctx, const MemraEmbeddingParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!p) return memra::kContractMissing;
  const int T = p->T, D = p->D, hc = p->hc, table_dtype = p->table_dtype;
  const int64_t vocab = p->vocab;
  const int32_t* ids = p->ids;
  float* out = p->out;
  if (T < 0 || D < 0 || vocab < 0 || hc < 1) return memra::kContractValue;
  if (table_dtype < 0 || table_dtype > 2) return memra::kContractDType;
  if (T == 0 || D == 0) return memra::kOk;
  if (!ids || !out || (!p->table && vocab > 0)) return memra::kContractMissing;
  const int threads = D >= 256 ? 256 : (D >= 128 ? 128 : (D >= 64 ? 64 : 32));
  const int64_t chunks = ceil_div(D, threads);
  const dim3 grid(T, static_cast<unsigned>(chunks < 65535 ? chunks : 65535));
  switch (table_dtype) {
    case 0:
      memra::cuda::launch(ctx, true, embedding_kernel<float>, grid, dim3(threads), 0,
          static_cast<const float*>(p->table), vocab, D, ids, out, hc);
      break;
    case 1:
      memra::cuda::launch(ctx, true, embedding_kernel<__nv_bfloat16>, grid, dim3(threads), 0,
          static_cast<const __nv_bfloat16*>(p->table), vocab, D, ids, out, hc);
      break;
    default:
      memra::cuda::launch(ctx, true, embedding_kernel<__half>, grid, dim3(threads), 0,
          static_cast<const __half*>(p->table), vocab, D, ids, out, hc);
      break;
  }
  return launch_status();
}

int memra_cuda_rms_norm(MemraCudaCtx* ctx, const float* x, int T, int D, const float* w, float eps,
                        float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || D < 0) return memra::kContractValue;
  if (T == 0 || D == 0) return memra::kOk;
  if (!x || !y) return memra::kContractMissing;
  with_group(group_for(D), [&](auto g) {
    constexpr int G = decltype(g)::value;
    memra::cuda::launch(ctx, true, rms_norm_kernel<G>, dim3(row_blocks<G>(T)),
        dim3(Group<G>::kBlock), 0, x, T, D, w, eps, y);
  });
  return launch_status();
}

int memra_cuda_add_rms_norm(MemraCudaCtx* ctx, const MemraAddRmsNormParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!p) return memra::kContractMissing;
  if (p->T < 0 || p->D < 0) return memra::kContractValue;
  if (p->T == 0 || p->D == 0) return memra::kOk;
  if (!p->x || !p->y || !p->sum || !p->h) return memra::kContractMissing;
  const int g = group_for(p->D);
  if (p->D > kGatedCols * g) {  // a long row: the two kernels
    MEMRA_CUDA_RETURN_IF(memra_cuda_add(ctx, p->x, p->y, int64_t(p->T) * p->D, p->sum));
    return memra_cuda_rms_norm(ctx, p->sum, p->T, p->D, p->w, p->eps, p->h);
  }
  with_group(g, [&](auto gc) {
    constexpr int G = decltype(gc)::value;
    memra::cuda::launch(ctx, true, add_rms_norm_kernel<G>, dim3(row_blocks<G>(p->T)),
        dim3(Group<G>::kBlock), 0, p->x, p->y, int64_t(p->T), p->D, p->w, p->eps, p->sum, p->h);
  });
  return launch_status();
}

int memra_cuda_rms_norm_gated_sigmoid(MemraCudaCtx* ctx, const float* x, const float* gate, int T,
                                      int D, const float* w, float eps, float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || D < 0) return memra::kContractValue;
  if (T == 0 || D == 0) return memra::kOk;
  if (!x || !gate || !w || !y) return memra::kContractMissing;
  with_group(group_for(D), [&](auto g) {
    constexpr int G = decltype(g)::value;
    memra::cuda::launch(ctx, true, rms_norm_gated_kernel<G>, dim3(row_blocks<G>(T)),
        dim3(Group<G>::kBlock), 0, x, gate, T, D, w, eps, y);
  });
  return launch_status();
}

int memra_cuda_layer_norm(MemraCudaCtx* ctx, const float* x, int T, int D, const float* w,
                          const float* b, float eps, float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || D < 0) return memra::kContractValue;
  if (T == 0 || D == 0) return memra::kOk;
  if (!x || !w || !b || !y) return memra::kContractMissing;
  with_group(group_for(D), [&](auto g) {
    constexpr int G = decltype(g)::value;
    memra::cuda::launch(ctx, true, layer_norm_kernel<G>, dim3(row_blocks<G>(T)),
        dim3(Group<G>::kBlock), 0, x, T, D, w, b, eps, y);
  });
  return launch_status();
}

int memra_cuda_norm_rows(MemraCudaCtx* ctx, const MemraNormRowsParams* p) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (!p) return memra::kContractMissing;
  const float *x0 = p->x0, *x1 = p->x1, *x2 = p->x2, *w0 = p->w0, *w1 = p->w1, *w2 = p->w2;
  const float* b2 = p->b2;
  float *y0 = p->y0, *y1 = p->y1, *y2 = p->y2;
  const int D0 = p->D0, D1 = p->D1, D2 = p->D2;
  const float eps0 = p->eps0, eps1 = p->eps1, eps2 = p->eps2;
  if (D0 < 0 || D1 < 0 || D2 < 0) return memra::kContractValue;
  // A row is skipped when its x is null or its D is 0 (the ABI's contract); a row that runs
  // needs its y (and row 2 its LayerNorm weight and bias).
  if ((x0 && D0 > 0 && !y0) || (x1 && D1 > 0 && !y1)) return memra::kContractMissing;
  if (x2 && D2 > 0 && (!w2 || !b2 || !y2)) return memra::kContractMissing;
  NormRows t{};
  int n = 0, block = 0;
  auto add = [&](const float* x, int D, const float* w, const float* b, float eps, float* y) {
    if (!x || D == 0) return;
    const int g = group_for(D);
    t.row[n++] = NormRow{x, w, b, y, D, g, eps};
    block = std::max(block, std::max(g, 256));
  };
  add(x0, D0, w0, nullptr, eps0, y0);
  add(x1, D1, w1, nullptr, eps1, y1);
  add(x2, D2, w2, b2, eps2, y2);
  if (n == 0) return memra::kOk;
  memra::cuda::launch(ctx, true, norm_rows_kernel, dim3(n), dim3(block), 0, t);
  return launch_status();
}

int memra_cuda_l2norm_heads(MemraCudaCtx* ctx, float* x, int T, int H, int d, float eps) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || H < 0 || d < 0) return memra::kContractValue;
  const int64_t rows = static_cast<int64_t>(T) * H;
  if (rows == 0 || d == 0) return memra::kOk;
  if (!x) return memra::kContractMissing;
  with_group(group_for(d), [&](auto g) {
    constexpr int G = decltype(g)::value;
    memra::cuda::launch(ctx, true, l2norm_kernel<G>, dim3(row_blocks<G>(rows)),
        dim3(Group<G>::kBlock), 0, x, rows, d, eps);
  });
  return launch_status();
}

int memra_cuda_rope_interleaved(MemraCudaCtx* ctx, float* x, const int32_t* positions, int T,
                                int n_vec, int d_rope, float base) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (d_rope % 2 != 0) return memra::kContractOddRope;
  if (T < 0 || n_vec < 0 || d_rope < 0) return memra::kContractValue;
  if (T == 0 || n_vec == 0 || d_rope == 0) return memra::kOk;
  if (!x || !positions) return memra::kContractMissing;
  const int half = d_rope / 2;
  RopeFreqs freqs;
  for (int j = 0; j < kRopeHostFreqs; ++j) {
    freqs.inv_freq[j] = j < half ? std::pow(static_cast<double>(base), -2.0 * j / d_rope) : 0.0;
  }
  if (ceil_div(half, 32) > 65535) return memra::kUnsupportedGeometry;  // grid.y
  const dim3 grid(static_cast<unsigned>(T), ceil_div(half, 32));
  memra::cuda::launch(ctx, true, rope_kernel, dim3(grid), dim3(dim3(32, 8)), 0, x, positions, n_vec,
      d_rope, static_cast<double>(base), freqs);
  return launch_status();
}

int memra_cuda_sigmoid(MemraCudaCtx* ctx, const float* x, int64_t n, float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (n < 0) return memra::kContractValue;
  if (n == 0) return memra::kOk;
  if (!x || !y) return memra::kContractMissing;
  memra::cuda::launch(ctx, true, sigmoid_kernel, dim3(grid_stride_blocks(n, 256)), dim3(256), 0, x,
      n, y);
  return launch_status();
}

int memra_cuda_add(MemraCudaCtx* ctx, const float* a, const float* b, int64_t n, float* y) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (n <= 0) return memra::kOk;
  const unsigned blocks = std::min<unsigned>(ceil_div(n, 256), 4096u);
  memra::cuda::launch(ctx, true, add_kernel, dim3(blocks), dim3(256), 0, a, b, n, y);
  return launch_status();
}

}  // extern "C"
