// device_args.h: dual-backend argument checks and outputs; Engine.to_device / to_host and the
// DeviceWeight class.
#include "device_args.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <string>

#include "memra/decode_step.h"
#include "memra/msg.h"

namespace memra::py {

nb::object numpy_owning(uint8_t* p, const std::vector<size_t>& shape, nb::dlpack::dtype dtype) {
  nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<uint8_t*>(q); });
  const bool bf16 = dtype.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && dtype.bits == 16;
  nb::object a = nb::cast(nb::ndarray<nb::numpy>(p, shape.size(), shape.data(), owner, nullptr,
                                                 bf16 ? nb::dtype<uint16_t>() : dtype));
  return bf16 ? a.attr("view")(nb::module_::import_("ml_dtypes").attr("bfloat16")) : a;
}

namespace {

int device_type_of(const Engine* e) {
  return on_cuda(e) ? nb::device::cuda::value : nb::device::cpu::value;
}
int device_id_of(const Engine* e) { return on_cuda(e) ? e->device_index() : 0; }

Out out_on(const std::shared_ptr<CudaContext>& cuda, std::vector<size_t> shape,
           nb::dlpack::dtype dtype, size_t item, bool zero = true) {
  Out o;
  if (!cuda) {
    void* p = new_host_zeroed(host_bytes(shape, item));
    o.obj = numpy_owning(static_cast<uint8_t*>(p), shape, dtype);
    o.ptr = p;
    return o;
  }
  std::shared_ptr<DeviceBuffer> buf;
  check(DeviceBuffer::create(cuda, device_bytes(shape, item), &buf));
  if (zero) check(cuda->status(cuda->api().zero(cuda->ctx(), buf->data(), buf->bytes()), "output allocation"));
  o.ptr = buf->data();
  o.obj = device_array(std::move(buf), std::move(shape), dtype, cuda->device());
  return o;
}

Out out_of(const Engine* engine, std::vector<size_t> shape, nb::dlpack::dtype dtype, size_t item,
           bool zero = true) {
  static const std::shared_ptr<CudaContext> none;
  return out_on(on_cuda(engine) ? engine->cuda() : none, std::move(shape), dtype, item, zero);
}

nb::dlpack::dtype dtype_of(const AnyArray& a) { return a.dtype(); }

}  // namespace

const float* f32_in(const Engine* engine, const AnyArray& a, const char* op, const char* name,
                    std::initializer_list<int64_t> shape) {
  check_array(a, op, name, shape, "float32", has_dtype(a, nb::dlpack::dtype_code::Float, 32),
              device_type_of(engine), device_id_of(engine));
  return static_cast<const float*>(a.data());
}

const int32_t* i32_in(const Engine* engine, const AnyArray& a, const char* op, const char* name,
                      std::initializer_list<int64_t> shape) {
  check_array(a, op, name, shape, "int32", has_dtype(a, nb::dlpack::dtype_code::Int, 32),
              device_type_of(engine), device_id_of(engine));
  return static_cast<const int32_t*>(a.data());
}

const void* f32_or_bf16_in(const Engine* engine, const AnyArray& a, const char* op,
                           const char* name, std::initializer_list<int64_t> shape, int* dtype,
                           int want) {
  const bool f32 = has_dtype(a, nb::dlpack::dtype_code::Float, 32), bf16 = has_bf16(a);
  const char* what = want < 0    ? "float32 or bfloat16 (uint16 raw bits accepted)"
                     : want == 0 ? "float32 (the dtype of q)"
                                 : "bfloat16 (the dtype of q)";
  const bool ok = want < 0 ? (f32 || bf16) : (want == 0 ? f32 : bf16);
  check_array(a, op, name, shape, what, ok, device_type_of(engine), device_id_of(engine));
  *dtype = f32 ? 0 : 1;
  return a.data();
}

const uint64_t* u64_in(const Engine* engine, const AnyArray& a, const char* op, const char* name,
                       std::initializer_list<int64_t> shape) {
  check_array(a, op, name, shape, "uint64", has_dtype(a, nb::dlpack::dtype_code::UInt, 64),
              device_type_of(engine), device_id_of(engine));
  return static_cast<const uint64_t*>(a.data());
}

