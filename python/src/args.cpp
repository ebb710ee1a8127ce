// Status -> Python exception, the AnyArray caster and the DLPack argument checks (common.h).
#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include <nanobind/stl/string.h>

#include "common.h"
#include "memra/host_memory.h"
#include "memra/msg.h"

namespace memra::py {

namespace {

// The memra.errors class for a status band (cpp/include/memra/status.h).
const char* error_class_for(int code) {
  if (code >= 60000) return "NonFiniteError";
  if (code >= 50000) return "UnsupportedError";
  if (code >= 40000) return "ContractError";
  if (code == kCacheFull) return "CacheFullError";
  if (code >= 30000) return "OutOfMemoryError";
  if (code >= 20000) return "LibraryError";
  if (code >= 10000) return "CudaError";
  return "MemraError";
}


bool c_contiguous(const AnyArray& a) {
  // An array with a zero extent holds no elements: any strides describe it (numpy gives 0s).
  for (size_t i = 0; i < a.ndim(); ++i) {
    if (a.shape(i) == 0) return true;
  }
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) return false;
    expect *= static_cast<int64_t>(a.shape(i));
  }
  return true;
}

// `text` (a repr, an error message) on one line, with its runs of blanks cut, at most `max`
// characters.
std::string one_line(nb::handle text, size_t max) {
  std::string r = "?";
  try {
    if (text.is_valid()) r = nb::cast<std::string>(text);
  } catch (...) {
    PyErr_Clear();
  }
  std::string line;
  for (char c : r) {
    if (c == '\n' || c == ' ') {
      if (!line.empty() && line.back() != ' ') line += ' ';
    } else {
      line += c;
    }
  }
  return line.size() > max ? line.substr(0, max - 3) + "..." : line;
}

// A short, safe repr of a value for an error message: "[[1, 2], [3]] (list)". A multi-line
// repr (torch's sparse and nested tensors) comes on one line.
std::string show(nb::handle v) {
  nb::object repr = nb::steal(PyObject_Repr(v.ptr()));
  if (!repr.is_valid()) PyErr_Clear();
  return one_line(repr, 60) + " (" + std::string(nb::type_name(v.type()).c_str()) + ")";
}

// An exception as "RuntimeError: its message", on one line.
std::string show_error(nb::handle e) {
  nb::object text = nb::steal(PyObject_Str(e.ptr()));
  if (!text.is_valid()) PyErr_Clear();
  return std::string(Py_TYPE(e.ptr())->tp_name) + ": " + one_line(text, 200);
}

// Why `src`, which is no DLPack or buffer-protocol array, cannot be taken as one.
std::string refusal_of(nb::handle src) {
  if (is_torch_tensor(src)) {  // torch exports dense, strided tensors in memory only
    const std::string what = show(src);
    if (nb::cast<bool>(src.attr("is_meta"))) return what + ": a tensor on torch's meta device has no memory";
    if (nb::cast<bool>(src.attr("is_quantized"))) return what + ": a quantized tensor (call .dequantize())";
    if (nb::cast<bool>(src.attr("is_nested"))) return what + ": a nested tensor (DLPack holds dense tensors)";
    const std::string layout = nb::cast<std::string>(nb::repr(src.attr("layout")));
    if (layout != "torch.strided") {
      return what + ": a tensor of layout " + layout + " (DLPack holds dense, strided tensors: call .to_dense())";
    }
    return what;
  }
  if (nb::hasattr(src, "__array_interface__") && nb::hasattr(src, "dtype")) {
    nb::object dt = src.attr("dtype");
    const std::string name = nb::cast<std::string>(dt.attr("name"));
    if (!nb::cast<bool>(dt.attr("isnative"))) {
      return "a big-endian " + name + " array (convert it with a.astype(a.dtype.newbyteorder('=')))";
    }
    return "an array of dtype " + name + ", which has no DLPack form";
  }
  return show(src);
}

