// Placeholder.
#include "common.h"

namespace memra::py {
void init_engine(nb::module_& m) {}
}  // namespace memra::py
