// The count of memra calls in progress and the exit hook that waits for it (nogil.h says why).
#include "nogil.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <nanobind/stl/vector.h>

#include "common.h"

namespace memra::py {
namespace {

// These change only while the changing thread holds the GIL: a call's check of `g_closed` and
// its count are one step the exit hook cannot come between.
std::atomic<int> g_running{0};  // memra calls in progress, on all threads
std::atomic<int> g_native{0};   // of those, the GIL releases (ReleasedGil): native work that ends
std::atomic<bool> g_closed{false};
std::atomic<unsigned long> g_exit_thread{0};  // the thread that ran the exit hook
thread_local int t_depth = 0;                 // this thread's part of g_running
thread_local int t_daemon = -1;               // whether this thread is a daemon (-1: not asked yet)
std::atomic<bool> g_hook_done{false};         // the hook stopped waiting
bool g_fork_with_threads = false;  // os.fork() ran while other threads were alive
bool g_child_of_threads = false;   // this process is such a fork's child

// Whether a Python thread other than the caller and those of `quiet` is alive: its frames may
// hold memra objects past the teardown, which nanobind would report as leaks of its bindings.
bool other_threads_alive(const std::vector<unsigned long>& quiet) {
  PyThreadState* me = PyThreadState_Get();
  for (PyThreadState* t = PyInterpreterState_ThreadHead(PyThreadState_GetInterpreter(me)); t;
       t = PyThreadState_Next(t)) {
    if (t != me && std::find(quiet.begin(), quiet.end(), t->thread_id) == quiet.end()) return true;
  }
  return false;
}

// Asked at the thread's first memra call: after the hook, running Python code inside memra's
// frames is what the hook guards against.
bool daemon_thread() {
  if (t_daemon < 0) {
    PyObject* threading = PyImport_ImportModule("threading");
    PyObject* t = threading ? PyObject_CallMethod(threading, "current_thread", nullptr) : nullptr;
    PyObject* d = t ? PyObject_GetAttrString(t, "daemon") : nullptr;
    t_daemon = d && PyObject_IsTrue(d) == 1;
    Py_XDECREF(d);
    Py_XDECREF(t);
    Py_XDECREF(threading);
    PyErr_Clear();
  }
  return t_daemon == 1;
}

constexpr const char* kAtExit =
    "the interpreter is exiting: memra runs no call after its exit hook that could leave a "
    "thread inside memra as the interpreter finalizes";

// Set the refusal of a call made after the hook (`releases`: the call would release the GIL);
// false when the call may go on.
bool refused(bool releases) {
  if (!g_closed.load()) return false;
  if (PyThread_get_thread_ident() == g_exit_thread.load()) {
    if (!releases) return false;  // finalizers and late atexit callbacks: on this thread, safe
    set_status_error(Status(kUnsupportedAtExit, std::string(kAtExit) + " (a call that releases "
                                                "the GIL, from a later atexit callback or finalizer)"));
    return true;
  }
  // Inside a call the hook counted and waits for; once it stopped waiting (only Python code that
  // memra called was left), no new work starts there either.
  if (t_depth > 0 && !g_hook_done.load()) return false;
  if (daemon_thread()) {
    // Ends the thread without a traceback (threading ignores SystemExit), its frames unwound.
    PyErr_SetString(PyExc_SystemExit, "memra: the interpreter is exiting; this daemon thread ends");
  } else {
    set_status_error(Status(kUnsupportedAtExit, std::string(kAtExit) + " (a thread started after it)"));
  }
  return true;
}

// A signal handler's exception (Ctrl-C, a SIGTERM handler's sys.exit) ended the wait while
// another thread is inside memra: finalizing now would abort the process, so it ends here, with
// the status the exception asks for (130 for a Ctrl-C), its output flushed.
[[noreturn]] void exit_now() {
  int status = 1;
  if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
    status = 130;
  } else if (PyErr_ExceptionMatches(PyExc_SystemExit)) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    PyErr_NormalizeException(&type, &value, &trace);
    PyObject* code = value ? PyObject_GetAttrString(value, "code") : nullptr;
    status = !code || code == Py_None ? 0 : PyLong_Check(code) ? int(PyLong_AsLong(code)) : 1;
    Py_XDECREF(code);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(trace);
  }
  PyErr_Clear();
  PyRun_SimpleString(
      "import sys\n"
      "print('memra: exit interrupted while a thread was inside memra; exiting now', file=sys.stderr)\n"
      "for f in (sys.stdout, sys.stderr):\n"
      "    try: f.flush()\n"
      "    except Exception: pass\n");
  _exit(status);
}

}  // namespace