// `src`, or a memoryview of it where its buffer comes without strides: ctypes arrays export
// Py_buffer.strides as null even when strides are asked for, and nanobind's buffer import reads
// them. A memoryview fills them in over the same memory (zero-copy, writable as `src` is).
nb::object with_strides(nb::handle src) {
  PyObject* o = src.ptr();
  if (PyCapsule_CheckExact(o) || PyMemoryView_Check(o) || PyType_Check(o) || !PyObject_CheckBuffer(o) ||
      nb::hasattr(src, "__dlpack__")) {
    return nb::borrow(src);
  }
  Py_buffer view;
  if (PyObject_GetBuffer(o, &view, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return nb::borrow(src);
  }
  const bool strideless = view.ndim > 0 && view.strides == nullptr;
  PyBuffer_Release(&view);
  if (!strideless) return nb::borrow(src);
  nb::object mv = nb::steal(PyMemoryView_FromObject(o));
  if (!mv.is_valid()) PyErr_Clear();
  return mv.is_valid() ? mv : nb::borrow(src);
}

// A numpy array of ml_dtypes bfloat16 (which has no DLPack or buffer form) as a DLPack bfloat16
// view of the same memory: the view keeps the array alive. False for anything else.
bool bf16_view(nb::handle src, uint32_t flags, nb::detail::cleanup_list* cleanup, AnyArray* out) {
  if (!nb::hasattr(src, "__array_interface__") || !nb::hasattr(src, "dtype") ||
      nb::cast<std::string>(src.attr("dtype").attr("name")) != "bfloat16") {
    return false;
  }
  nb::object bits = src.attr("view")("uint16");
  nb::detail::make_caster<nb::ndarray<nb::ro>> strict;
  if (!strict.from_python(bits, flags, cleanup)) return false;
  const nb::ndarray<nb::ro>& u = strict.value;
  std::vector<size_t> shape(u.ndim());
  std::vector<int64_t> strides(u.ndim());
  for (size_t i = 0; i < u.ndim(); ++i) {
    shape[i] = u.shape(i);
    strides[i] = u.stride(i);
  }
  const nb::dlpack::dtype bf16{uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
  *out = AnyArray(nb::ndarray<nb::ro>(u.data(), u.ndim(), shape.data(), bits, strides.data(), bf16,
                                      u.device_type(), u.device_id()));
  return true;
}

// Why an array the DLPack caster took still cannot be used ("" when it can): a null data
// pointer behind a non-empty shape (a torch tensor whose storage was freed, as FSDP frees
// parameters: every read would fault), or a torch tensor with its negative bit set (torch
// exports the memory, which holds the values negated, and the bit is not part of DLPack).
std::string unusable(nb::handle src, const AnyArray& a) {
  if (a.data() == nullptr && a.size() > 0) {
    return "a tensor of shape " + shape_str(a) + " with no memory behind it (a null data pointer: "
           "its storage was freed)";
  }
  if (is_torch_tensor(src) && nb::cast<bool>(src.attr("is_neg")())) {
    return "a torch tensor with its negative bit set, whose memory holds the values negated "
           "(call .resolve_neg() first)";
  }
  return {};
}

}  // namespace

bool is_torch_tensor(nb::handle obj) {
  // torch.Tensor, looked up once torch is imported (memra never imports it).
  static PyObject* tensor_type = nullptr;
  if (!tensor_type) {
    PyObject* torch = PyImport_GetModule(nb::str("torch").ptr());
    if (!torch) {
      PyErr_Clear();
      return false;
    }
    tensor_type = PyObject_GetAttrString(torch, "Tensor");  // kept for the process
    Py_DECREF(torch);
    if (!tensor_type) {
      PyErr_Clear();
      return false;
    }
  }
  const int r = PyObject_IsInstance(obj.ptr(), tensor_type);
  if (r < 0) PyErr_Clear();
  return r == 1;
}

std::string dtype_str(const AnyArray& a) {
  const char* kind = "?";
  switch (static_cast<nb::dlpack::dtype_code>(a.dtype().code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: kind = "bool"; break;
    default:  // float8 / float4 and other newer DLPack codes
      return "DLPack type code " + std::to_string(a.dtype().code) + " of " +
             std::to_string(a.dtype().bits) + " bits";
  }
  return std::string(kind) + std::to_string(a.dtype().bits);
}

const std::string& AnyArray::refusal() const {
  if (raised_.is_valid()) {
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(raised_.ptr())), raised_.ptr());
    throw nb::python_error();
  }
  return refusal_;
}

