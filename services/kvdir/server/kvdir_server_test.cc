// The directory over real gRPC on 127.0.0.1 (port 0; one test on [::] to see two peer hosts): a
// test client plays a worker on a Publish stream and a router on Lookup / ListWorkers. Stream
// handling is asynchronous to lookups, so checks that depend on it wait in a bounded loop; ordering
// on the stream makes a later message's visibility prove that earlier ones were handled.
#include "services/kvdir/server/kvdir_server.h"

#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/metric_family.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/kvdir_stream_trailer.h"
#include "lazyattn/v1/kvdir.grpc.pb.h"

namespace lazyattn::kvdir {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kWaitLimit = absl::Seconds(3);

// Polls `cond` every 2 ms until it holds or kWaitLimit passes.
bool WaitFor(const std::function<bool()>& cond) {
  const absl::Time deadline = absl::Now() + kWaitLimit;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return cond();
}

v1::DocKey Key(uint64_t n) {
  v1::DocKey k;
  k.set_hi(n);
  k.set_lo(~n);
  return k;
}

v1::DocEntry Entry(uint64_t key, int64_t tokens, int64_t offset = -1) {
  v1::DocEntry e;
  *e.mutable_key() = Key(key);
  e.set_tokens(tokens);
  e.set_offset(offset);
  return e;
}

// A worker's side of Publish, with the sync client API and a deadline so nothing hangs.
class FakeWorker {
 public:
  FakeWorker(v1::KvDirectory::Stub* stub, std::string id) : id_(std::move(id)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    stream_ = stub->Publish(&ctx_);
  }

  bool Send(v1::WorkerMessage m) {
    m.set_seq(next_seq_++);
    return stream_->Write(m);
  }
  void SkipSeq() { ++next_seq_; }
  uint64_t next_seq() const { return next_seq_; }

  // `address`: the advertised one; empty: ID:7000.
  bool Hello(uint64_t epoch = 1, const std::string& address = "") {
    v1::WorkerMessage m;
    m.mutable_hello()->mutable_status()->set_worker_id(id_);
    m.mutable_hello()->mutable_status()->set_address(address.empty() ? id_ + ":7000" : address);
    m.mutable_hello()->set_epoch(epoch);
    return Send(m);
  }
  bool Stored(uint64_t key, int64_t tokens) {
    v1::WorkerMessage m;
    m.mutable_event()->set_kind(v1::DocEvent::STORED);
    *m.mutable_event()->mutable_entry() = Entry(key, tokens);
    return Send(m);
  }
  bool Heartbeat(int32_t running = 0) {
    v1::WorkerMessage m;
    m.mutable_heartbeat()->mutable_load()->set_running_requests(running);
    return Send(m);
  }
  bool Snapshot(const std::vector<v1::DocEntry>& entries) {
    v1::WorkerMessage m;
    v1::Snapshot* snapshot = m.mutable_snapshot();  // set even when empty
    for (const auto& e : entries) *snapshot->add_entries() = e;
    return Send(m);
  }
  // Hello, then the LeaseGrant and SnapshotRequest it brings, then the snapshot.
  void Join(const std::vector<v1::DocEntry>& entries, uint64_t epoch = 1,
            const std::string& address = "") {
    ASSERT_TRUE(Hello(epoch, address));
    v1::DirectoryMessage m;
    ASSERT_TRUE(Read(&m));
    ASSERT_TRUE(m.has_lease());
    ASSERT_TRUE(Read(&m));
    ASSERT_TRUE(m.has_snapshot_request());
    ASSERT_TRUE(Snapshot(entries));
  }

  bool Read(v1::DirectoryMessage* m) { return stream_->Read(m); }

  // Half-closes, drains what kvdir still sends, returns the stream's final status.
  grpc::Status Close() {
    stream_->WritesDone();
    return Drain();
  }
  // Waits for kvdir to end the stream.
  grpc::Status Drain() {
    v1::DirectoryMessage m;
    while (stream_->Read(&m)) {
    }
    return stream_->Finish();
  }
  // A trailing metadata value of the ended stream ("" when absent).
  std::string Trailer(const std::string& key) {
    const auto& trailers = ctx_.GetServerTrailingMetadata();
    auto it = trailers.find(key);
    return it == trailers.end() ? "" : std::string(it->second.data(), it->second.size());
  }

