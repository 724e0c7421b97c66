// DirectoryIndex addresses: one live worker per advertised address. Another id's Hello for a held
// address is refused while the holder is connected and leased; a disconnected or lapsed holder
// of the address is removed with its entries and the new worker takes the address.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "services/kvdir/index/directory_index.h"
#include "services/kvdir/index/directory_index_test_fixture.h"

namespace lazyattn::kvdir {
namespace {

using ::testing::ElementsAre;
using testing::IndexTest;
using testing::Key;
using testing::kLease;
using testing::Pair;
using testing::StatusAt;
using testing::Stored;

// A peer claiming a live worker's address under its own id (a copied advertise_address, or any
// worker certificate trying to divert another worker's requests): refused, nothing changes.
TEST_F(IndexTest, HelloForAnAddressAnotherLiveWorkerHoldsIsRefused) {
  const uint64_t holder = Join("w1");  // at w1.local:7000
  ASSERT_EQ(index_.ApplyEvent("w1", holder, 3, Stored(1, 10), now_).outcome,
            ApplyOutcome::kApplied);
  now_ += kLease / 2;
  const HelloResult claim = index_.Hello(StatusAt("w9", "w1.local:7000"), 5, 1, now_);
  EXPECT_TRUE(claim.address_in_use);
  EXPECT_EQ(claim.address_holder_id, "w1");
  EXPECT_EQ(claim.session, 0u);
  EXPECT_FALSE(claim.id_in_use);
  EXPECT_EQ(index_.Stats().workers, 1);  // w9 is not registered
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("w1", 10)));
  EXPECT_EQ(index_.Heartbeat("w1", holder, 4, {}, now_).outcome, ApplyOutcome::kApplied);
  // Its own address is free for it, and an empty one is never compared.
  EXPECT_NE(index_.Hello(StatusAt("w9", "w9.local:7000"), 5, 1, now_).session, 0u);
  EXPECT_NE(index_.Hello(StatusAt("w8", ""), 5, 1, now_).session, 0u);
  EXPECT_NE(index_.Hello(StatusAt("w7", ""), 5, 1, now_).session, 0u);
  EXPECT_EQ(index_.Stats().workers, 4);
}

// The holder's stream closed (a crash) or its lease passed (a frozen or vanished process): the
// address's new owner takes it, and the old worker goes with its entries, since a router dialling
// the address now reaches the new one.
TEST_F(IndexTest, HelloForTheAddressOfAGoneWorkerTakesItOver) {
  for (bool lapsed : {false, true}) {
    SCOPED_TRACE(lapsed ? "lease passed" : "disconnected");
    DirectoryIndex index(kLease);
    const uint64_t old_session = index.Hello(StatusAt("old", "10.0.0.5:7200"), 1, 1, now_).session;
    ASSERT_EQ(index.ApplySnapshot("old", old_session, 2, {{Key(1), 10, kLazyOffset}}, nullptr,
                                  now_)
                  .outcome,
              ApplyOutcome::kApplied);
    absl::Time at = now_;
    if (lapsed) {
      at += kLease;  // still connected, but nothing heard for a lease
    } else {
      index.Disconnect("old", old_session);
    }
    const HelloResult hello = index.Hello(StatusAt("new", "10.0.0.5:7200"), 2, 1, at);
    EXPECT_FALSE(hello.address_in_use);
    ASSERT_NE(hello.session, 0u);
    EXPECT_EQ(index.Stats().workers, 1);
    EXPECT_EQ(index.Stats().entries, 0);
    const std::vector<WorkerResidency> live = index.Lookup({Key(1)}, at);
    ASSERT_EQ(live.size(), 1u);
    EXPECT_EQ(live[0].status.worker_id(), "new");
    EXPECT_FALSE(live[0].resident[0]);
    // The old session owns nothing any more.
    EXPECT_EQ(index.Heartbeat("old", old_session, 3, {}, at).outcome, ApplyOutcome::kNoSession);
  }
}

}  // namespace
}  // namespace lazyattn::kvdir