namespace {

// The DLPack capsule that `export_` (a producer's bound __dlpack__, not memra's own: DeviceArray
// is taken by its own overloads) gives: memra asks for it before nanobind does, because nanobind
// clears the error of an export that raises, and a Ctrl-C inside a Python __dlpack__ (torch's)
// would be lost, a producer's refusal reported as a wrong type. Asked as nanobind asks: without
// max_version (memra only reads), with it when the producer refuses that with BufferError (a
// read-only numpy array) or TypeError. None when the producer gives no capsule (nanobind then
// tries its own ways) or raises (*raised: the first error).
nb::object dlpack_capsule(nb::handle export_, nb::object* raised) {
  try {
    nb::object capsule;
    try {
      capsule = export_();
    } catch (nb::python_error& e) {
      if (!e.matches(PyExc_BufferError) && !e.matches(PyExc_TypeError)) throw;
      try {
        capsule = export_(nb::arg("max_version") = nb::make_tuple(nb::dlpack::major_version,
                                                                 nb::dlpack::minor_version));
      } catch (nb::python_error&) {
        throw e;  // the first refusal says why; the retry was nanobind's fallback
      }
    }
    return PyCapsule_CheckExact(capsule.ptr()) ? capsule : nb::object();
  } catch (nb::python_error& e) {
    *raised = nb::borrow(e.value());
    return nb::object();
  }
}

// Whether the producer's error is for the caller to see as it is (a Ctrl-C, SystemExit, out of
// memory) rather than the reason its value is refused.
bool passes_through(nb::handle error) {
  return !PyErr_GivenExceptionMatches(error.ptr(), PyExc_Exception) ||
         PyErr_GivenExceptionMatches(error.ptr(), PyExc_MemoryError);
}

}  // namespace

bool array_from_python(nb::handle src, uint32_t flags, nb::detail::cleanup_list* cleanup,
                       AnyArray* out) noexcept {
  try {
    nb::detail::make_caster<nb::ndarray<nb::ro>> strict;
    const bool convert = flags & uint32_t(nb::detail::cast_flags::convert);
    nb::object arg;     // what nanobind imports: the producer's capsule, else src itself
    nb::object raised;  // what the producer's __dlpack__ raised
    if (!PyCapsule_CheckExact(src.ptr()) && !PyType_Check(src.ptr()) && !nb::inst_check(src)) {
      nb::object export_ = nb::getattr(src, "__dlpack__", nb::none());
      if (!export_.is_none()) arg = dlpack_capsule(export_, &raised);
      if (raised.is_valid() && passes_through(raised)) {
        *out = AnyArray();
        nb::detail::type_caster<AnyArray>::refuse(out, "", std::move(raised));
        return true;
      }
    }
    if (!arg.is_valid()) arg = with_strides(src);
    if (strict.from_python(arg, flags, cleanup)) {
      AnyArray a(std::move(strict.value));
      std::string why = unusable(src, a);
      if (why.empty()) {
        *out = std::move(a);
        return true;
      }
      // Refused in either pass: no other overload could use it, and a capsule read in the
      // first pass is consumed, so the second could no longer say why.
      *out = AnyArray();
      nb::detail::type_caster<AnyArray>::refuse(out, std::move(why));
      return true;
    }
    // nanobind's first pass over an overload set converts nothing: take real arrays only, so
    // that an overload taking the value as it is wins. memra's own objects are never arrays (an
    // overload taking a DecodeSlots gets them in either pass).
    if (!convert || nb::inst_check(src)) return false;
    // A class (np.ndarray itself) has numpy's attributes as descriptors, which the probes
    // below would read as an array's.
    const bool cls = PyType_Check(src.ptr());
    if (!cls && bf16_view(src, flags, cleanup, out)) return true;
    std::string why = cls ? show(src) : refusal_of(src);
    // nanobind's own ways failed too (torch's to_dlpack takes a tensor that requires grad)
    if (raised.is_valid()) why += " (its __dlpack__() raised " + show_error(raised) + ")";
    *out = AnyArray();
    nb::detail::type_caster<AnyArray>::refuse(out, std::move(why));
    return true;
  } catch (...) {
    PyErr_Clear();
    return false;
  }
}

