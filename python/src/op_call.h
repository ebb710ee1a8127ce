// Calling a memra::op function from a binding: the engine's backend, the GIL released while the
// CPU reference computes (a CUDA op only enqueues), the status raised once the GIL is back.
#pragma once

#include <optional>

#include "common.h"
#include "device_args.h"

namespace memra::py {

template <typename P>
void run_op(const Engine* engine, Status (*fn)(const op::Backend&, const P&), const P& p) {
  Status st;
  {
    std::optional<nb::gil_scoped_release> nogil;
    if (!on_cuda(engine)) nogil.emplace();
    st = fn(backend(engine), p);
  }
  check(st);
}

}  // namespace memra::py
