// Slot arguments shared by the layer bindings (bind_layers*.cpp): the host slot list of a decode
// step and a memra.DecodeSlots, checked against the cache the layer call writes.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "common.h"
#include "memra/cache.h"
#include "memra/decode_step.h"

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

}  // namespace memra::py
