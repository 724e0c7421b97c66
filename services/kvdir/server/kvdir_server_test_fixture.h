// Shared by the KV directory server tests (kvdir_server_*_test.cc): the directory over real gRPC
// on 127.0.0.1 (port 0), a test client that plays a worker on a Publish stream (FakeWorker), and
// KvdirServerTest, which plays a router on Lookup / ListWorkers and reads the server's metrics.
// Stream handling is asynchronous to lookups, so checks that depend on it wait in a bounded loop
// (WaitFor); ordering on the stream makes a later message's visibility prove that earlier ones
// were handled.
#ifndef LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_SERVER_TEST_FIXTURE_H_
#define LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_SERVER_TEST_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/metric_family.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lazyattn/v1/kvdir.grpc.pb.h"
#include "services/kvdir/server/kvdir_server.h"

namespace lazyattn::kvdir::testing {

inline constexpr absl::Duration kWaitLimit = absl::Seconds(3);

// Polls `cond` every 2 ms until it holds or kWaitLimit passes.
inline bool WaitFor(const std::function<bool()>& cond) {
  const absl::Time deadline = absl::Now() + kWaitLimit;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return cond();
}

inline v1::DocKey Key(uint64_t n) {
  v1::DocKey k;
  k.set_hi(n);
  k.set_lo(~n);
  return k;
}

inline v1::DocEntry Entry(uint64_t key, int64_t tokens, int64_t offset = -1) {
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
  // Goes away without a half-close (a crash, a cut connection): the stream is cancelled.
  grpc::Status Cancel() {
    ctx_.TryCancel();
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

// Outside an anonymous namespace: the tests of one fixture in several files must share its type.
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

}  // namespace lazyattn::kvdir::testing

#endif  // LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_SERVER_TEST_FIXTURE_H_
