#include "services/router/server/retry_budget.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace lazyattn::router {
namespace {

// max(min_retries, percent % of the requests in flight), floored; slots give their place back
// when destroyed, reset or moved over.
TEST(RetryBudgetTest, AllowsTheLargerOfTheMinimumAndThePercentOfRequests) {
  RetryBudget budget({.percent = 20.0, .min_retries = 3});
  EXPECT_EQ(budget.allowed(), 3);
  std::vector<RetryBudget::RequestSlot> requests;
  for (int i = 0; i < 29; ++i) requests.push_back(budget.StartRequest());
  EXPECT_EQ(budget.allowed(), 5);  // 20 % of 29, floored
  requests.push_back(budget.StartRequest());
  EXPECT_EQ(budget.allowed(), 6);

  std::vector<RetryBudget::RetrySlot> retries;
  for (int i = 0; i < 6; ++i) {
    retries.push_back(budget.TryStartRetry());
    EXPECT_TRUE(retries.back().held()) << "retry " << i;
  }
  EXPECT_EQ(budget.retries_in_flight(), 6);
  EXPECT_FALSE(budget.TryStartRetry().held());
  EXPECT_EQ(budget.retries_in_flight(), 6);  // a refused slot holds nothing

  retries[0].Reset();
  EXPECT_EQ(budget.retries_in_flight(), 5);
  RetryBudget::RetrySlot again = budget.TryStartRetry();
  EXPECT_TRUE(again.held());
  retries[1] = std::move(again);  // the old slot's place is given back, the new one kept
  EXPECT_EQ(budget.retries_in_flight(), 5);
  EXPECT_FALSE(again.held());

  // Fewer requests in flight: the retries already running keep their places, new ones wait.
  requests.resize(10);
  EXPECT_EQ(budget.allowed(), 3);
  EXPECT_FALSE(budget.TryStartRetry().held());
  retries.clear();
  EXPECT_EQ(budget.retries_in_flight(), 0);
  EXPECT_TRUE(budget.TryStartRetry().held());
}

// Whole percents of whole request counts come out exact (29 % of 100 is 29, not 28).
TEST(RetryBudgetTest, WholePercentsAreExact) {
  for (double percent : {29.0, 35.0, 57.0}) {
    RetryBudget budget({.percent = percent, .min_retries = 0});
    std::vector<RetryBudget::RequestSlot> requests;
    for (int i = 0; i < 100; ++i) requests.push_back(budget.StartRequest());
    EXPECT_EQ(budget.allowed(), static_cast<int64_t>(percent)) << percent;
  }
}

TEST(RetryBudgetTest, AZeroBudgetRefusesEveryRetry) {
  RetryBudget budget({.percent = 0.0, .min_retries = 0});
  RetryBudget::RequestSlot request = budget.StartRequest();
  EXPECT_FALSE(budget.TryStartRetry().held());
  RetryBudget full({.percent = 100.0, .min_retries = 0});
  std::vector<RetryBudget::RequestSlot> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(full.StartRequest());
  std::vector<RetryBudget::RetrySlot> retries;
  for (int i = 0; i < 4; ++i) retries.push_back(full.TryStartRetry());
  for (const auto& r : retries) EXPECT_TRUE(r.held());
  EXPECT_FALSE(full.TryStartRetry().held());
}

}  // namespace
}  // namespace lazyattn::router
