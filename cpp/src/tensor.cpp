#include "memra/tensor.h"

#include <cmath>
#include "memra/msg.h"

namespace memra {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
  }
  return "?";
}

size_t dtype_size(DType d) { return d == DType::kF32 ? 4 : 2; }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

Weight::Weight(DType dtype, std::vector<int64_t> shape, const void* data)
    : dtype_(dtype), shape_(std::move(shape)) {
  cols_ = shape_.empty() ? 1 : shape_.back();
  rows_ = 1;
  for (size_t i = 0; i + 1 < shape_.size(); ++i) rows_ *= shape_[i];
  const size_t n = static_cast<size_t>(rows_ * cols_) * dtype_size(dtype_);
  bytes_ = std::make_shared<std::vector<uint8_t>>(n);
  if (n) std::memcpy(bytes_->data(), data, n);
}

std::string Weight::shape_str() const {
  Msg os;
  os << "[";
  for (size_t i = 0; i < shape_.size(); ++i) os << (i ? ", " : "") << shape_[i];
  os << "]";
  return os.str();
}

void WeightView::read_f32(int64_t r, int64_t c0, int64_t n, float* out) const {
  const int64_t off = r * cols + c0;
  switch (dtype) {
    case DType::kF32: {
      std::memcpy(out, static_cast<const float*>(data) + off, n * sizeof(float));
      break;
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + off;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      break;
    }
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + off;
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      break;
    }
  }
}

std::vector<float> Weight::to_f32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  for (int64_t r = 0; r < rows_; ++r) row_f32(r, out.data() + r * cols_);
  return out;
}

}  // namespace memra
