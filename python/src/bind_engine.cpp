// memra._core.Engine and the CUDA availability probe.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>

#include "common.h"
#include "memra/engine.h"

namespace memra::py {

void init_engine(nb::module_& m) {
  m.def(
      "cuda_available",
      [] {
        std::string reason;
        int count = 0;
        return cuda_probe(&reason, &count).ok();
      },
      "True when memra was built with its CUDA library and a CUDA device is usable here.");
  m.def(
      "cuda_unavailable_reason",
      []() -> std::optional<std::string> {
        std::string reason;
        int count = 0;
        if (cuda_probe(&reason, &count).ok()) return std::nullopt;
        return reason;
      },
      "None when CUDA is usable, otherwise why not (not built, library missing, no driver, no "
      "device).");

  nb::class_<Engine>(m, "Engine",
                     "Owns one device: 'cpu' (the C++ reference backend) or 'cuda'. Raises "
                     "UnsupportedError when a CUDA engine cannot be made here, ContractError for "
                     "an unknown device.")
      .def(
          "__init__",
          [](Engine* self, const std::string& device, int device_index) {
            std::unique_ptr<Engine> e;
            check(Engine::create(device, device_index, &e));
            new (self) Engine(std::move(*e));
          },
          nb::arg("device") = "cpu", nb::arg("device_index") = 0)
      .def_prop_ro("device", &Engine::device, "'cpu' or 'cuda:N'.")
      .def("__repr__", [](const Engine& e) { return "Engine(device='" + e.device() + "')"; });
}

}  // namespace memra::py
