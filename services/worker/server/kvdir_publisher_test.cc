// KvdirPublisher against a fake kvdir on 127.0.0.1: Hello, events with contiguous sequence numbers,
// snapshots on request and on queue overflow, heartbeats, reconnection after a kvdir restart; and
// a WorkerServer publishing its engine's document cache.
#include "services/worker/server/kvdir_publisher.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kvdir_stream_trailer.h"
#include "common/log.h"
#include "common/test_certs_for_test.h"
#include "common/tls_expiry_metrics.h"
#include "common/tls_files.h"
#include "gtest/gtest.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"
#include "services/worker/server/testing_fake_kvdir.h"
#include "services/worker/server/worker_server.h"

namespace lazyattn {
namespace {

using testing::FakeKvdir;
using Messages = std::vector<v1::WorkerMessage>;

DocCacheKey Key(uint64_t n, int64_t offset = DocCacheKey::kAnyOffset) {
  return {.doc = {.hi = n, .lo = n * 7}, .offset = offset};
}

int Count(const Messages& ms, v1::WorkerMessage::BodyCase body) {
  int n = 0;
  for (const auto& m : ms) n += m.body_case() == body ? 1 : 0;
  return n;
}

// Messages after the last Hello (the current connection).
Messages LastConnection(const Messages& ms) {
  size_t start = 0;
  for (size_t i = 0; i < ms.size(); ++i) {
    if (ms[i].has_hello()) start = i;
  }
  return Messages(ms.begin() + static_cast<long>(start), ms.end());
}

// Sequence numbers of one connection: 1, 2, 3, ...
void ExpectContiguousSeq(const Messages& connection) {
  for (size_t i = 0; i < connection.size(); ++i) {
    EXPECT_EQ(connection[i].seq(), i + 1) << "message " << i;
  }
}

class KvdirPublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kvdir_.Start());
    mirror_.set_listener([this](const CacheEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      if (publisher_ != nullptr) publisher_->OnCacheEvent(e);
    });
  }
  void TearDown() override {
    mirror_.set_listener({});
    publisher_.reset();
  }

  void StartPublisher(int max_queued_events = 4096,
                      absl::Duration max_backoff = absl::Milliseconds(200)) {
    KvdirPublisherOptions o;
    o.address = kvdir_.address();
    o.lease = absl::Milliseconds(300);  // heartbeats every 100 ms
    o.min_backoff = absl::Milliseconds(20);
    o.max_backoff = max_backoff;
    o.max_queued_events = max_queued_events;
    o.routine_stream_age = routine_stream_age_;
    PublisherSource source{
        .status =
            [] {
              v1::WorkerStatus s;
              s.set_worker_id("w1");
              s.set_address("127.0.0.1:1234");
              return s;
            },
        .load =
            [this] {
              std::unique_lock<std::mutex> lock(gate_mu_);
              if (gate_closed_) {
                blocked_in_load_ = true;
                gate_cv_.notify_all();
                gate_cv_.wait(lock, [&] { return !gate_closed_; });
                blocked_in_load_ = false;
              }
              v1::WorkerLoad l;
              l.set_free_blocks(7);
              return l;
            },
        .snapshot = [this] { return mirror_.Snapshot(); }};
    auto p = KvdirPublisher::Create(o, source);
    ASSERT_TRUE(p.ok()) << p.status();
    std::lock_guard<std::mutex> lock(mu_);
    publisher_ = std::move(*p);
  }

  bool WaitConnected() {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (!publisher_->stats().connected) {
      if (absl::Now() > until) return false;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return true;
  }

  // Waits until the fake directory holds the stream (it has read the Hello), so that Send
  // reaches the publisher: the publisher counts itself connected once the Hello is sent.
  bool WaitForHello() {
    return kvdir_.WaitFor(
        [](const Messages& ms) { return Count(ms, v1::WorkerMessage::kHello) >= 1; });
  }

  // Waits until the publisher thread is blocked in load().
  bool WaitBlockedInLoad() {
    std::unique_lock<std::mutex> lock(gate_mu_);
    return gate_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return blocked_in_load_; });
  }

  void SetGate(bool closed) {
    {
      std::lock_guard<std::mutex> lock(gate_mu_);
      gate_closed_ = closed;
    }
    gate_cv_.notify_all();
  }

  FakeKvdir kvdir_;
  CacheMirror mirror_;  // stands in for the engine's document cache
  std::mutex mu_;
  absl::Duration routine_stream_age_ = absl::Minutes(30);  // the option's default
  std::unique_ptr<KvdirPublisher> publisher_;
  // Closed: the publisher thread blocks when it asks for the load (to make it fall behind).
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool gate_closed_ = false;
  bool blocked_in_load_ = false;
};

