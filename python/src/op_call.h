// Running a memra::op function from a binding (the ops of cpp/include/memra/op/): on the CPU
// the op computes, so it runs with the GIL released; on CUDA it only enqueues. A failure is
// raised as its named memra error once the GIL is held again.
#pragma once

#include <optional>

#include "device_args.h"

namespace memra::py {

template <typename F>
void run_op(const Engine* engine, F&& op) {
  Status st;
  {
    std::optional<nb::gil_scoped_release> nogil;
    if (!on_cuda(engine)) nogil.emplace();
    st = op();
  }
  check(st);
}

}  // namespace memra::py
