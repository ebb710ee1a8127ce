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

// An array argument as the caller gave it. Its caster (below) takes any object but memra's own:
// a DLPack or buffer-protocol array (numpy, torch, cupy, memra.DeviceArray, ...) becomes a view,
// a numpy array of ml_dtypes bfloat16 a DLPack bfloat16 view of the same memory; anything else
// (a list, a scalar, a big-endian or object array, ...) an invalid AnyArray that says why, so
// that check_array (and f32_in, i32_in, ... built on it) raises ContractError naming the op, the
// argument and the value instead of nanobind's bare TypeError. (None never reaches a caster:
// nanobind refuses it for arguments not marked .none(), and bind_arguments.cpp names those.)
// In an overload set the first, converting-nothing pass takes real arrays only; the second
// takes anything into the first array overload, so an overload for some other kind of value
// (a list) must come before it.
class AnyArray : public nb::ndarray<nb::ro> {
 public:
  AnyArray() = default;
  explicit AnyArray(nb::ndarray<nb::ro> a) : nb::ndarray<nb::ro>(std::move(a)) {}
  // Why the value is not a usable array, as "got ..." continues it (empty when it is one).
  // Raises instead what the producer's __dlpack__ raised when that was no refusal of the value
  // (KeyboardInterrupt, MemoryError), so a Ctrl-C during the export is not lost.
  const std::string& refusal() const;

 private:
  friend struct nb::detail::type_caster<AnyArray>;
  std::string refusal_;
  nb::object raised_;
};
// A fresh C-contiguous host array handed back to Python as numpy.
using NpF32 = nb::ndarray<nb::numpy, float>;
using NpI32 = nb::ndarray<nb::numpy, int32_t>;

// Raise the memra.errors class for `st.code`'s band with `st.message` (never returns).
[[noreturn]] void raise_status(const Status& st);
// The same, only setting the Python error (for exception translators).
void set_status_error(const Status& st);
// The op whose array arguments were checked last on this thread (check_array): the op a host
// allocation failure belongs to, named without threading the name through every helper.
const char* last_checked_op();
// Raise when !st.ok().
inline void check(const Status& st) {
  if (!st.ok()) raise_status(st);
}
[[noreturn]] void raise_contract(int code, const std::string& message);
// CONTRACT_VALUE when the bytes [a, a + a_bytes) and [b, b + b_bytes) overlap: an op that
// writes `b` in place while it reads `a` would read rows it has already written (the CPU's
// row-by-row copies) or race with itself (a CUDA kernel). Empty ranges never overlap.
void check_disjoint(const char* op, const char* a_name, const void* a, size_t a_bytes,
                    const char* b_name, const void* b, size_t b_bytes);
// A named byte range an op reads or writes, for check_all_disjoint.
struct Span {
  std::string name;
  const void* data;
  size_t bytes;
};
// CONTRACT_VALUE naming the first two of `spans` (the arrays an op writes in place, sorted by
// address here) that overlap: two of them sharing memory would have the op's writes race or land
// in each other. Empty spans never overlap.
void check_all_disjoint(const char* op, std::vector<Span> spans);

std::string shape_str(const AnyArray& a);
// The array's element type: int32, uint64, float16, bfloat16, ... (bool as bool8).
std::string dtype_str(const AnyArray& a);
// True when `a` holds scalars of DLPack type `c` with `bits` bits (one lane).
bool has_dtype(const AnyArray& a, nb::dlpack::dtype_code c, int bits);
// True when `a` holds bfloat16: DLPack bfloat16, or uint16 carrying the raw bfloat16 bits.
bool has_bf16(const AnyArray& a);

// Check that `a` is a C-contiguous host int32 array whose shape matches `shape` (-1 = any extent)
// and return its data (host-side slot lists); `op` and `name` go into the error message. int64
// arrays are NOT silently narrowed. Arrays on either backend: f32_in / i32_in (device_args.h).
const int32_t* i32_arg(const AnyArray& a, const char* op, const char* name,
                       std::initializer_list<int64_t> shape);
// The shared DLPack checks (args.cpp): a usable array, device, dtype, shape (-1 = any extent),
// C-contiguity. `op` must be a string literal: it stays the thread's current op, which names an
// output allocation's OutOfMemoryError.
void check_array(const AnyArray& a, const char* op, const char* name,
                 std::initializer_list<int64_t> shape, const char* want_dtype, bool dtype_ok,
                 int device_type, int device_id, bool any_shape = false);

