// Binding helpers for ops that run on either backend: array arguments checked against the
// engine's device (host memory for a CPU engine or none, the engine's CUDA device otherwise),
// outputs allocated on that device, DeviceWeight arguments, CUDA statuses raised as named errors.
//
// Pattern of a dual-backend functional op (keyword-only `engine`, None = CPU):
//   m.def("rms_norm", [](const AnyArray& x, ..., const Engine* engine) {
//     const float* xp = f32_in(engine, x, "rms_norm", "x", {-1, -1});
//     Out y = out_f32(engine, {T, D});
//     if (on_cuda(engine)) {
//       const CudaContext& c = cuda_ctx(engine);
//       check_cuda(engine, c.api().rms_norm(c.ctx(), xp, ..., y.data<float>()), "rms_norm");
//     } else { ReleasedGil nogil; cpu::rms_norm(xp, ..., y.data<float>()); }
//     return y.obj;
//   }, ..., nb::kw_only(), nb::arg("engine").none() = nb::none());
#pragma once

#include <memory>
#include <vector>

#include "common.h"
#include "memra/device.h"
#include "memra/engine.h"
#include "memra/op/backend.h"

namespace memra::py {

// True for a CUDA engine (nullptr = the CPU backend).
inline bool on_cuda(const Engine* engine) { return engine && engine->is_cuda(); }

// The same for a layer or cache bound to a CUDA context (nullptr = host memory).
const float* f32_in(const std::shared_ptr<CudaContext>& cuda, const AnyArray& a, const char* op,
                    const char* name, std::initializer_list<int64_t> shape);
const int32_t* i32_in(const std::shared_ptr<CudaContext>& cuda, const AnyArray& a, const char* op,
                      const char* name, std::initializer_list<int64_t> shape);

// Checked float32 / int32 / uint64 argument on the engine's device; returns its data pointer.
const float* f32_in(const Engine* engine, const AnyArray& a, const char* op, const char* name,
                    std::initializer_list<int64_t> shape);
const int32_t* i32_in(const Engine* engine, const AnyArray& a, const char* op, const char* name,
                      std::initializer_list<int64_t> shape);
const uint64_t* u64_in(const Engine* engine, const AnyArray& a, const char* op, const char* name,
                       std::initializer_list<int64_t> shape);
// A float32 or bfloat16 argument (DLPack bfloat16, or uint16 holding the raw bits) on the
// engine's device; *dtype gets its memra::DType code (0 f32, 1 bf16). want >= 0 asks for that
// code alone (inputs that share the first one's type), named so in the error.
const void* f32_or_bf16_in(const Engine* engine, const AnyArray& a, const char* op,
                           const char* name, std::initializer_list<int64_t> shape, int* dtype,
                           int want = -1);

// A numpy array owning `p` (new uint8_t[] of the shape's bytes). numpy has no bfloat16 of its
// own: bfloat16 data comes back as an ml_dtypes bfloat16 array (the raw bits as uint16, viewed),
// as the loader reads them.
nb::object numpy_owning(uint8_t* p, const std::vector<size_t>& shape, nb::dlpack::dtype dtype);

// A new zero-filled output on the engine's device: a numpy array on the CPU, a DLPack CUDA
// array (nanobind ndarray owning a DeviceBuffer) on the GPU. Return `obj` to Python.
struct Out {
  nb::object obj;
  void* ptr = nullptr;
  template <typename T>
  T* data() const { return static_cast<T*>(ptr); }
};
Out out_f32(const Engine* engine, std::vector<size_t> shape);
Out out_i32(const Engine* engine, std::vector<size_t> shape);
// An output the op overwrites entirely: no zero-fill on the device (host arrays are still zeroed).
// The decode step's hot ops use these: a zero-fill is a launch (and a graph node) per output.
Out out_f32_uninit(const Engine* engine, std::vector<size_t> shape);
// bfloat16, the same way: a DLPack bfloat16 device array, or on the host an ml_dtypes bfloat16
// numpy array (zeroed).
Out out_bf16_uninit(const Engine* engine, std::vector<size_t> shape);
Out out_i32_uninit(const Engine* engine, std::vector<size_t> shape);
// For a layer's CUDA context; zero = false for outputs the layer writes entirely.
Out out_f32(const std::shared_ptr<CudaContext>& cuda, std::vector<size_t> shape, bool zero = true);
Out out_i32(const std::shared_ptr<CudaContext>& cuda, std::vector<size_t> shape, bool zero = true);
// memra.DeviceArray: a device buffer with a shape and dtype, exported through __dlpack__.
struct DeviceArray {
  std::shared_ptr<DeviceBuffer> buffer;
  std::vector<size_t> shape;
  nb::dlpack::dtype dtype;
  int device = 0;
};
// A memra.DeviceArray of `shape` viewing an existing buffer (kept alive by the array).
nb::object device_array(std::shared_ptr<DeviceBuffer> buffer, std::vector<size_t> shape,
                        nb::dlpack::dtype dtype, int device_id);

// The engine's CUDA context (raises UnsupportedError for a CPU engine).
const CudaContext& cuda_ctx(const Engine* engine);
// Raise the named error of a CUDA-library status (no-op for 0).
void check_cuda(const Engine* engine, int rc, const char* op);
// The backend memra::op functions run on for `engine` (None or a CPU engine: the CPU reference).
op::Backend backend(const Engine* engine);
// Device scratch for the duration of a binding call (freed stream-ordered on return), and a
// host -> device copy into such scratch (e.g. the per-sequence pointer tables of kda_scan).
std::shared_ptr<DeviceBuffer> device_scratch(const Engine* engine, size_t bytes);
std::shared_ptr<DeviceBuffer> device_upload(const Engine* engine, const void* host, size_t bytes);

// Weight arguments: a memra.Weight for the CPU backend, a memra.DeviceWeight on the engine's
// device for CUDA (ContractError 40021 naming the argument otherwise).
const Weight& host_weight(nb::handle w, const char* op, const char* name);
const DeviceWeight& device_weight(const Engine* engine, nb::handle w, const char* op, const char* name);

// ContractError (40000) naming the weight unless it is exactly [rows, cols].
void check_weight_2d(const Weight& w, const char* op, const char* name, int64_t rows, int64_t cols);
void check_weight_2d(const DeviceWeight& w, const char* op, const char* name, int64_t rows,
                     int64_t cols);
// ContractError (40025) when `obj` is an array an op would write into but that refuses writes
// (a numpy array with flags.writeable False, e.g. a read-only memory map) or a torch tensor that
// requires grad.
void require_writable(nb::handle obj, const char* op, const char* name);
// ContractError (`code`, default 40025) unless v >= 0; ContractError (40025) unless v is finite.
void check_nonneg(int64_t v, const char* op, const char* name, int code = kContractValue);
// ContractError (40025) "op: name must be >= lo, got v" unless v >= lo.
void check_min(int64_t v, int64_t lo, const char* op, const char* name);
void check_finite(float v, const char* op, const char* name);
// KDA's lower_bound gate: ContractError (40025) unless finite and <= 0.
void check_lower_bound(float v, const char* op, const char* name);
// ContractError (40025) "op: what" unless ok.
void check_value(bool ok, const char* op, const std::string& what);
// A norm or mixing epsilon: ContractError (40025) unless finite and >= 0 (a NaN or negative one
// would turn the output into NaN).
void check_eps(float eps, const char* op, const char* name = "eps");
// The arguments of one op that share its row count T (given by the argument `ref`): each
// (name, array, rank) whose rank is right but whose first dimension is not T raises
// ContractError (40000) naming both, before the per-argument shape checks name only one.
struct RowArg {
  const char* name;
  const AnyArray* array;
  size_t rank;
};
void check_rows(const char* op, const char* ref, int64_t T, std::initializer_list<RowArg> args);

// A per-sequence int argument of a batched op (t_kv, pos): a host list / tuple of ints or host
// int32 / int64 array [B] (values known here, checked against int32, uploaded on CUDA), or on CUDA
// a device int32 [B] array (values unknown to the host). ContractError names `op` and `name`.
struct PerSeq {
  bool host = false;
  std::vector<int32_t> values;   // host values (host == true)
  const int32_t* dev = nullptr;  // device int32 [B] (CUDA: the caller's array or the upload)
  std::shared_ptr<DeviceBuffer> upload;
};
PerSeq per_seq_arg(const Engine* engine, nb::handle h, int64_t B, const char* op,
                   const char* name);

void init_device(nb::module_& m);
void init_ops_util(nb::module_& m);

}  // namespace memra::py
