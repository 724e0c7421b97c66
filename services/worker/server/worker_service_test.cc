// The Worker service over a real gRPC server on 127.0.0.1 and a random model: streaming, document
// reuse in any order, validation, cancellation, deadlines, Prefetch, Status and shutdown.
#include "services/worker/server/worker_service.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/worker_call_trailer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/server/worker_server.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;

// Big enough that one decode step takes a while on a CPU (a long generation lasts seconds), so
// cancellations and deadlines land mid-stream.
ModelConfig SlowTestConfig() {
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
double MetricValue(prometheus::Registry& registry, const std::string& name,
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

v1::Document TextDoc(const std::string& text) {
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
    o.engine = {.num_kv_blocks = 512, .max_batch_tokens = 64, .max_running = 8};
    o.limits.max_documents = max_documents;
    o.service.worker_id = "worker-under-test";
    o.service.max_buffered_tokens = max_buffered_tokens;
    o.shutdown_grace = absl::Seconds(2);
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

  static ModelWeights* tiny_weights_;
  static ModelWeights* slow_weights_;
  static Tokenizer* tokenizer_;
  std::unique_ptr<WorkerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

ModelWeights* WorkerServiceTest::tiny_weights_ = nullptr;
ModelWeights* WorkerServiceTest::slow_weights_ = nullptr;
Tokenizer* WorkerServiceTest::tokenizer_ = nullptr;

const std::vector<std::string> kDocs = {
    "The warehouse in Lyon ships orders within two days.",
    "Returns are accepted for thirty days with a receipt.",
    "Support answers by email from nine to five on weekdays."};

TEST_F(WorkerServiceTest, StreamsTokensThenFinalWithUsage) {
  StartServer();
  const StreamResult r = Generate(Request(kDocs, 8));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  int tokens = 0;
  for (const v1::TokenChunk& c : r.chunks) tokens += c.token_id() >= 0 ? 1 : 0;
  EXPECT_EQ(tokens, 8);
  ASSERT_TRUE(r.final.has_value());
  EXPECT_EQ(r.final->finish_reason(), "length");
  EXPECT_EQ(r.final->worker(), "worker-under-test");
  EXPECT_EQ(r.final->attempts(), 1);
  EXPECT_EQ(r.final->text(), r.text);
  EXPECT_GT(r.final->ttft_ms(), 0);
  const v1::Usage& u = r.final->usage();
  EXPECT_EQ(u.completion_tokens(), 8);
  EXPECT_EQ(u.documents(), 3);
  EXPECT_EQ(u.documents_hit(), 0);
  EXPECT_GT(u.prompt_tokens(), 150);  // three byte-tokenized documents
  EXPECT_EQ(u.prompt_tokens(), u.cached_tokens() + u.computed_tokens());
  ExpectIdle();
  server_->RefreshMetrics();
  EXPECT_EQ(Requests("ok"), 1);
  EXPECT_GT(MetricValue(*server_->registry(), "lazyattn_worker_prefill_tokens_total",
                        {{"kind", "computed"}}),
            150);
}

// The router sends its request id as x-request-id metadata (forwarding_call.cc); the worker's
// own lines about that request carry it, so one search finds the request at both ends.
TEST_F(WorkerServiceTest, LogLinesAboutARequestCarryTheRoutersRequestId) {
  StartServer();
  const std::string path = absl::StrCat(::testing::TempDir(), "/worker-log-", getpid());
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  SetLogSinkForTest(fd);
  const auto generate = [&](const std::string& id, const v1::GenerateRequest& request) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kRequestIdKey, id);
    auto reader = stub_->Generate(&ctx, request);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  };
  const grpc::Status served = generate("router-req-4711", Request(kDocs, 2));
  v1::GenerateRequest bad = Request(kDocs, 2);
  bad.mutable_documents(1)->set_text("");
  const grpc::Status refused = generate("router-req-4712", bad);
  SetLogSinkForTest(STDERR_FILENO);
  close(fd);
  EXPECT_TRUE(served.ok()) << served.error_message();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  std::string served_line, refused_line, line;
  std::ifstream in(path);
  while (std::getline(in, line)) {
    if (line.find("request_id=router-req-4711") != std::string::npos) served_line = line;
    if (line.find("request_id=router-req-4712") != std::string::npos) refused_line = line;
  }
  EXPECT_THAT(served_line, HasSubstr(" worker: request "));
  EXPECT_THAT(served_line, HasSubstr("status=ok"));
  EXPECT_THAT(served_line, HasSubstr("tokens=2"));
  EXPECT_THAT(refused_line, HasSubstr("request refused"));
  EXPECT_THAT(refused_line, HasSubstr("status=invalid_argument"));
  EXPECT_THAT(refused_line, HasSubstr("documents[1]"));
  ExpectIdle();
}

// The router names the model it routed a call for; a worker holding other weights (restarted with
// a new model at the same address) refuses with UNAVAILABLE, which the router fails over.
TEST_F(WorkerServiceTest, RefusesCallsRoutedForAnotherModel) {
  StartServer();
  v1::WorkerStatus status;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Status(&ctx, v1::WorkerStatusRequest(), &status).ok());
  }
  const std::string mine = ExpectedModelValue(status.model().model_fingerprint(),
                                              status.model().tokenizer_fingerprint());
  const auto generate = [&](const std::string& expected) {
    grpc::ClientContext ctx;
    if (!expected.empty()) ctx.AddMetadata(kExpectedModelKey, expected);
    auto reader = stub_->Generate(&ctx, Request(kDocs, 2));
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  };
  EXPECT_TRUE(generate(mine).ok());
  EXPECT_TRUE(generate("").ok());  // a direct client names no model
  const grpc::Status other = generate(ExpectedModelValue("0123abcd", "tok"));
  EXPECT_EQ(other.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(other.error_message(), HasSubstr("routed for model 0123abcd/tok"));
  // A hostile value (4 KB, not a fingerprint) is refused the same way and not echoed whole.
  const grpc::Status huge = generate(std::string(4000, 'x'));
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(huge.error_message().size(), 600u);
  grpc::ClientContext ctx;
  ctx.AddMetadata(kExpectedModelKey, ExpectedModelValue("0123abcd", "tok"));
  v1::PrefetchRequest prefetch;
  prefetch.add_documents()->set_text("A document to warm.");
  v1::PrefetchResponse response;
  EXPECT_EQ(stub_->Prefetch(&ctx, prefetch, &response).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  ExpectIdle();
}

// A router asks for PrefillProgress events (its first-token timeout restarts on each): a prompt
// of many steps sends at least one, each before the first token, with the prompt tokens ready so
// far; a direct client that does not ask gets none.
TEST_F(WorkerServiceTest, PrefillProgressOnlyWhenAskedAndOnlyBeforeTheFirstToken) {
  StartServer(/*slow=*/true);
  const auto generate = [&](bool ask) {
    grpc::ClientContext ctx;
    if (ask) ctx.AddMetadata(kPrefillProgressKey, kPrefillProgressValue);
    // ~1,500 byte tokens: over 20 steps of 64 before the first token.
    v1::GenerateRequest request =
        Request({std::string(1500, 'a') + " fresh " + (ask ? "1" : "2")}, 3);
    auto reader = stub_->Generate(&ctx, request);
    std::vector<int64_t> progress;
    int tokens = 0, progress_after_tokens = 0;
    int64_t prompt_tokens = 0;
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
      if (m.has_prefill_progress()) {
        progress.push_back(m.prefill_progress().prompt_tokens_ready());
        if (tokens > 0) ++progress_after_tokens;
      }
      if (m.has_token() && m.token().token_id() >= 0) ++tokens;
      if (m.has_final()) prompt_tokens = m.final().usage().prompt_tokens();
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(tokens, 3);
    EXPECT_EQ(progress_after_tokens, 0);
    EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
    for (int64_t ready : progress) {
      EXPECT_GT(ready, 0);
      EXPECT_LT(ready, prompt_tokens);
    }
    return progress.size();
  };
  EXPECT_GE(generate(true), 1u);
  EXPECT_EQ(generate(false), 0u);
  ExpectIdle();
}

TEST_F(WorkerServiceTest, SameDocumentsInAnotherOrderHitTheCache) {
  StartServer();
  const StreamResult first = Generate(Request(kDocs, 4));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  const StreamResult second = Generate(Request({kDocs[2], kDocs[0], kDocs[1]}, 4));
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  ASSERT_TRUE(second.final.has_value());
  const v1::Usage& u = second.final->usage();
  EXPECT_EQ(u.documents_hit(), 3);
  int64_t doc_tokens = 0;
  for (const std::string& d : kDocs) doc_tokens += static_cast<int64_t>(d.size());  // bytes
  EXPECT_GE(u.cached_tokens(), doc_tokens);
  ExpectIdle();
  const v1::WorkerStatus s = Status();
  EXPECT_EQ(s.cached_documents(), 3);
  EXPECT_GT(s.cached_blocks(), 0);
  server_->RefreshMetrics();
  EXPECT_EQ(MetricValue(*server_->registry(), "lazyattn_worker_document_hit_tokens_total",
                        {{"mode", "lazy"}}),
            static_cast<double>(doc_tokens));
  EXPECT_EQ(MetricValue(*server_->registry(), "lazyattn_worker_document_lookup_tokens_total",
                        {{"mode", "lazy"}}),
            2.0 * doc_tokens);
  // The second request's documents were not tokenized again (the engine's token cache).
  EXPECT_EQ(MetricValue(*server_->registry(), "lazyattn_worker_document_prep_total",
                        {{"document", "text"}, {"result", "computed"}}),
            3.0);
  EXPECT_EQ(MetricValue(*server_->registry(), "lazyattn_worker_document_prep_total",
                        {{"document", "text"}, {"result", "reused"}}),
            3.0);
}

TEST_F(WorkerServiceTest, BadRequestsAreInvalidArgumentNamingTheField) {
  StartServer(/*slow=*/false, /*max_documents=*/4);
  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest&)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"too many documents",
       [](v1::GenerateRequest& r) {
         for (int i = 0; i < 3; ++i) *r.add_documents() = TextDoc("more");
       },
       "documents"},
      {"empty document", [](v1::GenerateRequest& r) { r.mutable_documents(1)->set_text(""); },
       "documents[1]"},
      {"document without content",
       [](v1::GenerateRequest& r) { r.mutable_documents(0)->clear_content(); }, "documents[0]"},
      {"token id out of range",
       [](v1::GenerateRequest& r) {
         auto* ids = r.mutable_documents(2)->mutable_tokens()->mutable_ids();
         ids->Add(5);
         ids->Add(300);
       },
       "documents[2].tokens.ids[1]"},
      {"negative temperature",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_temperature(-1); },
       "sampling.temperature"},
      {"negative top_k", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_k(-2); },
       "sampling.top_k"},
      {"top_p above 1", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5f); },
       "sampling.top_p"},
      {"negative max_tokens",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(-1); },
       "sampling.max_tokens"},
      {"unknown cache mode",
       [](v1::GenerateRequest& r) { r.set_cache_mode(static_cast<v1::CacheMode>(42)); },
       "cache_mode"},
      {"empty question", [](v1::GenerateRequest& r) { r.clear_question(); }, "question"},
      {"chat without a template", [](v1::GenerateRequest& r) { r.set_chat(true); }, "chat"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = Request(kDocs, 4);
    c.mutate(r);
    const StreamResult out = Generate(r);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.field)) << c.name;
    EXPECT_TRUE(out.chunks.empty()) << c.name;
  }
  EXPECT_EQ(Requests("invalid_argument"), static_cast<double>(cases.size()));
  // The worker still serves.
  EXPECT_TRUE(Generate(Request(kDocs, 2)).status.ok());
  ExpectIdle();
}

