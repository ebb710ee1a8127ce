// The MoE router of the CUDA backend (cpp/include/memra/cuda_abi/moe.h `moe_route`): the GPU twin
// of cpu::moe_route and cpu::moe_route_softmax (cpu/moe.cpp; the softmax form in a kernel of its
// own, moe_route_softmax_kernel). Router logits in f32 (SGEMM), then one warp per token: sigmoid
// scores, choice = s + bias, group scores (the CPU's best/second loop), top groups and top_k
// experts by repeated warp argmax over (value desc, id asc), weights from s, the CPU's sequential
// renormalisation, times scaling. Same indices and order as the CPU. At one token, where the
// decode GEMV takes the router, logits and routing run in one launch; at 2..64 tokens of up to 64
// experts another single launch (route_rows_kernel) does both, for either scoring.
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemv.cuh"
#include "gemv_rows.cuh"
#include "linear.cuh"

using memra::cuda::ceil_div;
using memra::cuda::launch_status;
using memra::cuda::Scratch;
namespace grow = memra::cuda::gemv_rows_detail;  // the decode GEMV's row body

namespace {

// Index of the best unflagged entry of v[0, n) by (value desc, index asc); NaN counts as -inf.
// Every lane of the warp returns the same index (xor butterfly over a total order).
__device__ __forceinline__ int warp_argmax_unflagged(const float* v, const unsigned char* flag,
                                                     int n, int lane) {
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int i = lane; i < n; i += 32) {
    if (flag[i]) continue;
    float x = v[i];
    if (isnan(x)) x = -INFINITY;
    if (x > bv || (x == bv && i < bi)) {
      bv = x;
      bi = i;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
  return bi;
}

// The top_k experts by (choose desc, id asc) among those not yet taken (which it flags), in
// order: idx[j] = e_j and w[j] = value[e_j] (norm: divided by the chosen values' sum, added in j
// order, + denom_eps) * scaling, as the CPU computes them. Lane j % 32 keeps the j-th choice
// for j < 32 (mine), so the weights are finished in parallel from registers; lane 0 adds the
// sum. One whole warp calls it.
__device__ __forceinline__ void pick_top_k(const float* choose, const float* value,
                                           unsigned char* taken, int E, int top_k, int norm,
                                           float scaling, float denom_eps,
                                           int32_t* __restrict__ idx, float* __restrict__ w,
                                           int lane) {
  float sum = 0.0f;
  int mine = 0;
  for (int j = 0; j < top_k; ++j) {
    const int e = warp_argmax_unflagged(choose, taken, E, lane);
    if (lane == j) mine = e;
    if (lane == 0) {
      taken[e] = 1;
      idx[j] = e;
      sum = __fadd_rn(sum, value[e]);
    }
    __syncwarp();
  }
  const float denom = __shfl_sync(0xffffffffu, __fadd_rn(sum, denom_eps), 0);
  for (int j = lane; j < top_k; j += 32) {
    // j >= 32 (top_k > 32): the choice read back from idx, which lane 0 wrote above.
    float v = value[j < 32 ? mine : idx[j]];
    if (norm) v = __fdiv_rn(v, denom);
    w[j] = __fmul_rn(v, scaling);
  }
}

struct RouteLayout {
  int floats_bytes;  // scores[E], choice[E], group_score[G] (f32), rounded up to 16
  int warp_bytes;    // + taken[E], kept[G] (bytes), rounded up to 16
};

RouteLayout route_layout(int E, int G) {
  RouteLayout l;
  l.floats_bytes = ((4 * (2 * E + G)) + 15) / 16 * 16;
  l.warp_bytes = l.floats_bytes + ((E + G) + 15) / 16 * 16;
  return l;
}

// One token's routing by one whole warp (lane `lane`): lt [E] its logits, base its warp_bytes of
// shared memory; idx, w [top_k] its choices. Load: LOAD_CG reads lt through L2 (other blocks'
// stores of the same launch).
template <bool LOAD_CG>
__device__ __forceinline__ void route_token(const float* lt, const float* __restrict__ bias, int E,
                                            int top_k, int G, int topk_group, int norm,
                                            float scaling, const RouteLayout& layout,
                                            unsigned char* base, int32_t* __restrict__ idx,
                                            float* __restrict__ w, int lane) {
  float* scores = reinterpret_cast<float*>(base);
  float* choice = scores + E;
  float* group_score = choice + E;
  unsigned char* taken = base + layout.floats_bytes;
  unsigned char* kept = taken + E;
  const int per_group = E / G;
  const float neg_inf = -INFINITY;

  for (int e = lane; e < E; e += 32) {
    const float l = LOAD_CG ? __ldcg(lt + e) : lt[e];
    const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-l)));
    scores[e] = s;
    choice[e] = bias ? __fadd_rn(s, bias[e]) : s;
    taken[e] = 0;
  }
  for (int g = lane; g < G; g += 32) kept[g] = 0;
  __syncwarp();
  // Group-limited routing only when it can drop a group: with topk_group == G every group is
  // kept and the group scores choose nothing (GLM-5.3: G = 1), so their serial loop is skipped.
  if (topk_group < G) {
    // Group score: the sum of the two largest choice scores (the CPU's loop, verbatim).
    for (int g = lane; g < G; g += 32) {
      const float* c = choice + static_cast<int64_t>(g) * per_group;
      float best = neg_inf, second = neg_inf;
      for (int i = 0; i < per_group; ++i) {
        if (c[i] > best) {
          second = best;
          best = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group_score[g] = per_group >= 2 ? __fadd_rn(best, second) : best;
    }
    __syncwarp();
    for (int r = 0; r < topk_group; ++r) {
      const int g = warp_argmax_unflagged(group_score, kept, G, lane);
      if (lane == 0) kept[g] = 1;
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32) {
      if (!kept[e / per_group]) choice[e] = neg_inf;
    }
    __syncwarp();
  }
  // The unbiased scores weigh the choice: the bias only chooses.
  pick_top_k(choice, scores, taken, E, top_k, norm, scaling, 1e-20f, idx, w, lane);
}

// One warp per token; each warp owns warp_bytes of dynamic shared memory. No __syncthreads, so a
// warp past the last token may return at once.
__global__ void moe_route_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                                 int T, int E, int top_k, int G, int topk_group, int norm,
                                 float scaling, RouteLayout layout, int32_t* __restrict__ topk_idx,
                                 float* __restrict__ topk_w) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (t >= T) return;
  route_token<false>(logits + t * E, bias, E, top_k, G, topk_group, norm, scaling, layout,
                     smem + static_cast<size_t>(warp) * layout.warp_bytes, topk_idx + t * top_k,
                     topk_w + t * top_k, lane);
}

