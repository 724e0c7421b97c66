// The bounds on Publish streams themselves (PublishStreams): how many may be open, how many per
// worker certificate (mutual TLS), and how long one may stay open without a hello. First the
// registry alone, then through the server: what a worker sees and what kvdir counts.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/metric_family.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/test_certs_for_test.h"
#include "services/kvdir/server/kvdir_server.h"
#include "services/kvdir/server/kvdir_server_test_fixture.h"
#include "services/kvdir/server/publish_streams.h"

namespace lazyattn::kvdir {
namespace {

using testing::Entry;
using testing::FakeWorker;
using ::testing::HasSubstr;
using testing::KvdirServerTest;
using testing::WaitFor;

const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(1);

TEST(PublishStreamsTest, BoundsTheStreamsInAllAndPerCertificate) {
  PublishStreams streams({.max_streams = 3, .max_per_certificate = 2});
  bool per_certificate = true;
  auto a = streams.Open("worker-0", "10.0.0.1", kT0, nullptr, &per_certificate);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(per_certificate);
  ASSERT_TRUE(streams.Open("worker-0", "10.0.0.1", kT0, nullptr).ok());
  auto third = streams.Open("worker-0", "10.0.0.1", kT0, nullptr, &per_certificate);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("limits.max_streams_per_certificate"));
  EXPECT_THAT(third.status().message(), HasSubstr("worker-0"));
  EXPECT_TRUE(per_certificate);
  // Another certificate, and a stream without one, still fit under max_streams.
  auto other = streams.Open("worker-1", "10.0.0.2", kT0, nullptr);
  ASSERT_TRUE(other.ok()) << other.status();
  auto fourth = streams.Open("", "10.0.0.3", kT0, nullptr, &per_certificate);
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(fourth.status().message(), HasSubstr("limits.max_publish_streams"));
  EXPECT_FALSE(per_certificate);
  EXPECT_EQ(streams.open_streams(), 3);
  // Closing frees both counts; closing twice or an unknown id changes nothing.
  streams.Close(*a);
  streams.Close(*a);
  streams.Close(12345);
  EXPECT_EQ(streams.open_streams(), 2);
  EXPECT_TRUE(streams.Open("worker-0", "10.0.0.1", kT0, nullptr).ok());
  EXPECT_FALSE(streams.Open("worker-0", "10.0.0.1", kT0, nullptr).ok());
}

// The budget of directory work (limits.max_publish_entries_per_s): the streams of one
// certificate share it, a refused message charges nothing, it refills at the rate up to four
// seconds of it, and a new stream of the certificate does not start afresh. Without a
// certificate each stream has its own; 0 is no bound.
TEST(PublishStreamsTest, ChargesDirectoryWorkPerCertificateAndRefillsAtTheRate) {
  PublishStreams streams({.max_streams = 10, .max_per_certificate = 4, .entries_per_s = 100});
  auto a = streams.Open("worker-0", "10.0.0.1", kT0, nullptr);
  auto b = streams.Open("worker-0", "10.0.0.1", kT0, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(streams.Charge(*a, 350, kT0).ok());  // of a burst of 400
  const absl::Status over = streams.Charge(*b, 60, kT0);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("limits.max_publish_entries_per_s"));
  EXPECT_THAT(over.message(), HasSubstr("worker-0"));
  EXPECT_TRUE(streams.Charge(*b, 50, kT0).ok());  // the refusal took nothing
  EXPECT_FALSE(streams.Charge(*a, 1, kT0).ok());
  const absl::Time later = kT0 + absl::Milliseconds(100);  // 10 entries back
  EXPECT_TRUE(streams.Charge(*a, 10, later).ok());
  EXPECT_FALSE(streams.Charge(*a, 1, later).ok());
  // Reconnecting does not refill it: the sweep keeps a budget that is not full.
  streams.Close(*a);
  streams.Close(*b);
  streams.CancelSilent(later);
  auto c = streams.Open("worker-0", "10.0.0.1", later, nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(streams.Charge(*c, 1, later).ok());
  // Refilled to the burst and no further.
  const absl::Time rested = kT0 + absl::Seconds(60);
  EXPECT_TRUE(streams.Charge(*c, 400, rested).ok());
  EXPECT_FALSE(streams.Charge(*c, 1, rested).ok());
  // Without a certificate each stream has its own budget.
  auto p = streams.Open("", "10.0.0.2", kT0, nullptr);
  auto q = streams.Open("", "10.0.0.2", kT0, nullptr);
  ASSERT_TRUE(p.ok() && q.ok());
  EXPECT_TRUE(streams.Charge(*p, 400, kT0).ok());
  EXPECT_TRUE(streams.Charge(*q, 400, kT0).ok());
  EXPECT_FALSE(streams.Charge(*q, 1, kT0).ok());

  PublishStreams unbounded({.max_streams = 1, .entries_per_s = 0});
  auto u = unbounded.Open("worker-0", "10.0.0.1", kT0, nullptr);
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(unbounded.Charge(*u, int64_t{1} << 40, kT0).ok());
}

TEST(PublishStreamsTest, CancelsOnceTheStreamsSilentPastTheHelloTimeout) {
  PublishStreams streams({.max_streams = 10, .hello_timeout = absl::Seconds(10)});
  int cancelled_silent = 0, cancelled_greeted = 0, cancelled_young = 0;
  auto silent = streams.Open("", "10.0.0.1", kT0, [&] { ++cancelled_silent; });
  auto greeted = streams.Open("", "10.0.0.2", kT0, [&] { ++cancelled_greeted; });
  auto young = streams.Open("worker-3", "10.0.0.3", kT0 + absl::Seconds(5),
                            [&] { ++cancelled_young; });
  ASSERT_TRUE(silent.ok() && greeted.ok() && young.ok());
  streams.SaidHello(*greeted);
  EXPECT_TRUE(streams.CancelSilent(kT0 + absl::Milliseconds(9999)).empty());
  std::vector<SilentStream> out = streams.CancelSilent(kT0 + absl::Seconds(10));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].peer_host, "10.0.0.1");
  EXPECT_EQ(out[0].open_for, absl::Seconds(10));
  EXPECT_EQ(cancelled_silent, 1);
  // Once: the cancelled stream stays registered until its reactor closes it.
  out = streams.CancelSilent(kT0 + absl::Seconds(15));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].certificate_id, "worker-3");
  EXPECT_EQ(cancelled_silent, 1);
  EXPECT_EQ(cancelled_young, 1);
  EXPECT_EQ(cancelled_greeted, 0);
  EXPECT_EQ(streams.open_streams(), 3);
}

