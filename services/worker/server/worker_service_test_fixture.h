// Shared by the Worker service tests (worker_service_*_test.cc): a real gRPC server on 127.0.0.1
// over random weights (a tiny model, and a slower one whose long generations last seconds so that
// cancellations and deadlines land mid-stream), a client stub, three documents, and readers for
// the stream, the status and the metrics.
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_WORKER_SERVICE_TEST_FIXTURE_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_WORKER_SERVICE_TEST_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"
#include "services/worker/server/worker_server.h"

namespace lazyattn::testing {

// Big enough that one decode step takes a while on a CPU (a long generation lasts seconds), so
// cancellations and deadlines land mid-stream.
inline ModelConfig SlowTestConfig() {
  ModelConfig c = TinyTestConfig();
  c.name = "slow-test";
  c.hidden_size = 512;
  c.intermediate_size = 1024;
  c.num_layers = 4;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.rope = RopeParams{.head_dim = 64, .theta = 10000};
  return c;
}

// Value of the counter or gauge child that has `labels` (among others, such as the family's
// constant `model` label), or -1 when absent.
inline double MetricValue(prometheus::Registry& registry, const std::string& name,
                          const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::map<std::string, std::string> have;
      for (const auto& l : m.label) have[l.name] = l.value;
      const bool match = std::all_of(labels.begin(), labels.end(), [&](const auto& want) {
        auto it = have.find(want.first);
        return it != have.end() && it->second == want.second;
      });
      if (!match) continue;
      return f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  return -1;
}

inline v1::Document TextDoc(const std::string& text) {
  v1::Document d;
  d.set_text(text);
  return d;
}

struct StreamResult {
  grpc::Status status;
  std::vector<v1::TokenChunk> chunks;
  std::optional<v1::Final> final;
  std::string text;  // of the chunks
};

// Outside an anonymous namespace: the tests of one fixture in several files must share its type.
class WorkerServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tiny_weights_ = MakeRandomWeights(TinyTestConfig(), 11).release();
    slow_weights_ = MakeRandomWeights(SlowTestConfig(), 12).release();
    tokenizer_ = MakeByteTokenizer().release();
  }
  static void TearDownTestSuite() {
    delete tiny_weights_;
    delete slow_weights_;
    delete tokenizer_;
  }

  void StartServer(bool slow = false, int max_documents = 4, int max_buffered_tokens = 1024,
                   PrepPoolOptions prep = {}) {
    WorkerServerOptions o;
    o.service.prep = prep;
    o.grpc.listen_address = "127.0.0.1:0";
    o.metrics_address = "";
    o.engine = {.num_kv_blocks = 512, .max_batch_tokens = 64, .max_running = max_running_};
    o.limits.max_documents = max_documents;
    o.service.worker_id = "worker-under-test";
    o.service.max_buffered_tokens = max_buffered_tokens;
    o.service.after_submit_for_test = after_submit_for_test_;
    o.shutdown_grace = absl::Seconds(2);
    o.drain_timeout = drain_timeout_;
    o.drain_announce = drain_announce_;
    auto server = WorkerServer::Create(o, slow ? slow_weights_ : tiny_weights_, tokenizer_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Worker::NewStub(channel_);
  }

  static v1::GenerateRequest Request(std::vector<std::string> docs, int max_tokens) {
    v1::GenerateRequest r;
    r.set_system("system: answer from the documents\n");
    for (const std::string& d : docs) *r.add_documents() = TextDoc(d);
    r.set_question("what do they say?");
    r.mutable_sampling()->set_max_tokens(max_tokens);
    r.mutable_sampling()->set_ignore_eos(true);
    r.set_cache_mode(v1::CACHE_MODE_LAZY);
    return r;
  }

  StreamResult Generate(const v1::GenerateRequest& request) {
    grpc::ClientContext ctx;
    StreamResult out;
    auto reader = stub_->Generate(&ctx, request);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
      if (m.has_token()) {
        out.chunks.push_back(m.token());
        out.text += m.token().text();
      } else if (m.has_final()) {
        out.final = m.final();
      }
    }
    out.status = reader->Finish();
    return out;
  }

  v1::WorkerStatus Status() {
    grpc::ClientContext ctx;
    v1::WorkerStatus s;
    EXPECT_TRUE(stub_->Status(&ctx, {}, &s).ok());
    return s;
  }

  // Every engine request ended and the KV pool is back to idle: nothing referenced, invariants.
  void ExpectIdle() {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (server_->service().in_flight() > 0 && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(server_->service().in_flight(), 0u);
    ASSERT_TRUE(server_->engine().WaitIdleAndCheck().ok());
    const v1::WorkerStatus s = Status();
    EXPECT_EQ(s.referenced_blocks(), 0);
    EXPECT_EQ(s.load().running_requests(), 0);
    EXPECT_EQ(s.load().waiting_requests(), 0);
    EXPECT_EQ(s.load().queued_prefill_tokens(), 0);
  }

  double Requests(const std::string& status) {
    return MetricValue(*server_->registry(), "lazyattn_worker_requests_total",
                       {{"status", status}});
  }

  static inline ModelWeights* tiny_weights_ = nullptr;
  static inline ModelWeights* slow_weights_ = nullptr;
  static inline Tokenizer* tokenizer_ = nullptr;
  // Set before StartServer: WorkerServerOptions::drain_timeout and EngineOptions::max_running.
  absl::Duration drain_timeout_ = absl::Seconds(30);
  absl::Duration drain_announce_ = WorkerServerOptions().drain_announce;
  int max_running_ = 8;
  // Set before StartServer: WorkerServiceOptions::after_submit_for_test.
  std::function<void()> after_submit_for_test_;
  std::unique_ptr<WorkerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

inline const std::vector<std::string> kDocs = {
    "The warehouse in Lyon ships orders within two days.",
    "Returns are accepted for thirty days with a receipt.",
    "Support answers by email from nine to five on weekdays."};

}  // namespace lazyattn::testing

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_WORKER_SERVICE_TEST_FIXTURE_H_
