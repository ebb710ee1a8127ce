// Naming the argument behind nanobind's "incompatible function arguments" TypeError.
//
// nanobind refuses a call whose arguments it cannot convert (None for an argument not marked
// .none(), a float or an out-of-range int for an int, a str for a class, ...) with a bare
// TypeError that lists the signature but not which argument failed. Arrays never get there (the
// AnyArray caster takes any object, common.h); everything else does. init_arguments() runs after
// every function and class of memra._core is defined and puts a check in front of each function
// and method, in the per-object vectorcall slot (PEP 590) that CPython and nanobind itself call
// through: a call that succeeds, or fails in any other way, is passed on untouched; on that
// TypeError, memra._arguments.explain() binds the arguments to the signature (__nb_signature__),
// finds the one whose value does not fit its type, and the call raises ContractError naming the
// function, the argument and the value. A wrong number of arguments or an unknown keyword keeps
// Python's TypeError. The stubs, the signatures and the successful calls are unchanged. The same
// front counts each call for the exit hook (nogil.h).
#include <nanobind/stl/string.h>

#include <cstring>
#include <string>

#include "common.h"
#include "nogil.h"

namespace memra::py {

namespace {

// nanobind's dispatchers (one per call complexity: a handful); kChecked[i] fronts g_dispatch[i].
constexpr int kSlots = 8;
vectorcallfunc g_dispatch[kSlots] = {};

// With nanobind's TypeError set: replace it by explain()'s ContractError when there is one.
PyObject* explain(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  if (type == PyExc_TypeError && value) {
    try {
      // nanobind's calls between its own objects (a class calling its __init__) tag a trusted
      // self with the bit below PY_VECTORCALL_ARGUMENTS_OFFSET: not part of the count.
      const Py_ssize_t n = PyVectorcall_NARGS(nargsf) & ~Py_ssize_t(PY_VECTORCALL_ARGUMENTS_OFFSET >> 1);
      nb::list pos;
      for (Py_ssize_t i = 0; i < n; ++i) pos.append(nb::handle(args[i]));
      nb::dict kw;
      const Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
      for (Py_ssize_t j = 0; j < nk; ++j) kw[nb::handle(PyTuple_GET_ITEM(kwnames, j))] = nb::handle(args[n + j]);
      nb::object exc = nb::module_::import_("memra._arguments")
                           .attr("explain")(nb::handle(self), nb::tuple(pos), kw, nb::handle(value));
      if (!exc.is_none()) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(trace);
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
        return nullptr;
      }
    } catch (...) {
      PyErr_Clear();  // the explanation failed: nanobind's own error stands
    }
  }
  PyErr_Restore(type, value, trace);
  return nullptr;
}

template <int I>
PyObject* checked(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (!enter_call()) return nullptr;  // counted for the exit hook (nogil.h)
  PyObject* r = g_dispatch[I](self, args, nargsf, kwnames);
  if (r == nullptr && PyErr_ExceptionMatches(PyExc_TypeError)) r = explain(self, args, nargsf, kwnames);
  leave_call();
  return r;
}

const vectorcallfunc kChecked[kSlots] = {checked<0>, checked<1>, checked<2>, checked<3>,
                                         checked<4>, checked<5>, checked<6>, checked<7>};

void guard(nb::handle f) {
  PyTypeObject* t = Py_TYPE(f.ptr());
  if (std::strcmp(t->tp_name, "nanobind.nb_func") != 0 && std::strcmp(t->tp_name, "nanobind.nb_method") != 0) {
    return;
  }
  if (!(t->tp_flags & Py_TPFLAGS_HAVE_VECTORCALL) || t->tp_vectorcall_offset <= 0) return;
  auto* slot = reinterpret_cast<vectorcallfunc*>(reinterpret_cast<char*>(f.ptr()) + t->tp_vectorcall_offset);
  for (vectorcallfunc c : kChecked) {
    if (*slot == c) return;
  }
  int i = 0;
  while (i < kSlots && g_dispatch[i] != nullptr && g_dispatch[i] != *slot) ++i;
  if (i == kSlots) return;  // more dispatchers than slots: left as nanobind made it
  g_dispatch[i] = *slot;
  *slot = kChecked[i];
}

}  // namespace

void init_arguments(nb::module_& m) {
  for (nb::handle v : nb::borrow<nb::dict>(m.attr("__dict__")).values()) {
    guard(v);
    if (PyType_Check(v.ptr()) && nb::hasattr(v, "__module__") &&
        nb::cast<std::string>(v.attr("__module__")) == "memra._core") {
      // Methods and __init__; not the other dunders, whose TypeErrors protocols may act on
      // (a DLPack consumer retries __dlpack__ without max_version on one).
      for (nb::handle item : v.attr("__dict__").attr("items")()) {
        const std::string name = nb::cast<std::string>(item[0]);
        if (name == "__init__" || name.rfind("__", 0) != 0) guard(item[1]);
      }
    }
  }
}

}  // namespace memra::py
