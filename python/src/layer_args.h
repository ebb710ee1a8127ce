// Arguments and calls shared by the layer bindings (bind_layers*.cpp): the host slot list of a
// decode step and a memra.DecodeSlots, checked against the cache the layer call writes, and the
// row-in, row-out calls of the mixers whose decode is decode(cache, layer, slots, B, x, y)
// (KdaLayer, GdnLayer, AttentionLayer).
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "common.h"
#include "device_args.h"
#include "memra/cache.h"
#include "memra/decode_step.h"
#include "nogil.h"

namespace memra::py {

// slots [B] int32: in range and distinct (a slot cannot take two tokens in one decode step).
inline const int32_t* slots_arg(const AnyArray& slots, const Cache& cache, const char* op) {
  const int32_t* s = i32_arg(slots, op, "slots", {-1});
  std::set<int32_t> seen;
  for (int64_t b = 0; b < dim(slots, 0); ++b) {
    check(cache.check_slot(s[b], op));
    if (!seen.insert(s[b]).second) {
      raise_contract(kContractValue, std::string(op) + ": argument 'slots' holds slot " +
                                         std::to_string(s[b]) +
                                         " twice (one token per slot per decode step)");
    }
  }
  return s;
}

// A DecodeSlots argument: made for `cache`, and every active slot has room for one more token
// (checked on the host copy; the device-driven layers cannot check).
inline void check_decode_slots(const DecodeSlots& slots, const Cache& cache, const char* op) {
  if (slots.cache() != &cache) {
    raise_contract(kContractValue, std::string(op) + ": the DecodeSlots belong to another cache");
  }
  for (int32_t s : slots.host()) {
    if (s >= 0) check(cache.check_room(s, 1, op));
  }
}

// Run a layer call with the GIL released; raise its error.
template <typename F>
void run_layer(F&& f) {
  Status st;
  {
    ReleasedGil nogil;
    st = f();
  }
  check(st);
}

// x [rows, hidden] f32 (rows -1: any T) -> y [T, hidden] f32 on the layer's device by
// call(x, T, y) with the GIL released; the checks and errors name `op`.
template <typename L, typename F>
nb::object layer_rows(const L& l, const AnyArray& x, int rows, const char* op, F&& call) {
  const int D = l.config().hidden;
  const float* xp = f32_in(l.cuda(), x, op, "x", {rows, D});
  const int T = int(dim(x, 0));
  Out y = out_f32(l.cuda(), {static_cast<size_t>(T), static_cast<size_t>(D)}, false);
  run_layer([&] { return call(xp, T, y.data<float>()); });
  return y.obj;
}

// decode(cache, layer, slots [B] int32 host, x [B, hidden]) -> y [B, hidden].
template <typename L>
nb::object layer_decode(const L& l, Cache& cache, int layer, const AnyArray& slots,
                        const AnyArray& x, const char* op) {
  const int32_t* sp = slots_arg(slots, cache, op);
  const int B = int(dim(slots, 0));
  return layer_rows(l, x, B, op, [&](const float* xp, int, float* y) {
    return l.decode(cache, layer, sp, B, xp, y);
  });
}

// decode with the rows' slots on the device (memra.DecodeSlots of `cache`); no host round trip
// and the GIL held (the call only enqueues work, and may be captured into a CUDA graph).
template <typename L>
nb::object layer_decode_device(const L& l, Cache& cache, int layer, const DecodeSlots& slots,
                               const AnyArray& x, const char* op) {
  const int D = l.config().hidden, B = slots.size();
  check_decode_slots(slots, cache, op);
  const float* xp = f32_in(l.cuda(), x, op, "x", {B, D});
  Out y = out_f32(l.cuda(), {static_cast<size_t>(B), static_cast<size_t>(D)}, false);
  check(l.decode_device(cache, layer, slots.data(), B, xp, y.data<float>()));
  return y.obj;
}

}  // namespace memra::py