TEST_F(KvdirPublisherTest, HelloEventsSnapshotOnRequestAndHeartbeats) {
  StartPublisher();
  ASSERT_TRUE(kvdir_.WaitFor([](const Messages& ms) { return !ms.empty(); }));
  const v1::WorkerMessage hello = kvdir_.messages().front();
  ASSERT_TRUE(hello.has_hello());
  EXPECT_EQ(hello.seq(), 1u);
  EXPECT_EQ(hello.hello().status().worker_id(), "w1");
  EXPECT_EQ(hello.hello().epoch(), publisher_->epoch());
  EXPECT_NE(hello.hello().epoch(), 0u);
  ASSERT_TRUE(WaitConnected());

  mirror_.Apply(Key(1), 40, /*stored=*/true);
  mirror_.Apply(Key(2, 16), 25, /*stored=*/true);
  mirror_.Apply(Key(1), 40, /*stored=*/false);
  ASSERT_TRUE(kvdir_.WaitFor(
      [](const Messages& ms) { return Count(ms, v1::WorkerMessage::kEvent) == 3; }));
  Messages ms = kvdir_.messages();
  std::vector<v1::DocEvent> events;
  for (const auto& m : ms) {
    if (m.has_event()) events.push_back(m.event());
  }
  EXPECT_EQ(events[0].kind(), v1::DocEvent::STORED);
  EXPECT_EQ(events[0].entry().key().hi(), 1u);
  EXPECT_EQ(events[0].entry().key().lo(), 7u);
  EXPECT_EQ(events[0].entry().tokens(), 40);
  EXPECT_EQ(events[0].entry().offset(), -1);
  EXPECT_EQ(events[1].entry().offset(), 16);
  EXPECT_EQ(events[2].kind(), v1::DocEvent::EVICTED);

  ASSERT_TRUE(kvdir_.RequestSnapshot("test"));
  ASSERT_TRUE(kvdir_.WaitFor(
      [](const Messages& ms) { return Count(ms, v1::WorkerMessage::kSnapshot) == 1; }));
  ASSERT_TRUE(kvdir_.WaitFor(
      [](const Messages& ms) { return Count(ms, v1::WorkerMessage::kHeartbeat) >= 2; }));
  ms = kvdir_.messages();
  ExpectContiguousSeq(ms);
  for (const auto& m : ms) {
    if (m.has_snapshot()) {
      ASSERT_EQ(m.snapshot().entries_size(), 1);  // key 1 was evicted
      EXPECT_EQ(m.snapshot().entries(0).key().hi(), 2u);
      EXPECT_EQ(m.snapshot().entries(0).tokens(), 25);
      EXPECT_EQ(m.snapshot().load().free_blocks(), 7);
    }
    if (m.has_heartbeat()) {
      EXPECT_EQ(m.heartbeat().load().free_blocks(), 7);
    }
  }
  EXPECT_EQ(publisher_->stats().events_sent, 3);
  EXPECT_EQ(publisher_->stats().events_dropped, 0);
}