namespace {

// The op whose array arguments were checked last on this thread: every op checks its inputs
// before it allocates its outputs, so this names the op in an output's OutOfMemoryError without
// threading the name through every output helper.
thread_local const char* g_checking = "memra";

constexpr size_t kOverflow = std::numeric_limits<size_t>::max();

// Bytes of an array of `shape` with `item`-byte elements; kOverflow when that overflows.
size_t bytes_of(const std::vector<size_t>& shape, size_t item) {
  size_t n = item;
  for (size_t s : shape) {
    if (s != 0 && n > kOverflow / s) return kOverflow;
    n *= s;
  }
  return n;
}

[[noreturn]] void raise_oversized(const std::vector<size_t>& shape, size_t item, const char* where,
                                  const std::string& why) {
  Msg os;
  os << g_checking << ": an output of shape [";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "] (" << item << "-byte elements) " << why << " (" << where << ")";
  raise_status(Status(kOutOfMemory, os.str()));
}

}  // namespace

size_t host_bytes(const std::vector<size_t>& shape, size_t item) {
  // Below this size an array is allocated without asking (a failure still becomes
  // OutOfMemoryError); above it /proc/meminfo is read first (one file read per large array).
  constexpr size_t kAskAbove = size_t(64) << 20;
  const size_t n = bytes_of(shape, item);
  if (n == kOverflow) raise_oversized(shape, item, "host", "overflows size_t");
  const int64_t avail = n > kAskAbove ? available_host_bytes() : -1;
  if (avail >= 0 && n > static_cast<size_t>(avail)) {
    raise_oversized(shape, item, "host", "needs " + std::to_string(n) + " bytes, but only " +
                                             std::to_string(avail) + " are available");
  }
  return n;
}

size_t device_bytes(const std::vector<size_t>& shape, size_t item) {
  const size_t n = bytes_of(shape, item);
  if (n == kOverflow) raise_oversized(shape, item, "device", "overflows size_t");
  return n;
}

void* new_host_zeroed(size_t bytes) {
  void* p = new (std::nothrow) uint8_t[bytes > 0 ? bytes : 1]();
  if (!p) {
    raise_status(Status(kOutOfMemory, std::string(g_checking) + ": allocating " +
                                          std::to_string(bytes) + " bytes of host memory failed"));
  }
  return p;
}