nb::object device_array(std::shared_ptr<DeviceBuffer> buffer, std::vector<size_t> shape,
                        nb::dlpack::dtype dtype, int device_id) {
  DeviceArray a;
  a.buffer = std::move(buffer);
  a.shape = std::move(shape);
  a.dtype = dtype;
  a.device = device_id;
  return nb::cast(std::move(a));
}

Out out_f32(const std::shared_ptr<CudaContext>& cuda, std::vector<size_t> shape, bool zero) {
  return out_on(cuda, std::move(shape), nb::dtype<float>(), sizeof(float), zero);
}
Out out_i32(const std::shared_ptr<CudaContext>& cuda, std::vector<size_t> shape, bool zero) {
  return out_on(cuda, std::move(shape), nb::dtype<int32_t>(), sizeof(int32_t), zero);
}

const float* f32_in(const std::shared_ptr<CudaContext>& cuda, const AnyArray& a, const char* op,
                    const char* name, std::initializer_list<int64_t> shape) {
  check_array(a, op, name, shape, "float32", has_dtype(a, nb::dlpack::dtype_code::Float, 32),
              cuda ? nb::device::cuda::value : nb::device::cpu::value, cuda ? cuda->device() : 0);
  return static_cast<const float*>(a.data());
}

const int32_t* i32_in(const std::shared_ptr<CudaContext>& cuda, const AnyArray& a, const char* op,
                      const char* name, std::initializer_list<int64_t> shape) {
  check_array(a, op, name, shape, "int32", has_dtype(a, nb::dlpack::dtype_code::Int, 32),
              cuda ? nb::device::cuda::value : nb::device::cpu::value, cuda ? cuda->device() : 0);
  return static_cast<const int32_t*>(a.data());
}