// A directory granting a 1 ms lease (broken, or hostile) does not make the heartbeats a busy
// loop: the lease is taken as 50 ms at least, so a heartbeat every ~17 ms.
TEST_F(KvdirPublisherTest, ALeaseBelowKvdirsOwnBoundIsRaisedToIt) {
  StartPublisher();
  ASSERT_TRUE(WaitForHello());
  v1::DirectoryMessage grant;
  grant.mutable_lease()->set_lease_ms(1);
  ASSERT_TRUE(kvdir_.Send(grant));
  absl::SleepFor(absl::Milliseconds(200));  // the grant arrives; heartbeats follow its lease
  const int before = Count(kvdir_.messages(), v1::WorkerMessage::kHeartbeat);
  absl::SleepFor(absl::Milliseconds(500));
  const int during = Count(kvdir_.messages(), v1::WorkerMessage::kHeartbeat) - before;
  // 500 ms / (50 ms / 3) = 30; a 1 ms lease would have sent some 1,500.
  EXPECT_LE(during, 40);
  EXPECT_GE(during, 5);  // and more often than the 300 ms lease's 100 ms
}

// A directory message that does not parse (a string field that is not UTF-8) fails the
// publisher's read as the stream's end does; a directory that then keeps the stream open does
// not hold the publisher: it cancels the call within its grace and reconnects with a new Hello.
TEST_F(KvdirPublisherTest, AMessageThatDoesNotParseEndsTheStreamAndThePublisherReconnects) {
  StartPublisher();
  ASSERT_TRUE(WaitForHello());
  v1::DirectoryMessage bad;
  bad.mutable_snapshot_request()->set_reason("\xff\xfe");  // proto3 `string`: refused on read
  ASSERT_TRUE(kvdir_.Send(bad));
  EXPECT_TRUE(
      kvdir_.WaitFor([](const Messages& ms) { return Count(ms, v1::WorkerMessage::kHello) >= 2; },
                     std::chrono::seconds(15)));
  EXPECT_GE(kvdir_.streams(), 2);
  EXPECT_TRUE(WaitConnected());
}

TEST_F(KvdirPublisherTest, QueueOverflowDropsEventsAndSendsASnapshotInstead) {
  StartPublisher(/*max_queued_events=*/4);
  ASSERT_TRUE(WaitConnected());
  // Block the publisher thread in its next heartbeat so that it falls behind.
  SetGate(true);
  ASSERT_TRUE(WaitBlockedInLoad());
  for (uint64_t i = 1; i <= 10; ++i) mirror_.Apply(Key(i), static_cast<int64_t>(i), true);
  EXPECT_GT(publisher_->stats().events_dropped, 0);
  SetGate(false);
  ASSERT_TRUE(kvdir_.WaitFor(
      [](const Messages& ms) { return Count(ms, v1::WorkerMessage::kSnapshot) == 1; }));
  mirror_.Apply(Key(11), 11, true);  // after the snapshot: sent as an event
  ASSERT_TRUE(kvdir_.WaitFor([](const Messages& ms) {
    return !ms.empty() && ms.back().has_event() && ms.back().event().entry().key().hi() == 11;
  }));
  const Messages ms = kvdir_.messages();
  ExpectContiguousSeq(ms);
  for (const auto& m : ms) {
    if (m.has_snapshot()) {
      EXPECT_EQ(m.snapshot().entries_size(), 10);
    }
  }
}

