// The directory's side of a worker's Publish stream, over real gRPC: Hello brings a lease grant and
// a snapshot request, snapshots and events show in Lookup, a sequence gap asks for a snapshot that
// repairs it, a closed stream and a passed lease remove the worker, a reconnecting worker is
// rebuilt from its snapshot, and a newer stream for the same worker aborts the older one.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "services/kvdir/server/kvdir_server.h"
#include "services/kvdir/server/kvdir_server_test_fixture.h"

namespace lazyattn::kvdir {
namespace {

using ::testing::ElementsAre;
using testing::Entry;
using testing::FakeWorker;
using ::testing::HasSubstr;
using testing::KvdirServerTest;
using testing::Pair;
using testing::WaitFor;

TEST_F(KvdirServerTest, HelloGetsLeaseGrantThenReconnectSnapshotRequest) {
  Start(/*lease_ms=*/3000);
  FakeWorker w(stub_.get(), "w1");
  ASSERT_TRUE(w.Hello());
  v1::DirectoryMessage m;
  ASSERT_TRUE(w.Read(&m));
  ASSERT_TRUE(m.has_lease()) << m.DebugString();
  EXPECT_EQ(m.lease().lease_ms(), 3000);
  ASSERT_TRUE(w.Read(&m));
  ASSERT_TRUE(m.has_snapshot_request()) << m.DebugString();
  EXPECT_EQ(m.snapshot_request().reason(), "reconnect");
  EXPECT_THAT(LiveWorkers(), ElementsAre("w1"));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_snapshots_total", "requested_reconnect"), 1);
  EXPECT_TRUE(w.Close().ok());
}

TEST_F(KvdirServerTest, SnapshotAndEventsAreVisibleInLookup) {
  Start();
  FakeWorker a(stub_.get(), "a");
  FakeWorker b(stub_.get(), "b");
  a.Join({Entry(1, 100)});
  b.Join({});
  ASSERT_TRUE(a.Stored(2, 50));
  ASSERT_TRUE(b.Stored(2, 50));
  ASSERT_TRUE(WaitFor([&] {
    return Tokens({1, 2, 3}) == std::vector<Pair>{{"a", 150}, {"b", 50}};
  })) << "a holds 1 and 2, b holds 2";

  v1::LookupResponse response;
  ASSERT_TRUE(Lookup({3, 2, 1}, &response).ok());
  ASSERT_EQ(response.workers_size(), 2);
  EXPECT_EQ(response.workers(0).worker().address(), "a:7000");
  EXPECT_THAT(response.workers(0).resident(), ElementsAre(false, true, true));
  EXPECT_THAT(response.workers(1).resident(), ElementsAre(false, true, false));
  // A date, although kvdir's leases run on the monotonic clock: the last message was just now.
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  EXPECT_LE(response.workers(0).last_seen_unix_ms(), now_ms + 1000);
  EXPECT_GE(response.workers(0).last_seen_unix_ms(), now_ms - 60'000);
  EXPECT_TRUE(WaitFor([&] {
    return MetricValue("lazyattn_kvdir_events_applied_total", "stored") == 2 &&
           MetricValue("lazyattn_kvdir_snapshots_total", "applied") == 2 &&
           MetricValue("lazyattn_kvdir_documents_tracked") == 2 &&
           MetricValue("lazyattn_kvdir_workers_alive") == 2;
  }));

  // Heartbeats carry the load that routers read.
  ASSERT_TRUE(a.Heartbeat(/*running=*/5));
  EXPECT_TRUE(WaitFor([&] {
    v1::LookupResponse r;
    return Lookup({}, &r).ok() && r.workers_size() == 2 &&
           r.workers(0).worker().load().running_requests() == 5;
  }));
  EXPECT_TRUE(a.Close().ok());
  EXPECT_TRUE(b.Close().ok());
}

TEST_F(KvdirServerTest, SequenceGapTriggersSnapshotRequestAndSnapshotRepairs) {
  Start();
  FakeWorker w(stub_.get(), "w1");
  w.Join({});
  ASSERT_TRUE(w.Stored(1, 10));  // seq 3
  w.SkipSeq();                   // seq 4 lost
  ASSERT_TRUE(w.Stored(2, 20));  // seq 5: a gap
  v1::DirectoryMessage m;
  ASSERT_TRUE(w.Read(&m));
  ASSERT_TRUE(m.has_snapshot_request()) << m.DebugString();
  EXPECT_EQ(m.snapshot_request().reason(), "sequence gap after 3, got 5");
  ASSERT_TRUE(w.Stored(3, 30));  // seq 6: ignored until the snapshot

  ASSERT_TRUE(w.Snapshot({Entry(2, 20)}));  // what the worker really holds
  ASSERT_TRUE(w.Stored(4, 40));             // applied again after the snapshot
  ASSERT_TRUE(WaitFor([&] { return Tokens({4}) == std::vector<Pair>{{"w1", 40}}; }));
  v1::LookupResponse response;
  ASSERT_TRUE(Lookup({1, 2, 3, 4}, &response).ok());
  ASSERT_EQ(response.workers_size(), 1);
  EXPECT_THAT(response.workers(0).resident(), ElementsAre(false, true, false, true));
  EXPECT_EQ(response.workers(0).resident_tokens(), 60);
  EXPECT_EQ(MetricValue("lazyattn_kvdir_snapshots_total", "requested_gap"), 1);
  EXPECT_TRUE(w.Close().ok());
}

// A stream that ends without a half-close (a crash, a cut connection) leaves the worker in place
// until its lease passes: it may be back at once with the same cache.
TEST_F(KvdirServerTest, CancelledStreamAndLeaseExpiryRemoveTheWorker) {
  Start(/*lease_ms=*/200);
  FakeWorker w(stub_.get(), "w1");
  w.Join({Entry(1, 100)});
  // Heartbeat while waiting so a slow machine cannot let the short lease lapse here.
  ASSERT_TRUE(WaitFor([&] {
    w.Heartbeat();
    return Tokens({1}) == std::vector<Pair>{{"w1", 100}};
  }));
  EXPECT_EQ(w.Cancel().error_code(), grpc::StatusCode::CANCELLED);

  EXPECT_TRUE(WaitFor([&] { return LiveWorkers().empty(); })) << "lease never expired";
  EXPECT_TRUE(Tokens({1}).empty());
  // The sweeper removed the entries too, not only hid the worker.
  EXPECT_TRUE(WaitFor([&] {
    return MetricValue("lazyattn_kvdir_leases_expired_total") == 1 &&
           MetricValue("lazyattn_kvdir_documents_tracked") == 0 &&
           MetricValue("lazyattn_kvdir_workers_alive") == 0;
  }));
}

// A worker that half-closes its stream (the end of its drain) leaves at once, counted as leaving,
// not as a lease expiry (which warns of a crash): with a lease of a minute here, only the
// half-close can explain its going.
TEST_F(KvdirServerTest, AWorkerThatHalfClosesLeavesAtOnce) {
  Start(/*lease_ms=*/60000);
  FakeWorker w(stub_.get(), "w1");
  w.Join({Entry(1, 100)});
  FakeWorker other(stub_.get(), "w2");
  other.Join({Entry(1, 50)});
  // Both snapshots applied, not only both workers live (a Lookup lists a live worker whose
  // snapshot still waits in kvdir's pool with 0 tokens).
  ASSERT_TRUE(WaitFor([&] {
    std::vector<Pair> tokens = Tokens({1});
    std::sort(tokens.begin(), tokens.end());
    return tokens == std::vector<Pair>{{"w1", 100}, {"w2", 50}};
  }));
  EXPECT_TRUE(w.Close().ok());
  EXPECT_TRUE(WaitFor([&] { return LiveWorkers() == std::vector<std::string>{"w2"}; }));
  EXPECT_EQ(Tokens({1}), (std::vector<Pair>{{"w2", 50}}));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_workers_left_total"), 1);
  EXPECT_EQ(MetricValue("lazyattn_kvdir_leases_expired_total"), 0);
  EXPECT_TRUE(other.Close().ok());
}

TEST_F(KvdirServerTest, ReconnectingWorkerIsRebuiltFromItsSnapshot) {
  Start();
  {
    FakeWorker w(stub_.get(), "w1");
    w.Join({Entry(1, 10)});
    ASSERT_TRUE(WaitFor([&] { return Tokens({1}) == std::vector<Pair>{{"w1", 10}}; }));
    EXPECT_TRUE(w.Close().ok());
  }
  FakeWorker again(stub_.get(), "w1");
  again.Join({Entry(2, 20)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({2}) == std::vector<Pair>{{"w1", 20}}; }));
  EXPECT_THAT(Tokens({1}), ElementsAre(Pair("w1", 0)));
  EXPECT_TRUE(again.Close().ok());
}

TEST_F(KvdirServerTest, NewerStreamForTheSameWorkerAbortsTheOlderOne) {
  Start();
  FakeWorker old_stream(stub_.get(), "w1");
  old_stream.Join({});
  FakeWorker new_stream(stub_.get(), "w1");
  new_stream.Join({Entry(1, 10)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1}) == std::vector<Pair>{{"w1", 10}}; }));
  old_stream.Heartbeat();
  const grpc::Status s = old_stream.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("say hello"));
  EXPECT_THAT(Tokens({1}), ElementsAre(Pair("w1", 10)));  // the new stream is untouched
  EXPECT_TRUE(new_stream.Close().ok());
}

}  // namespace
}  // namespace lazyattn::kvdir