void check_array(const AnyArray& a, const char* op, const char* name,
                 std::initializer_list<int64_t> shape, const char* want_dtype, bool dtype_ok,
                 int device_type, int device_id, bool any_shape) {
  g_checking = op;
  Msg os;
  if (!a.is_valid()) {
    os << op << ": argument '" << name << "' must be "
       << (want_dtype && *want_dtype
               ? std::string(std::strchr("aeiou", *want_dtype) ? "an " : "a ") + want_dtype + " array"
               : "an array")
       << ", got " << a.refusal();
    raise_contract(kContractDType, os.str());
  }
  if (device_type == nb::device::cpu::value && a.device_type() != nb::device::cpu::value) {
    os << op << ": argument '" << name << "' must live in host memory for the CPU backend, got "
       << "a tensor on DLPack device type " << a.device_type();
    raise_contract(kContractDevice, os.str());
  }
  if (device_type != nb::device::cpu::value &&
      (a.device_type() != device_type || a.device_id() != device_id)) {
    os << op << ": argument '" << name << "' must live on the engine's device (cuda:" << device_id
       << "), got a tensor on DLPack device type " << a.device_type() << " id " << a.device_id()
       << " (move it with engine.to_device())";
    raise_contract(kContractDevice, os.str());
  }
  if (!dtype_ok) {
    os << op << ": argument '" << name << "' must be " << want_dtype << ", got " << dtype_str(a);
    raise_contract(kContractDType, os.str());
  }
  bool shape_ok = any_shape || a.ndim() == shape.size();
  size_t i = 0;
  for (int64_t s : shape) {
    if (!shape_ok || any_shape) break;
    if (s >= 0 && static_cast<int64_t>(a.shape(i)) != s) shape_ok = false;
    ++i;
  }
  if (!shape_ok) {
    os << op << ": argument '" << name << "' has shape " << shape_str(a) << ", expected [";
    i = 0;
    for (int64_t s : shape) os << (i++ ? ", " : "") << (s >= 0 ? std::to_string(s) : "*");
    os << "]";
    raise_contract(kContractShape, os.str());
  }
  if (!c_contiguous(a)) {
    os << op << ": argument '" << name << "' with shape " << shape_str(a)
       << " must be C-contiguous (call .contiguous() / np.ascontiguousarray first)";
    raise_contract(kContractStride, os.str());
  }
  // Every op takes its extents as 32-bit counts (the ABI structs' int fields): an extent past
  // INT32_MAX would wrap to another geometry and the op would run on it. Refused here, for every
  // array of every op, so no binding's int(...) of an extent can wrap.
  for (size_t d = 0; d < a.ndim(); ++d) dim32(a, d, op, name);
}

bool has_dtype(const AnyArray& a, nb::dlpack::dtype_code c, int bits) {
  return a.dtype().code == static_cast<uint8_t>(c) && a.dtype().bits == bits &&
         a.dtype().lanes == 1;
}

bool has_bf16(const AnyArray& a) {
  return has_dtype(a, nb::dlpack::dtype_code::Bfloat, 16) ||
         has_dtype(a, nb::dlpack::dtype_code::UInt, 16);
}

void set_status_error(const Status& st) {
  nb::object errors = nb::module_::import_("memra.errors");
  nb::object cls = errors.attr(error_class_for(st.code));
  nb::object exc = cls(st.message, st.code);
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

void raise_status(const Status& st) {
  set_status_error(st);
  throw nb::python_error();
}

const char* last_checked_op() { return g_checking; }

void raise_contract(int code, const std::string& message) { raise_status(Status(code, message)); }

void check_disjoint(const char* op, const char* a_name, const void* a, size_t a_bytes,
                    const char* b_name, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return;
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  if (a0 < b0 + b_bytes && b0 < a0 + a_bytes) {
    Msg os;
    os << op << ": argument '" << a_name << "' overlaps '" << b_name << "' in memory (the op "
       << "writes '" << b_name << "' in place while it reads '" << a_name
       << "'); pass a copy (np.array(x) / x.clone())";
    raise_contract(kContractValue, os.str());
  }
}

void check_all_disjoint(const char* op, std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) {
    return reinterpret_cast<uintptr_t>(x.data) < reinterpret_cast<uintptr_t>(y.data);
  });
  // Sorted by start, any overlapping pair implies an overlapping neighbour: keep the span
  // reaching furthest so far and test each next one against it.
  const Span* reach = nullptr;
  for (const Span& x : spans) {
    if (x.bytes == 0) continue;
    const uintptr_t x0 = reinterpret_cast<uintptr_t>(x.data);
    if (reach && x0 < reinterpret_cast<uintptr_t>(reach->data) + reach->bytes) {
      Msg os;
      os << op << ": arguments '" << reach->name << "' and '" << x.name << "' share memory, "
         << "and the op writes both in place: give each its own array";
      raise_contract(kContractValue, os.str());
    }
    if (!reach || x0 + x.bytes > reinterpret_cast<uintptr_t>(reach->data) + reach->bytes) {
      reach = &x;
    }
  }
}

