// The router's worker registry (worker_registry.h): which listed addresses it dials, how it
// forgets workers across directory outages and timeouts, moves of a worker to a new address, and
// what it keeps of a status. No gRPC, no clock: times are passed in.
#include "services/router/server/worker_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "services/router/server/worker_listing_for_test.h"

namespace lazyattn::router {
namespace {

using listing_test::kFpA;
using listing_test::Listing;
using listing_test::Worker;
using listing_test::WorkerAt;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

// A router that reaches kvdir over the network never dials a worker listed at a loopback
// address: that is the router's own host. (kvdir takes such an address only from a worker
// connected over loopback, which one on kvdir's host or behind a proxy there also is.) A one-host
// cluster dials them. Addresses that do not dial over the network are dropped either way; static
// addresses are kept.
TEST(WorkerRegistryTest, LoopbackWorkerAddressesAreDialledOnlyInAOneHostCluster) {
  auto listed = [](bool directory_on_this_host) {
    WorkerRegistry registry({"127.0.0.1:9000"}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                            directory_on_this_host);
    const auto at = WorkerAt;
    registry.ObserveDirectory(
        Listing({at("w0", "10.0.0.7:7200"), at("w1", "127.0.0.1:7201"), at("w2", "localhost:7202"),
                 at("w3", "[::1]:7203"), at("w4", "unix:/run/w4.sock"),
                 at("w5", "dns://10.9.9.9/w5.example:7205")}),
        absl::UnixEpoch() + absl::Hours(1));
    std::vector<std::string> ids;
    for (const WorkerInfo& w : registry.Snapshot()) ids.push_back(w.id);
    return ids;
  };
  EXPECT_THAT(listed(false), UnorderedElementsAre("w0", "127.0.0.1:9000"));
  EXPECT_THAT(listed(true), UnorderedElementsAre("w0", "w1", "w2", "w3", "127.0.0.1:9000"));

  // A worker now listed at an address not dialled leaves its old one at once, as a move does.
  WorkerRegistry registry({}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/false);
  lazyattn::v1::WorkerResidency w0 = WorkerAt("w0", "10.0.0.7:7200");
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  registry.ObserveDirectory(Listing({w0}), t0);
  EXPECT_EQ(registry.Snapshot().size(), 1u);
  w0.mutable_worker()->set_address("127.0.0.1:7200");
  registry.ObserveDirectory(Listing({w0}), t0 + absl::Seconds(1));
  EXPECT_TRUE(registry.Snapshot().empty());

  EXPECT_TRUE(DialsThisHost("127.0.0.1:7100"));
  EXPECT_TRUE(DialsThisHost("localhost:7100"));
  EXPECT_TRUE(DialsThisHost("[::1]:7100"));
  EXPECT_TRUE(DialsThisHost("unix:/run/kvdir.sock"));
  EXPECT_FALSE(DialsThisHost("kvdir:7100"));
  EXPECT_FALSE(DialsThisHost("10.0.0.5:7100"));
  EXPECT_FALSE(DialsThisHost(""));
}

// The router's calls in flight count against a worker's id and address: calls held by a frozen
// process (until keepalive ends them) were counted against the same id restarted at a new
// address, whose selector load (the larger of the count and the worker's report) kept it from
// getting traffic for as long as they were held.
TEST(WorkerRegistryTest, AWorkerRestartedAtANewAddressStartsWithNoCallsInFlight) {
  WorkerRegistry registry({}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  lazyattn::v1::WorkerResidency w0 = WorkerAt("w0", "10.0.0.7:7200");
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  registry.ObserveDirectory(Listing({w0}), t0);
  ASSERT_EQ(registry.Snapshot().size(), 1u);
  const WorkerInfo old_process = registry.Snapshot()[0];
  for (int i = 0; i < 8; ++i) registry.AddInflight(old_process, 1);
  EXPECT_EQ(registry.Inflight(old_process), 8);

  w0.mutable_worker()->set_address("10.0.0.8:7200");
  registry.ObserveDirectory(Listing({w0}), t0 + absl::Seconds(1));
  ASSERT_EQ(registry.Snapshot().size(), 1u);
  const WorkerInfo restarted = registry.Snapshot()[0];
  EXPECT_EQ(restarted.id, "w0");
  EXPECT_EQ(restarted.address, "10.0.0.8:7200");
  EXPECT_EQ(registry.Inflight(restarted), 0);
  registry.AddInflight(restarted, 1);
  EXPECT_EQ(registry.Inflight(restarted), 1);
  // The old calls end when they end, each taken off where it was counted.
  for (int i = 0; i < 8; ++i) registry.AddInflight(old_process, -1);
  EXPECT_EQ(registry.Inflight(old_process), 0);
  EXPECT_EQ(registry.Inflight(restarted), 1);
}

// docs/router.md: forget_after counts only while the directory answers. A directory back from a
// 25 s outage (restarted, empty until its workers reconnect) must not empty the list with its
// first answer; it takes forget_after of answered time, as when a healthy directory stops
// listing a worker.
TEST(WorkerRegistryTest, AnOutageOfTheDirectoryDoesNotCountTowardsForgetting) {
  WorkerRegistry registry({}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA), Worker("w1", "llama", kFpA)}),
                            t0);
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA)}), t0 + absl::Seconds(1));
  registry.ObserveDirectoryFailure(t0 + absl::Seconds(1));  // unreachable from here on
  registry.ObserveDirectoryFailure(t0 + absl::Seconds(3));
  const absl::Time back = t0 + absl::Seconds(26);
  registry.ObserveDirectory(Listing({}), back);
  EXPECT_EQ(registry.LiveCount(), 2);
  // w1 was unlisted for 1 s before the outage: 9 s of answered time more and it goes; w0 was
  // listed until the outage and stays for the full 10 s.
  registry.ObserveDirectory(Listing({}), back + absl::Seconds(9));
  EXPECT_EQ(registry.LiveCount(), 1);
  EXPECT_EQ(registry.Snapshot()[0].id, "w0");
  registry.ObserveDirectory(Listing({}), back + absl::Seconds(10));
  EXPECT_EQ(registry.LiveCount(), 0);
}

