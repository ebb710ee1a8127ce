// copy.copy / copy.deepcopy / pickle on memra's native objects: UnsupportedError naming the class
// and what to do instead, where nanobind alone raises TypeError ("cannot pickle 'Cache' object"),
// which the README keeps for wrong argument counts and unknown keywords. Defined after the
// argument front (module.cpp): refusing needs no counting.
#include <string>

#include "common.h"

namespace memra::py {

void init_copies(nb::module_& m) {
  // Every class of the module but KernelOptions (a value: it pickles) and status (constants).
  static const std::pair<const char*, const char*> kClasses[] = {
      {"Cache", "it owns the slots' memory; copy_slot copies a slot's state within a cache, "
                "snapshot / restore keep one"},
      {"SlotSnapshot", "it holds a slot's saved state; Cache.restore takes it back"},
      {"Engine", "it owns a device context and stream; make another memra.Engine"},
      {"DeviceArray", "it owns device memory; torch.from_dlpack(a).clone() or Engine.to_host copies "
                      "its values"},
      {"HostRead", "it waits on a device copy; wait() gives its host array"},
      {"DecodeSlots", "it owns device memory; make another from the same slots"},
      {"CudaGraph", "it owns a graph of its engine's buffers; capture another"},
      {"Weight", "it holds a loaded tensor; make another from the same array"},
      {"DeviceWeight", "it owns device memory; make another from the host array"},
      {"LayerStateSpec", "a layer's cache geometry, made by the layer; read its fields"},
      {"KdaLayer", "it owns its weights; build another from the same weights"},
      {"GdnLayer", "it owns its weights; build another from the same weights"},
      {"MlaLayer", "it owns its weights; build another from the same weights"},
      {"AttentionLayer", "it owns its weights; build another from the same weights"},
      {"MlpLayer", "it owns its weights; build another from the same weights"},
      {"MoeLayer", "it owns its weights; build another from the same weights"},
      {"HyperConnection", "it owns its weights; build another from the same weights"},
  };
  for (const auto& [name, instead] : kClasses) {
    nb::object cls = m.attr(name);
    const std::string msg = std::string(name) + ": not copied or pickled (" + instead + ")";
    for (const char* method : {"__copy__", "__deepcopy__", "__reduce_ex__"}) {
      nb::setattr(cls, method,
                  nb::cpp_function([msg](nb::handle, nb::args) { raise_status(Status(kUnsupported, msg)); },
                                   nb::scope(cls), nb::name(method), nb::is_method(),
                                   nb::sig((std::string("def ") + method + "(self, *args) -> typing.NoReturn").c_str())));
    }
  }
}

}  // namespace memra::py
