#include "tools/cachesim/closed_form.h"

#include <vector>

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(ClosedFormTest, FormulaOfDesignSectionOne) {
  EXPECT_NEAR(ZipfHeadSum(5, 1.0), 1 + 1 / 2.0 + 1 / 3.0 + 1 / 4.0 + 1 / 5.0, 1e-12);
  EXPECT_NEAR(StaticPositionGain(100, 20, 0.85), 2.87, 0.01);  // DESIGN.md: 2.86x
  EXPECT_NEAR(StaticPositionGain(100, 20, 0.0), 20.0, 1e-9);   // uniform: exactly D
}

TEST(ClosedFormTest, CheIsExactForUniformPopularity) {
  const std::vector<double> p(1000, 1e-3);
  EXPECT_NEAR(CheLruHitRatio(p, 1, 100), 0.1, 1e-6);
  EXPECT_NEAR(CheLruHitRatio(p, 4, 100), 0.025, 1e-6);
  EXPECT_DOUBLE_EQ(CheLruHitRatio(p, 1, 5000), 1.0);
}

TEST(ClosedFormTest, SimulationTracksTheLruPrediction) {
  PositionCheckOptions o{.num_documents = 2000,
                         .capacity = 40,
                         .positions = 4,
                         .zipf_a = 0.9,
                         .num_requests = 60000,
                         .warmup_requests = 6000};
  auto r = RunPositionCheck(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_blocks, 43);
  EXPECT_NEAR(r->sim_lazy, r->che_lazy, 0.1 * r->che_lazy);
  EXPECT_NEAR(r->sim_block, r->che_block, 0.1 * r->che_block);
  EXPECT_GT(r->sim_gain(), 1.3);
  EXPECT_LT(r->che_lazy, r->static_lazy);  // LRU does worse than the static top-C
}

}  // namespace
}  // namespace lazyattn
