// Shared by the KDA area's sources (cuda/kda_conv.cu, kda_scan.cu, kda_decode_lines.cu; ABI in
// cpp/include/memra/cuda_abi/kda.h): how a decode kernel finds each row's planes, the gate's
// per-element arithmetic, and the scan's head size.
//
// Rounding, for every KDA kernel: each arithmetic operation is written with an explicit
// round-to-nearest intrinsic (__fmul_rn / __fadd_rn / __fdiv_rn), which nvcc never contracts into
// an FMA, so each element sees the operations of the CPU reference (cpu/kda.cpp; x86-64 without
// FMA rounds every op). What still differs from the CPU: expf / logf (CUDA's are within 2 ulp,
// glibc's ~0.5 ulp) and, in the scan, the order of the dk-long sums (partial sums + a warp tree
// instead of one ascending chain).
//
// The types and device functions below are in an anonymous namespace, as the kernels that take
// them are: each source gets its own copy, and the kernels' mangled names (sass_diff.py compares
// by them) stay those of the single-file KDA library. What one source calls in another is in
// memra::cuda::kda and takes only the ABI's parameter structs.
#pragma once

#include <cstdint>

#include "common.cuh"

namespace {

constexpr int kMaxGridY = 65535;

// The scan kernels' head size (dk = dv = 128; anything else is 50002).
constexpr int kScanDk = 128;
constexpr int kScanDv = 128;

// The per-row planes a decode kernel reads and writes (a conv ring or a scan state): the [B]
// pointer tables kda_tables builds (in null or a null entry = zeros; a null out entry is not
// written), or, with slots set (MEMRA_KDA_PLANES_SLOTS), resolved in the kernel from the device
// slots with kda_tables' arithmetic, which needs neither its launch nor its tables: row b with
// s = slots[b] >= 0 and c = cur[s] & 1 reads base<c> + s * floats + offset and writes
// base<1 - c> + s * floats + offset; an idle row (s < 0) reads zeros and writes nothing.
// early: slots, cur, the input planes and the kernel's weights are read before its pdl_wait (the
// caller guarantees that no kernel that may still be running writes them: with every kernel
// triggering its dependent after its own wait, that is the launch in front), so their latency is
// spent under that launch instead of on the step's critical path.
struct RowPlanes {
  const float* const* in = nullptr;
  float* const* out = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* cur = nullptr;
  float* base0 = nullptr;
  float* base1 = nullptr;
  int64_t floats = 0;
  int64_t offset = 0;
  bool strided = false;  // MEMRA_KDA_PLANES_STRIDED: row b's planes base0 / base1 + b * floats
  bool early = false;

  __device__ __forceinline__ void at(int64_t b, const float** pin, float** pout) const {
    // slots and cur through L2 (__ldcg), belt and braces: with early, what is read before the
    // wait (these, the input planes, the taps) was last written by kernels that completed before
    // the launch in front of this one began (each kernel triggers its dependent only after its
    // own wait), so no cache can hold an older copy.
    if (slots) {
      const int s = __ldcg(slots + b);
      if (s < 0) {
        *pin = nullptr;
        *pout = nullptr;
        return;
      }
      const bool one = (__ldcg(cur + s) & 1) != 0;
      const int64_t off = static_cast<int64_t>(s) * floats + offset;
      *pin = (one ? base1 : base0) + off;
      *pout = (one ? base0 : base1) + off;
      return;
    }
    if (strided) {
      const int64_t off = b * floats;
      *pin = base0 ? base0 + off : nullptr;
      *pout = base1 + off;
      return;
    }
    *pin = in ? in[b] : nullptr;
    *pout = out[b];
  }
};

// The RowPlanes of a TABLES, STRIDED or SLOTS MemraKdaPlanes (the caller has checked the form).
// A SLOTS form with null slots is left a table form without tables, which the checks refuse
// (40024).
inline RowPlanes row_planes(const MemraKdaPlanes& p) {
  RowPlanes r;
  if (p.form == MEMRA_KDA_PLANES_SLOTS) {
    r.slots = p.slots;
    r.cur = p.cur;
    r.base0 = p.base0;
    r.base1 = p.base1;
    r.floats = p.floats;
    r.offset = p.offset;
  } else if (p.form == MEMRA_KDA_PLANES_STRIDED) {
    r.strided = true;
    r.base0 = const_cast<float*>(p.in);  // only read
    r.base1 = p.out;
    r.floats = p.floats;
  } else {
    r.in = p.in_table;
    r.out = p.out_table;
  }
  r.early = p.early != 0;
  return r;
}

// One gate value from f + dt_bias (cpu::kda_gate's arithmetic; decay_rate = exp(A_log[h])).
// The gate kernel and the decode scan's fused gates both call it.
__device__ __forceinline__ float gate_value(float f, float bias, float decay_rate, int form,
                                           float lower_bound) {
  const float x = __fadd_rn(f, bias);
  if (form == 0) {
    // lb * sigmoid(exp(A_log) * x), written as lb * (1 / (1 + exp(-(rate * x)))).
    return __fmul_rn(lower_bound,
                     __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(decay_rate, x)))));
  }
  // transformers' softplus: log(1 + exp(x)) (not log1p), x itself above 20.
  const float sp = x > 20.0f ? x : logf(__fadd_rn(1.0f, expf(x)));
  return __fmul_rn(-decay_rate, sp);
}