 private:
  std::string id_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::DirectoryMessage>> stream_;
  uint64_t next_seq_ = 1;
};

class KvdirServerTest : public ::testing::Test {
 protected:
  void Start(int64_t lease_ms = 3000, int max_keys = 1024) {
    KvdirOptions options;
    options.lease_ms = lease_ms;
    options.limits.max_keys_per_lookup = max_keys;
    StartWith(options);
  }
  // `listen_address`: with port 0; the test's own stub dials 127.0.0.1.
  void StartWith(KvdirOptions options, const std::string& listen_address = "127.0.0.1:0") {
    options.listen_address = listen_address;
    options.metrics_address = "";
    auto server = KvdirServer::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::KvDirectory::NewStub(channel_);
  }

  grpc::Status Lookup(const std::vector<uint64_t>& keys, v1::LookupResponse* response) {
    v1::LookupRequest request;
    for (uint64_t k : keys) *request.add_keys() = Key(k);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub_->Lookup(&ctx, request, response);
  }
  // worker id -> resident tokens of `keys`; empty on an RPC error.
  std::vector<std::pair<std::string, int64_t>> Tokens(const std::vector<uint64_t>& keys) {
    v1::LookupResponse response;
    std::vector<std::pair<std::string, int64_t>> out;
    if (!Lookup(keys, &response).ok()) return out;
    for (const auto& w : response.workers()) {
      out.emplace_back(w.worker().worker_id(), w.resident_tokens());
    }
    return out;
  }
  std::vector<std::string> LiveWorkers() {
    v1::ListWorkersResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    std::vector<std::string> out;
    if (!stub_->ListWorkers(&ctx, {}, &response).ok()) return {"<rpc failed>"};
    for (const auto& w : response.workers()) out.push_back(w.worker().worker_id());
    return out;
  }
  // The value of a counter or gauge child with the given label (or the unlabelled one).
  double MetricValue(const std::string& name, const std::string& label_value = "") {
    for (const prometheus::MetricFamily& f : server_->registry()->Collect()) {
      if (f.name != name) continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        if (!label_value.empty() && (m.label.empty() || m.label[0].value != label_value)) continue;
        return f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
      }
    }
    return -1;
  }

  std::unique_ptr<KvdirServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvDirectory::Stub> stub_;
};

using Pair = std::pair<std::string, int64_t>;

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
  EXPECT_GT(response.workers(0).last_seen_unix_ms(), 0);
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

TEST_F(KvdirServerTest, ClosedStreamAndLeaseExpiryRemoveTheWorker) {
  Start(/*lease_ms=*/200);
  FakeWorker w(stub_.get(), "w1");
  w.Join({Entry(1, 100)});
  // Heartbeat while waiting so a slow machine cannot let the short lease lapse here.
  ASSERT_TRUE(WaitFor([&] {
    w.Heartbeat();
    return Tokens({1}) == std::vector<Pair>{{"w1", 100}};
  }));
  EXPECT_TRUE(w.Close().ok());

  EXPECT_TRUE(WaitFor([&] { return LiveWorkers().empty(); })) << "lease never expired";
  EXPECT_TRUE(Tokens({1}).empty());
  // The sweeper removed the entries too, not only hid the worker.
  EXPECT_TRUE(WaitFor([&] {
    return MetricValue("lazyattn_kvdir_leases_expired_total") == 1 &&
           MetricValue("lazyattn_kvdir_documents_tracked") == 0 &&
           MetricValue("lazyattn_kvdir_workers_alive") == 0;
  }));
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

// Two live processes with one worker id (a copied --worker-id): the second is refused naming
// the id and where it runs, instead of the two taking the id from each other in turn.
TEST_F(KvdirServerTest, ASecondLiveWorkerWithTheSameIdIsRefusedAndTheFirstKeepsWorking) {
  Start();
  FakeWorker holder(stub_.get(), "w1");
  holder.Join({Entry(1, 10)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1}) == std::vector<Pair>{{"w1", 10}}; }));

  FakeWorker copy(stub_.get(), "w1");
  ASSERT_TRUE(copy.Hello(/*epoch=*/2, "10.0.0.9:7000"));
  const grpc::Status s = copy.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("hello.status.worker_id: \"w1\" is held by a live "
                                           "worker at w1:7000"));
  EXPECT_THAT(s.error_message(), HasSubstr("10.0.0.9:7000"));
  EXPECT_THAT(s.error_message(), HasSubstr("own worker id"));
  EXPECT_EQ(copy.Trailer(kWorkerIdHolderKey), "w1:7000");
  EXPECT_EQ(MetricValue("lazyattn_kvdir_hellos_refused_total", "worker_id_in_use"), 1);
  EXPECT_EQ(MetricValue("lazyattn_kvdir_hellos_refused_total", "not_certificate_id"), 0);

  // The holder's session, address and entries are intact: its next event and heartbeat are
  // applied (a replaced session would have its stream ended ABORTED), and it closes cleanly.
  ASSERT_TRUE(holder.Stored(2, 20));
  ASSERT_TRUE(holder.Heartbeat(/*running=*/5));
  ASSERT_TRUE(WaitFor([&] {
    v1::LookupResponse r;
    return Lookup({1, 2}, &r).ok() && r.workers_size() == 1 &&
           r.workers(0).resident_tokens() == 30 &&
           r.workers(0).worker().load().running_requests() == 5;
  }));
  v1::LookupResponse r;
  ASSERT_TRUE(Lookup({1, 2}, &r).ok());
  ASSERT_EQ(r.workers_size(), 1);
  EXPECT_EQ(r.workers(0).worker().address(), "w1:7000");
  EXPECT_TRUE(holder.Close().ok());

  // Once the holder is gone the other process takes the id over at once (its retry).
  FakeWorker retry(stub_.get(), "w1");
  retry.Join({Entry(3, 30)}, /*epoch=*/2, "10.0.0.9:7000");
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2, 3}) == std::vector<Pair>{{"w1", 30}}; }));
  ASSERT_TRUE(Lookup({}, &r).ok());
  ASSERT_EQ(r.workers_size(), 1);
  EXPECT_EQ(r.workers(0).worker().address(), "10.0.0.9:7000");
  EXPECT_TRUE(retry.Close().ok());
}

