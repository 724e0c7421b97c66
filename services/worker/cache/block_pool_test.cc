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

// The bug class of a double release: in every build type the second Unref changes nothing, the
// block is on the free list once, and the misuse is counted and reported by the invariant.
TEST(BlockPoolTest, MisuseIsCountedNeverApplied) {
  BlockPool pool(3);
  auto a = pool.Allocate();
  ASSERT_TRUE(a);
  EXPECT_TRUE(pool.Unref(*a));
  EXPECT_FALSE(pool.Unref(*a));   // double free
  EXPECT_FALSE(pool.Ref(*a));     // ref of a free block
  EXPECT_FALSE(pool.Unref(7));    // outside the pool
  EXPECT_FALSE(pool.SetCached(*a, true));  // caching a free block
  EXPECT_EQ(pool.errors(), 4);
  EXPECT_EQ(pool.first_error(), "unref of an unreferenced or unknown block 0");
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.ref_count(*a), 0);
  // Each block is handed out once: the double free did not put `a` on the list twice.
  auto x = pool.Allocate(), y = pool.Allocate(), z = pool.Allocate();
  ASSERT_TRUE(x && y && z);
  EXPECT_TRUE(*x != *y && *y != *z && *x != *z);
  EXPECT_FALSE(pool.Allocate());
  const absl::Status check = pool.CheckInvariant();
  EXPECT_EQ(check.code(), absl::StatusCode::kInternal);
  EXPECT_NE(check.message().find("4 misuses"), std::string::npos) << check;
}

}  // namespace
}  // namespace lazyattn
