#include "services/router/server/plan_cursor.h"

#include <gtest/gtest.h>

namespace lazyattn::router {
namespace {

TEST(PlanCursorTest, WalksThePlanInOrder) {
  PlanCursor cursor;
  for (size_t i = 0; i < 3; ++i) {
    auto next = cursor.Advance(3, /*nothing_sent=*/true);
    ASSERT_TRUE(next.has_value());
    EXPECT_EQ(next->index, i);
    EXPECT_FALSE(next->bypass_breaker);
  }
  EXPECT_FALSE(cursor.Advance(3, true).has_value());
}

// The single worker of a model is half-open: another request took the probe between this one's
// plan and its send. Refusing would turn "every worker is out: try anyway" into a failure.
TEST(PlanCursorTest, RefusedWorkersAreOfferedAgainWhenNothingWasSent) {
  PlanCursor cursor;
  auto first = cursor.Advance(2, true);
  cursor.SetAside(first->index);
  auto second = cursor.Advance(2, true);
  cursor.SetAside(second->index);
  auto again = cursor.Advance(2, true);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->index, 0u);
  EXPECT_TRUE(again->bypass_breaker);
  // That attempt failed; the other set-aside worker is still offered (as in panic mode, every
  // worker is tried).
  again = cursor.Advance(2, /*nothing_sent=*/false);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->index, 1u);
  EXPECT_TRUE(again->bypass_breaker);
  EXPECT_FALSE(cursor.Advance(2, false).has_value());
}

// Once a request left for some worker, the breakers' verdicts stand: a worker out is not tried.
TEST(PlanCursorTest, RefusedWorkersStayOutOnceSomethingWasSent) {
  PlanCursor cursor;
  auto first = cursor.Advance(2, true);
  cursor.SetAside(first->index);
  auto second = cursor.Advance(2, true);
  EXPECT_EQ(second->index, 1u);  // sent; it failed
  EXPECT_FALSE(cursor.Advance(2, /*nothing_sent=*/false).has_value());
}

}  // namespace
}  // namespace lazyattn::router