// The router and the routing of one token in one launch (memra_cuda_moe_route at T == 1 where the
// decode GEMV takes the router: f32 gate_w [E, D] and x, 16-byte aligned, D % 4 == 0): block e
// computes logit e as the router's GEMV launch does
// (gemv_rows, one row a block: the same bits) into logits [E]; the block that finishes last runs
// moe_route_kernel's warp on them. A deferred Sinkhorn rides in block 0, as on the GEMV.
template <int P>
__global__ void __launch_bounds__(grow::kGemvThreads)
    route_decode_kernel(const float* __restrict__ x, const float* __restrict__ gate_w, int D,
                        const float* __restrict__ bias, int E, int top_k, int G, int topk_group,
                        int norm, float scaling, RouteLayout layout, float* __restrict__ logits,
                        unsigned* __restrict__ ticket, int32_t* __restrict__ topk_idx,
                        float* __restrict__ topk_w, int prefetch, memra::cuda::SinkTask task) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (task.comb && blockIdx.x == 0) return memra::cuda::run_sink_task(task);
  const int e = blockIdx.x - (task.comb ? 1 : 0);
  grow::gemv_rows<float, float, 1, P>(x, gate_w, D, E, nullptr, logits, prefetch, e);
  if (!memra::cuda::last_block(ticket, static_cast<unsigned>(E))) return;
  if (threadIdx.x < 32) {
    route_token<true>(logits, bias, E, top_k, G, topk_group, norm, scaling, layout, smem, topk_idx,
                      topk_w, threadIdx.x);
  }
}

