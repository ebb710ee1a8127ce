// KDA area: the chunked (WY / UT) form of the delta-rule scan on tensor cores, the TABLES scan
// with MemraKdaScanParams::chunked (cpp/include/memra/cuda_abi/kda.h), which a bf16 model's
// prefill asks for; f32 models and the decode step keep the sequential scan (cuda/kda_scan.cu,
// the CPU oracle's twin). GDN's scan calls scan_chunked with its per-head decay and grouped key
// heads (cuda/gdn.cu). The algebra, the kernels' split and the scratch layout are in
// cuda/kda_chunk.cuh; the kernels in kda_chunk_intra.cu and kda_chunk_state.cu.
#include "kda_chunk.cuh"

namespace memra::cuda::kda {

int scan_chunked(MemraCudaCtx* ctx, const ChunkProblem& p) {
  const int nc = (p.T + kC - 1) / kC;
  const int64_t chunks = int64_t(p.B) * p.H * nc;
  if (chunks > 0x7fffffffLL) return memra::kContractShape;
  memra::cuda::Scratch scratch(ctx, size_t(chunks) * kChunkFloats * sizeof(float));
  MEMRA_CUDA_RETURN_IF(scratch.status());
  float* sc = scratch.as<float>();
  MEMRA_CUDA_RETURN_IF(launch_chunk_intra(ctx, p, nc, sc));
  return launch_chunk_state(ctx, p, nc, sc);
}

int scan_chunked_tables(MemraCudaCtx* ctx, const MemraKdaScanParams& p) {
  ChunkProblem c{};
  c.q = p.q;
  c.k = p.k;
  c.v = p.v;
  c.g = p.g;
  c.beta = p.beta;
  c.ld_qk = int64_t(p.H) * kDk;
  c.ld_v = int64_t(p.H) * kDv;
  c.B = p.B;
  c.T = p.T;
  c.H = p.H;
  c.group = 1;
  c.scalar_g = 0;
  c.in_bf16 = p.in_dtype == 1;
  c.o_bf16 = p.o_dtype == 1;
  c.scale = p.scale;
  c.state_in = p.state.in_table;
  c.state_out = p.state.out_table;
  c.o = p.o;
  return scan_chunked(ctx, c);
}

}  // namespace memra::cuda::kda