TEST_F(KvdirPublisherTest, ARefusedWorkerRetriesAtTheMaximumBackoff) {
  // kvdir over limits.max_workers: every Hello is answered RESOURCE_EXHAUSTED.
  kvdir_.SetRefusal(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 "hello: the directory holds its maximum number of workers"));
  StartPublisher(4096, absl::Milliseconds(500));
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (publisher_->stats().refusals < 1 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_GE(publisher_->stats().refusals, 1);
  const int first = kvdir_.streams();
  absl::SleepFor(absl::Milliseconds(1400));
  // At most one retry per 500 ms (a reset to the 20 ms minimum would make dozens).
  const int retries = kvdir_.streams() - first;
  EXPECT_GE(retries, 1);
  EXPECT_LE(retries, 3);
  const KvdirPublisher::Stats refused = publisher_->stats();
  EXPECT_LE(refused.connections - refused.refusals, 1);  // every Hello refused (one may be in flight)
  // Once kvdir accepts again, the worker connects within the maximum backoff and stays.
  kvdir_.SetRefusal(grpc::Status::OK);
  const int64_t refusals = publisher_->stats().refusals;
  ASSERT_TRUE(WaitConnected());
  absl::SleepFor(absl::Milliseconds(700));
  EXPECT_TRUE(publisher_->stats().connected);
  EXPECT_LE(publisher_->stats().refusals, refusals + 1);  // at most one refusal raced the switch
}