// The softmax router's routing of one token by one whole warp (MEMRA_MOE_SCORE_SOFTMAX): lt [E]
// its logits, base its warp_bytes of shared memory (probs_bytes of f32 probabilities, then E
// flags); idx, w [top_k] its choices. p = exp(l - max) / sum (every lane holds the same max and
// sum: xor butterflies), then top_k by (p desc, id asc) as route_token chooses, lane 0 adding the
// chosen p in j order for the renormalisation.
__device__ __forceinline__ void route_token_softmax(const float* lt, int E, int top_k, int norm,
                                                    float scaling, int probs_bytes,
                                                    unsigned char* base,
                                                    int32_t* __restrict__ idx,
                                                    float* __restrict__ w, int lane) {
  float* probs = reinterpret_cast<float*>(base);
  unsigned char* taken = base + probs_bytes;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lt[e]);
  mx = memra::cuda::warp_max(mx);
  float sum = 0.0f;
  for (int e = lane; e < E; e += 32) {
    const float v = expf(__fsub_rn(lt[e], mx));
    probs[e] = v;
    sum = __fadd_rn(sum, v);
    taken[e] = 0;
  }
  sum = memra::cuda::warp_sum(sum);
  __syncwarp();
  for (int e = lane; e < E; e += 32) probs[e] = __fdiv_rn(probs[e], sum);
  __syncwarp();
  pick_top_k(probs, probs, taken, E, top_k, norm, scaling, 0.0f, idx, w, lane);  // sum + 0: the sum
}

// The softmax routing of logits [T, E] f32, one token a warp, each warp owning warp_bytes of the
// dynamic shared memory (route_token_softmax). No __syncthreads, so a warp past the last token
// may return at once. A kernel of its own: the sigmoid router's kernels are not touched.
__global__ void moe_route_softmax_kernel(const float* __restrict__ logits, int T, int E, int top_k,
                                         int norm, float scaling, int probs_bytes, int warp_bytes,
                                         int32_t* __restrict__ topk_idx,
                                         float* __restrict__ topk_w) {
  memra::cuda::pdl_wait();  // launched as a programmatic dependent (common.cuh)
  memra::cuda::pdl_trigger();
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (t >= T) return;
  route_token_softmax(logits + t * E, E, top_k, norm, scaling, probs_bytes,
                      smem + static_cast<size_t>(warp) * warp_bytes, topk_idx + t * top_k,
                      topk_w + t * top_k, lane);
}

// ---- The router and the routing of 2..kRowsMaxT tokens in one launch (f32 x and gate_w with
// 16-byte aligned rows, D % 4 == 0), either scoring. cuBLAS's SGEMM ran the router's logits at
// these shapes (N = E, a few dozen rows) in one CTA, ~5 us at GLM's D = 4096 whatever the GPU's
// size, and the routing took a second launch. Grid (K splits x expert tiles, token tiles) of
// kRowsThreads threads: a thread owns one float4 of its split's kRowsK columns for the tile's
// kRowsT tokens and kRowsE experts; the 32 dot products (x.x w.x + x.y w.y + x.z w.z + x.w w.w,
// fused in that order) cross the warp in one transposed butterfly (warp_sum32_transposed), then
// the block's warps in order, into the split's partial logit. The last block of a token tile to
// arrive (memra::cuda::last_block on the tile's ticket) adds the splits in order into its tokens'
// logits in shared memory and routes them, a warp a token (route_token / route_token_softmax).
// Every sum's order depends on D alone, so a token's logits do not depend on T (within 2..64) or
// on the other tokens of the call; T = 1 and T > 64 sum in other orders.
// Up to kRowsMaxE experts: each token tile reads all of gate_w and each expert tile all of x, so
// the L2 moves ~1.5 T E D bytes (6 MB at the bench model's T = 32, E = 32, D = 4096, 57 MB with
// GLM-5.3-Flash's 288 experts); wider routers keep the SGEMM until a tile with more reuse has
// been measured against it.
constexpr int kRowsT = 4;                 // tokens a tile
constexpr int kRowsE = 8;                 // experts a tile: kRowsT * kRowsE = 32 sums a warp
constexpr int kRowsThreads = 256;
constexpr int kRowsWarps = kRowsThreads / 32;
constexpr int kRowsK = 4 * kRowsThreads;  // K columns a split: one float4 a thread
constexpr int kRowsMaxT = kRowsT * memra::cuda::kRouteRowsTiles;
constexpr int kRowsMaxE = 64;
constexpr int kRowsStaticSmem = 2048;     // red below and last_block's flag, rounded up
static_assert(kRowsT * kRowsE == 32, "one transposed warp sum covers a tile");
static_assert(kRowsT <= kRowsWarps, "a warp routes each token of a tile");