// Whether this machine has an IPv6 loopback (containers may run without one).
bool HaveIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// Two copies that also advertise one address (a compose service scaled to two: both say
// w1:7000) on two hosts: the hosts their streams come from tell them apart. To kvdir listening
// on [::], a client dialling 127.0.0.1 and one dialling [::1] are two peer hosts (127.0.0.2 would
// not do: Linux connects to it from 127.0.0.1).
TEST_F(KvdirServerTest, ACopyAdvertisingTheHoldersAddressFromAnotherHostIsRefused) {
  if (!HaveIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback to connect from a second host";
  StartWith(KvdirOptions{}, "[::]:0");
  FakeWorker holder(stub_.get(), "w1");  // from 127.0.0.1
  holder.Join({Entry(1, 10)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1}) == std::vector<Pair>{{"w1", 10}}; }));

  auto other_host = v1::KvDirectory::NewStub(grpc::CreateChannel(
      absl::StrCat("[::1]:", server_->port()), grpc::InsecureChannelCredentials()));
  FakeWorker copy(other_host.get(), "w1");
  ASSERT_TRUE(copy.Hello(/*epoch=*/2));  // the holder's address, w1:7000
  const grpc::Status s = copy.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("\"w1\" is held by a live worker at w1:7000 (connected from 127.0.0.1); "
                        "this hello came from w1:7000 (connected from [::1]): two processes "
                        "advertise one address from two hosts"));
  EXPECT_THAT(s.error_message(), HasSubstr("own worker id"));
  EXPECT_EQ(copy.Trailer(kWorkerIdHolderKey), "w1:7000");
  EXPECT_EQ(MetricValue("lazyattn_kvdir_hellos_refused_total", "worker_id_in_use"), 1);

  // The holder keeps its session and entries: its next event is applied, it closes cleanly.
  ASSERT_TRUE(holder.Stored(2, 20));
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2}) == std::vector<Pair>{{"w1", 30}}; }));
  EXPECT_TRUE(holder.Close().ok());

  // Once the holder is gone the copy on the other host takes the id over (its retry).
  FakeWorker retry(other_host.get(), "w1");
  retry.Join({Entry(3, 30)}, /*epoch=*/2);
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2, 3}) == std::vector<Pair>{{"w1", 30}}; }));
  EXPECT_TRUE(retry.Close().ok());
}

TEST_F(KvdirServerTest, LookupWithTooManyKeysIsInvalidArgumentNamingKeys) {
  Start(/*lease_ms=*/3000, /*max_keys=*/4);
  v1::LookupResponse response;
  EXPECT_TRUE(Lookup({1, 2, 3, 4}, &response).ok());
  const grpc::Status s = Lookup({1, 2, 3, 4, 5}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("keys"));
  EXPECT_THAT(s.error_message(), HasSubstr("at most 4"));
}

