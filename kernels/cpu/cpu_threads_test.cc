// The kernel thread pool's sizing from the CPU budget and its small-product threshold.
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "kernels/include/cpu_threads.h"

namespace lazyattn {
namespace {

TEST(CgroupQuotaTest, ParsesCgroupV2CpuMax) {
  EXPECT_EQ(ParseCgroupV2CpuMax("max 100000\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("200000 100000\n"), 2);
  EXPECT_EQ(ParseCgroupV2CpuMax("150000 100000"), 2);  // 1.5 CPUs: rounded up
  EXPECT_EQ(ParseCgroupV2CpuMax("50000 100000"), 1);
  EXPECT_EQ(ParseCgroupV2CpuMax(""), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("garbage"), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("100000 0"), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("-5 100000"), std::nullopt);
}

TEST(CgroupQuotaTest, ParsesCgroupV1Quota) {
  EXPECT_EQ(ParseCgroupV1CpuQuota("-1\n", "100000\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupV1CpuQuota("400000\n", "100000\n"), 4);
  EXPECT_EQ(ParseCgroupV1CpuQuota("250000", "100000"), 3);
  EXPECT_EQ(ParseCgroupV1CpuQuota("x", "100000"), std::nullopt);
}

class CgroupRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("cpu_threads_test." + std::to_string(getpid()) + "." +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    std::filesystem::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  std::filesystem::path root_;
};

TEST_F(CgroupRootTest, ReadsV2ThenV1AndNoneWhenAbsent) {
  EXPECT_EQ(CgroupCpuQuota(root_.string()), std::nullopt);
  Write("cpu,cpuacct/cpu.cfs_quota_us", "300000\n");
  Write("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuQuota(root_.string()), 3);
  Write("cpu.max", "200000 100000\n");  // v2 wins where both are mounted
  EXPECT_EQ(CgroupCpuQuota(root_.string()), 2);
  Write("cpu.max", "max 100000\n");
  EXPECT_EQ(CgroupCpuQuota(root_.string()), std::nullopt);
}

// A container limited to 2 CPUs on a 32-core host.
TEST_F(CgroupRootTest, ContainerOnLargeHostGetsItsQuota) {
  Write("cpu.max", "200000 100000\n");
  EXPECT_EQ(DefaultCpuKernelThreadsFrom(32, CgroupCpuQuota(root_.string()), nullptr, nullptr), 2);
}

TEST(DefaultThreadsTest, TakesTheSmallestBudget) {
  EXPECT_EQ(DefaultCpuKernelThreadsFrom(32, std::nullopt, nullptr, nullptr), 32);
  EXPECT_EQ(DefaultCpuKernelThreadsFrom(4, 8, nullptr, nullptr), 4);
  EXPECT_EQ(DefaultCpuKernelThreadsFrom(32, 8, "3", nullptr), 3);
  EXPECT_EQ(DefaultCpuKernelThreadsFrom(32, std::nullopt, nullptr, "6"), 6);
  EXPECT_EQ(DefaultCpuKernelThreadsFrom(32, std::nullopt, "5", "2"), 5);  // OpenBLAS's first
  EXPECT_EQ(DefaultCpuKernelThreadsFrom(32, std::nullopt, "64", nullptr), 32);  // never raises
  EXPECT_EQ(DefaultCpuKernelThreadsFrom(8, std::nullopt, "0", "bad"), 8);  // unusable: ignored
  EXPECT_EQ(DefaultCpuKernelThreadsFrom(0, std::nullopt, nullptr, nullptr), 1);
  EXPECT_EQ(DefaultCpuKernelThreadsFrom(1024, std::nullopt, nullptr, nullptr), 256);
}

TEST(CpuWorkGrainTest, SmallProductsAreOneRange) {
  EXPECT_EQ(CpuWorkGrain(64, 16, 64), 64);        // tiny model: 64x64
  EXPECT_EQ(CpuWorkGrain(256, 16, 64), 256);      // 16K multiply-adds
  EXPECT_EQ(CpuWorkGrain(576, 16, 576), 32);      // SmolLM2 576x576: >= 16K a range
  EXPECT_EQ(CpuWorkGrain(49152, 16, 576), 32);
  EXPECT_EQ(CpuWorkGrain(1536, 32, 576 * 64), 32);  // a prefill GEMM keeps its grain
  EXPECT_EQ(CpuWorkGrain(int64_t{1} << 40, 16, int64_t{1} << 40), 16);  // no overflow
}

TEST(CpuThreadsTest, SmallLoopsRunOnTheCaller) {
  SetCpuKernelThreads(4);
  std::set<std::thread::id> ids;
  const int64_t grain = CpuWorkGrain(64, 16, 64);
  CpuParallelFor(64, grain, [&](int64_t, int64_t) { ids.insert(std::this_thread::get_id()); });
  EXPECT_EQ(ids, std::set<std::thread::id>{std::this_thread::get_id()});
  SetCpuKernelThreads(0);
}

TEST(CpuThreadsTest, NestedLoopsRunInline) {
  SetCpuKernelThreads(4);
  std::atomic<int64_t> total{0}, foreign{0};
  CpuParallelFor(64, 1, [&](int64_t begin, int64_t end) {
    const auto outer = std::this_thread::get_id();
    CpuParallelFor(end - begin, 1, [&](int64_t b, int64_t e) {
      if (std::this_thread::get_id() != outer) foreign.fetch_add(1);
      total.fetch_add(e - b);
    });
  });
  EXPECT_EQ(total.load(), 64);
  EXPECT_EQ(foreign.load(), 0);
  SetCpuKernelThreads(0);
}

}  // namespace
}  // namespace lazyattn