struct RowsArgs {
  const float* x;       // [T, D] f32
  const float* gate_w;  // [E, D] f32
  const float* bias;    // [E] f32 or null (sigmoid: added to the scores to choose)
  float* part;          // [S, T, E] f32 scratch: split s's partial logits, S = ceil(D / kRowsK)
  unsigned* tickets;    // [ceil(T / kRowsT)] arrival counters, zero between launches
  int32_t* topk_idx;    // [T, top_k]
  float* topk_w;        // [T, top_k]
  int T, D, E, top_k;
  int G, topk_group;    // sigmoid: expert groups, and the groups kept
  int norm;             // 1: the chosen weights renormalised to sum 1
  float scaling;        // the weights' factor
  RouteLayout layout;   // sigmoid: the parts of a warp's routing bytes
  int probs_bytes;      // softmax: a warp's probability bytes (then E flags)
  int warp_bytes;       // a warp's routing bytes (either scoring)
  int prefetch;         // 1: gate_w loaded before pdl_wait (no queued kernel writes it)
};

// The finishing block's shared memory: the tile's logits [kRowsT, E] f32, then a warp's routing
// bytes for each of its tokens.
__host__ __device__ inline size_t rows_lt_bytes(int E) {
  return (sizeof(float) * kRowsT * static_cast<size_t>(E) + 15) / 16 * 16;
}

template <bool SOFTMAX>
__global__ void __launch_bounds__(kRowsThreads, 1) route_rows_kernel(RowsArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[kRowsWarps][32];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int S = (a.D + kRowsK - 1) / kRowsK;
  const int split = static_cast<int>(blockIdx.x) % S;
  const int e0 = static_cast<int>(blockIdx.x) / S * kRowsE;
  const int t0 = static_cast<int>(blockIdx.y) * kRowsT;
  const int k = split * kRowsK + 4 * tid;
  const bool kin = k < a.D;  // D % 4 == 0: a thread's four columns are all in or all out
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 wv[kRowsE];
  auto load_w = [&] {
#pragma unroll
    for (int r = 0; r < kRowsE; ++r) {
      wv[r] = kin && e0 + r < a.E
                  ? *reinterpret_cast<const float4*>(a.gate_w + int64_t(e0 + r) * a.D + k)
                  : zero;
    }
  };
  if (a.prefetch) load_w();
  memra::cuda::pdl_wait();  // x belongs to the stream's earlier work
  memra::cuda::pdl_trigger();
  if (!a.prefetch) load_w();
  float4 xv[kRowsT];
#pragma unroll
  for (int t = 0; t < kRowsT; ++t) {
    xv[t] = kin && t0 + t < a.T
                ? *reinterpret_cast<const float4*>(a.x + int64_t(t0 + t) * a.D + k)
                : zero;
  }
  float p[32];  // p[t * kRowsE + r]: token t0 + t against expert e0 + r
#pragma unroll
  for (int t = 0; t < kRowsT; ++t) {
#pragma unroll
    for (int r = 0; r < kRowsE; ++r) {
      const float4 u = xv[t], v = wv[r];
      p[t * kRowsE + r] = fmaf(u.w, v.w, fmaf(u.z, v.z, fmaf(u.y, v.y, u.x * v.x)));
    }
  }
  red[warp][lane] = memra::cuda::warp_sum32_transposed(p, lane);
  __syncthreads();
  if (tid < 32) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowsWarps; ++i) acc += red[i][tid];
    const int t = t0 + tid / kRowsE, e = e0 + tid % kRowsE;
    if (t < a.T && e < a.E) a.part[(int64_t(split) * a.T + t) * a.E + e] = acc;
  }
  if (!memra::cuda::last_block(a.tickets + blockIdx.y, gridDim.x)) return;
  // The tile's logits: the splits' partials added in split order (other blocks' stores: L2).
  float* lt = reinterpret_cast<float*>(smem);
  const int nt = a.T - t0 < kRowsT ? a.T - t0 : kRowsT;
  for (int i = tid; i < nt * a.E; i += kRowsThreads) {
    const int t = i / a.E, e = i - t * a.E;
    float acc = 0.0f;
    for (int s = 0; s < S; ++s) acc += __ldcg(a.part + (int64_t(s) * a.T + t0 + t) * a.E + e);
    lt[i] = acc;
  }
  __syncthreads();
  if (warp >= nt) return;
  const int64_t t = t0 + warp;
  unsigned char* base = smem + rows_lt_bytes(a.E) + static_cast<size_t>(warp) * a.warp_bytes;
  if constexpr (SOFTMAX) {
    route_token_softmax(lt + warp * a.E, a.E, a.top_k, a.norm, a.scaling, a.probs_bytes, base,
                        a.topk_idx + t * a.top_k, a.topk_w + t * a.top_k, lane);
  } else {
    route_token<false>(lt + warp * a.E, a.bias, a.E, a.top_k, a.G, a.topk_group, a.norm,
                       a.scaling, a.layout, base, a.topk_idx + t * a.top_k,
                       a.topk_w + t * a.top_k, lane);
  }
}