// Extent `dim` of a checked array.
inline int64_t dim(const AnyArray& a, size_t i) { return static_cast<int64_t>(a.shape(i)); }
// Extent i of a as the int an op's parameters take: ContractError (CONTRACT_RANGE) naming op and
// the argument past INT32_MAX (a zero-byte [2^31, 0] array gets there), never a wrapped count.
int dim32(const AnyArray& a, size_t i, const char* op, const char* name);

// New zero-filled host arrays owned by Python.
NpF32 new_f32(std::vector<size_t> shape);
NpI32 new_i32(std::vector<size_t> shape);

// Build a Weight from a host array of float32, float16, or bfloat16. bfloat16 arrives either as
// a DLPack bfloat16 tensor (torch) or as a uint16 array holding the raw bits with
// dtype="bfloat16" (numpy + ml_dtypes through .view(np.uint16)).
Weight weight_from_array(const AnyArray& a, const std::string& dtype, const char* name);

// An int argument that refuses a bool (nanobind's int caster takes True as 1): a cache slot,
// layer or count given as True is a mistake to name (memra._arguments.explain does), not slot 1.
struct Index {
  int value;
  operator int() const { return value; }  // NOLINT: an int in every other respect
};

// An owner token (Cache.hold's) that refuses a bool as Index does: owner=True would otherwise be
// token 1, the first hold() of the process.
struct Token {
  uint64_t value;
  operator uint64_t() const { return value; }  // NOLINT: a uint64 in every other respect
};

// Whether obj is a torch.Tensor (false while torch is not imported; never imports it).
bool is_torch_tensor(nb::handle obj);

// The AnyArray caster's work (args.cpp): false only for objects of memra's own classes.
bool array_from_python(nb::handle src, uint32_t flags, nb::detail::cleanup_list* cleanup,
                       AnyArray* out) noexcept;

// Bytes of a new output array of `shape` with `item`-byte elements. OutOfMemoryError naming the
// op (the last one whose arguments were checked on this thread) before anything is allocated
// when the size overflows or, on the host, exceeds the memory available now (a device
// allocation that does not fit fails in cudaMalloc with the same error).
size_t host_bytes(const std::vector<size_t>& shape, size_t item);
size_t device_bytes(const std::vector<size_t>& shape, size_t item);
// A zero-filled host buffer (new uint8_t[]; OutOfMemoryError when it cannot be had).
void* new_host_zeroed(size_t bytes);

void init_errors(nb::module_& m);
void init_arguments(nb::module_& m);
void init_weight(nb::module_& m);
void init_ops_basic(nb::module_& m);
void init_ops_kda(nb::module_& m);
void init_ops_gdn(nb::module_& m);
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
void init_ops_attention(nb::module_& m);
void init_layers_attention(nb::module_& m);
void init_layers_gdn(nb::module_& m);
void init_copies(nb::module_& m);

}  // namespace memra::py

namespace nanobind::detail {

template <>
struct type_caster<memra::py::AnyArray> {
  // Rendered as the plain ndarray argument (the stubs are unchanged).
  NB_TYPE_CASTER(memra::py::AnyArray, make_caster<ndarray<ro>>::Name)

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    return memra::py::array_from_python(src, flags, cleanup, &value);
  }
  static handle from_cpp(const memra::py::AnyArray& a, rv_policy policy,
                         cleanup_list* cleanup) noexcept {
    return make_caster<ndarray<ro>>::from_cpp(a, policy, cleanup);
  }
  // An invalid array reads as rank 0 with zero extents, never through a null shape. `raised`:
  // the exception refusal() re-raises (none: it returns `why`).
  static void refuse(memra::py::AnyArray* a, std::string why, object raised = object()) {
    static const int64_t zeros[8] = {};
    a->refusal_ = std::move(why);
    a->raised_ = std::move(raised);
    a->m_dltensor.shape = const_cast<int64_t*>(zeros);
    a->m_dltensor.strides = const_cast<int64_t*>(zeros);
  }
};

// The caster of an integer wrapper W (Index, Token) holding a Raw: Raw's conversion, but a bool
// is refused.
template <class W, class Raw>
struct no_bool_caster {
  NB_TYPE_CASTER(W, const_name("int"))

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    if (PyBool_Check(src.ptr())) return false;
    make_caster<Raw> c;
    if (!c.from_python(src, flags, cleanup)) return false;
    value.value = c.value;
    return true;
  }
  static handle from_cpp(W w, rv_policy policy, cleanup_list* cleanup) noexcept {
    return make_caster<Raw>::from_cpp(w.value, policy, cleanup);
  }
};

template <>
struct type_caster<memra::py::Index> : no_bool_caster<memra::py::Index, int> {};
template <>
struct type_caster<memra::py::Token> : no_bool_caster<memra::py::Token, uint64_t> {};

}  // namespace nanobind::detail