std::string shape_str(const AnyArray& a) {
  Msg os;
  os << "[";
  for (size_t i = 0; i < a.ndim(); ++i) os << (i ? ", " : "") << a.shape(i);
  os << "]";
  return os.str();
}

int dim32(const AnyArray& a, size_t i, const char* op, const char* name) {
  const int64_t n = dim(a, i);
  if (n > std::numeric_limits<int32_t>::max()) {
    raise_contract(kContractRange, std::string(op) + ": argument '" + name + "' has shape " +
                                       shape_str(a) + ", an extent past int32");
  }
  return static_cast<int>(n);
}

const int32_t* i32_arg(const AnyArray& a, const char* op, const char* name,
                       std::initializer_list<int64_t> shape) {
  check_array(a, op, name, shape, "int32", has_dtype(a, nb::dlpack::dtype_code::Int, 32),
              nb::device::cpu::value, 0);
  return static_cast<const int32_t*>(a.data());
}

NpF32 new_f32(std::vector<size_t> shape) {
  float* data = static_cast<float*>(new_host_zeroed(host_bytes(shape, sizeof(float))));
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
  return NpF32(data, shape.size(), shape.data(), owner);
}

NpI32 new_i32(std::vector<size_t> shape) {
  int32_t* data = static_cast<int32_t*>(new_host_zeroed(host_bytes(shape, sizeof(int32_t))));
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
  return NpI32(data, shape.size(), shape.data(), owner);
}

Weight weight_from_array(const AnyArray& a, const std::string& dtype, const char* name) {
  Msg os;
  if (!a.is_valid()) {
    os << "Weight: argument 'array' (tensor '" << name << "') must be an array, got " << a.refusal();
    raise_contract(kContractDType, os.str());
  }
  if (a.device_type() != nb::device::cpu::value) {
    os << "Weight: argument 'array' (tensor '" << name << "') must be given in host memory";
    raise_contract(kContractDevice, os.str());
  }
  if (!c_contiguous(a)) {
    os << "Weight: argument 'array' (tensor '" << name << "') with shape " << shape_str(a)
       << " must be C-contiguous";
    raise_contract(kContractStride, os.str());
  }
  if (a.ndim() < 1 || a.ndim() > 4) {
    os << "Weight: argument 'array' (tensor '" << name << "') must have rank 1..4, got shape "
       << shape_str(a);
    raise_contract(kContractShape, os.str());
  }
  DType dt;
  if (has_dtype(a, nb::dlpack::dtype_code::Float, 32)) {
    dt = DType::kF32;
  } else if (has_dtype(a, nb::dlpack::dtype_code::Float, 16)) {
    dt = DType::kF16;
  } else if (has_dtype(a, nb::dlpack::dtype_code::Bfloat, 16)) {
    dt = DType::kBF16;
  } else if (has_dtype(a, nb::dlpack::dtype_code::UInt, 16) && dtype == "bfloat16") {
    dt = DType::kBF16;
  } else {
    os << "Weight: argument 'array' (tensor '" << name << "') has unsupported dtype " << dtype_str(a)
       << (dtype.empty() ? "" : " (declared " + dtype + ")")
       << "; expected float32, float16, or bfloat16 (raw uint16 bits with dtype='bfloat16')";
    raise_contract(kContractDType, os.str());
  }
  if (!dtype.empty() && dtype != dtype_name(dt)) {
    os << "Weight: argument 'array' (tensor '" << name << "') declared as " << dtype << " but holds "
       << dtype_name(dt);
    raise_contract(kContractDType, os.str());
  }
  // The ops index a weight with 32-bit extents (see check_array), an empty one included.
  const std::string op = "Weight (tensor '" + std::string(name) + "')";
  std::vector<int64_t> shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(dim32(a, i, op.c_str(), "array"));
  return Weight(dt, shape, a.data());
}

}  // namespace memra::py
