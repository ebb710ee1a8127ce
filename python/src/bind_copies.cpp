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
      {"Cache", "copy_slot copies a slot's state within a cache, snapshot / restore keep one"},
      {"SlotSnapshot", "Cache.restore takes it back"},
      {"Engine", "make another memra.Engine"},
      {"DeviceArray", "torch.from_dlpack(a).clone() or Engine.to_host copies its values"},
      {"HostRead", "wait() gives its host array"},
      {"DecodeSlots", "make another from the same slots"},
      {"CudaGraph", "capture another"},
      {"Weight", "make another from the same array"},
      {"DeviceWeight", "make another from the host array"},
      {"LayerStateSpec", "read its fields"},
      {"KdaLayer", "build another from the same weights"},
      {"GdnLayer", "build another from the same weights"},
      {"MlaLayer", "build another from the same weights"},
      {"AttentionLayer", "build another from the same weights"},
      {"MlpLayer", "build another from the same weights"},
      {"MoeLayer", "build another from the same weights"},
      {"HyperConnection", "build another from the same weights"},
  };
  for (const auto& [name, instead] : kClasses) {
    nb::object cls = m.attr(name);
    const std::string msg = std::string(name) +
                            ": memra's native objects are not copied or pickled (they own engine, "
                            "device or cache memory); " + instead;
    for (const char* method : {"__copy__", "__deepcopy__", "__reduce_ex__"}) {
      nb::setattr(cls, method,
                  nb::cpp_function([msg](nb::handle, nb::args) { raise_status(Status(kUnsupported, msg)); },
                                   nb::scope(cls), nb::name(method), nb::is_method(),
                                   nb::sig((std::string("def ") + method + "(self, *args) -> typing.NoReturn").c_str())));
    }
  }
}

}  // namespace memra::py