TEST_F(KvdirServerTest, AStreamWithoutHelloIsCancelledAfterTheHelloTimeout) {
  KvdirOptions options;
  options.limits.hello_timeout_ms = 300;
  StartWith(options);
  FakeWorker greeted(stub_.get(), "w1");
  greeted.Join({});
  FakeWorker silent(stub_.get(), "w2");
  const absl::Time opened = absl::Now();
  const grpc::Status s = silent.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  EXPECT_GE(absl::Now() - opened, absl::Milliseconds(300));
  EXPECT_TRUE(WaitFor([&] {
    return MetricValue("lazyattn_kvdir_limit_refusals_total", "hello_timeout") == 1;
  }));
  // The worker that said hello is not touched by the timeout.
  EXPECT_TRUE(greeted.Heartbeat());
  EXPECT_THAT(LiveWorkers(), ::testing::ElementsAre("w1"));
  EXPECT_TRUE(greeted.Close().ok());
}

// Holds the slow-work pool's one thread at the first slice boundary of a large change (a
// snapshot of over 2,048 entries) until Release(), through DirectoryIndex's test hook. The state
// is shared with the hook, which stays installed until the fixture's teardown; the destructor
// releases, so a failed assertion never leaves the thread waiting.
class SliceGate {
 public:
  ~SliceGate() { Release(); }
  void Install(DirectoryIndex& index) {
    index.SetBetweenSlicesHookForTest([s = state_] {
      if (s->held.exchange(true)) return;
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return s->released; });
    });
  }
  bool held() const { return state_->held.load(); }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->released = true;
    }
    state_->cv.notify_all();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool released = false;
    std::atomic<bool> held{false};
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// A hello that waits in the slow-work queue past the hello timeout (behind another worker's
// snapshot, the pool's one thread held): the sweeper cancels its stream, and the hello, when its
// turn comes, is dropped unapplied. Applied, it would list a worker whose stream is gone, and
// hold its id and address until its lease ran out.
TEST_F(KvdirServerTest, AHelloQueuedPastTheHelloTimeoutIsDroppedUnapplied) {
  KvdirOptions options;
  options.limits.hello_timeout_ms = 1500;  // w1's and w3's hellos get through well within it
  options.slow_work_threads = 1;
  StartWith(options);
  SliceGate gate;
  gate.Install(server_->index_for_test());  // before any worker connects (the hook's contract)
  FakeWorker big(stub_.get(), "w1");
  std::vector<v1::DocEntry> entries;
  for (uint64_t k = 1; k <= 5000; ++k) entries.push_back(Entry(k, 16));  // 3 slices
  big.Join(entries);
  ASSERT_TRUE(WaitFor([&] { return gate.held(); }));

  FakeWorker late(stub_.get(), "w2");
  ASSERT_TRUE(late.Hello());  // queued behind w1's snapshot
  const grpc::Status s = late.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  // Counted by the sweeper just after the cancel.
  EXPECT_TRUE(WaitFor(
      [&] { return MetricValue("lazyattn_kvdir_limit_refusals_total", "hello_timeout") == 1; }));
  gate.Release();

  // The pool takes its queue in order: once w3's hello (queued after w2's) is applied, w2's
  // has had its turn.
  FakeWorker next(stub_.get(), "w3");
  ASSERT_TRUE(next.Hello());
  v1::DirectoryMessage m;
  ASSERT_TRUE(next.Read(&m));
  EXPECT_TRUE(m.has_lease());
  EXPECT_THAT(LiveWorkers(), ::testing::ElementsAre("w1", "w3"));
  // w1's snapshot, held at its first slice boundary, was stored whole.
  EXPECT_THAT(Tokens({1, 5000}), ::testing::Contains(std::make_pair(std::string("w1"), 32)));
  EXPECT_TRUE(big.Close().ok());
  EXPECT_TRUE(next.Close().ok());
}