// A directory that answers but lets a Lookup time out now and then is not down between its
// answers: only the time from the failed call's send to the next answer is left out. (Crediting
// the whole gap since the last answer, as before, kept a departed worker forever when every gap
// held one timeout.)
TEST(WorkerRegistryTest, OccasionalTimeoutsSlowForgettingButDoNotStopIt) {
  WorkerRegistry registry({}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA), Worker("w1", "llama", kFpA)}),
                            t0);
  // Every second an answer without w1, and between two answers a Lookup sent 0.8 s after the
  // first that fails: 0.2 s of each second is an outage, 0.8 s counts.
  absl::Time now = t0;
  int seconds = 0;
  while (registry.LiveCount() == 2 && seconds < 60) {
    registry.ObserveDirectoryFailure(now + absl::Milliseconds(800));
    now += absl::Seconds(1);
    ++seconds;
    registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA)}), now);
  }
  EXPECT_EQ(registry.LiveCount(), 1);
  EXPECT_EQ(registry.Snapshot()[0].id, "w0");
  // 10 s of answered time at 0.8 s a second: the 13th answer (10.4 s) forgets it, not sooner.
  EXPECT_EQ(seconds, 13);
}

// A failed call sent before the last answer arrived does not reach back past that answer.
TEST(WorkerRegistryTest, AFailureSentBeforeTheLastAnswerCountsFromThatAnswer) {
  WorkerRegistry registry({}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA), Worker("w1", "llama", kFpA)}),
                            t0);
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA)}), t0 + absl::Seconds(5));
  registry.ObserveDirectoryFailure(t0 + absl::Seconds(2));  // sent before the answer at 5 s
  // Down from 5 s to 8 s: w1's 10 s of unlisted time end at 13 s, not 10 s.
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA)}), t0 + absl::Seconds(8));
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA)}), t0 + absl::Seconds(12));
  EXPECT_EQ(registry.LiveCount(), 2);
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA)}), t0 + absl::Seconds(13));
  EXPECT_EQ(registry.LiveCount(), 1);
}

// A static worker's failed Status poll does not take its model away at once (a request naming
// it would get NOT_FOUND, which clients do not retry): its last status holds for forget_after.
TEST(WorkerRegistryTest, AStaticWorkerKeepsItsStatusThroughFailedPollsForForgetAfter) {
  WorkerRegistry registry({"10.0.0.1:7000"}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  registry.ObserveStatic("10.0.0.1:7000", nullptr, t0);  // never reported: stays so
  ASSERT_EQ(registry.Snapshot().size(), 1u);
  EXPECT_FALSE(registry.Snapshot()[0].reported);
  const lazyattn::v1::WorkerStatus status = Worker("w0", "llama", kFpA).worker();
  registry.ObserveStatic("10.0.0.1:7000", &status, t0);
  EXPECT_TRUE(registry.Snapshot()[0].reported);
  registry.ObserveStatic("10.0.0.1:7000", nullptr, t0 + absl::Seconds(9));
  EXPECT_TRUE(registry.Snapshot()[0].reported);
  EXPECT_EQ(registry.Snapshot()[0].id, "w0");
  registry.ObserveStatic("10.0.0.1:7000", nullptr, t0 + absl::Seconds(10));
  EXPECT_FALSE(registry.Snapshot()[0].reported);
  // A good poll brings it back at once.
  registry.ObserveStatic("10.0.0.1:7000", &status, t0 + absl::Seconds(11));
  EXPECT_TRUE(registry.Snapshot()[0].reported);
}

// Without a failed call between two answers the gap counts: a healthy directory's empty list is
// the truth (every worker gone) once forget_after has passed.
TEST(WorkerRegistryTest, AHealthyDirectorysEmptyListForgetsAfterForgetAfter) {
  WorkerRegistry registry({}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA)}), t0);
  registry.ObserveDirectory(Listing({}), t0 + absl::Seconds(5));
  EXPECT_EQ(registry.LiveCount(), 1);
  registry.ObserveDirectory(Listing({}), t0 + absl::Seconds(10));
  EXPECT_EQ(registry.LiveCount(), 0);
}

