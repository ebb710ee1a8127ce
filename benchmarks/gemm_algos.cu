// Survey of cuBLASLt algorithms for the decode-row GEMMs of GLM-5.3-Flash (bf16 weights, f32
// output, f32 accumulation), against cublasGemmEx's default choice (what memra_cuda_linear runs):
// for each shape y[T, N] = x[T, K] w[N, K]^T, every heuristic candidate (up to 32) is timed by CUDA
// events (median of 20 launches after 5 warm-ups) and one JSON line per shape gives the default,
// the heuristic's first choice, the fastest candidate and their fractions of the copy bandwidth
// over the weight bytes. Standalone (no memra): built and run on the GPU machine,
//   nv=$(python3 -c "import nvidia,os;print(os.path.join(list(nvidia.__path__)[0],'cu13'))")
//   nvcc -O2 -std=c++17 -arch=sm_90a -I$nv/include benchmarks/gemm_algos.cu -o /tmp/gemm_algos \
//     -L$nv/lib -l:libcublasLt.so.13 -l:libcublas.so.13 -Xlinker -rpath=$nv/lib
//   /tmp/gemm_algos [copy_TBps]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

struct Shape {
  const char* name;
  int N, K;
};

// Median over 20 launches of f (after 5 warm-ups), each after prep() (outside the timed span).
template <typename P, typename F>
float median_us(cudaStream_t s, P&& prep, F&& f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) {
    prep();
    f();
  }
  std::vector<float> t;
  for (int i = 0; i < 20; ++i) {
    prep();
    CK(cudaEventRecord(a, s));
    f();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  const double copy_tbps = argc > 1 ? std::atof(argv[1]) : 4.27;
  const Shape shapes[] = {
      {"kda_q", 8192, 4096},        {"kda_qkv", 24576, 4096},   {"kda_o", 4096, 8192},
      {"kda_fa_ga", 256, 4096},     {"kda_f_b", 8192, 128},     {"kda_b", 64, 4096},
      {"mla_q_a", 1536, 4096},      {"mla_kv_a", 512, 4096},    {"mla_q_b", 16384, 1536},
      {"mla_o", 4096, 16384},       {"mla_in_fused", 2336, 4096}, {"idx_wq_b", 4096, 1536},
      {"mlp_gate", 12288, 4096},    {"mlp_gate_up", 24576, 4096}, {"mlp_down", 4096, 12288},
      {"shared_gate_up", 4096, 4096}, {"shared_down", 4096, 2048}, {"lm_head", 154880, 4096},
  };
  const int Ts[] = {1, 32};
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cublasHandle_t blas;
  CK(cublasCreate(&blas));
  CK(cublasSetStream(blas, s));
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  const size_t ws_bytes = size_t(32) << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  CK(cublasSetWorkspace(blas, ws, ws_bytes));
  size_t max_w = 0, max_x = 0, max_y = 0;
  for (const Shape& sh : shapes) {
    max_w = std::max(max_w, size_t(sh.N) * sh.K);
    max_x = std::max(max_x, size_t(32) * sh.K);
    max_y = std::max(max_y, size_t(32) * sh.N);
  }
  __nv_bfloat16 *w, *x;
  float* y;
  CK(cudaMalloc(&w, max_w * 2));
  CK(cudaMalloc(&x, max_x * 2));
  CK(cudaMalloc(&y, max_y * 4));
  CK(cudaMemset(w, 0, max_w * 2));
  CK(cudaMemset(x, 0, max_x * 2));
  // A buffer larger than L2, rewritten between launches, so no weight byte is served from L2.
  const size_t flush_bytes = size_t(256) << 20;
  void* flush;
  CK(cudaMalloc(&flush, flush_bytes));

  for (const Shape& sh : shapes) {
    for (int T : Ts) {
      const float one = 1.0f, zero = 0.0f;
      // Column-major: y_cm [N, T] = w_cm^T [N, K] x_cm [K, T] (as memra's cuda/linear.cu).
      auto prep = [&]() { CK(cudaMemsetAsync(flush, T, flush_bytes, s)); };
      auto gemm_ex = [&]() {
        CK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.N, T, sh.K, &one, w, CUDA_R_16BF, sh.K,
                        x, CUDA_R_16BF, sh.K, &zero, y, CUDA_R_32F, sh.N, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
      };
      const float ex_us = median_us(s, prep, gemm_ex);

      cublasLtMatmulDesc_t op;
      CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      cublasLtMatrixLayout_t la, lb, lc;
      CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, sh.K, sh.N, sh.K));
      CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, sh.K, T, sh.K));
      CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, sh.N, T, sh.N));
      cublasLtMatmulPreference_t pref;
      CK(cublasLtMatmulPreferenceCreate(&pref));
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &ws_bytes, sizeof(ws_bytes)));
      cublasLtMatmulHeuristicResult_t heur[32];
      int n = 0;
      CK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 32, heur, &n));
      float first_us = -1, best_us = 1e30f;
      int best = -1, best_split = -1, first_split = -1;
      for (int i = 0; i < n; ++i) {
        if (heur[i].state != CUBLAS_STATUS_SUCCESS) continue;
        const cublasLtMatmulAlgo_t* algo = &heur[i].algo;
        bool ok = true;
        auto run = [&]() {
          if (cublasLtMatmul(lt, op, &one, w, la, x, lb, &zero, y, lc, y, lc, algo, ws, ws_bytes,
                             s) != CUBLAS_STATUS_SUCCESS)
            ok = false;
        };
        const float us = median_us(s, prep, run);
        if (!ok) continue;
        int split = 0;
        size_t got = 0;
        cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                             sizeof(split), &got);
        if (i == 0) {
          first_us = us;
          first_split = split;
        }
        if (us < best_us) {
          best_us = us;
          best = i;
          best_split = split;
        }
      }
      const double bytes = 2.0 * sh.N * sh.K;
      auto frac = [&](float us) { return us > 0 ? bytes / (us * 1e-6) / (copy_tbps * 1e12) : 0.0; };
      std::printf(
          "{\"bench\":\"gemm_algos\",\"shape\":{\"name\":\"%s\",\"T\":%d,\"N\":%d,\"K\":%d},"
          "\"candidates\":%d,\"gemm_ex_us\":%.2f,\"lt_first_us\":%.2f,\"lt_first_splitk\":%d,"
          "\"lt_best_us\":%.2f,\"lt_best_index\":%d,\"lt_best_splitk\":%d,"
          "\"frac_gemm_ex\":%.3f,\"frac_lt_best\":%.3f}\n",
          sh.name, T, sh.N, sh.K, n, ex_us, first_us, first_split, best_us, best, best_split,
          frac(ex_us), frac(best_us));
      std::fflush(stdout);
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(op);
    }
  }
  return 0;
}
