// Does the driver take the programmatic-serialization (PDL) launch attribute together with a
// cluster dimension or the cooperative attribute? cuda/mla_decode_sm90_launch.cu's launch_form
// asks for both when KernelOptions::pdl is on and retries without PDL where refused, so a refusal
// would cost every call a failed launch. A kernel of the MLA decode's shared-memory footprint
// (215560 bytes) is launched after another one in the same stream with each pairing; one JSON
// line per case with the launch's and the synchronisation's error string.
// Standalone: nvcc -O2 -std=c++17 -arch=sm_90a benchmarks/pdl_pairing_probe.cu -o /tmp/pp && /tmp/pp
// (H200, CUDA 13: every pairing accepted, benchmarks/results/2026-12-04-h200-s20-pdl-pairing.jsonl.)
#include <cstdio>
#include <cuda_runtime.h>
__global__ void k(int* x) {
  extern __shared__ int s[];
  s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(x, s[1]);
}
int main() {
  int* d; cudaMalloc(&d, 4);
  cudaStream_t st; cudaStreamCreate(&st);
  const int smem = 215560;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  struct Case { const char* name; int cluster; bool coop; bool pdl; dim3 grid; };
  Case cases[] = {{"coop", 0, true, false, dim3(16, 8)}, {"coop+pdl", 0, true, true, dim3(16, 8)},
                  {"cluster2", 2, false, false, dim3(2, 64)}, {"cluster2+pdl", 2, false, true, dim3(2, 64)},
                  {"cluster16+pdl", 16, false, true, dim3(16, 4)}, {"plain+pdl", 0, false, true, dim3(16, 8)}};
  for (const Case& c : cases) {
    k<<<1, 256, smem, st>>>(d);  // a kernel in front, so the programmatic attribute has one
    cudaLaunchAttribute a[2]; int n = 0;
    if (c.cluster) { a[n].id = cudaLaunchAttributeClusterDimension; a[n].val.clusterDim.x = c.cluster; a[n].val.clusterDim.y = 1; a[n].val.clusterDim.z = 1; ++n; }
    if (c.coop) { a[n].id = cudaLaunchAttributeCooperative; a[n].val.cooperative = 1; ++n; }
    if (c.pdl) { a[n].id = cudaLaunchAttributeProgrammaticStreamSerialization; a[n].val.programmaticStreamSerializationAllowed = 1; ++n; }
    cudaLaunchConfig_t cfg = {}; cfg.gridDim = c.grid; cfg.blockDim = dim3(256); cfg.dynamicSmemBytes = smem; cfg.stream = st; cfg.attrs = a; cfg.numAttrs = n;
    cudaError_t e = cudaLaunchKernelEx(&cfg, k, d);
    cudaError_t e2 = cudaStreamSynchronize(st);
    printf("{\"case\": \"%s\", \"launch\": \"%s\", \"sync\": \"%s\"}\n", c.name, cudaGetErrorString(e), cudaGetErrorString(e2));
    cudaGetLastError();
  }
  return 0;
}
