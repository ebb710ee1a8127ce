// ReleasedGil and the exit hook that waits for the calls it counts (nogil.h says why).
#include "nogil.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "common.h"

namespace memra::py {
namespace {

// Both change only while the changing thread holds the GIL: a call's check of `g_closed` and
// its count are one step the exit hook cannot come between.
std::atomic<int> g_running{0};
std::atomic<bool> g_closed{false};
std::atomic<unsigned long> g_exit_thread{0};  // the thread that ran the exit hook

// Whether threads other than the caller have a Python thread state (daemon threads still alive).
bool other_threads_alive() {
  PyInterpreterState* interp = PyThreadState_GetInterpreter(PyThreadState_Get());
  int n = 0;
  for (PyThreadState* t = PyInterpreterState_ThreadHead(interp); t; t = PyThreadState_Next(t)) ++n;
  return n > 1;
}

}  // namespace

ReleasedGil::ReleasedGil() {
  if (g_closed.load()) {
    if (PyThread_get_thread_ident() == g_exit_thread.load()) {
      raise_status(Status(kUnsupportedAtExit,
                          "the interpreter is exiting: memra runs no native call after its exit "
                          "hook (a later atexit callback or finalizer called memra)"));
    }
    // Any other thread is a daemon thread (the others were joined before atexit): park it with
    // the GIL released, as Python 3.14 parks daemon threads at exit; the process ends under it.
    // Raising instead would print its traceback over the interpreter's teardown.
    PyEval_SaveThread();
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  g_running.fetch_add(1);
  state_ = PyEval_SaveThread();
}

ReleasedGil::~ReleasedGil() {
  PyEval_RestoreThread(state_);
  g_running.fetch_sub(1);
}

void init_nogil(nb::module_& m) {
  m.def(
      "_finish_native_calls",
      [] {
        g_exit_thread.store(PyThread_get_thread_ident());
        g_closed.store(true);
        while (g_running.load() > 0) {
          {
            nb::gil_scoped_release nogil;  // the running calls need it to finish
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          if (PyErr_CheckSignals() != 0) throw nb::python_error();  // Ctrl-C ends the wait
        }
        // A live daemon thread's frames keep memra objects past the teardown, which nanobind
        // would report as leaks of its bindings (it is the thread, not a reference count).
        if (other_threads_alive()) nb::set_leak_warnings(false);
      },
      "memra's exit hook (atexit, registered at import): waits until every native call running "
      "with the GIL released on another thread has taken it back, so that no thread is inside "
      "memra when the interpreter finalizes (CPython ends a thread asking for the GIL then by a "
      "forced unwind, which would abort the process). After it, a daemon thread's native call "
      "parks the thread (the process ends under it) and the exiting thread's raises "
      "UnsupportedError (UNSUPPORTED_AT_EXIT). A Ctrl-C ends the wait.");
}

}  // namespace memra::py