// Whether route_rows_kernel takes T tokens of x [T, D] against gate_w [E, D] with warp_bytes of
// routing bytes a token.
bool rows_take(const float* x, const float* gate_w, int T, int D, int E, int warp_bytes) {
  const size_t smem = rows_lt_bytes(E) + static_cast<size_t>(kRowsT) * warp_bytes;
  return T >= 2 && T <= kRowsMaxT && E <= kRowsMaxE && D > 0 && D % 4 == 0 &&
         memra::cuda::aligned16(x) && memra::cuda::aligned16(gate_w) &&
         smem + kRowsStaticSmem <= 48 * 1024;
}

// route_rows_kernel's launch; a (filled but for part, tickets and prefetch) passed rows_take.
int route_rows(MemraCudaCtx* ctx, RowsArgs a, bool softmax) {
  // No block of this grid runs a deferred Sinkhorn (one-row sites only leave one).
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_pending(ctx));
  const int S = static_cast<int>(ceil_div(a.D, kRowsK));
  Scratch part(ctx, sizeof(float) * static_cast<size_t>(S) * a.T * a.E);
  MEMRA_CUDA_RETURN_IF(part.status());
  a.part = part.as<float>();
  a.tickets = ctx->tickets + memra::cuda::kTicketMoeRouteRows;
  a.prefetch = ctx->resident_weights > 0 ? 1 : 0;
  const dim3 grid(static_cast<unsigned>(S * ceil_div(a.E, kRowsE)),
                  static_cast<unsigned>(ceil_div(a.T, kRowsT)));
  const size_t smem = rows_lt_bytes(a.E) + static_cast<size_t>(kRowsT) * a.warp_bytes;
  if (softmax) {
    memra::cuda::launch(ctx, true, route_rows_kernel<true>, grid, dim3(kRowsThreads), smem, a);
  } else {
    memra::cuda::launch(ctx, true, route_rows_kernel<false>, grid, dim3(kRowsThreads), smem, a);
  }
  return launch_status();
}

