// The bf16 tensor-core building blocks every mma.sync kernel shares (attention_tc.cu,
// dsa_score_tc.cu, mla_decode_tc.cu, mla_decode_sm90.cu through mla_sm90.cuh, moe_tc.cu): ldmatrix
// loads of 8x8 b16 tiles from shared memory, the m16n8k16 bf16 -> f32 mma, and pair packing
// (bf16, and f16 for kda_chunk_state.cu's wgmma A fragments).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "common.cuh"

namespace memra::cuda {

// Four 8x8 b16 tiles from shared memory, one row address per lane (lanes 8i..8i+7: tile i).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// ldsm_x4 with each tile transposed (a row-major [k, n] tile read as the mma's col-major B).
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// d += a * b, m16n8k16, bf16 inputs, f32 accumulators. Fragments (g = lane / 4, q = lane % 4):
// a0 (row g, k 2q..2q+1), a1 (row g+8, same k), a2 (row g, k 2q+8..), a3 (row g+8, k 2q+8..);
// b0 (k 2q..2q+1, col g), b1 (k 2q+8.., col g); d0 d1 (row g, cols 2q, 2q+1), d2 d3 (row g+8).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to f16 (nearest even) in one register, lo at the lower address.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// Two floats rounded to bf16 (nearest even) in one register, lo at the lower address.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// The sum of a packed pair's two values (the rounded values the mma reads).
__device__ __forceinline__ float bf16x2_sum(uint32_t u) {
  __nv_bfloat162 v;
  memcpy(&v, &u, sizeof(v));
  return __low2float(v) + __high2float(v);
}

}  // namespace memra::cuda
