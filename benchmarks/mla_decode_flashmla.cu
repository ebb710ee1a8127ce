// The best public peer of memra's MLA decode kernel on the same machine: DeepSeek FlashMLA's
// SM90 dense decode (csrc/sm90/decode/dense: flash_fwd_splitkv_mla_kernel, then
// flash_fwd_mla_combine_kernel for the split sequences), its real code compiled in, called
// through its launchers with raw device pointers exactly as csrc/api/dense_decode.h fills them
// (no torch), at bench_mla_decode.py's shapes: h_q = 64, s_q = 1, h_k = 1, d_v = 512,
// page_block_size = 64, scale = 192**-0.5, every sequence L long in its own contiguous pages.
//
// d_k = 576, not 512: the SM90 dense kernel is built for Config::HEAD_DIM_K = 576 only
// (sm90/decode/dense/config.h; run_flash_splitkv_mla_kernel asserts params.d == 576, and the Q/K
// TMA boxes, the nine 64-column K tiles and the 64*576*2-byte Q barrier are fixed at 576; the
// torch API's "576 or 512" check does not reach it). So each cache row is 512 latent + 64 rope
// columns, 1152 bytes against memra's 1024: `bytes` = B L 576 2 (what FlashMLA must read);
// `bytes_r512` = B L 512 2 is memra's bench's figure for the same (B, L); frac_of_copy uses
// `bytes`, r512_frac_of_copy the 512-column bytes over FlashMLA's time (a like-for-like time
// comparison against memra is flashmla_us against memra_us).
//
// Per shape: inputs from a counter hash on the device (cache ~U[-1, 1] on all 576 columns, q
// ~U[-a, a] with a such that the scaled scores have std ~2); the scheduling metadata once
// (run_get_decoding_sched_meta_kernel with dense_decode.h's arguments: block_size_n 64,
// fixed_overhead_num_blocks 5, no topk; num_sm_parts = max(SMs / h_k / ceil(s_q h_q / h_k / 64),
// 1)); oaccum / lse_accum sized for B + num_sm_parts splits as dense_decode.h does. Then
//   correctness: 2-4 sequences against a host float64 softmax(q k^T scale) v over the same bf16
//     values (v = the first 512 columns of k), max |diff| / max |ref| per sequence, the max over
//     them (`max_rel_err_ref`; exit 1 above 5e-2); `max_abs_err_lse` for FlashMLA's lse (natural
//     log) the same way;
//   timing: CUDA events on one non-blocking stream, 10 warm-up calls, then 50 calls of one
//     event pair each, the median: flashmla_us (splitkv + combine, the pair the API launches; the
//     combine is a programmatic dependent launch), flashmla_splitkv_us, flashmla_combine_us
//     (alone, on the splitkv's partials); flashmla_loop_us: 50 calls back to back between one
//     event pair, per call. The metadata kernel is not timed (a serving engine runs it once a
//     step for all layers).
//   copy yardstick as benchmarks/common.py measure_copy: a 2 GiB device-to-device
//     cudaMemcpyAsync, 10 warm-up, median of 100 (one event pair each), (read + written) / time.
// One JSON line per shape on stdout; progress on stderr.
//
// Build (no GPU needed; FlashMLA and CUTLASS are not copied into memra): FlashMLA
// (github.com/deepseek-ai/FlashMLA) at 9241ae3ef9bac614dd25e45e507e089f888280e0 and CUTLASS
// (github.com/NVIDIA/cutlass, FlashMLA's submodule) at 147f5673d0c1c3dcf66f78d677fd647e4a020219
// extracted outside the repository, e.g. from clones:
//   FLASHMLA=/tmp/peers/FlashMLA; CUTLASS=/tmp/peers/cutlass; mkdir -p $FLASHMLA $CUTLASS
//   git -C <FlashMLA clone> archive 9241ae3ef9bac614dd25e45e507e089f888280e0 | tar -x -C $FLASHMLA
//   git -C <cutlass clone> archive 147f5673d0c1c3dcf66f78d677fd647e4a020219 \
//       include tools/util/include | tar -x -C $CUTLASS
//   nvcc -O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES -DFLASH_MLA_DISABLE_FP16 \
//     -Wno-deprecated-declarations -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ \
//     -U__CUDA_NO_HALF2_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr \
//     --expt-extended-lambda --use_fast_math --ptxas-options=--register-usage-level=10 -lineinfo \
//     -gencode arch=compute_90a,code=sm_90a \
//     -I$FLASHMLA/csrc -I$FLASHMLA/csrc/kerutils/include -I$FLASHMLA/csrc/sm90 \
//     -I$CUTLASS/include -I$CUTLASS/tools/util/include \
//     benchmarks/mla_decode_flashmla.cu \
//     $FLASHMLA/csrc/sm90/decode/dense/instantiations/bf16.cu \
//     $FLASHMLA/csrc/smxx/decode/combine/combine.cu \
//     $FLASHMLA/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu \
//     -o .carry/mla_decode_flashmla
// (setup.py's nvcc flags for sm_90a, less its diagnostics (-v, --warn-on-*, --source-in-ptx)
// and with the fp16 instantiations off, as its FLASH_MLA_DISABLE_FP16 does.)
// Run: .carry/mla_decode_flashmla [B:L ...]   (default 64:4096 8:32768; ~10 s a shape)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include <cutlass/bfloat16.h>