// The request's mode and offsets decide what counts as resident (docs/kvdir.md).
TEST_F(KvdirServerTest, LookupCountsOnlyEntriesTheRequestsModeReuses) {
  Start();
  FakeWorker w(stub_.get(), "w1");
  w.Join({Entry(1, 100, 37), Entry(2, 50)});  // key 1 in block mode at 37, key 2 position-free
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2}) == std::vector<Pair>{{"w1", 150}}; }));
  auto lookup = [&](v1::CacheMode mode, std::vector<int64_t> offsets) {
    v1::LookupRequest request;
    *request.add_keys() = Key(1);
    *request.add_keys() = Key(2);
    request.set_mode(mode);
    for (int64_t o : offsets) request.add_offsets(o);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::LookupResponse response;
    const grpc::Status s = stub_->Lookup(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (response.workers_size() != 1) {
      return absl::StrCat("workers: ", response.workers_size());
    }
    std::string out = std::to_string(response.workers(0).resident_tokens());
    for (bool b : response.workers(0).resident()) out += b ? " 1" : " 0";
    return out;
  };
  EXPECT_EQ(lookup(v1::CACHE_MODE_LAZY, {}), "50 0 1");
  EXPECT_EQ(lookup(v1::CACHE_MODE_BLOCK, {37, 2048}), "100 1 0");
  EXPECT_EQ(lookup(v1::CACHE_MODE_BLOCK, {0, 37}), "0 0 0");
  EXPECT_EQ(lookup(v1::CACHE_MODE_BLOCK, {}), "0 0 0");
  EXPECT_EQ(lookup(v1::CACHE_MODE_PREFIX, {}), "0 0 0");
  EXPECT_EQ(lookup(v1::CACHE_MODE_UNSPECIFIED, {}), "150 1 1");
  EXPECT_TRUE(w.Close().ok());
}

TEST_F(KvdirServerTest, LookupWithBadOffsetsOrModeIsInvalidArgumentNamingTheField) {
  Start();
  auto status = [&](int mode, std::vector<int64_t> offsets) {
    v1::LookupRequest request;
    *request.add_keys() = Key(1);
    *request.add_keys() = Key(2);
    request.set_mode(static_cast<v1::CacheMode>(mode));
    for (int64_t o : offsets) request.add_offsets(o);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::LookupResponse response;
    return stub_->Lookup(&ctx, request, &response);
  };
  grpc::Status s = status(v1::CACHE_MODE_BLOCK, {0});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("offsets: 1 offsets for 2 keys"));
  s = status(v1::CACHE_MODE_BLOCK, {0, -2});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("offsets[1]"));
  s = status(99, {});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("mode: unknown cache mode 99"));
  EXPECT_TRUE(status(v1::CACHE_MODE_BLOCK, {-1, 0}).ok());
}

TEST_F(KvdirServerTest, FirstMessageMustBeHello) {
  Start();
  FakeWorker w(stub_.get(), "w1");
  w.Heartbeat();
  const grpc::Status s = w.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("hello"));
}

TEST_F(KvdirServerTest, MalformedMessagesEndTheStreamNamingTheField) {
  Start();
  {
    FakeWorker w(stub_.get(), "");
    w.Hello();
    const grpc::Status s = w.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("hello.status.worker_id"));
  }
  {
    FakeWorker w(stub_.get(), "w1");
    w.Join({});
    v1::WorkerMessage m;
    m.mutable_event()->set_kind(v1::DocEvent::KIND_UNSPECIFIED);
    w.Send(m);
    const grpc::Status s = w.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("event.kind"));
  }
  {
    FakeWorker w(stub_.get(), "w2");
    w.Join({Entry(1, 10), Entry(2, -5)});
    const grpc::Status s = w.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("snapshot.entries[1].tokens"));
  }
  // Both workers stay registered (their leases run), holding nothing: no bad entry was applied.
  EXPECT_THAT(Tokens({1}), ElementsAre(Pair("w1", 0), Pair("w2", 0)));
}

TEST_F(KvdirServerTest, ShutdownEndsOpenStreamsSoWorkersReconnect) {
  Start();
  FakeWorker w(stub_.get(), "w1");
  w.Join({Entry(1, 10)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1}) == std::vector<Pair>{{"w1", 10}}; }));
  const absl::Time start = absl::Now();
  server_->Shutdown();  // must not wait for the worker to hang up
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_FALSE(w.Drain().ok());
}

TEST_F(KvdirServerTest, BadOptionsAreRejectedNamingTheOption) {
  KvdirOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "";
  options.lease_ms = 0;
  auto server = KvdirServer::Create(options);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("lease_ms"));
}

TEST_F(KvdirServerTest, MetricsEndpointBindsAnOsChosenPort) {
  KvdirOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "127.0.0.1:0";
  auto server = KvdirServer::Create(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->metrics_port(), 0);
}