// The router's limits hold at the worker too (it is reachable directly).
TEST_F(WorkerServiceTest, TheRoutersLimitsAreEnforced) {
  StartServer();
  struct Case {
    std::function<void(v1::GenerateRequest&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(4097); },
       "sampling.max_tokens: 4097 outside [0, 4096]"},
      {[](v1::GenerateRequest& r) {
         for (int i = 0; i < 17; ++i) r.mutable_sampling()->add_stop("x");
       },
       "sampling.stop: 17 stop strings, the limit is 16"},
      {[](v1::GenerateRequest& r) { r.mutable_sampling()->add_stop(std::string(257, 's')); },
       "sampling.stop[0]: 257 bytes, the limit is 256"},
      {[](v1::GenerateRequest& r) {
         for (int i = 0; i < 65; ++i) r.mutable_sampling()->add_stop_token_ids(1);
       },
       "sampling.stop_token_ids: 65 ids, the limit is 64"},
      {[](v1::GenerateRequest& r) { r.mutable_documents(0)->set_id(std::string(257, 'i')); },
       "documents[0].id: 257 bytes, the limit is 256"},
      {[](v1::GenerateRequest& r) { r.set_question(std::string((64 << 10) + 1, 'q')); },
       "question: 65537 bytes"},
      {[](v1::GenerateRequest& r) { r.set_system(std::string((64 << 10) + 1, 's')); },
       "system: 65537 bytes"},
      {[](v1::GenerateRequest& r) {
         r.mutable_documents(1)->set_text(std::string((1 << 20) + 1, 'd'));
       },
       "documents[1].text: 1048577 bytes, the limit is 1048576"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = Request(kDocs, 4);
    c.mutate(r);
    const StreamResult out = Generate(r);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.message));
  }
  EXPECT_EQ(Requests("invalid_argument"), static_cast<double>(cases.size()));
  ExpectIdle();
}