#include "check.h"
#include "params.h"
#include "sm90/decode/dense/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

namespace {

constexpr const char* kFlashMLACommit = "9241ae3ef9bac614dd25e45e507e089f888280e0";
constexpr const char* kCutlassCommit = "147f5673d0c1c3dcf66f78d677fd647e4a020219";

constexpr int kHq = 64, kSq = 1, kHk = 1, kDv = 512, kPage = 64;
constexpr int kD = 576;  // HEAD_DIM_K of the SM90 dense kernel (see the header)
constexpr int kWarmup = 10, kReps = 50;
constexpr int kCopyWarmup = 10, kCopyReps = 100;
constexpr double kMaxRelErr = 5e-2;
const double kScale = 1.0 / std::sqrt(192.0);

__device__ __forceinline__ uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// p[i] = bf16(amp * u), u ~ U[-1, 1) from a hash of (seed, i).
__global__ void fill_uniform(__nv_bfloat16* p, size_t n, uint64_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x2545f4914f6cdd1dull ^ i);
    const float u = float(h >> 40) * (1.0f / 8388608.0f) - 1.0f;  // 24 bits -> [-1, 1)
    p[i] = __float2bfloat16(amp * u);
  }
}

inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median microseconds of `reps` calls of f, one event pair each, after `warmup` calls.
template <class F>
double time_us(cudaStream_t st, F&& f, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) f();
  CK(cudaStreamSynchronize(st));
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(ev[2 * i], st));
    f();
    CK(cudaEventRecord(ev[2 * i + 1], st));
  }
  CK(cudaStreamSynchronize(st));
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    us[i] = 1e3 * ms;
  }
  for (auto& e : ev) CK(cudaEventDestroy(e));
  return median(us);
}

// Microseconds per call of `reps` calls enqueued back to back between one event pair.
template <class F>
double loop_us(cudaStream_t st, F&& f, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) f();
  CK(cudaStreamSynchronize(st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, st));
  for (int i = 0; i < reps; ++i) f();
  CK(cudaEventRecord(e1, st));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return 1e3 * ms / reps;
}

double measure_copy_TBps(cudaStream_t st) {  // benchmarks/common.py measure_copy(2)
  const size_t n = size_t(2) << 30;
  void *src = nullptr, *dst = nullptr;
  CK(cudaMalloc(&src, n));
  CK(cudaMalloc(&dst, n));
  CK(cudaMemsetAsync(src, 1, n, st));
  const double us = time_us(
      st, [&] { CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, st)); }, kCopyWarmup,
      kCopyReps);
  CK(cudaFree(src));
  CK(cudaFree(dst));
  return 2.0 * n / us / 1e6;
}