bool enter_call() {
  if (t_daemon < 0 && !g_closed.load()) daemon_thread();
  if (refused(false)) return false;
  ++t_depth;
  g_running.fetch_add(1);
  return true;
}

void leave_call() {
  g_running.fetch_sub(1);
  --t_depth;
}

ReleasedGil::ReleasedGil() {
  if (refused(true)) throw nb::python_error();
  ++t_depth;
  g_running.fetch_add(1);
  g_native.fetch_add(1);
  state_ = PyEval_SaveThread();
}

ReleasedGil::~ReleasedGil() {
  PyEval_RestoreThread(state_);
  g_native.fetch_sub(1);
  g_running.fetch_sub(1);
  --t_depth;
}

void init_nogil(nb::module_& m) {
  // Defined after init_arguments: not fronted, so neither counted nor refused after the hook
  // (a fork from a daemon thread while later atexit callbacks run, a finalizer's check).
  m.def(
      "_before_fork",
      [](const std::vector<unsigned long>& quiet) { g_fork_with_threads = other_threads_alive(quiet); },
      nb::arg("quiet"),
      "os.register_at_fork(before=...) at import: notes whether threads other than this one and "
      "those of `quiet` (idents) are alive.");
  m.def(
      "_after_fork_in_child",
      [] {
        // The parent's counts hold its other threads' calls, threads the child does not have.
        g_running.store(t_depth);
        g_native.store(0);
        g_closed.store(false);
        g_exit_thread.store(0);
        g_hook_done.store(false);
        g_child_of_threads = g_fork_with_threads;
      },
      "os.register_at_fork(after_in_child=...) at import: the counts of calls in progress start "
      "over in the child, which has no other threads.");
  m.def(
      "_exit_began", [] { return g_closed.load(); },
      "Whether memra's exit hook has run (SlotLease.release then gives nothing back).");
  m.def(
      "_finish_native_calls",
      [](const std::vector<unsigned long>& quiet) {
        g_exit_thread.store(PyThread_get_thread_ident());
        g_closed.store(true);
        // Native work ends; Python code that memra called (a __getitem__, a __dlpack__) may
        // block for good (a queue never fed): once no thread has been inside native work for a
        // second, the wait stops (such a thread aborts the process only if it wakes while the
        // interpreter finalizes; nogil.h).
        auto busy = std::chrono::steady_clock::now();
        while (g_running.load() > t_depth) {
          if (g_native.load() > 0) {
            busy = std::chrono::steady_clock::now();
          } else if (std::chrono::steady_clock::now() - busy > std::chrono::seconds(1)) {
            break;
          }
          {
            nb::gil_scoped_release nogil;  // the running calls need it to finish
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          if (PyErr_CheckSignals() != 0) exit_now();
        }
        g_hook_done.store(true);
        // A live thread, or one a fork's child did not inherit, may keep memra objects past the
        // teardown: a leak of the thread's, not of a reference count. `quiet` threads hold none.
        if (other_threads_alive(quiet) || g_child_of_threads) nb::set_leak_warnings(false);
      },
      nb::arg("quiet"),
      "memra's exit hook (atexit, registered at import): waits until no other thread is inside a "
      "memra call, so that none is when the interpreter finalizes (CPython ends a thread asking "
      "for the GIL then by a forced unwind, which would abort the process). After it a daemon "
      "thread's next memra call raises SystemExit (the thread ends quietly), another thread's "
      "UnsupportedError (UNSUPPORTED_AT_EXIT), and on this thread a call that would release the "
      "GIL. A Ctrl-C or a signal handler's exception during the wait ends the process at once "
      "(status 130, or the SystemExit's code). quiet: idents of threads that hold no memra object "
      "(nanobind's leak report is silenced where any other thread is alive).");
}

}  // namespace memra::py
