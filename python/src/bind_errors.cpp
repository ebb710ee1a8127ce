// Status-code constants, so Python and tests name codes instead of repeating numbers; and the
// translation of a std::bad_alloc escaping an op into memra.OutOfMemoryError and of a failed
// cast inside a binding into memra.ContractError.
#include <exception>
#include <new>
#include <string>

#include "common.h"

namespace memra::py {

namespace {
struct StatusCodes {};
}  // namespace

void init_errors(nb::module_& m) {
  // A std::bad_alloc escaping an op (a host vector of scratch) is an OutOfMemoryError like any
  // other, not nanobind's bare MemoryError.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::bad_alloc&) {
      set_status_error(Status(kOutOfMemory, std::string(last_checked_op()) +
                                                ": a host allocation failed (std::bad_alloc)"));
    } catch (const nb::cast_error&) {
      // A binding's own nb::cast of an argument failed after dispatch accepted it: in practice a
      // memra object made with __new__ and never initialised (nanobind's RuntimeWarning names
      // its type), which would otherwise surface as a bare RuntimeError "std::bad_cast".
      set_status_error(Status(kContractDType,
                              "memra: an argument is a memra object that was never initialised "
                              "(made with __new__ without __init__?) or of another type"));
    }
  });
  // A namespace-like class (not a submodule) so the generated stub stays one file.
  nb::class_<StatusCodes> s(m, "status", "Status codes of memra's bands "
                                         "(cpp/include/memra/status.h); memra.MemraError.code "
                                         "holds one of these, or a CUDA_BASE / LIBRARY_BASE "
                                         "band's base plus the library's own status.");
  s.attr("OK") = kOk;
  s.attr("CUDA_BASE") = kCudaBase;
  s.attr("LIBRARY_BASE") = kLibraryBase;
  s.attr("OUT_OF_MEMORY") = kOutOfMemory;
  s.attr("CACHE_FULL") = kCacheFull;
  s.attr("CONTRACT_SHAPE") = kContractShape;
  s.attr("CONTRACT_ODD_ROPE") = kContractOddRope;
  s.attr("CONTRACT_QUERY_SUFFIX") = kContractQuerySuffix;
  s.attr("CONTRACT_POOL") = kContractPool;
  s.attr("CONTRACT_INDEX_WIDTH") = kContractIndexWidth;
  s.attr("CONTRACT_DTYPE") = kContractDType;
  s.attr("CONTRACT_DEVICE") = kContractDevice;
  s.attr("CONTRACT_STRIDE") = kContractStride;
  s.attr("CONTRACT_RANGE") = kContractRange;
  s.attr("CONTRACT_MISSING") = kContractMissing;
  s.attr("CONTRACT_VALUE") = kContractValue;
  s.attr("CONTRACT_SLOT_HELD") = kContractSlotHeld;
  s.attr("UNSUPPORTED") = kUnsupported;
  s.attr("UNSUPPORTED_NO_CUDA") = kUnsupportedNoCuda;
  s.attr("UNSUPPORTED_GEOMETRY") = kUnsupportedGeometry;
  s.attr("UNSUPPORTED_IN_CAPTURE") = kUnsupportedInCapture;
  s.attr("UNSUPPORTED_AT_EXIT") = kUnsupportedAtExit;
  s.attr("NON_FINITE") = kNonFinite;
}

}  // namespace memra::py