TEST_F(KvdirServerTest, BoundsEndTheStreamNamingTheLimitAndAreCounted) {
  KvdirOptions options;
  options.limits.max_workers = 1;
  options.limits.max_entries_per_worker = 3;
  options.limits.max_worker_id_length = 8;
  StartWith(options);
  FakeWorker w1(stub_.get(), "w1");
  w1.Join({Entry(1, 10), Entry(2, 20), Entry(3, 30)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2, 3}) == std::vector<Pair>{{"w1", 60}}; }));

  // A second worker when one is the maximum.
  FakeWorker w2(stub_.get(), "w2");
  ASSERT_TRUE(w2.Hello());
  grpc::Status s = w2.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("limits.max_workers 1"));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_workers"), 1);
  EXPECT_THAT(LiveWorkers(), ElementsAre("w1"));

  // Replacing an entry it holds is fine at the bound; a fourth entry is not, and drops them all.
  v1::WorkerMessage replace;
  replace.mutable_event()->set_kind(v1::DocEvent::STORED);
  *replace.mutable_event()->mutable_entry() = Entry(3, 31);
  ASSERT_TRUE(w1.Send(replace));
  ASSERT_TRUE(WaitFor([&] { return Tokens({3}) == std::vector<Pair>{{"w1", 31}}; }));
  ASSERT_TRUE(w1.Stored(4, 40));
  s = w1.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("event.stored"));
  EXPECT_THAT(s.error_message(), HasSubstr("limits.max_entries_per_worker (3)"));
  EXPECT_THAT(Tokens({1, 2, 3, 4}), ElementsAre(Pair("w1", 0)));  // registered, holding nothing
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_entries_per_worker"), 1);

  // A snapshot larger than the bound is refused whole.
  FakeWorker again(stub_.get(), "w1");
  again.Join({Entry(1, 1), Entry(2, 2), Entry(3, 3), Entry(4, 4)});
  s = again.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("snapshot.entries: 4 entries"));
  EXPECT_THAT(Tokens({1, 2, 3, 4}), ElementsAre(Pair("w1", 0)));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_entries_per_worker"), 2);

  // Worker ids: too long, or outside the charset.
  for (const std::string& id : std::vector<std::string>{"worker-123", "w 1", std::string("w\0x", 3), "w/1"}) {
    FakeWorker bad(stub_.get(), id);
    ASSERT_TRUE(bad.Hello());
    s = bad.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    EXPECT_THAT(s.error_message(), HasSubstr("hello.status.worker_id: expected 1 to 8"));
  }
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "worker_id"), 4);
  // Host:port ids (a worker's default) and bracketed IPv6 pass the charset.
  KvdirOptions wide;
  wide.limits.max_worker_id_length = 64;
  server_.reset();
  StartWith(wide);
  FakeWorker hostport(stub_.get(), "[::1]:7201");
  hostport.Join({});
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers() == std::vector<std::string>{"[::1]:7201"}; }));
  EXPECT_TRUE(hostport.Close().ok());
}

TEST_F(KvdirServerTest, ReflectionOnlyWhenConfigured) {
  for (bool reflection : {false, true}) {
    KvdirOptions options;
    options.reflection = reflection;
    server_.reset();
    StartWith(options);
    // ServerReflectionInfo is a bidi stream; an unregistered method ends UNIMPLEMENTED at once.
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::CompletionQueue cq;
    auto call = generic.PrepareCall(
        &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
    void* tag = nullptr;
    bool ok = false;
    call->StartCall(reinterpret_cast<void*>(1));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    // list_services: field 7 (string), empty.
    grpc::Slice slice(std::string("\x3a\x00", 2));
    grpc::ByteBuffer request(&slice, 1);
    call->Write(request, reinterpret_cast<void*>(2));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    grpc::ByteBuffer response;
    call->Read(&response, reinterpret_cast<void*>(3));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    const bool answered = ok;
    std::string text;
    if (answered) {
      std::vector<grpc::Slice> slices;
      ASSERT_TRUE(response.Dump(&slices).ok());
      for (const auto& sl : slices) text.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    if (answered) ctx.TryCancel();  // reflection would keep the stream open for more
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(4));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    if (reflection) {
      EXPECT_TRUE(answered);
      EXPECT_THAT(text, HasSubstr("lazyattn.v1.KvDirectory"));
    } else {
      EXPECT_FALSE(answered);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
    }
  }
}

}  // namespace
}  // namespace lazyattn::kvdir
