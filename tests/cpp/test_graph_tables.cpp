// The decode graph's bookkeeping ops are CUDA only: on the CPU backend op:: refuses them
// (kUnsupported) without touching the arrays (their CUDA behaviour:
// tests/test_cuda_graph_tables.py).
#include <gtest/gtest.h>

#include <vector>

#include "memra/op/graph_tables.h"

namespace memra {
namespace {

TEST(OpGraphTables, CpuBackendRefuses) {
  std::vector<int32_t> slots = {0, 1}, lengths = {3, 4}, cur = {0, 1};
  EXPECT_EQ(op::commit_decode(op::Backend{}, slots.data(), 2, lengths.data(), cur.data()).code,
            kUnsupported);
  EXPECT_EQ(lengths, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(cur, (std::vector<int32_t>{0, 1}));
  const MemraDecodeTablesParams p{slots.data(), 2, lengths.data(), nullptr, nullptr, 0,
                                  nullptr, nullptr, nullptr};
  EXPECT_EQ(op::decode_tables(op::Backend{}, p).code, kUnsupported);
}

}  // namespace
}  // namespace memra
