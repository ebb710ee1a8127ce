// The functional bindings of sampling over DLPack arrays: memra::op::sample (op/sample.h) on the
// CPU reference (cpu/sample.cpp) or, with keyword `engine` = a CUDA Engine, the CUDA library
// (cuda/sample.cu, cuda/sample_greedy.cu, cuda_abi/sample.h). Every function checks its arguments
// (ContractError naming the op and the values) before anything runs, allocates its output on the
// engine's device and, on the CPU, releases the GIL while computing.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <climits>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "device_args.h"
#include "memra/cpu/sample.h"
#include "memra/engine.h"
#include "memra/msg.h"
#include "memra/op/sample.h"
#include "nogil.h"

namespace memra::py {

namespace {

// Counters for sampling: int64 or uint64, 1-D [B], C-contiguous, host (check_array's checks and
// messages, with the two dtypes it has no checker for). int64 values must be non-negative (they
// are reinterpreted as uint64).
std::vector<uint64_t> counter_arg(const AnyArray& a, const char* op, const char* name, int64_t B) {
  const bool is_i64 = a.is_valid() && has_dtype(a, nb::dlpack::dtype_code::Int, 64);
  const bool is_u64 = a.is_valid() && has_dtype(a, nb::dlpack::dtype_code::UInt, 64);
  check_array(a, op, name, {B}, "int64 or uint64", is_i64 || is_u64, nb::device::cpu::value, 0);
  Msg os;
  std::vector<uint64_t> out(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    if (is_i64) {
      const int64_t v = static_cast<const int64_t*>(a.data())[b];
      if (v < 0) {
        os << op << ": argument '" << name << "' holds the negative value " << v
           << " at row " << b;
        raise_contract(kContractRange, os.str());
      }
      out[b] = static_cast<uint64_t>(v);
    } else {
      out[b] = static_cast<const uint64_t*>(a.data())[b];
    }
  }
  return out;
}

size_t sz(int64_t v) { return static_cast<size_t>(v); }

// The optional per-row flag output: an int32 [B] array on the engine's device (host for the CPU
// backend), C-contiguous and writable; nullptr for None.
int32_t* nonfinite_arg(const Engine* engine, const nb::object& obj, const char* op, int64_t B) {
  if (obj.is_none()) return nullptr;
  AnyArray a;
  if (!nb::try_cast(obj, a)) {
    raise_contract(kContractDType, std::string(op) + ": argument 'nonfinite' must be an int32 "
                                       "array or None, got " +
                                       std::string(nb::type_name(obj.type()).c_str()));
  }
  const int32_t* p = i32_in(engine, a, op, "nonfinite", {B});
  require_writable(obj, op, "nonfinite");
  return const_cast<int32_t*>(p);
}

}  // namespace

void init_ops_sample(nb::module_& m) {
  m.def(
      "sample",
      [](const AnyArray& logits, const AnyArray& counters, float temperature, int top_k,
         float top_p, uint64_t seed, std::optional<AnyArray> seeds, const nb::object& nonfinite,
         const Engine* engine) {
        const char* op = "sample";
        const float* lp = f32_in(engine, logits, op, "logits", {-1, -1});
        const int64_t B = dim(logits, 0), V = dim(logits, 1);
        if (B > INT_MAX || V > INT_MAX) {  // the kernels and the CPU op index rows and ids in int
          raise_contract(kContractShape, "sample: logits of shape " + shape_str(logits) +
                                             " exceed 2^31 - 1 rows or columns");
        }
        check_value(V >= 1, op, "logits must have at least one column");
        check_value(std::isfinite(temperature), op,
                    "temperature must be finite (<= 0: greedy), got " + std::to_string(temperature));
        check_nonneg(top_k, op, "top_k");
        check_value(top_p > 0.0f, op, "top_p must be > 0, got " + std::to_string(top_p));
        MemraSampleParams p{};
        std::vector<uint64_t> ctr, row_seeds;  // CPU: host copies (int64 or uint64 arrays)
        if (on_cuda(engine)) {
          p.counters = u64_in(engine, counters, op, "counters", {B});
          p.seeds = seeds ? u64_in(engine, *seeds, op, "seeds", {B}) : nullptr;
        } else {
          ctr = counter_arg(counters, op, "counters", B);
          if (seeds) row_seeds = counter_arg(*seeds, op, "seeds", B);
          p.counters = ctr.data();
          p.seeds = seeds ? row_seeds.data() : nullptr;
        }
        p.nonfinite = nonfinite_arg(engine, nonfinite, op, B);
        if (p.nonfinite) {  // the flags are written while the rows (and, on CUDA, counters) are read
          const size_t flags = sz(B) * sizeof(int32_t), ctr_bytes = sz(B) * sizeof(uint64_t);
          check_disjoint(op, "logits", lp, logits.nbytes(), "nonfinite", p.nonfinite, flags);
          check_disjoint(op, "counters", counters.data(), ctr_bytes, "nonfinite", p.nonfinite, flags);
          if (seeds) check_disjoint(op, "seeds", seeds->data(), ctr_bytes, "nonfinite", p.nonfinite, flags);
        }
        Out out = out_i32(engine, {sz(B)});
        p.logits = lp;
        p.B = int(B);
        p.V = int(V);
        p.temperature = temperature;
        p.top_k = top_k;
        p.top_p = top_p;
        p.seed = seed;
        p.out = out.data<int32_t>();
        {
          std::optional<ReleasedGil> nogil;
          if (!on_cuda(engine)) nogil.emplace();
          check(op::sample(backend(engine), p));
        }
        return out.obj;
      },
      nb::arg("logits"), nb::arg("counters"), nb::kw_only(), nb::arg("temperature"),
      nb::arg("top_k") = 0, nb::arg("top_p") = 1.0f, nb::arg("seed") = 0,
      nb::arg("seeds").none() = nb::none(), nb::arg("nonfinite").none() = nb::none(),
      nb::arg("engine").none() = nb::none(),
      "One token per row.\n\nlogits [B, V] float32; counters [B], the per-row draw index; seeds "
      "[B] (same dtype rules as counters), when given, the per-row seed replacing `seed`. "
      "nonfinite, when given: an int32 [B] array "
      "(on the engine's device; host arrays for the CPU) that the same call (on CUDA the same "
      "launches, so inside a captured graph) fills with 1 where the row's logits hold a NaN or "
      "+-inf and 0 elsewhere; the token drawn for such a row is the one drawn without it "
      "(memra.batch ends that row with NonFiniteError). "
      "temperature <= 0: argmax (ties to the lower id; a NaN never wins unless it sits at id 0, "
      "which then keeps the row: the CPU scan's v[i] > v[best]). Otherwise "
      "softmax(logits / temperature) in f32; keep the top_k most likely (0: all), then the "
      "shortest prefix in (p desc, id asc) order whose top-k-renormalised mass reaches top_p "
      "(>= 1: all); draw by inverse CDF with u = uniform_from_counter(seed, counter) (splitmix64; "
      "the exact formula is in cpu/sample.h). A row whose softmax has no positive finite "
      "denominator (every logit -inf, a NaN, or logits / temperature past float32's range, "
      "e.g. 3e38 at temperature 0.5) has no distribution to draw from and takes the argmax "
      "above instead; only non-finite logits set nonfinite. Every sum (the softmax denominator, the top-k "
      "mass, the running top-p mass and CDF) is an f32 sum in cpu/sample.h's blocked order: "
      "blocks of 512 terms "
      "each summed left to right, then the block sums left to right; the running sum at i is "
      "the sum of the blocks before i's plus i's block up to i. Returns int32 [B].\n"
      "engine: None or a CPU Engine: host arrays, counters uint64 or int64 (>= 0). A CUDA "
      "Engine: arrays on its device, counters uint64; the same f32 arithmetic as the CPU "
      "(glibc's expf reproduced bit for bit, the same blocked sums, the blocks summed in "
      "parallel), so the same seed and counter give the same token.\n"
      "Raises ContractError (CONTRACT_DTYPE for counters not int64/uint64 (uint64 on CUDA), "
      "logits not float32 or nonfinite not int32, CONTRACT_SHAPE, CONTRACT_STRIDE, "
      "CONTRACT_DEVICE, CONTRACT_RANGE for a negative int64 counter or a seed outside [0, 2^64), "
      "CONTRACT_VALUE for top_p "
      "<= 0 or NaN, top_k < 0, a temperature that is not finite, or a nonfinite array that is "
      "read-only or shares memory with logits, counters or seeds).\n"
      "Reference: transformers' temperature / TopK / TopP logits warpers followed by "
      "multinomial, with a counter-based draw. One difference, at exact ties only: where "
      "several tokens share the top_k-th probability, TopKLogitsWarper (and vLLM) keep all of "
      "them and this keeps exactly top_k, lower ids first.");

  m.def(
      "uniform_from_counter",
      [](uint64_t seed, uint64_t counter) { return cpu::uniform_from_counter(seed, counter); },
      nb::arg("seed"), nb::arg("counter"),
      "The counter-based uniform in [0, 1) that sample draws with: seed and counter are uint64 "
      "(ContractError CONTRACT_RANGE outside [0, 2^64)); the float32 made of splitmix64(seed, "
      "counter)'s top 24 bits times 2^-24 (the exact formula: cpp/include/memra/cpu/sample.h). "
      "Returns a float.");
}

}  // namespace memra::py
