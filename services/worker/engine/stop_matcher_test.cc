#include "services/worker/engine/stop_matcher.h"

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(StopMatcherTest, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("hello "), "hello ");
  EXPECT_EQ(m.Push("world"), "world");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, StopSplitAcrossPiecesIsNeverEmitted) {
  StopMatcher m({"###"});
  EXPECT_EQ(m.Push("abc#"), "abc");
  EXPECT_EQ(m.Push("#"), "");
  EXPECT_EQ(m.Push("#tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Push("more"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, FalseStartIsReleased) {
  StopMatcher m({"###"});
  EXPECT_EQ(m.Push("a##"), "a");
  EXPECT_EQ(m.Push("b"), "##b");
  EXPECT_EQ(m.Push("#"), "");
  EXPECT_EQ(m.Flush(), "#");
}

TEST(StopMatcherTest, EarliestOfSeveralStopsWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.Push("hello world"), "hel");
  EXPECT_TRUE(m.stopped());
}

}  // namespace
}  // namespace lazyattn