struct RefErr {
  double rel = 0, lse_abs = 0;
};

// Host float64 reference for the sequences in `seqs`: o[h] = softmax(scale q[h] K^T) K[:, :512],
// lse[h] = log sum exp(scale q[h] K^T). q_h: [B][64][576], k_h: the sequence's L rows of 576.
RefErr check_sequences(const std::vector<int>& seqs, int L, int pages_per_seq, const uint16_t* dq,
                       const uint16_t* dk, const uint16_t* dout, const float* dlse) {
  RefErr worst;
  const unsigned nth = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  for (int b : seqs) {
    std::vector<uint16_t> qh(size_t(kHq) * kD), kh(size_t(L) * kD), oh(size_t(kHq) * kDv);
    std::vector<float> lh(kHq);
    CK(cudaMemcpy(qh.data(), dq + size_t(b) * kHq * kD, qh.size() * 2, cudaMemcpyDeviceToHost));
    // The sequence's pages are b * pages_per_seq ... (contiguous), rows of kD.
    CK(cudaMemcpy(kh.data(), dk + size_t(b) * pages_per_seq * kPage * kD, kh.size() * 2,
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(oh.data(), dout + size_t(b) * kHq * kDv, oh.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lh.data(), dlse + size_t(b) * kHq, kHq * 4, cudaMemcpyDeviceToHost));
    std::vector<float> kf(kh.size());
    for (size_t i = 0; i < kh.size(); ++i) kf[i] = bf16_to_float(kh[i]);
    std::vector<double> ref(size_t(kHq) * kDv), lse(kHq);
    std::atomic<int> next{0};
    auto work = [&] {
      std::vector<double> s(L), qd(kD), o(kDv);
      for (int h; (h = next.fetch_add(1)) < kHq;) {
        for (int c = 0; c < kD; ++c) qd[c] = bf16_to_float(qh[size_t(h) * kD + c]);
        double mx = -INFINITY;
        for (int j = 0; j < L; ++j) {
          const float* kr = &kf[size_t(j) * kD];
          double acc = 0;
          for (int c = 0; c < kD; ++c) acc += qd[c] * kr[c];
          s[j] = acc * kScale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < L; ++j) sum += (s[j] = std::exp(s[j] - mx));
        std::fill(o.begin(), o.end(), 0.0);
        for (int j = 0; j < L; ++j) {
          const float* kr = &kf[size_t(j) * kD];
          const double p = s[j];
          for (int c = 0; c < kDv; ++c) o[c] += p * kr[c];
        }
        for (int c = 0; c < kDv; ++c) ref[size_t(h) * kDv + c] = o[c] / sum;
        lse[h] = mx + std::log(sum);
      }
    };
    std::vector<std::thread> th;
    for (unsigned t = 0; t < nth; ++t) th.emplace_back(work);
    for (auto& t : th) t.join();
    double num = 0, den = 0, lerr = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = std::fabs(double(bf16_to_float(oh[i])) - ref[i]);
      num = (d > num || d != d) ? d : num;  // a NaN must survive
      den = std::max(den, std::fabs(ref[i]));
    }
    for (int h = 0; h < kHq; ++h) {
      const double d = std::fabs(double(lh[h]) - lse[h]);
      lerr = (d > lerr || d != d) ? d : lerr;
    }
    const double rel = den > 0 ? num / den : num;
    worst.rel = (rel > worst.rel || rel != rel) ? rel : worst.rel;
    worst.lse_abs = (lerr > worst.lse_abs || lerr != lerr) ? lerr : worst.lse_abs;
  }
  return worst;
}

