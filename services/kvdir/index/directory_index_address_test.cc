// DirectoryIndex addresses: one live worker per advertised address. Another id's Hello for a held
// address is refused while the holder's lease runs, connected or not; a holder whose lease passed
// is removed with its entries and the new worker takes the address.
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
// worker certificate trying to take another worker's place in routing): refused, nothing changes.
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

// The holder's stream closed but its lease runs (a reconnect after a blip, a rolling restart):
// the address stays its own. Once its lease passed (a crash, a frozen or vanished process) the
// address's new owner takes it, and the old worker goes with its entries, since a router dialling
// the address now reaches the new one.
TEST_F(IndexTest, HelloForTheAddressOfAGoneWorkerTakesItOverOnceItsLeasePassed) {
  DirectoryIndex index(kLease, IndexLimits{.max_workers = 1});
  const uint64_t old_session = index.Hello(StatusAt("old", "10.0.0.5:7200"), 1, 1, now_).session;
  ASSERT_EQ(index.ApplySnapshot("old", old_session, 2, {{Key(1), 10, kLazyOffset}}, nullptr, now_)
                .outcome,
            ApplyOutcome::kApplied);
  index.Disconnect("old", old_session);
  EXPECT_TRUE(
      index.Hello(StatusAt("new", "10.0.0.5:7200"), 2, 1, now_ + kLease / 2).address_in_use);
  // The old worker's own reconnect finds its address (and entries) as it left them.
  const uint64_t back = index.Hello(StatusAt("old", "10.0.0.5:7200"), 1, 3, now_).session;
  ASSERT_NE(back, 0u);
  EXPECT_EQ(index.Stats().entries, 1);
  index.Disconnect("old", back);

  const absl::Time at = now_ + kLease;  // nothing heard from it for a lease
  // At max_workers (1), the lapsed holder does not count: it leaves for the new worker.
  const HelloResult hello = index.Hello(StatusAt("new", "10.0.0.5:7200"), 2, 1, at);
  EXPECT_FALSE(hello.address_in_use);
  EXPECT_FALSE(hello.refused);
  ASSERT_NE(hello.session, 0u);
  EXPECT_THAT(hello.removed_at_address, ElementsAre("old"));
  EXPECT_EQ(index.Stats().workers, 1);
  EXPECT_EQ(index.Stats().entries, 0);
  const std::vector<WorkerResidency> live = index.Lookup({Key(1)}, at);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].status.worker_id(), "new");
  EXPECT_FALSE(live[0].resident[0]);
  EXPECT_EQ(index.Heartbeat("old", back, 4, {}, at).outcome, ApplyOutcome::kNoSession);
}

}  // namespace
}  // namespace lazyattn::kvdir
