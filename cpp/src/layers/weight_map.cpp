#include <climits>
#include <string>

#include "memra/layers.h"
#include "memra/msg.h"

namespace memra {

Status check_sizes(const char* layer, std::initializer_list<std::pair<const char*, int>> sizes) {
  for (const auto& [name, value] : sizes) {
    if (value < 0) {  // no size is negative; a negative one would reach a shape check as [-16, 32]
      return Status(kContractValue, std::string(layer) + ": " + name + " must be >= 0, got " +
                                        std::to_string(value));
    }
    if (value > kMaxLayerSize) {
      return Status(kContractValue, std::string(layer) + ": " + name + " must be at most " +
                                        std::to_string(kMaxLayerSize) + " (2^20), got " +
                                        std::to_string(value));
    }
  }
  return Status::Ok();
}

namespace {
std::string shape_of(const std::vector<int64_t>& s) {
  Msg os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// At most one extent differs from 1.
bool unit_padded(const std::vector<int64_t>& s) {
  int other = 0;
  for (int64_t e : s) other += e != 1;
  return other <= 1;
}
}  // namespace

Status WeightMap::take(const std::string& name, const std::vector<int64_t>& shape, Weight* out) {
  auto it = weights_.find(name);
  if (it == weights_.end()) {
    return Status(kContractMissing, owner_ + ": missing tensor '" + name + "' (expected shape " +
                                        shape_of(shape) + ")");
  }
  // A tensor matches when its shape is `shape`, or when `shape` is rank 1 and the tensor is that
  // vector with unit extents around it (per-head vectors such as A_log are stored as [H] or
  // [1, 1, H, 1] by different checkpoints); [2, 2] for [4] is a different tensor.
  for (int64_t s : shape) {
    if (s > INT_MAX) {
      return Status(kContractValue, owner_ + ": tensor '" + name + "' would have shape " +
                                        shape_of(shape) + ": an extent above 2^31 - 1");
    }
  }
  const Weight& w = it->second;
  const bool same = w.shape() == shape || (shape.size() == 1 && w.numel() == shape[0] &&
                                           unit_padded(w.shape()));
  if (!same) {
    return Status(kContractShape, owner_ + ": tensor '" + name + "' has shape " + w.shape_str() +
                                      ", expected " + shape_of(shape));
  }
  used_[name] = true;
  *out = w;
  return Status::Ok();
}

Status WeightMap::take_f32(const std::string& name, const std::vector<int64_t>& shape,
                           std::vector<float>* out) {
  Weight w;
  MEMRA_TRY(take(name, shape, &w));
  *out = w.to_f32();
  return Status::Ok();
}

Status WeightMap::finish() const {
  std::string extra;
  for (const auto& kv : weights_) {
    if (!used_.count(kv.first)) extra += (extra.empty() ? "'" : ", '") + kv.first + "'";
  }
  if (!extra.empty()) {
    return Status(kContractMissing, owner_ + ": unexpected tensor(s) " + extra);
  }
  return Status::Ok();
}

}  // namespace memra