// A snapshot whose slices take longer than a lease (a large one on a busy host, a short lease):
// its worker's heartbeats wait unread behind it, so only the directory is slow, and the worker
// must stay live through the apply instead of expiring, losing the snapshot and resending it.
TEST_F(KvdirServerTest, AWorkerWhoseSnapshotTakesLongerThanALeaseStaysLive) {
  KvdirOptions options;
  options.lease_ms = 1000;
  options.slow_work_threads = 1;
  StartWith(options);
  SliceGate gate;
  gate.Install(server_->index_for_test());
  FakeWorker w(stub_.get(), "w1");
  std::vector<v1::DocEntry> entries;
  for (uint64_t k = 1; k <= 5000; ++k) entries.push_back(Entry(k, 16));
  w.Join(entries);
  ASSERT_TRUE(WaitFor([&] { return gate.held(); }));
  // The worker goes on with its heartbeats; they queue in the stream behind the snapshot.
  std::atomic<bool> stop{false};
  std::thread beats([&] {
    while (!stop.load()) {
      if (!w.Heartbeat()) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  absl::SleepFor(absl::Milliseconds(2500));  // two and a half leases, several sweeps
  EXPECT_THAT(LiveWorkers(), ::testing::ElementsAre("w1"));
  gate.Release();
  EXPECT_TRUE(WaitFor([&] {
    const auto tokens = Tokens({1, 5000});
    return tokens.size() == 1 && tokens[0] == std::make_pair(std::string("w1"), int64_t{32});
  }));
  stop = true;
  beats.join();
  EXPECT_EQ(MetricValue("lazyattn_kvdir_leases_expired_total"), 0);
  EXPECT_TRUE(w.Close().ok());
}

TEST_F(KvdirServerTest, StreamsPastMaxPublishStreamsAreRefusedBeforeAnyRead) {
  KvdirOptions options;
  options.limits.max_publish_streams = 2;
  StartWith(options);
  auto first = std::make_unique<FakeWorker>(stub_.get(), "w1");
  first->Join({});
  FakeWorker second(stub_.get(), "w2");
  second.Join({});  // both registered before the probe (stream setup is asynchronous)
  FakeWorker probe(stub_.get(), "w3");
  const grpc::Status s = probe.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("limits.max_publish_streams"));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_publish_streams"), 1);
  // A closed stream frees its place (once its reactor is done: asynchronous again).
  EXPECT_TRUE(first->Close().ok());
  first.reset();
  EXPECT_TRUE(WaitFor([&] {
    FakeWorker again(stub_.get(), "w1");
    if (!again.Hello()) return false;
    v1::DirectoryMessage m;
    return again.Read(&m) && m.has_lease();
  }));
  EXPECT_TRUE(second.Heartbeat());
  EXPECT_TRUE(second.Close().ok());
}

// A worker past limits.max_publish_entries_per_s: the message that would pass it is not
// applied, and the stream ends RESOURCE_EXHAUSTED naming the limit, counted. At 1,000 entries a
// second (bursts of 4,000) a worker sending 1,000-entry snapshots back to back is refused within
// the first few, unless this machine takes seconds for each.
TEST_F(KvdirServerTest, AWorkerPastItsRateOfDirectoryWorkIsEndedUnapplied) {
  KvdirOptions options;
  options.limits.max_entries_per_worker = 1000;
  options.limits.max_publish_entries_per_s = 1000;
  options.lease_ms = 60'000;  // the worker's entries outlive its ended stream until the Lookup
  StartWith(options);
  // Snapshot i: 999 shared entries and key kFirst + i, which only it holds.
  constexpr uint64_t kFirst = 100'000;
  constexpr int kSnapshots = 13;
  auto snapshot = [](int i) {
    std::vector<v1::DocEntry> entries;
    for (uint64_t key = 1; key < 1000; ++key) entries.push_back(Entry(key, 10));
    entries.push_back(Entry(kFirst + i, 10));
    return entries;
  };
  FakeWorker w(stub_.get(), "w1");
  w.Join(snapshot(0));
  int sent = 1;
  while (sent < kSnapshots && w.Snapshot(snapshot(sent))) ++sent;
  const grpc::Status s = w.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("limits.max_publish_entries_per_s"));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_publish_entries_per_s"), 1);
  // Messages are handled in order, so the stream's end follows everything before it: the last
  // snapshot applied is the one before the refused one, never the last sent.
  std::vector<uint64_t> keys;
  for (int i = 0; i < sent; ++i) keys.push_back(kFirst + i);
  v1::LookupResponse after;
  ASSERT_TRUE(Lookup(keys, &after).ok());
  ASSERT_EQ(after.workers_size(), 1);
  int resident = 0, last = -1;
  for (int i = 0; i < sent; ++i) {
    if (after.workers(0).resident(i)) ++resident, last = i;
  }
  EXPECT_EQ(resident, 1);
  EXPECT_LT(last, sent - 1);
}

// A rate below a full snapshot a second would shut out a worker holding
// limits.max_entries_per_worker entries that reconnects a few times in a row: refused at start,
// naming both keys. Unset, the rate is that of a full snapshot, whatever the bound (a config
// that raised max_entries_per_worker before this key existed still starts).
TEST(KvdirServerLimitsTest, ARateBelowAFullSnapshotASecondIsRefused) {
  KvdirOptions options;
  options.listen_address = "127.0.0.1:0";
  options.limits.max_entries_per_worker = 1000;
  options.limits.max_publish_entries_per_s = 999;
  auto refused = KvdirServer::Create(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("limits.max_publish_entries_per_s"));
  EXPECT_THAT(refused.status().message(), HasSubstr("limits.max_entries_per_worker"));
  for (int64_t rate : {int64_t{1000}, int64_t{0}, int64_t{-1}}) {  // -1: 262,144 here
    options.limits.max_publish_entries_per_s = rate;
    EXPECT_TRUE(KvdirServer::Create(options).ok()) << rate;
  }
  options.limits.max_entries_per_worker = 1'000'000;
  options.limits.max_publish_entries_per_s = -1;
  EXPECT_TRUE(KvdirServer::Create(options).ok());
}

// kvdir under mutual TLS with the set of tools/gen-certs in `certs`, on a port the OS picks.
KvdirOptions MutualTlsOptions(const std::string& certs) {
  KvdirOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "";
  options.tls = TlsOptions{.cert_file = certs + "/kvdir.crt",
                           .key_file = certs + "/kvdir.key",
                           .ca_file = certs + "/ca.crt"};
  return options;
}

// A channel to kvdir's `port` presenting the certificate `name` of the set in `certs`.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelAs(const std::string& certs,
                                                         const std::string& name, int port) {
  return MakeChannel(absl::StrCat("localhost:", port),
                     TlsOptions{.cert_file = certs + "/" + name + ".crt",
                                .key_file = certs + "/" + name + ".key",
                                .ca_file = certs + "/ca.crt"});
}