// Two workers started with one id: kvdir refuses the second with ALREADY_EXISTS. It says so as
// an error naming where the other runs, once, and keeps retrying, so that it takes the id over
// when the other leaves (it never gives up or exits).
TEST_F(KvdirPublisherTest, AnIdHeldByAnotherLiveWorkerIsAnErrorAndRetriedUntilFree) {
  kvdir_.SetRefusal(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                                 "hello.status.worker_id: \"w1\" is held by a live worker at "
                                 "10.0.0.9:7200"),
                    {{kWorkerIdHolderKey, "10.0.0.9:7200"}});
  const std::string path = absl::StrCat(::testing::TempDir(), "/publisher-log-", getpid());
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  SetLogSinkForTest(fd);
  StartPublisher(4096, absl::Milliseconds(200));
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (publisher_->stats().refusals < 3 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_GE(publisher_->stats().refusals, 3);  // still retrying after the first refusal
  EXPECT_FALSE(publisher_->stats().connected);
  // The other worker left: the next retry is accepted and stays.
  kvdir_.SetRefusal(grpc::Status::OK);
  EXPECT_TRUE(WaitConnected());
  {
    std::lock_guard<std::mutex> lock(mu_);
    publisher_.reset();
  }
  SetLogSinkForTest(STDERR_FILENO);
  close(fd);

  std::ifstream in(path);
  std::string line;
  std::vector<std::string> errors;
  while (std::getline(in, line)) {
    if (line.find(" ERROR worker: ") != std::string::npos) errors.push_back(line);
  }
  ASSERT_EQ(errors.size(), 1u) << "logged once, not once per retry";
  EXPECT_NE(errors[0].find("another live worker holds worker id w1 at 10.0.0.9:7200"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("holder_address=10.0.0.9:7200"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("--worker-id"), std::string::npos) << errors[0];
  unlink(path.c_str());
}

TEST_F(KvdirPublisherTest, ReconnectsWithANewHelloAfterKvdirRestarts) {
  StartPublisher();
  ASSERT_TRUE(WaitConnected());
  mirror_.Apply(Key(1), 40, true);
  ASSERT_TRUE(kvdir_.WaitFor(
      [](const Messages& ms) { return Count(ms, v1::WorkerMessage::kEvent) == 1; }));
  const uint64_t epoch = publisher_->epoch();
  const int port = kvdir_.port();
  kvdir_.Stop();
  FakeKvdir restarted;
  ASSERT_TRUE(restarted.Start(port));
  ASSERT_TRUE(restarted.WaitFor([](const Messages& ms) { return !ms.empty(); }));
  const v1::WorkerMessage hello = restarted.messages().front();
  ASSERT_TRUE(hello.has_hello());
  EXPECT_EQ(hello.seq(), 1u);
  EXPECT_EQ(hello.hello().epoch(), epoch);  // same process: same epoch
  // The restarted kvdir rebuilds its view from a snapshot.
  ASSERT_TRUE(restarted.RequestSnapshot("reconnect"));
  ASSERT_TRUE(restarted.WaitFor([](const Messages& ms) {
    for (const auto& m : ms) {
      if (m.has_snapshot()) return m.snapshot().entries_size() == 1;
    }
    return false;
  }));
  ExpectContiguousSeq(LastConnection(restarted.messages()));
  EXPECT_GE(publisher_->stats().connections, 2);
  mirror_.set_listener({});
  {
    std::lock_guard<std::mutex> lock(mu_);
    publisher_.reset();  // closes the stream while `restarted` is still up
  }
}

// kvdir closes every connection after about an hour (its connection age): a stream that lived
// routine_stream_age and then ends UNAVAILABLE is logged at INFO, and only a reconnect that
// fails warns. The end of a younger stream is a WARNING, as before. The first directory here
// ages its connections as kvdir does (GOAWAY, then the grace's end closes the connection): a
// server shut down under the stream instead may end it CANCELLED on a loaded machine, which no
// routine end is.
TEST_F(KvdirPublisherTest, AStreamEndedPastItsRoutineAgeIsInfoNotAWarning) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/publisher-age-log-", getpid());
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  SetLogSinkForTest(fd);
  const int port = kvdir_.port();
  kvdir_.Stop();
  {
    FakeKvdir aging;
    ASSERT_TRUE(aging.Start(port, /*max_connection_age_ms=*/300, /*grace_ms=*/100));
    routine_stream_age_ = absl::Milliseconds(1);
    StartPublisher();
    // Cut at the connection's age, then reconnected: a second stream with its own Hello.
    ASSERT_TRUE(aging.WaitFor([](const Messages& ms) {
      return std::count_if(ms.begin(), ms.end(), [](const auto& m) { return m.has_hello(); }) >= 2;
    }));
    std::lock_guard<std::mutex> lock(mu_);
    publisher_.reset();  // before the next age cut: one routine end only
  }
  {
    FakeKvdir first, restarted;
    ASSERT_TRUE(first.Start(port));
    routine_stream_age_ = absl::Hours(1);
    StartPublisher();
    ASSERT_TRUE(WaitConnected());
    first.Stop();
    ASSERT_TRUE(restarted.Start(port));
    ASSERT_TRUE(restarted.WaitFor([](const Messages& ms) { return !ms.empty(); }));
    std::lock_guard<std::mutex> lock(mu_);
    publisher_.reset();
  }
  SetLogSinkForTest(STDERR_FILENO);
  close(fd);

  std::ifstream in(path);
  std::vector<std::string> routine, lost;
  for (std::string line; std::getline(in, line);) {
    if (line.find("kvdir closed the stream after its connection age") != std::string::npos) {
      routine.push_back(line);
    }
    if (line.find("lost the kvdir stream") != std::string::npos) lost.push_back(line);
  }
  ASSERT_EQ(routine.size(), 1u) << "the first publisher's end";
  EXPECT_NE(routine[0].find(" INFO worker: "), std::string::npos) << routine[0];
  EXPECT_NE(routine[0].find("stream_age_s="), std::string::npos) << routine[0];
  ASSERT_EQ(lost.size(), 1u) << "the second publisher's end";
  EXPECT_NE(lost[0].find(" WARN worker: "), std::string::npos) << lost[0];
  unlink(path.c_str());
}

// Both sides of the worker's TLS show their certificates' expiry: its listener's (server) and
// the one it dials kvdir with (client); tls_expiry_metrics_test covers rotation.
TEST(WorkerServerKvdirTest, ExportsTheExpiryOfItsCertificates) {
  const std::string certs = testing::MakeTestCerts("worker-tls-expiry");
  ASSERT_FALSE(certs.empty()) << "tools/gen-certs (run from the source tree) failed";
  auto weights = MakeRandomWeights(TinyTestConfig(), 3);
  auto tokenizer = MakeByteTokenizer();
  WorkerServerOptions o;
  o.grpc.listen_address = "127.0.0.1:0";
  o.grpc.tls = {.cert_file = certs + "/worker-0.crt",
                .key_file = certs + "/worker-0.key",
                .ca_file = certs + "/ca.crt"};
  o.metrics_address = "";
  o.engine = {.num_kv_blocks = 256, .max_batch_tokens = 64};
  o.service.worker_id = "worker-0";
  o.kvdir.emplace();
  o.kvdir->address = "127.0.0.1:1";  // never reached: the series come from the files
  o.kvdir->tls = o.grpc.tls;
  auto server = WorkerServer::Create(o, weights.get(), tokenizer.get());
  ASSERT_TRUE(server.ok()) << server.status();
  const absl::StatusOr<int64_t> cert =
      CertificateNotAfter(testing::ReadWholeFile(certs + "/worker-0.crt"));
  const absl::StatusOr<int64_t> ca = CertificateNotAfter(testing::ReadWholeFile(certs + "/ca.crt"));
  ASSERT_TRUE(cert.ok()) << cert.status();
  ASSERT_TRUE(ca.ok()) << ca.status();
  std::map<std::pair<std::string, std::string>, double> seen;  // (role, file) -> notAfter
  for (const prometheus::MetricFamily& f : (*server)->registry()->Collect()) {
    if (f.name != kTlsExpiryMetric) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& l : m.label) labels[l.name] = l.value;
      seen[{labels["role"], labels["file"]}] = m.gauge.value;
    }
  }
  const std::map<std::pair<std::string, std::string>, double> want = {
      {{"server", "cert"}, static_cast<double>(*cert)},
      {{"server", "ca"}, static_cast<double>(*ca)},
      {{"client", "cert"}, static_cast<double>(*cert)},
      {{"client", "ca"}, static_cast<double>(*ca)}};
  EXPECT_EQ(seen, want);
}

