// Connections per client address: the cap, the release, and addresses kept apart.
#include "services/router/http/client_slots.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace lazyattn::router {
namespace {

TEST(ClientSlotsTest, CapsEachAddressAndFreesOnRelease) {
  ClientSlots slots(2);
  auto a1 = slots.TryAcquire("10.0.0.1");
  auto a2 = slots.TryAcquire("10.0.0.1");
  ASSERT_NE(a1, nullptr);
  ASSERT_NE(a2, nullptr);
  EXPECT_EQ(slots.TryAcquire("10.0.0.1"), nullptr);
  auto b = slots.TryAcquire("10.0.0.2");  // another address is not affected
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(slots.open("10.0.0.1"), 2);
  EXPECT_EQ(slots.open_total(), 3);
  a1.reset();
  EXPECT_EQ(slots.open("10.0.0.1"), 1);
  EXPECT_NE(slots.TryAcquire("10.0.0.1"), nullptr);  // acquired and released at once
  EXPECT_EQ(slots.open_total(), 2);
}

TEST(ClientSlotsTest, ZeroCountsWithoutACap) {
  ClientSlots slots(0);
  std::vector<std::unique_ptr<ClientSlots::Slot>> held;
  for (int i = 0; i < 100; ++i) {
    held.push_back(slots.TryAcquire("10.0.0.1"));
    ASSERT_NE(held.back(), nullptr);
  }
  EXPECT_EQ(slots.open("10.0.0.1"), 100);
  held.clear();
  EXPECT_EQ(slots.open("10.0.0.1"), 0);
  EXPECT_EQ(slots.open_total(), 0);
}

}  // namespace
}  // namespace lazyattn::router
