// Placeholder.
#include "common.h"

namespace memra::py {
void init_cache(nb::module_& m) {}
}  // namespace memra::py
