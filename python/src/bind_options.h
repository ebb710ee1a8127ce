// memra._core.KernelOptions (memra/options.h), and the helper that reads an `options=` argument.
#pragma once

#include "common.h"
#include "memra/options.h"

namespace memra::py {

void init_options(nb::module_& m);

// `h` as KernelOptions: None gives the defaults; anything but a KernelOptions is a ContractError
// 40025 naming `op`, the argument `name` and what was passed.
KernelOptions options_arg(nb::handle h, const char* op, const char* name);

}  // namespace memra::py