// A worker does not start with another role's certificate of the CA as its server certificate:
// routers accept a worker only through a lazyattn://worker/ one, so it would serve nobody.
TEST(WorkerServerKvdirTest, AnotherRolesServerCertificateStopsTheStart) {
  const std::string certs = testing::MakeTestCerts("worker-cert-role");
  ASSERT_FALSE(certs.empty()) << "tools/gen-certs (run from the source tree) failed";
  auto weights = MakeRandomWeights(TinyTestConfig(), 3);
  auto tokenizer = MakeByteTokenizer();
  for (const auto& [cert, role] :
       {std::pair<std::string, std::string>{"kvdir", "kvdir"}, {"router-0", "router"}}) {
    SCOPED_TRACE(cert);
    WorkerServerOptions o;
    o.grpc.listen_address = "127.0.0.1:0";
    o.grpc.tls = {.cert_file = absl::StrCat(certs, "/", cert, ".crt"),
                  .key_file = absl::StrCat(certs, "/", cert, ".key"),
                  .ca_file = certs + "/ca.crt"};
    o.metrics_address = "";
    o.engine = {.num_kv_blocks = 256, .max_batch_tokens = 64};
    auto server = WorkerServer::Create(o, weights.get(), tokenizer.get());
    ASSERT_FALSE(server.ok());
    EXPECT_EQ(ExitStatusForStartFailure(server.status()), 2) << server.status();
    const std::string message(server.status().message());
    EXPECT_NE(
        message.find(absl::StrCat("server.tls.cert_file: ", o.grpc.tls.cert_file,
                                  ": the certificate is lazyattn://", role, "/", cert, " (role ",
                                  role, "), but this server serves as role worker")),
        std::string::npos)
        << message;
  }
}

