// Status -> Python exception, and the DLPack argument checks (common.h).
#include <cstring>
#include "memra/msg.h"

#include <nanobind/stl/string.h>

#include "common.h"

namespace memra::py {

namespace {

// The memra.errors class for a status band (DESIGN.md "Status codes").
const char* error_class_for(int code) {
  if (code >= 50000) return "UnsupportedError";
  if (code >= 40000) return "ContractError";
  if (code == kCacheFull) return "CacheFullError";
  if (code >= 30000) return "OutOfMemoryError";
  if (code >= 20000) return "LibraryError";
  if (code >= 10000) return "CudaError";
  return "MemraError";
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
  }
  return std::string(kind) + std::to_string(a.dtype().bits);
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

}  // namespace

void check_array(const AnyArray& a, const char* op, const char* name,
                 std::initializer_list<int64_t> shape, const char* want_dtype, bool dtype_ok,
                 int device_type, int device_id, bool any_shape) {
  Msg os;
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
}

bool has_dtype(const AnyArray& a, nb::dlpack::dtype_code c, int bits) {
  return a.dtype().code == static_cast<uint8_t>(c) && a.dtype().bits == bits &&
         a.dtype().lanes == 1;
}

bool has_bf16(const AnyArray& a) {
  return has_dtype(a, nb::dlpack::dtype_code::Bfloat, 16) ||
         has_dtype(a, nb::dlpack::dtype_code::UInt, 16);
}

void raise_status(const Status& st) {
  nb::object errors = nb::module_::import_("memra.errors");
  nb::object cls = errors.attr(error_class_for(st.code));
  nb::object exc = cls(st.message, st.code);
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw nb::python_error();
}

void raise_contract(int code, const std::string& message) { raise_status(Status(code, message)); }

std::string shape_str(const AnyArray& a) {
  Msg os;
  os << "[";
  for (size_t i = 0; i < a.ndim(); ++i) os << (i ? ", " : "") << a.shape(i);
  os << "]";
  return os.str();
}

const int32_t* i32_arg(const AnyArray& a, const char* op, const char* name,
                       std::initializer_list<int64_t> shape) {
  check_array(a, op, name, shape, "int32", has_dtype(a, nb::dlpack::dtype_code::Int, 32),
              nb::device::cpu::value, 0);
  return static_cast<const int32_t*>(a.data());
}

NpF32 new_f32(std::vector<size_t> shape) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  float* data = new float[n > 0 ? n : 1]();
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return NpF32(data, shape.size(), shape.data(), owner);
}

NpI32 new_i32(std::vector<size_t> shape) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  int32_t* data = new int32_t[n > 0 ? n : 1]();
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
  return NpI32(data, shape.size(), shape.data(), owner);
}

Weight weight_from_array(const AnyArray& a, const std::string& dtype, const char* name) {
  Msg os;
  if (a.device_type() != nb::device::cpu::value) {
    os << "Weight: tensor '" << name << "' must be given in host memory";
    raise_contract(kContractDevice, os.str());
  }
  if (!c_contiguous(a)) {
    os << "Weight: tensor '" << name << "' with shape " << shape_str(a) << " must be C-contiguous";
    raise_contract(kContractStride, os.str());
  }
  if (a.ndim() < 1 || a.ndim() > 4) {
    os << "Weight: tensor '" << name << "' must have rank 1..4, got shape " << shape_str(a);
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
    os << "Weight: tensor '" << name << "' has unsupported dtype " << dtype_str(a)
       << (dtype.empty() ? "" : " (declared " + dtype + ")")
       << "; expected float32, float16, or bfloat16 (raw uint16 bits with dtype='bfloat16')";
    raise_contract(kContractDType, os.str());
  }
  if (!dtype.empty() && dtype != dtype_name(dt)) {
    os << "Weight: tensor '" << name << "' declared as " << dtype << " but holds "
       << dtype_name(dt);
    raise_contract(kContractDType, os.str());
  }
  std::vector<int64_t> shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(static_cast<int64_t>(a.shape(i)));
  return Weight(dt, shape, a.data());
}

}  // namespace memra::py