// A worker restarted with its worker id at a new address: its old address goes with the first
// listing that shows the new one, not forget_after later (breakers and in-flight counts go by id,
// so the dead address's failures would shut the live one out).
TEST(WorkerRegistryTest, AWorkerListedAtANewAddressLeavesItsOldOneAtOnce) {
  WorkerRegistry registry({}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA), Worker("w1", "llama", kFpA)}),
                            t0);
  lazyattn::v1::WorkerResidency moved = Worker("w0", "llama", kFpA);
  moved.mutable_worker()->set_address("127.0.0.1:17");
  registry.ObserveDirectory(Listing({moved, Worker("w1", "llama", kFpA)}), t0 + absl::Seconds(1));
  std::vector<std::string> addresses;
  for (const WorkerInfo& w : registry.Snapshot()) addresses.push_back(w.id + "@" + w.address);
  EXPECT_THAT(addresses, UnorderedElementsAre("w0@127.0.0.1:17", "w1@127.0.0.1:11"));
}

// A call planned just before its worker was forgotten (a retry, a failover) still gets a stub,
// but the registry keeps channels only for the workers it knows: nothing would free the others.
TEST(WorkerRegistryTest, KeepsChannelsOnlyForKnownWorkers) {
  WorkerRegistry registry({}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA)}), t0);
  const std::string known = registry.Snapshot().at(0).address;
  ASSERT_TRUE(registry.Stub(known).ok());
  ASSERT_TRUE(registry.Channel(known).ok());
  EXPECT_EQ(registry.kept_channels(), 1u);
  EXPECT_TRUE(registry.Stub("10.0.0.9:7000").ok());
  EXPECT_EQ(registry.kept_channels(), 1u);
  EXPECT_EQ(registry.Channel("10.0.0.9:7000").status().code(), absl::StatusCode::kUnavailable);
  registry.ObserveDirectory(Listing({}), t0 + absl::Seconds(10));  // w0 forgotten
  EXPECT_EQ(registry.kept_channels(), 0u);
  EXPECT_TRUE(registry.Stub(known).ok());
  EXPECT_EQ(registry.kept_channels(), 0u);
}

// A status is kept and copied into every routing decision's snapshot: fields this build does not
// know (a hostile worker's or directory's megabytes under an unknown tag) are dropped, from the
// directory's listing and from a static worker's own Status answer alike.
TEST(WorkerRegistryTest, UnknownFieldsOfAStatusAreNotKept) {
  WorkerRegistry registry({"10.0.0.9:7000"}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  lazyattn::v1::WorkerResidency listed = Worker("w0", "llama", kFpA);
  lazyattn::v1::WorkerLoad* load = listed.mutable_worker()->mutable_load();
  load->set_running_requests(2);
  load->GetReflection()->MutableUnknownFields(load)->AddLengthDelimited(99, std::string(4096, 'x'));
  registry.ObserveDirectory(Listing({listed}), t0);
  lazyattn::v1::WorkerStatus polled = Worker("w1", "llama", kFpA).worker();
  polled.set_address("10.0.0.9:7000");
  polled.GetReflection()->MutableUnknownFields(&polled)->AddLengthDelimited(98, "unknown");
  registry.ObserveStatic("10.0.0.9:7000", &polled, t0);
  const auto snapshot = registry.Snapshot();
  ASSERT_EQ(snapshot.size(), 2u);
  for (const auto& worker : snapshot) {
    const lazyattn::v1::WorkerStatus& kept = worker.status;
    EXPECT_TRUE(kept.GetReflection()->GetUnknownFields(kept).empty()) << worker.id;
    EXPECT_TRUE(kept.load().GetReflection()->GetUnknownFields(kept.load()).empty()) << worker.id;
    EXPECT_FALSE(kept.worker_id().empty());  // the known fields are kept
  }
}

}  // namespace
}  // namespace lazyattn::router
