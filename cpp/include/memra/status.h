// Status codes in bands (the table of python/memra/errors.py). Ops and launchers never throw: they return a
// Status, and the binding layer turns a non-zero code into the named Python exception.
#pragma once

#include <string>
#include <utility>

namespace memra {

// Band bases. A CUDA runtime failure is kCudaBase + cudaError_t; a cuBLAS(Lt) status is
// kLibraryBase + cublasStatus_t.
constexpr int kOk = 0;
constexpr int kCudaBase = 10000;
constexpr int kLibraryBase = 20000;
constexpr int kOutOfMemory = 30001;
constexpr int kCacheFull = 30002;

// Contract violations (40000+): each code names one kind of offence.
constexpr int kContractShape = 40000;      // a tensor's rank or extent is wrong
constexpr int kContractOddRope = 40001;    // d_rope must be even (interleaved pairs)
constexpr int kContractQuerySuffix = 40004;  // t_q > t_kv: queries must be a suffix of the cache
constexpr int kContractPool = 40010;       // k-pool size out of range
constexpr int kContractIndexWidth = 40014; // index list narrower than select_k * pool + pool - 1
constexpr int kContractDType = 40020;      // wrong dtype
constexpr int kContractDevice = 40021;     // wrong device
constexpr int kContractStride = 40022;     // not C-contiguous
constexpr int kContractRange = 40023;      // an id, slot or position out of range
constexpr int kContractMissing = 40024;    // a required tensor is missing / an unexpected one is present
constexpr int kContractValue = 40025;      // a scalar argument out of its domain
constexpr int kContractSlotHeld = 40026;   // a cache slot another owner holds (Cache::hold) was changed

// Unsupported (50000+).
constexpr int kUnsupported = 50000;        // feature or configuration not supported
constexpr int kUnsupportedNoCuda = 50001;  // no CUDA build or no usable device
constexpr int kUnsupportedGeometry = 50002;  // geometry not instantiated by the kernels
constexpr int kUnsupportedInCapture = 50003;  // a host copy / wait inside a CUDA graph capture
constexpr int kUnsupportedAtExit = 50004;  // a native call after the interpreter's exit began

// Numeric (60000+): a computed value the next step cannot use.
constexpr int kNonFinite = 60001;          // a row of logits holds NaN or +-inf

// A code plus a message that names the op and the offending values.
struct Status {
  int code = kOk;
  std::string message;

  Status() = default;
  Status(int c, std::string m) : code(c), message(std::move(m)) {}
  static Status Ok() { return Status(); }
  bool ok() const { return code == kOk; }
};

}  // namespace memra

// Return early from the enclosing function when a Status-returning expression fails.
#define MEMRA_TRY(expr)                     \
  do {                                      \
    ::memra::Status _memra_st = (expr);     \
    if (!_memra_st.ok()) return _memra_st;  \
  } while (0)
