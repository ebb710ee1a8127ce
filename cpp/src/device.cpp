// CUDA library loading (dlopen from the extension's own folder, dlsym of every CudaApi entry),
// CudaContext, DeviceBuffer, DeviceWeight (device.h).
#include "memra/device.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace memra {

namespace {

// Directory of the shared object this code is linked into (the extension module), where the
// CUDA library is installed beside it.
std::string own_directory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || !info.dli_fname) return ".";
  std::string path(info.dli_fname);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

template <typename F>
void resolve(void* handle, const char* name, F** slot, std::string* missing) {
  *slot = reinterpret_cast<F*>(dlsym(handle, name));
  if (!*slot) *missing += std::string(missing->empty() ? "" : ", ") + name;
}

}  // namespace

const CudaLibrary& cuda_library() {
  static const CudaLibrary lib = [] {
    CudaLibrary l;
#ifdef MEMRA_CUDA_LIBRARY_NAME
    const std::string path = own_directory() + "/" + MEMRA_CUDA_LIBRARY_NAME;
    l.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!l.handle) {
      const char* e = dlerror();
      l.error = "the CUDA library could not be loaded from " + path + ": " + (e ? e : "unknown error");
      if (e && std::strstr(e, "libcublas")) {
        l.error += " (cuBLAS comes from the nvidia-cublas wheel: pip install 'memra[cuda]')";
      }
      // Without a driver, installing cuBLAS would only lead to the next refusal: say that first.
      if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
        dlclose(driver);
      } else {
        l.error = "no NVIDIA driver is installed here (libcuda.so.1 cannot be loaded), so no GPU can "
                  "be used; besides, " + l.error;
      }
      return l;
    }
    std::string missing;
    resolve(l.handle, "memra_cuda_device_count", &l.device_count, &missing);
    resolve(l.handle, "memra_cuda_error_string", &l.error_string, &missing);
#define MEMRA_RESOLVE(name, args) resolve(l.handle, "memra_cuda_" #name, &l.api.name, &missing);
    MEMRA_CUDA_ALL_OPS(MEMRA_RESOLVE)
#undef MEMRA_RESOLVE
    if (!missing.empty()) l.error = "the CUDA library at " + path + " lacks entry points: " + missing;
#else
    l.error = "memra was built without the CUDA backend (MEMRA_CUDA=OFF or no nvcc/cuBLAS at build time)";
#endif
    return l;
  }();
  return lib;
}

// ------------------------------------------------------------------------------ CudaContext
Status CudaContext::create(int device, const KernelOptions& options,
                           std::shared_ptr<CudaContext>* out) {
  MEMRA_TRY(options.validate());
  const CudaLibrary& lib = cuda_library();
  if (!lib.error.empty()) return Status(kUnsupportedNoCuda, lib.error);
  std::shared_ptr<CudaContext> c(new CudaContext());
  c->api_ = &lib.api;
  c->device_ = device;
  c->options_ = options;
  const MemraKernelOptions abi = options.to_abi();
  const int rc = lib.api.ctx_create(device, &abi, &c->ctx_);
  if (rc != kOk) return c->status(rc, "Engine(device='cuda')");
  *out = std::move(c);
  return Status::Ok();
}

CudaContext::~CudaContext() {
  if (ctx_) api_->ctx_destroy(ctx_);
}

Status CudaContext::status(int rc, const std::string& op) const {
  if (rc == kOk) return Status::Ok();
  std::string what;
  if (rc >= kCudaBase && rc < kLibraryBase) {
    what = std::string("CUDA error: ") + cuda_library().error_string(rc - kCudaBase);
  } else if (rc >= kLibraryBase && rc < kOutOfMemory) {
    what = "cuBLAS/cuBLASLt status " + std::to_string(rc - kLibraryBase);
  } else if (rc == kOutOfMemory) {
    what = "out of device memory";
  } else if (rc == kUnsupportedGeometry) {
    what = "geometry not instantiated by the CUDA kernels";
  } else if (rc >= 40000 && rc < 50000) {
    what = "contract violation";
  } else {
    what = "failed";
  }
  return Status(rc, op + ": " + what + " (code " + std::to_string(rc) + ")");
}

// ------------------------------------------------------------------------------ DeviceBuffer
Status DeviceBuffer::create(std::shared_ptr<CudaContext> ctx, size_t bytes,
                            std::shared_ptr<DeviceBuffer>* out) {
  std::shared_ptr<DeviceBuffer> b(new DeviceBuffer());
  const int rc = ctx->api().alloc(ctx->ctx(), bytes, &b->ptr_);
  if (rc != kOk) {
    return ctx->status(rc, "device allocation of " + std::to_string(bytes) + " bytes");
  }
  b->bytes_ = bytes;
  b->ctx_ = std::move(ctx);
  *out = std::move(b);
  return Status::Ok();
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) ctx_->api().release(ctx_->ctx(), ptr_);
}

