// memra._core.Engine (with its CUDA-graph capture and copies) and the CUDA availability probe.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <cstring>
#include <optional>
#include <vector>

#include "bind_options.h"
#include "common.h"
#include "device_args.h"
#include "memra/decode_step.h"
#include "memra/engine.h"

namespace memra::py {

namespace {

// A device -> host copy in flight (Engine.to_host_async): the ticket of the engine's readback
// slot, or, on a CPU engine, the copy itself.
struct HostRead {
  nb::object engine;  // keeps the Engine (and its context's slots) alive
  uint64_t ticket = 0;
  std::vector<size_t> shape;
  nb::dlpack::dtype dtype;
  size_t bytes = 0;
  nb::object done;  // the numpy result once waited for (or from the start on a CPU engine)
};


}  // namespace

void init_engine(nb::module_& m) {
  nb::class_<HostRead>(m, "HostRead",
                       "A device -> host copy in flight, from Engine.to_host_async: wait() returns "
                       "the numpy array.")
      .def(
          "wait",
          [](HostRead& r) -> nb::object {
            if (!r.done.is_valid()) {
              const Engine& e = nb::cast<const Engine&>(r.engine);
              uint8_t* p = static_cast<uint8_t*>(new_host_zeroed(r.bytes));
              const int rc = e.cuda()->api().read_wait(e.cuda()->ctx(), r.ticket, p, r.bytes);
              if (rc != kOk) delete[] p;
              check_cuda(&e, rc, "HostRead.wait");
              r.done = numpy_owning(p, r.shape, r.dtype);
            }
            return r.done;
          },
          "The copy as a numpy array (waits for that copy only, not for work enqueued after it; "
          "later calls return the same array). On a CUDA engine, ContractError 40025 when the "
          "engine has made Engine.READ_SLOTS newer reads since this one (its slot was reused); a "
          "CPU engine's read is complete when to_host_async returns, so it never fails.");


  m.def(
      "cuda_available",
      [] {
        std::string reason;
        int count = 0;
        return cuda_probe(&reason, &count).ok();
      },
      "True when memra was built with its CUDA library and a CUDA device is usable here.");
  m.def(
      "cuda_unavailable_reason",
      []() -> std::optional<std::string> {
        std::string reason;
        int count = 0;
        if (cuda_probe(&reason, &count).ok()) return std::nullopt;
        return reason;
      },
      "None when CUDA is usable, otherwise why not (not built, library missing, no driver, no "
      "device).");

  nb::class_<Engine>(m, "Engine",
                     "Owns one device: 'cpu' (the C++ reference backend) or 'cuda'. options: the "
                     "CUDA kernels' arms (memra.KernelOptions; None: the defaults), fixed for the "
                     "engine's life. device: 'cpu' or 'cuda' (the index is device_index; "
                     "memra.load's 'cuda:N' is its own grammar). Raises UnsupportedError when a "
                     "CUDA engine cannot be made here, ContractError for an unknown device, a "
                     "device_index other than 0 on the CPU or out of range (40023), or options "
                     "that are not a KernelOptions. On a CPU engine copy_into, begin_capture and "
                     "end_capture raise UnsupportedError (50000): there is no stream to capture.")
      .def(
          "__init__",
          [](Engine* self, const std::string& device, Index device_index, nb::handle options) {
            const KernelOptions o = options_arg(options, "Engine", "options");
            std::unique_ptr<Engine> e;
            check(Engine::create(device, device_index, o, &e));
            new (self) Engine(std::move(*e));
          },
          nb::arg("device") = "cpu", nb::arg("device_index") = 0, nb::kw_only(),
          nb::arg("options").none() = nb::none(),
          nb::sig("def __init__(self, device: str = 'cpu', device_index: int = 0, *, "
                  "options: KernelOptions | None = None) -> None"))
      .def_prop_ro("device", &Engine::device, "'cpu' or 'cuda:N'.")
      .def_prop_ro(
          "options", [](const Engine& e) { return e.options(); },
          "The KernelOptions this engine was made with (a copy; immutable).")
      .def_prop_ro("is_cuda", &Engine::is_cuda)
      .def_prop_ro(
          "cuda_stream",
          [](const Engine& e) -> uintptr_t {
            if (!e.is_cuda()) return 0;
            void* s = nullptr;
            check_cuda(&e, e.cuda()->api().stream(e.cuda()->ctx(), &s), "Engine.cuda_stream");
            return reinterpret_cast<uintptr_t>(s);
          },
          "The engine's cudaStream_t as an integer (0 on the CPU), e.g. for "
          "torch.cuda.ExternalStream: memra enqueues all of its work there.")
      .def(
          "to_device",
          [](const Engine& e, const AnyArray& a) -> nb::object {
            if (!e.is_cuda()) {
              raise_status(Status(kUnsupported, "Engine.to_device: a CPU engine uses host arrays"));
            }
            check_array(a, "Engine.to_device", "array", {}, "", true, nb::device::cpu::value, 0, true);
            std::vector<size_t> shape(a.ndim());
            size_t n = 1;
            for (size_t i = 0; i < a.ndim(); ++i) n *= (shape[i] = a.shape(i));
            const size_t bytes = n * (a.dtype().bits / 8) * a.dtype().lanes;
            auto buf = device_upload(&e, a.data(), bytes);
            return device_array(std::move(buf), std::move(shape), a.dtype(), e.device_index());
          },
          nb::arg("array"),
          "Copy a C-contiguous host array (any dtype) to this CUDA engine's device; returns a DLPack "
          "CUDA array of the same shape and dtype. Raises UnsupportedError on a CPU engine, "
          "ContractError for a device or non-contiguous input.")
      .def(
          "to_host",
          [](const Engine& e, const AnyArray& a) -> nb::object {
            const int want = e.is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
            check_array(a, "Engine.to_host", "array", {}, "", true, want, e.is_cuda() ? e.device_index() : 0, true);
            std::vector<size_t> shape(a.ndim());
            for (size_t i = 0; i < a.ndim(); ++i) shape[i] = a.shape(i);
            const size_t bytes = host_bytes(shape, (a.dtype().bits / 8) * a.dtype().lanes);
            uint8_t* p = static_cast<uint8_t*>(new_host_zeroed(bytes));
            nb::object out = numpy_owning(p, shape, a.dtype());  // owns p from here on
            if (e.is_cuda()) {
              check_cuda(&e, e.cuda()->api().copy_to_host(e.cuda()->ctx(), p, a.data(), bytes),
                         "Engine.to_host");
            } else if (bytes) {
              std::memcpy(p, a.data(), bytes);
            }
            return out;
          },
          nb::arg("array"),
          "A numpy copy of a C-contiguous array on this engine's device (waits for the engine's "
          "stream). Raises ContractError for an array on another device.")
      .def(
          "to_host_async",
          [](nb::object self, const AnyArray& a) -> HostRead {
            const Engine& e = nb::cast<const Engine&>(self);
            const char* op = "Engine.to_host_async";
            const int want = e.is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
            check_array(a, op, "array", {}, "", true, want, e.is_cuda() ? e.device_index() : 0, true);
            HostRead r;
            size_t n = 1;
            for (size_t i = 0; i < a.ndim(); ++i) {
              r.shape.push_back(a.shape(i));
              n *= a.shape(i);
            }
            r.dtype = a.dtype();
            r.bytes = n * (a.dtype().bits / 8) * a.dtype().lanes;
            // The CUDA engine's readback slots bound a read; the CPU engine keeps the same bound,
            // so code tried on the CPU behaves alike on a GPU.
            if (r.bytes > MEMRA_CUDA_READ_SLOT_BYTES) {
              raise_contract(kContractShape, std::string(op) + ": argument 'array' has " +
                                                 std::to_string(r.bytes) + " bytes; at most " +
                                                 std::to_string(MEMRA_CUDA_READ_SLOT_BYTES) +
                                                 " a read (use to_host for more)");
            }
            if (!e.is_cuda()) {
              uint8_t* p = static_cast<uint8_t*>(new_host_zeroed(r.bytes));
              if (r.bytes) std::memcpy(p, a.data(), r.bytes);
              r.done = numpy_owning(p, r.shape, r.dtype);
              return r;
            }
            check_cuda(&e, e.cuda()->api().read_start(e.cuda()->ctx(), a.data(), r.bytes, &r.ticket), op);
            r.engine = self;
            return r;
          },
          nb::arg("array"),
          "Start copying a C-contiguous array of this engine (at most 64 KiB: token ids, not "
          "logits) to the host behind the work already enqueued, without waiting (a CPU engine "
          "copies at once); returns a "
          "memra._core.HostRead whose wait() gives the numpy array. Work enqueued after this call "
          "does not delay wait(), which is what lets a decode loop queue its next step before "
          "reading this one's tokens. Raises ContractError for an array on another device "
          "(40021) or over 64 KiB (40000), UnsupportedError 50003 while capturing.")
      .def_prop_ro_static(
          "READ_SLOTS", [](nb::handle) { return MEMRA_CUDA_READ_SLOTS; },
          "How many to_host_async reads may be pending at once: the next one reuses the oldest "
          "one's slot.")
      .def(
          "synchronize",
          [](const Engine& e) {
            if (e.is_cuda()) check_cuda(&e, e.cuda()->api().synchronize(e.cuda()->ctx()), "Engine.synchronize");
          },
          "Wait for all work enqueued on this engine's stream.")
      .def(
          "copy_into",
          [](const Engine& e, nb::handle dst, const AnyArray& src) {
            const char* op = "Engine.copy_into";
            if (!e.is_cuda()) raise_status(Status(kUnsupported, std::string(op) + ": needs a CUDA engine"));
            const AnyArray d = nb::cast<AnyArray>(dst);
            check_array(d, op, "dst", {}, "", true, nb::device::cuda::value, e.device_index(), true);
            const int src_dev = src.device_type() == nb::device::cuda::value ? nb::device::cuda::value
                                                                              : nb::device::cpu::value;
            check_array(src, op, "src", {}, "", true, src_dev, src_dev == nb::device::cuda::value ? e.device_index() : 0, true);
            check_value(d.dtype() == src.dtype(), op, "dst and src must have the same dtype");
            size_t nd = 1, ns = 1;
            for (size_t i = 0; i < d.ndim(); ++i) nd *= d.shape(i);
            for (size_t i = 0; i < src.ndim(); ++i) ns *= src.shape(i);
            check_value(nd == ns, op, "dst has " + std::to_string(nd) + " elements, src " + std::to_string(ns));
            const size_t bytes = nd * (d.dtype().bits / 8) * d.dtype().lanes;
            if (src_dev == nb::device::cuda::value && src.data() != d.data()) {
              // An overlapping device copy is undefined for cudaMemcpyAsync (the same array is
              // a no-op copy and stays allowed).
              check_disjoint(op, "src", src.data(), bytes, "dst", d.data(), bytes);
            }
            check_cuda(&e, e.cuda()->api().copy(e.cuda()->ctx(), const_cast<void*>(d.data()), src.data(), bytes), op);
          },
          nb::arg("dst"), nb::arg("src"),
          "Copy src (a host array, or a device array of this engine) into the existing device "
          "array dst (same dtype and element count; shapes may differ), asynchronously on the "
          "engine's stream. While capturing only device -> device copies are allowed "
          "(UnsupportedError 50003 otherwise: a captured host copy would replay stale bytes). "
          "Raises ContractError for a dtype / size / device mismatch.")
      .def(
          "begin_capture",
          [](const Engine& e) {
            if (!e.is_cuda()) raise_status(Status(kUnsupported, "Engine.begin_capture: needs a CUDA engine"));
            check(CudaGraph::begin(e.cuda()));
          },
          "Start recording this engine's stream into a CUDA graph: memra ops called from now on "
          "are recorded, not run, until end_capture() (or abort_capture() after an error). While "
          "recording, host <-> device copies and synchronisation raise UnsupportedError 50003; "
          "scratch allocated and released inside becomes the graph's own memory. Arrays an op "
          "returns while recording must be dropped before end_capture() (copy results into "
          "arrays made before the capture with copy_into). ContractError when already recording.")
      .def(
          "end_capture",
          [](const Engine& e) {
            if (!e.is_cuda()) raise_status(Status(kUnsupported, "Engine.end_capture: needs a CUDA engine"));
            std::unique_ptr<CudaGraph> g;
            check(CudaGraph::end(e.cuda(), &g));
            return g;
          },
          "Finish the recording and return it as a memra._core.CudaGraph (ContractError when not "
          "recording; a CUDA error when the recording was invalidated). The graph holds the "
          "device addresses it recorded and no reference to their owners: keep the Cache, the "
          "arrays, weights and layers the recorded ops used alive for as long as it is replayed.")
      .def(
          "abort_capture",
          [](const Engine& e) {
            if (e.is_cuda() && CudaGraph::capturing(e.cuda())) check(CudaGraph::abort(e.cuda()));
          },
          "Discard a running recording (no-op when none runs); the engine is usable again.")
      .def(
          "memory",
          [](const Engine& e, bool reset_peak) -> nb::object {
            if (!e.is_cuda()) return nb::none();
            MemraMemStats st{};
            check_cuda(&e, e.cuda()->api().mem_stats(e.cuda()->ctx(), &st, reset_peak ? 1 : 0),
                       "Engine.memory");
            nb::dict d;
            d["device_total"] = st.device_total;
            d["device_used"] = st.device_total - st.device_free;
            d["pool_used"] = st.pool_used;
            d["pool_used_peak"] = st.pool_used_peak;
            d["pool_reserved"] = st.pool_reserved;
            d["pool_reserved_peak"] = st.pool_reserved_peak;
            return d;
          },
          nb::kw_only(), nb::arg("reset_peak") = false,
          nb::sig("def memory(self, *, reset_peak: bool = False) -> dict[str, int] | None"),
          "Device memory in bytes, read without waiting for the stream (None on a CPU engine): "
          "device_total and device_used (cudaMemGetInfo: the whole device, every process and "
          "library on it, the CUDA context included); pool_used (memra's live allocations: "
          "weights, caches, arrays and kernel scratch all come from the device's stream-ordered "
          "pool, which engines on one device share; up to two released arrays above 1 GiB an "
          "engine keeps for the next array of their size count too) and pool_used_peak, its "
          "high-water mark; "
          "pool_reserved / pool_reserved_peak, what the pool holds from the driver (freed blocks "
          "are kept for reuse). The peaks count from the engine's creation or the last call with "
          "reset_peak=True, which restarts them from the current values after reading them. "
          "Reset just before a call, pool_used_peak after it minus the pool_used of the reset is "
          "the call's scratch high-water mark.")
      .def_prop_ro(
          "capturing", [](const Engine& e) { return e.is_cuda() && CudaGraph::capturing(e.cuda()); },
          "True while this engine's stream is being recorded.")
      .def("__repr__", [](const Engine& e) { return "Engine(device='" + e.device() + "')"; });
}

}  // namespace memra::py