// Under mutual TLS the bound is per worker certificate: worker-0 may hold two streams, a third
// is refused naming the limit, and worker-1's certificate is not affected.
TEST(KvdirServerTlsStreamsTest, StreamsArePerCertificate) {
  const std::string certs = lazyattn::testing::MakeTestCerts("kvdir-streams", /*workers=*/2);
  ASSERT_FALSE(certs.empty()) << "tools/gen-certs (run from the source tree) failed";
  KvdirOptions options = MutualTlsOptions(certs);
  options.limits.max_streams_per_certificate = 2;
  auto server = KvdirServer::Create(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel0 = ChannelAs(certs, "worker-0", (*server)->port());
  auto channel1 = ChannelAs(certs, "worker-1", (*server)->port());
  ASSERT_TRUE(channel0.ok() && channel1.ok()) << channel0.status() << channel1.status();
  auto worker0 = v1::KvDirectory::NewStub(*channel0);
  auto worker1 = v1::KvDirectory::NewStub(*channel1);
  FakeWorker a(worker0.get(), "worker-0");
  a.Join({}, 1, "localhost:7000");          // an address its certificate names
  FakeWorker b(worker0.get(), "worker-0");  // a reconnect's overlap: open, no hello
  // Stream setup is asynchronous: b must be registered before c is opened, or c takes its place.
  ASSERT_TRUE(WaitFor([&] {
    for (const prometheus::MetricFamily& f : (*server)->registry()->Collect()) {
      if (f.name == "lazyattn_kvdir_publish_streams") return f.metric[0].gauge.value == 2;
    }
    return false;
  }));
  FakeWorker c(worker0.get(), "worker-0");
  const grpc::Status refused = c.Drain();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("limits.max_streams_per_certificate"));
  EXPECT_THAT(refused.error_message(), HasSubstr("worker-0"));
  FakeWorker other(worker1.get(), "worker-1");
  other.Join({}, 1, "127.0.0.1:7001");
  EXPECT_TRUE(a.Heartbeat());
  EXPECT_TRUE(a.Close().ok());
  EXPECT_TRUE(other.Close().ok());
}

