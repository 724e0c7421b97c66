#include "tools/cachesim/kv_budget.h"

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(KvBudgetTest, ModelShapes) {
  EXPECT_EQ(FindModelShape("llama3-8b")->BytesPerToken(), 128 * 1024);
  EXPECT_EQ(FindModelShape("smollm2-135m")->BytesPerToken(), 23040);
  auto bad = FindModelShape("gpt5");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("llama3-8b"), std::string::npos);
}

TEST(KvBudgetTest, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("1GiB"), int64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("10GB"), 10'000'000'000);
  EXPECT_EQ(*ParseByteSize("1.5KiB"), 1536);
  EXPECT_EQ(*ParseByteSize("512"), 512);
  EXPECT_EQ(*ParseByteSize("64B"), 64);
  for (const char* bad : {"", "GiB", "-1GB", "1XB", "0", "1e30GB"}) {
    EXPECT_EQ(ParseByteSize(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(BlocksForBudget(int64_t{1} << 30, 128 * 1024, 16), 512);
  EXPECT_EQ(BlocksForBudget(int64_t{1} << 30, 23040, 16), 2912);
}

}  // namespace
}  // namespace lazyattn