// Text fields are `bytes` on the wire: invalid UTF-8 reaches the service, which names the field
// and counts it (a `string` field made gRPC's parser refuse the call as UNIMPLEMENTED, silently).
TEST_F(WorkerServiceTest, InvalidUtf8IsInvalidArgumentNamingTheFieldAndCounted) {
  StartServer();
  const std::string bad = "ab\xF0\x9F";  // a four-byte sequence cut short
  struct Case {
    std::function<void(v1::GenerateRequest&)> mutate;
    std::string field;
    std::string label;
  };
  const std::vector<Case> cases = {
      {[&](v1::GenerateRequest& r) { r.set_system(bad); }, "system", "system"},
      {[&](v1::GenerateRequest& r) { r.set_question(bad); }, "question", "question"},
      {[&](v1::GenerateRequest& r) { r.mutable_documents(2)->set_id(bad); }, "documents[2].id",
       "documents.id"},
      {[&](v1::GenerateRequest& r) { r.mutable_documents(1)->set_text(bad); },
       "documents[1].text", "documents.text"},
      {[&](v1::GenerateRequest& r) {
         r.mutable_sampling()->add_stop("ok");
         r.mutable_sampling()->add_stop(bad);
       },
       "sampling.stop[1]", "sampling.stop"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = Request(kDocs, 4);
    c.mutate(r);
    const StreamResult out = Generate(r);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(out.status.error_message(),
                HasSubstr(c.field + ": not valid UTF-8 (byte 2 of 4, value 0xf0)"));
    EXPECT_TRUE(out.chunks.empty());
  }
  for (const std::string field : {"id", "text"}) {
    v1::PrefetchRequest p;
    *p.add_documents() = TextDoc(kDocs[0]);
    *p.add_documents() = TextDoc(kDocs[1]);
    if (field == "id") {
      p.mutable_documents(1)->set_id(bad);
    } else {
      p.mutable_documents(1)->set_text(bad);
    }
    grpc::ClientContext ctx;
    v1::PrefetchResponse resp;
    const grpc::Status s = stub_->Prefetch(&ctx, p, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(s.error_message(), HasSubstr("documents[1]." + field + ": not valid UTF-8"));
  }
  EXPECT_EQ(Requests("invalid_argument"), static_cast<double>(cases.size()));
  for (const Case& c : cases) {
    const double prefetches = c.label == "documents.id" || c.label == "documents.text" ? 1 : 0;
    EXPECT_EQ(MetricValue(*server_->registry(), "lazyattn_worker_invalid_utf8_requests_total",
                          {{"field", c.label}}),
              1 + prefetches)
        << c.label;
  }
  // Valid UTF-8 beyond ASCII is served.
  v1::GenerateRequest fine = Request({"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"}, 2);
  EXPECT_TRUE(Generate(fine).status.ok());
  ExpectIdle();
}

// Occupies every preparation thread until released (tasks submitted straight to the pool).
class PoolBlocker {
 public:
  explicit PoolBlocker(PrepPool& pool) {
    for (int i = 0; i < pool.options().threads; ++i) {
      EXPECT_TRUE(pool.Submit([this](const absl::Status&) {
                        started_.fetch_add(1);
                        release_.WaitForNotification();
                      }).ok());
    }
    while (started_.load() < pool.options().threads) absl::SleepFor(absl::Milliseconds(1));
  }
  ~PoolBlocker() { Release(); }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

 private:
  std::atomic<int> started_{0};
  absl::Notification release_;
};

TEST_F(WorkerServiceTest, AFullPreparationQueueIsResourceExhaustedAtOnce) {
  StartServer(/*slow=*/false, 4, 1024, {.threads = 1, .max_pending = 1});
  PrepPool& pool = server_->service().prep_pool();
  PoolBlocker blocker(pool);
  // One request waits in the queue ...
  grpc::ClientContext queued_ctx;
  auto queued = stub_->Generate(&queued_ctx, Request(kDocs, 2));
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (pool.pending() < 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(pool.pending(), 1);
  // ... so the next is refused without waiting.
  const StreamResult refused = Generate(Request(kDocs, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("engine.max_pending_preparations 1"));
  {
    v1::PrefetchRequest p;
    *p.add_documents() = TextDoc(kDocs[0]);
    grpc::ClientContext ctx;
    v1::PrefetchResponse resp;
    EXPECT_EQ(stub_->Prefetch(&ctx, p, &resp).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  EXPECT_EQ(Requests("resource_exhausted"), 1);
  // Once the pool frees up, the queued request is served.
  blocker.Release();
  v1::GenerateResponse m;
  int tokens = 0;
  while (queued->Read(&m)) tokens += m.has_token() ? 1 : 0;
  EXPECT_TRUE(queued->Finish().ok());
  EXPECT_EQ(tokens, 2);
  EXPECT_TRUE(Generate(Request(kDocs, 2)).status.ok());
  ExpectIdle();
}

TEST_F(WorkerServiceTest, CancellationAndDeadlinesReachARequestWaitingForPreparation) {
  StartServer(/*slow=*/false, 4, 1024, {.threads = 1, .max_pending = 4});
  PrepPool& pool = server_->service().prep_pool();
  PoolBlocker blocker(pool);
  {
    // The deadline passes while the request is queued: it ends without a pool thread.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    auto reader = stub_->Generate(&ctx, Request(kDocs, 2));
    v1::GenerateResponse m;
    EXPECT_FALSE(reader->Read(&m));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  {
    // The client's deadline fires a little before the worker's (which counts from arrival): wait
    // until the worker has taken the expired call out of the queue, so that the queued call seen
    // below is the next one. (Without this wait the next call was sometimes cancelled before it
    // reached the worker at all, which then rightly never counted it.)
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (pool.pending() > 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(pool.pending(), 0);
  }
  {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, Request(kDocs, 2));
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (pool.pending() < 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(pool.pending(), 1);
    ctx.TryCancel();
    v1::GenerateResponse m;
    EXPECT_FALSE(reader->Read(&m));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // Both left the queue while its only thread was still busy.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (pool.pending() > 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(pool.pending(), 0);
  EXPECT_EQ(pool.running(), 1);  // the blocker
  while (Requests("cancelled") + Requests("deadline_exceeded") < 2 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(Requests("deadline_exceeded"), 1);
  EXPECT_EQ(Requests("cancelled"), 1);
  blocker.Release();
  EXPECT_TRUE(Generate(Request(kDocs, 2)).status.ok());
  ExpectIdle();
  // Neither reached the engine nor was tokenized: only the last request was.
  const EngineStats stats = server_->engine().stats();
  EXPECT_EQ(stats.requests_ok, 1);
  EXPECT_EQ(stats.requests_failed, 0);
  EXPECT_EQ(stats.text_docs_tokenized, 3);
}

TEST_F(WorkerServiceTest, ClientCancellationMidStreamFreesEveryBlock) {
  StartServer(/*slow=*/true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Request(kDocs, 3000));
  v1::GenerateResponse m;
  int tokens = 0;
  while (tokens < 2 && reader->Read(&m)) tokens += m.has_token() ? 1 : 0;
  ASSERT_EQ(tokens, 2);
  EXPECT_GT(Status().referenced_blocks(), 0);  // the request holds its KV while it runs
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ExpectIdle();
  EXPECT_EQ(Requests("cancelled"), 1);  // ended by the cancellation, not by finishing
  EXPECT_EQ(Requests("ok"), 0);
}

TEST_F(WorkerServiceTest, ASlowClientIsCutOffWithoutBlockingOtherStreams) {
  StartServer(/*slow=*/false, /*max_documents=*/4, /*max_buffered_tokens=*/16);
  // A client that announces a tiny receive window and does not read: the worker's writes stall,
  // generated tokens pile up in the call's queue, and the call is cut off at 16.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto slow_channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                                grpc::InsecureChannelCredentials(), args);
  auto slow_stub = v1::Worker::NewStub(slow_channel);
  grpc::ClientContext ctx;
  auto reader = slow_stub->Generate(&ctx, Request(kDocs, 3500));
  // Meanwhile another client is served normally.
  const StreamResult other = Generate(Request(kDocs, 8));
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (Requests("resource_exhausted") < 1 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(Requests("resource_exhausted"), 1);
  v1::GenerateResponse m;
  int tokens = 0;
  while (reader->Read(&m)) tokens += m.has_token() ? 1 : 0;
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("client too slow"));
  EXPECT_LT(tokens, 3500);
  ExpectIdle();
}

TEST_F(WorkerServiceTest, DeadlineEndsTheRequestAndFreesItsBlocks) {
  StartServer(/*slow=*/true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  auto reader = stub_->Generate(&ctx, Request(kDocs, 3000));
  v1::GenerateResponse m;
  int tokens = 0;
  bool final = false;
  while (reader->Read(&m)) {
    tokens += m.has_token() ? 1 : 0;
    final = final || m.has_final();
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_FALSE(final);
  EXPECT_LT(tokens, 3000);
  ExpectIdle();
  EXPECT_EQ(Requests("deadline_exceeded"), 1);
}

TEST_F(WorkerServiceTest, PrefetchComputesOnceThenReportsCachedTokens) {
  StartServer();
  v1::PrefetchRequest p;
  *p.add_documents() = TextDoc(kDocs[0]);
  *p.add_documents() = TextDoc(kDocs[1]);
  const int64_t tokens = static_cast<int64_t>(kDocs[0].size() + kDocs[1].size());
  {
    grpc::ClientContext ctx;
    v1::PrefetchResponse r;
    ASSERT_TRUE(stub_->Prefetch(&ctx, p, &r).ok());
    EXPECT_EQ(r.computed_tokens(), tokens);
    EXPECT_EQ(r.cached_tokens(), 0);
    EXPECT_THAT(r.workers(), ::testing::ElementsAre("worker-under-test"));
  }
  {
    grpc::ClientContext ctx;
    v1::PrefetchResponse r;
    ASSERT_TRUE(stub_->Prefetch(&ctx, p, &r).ok());
    EXPECT_EQ(r.computed_tokens(), 0);
    EXPECT_EQ(r.cached_tokens(), tokens);
  }
  const StreamResult g = Generate(Request({kDocs[1], kDocs[2], kDocs[0]}, 2));
  ASSERT_TRUE(g.final.has_value()) << g.status.error_message();
  EXPECT_EQ(g.final->usage().documents_hit(), 2);
  {
    p.set_cache_mode(v1::CACHE_MODE_FULL);
    grpc::ClientContext ctx;
    v1::PrefetchResponse r;
    const grpc::Status s = stub_->Prefetch(&ctx, p, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("cache_mode"));
  }
  ExpectIdle();
}

TEST_F(WorkerServiceTest, StatusReportsIdentityModelAndLoad) {
  StartServer();
  const v1::WorkerStatus s = Status();
  EXPECT_EQ(s.worker_id(), "worker-under-test");
  EXPECT_EQ(s.address(), absl::StrCat("127.0.0.1:", server_->port()));
  EXPECT_EQ(s.model().name(), "tiny-test");
  EXPECT_EQ(s.model().vocab_size(), 300);
  EXPECT_EQ(s.model().max_documents(), 4);
  EXPECT_EQ(s.model().model_fingerprint(), server_->engine().identity().model_fingerprint);
  EXPECT_EQ(s.load().total_blocks(), 512);
  EXPECT_EQ(s.load().free_blocks(), 512);
  EXPECT_EQ(s.referenced_blocks(), 0);
  EXPECT_EQ(s.cached_documents(), 0);
}

TEST_F(WorkerServiceTest, ShutdownEndsRunningStreamsWithUnavailable) {
  StartServer(/*slow=*/true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Request(kDocs, 3000));
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  std::thread stopper([&] { server_->Shutdown(); });
  while (reader->Read(&m)) {
  }
  const grpc::Status s = reader->Finish();
  stopper.join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("shutting down"));
  EXPECT_EQ(server_->service().in_flight(), 0u);
  EXPECT_TRUE(server_->engine().WaitIdleAndCheck().ok());
}

// The ids of the generated tokens (the final flush chunk, id -1, left out).
std::vector<int32_t> Ids(const StreamResult& r) {
  std::vector<int32_t> ids;
  for (const v1::TokenChunk& c : r.chunks) {
    if (c.token_id() >= 0) ids.push_back(c.token_id());
  }
  return ids;
}

TEST_F(WorkerServiceTest, UnseededRequestsDifferAndASeedRepeats) {
  StartServer();
  v1::GenerateRequest r = Request(kDocs, 24);
  r.mutable_sampling()->set_temperature(1.5f);  // near-uniform over 300 ids: a repeat is ~300^-24
  const StreamResult a = Generate(r), b = Generate(r);
  ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status.error_message();
  ASSERT_EQ(Ids(a).size(), 24u);
  EXPECT_NE(Ids(a), Ids(b)) << "two unseeded requests drew the same tokens";
  r.mutable_sampling()->set_seed(0);  // a set seed, even 0, is not "unseeded"
  const StreamResult c = Generate(r), d = Generate(r);
  ASSERT_TRUE(c.status.ok() && d.status.ok());
  EXPECT_EQ(Ids(c), Ids(d));
  EXPECT_NE(Ids(c), Ids(a));
  r.mutable_sampling()->set_seed(12345);
  const StreamResult e = Generate(r), f = Generate(r);
  ASSERT_TRUE(e.status.ok() && f.status.ok());
  EXPECT_EQ(Ids(e), Ids(f));
  EXPECT_NE(Ids(e), Ids(c));
  ExpectIdle();
}

TEST_F(WorkerServiceTest, LogprobsComeWithEachTokenOnlyWhenAsked) {
  StartServer();
  v1::GenerateRequest r = Request(kDocs, 12);
  const StreamResult plain = Generate(r);
  ASSERT_TRUE(plain.status.ok());
  for (const v1::TokenChunk& c : plain.chunks) EXPECT_FALSE(c.has_logprob());

  // Greedy: the chosen token is the most likely, so its probability is at least 1/vocab.
  r.mutable_sampling()->set_logprobs(true);
  const StreamResult greedy = Generate(r);
  ASSERT_TRUE(greedy.status.ok());
  EXPECT_EQ(Ids(greedy), Ids(plain));  // asking for logprobs changes no token
  int with = 0;
  for (const v1::TokenChunk& c : greedy.chunks) {
    EXPECT_EQ(c.has_logprob(), c.token_id() >= 0) << "chunk " << c.token_id();
    if (!c.has_logprob()) continue;
    ++with;
    EXPECT_LE(c.logprob(), 0.0f);
    EXPECT_GE(c.logprob(), -std::log(300.0f) - 1e-4f);
  }
  EXPECT_EQ(with, 12);

  // Sampled and seeded: the same tokens and log-probabilities again, each a real probability.
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_seed(7);
  const StreamResult s1 = Generate(r), s2 = Generate(r);
  ASSERT_TRUE(s1.status.ok() && s2.status.ok());
  ASSERT_EQ(s1.chunks.size(), s2.chunks.size());
  bool below_greedy_bound = false;
  for (size_t i = 0; i < s1.chunks.size(); ++i) {
    if (s1.chunks[i].token_id() < 0) continue;
    ASSERT_TRUE(s1.chunks[i].has_logprob());
    EXPECT_EQ(s1.chunks[i].logprob(), s2.chunks[i].logprob());
    EXPECT_LT(s1.chunks[i].logprob(), 0.0f);
    EXPECT_GT(s1.chunks[i].logprob(), -60.0f);
    below_greedy_bound |= s1.chunks[i].logprob() < -std::log(300.0f);
  }
  // Temperature 1 over 300 near-uniform ids: some draw is less likely than 1/300.
  EXPECT_TRUE(below_greedy_bound);
  ExpectIdle();
}

}  // namespace
}  // namespace lazyattn
