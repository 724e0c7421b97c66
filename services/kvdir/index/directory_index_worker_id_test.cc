// DirectoryIndex worker ids: one live process per id. A second process's Hello is refused while the
// holder is connected and leased and differs in address or peer host; a restart, a reconnect of
// the holder's own process, a disconnected holder or a passed lease let the new Hello take over.
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
using testing::Status;
using testing::StatusAt;
using testing::Stored;

// A second live process started with the id of a live, connected worker (a copied
// --worker-id): refused, so the two cannot take turns dropping each other's entries.
TEST_F(IndexTest, HelloForAnIdHeldByALiveConnectedWorkerElsewhereIsRefused) {
  const uint64_t holder = Join("w1");
  ASSERT_EQ(index_.ApplyEvent("w1", holder, 3, Stored(1, 10), now_).outcome,
            ApplyOutcome::kApplied);

  now_ += kLease / 2;  // well inside the lease
  const HelloResult dup = index_.Hello(StatusAt("w1", "other.local:7000"), 99, 1, now_);
  EXPECT_TRUE(dup.id_in_use);
  EXPECT_EQ(dup.holder_address, "w1.local:7000");
  EXPECT_EQ(dup.session, 0u);
  EXPECT_FALSE(dup.entries_dropped);  // a new epoch, yet nothing was dropped
  EXPECT_FALSE(dup.refused);

  // The holder is untouched: same address and entries, and its session still owns the worker
  // (its next message is in sequence and applied).
  const auto r = index_.Lookup({Key(1)}, now_);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status.address(), "w1.local:7000");
  EXPECT_EQ(r[0].resident_tokens, 10);
  EXPECT_EQ(index_.ApplyEvent("w1", holder, 4, Stored(2, 20), now_).outcome,
            ApplyOutcome::kApplied);
  EXPECT_EQ(index_.Heartbeat("w1", holder, 5, {}, now_).outcome, ApplyOutcome::kApplied);
  EXPECT_THAT(Tokens({Key(1), Key(2)}), ElementsAre(Pair("w1", 30)));
  EXPECT_EQ(index_.Stats().workers, 1);

  // The refusal did not renew anything: the holder's lease runs from its own last message.
  now_ += kLease;
  EXPECT_THAT(index_.ExpireLeases(now_), ElementsAre("w1"));
}

TEST_F(IndexTest, HelloFromTheHoldersAddressReplacesIt) {
  // A restart on the same port (new epoch) before the old stream is noticed closed.
  const uint64_t old_session = Join("w1", /*epoch=*/7);
  index_.ApplyEvent("w1", old_session, 3, Stored(1, 10), now_);
  const HelloResult restart = index_.Hello(Status("w1"), 8, 1, now_);
  EXPECT_FALSE(restart.id_in_use);
  EXPECT_NE(restart.session, 0u);
  EXPECT_TRUE(restart.entries_dropped);
  EXPECT_EQ(index_.Heartbeat("w1", old_session, 4, {}, now_).outcome, ApplyOutcome::kNoSession);
  // A reconnect of the same process (same epoch) over a stream not yet seen closed.
  const HelloResult reconnect = index_.Hello(Status("w1"), 8, 1, now_);
  EXPECT_FALSE(reconnect.id_in_use);
  EXPECT_NE(reconnect.session, restart.session);
}

TEST_F(IndexTest, HelloReplacesADisconnectedHolderAtOnceFromAnyAddress) {
  // A crashed worker's stream closes; a replacement elsewhere (a pod with a new IP) takes over.
  const uint64_t old_session = Join("w1");
  index_.ApplyEvent("w1", old_session, 3, Stored(1, 10), now_);
  index_.Disconnect("w1", old_session);
  const HelloResult moved = index_.Hello(StatusAt("w1", "10.0.0.9:7000"), 8, 1, now_);
  EXPECT_FALSE(moved.id_in_use);
  EXPECT_NE(moved.session, 0u);
  EXPECT_TRUE(moved.entries_dropped);
  const auto r = index_.Lookup({}, now_);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status.address(), "10.0.0.9:7000");
}

