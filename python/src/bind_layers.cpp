// Placeholder.
#include "common.h"

namespace memra::py {
void init_layers(nb::module_& m) {}
}  // namespace memra::py
