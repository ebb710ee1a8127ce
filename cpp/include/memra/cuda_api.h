// The C ABI between the extension (memra_core, no CUDA types) and the CUDA library
// (libmemra_cuda.so, dlopened when a CUDA engine is made; docs/architecture.md "The CUDA ABI and the op layer").
//
// Every entry point is `extern "C" int memra_cuda_<name>(...)` returning a status in memra's
// bands (0 ok, 10000 + cudaError_t, 20000 + cublasStatus_t, 30001 OOM, 40000+ contract,
// 50002 geometry not instantiated); none throws. The lists live per area in cuda_abi/*.h as
// X-macros X(name, (args)) so that
//   - the CUDA library gets a prototype for each definition (a mismatch fails to compile), and
//   - memra_core builds a table of function pointers resolved with dlsym by name (CudaApi).
// Conventions: pointers are device pointers unless named host_*; activations are f32 and
// C-contiguous with the shape written beside each argument; weights are `const void*` plus an
// `int` dtype code (memra::DType: 0 f32, 1 bf16, 2 f16); all work is enqueued on the context's
// stream (no host synchronisation unless the entry says so); scratch comes from the context's
// stream-ordered pool.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
typedef struct MemraCudaCtx MemraCudaCtx;
#ifdef __cplusplus
}
#endif

#include "memra/cuda_abi/attention.h"
#include "memra/cuda_abi/basic.h"
#include "memra/cuda_abi/dsa.h"
#include "memra/cuda_abi/gdn.h"
#include "memra/cuda_abi/graph_tables.h"
#include "memra/cuda_abi/kda.h"
#include "memra/cuda_abi/linear.h"
#include "memra/cuda_abi/mhc.h"
#include "memra/cuda_abi/mla.h"
#include "memra/cuda_abi/mlp.h"
#include "memra/cuda_abi/moe.h"
#include "memra/cuda_abi/runtime.h"
#include "memra/cuda_abi/sample.h"

#define MEMRA_CUDA_ALL_OPS(X) \
  MEMRA_CUDA_RUNTIME_OPS(X)   \
  MEMRA_CUDA_BASIC_OPS(X)     \
  MEMRA_CUDA_LINEAR_OPS(X)    \
  MEMRA_CUDA_MHC_OPS(X)       \
  MEMRA_CUDA_KDA_OPS(X)       \
  MEMRA_CUDA_GDN_OPS(X)       \
  MEMRA_CUDA_MLA_OPS(X)       \
  MEMRA_CUDA_DSA_OPS(X)       \
  MEMRA_CUDA_MLP_OPS(X)       \
  MEMRA_CUDA_MOE_OPS(X)       \
  MEMRA_CUDA_SAMPLE_OPS(X)    \
  MEMRA_CUDA_ATTENTION_OPS(X) \
  MEMRA_CUDA_GRAPH_TABLES_OPS(X)

#ifdef __cplusplus
namespace memra {
// Function pointers of every entry point, resolved by name from the CUDA library.
struct CudaApi {
#define MEMRA_CUDA_API_MEMBER(name, args) int(*name) args = nullptr;
  MEMRA_CUDA_ALL_OPS(MEMRA_CUDA_API_MEMBER)
#undef MEMRA_CUDA_API_MEMBER
};
}  // namespace memra
#endif