// MEMRA_MOE_SCORE_SOFTMAX and any other scoring but the sigmoid: the checks of moe_route_impl in
// its order, then the scoring's (cpu's op::moe_route has the same), then router logits by the
// f32 linear (the decode GEMV at one token) and moe_route_softmax_kernel.
int moe_route_softmax_impl(MemraCudaCtx* ctx, const MemraMoeRouteParams& p) {
  const int T = p.T, D = p.D, E = p.E;
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, p.x, sizeof(float) * size_t(T > 0 ? T : 0) * size_t(D > 0 ? D : 0)));
  const size_t picks = size_t(T > 0 ? T : 0) * size_t(p.top_k > 0 ? p.top_k : 0);
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, p.topk_idx, sizeof(int32_t) * picks));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, p.topk_w, sizeof(float) * picks));
  if (T < 0 || D < 0 || E <= 0) return memra::kContractValue;
  if (p.n_group < 1 || E % p.n_group != 0) return memra::kContractValue;
  if (p.topk_group < 1 || p.topk_group > p.n_group) return memra::kContractValue;
  if (p.top_k < 1 || static_cast<int64_t>(p.top_k) > static_cast<int64_t>(p.topk_group) * (E / p.n_group))
    return memra::kContractValue;
  if (p.scoring != MEMRA_MOE_SCORE_SOFTMAX) return memra::kContractValue;
  if (p.n_group != 1 || p.corr_bias) return memra::kContractValue;
  if (T == 0) return memra::kOk;
  if (!p.x || !p.gate_w || !p.topk_idx || !p.topk_w) return memra::kContractMissing;
  const int probs_bytes = (4 * E + 15) / 16 * 16;
  const int warp_bytes = probs_bytes + (E + 15) / 16 * 16;
  constexpr int kSmemLimit = 48 * 1024;
  if (warp_bytes > kSmemLimit) return memra::kUnsupportedGeometry;  // E beyond ~9800
  if (rows_take(p.x, p.gate_w, T, D, E, warp_bytes)) {
    RowsArgs a{};
    a.x = p.x;
    a.gate_w = p.gate_w;
    a.topk_idx = p.topk_idx;
    a.topk_w = p.topk_w;
    a.T = T;
    a.D = D;
    a.E = E;
    a.top_k = p.top_k;
    a.norm = p.norm_topk_prob ? 1 : 0;
    a.scaling = p.scaling;
    a.probs_bytes = probs_bytes;
    a.warp_bytes = warp_bytes;
    return route_rows(ctx, a, true);
  }
  int warps = 4;
  while (warps > 1 && warps * warp_bytes > kSmemLimit) warps /= 2;
  Scratch logits(ctx, sizeof(float) * static_cast<size_t>(T) * E);
  MEMRA_CUDA_RETURN_IF(logits.status());
  // Router logits in f32 (transformers computes them in f32): TF32 off.
  MEMRA_CUDA_RETURN_IF(memra::cuda::linear(ctx, p.x, T, D, p.gate_w, 0, E, nullptr, logits.as<float>()));
  memra::cuda::launch(ctx, true, moe_route_softmax_kernel, dim3(ceil_div(T, warps)), dim3(warps * 32),
                      static_cast<size_t>(warps) * warp_bytes, logits.as<float>(), T, E, p.top_k,
                      p.norm_topk_prob ? 1 : 0, p.scaling, probs_bytes, warp_bytes, p.topk_idx,
                      p.topk_w);
  return launch_status();
}