// ------------------------------------------------------------------------------ DeviceWeight
std::string DeviceWeight::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status DeviceWeight::upload(const std::shared_ptr<CudaContext>& ctx, const Weight& w, DType target,
                            DeviceWeight* out) {
  return upload_stacked(ctx, {&w}, target, out);
}

Status DeviceWeight::upload_stacked(const std::shared_ptr<CudaContext>& ctx,
                                    const std::vector<const Weight*>& ws, DType target,
                                    DeviceWeight* out) {
  if (target != DType::kF32 && target != DType::kBF16) {
    return Status(kContractDType, "DeviceWeight: the device dtype must be float32 or bfloat16");
  }
  if (ws.empty()) return Status(kContractShape, "DeviceWeight: no weights to upload");
  const Weight& first = *ws[0];
  for (const Weight* w : ws) {
    if (w->shape() != first.shape()) {
      return Status(kContractShape, "DeviceWeight: stacked weights differ in shape (" +
                                        w->shape_str() + " vs " + first.shape_str() + ")");
    }
    if (w->dtype() != first.dtype()) {
      return Status(kContractDType, "DeviceWeight: stacked weights differ in dtype");
    }
  }
  // Equal shapes concatenated along rows are the stack [n, rows, cols] in memory.
  DeviceWeight d;
  MEMRA_TRY(upload_rows(ctx, ws, target, &d));
  d.shape = first.shape();
  if (ws.size() > 1) d.shape.insert(d.shape.begin(), static_cast<int64_t>(ws.size()));
  *out = std::move(d);
  return Status::Ok();
}

Status DeviceWeight::upload_rows(const std::shared_ptr<CudaContext>& ctx,
                                 const std::vector<const Weight*>& ws, DType target,
                                 DeviceWeight* out) {
  if (target != DType::kF32 && target != DType::kBF16) {
    return Status(kContractDType, "DeviceWeight: the device dtype must be float32 or bfloat16");
  }
  if (ws.empty()) return Status(kContractShape, "DeviceWeight: no weights to upload");
  const int64_t cols = ws[0]->cols();
  int64_t rows = 0;
  size_t stage_bytes = 0;
  for (const Weight* w : ws) {
    if (w->cols() != cols) {
      return Status(kContractShape, "DeviceWeight: weights concatenated along rows differ in "
                                    "columns (" + w->shape_str() + " vs " + ws[0]->shape_str() + ")");
    }
    rows += w->rows();
    stage_bytes = std::max(stage_bytes, w->nbytes());
  }
  DeviceWeight d;
  d.dtype = target;
  d.shape = {rows, cols};
  d.rows = rows;
  d.cols = cols;
  MEMRA_TRY(DeviceBuffer::create(ctx, size_t(rows * cols) * dtype_size(target), &d.buffer));
  // Stage each weight in its file dtype, convert on the device into its row block (the copies and
  // conversions are ordered on the stream, so one stage buffer serves them all).
  std::shared_ptr<DeviceBuffer> stage;
  MEMRA_TRY(DeviceBuffer::create(ctx, stage_bytes, &stage));
  int64_t row0 = 0;
  for (const Weight* w : ws) {
    char* dst = static_cast<char*>(d.buffer->data()) + size_t(row0 * cols) * dtype_size(target);
    int rc = ctx->api().copy(ctx->ctx(), stage->data(), w->data(), w->nbytes());
    if (rc == kOk) {
      rc = ctx->api().convert(ctx->ctx(), stage->data(), static_cast<int>(w->dtype()), dst,
                              static_cast<int>(target), w->numel());
    }
    if (rc != kOk) return ctx->status(rc, "DeviceWeight upload");
    row0 += w->rows();
  }
  // The bytes are final before the weight is handed out: inside a layer call the decode GEMV may
  // read a weight before the kernel in front of it has finished (gpu::ResidentWeights), which is
  // safe only if no conversion into it is still queued. (Uploads happen once, at load.)
  const int rc = ctx->api().synchronize(ctx->ctx());
  if (rc != kOk) return ctx->status(rc, "DeviceWeight upload");
  *out = std::move(d);
  return Status::Ok();
}

Status DeviceWeight::upload_f32(const std::shared_ptr<CudaContext>& ctx, const std::vector<float>& v,
                                DeviceWeight* out) {
  DeviceWeight d;
  d.dtype = DType::kF32;
  d.shape = {static_cast<int64_t>(v.size())};
  d.rows = 1;
  d.cols = static_cast<int64_t>(v.size());
  MEMRA_TRY(DeviceBuffer::create(ctx, v.size() * sizeof(float), &d.buffer));
  const int rc = ctx->api().copy(ctx->ctx(), d.buffer->data(), v.data(), v.size() * sizeof(float));
  if (rc != kOk) return ctx->status(rc, "DeviceWeight upload");
  *out = std::move(d);
  return Status::Ok();
}

}  // namespace memra
