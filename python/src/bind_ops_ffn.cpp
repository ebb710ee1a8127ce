// Placeholder until the ffn ops are bound.
#include "common.h"

namespace memra::py {
void init_ops_ffn(nb::module_& m) {}
}  // namespace memra::py
