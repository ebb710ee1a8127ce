// CK(call) for the standalone CUDA benchmarks (gemm_algos.cu, l2_prefetch.cu): a call returning a
// nonzero status (cudaError_t, cublasStatus_t) prints the file, line, call and code, and exits 1.
#pragma once

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                    \
  do {                                                                           \
    auto _e = (x);                                                               \
    if (static_cast<int>(_e) != 0) {                                             \
      std::fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, int(_e)); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)
