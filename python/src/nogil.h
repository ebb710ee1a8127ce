// memra's calls counted, so that the interpreter's exit can wait until no thread is inside one.
//
// CPython ends a thread that asks for the GIL during finalization (a daemon thread returning
// from an op that ran without it, or running Python code that memra called: a __dlpack__, a
// sequence's __getitem__) with pthread_exit, whose forced unwind through memra's C++ frames
// aborts the process ("terminate called without an active exception", exit 134). So every
// memra._core function and method is counted from its first to its last instruction (the
// argument front of bind_arguments.cpp calls enter_call / leave_call), and so is every release
// of the GIL (ReleasedGil); memra's exit hook (_core._finish_native_calls, registered with atexit
// at import: atexit runs before finalization) waits until the count falls to zero (or, where
// only Python code that memra called is left running, for at most a second: it may block for
// good; such a thread still aborts the process if it wakes while the interpreter finalizes, and
// starts no native work after the wait). After the
// hook a daemon thread's next memra call raises SystemExit, which ends the thread quietly and
// unwinds it (its `with` blocks give their locks back); any other thread's raises
// UnsupportedError (UNSUPPORTED_AT_EXIT), and on the exiting thread only a call that would
// release the GIL does.
#pragma once

#include <nanobind/nanobind.h>

namespace memra::py {

// Count a memra call on this thread; false with the Python error set when the exit hook has run
// and the call is refused (see above).
bool enter_call();
// The end of a call enter_call counted.
void leave_call();

class ReleasedGil {
 public:
  // Counts the call and releases the GIL; raises (see above) once the exit hook has run.
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
