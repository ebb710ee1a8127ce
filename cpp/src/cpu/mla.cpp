// MLA in the absorbed form: q absorption, v decompression, causal and gathered attention over the
// latent cache (cpu/mla.h). Reference: Glm5NextTextAttention (expand_kv + eager attention), which
// expands k = W_uk c and v = W_uv c per head; the absorbed form folds W_uk into q and W_uv into the
// output, so the cache stays one latent row per token shared by all heads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "memra/cpu/mla.h"

namespace memra::cpu {

namespace {

// One (query, head) of attention over the cache rows rows[0..n): softmax in f32 with the max
// subtracted, o = sum_j p_j c_j / sum_j p_j. q_lat [R]; q_pe [d_rope] or nullptr;
// cache [*, R + d_rope]; p [n] scratch; o [R]. n == 0 gives o = 0.
void attend_rows(const float* q_lat, const float* q_pe, const float* cache, int R, int d_rope,
                 const int32_t* rows, int n, float scale, float* p, float* o) {
  std::fill(o, o + R, 0.0f);
  if (n == 0) return;
  const int64_t W = static_cast<int64_t>(R) + d_rope;
  float m = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const float* c = cache + rows[j] * W;
    float s = 0.0f;
    for (int r = 0; r < R; ++r) s += q_lat[r] * c[r];
    for (int e = 0; e < d_rope; ++e) s += q_pe[e] * c[R + e];
    p[j] = s * scale;
    m = std::max(m, p[j]);
  }
  float l = 0.0f;
  for (int j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - m);
    l += p[j];
  }
  for (int j = 0; j < n; ++j) {
    const float* c = cache + rows[j] * W;
    for (int r = 0; r < R; ++r) o[r] += p[j] * c[r];
  }
  const float inv = 1.0f / l;  // l >= 1: the max row contributes exp(0)
  for (int r = 0; r < R; ++r) o[r] *= inv;
}

}  // namespace

void mla_absorb_q(const float* q_nope, const WeightView& kv_b, int T, int H, int d_nope, int d_v,
                  float* q_lat) {
  const int64_t R = kv_b.cols;
  std::fill(q_lat, q_lat + static_cast<int64_t>(T) * H * R, 0.0f);
  std::vector<float> row(static_cast<size_t>(R));
  // Weight-row outer loop (each W_uk row converted once per call): q_lat[t,h,:] accumulates
  // q_nope[t,h,n] * W_uk[h][n,:] over n ascending.
  for (int h = 0; h < H; ++h) {
    for (int n = 0; n < d_nope; ++n) {
      kv_b.row_f32(static_cast<int64_t>(h) * (d_nope + d_v) + n, row.data());
      for (int t = 0; t < T; ++t) {
        const float a = q_nope[(static_cast<int64_t>(t) * H + h) * d_nope + n];
        float* out = q_lat + (static_cast<int64_t>(t) * H + h) * R;
        for (int64_t r = 0; r < R; ++r) out[r] += a * row[r];
      }
    }
  }
}

void mla_decompress_v(const float* o_lat, const WeightView& kv_b, int T, int H, int d_nope, int d_v,
                      float* out) {
  const int64_t R = kv_b.cols;
  std::vector<float> row(static_cast<size_t>(R));
  for (int h = 0; h < H; ++h) {
    for (int v = 0; v < d_v; ++v) {
      kv_b.row_f32(static_cast<int64_t>(h) * (d_nope + d_v) + d_nope + v, row.data());
      for (int t = 0; t < T; ++t) {
        const float* o = o_lat + (static_cast<int64_t>(t) * H + h) * R;
        float acc = 0.0f;
        for (int64_t r = 0; r < R; ++r) acc += row[r] * o[r];
        out[(static_cast<int64_t>(t) * H + h) * d_v + v] = acc;
      }
    }
  }
}

Status mla_attn_absorbed(const float* q_lat, const float* q_pe, const float* cache, int H, int R,
                         int d_rope, int t_q, int t_kv, float scale, float* o_lat) {
  if (t_q > t_kv) {
    return Status(kContractQuerySuffix,
                  "mla_attn_absorbed: the queries must be the last rows of the cache, got t_q=" +
                      std::to_string(t_q) + " > t_kv=" + std::to_string(t_kv));
  }
  std::vector<int32_t> rows(static_cast<size_t>(t_kv));
  for (int j = 0; j < t_kv; ++j) rows[j] = j;
  std::vector<float> p(static_cast<size_t>(t_kv));
  for (int i = 0; i < t_q; ++i) {
    const int n = t_kv - t_q + i + 1;  // query i sits at row t_kv - t_q + i and sees rows <= it
    for (int h = 0; h < H; ++h) {
      const int64_t qh = static_cast<int64_t>(i) * H + h;
      attend_rows(q_lat + qh * R, q_pe ? q_pe + qh * d_rope : nullptr, cache, R, d_rope,
                  rows.data(), n, scale, p.data(), o_lat + qh * R);
    }
  }
  return Status::Ok();
}

Status mla_attn_gathered(const float* q_lat, const float* q_pe, const float* cache,
                         const int32_t* idx, int H, int R, int d_rope, int t_q, int t_kv,
                         int width, float scale, float* o_lat) {
  if (t_q > t_kv) {
    return Status(kContractQuerySuffix,
                  "mla_attn_gathered: the queries must be the last rows of the cache, got t_q=" +
                      std::to_string(t_q) + " > t_kv=" + std::to_string(t_kv));
  }
  // Validate every entry before writing anything. The reference ANDs the list's mask with the
  // causal one, so a row after the query's own is never attended: refused, as CUDA refuses it.
  for (int64_t e = 0; e < static_cast<int64_t>(t_q) * width; ++e) {
    const int32_t r = idx[e];
    const int64_t row = static_cast<int64_t>(t_kv) - t_q + e / width;  // the query's own row
    if (r < -1 || r >= t_kv || r > row) {
      return Status(kContractRange, "mla_attn_gathered: index " + std::to_string(r) +
                                        " at query " + std::to_string(e / width) + ", entry " +
                                        std::to_string(e % width) +
                                        (r > row && r < t_kv
                                             ? " is after the query's row " + std::to_string(row)
                                             : " is outside [0, t_kv=" + std::to_string(t_kv) +
                                                   ") and is not the padding value -1"));
    }
  }
  // transformers turns the list into a mask (build_attention_mask_from_topk), so a row listed
  // twice counts once: rows are marked with the query number and kept on first sight.
  std::vector<int> seen(static_cast<size_t>(t_kv), -1);
  std::vector<int32_t> rows(static_cast<size_t>(width));
  std::vector<float> p(static_cast<size_t>(width));
  for (int i = 0; i < t_q; ++i) {
    int n = 0;
    for (int e = 0; e < width; ++e) {
      const int32_t r = idx[static_cast<int64_t>(i) * width + e];
      if (r < 0 || seen[r] == i) continue;
      seen[r] = i;
      rows[n++] = r;
    }
    // Ascending rows: the sums then run in the same order as the causal walk.
    std::sort(rows.begin(), rows.begin() + n);
    for (int h = 0; h < H; ++h) {
      const int64_t qh = static_cast<int64_t>(i) * H + h;
      attend_rows(q_lat + qh * R, q_pe ? q_pe + qh * d_rope : nullptr, cache, R, d_rope,
                  rows.data(), n, scale, p.data(), o_lat + qh * R);
    }
  }
  return Status::Ok();
}

}  // namespace memra::cpu
