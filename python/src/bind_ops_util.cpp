// Functional bindings of the small data movements the model chains between layers, on either
// backend: take_rows (a row range, e.g. the last prefill position before the LM head).
#include <cstdint>
#include <cstring>

#include "device_args.h"

namespace memra::py {

void init_ops_util(nb::module_& m) {
  m.def(
      "take_rows",
      [](const AnyArray& x, int64_t start, int64_t count, const Engine* engine) {
        const float* xp = f32_in(engine, x, "take_rows", "x", {-1, -1});
        const int64_t T = dim(x, 0), D = dim(x, 1);
        if (start < 0 || count < 0 || start > T || count > T - start) {
          raise_contract(kContractRange, "take_rows: start=" + std::to_string(start) +
                                             ", count=" + std::to_string(count) +
                                             ": the rows are outside x's [0, " + std::to_string(T) + ")");
        }
        Out y = out_f32_uninit(engine, {size_t(count), size_t(D)});
        const size_t bytes = size_t(count) * D * 4;
        if (on_cuda(engine)) {
          const CudaContext& c = cuda_ctx(engine);
          check_cuda(engine, c.api().copy(c.ctx(), y.data<float>(), xp + start * D, bytes), "take_rows");
        } else if (bytes) {
          std::memcpy(y.data<float>(), xp + start * D, bytes);
        }
        return y.obj;
      },
      nb::arg("x"), nb::arg("start"), nb::arg("count"), nb::kw_only(),
      nb::arg("engine").none() = nb::none(),
      "Rows [start, start + count) of x [T, D] float32 as a new [count, D] array on the same "
      "backend. Raises ContractError for rows outside x.");
}

}  // namespace memra::py
