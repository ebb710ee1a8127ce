// Placeholder until the mla ops are bound.
#include "common.h"

namespace memra::py {
void init_ops_mla(nb::module_& m) {}
}  // namespace memra::py