TEST_F(IndexTest, HelloReplacesAConnectedHolderWhoseLeasePassed) {
  // A frozen process: its stream is open but it sends nothing.
  const uint64_t frozen = Join("w1");
  now_ += kLease - absl::Milliseconds(1);
  EXPECT_TRUE(index_.Hello(StatusAt("w1", "10.0.0.9:7000"), 8, 1, now_).id_in_use);
  now_ += absl::Milliseconds(1);  // the lease ends exactly now (not yet swept)
  const HelloResult moved = index_.Hello(StatusAt("w1", "10.0.0.9:7000"), 8, 1, now_);
  EXPECT_FALSE(moved.id_in_use);
  EXPECT_NE(moved.session, 0u);
  EXPECT_EQ(index_.Heartbeat("w1", frozen, 3, {}, now_).outcome, ApplyOutcome::kNoSession);
}

TEST_F(IndexTest, ASecondHelloOnTheHoldingStreamMayChangeTheAddress) {
  const uint64_t s = Join("w1");
  const HelloResult again =
      index_.Hello(StatusAt("w1", "renamed.local:7000"), 7, 3, now_, {.session = s});
  EXPECT_FALSE(again.id_in_use);
  EXPECT_NE(again.session, 0u);
  // Any other session (an older stream) of another process (epoch) is refused.
  EXPECT_TRUE(index_.Hello(Status("w1"), 8, 1, now_, {.session = s}).id_in_use);
}

TEST_F(IndexTest, AStallOfTheDirectoryDoesNotLetADuplicateTakeOver) {
  // While the sweeper is overdue every registered worker counts as live (as in Lookup): its
  // heartbeats wait unread, so a passed lease says nothing about the holder.
  Join("w1");
  index_.Sweep(now_);
  now_ += kLease * 5;
  EXPECT_TRUE(index_.Hello(StatusAt("w1", "10.0.0.9:7000"), 8, 1, now_).id_in_use);
}

// Two copies advertising one address (a compose service scaled to two: both say worker-0:7000)
// from two hosts: the peer host tells them apart, and the second is refused as a copy with another
// address would be.
TEST_F(IndexTest, HelloWithTheHoldersAddressFromAnotherPeerHostIsRefused) {
  const uint64_t holder = Join("w1", /*epoch=*/7, "10.0.0.5");
  ASSERT_EQ(index_.ApplyEvent("w1", holder, 3, Stored(1, 10), now_).outcome,
            ApplyOutcome::kApplied);
  now_ += kLease / 2;
  const HelloResult dup = index_.Hello(Status("w1"), 99, 1, now_, {.peer_host = "10.0.0.6"});
  EXPECT_TRUE(dup.id_in_use);
  EXPECT_EQ(dup.holder_address, "w1.local:7000");
  EXPECT_EQ(dup.holder_peer_host, "10.0.0.5");
  EXPECT_EQ(dup.session, 0u);
  EXPECT_FALSE(dup.entries_dropped);

  // The holder keeps its session and entries, and its host: a second try from the other host is
  // refused again, one from the holder's own host is the holder reconnecting.
  EXPECT_EQ(index_.ApplyEvent("w1", holder, 4, Stored(2, 20), now_).outcome,
            ApplyOutcome::kApplied);
  EXPECT_THAT(Tokens({Key(1), Key(2)}), ElementsAre(Pair("w1", 30)));
  EXPECT_TRUE(index_.Hello(Status("w1"), 99, 1, now_, {.peer_host = "10.0.0.6"}).id_in_use);
  const HelloResult reconnect = index_.Hello(Status("w1"), 7, 1, now_, {.peer_host = "10.0.0.5"});
  EXPECT_FALSE(reconnect.id_in_use);
  EXPECT_NE(reconnect.session, 0u);
  EXPECT_FALSE(reconnect.entries_dropped);  // same epoch: a reconnect keeps the entries
}