int moe_route_impl(MemraCudaCtx* ctx, const float* x, int T, int D, const float* gate_w,
                   const float* corr_bias, int E, int top_k, int n_group, int topk_group,
                   int norm_topk_prob, float scaling, int32_t* topk_idx, float* topk_w) {
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, x, sizeof(float) * size_t(T > 0 ? T : 0) * size_t(D > 0 ? D : 0)));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, corr_bias, sizeof(float) * size_t(E > 0 ? E : 0)));
  const size_t picks = size_t(T > 0 ? T : 0) * size_t(top_k > 0 ? top_k : 0);
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, topk_idx, sizeof(int32_t) * picks));
  MEMRA_CUDA_RETURN_IF(memra::cuda::flush_if_reads(ctx, topk_w, sizeof(float) * picks));
  if (T < 0 || D < 0 || E <= 0) return memra::kContractValue;
  if (n_group < 1 || E % n_group != 0) return memra::kContractValue;
  if (topk_group < 1 || topk_group > n_group) return memra::kContractValue;
  if (top_k < 1 || static_cast<int64_t>(top_k) > static_cast<int64_t>(topk_group) * (E / n_group))
    return memra::kContractValue;
  if (T == 0) return memra::kOk;
  if (!x || !gate_w || !topk_idx || !topk_w) return memra::kContractMissing;
  const RouteLayout layout = route_layout(E, n_group);
  constexpr int kSmemLimit = 48 * 1024;
  if (layout.warp_bytes > kSmemLimit) return memra::kUnsupportedGeometry;  // E beyond ~5000
  int warps = 4;
  while (warps > 1 && warps * layout.warp_bytes > kSmemLimit) warps /= 2;
  if (rows_take(x, gate_w, T, D, E, layout.warp_bytes)) {
    RowsArgs a{};
    a.x = x;
    a.gate_w = gate_w;
    a.bias = corr_bias;
    a.topk_idx = topk_idx;
    a.topk_w = topk_w;
    a.T = T;
    a.D = D;
    a.E = E;
    a.top_k = top_k;
    a.G = n_group;
    a.topk_group = topk_group;
    a.norm = norm_topk_prob ? 1 : 0;
    a.scaling = scaling;
    a.layout = layout;
    a.warp_bytes = layout.warp_bytes;
    return route_rows(ctx, a, false);
  }

  Scratch logits(ctx, sizeof(float) * static_cast<size_t>(T) * E);
  MEMRA_CUDA_RETURN_IF(logits.status());
  // One token whose router the GEMV's row body takes (not its short-row kernel, whose sums go
  // in another order): router and routing in one launch.
  // (Its static shared memory, the GEMV's partial sums and the ticket flag, comes on top of the
  // routing's warp_bytes.)
  constexpr int kFusedStaticSmem = 256;
  if (T == 1 && memra::cuda::gemv_takes(ctx, x, 0, D, gate_w, 0) &&
      D / 4 > grow::kShortMaxV && layout.warp_bytes + kFusedStaticSmem <= kSmemLimit) {
    // The router GEMV's own check (memra_cuda_linear): a weight that overlaps a pending comb.
    MEMRA_CUDA_RETURN_IF(
        memra::cuda::flush_if_reads(ctx, gate_w, sizeof(float) * size_t(E) * size_t(D)));
    const int KV = D / 4;
    const int prefetch = ctx->resident_weights > 0 ? 1 : 0;
    auto go = [&](auto p) {
      constexpr int P = decltype(p)::value;
      return grow::launch_gemv_smem(
          ctx, route_decode_kernel<P>, E, static_cast<size_t>(layout.warp_bytes), x, gate_w, D,
          corr_bias, E, top_k, n_group, topk_group, norm_topk_prob ? 1 : 0, scaling, layout,
          logits.as<float>(), ctx->tickets + memra::cuda::kTicketMoeRoute, topk_idx, topk_w,
          prefetch);
    };
    if (grow::vectors_per_chunk_thread(KV) == 1) return go(std::integral_constant<int, 1>());
    return go(std::integral_constant<int, grow::kGemvP>());
  }
  // Router logits in f32 (transformers computes them in f32): an SGEMM with TF32 off.
  MEMRA_CUDA_RETURN_IF(memra::cuda::linear(ctx, x, T, D, gate_w, 0, E, nullptr, logits.as<float>()));
  const unsigned blocks = ceil_div(T, warps);
  memra::cuda::launch(ctx, true, moe_route_kernel, dim3(blocks), dim3(warps * 32),
      static_cast<size_t>(warps) * layout.warp_bytes, logits.as<float>(), corr_bias, T, E, top_k,
      n_group, topk_group, norm_topk_prob ? 1 : 0, scaling, layout, topk_idx, topk_w);
  return launch_status();
}

}  // namespace

extern "C" int memra_cuda_moe_route(MemraCudaCtx* ctx, const MemraMoeRouteParams* p) {
  // A deferred mHC Sinkhorn rides on the router's GEMV (common.cuh) unless it reads the comb.
  MEMRA_CUDA_RETURN_IF(memra::cuda::enter_keep(ctx));
  if (!p) return memra::kContractMissing;
  if (p->scoring != MEMRA_MOE_SCORE_SIGMOID) return moe_route_softmax_impl(ctx, *p);
  return moe_route_impl(ctx, p->x, p->T, p->D, p->gate_w, p->corr_bias, p->E, p->top_k, p->n_group,
                        p->topk_group, p->norm_topk_prob, p->scaling, p->topk_idx, p->topk_w);
}
