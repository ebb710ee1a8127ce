// memra._core: the nanobind extension. One init_<area>() per file (STYLE.md "Bindings one area
// per file").
#include "bind_options.h"
#include "common.h"
#include "device_args.h"
#include "nogil.h"

NB_MODULE(_core, m) {
  m.doc() = "memra's C++ runtime: CPU reference ops, Engine, Cache and layer objects.";
  memra::py::init_errors(m);
  memra::py::init_weight(m);
  memra::py::init_ops_basic(m);
  memra::py::init_ops_kda(m);
  memra::py::init_ops_gdn(m);
  memra::py::init_ops_mla(m);
  memra::py::init_ops_mlp(m);
  memra::py::init_ops_moe(m);
  memra::py::init_ops_sample(m);
  memra::py::init_ops_mhc(m);
  memra::py::init_ops_dsa(m);
  memra::py::init_ops_attention(m);
  memra::py::init_ops_util(m);
  memra::py::init_graph(m);
  memra::py::init_options(m);
  memra::py::init_engine(m);
  memra::py::init_device(m);
  memra::py::init_cache(m);
  memra::py::init_layers(m);
  memra::py::init_layers_attention(m);
  memra::py::init_layers_gdn(m);
  memra::py::init_arguments(m);  // it fronts every function defined above
  memra::py::init_nogil(m);      // after it: the exit hook's functions are not fronted
  memra::py::init_copies(m);     // copy / pickle refusals: nothing to count
}