// The holder's own process (its epoch) reconnecting from a new address and host, before its
// old stream is seen closed (a dual-stack name, a changed IP): it takes its id back at once and
// keeps its entries, where another process would be refused until the lease passed.
TEST_F(IndexTest, TheHoldersOwnProcessReconnectsFromAnywhere) {
  const uint64_t old_session = Join("w1", /*epoch=*/7, "10.0.0.5");
  ASSERT_EQ(index_.ApplyEvent("w1", old_session, 3, Stored(1, 10), now_).outcome,
            ApplyOutcome::kApplied);
  EXPECT_TRUE(
      index_.Hello(StatusAt("w1", "w1.v6:7000"), 8, 1, now_, {.peer_host = "[fd00::5]"}).id_in_use);
  const HelloResult back =
      index_.Hello(StatusAt("w1", "w1.v6:7000"), 7, 1, now_, {.peer_host = "[fd00::5]"});
  EXPECT_FALSE(back.id_in_use);
  EXPECT_NE(back.session, 0u);
  EXPECT_FALSE(back.entries_dropped);
  EXPECT_EQ(index_.Heartbeat("w1", old_session, 4, {}, now_).outcome, ApplyOutcome::kNoSession);
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("w1", 10)));
}

TEST_F(IndexTest, AnotherAddressFromTheHoldersPeerHostIsStillRefused) {
  // Two workers on one host (or behind one NAT) share a peer host: the address tells them apart.
  Join("w1", /*epoch=*/7, "10.0.0.5");
  const HelloResult dup =
      index_.Hello(StatusAt("w1", "w1.local:7001"), 8, 1, now_, {.peer_host = "10.0.0.5"});
  EXPECT_TRUE(dup.id_in_use);
  EXPECT_EQ(dup.holder_address, "w1.local:7000");
  EXPECT_EQ(dup.holder_peer_host, "10.0.0.5");
}

TEST_F(IndexTest, HelloWithTheHoldersAddressFromItsPeerHostReplacesIt) {
  // A restart on the same host and port (new epoch) before the old stream is noticed closed.
  const uint64_t old_session = Join("w1", /*epoch=*/7, "[::1]");
  index_.ApplyEvent("w1", old_session, 3, Stored(1, 10), now_);
  const HelloResult restart = index_.Hello(Status("w1"), 8, 1, now_, {.peer_host = "[::1]"});
  EXPECT_FALSE(restart.id_in_use);
  EXPECT_NE(restart.session, 0u);
  EXPECT_TRUE(restart.entries_dropped);
  EXPECT_EQ(index_.Heartbeat("w1", old_session, 4, {}, now_).outcome, ApplyOutcome::kNoSession);
}

TEST_F(IndexTest, ADisconnectedHolderIsReplacedFromAnyPeerHost) {
  // A crashed worker's replacement on another machine, advertising the same name.
  const uint64_t old_session = Join("w1", /*epoch=*/7, "10.0.0.5");
  index_.ApplyEvent("w1", old_session, 3, Stored(1, 10), now_);
  index_.Disconnect("w1", old_session);
  const HelloResult moved = index_.Hello(Status("w1"), 8, 1, now_, {.peer_host = "10.0.0.6"});
  EXPECT_FALSE(moved.id_in_use);
  EXPECT_NE(moved.session, 0u);
  EXPECT_TRUE(moved.entries_dropped);
  // The new holder's host is now the one a later copy (another process) is compared with.
  EXPECT_TRUE(index_.Hello(Status("w1"), 9, 1, now_, {.peer_host = "10.0.0.5"}).id_in_use);
}

TEST_F(IndexTest, AConnectedHolderWhoseLeasePassedIsReplacedFromAnyPeerHost) {
  const uint64_t frozen = Join("w1", /*epoch=*/7, "10.0.0.5");
  now_ += kLease - absl::Milliseconds(1);
  EXPECT_TRUE(index_.Hello(Status("w1"), 8, 1, now_, {.peer_host = "10.0.0.6"}).id_in_use);
  now_ += absl::Milliseconds(1);  // the lease ends exactly now (not yet swept)
  const HelloResult moved = index_.Hello(Status("w1"), 8, 1, now_, {.peer_host = "10.0.0.6"});
  EXPECT_FALSE(moved.id_in_use);
  EXPECT_NE(moved.session, 0u);
  EXPECT_EQ(index_.Heartbeat("w1", frozen, 3, {}, now_).outcome, ApplyOutcome::kNoSession);
}

}  // namespace
}  // namespace lazyattn::kvdir
