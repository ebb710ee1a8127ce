// Shared helpers of the binding layer: Status -> named Python exception, and DLPack argument
// checks that turn a wrong dtype / rank / shape / device / stride into a ContractError naming
// the op, the argument and the offending values (instead of nanobind's generic TypeError).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "memra/status.h"
#include "memra/tensor.h"

namespace memra::py {

namespace nb = nanobind;

// Any DLPack-capable array (numpy, torch, cupy, ...); checked by the helpers below.
using AnyArray = nb::ndarray<nb::ro>;
// A fresh C-contiguous host array handed back to Python as numpy.
using NpF32 = nb::ndarray<nb::numpy, float>;
using NpI32 = nb::ndarray<nb::numpy, int32_t>;

// Raise the memra.errors class for `st.code`'s band with `st.message` (never returns).
[[noreturn]] void raise_status(const Status& st);
// Raise when !st.ok().
inline void check(const Status& st) {
  if (!st.ok()) raise_status(st);
}
[[noreturn]] void raise_contract(int code, const std::string& message);

std::string shape_str(const AnyArray& a);
// True when `a` holds scalars of DLPack type `c` with `bits` bits (one lane).
bool has_dtype(const AnyArray& a, nb::dlpack::dtype_code c, int bits);
// True when `a` holds bfloat16: DLPack bfloat16, or uint16 carrying the raw bfloat16 bits.
bool has_bf16(const AnyArray& a);

// Check that `a` is a C-contiguous host int32 array whose shape matches `shape` (-1 = any extent)
// and return its data (host-side slot lists); `op` and `name` go into the error message. int64
// arrays are NOT silently narrowed. Arrays on either backend: f32_in / i32_in (device_args.h).
const int32_t* i32_arg(const AnyArray& a, const char* op, const char* name,
                       std::initializer_list<int64_t> shape);
// The shared DLPack checks (args.cpp): device, dtype, shape (-1 = any extent), C-contiguity.
void check_array(const AnyArray& a, const char* op, const char* name,
                 std::initializer_list<int64_t> shape, const char* want_dtype, bool dtype_ok,
                 int device_type, int device_id, bool any_shape = false);

// Extent `dim` of a checked array.
inline int64_t dim(const AnyArray& a, size_t i) { return static_cast<int64_t>(a.shape(i)); }

// New zero-filled host arrays owned by Python.
NpF32 new_f32(std::vector<size_t> shape);
NpI32 new_i32(std::vector<size_t> shape);

// Build a Weight from a host array of float32, float16, or bfloat16. bfloat16 arrives either as
// a DLPack bfloat16 tensor (torch) or as a uint16 array holding the raw bits with
// dtype="bfloat16" (numpy + ml_dtypes through .view(np.uint16)).
Weight weight_from_array(const AnyArray& a, const std::string& dtype, const char* name);

void init_errors(nb::module_& m);
void init_weight(nb::module_& m);
void init_ops_basic(nb::module_& m);
void init_ops_kda(nb::module_& m);
void init_ops_mla(nb::module_& m);
void init_ops_mlp(nb::module_& m);
void init_ops_moe(nb::module_& m);
void init_ops_sample(nb::module_& m);
void init_ops_mhc(nb::module_& m);
void init_ops_dsa(nb::module_& m);
void init_engine(nb::module_& m);
void init_graph(nb::module_& m);
void init_cache(nb::module_& m);
void init_layers(nb::module_& m);

}  // namespace memra::py
