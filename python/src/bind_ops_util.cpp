// Functional bindings of the small data movements the model chains between layers, on either
// backend: take_rows (a row range, e.g. the last prefill position before the LM head) and
// concat_rows (a batched prefill's per-sequence mixer outputs back into one packed array).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "device_args.h"

namespace memra::py {

void init_ops_util(nb::module_& m) {
  m.def(
      "take_rows",
      [](const AnyArray& x, Index start_i, Index count_i, const Engine* engine) {
        const int64_t start = start_i, count = count_i;
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

  m.def(
      "concat_rows",
      [](nb::handle parts, const Engine* engine) {
        const char* op = "concat_rows";
        if (nb::hasattr(parts, "__dlpack__") || !nb::isinstance<nb::sequence>(parts) ||
            nb::isinstance<nb::str>(parts) || nb::len(parts) == 0) {
          raise_contract(kContractDType, std::string(op) +
                                             ": argument 'parts' must be a non-empty list of "
                                             "[T_i, D] float32 arrays, got " +
                                             std::string(nb::type_name(parts.type()).c_str()));
        }
        // Every part is checked before the output is allocated; the rows are copied in order.
        // keep holds each imported part until the copies are done: a sequence may hand out a
        // fresh array per item (or a DLPack capsule), which dies with the loop's reference.
        std::vector<AnyArray> keep;
        std::vector<const float*> src;
        std::vector<int64_t> rows;
        int64_t D = -1, T = 0;
        size_t i = 0;
        for (nb::handle h : parts) {
          const std::string name = "parts[" + std::to_string(i++) + "]";
          AnyArray a;
          if (!nb::try_cast(h, a)) {
            raise_contract(kContractDType, std::string(op) + ": " + name + " must be an array, got " +
                                               std::string(nb::type_name(h.type()).c_str()));
          }
          src.push_back(f32_in(engine, a, op, name.c_str(), {-1, D}));
          D = dim(a, 1);
          rows.push_back(dim(a, 0));
          T += rows.back();
          keep.push_back(std::move(a));
        }
        Out y = out_f32_uninit(engine, {size_t(T), size_t(D)});
        char* dst = static_cast<char*>(y.ptr);
        for (size_t p = 0; p < src.size(); ++p) {
          const size_t bytes = size_t(rows[p]) * size_t(D) * 4;
          if (!bytes) continue;
          if (on_cuda(engine)) {
            const CudaContext& c = cuda_ctx(engine);
            check_cuda(engine, c.api().copy(c.ctx(), dst, src[p], bytes), op);
          } else {
            std::memcpy(dst, src[p], bytes);
          }
          dst += bytes;
        }
        return y.obj;
      },
      nb::arg("parts"), nb::kw_only(), nb::arg("engine").none() = nb::none(),
      "The arrays of parts (a list of [T_i, D] float32 arrays, one D, on the engine's device) "
      "stacked by rows into a new [sum T_i, D] array on the same backend: a batched prefill's "
      "per-sequence rows put back at their offsets. Raises ContractError naming a part that is "
      "not such an array, or an empty list.");
}

}  // namespace memra::py
