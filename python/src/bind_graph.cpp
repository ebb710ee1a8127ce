// memra._core.DecodeSlots and memra._core.CudaGraph (decode_step.h): what a captured decode step
// reads and how it is replayed (docs/decode_graphs.md). The capture itself is begun and ended on
// the Engine (bind_engine.cpp).
#include <nanobind/stl/unique_ptr.h>

#include <memory>

#include "common.h"
#include "device_args.h"
#include "memra/cache.h"
#include "memra/decode_step.h"

namespace memra::py {

void init_graph(nb::module_& m) {
  nb::class_<DecodeSlots>(m, "DecodeSlots",
                          "A decode batch's slot ids on a CUDA cache's device, at a fixed address "
                          "(what a captured decode step reads): `size` rows, each a slot or idle "
                          "(-1). Layers' decode(cache, layer, slots, x) accepts it in place of a "
                          "host slot array: the rows' positions then come from the cache's device "
                          "lengths and nothing is copied from the host, so the step can be captured "
                          "into a CUDA graph (Engine.begin_capture). Idle rows read and write no "
                          "state. Raises UnsupportedError on a CPU cache, ContractError for size < 1.")
      .def(
          "__init__",
          [](DecodeSlots* self, Cache& cache, int size) {
            std::unique_ptr<DecodeSlots> d;
            check(DecodeSlots::create(cache, size, &d));
            new (self) DecodeSlots(std::move(*d));
          },
          nb::arg("cache"), nb::arg("size"), nb::keep_alive<1, 2>())
      .def(
          "set",
          [](DecodeSlots& d, const AnyArray& slots) {
            const int32_t* p = i32_arg(slots, "DecodeSlots.set", "slots", {-1});
            check(d.set(p, dim32(slots, 0, "DecodeSlots.set", "slots")));
          },
          nb::arg("slots"),
          "Rows [0, n) take slots [n] (host int32, distinct, in [0, max_batch)); the other rows "
          "become idle. Uploaded asynchronously when they changed (not while capturing). Raises "
          "ContractError (CONTRACT_SHAPE for more slots than rows, CONTRACT_RANGE for a slot "
          "outside the cache, CONTRACT_VALUE for a repeated slot); nothing changes on a refusal.")
      .def_prop_ro("size", &DecodeSlots::size, "Rows (the batch bucket).")
      .def_prop_ro("active", &DecodeSlots::active, "Rows set by the last set() (the rest idle).")
      .def_prop_ro(
          "slots",
          [](const DecodeSlots& d) -> nb::object {
            NpI32 out = new_i32({size_t(d.size())});
            std::copy(d.host().begin(), d.host().end(), out.data());
            return nb::cast(out);
          },
          "A host copy of the rows' slots [size] int32 (-1 = idle).");

  nb::class_<CudaGraph>(m, "CudaGraph",
                        "A CUDA graph captured from an engine's stream (Engine.begin_capture / "
                        "end_capture): replay() enqueues the recorded work again, reading whatever "
                        "the captured device buffers hold at replay time.")
      .def(
          "replay", [](const CudaGraph& g) { check(g.launch()); },
          "Enqueue the graph on the engine's stream (asynchronous; Engine.synchronize or a host "
          "copy waits for it).");
}

}  // namespace memra::py
