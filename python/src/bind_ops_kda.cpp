// Placeholder until the kda ops are bound.
#include "common.h"

namespace memra::py {
void init_ops_kda(nb::module_& m) {}
}  // namespace memra::py