// A snapshot over limits.max_entries_per_worker is refused unconverted, but kvdir parsed it all
// the same: it is charged to the certificate's budget of directory work (as a full snapshot), so
// a worker certificate that opens stream after stream to send one is refused for its rate within
// a few, instead of keeping kvdir parsing megabyte messages as fast as it sends them.
TEST(KvdirServerTlsStreamsTest, OversizedSnapshotsAreChargedToTheCertificate) {
  const std::string certs = lazyattn::testing::MakeTestCerts("kvdir-oversize");
  ASSERT_FALSE(certs.empty()) << "tools/gen-certs (run from the source tree) failed";
  KvdirOptions options = MutualTlsOptions(certs);
  // A budget of 4 full snapshots, refilled at one a second.
  options.limits.max_entries_per_worker = 20'000;
  options.limits.max_publish_entries_per_s = 20'000;
  auto server = KvdirServer::Create(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = ChannelAs(certs, "worker-0", (*server)->port());
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto stub = v1::KvDirectory::NewStub(*channel);
  std::vector<v1::DocEntry> oversized;
  for (uint64_t key = 1; key <= 20'001; ++key) oversized.push_back(Entry(key, 10));
  std::vector<std::string> refusals;
  for (int i = 0; i < 12; ++i) {
    FakeWorker w(stub.get(), "worker-0");
    w.Hello(1, "localhost:7000");
    w.Snapshot(oversized);
    const grpc::Status s = w.Drain();
    refusals.push_back(s.error_message());
    if (absl::StrContains(s.error_message(), "limits.max_publish_entries_per_s")) break;
    EXPECT_THAT(s.error_message(), HasSubstr("snapshot.entries: 20001 entries")) << i;
  }
  ASSERT_FALSE(refusals.empty());
  EXPECT_THAT(refusals.back(), HasSubstr("limits.max_publish_entries_per_s"))
      << refusals.size() << " oversized snapshots were sent and none was charged";
  EXPECT_LE(refusals.size(), 8u) << "the budget allows about 4 and a refill of one a second";
}

}  // namespace
}  // namespace lazyattn::kvdir