Out out_f32(const Engine* engine, std::vector<size_t> shape) {
  return out_of(engine, std::move(shape), nb::dtype<float>(), sizeof(float));
}
Out out_f32_uninit(const Engine* engine, std::vector<size_t> shape) {
  return out_of(engine, std::move(shape), nb::dtype<float>(), sizeof(float), false);
}
Out out_bf16_uninit(const Engine* engine, std::vector<size_t> shape) {
  const nb::dlpack::dtype bf16{uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
  return out_of(engine, std::move(shape), bf16, 2, false);
}
Out out_i32(const Engine* engine, std::vector<size_t> shape) {
  return out_of(engine, std::move(shape), nb::dtype<int32_t>(), sizeof(int32_t));
}
Out out_i32_uninit(const Engine* engine, std::vector<size_t> shape) {
  return out_of(engine, std::move(shape), nb::dtype<int32_t>(), sizeof(int32_t), false);
}

const CudaContext& cuda_ctx(const Engine* engine) {
  if (!on_cuda(engine)) raise_status(Status(kUnsupported, "this call needs a CUDA engine"));
  return *engine->cuda();
}

void check_cuda(const Engine* engine, int rc, const char* op) {
  if (rc != kOk) raise_status(cuda_ctx(engine).status(rc, op));
}

op::Backend backend(const Engine* engine) {
  return {on_cuda(engine) ? &cuda_ctx(engine) : nullptr};
}

std::shared_ptr<DeviceBuffer> device_scratch(const Engine* engine, size_t bytes) {
  std::shared_ptr<DeviceBuffer> b;
  check(DeviceBuffer::create(engine->cuda(), bytes, &b));
  return b;
}

std::shared_ptr<DeviceBuffer> device_upload(const Engine* engine, const void* host, size_t bytes) {
  auto b = device_scratch(engine, bytes);
  check_cuda(engine, cuda_ctx(engine).api().copy(cuda_ctx(engine).ctx(), b->data(), host, bytes),
             "host-to-device copy");
  return b;
}

void check_weight_2d(const Weight& w, const char* op, const char* name, int64_t rows, int64_t cols) {
  if (w.rows() != rows || w.cols() != cols || w.shape().size() != 2) {
    raise_contract(kContractShape, std::string(op) + ": weight '" + name + "' has shape " + w.shape_str() +
                                       ", expected [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
}

void check_weight_2d(const DeviceWeight& w, const char* op, const char* name, int64_t rows,
                     int64_t cols) {
  if (w.rows != rows || w.cols != cols || w.shape.size() != 2) {
    raise_contract(kContractShape, std::string(op) + ": DeviceWeight '" + name + "' has shape " +
                                       w.shape_str() + ", expected [" + std::to_string(rows) + ", " +
                                       std::to_string(cols) + "]");
  }
}

namespace {

// DLPack 1.x's DLManagedTensorVersioned up to its flags (dlpack.h; the DLTensor follows).
struct ManagedTensorVersionedHead {
  uint32_t major, minor;
  void* manager_ctx;
  void (*deleter)(void*);
  uint64_t flags;
};
constexpr uint64_t kDlpackReadOnly = 1;  // DLPACK_FLAG_BITMASK_READ_ONLY

// Whether a DLPack capsule (consumed or not: nanobind renames it "used_...") marks its tensor
// read-only. Only a versioned capsule can: an unversioned one has no flags.
bool capsule_read_only(PyObject* capsule) {
  const char* cname = PyCapsule_GetName(capsule);
  if (cname == nullptr) {
    PyErr_Clear();
    return false;
  }
  const std::string n = cname;
  if (n != "dltensor_versioned" && n != "used_dltensor_versioned") return false;
  auto* head = static_cast<ManagedTensorVersionedHead*>(PyCapsule_GetPointer(capsule, cname));
  if (head == nullptr) {
    PyErr_Clear();
    return false;
  }
  return (head->flags & kDlpackReadOnly) != 0;
}

// Whether an object exporting the buffer protocol refuses a writable buffer (bytes, a read-only
// mmap).
bool buffer_read_only(PyObject* o) {
  if (!PyObject_CheckBuffer(o)) return false;
  Py_buffer view;
  if (PyObject_GetBuffer(o, &view, PyBUF_WRITABLE) != 0) {
    PyErr_Clear();
    return true;
  }
  PyBuffer_Release(&view);
  return false;
}

}  // namespace

void require_writable(nb::handle obj, const char* op, const char* name) {
  // torch's own __dlpack__ refuses such a tensor; nanobind's fallback export does not, and a
  // write that autograd cannot see (no version bump) would corrupt the gradients silently.
  if (is_torch_tensor(obj) && nb::cast<bool>(obj.attr("requires_grad"))) {
    raise_contract(kContractValue, std::string(op) + ": argument '" + name +
                                       "' is written in place but requires grad, and autograd "
                                       "would not see the write (pass one made under "
                                       "torch.no_grad(), or .detach() it)");
  }
  if (PyMemoryView_Check(obj.ptr()) && PyMemoryView_GET_BUFFER(obj.ptr())->readonly) {
    raise_contract(kContractValue, std::string(op) + ": argument '" + name +
                                       "' is written in place but is a read-only memoryview");
  }
  if (PyCapsule_CheckExact(obj.ptr())) {
    if (capsule_read_only(obj.ptr())) {
      raise_contract(kContractValue, std::string(op) + ": argument '" + name +
                                         "' is written in place but is a read-only DLPack capsule");
    }
    return;
  }
  if (!nb::hasattr(obj, "flags")) {
    // A DLPack producer without numpy's flags (a read-only memory map behind a thin wrapper, a
    // JAX array): DLPack 1.0 marks a read-only export, which nanobind refuses where a writable
    // array is asked for. memra's own DeviceArray is writable.
    if (nb::isinstance<DeviceArray>(obj)) return;
    if (!nb::hasattr(obj, "__dlpack__")) {
      if (buffer_read_only(obj.ptr())) {
        raise_contract(kContractValue, std::string(op) + ": argument '" + name +
                                           "' is written in place but its buffer is read-only");
      }
      return;
    }
    nb::ndarray<> probe;
    nb::ndarray<nb::ro> any;  // no array at all (a meta or sparse tensor): its own check names it
    if (!nb::try_cast(obj, probe) && nb::try_cast(obj, any)) {
      raise_contract(kContractValue, std::string(op) + ": argument '" + name +
                                         "' is written in place but its DLPack export is read-only");
    }
    return;
  }
  nb::object flags = obj.attr("flags");
  if (nb::hasattr(flags, "writeable") && !nb::cast<bool>(flags.attr("writeable"))) {
    raise_contract(kContractValue, std::string(op) + ": argument '" + name +
                                       "' is written in place but is a read-only array "
                                       "(flags.writeable is False)");
  }
}

void check_nonneg(int64_t v, const char* op, const char* name, int code) {
  if (v < 0) {
    raise_contract(code, std::string(op) + ": " + name + " must be >= 0, got " + std::to_string(v));
  }
}

void check_min(int64_t v, int64_t lo, const char* op, const char* name) {
  if (v < lo) {
    raise_contract(kContractValue, std::string(op) + ": " + name + " must be >= " +
                                       std::to_string(lo) + ", got " + std::to_string(v));
  }
}

void check_finite(float v, const char* op, const char* name) {
  if (!std::isfinite(v)) {
    raise_contract(kContractValue,
                   std::string(op) + ": " + name + " must be finite, got " + std::to_string(v));
  }
}

void check_lower_bound(float v, const char* op, const char* name) {
  check_finite(v, op, name);
  if (v > 0.0f) {
    raise_contract(kContractValue, std::string(op) + ": " + name + " must be <= 0, got " + std::to_string(v) +
                                       " (g = lower_bound * sigmoid(...) is a log decay; above 0 the "
                                       "state grows without bound)");
  }
}

void check_value(bool ok, const char* op, const std::string& what) {
  if (!ok) raise_contract(kContractValue, std::string(op) + ": " + what);
}

void check_eps(float eps, const char* op, const char* name) {
  check_value(std::isfinite(eps) && eps >= 0.0f, op,
              std::string(name) + " must be finite and >= 0, got " + std::to_string(eps));
}

void check_rows(const char* op, const char* ref, int64_t T, std::initializer_list<RowArg> args) {
  for (const RowArg& a : args) {
    if (a.array->ndim() == a.rank && dim(*a.array, 0) != T) {
      raise_contract(kContractShape, std::string(op) + ": " + a.name + " has " +
                                         std::to_string(dim(*a.array, 0)) + " rows but " + ref +
                                         " has T = " + std::to_string(T));
    }
  }
}

const Weight& host_weight(nb::handle w, const char* op, const char* name) {
  if (!nb::isinstance<Weight>(w)) {
    raise_contract(nb::isinstance<DeviceWeight>(w) ? kContractDevice : kContractDType,
                   std::string(op) + ": argument '" + name +
                       "' must be a memra.Weight (host) for the CPU backend, got " +
                       nb::type_name(w.type()).c_str());
  }
  return nb::cast<const Weight&>(w);
}

const DeviceWeight& device_weight(const Engine* engine, nb::handle w, const char* op,
                                  const char* name) {
  if (!nb::isinstance<DeviceWeight>(w)) {
    raise_contract(kContractDevice, std::string(op) + ": argument '" + name +
                                        "' must be a memra.DeviceWeight on the engine's device, got " +
                                        nb::type_name(w.type()).c_str());
  }
  const DeviceWeight& d = nb::cast<const DeviceWeight&>(w);
  if (!d.buffer || d.buffer->context()->device() != engine->device_index()) {
    raise_contract(kContractDevice, std::string(op) + ": DeviceWeight '" + name +
                                        "' lives on another device than the engine");
  }
  return d;
}

namespace {

std::string dtype_name_of(nb::dlpack::dtype d) {
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Float: return "float" + std::to_string(d.bits);
    case nb::dlpack::dtype_code::Int: return "int" + std::to_string(d.bits);
    case nb::dlpack::dtype_code::UInt: return "uint" + std::to_string(d.bits);
    case nb::dlpack::dtype_code::Bfloat: return "bfloat" + std::to_string(d.bits);
    default: return "?" + std::to_string(d.bits);
  }
}

}  // namespace

void init_device(nb::module_& m) {
  nb::class_<DeviceArray>(m, "DeviceArray",
                          "A C-contiguous array in a CUDA engine's device memory, as memra's ops "
                          "return it. Consumed zero-copy through DLPack (torch.from_dlpack, "
                          "cupy.from_dlpack, or any memra op on the same engine); "
                          "engine.to_host(a) copies it to numpy. The memory stays alive while "
                          "any consumer holds a view.")
      .def_prop_ro("shape", [](const DeviceArray& a) {
        nb::list l;
        for (size_t s : a.shape) l.append(s);
        return nb::tuple(l);
      })
      .def_prop_ro("dtype", [](const DeviceArray& a) { return dtype_name_of(a.dtype); })
      .def_prop_ro("device", [](const DeviceArray& a) { return "cuda:" + std::to_string(a.device); })
      .def("__len__", [](const DeviceArray& a) { return a.shape.empty() ? size_t(0) : a.shape[0]; })
      .def(
          "__dlpack__",
          [](nb::handle self, nb::handle stream, nb::handle max_version, nb::handle dl_device,
             nb::handle copy) {
            const DeviceArray& a = nb::cast<const DeviceArray&>(self);
            if (!copy.is_none() && nb::cast<bool>(copy)) {
              raise_contract(kContractValue, "DeviceArray.__dlpack__: copy=True is not supported");
            }
            // A consumer on another stream must not read before memra's stream has written:
            // wait for the engine's stream whenever the consumer names a stream -- except its
            // own stream, and while that stream is being captured into a graph (the consumer is
            // then a memra op recorded on the same stream, and a wait would break the capture).
            if (!stream.is_none()) {
              const auto& c = a.buffer->context();
              void* own = nullptr;
              c->api().stream(c->ctx(), &own);
              const bool same = nb::isinstance<nb::int_>(stream) &&
                                nb::cast<uintptr_t>(stream) == reinterpret_cast<uintptr_t>(own);
              if (!same && !CudaGraph::capturing(c)) {
                check(c->status(c->api().synchronize(c->ctx()), "DeviceArray.__dlpack__"));
              }
            }
            nb::ndarray<> view(a.buffer->data(), a.shape.size(), a.shape.data(), self, nullptr,
                               a.dtype, nb::device::cuda::value, a.device);
            return nb::cast(view);  // a fresh DLPack capsule per call
          },
          nb::kw_only(), nb::arg("stream").none() = nb::none(), nb::arg("max_version").none() = nb::none(),
          nb::arg("dl_device").none() = nb::none(), nb::arg("copy").none() = nb::none())
      .def("__dlpack_device__", [](const DeviceArray& a) { return nb::make_tuple(2, a.device); })
      .def("__repr__", [](const DeviceArray& a) {
        std::string s = "DeviceArray(shape=(";
        for (size_t i = 0; i < a.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(a.shape[i]);
        return s + (a.shape.size() == 1 ? ",)" : ")") + ", dtype=" + dtype_name_of(a.dtype) +
               ", device=cuda:" + std::to_string(a.device) + ")";
      });

  nb::class_<DeviceWeight>(m, "DeviceWeight",
                           "A weight on a CUDA engine's device, converted once (on the device) to "
                           "float32 or bfloat16. Used by the CUDA branch of the functional ops.")
      .def(
          "__init__",
          [](DeviceWeight* self, const Engine& engine, const Weight& weight,
             std::optional<std::string> dtype) {
            DType target = weight.dtype() == DType::kF32 ? DType::kF32 : DType::kBF16;
            if (dtype) {
              if (*dtype == "float32") target = DType::kF32;
              else if (*dtype == "bfloat16") target = DType::kBF16;
              else raise_contract(kContractValue, "DeviceWeight: dtype must be 'float32' or 'bfloat16', got '" + *dtype + "'");
            }
            DeviceWeight d;
            if (!engine.is_cuda()) {
              raise_status(Status(kUnsupported, "DeviceWeight: needs a CUDA engine, got " + engine.device() +
                                                    " (the CPU backend takes memra.Weight directly)"));
            }
            check(DeviceWeight::upload(engine.cuda(), weight, target, &d));
            new (self) DeviceWeight(std::move(d));
          },
          nb::arg("engine"), nb::arg("weight"), nb::kw_only(), nb::arg("dtype").none() = nb::none(),
          "engine: a CUDA Engine; weight: a memra.Weight; dtype: 'float32' or 'bfloat16' (default: "
          "float32 stays float32, bfloat16/float16 become bfloat16). Raises UnsupportedError for "
          "a CPU engine, ContractError for another dtype, OutOfMemoryError when it does not fit.")
      .def_prop_ro("dtype", [](const DeviceWeight& w) { return std::string(dtype_name(w.dtype)); })
      .def_prop_ro("shape", [](const DeviceWeight& w) { return w.shape; })
      .def("__repr__", [](const DeviceWeight& w) {
        return "DeviceWeight(" + std::string(dtype_name(w.dtype)) + ", " + w.shape_str() + ")";
      });
}

PerSeq per_seq_arg(const Engine* engine, nb::handle h, int64_t B, const char* op,
                   const char* name) {
  PerSeq p;
  const std::string arg = std::string(op) + ": argument '" + name + "'";
  auto push = [&](int64_t v) {
    if (v < INT32_MIN || v > INT32_MAX) {
      raise_contract(kContractRange, arg + " holds " + std::to_string(v) + ", outside int32");
    }
    p.values.push_back(static_cast<int32_t>(v));
  };
  if (!nb::hasattr(h, "__dlpack__") && nb::isinstance<nb::sequence>(h) &&
      !nb::isinstance<nb::str>(h)) {
    for (nb::handle x : h) {
      int64_t v = 0;
      if (PyBool_Check(x.ptr())) {  // nanobind's int caster takes True as 1: a mistake to name
        raise_contract(kContractDType, arg + " must hold ints, got bool");
      }
      if (!nb::try_cast(x, v)) {
        if (PyIndex_Check(x.ptr()) && !PyBool_Check(x.ptr())) {  // an int past int64: a range error
          raise_contract(kContractRange, arg + " holds " + nb::repr(x).c_str() +
                                             ", outside int32");
        }
        raise_contract(kContractDType, arg + " must hold ints, got " +
                                           std::string(nb::type_name(x.type()).c_str()));
      }
      push(v);
    }
    p.host = true;
  } else {
    AnyArray a;
    if (!nb::try_cast(h, a)) {
      raise_contract(kContractDType, arg + " must be a list of ints or an int32 array [B], got " +
                                         std::string(nb::type_name(h.type()).c_str()));
    }
    if (a.device_type() == nb::device::cpu::value) {
      const bool i32 = has_dtype(a, nb::dlpack::dtype_code::Int, 32);
      const bool i64 = has_dtype(a, nb::dlpack::dtype_code::Int, 64);
      check_array(a, op, name, {B}, "int32 or int64 (host) / int32 (device)", i32 || i64,
                  nb::device::cpu::value, 0);
      for (int64_t b = 0; b < B; ++b) {
        push(i32 ? static_cast<const int32_t*>(a.data())[b]
                 : static_cast<const int64_t*>(a.data())[b]);
      }
      p.host = true;
    } else {
      p.dev = i32_in(engine, a, op, name, {B});  // CONTRACT_DEVICE on the CPU backend
    }
  }
  if (p.host && static_cast<int64_t>(p.values.size()) != B) {
    raise_contract(kContractShape, arg + " has " + std::to_string(p.values.size()) +
                                       " entries, expected B=" + std::to_string(B));
  }
  if (p.host && on_cuda(engine) && B > 0) {
    p.upload = device_upload(engine, p.values.data(), sizeof(int32_t) * static_cast<size_t>(B));
    p.dev = static_cast<const int32_t*>(p.upload->data());
  }
  return p;
}

}  // namespace memra::py