// beta from its logit (memra_cuda_sigmoid's arithmetic).
__device__ __forceinline__ float beta_value(float logit) { return 1.0f / (1.0f + expf(-logit)); }

// kda_scan's fused gates (SLOTS: scan_decode_lines_kernel, cuda/kda_decode_lines.cu): g and
// beta arrive raw (f, beta's logits) and the scan applies gate_kernel's arithmetic to them as it
// loads them.
struct RawGates {
  const float* dt_bias;  // [H * dk], 16-byte aligned
  const float* A_log;    // [H]
  int form;
  float lower_bound;
  int64_t beta_ld;       // floats from one row's beta logits to the next's (>= H)
};

// kda_scan's fused norm (SLOTS): o written through rms_norm_gated_sigmoid over the head's row.
struct GatedNorm {
  const float* gate;  // [B * H, dv]
  const float* w;     // [dv]
  float eps;
  bool o_bf16 = false;  // o [B, H, dv] is bf16 (each normed value rounded RNE), else f32
};

}  // namespace

namespace memra::cuda::kda {

// cuda/kda_decode_lines.cu: the decode step of kda_scan (T == 1), a block per 64 columns of a
// head in 256-byte row segments from three full waves of such blocks, else per 32 columns. TABLES
// or STRIDED: the launch after the entry's checks (q .. o checked 16-byte aligned).
int scan_decode_tables(MemraCudaCtx* ctx, const MemraKdaScanParams& p);
// SLOTS with the gates and the norm fused (a whole head a block): the whole of that form (its
// checks, then the launch).
int scan_decode_slots(MemraCudaCtx* ctx, const MemraKdaScanParams& p);
// cuda/kda_chunk.cu: the chunked (WY / UT) form of the TABLES scan on tensor cores (p.chunked),
// any T >= 1, after the entry's checks (q .. o 16-byte aligned, dk = dv = 128).
int scan_chunked_tables(MemraCudaCtx* ctx, const MemraKdaScanParams& p);

// One chunked scan: B sequences of T >= 1 steps, H state heads of dk = dv = 128. Row n = b T + t.
// KDA: key head = state head, g per channel; GDN: key head h / group, one g per head. The host
// side (cuda/kda_chunk.cu) has checked the pointers non-null where required and 16-byte aligned,
// ld_qk and ld_v multiples of 4.
struct ChunkProblem {
  // q, k, v, g: f32, or bf16 with in_bf16 (strides in elements).
  const void* q;      // row n, key head j at q + n * ld_qk + j * dk
  const void* k;      // the layout of q
  const void* v;      // row n, head h at v + n * ld_v + h * dv
  const void* g;      // scalar_g == 0: [B, T, H, dk]; else [B, T, H]
  const float* beta;  // [B, T, H]
  int64_t ld_qk, ld_v;
  int B, T, H;
  int group;          // state heads per key head (1 for KDA)
  int scalar_g;
  int in_bf16;        // q, k, v, g are bf16 (KDA only: scalar_g == 0)
  float scale;
  const float* const* state_in;  // [B] device table; null or a null entry: zeros
  float* const* state_out;       // [B] device table (required); a null entry is not written
  void* o;                       // [B, T, H, dv], f32 or (o_bf16) bf16
  int o_bf16;
};

// cuda/kda_chunk.cu: the whole chunked scan of a ChunkProblem (scratch, then the two
// launches); GDN's scan calls it without expanding its heads.
int scan_chunked(MemraCudaCtx* ctx, const ChunkProblem& p);

}  // namespace memra::cuda::kda
