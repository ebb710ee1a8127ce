// The model's head after the last block (the expand + head + norm form of the mhc entry,
// cuda_abi/mhc.h): rms_norm(hc_head_mean(mhc_post(y, post, comb, residual)), w, eps) in one
// launch with the bytes of the three ops (cuda/mhc_post.cu, cuda/basic.cu), which run instead
// for hc > 8 or D > 4096.
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "mhc.cuh"
#include "row_group.cuh"

using memra::cuda::enter;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
using memra::cuda::rowsum::Group;
using memra::cuda::rowsum::group_for;
using memra::cuda::rowsum::kGatedCols;
using memra::cuda::rowsum::load_row_cols;
using memra::cuda::rowsum::rms_norm_cols;
using memra::cuda::rowsum::row_blocks;
using memra::cuda::rowsum::with_group;

namespace {

// The model's head at the last block (the expand + head + norm form): out[t] =
// rms_norm(hc_head_mean(mhc_post(y, post, comb, residual))[t], w, eps), one block per row of
// Group<G> threads (G = group_for(D), D <= kGatedCols * G): thread g's columns g + G c hold the
// hc stream values (mhc_post_kernel's arithmetic), their mean (hc_head_mean_kernel's) and then
// rms_norm_row's short form over them, so out has the bytes of the three launches in one, and
// the expanded streams never go to memory (two launches fewer on the decode step's critical path
// before the LM head).
constexpr int kHeadMaxHc = 8;

template <int G>
__global__ void __launch_bounds__(Group<G>::kBlock)
    mhc_head_norm_kernel(const float* __restrict__ y, const float* __restrict__ post,
                         const float* __restrict__ comb, const float* __restrict__ residual,
                         int64_t T, int hc, int D, const float* __restrict__ w, float eps,
                         float* __restrict__ out) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  __shared__ float red[Group<G>::kWarps];
  const int64_t t = Group<G>::row(blockIdx.x);
  const int lane = Group<G>::lane();
  const bool live = t < T;
  const int64_t tt = live ? t : 0;
  const float* ct = comb + tt * hc * hc;
  const float* pt = post + tt * hc;
  const float* rt = residual + tt * hc * D;
  float mean[kGatedCols], wv[kGatedCols];
  load_row_cols<G>(w, live, lane, D, wv);
#pragma unroll
  for (int c = 0; c < kGatedCols; ++c) {
    const int d = lane + G * c;
    mean[c] = 0.0f;
    if (!live || d >= D) continue;
    float r[kHeadMaxHc];
#pragma unroll
    for (int i = 0; i < kHeadMaxHc; ++i) r[i] = i < hc ? rt[int64_t(i) * D + d] : 0.0f;
    const float yv = y[tt * D + d];
    float acc_mean = 0.0f;
    for (int j = 0; j < hc; ++j) {
      float acc = 0.0f;  // mhc_post_kernel: sum over i ascending, then post * y + it
#pragma unroll
      for (int i = 0; i < kHeadMaxHc; ++i) {
        if (i < hc) acc = __fadd_rn(acc, __fmul_rn(ct[i * hc + j], r[i]));
      }
      acc_mean += __fadd_rn(__fmul_rn(pt[j], yv), acc);  // hc_head_mean_kernel: s ascending
    }
    mean[c] = acc_mean / static_cast<float>(hc);
  }
  rms_norm_cols<G>(mean, wv, w != nullptr, live, lane, D, eps, red, out + tt * D);
}

}  // namespace

namespace memra::cuda::mhc {

int post_head_norm_impl(MemraCudaCtx* ctx, const float* y, const float* post, const float* comb,
                        const float* residual, int T, int hc, int D, const float* rms_w, float eps,
                        float* out) {
  MEMRA_CUDA_RETURN_IF(enter(ctx));
  if (T < 0 || hc < 1 || D < 0) return memra::kContractValue;
  if (!(eps >= 0.0f) || !std::isfinite(eps)) return memra::kContractValue;
  if (T == 0 || D == 0) return memra::kOk;
  if (!y || !post || !comb || !residual || !out) return memra::kContractMissing;
  const int g = group_for(D);
  if (hc > kHeadMaxHc || D > kGatedCols * g) {  // the three launches
    Scratch buf(ctx, sizeof(float) * (static_cast<size_t>(T) * hc * D + static_cast<size_t>(T) * D));
    MEMRA_CUDA_RETURN_IF(buf.status());
    float* streams = buf.as<float>();
    float* mean = streams + static_cast<size_t>(T) * hc * D;
    MEMRA_CUDA_RETURN_IF(post_impl(ctx, y, post, comb, residual, T, hc, D, streams));
    MEMRA_CUDA_RETURN_IF(memra_cuda_hc_head_mean(ctx, streams, T, hc, D, mean));
    return memra_cuda_rms_norm(ctx, mean, T, D, rms_w, eps, out);
  }
  with_group(g, [&](auto gc) {
    constexpr int G = decltype(gc)::value;
    memra::cuda::launch(ctx, true, mhc_head_norm_kernel<G>, dim3(row_blocks<G>(T)),
                        dim3(Group<G>::kBlock), 0, y, post, comb, residual,
                        static_cast<int64_t>(T), hc, D, rms_w, eps, out);
  });
  return launch_status();
}

}  // namespace memra::cuda::mhc
