#include "services/worker/cache/block_pool.h"

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(BlockPoolTest, StatesMoveAndTheInvariantHolds) {
  BlockPool pool(4);
  auto a = pool.Allocate(), b = pool.Allocate();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.num_referenced(), 2);
  pool.SetCached(*a, true);  // a cache takes a
  pool.Unref(*a);            // the sequence lets go: a is cached-unreferenced
  EXPECT_EQ(pool.num_cached_unreferenced(), 1);
  pool.Ref(*a);              // another sequence reuses it
  EXPECT_EQ(pool.num_cached_unreferenced(), 0);
  pool.Unref(*a);
  pool.Unref(*b);            // b was never cached: straight back to the free list
  EXPECT_TRUE(pool.is_free(*b));
  pool.SetCached(*a, false);  // evicted
  EXPECT_TRUE(pool.is_free(*a));
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_TRUE(pool.CheckInvariant().ok());
}

TEST(BlockPoolTest, ExhaustionIsNulloptNotACrash) {
  BlockPool pool(2);
  EXPECT_TRUE(pool.Allocate());
  EXPECT_TRUE(pool.Allocate());
  EXPECT_FALSE(pool.Allocate());
  EXPECT_TRUE(pool.CheckInvariant().ok());
}

}  // namespace
}  // namespace lazyattn
