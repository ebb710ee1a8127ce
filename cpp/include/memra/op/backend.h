// Where an op runs. Every op with a CPU reference and a CUDA kernel has one C++ function in
// memra::op (cpp/include/memra/op/<area>.h, cpp/src/op/<area>.cpp) that takes a Backend and the
// op's parameter struct (the plain C struct of cpp/include/memra/cuda_abi/<area>.h, one per op
// family) and makes the CPU / CUDA choice there, once: the bindings (python/src/bind_ops_*.cpp)
// and the layers (cpp/src/layers/) call these functions instead of the CUDA ABI or memra::cpu.
//
// Pointers in a parameter struct live on the backend's device (host memory on the CPU); weights
// are named by their bytes and dtype code (a WeightView on the CPU reads the same fields). A
// field that only a CUDA kernel can honour (a device slot table, a fused launch) is refused on the
// CPU with kUnsupportedGeometry unless the CPU branch computes the same values from the reference
// ops; the comment on the field says which.
#pragma once

#include <string>

#include "memra/device.h"
#include "memra/status.h"
#include "memra/tensor.h"

namespace memra::op {

struct Backend {
  const CudaContext* cuda = nullptr;  // null: the CPU reference backend (memra::cpu)
  bool on_cuda() const { return cuda != nullptr; }
};

// A CUDA-library status as a Status naming `op` (kOk passes through).
inline Status cuda_status(const Backend& b, int rc, const char* op) {
  return rc == kOk ? Status::Ok() : b.cuda->status(rc, op);
}

// A weight of a parameter struct (bytes + dtype code) as the CPU reference ops read it.
inline WeightView host_view(const void* data, int dtype, int64_t rows, int64_t cols) {
  return {data, static_cast<DType>(dtype), rows, cols};
}

}  // namespace memra::op
