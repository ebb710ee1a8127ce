// Running a memra::op function from a binding (the ops of cpp/include/memra/op/): on the CPU
// the op computes, so it runs with the GIL released; on CUDA it only enqueues. A failure is
// raised as its named memra error once the GIL is held again.
#pragma once

#include <optional>

#include "common.h"
#include "device_args.h"
#include "nogil.h"

namespace memra::py {

// op() returns the op's Status (a lambda over backend(engine) and the op's arguments).
template <typename F>
void run_op(const Engine* engine, F&& op) {
  Status st;
  {
    std::optional<ReleasedGil> nogil;
    if (!on_cuda(engine)) nogil.emplace();
    st = op();
  }
  check(st);
}

// The parameter-struct form: fn(backend(engine), p).
template <typename P>
void run_op(const Engine* engine, Status (*fn)(const op::Backend&, const P&), const P& p) {
  run_op(engine, [&] { return fn(backend(engine), p); });
}

}  // namespace memra::py
