// Weight storage: one type that holds a row-major matrix or vector in its file dtype (f32, bf16,
// f16; later Q8_0 and FP8 E4M3 blocks). Ops read rows through row_f32(), so callers never care
// which dtype is stored.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace memra {

enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

const char* dtype_name(DType d);
size_t dtype_size(DType d);

// bf16 -> f32 is exact (the bf16 bits are the high half of the f32 bits).
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round-to-nearest-even f32 -> bf16 (NaN kept quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float f16_to_f32(uint16_t h);

// A non-owning [rows, cols] row-major view of weight bytes in their stored dtype: what the CPU
// reference ops read (a Weight converts to one implicitly), and what an op's parameter struct
// names on either backend (a host pointer on the CPU, a device pointer on CUDA).
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  // Convert `n` elements starting at row `r`, column `c0` to f32 (host data only).
  void read_f32(int64_t r, int64_t c0, int64_t n, float* out) const;
  // Whole row `r` as f32 (cols values).
  void row_f32(int64_t r, float* out) const { read_f32(r, 0, cols, out); }
  // Rows [row0, row0 + n) as a view of their own (an expert of a stacked [E * rows, cols] weight).
  WeightView row_view(int64_t row0, int64_t n) const {
    return {static_cast<const char*>(data) + static_cast<size_t>(row0 * cols) * dtype_size(dtype), dtype, n,
            cols};
  }
};

// A weight tensor of rank 1..3, stored as [rows, cols] row-major where rows = product of all
// leading dims and cols = the last dim. Owns its bytes (copied once at load).
class Weight {
 public:
  Weight() = default;
  // `data` holds numel * dtype_size(dtype) bytes, row-major with the given shape.
  Weight(DType dtype, std::vector<int64_t> shape, const void* data);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t numel() const { return rows_ * cols_; }
  size_t nbytes() const { return bytes_ ? bytes_->size() : 0; }
  const void* data() const { return bytes_ ? bytes_->data() : nullptr; }
  bool empty() const { return !bytes_; }
  std::string shape_str() const;

  // The bytes as a non-owning view (valid while this Weight, or a copy of it, lives).
  WeightView view() const { return {data(), dtype_, rows_, cols_}; }
  operator WeightView() const { return view(); }  // NOLINT: a Weight is usable wherever a view is
  // Convert `n` elements starting at row `r`, column `c0` to f32.
  void read_f32(int64_t r, int64_t c0, int64_t n, float* out) const { view().read_f32(r, c0, n, out); }
  // Whole row `r` as f32 (cols() values).
  void row_f32(int64_t r, float* out) const { read_f32(r, 0, cols_, out); }
  // The whole tensor as f32 (numel() values), for small vectors (norm weights, biases).
  std::vector<float> to_f32() const;

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  int64_t rows_ = 0, cols_ = 0;
  std::shared_ptr<std::vector<uint8_t>> bytes_;
};

// Views of several weights (a MoE layer's experts), for the CPU ops that take an array of them.
inline std::vector<WeightView> views_of(const std::vector<Weight>& ws) {
  std::vector<WeightView> out;
  out.reserve(ws.size());
  for (const Weight& w : ws) out.push_back(w.view());
  return out;
}

}  // namespace memra
