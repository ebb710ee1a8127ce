// Host memory the system can give now: the bound a Cache and the bindings' output arrays are
// checked against before they allocate, so an oversized request is an OutOfMemoryError rather
// than a std::bad_alloc, or pages that are zero-filled until the kernel's OOM killer steps in.
#pragma once

#include <cstdint>

namespace memra {

// MemAvailable from /proc/meminfo in bytes, or -1 when unknown (no /proc). One file read: call
// it for large allocations, not per small array.
int64_t available_host_bytes();

}  // namespace memra