void json_num(const char* key, double v, bool comma = true) {
  if (std::isfinite(v)) {
    std::printf("\"%s\": %.6g%s", key, v, comma ? ", " : "");
  } else {
    std::printf("\"%s\": \"%s\"%s", key, std::isnan(v) ? "nan" : "inf", comma ? ", " : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<int, int>> shapes;
  for (int i = 1; i < argc; ++i) {
    int B = 0, L = 0;
    if (std::sscanf(argv[i], "%d:%d", &B, &L) != 2 || B <= 0 || L <= 0) {
      std::fprintf(stderr, "usage: %s [B:L ...]   (default 64:4096 8:32768)\n", argv[0]);
      return 2;
    }
    shapes.emplace_back(B, L);
  }
  if (shapes.empty()) shapes = {{64, 4096}, {8, 32768}};

  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  if (prop.major != 9 || prop.minor != 0) {
    std::fprintf(stderr, "mla_decode_flashmla: needs sm_90 (FlashMLA's SM90 dense decode), got "
                         "%s sm_%d%d\n", prop.name, prop.major, prop.minor);
    return 1;
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const double copy_TBps = measure_copy_TBps(st);
  std::fprintf(stderr, "mla_decode_flashmla: %s, %d SMs, copy 2 GiB: %.3f TB/s\n", prop.name,
               prop.multiProcessorCount, copy_TBps);

  for (auto [B, L] : shapes) {
    std::fprintf(stderr, "mla_decode_flashmla: B=%d L=%d\n", B, L);
    const int pages_per_seq = (L + kPage - 1) / kPage;
    const int num_blocks = B * pages_per_seq;
    const int q_seq_per_hk = kSq * kHq / kHk;  // 64
    // As dense_decode.h: SMs / h_k / ceil(s_q h_q / h_k / 64), at least 1.
    const int num_sm_parts = std::max(
        prop.multiProcessorCount / kHk / ((kSq * kHq / kHk + 63) / 64), 1);
    const int total_num_splits = B + num_sm_parts;

    __nv_bfloat16 *q = nullptr, *kc = nullptr, *out = nullptr;
    float *lse = nullptr, *lse_accum = nullptr, *o_accum = nullptr;
    int *block_table = nullptr, *seqlens = nullptr, *num_splits = nullptr;
    DecodingSchedMeta* sched = nullptr;
    const size_t q_n = size_t(B) * kSq * kHq * kD;                 // [B, 1, 64, 576]
    const size_t k_n = size_t(num_blocks) * kPage * kHk * kD;      // [blocks, 64, 1, 576]
    const size_t o_n = size_t(B) * kHk * q_seq_per_hk * kDv;       // [B, 1, 64, 512]
    CK(cudaMalloc(&q, q_n * 2));
    CK(cudaMalloc(&kc, k_n * 2));
    CK(cudaMalloc(&out, o_n * 2));
    CK(cudaMalloc(&lse, size_t(B) * kHk * q_seq_per_hk * 4));
    CK(cudaMalloc(&lse_accum, size_t(total_num_splits) * kHk * q_seq_per_hk * 4));
    CK(cudaMalloc(&o_accum, size_t(total_num_splits) * kHk * q_seq_per_hk * kDv * 4));
    CK(cudaMalloc(&block_table, size_t(B) * pages_per_seq * 4));
    CK(cudaMalloc(&seqlens, size_t(B) * 4));
    CK(cudaMalloc(&num_splits, size_t(B + 1) * 4));
    CK(cudaMalloc(&sched, size_t(num_sm_parts) * sizeof(DecodingSchedMeta)));

    // Inputs. Scores: scale * sum of kD products of U[-a, a] and U[-1, 1] (variance a^2 / 9
    // each), std = scale * a * sqrt(kD) / 3 = 2.
    const float q_amp = float(6.0 / (kScale * std::sqrt(double(kD))));
    fill_uniform<<<1024, 256, 0, st>>>(kc, k_n, 1, 1.0f);
    CK(cudaGetLastError());
    fill_uniform<<<256, 256, 0, st>>>(q, q_n, 2, q_amp);
    CK(cudaGetLastError());
    {
      std::vector<int> bt(size_t(B) * pages_per_seq), sl(B, L);
      for (size_t i = 0; i < bt.size(); ++i) bt[i] = int(i);  // sequence b: its own pages
      CK(cudaMemcpyAsync(block_table, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice, st));
      CK(cudaMemcpyAsync(seqlens, sl.data(), sl.size() * 4, cudaMemcpyHostToDevice, st));
      CK(cudaStreamSynchronize(st));
    }
    CK(cudaMemsetAsync(out, 0, o_n * 2, st));

    // Scheduling metadata, once (dense_decode.h's arguments).
    GetDecodeSchedMetaParams mp = {
        B, kSq,
        64,      // block_size_n
        5,       // fixed_overhead_num_blocks
        -1, -1,  // topk, extra_topk: dense
        nullptr, nullptr,
        seqlens,
        sched,
        num_splits,
        num_sm_parts,
        st};
    smxx::decode::run_get_decoding_sched_meta_kernel(mp);
    CK(cudaStreamSynchronize(st));
    int total_splits_used = 0;
    CK(cudaMemcpy(&total_splits_used, num_splits + B, 4, cudaMemcpyDeviceToHost));

    // DenseAttnDecodeParams as dense_decode.h fills them. q viewed as [B, q_seq_per_hk, h_k, d]
    // (s_q = 1, h_k = 1: the contiguous [B, 1, 64, d] itself); out [B, h_k, q_seq_per_hk, d_v];
    // lse [B, h_k, q_seq_per_hk]; strides in elements.
    DenseAttnDecodeParams p{};
    p.b = B;
    p.s_q = kSq;
    p.q_seq_per_hk = q_seq_per_hk;
    p.seqlens_k_ptr = seqlens;
    p.h_q = kHq;
    p.h_k = kHk;
    p.num_blocks = num_blocks;
    p.q_head_per_hk = kHq / kHk;
    p.is_causal = false;  // s_q == 1
    p.d = kD;
    p.d_v = kDv;
    p.scale_softmax = float(kScale);
    p.scale_softmax_log2 = float(kScale * M_LOG2E);
    p.q_ptr = q;
    p.k_ptr = kc;
    p.o_ptr = out;
    p.softmax_lse_ptr = lse;
    p.q_batch_stride = int64_t(q_seq_per_hk) * kHk * kD;
    p.q_row_stride = int64_t(kHk) * kD;
    p.q_head_stride = kD;
    p.k_batch_stride = int64_t(kPage) * kHk * kD;
    p.k_row_stride = int64_t(kHk) * kD;
    p.k_head_stride = kD;
    p.o_batch_stride = int64_t(kHk) * q_seq_per_hk * kDv;
    p.o_row_stride = kDv;
    p.o_head_stride = int64_t(q_seq_per_hk) * kDv;
    p.block_table = block_table;
    p.block_table_batch_stride = pages_per_seq;
    p.page_block_size = kPage;
    p.tile_scheduler_metadata_ptr = sched;
    p.num_sm_parts = num_sm_parts;
    p.num_splits_ptr = num_splits;
    p.total_num_splits = total_num_splits;
    p.softmax_lseaccum_ptr = lse_accum;
    p.oaccum_ptr = o_accum;
    p.stream = st;

    CombineParams cp = {
        B, kSq, kHq, kDv,
        lse, out,
        kHk * q_seq_per_hk, kHq,                    // stride_lse_b, stride_lse_s_q
        kHq * kSq * kDv, kHq * kDv, kDv,            // stride_o_b, _s_q, _h_q
        lse_accum, o_accum,
        kHk * q_seq_per_hk, kHq,                    // stride_lse_accum_split, _s_q
        kHq * kSq * kDv, kHq * kDv, kDv,            // stride_o_accum_split, _s_q, _h_q
        sched, num_splits, num_sm_parts,
        nullptr,                                    // attn_sink
        st};

    auto splitkv = [&] { sm90::run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p); };
    auto combine = [&] { smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(cp); };
    auto call = [&] {
      splitkv();
      combine();
    };

    // Correctness, first call.
    call();
    CK(cudaStreamSynchronize(st));
    std::vector<int> seqs;
    const int nchk = L <= 8192 ? 4 : 2;
    for (int i = 0; i < nchk; ++i) {
      const int b = nchk == 1 ? 0 : int((long long)(B - 1) * i / (nchk - 1));
      if (seqs.empty() || seqs.back() != b) seqs.push_back(b);
    }
    const RefErr err = check_sequences(seqs, L, pages_per_seq,
                                       reinterpret_cast<const uint16_t*>(q),
                                       reinterpret_cast<const uint16_t*>(kc),
                                       reinterpret_cast<const uint16_t*>(out), lse);

    const double us = time_us(st, call, kWarmup, kReps);
    const double split_us = time_us(st, splitkv, kWarmup, kReps);
    const double comb_us = time_us(st, combine, kWarmup, kReps);
    const double loop = loop_us(st, call, kWarmup, kReps);
    CK(cudaDeviceSynchronize());

    const double bytes = double(B) * L * kD * 2;
    const double bytes_r512 = double(B) * L * 512 * 2;
    std::printf("{\"bench\": \"mla_decode_flashmla\", \"shape\": {\"B\": %d, \"L\": %d, \"H\": %d, "
                "\"R\": 512, \"d_k\": %d, \"d_v\": %d, \"h_k\": %d, \"s_q\": %d, "
                "\"page_block_size\": %d, \"cache_dtype\": \"bfloat16\", \"scale\": %.9g}, ",
                B, L, kHq, kD, kDv, kHk, kSq, kPage, kScale);
    json_num("flashmla_us", us);
    json_num("flashmla_splitkv_us", split_us);
    json_num("flashmla_combine_us", comb_us);
    json_num("flashmla_loop_us", loop);
    std::printf("\"bytes\": %.0f, \"bytes_r512\": %.0f, ", bytes, bytes_r512);
    json_num("flashmla_TBps", bytes / us / 1e6);
    json_num("frac_of_copy", bytes / us / 1e6 / copy_TBps);
    json_num("splitkv_frac_of_copy", bytes / split_us / 1e6 / copy_TBps);
    json_num("loop_frac_of_copy", bytes / loop / 1e6 / copy_TBps);
    json_num("r512_frac_of_copy", bytes_r512 / us / 1e6 / copy_TBps);
    json_num("copy_TBps", copy_TBps);
    json_num("max_rel_err_ref", err.rel);
    json_num("max_abs_err_lse", err.lse_abs);
    std::printf("\"checked_sequences\": [");
    for (size_t i = 0; i < seqs.size(); ++i) std::printf("%s%d", i ? ", " : "", seqs[i]);
    std::printf("], \"num_sm_parts\": %d, \"total_num_splits\": %d, \"num_splits_used\": %d, "
                "\"device\": \"%s\", \"sms\": %d, \"warmup\": %d, \"reps\": %d, "
                "\"flashmla_commit\": \"%s\", \"cutlass_commit\": \"%s\"}\n",
                num_sm_parts, total_num_splits, total_splits_used, prop.name,
                prop.multiProcessorCount, kWarmup, kReps, kFlashMLACommit, kCutlassCommit);
    std::fflush(stdout);

    CK(cudaFree(q));
    CK(cudaFree(kc));
    CK(cudaFree(out));
    CK(cudaFree(lse));
    CK(cudaFree(lse_accum));
    CK(cudaFree(o_accum));
    CK(cudaFree(block_table));
    CK(cudaFree(seqlens));
    CK(cudaFree(num_splits));
    CK(cudaFree(sched));
    if (!(err.rel <= kMaxRelErr)) {
      std::fprintf(stderr, "mla_decode_flashmla: max_rel_err_ref %.3g > %.3g at B=%d L=%d "
                           "(a harness error)\n", err.rel, kMaxRelErr, B, L);
      return 1;
    }
  }
  CK(cudaStreamDestroy(st));
  return 0;
}
