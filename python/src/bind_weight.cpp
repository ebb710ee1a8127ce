// memra._core.Weight: a weight tensor kept in its file dtype (tensor.h).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"

namespace memra::py {

void init_weight(nb::module_& m) {
  nb::class_<Weight>(m, "Weight",
                     "A weight tensor (rank 1..4) copied once into memra, kept in its file dtype "
                     "(float32, float16 or bfloat16) and converted to f32 per row by the ops.")
      .def(
          "__init__",
          [](Weight* self, const AnyArray& array, const std::string& dtype, const std::string& name) {
            new (self) Weight(weight_from_array(array, dtype, name.c_str()));
          },
          nb::arg("array"), nb::kw_only(), nb::arg("dtype") = "", nb::arg("name") = "weight",
          "array: host array of float32/float16/bfloat16, or uint16 raw bfloat16 bits with "
          "dtype='bfloat16'. Raises ContractError on another dtype, a device array, a "
          "non-contiguous array or rank outside 1..4.")
      .def_prop_ro("dtype", [](const Weight& w) { return std::string(dtype_name(w.dtype())); })
      .def_prop_ro("shape", [](const Weight& w) { return w.shape(); })
      .def_prop_ro("nbytes", [](const Weight& w) { return w.nbytes(); })
      .def(
          "to_numpy",
          [](const Weight& w) {
            std::vector<size_t> shape(w.shape().begin(), w.shape().end());
            NpF32 out = new_f32(shape);
            std::vector<float> v = w.to_f32();
            std::copy(v.begin(), v.end(), out.data());
            return out;
          },
          "The weight converted to a float32 numpy array.")
      .def("__repr__", [](const Weight& w) {
        return "Weight(" + std::string(dtype_name(w.dtype())) + ", " + w.shape_str() + ")";
      });
}

}  // namespace memra::py