TEST(WorkerServerKvdirTest, PublishesTheEngineDocumentCache) {
  FakeKvdir kvdir;
  ASSERT_TRUE(kvdir.Start());
  auto weights = MakeRandomWeights(TinyTestConfig(), 3);
  auto tokenizer = MakeByteTokenizer();
  WorkerServerOptions o;
  o.grpc.listen_address = "127.0.0.1:0";
  o.metrics_address = "";
  o.engine = {.num_kv_blocks = 256, .max_batch_tokens = 64};
  o.service.worker_id = "w-publish";
  o.kvdir.emplace();
  o.kvdir->address = kvdir.address();
  o.kvdir->min_backoff = absl::Milliseconds(20);
  auto server = WorkerServer::Create(o, weights.get(), tokenizer.get());
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(kvdir.WaitFor([](const Messages& ms) { return !ms.empty(); }));
  const v1::WorkerMessage hello = kvdir.messages().front();
  ASSERT_TRUE(hello.has_hello());
  EXPECT_EQ(hello.hello().status().worker_id(), "w-publish");
  EXPECT_EQ(hello.hello().status().address(), (*server)->address());
  EXPECT_EQ(hello.hello().status().load().total_blocks(), 256);
  EXPECT_FALSE(hello.hello().status().model().model_fingerprint().empty());
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!(*server)->publisher()->stats().connected && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(2));
  }

  EngineRequest r;
  r.documents = {{.text = "first document text"}, {.text = "second document, a bit longer"}};
  r.question = "q";
  r.sampling.max_tokens = 2;
  ASSERT_TRUE((*server)->engine().Run(r).ok());
  ASSERT_TRUE(kvdir.WaitFor(
      [](const Messages& ms) { return Count(ms, v1::WorkerMessage::kEvent) == 2; }));
  int64_t tokens = 0;
  for (const auto& m : kvdir.messages()) {
    if (!m.has_event()) continue;
    EXPECT_EQ(m.event().kind(), v1::DocEvent::STORED);
    EXPECT_EQ(m.event().entry().offset(), -1);  // lazy: any position
    tokens += m.event().entry().tokens();
  }
  EXPECT_EQ(tokens, static_cast<int64_t>(std::string("first document text").size() +
                                         std::string("second document, a bit longer").size()));
  ExpectContiguousSeq(kvdir.messages());
  server->reset();  // half-closes the stream before the fake goes away
}

// kvdir refuses every hello of a worker whose id is not 1-255 of [A-Za-z0-9._:[]-], and the
// worker, alive and healthy, then never got a request routed by the directory, with one warning in
// its log. A publishing worker does not start with such an id, whether set (worker.id) or taken
// from its advertised address; a standalone one has no directory to refuse it.
TEST(WorkerServerKvdirTest, AnIdKvdirWouldRefuseStopsTheStart) {
  auto weights = MakeRandomWeights(TinyTestConfig(), 3);
  auto tokenizer = MakeByteTokenizer();
  auto start = [&](const std::string& id, const std::string& advertised, bool publishes) {
    WorkerServerOptions o;
    o.grpc.listen_address = "127.0.0.1:0";
    o.metrics_address = "";
    o.engine = {.num_kv_blocks = 256, .max_batch_tokens = 64};
    o.service.worker_id = id;
    o.advertise_address = advertised;
    if (publishes) o.kvdir = KvdirPublisherOptions{.address = "127.0.0.1:9"};
    return WorkerServer::Create(o, weights.get(), tokenizer.get());
  };
  for (const auto& [id, advertised] : {std::pair<std::string, std::string>{"w0/a", ""},
                                       {std::string(256, 'w'), ""},
                                       {"", "dns:///w0.example:7200"}}) {
    SCOPED_TRACE(id + " " + advertised);
    auto refused = start(id, advertised, /*publishes=*/true);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("worker.id: "), std::string::npos)
        << refused.status();
    EXPECT_TRUE(start(id, advertised, /*publishes=*/false).ok()) << "standalone";
  }
  EXPECT_TRUE(start("worker-0.lazyattn:7200", "", /*publishes=*/true).ok());
  EXPECT_TRUE(start("", "[::1]:7200", /*publishes=*/true).ok());
}

}  // namespace
}  // namespace lazyattn
