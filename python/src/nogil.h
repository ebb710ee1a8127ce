// The GIL released around a native call, counted, so that the interpreter's exit can wait for
// every such call to take the GIL back (_core._finish_native_calls, which memra registers with
// atexit at import). CPython ends a thread that asks for the GIL during finalization (a daemon
// thread returning from a long op) with pthread_exit; its forced unwind through this class's
// noexcept destructor, or through nanobind's catch (...), aborts the whole process ("terminate
// called without an active exception", exit 134). atexit callbacks run before finalization, so
// the wait closes that window; a native call started after it parks its thread (or, on the
// thread exiting, raises UnsupportedError UNSUPPORTED_AT_EXIT) instead of releasing the GIL.
#pragma once

#include <nanobind/nanobind.h>

namespace memra::py {

class ReleasedGil {
 public:
  // Releases the GIL; once the exit hook has run, parks the thread instead (the exiting thread:
  // raises UnsupportedError kUnsupportedAtExit).
  ReleasedGil();
  // Takes the GIL back, then stops counting the call (in that order: the exit hook sees the call
  // as running until its thread holds the GIL again).
  ~ReleasedGil();
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;

 private:
  PyThreadState* state_;
};

void init_nogil(nanobind::module_& m);

}  // namespace memra::py
